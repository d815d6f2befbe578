"""What people paste when a GPU looks stuck: the default ``nvidia-smi`` table and ``gpustat``.

The ``nvidia-smi`` table (one snapshot, or many from ``watch nvidia-smi`` or a loop) gives per
GPU, two lines in a box::

    |   0  Tesla V100-SXM2...  On   | 00000000:06:00.0 Off |                    0 |
    | N/A   66C    P0   253W / 300W |   9000MiB / 16152MiB |     98%   E. Process |

(index, name, bus id; fan, temperature, performance state, power draw / limit, memory used /
total, utilization), newer drivers with wider columns and a third line, and below it the
processes holding memory (``No running processes found`` when none). ``gpustat`` prints one
line per GPU: ``[6] NVIDIA A100 80GB PCIe | 52'C, 100 % | 10151 / 81920 MB | user(10151M)``.

Each snapshot becomes one sample per GPU; snapshots are laid 1 s apart unless a timestamp
line (``Mon Jul  1 11:50:10 2019``) above each gives their spacing. A single snapshot is a
single reading, and the diagnosis says so through its low sample count. The power limit goes
into the GPU inventory (what ``power_cap`` compares the draw against).
"""

from __future__ import annotations

import itertools
import re
from datetime import datetime
from pathlib import Path

import numpy as np
import pandas as pd

from gpuprof.collectors.importers import ANSI, Imported, ImportFormatError, open_text
from gpuprof.collectors.importers.nvidia_smi import host_name

FORMAT = "nvidia-smi-table"

MIB = 1024**2

_SMI_GPU = re.compile(
    r"^\|\s*(?P<index>\d+)\s+(?P<name>\S.*?)\s+(?:On|Off)\s*\|\s*(?P<bus>[0-9A-Fa-f]{4,8}:"
    r"[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2}\.\d)\s+(?:On|Off)\s*\|"
)
_SMI_READING = re.compile(
    r"^\|\s*(?:N/A|\d+%)\s+(?P<temp>N/A|\d+)C\s+(?P<perf>P\d+|N/A)\s+(?P<power>N/A|[\d.]+)W?"
    r"\s*/\s*(?P<limit>N/A|[\d.]+)W?\s*\|\s*(?P<used>\d+)MiB\s*/\s*(?P<total>\d+)MiB\s*\|"
    r"\s*(?P<util>N/A|\d+)%"
)
_SMI_PROCESS = re.compile(
    r"^\|\s+(?P<gpu>\d+)\s+(?:(?:N/A|\d+)\s+(?:N/A|\d+)\s+)?(?P<pid>\d+)\s+[CGM+]+\s+"
    r"\S.*?\s+(?P<mem>\d+)MiB\s*\|"
)
_GPUSTAT = re.compile(
    r"^\[(?P<index>\d+)\]\s+(?P<name>\S.*?)\s*\|\s*(?P<temp>\d+)\s*(?:'|°)?C,\s*"
    r"(?P<util>\d+)\s*%(?:,\s*(?P<power>\d+)\s*/\s*(?P<limit>\d+)\s*W)?\s*\|\s*"
    r"(?P<used>\d+)\s*/\s*(?P<total>\d+)\s*MB\s*\|(?P<procs>.*)$"
)
_GPUSTAT_PROC = re.compile(r"\((?P<mem>\d+)M\)")
_STAMP = re.compile(
    r"\b(?P<mon>Jan|Feb|Mar|Apr|May|Jun|Jul|Aug|Sep|Oct|Nov|Dec)\s+(?P<day>\d{1,2})\s+"
    r"(?P<time>\d{2}:\d{2}:\d{2})\s+(?P<year>\d{4})\b"
)


def sniff(head: str, path: Path) -> bool:
    """An nvidia-smi table (a GPU line and its reading line) or a gpustat GPU line."""
    lines = [ANSI.sub("", line) for line in head.splitlines()]
    if any(_GPUSTAT.match(line.strip()) for line in lines):
        return True
    return any(
        _SMI_GPU.match(a.strip()) and _SMI_READING.match(b.strip())
        for a, b in itertools.pairwise(lines)
    )


