"""Resource stalls: the GPUs are not idle-waiting on a phase, a resource limits them.

Kinds: ``memory_headroom``, ``offload_thrash``, ``comm_bound``, ``host_bound``, ``imbalance``,
``throttling`` (DESIGN.md, "Stall taxonomy"). Each detector is a pure function
``detect_<kind>(ctx, th) -> Finding | None`` over `AnalysisContext`; `DETECTORS` maps kind to
detector. Work is vectorised over samples and spans; loops run over GPUs, steps or phases.

Who claims what (no double counting):

- ``offload_thrash`` claims update-phase samples with heavy PCIe traffic and low compute;
  ``host_bound`` and ``memory_headroom`` leave those samples alone.
- ``comm_bound`` claims the collective (non-barrier) share of update time above a healthy
  allowance; barrier waits (``nccl:barrier`` / ``attrs.wait``) are left to ``imbalance`` and
  ``throttling``.
- ``throttling`` claims the time lost to reduced clocks on GPUs whose clock-event reasons show
  a power or thermal limit; ``imbalance`` ignores stragglers that are throttled GPUs.
- ``host_bound`` claims compute-phase samples while the rank's process (or the main process)
  is pinned at ~one full core.
- ``memory_headroom`` claims a share of rollout time (or update time when no rollout is
  recorded) on GPUs whose peak memory leaves headroom.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pandas as pd

from gpuprof.analyzers.findings import AnalysisContext, Finding, Thresholds

UPDATE_PHASES = ("update_actor", "update_critic")
COMPUTE_PHASES = ("old_logprob", "ref_logprob", "values", "update_actor", "update_critic")
"""Trainer-side GPU phases (forward/backward passes) where launch overhead shows."""
NOT_WORK_PHASES = ("step", "collective", "(none)", "(unnamed)")
"""Phases that are not units of per-rank work (compared across ranks by ``imbalance``)."""

# NVML nvmlClocksEventReason* bits (nvml.h) that mean "a power or thermal limit cut the clocks"
REASON_SW_POWER_CAP = 0x4
REASON_HW_SLOWDOWN = 0x8
REASON_SW_THERMAL = 0x20
REASON_HW_THERMAL = 0x40
REASON_HW_POWER_BRAKE = 0x80
THROTTLE_REASON_MASK = (
    REASON_SW_POWER_CAP
    | REASON_HW_SLOWDOWN
    | REASON_SW_THERMAL
    | REASON_HW_THERMAL
    | REASON_HW_POWER_BRAKE
)
THROTTLE_REASON_NAMES = {
    REASON_SW_POWER_CAP: "sw_power_cap",
    REASON_HW_SLOWDOWN: "hw_slowdown",
    REASON_SW_THERMAL: "sw_thermal_slowdown",
    REASON_HW_THERMAL: "hw_thermal_slowdown",
    REASON_HW_POWER_BRAKE: "hw_power_brake",
}

MEM_TARGET_FRAC = 0.9
"""Memory use a well-tuned rollout/update reaches (share of total)."""
MEM_UPDATE_FACTOR = 0.25
"""Update phases gain less from memory than generation (compute-bound): a quarter of the model."""

PCIE_LINK_BYTES_S = 64e9
"""Nominal PCIe Gen5 x16 rate per direction: copies take at least bytes / this."""

_COLLECTIVE_WORDS = ("allreduce", "all_reduce", "all_gather", "allgather", "reduce_scatter",
                     "reducescatter", "broadcast", "all_to_all", "alltoall")  # fmt: skip

HOST_BOUND_UTIL_REF = 0.95
"""A launch-bound phase loses ``HOST_BOUND_UTIL_REF - util`` of its time (util as 0–1)."""

_MAX_INTERVALS = 20


# --------------------------------------------------------------------------------------------
# Helpers


def _num(frame: pd.DataFrame, name: str) -> np.ndarray:
    if frame is None or name not in frame:
        return np.full(0 if frame is None else len(frame), np.nan)
    return pd.to_numeric(frame[name], errors="coerce").to_numpy(np.float64, na_value=np.nan)


def _gpu_label(host: Any, gpu: Any) -> str:
    return f"{host}:{int(gpu)}"


def _spans(ctx: AnalysisContext) -> pd.DataFrame:
    """The run's usable spans with name and a barrier flag; empty frame when none (computed
    once per context: several detectors use them)."""
    cache = ctx.__dict__.setdefault("_stalls_resource_cache", {})
    if "spans" not in cache:
        cache["spans"] = _usable_spans(ctx)
    return cache["spans"]


def _usable_spans(ctx: AnalysisContext) -> pd.DataFrame:
    cols = ["host", "pid", "rank", "phase", "name", "step", "start_ns", "end_ns", "wait"]
    spans = ctx.run.spans
    if spans is None or len(spans) == 0 or "start_ns" not in spans or "end_ns" not in spans:
        return pd.DataFrame({c: pd.Series([], dtype=object) for c in cols})
    start, end, pid = _num(spans, "start_ns"), _num(spans, "end_ns"), _num(spans, "pid")
    ok = np.isfinite(start) & np.isfinite(end) & (end >= start) & np.isfinite(pid)
    ok &= spans["host"].notna().to_numpy() if "host" in spans else False
    kept = spans.loc[ok]
    phase = kept["phase"].astype(object).fillna("(unnamed)") if "phase" in kept else None
    name = kept["name"].astype(object).fillna("") if "name" in kept else None
    attrs = kept["attrs"] if "attrs" in kept else pd.Series([{}] * len(kept), dtype=object)
    wait = np.array([bool(a.get("wait")) if isinstance(a, dict) else False for a in attrs])
    out = pd.DataFrame(
        {
            "host": kept["host"].astype(str).to_numpy(object),
            "pid": pid[ok],
            "rank": _num(kept, "rank"),
            "phase": phase.to_numpy(object) if phase is not None else "(unnamed)",
            "name": name.astype(str).to_numpy(object) if name is not None else "",
            "step": _num(kept, "step"),
            "start_ns": pd.to_numeric(kept["start_ns"]).to_numpy(np.int64),
            "end_ns": pd.to_numeric(kept["end_ns"]).to_numpy(np.int64),
            "wait": wait.astype(bool),
        }
    )
    lname = out["name"].str.lower()
    out["wait"] = out["wait"] | lname.str.contains("barrier", regex=False)
    return out


def _collective_mask(spans: pd.DataFrame) -> np.ndarray:
    """Spans that are collectives: phase ``collective``, ``nccl:*`` names or collective words."""
    if spans.empty:
        return np.zeros(0, dtype=bool)
    lname = spans["name"].astype(str).str.lower()
    hit = (spans["phase"] == "collective").to_numpy() | lname.str.startswith("nccl").to_numpy()
    for word in _COLLECTIVE_WORDS:
        hit |= lname.str.contains(word, regex=False).to_numpy()
    return hit


def _inside(samples: pd.DataFrame, spans: pd.DataFrame) -> np.ndarray:
    """Position in ``spans`` of a span of the sample's owner covering the sample (-1: none).

    Spans of one owner are assumed not to overlap each other (e.g. all of one phase).
    """
    out = np.full(len(samples), -1, dtype=np.int64)
    if samples.empty or spans.empty:
        return out
    left = pd.DataFrame(
        {
            "t_ns": samples["t_ns"].to_numpy(np.int64),
            "owner_host": samples["owner_host"].astype(object).to_numpy(),
            "pid": _num(samples, "pid"),
            "row": np.arange(len(samples)),
        }
    ).dropna(subset=["owner_host", "pid"])
    if left.empty:
        return out
    right = pd.DataFrame(
        {
            "t_ns": spans["start_ns"].to_numpy(np.int64),
            "owner_host": spans["host"].astype(object).to_numpy(),
            "pid": spans["pid"].to_numpy(np.float64),
            "end_ns": spans["end_ns"].to_numpy(np.int64),
            "pos": np.arange(len(spans)),
        }
    )
    merged = pd.merge_asof(
        left.sort_values("t_ns", kind="stable"),
        right.sort_values("t_ns", kind="stable"),
        on="t_ns",
        by=["owner_host", "pid"],
        direction="backward",
    )
    hit = merged["pos"].notna().to_numpy() & (
        merged["t_ns"].to_numpy() < merged["end_ns"].to_numpy(np.float64, na_value=-1.0)
    )
    out[merged["row"].to_numpy()[hit]] = merged["pos"].to_numpy()[hit].astype(np.int64)
    return out


def _gpu_columns(ctx: AnalysisContext) -> pd.DataFrame:
    """The clock and power columns of ``run.gpu`` for each row of ``ctx.samples``, in order."""
    g, rows = ctx.run.gpu, ctx.samples["row"].to_numpy(np.int64)
    return pd.DataFrame(
        {
            "sm_clock_mhz": _num(g, "sm_clock_mhz")[rows],
            "reasons": _num(g, "clock_event_reasons")[rows],
            "temp_c": _num(g, "temp_c")[rows],
            "power_w": _num(g, "power_w")[rows],
        },
        index=ctx.samples.index,
    )


def _intervals(frame: pd.DataFrame, weight: str, n: int = _MAX_INTERVALS) -> list[list[int]]:
    """The ``n`` worst ``[start_ns, end_ns]`` rows of ``frame`` by ``weight``, in time order."""
    if frame.empty:
        return []
    top = frame.nlargest(n, weight).sort_values("start_ns")
    return [[int(a), int(b)] for a, b in zip(top["start_ns"], top["end_ns"])]


def _runs(samples: pd.DataFrame, mask: np.ndarray, weight: np.ndarray) -> pd.DataFrame:
    """Contiguous runs of masked samples per GPU: start_ns, end_ns, summed weight."""
    s = samples
    if s.empty or not mask.any():
        return pd.DataFrame({"start_ns": [], "end_ns": [], "w": []})
    gid = s.groupby(["host", "gpu"], sort=False).ngroup().to_numpy()
    m = mask.astype(bool)
    brk = np.ones(len(s), dtype=bool)
    brk[1:] = (gid[1:] != gid[:-1]) | (m[1:] != m[:-1])
    run_id = np.cumsum(brk)
    t = s["t_ns"].to_numpy(np.int64)
    end = t + np.round(s["dt_s"].to_numpy(np.float64) * 1e9).astype(np.int64)
    f = pd.DataFrame({"run": run_id[m], "t": t[m], "e": end[m], "w": weight[m]})
    agg = f.groupby("run").agg(start_ns=("t", "min"), end_ns=("e", "max"), w=("w", "sum"))
    return agg.reset_index(drop=True)


def _finding(
    kind: str,
    ctx: AnalysisContext,
    th: Thresholds,
    gpu_s: float,
    confidence: float,
    summary: str,
    evidence: dict[str, Any],
) -> Finding | None:
    if not np.isfinite(gpu_s) or gpu_s <= 0:
        return None
    share = ctx.share(gpu_s)
    if share < th.min_share:
        return None
    evidence = {**evidence, "gpu_seconds_lost": round(float(gpu_s), 3)}
    return Finding(
        kind=kind,
        gpu_seconds_lost=float(gpu_s),
        share=share,
        confidence=float(np.clip(confidence, 0.0, 1.0)),
        summary=summary.replace("{share}", f"{share:.0%}"),
        evidence=evidence,
    )


def _fmt_gpu_s(gpu_s: float) -> str:
    return f"{gpu_s / 60:.1f} GPU-min" if gpu_s >= 60 else f"{gpu_s:.1f} GPU-s"


def _sorted_gpus(frame: pd.DataFrame) -> list[str]:
    keys = frame[["host", "gpu"]].drop_duplicates().sort_values(["host", "gpu"])
    return [_gpu_label(h, g) for h, g in zip(keys["host"], keys["gpu"])]


def _offload_mask(samples: pd.DataFrame, th: Thresholds) -> np.ndarray:
    """Update samples with heavy PCIe traffic and low compute (claimed by ``offload_thrash``)."""
    s = samples
    dt = s["dt_s"].to_numpy(np.float64)
    with np.errstate(invalid="ignore", divide="ignore"):
        per_dir = s["pcie_bytes"].to_numpy(np.float64) / np.where(dt > 0, dt, np.nan) / 2.0
    heavy = per_dir > th.pcie_heavy_bytes_s
    return heavy & s["phase"].isin(UPDATE_PHASES).to_numpy()


# --------------------------------------------------------------------------------------------
# memory_headroom


def detect_memory_headroom(ctx: AnalysisContext, th: Thresholds) -> Finding | None:
    """Peak device memory far below total during rollout (or, without rollout, update).

    Gain model: generation throughput grows with the KV cache (sequences in flight), so a
    rollout whose peak memory ``p`` (share of total) sits below the ``MEM_TARGET_FRAC`` a tuned
    job reaches runs ``1 + d`` times longer than it would, ``d = MEM_TARGET_FRAC - p``; the
    recoverable share of its GPU-time is ``d / (1 + d)``. Update phases gain less from larger
    micro-batches (they are compute-bound): a quarter of that (`MEM_UPDATE_FACTOR`). Only GPUs
    whose peak is below ``1 - th.memory_headroom_frac`` count; update samples with heavy PCIe
    (offload frees memory on purpose) are left to ``offload_thrash``.
    """
    s = ctx.samples
    if s.empty:
        return None
    used, total = _num(s, "mem_used_bytes"), _num(s, "mem_total_bytes")
    if not np.isfinite(used).any():
        return None
    # total from the inventory when samples lack it
    if not np.isfinite(total).all():
        listed = [g for g in ctx.run.meta.gpus or [] if isinstance(g, dict)]
        inv = pd.DataFrame(
            [(str(g.get("host")), g.get("index"), g.get("mem_total_bytes")) for g in listed],
            columns=["host", "gpu", "total"],
        )
        inv["gpu"] = pd.to_numeric(inv["gpu"], errors="coerce")
        inv["total"] = pd.to_numeric(inv["total"], errors="coerce").astype(np.float64)
        inv = inv.dropna(subset=["gpu"]).drop_duplicates(["host", "gpu"])
        keys = pd.DataFrame({"host": s["host"].astype(str).to_numpy(object),
                             "gpu": s["gpu"].to_numpy(np.float64)})  # fmt: skip
        fill = keys.merge(inv.astype({"gpu": np.float64}), on=["host", "gpu"], how="left")
        fill = fill["total"].to_numpy(np.float64)
        total = np.where(np.isfinite(total), total, fill)
    phase = s["phase"].to_numpy(object)
    if (phase == "rollout").any():
        use = phase == "rollout"
        factor = 1.0
        phases = ["rollout"]
    else:
        use = np.isin(phase, UPDATE_PHASES) & ~_offload_mask(s, th)
        factor = MEM_UPDATE_FACTOR
        phases = sorted(set(phase[use]))
    use &= np.isfinite(used) & np.isfinite(total) & (total > 0)
    if not use.any():
        return None
    work = pd.DataFrame(
        {
            "host": s["host"].to_numpy(object)[use],
            "gpu": s["gpu"].to_numpy()[use],
            "frac": used[use] / total[use],
            "dt": s["dt_s"].to_numpy(np.float64)[use],
            "used": used[use],
            "total": total[use],
        }
    )
    per_gpu = work.groupby(["host", "gpu"], sort=True).agg(
        peak=("frac", "max"), gpu_s=("dt", "sum"), peak_b=("used", "max"), total_b=("total", "max")
    )
    per_gpu = per_gpu.reset_index()
    limit = 1.0 - th.memory_headroom_frac
    low = per_gpu[per_gpu["peak"] < limit].copy()
    if low.empty:
        return None
    d = np.clip(MEM_TARGET_FRAC - low["peak"].to_numpy(), 0.0, None)
    low["lost"] = low["gpu_s"].to_numpy() * factor * d / (1.0 + d)
    gpu_s = float(low["lost"].sum())
    peak = float(low["peak"].median())
    knobs = ctx.run.meta.knobs or {}
    gmu = {k: v for k, v in knobs.items() if "gpu_memory_utilization" in str(k)}
    # intervals: the phase's contiguous runs on the low-memory GPUs
    on_low = pd.MultiIndex.from_arrays([s["host"].astype(str), s["gpu"]]).isin(
        pd.MultiIndex.from_arrays([low["host"].astype(str), low["gpu"]])
    )
    runs = _runs(s, use & on_low, s["dt_s"].to_numpy(np.float64))
    confidence = 0.5 + 0.4 * min(1.0, (limit - peak) / 0.3) + (0.1 if gmu else 0.0)
    summary = (
        f"peak memory {peak:.0%} of total during {'/'.join(phases)} on {len(low)} GPU(s): "
        f"a larger KV cache/batch could recover ~{_fmt_gpu_s(gpu_s)} ({{share}})"
    )
    evidence = {
        "intervals": _intervals(runs.rename(columns={"w": "w"}), "w"),
        "gpus": _sorted_gpus(low),
        "phases": phases,
        "mem_peak_frac": round(peak, 4),
        "mem_peak_bytes": int(low["peak_b"].max()),
        "mem_total_bytes": int(low["total_b"].max()),
        "mem_target_frac": MEM_TARGET_FRAC,
        "phase_gpu_s": round(float(low["gpu_s"].sum()), 3),
        "model": "lost = phase GPU-s x d/(1+d), d = target - peak"
        + (f" x {MEM_UPDATE_FACTOR}" if factor != 1.0 else ""),
    }
    if gmu:
        evidence["knobs"] = {str(k): v for k, v in gmu.items()}
    return _finding("memory_headroom", ctx, th, gpu_s, confidence, summary, evidence)


# --------------------------------------------------------------------------------------------
# offload_thrash


def _update_windows(ctx: AnalysisContext, spans: pd.DataFrame) -> np.ndarray:
    """Per sample: inside an update span of its owner (also where a child span is innermost)."""
    s = ctx.samples
    in_update = s["phase"].isin(UPDATE_PHASES).to_numpy()
    if spans.empty:
        return in_update
    upd = spans[spans["phase"].isin(UPDATE_PHASES).to_numpy()].reset_index(drop=True)
    return in_update | (_inside(s, upd) >= 0)


def detect_offload_thrash(ctx: AnalysisContext, th: Thresholds) -> Finding | None:
    """Heavy PCIe traffic with low compute during update: parameter/optimizer offload.

    Per update sample with PCIe above ``th.pcie_heavy_bytes_s`` per direction, the lost share
    of its time is the larger of the kernel-free share (``1 - util``) and the time the copies
    need at the nominal link rate (``rate / PCIE_LINK_BYTES_S``), i.e. the copies are assumed
    not to overlap compute. Reported only when those samples' compute is low (util below
    ``th.low_compute_util_pct`` or, with GPM, SM activity below ``th.low_compute_sm_pct``), which
    keeps collective traffic over the NIC (util stays ~100%) for ``comm_bound``.
    """
    s = ctx.samples
    if s.empty or not np.isfinite(_num(s, "pcie_bytes")).any():
        return None
    spans = _spans(ctx)
    window = _update_windows(ctx, spans)
    dt = s["dt_s"].to_numpy(np.float64)
    with np.errstate(invalid="ignore", divide="ignore"):
        per_dir = s["pcie_bytes"].to_numpy(np.float64) / np.where(dt > 0, dt, np.nan) / 2.0
    heavy = window & (per_dir > th.pcie_heavy_bytes_s)
    if not heavy.any() or dt[heavy].sum() <= 0:
        return None
    util = _num(s, "util_gpu_pct")
    sm = _num(s, "sm_active_pct")
    w = dt[heavy]
    u_ok = np.isfinite(util[heavy])
    sm_ok = np.isfinite(sm[heavy])
    mean_util = float(np.average(util[heavy][u_ok], weights=w[u_ok])) if u_ok.any() else np.nan
    mean_sm = float(np.average(sm[heavy][sm_ok], weights=w[sm_ok])) if sm_ok.any() else np.nan
    # util (kernel running) first: NCCL traffic over the NIC keeps it ~100% with SMs low
    if np.isfinite(mean_util):
        low_compute = mean_util < th.low_compute_util_pct
    else:
        low_compute = bool(np.isfinite(mean_sm) and mean_sm < th.low_compute_sm_pct)
    if not low_compute:
        return None
    idle_frac = np.where(np.isfinite(util), 1.0 - np.clip(util / 100.0, 0, 1), 0.0)
    copy_frac = np.clip(np.nan_to_num(per_dir) / PCIE_LINK_BYTES_S, 0.0, 1.0)
    lost = np.where(heavy, dt * np.maximum(idle_frac, copy_frac), 0.0)
    gpu_s = float(lost.sum())
    update_s = float(dt[window].sum())
    heavy_share = float(w.sum() / update_s) if update_s > 0 else 0.0
    runs = _runs(s, heavy, lost)
    rate = float(np.average(per_dir[heavy], weights=w))
    knobs = {k: v for k, v in (ctx.run.meta.knobs or {}).items() if "offload" in str(k)}
    confidence = 0.45 + 0.3 * min(1.0, heavy_share) + 0.15 * min(1.0, rate / 30e9)
    confidence += 0.1 if any(v is True for v in knobs.values()) else 0.0
    phases = sorted(set(s["phase"].to_numpy(object)[heavy]) & set(UPDATE_PHASES)) or list(
        UPDATE_PHASES[:1]
    )
    summary = (
        f"PCIe {rate / 1e9:.0f} GB/s per direction during {heavy_share:.0%} of update with "
        f"util {mean_util:.0f}%: offload copies cost ~{_fmt_gpu_s(gpu_s)} ({{share}})"
    )
    evidence = {
        "intervals": _intervals(runs, "w"),
        "gpus": _sorted_gpus(s[heavy]),
        "phases": phases,
        "pcie_bytes_s_per_direction": round(rate, 0),
        "pcie_heavy_share_of_update": round(heavy_share, 4),
        "update_gpu_s": round(update_s, 3),
        "util_gpu_pct": None if not np.isfinite(mean_util) else round(mean_util, 1),
        "sm_active_pct": None if not np.isfinite(mean_sm) else round(mean_sm, 1),
    }
    if knobs:
        evidence["knobs"] = {str(k): v for k, v in knobs.items()}
    return _finding("offload_thrash", ctx, th, gpu_s, confidence, summary, evidence)


# --------------------------------------------------------------------------------------------
# comm_bound


def detect_comm_bound(ctx: AnalysisContext, th: Thresholds) -> Finding | None:
    """Collectives take a large share of update time.

    From spans: per owner, the wall time of collective spans (not barrier waits) inside its
    update spans over its update time, ``c``. The exposed communication above what a healthy,
    overlapped update shows (``th.collective_healthy_frac``) is lost: ``(c - healthy) x update
    GPU-s``. Reported when ``c >= th.collective_min_frac``; NVLink/PCIe traffic and SM activity
    (GPM) during the collectives raise the confidence.
    """
    s = ctx.samples
    spans = _spans(ctx)
    if s.empty or spans.empty:
        return None
    upd = spans[spans["phase"].isin(UPDATE_PHASES).to_numpy()]
    coll = spans[_collective_mask(spans) & ~spans["wait"].to_numpy()]
    if upd.empty or coll.empty:
        return None
    upd = upd.sort_values("start_ns", kind="stable").reset_index(drop=True)
    keys = ["host", "pid"]
    m = pd.merge_asof(
        coll[["host", "pid", "start_ns", "end_ns"]].sort_values("start_ns", kind="stable"),
        upd[["host", "pid", "start_ns", "end_ns"]].rename(
            columns={"start_ns": "u_start", "end_ns": "u_end"}
        ),
        left_on="start_ns",
        right_on="u_start",
        by=keys,
        direction="backward",
    ).dropna(subset=["u_end"])
    if m.empty:
        return None
    overlap = np.clip(np.minimum(m["end_ns"], m["u_end"]) - m["start_ns"], 0, None) / 1e9
    coll_s = m.assign(c=overlap).groupby(keys)["c"].sum()
    upd_s = upd.assign(d=(upd["end_ns"] - upd["start_ns"]) / 1e9).groupby(keys)["d"].sum()
    per_owner = pd.DataFrame({"coll_s": coll_s, "upd_s": upd_s}).fillna(0.0)
    per_owner = per_owner[per_owner["upd_s"] > 0]
    if per_owner.empty:
        return None
    per_owner["frac"] = (per_owner["coll_s"] / per_owner["upd_s"]).clip(0, 1)
    frac = float(per_owner["coll_s"].sum() / per_owner["upd_s"].sum())
    if frac < th.collective_min_frac:
        return None
    # GPU-seconds inside update windows per owner
    window = _update_windows(ctx, spans)
    dt = s["dt_s"].to_numpy(np.float64)
    w = pd.DataFrame({"host": s["owner_host"].to_numpy(object), "pid": _num(s, "pid"), "dt": dt})[
        window
    ]
    gpu_upd = w.groupby(keys)["dt"].sum()
    per_owner = per_owner.join(gpu_upd.rename("gpu_s"), how="inner")
    excess = (per_owner["frac"] - th.collective_healthy_frac).clip(0)
    per_owner["lost"] = per_owner["gpu_s"] * excess
    gpu_s = float(per_owner["lost"].sum())
    # link traffic and SM activity inside the collective spans
    coll_sorted = coll.reset_index(drop=True)
    in_coll = (_inside(s, coll_sorted) >= 0) & window
    nvl = _num(s, "nvlink_bytes")
    sm = _num(s, "sm_active_pct")
    util = _num(s, "util_gpu_pct")
    figures: dict[str, Any] = {}
    conf = 0.5 + 0.3 * min(1.0, (frac - th.collective_min_frac) / 0.3)
    if in_coll.any():
        wd = dt[in_coll]
        ok = np.isfinite(nvl[in_coll]) & (wd > 0)
        if ok.any():
            rate = float(nvl[in_coll][ok].sum() / wd[ok].sum() / 2.0)
            figures["nvlink_bytes_s_per_direction"] = round(rate, 0)
        ok_sm = np.isfinite(sm[in_coll])
        ok_u = np.isfinite(util[in_coll])
        if ok_sm.any():
            sm_mean = float(np.average(sm[in_coll][ok_sm], weights=wd[ok_sm] + 1e-12))
            figures["sm_active_pct_in_collectives"] = round(sm_mean, 1)
            conf += 0.1 if sm_mean < 50 else 0.0
        if ok_u.any():
            u_mean = float(np.average(util[in_coll][ok_u], weights=wd[ok_u] + 1e-12))
            figures["util_gpu_pct_in_collectives"] = round(u_mean, 1)
            conf += 0.1 if u_mean >= th.busy_util_pct else 0.0
    worst = m.assign(w=overlap).rename(columns={"start_ns": "start_ns", "end_ns": "end_ns"})
    worst = worst.drop_duplicates(["start_ns", "end_ns"])
    owners = per_owner.reset_index()
    gpus_df = s[window & s["owner_host"].notna().to_numpy()]
    gpus_df = gpus_df[
        pd.MultiIndex.from_arrays([gpus_df["owner_host"], gpus_df["pid"]]).isin(
            pd.MultiIndex.from_arrays([owners["host"], owners["pid"].astype(float)])
        )
    ]
    summary = (
        f"collectives take {frac:.0%} of update time (healthy ~{th.collective_healthy_frac:.0%}): "
        f"~{_fmt_gpu_s(gpu_s)} ({{share}}) of exposed communication"
    )
    evidence = {
        "intervals": _intervals(worst, "w"),
        "gpus": _sorted_gpus(gpus_df) if len(gpus_df) else [],
        "phases": sorted(set(upd["phase"])),
        "collective_share_of_update": round(frac, 4),
        "collective_s_per_owner_mean": round(float(per_owner["coll_s"].mean()), 3),
        "update_s_per_owner_mean": round(float(per_owner["upd_s"].mean()), 3),
        **figures,
    }
    return _finding("comm_bound", ctx, th, gpu_s, conf, summary, evidence)


# --------------------------------------------------------------------------------------------
# host_bound


def detect_host_bound(ctx: AnalysisContext, th: Thresholds) -> Finding | None:
    """Moderate utilisation in compute phases while the rank's (or main) process is pinned.

    A compute-phase sample is host-bound when, at that instant (nearest earlier process
    sample, within three process-sampling intervals), the GPU owner's process or a ``main``
    process (the driver, which dispatches for every GPU) reads at least
    ``th.process_core_pinned_pct`` of one core.
    Per (GPU, phase, step) the lost share of those samples' time is
    ``HOST_BOUND_UTIL_REF - mean util`` (kernels are launched too slowly to keep the GPU busy).
    Update samples claimed by ``offload_thrash`` are skipped.
    """
    s = ctx.samples
    procs = ctx.run.procs
    if s.empty or procs is None or procs.empty or "cpu_pct" not in procs:
        return None
    cpu = _num(procs, "cpu_pct")
    p = pd.DataFrame(
        {
            "host": procs["host"].astype(str).to_numpy(object),
            "pid": _num(procs, "pid"),
            "t_ns": _num(procs, "t_ns"),
            "cpu": cpu,
            "role": procs["role"].astype(object).to_numpy() if "role" in procs else None,
        }
    ).dropna(subset=["pid", "t_ns", "cpu"])
    if p.empty:
        return None
    p["t_ns"] = p["t_ns"].astype(np.int64)
    t_sorted = np.sort(np.unique(p["t_ns"].to_numpy()))
    step_ns = float(np.median(np.diff(t_sorted))) if len(t_sorted) > 1 else 1e9
    tol = pd.Timedelta(int(max(3 * step_ns, 1e9)), "ns").value
    compute = s["phase"].isin(COMPUTE_PHASES).to_numpy() & ~_offload_mask(s, th)
    if not compute.any():
        return None
    sel = s[compute]
    left = pd.DataFrame(
        {
            "t_ns": sel["t_ns"].to_numpy(np.int64),
            "host": sel["owner_host"].astype(object).to_numpy(),
            "pid": _num(sel, "pid"),
            "row": np.flatnonzero(compute),
        }
    ).sort_values("t_ns", kind="stable")
    own = pd.merge_asof(
        left.dropna(subset=["host", "pid"]),
        p[["t_ns", "host", "pid", "cpu"]].sort_values("t_ns", kind="stable"),
        on="t_ns",
        by=["host", "pid"],
        direction="backward",
        tolerance=tol,
    )
    main = p[p["role"] == "main"] if "role" in p else p.iloc[:0]
    # the main (driver) process dispatches work for every GPU of the job, wherever it runs
    main_max = main.groupby("t_ns", sort=False)["cpu"].max().reset_index()
    own_cpu = np.full(len(s), np.nan)
    own_cpu[own["row"].to_numpy()] = own["cpu"].to_numpy()
    main_cpu = np.full(len(s), np.nan)
    if not main_max.empty:
        mm = pd.merge_asof(
            left,
            main_max.sort_values("t_ns", kind="stable"),
            on="t_ns",
            direction="backward",
            tolerance=tol,
        )
        main_cpu[mm["row"].to_numpy()] = mm["cpu"].to_numpy()
    pinned_cpu = np.fmax(own_cpu, main_cpu)
    pinned = compute & (pinned_cpu >= th.process_core_pinned_pct)
    util = _num(s, "util_gpu_pct")
    pinned &= np.isfinite(util)
    if not pinned.any():
        return None
    dt = s["dt_s"].to_numpy(np.float64)
    work = pd.DataFrame(
        {
            "host": s["host"].to_numpy(object)[pinned],
            "gpu": s["gpu"].to_numpy()[pinned],
            "phase": s["phase"].to_numpy(object)[pinned],
            "step": np.nan_to_num(_num(s, "step")[pinned], nan=-1.0),
            "dt": dt[pinned],
            "uw": util[pinned] * dt[pinned],
            "t0": s["t_ns"].to_numpy(np.int64)[pinned],
            "t1": s["t_ns"].to_numpy(np.int64)[pinned] + (dt[pinned] * 1e9).astype(np.int64),
        }
    )
    g = work.groupby(["host", "gpu", "phase", "step"], sort=False).agg(
        gpu_s=("dt", "sum"), uw=("uw", "sum"), start_ns=("t0", "min"), end_ns=("t1", "max")
    )
    g = g[g["gpu_s"] > 0].reset_index()
    g["util"] = g["uw"] / g["gpu_s"] / 100.0
    g["lost"] = g["gpu_s"] * (HOST_BOUND_UTIL_REF - g["util"]).clip(0)
    gpu_s = float(g["lost"].sum())
    mean_util = float(g["uw"].sum() / g["gpu_s"].sum())
    if mean_util >= HOST_BOUND_UTIL_REF * 100:
        return None
    pinned_share = float(dt[pinned].sum() / dt[compute].sum()) if dt[compute].sum() > 0 else 0
    cpu_mean = float(np.nanmean(pinned_cpu[pinned]))
    own_share = float(np.mean(own_cpu[pinned] >= th.process_core_pinned_pct))
    sm = _num(s, "sm_active_pct")[pinned]
    confidence = 0.45 + 0.3 * min(1.0, pinned_share) + 0.15 * own_share
    confidence += 0.1 if mean_util < 85 else 0.0
    intervals = g.groupby(["phase", "step"]).agg(
        start_ns=("start_ns", "min"), end_ns=("end_ns", "max"), w=("lost", "sum")
    )
    summary = (
        f"util {mean_util:.0f}% in compute phases while a process is pinned at "
        f"{cpu_mean:.0f}% of one core ({pinned_share:.0%} of compute time): "
        f"~{_fmt_gpu_s(gpu_s)} ({{share}}) lost to launch/Python overhead"
    )
    evidence = {
        "intervals": _intervals(intervals.reset_index(), "w"),
        "gpus": _sorted_gpus(g),
        "phases": sorted(set(g["phase"])),
        "util_gpu_pct": round(mean_util, 1),
        "process_cpu_pct_of_core": round(cpu_mean, 1),
        "pinned_share_of_compute": round(pinned_share, 4),
        "rank_process_pinned_share": round(own_share, 4),
    }
    if np.isfinite(sm).any():
        evidence["sm_active_pct"] = round(float(np.nanmean(sm)), 1)
    return _finding("host_bound", ctx, th, gpu_s, confidence, summary, evidence)


# --------------------------------------------------------------------------------------------
# throttling


def _throttle_samples(ctx: AnalysisContext, th: Thresholds) -> pd.DataFrame | None:
    """Busy samples with their lost share to reduced clocks (``lost_frac``), or None."""
    s = ctx.samples
    if s.empty:
        return None
    g = _gpu_columns(ctx)
    if not np.isfinite(g["sm_clock_mhz"]).any():
        return None
    m = pd.concat([s[["host", "gpu", "t_ns", "dt_s", "step", "util_gpu_pct"]], g], axis=1)
    m = m.drop_duplicates(["host", "gpu", "t_ns"])
    clock = m["sm_clock_mhz"].to_numpy(np.float64)
    max_seen = float(np.nanmax(clock)) if np.isfinite(clock).any() else np.nan
    inv_max = [
        float(x.get("max_sm_clock_mhz"))
        for x in ctx.run.meta.gpus or []
        if isinstance(x, dict) and isinstance(x.get("max_sm_clock_mhz"), int | float)
    ]
    max_clock = max([max_seen, *inv_max]) if inv_max else max_seen
    if not np.isfinite(max_clock) or max_clock <= 0:
        return None
    reasons = m["reasons"].to_numpy(np.float64)
    has_reasons = np.isfinite(reasons)
    bits = np.where(has_reasons, reasons, 0).astype(np.int64)
    busy = m["util_gpu_pct"].to_numpy(np.float64) >= th.busy_util_pct
    ratio = clock / max_clock
    limited = np.where(has_reasons, (bits & THROTTLE_REASON_MASK) != 0, ratio < th.clock_drop_frac)
    hot = busy & limited & np.isfinite(clock)
    m["hot"] = hot
    m["bits"] = bits
    m["lost_frac"] = np.where(hot, np.clip(1.0 - ratio, 0.0, 1.0), 0.0)
    m["has_reasons"] = has_reasons
    m.attrs["max_clock_mhz"] = max_clock
    return m


def detect_throttling(ctx: AnalysisContext, th: Thresholds) -> Finding | None:
    """Busy GPUs whose clocks a power or thermal limit reduced.

    A busy sample (util at least ``th.busy_util_pct``) is throttled when its clock-event
    reasons carry a power-cap / thermal / HW-slowdown bit (or, without reasons, its SM clock
    is below ``th.clock_drop_frac`` of the max seen). It runs at ``clock / max_clock`` speed, so
    ``dt x (1 - clock/max)`` of its time is lost. Data-parallel ranks wait for the slowest GPU:
    per step the wall time lost is the worst GPU's, and every GPU of the run pays it.
    """
    m = _throttle_samples(ctx, th)
    if m is None or not m["hot"].any():
        return None
    m["lost_s"] = m["dt_s"] * m["lost_frac"]
    m["step_k"] = m["step"].fillna(-1.0)
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
    evidence = {
        "intervals": _intervals(runs, "w"),
        "gpus": _sorted_gpus(hot_gpus),
        "phases": sorted(
            set(
                ctx.samples.merge(hot[["host", "gpu", "t_ns"]], on=["host", "gpu", "t_ns"])["phase"]
            )
        ),
        "clock_event_reasons": reasons,
        "clock_event_reasons_mask": bits,
        "sm_clock_mhz_throttled": round(clock_hot, 1),
        "sm_clock_mhz_max": round(max_clock, 1),
        "throttled_share_of_busy": round(hot_share, 4),
        "temp_c_throttled": None if temp is None else round(temp, 1),
        "power_w_throttled": None if power is None else round(power, 1),
    }
    return _finding("throttling", ctx, th, gpu_s, confidence, summary, evidence)


# --------------------------------------------------------------------------------------------
# imbalance


def _throttled_gpus(ctx: AnalysisContext, th: Thresholds) -> set[tuple[str, int]]:
    m = _throttle_samples(ctx, th)
    if m is None or not m["hot"].any():
        return set()
    busy = m[m["util_gpu_pct"] >= th.busy_util_pct]
    share = busy.groupby(["host", "gpu"])["hot"].mean()
    return {(str(h), int(g)) for (h, g), v in share.items() if v >= 0.2}


def detect_imbalance(ctx: AnalysisContext, th: Thresholds) -> Finding | None:
    """A straggler rank whose phases run longer while the other ranks wait.

    Per (phase, step), each rank's (process's) summed span time is compared with the median
    rank's; when the slowest exceeds it by ``th.imbalance_spread_frac``, every other GPU of
    the phase waits for it (data-parallel steps synchronise): lost = ``(slowest - median) x
    (GPUs of the phase - GPUs of the straggler)``, i.e. (n−1) × delay. Ranks on throttled GPUs
    are compared only with each other (their shared slowdown is ``throttling``'s).
    """
    spans = _spans(ctx)
    s = ctx.samples
    if spans.empty or s.empty:
        return None
    work = spans[
        ~spans["phase"].isin(NOT_WORK_PHASES).to_numpy()
        & ~_collective_mask(spans)
        & ~spans["wait"].to_numpy()
        & np.isfinite(spans["step"].to_numpy(np.float64))
    ]
    if work.empty:
        return None
    # GPUs per owner process (a controller may drive several)
    owners = s.dropna(subset=["pid"]).drop_duplicates(["host", "gpu"])
    n_gpu = owners.groupby(["owner_host", "pid"]).size()
    gpu_of = owners.groupby(["owner_host", "pid"])[["host", "gpu"]].first()
    d = work.assign(dur=(work["end_ns"] - work["start_ns"]) / 1e9)
    per = (
        d.groupby(["phase", "step", "host", "pid"], sort=False)
        .agg(dur=("dur", "sum"), start_ns=("start_ns", "min"), end_ns=("end_ns", "max"))
        .reset_index()
    )
    idx = pd.MultiIndex.from_arrays([per["host"], per["pid"]])
    per["n_gpu"] = n_gpu.reindex(idx).to_numpy()
    per = per[np.isfinite(per["n_gpu"].to_numpy(np.float64))]
    if per.empty:
        return None
    # ranks on throttled GPUs are compared with each other only: their common slowdown is
    # ``throttling``'s, a straggler among them is still imbalance
    throttled = _throttled_gpus(ctx, th)
    where = gpu_of.reindex(pd.MultiIndex.from_arrays([per["host"], per["pid"]]))
    per["hot"] = [
        isinstance(h, str) and g == g and (h, int(g)) in throttled
        for h, g in zip(where["host"], where["gpu"])
    ]
    grp = per.groupby(["phase", "step", "hot"], sort=False)
    per["ranks"] = grp["dur"].transform("size")
    per["mx"] = grp["dur"].transform("max")
    # the pace the others kept: the median of every rank but the slowest (with two ranks the
    # median of both would hide half the delay)
    others = per["dur"].where(per["dur"] < per["mx"])
    per["med"] = others.groupby([per["phase"], per["step"], per["hot"]], sort=False).transform(
        "median"
    )
    per["med"] = per["med"].fillna(per["mx"])
    per["all_gpus"] = per.groupby(["phase", "step"], sort=False)["n_gpu"].transform("sum")
    per = per[per["ranks"] >= 2]
    if per.empty:
        return None
    slow = (per["mx"] > per["med"] * (1 + th.imbalance_spread_frac)) & (per["mx"] > 0)
    stragglers = per[slow & (per["dur"] >= per["mx"])]
    # the slowest subgroup's straggler sets the pace of the phase-step
    stragglers = stragglers.sort_values("dur", ascending=False).drop_duplicates(["phase", "step"])
    if stragglers.empty:
        return None
    stragglers = stragglers.assign(
        delay_s=stragglers["mx"] - stragglers["med"],
    )
    stragglers["w"] = stragglers["delay_s"] * (stragglers["all_gpus"] - stragglers["n_gpu"])
    flagged = stragglers.assign(lost=stragglers["w"])
    gpu_s = float(flagged["lost"].sum())
    who = stragglers.groupby(["host", "pid"])["w"].sum().sort_values(ascending=False)
    top_host, top_pid = who.index[0]
    top = gpu_of.loc[(top_host, top_pid)] if (top_host, top_pid) in gpu_of.index else None
    rank_vals = spans.loc[(spans["host"] == top_host) & (spans["pid"] == top_pid), "rank"].dropna()
    rank = int(rank_vals.iloc[0]) if len(rank_vals) else None
    spread = float((stragglers["mx"] / stragglers["med"].where(stragglers["med"] > 0)).median())
    # per-GPU utilisation / memory spread as supporting figures
    per_gpu = s.groupby(["host", "gpu"]).agg(
        util=("util_gpu_pct", "mean"), mem=("mem_used_bytes", "max")
    )
    barrier = spans[spans["wait"].to_numpy()]
    confidence = 0.5 + 0.2 * min(1.0, (spread - 1.0) / 0.5 if np.isfinite(spread) else 0.0)
    confidence += 0.15 * min(1.0, who.iloc[0] / max(gpu_s, 1e-12))
    confidence += 0.15 if not barrier.empty else 0.0
    straggler_label = f"rank {rank}" if rank is not None else f"pid {int(top_pid)} on {top_host}"
    summary = (
        f"{straggler_label} straggles: its phases run {spread - 1:.0%} longer than the median "
        f"rank in {len(stragglers)} phase-steps; others wait ~{_fmt_gpu_s(gpu_s)} ({{share}})"
    )
    evidence = {
        "intervals": _intervals(stragglers, "w"),
        "gpus": [_gpu_label(top["host"], top["gpu"])] if top is not None else [],
        "phases": sorted(set(stragglers["phase"])),
        "straggler_rank": rank,
        "straggler_pid": int(top_pid),
        "straggler_host": str(top_host),
        "slowdown_frac_median": round(spread - 1.0, 4) if np.isfinite(spread) else None,
        "delay_s_total": round(float(stragglers["delay_s"].sum()), 3),
        "phase_steps_flagged": len(stragglers),
        "barrier_spans": len(barrier),
        "util_gpu_pct_spread": round(float(per_gpu["util"].max() - per_gpu["util"].min()), 2)
        if per_gpu["util"].notna().any()
        else None,
        "mem_peak_bytes_spread": float(per_gpu["mem"].max() - per_gpu["mem"].min())
        if per_gpu["mem"].notna().any()
        else None,
    }
    return _finding("imbalance", ctx, th, gpu_s, confidence, summary, evidence)


DETECTORS: dict[str, Callable[[AnalysisContext, Thresholds], Finding | None]] = {
    "memory_headroom": detect_memory_headroom,
    "offload_thrash": detect_offload_thrash,
    "comm_bound": detect_comm_bound,
    "host_bound": detect_host_bound,
    "imbalance": detect_imbalance,
    "throttling": detect_throttling,
}
