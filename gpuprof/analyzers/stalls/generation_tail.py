"""``generation_tail``: Rollout utilisation decaying while the last, longest responses finish."""

from __future__ import annotations

import numpy as np
import pandas as pd

from gpuprof.analyzers.evidence import PHASE_TIMING, GenerationTailEvidence
from gpuprof.analyzers.findings import AnalysisContext, Finding, Thresholds
from gpuprof.analyzers.grouping import first_rows, first_valid, label_codes, per_frame
from gpuprof.analyzers.parts import Parts
from gpuprof.analyzers.stalls._phase import (
    _TAIL_MIN_SAMPLES,
    _any_samples,
    _conf,
    _gpu_key,
    _joined_labels,
    _minutes,
    _num,
    _parts,
    _samples,
    _span_attr,
)
from gpuprof.analyzers.stalls._timing import phase_seconds, timing
from gpuprof.analyzers.texts import as_texts
from gpuprof.intervals import top_intervals, union


def detect(ctx: AnalysisContext | Parts, th: Thresholds) -> Finding | None:
    """Rollout utilisation decaying at the end of each rollout span (few sequences left)."""
    parts = _parts(ctx)
    if not _any_samples(parts):
        return _from_timing(parts.lead, th)
    tables = [t for t in parts.map(_rollouts, th) if t is not None]
    if not tables:
        return None
    # one row per rollout of one GPU (numbered part by part: a rollout is one GPU's)
    per = pd.concat(tables, ignore_index=True) if len(tables) > 1 else tables[0]
    per = per[(per["n"] >= _TAIL_MIN_SAMPLES) & (per["first"] >= th.busy_util_pct / 100.0)]
    if per.empty:
        return None
    per["ratio"] = per["last"] / per["first"]
    step_key = per["step"].fillna(-1.0)
    by_step = per.groupby(step_key)["ratio"].median()
    tail_steps = by_step[by_step < th.tail_util_drop_frac]
    if len(tail_steps) == 0 or len(tail_steps) < 0.5 * len(by_step):
        return None
    tailing = per[step_key.isin(tail_steps.index) & (per["ratio"] < th.tail_util_drop_frac)]
    lost = float(tailing["deficit"].sum())
    share = parts.share(lost)
    if share < th.min_share:
        return None
    # response lengths: on rollout spans (hooks), else on the steps (verl logs them per step)
    max_keys = ("response_length_max", "response_length/max")
    mean_keys = ("response_length_mean", "response_length/mean")
    resp_max = _span_attr(parts, "rollout", max_keys)
    resp_mean = _span_attr(parts, "rollout", mean_keys)
    if not np.isfinite(resp_max) or not np.isfinite(resp_mean):
        resp_max = _span_attr(parts, "step", max_keys)
        resp_mean = _span_attr(parts, "step", mean_keys)
    resp_ratio = resp_max / resp_mean if resp_mean and np.isfinite(resp_mean) else np.nan
    long_resp = bool(resp_ratio >= th.long_response_ratio)
    ratio = float(by_step.median())
    conf = _conf(0.55 + 0.5 * (th.tail_util_drop_frac - ratio) + (0.15 if long_resp else 0.0))
    resp_txt = (
        f"; response length max {resp_max:.0f} vs mean {resp_mean:.0f} tokens"
        if np.isfinite(resp_ratio)
        else ""
    )
    summary = (
        f"Rollout utilisation falls to {ratio:.0%} of its level at the end of generation in "
        f"{len(tail_steps)}/{len(by_step)} steps: {_minutes(lost)} ({share:.0%}) idle in the "
        f"tail{resp_txt}"
    )
    worst = tailing.sort_values("deficit", ascending=False)
    starts = worst["t0"].to_numpy(np.int64)
    ends = worst["t1"].to_numpy(np.int64)
    m_s, m_e = union(starts, ends)
    return Finding(
        kind="generation_tail",
        gpu_seconds_lost=lost,
        share=share,
        confidence=conf,
        summary=summary,
        evidence=GenerationTailEvidence(
            intervals=top_intervals(m_s, m_e),
            gpus=_joined_labels([list(zip(tailing["host"], tailing["gpu"]))]),
            phases=["rollout"],
            tail_to_head_util_ratio=_num(ratio, ".3f"),
            tail_steps=len(tail_steps),
            steps=len(by_step),
            tail_idle_gpu_s=_num(lost),
            response_length_max_tokens=_num(resp_max),
            response_length_mean_tokens=_num(resp_mean),
            response_length_max_to_mean=_num(resp_ratio, ".2f"),
        ),
    )


