"""``periodic_stall``: Checkpoint / evaluation phases every N steps that stop training."""

from __future__ import annotations

import numpy as np
import pandas as pd

from gpuprof.analyzers.evidence import PHASE_TIMING, PeriodicStallEvidence
from gpuprof.analyzers.findings import AnalysisContext, Finding, Thresholds
from gpuprof.analyzers.parts import Parts
from gpuprof.analyzers.stalls._phase import (
    _MAX_INTERVALS,
    _PERIODIC_PHASES,
    _any_samples,
    _conf,
    _minutes,
    _num,
    _parts,
    _phase_intervals,
    _samples,
    _spans,
    _starts_ends,
    _waiting_on,
    phase_idle,
)
from gpuprof.analyzers.stalls._timing import phase_seconds, timing
from gpuprof.intervals import union


def detect(ctx: AnalysisContext | Parts, th: Thresholds) -> Finding | None:
    """Checkpoint / eval phases every N steps with the GPUs idle."""
    parts = _parts(ctx)
    if not _any_samples(parts):
        return _from_timing(parts.lead, th)
    sps = parts.map(_periodic_spans)
    if all(sp.empty for sp in sps):
        return None
    phases = sorted({p for sp in sps for p in sp["phase"]})
    st = phase_idle(parts, phases)
    if st is None:
        return None
    waiting = _waiting_on(parts, th, phases)
    lost = st["idle_gpu_s"] + waiting
    share = parts.share(lost)
    if share < th.min_share:
        return None
    steps = np.unique(np.concatenate([sp["step"].dropna().to_numpy(np.float64) for sp in sps]))
    all_steps = np.unique(np.concatenate(parts.map(_span_steps)))
    period = float(np.median(np.diff(steps))) if len(steps) >= 2 else np.nan
    regular = len(steps) >= 2 and bool(np.all(np.diff(steps) == period))
    if len(steps):
        occurrences = max(1, len(steps))
    else:
        ends = [_starts_ends(sp) for sp in sps]
        joined = union(np.concatenate([e[0] for e in ends]), np.concatenate([e[1] for e in ends]))
        occurrences = len(joined[0])
    per_event = lost / occurrences
    # a normal step's idle GPU-seconds, for scale
    normal = [n for n in parts.map(_normal_idle, phases, steps) if n is not None]
    n_normal = len(set().union(*(n[1] for n in normal)))
    normal_idle = float(sum(n[0] for n in normal)) / n_normal if n_normal else np.nan
    ratio = per_event / normal_idle if normal_idle and np.isfinite(normal_idle) else np.nan
    spike = bool(ratio >= th.periodic_min_ratio) if np.isfinite(ratio) else False
    conf = _conf(0.5 + (0.2 if regular else 0.0) + (0.15 if spike else 0.0) + 0.5 * share)
    every = f"every {period:.0f} steps" if np.isfinite(period) else f"{occurrences}×"
    summary = (
        f"{'/'.join(phases)} {every} keeps GPUs idle {st['idle_frac']:.0%} of the time: "
        f"{_minutes(lost)} ({share:.0%})"
        + (f", {ratio:.1f}× a normal step's idle" if np.isfinite(ratio) else "")
    )
    return Finding(
        kind="periodic_stall",
        gpu_seconds_lost=lost,
        share=share,
        confidence=conf,
        summary=summary,
        evidence=PeriodicStallEvidence(
            intervals=_phase_intervals(parts, phases),
            gpus=st["gpus"],
            phases=phases,
            every_n_steps=_num(period, ".0f"),
            occurrences=int(occurrences),
            steps_total=len(all_steps),
            stall_steps=[int(x) for x in steps[:_MAX_INTERVALS]],
            idle_gpu_s=_num(lost),
            idle_gpu_s_per_occurrence=_num(per_event),
            normal_step_idle_gpu_s=_num(normal_idle),
            waiting_gpus_idle_gpu_s=_num(waiting),
            util_gpu_pct=_num(st["util_pct"]),
        ),
    )


def _periodic_spans(ctx: AnalysisContext) -> pd.DataFrame:
    sp = _spans(ctx)
    return sp[sp["phase"].isin(list(_PERIODIC_PHASES))]


def _span_steps(ctx: AnalysisContext) -> np.ndarray:
    return _spans(ctx)["step"].dropna().to_numpy(np.float64)


def _normal_idle(
    ctx: AnalysisContext, phases: list[str], steps: np.ndarray
) -> tuple[float, set] | None:
    """One part's idle GPU-seconds in normal steps (no periodic phase) and those steps."""
    s = _samples(ctx)
    if s is None:
        return None
    normal = s[~s["phase"].isin(phases) & ~s["step"].isin(steps) & s["step"].notna()]
    return float(np.nansum(normal["idle_gpu_s"])), set(normal["step"].unique())


def _from_timing(ctx: AnalysisContext, th: Thresholds) -> Finding | None:
    """From a framework's phase times alone: checkpoint / evaluation phases that come back
    every N steps (training stops on every GPU meanwhile), or, with no such phase named, step
    times that spike at a regular period (at least ``th.periodic_spike_ratio`` × the median)."""
    t = timing(ctx)
    if t is None or len(t.steps) < 3:
        return None
    steps = t.steps.index.to_numpy(np.float64)
    wall = t.steps["wall_s"].to_numpy(np.float64)
    phases = [p for p in _PERIODIC_PHASES if p in t.phases]
    if phases:
        secs = phase_seconds(t, phases)
        hit = secs > 0
        extra = secs
    else:
        median = float(np.median(wall))
        hit = wall >= th.periodic_spike_ratio * median
        extra = np.where(hit, wall - median, 0.0)
        if hit.sum() < 2 or not _regular(steps[hit]):
            return None
    if not hit.any() or hit.all():
        return None
    lost = float(extra[hit].sum()) * t.gpus
    share = t.share(lost)
    if share < th.min_share:
        return None
    at = steps[hit]
    period = float(np.median(np.diff(at))) if len(at) >= 2 else np.nan
    normal = float(np.median(wall[~hit]))
    per = float(extra[hit].mean())
    names = "/".join(phases) if phases else "unnamed work"
    every = f"every {period:.0f} steps" if np.isfinite(period) else f"{len(at)}×"
    summary = (
        f"{names} {every} adds {per:.1f} s to a {normal:.1f} s step: {_minutes(lost)} "
        f"({share:.0%}) of GPU-time not training{t.gpu_note()} — from the framework's step times"
    )
    return Finding(
        kind="periodic_stall",
        gpu_seconds_lost=lost,
        share=share,
        confidence=_conf(
            0.5 + (0.2 if _regular(at) else 0.0) + 0.5 * share - (0 if phases else 0.1)
        ),
        summary=summary,
        evidence=PeriodicStallEvidence(
            intervals=t.intervals(phases) if phases else [],
            phases=phases,
            basis=PHASE_TIMING,
            every_n_steps=_num(period, ".0f"),
            occurrences=int(hit.sum()),
            steps_total=len(steps),
            stall_steps=[int(x) for x in at[:20]],
            idle_gpu_s=_num(lost),
            idle_gpu_s_per_occurrence=_num(per * t.gpus),
            seconds_per_occurrence=_num(per, ".2f"),
            normal_step_s=_num(normal, ".2f"),
        ),
    )


def _regular(steps: np.ndarray) -> bool:
    """Steps at one period (a last one missing or an off-by-one start allowed)."""
    if len(steps) < 2:
        return False
    gaps = np.diff(steps)
    return bool(np.all(gaps == gaps[0]) or np.mean(gaps == np.median(gaps)) >= 0.8)
