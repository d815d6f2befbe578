"""dcgm-exporter scrapes (Prometheus text format) → GPU samples.

A scrape is what ``curl host:9400/metrics`` returns: ``# HELP``/``# TYPE`` lines and one sample
per metric per GPU, e.g. ``DCGM_FI_DEV_GPU_UTIL{gpu="0",UUID="GPU-…",modelName="…",
Hostname="node1"} 45``, optionally followed by a timestamp in milliseconds. A file may hold one
scrape or many concatenated (a loop of curl calls).

Times: when every sample carries a timestamp the samples are anchored in wall-clock time.
Otherwise scrapes are told apart by repetition — a metric seen again for the same GPU starts a
new scrape — and taken as 1 s apart from t=0 (the import is then not anchored). A file cut off
at either end (a partial first or last line) is imported without that line, with a note.

Each line is read with one regular expression and each distinct label set parsed once (a day of
scrapes repeats the same few hundred): the whole import runs 5-9 times quicker than
`prometheus_client`'s parser alone, whose character-by-character label reader is also
stopped by the first bad line. MIG instance samples (a ``GPU_I_ID`` label) are left out: the samples
describe whole GPUs.
"""

from __future__ import annotations

import math
import re
from pathlib import Path

import numpy as np
import pandas as pd

from gpuprof.collectors.importers import Imported, ImportFormatError, open_text
from gpuprof.collectors.importers.nvidia_smi import host_name

FORMAT = "dcgm-prometheus"

SCRAPE_INTERVAL_S = 1.0
"""Spacing assumed between scrapes that carry no timestamps."""

METRICS: dict[str, tuple[str, float]] = {
    "DCGM_FI_DEV_GPU_UTIL": ("util_gpu_pct", 1.0),
    "DCGM_FI_DEV_MEM_COPY_UTIL": ("util_mem_pct", 1.0),
    "DCGM_FI_DEV_FB_USED": ("mem_used_bytes", float(2**20)),
    "DCGM_FI_DEV_FB_FREE": ("mem_free_bytes", float(2**20)),
    "DCGM_FI_DEV_FB_RESERVED": ("mem_reserved_bytes", float(2**20)),
    "DCGM_FI_DEV_FB_TOTAL": ("mem_total_bytes", float(2**20)),
    "DCGM_FI_DEV_POWER_USAGE": ("power_w", 1.0),
    "DCGM_FI_DEV_SM_CLOCK": ("sm_clock_mhz", 1.0),
    "DCGM_FI_DEV_GPU_TEMP": ("temp_c", 1.0),
    "DCGM_FI_PROF_PCIE_TX_BYTES": ("pcie_tx_bytes_s", 1.0),
    "DCGM_FI_PROF_PCIE_RX_BYTES": ("pcie_rx_bytes_s", 1.0),
    "DCGM_FI_DEV_PCIE_TX_THROUGHPUT": ("pcie_tx_bytes_s", 1024.0),
    "DCGM_FI_DEV_PCIE_RX_THROUGHPUT": ("pcie_rx_bytes_s", 1024.0),
    "DCGM_FI_PROF_NVLINK_TX_BYTES": ("nvlink_tx_bytes_s", 1.0),
    "DCGM_FI_PROF_NVLINK_RX_BYTES": ("nvlink_rx_bytes_s", 1.0),
    "DCGM_FI_PROF_SM_ACTIVE": ("sm_active_pct", 100.0),
    "DCGM_FI_PROF_SM_OCCUPANCY": ("sm_occupancy_pct", 100.0),
    "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE": ("tensor_active_pct", 100.0),
    "DCGM_FI_PROF_DRAM_ACTIVE": ("dram_active_pct", 100.0),
    "DCGM_FI_DEV_CLOCK_THROTTLE_REASONS": ("clock_event_reasons", 1.0),
    "DCGM_FI_DEV_CLOCKS_EVENT_REASONS": ("clock_event_reasons", 1.0),
}
"""DCGM field → (column, factor to its unit): MiB → bytes, KB/s → bytes/s, 0–1 ratios → %.
``mem_free_bytes``/``mem_reserved_bytes`` only serve to work out the total."""

INVENTORY_METRICS = {"DCGM_FI_DEV_POWER_MGMT_LIMIT": "power_limit_w"}
"""Fields kept in the GPU inventory (`RunMeta.gpus`) rather than as samples."""

SAMPLE_COLUMNS = (
    "util_gpu_pct", "util_mem_pct", "mem_used_bytes", "mem_total_bytes", "pcie_tx_bytes_s",
    "pcie_rx_bytes_s", "nvlink_tx_bytes_s", "nvlink_rx_bytes_s", "power_w", "sm_clock_mhz",
    "temp_c", "clock_event_reasons", "sm_active_pct", "sm_occupancy_pct", "tensor_active_pct",
    "dram_active_pct",
)  # fmt: skip

