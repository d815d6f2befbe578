"""``nvidia-smi dmon`` output → GPU samples.

dmon prints a ``#`` header naming its columns and a ``#`` line of units, repeated every so many
rows, then one whitespace-separated row per GPU per interval, ``-`` where a figure is missing::

    # gpu    pwr  gtemp  mtemp     sm    mem    enc    dec   mclk   pclk
    # Idx      W      C      C      %      %      %      %    MHz    MHz
        0     43     48      -      0      0      0      0    877    135

With ``-o DT`` (or ``-o TD``) each row starts with the date (``20240501``) and time
(``12:34:56``), local time of the logging machine; with ``-o T`` only the time. ``-s`` picks
the column groups (``p`` power/temperature, ``u`` utilization, ``c`` clocks, ``v`` violations,
``m`` memory, ``e`` ECC/PCIe errors, ``t`` PCIe throughput); the header names whichever were
chosen, and both header spellings (``# gpu …`` and ``#Date Time gpu …``) are read. Without
dates the rows carry no wall clock: they are taken as dmon's default 1 s apart from t=0 (the
import is then not anchored).
Columns: ``sm`` (percent of time a kernel ran, what NVML calls GPU utilization) →
``util_gpu_pct``, ``mem`` → ``util_mem_pct``, ``pwr`` W, ``gtemp`` °C, ``pclk`` MHz (the SM
clock), ``fb`` MiB, ``rxpci``/``txpci`` MB/s, ``pviol``/``tviol`` (time held by the power / thermal
limit) as clock-event reasons; the other columns are not imported.
"""

from __future__ import annotations

import calendar
import re
import time
from pathlib import Path

import numpy as np
import pandas as pd

from gpuprof.collectors.importers import Imported, ImportFormatError, open_text
from gpuprof.collectors.importers.nvidia_smi import host_name

FORMAT = "nvidia-smi-dmon"

COLUMNS: dict[str, tuple[str, float]] = {
    "sm": ("util_gpu_pct", 1.0),
    "mem": ("util_mem_pct", 1.0),
    "pwr": ("power_w", 1.0),
    "gtemp": ("temp_c", 1.0),
    "pclk": ("sm_clock_mhz", 1.0),
    "fb": ("mem_used_bytes", float(2**20)),
    "rxpci": ("pcie_rx_bytes_s", 1e6),
    "txpci": ("pcie_tx_bytes_s", 1e6),
}
"""dmon column → (GpuSample field, factor from dmon's unit to the field's)."""

_HEADER_RE = re.compile(r"^#\s*(?:(?:date\s+)?time\s+)?gpu\b", re.IGNORECASE)
_MISSING = {"-", "N/A", "n/a"}
_NUMBER_RE = re.compile(r"^[-+]?(?:\d+\.?\d*|\.\d+)$")


def sniff(head: str, path: Path) -> bool:
    """The first non-empty line is dmon's ``# gpu …`` header (``pmon``'s has ``pid``: not it)."""
    for line in head.splitlines():
        if line.strip():
            tokens = line.lstrip("#").split()
            return bool(_HEADER_RE.match(line.strip())) and "pid" not in tokens and len(tokens) > 1
    return False


