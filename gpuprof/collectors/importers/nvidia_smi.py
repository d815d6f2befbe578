"""nvidia-smi ``--query-gpu=… --format=csv`` logs → GPU samples.

What such logs look like in the wild:

- any subset of query fields in any order, the header naming them (``utilization.gpu [%]``, or
  ``utilization.gpu`` with ``nounits``, in which case values carry no units either);
- a header a user's own logger wrote (``timestamp,gpu_index,temperature_C,utilization_gpu_pct``,
  ``util_pct``, ``mem_used_mb``): columns are mapped by what their names, units and values mean
  (`smi_columns`); columns it does not understand are named in a note;
- no header at all (``--format=csv,noheader``): the columns are inferred from the shape of the
  values where that is unambiguous (`smi_columns.infer_columns`), with a note saying so; a
  pasted ``$ nvidia-smi --query-gpu=…`` command line above the rows names them; otherwise the
  import stops with one line asking for ``--fields`` (`parse`'s ``fields``);
- values with units (``22 %``, ``841 MiB``, ``33.09 W``) or without, ``[N/A]`` / ``[Not
  Supported]`` for what the GPU does not report; a comment typed after the numbers
  (``114.13 W    # ← phantom``) is dropped;
- the header repeated before every row (a logger that appends one ``nvidia-smi`` call per
  sample), or a new header when the query changed halfway;
- nvidia-smi's own timestamps (``2024/05/01 12:34:56.789``, the logging machine's local time,
  no zone), Unix-epoch timestamps (s, ms, µs or ns) from a custom logger, or ISO 8601;
- one GPU and no ``index`` column; several GPUs told apart by ``index``, ``uuid`` or
  ``pci.bus_id``;
- UTF-8, or UTF-16 with a BOM (what PowerShell redirection writes).

The reader is tolerant and the report strict: a line or value that makes no sense (a wrapped
line, ``lots`` where a number belongs, 250 % utilization, a timestamp that does not parse) is
skipped, and a note counts what was skipped and names the first line. A file is refused only
when nothing usable is left.
"""

from __future__ import annotations

import calendar
import re
import time
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pandas as pd

from gpuprof.collectors.importers import Imported, ImportFormatError, open_text
from gpuprof.collectors.importers import smi_columns as sc

FORMAT = "nvidia-smi-csv"

_MIB = 2**20
_MEMORY_UNITS = {"": _MIB, "mib": _MIB, "gib": 2**30, "kib": 2**10, "b": 1, "mb": _MIB,
                 "gb": 2**30, "kb": 2**10}  # fmt: skip
"""Bytes per unit of a memory value; nvidia-smi's "MiB" (a bare number means MiB too)."""

NUMERIC_FIELDS: dict[str, str] = {
    "utilization.gpu": "util_gpu_pct",
    "utilization.memory": "util_mem_pct",
    "memory.used": "mem_used_bytes",
    "memory.total": "mem_total_bytes",
    "memory.free": "mem_free_bytes",
    "power.draw": "power_w",
    "power.draw.instant": "power_w",
    "power.draw.average": "power_w",
    "power.limit": "power_limit_w",
    "enforced.power.limit": "power_limit_w",
    "power.default_limit": "power_default_limit_w",
    "power.max_limit": "power_max_limit_w",
    "clocks.sm": "sm_clock_mhz",
    "clocks.current.sm": "sm_clock_mhz",
    "clocks.max.sm": "max_sm_clock_mhz",
    "clocks.max.graphics": "max_sm_clock_mhz",
    "temperature.gpu": "temp_c",
    "pcie.link.gen.current": "pcie_link_gen",
    "pcie.link.gen.gpucurrent": "pcie_link_gen",
    "pcie.link.width.current": "pcie_link_width",
    "pcie.link.gen.max": "pcie_link_gen_max",
    "pcie.link.gen.gpumax": "pcie_link_gen_gpu_max",
    "pcie.link.width.max": "pcie_link_width_max",
}
"""Query field → column (GpuSample field, or an inventory figure); units: %, bytes, W, MHz, °C."""

