"""``throttling``: Clocks cut by a power or thermal limit."""

from __future__ import annotations

import numpy as np
import pandas as pd

from gpuprof.analyzers.breakdown import keyed_sums
from gpuprof.analyzers.evidence import ThrottlingEvidence
from gpuprof.analyzers.findings import AnalysisContext, Finding, Thresholds
from gpuprof.analyzers.parts import Parts, exact_sum
from gpuprof.analyzers.stalls._phase import _gpu_pairs, _parts
from gpuprof.analyzers.stalls._resource import (
    THROTTLE_REASON_NAMES,
    _finding,
    _fmt_gpu_s,
    _intervals,
    _joined_gpus,
    _runs,
    _throttle_samples,
    top_clock,
)


def _named_elsewhere(parts: Parts) -> set[tuple[str, int]]:
    """GPUs named by an earlier ``power_cap`` or ``hot_gpu`` finding."""
    named = set()
    for finding in parts.found:
        if finding.kind in ("power_cap", "hot_gpu"):
            for label in finding.evidence["gpus"]:
                host, _, gpu = str(label).rpartition(":")
                named.add((host, int(gpu)))
    return named


def detect(ctx: AnalysisContext | Parts, th: Thresholds) -> Finding | None:
    """Busy GPUs whose clocks a power or thermal limit reduced (the GPUs a ``power_cap`` or
    ``hot_gpu`` finding names are left to it).

    A busy sample (util at least ``th.busy_util_pct``) is throttled when its clock-event
    reasons carry a power-cap / thermal / HW-slowdown bit (or, without reasons, its SM clock
    is below ``th.clock_drop_frac`` of the max seen). It runs at ``clock / max_clock`` speed, so
    ``dt x (1 - clock/max)`` of its time is lost. Data-parallel ranks wait for the slowest GPU:
    per step the wall time lost is the worst GPU's, and every GPU of the run pays it.
    """
    parts = _parts(ctx)
    max_clock = top_clock(parts)
    named = _named_elsewhere(parts)
    if not any(parts.map(_any_throttled, th, max_clock, named)):
        return None
    got = [g for g in parts.map(_throttled, th, max_clock, named) if g]
    per = pd.concat([g["per"] for g in got])
    worst = per.groupby(level="step_k").max()
    n_gpus = int(sum(g["n_gpus"] for g in got))
    gpu_s = float(worst.sum() * n_gpus)
    hot = {k: np.concatenate([g["hot"][k] for g in got]) for k in got[0]["hot"]}
    hot_gpus = _joined_gpus(g["gpus"] for g in got)
    bits = int(np.bitwise_or.reduce(hot["bits"])) if len(hot["bits"]) else 0
    reasons = [name for bit, name in THROTTLE_REASON_NAMES.items() if bits & bit]
    busy_s = float(sum(g["busy_s"] for g in got))
    hot_share = float(hot["dt_s"].sum() / busy_s) if busy_s > 0 else 0.0
    clock_hot = float(np.average(hot["sm_clock_mhz"], weights=hot["dt_s"] + 1e-12))
    temp = float(np.nanmean(hot["temp_c"])) if np.isfinite(hot["temp_c"]).any() else None
    power = float(np.nanmean(hot["power_w"])) if np.isfinite(hot["power_w"]).any() else None
    confidence = 0.5 + 0.25 * min(1.0, hot_share) + (0.2 if reasons else 0.0)
    summary = (
        f"{len(hot_gpus)} GPU(s) throttled ({', '.join(reasons) or 'SM clock drop'}) "
        f"{hot_share:.0%} of busy time at {clock_hot:.0f}/{max_clock:.0f} MHz: "
        f"~{_fmt_gpu_s(gpu_s)} ({{share}}) lost"
    )
    evidence = ThrottlingEvidence(
        intervals=_intervals(pd.concat([g["runs"] for g in got], ignore_index=True), "w"),
        gpus=hot_gpus,
        phases=sorted(set().union(*(g["phases"] for g in got))),
        clock_event_reasons=reasons,
        clock_event_reasons_mask=bits,
        sm_clock_mhz_throttled=round(clock_hot, 1),
        sm_clock_mhz_max=round(max_clock, 1),
        throttled_share_of_busy=round(hot_share, 4),
        temp_c_throttled=None if temp is None else round(temp, 1),
        power_w_throttled=None if power is None else round(power, 1),
    )
    return _finding("throttling", parts, th, gpu_s, confidence, summary, evidence)


def _left(
    ctx: AnalysisContext, th: Thresholds, max_clock: float, named: set[tuple[str, int]]
) -> pd.DataFrame | None:
    """One part's `_throttle_samples` of the GPUs ``named`` leaves to this kind."""
    m = _throttle_samples(ctx, th, max_clock)
    if m is None or not named:
        return m
    # GPUs a power cap or heat explains: their kinds carry the loss and the action
    keep = ~pd.Series(list(zip(m["host"].astype(str), m["gpu"].astype(int)))).isin(named)
    return m[keep.to_numpy()]


def _any_throttled(
    ctx: AnalysisContext, th: Thresholds, max_clock: float, named: set[tuple[str, int]]
) -> bool:
    m = _left(ctx, th, max_clock, named)
    return m is not None and bool(m["hot"].any())


def _throttled(
    ctx: AnalysisContext, th: Thresholds, max_clock: float, named: set[tuple[str, int]]
) -> dict | None:
    """One part's throttled samples (its GPUs that ``named`` leaves to it): lost seconds per
    (step, GPU), GPUs, busy seconds, the throttled samples' columns (in sample order), runs
    and phases. None without clock readings."""
    m = _left(ctx, th, max_clock, named)
    if m is None:
        return None
    m = m.assign(lost_s=m["dt_s"] * m["lost_frac"], step_k=m["step"].fillna(-1.0))
    hot = m[m["hot"]]
    return {
        "per": keyed_sums(m, ["step_k", "host", "gpu"], ["lost_s"])["lost_s"],
        "n_gpus": int(m[["host", "gpu"]].drop_duplicates().shape[0]),
        "hot": {
            k: hot[k].to_numpy() for k in ("bits", "dt_s", "sm_clock_mhz", "temp_c", "power_w")
        },
        "gpus": _gpu_pairs(hot),
        "busy_s": exact_sum(m.loc[m["util_gpu_pct"] >= th.busy_util_pct, "dt_s"].to_numpy()),
        "runs": _runs(m, m["hot"].to_numpy(bool), m["lost_s"].to_numpy(np.float64)),
        "phases": set(
            ctx.samples.merge(hot[["host", "gpu", "t_ns"]], on=["host", "gpu", "t_ns"])["phase"]
        ),
    }