_SNIFF_RE = re.compile(r"^(?:# (?:HELP|TYPE) )?DCGM_FI_[A-Z0-9_]+", re.MULTILINE)
_LABEL = r'[a-zA-Z_][a-zA-Z0-9_]*\s*=\s*"(?:[^"\\]|\\.)*"'
_LABELS_RE = re.compile(rf"\s*(?:{_LABEL}(?:\s*,\s*{_LABEL})*)?\s*,?\s*")
_PAIR_RE = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)\s*=\s*"((?:[^"\\]|\\.)*)"')
_LINE_RE = re.compile(
    r"([a-zA-Z_:][a-zA-Z0-9_:]*)"  # metric name
    r"(?:\{(.*)\})?"  # labels, checked by _LABELS_RE
    r"\s+([-+]?(?:\d+\.?\d*(?:[eE][-+]?\d+)?|\.\d+(?:[eE][-+]?\d+)?|[Nn]a[Nn]|[Ii]nf))"
    r"(?:\s+(-?\d+))?\s*"  # timestamp, ms
)
_UNESCAPE = {"\\\\": "\\", '\\"': '"', "\\n": "\n"}
_MAX_MS = 9_223_372_036_854  # int64 ns end in 2262


def sniff(head: str, path: Path) -> bool:
    """A ``DCGM_FI_…`` metric at the start of a line (possibly after ``# HELP``/``# TYPE``)."""
    return _SNIFF_RE.search(head) is not None


def _labels(text: str | None) -> dict[str, str] | None:
    """The labels of a sample (``{}`` for none), or None when the text is not a label set."""
    if not text:
        return {}
    if _LABELS_RE.fullmatch(text) is None:
        return None
    return {
        k: re.sub(r"\\[\\\"n]", lambda m: _UNESCAPE[m.group(0)], v)
        for k, v in _PAIR_RE.findall(text)
    }


class _Columns:
    """The kept samples, column by column, in file order."""

    def __init__(self) -> None:
        self.host: list[str] = []
        self.gpu: list[int] = []
        self.metric: list[str] = []
        self.value: list[float] = []
        self.ms: list[float] = []  # NaN: no timestamp


def parse(path: Path) -> Imported:
    """Read a whole file of scrapes; raises `ImportFormatError` when malformed.

    Each line is matched once against the sample syntax; a line that is neither a comment nor
    a sample is an error naming it, except as the first or last line of the file, where a
    cut-off excerpt leaves half a line (skipped with a note).
    """
    text = open_text(path)
    default_host = host_name(path)
    numbered = [(i, ln.strip()) for i, ln in enumerate(text.splitlines(), 1) if ln.strip()]
    cols = _Columns()
    notes: list[str] = []
    inventory: dict[tuple[str, int], dict] = {}
    told: set[str] = set()
    seen_labels: dict[str | None, tuple | None] = {}  # label text → (host, gpu) or None
    mig = 0
    for pos, (lineno, line) in enumerate(numbered):
        if line[0] == "#":
            continue
        match = _LINE_RE.fullmatch(line)
        key = match.group(2) if match else None
        if match is not None and key not in seen_labels:
            labels = _labels(key)
            if labels is None:
                match = None
            else:
                seen_labels[key] = _gpu_of(labels, default_host, inventory, told)
        if match is None:
            if pos in (0, len(numbered) - 1):
                where = "first" if pos == 0 else "last"
                notes.append(f"line {lineno}: incomplete {where} line skipped (file cut off)")
                continue
            raise ImportFormatError(f"{path}:{lineno}: not a Prometheus sample line: {line[:80]!r}")
        name = match.group(1)
        where_from = seen_labels[key]
        if not name.startswith("DCGM_FI_") or where_from is None:
            continue  # another exporter's metric, or not a per-GPU field
        if where_from == "mig":
            mig += 1
            continue
        value = float(match.group(3))
        if name in INVENTORY_METRICS and math.isfinite(value):
            inventory[where_from][INVENTORY_METRICS[name]] = value
        if name in METRICS:
            stamp = match.group(4)
            ms = float("nan")
            if stamp is not None:
                ms = int(stamp)
                if not 0 <= ms < _MAX_MS:
                    raise ImportFormatError(f"{path}:{lineno}: timestamp out of range ({stamp})")
            cols.host.append(where_from[0])
            cols.gpu.append(where_from[1])
            cols.metric.append(name)
            cols.value.append(value)
            cols.ms.append(ms)
    if not inventory:
        raise ImportFormatError(f"{path}: no DCGM per-GPU samples")
    if mig:
        notes.append(f"{mig} MIG instance samples left out (whole-GPU samples kept)")
    gpus = [inventory[k] for k in sorted(inventory)]
    if not cols.value:
        notes.append("no utilization, memory, power or clock fields in the file: no samples")
        return Imported(path, FORMAT, {}, {"gpus": gpus, "hosts": sorted(told)}, True, notes)
    frame, anchored, time_note = _table(cols)
    notes.append(time_note)
    uuids = {(g["host"], g["index"]): g.get("uuid") for g in gpus}
    frame["uuid"] = [uuids.get(k) for k in zip(frame["host"], frame["gpu"])]
    for entry in gpus:
        rows = frame[(frame["host"] == entry["host"]) & (frame["gpu"] == entry["index"])]
        if len(rows) and rows["mem_total_bytes"].notna().any():
            entry["mem_total_bytes"] = int(rows["mem_total_bytes"].dropna().iloc[-1])
    meta: dict = {
        "gpus": gpus,
        "hosts": sorted(told),
        "start_ns": int(frame["t_ns"].min()),
        "end_ns": int(frame["t_ns"].max()),
    }
    intervals = frame.groupby(["host", "gpu"])["t_ns"].diff().dropna()
    if len(intervals):
        meta["interval_s"] = float(intervals.median()) / 1e9
    return Imported(path, FORMAT, {"gpu": frame}, meta, anchored, notes)