_KIND_OF_COLUMN = {
    "util_gpu_pct": "%", "util_mem_pct": "%", "mem_used_bytes": "memory",
    "mem_total_bytes": "memory", "mem_free_bytes": "memory", "power_w": "power",
    "power_limit_w": "power", "power_default_limit_w": "power", "power_max_limit_w": "power",
    "sm_clock_mhz": "clock", "max_sm_clock_mhz": "clock", "temp_c": "temp",
}  # fmt: skip
"""Column → kind whose range (`smi_columns.RANGES`) its values must fall in."""

_MEMORY_FIELDS = {"mem_used_bytes", "mem_total_bytes", "mem_free_bytes"}
_INVENTORY_FIELDS = {"pcie_link_gen", "pcie_link_width", "pcie_link_gen_max",
                     "pcie_link_gen_gpu_max", "pcie_link_width_max", "power_limit_w",
                     "power_default_limit_w", "power_max_limit_w",
                     "max_sm_clock_mhz"}  # fmt: skip
"""Columns kept once per GPU in the inventory (`RunMeta.gpus`, the last value read), not as
samples: the power limits are what the power-cap finding compares power draw against."""
_REASON_FIELDS = {"clocks_event_reasons.active", "clocks_throttle_reasons.active"}
_ID_FIELDS = {"index": "gpu", "uuid": "uuid", "name": "name", "pci.bus_id": "pci_bus_id"}
_ALIASES = {
    "gpu_uuid": "uuid",
    "gpu_name": "name",
    "gpu_bus_id": "pci.bus_id",
    "clocks.current.graphics": "clocks.gr",
    "clocks_event_reasons.active": "clocks_event_reasons.active",
    "clocks.mem": "clocks.mem",
}
_KNOWN = {"timestamp", *NUMERIC_FIELDS, *_REASON_FIELDS, *_ID_FIELDS}
"""Fields this reader imports (others are named in a note)."""

_FIELD_RE = re.compile(r"^([a-z][a-z0-9_]*(?:\.[a-z0-9_]+)*)(?:\s*\[([^\]]*)\])?$")
_SMI_TIME_RE = sc.SMI_TIME_RE
_QUERY_RE = re.compile(r"--query-gpu[= ]\s*([A-Za-z0-9_.,]+)")
_ANSI_RE = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")
_COMMENT_RE = re.compile(r"\s+#.*$")
_NUMBER_RE = r"^\s*([-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?)\s*([A-Za-z%]*)\s*$"
_NA_RE = r"^\s*(\[.*\]|N/A|n/a|NA|Unknown|unknown|)\s*$"
_NA = re.compile(_NA_RE)

Header = list[tuple[str, str]]
"""A header as (field, unit) per column; a field not imported keeps its name as written."""


class _Skips:
    """What was skipped, by reason: counts and the first line of each (for the notes)."""

    def __init__(self) -> None:
        self.counts: dict[str, int] = {}
        self.first: dict[str, int] = {}

    def add(self, reason: str, line: int, n: int = 1) -> None:
        if n <= 0:
            return
        self.counts[reason] = self.counts.get(reason, 0) + n
        self.first.setdefault(reason, line)

    def notes(self) -> list[str]:
        return [
            f"{n} {reason} skipped (first: line {self.first[reason]})"
            for reason, n in self.counts.items()
        ]


def _field(cell: str) -> tuple[str, str, bool] | None:
    """``("memory.used", "MiB", True)`` for a header cell ``memory.used [MiB]``: the field, its
    unit, and whether gpuprof knows what it means; None when the cell is not a column name."""
    text = cell.strip()
    match = _FIELD_RE.match(text)
    if match is not None:
        name = _ALIASES.get(match.group(1), match.group(1))
        if name in _KNOWN:
            return name, (match.group(2) or "").strip(), True
    col = sc.column(text)
    if col.known:
        return col.field, col.unit, col.field in _KNOWN  # type: ignore[return-value]
    if match is not None and ("." in match.group(1) or match.group(2)):
        return match.group(1), (match.group(2) or "").strip(), True  # nvidia-smi's own vocabulary
    if not text or re.fullmatch(r"[-+]?[\d.eE]+", text):
        return None
    return text, col.unit, False


