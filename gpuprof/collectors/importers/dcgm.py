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
stopped by the first bad line.

MIG. A GPU in MIG mode is scraped per GPU instance: each sample carries the physical GPU's
``gpu`` index and UUID plus ``GPU_I_ID`` and ``GPU_I_PROFILE`` (``1g.10gb``, ``3g.40gb``…), and
DCGM has no whole-GPU utilization for it (NVML reports none on MIG). gpuprof's samples describe
physical GPUs, so each instance is counted once and the instances of a GPU are combined by
what a field measures (`MIG_PARTITIONED`, `MIG_ACTIVITY`, device-wide otherwise):

- memory is partitioned: an instance's used/free framebuffer is its own slice, so the GPU's is
  the sum over its instances;
- engine activity (``DCGM_FI_PROF_GR_ENGINE_ACTIVE``, SM/tensor/DRAM activity, occupancy) is a
  ratio of the instance's own engines, so the GPU's is the mean weighted by each instance's
  compute slices over the GPU's (``1g`` = 1/7 of an A100/H100/H200, 1/4 of an A30): one busy
  ``1g`` instance is a GPU 1/7 busy, not 100 % and not 7 × 100 %;
- readings of the board (power, temperature, clocks, clock-event reasons, PCIe/NVLink) are
  repeated on every instance: taken once (the largest), never summed.

A whole-GPU sample of the same field and scrape, where the exporter gives one, wins over the
combination. ``DCGM_FI_PROF_GR_ENGINE_ACTIVE`` stands in for utilization where
``DCGM_FI_DEV_GPU_UTIL`` is missing (MIG, or an exporter configured with profiling fields
only): both are the share of time the compute engine had work.
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
    "DCGM_FI_PROF_GR_ENGINE_ACTIVE": ("gr_engine_active_pct", 100.0),
}
"""DCGM field → (column, factor to its unit): MiB → bytes, KB/s → bytes/s, 0–1 ratios → %.
``mem_free_bytes``/``mem_reserved_bytes`` only serve to work out the total."""

INVENTORY_METRICS = {
    "DCGM_FI_DEV_POWER_MGMT_LIMIT": "power_limit_w",
    "DCGM_FI_DEV_ENFORCED_POWER_LIMIT": "power_limit_w",
    "DCGM_FI_DEV_POWER_MGMT_LIMIT_DEF": "power_default_limit_w",
    "DCGM_FI_DEV_POWER_MGMT_LIMIT_MAX": "power_max_limit_w",
    "DCGM_FI_DEV_MAX_SM_CLOCK": "max_sm_clock_mhz",
}

MIG_PARTITIONED = {"mem_used_bytes", "mem_free_bytes", "mem_reserved_bytes", "mem_total_bytes"}
"""Columns a MIG instance holds a slice of: summed over a GPU's instances."""

MIG_ACTIVITY = {"util_gpu_pct", "util_mem_pct", "gr_engine_active_pct", "sm_active_pct",
                "sm_occupancy_pct", "tensor_active_pct", "dram_active_pct"}  # fmt: skip
"""Ratios of an instance's own engines: weighted by its compute slices over the GPU's."""

MIG_SLICES_DEFAULT = 7
"""Compute slices of a MIG-capable GPU: seven on A100, H100, H200 and B200 (NVIDIA MIG user
guide, "Supported MIG profiles"); the A30 has four (`MIG_SLICES_BY_MODEL`)."""

MIG_SLICES_BY_MODEL = {"A30": 4}

_PROFILE_RE = re.compile(r"^(?:(\d+)c\.)?(\d+)g\.")
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
        self.inst: list[int] = []  # MIG GPU instance id; -1 for the whole GPU
        self.slices: list[float] = []  # the instance's share of the GPU's compute (MIG)
        self.metric: list[str] = []
        self.value: list[float] = []
        self.ms: list[float] = []  # NaN: no timestamp


