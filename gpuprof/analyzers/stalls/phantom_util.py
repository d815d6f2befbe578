"""``phantom_util``: a GPU that reads busy but does no work — a stuck GPU to reset.

After a training process is killed mid-collective (SIGKILL after a grace period, an Xid 43
channel reset), a GPU can stay at 100 % utilization, P0 and maximum clocks with 0 MiB used
and no process on it, for hours: NVML's utilization is "a kernel was running", and whatever
the driver holds keeps it there. Nothing runs; the next job scheduled there shares a GPU that
may not recover until it is reset (``nvidia-smi -r``, which fails while
``nvidia-persistenced`` holds it) or the node rebooted.

A sample is phantom when its utilization is at least ``th.phantom_util_pct`` while its memory
used is at most ``th.phantom_mem_bytes`` — less than any CUDA context, so no process can be
running a kernel there — (or, without a memory-used reading, its memory activity is at most
``th.phantom_mem_util_pct``), its power draw is below ``th.phantom_power_frac`` of the limit
where the limit is known, and no process holds memory on the GPU where per-process data
exists. Its time is lost, and claimed (``ctx.claim``): no later stall counts it as busy work
(imbalance against idle peers, throttling, headroom), and idle-time stalls see the GPUs
without it.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from gpuprof.analyzers.evidence import PhantomUtilEvidence
from gpuprof.analyzers.findings import AnalysisContext, Finding, Thresholds
from gpuprof.analyzers.parts import (
    Parts,
    median_of_counts,
    stretches,
    top_stretches,
    value_counts,
)
from gpuprof.analyzers.stalls._phase import _conf, _minutes, _num
from gpuprof.analyzers.stalls._resource import _gpu_codes, _gpu_columns_of
from gpuprof.analyzers.stalls._resource import _num as _column


def detect(ctx: AnalysisContext | Parts, th: Thresholds) -> Finding | None:
    """GPUs reading busy with no memory, no process and little power (see the module doc)."""
    parts = ctx if isinstance(ctx, Parts) else Parts.of(ctx)
    if parts.total_gpu_s <= 0:
        return None
    held = any(parts.map(_holds_memory))
    tolerance = _tolerance_ns(parts.map(_dt_counts)) if held else 0
    got = [g for g in parts.map(_measure, th, tolerance) if g is not None]
    if not any(g["phantom"].any() for g in got):
        return None
    found = [g for g in got if g["phantom"].any()]
    # the phantom samples of every part, in the whole run's sample order
    hit = {k: np.concatenate([g["hit"][k] for g in found]) for k in found[0]["hit"]}
    util, mem, dt, measured = hit["util"], hit["mem"], hit["dt"], hit["measured"]
    lost = float(np.nansum(dt))
    share = parts.share(lost)
    if share < th.min_share:
        return None
    n_all = sum(parts.map(_gpu_count))  # before the claim: the GPUs these samples cover
    parts.each(_claim, th, tolerance)
    labels = [f"{h}:{int(gg)}" for h, gg in sorted(p for g in found for p in g["gpus"])]
    longest = max(g["longest"] for g in found)
    mem_max = float(np.nanmax(mem)) if measured.any() else np.nan
    power, limit, clock, mem_util = hit["power"], hit["limit"], hit["clock"], hit["mem_util"]
    power_mean = float(np.nanmean(power)) if np.isfinite(power).any() else np.nan
    limit_mean = float(np.nanmean(limit)) if np.isfinite(limit).any() else np.nan
    has_procs = any(g["has_procs"] for g in got)
    all_measured = bool(measured.all())
    # memory below a CUDA context is decisive; memory activity alone is a weaker sign, and a
    # snapshot can't show the state persists (stuck GPUs stay so for hours)
    confidence = (0.7 if all_measured else 0.45) + 0.15 * min(1.0, longest / 900.0)
    confidence += 0.1 if has_procs else 0.0
    mem_txt = f"{mem_max / 2**20:.0f} MiB used" if np.isfinite(mem_max) else "no memory activity"
    power_txt = f" at {power_mean:.0f} W" if np.isfinite(power_mean) else ""
    proc_txt = ", no process on them" if has_procs else ""
    summary = (
        f"{len(labels)} of {n_all} GPU(s) read {np.nanmean(util):.0f}% utilization "
        f"with {mem_txt}{proc_txt}{power_txt}: stuck GPUs to reset (nvidia-smi -r, or reboot "
        f"the node), not work — {_minutes(lost)} ({share:.0%}) of GPU-time"
    )
    return Finding(
        kind="phantom_util",
        gpu_seconds_lost=lost,
        share=share,
        confidence=_conf(confidence),
        summary=summary,
        evidence=PhantomUtilEvidence(
            intervals=top_stretches([g["stretches"] for g in found]),
            gpus=labels,
            phases=[],
            phantom_gpu_s=_num(lost),
            longest_stretch_s=_num(longest),
            util_gpu_pct_mean=_num(float(np.nanmean(util))),
            util_mem_pct_mean=_num(float(np.nanmean(mem_util)))
            if np.isfinite(mem_util).any()
            else None,
            mem_used_bytes_max=_num(mem_max, ".0f"),
            memory_measured=all_measured,
            power_w_mean=_num(power_mean),
            power_limit_w=_num(limit_mean),
            sm_clock_mhz_mean=_num(float(np.nanmean(clock))) if np.isfinite(clock).any() else None,
            processes_seen=False if has_procs else None,
            working_gpus=n_all - len(labels),
        ),
    )


def _holds_memory(ctx: AnalysisContext) -> bool:
    """Whether one part has a per-process reading with memory held (what `_with_process`
    looks samples up in)."""
    procs = ctx.run.gpu_procs
    if procs is None or procs.empty:
        return False
    mem = pd.to_numeric(procs["gpu_mem_bytes"], errors="coerce").fillna(1.0)
    return bool((mem.to_numpy() > 0).any())


def _dt_counts(ctx: AnalysisContext) -> tuple[np.ndarray, np.ndarray]:
    """One part's sampling intervals (s) of the samples left unclaimed, as distinct values
    and their counts (what an exact median over every part needs)."""
    s = ctx.unclaimed_samples
    dt = s["dt_s"].to_numpy(np.float64) if s is not None else np.zeros(0)
    return value_counts(dt)


def _tolerance_ns(counts: list[tuple[np.ndarray, np.ndarray]]) -> int:
    """Two sampling periods (the median interval of every unclaimed sample, at least 1 s) in
    ns: how near a per-process reading must be to vouch for a sample."""
    median = median_of_counts(counts)
    return int(max(1.0, median if np.isfinite(median) else 1.0) * 2e9)


def _phantom(ctx: AnalysisContext, s: pd.DataFrame, th: Thresholds, tolerance: int) -> dict:
    """Per sample of ``s``: phantom or not, and the columns the finding reads."""
    util = s["util_gpu_pct"].to_numpy(np.float64)
    busy = np.nan_to_num(util, nan=-1.0) >= th.phantom_util_pct
    if not busy.any():
        return {"phantom": busy}
    g = _gpu_columns_of(ctx, s)
    rows = s["row"].to_numpy(np.int64)
    mem = s["mem_used_bytes"].to_numpy(np.float64)
    mem_util = _column(ctx.run.gpu, "util_mem_pct")[rows]
    measured = np.isfinite(mem)
    quiet = np.nan_to_num(mem_util, nan=np.inf) <= th.phantom_mem_util_pct
    empty = np.where(measured, mem <= th.phantom_mem_bytes, quiet)
    power = g["power_w"].to_numpy(np.float64)
    limit = _limits(ctx, s)
    over = np.isfinite(power) & np.isfinite(limit) & (power > th.phantom_power_frac * limit)
    procs = _with_process(ctx, s, tolerance)
    phantom = busy & empty & ~over & ~procs
    return {"phantom": phantom, "util": util, "mem": mem, "mem_util": mem_util,
            "measured": measured, "power": power, "limit": limit,
            "clock": g["sm_clock_mhz"].to_numpy(np.float64)}  # fmt: skip


def _measure(ctx: AnalysisContext, th: Thresholds, tolerance: int) -> dict | None:
    """One part's phantom samples: their columns (in sample order), GPUs, the part's GPU
    count, longest phantom stretch and stretches; None without samples."""
    s = ctx.unclaimed_samples
    if s is None or s.empty:
        return None
    got = _phantom(ctx, s, th, tolerance)
    phantom = got["phantom"]
    has_procs = len(ctx.run.gpu_procs) > 0
    if not phantom.any():
        return {"phantom": phantom, "has_procs": has_procs}
    dt = s["dt_s"].to_numpy(np.float64)
    hit = {k: got[k][phantom] for k in ("util", "mem", "mem_util", "measured", "power",
                                        "limit", "clock")}  # fmt: skip
    hit["dt"] = dt[phantom]
    keys = s.loc[phantom, ["host", "gpu"]].drop_duplicates()
    return {
        "phantom": phantom,
        "hit": hit,
        "gpus": [(str(h), int(n)) for h, n in zip(keys["host"], keys["gpu"])],
        "longest": _longest_stretch(s, phantom),
        "stretches": stretches(s["t_ns"].to_numpy(np.int64), dt, phantom, dt),
        "has_procs": has_procs,
    }


def _gpu_count(ctx: AnalysisContext) -> int:
    """How many GPUs one part's unclaimed samples cover."""
    s = ctx.unclaimed_samples
    return 0 if s is None or s.empty else int(s[["host", "gpu"]].drop_duplicates().shape[0])


