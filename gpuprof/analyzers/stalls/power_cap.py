"""``power_cap``: busy GPUs held at their power limit, the cap costing clocks.

When a GPU's draw reaches its power limit the driver's SW power cap lowers its clocks to stay
under it (clock-event reason ``sw_power_cap``: "SW Power Scaling algorithm is reducing the
clocks below requested clocks because the GPU is consuming too much power", nvidia-smi
--help-query-gpu). A limit lowered with ``nvidia-smi -pl`` (a cluster policy, a shared rack
budget) makes that the normal state; at the board's default limit it is what the heaviest
kernels hit. Either way ``nvidia-smi -q -d PERFORMANCE,POWER`` shows it.

A busy sample (utilization at least ``th.busy_util_pct``) is at the cap when its draw is at
least ``th.power_cap_frac`` of its GPU's limit (the inventory's ``power_limit_w``: nvidia-smi
``power.limit`` / ``enforced.power.limit``, DCGM ``DCGM_FI_DEV_POWER_MGMT_LIMIT``); the SW
power cap clock-event bit, where logged, raises the confidence (alone, without a limit to
compare the draw with, it is ``throttling``'s evidence). A GPU at the cap for at least
``th.power_cap_share`` of its busy time is held by it. Its loss is, per capped sample, the SM
clock short of the highest clock the GPU reached in the run (or its inventory maximum);
without clocks, a limit below the board default costs ``1 - (limit/default)^(1/3)`` (see
`Thresholds.power_cap_frac`), and at the default limit the loss can't be measured (no finding).
``throttling`` leaves the GPUs named here alone.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from gpuprof.analyzers.evidence import PowerCapEvidence
from gpuprof.analyzers.findings import AnalysisContext, Finding, Thresholds
from gpuprof.analyzers.parts import Parts, exact_sum
from gpuprof.analyzers.stalls._phase import _gpu_pairs, _num, _parts
from gpuprof.analyzers.stalls._resource import (
    REASON_SW_POWER_CAP,
    _finding,
    _fmt_gpu_s,
    _intervals,
    _joined_gpus,
    _runs,
    _sample_frame,
)


def _inventory(ctx: AnalysisContext, key: str) -> dict[tuple[str, int], float]:
    return {
        (str(g.get("host")), int(g["index"])): float(g[key])
        for g in ctx.run.meta.gpus or []
        if isinstance(g, dict) and g.get("index") is not None
        and isinstance(g.get(key), int | float) and g[key] > 0
    }  # fmt: skip


def _gpu_codes(m: pd.DataFrame) -> tuple[np.ndarray, list[tuple[str, int]]]:
    """Each row's GPU as a code into the list of distinct ``(host, gpu)`` pairs."""
    index = pd.MultiIndex.from_arrays([m["host"], m["gpu"]])
    codes, uniques = index.factorize()
    return codes, [(str(h), int(g)) for h, g in uniques]


def _per_gpu(
    codes: np.ndarray, pairs: list[tuple[str, int]], values: dict[tuple[str, int], float]
) -> np.ndarray:
    """A per-GPU figure spread to every row (NaN where the GPU has none): one lookup per GPU,
    not per sample."""
    table = np.array([values.get(pair, np.nan) for pair in pairs], dtype=np.float64)
    return table[codes]


def detect(ctx: AnalysisContext | Parts, th: Thresholds) -> Finding | None:
    """Busy GPUs at their power limit most of their busy time (see the module doc)."""
    parts = _parts(ctx)
    got = [g for g in parts.map(_capped, th) if g is not None]
    if not got or not any(g["limits"] for g in got):
        return None  # no limit in the data: nothing to hold the draw against
    if not any(g["capped"] for g in got):
        return None
    held = [g for g in got if g["hit"] is not None]
    if not held:
        return None
    # the held GPUs' capped samples of every part, in the whole run's sample order
    hit = {k: np.concatenate([g["hit"][k] for g in held]) for k in held[0]["hit"]}
    gpu_s = float(sum(g["lost_s"] for g in held))
    measure = "clock" if hit["by_clock"].any() else "power_ratio"
    busy_held_s = float(sum(g["busy_held_s"] for g in held))
    capped_share = float(hit["dt_s"].sum() / max(busy_held_s, 1e-12))
    power, limit, clock, top = hit["power"], hit["limit"], hit["clock"], hit["top"]
    default = hit["default"]
    power_mean = float(np.nanmean(power)) if np.isfinite(power).any() else None
    limit_mean = float(np.nanmean(limit)) if np.isfinite(limit).any() else None
    default_mean = float(np.nanmean(default)) if np.isfinite(default).any() else None
    is_lowered = bool(hit["lowered"].any())
    clock_mean = float(np.nanmean(clock)) if np.isfinite(clock).any() else None
    top_mean = float(np.nanmean(top)) if np.isfinite(top).any() else None
    bit_share = float(hit["cap_bit"].mean()) if np.isfinite(hit["reasons"]).any() else None
    gpus = _joined_gpus(g["gpus"] for g in held)
    limit_txt = f" limit {limit_mean:.0f} W" if limit_mean else " limit"
    if is_lowered and default_mean:
        limit_txt += f" (default {default_mean:.0f} W: lowered with nvidia-smi -pl)"
    clock_txt = (
        f", SM clock {clock_mean:.0f} of {top_mean:.0f} MHz" if clock_mean and top_mean else ""
    )
    summary = (
        f"{len(gpus)} GPU(s) held at their power{limit_txt} {capped_share:.0%} of busy time"
        f"{clock_txt}: ~{_fmt_gpu_s(gpu_s)} ({{share}}) lost to the power cap"
    )
    confidence = 0.5 + 0.2 * min(1.0, capped_share) + (0.15 if measure == "clock" else 0.0)
    confidence += 0.1 if bit_share else 0.0
    evidence = PowerCapEvidence(
        intervals=_intervals(pd.concat([g["runs"] for g in held], ignore_index=True), "w"),
        gpus=gpus,
        phases=sorted(set().union(*(g["phases"] for g in held))),
        power_w_mean=_num(power_mean) if power_mean is not None else None,
        power_limit_w=_num(limit_mean) if limit_mean is not None else None,
        power_default_limit_w=_num(default_mean) if default_mean is not None else None,
        lowered_limit=is_lowered if default_mean is not None else None,
        capped_share_of_busy=round(capped_share, 4),
        sm_clock_mhz_capped=_num(clock_mean) if clock_mean is not None else None,
        sm_clock_mhz_max=_num(top_mean) if top_mean is not None else None,
        power_cap_reason_share=None if bit_share is None else round(bit_share, 4),
        loss_measure=measure,
    )
    return _finding("power_cap", parts, th, gpu_s, confidence, summary, evidence)


