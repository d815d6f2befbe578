"""nvidia-smi ``--query-gpu=… --format=csv`` logs → GPU samples.

What such logs look like in the wild:

- any subset of query fields in any order, the header naming them (``utilization.gpu [%]``, or
  ``utilization.gpu`` with ``nounits``, in which case values carry no units either);
- values with units (``22 %``, ``841 MiB``, ``33.09 W``) or without, ``[N/A]`` / ``[Not
  Supported]`` for what the GPU does not report;
- the header repeated before every row (a logger that appends one ``nvidia-smi`` call per
  sample), or a new header when the query changed halfway;
- nvidia-smi's own timestamps (``2024/05/01 12:34:56.789``, the logging machine's local time,
  no zone), Unix-epoch timestamps (s, ms, µs or ns) from a custom logger, or ISO 8601;
- one GPU and no ``index`` column; several GPUs told apart by ``index``, ``uuid`` or
  ``pci.bus_id``;
- UTF-8, or UTF-16 with a BOM (what PowerShell redirection writes).

A file without a header (``noheader``) is refused with a message asking for one: the columns
could be guessed for a few field sets, but ``utilization.gpu`` and ``utilization.memory`` (or
``memory.used`` and ``memory.total``) look alike, and a silent wrong guess would be worse.
"""

from __future__ import annotations

import calendar
import re
import time
from pathlib import Path

import numpy as np
import pandas as pd

from gpuprof.collectors.importers import Imported, ImportFormatError, open_text

FORMAT = "nvidia-smi-csv"

_MIB = 2**20
_MEMORY_UNITS = {"": _MIB, "mib": _MIB, "gib": 2**30, "kib": 2**10, "b": 1, "mb": _MIB}
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
    "clocks.sm": "sm_clock_mhz",
    "clocks.current.sm": "sm_clock_mhz",
    "temperature.gpu": "temp_c",
    "pcie.link.gen.current": "pcie_link_gen",
    "pcie.link.gen.gpucurrent": "pcie_link_gen",
    "pcie.link.width.current": "pcie_link_width",
    "pcie.link.gen.max": "pcie_link_gen_max",
    "pcie.link.gen.gpumax": "pcie_link_gen_gpu_max",
    "pcie.link.width.max": "pcie_link_width_max",
}
"""Query field → column (GpuSample field, or an inventory figure); units: %, bytes, W, MHz, °C."""

_MEMORY_FIELDS = {"mem_used_bytes", "mem_total_bytes", "mem_free_bytes"}
_INVENTORY_FIELDS = {"pcie_link_gen", "pcie_link_width", "pcie_link_gen_max",
                     "pcie_link_gen_gpu_max", "pcie_link_width_max"}  # fmt: skip
_REASON_FIELDS = {"clocks_event_reasons.active", "clocks_throttle_reasons.active"}
_ID_FIELDS = {"index": "gpu", "uuid": "uuid", "name": "name", "pci.bus_id": "pci_bus_id"}
_ALIASES = {
    "gpu_uuid": "uuid",
    "gpu_name": "name",
    "gpu_bus_id": "pci.bus_id",
    "clocks.current.graphics": "clocks.gr",
}
_DISTINCTIVE = {*NUMERIC_FIELDS, *_REASON_FIELDS, "pci.bus_id"}
"""Fields of which a header needs one: ``timestamp, index, name`` alone is any CSV's header."""

_FIELD_RE = re.compile(r"^([a-z][a-z0-9_]*(?:\.[a-z0-9_]+)*)(?:\s*\[([^\]]*)\])?$")
_SMI_TIME_RE = re.compile(r"^\d{4}/\d{2}/\d{2} \d{2}:\d{2}:\d{2}(\.\d+)?$")
_NUMBER_RE = r"^\s*([-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?)\s*([A-Za-z%]*)\s*$"
_NA_RE = r"^\s*(\[.*\]|N/A|n/a|NA|Unknown|unknown|)\s*$"
_NA = re.compile(_NA_RE)


