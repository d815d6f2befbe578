"""dcgm-exporter scrapes (Prometheus text format) → GPU samples.

A scrape is what ``curl host:9400/metrics`` returns: ``# HELP``/``# TYPE`` lines and one sample
per metric per GPU, e.g. ``DCGM_FI_DEV_GPU_UTIL{gpu="0",UUID="GPU-…",modelName="…",
Hostname="node1"} 45``, optionally followed by a timestamp in milliseconds. A file may hold one
scrape or many concatenated (a loop of curl calls).

Times: when every sample carries a timestamp the samples are anchored in wall-clock time.
Otherwise scrapes are told apart by repetition — a metric seen again for the same GPU starts a
new scrape — and taken as 1 s apart from t=0 (the import is then not anchored). A file cut off
at either end (a partial first or last line) is imported without that line, with a note.

Parsing is `prometheus_client.parser`'s; lines are checked one by one first so a bad line can be
named. MIG instance samples (a ``GPU_I_ID`` label) are left out: the samples describe whole GPUs.
"""

from __future__ import annotations

import math
import re
from pathlib import Path

import numpy as np
import pandas as pd
from prometheus_client.parser import text_string_to_metric_families

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
_SAMPLE_RE = re.compile(
    r"^[a-zA-Z_:][a-zA-Z0-9_:]*"
    rf"(?:\{{\s*(?:{_LABEL}(?:\s*,\s*{_LABEL})*)?\s*,?\s*\}})?"
    r"\s+(?:[-+]?(?:\d+\.?\d*(?:[eE][-+]?\d+)?|\.\d+(?:[eE][-+]?\d+)?|[Nn]a[Nn]|[Ii]nf))"
    r"(?:\s+-?\d+)?\s*$"
)


def sniff(head: str, path: Path) -> bool:
    """A ``DCGM_FI_…`` metric at the start of a line (possibly after ``# HELP``/``# TYPE``)."""
    return _SNIFF_RE.search(head) is not None


def _good_lines(path: Path, text: str) -> tuple[list[tuple[int, str]], list[str]]:
    """The sample and comment lines (with their numbers), and notes on a cut-off first or
    last line.

    A line that is neither a comment nor a well-formed sample is an error, except as the
    first or last line of the file (where a cut-off excerpt leaves half a line).
    """
    numbered = [(i, ln.strip()) for i, ln in enumerate(text.splitlines(), 1) if ln.strip()]
    keep, notes = [], []
    for pos, (lineno, line) in enumerate(numbered):
        if line.startswith("#") or _SAMPLE_RE.match(line):
            keep.append((lineno, line))
            continue
        if pos in (0, len(numbered) - 1):
            where = "first" if pos == 0 else "last"
            notes.append(f"line {lineno}: incomplete {where} line skipped (file cut off)")
            continue
        raise ImportFormatError(f"{path}:{lineno}: not a Prometheus sample line: {line[:80]!r}")
    return keep, notes


def _samples(path: Path, lines: list[tuple[int, str]]) -> list:
    """Every sample in file order, parsed by prometheus_client."""
    text = "\n".join(line for _, line in lines) + "\n"
    try:
        return [s for fam in text_string_to_metric_families(text) for s in fam.samples]
    except Exception:  # the checked lines still failed: find the line to name it
        for lineno, line in lines:
            try:
                list(text_string_to_metric_families(line + "\n"))
            except Exception as exc:
                raise ImportFormatError(f"{path}:{lineno}: cannot parse ({exc})") from None
        raise ImportFormatError(f"{path}: cannot parse the metric families") from None


def parse(path: Path) -> Imported:
    """Read a whole file of scrapes; raises `ImportFormatError` when malformed."""
    text = open_text(path)
    lines, notes = _good_lines(path, text)
    default_host = host_name(path)
    records: list[tuple[str, int, str, float, float | None]] = []
    inventory: dict[tuple[str, int], dict] = {}
    told: set[str] = set()
    mig = 0
    for sample in _samples(path, lines):
        labels = sample.labels
        if not sample.name.startswith("DCGM_FI_"):
            continue
        if labels.get("GPU_I_ID"):
            mig += 1
            continue
        try:
            gpu = int(labels["gpu"])
        except (KeyError, ValueError):
            continue  # not a per-GPU field (e.g. a per-host one)
        host = labels.get("Hostname") or default_host
        if labels.get("Hostname"):
            told.add(host)
        entry = inventory.setdefault((host, gpu), {"host": host, "index": gpu})
        for label, key in (("UUID", "uuid"), ("modelName", "name"), ("pci_bus_id", "pci_bus_id")):
            if labels.get(label):
                entry[key] = labels[label]
        value = float(sample.value)
        if sample.name in INVENTORY_METRICS and math.isfinite(value):
            entry[INVENTORY_METRICS[sample.name]] = value
        if sample.name in METRICS:
            records.append((host, gpu, sample.name, value, sample.timestamp))
    if not inventory:
        raise ImportFormatError(f"{path}: no DCGM per-GPU samples")
    if mig:
        notes.append(f"{mig} MIG instance samples left out (whole-GPU samples kept)")
    gpus = [inventory[k] for k in sorted(inventory)]
    if not records:
        notes.append("no utilization, memory, power or clock fields in the file: no samples")
        return Imported(path, FORMAT, {}, {"gpus": gpus, "hosts": sorted(told)}, True, notes)
    frame, anchored, time_note = _table(path, records)
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


def _table(path: Path, records: list) -> tuple[pd.DataFrame, bool, str]:
    """One row per GPU per scrape, one column per field; (frame, anchored, note on times)."""
    raw = pd.DataFrame(records, columns=["host", "gpu", "metric", "value", "ts"])
    # a (host, gpu, metric) seen again starts a new scrape
    seen = raw.groupby(["host", "gpu", "metric"], sort=False).cumcount().to_numpy()
    scrape = np.maximum.accumulate(seen)
    raw["scrape"] = scrape
    stamped = raw["ts"].notna()
    seconds = raw["ts"].astype(np.float64)
    wild = stamped & ~((seconds >= 0) & (seconds < 9.2e9))  # int64 ns ends in 2262
    if wild.any():
        bad = raw[wild].iloc[0]
        raise ImportFormatError(f"{path}: {bad['metric']}: timestamp out of range ({bad['ts']})")
    if stamped.all():
        # DCGM stamps each field when it was read: a scrape's row takes its latest stamp
        raw["t_ns"] = (raw["ts"].astype(np.float64) * 1000).round().astype(np.int64) * 1_000_000
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
