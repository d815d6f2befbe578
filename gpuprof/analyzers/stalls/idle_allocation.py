"""``idle_allocation``: stretches of minutes in which the job's GPUs all sat idle with nothing
running on them that the run knows of.

A run that hangs in a collective, waits on a file system or a remote service, sits in a
debugger or between jobs of a notebook keeps its GPUs (often with their memory held) while
doing nothing; a phase span covering the stretch would name the cause, and then the phase's
own stall claims it instead. Only stretches where no GPU of the job worked and no owner was in
a named phase (bare ``step`` spans or none) count, and only those of at least
``th.idle_allocation_min_s``: short gaps stay with ``idle_unattributed``. The stretches are
claimed so that later stalls don't explain them again.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from gpuprof.analyzers.evidence import IdleAllocationEvidence
from gpuprof.analyzers.findings import AnalysisContext, Finding, Thresholds
from gpuprof.analyzers.stalls._phase import (
    _WAIT_PHASES,
    _conf,
    _gpu_labels,
    _minutes,
    _num,
    _samples,
)
from gpuprof.intervals import difference, in_union, top_intervals


def detect(ctx: AnalysisContext, th: Thresholds) -> Finding | None:
    """Stretches in which every GPU is below ``th.idle_util_pct`` with its owner in no named
    phase; the idle GPU-time of those lasting ``th.idle_allocation_min_s`` or more is lost."""
    s = _samples(ctx)
    if s is None:
        return None
    t = s["t_ns"].to_numpy(np.int64)
    end = t + np.round(np.nan_to_num(s["dt_s"].to_numpy(np.float64)) * 1e9).astype(np.int64)
    busy = s["busy_frac"].to_numpy(np.float64)
    quiet = np.isfinite(busy) & (busy < th.idle_util_pct / 100.0)
    quiet &= s["phase"].isin(list(_WAIT_PHASES)).to_numpy()
    if not quiet.any():
        return None
    # quiet time of the whole job: covered by quiet samples, by no other sample of any GPU
    a, b = difference(t[quiet], end[quiet], t[~quiet], end[~quiet])
    long = (b - a) >= th.idle_allocation_min_s * 1e9
    if not long.any():
        return None
    a, b = a[long], b[long]
    mask = quiet & in_union(t, a, b)
    idle = np.nan_to_num(s["idle_gpu_s"].to_numpy(np.float64))
    lost = float(idle[mask].sum())
    share = ctx.share(lost)
    if share < th.min_share:
        return None
    claim = np.zeros(len(ctx.samples), dtype=bool)
    claim[ctx.samples.index.get_indexer(s.index[mask])] = True
    ctx.claim(claim)
    mem = s["mem_used_bytes"].to_numpy(np.float64)[mask]
    keys = s.loc[mask, ["host", "gpu"]]
    per_gpu_mem = pd.Series(mem).groupby([keys["host"].to_numpy(), keys["gpu"].to_numpy()]).max()
    held = float(per_gpu_mem.sum()) if len(per_gpu_mem) else np.nan
    longest = float(((b - a) / 1e9).max())
    run_s = max(ctx.run.duration_s or 0.0, 1e-9)
    whole = bool(longest >= 0.9 * run_s)
    held_txt = f" holding {held / 2**30:.1f} GiB" if np.isfinite(held) and held > 2**30 else ""
    summary = (
        f"every GPU of the job idle{held_txt} with nothing running for {len(a)} stretch"
        f"{'es' if len(a) > 1 else ''} of {_span_txt(longest)} at most: {_minutes(lost)} "
        f"({share:.0%}) of the allocation held idle"
    )
    return Finding(
        kind="idle_allocation",
        gpu_seconds_lost=lost,
        share=share,
        confidence=_conf(0.6 + 0.3 * min(1.0, longest / 1800.0) + 0.2 * share),
        summary=summary,
        evidence=IdleAllocationEvidence(
            intervals=top_intervals(a, b),
            gpus=_gpu_labels(s[mask]),
            phases=sorted({str(p) for p in s.loc[mask, "phase"].unique()}),
            idle_stretch_s_longest=_num(longest),
            idle_stretches=len(a),
            mem_held_bytes=_num(held, ".0f"),
            idle_gpu_s=_num(lost),
            whole_run=whole,
        ),
    )


def _span_txt(seconds: float) -> str:
    return f"{seconds / 60:.0f} min" if seconds >= 120 else f"{seconds:.0f} s"
