"""``pipeline_bubble``: GPUs idle-waiting while other GPUs of the job work."""

from __future__ import annotations

import numpy as np
import pandas as pd

from gpuprof.analyzers.breakdown import group_sums, keyed_sums
from gpuprof.analyzers.evidence import PipelineBubbleEvidence
from gpuprof.analyzers.findings import AnalysisContext, Finding, Thresholds
from gpuprof.analyzers.grouping import appearance_codes, first_rows
from gpuprof.analyzers.parts import Parts, stretches, top_stretches
from gpuprof.analyzers.stalls._phase import (
    _conf,
    _gpu_pairs,
    _joined_labels,
    _minutes,
    _num,
    _parts,
    _phases_of,
    _samples,
    _split_of,
    add_bin_counts,
    bin_index,
    wait_inputs,
)
from gpuprof.analyzers.texts import as_texts


def detect(ctx: AnalysisContext | Parts, th: Thresholds) -> Finding | None:
    """Some GPUs idle (their owner only waiting) while other GPUs of the job work.

    Lost time per step: the step's wall time beyond its busiest GPU's working time (what
    perfect overlap would leave) times the GPUs, capped by the GPU-seconds actually idle in
    such waits — a split placement waiting for the slower side only costs what serialising
    the two sides added.
    """
    parts = _parts(ctx)
    n_gpus = sum(parts.map(_n_gpus))
    if n_gpus < 2:
        return None
    grid, heads = wait_inputs(parts, th)
    # every part with samples counts, bubbles or not: a step's busiest GPU and its GPUs are
    # the whole job's
    got = [g for g in parts.map(_bubbles, th, grid, heads) if g is not None]
    if not any(g["gpus"] for g in got):
        return None
    # per step over its GPUs in (step, host, GPU) order, in row order (`group_sums`): the
    # same sums however the run was cut into parts
    per_gpu = pd.concat([g["per_gpu"] for g in got]).sort_index()
    step_of = per_gpu.index.get_level_values("step").to_numpy(np.float64)
    codes, steps = pd.factorize(step_of, sort=True)
    per_step = pd.DataFrame(
        {
            "wall": per_gpu["wall"].groupby(codes).max().to_numpy(),
            "work": per_gpu["work"].groupby(codes).max().to_numpy(),
            "bubble": group_sums(codes, len(steps), per_gpu["bubble"].to_numpy()),
            "gpus": np.bincount(codes, minlength=len(steps)),
        },
        index=pd.Index(steps, name="step"),
    )
    extra_s = (per_step["wall"] - per_step["work"]).clip(lower=0.0)
    lost_step = np.minimum(per_step["bubble"], extra_s * per_step["gpus"])
    lost = float(lost_step.sum())
    share = parts.share(lost)
    if share < th.min_share:
        return None
    bubble_gpu_s = float(per_step["bubble"].sum())
    # per instant: share of the job's GPUs idle-waiting while others work (over the time
    # bins, ascending, that hold samples)
    _, in_bin, bubbled = add_bin_counts(*((g["bins"], g["in_bin"], g["bubbled"]) for g in got))
    seen = in_bin > 0
    frac = bubbled[seen] / in_bin[seen]
    in_bubble = frac[frac > 0]
    mean_frac = float(in_bubble.mean()) if len(in_bubble) else np.nan
    time_share = float(len(in_bubble) / frac.size) if frac.size else np.nan
    waiting_gpus = _joined_labels(g["gpus"] for g in got)
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
            intervals=top_stretches([g["stretches"] for g in got]),
            gpus=waiting_gpus,
            phases=sorted({p for g in got for p in g["phases"]}),
            bubble_idle_gpu_s=_num(bubble_gpu_s),
            serial_extra_gpu_s=_num(float((extra_s * per_step["gpus"]).sum())),
            idle_gpus_frac_in_bubble=_num(mean_frac, ".3f"),
            bubble_time_share=_num(time_share, ".3f"),
        ),
    )


def _n_gpus(ctx: AnalysisContext) -> int:
    s = _samples(ctx)
    if s is None:
        return 0
    # distinct (host, gpu) pairs, a missing value one like the others (``drop_duplicates``)
    return len(first_rows(appearance_codes([s["host"], s["gpu"]], missing_is_value=True)))


def _bubbles(ctx: AnalysisContext, th: Thresholds, grid: dict, heads: bool) -> dict | None:
    """One part's bubbles: per (step, GPU) wall, working and bubble seconds; per time bin its
    samples and those in a bubble; the GPUs, phases and stretches of the bubbles (none when
    the part has no bubble). None without samples (``grid``, ``heads``:
    `_phase.wait_inputs`)."""
    got = _split_of(ctx, th, grid, heads)
    if got is None:
        return None
    s, split = got
    mask, idle = split["bubble"], split["idle"]
    step = s["step"].fillna(-1.0).to_numpy(np.float64)
    hosts = as_texts(s["host"])
    dt = s["dt_s"].to_numpy(np.float64)
    waiting = split["bubble"] | split["alone"]
    busy = s["busy_frac"].to_numpy(np.float64) >= th.busy_util_pct / 100.0
    working = ~waiting | busy
    frame = pd.DataFrame(
        {
            "step": step,
            "host": hosts,
            "g": s["gpu"].to_numpy(np.int64),
            "wall": dt,
            "work": np.where(working, dt, 0.0),
            "bubble": np.where(mask, idle, 0.0),
        }
    )
    # per time bin (`_phase.bin_index`: only those that hold samples, however far apart)
    keys, where = bin_index(split["bins"])
    rows = np.flatnonzero(mask)
    return {
        "per_gpu": keyed_sums(frame, ["step", "host", "g"], ["wall", "work", "bubble"]),
        "bins": keys,
        "in_bin": np.bincount(where, minlength=len(keys)),
        "bubbled": np.bincount(where[mask], minlength=len(keys)),
        "gpus": _gpu_pairs(s, rows),
        "phases": _phases_of(s, rows),
        "stretches": stretches(s["t_ns"].to_numpy(np.int64), dt, mask, idle),
    }
