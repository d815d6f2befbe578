"""Compute / communication / memory / idle time of a rank's GPU, from its Kineto trace.

The figures follow HolisticTraceAnalysis's temporal breakdown, so the two can be set side by
side:

- the **span** is the time from the first GPU activity's start to the last one's end (not the
  profiler window: the time before the first kernel is not counted as idle);
- **busy** is the union of all GPU activities (kernels, memcpys, memsets) of the rank, every
  stream and device together; **idle** = span − busy;
- **compute** is the union of compute kernels; **communication** the time NCCL kernels run
  while no compute kernel does; **memory** the time memcpy/memset run while neither does
  (HTA reports communication + memory as one "non-compute" figure);
- when the trace holds two or more ``ProfilerStep#N`` ranges, only GPU work launched before
  the last step began counts (the profiler often stops in the middle of that step); GPU work
  whose launch is not in the trace is left out then too. ``include_last_step=True`` keeps it.

Differences from HTA, all well under a percentage point on real traces: times keep the
trace's sub-microsecond resolution (HTA rounds fractional timestamps to whole µs), and CUDA
synchronisation records on a stream (``cuda_sync``: a host waiting for the GPU) are not GPU
work here (HTA counts them as non-compute kernel time).
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

import numpy as np
import pandas as pd

from gpuprof.collectors.importers.kineto import (
    ANNOTATION,
    CPU_OP,
    GPU_ANNOTATION,
    GPU_KINDS,
    KinetoTrace,
    _get,
    _ints,
    class_times,
    load_trace,
)

BREAKDOWN_COLUMNS = [
    "rank",
    "span_ns",
    "busy_ns",
    "idle_ns",
    "compute_ns",
    "communication_ns",
    "memory_ns",
    "non_compute_ns",
    "idle_pct",
    "compute_pct",
    "communication_pct",
    "memory_pct",
    "non_compute_pct",
    "activities",
]
"""Columns of `temporal_breakdown`: times in ns, shares in percent of ``span_ns``."""


def temporal_breakdown(
    traces: str | Path | KinetoTrace | Iterable[str | Path | KinetoTrace],
    include_last_step: bool = False,
) -> pd.DataFrame:
    """One row per rank (sorted): how its GPU's time splits into compute, communication,
    memory and idle (see the module docstring for the definitions).

    ``traces``: a trace file, a loaded `KinetoTrace`, or several of them (one per rank).
    Raises `ImportFormatError` for a malformed file.
    """
    if isinstance(traces, str | Path | KinetoTrace):
        traces = [traces]
    rows = []
    for item in traces:
        trace = item if isinstance(item, KinetoTrace) else load_trace(item)
        rows.append(_rank_row(trace, include_last_step))
    frame = pd.DataFrame(rows, columns=BREAKDOWN_COLUMNS)
    return frame.sort_values("rank", kind="stable", ignore_index=True)


def counted_gpu_rows(trace: KinetoTrace, include_last_step: bool = False) -> np.ndarray:
    """Positions (within ``trace.gpu_rows``) of the GPU activities the breakdown counts."""
    everything = np.arange(len(trace.gpu_rows))
    if include_last_step:
        return everything
    host = np.flatnonzero(~np.isin(trace.kind, GPU_KINDS))
    names = pd.Series(trace.names[host], dtype=object).astype(str)
    is_step = names.str.contains("ProfilerStep", regex=False).to_numpy()
    if len(np.unique(trace.names[host][is_step])) < 2:
        return everything  # one step or none: nothing to cut
    last_start = trace.start_ns[host][is_step].max()
    # launches (runtime calls) before the last step began; ops and annotations carry no
    # correlation id, so their args need not be read
    launchers = host[
        (trace.start_ns[host] < last_start)
        & ~np.isin(trace.kind[host], (CPU_OP, ANNOTATION, GPU_ANNOTATION))
    ]
    launched = _correlations(trace, launchers)
    own = _correlations(trace, trace.gpu_rows)
    return np.flatnonzero(np.isin(own, launched[launched >= 0]) & (own >= 0))


def _correlations(trace: KinetoTrace, rows: np.ndarray) -> np.ndarray:
    args = [a if type(a) is dict else {} for a in (trace.args[i] for i in rows)]
    return _ints(_get(args, "correlation"))


def _rank_row(trace: KinetoTrace, include_last_step: bool) -> dict:
    keep = counted_gpu_rows(trace, include_last_step)
    rows = trace.gpu_rows[keep]
    starts, ends = trace.start_ns[rows], trace.end_ns[rows]
    times = class_times(starts, ends, trace.gpu_class[keep])
    span = int(ends.max() - starts.min()) if len(rows) else 0
    row = {
        "rank": trace.rank if trace.rank is not None else 0,
        "span_ns": span,
        "idle_ns": span - times["busy_ns"],
        **times,
        "non_compute_ns": times["communication_ns"] + times["memory_ns"],
        "activities": len(rows),
    }
    for name in ("idle", "compute", "communication", "memory", "non_compute"):
        row[f"{name}_pct"] = 100.0 * row[f"{name}_ns"] / span if span else np.nan
    return row