def _claim(ctx: AnalysisContext, th: Thresholds, tolerance: int) -> None:
    s = ctx.unclaimed_samples
    if s is None or s.empty:
        return
    phantom = _phantom(ctx, s, th, tolerance)["phantom"]
    claim = np.zeros(len(ctx.samples), dtype=bool)
    claim[ctx.samples.index.get_indexer(s.index[phantom])] = True
    ctx.claim(claim)


def _limits(ctx: AnalysisContext, s: pd.DataFrame) -> np.ndarray:
    """The power limit (W) of each sample's GPU from the run's inventory; NaN when unknown."""
    limits = {
        (str(g.get("host")), int(g["index"])): float(g["power_limit_w"])
        for g in ctx.run.meta.gpus or []
        if isinstance(g, dict) and g.get("index") is not None
        and isinstance(g.get("power_limit_w"), int | float)
    }  # fmt: skip
    if not limits:
        return np.full(len(s), np.nan)
    code, gpus = _gpu_codes(ctx, s)  # looked up once per GPU
    per_gpu = [limits.get((str(h), int(g)), np.nan) for h, g in zip(gpus["host"], gpus["gpu"])]
    return np.array([*per_gpu, np.nan], dtype=np.float64)[code]


def _with_process(
    ctx: AnalysisContext, s: pd.DataFrame, tolerance: int | None = None
) -> np.ndarray:
    """Per sample: a process held memory on its GPU at about that time (per-process data):
    a reading of the same GPU within ``tolerance`` ns (`_tolerance_ns`; by default of the
    samples ``s``), looked up one GPU at a time (a ``merge_asof`` to the nearest reading,
    with that tolerance)."""
    procs = ctx.run.gpu_procs
    out = np.zeros(len(s), dtype=bool)
    if procs is None or procs.empty:
        return out
    mem = pd.to_numeric(procs["gpu_mem_bytes"], errors="coerce").fillna(1.0)
    held = procs[mem.to_numpy() > 0]
    if held.empty:
        return out
    held_t = pd.to_numeric(held["t_ns"]).astype(np.int64).to_numpy()
    keys = pd.DataFrame(
        {"host": held["host"].to_numpy(object),
         "gpu": pd.to_numeric(held["gpu"]).astype(np.int64).to_numpy()}
    )  # fmt: skip
    readings: dict[tuple[str, int], np.ndarray] = {}  # (host as text, gpu) → reading rows
    for (host, gpu), rows in keys.groupby(["host", "gpu"], sort=False).indices.items():
        key = (str(host), int(gpu))
        readings[key] = np.concatenate([readings[key], rows]) if key in readings else rows
    if tolerance is None:
        dt = s["dt_s"].to_numpy(np.float64)
        tolerance = _tolerance_ns([value_counts(dt)])
    t = s["t_ns"].to_numpy(np.int64)
    code, gpus = _gpu_codes(ctx, s)
    order = np.argsort(code, kind="stable")
    bounds = np.searchsorted(code[order], np.arange(len(gpus) + 1))
    for k, (host, gpu) in enumerate(zip(gpus["host"], gpus["gpu"])):
        rows = readings.get((str(host), int(gpu)))
        if rows is None:
            continue
        seen = np.sort(held_t[rows])
        mine = order[bounds[k] : bounds[k + 1]]
        at = np.searchsorted(seen, t[mine])
        before = np.abs(t[mine] - seen[np.maximum(at - 1, 0)])
        after = np.abs(seen[np.minimum(at, len(seen) - 1)] - t[mine])
        out[mine] = np.minimum(before, after) <= tolerance
    return out


def _longest_stretch(s: pd.DataFrame, mask: np.ndarray) -> float:
    """The longest run of consecutive masked samples of one GPU, in seconds."""
    frame = pd.DataFrame(
        {
            "gid": s.groupby(["host", "gpu"], sort=False).ngroup().to_numpy(),
            "m": mask,
            "dt": np.nan_to_num(s["dt_s"].to_numpy(np.float64)),
        }
    )
    brk = (frame["gid"] != frame["gid"].shift()) | (frame["m"] != frame["m"].shift())
    frame["run"] = brk.cumsum()
    runs = frame[frame["m"]].groupby("run")["dt"].sum()
    return float(runs.max()) if len(runs) else 0.0
