"""``nvidia-smi dmon`` output → GPU samples.

dmon prints a ``#`` header naming its columns and a ``#`` line of units, repeated every so many
rows, then one whitespace-separated row per GPU per interval, ``-`` where a figure is missing::

    # gpu    pwr  gtemp  mtemp     sm    mem    enc    dec   mclk   pclk
    # Idx      W      C      C      %      %      %      %    MHz    MHz
        0     43     48      -      0      0      0      0    877    135

With ``-o DT`` each row starts with the date (``20240501``) and time (``12:34:56``), local time
of the logging machine; with ``-o T`` only the time. Without dates the rows carry no wall clock:
they are taken as dmon's default 1 s apart from t=0 (the import is then not anchored).
Columns: ``sm`` (percent of time a kernel ran, what NVML calls GPU utilization) →
``util_gpu_pct``, ``mem`` → ``util_mem_pct``, ``pwr`` W, ``gtemp`` °C, ``pclk`` MHz (the SM
clock), ``fb`` MiB, ``rxpci``/``txpci`` MB/s; the other columns are not imported.
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
    """Read the whole output; raises `ImportFormatError` (``path:line: reason``) when malformed."""
    text = open_text(path)
    header: list[str] | None = None
    rows: list[list[str]] = []
    lines: list[int] = []
    skipped: list[int] = []
    headers: dict[tuple[str, ...], int] = {}
    numbered = [(i, ln.strip()) for i, ln in enumerate(text.splitlines(), 1) if ln.strip()]
    last = numbered[-1][0] if numbered else 0
    for lineno, line in numbered:
        if line.startswith("#"):
            if _HEADER_RE.match(line):
                names = [t.lower() for t in line.lstrip("#").split()]
                if header is not None and names != header and rows:
                    raise ImportFormatError(
                        f"{path}:{lineno}: the columns change halfway (import each part alone)"
                    )
                header = names
                headers.setdefault(tuple(names), lineno)
            continue  # the units line, or a comment
        if header is None:
            raise ImportFormatError(f"{path}:{lineno}: a row before dmon's '# gpu …' header")
        cells = line.split()
        if len(cells) != len(header):
            if lineno == last:
                skipped.append(lineno)
                continue
            raise ImportFormatError(
                f"{path}:{lineno}: {len(cells)} values where the header names {len(header)}"
            )
        rows.append(cells)
        lines.append(lineno)
    if header is None or not rows:
        raise ImportFormatError(f"{path}: no samples")
    if "gpu" not in header:
        raise ImportFormatError(f"{path}:{next(iter(headers.values()))}: no gpu column")
    notes = [f"line {skipped[0]}: incomplete last line skipped"] if skipped else []
    raw = pd.DataFrame(rows, columns=header, dtype=object)
    line_no = np.asarray(lines)
    gpu = _column(path, raw, "gpu", line_no)
    if gpu.isna().any():
        i = int(np.argmax(gpu.isna().to_numpy()))
        raise ImportFormatError(f"{path}:{line_no[i]}: gpu: missing index")
    t_ns, anchored, note = _times(path, raw, line_no, gpu)
    if note:
        notes.append(note)
    host = host_name(path)
    samples = pd.DataFrame(
        {"host": host, "gpu": gpu.to_numpy(np.int64), "uuid": None, "t_ns": t_ns}
    )
    for name, (target, factor) in COLUMNS.items():
        if name in raw:
            samples[target] = _column(path, raw, name, line_no).to_numpy() * factor
    ignored = [n for n in header if n not in COLUMNS and n not in ("gpu", "date", "time")]
    if ignored:
        notes.append(f"columns not imported: {', '.join(ignored)}")
    samples = samples.sort_values(["gpu", "t_ns"], kind="stable", ignore_index=True)
    gpus = [{"host": host, "index": int(g)} for g in sorted(samples["gpu"].unique())]
    intervals = samples.groupby("gpu")["t_ns"].diff().dropna()
    meta = {
        "gpus": gpus,
        "start_ns": int(samples["t_ns"].min()),
        "end_ns": int(samples["t_ns"].max()),
    }
    if len(intervals):
        meta["interval_s"] = float(intervals.median()) / 1e9
    return Imported(path, FORMAT, {"gpu": samples}, meta, anchored, notes)


def _column(path: Path, raw: pd.DataFrame, name: str, line_no: np.ndarray) -> pd.Series:
    """A numeric column; ``-`` → NaN; anything else that is not a number is an error."""
    codes, uniques = pd.factorize(raw[name].to_numpy(object))  # each distinct cell read once
    values = np.full(len(uniques), np.nan)
    for j, cell in enumerate(uniques):
        if cell in _MISSING:
            continue
        if not _NUMBER_RE.match(cell):
            i = int(np.argmax(codes == j))
            raise ImportFormatError(f"{path}:{line_no[i]}: {name}: not a number: {cell!r}")
        values[j] = float(cell)
    return pd.Series(values[codes], index=raw.index)


def _times(
    path: Path, raw: pd.DataFrame, line_no: np.ndarray, gpu: pd.Series
) -> tuple[np.ndarray, bool, str | None]:
    """(t_ns per row, anchored, note): ``-o DT`` dates and times, ``-o T`` times, or none."""
    if "date" in raw and "time" in raw:
        text = raw["date"].astype(str) + " " + raw["time"].astype(str)
        stamps = pd.to_datetime(text, format="%Y%m%d %H:%M:%S", errors="coerce")
        if stamps.isna().any():
            i = int(np.argmax(stamps.isna().to_numpy()))
            raise ImportFormatError(f"{path}:{line_no[i]}: cannot read date/time {text.iloc[i]!r}")
        fields = stamps.iloc[0].to_pydatetime().timetuple()
        offset_s = calendar.timegm(fields) - time.mktime(fields)
        wall = stamps.astype("datetime64[ns]").astype(np.int64).to_numpy()
        note = (
            f"dmon times have no time zone: read as this machine's local time "
            f"(UTC{offset_s / 3600:+g} h); set TZ to the logging machine's zone if it differs"
        )
        return wall - int(offset_s * 1e9), True, note
    if "time" in raw:
        clock = pd.to_datetime(raw["time"].astype(str), format="%H:%M:%S", errors="coerce")
        if clock.isna().any():
            i = int(np.argmax(clock.isna().to_numpy()))
            raise ImportFormatError(
                f"{path}:{line_no[i]}: cannot read time {raw['time'].iloc[i]!r}"
            )
        seconds = (clock.dt.hour * 3600 + clock.dt.minute * 60 + clock.dt.second).to_numpy()
        # a clock going backwards is midnight passing: count the days
        days = np.cumsum(np.r_[0, np.diff(seconds) < -43_200])
        elapsed = seconds + 86_400 * days
        return (
            (elapsed - elapsed[0]).astype(np.int64) * 1_000_000_000,
            False,
            ("time of day without a date (dmon -o T): times count from the first row"),
        )
    order = gpu.groupby(gpu).cumcount().to_numpy(np.int64)
    return (
        order * 1_000_000_000,
        False,
        ("no date/time columns (dmon without -o DT): rows taken as 1 s apart from the start"),
    )
