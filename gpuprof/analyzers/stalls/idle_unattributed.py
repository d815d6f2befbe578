"""``idle_unattributed``: Idle GPU-time no phase explains while the whole job idles."""

from __future__ import annotations

import numpy as np

from gpuprof.analyzers.evidence import IdleUnattributedEvidence
from gpuprof.analyzers.findings import AnalysisContext, Finding, Thresholds
from gpuprof.analyzers.parts import Parts, exact_sum, stretches, top_stretches
from gpuprof.analyzers.spans import NO_PHASE
from gpuprof.analyzers.stalls._phase import (
    _any_samples,
    _conf,
    _gpu_pairs,
    _is_idle,
    _joined_labels,
    _minutes,
    _num,
    _parts,
    _phases_of,
    _split_of,
    wait_inputs,
)


def detect(ctx: AnalysisContext | Parts, th: Thresholds) -> Finding | None:
    """Idle GPU-time outside every phase span while the whole job idles."""
    parts = _parts(ctx)
    if not _any_samples(parts):
        return None
    grid, heads = wait_inputs(parts, th)
    got = [g for g in parts.map(_alone, th, grid, heads) if g is not None]
    lost = float(sum(g["lost"] for g in got))
    share = parts.share(lost)
    no_spans = parts.facts.first_span_ns is None
    # over the samples no earlier stall claimed (a GPU never used is not this job's idle)
    run_idle = float(sum(g["run_idle"] for g in got))
    measured = float(sum(g["measured"] for g in got))
    run_idle_share = run_idle / measured if measured > 0 else 0.0
    if share < th.min_share or (no_spans and run_idle_share < th.no_span_idle_share):
        return None
    outside = float(sum(g["outside"] for g in got))
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
            intervals=top_stretches([g["stretches"] for g in got]),
            gpus=_joined_labels(g["gpus"] for g in got),
            phases=sorted({p for g in got for p in g["phases"]}),
            idle_gpu_s=_num(lost),
            idle_in_step_gpu_s=_num(lost - outside),
            idle_outside_spans_gpu_s=_num(outside),
            run_idle_share=_num(run_idle_share, ".3f"),
            spans_recorded=not no_spans,
        ),
    )


def _alone(ctx: AnalysisContext, th: Thresholds, grid: dict, heads: bool) -> dict | None:
    """One part's idle samples while the whole job idles, outside claimed phases: their idle
    GPU-seconds (and those outside every span), the part's idle and measured GPU-seconds,
    and the GPUs, phases and stretches of those samples (None without samples)."""
    got = _split_of(ctx, th, grid, heads)
    if got is None:
        return None
    s, split = got
    # idle samples only: the gaps between kernels of a busy stretch are not idle time
    mask, idle = split["alone"] & _is_idle(s, th), split["idle"]
    measured_dt = s["dt_s"].to_numpy(np.float64)[np.isfinite(s["busy_frac"].to_numpy(np.float64))]
    rows = np.flatnonzero(mask)
    t, dt = s["t_ns"].to_numpy(np.int64), s["dt_s"].to_numpy(np.float64)
    return {
        "lost": exact_sum(idle[mask]),
        "outside": exact_sum(idle[mask & (s["phase"] == NO_PHASE).to_numpy()]),
        "run_idle": exact_sum(idle),
        "measured": exact_sum(measured_dt),
        "gpus": _gpu_pairs(s, rows),
        "phases": _phases_of(s, rows),
        "stretches": stretches(t, dt, mask, idle),
    }