def parse(path: Path) -> Imported:
    """Read a whole file of scrapes; raises `ImportFormatError` when no per-GPU sample can be
    read.

    Each line is matched once against the sample syntax; a line that is neither a comment nor
    a sample, or a sample whose timestamp is out of range, is skipped and counted in a note
    (at either end of the file: the half line a cut-off excerpt leaves).
    """
    text = open_text(path)
    default_host = host_name(path)
    numbered = [(i, ln.strip()) for i, ln in enumerate(text.splitlines(), 1) if ln.strip()]
    cols = _Columns()
    notes: list[str] = []
    inventory: dict[tuple[str, int], dict] = {}
    told: set[str] = set()
    seen_labels: dict[str | None, tuple | None] = {}  # label text → (host, gpu, inst, slices)
    bad: list[int] = []
    bad_stamps: list[int] = []
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
            else:
                bad.append(lineno)
            continue
        name = match.group(1)
        where_from = seen_labels[key]
        if not name.startswith("DCGM_FI_") or where_from is None:
            continue  # another exporter's metric, or not a per-GPU field
        host, gpu, inst, slices = where_from
        value = float(match.group(3))
        if name in INVENTORY_METRICS and math.isfinite(value):
            inventory[(host, gpu)][INVENTORY_METRICS[name]] = value
        if name in METRICS:
            stamp = match.group(4)
            ms = float("nan")
            if stamp is not None:
                ms = int(stamp)
                if not 0 <= ms < _MAX_MS:
                    bad_stamps.append(lineno)
                    continue
            cols.host.append(host)
            cols.gpu.append(gpu)
            cols.inst.append(inst)
            cols.slices.append(slices)
            cols.metric.append(name)
            cols.value.append(value)
            cols.ms.append(ms)
    if bad:
        notes.append(f"{len(bad)} lines that are not Prometheus samples skipped (first: line "
                     f"{bad[0]})")  # fmt: skip
    if bad_stamps:
        notes.append(f"{len(bad_stamps)} samples with a timestamp out of range skipped (first: "
                     f"line {bad_stamps[0]})")  # fmt: skip
    if not inventory:
        detail = f" ({notes[-1]})" if bad or bad_stamps else ""
        raise ImportFormatError(f"{path}: no DCGM per-GPU samples{detail}")
    gpus = [inventory[k] for k in sorted(inventory)]
    for entry in gpus:
        instances = entry.pop("_mig", None)
        if instances:
            entry["mig_instances"] = len(instances)
            entry["mig_profiles"] = sorted(set(instances.values()))
    if any("mig_instances" in g for g in gpus):
        n_mig = sum(1 for g in gpus if "mig_instances" in g)
        notes.append(
            f"{n_mig} GPU(s) in MIG mode: each physical GPU counted once — memory summed over "
            "its instances, engine activity weighted by each instance's compute slices, "
            "power/temperature/clocks taken once"
        )
    if not cols.value:
        notes.append("no utilization, memory, power or clock fields in the file: no samples")
        return Imported(path, FORMAT, {}, {"gpus": gpus, "hosts": sorted(told)}, True, notes)
    frame, anchored, time_notes = _table(cols)
    notes.extend(time_notes)
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
) -> tuple[str, int, int, float] | None:
    """(host, gpu, MIG instance id or -1, the instance's share of the GPU's compute) a label
    set describes, None when it names no GPU; records the GPU's identity (and its MIG
    instances) in ``inventory`` on the way."""
    try:
        gpu = int(labels["gpu"])
    except (KeyError, ValueError):
        return None
    host = labels.get("Hostname") or labels.get("hostname") or default_host
    if labels.get("Hostname") or labels.get("hostname"):
        told.add(host)
    entry = inventory.setdefault((host, gpu), {"host": host, "index": gpu})
    for label, key in (("UUID", "uuid"), ("modelName", "name"), ("pci_bus_id", "pci_bus_id")):
        if labels.get(label):
            entry[key] = labels[label]
    inst_text = labels.get("GPU_I_ID")
    if not inst_text:
        return host, gpu, -1, 1.0
    try:
        inst = int(inst_text)
    except ValueError:
        inst = abs(hash(inst_text)) % 10_000
    profile = labels.get("GPU_I_PROFILE", "")
    entry.setdefault("_mig", {})[inst] = profile
    return host, gpu, inst, _slice_share(profile, entry.get("name", ""))


def _slice_share(profile: str, model: str) -> float:
    """An instance's share of its GPU's compute from its profile (``3g.40gb`` → 3/7 on an
    A100; ``1c.3g.40gb``, a compute instance, → 1/7); NaN when the profile can't be read."""
    match = _PROFILE_RE.match(profile.strip())
    if match is None:
        return float("nan")
    total = next(
        (n for key, n in MIG_SLICES_BY_MODEL.items() if key in model.upper()), MIG_SLICES_DEFAULT
    )
    return int(match.group(1) or match.group(2)) / total