def _capped(ctx: AnalysisContext, th: Thresholds) -> dict | None:
    """One part's GPUs at their power cap: whether it knows any limit, has a capped busy
    sample, and, for the GPUs held by the cap, their capped samples' columns (in sample
    order), lost and busy seconds, runs, GPUs and phases. None without samples."""
    s = ctx.unclaimed_samples
    if s is None or s.empty:
        return None
    limits = _inventory(ctx, "power_limit_w")
    out: dict = {"limits": bool(limits), "capped": False, "hit": None}
    if not limits:
        return out
    m = _sample_frame(ctx, s, {"power": "power_w", "clock": "sm_clock_mhz", "reasons": "reasons"})
    codes, pairs = _gpu_codes(m)
    m["limit"] = _per_gpu(codes, pairs, limits)
    busy = (m["util"] >= th.busy_util_pct).to_numpy()
    reasons = m["reasons"].to_numpy(np.float64)
    cap_bit = np.isfinite(reasons) & (
        (np.nan_to_num(reasons).astype(np.int64) & REASON_SW_POWER_CAP) > 0
    )
    with np.errstate(invalid="ignore"):
        at_limit = (m["power"] >= th.power_cap_frac * m["limit"]).to_numpy(bool)
    capped = busy & at_limit  # the reason bit alone is throttling's: here the draw decides
    out["capped"] = bool(capped.any())
    if not capped.any():
        return out
    m["capped_s"] = np.where(capped, m["dt_s"], 0.0)
    sums = m[busy].groupby(["host", "gpu"])[["capped_s", "dt_s"]].sum()
    per = sums["capped_s"] / sums["dt_s"].clip(lower=1e-12)
    held = per[per >= th.power_cap_share]
    if held.empty:
        return out
    held_gpus = pd.MultiIndex.from_frame(m[["host", "gpu"]]).isin(held.index)
    hit = capped & held_gpus
    # the clock the GPU reaches when not capped: its inventory maximum, else the run's highest
    max_clock = _inventory(ctx, "max_sm_clock_mhz")
    seen = m.groupby(["host", "gpu"])["clock"].transform("max").to_numpy(np.float64)
    top = _per_gpu(codes, pairs, max_clock)
    top = np.where(np.isfinite(top), np.fmax(top, seen), seen)
    ratio = m["clock"].to_numpy(np.float64) / top
    defaults = _inventory(ctx, "power_default_limit_w")
    default = _per_gpu(codes, pairs, defaults)
    lowered = np.isfinite(default) & (m["limit"].to_numpy(np.float64) < default * 0.99)
    by_clock = np.isfinite(ratio)
    with np.errstate(invalid="ignore", divide="ignore"):
        cube = 1.0 - np.cbrt(m["limit"].to_numpy(np.float64) / default)
    lost_frac = np.where(by_clock, np.clip(1.0 - ratio, 0.0, 1.0),
                         np.where(lowered, np.clip(cube, 0.0, 1.0), 0.0))  # fmt: skip
    lost_frac = np.where(hit, np.nan_to_num(lost_frac), 0.0)
    m["lost_s"] = m["dt_s"] * lost_frac
    out.update(
        hit={"dt_s": m["dt_s"].to_numpy()[hit], "power": m["power"].to_numpy()[hit],
             "limit": m["limit"].to_numpy()[hit], "clock": m["clock"].to_numpy()[hit],
             "top": top[hit], "default": default[hit], "lowered": lowered[hit],
             "by_clock": by_clock[hit], "cap_bit": cap_bit[hit], "reasons": reasons[hit]},
        lost_s=exact_sum(m["lost_s"].to_numpy(np.float64)),
        busy_held_s=exact_sum(m.loc[busy & held_gpus, "dt_s"].to_numpy(np.float64)),
        runs=_runs(m, hit, m["lost_s"].to_numpy(np.float64)),
        gpus=_gpu_pairs(m[hit]),
        phases=set(s.loc[s.index[hit], "phase"].astype(str)),
    )  # fmt: skip
    return out