def _header(cells: list[str]) -> Header | None:
    """The fields of a header line, or None when the line is not a header (see
    `smi_columns.header` for the rules)."""
    if sc.header(cells) is None and not _smi_header(cells):
        return None
    fields = [_field(c) for c in cells]
    if any(f is None for f in fields):
        return None
    return [(name, unit) for name, unit, _ in fields]  # type: ignore[misc]


def _smi_header(cells: list[str]) -> bool:
    """Every cell an nvidia-smi field name, one of them a metric (its own header)."""
    names = []
    for cell in cells:
        match = _FIELD_RE.match(cell.strip())
        if match is None:
            return False
        names.append(_ALIASES.get(match.group(1), match.group(1)))
    return any(n in NUMERIC_FIELDS or n in _REASON_FIELDS or n == "pci.bus_id" for n in names)


def _cells(line: str) -> list[str]:
    """A line's cells, not yet stripped (done once per distinct value, see `_distinct`)."""
    return line.split(",")


def _distinct(col: pd.Series) -> tuple[np.ndarray, list[str]]:
    """(codes, distinct stripped cells): logs repeat a few values (0-100 %, one total, one
    name), so each distinct cell is read once and the result taken by code."""
    codes, uniques = pd.factorize(col.to_numpy(object))
    return codes, [str(u).strip() for u in uniques]


def _clean(line: str) -> tuple[str, bool]:
    """A line without ANSI colour codes, and without a comment typed after the values (and
    whether it had one)."""
    if "\x1b" in line:
        line = _ANSI_RE.sub("", line)
    if "#" in line:
        stripped = _COMMENT_RE.sub("", line)
        return stripped, stripped != line
    return line, False


def _is_comment(line: str) -> bool:
    """A pasted shell prompt, a ``#`` comment or a quoted paste marker: not data."""
    s = line.lstrip()
    return s.startswith(("#", "$ ", "> ", "```"))


def sniff(head: str, path: Path) -> bool:
    """A header of query fields on the first line, a pasted ``nvidia-smi --query-gpu`` command,
    or a header-less nvidia-smi row (`smi_columns.looks_headerless`)."""
    seen = 0
    for line in head.splitlines():
        if not line.strip():
            continue
        seen += 1
        if seen > 8:
            return False
        if _is_comment(line):
            if _QUERY_RE.search(line) and "nvidia-smi" in line:
                return True
            continue
        line, _ = _clean(line)
        cells = _cells(line)
        if _header(cells) is not None:
            return True
        return sc.looks_headerless(cells)
    return False


def host_name(path: Path) -> str:
    """The host a single-machine log is filed under: the file's stem (``imported`` if none)."""
    stem = re.sub(r"[^A-Za-z0-9_.-]+", "_", path.name.split(".")[0]).strip("_")
    return stem or "imported"