def parse(path: Path) -> Imported:
    """One sample per GPU per snapshot, the processes each table lists, the GPU inventory."""
    lines = [ANSI.sub("", line).strip() for line in open_text(path).splitlines()]
    rows: list[dict] = []
    procs: list[dict] = []
    snapshot, stamp, pending = -1, None, None
    seen: set[int] = set()
    stamps: dict[int, float] = {}
    for number, line in enumerate(lines, 1):
        match = _STAMP.search(line)
        if match and not line.startswith("|"):
            stamp = _epoch(match)
            continue
        gpu = _SMI_GPU.match(line) or _GPUSTAT.match(line)
        if gpu is not None:
            index = int(gpu["index"])
            if index in seen or snapshot < 0:  # a GPU seen again starts the next snapshot
                snapshot, seen = snapshot + 1, set()
                if stamp is not None:
                    stamps[snapshot] = stamp
                stamp = None
            seen.add(index)
            if gpu.re is _GPUSTAT:
                rows.append(_row(snapshot, index, gpu["name"], None, gpu, number))
                procs.extend(
                    {"snapshot": snapshot, "gpu": index, "pid": 0, "mem": int(m["mem"]) * MIB}
                    for m in _GPUSTAT_PROC.finditer(gpu["procs"])
                )
                pending = None
            else:
                pending = (index, gpu["name"], gpu["bus"])
            continue
        reading = _SMI_READING.match(line)
        if reading is not None and pending is not None:
            index, name, bus = pending
            rows.append(_row(snapshot, index, name, bus, reading, number))
            pending = None
            continue
        process = _SMI_PROCESS.match(line)
        if process is not None and snapshot >= 0:
            mem = int(process["mem"]) * MIB
            procs.append(
                {"snapshot": snapshot, "gpu": int(process["gpu"]), "pid": int(process["pid"]),
                 "mem": mem}
            )  # fmt: skip
    if not rows:
        raise ImportFormatError(f"{path}: no GPU rows of an nvidia-smi table or gpustat")
    return _imported(path, pd.DataFrame(rows), procs, stamps)


def _row(snapshot: int, index: int, name: str, bus: str | None, m: re.Match, line: int) -> dict:
    return {
        "snapshot": snapshot,
        "gpu": index,
        "name": name.strip(),
        "pci_bus_id": bus,
        "util_gpu_pct": _num(m["util"]),
        "temp_c": _num(m["temp"]),
        "power_w": _num(m["power"]),
        "power_limit_w": _num(m["limit"]),
        "mem_used_bytes": int(m["used"]) * MIB,
        "mem_total_bytes": int(m["total"]) * MIB,
        "line": line,
    }


def _num(text: str | None) -> float:
    if text is None or text == "N/A":
        return np.nan
    return float(text)


def _epoch(match: re.Match) -> float | None:
    text = f"{match['mon']} {match['day']} {match['time']} {match['year']}"
    try:
        return datetime.strptime(text, "%b %d %H:%M:%S %Y").timestamp()
    except ValueError:
        return None


def _imported(
    path: Path, frame: pd.DataFrame, procs: list[dict], stamps: dict[int, float]
) -> Imported:
    host = host_name(path)
    snapshots = int(frame["snapshot"].max()) + 1
    notes = []
    # the spacing of snapshots comes from their timestamps when every one has its own
    ordered = [stamps.get(k) for k in range(snapshots)]
    increasing = all(a is not None and b is not None and b > a for a, b in
                     itertools.pairwise(ordered))  # fmt: skip
    if snapshots > 1 and len(stamps) == snapshots and increasing:
        first = min(stamps.values())
        offset = {k: round((v - first) * 1e9) for k, v in stamps.items()}
        notes.append("snapshots placed by the timestamp printed above each table")
    else:
        offset = {k: k * 1_000_000_000 for k in range(snapshots)}
        notes.append(
            f"{snapshots} snapshot(s) of GPU status with no clock: laid 1 s apart"
            if snapshots > 1
            else "one snapshot of GPU status: a single reading per GPU, not a time series"
        )
    frame["t_ns"] = frame["snapshot"].map(offset).astype(np.int64)
    gpus = []
    for index, rows in frame.groupby("gpu", sort=True):
        entry: dict = {"host": host, "index": int(index), "name": str(rows["name"].iloc[-1])}
        if rows["pci_bus_id"].notna().any():
            entry["pci_bus_id"] = str(rows["pci_bus_id"].dropna().iloc[-1])
        entry["mem_total_bytes"] = int(rows["mem_total_bytes"].iloc[-1])
        if rows["power_limit_w"].notna().any():
            entry["power_limit_w"] = float(rows["power_limit_w"].dropna().iloc[-1])
        gpus.append(entry)
    samples = pd.DataFrame(
        {"host": host, "gpu": frame["gpu"].to_numpy(np.int64), "uuid": None,
         "t_ns": frame["t_ns"].to_numpy(np.int64)}
    )  # fmt: skip
    for column in ("util_gpu_pct", "mem_used_bytes", "mem_total_bytes", "power_w", "temp_c"):
        samples[column] = frame[column].to_numpy(np.float64)
    for column in ("util_mem_pct", "sm_clock_mhz", "clock_event_reasons"):
        samples[column] = np.nan
    frames = {"gpu": samples}
    if procs:
        table = pd.DataFrame(procs)
        frames["gpu_procs"] = pd.DataFrame(
            {
                "host": host,
                "t_ns": table["snapshot"].map(offset).astype(np.int64).to_numpy(),
                "gpu": table["gpu"].to_numpy(np.int64),
                "pid": table["pid"].to_numpy(np.int64),
                "gpu_mem_bytes": table["mem"].to_numpy(np.int64),
                "sm_util_pct": np.nan,
                "watched": False,
            }
        )
    meta: dict = {
        "gpus": gpus,
        "start_ns": int(samples["t_ns"].min()),
        "end_ns": int(samples["t_ns"].max()),
        "interval_s": 1.0,
    }
    return Imported(
        source=path, format=FORMAT, frames=frames, meta=meta, anchored=False, notes=notes
    )