def _table(cols: _Columns) -> tuple[pd.DataFrame, bool, list[str]]:
    """One row per GPU per scrape, one column per field; (frame, anchored, notes)."""
    raw = pd.DataFrame(
        {"host": cols.host, "gpu": cols.gpu, "inst": cols.inst, "slices": cols.slices,
         "metric": cols.metric, "value": cols.value}
    )  # fmt: skip
    ms = np.asarray(cols.ms, dtype=np.float64)  # exact: ms stamps stay far below 2**53
    # a (host, gpu, instance, metric) seen again starts a new scrape
    seen = raw.groupby(["host", "gpu", "inst", "metric"], sort=False).cumcount().to_numpy()
    scrape = np.maximum.accumulate(seen)
    raw["scrape"] = scrape
    stamped = ~np.isnan(ms)
    notes = []
    if stamped.all():
        # DCGM stamps each field when it was read: a scrape's row takes its latest stamp
        raw["t_ns"] = ms.astype(np.int64) * 1_000_000
        times = raw.groupby(["host", "gpu", "scrape"])["t_ns"].transform("max")
        anchored = True
        notes.append("per-sample timestamps used")
    else:
        times = pd.Series(scrape * int(SCRAPE_INTERVAL_S * 1e9), index=raw.index)
        anchored = False
        note = (
            f"{int(scrape.max()) + 1} scrape(s) without timestamps: taken as "
            f"{SCRAPE_INTERVAL_S:g} s apart from the start"
        )
        if stamped.any():
            note += " (timestamps on only some samples were ignored)"
        notes.append(note)
    raw["t_ns"] = times.astype(np.int64)
    raw["column"] = raw["metric"].map(lambda m: METRICS[m][0])
    raw["value"] = raw["value"] * raw["metric"].map(lambda m: METRICS[m][1])
    raw = _combine_mig(raw, notes)
    wide = raw.pivot_table(
        index=["host", "gpu", "t_ns"], columns="column", values="value", aggfunc="last"
    ).reset_index()
    wide.columns.name = None
    for col in (*SAMPLE_COLUMNS, "mem_free_bytes", "mem_reserved_bytes", "gr_engine_active_pct"):
        if col not in wide:
            wide[col] = np.nan
    if wide["gr_engine_active_pct"].notna().any():
        stand_in = wide["util_gpu_pct"].isna() & wide["gr_engine_active_pct"].notna()
        if stand_in.any():
            wide.loc[stand_in, "util_gpu_pct"] = wide.loc[stand_in, "gr_engine_active_pct"]
            notes.append(
                f"{int(stand_in.sum())} samples without DCGM_FI_DEV_GPU_UTIL: utilization "
                "read from DCGM_FI_PROF_GR_ENGINE_ACTIVE (share of time the engine had work)"
            )
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
    return out.sort_values(["host", "gpu", "t_ns"], ignore_index=True), anchored, notes


def _combine_mig(raw: pd.DataFrame, notes: list[str]) -> pd.DataFrame:
    """MIG instances' samples combined into one per physical GPU, field and scrape (see the
    module doc); whole-GPU samples unchanged and preferred."""
    mig = raw["inst"].to_numpy() >= 0
    if not mig.any():
        return raw
    whole, parts = raw[~mig], raw[mig].copy()
    key = ["host", "gpu", "t_ns", "column"]
    partitioned = parts["column"].isin(MIG_PARTITIONED).to_numpy()
    activity = parts["column"].isin(MIG_ACTIVITY).to_numpy()
    unknown = activity & parts["slices"].isna().to_numpy()
    if unknown.any():
        notes.append(
            f"{int(unknown.sum())} MIG activity samples with an unreadable GPU_I_PROFILE: "
            "left out of the GPU's activity"
        )
    parts["weighted"] = np.where(activity, parts["value"] * parts["slices"], parts["value"])
    summed = parts[partitioned | activity].groupby(key, sort=False)["weighted"].sum(min_count=1)
    device = parts[~(partitioned | activity)].groupby(key, sort=False)["value"].max()
    combined = pd.concat([summed, device]).rename("value").reset_index()
    have = set(map(tuple, whole[key].itertuples(index=False, name=None)))
    keep = [k not in have for k in map(tuple, combined[key].itertuples(index=False, name=None))]
    combined = combined[keep]
    cols = ["host", "gpu", "t_ns", "column", "value"]
    return pd.concat([whole[cols], combined[cols]], ignore_index=True)
