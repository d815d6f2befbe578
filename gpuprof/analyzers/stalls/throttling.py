"""``throttling``: Clocks cut by a power or thermal limit."""

from __future__ import annotations

import numpy as np
import pandas as pd

from gpuprof.analyzers.evidence import ThrottlingEvidence
from gpuprof.analyzers.findings import AnalysisContext, Finding, Thresholds
from gpuprof.analyzers.stalls._resource import (
    THROTTLE_REASON_NAMES,
    _finding,
    _fmt_gpu_s,
    _intervals,
    _runs,
    _sorted_gpus,
    _throttle_samples,
)


def _named_elsewhere(ctx: AnalysisContext) -> set[tuple[str, int]]:
    """GPUs named by an earlier ``power_cap`` or ``hot_gpu`` finding."""
    named = set()
    for finding in ctx.found:
        if finding.kind in ("power_cap", "hot_gpu"):
            for label in finding.evidence["gpus"]:
                host, _, gpu = str(label).rpartition(":")
                named.add((host, int(gpu)))
    return named


def detect(ctx: AnalysisContext, th: Thresholds) -> Finding | None:
    """Busy GPUs whose clocks a power or thermal limit reduced (the GPUs a ``power_cap`` or
    ``hot_gpu`` finding names are left to it).

    A busy sample (util at least ``th.busy_util_pct``) is throttled when its clock-event
    reasons carry a power-cap / thermal / HW-slowdown bit (or, without reasons, its SM clock
    is below ``th.clock_drop_frac`` of the max seen). It runs at ``clock / max_clock`` speed, so
    ``dt x (1 - clock/max)`` of its time is lost. Data-parallel ranks wait for the slowest GPU:
    per step the wall time lost is the worst GPU's, and every GPU of the run pays it.
    """
    m = _throttle_samples(ctx, th)
    if m is None or not m["hot"].any():
        return None
    named = _named_elsewhere(ctx)
    if named:  # GPUs a power cap or heat explains: their kinds carry the loss and the action
        keep = ~pd.Series(list(zip(m["host"].astype(str), m["gpu"].astype(int)))).isin(named)
        m = m[keep.to_numpy()]
        if not m["hot"].any():
            return None
    m = m.assign(lost_s=m["dt_s"] * m["lost_frac"], step_k=m["step"].fillna(-1.0))
    per = m.groupby(["step_k", "host", "gpu"], sort=False)["lost_s"].sum()
    worst = per.groupby(level="step_k").max()
    n_gpus = int(m[["host", "gpu"]].drop_duplicates().shape[0])
    gpu_s = float(worst.sum() * n_gpus)
    hot = m[m["hot"]]
    hot_gpus = hot[["host", "gpu"]].drop_duplicates()
    bits = int(np.bitwise_or.reduce(hot["bits"].to_numpy(np.int64))) if len(hot) else 0
    reasons = [name for bit, name in THROTTLE_REASON_NAMES.items() if bits & bit]
    busy_s = float(m.loc[m["util_gpu_pct"] >= th.busy_util_pct, "dt_s"].sum())
    hot_share = float(hot["dt_s"].sum() / busy_s) if busy_s > 0 else 0.0
    clock_hot = float(np.average(hot["sm_clock_mhz"], weights=hot["dt_s"] + 1e-12))
    max_clock = float(m.attrs.get("max_clock_mhz", np.nan))
    temp = float(np.nanmean(hot["temp_c"])) if np.isfinite(hot["temp_c"]).any() else None
    power = float(np.nanmean(hot["power_w"])) if np.isfinite(hot["power_w"]).any() else None
    confidence = 0.5 + 0.25 * min(1.0, hot_share) + (0.2 if reasons else 0.0)
    runs = _runs(
        m,
        m["hot"].to_numpy(bool),
        m["lost_s"].to_numpy(np.float64),
    )
    summary = (
        f"{len(hot_gpus)} GPU(s) throttled ({', '.join(reasons) or 'SM clock drop'}) "
        f"{hot_share:.0%} of busy time at {clock_hot:.0f}/{max_clock:.0f} MHz: "
        f"~{_fmt_gpu_s(gpu_s)} ({{share}}) lost"
    )
    evidence = ThrottlingEvidence(
        intervals=_intervals(runs, "w"),
        gpus=_sorted_gpus(hot_gpus),
        phases=sorted(
            set(
                ctx.samples.merge(hot[["host", "gpu", "t_ns"]], on=["host", "gpu", "t_ns"])["phase"]
            )
        ),
        clock_event_reasons=reasons,
        clock_event_reasons_mask=bits,
        sm_clock_mhz_throttled=round(clock_hot, 1),
        sm_clock_mhz_max=round(max_clock, 1),
        throttled_share_of_busy=round(hot_share, 4),
        temp_c_throttled=None if temp is None else round(temp, 1),
        power_w_throttled=None if power is None else round(power, 1),
    )
    return _finding("throttling", ctx, th, gpu_s, confidence, summary, evidence)