def parse(path: Path, fields: str | Sequence[str] | None = None) -> Imported:
    """Read a whole log; raises `ImportFormatError` (``path[:line]: reason``) when nothing in
    it can be read.

    ``fields``: the columns of a header-less capture, in order (``"timestamp,index,
    utilization.gpu"`` or a list; aliases as in `smi_columns`). A file with its own header
    keeps it.
    """
    text = open_text(path)
    skips = _Skips()
    segments: list[tuple[Header, list[list[str]], list[int]]] = []
    headerless: list[tuple[int, list[str]]] = []
    header: Header | None = None
    header_text = None
    rows: list[list[str]] = []
    lines: list[int] = []
    annotated = 0
    named_by: list[int] = []  # lines of pasted nvidia-smi commands that named the columns
    numbered = [(i, ln) for i, ln in enumerate(text.splitlines(), 1) if ln.strip()]
    last = numbered[-1][0] if numbered else 0
    for lineno, line in numbered:
        if line == header_text:  # the repeated header: the common case, cheapest test first
            continue
        if _is_comment(line):
            found = _QUERY_RE.search(line)
            if found and "nvidia-smi" in line:  # a pasted command names the columns after it
                query = _query_header(found.group(1))
                named_by.append(lineno)
                if rows:
                    segments.append((header, rows, lines))  # type: ignore[arg-type]
                rows, lines, header, header_text = [], [], query, None
            continue
        line, had_comment = _clean(line)
        annotated += had_comment
        cells = _cells(line)
        found_header = _header(cells)
        if found_header is not None:
            if found_header != header:
                if rows:
                    segments.append((header, rows, lines))  # type: ignore[arg-type]
                rows, lines = [], []
                header = found_header
            header_text = line
            continue
        if header is None:
            headerless.append((lineno, cells))
            continue
        if len(cells) != len(header):
            why = "incomplete last line" if lineno == last else "lines of the wrong width"
            skips.add(why, lineno)
            continue
        rows.append(cells)
        lines.append(lineno)
    if rows:
        segments.append((header, rows, lines))  # type: ignore[arg-type]
    notes: list[str] = []
    if headerless:
        segment = _headerless(path, headerless, fields, bool(segments), notes, skips)
        if segment is not None:
            segments.insert(0, segment)
    elif fields is not None:
        notes.append("--fields not used: the file names its columns in a header")
    if named_by:
        notes.append(f"columns named by the pasted --query-gpu list (line {named_by[0]})")
    if annotated:
        notes.append(f"{annotated} line(s) with a comment after the values: comment ignored")
    if not segments:
        raise ImportFormatError(f"{path}: no samples (only a header or nothing)")

    frames, ignored = [], set()
    zone_note = None
    anchored = True
    for seg_fields, seg_rows, seg_lines in segments:
        frame, seg_ignored, seg_anchored, seg_zone = _segment(
            seg_fields, seg_rows, seg_lines, skips
        )
        frames.append(frame)
        ignored |= seg_ignored
        anchored &= seg_anchored
        zone_note = zone_note or seg_zone
    frame = pd.concat(frames, ignore_index=True)
    if not _usable(frame):
        detail = "; ".join(skips.notes()) or "no metric column"
        raise ImportFormatError(f"{path}: no usable samples ({detail})")
    notes.extend(skips.notes())
    if ignored:
        notes.append(f"fields not imported: {', '.join(sorted(ignored))}")
    if zone_note:
        notes.append(zone_note)
    if not anchored:
        notes.append("no timestamp column: samples taken as 1 s apart (nvidia-smi -l 1)")
    return _imported(path, frame, anchored, notes)


def _query_header(text: str) -> Header:
    """The header a pasted ``--query-gpu=a,b,c`` names (units come with the values)."""
    header: Header = []
    for cell in (c.strip() for c in text.split(",")):
        if cell:
            found = _field(cell)
            header.append((found[0], "") if found else (cell, ""))
    return header


def _usable(frame: pd.DataFrame) -> bool:
    """Whether any row has a measured value (a sample worth keeping)."""
    metrics = [c for c in frame if c in _KIND_OF_COLUMN or c == "clock_event_reasons"]
    return bool(len(frame)) and any(frame[c].notna().any() for c in metrics)