def _field(cell: str) -> tuple[str, str] | None:
    """``("memory.used", "MiB")`` for a header cell ``memory.used [MiB]``, None if not a field."""
    match = _FIELD_RE.match(cell.strip())
    if match is None:
        return None
    name = _ALIASES.get(match.group(1), match.group(1))
    return name, (match.group(2) or "").strip()


def _header(cells: list[str]) -> list[tuple[str, str]] | None:
    """The fields of a header line, or None when the line is not a header."""
    fields = []
    for cell in cells:  # a data row fails on its first cell: stop there
        field = _field(cell)
        if field is None:
            return None
        fields.append(field)
    if not any(name in _DISTINCTIVE for name, _ in fields):  # type: ignore[misc]
        return None
    return fields  # type: ignore[return-value]


def _cells(line: str) -> list[str]:
    """A line's cells, not yet stripped (done once per distinct value, see `_distinct`)."""
    return line.split(",")


def _distinct(col: pd.Series) -> tuple[np.ndarray, list[str]]:
    """(codes, distinct stripped cells): logs repeat a few values (0-100 %, one total, one
    name), so each distinct cell is read once and the result taken by code."""
    codes, uniques = pd.factorize(col.to_numpy(object))
    return codes, [str(u).strip() for u in uniques]


def sniff(head: str, path: Path) -> bool:
    """A header of query fields on the first line, or a headerless nvidia-smi row."""
    for line in head.splitlines():
        if not line.strip():
            continue
        cells = _cells(line)
        if _header(cells) is not None:
            return True
        # noheader: refused by parse with a message that asks for the header
        return len(cells) >= 2 and bool(_SMI_TIME_RE.match(cells[0]))
    return False


def host_name(path: Path) -> str:
    """The host a single-machine log is filed under: the file's stem (``imported`` if none)."""
    stem = re.sub(r"[^A-Za-z0-9_.-]+", "_", path.name.split(".")[0]).strip("_")
    return stem or "imported"


def parse(path: Path) -> Imported:
    """Read a whole log; raises `ImportFormatError` (``path:line: reason``) when malformed."""
    text = open_text(path)
    segments: list[tuple[list[tuple[str, str]], list[list[str]], list[int]]] = []
    header: list[tuple[str, str]] | None = None
    header_text = None
    rows: list[list[str]] = []
    lines: list[int] = []
    skipped: list[int] = []
    numbered = [(i, ln) for i, ln in enumerate(text.splitlines(), 1) if ln.strip()]
    last = numbered[-1][0] if numbered else 0
    for lineno, line in numbered:
        if line == header_text:  # the repeated header: the common case, cheapest test first
            continue
        cells = _cells(line)
        fields = _header(cells)
        if fields is not None:
            if fields != header:
                if rows:
                    segments.append((header, rows, lines))  # type: ignore[arg-type]
                rows, lines = [], []
                header = fields
                names = [n for n, _ in fields]
                dup = {n for n in names if names.count(n) > 1}
                if dup:
                    raise ImportFormatError(f"{path}:{lineno}: field {sorted(dup)[0]} twice")
            header_text = line
            continue
        if header is None:
            raise ImportFormatError(
                f"{path}:{lineno}: no header line (a noheader log?): put the --query-gpu "
                "field names, comma-separated, on the first line and import again"
            )
        if len(cells) != len(header):
            if lineno == last:  # the logger was stopped mid-write
                skipped.append(lineno)
                continue
            raise ImportFormatError(
                f"{path}:{lineno}: {len(cells)} values where the header names {len(header)}"
            )
        rows.append(cells)
        lines.append(lineno)
    if rows:
        segments.append((header, rows, lines))  # type: ignore[arg-type]
    if not segments:
        raise ImportFormatError(f"{path}: no samples (only a header or nothing)")

    notes: list[str] = []
    if skipped:
        notes.append(f"line {skipped[0]}: incomplete last line skipped")
    frames, ignored = [], set()
    zone_note = None
    anchored = True
    for fields, seg_rows, seg_lines in segments:
        frame, seg_ignored, seg_anchored, seg_zone = _segment(path, fields, seg_rows, seg_lines)
        frames.append(frame)
        ignored |= seg_ignored
        anchored &= seg_anchored
        zone_note = zone_note or seg_zone
    if ignored:
        notes.append(f"fields not imported: {', '.join(sorted(ignored))}")
    if zone_note:
        notes.append(zone_note)
    if not anchored:
        notes.append("no timestamp column: samples taken as 1 s apart (nvidia-smi -l 1)")
    return _imported(path, pd.concat(frames, ignore_index=True), anchored, notes)