def parse(path: Path) -> Imported:
    """Read the whole output; raises `ImportFormatError` (``path:line: reason``) only when no
    row can be read.

    Tolerant of what pasted dmon output holds: blank lines, the header repeated, a new header
    when the ``-s`` selection changed (each part read under its own columns), rows before the
    first header or of the wrong width, ``-`` or junk where a number belongs (skipped and
    counted in a note).
    """
    text = open_text(path)
    header: list[str] | None = None
    parts: list[pd.DataFrame] = []
    rows: list[list[str]] = []
    lines: list[int] = []
    skipped: dict[str, list[int]] = {}
    numbered = [(i, ln.strip()) for i, ln in enumerate(text.splitlines(), 1) if ln.strip()]
    last = numbered[-1][0] if numbered else 0

    def flush() -> None:
        if rows and header is not None:
            part = pd.DataFrame(rows, columns=header, dtype=object)
            part["_line"] = lines[:]
            parts.append(part)
        rows.clear()
        lines.clear()

    for lineno, line in numbered:
        if line.startswith("#"):
            if _HEADER_RE.match(line):
                names = _header_names(line)
                if names != header:
                    flush()
                    header = names
            continue  # the units line, or a comment
        if header is None:
            skipped.setdefault("rows before dmon's '# gpu …' header", []).append(lineno)
            continue
        cells = line.split()
        if len(cells) != len(header):
            why = "incomplete last line" if lineno == last else "rows of the wrong width"
            skipped.setdefault(why, []).append(lineno)
            continue
        rows.append(cells)
        lines.append(lineno)
    flush()
    if not parts:
        where = f" ({_skip_text(skipped)})" if skipped else ""
        raise ImportFormatError(f"{path}: no samples{where}")
    if not any("gpu" in p for p in parts):
        raise ImportFormatError(f"{path}: no gpu column")
    raw = pd.concat([p for p in parts if "gpu" in p], ignore_index=True).fillna("-")
    if len(parts) > 1:
        skipped.setdefault("(note) the columns changed halfway", []).append(int(raw["_line"][0]))
    line_no = raw["_line"].to_numpy(np.int64)
    gpu = _column(raw, "gpu", line_no, skipped)
    bad_gpu = gpu.isna() | (gpu < 0) | (gpu % 1 != 0)
    if bad_gpu.any():
        skipped.setdefault("rows without a GPU index", []).extend(line_no[bad_gpu].tolist())
        raw, gpu, line_no = raw[~bad_gpu].reset_index(drop=True), gpu[~bad_gpu], line_no[~bad_gpu]
        gpu = gpu.reset_index(drop=True)
    if not len(raw):
        raise ImportFormatError(f"{path}: no samples ({_skip_text(skipped)})")
    t_ns, anchored, note, bad_time = _times(raw, line_no, gpu)
    if bad_time.any():
        skipped.setdefault("rows whose date/time can't be read", []).extend(
            line_no[bad_time].tolist()
        )
        keep = ~bad_time
        raw, line_no, t_ns = raw[keep].reset_index(drop=True), line_no[keep], t_ns[keep]
        gpu = gpu[keep].reset_index(drop=True)
    if not len(raw):
        raise ImportFormatError(f"{path}: no samples ({_skip_text(skipped)})")
    notes = [note] if note else []
    host = host_name(path)
    samples = pd.DataFrame(
        {"host": host, "gpu": gpu.to_numpy(np.int64), "uuid": None, "t_ns": t_ns}
    )
    for name, (target, factor) in COLUMNS.items():
        if name in raw:
            values = _column(raw, name, line_no, skipped).to_numpy() * factor
            samples[target] = _in_range(name, target, values, line_no, skipped)
    if "pviol" in raw or "tviol" in raw:
        samples["clock_event_reasons"] = _violations(raw, line_no, skipped)
    names = [n for n in raw.columns if n != "_line"]
    used = {"gpu", "date", "time", "pviol", "tviol"}
    ignored = [n for n in names if n not in COLUMNS and n not in used]
    if ignored:
        notes.append(f"columns not imported: {', '.join(ignored)}")
    notes.extend(_skip_notes(skipped))
    samples = samples.sort_values(["gpu", "t_ns"], kind="stable", ignore_index=True)
    dup = samples.duplicated(["gpu", "t_ns"])
    if dup.any():  # the same GPU twice at one instant (a pasted block repeated)
        notes.append(f"{int(dup.sum())} rows repeat an earlier time of their GPU: dropped")
        samples = samples[~dup].reset_index(drop=True)
    gpus = [{"host": host, "index": int(g)} for g in sorted(samples["gpu"].unique())]
    intervals = samples.groupby("gpu")["t_ns"].diff().dropna()
    meta = {
        "gpus": gpus,
        "start_ns": int(samples["t_ns"].min()),
        "end_ns": int(samples["t_ns"].max()),
        "interval_s": float(intervals.median()) / 1e9 if len(intervals) else 1.0,
    }
    return Imported(path, FORMAT, {"gpu": samples}, meta, anchored, notes)


_RANGES = {"util_gpu_pct": (0, 100), "util_mem_pct": (0, 100), "power_w": (0, 5000),
           "temp_c": (-40, 150), "sm_clock_mhz": (0, 10000)}  # fmt: skip
"""Plausible values of the imported columns; outside them a value is skipped."""


def _violations(raw: pd.DataFrame, line_no: np.ndarray, skipped: dict) -> np.ndarray:
    """``-s v``: the share of the interval the clocks were held by the power (``pviol``) or
    thermal (``tviol``) limit, as the NVML clock-event bits the throttling findings read
    (SW power cap 0x4, SW thermal slowdown 0x20); NaN where neither was reported."""
    bits = np.zeros(len(raw))
    seen = np.zeros(len(raw), dtype=bool)
    for name, bit in (("pviol", 0x4), ("tviol", 0x20)):
        if name in raw:
            values = _column(raw, name, line_no, skipped).to_numpy()
            seen |= np.isfinite(values)
            bits += np.where(np.nan_to_num(values) > 0, bit, 0)
    return np.where(seen, bits, np.nan)