def _headerless(
    path: Path,
    rows: list[tuple[int, list[str]]],
    fields: str | Sequence[str] | None,
    others: bool,
    notes: list[str],
    skips: _Skips,
) -> tuple[Header, list[list[str]], list[int]] | None:
    """The segment of rows that came before any header: named by ``fields``, else inferred
    from their values. None (rows skipped with a note) when the file has headers for its other
    rows; raises `ImportFormatError` asking for ``--fields`` when nothing else can be read."""
    widths = pd.Series([len(c) for _, c in rows])
    width = int(widths.mode().iloc[0])
    if fields is not None:
        try:
            cols = sc.fields_option(fields)
        except ValueError as exc:
            raise ImportFormatError(f"{path}: {exc}") from None
        width = len(cols)
        header = [_named(c) for c in cols]
        notes.append(f"columns named by --fields: {', '.join(f for f, _ in header)}")
    else:
        body = [c for _, c in rows if len(c) == width]
        try:
            cols, inferred = sc.infer_columns(body)
        except sc.Ambiguous as exc:
            if others:
                skips.add("lines before the header (columns unknown)", rows[0][0], len(rows))
                return None
            raise ImportFormatError(
                f"{path}:{rows[0][0]}: no header line, and the columns can't be told apart "
                f"from their values ({exc}): name them in order with --fields, e.g. "
                "--fields timestamp,index,utilization.gpu,memory.used (the --query-gpu list)"
            ) from None
        header = [_named(c) for c in cols]
        notes.append("no header: columns inferred from their values — " + "; ".join(inferred))
    kept = [(n, c) for n, c in rows if len(c) == width]
    for n, c in rows:
        if len(c) != width:
            skips.add(f"lines of {len(c)} values where {width} columns are named", n)
    if not kept:
        return None
    return header, [c for _, c in kept], [n for n, _ in kept]


def _named(col: sc.Column) -> tuple[str, str]:
    """A `smi_columns.Column` as a header entry of this reader."""
    if col.field is not None:
        return col.field, col.unit
    return col.raw, col.unit


def _segment(
    fields: Header, rows: list[list[str]], lines: list[int], skips: _Skips
) -> tuple[pd.DataFrame, set[str], bool, str | None]:
    """Typed columns of the rows under one header: (frame, fields ignored, anchored, zone
    note). Rows without a readable timestamp are dropped; values that make no sense become
    NaN; both counted in ``skips``."""
    names = [n for n, _ in fields]
    keep = [i for i, n in enumerate(names) if n not in names[:i]]  # a field twice: the first
    if len(keep) < len(names):
        skips.add("repeated columns", lines[0], len(names) - len(keep))
    raw = pd.DataFrame([[r[i] for i in keep] for r in rows], columns=[names[i] for i in keep],
                       dtype=object)  # fmt: skip
    fields = [fields[i] for i in keep]
    line_no = np.asarray(lines)
    out = pd.DataFrame({"line": line_no})
    ignored: set[str] = set()
    for name, unit in fields:
        if name == "timestamp":
            continue
        col = raw[name]
        if name == "index":
            out["gpu"] = _numbers(name, col, line_no, "", skips)[0]
            bad = out["gpu"].notna() & ((out["gpu"] < 0) | (out["gpu"] % 1 != 0))
            skips.add("GPU indices that are not whole numbers", int(line_no[bad.argmax()]),
                      int(bad.sum()))  # fmt: skip
            out.loc[bad, "gpu"] = np.nan
        elif name in _ID_FIELDS:
            codes, uniques = _distinct(col)
            values = np.array([None if _NA.fullmatch(u) else u for u in uniques], dtype=object)
            out[_ID_FIELDS[name]] = pd.Series(values[codes], dtype=object)  # no str inference
        elif name in NUMERIC_FIELDS:
            target = NUMERIC_FIELDS[name]
            number, units = _numbers(name, col, line_no, unit, skips)
            if target in _MEMORY_FIELDS:
                scale = units.str.lower().map(_MEMORY_UNITS)
                bad = scale.isna() & number.notna()
                skips.add(f"{name} values in an unknown unit", int(line_no[bad.argmax()]),
                          int(bad.sum()))  # fmt: skip
                number = number * scale
            elif target.endswith("_w"):
                number = number.where(units.str.lower() != "mw", number / 1000.0)
            out[target] = _in_range(name, number, _KIND_OF_COLUMN.get(target), line_no, skips)
        elif name in _REASON_FIELDS:
            out["clock_event_reasons"] = _bitmasks(name, col, line_no, skips)
        else:
            ignored.add(name)
    anchored, zone = True, None
    if "timestamp" in raw:
        stamps = pd.Series([str(c).strip() for c in raw["timestamp"]], dtype=object)
        t_ns, bad, zone = _timestamps(stamps)
        out["t_ns"] = t_ns
        if bad.any():
            skips.add("lines whose timestamp can't be read", int(line_no[bad.argmax()]),
                      int(bad.sum()))  # fmt: skip
            out = out[~bad].reset_index(drop=True)
    else:
        anchored = False
        out["t_ns"] = 0
    if "gpu" in out and out["gpu"].notna().any() and out["gpu"].isna().any():
        missing = out["gpu"].isna().to_numpy()
        skips.add("lines without a GPU index", int(out["line"][missing].iloc[0]),
                  int(missing.sum()))  # fmt: skip
        out = out[~missing].reset_index(drop=True)
    return out, ignored, anchored, zone


