"""``idle_unattributed``: Idle GPU-time no phase explains while the whole job idles."""

from __future__ import annotations

import numpy as np

from gpuprof.analyzers.evidence import IdleUnattributedEvidence
from gpuprof.analyzers.findings import AnalysisContext, Finding, Thresholds
from gpuprof.analyzers.spans import NO_PHASE
from gpuprof.analyzers.stalls._phase import (
    _conf,
    _gpu_labels,
    _is_idle,
    _minutes,
    _num,
    _sample_intervals,
    _samples,
    _spans,
    _wait_split,
)


def detect(ctx: AnalysisContext, th: Thresholds) -> Finding | None:
    """Idle GPU-time outside every phase span while the whole job idles."""
    s = _samples(ctx)
    if s is None:
        return None
    split = _wait_split(ctx, s, th)
    # idle samples only: the gaps between kernels of a busy stretch are not idle time
    mask, idle = split["alone"] & _is_idle(s, th), split["idle"]
    lost = float(idle[mask].sum())
    share = ctx.share(lost)
    no_spans = _spans(ctx).empty
    # over the samples no earlier stall claimed (a GPU never used is not this job's idle)
    measured_dt = s["dt_s"].to_numpy(np.float64)[np.isfinite(s["busy_frac"].to_numpy(np.float64))]
    run_idle = float(np.nansum(idle))
    measured = float(measured_dt.sum())
    run_idle_share = run_idle / measured if measured > 0 else 0.0
    if share < th.min_share or (no_spans and run_idle_share < th.no_span_idle_share):
        return None
    sub = s[mask]
    outside = float(idle[mask & (s["phase"] == NO_PHASE).to_numpy()].sum())
    conf = _conf((0.45 if no_spans else 0.7) + 0.5 * share)
    where = "no phase spans recorded" if no_spans else "outside every phase span"
    summary = (
        f"GPUs idle {_minutes(lost)} ({share:.0%}) {where}, with no GPU of the job working"
        + ("; wrap that code in gpuprof.phase(...) to name it" if not no_spans else "")
    )
    return Finding(
        kind="idle_unattributed",
        gpu_seconds_lost=lost,
        share=share,
        confidence=conf,
        summary=summary,
        evidence=IdleUnattributedEvidence(
            intervals=_sample_intervals(s, mask, idle),
            gpus=_gpu_labels(sub),
            phases=sorted({str(p) for p in sub["phase"].unique()}),
            idle_gpu_s=_num(lost),
            idle_in_step_gpu_s=_num(lost - outside),
            idle_outside_spans_gpu_s=_num(outside),
            run_idle_share=_num(run_idle_share, ".3f"),
            spans_recorded=not no_spans,
        ),
    )