def _gpu_of(
    labels: dict[str, str], default_host: str, inventory: dict, told: set[str]
) -> tuple[str, int] | str | None:
    """(host, gpu) a label set describes, ``"mig"`` for a MIG instance, None when it names no
    GPU; records the GPU's identity in ``inventory`` on the way."""
    if labels.get("GPU_I_ID"):
        return "mig"
    try:
        gpu = int(labels["gpu"])
    except (KeyError, ValueError):
        return None
    host = labels.get("Hostname") or default_host
    if labels.get("Hostname"):
        told.add(host)
    entry = inventory.setdefault((host, gpu), {"host": host, "index": gpu})
    for label, key in (("UUID", "uuid"), ("modelName", "name"), ("pci_bus_id", "pci_bus_id")):
        if labels.get(label):
            entry[key] = labels[label]
    return host, gpu


def _table(cols: _Columns) -> tuple[pd.DataFrame, bool, str]:
    """One row per GPU per scrape, one column per field; (frame, anchored, note on times)."""
    raw = pd.DataFrame(
        {"host": cols.host, "gpu": cols.gpu, "metric": cols.metric, "value": cols.value}
    )
    ms = np.asarray(cols.ms, dtype=np.float64)  # exact: ms stamps stay far below 2**53
    # a (host, gpu, metric) seen again starts a new scrape
    seen = raw.groupby(["host", "gpu", "metric"], sort=False).cumcount().to_numpy()
    scrape = np.maximum.accumulate(seen)
    raw["scrape"] = scrape
    stamped = ~np.isnan(ms)
    if stamped.all():
        # DCGM stamps each field when it was read: a scrape's row takes its latest stamp
        raw["t_ns"] = ms.astype(np.int64) * 1_000_000
        times = raw.groupby(["host", "gpu", "scrape"])["t_ns"].transform("max")
        anchored, note = True, "per-sample timestamps used"
    else:
        times = pd.Series(scrape * int(SCRAPE_INTERVAL_S * 1e9), index=raw.index)
        anchored = False
        note = (
            f"{int(scrape.max()) + 1} scrape(s) without timestamps: taken as "
            f"{SCRAPE_INTERVAL_S:g} s apart from the start"
        )
        if stamped.any():
            note += " (timestamps on only some samples were ignored)"
    raw["t_ns"] = times.astype(np.int64)
    column = raw["metric"].map(lambda m: METRICS[m][0])
    raw["value"] = raw["value"] * raw["metric"].map(lambda m: METRICS[m][1])
    raw["column"] = column
    wide = raw.pivot_table(
        index=["host", "gpu", "t_ns"], columns="column", values="value", aggfunc="last"
    ).reset_index()
    wide.columns.name = None
    for col in (*SAMPLE_COLUMNS, "mem_free_bytes", "mem_reserved_bytes"):
        if col not in wide:
            wide[col] = np.nan
    total = wide["mem_used_bytes"] + wide["mem_free_bytes"] + wide["mem_reserved_bytes"].fillna(0)
    wide["mem_total_bytes"] = wide["mem_total_bytes"].fillna(total)
    out = pd.DataFrame(
        {
            "host": wide["host"].astype(object),
            "gpu": wide["gpu"].astype(np.int64),
            "uuid": None,
            "t_ns": wide["t_ns"].astype(np.int64),
        }
    )
    for col in SAMPLE_COLUMNS:
        out[col] = wide[col].astype(np.float64)
    return out.sort_values(["host", "gpu", "t_ns"], ignore_index=True), anchored, note
