"""Coarser sample tables for very long runs, without blurring phase boundaries.

A day on 64 GPUs at 10 Hz is 55 million GPU samples; the analyzers need the time each GPU spent
busy or idle *in each phase*, not every tenth of a second. `reduce_gpu` merges runs of up to
``factor`` consecutive samples of one GPU into one, but never across a boundary of a span of the
GPU's owner (so every merged sample lies inside one phase and one step) and never across a gap
in sampling. A merged sample keeps the first sample's ``t_ns`` and stands, like any sample, for
the time until the next one; rates and percentages are time-weighted means, memory is the peak,
clock-event reasons are OR-ed. GPU-seconds busy and idle per phase are therefore the same as at
full resolution up to rounding; what is lost is sub-bucket detail (a 0.3 s dip inside a 2 s
bucket of one phase shows as a shallower, longer dip).

`reduce_table` does the same for host, process and per-GPU-process samples, by fixed time
buckets (their phase attribution is by time window anyway).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd

from gpuprof.model import GpuSample, columns

MEAN_COLUMNS: tuple[str, ...] = (
    "util_gpu_pct", "util_mem_pct", "pcie_tx_bytes_s", "pcie_rx_bytes_s", "nvlink_tx_bytes_s",
    "nvlink_rx_bytes_s", "power_w", "sm_clock_mhz", "temp_c", "sm_active_pct",
    "sm_occupancy_pct", "tensor_active_pct", "dram_active_pct",
)  # fmt: skip
"""GPU columns merged as a time-weighted mean (NaN samples left out)."""
MAX_COLUMNS: tuple[str, ...] = ("mem_used_bytes", "mem_total_bytes")
"""GPU columns merged as their maximum."""
OR_COLUMNS: tuple[str, ...] = ("clock_event_reasons",)
"""GPU bit-mask columns merged with a bitwise OR."""
GAP_FACTOR = 3.0
"""A pause longer than this many typical intervals starts a new merged sample."""


def reduce_gpu(frame: pd.DataFrame, boundaries_ns: np.ndarray | None, factor: int) -> pd.DataFrame:
    """Merge up to ``factor`` consecutive samples of ONE GPU (``frame`` sorted by ``t_ns``).

    ``boundaries_ns``: sorted instants (span starts and ends of the GPU's owner) no merged
    sample may straddle; None or empty when the GPU has no owner. Returns a frame with the
    `GpuSample` columns, at most ``len(frame) / factor`` rows plus one per boundary crossed.
    """
    n = len(frame)
    if factor <= 1 or n <= 1:
        return frame
    t = frame["t_ns"].to_numpy(np.int64)
    idx = np.arange(n)
    gaps = np.diff(t)
    typical = typical_gap(gaps)
    dt = np.empty(n)
    dt[:-1] = gaps / 1e9
    dt[-1] = typical / 1e9
    new = np.zeros(n, dtype=bool)
    new[0] = True
    if boundaries_ns is not None and len(boundaries_ns):
        seg = np.searchsorted(boundaries_ns, t, side="right")
        new[1:] |= seg[1:] != seg[:-1]
    if typical > 0:
        new[1:] |= gaps > GAP_FACTOR * typical
    run_start = np.maximum.accumulate(np.where(new, idx, 0))
    starts = np.flatnonzero(new | ((idx - run_start) % factor == 0))

    out: dict[str, Any] = {}
    for name in ("host", "uuid"):
        col = frame[name]
        if isinstance(col.dtype, pd.CategoricalDtype):  # keep codes: no string per row
            out[name] = pd.Categorical.from_codes(
                col.cat.codes.to_numpy()[starts], categories=col.cat.categories
            )
        else:
            out[name] = pd.Series(col.to_numpy(object)[starts], dtype=object)
    for name in ("gpu", "t_ns"):
        out[name] = frame[name].to_numpy()[starts]
    # time-weighted means; two scratch buffers reused for every column, because fresh
    # multi-megabyte temporaries cost more in page faults than the arithmetic
    m = len(starts)
    num, den = np.empty((m, len(MEAN_COLUMNS))), np.empty((m, len(MEAN_COLUMNS)))
    dt_sums = np.add.reduceat(dt, starts)
    vx, wx, missing = np.empty(n), np.empty(n), np.empty(n, dtype=bool)
    for j, name in enumerate(MEAN_COLUMNS):
        x = _floats(frame, name)
        np.isnan(x, out=missing)
        np.multiply(x, dt, out=vx)
        if missing.any():
            np.copyto(vx, 0.0, where=missing)
            np.copyto(wx, dt)
            np.copyto(wx, 0.0, where=missing)  # a missing reading weighs nothing
            den[:, j] = np.add.reduceat(wx, starts)
        else:
            den[:, j] = dt_sums
        num[:, j] = np.add.reduceat(vx, starts)
    with np.errstate(invalid="ignore", divide="ignore"):
        mean = num / den  # NaN where no reading of the bucket had a duration
    for j, name in enumerate(MEAN_COLUMNS):
        out[name] = mean[:, j]
    for name in MAX_COLUMNS:
        out[name] = np.fmax.reduceat(_floats(frame, name), starts)
    for name in OR_COLUMNS:
        x = _floats(frame, name)
        has = ~np.isnan(x)
        bits = np.bitwise_or.reduceat(np.where(has, x, 0).astype(np.int64), starts)
        out[name] = np.where(np.add.reduceat(has, starts) > 0, bits.astype(np.float64), np.nan)
    return pd.DataFrame({name: out[name] for name in columns(GpuSample)})


TYPICAL_GAP_SAMPLE = 4096
"""Gaps a typical interval is the median of, evenly spread over the series: the median of
all of them cost more than merging the samples (a partition per GPU), and a series sampled
at one rate gives the same interval either way."""


def typical_gap(gaps: np.ndarray) -> float:
    """The typical gap of a series (its median, from at most about `TYPICAL_GAP_SAMPLE`
    evenly spread values); 0.0 for no gaps."""
    n = len(gaps)
    if n == 0:
        return 0.0
    stride = max(1, n // TYPICAL_GAP_SAMPLE)
    return float(np.median(gaps[::stride]))


def _floats(frame: pd.DataFrame, name: str) -> np.ndarray:
    if name not in frame:
        return np.full(len(frame), np.nan)
    col = frame[name]
    if col.dtype == np.float64:
        return col.to_numpy(copy=False)
    return pd.to_numeric(col, errors="coerce").to_numpy(np.float64)


_TABLE_RULES: dict[str, tuple[list[str], dict[str, str]]] = {
    "host": (["host"], {"cpu_pct": "mean", "mem_used_bytes": "max", "mem_total_bytes": "max",
                        "n_cpus": "max"}),
    "procs": (["host", "pid"], {"ppid": "last", "role": "last", "name": "last", "cpu_pct": "mean",
                                "rss_bytes": "max", "io_read_bytes_s": "mean",
                                "io_write_bytes_s": "mean", "num_threads": "max"}),
    "gpu_procs": (["host", "gpu", "pid"], {"gpu_mem_bytes": "max", "sm_util_pct": "mean",
                                           "watched": "max"}),
}  # fmt: skip
"""Per sample table: the keys a bucket is taken within, and how each other column merges."""


def reduce_table(table: str, frame: pd.DataFrame, window_ns: int) -> pd.DataFrame:
    """Merge the samples of ``table`` (``host``, ``procs`` or ``gpu_procs``) into buckets of
    ``window_ns`` per key; a bucket keeps its first ``t_ns``. Other tables pass through."""
    if table not in _TABLE_RULES or window_ns <= 0 or frame.empty:
        return frame
    keys, how = _TABLE_RULES[table]
    bucket = frame["t_ns"].to_numpy(np.int64) // int(window_ns)
    work = frame.assign(_bucket=bucket)
    agg = {name: (name, rule) for name, rule in how.items() if name in frame}
    agg["t_ns"] = ("t_ns", "min")
    out = work.groupby([*keys, "_bucket"], sort=False, dropna=False).agg(**agg).reset_index()
    return out[[c for c in frame.columns if c in out]]


SPAN_CUTS: dict[str, tuple[float, ...]] = {"rollout": (1.0 / 3.0, 0.9)}
"""Extra boundaries inside spans of a phase, as fractions of the span: a rollout keeps its
head (first third, its steady level) and its tail (last tenth) apart, which is what the
generation-tail detector compares."""


def owner_boundaries(
    spans: pd.DataFrame, owners: pd.DataFrame, cuts: dict[str, tuple[float, ...]] | None = None
) -> dict[tuple, np.ndarray]:
    """(host, gpu) → sorted instants no merged sample of the GPU may straddle: the span starts
    and ends of the process that owns the GPU, plus ``cuts`` (default `SPAN_CUTS`) inside spans.

    ``spans``: valid spans (`spans.valid_spans`); ``owners``: `ownership.gpu_owner`.
    """
    if spans.empty or owners.empty:
        return {}
    cuts = SPAN_CUTS if cuts is None else cuts
    starts = spans["start_ns"].to_numpy(np.int64)
    ends = spans["end_ns"].to_numpy(np.int64)
    points = [starts, ends]
    phase = spans["phase"].to_numpy(object)
    for name, fractions in cuts.items():
        sel = phase == name
        for frac in fractions:
            points.append(starts[sel] + ((ends[sel] - starts[sel]) * frac).astype(np.int64))
    rows_of = np.concatenate([np.arange(len(spans))] * 2 + [
        np.flatnonzero(phase == name) for name, fr in cuts.items() for _ in fr
    ])  # fmt: skip
    instants = np.concatenate(points)
    key = pd.DataFrame({"host": spans["host"].to_numpy(object)[rows_of],
                        "pid": spans["pid"].to_numpy(np.int64)[rows_of]})  # fmt: skip
    by_proc = key.groupby(["host", "pid"], sort=False).indices
    cache: dict[tuple, np.ndarray] = {}
    out = {}
    for host, gpu, o_host, pid in zip(owners["host"], owners["gpu"], owners["owner_host"],
                                      owners["pid"]):  # fmt: skip
        if o_host is None or not np.isfinite(pid):
            continue
        proc = (o_host, int(pid))
        if proc not in cache:
            rows = by_proc.get(proc)
            cache[proc] = np.unique(instants[rows]) if rows is not None else np.empty(0, np.int64)
        out[(host, int(gpu))] = cache[proc]
    return out


def typical_interval_ns(table: str, frame: pd.DataFrame) -> int:
    """The median time between consecutive samples of one series (one process, one host…)
    of a sample table, in ns; 0 when it can't be told.

    The series are taken in the order ``sort_values([*keys, "t_ns"])`` gives (the median is
    of evenly spread gaps, `typical_gap`, so the order matters): for a frame already in time
    order, by a stable sort of one integer code of the keys in sorted order."""
    if table not in _TABLE_RULES or len(frame) < 2:
        return 0
    keys, _ = _TABLE_RULES[table]
    t = frame["t_ns"].to_numpy(np.int64)
    code = _sorted_key_codes(frame, keys) if (t[1:] >= t[:-1]).all() else None
    if code is None:
        ordered = frame.sort_values([*keys, "t_ns"], kind="stable")
        t = ordered["t_ns"].to_numpy(np.int64)
        same = np.ones(len(t) - 1, dtype=bool)
        for key in keys:
            k = pd.factorize(ordered[key])[0]
            same &= k[1:] == k[:-1]
    else:
        order = np.argsort(code, kind="stable")
        t, code = t[order], code[order]
        same = code[1:] == code[:-1]
    gaps = np.diff(t)[same]
    return int(typical_gap(gaps[gaps > 0]))


def _sorted_key_codes(frame: pd.DataFrame, keys: list[str]) -> np.ndarray | None:
    """Per row, one integer that orders the rows as their keys sort (strings, numbers); None
    where that can't be promised (a missing or mixed-type key, too many combinations)."""
    code = np.zeros(len(frame), dtype=np.int64)
    width = 1
    for key in keys:
        column = frame[key]
        if column.isna().any():
            return None
        codes, uniques = pd.factorize(column, sort=True)
        kind = pd.api.types.infer_dtype(uniques, skipna=False)
        if kind not in ("string", "integer", "floating", "boolean"):
            return None
        width *= max(len(uniques), 1)
        if width >= 2**62:
            return None
        code = code * max(len(uniques), 1) + codes
    return code