def _rollouts(ctx: AnalysisContext, th: Thresholds) -> pd.DataFrame | None:
    """One part's rollouts, one row per stretch of one GPU's samples in ``rollout``: samples
    (``n``), busy level over the first and the last part of it, its signed shortfall after the
    first third (``deficit``), step, first and last sample, GPU; None without a rollout
    sample."""
    s = _samples(ctx)
    if s is None:
        return None
    phase, names = label_codes(s["phase"])  # compared as codes, not strings
    gkey = per_frame(ctx, s, "gpu_key", lambda: _gpu_key(s))
    new = np.ones(len(s), dtype=bool)
    new[1:] = (phase[1:] != phase[:-1]) | (gkey[1:] != gkey[:-1])
    inst = np.cumsum(new)
    rollout = names.index("rollout") if "rollout" in names else -2
    roll = (phase == rollout) & np.isfinite(s["busy_frac"].to_numpy(np.float64))
    if not roll.any():
        return None
    rows = np.flatnonzero(roll)
    busy = s["busy_frac"].to_numpy(np.float64)[rows]
    dt = s["dt_s"].to_numpy(np.float64)[rows]
    t = s["t_ns"].to_numpy(np.int64)[rows]
    step = s["step"].to_numpy(np.float64)[rows]
    # one rollout per stretch of one GPU's samples: its rows are consecutive, so its figures
    # are segment reductions (min, max, first) and pandas' sums on one integer code
    of = inst[rows]
    starts = np.flatnonzero(np.r_[True, of[1:] != of[:-1]])
    size = np.diff(np.r_[starts, len(rows)])
    seg = np.repeat(np.arange(len(starts)), size)
    # position of each sample's midpoint within its rollout (0–1), by time rather than by
    # sample count, so samples of unequal length (merged long runs) weigh what they cover
    t0 = np.minimum.reduceat(t, starts)
    t1 = np.maximum.reduceat(t, starts)
    end = np.maximum.reduceat(t + (dt * 1e9).round(), starts)
    t0_row = t0[seg]
    span_ns = np.maximum(end[seg] - t0_row, 1.0)
    mid = ((t - t0_row) + dt * 0.5e9) / span_ns
    first = mid < th.tail_head_frac
    last = mid >= 1.0 - th.tail_end_frac
    after = ~first
    weighted = pd.DataFrame(
        {
            "first_w": np.where(first, dt, 0.0),
            "first_b": np.where(first, busy * dt, 0.0),
            "last_w": np.where(last, dt, 0.0),
            "last_b": np.where(last, busy * dt, 0.0),
        },
        copy=False,
    )
    sums = {c: v.to_numpy() for c, v in weighted.groupby(seg, sort=False).sum().items()}
    with np.errstate(invalid="ignore", divide="ignore"):
        head = np.where(sums["first_w"] > 0, sums["first_b"] / sums["first_w"], np.nan)
        tail = np.where(sums["last_w"] > 0, sums["last_b"] / sums["last_w"], np.nan)
    # lost: the signed shortfall below the span's steady level after its first third
    deficit = np.where(after, (head[seg] - busy) * dt, 0.0)
    deficit = pd.Series(deficit, copy=False).groupby(seg, sort=False).sum().to_numpy()
    at = first_rows(inst)[of[starts] - 1]  # inst counts from 1
    return pd.DataFrame(
        {
            "n": size,
            **sums,
            "step": first_valid(seg, len(starts), step),
            "t0": t0,
            "t1": t1,
            "first": head,
            "last": tail,
            "deficit": pd.Series(deficit, copy=False).clip(lower=0.0).to_numpy(),
            "host": as_texts(s["host"].iloc[at]),
            "gpu": s["gpu"].to_numpy()[at].astype(np.int64),
        }
    )