def _numbers(
    name: str, col: pd.Series, line_no: np.ndarray, header_unit: str, skips: _Skips
) -> tuple[pd.Series, pd.Series]:
    """Numbers and their units from cells like ``22 %``; ``[N/A]`` and friends → NaN; a cell
    that is not a number → NaN, counted in ``skips``."""
    codes, uniques = _distinct(col)
    cells = pd.Series(uniques, dtype=object)
    parts = cells.str.extract(_NUMBER_RE)
    number = pd.to_numeric(parts[0], errors="coerce").to_numpy(np.float64)
    bad = np.isnan(number) & ~cells.str.fullmatch(_NA_RE).to_numpy(bool)
    if bad.any():
        rows = bad[codes]
        skips.add(f"{name} values that are not numbers", int(line_no[rows.argmax()]),
                  int(rows.sum()))  # fmt: skip
    units = parts[1].fillna("")
    units = units.where(units != "", header_unit).to_numpy(object)
    return pd.Series(number[codes], index=col.index), pd.Series(units[codes], index=col.index)


def _in_range(
    name: str, values: pd.Series, kind: str | None, line_no: np.ndarray, skips: _Skips
) -> pd.Series:
    """``values`` with those outside their kind's plausible range (`smi_columns.RANGES`) and
    non-finite ones (``1e309``) set to NaN, counted in ``skips``."""
    arr = values.to_numpy(np.float64)
    bad = np.isinf(arr)
    if kind in sc.RANGES:
        low, high = sc.RANGES[kind]
        with np.errstate(invalid="ignore"):
            bad |= (arr < low) | (arr > high)
    if bad.any():
        skips.add(f"{name} values out of range", int(line_no[bad.argmax()]), int(bad.sum()))
        values = values.where(~bad)
    return values


def _bitmasks(name: str, col: pd.Series, line_no: np.ndarray, skips: _Skips) -> pd.Series:
    """``0x0000000000000004`` → 4; ``[N/A]`` and what is not a mask → NaN (float: a mask fits
    53 bits)."""
    codes, uniques = _distinct(col)
    masks = np.full(len(uniques), np.nan)
    for j, text in enumerate(uniques):
        if _NA.fullmatch(text):
            continue
        try:
            value = int(text, 16) if text.lower().startswith("0x") else int(text)
        except ValueError:
            value = -1
        if 0 <= value < 2**53:
            masks[j] = float(value)
        else:
            rows = codes == j
            skips.add(f"{name} values that are not bit masks", int(line_no[rows.argmax()]),
                      int(rows.sum()))  # fmt: skip
    return pd.Series(masks[codes])


def epoch_scale(values: pd.Series) -> float:
    """ns per unit of Unix-epoch numbers in s, ms, µs or ns, told apart by their magnitude."""
    magnitude = values.abs().median()
    return 1e9 if magnitude < 1e11 else 1e6 if magnitude < 1e14 else 1e3 if magnitude < 1e17 else 1