def _segment(
    path: Path, fields: list[tuple[str, str]], rows: list[list[str]], lines: list[int]
) -> tuple[pd.DataFrame, set[str], bool, str | None]:
    """Typed columns of the rows under one header: (frame, fields ignored, anchored, zone note)."""
    raw = pd.DataFrame(rows, columns=[n for n, _ in fields], dtype=object)
    line_no = np.asarray(lines)
    out = pd.DataFrame({"line": line_no})
    ignored: set[str] = set()
    for name, unit in fields:
        if name == "timestamp":
            continue
        col = raw[name]
        if name == "index":
            out["gpu"] = _numbers(path, name, col, line_no, "")[0]
        elif name in _ID_FIELDS:
            codes, uniques = _distinct(col)
            values = np.array([None if _NA.fullmatch(u) else u for u in uniques], dtype=object)
            out[_ID_FIELDS[name]] = pd.Series(values[codes], dtype=object)  # no str inference
        elif name in NUMERIC_FIELDS:
            target = NUMERIC_FIELDS[name]
            number, units = _numbers(path, name, col, line_no, unit)
            if target in _MEMORY_FIELDS:
                scale = units.str.lower().map(_MEMORY_UNITS)
                bad = scale.isna() & number.notna()
                if bad.any():
                    i = int(np.argmax(bad.to_numpy()))
                    raise ImportFormatError(
                        f"{path}:{line_no[i]}: {name}: unknown unit {units.iloc[i]!r}"
                    )
                number = number * scale
            out[target] = number
        elif name in _REASON_FIELDS:
            out["clock_event_reasons"] = _bitmasks(path, name, col, line_no)
        else:
            ignored.add(name)
    anchored, zone = True, None
    if "timestamp" in raw:
        stamps = pd.Series([str(c).strip() for c in raw["timestamp"]], dtype=object)
        out["t_ns"], zone = _timestamps(path, stamps, line_no)
    else:
        anchored = False
        out["t_ns"] = 0
    return out, ignored, anchored, zone


def _numbers(
    path: Path, name: str, col: pd.Series, line_no: np.ndarray, header_unit: str
) -> tuple[pd.Series, pd.Series]:
    """Numbers and their units from cells like ``22 %``; ``[N/A]`` and friends → NaN."""
    codes, uniques = _distinct(col)
    cells = pd.Series(uniques, dtype=object)
    parts = cells.str.extract(_NUMBER_RE)
    number = pd.to_numeric(parts[0], errors="coerce").to_numpy(np.float64)
    bad = np.isnan(number) & ~cells.str.fullmatch(_NA_RE).to_numpy(bool)
    if bad.any():
        i = int(np.argmax(bad[codes]))
        text = str(col.iloc[i]).strip()
        raise ImportFormatError(f"{path}:{line_no[i]}: {name}: not a number: {text!r}")
    units = parts[1].fillna("")
    units = units.where(units != "", header_unit).to_numpy(object)
    return pd.Series(number[codes], index=col.index), pd.Series(units[codes], index=col.index)


