"""``hot_gpu``: one GPU far hotter than its peers at the same load — a cooling problem.

GPUs of one node doing the same data-parallel work run within a few degrees of each other;
one that runs ``th.hot_gpu_delta_c`` or more above the median of its peers at comparable
utilization (within ``th.hot_gpu_util_gap_pct`` points) has a cooling problem: a failing or
blocked fan, a clogged heat sink, a bad seat in the airflow, dried thermal paste. Hot silicon
leaks more power and, at its slowdown temperature, the driver cuts its clocks (clock-event
reasons SW/HW thermal slowdown: "SW Thermal capping algorithm is reducing clocks below
requested clocks because GPU temperature is higher than Max Operating Temp", nvidia-smi
--help-query-gpu). Its peers then wait for it at every synchronisation.

The loss is measured from clocks where they were sampled: at each instant the hot GPU's SM
clock short of its busy peers' median costs that share of its time, and every busy GPU of the
host waits for it (data-parallel ranks synchronise every step). Without clocks, or while its
clocks still keep up, the GPU is named in a finding only when the loss is measurable; the
temperatures are in the evidence either way (`warnings` gives the line for the notes).
``throttling`` leaves the GPUs named here alone.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from gpuprof.analyzers.evidence import HotGpuEvidence
from gpuprof.analyzers.findings import AnalysisContext, Finding, Thresholds
from gpuprof.analyzers.parts import Parts, exact_sum, median_of_counts, value_counts
from gpuprof.analyzers.stalls._phase import _memo, _num, _parts
from gpuprof.analyzers.stalls._resource import (
    REASON_HW_THERMAL,
    REASON_SW_THERMAL,
    _finding,
    _fmt_gpu_s,
    _gpu_columns_of,
    _intervals,
    _per_gpu,
    _runs,
    _sample_frame,
)

_THERMAL_BITS = REASON_SW_THERMAL | REASON_HW_THERMAL


def hot_gpus(ctx: AnalysisContext | Parts, th: Thresholds) -> pd.DataFrame:
    """One row per GPU that runs hot: host, gpu, temp_c and util (its busy medians), peer_temp
    and peer_util (its peers' medians of those), peers (how many). Empty when none. A GPU's
    peers are the GPUs of its host: each part of a run (a node) finds its own.

    Computed once per set of unclaimed samples and thresholds (`detect` and `warnings` both
    ask); the frame is shared, so callers don't modify it."""
    parts = _parts(ctx)
    got = [g for g in parts.map(_hot_of, th) if len(g)]
    if not got:
        return pd.DataFrame(columns=_HOT_COLUMNS)
    return pd.concat(got, ignore_index=True) if len(got) > 1 else got[0]


_HOT_COLUMNS = ["host", "gpu", "temp_c", "util", "peer_temp", "peer_util", "peers"]


def _hot_of(ctx: AnalysisContext, th: Thresholds) -> pd.DataFrame:
    key = f"hot_gpus:{th.busy_util_pct}:{th.hot_gpu_util_gap_pct}:{th.hot_gpu_delta_c}"
    return _memo(ctx, key, lambda: _hot_gpus(ctx, th))


def _hot_gpus(ctx: AnalysisContext, th: Thresholds) -> pd.DataFrame:
    s = ctx.unclaimed_samples
    cols = _HOT_COLUMNS
    if s is None or s.empty:
        return pd.DataFrame(columns=cols)
    util = s["util_gpu_pct"].to_numpy(np.float64)
    temp = _gpu_columns_of(ctx, s)["temp_c"].to_numpy(np.float64)
    busy = (util >= th.busy_util_pct) & np.isfinite(temp)
    if not busy.any():
        return pd.DataFrame(columns=cols)
    per = _per_gpu(ctx, s, busy, {"temp_c": (temp, "median"), "util": (util, "mean")})
    hosts = per["host"].to_numpy(object)
    numbers = per["gpu"].to_numpy()
    temps, utils = per["temp_c"].to_numpy(np.float64), per["util"].to_numpy(np.float64)
    rows = []
    # per host (sorted), its GPUs in the table's order; a node has a handful of GPUs: a
    # loop over them, on arrays
    for host in sorted(set(hosts.tolist())):
        mine = np.flatnonzero(hosts == host)
        if len(mine) < 2:
            continue
        for i in mine:
            peers = mine[mine != i]
            comparable = peers[np.abs(utils[peers] - utils[i]) <= th.hot_gpu_util_gap_pct]
            if not len(comparable):
                continue
            peer_temp = float(np.median(temps[comparable]))
            if temps[i] - peer_temp >= th.hot_gpu_delta_c:
                peer_util = float(np.mean(utils[comparable]))
                gpu = int(numbers[i])
                temp, util = float(temps[i]), float(utils[i])
                rows.append((host, gpu, temp, util, peer_temp, peer_util, len(comparable)))
    return pd.DataFrame(rows, columns=cols)


def detect(ctx: AnalysisContext | Parts, th: Thresholds) -> Finding | None:
    """A GPU ``th.hot_gpu_delta_c`` above its peers at comparable load, with the clock time it
    loses against them (see the module doc)."""
    parts = _parts(ctx)
    hot = hot_gpus(parts, th)
    if hot.empty:
        return None
    # the peers' clock at the same instant: busy samples of the other GPUs, binned by interval
    median = median_of_counts([c for c in parts.map(_positive_intervals) if c is not None])
    step = max(1, int(median * 1e9) if np.isfinite(median) else 1)
    pairs = list(zip(hot["host"].astype(str), hot["gpu"].astype(int)))
    got = [g for g in parts.map(_slowed, th, pairs, step) if g is not None]
    gpu_s = float(sum(g["gpu_s"] for g in got))
    rows = {k: np.concatenate([g["hot"][k] for g in got]) for k in got[0]["hot"]} if got else {}
    reasons = rows.get("reasons", np.zeros(0))
    thermal = np.isfinite(reasons) & ((np.nan_to_num(reasons).astype(np.int64) & _THERMAL_BITS) > 0)
    thermal_share = float(thermal.mean()) if np.isfinite(reasons).any() else None
    worst = hot.sort_values("temp_c", ascending=False).iloc[0]
    clock_hot = rows.get("clock", np.zeros(0))
    clock_peer = rows.get("peer_clock", np.zeros(0))
    labels = [f"{h}:{int(x)}" for h, x in zip(hot["host"], hot["gpu"])]
    delta = float(worst["temp_c"] - worst["peer_temp"])
    clock_txt = (
        f", SM clock {np.nanmean(clock_hot):.0f} vs {np.nanmean(clock_peer):.0f} MHz"
        if np.isfinite(clock_hot).any() and np.isfinite(clock_peer).any()
        else ""
    )
    summary = (
        f"{', '.join(labels)} run{'s' if len(labels) == 1 else ''} {delta:.0f} °C above "
        f"{int(worst['peers'])} peer(s) at comparable load ({worst['temp_c']:.0f} vs "
        f"{worst['peer_temp']:.0f} °C{clock_txt}): check its fans and airflow — "
        f"~{_fmt_gpu_s(gpu_s)} ({{share}}) lost waiting for it"
    )
    confidence = 0.55 + 0.1 * min(1.0, (delta - th.hot_gpu_delta_c) / 10.0)
    confidence += 0.15 * min(1.0, (int(worst["peers"]) - 1) / 3.0) + (0.15 if thermal.any() else 0)
    runs = pd.concat([g["runs"] for g in got], ignore_index=True) if got else pd.DataFrame()
    evidence = HotGpuEvidence(
        intervals=_intervals(runs, "w"),
        gpus=labels,
        phases=sorted(set().union(*(g["phases"] for g in got))),
        temp_c=_num(float(worst["temp_c"])),
        peer_temp_c=_num(float(worst["peer_temp"])),
        temp_c_above_peers=_num(delta),
        util_gpu_pct=_num(float(worst["util"])),
        peer_util_gpu_pct=_num(float(worst["peer_util"])),
        sm_clock_mhz=_num(float(np.nanmean(clock_hot))) if np.isfinite(clock_hot).any() else None,
        peer_sm_clock_mhz=_num(float(np.nanmean(clock_peer)))
        if np.isfinite(clock_peer).any()
        else None,
        thermal_reasons_share=None if thermal_share is None else round(thermal_share, 4),
        peers=int(worst["peers"]),
    )
    return _finding("hot_gpu", parts, th, gpu_s, confidence, summary, evidence)


def _positive_intervals(ctx: AnalysisContext) -> tuple[np.ndarray, np.ndarray] | None:
    """One part's positive sampling intervals of its unclaimed samples, as distinct values
    and counts."""
    s = ctx.unclaimed_samples
    if s is None or s.empty:
        return None
    dt = np.nan_to_num(s["dt_s"].to_numpy(np.float64))
    return value_counts(dt[dt > 0])


def _slowed(ctx: AnalysisContext, th: Thresholds, hot: list[tuple], step: int) -> dict | None:
    """One part's busy samples of its hot GPUs: the clock they lost against their busy peers
    (times the host's busy GPUs, who wait), their columns (in sample order), runs and phases.
    None without samples."""
    s = ctx.unclaimed_samples
    if s is None or s.empty:
        return None
    m = _sample_frame(ctx, s, {"clock": "sm_clock_mhz", "reasons": "reasons"})
    busy = (m["util"] >= th.busy_util_pct).to_numpy()
    is_hot = pd.MultiIndex.from_arrays([m["host"].astype(str), m["gpu"]]).isin(hot)
    m["bin"] = m["t_ns"] // step
    peers = m[busy & ~is_hot & np.isfinite(m["clock"])]
    peer_clock = peers.groupby(["host", "bin"])["clock"].median().rename("peer_clock")
    m = m.join(peer_clock, on=["host", "bin"])
    ratio = (m["clock"] / m["peer_clock"]).to_numpy(np.float64)
    lost_frac = np.where(busy & is_hot & np.isfinite(ratio), np.clip(1.0 - ratio, 0.0, 1.0), 0.0)
    m["lost_s"] = m["dt_s"] * lost_frac
    n_busy = m[busy].groupby("host")["gpu"].nunique()
    waiting = m["host"].map(n_busy).fillna(1).to_numpy(np.float64)
    rows = busy & is_hot
    return {
        "gpu_s": exact_sum(m["lost_s"].to_numpy(np.float64) * waiting),
        "hot": {
            "reasons": m["reasons"].to_numpy(np.float64)[rows],
            "clock": m["clock"].to_numpy(np.float64)[rows],
            "peer_clock": m["peer_clock"].to_numpy(np.float64)[rows],
        },
        "runs": _runs(m, (rows & (lost_frac > 0)), m["lost_s"].to_numpy(np.float64)),
        "phases": set(s.loc[s.index[rows], "phase"].astype(str)),
    }


def warnings(ctx: AnalysisContext, th: Thresholds) -> list[str]:
    """A line per hot GPU, for the diagnosis notes (whether or not it costs measurable time)."""
    try:
        hot = hot_gpus(ctx, th)
    except Exception:  # a note must never cost the diagnosis
        return []
    return [
        f"{r.host}:{int(r.gpu)} runs {r.temp_c - r.peer_temp:.0f} °C above {int(r.peers)} "
        f"peer(s) at comparable load ({r.temp_c:.0f} vs {r.peer_temp:.0f} °C): check its "
        "cooling before it throttles"
        for r in hot.itertuples(index=False)
    ]