def epoch_ns(values: pd.Series) -> pd.Series:
    """Unix-epoch numbers in s, ms, µs or ns (see `epoch_scale`) → integer ns."""
    scale = epoch_scale(values)
    if scale == 1:
        return values.round().astype(np.int64)
    whole = np.floor(values)
    fraction = ((values - whole) * scale).round().astype(np.int64)
    return whole.astype(np.int64) * int(scale) + fraction


def _timestamps(col: pd.Series) -> tuple[np.ndarray, np.ndarray, str | None]:
    """Timestamps → (integer ns since the epoch, which could not be read, a note when the zone
    had to be assumed). The format is the one most stamps are in."""
    col = col.str.strip()
    n = len(col)
    ns = np.zeros(n, dtype=np.int64)
    smi = col.str.match(_SMI_TIME_RE.pattern).to_numpy(bool)
    number = pd.to_numeric(col, errors="coerce")
    numeric = number.notna().to_numpy() & np.isfinite(number.to_numpy(np.float64))
    if smi.sum() >= max(numeric.sum(), 1):
        stamps = pd.to_datetime(col.where(smi), format="%Y/%m/%d %H:%M:%S.%f", errors="coerce")
        missing = stamps.isna() & pd.Series(smi)
        if missing.any():  # nvidia-smi versions without milliseconds
            stamps[missing] = pd.to_datetime(
                col[missing], format="%Y/%m/%d %H:%M:%S", errors="coerce"
            )
        bad = stamps.isna().to_numpy()
        if bad.all():
            return ns, bad, None
        wall = stamps.astype("datetime64[ns]").astype("int64").to_numpy()
        offset_s = _local_offset_s(stamps[~bad].iloc[0])
        zone = (
            f"nvidia-smi timestamps have no time zone: read as this machine's local time "
            f"(UTC{offset_s / 3600:+g} h); set TZ to the logging machine's zone if it differs"
        )
        ns[~bad] = wall[~bad] - int(offset_s * 1e9)
        return ns, bad, zone
    if numeric.sum() >= n / 2:
        values = number[numeric]
        scale = epoch_scale(values)
        with np.errstate(over="ignore", invalid="ignore"):
            scaled = values.to_numpy(np.float64) * scale
        ok = (scaled >= 0) & (scaled < 2**63 - 1024)
        bad = ~numeric
        idx = np.flatnonzero(numeric)
        bad[idx[~ok]] = True
        if ok.any():
            ns[idx[ok]] = epoch_ns(values[ok]).to_numpy(np.int64)
        return ns, bad, None
    stamps = pd.to_datetime(col, format="ISO8601", errors="coerce", utc=True)
    bad = stamps.isna().to_numpy()
    if not bad.all():
        ns[~bad] = stamps[~bad].astype("datetime64[ns, UTC]").astype("int64").to_numpy()
    return ns, bad, None


def _local_offset_s(stamp: pd.Timestamp) -> float:
    """This machine's UTC offset (s) at a naive local time (one offset for the whole file)."""
    fields = stamp.to_pydatetime().timetuple()
    try:
        return calendar.timegm(fields) - time.mktime(fields)
    except (OverflowError, ValueError):
        return 0.0


_PRODUCT_NAME = r"\s*(?=.*[A-Za-z]{2})(?=.*\d)(?!.*(?:N/A|ERR))[\w .\-]{4,}\s*"
"""A product name (``GeForce GTX 1080 Ti``, ``NVIDIA A100-SXM4-80GB``): letters and digits,
no ``[N/A]`` or ``ERR!`` — a garbled name must not make a GPU of its own."""


