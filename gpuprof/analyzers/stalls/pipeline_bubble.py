"""``pipeline_bubble``: GPUs idle-waiting while other GPUs of the job work."""

from __future__ import annotations

import numpy as np
import pandas as pd

from gpuprof.analyzers.evidence import PipelineBubbleEvidence
from gpuprof.analyzers.findings import AnalysisContext, Finding, Thresholds
from gpuprof.analyzers.stalls._phase import (
    _conf,
    _gpu_labels,
    _minutes,
    _num,
    _sample_intervals,
    _samples,
    _wait_split,
)


def detect(ctx: AnalysisContext, th: Thresholds) -> Finding | None:
    """Some GPUs idle (their owner only waiting) while other GPUs of the job work.

    Lost time per step: the step's wall time beyond its busiest GPU's working time (what
    perfect overlap would leave) times the GPUs, capped by the GPU-seconds actually idle in
    such waits — a split placement waiting for the slower side only costs what serialising
    the two sides added.
    """
    s = _samples(ctx)
    if s is None or s[["host", "gpu"]].drop_duplicates().shape[0] < 2:
        return None
    split = _wait_split(ctx, s, th)
    mask, idle = split["bubble"], split["idle"]
    if not mask.any():
        return None
    step = s["step"].fillna(-1.0).to_numpy(np.float64)
    gkey = s.groupby(["host", "gpu"], sort=False).ngroup().to_numpy()
    dt = s["dt_s"].to_numpy(np.float64)
    waiting = split["bubble"] | split["alone"]
    busy = s["busy_frac"].to_numpy(np.float64) >= th.busy_util_pct / 100.0
    working = ~waiting | busy
    frame = pd.DataFrame(
        {
            "step": step,
            "g": gkey,
            "wall": dt,
            "work": np.where(working, dt, 0.0),
            "bubble": np.where(mask, idle, 0.0),
        }
    )
    per_gpu = frame.groupby(["step", "g"], sort=False).sum()
    per_step = per_gpu.groupby(level="step").agg(
        wall=("wall", "max"), work=("work", "max"), bubble=("bubble", "sum"), gpus=("wall", "size")
    )
    extra_s = (per_step["wall"] - per_step["work"]).clip(lower=0.0)
    lost_step = np.minimum(per_step["bubble"], extra_s * per_step["gpus"])
    lost = float(lost_step.sum())
    share = ctx.share(lost)
    if share < th.min_share:
        return None
    bubble_gpu_s = float(per_step["bubble"].sum())
    # per instant: share of the job's GPUs idle-waiting while others work
    bins = split["bins"]
    frac = (
        pd.Series(mask.astype(np.float64)).groupby(bins).mean()
        if len(bins)
        else pd.Series(dtype=float)
    )
    in_bubble = frac[frac > 0]
    mean_frac = float(in_bubble.mean()) if len(in_bubble) else np.nan
    time_share = float(len(in_bubble) / frac.size) if frac.size else np.nan
    sub = s[mask]
    waiting_gpus = _gpu_labels(sub)
    n_gpus = int(s[["host", "gpu"]].drop_duplicates().shape[0])
    conf = _conf(0.55 + 0.3 * min(1.0, lost / max(bubble_gpu_s, 1e-9)) + 0.5 * share)
    summary = (
        f"{len(waiting_gpus)}/{n_gpus} GPUs wait while others work "
        f"({mean_frac:.0%} of the job idle during {time_share:.0%} of the run): "
        f"{_minutes(lost)} ({share:.0%}) lost to serialisation"
    )
    return Finding(
        kind="pipeline_bubble",
        gpu_seconds_lost=lost,
        share=share,
        confidence=conf,
        summary=summary,
        evidence=PipelineBubbleEvidence(
            intervals=_sample_intervals(s, mask, idle),
            gpus=waiting_gpus,
            phases=sorted({str(p) for p in sub["phase"].unique()}),
            bubble_idle_gpu_s=_num(bubble_gpu_s),
            serial_extra_gpu_s=_num(float((extra_s * per_step["gpus"]).sum())),
            idle_gpus_frac_in_bubble=_num(mean_frac, ".3f"),
            bubble_time_share=_num(time_share, ".3f"),
        ),
    )