def _bitmasks(path: Path, name: str, col: pd.Series, line_no: np.ndarray) -> pd.Series:
    """``0x0000000000000004`` → 4; ``[N/A]`` → NaN (float: a mask fits 53 bits)."""
    codes, uniques = _distinct(col)
    masks = np.full(len(uniques), np.nan)
    for j, text in enumerate(uniques):
        if _NA.fullmatch(text):
            continue
        try:
            masks[j] = float(int(text, 16) if text.lower().startswith("0x") else int(text))
        except ValueError:
            i = int(np.argmax(codes == j))
            raise ImportFormatError(
                f"{path}:{line_no[i]}: {name}: not a bit mask: {text!r}"
            ) from None
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


def _timestamps(path: Path, col: pd.Series, line_no: np.ndarray) -> tuple[pd.Series, str | None]:
    """Timestamps → integer ns since the epoch, and a note when the zone had to be assumed."""
    col = col.str.strip()
    first = col.iloc[0]
    if _SMI_TIME_RE.match(first):
        stamps = pd.to_datetime(col, format="%Y/%m/%d %H:%M:%S.%f", errors="coerce")
        missing = stamps.isna()
        if missing.any():  # nvidia-smi versions without milliseconds
            stamps[missing] = pd.to_datetime(
                col[missing], format="%Y/%m/%d %H:%M:%S", errors="coerce"
            )
        _check(path, "timestamp", col, stamps.isna(), line_no)
        wall = stamps.astype("datetime64[ns]").astype(np.int64)
        offset_s = _local_offset_s(stamps.iloc[0])
        zone = (
            f"nvidia-smi timestamps have no time zone: read as this machine's local time "
            f"(UTC{offset_s / 3600:+g} h); set TZ to the logging machine's zone if it differs"
        )
        return wall - int(offset_s * 1e9), zone
    number = pd.to_numeric(col, errors="coerce")
    if number.notna().all():
        ns = number * epoch_scale(number)
        _check(path, "timestamp", col, ~np.isfinite(ns) | (ns < 0) | (ns >= 2**63 - 1), line_no)
        return epoch_ns(number), None
    stamps = pd.to_datetime(col, format="ISO8601", errors="coerce", utc=True)
    _check(path, "timestamp", col, stamps.isna(), line_no)
    return stamps.astype("datetime64[ns, UTC]").astype(np.int64), None


def _check(path: Path, name: str, col: pd.Series, bad: pd.Series, line_no: np.ndarray) -> None:
    if bad.any():
        i = int(np.argmax(bad.to_numpy()))
        raise ImportFormatError(f"{path}:{line_no[i]}: {name}: cannot read {col.iloc[i]!r}")


def _local_offset_s(stamp: pd.Timestamp) -> float:
    """This machine's UTC offset (s) at a naive local time (one offset for the whole file)."""
    fields = stamp.to_pydatetime().timetuple()
    try:
        return calendar.timegm(fields) - time.mktime(fields)
    except (OverflowError, ValueError):
        return 0.0


def _gpu_numbers(frame: pd.DataFrame) -> tuple[pd.Series, str | None]:
    """GPU index per row: the ``index`` column, else first appearance of uuid / PCI bus id."""
    if "gpu" in frame and frame["gpu"].notna().all():
        return frame["gpu"].astype(np.int64), None
    for key in ("uuid", "pci_bus_id"):
        if key in frame and frame[key].notna().all():
            codes, _ = pd.factorize(frame[key])
            return pd.Series(codes, index=frame.index, dtype=np.int64), (
                f"no index column: GPUs numbered in order of first appearance of their {key}"
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
                entry[key] = value if isinstance(value, str) else int(value)
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
    return Imported(
        source=path,
        format=FORMAT,
        frames={"gpu": samples},
        meta=meta,
        anchored=anchored,
        notes=notes,
    )