def _header_names(line: str) -> list[str]:
    """Column names of a ``# gpu …`` / ``#Date Time gpu …`` header line, lower case."""
    return [t.lower() for t in line.lstrip("#").split()]


def _in_range(
    name: str, target: str, values: np.ndarray, line_no: np.ndarray, skipped: dict
) -> np.ndarray:
    low, high = _RANGES.get(target, (-np.inf, np.inf))
    with np.errstate(invalid="ignore"):
        bad = (values < low) | (values > high) | np.isinf(values)
    if bad.any():
        skipped.setdefault(f"{name} values out of range", []).extend(line_no[bad].tolist())
        values = np.where(bad, np.nan, values)
    return values


def _skip_notes(skipped: dict[str, list[int]]) -> list[str]:
    notes = []
    for why, where in skipped.items():
        if why.startswith("(note) "):
            notes.append(f"{why[7:]} (line {where[0]}): each part read under its own header")
        else:
            notes.append(f"{len(where)} {why} skipped (first: line {min(where)})")
    return notes


def _skip_text(skipped: dict[str, list[int]]) -> str:
    return "; ".join(_skip_notes(skipped))


def _column(raw: pd.DataFrame, name: str, line_no: np.ndarray, skipped: dict) -> pd.Series:
    """A numeric column; ``-`` → NaN; a cell that is not a number → NaN, counted."""
    codes, uniques = pd.factorize(raw[name].to_numpy(object))  # each distinct cell read once
    values = np.full(len(uniques), np.nan)
    for j, cell in enumerate(uniques):
        if cell in _MISSING:
            continue
        if not _NUMBER_RE.match(cell):
            where = line_no[codes == j].tolist()
            skipped.setdefault(f"{name} values that are not numbers", []).extend(where)
            continue
        values[j] = float(cell)
    return pd.Series(values[codes], index=raw.index)


def _times(
    raw: pd.DataFrame, line_no: np.ndarray, gpu: pd.Series
) -> tuple[np.ndarray, bool, str | None, np.ndarray]:
    """(t_ns per row, anchored, note, rows whose time can't be read): ``-o DT`` dates and
    times (``20240501`` as dmon prints it; ``2024/05/01`` and ``2024-05-01`` too), ``-o T``
    times, or none."""
    n = len(raw)
    no_bad = np.zeros(n, dtype=bool)
    if "date" in raw and "time" in raw:
        date = raw["date"].astype(str).str.replace(r"[/-]", "", regex=True)
        text = date + " " + raw["time"].astype(str)
        stamps = pd.to_datetime(text, format="%Y%m%d %H:%M:%S", errors="coerce")
        # a garbled year (``240``) parses, at a resolution nanoseconds can't hold
        stamps = stamps.where((stamps.dt.year >= 1970) & (stamps.dt.year <= 2200))
        bad = stamps.isna().to_numpy()
        if bad.all():
            return np.zeros(n, dtype=np.int64), True, None, bad
        fields = stamps[~bad].iloc[0].to_pydatetime().timetuple()
        offset_s = calendar.timegm(fields) - time.mktime(fields)
        wall = stamps.astype("datetime64[ns]").astype("int64").to_numpy()
        wall = np.where(bad, 0, wall)
        note = (
            f"dmon times have no time zone: read as this machine's local time "
            f"(UTC{offset_s / 3600:+g} h); set TZ to the logging machine's zone if it differs"
        )
        return wall - int(offset_s * 1e9), True, note, bad
    if "time" in raw:
        clock = pd.to_datetime(raw["time"].astype(str), format="%H:%M:%S", errors="coerce")
        bad = clock.isna().to_numpy()
        seconds = (clock.dt.hour * 3600 + clock.dt.minute * 60 + clock.dt.second).to_numpy()
        seconds = np.where(bad, np.nan, seconds)
        good = seconds[~bad]
        # a clock going backwards is midnight passing: count the days
        days = np.cumsum(np.r_[0, np.diff(good) < -43_200]) if len(good) else good
        elapsed = np.zeros(n)
        elapsed[~bad] = good + 86_400 * days
        start = elapsed[~bad][0] if (~bad).any() else 0.0
        return (
            ((elapsed - start) * 1e9).astype(np.int64),
            False,
            "time of day without a date (dmon -o T): times count from the first row",
            bad,
        )
    order = gpu.groupby(gpu).cumcount().to_numpy(np.int64)
    return (
        order * 1_000_000_000,
        False,
        "no date/time columns (dmon without -o DT): rows taken as 1 s apart from the start",
        no_bad,
    )