_WORKER_KEYS = {
    end: (f"generation_timing/{end}", f"timing_s/generation_timing/{end}",
          f"agent_loop/generate_sequences/{end}", f"timing_s/agent_loop/generate_sequences/{end}")
    for end in ("max", "min")
}  # fmt: skip
"""verl's per-worker generation times: ``generation_timing/*`` (synchronous rollout) and
``agent_loop/generate_sequences/*`` (the agent loop, per request), each under ``timing_s/``."""


def _from_timing(ctx: AnalysisContext, th: Thresholds) -> Finding | None:
    """From a framework's step metrics alone: per-worker generation times (verl's
    ``timing_s/generation_timing/max`` and ``/min``, or the agent loop's
    ``timing_s/agent_loop/generate_sequences/max`` and ``/min``) where the slowest worker
    takes more than 1 / ``th.tail_util_drop_frac`` times the fastest: the others wait for its
    long responses.
    Lost per step: ``(max - (max + min) / 2) × GPUs`` (the mean worker waits half the spread)."""
    t = timing(ctx)
    if t is None:
        return None
    mx = t.step_attr(*_WORKER_KEYS["max"])
    mn = t.step_attr(*_WORKER_KEYS["min"])
    ok = np.isfinite(mx) & np.isfinite(mn) & (mx > 0)
    if not ok.any():
        return None
    tail = ok & (mn < th.tail_util_drop_frac * np.where(ok, mx, np.inf))
    if not tail.any() or tail.sum() < 0.5 * ok.sum():
        return None
    lost = float(((mx - (mx + mn) / 2.0)[tail]).sum()) * t.gpus
    share = t.share(lost)
    if share < th.min_share:
        return None
    resp_max = float(np.nanmean(t.step_attr("response_length/max"))) if ok.any() else np.nan
    resp_mean = float(np.nanmean(t.step_attr("response_length/mean"))) if ok.any() else np.nan
    clip = float(np.nanmean(t.step_attr("response_length/clip_ratio")))
    roll_share = float(phase_seconds(t, ["rollout"]).sum() / t.wall_s) if t.wall_s > 0 else np.nan
    ratio = float(np.median((mn / mx)[tail]))
    extra = []
    if np.isfinite(resp_max) and np.isfinite(resp_mean):
        extra.append(f"response length max {resp_max:.0f} vs mean {resp_mean:.0f} tokens")
    if np.isfinite(clip):
        extra.append(f"{clip:.0%} of responses cut at the length limit")
    summary = (
        f"generation workers finish {1 / ratio:.1f}× apart (fastest {np.median(mn[tail]):.0f} s, "
        f"slowest {np.median(mx[tail]):.0f} s) in {int(tail.sum())}/{int(ok.sum())} steps: "
        f"{_minutes(lost)} ({share:.0%}) waiting for the longest responses{t.gpu_note()}"
        + (f"; {'; '.join(extra)}" if extra else "")
    )
    with np.errstate(invalid="ignore", divide="ignore"):
        max_to_mean = resp_max / resp_mean
    return Finding(
        kind="generation_tail",
        gpu_seconds_lost=lost,
        share=share,
        confidence=_conf(0.5 + 0.5 * (th.tail_util_drop_frac - ratio) + 0.5 * share),
        summary=summary,
        evidence=GenerationTailEvidence(
            intervals=t.intervals(["rollout"]),
            phases=["rollout"],
            basis=PHASE_TIMING,
            tail_to_head_util_ratio=_num(ratio, ".3f"),
            tail_steps=int(tail.sum()),
            steps=int(ok.sum()),
            tail_idle_gpu_s=_num(lost),
            response_length_max_tokens=_num(resp_max),
            response_length_mean_tokens=_num(resp_mean),
            response_length_max_to_mean=_num(max_to_mean, ".2f"),
            response_clip_ratio=_num(clip, ".3f"),
            generation_worker_s_min=_num(float(np.median(mn[tail]))),
            generation_worker_s_max=_num(float(np.median(mx[tail]))),
            rollout_share_of_step=_num(roll_share, ".3f"),
        ),
    )