def _gpu_numbers(frame: pd.DataFrame) -> tuple[pd.Series, str | None]:
    """GPU index per row: the ``index`` column, else first appearance of uuid / PCI bus id,
    else of the product name when the rows name several."""
    if "gpu" in frame and frame["gpu"].notna().all():
        return frame["gpu"].astype(np.int64), None
    for key in ("uuid", "pci_bus_id"):
        if key in frame and frame[key].notna().all():
            codes, _ = pd.factorize(frame[key])
            return pd.Series(codes, index=frame.index, dtype=np.int64), (
                f"no index column: GPUs numbered in order of first appearance of their {key}"
            )
    names = frame.get("name")
    if (
        names is not None
        and names.notna().all()
        and names.nunique() > 1
        and names.astype(str).str.fullmatch(_PRODUCT_NAME).all()
    ):
        # a desktop's mixed GPUs (a GTX 1080 Ti beside a GTX 1060) are told apart by name;
        # identical GPUs without an index can't be, and stay one
        codes, _ = pd.factorize(frame["name"])
        return pd.Series(codes, index=frame.index, dtype=np.int64), (
            "no index, UUID or bus id column: GPUs told apart by their names"
        )
    return pd.Series(0, index=frame.index, dtype=np.int64), None


def _imported(path: Path, frame: pd.DataFrame, anchored: bool, notes: list[str]) -> Imported:
    """Samples (one row per GPU reading) and the GPU inventory."""
    host = host_name(path)
    frame["gpu"], id_note = _gpu_numbers(frame)
    if id_note:
        notes.append(id_note)
    if not anchored:  # rows of each GPU 1 s apart, from 0
        frame["t_ns"] = frame.groupby("gpu").cumcount().astype(np.int64) * 1_000_000_000
    if "mem_total_bytes" not in frame and {"mem_used_bytes", "mem_free_bytes"} <= set(frame):
        frame["mem_total_bytes"] = frame["mem_used_bytes"] + frame["mem_free_bytes"]
    if "mem_used_bytes" not in frame and {"mem_total_bytes", "mem_free_bytes"} <= set(frame):
        frame["mem_used_bytes"] = frame["mem_total_bytes"] - frame["mem_free_bytes"]
    frame = frame.sort_values(["gpu", "t_ns", "line"], kind="stable", ignore_index=True)
    dup = frame.duplicated(["gpu", "t_ns"])
    if dup.any():
        notes.append(f"{int(dup.sum())} rows repeat an earlier timestamp of their GPU: dropped")
        frame = frame[~dup].reset_index(drop=True)
    gpus = []
    for gpu, rows in frame.groupby("gpu", sort=True):
        entry: dict = {"host": host, "index": int(gpu)}
        for key in ("uuid", "name", "pci_bus_id", "mem_total_bytes", *_INVENTORY_FIELDS):
            if key in rows and rows[key].notna().any():
                value = rows[key].dropna().iloc[-1]
                if isinstance(value, str):
                    entry[key] = value
                else:  # watts keep their fraction (250.5 W); counts and bytes are whole
                    entry[key] = float(value) if key.endswith("_w") else int(value)
        gpus.append(entry)
    samples = pd.DataFrame(
        {
            "host": host,
            "gpu": frame["gpu"].to_numpy(np.int64),
            "uuid": frame.get("uuid"),
            "t_ns": frame["t_ns"].to_numpy(np.int64),
        }
    )
    for col in (
        "util_gpu_pct",
        "util_mem_pct",
        "mem_used_bytes",
        "mem_total_bytes",
        "power_w",
        "sm_clock_mhz",
        "temp_c",
        "clock_event_reasons",
    ):
        samples[col] = frame[col].to_numpy(np.float64) if col in frame else np.nan
    meta: dict = {"gpus": gpus, "start_ns": int(samples["t_ns"].min())}
    meta["end_ns"] = int(samples["t_ns"].max())
    intervals = frame.groupby("gpu")["t_ns"].diff().dropna()
    if len(intervals):
        meta["interval_s"] = float(intervals.median()) / 1e9
    elif not anchored:  # one row per GPU: the 1 s the rows are taken to stand for
        meta["interval_s"] = 1.0
    return Imported(
        source=path,
        format=FORMAT,
        frames={"gpu": samples},
        meta=meta,
        anchored=anchored,
        notes=notes,
    )
