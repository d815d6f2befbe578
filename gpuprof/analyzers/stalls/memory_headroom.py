"""``memory_headroom``: Device memory left unused that a larger KV cache or batch could use."""

from __future__ import annotations

import numpy as np
import pandas as pd

from gpuprof.analyzers.evidence import MemoryHeadroomEvidence
from gpuprof.analyzers.findings import AnalysisContext, Finding, Thresholds
from gpuprof.analyzers.grouping import label_codes
from gpuprof.analyzers.parts import Parts
from gpuprof.analyzers.stalls._phase import _parts
from gpuprof.analyzers.stalls._resource import (
    UPDATE_PHASES,
    _finding,
    _fmt_gpu_s,
    _gpu_codes,
    _intervals,
    _num,
    _offload_mask,
    _on_gpus,
    _per_gpu,
    _runs,
    _sorted_gpus,
)
from gpuprof.analyzers.texts import as_texts


def detect(ctx: AnalysisContext | Parts, th: Thresholds) -> Finding | None:
    """Peak device memory far below total during rollout (or, without rollout, update).

    Gain model: generation throughput grows with the KV cache (sequences in flight), so a
    rollout whose peak memory ``p`` (share of total) sits below the ``th.mem_target_frac`` a tuned
    job reaches runs ``1 + d`` times longer than it would, ``d = th.mem_target_frac - p``; the
    recoverable share of its GPU-time is ``d / (1 + d)``. Update phases gain less from larger
    micro-batches (they are compute-bound): a quarter of that (``th.mem_update_factor``). Only GPUs
    whose peak is below ``1 - th.memory_headroom_frac`` count; update samples with heavy PCIe
    (offload frees memory on purpose) are left to ``offload_thrash``.
    """
    parts = _parts(ctx)
    state = [g for g in parts.map(_memory_state) if g is not None]
    if not any(used for used, _ in state):
        return None
    rollout = any(roll for _, roll in state)
    factor = 1.0 if rollout else th.mem_update_factor
    got = [g for g in parts.map(_headroom, th, rollout) if g is not None]
    if not got:
        return None
    phases = ["rollout"] if rollout else sorted(set().union(*(g["phases"] for g in got)))
    per_gpu = pd.concat([g["per_gpu"] for g in got], ignore_index=True)
    limit = 1.0 - th.memory_headroom_frac
    low = per_gpu[per_gpu["peak"] < limit].copy()
    if low.empty:
        return None
    d = np.clip(th.mem_target_frac - low["peak"].to_numpy(), 0.0, None)
    low["lost"] = low["gpu_s"].to_numpy() * factor * d / (1.0 + d)
    gpu_s = float(low["lost"].sum())
    peak = float(low["peak"].median())
    knobs = parts.meta.knobs or {}
    gmu = {k: v for k, v in knobs.items() if "gpu_memory_utilization" in str(k)}
    # intervals: the phase's contiguous runs on the low-memory GPUs
    runs = pd.concat([g["runs"] for g in got], ignore_index=True)
    confidence = 0.5 + 0.4 * min(1.0, (limit - peak) / 0.3) + (0.1 if gmu else 0.0)
    summary = (
        f"peak memory {peak:.0%} of total during {'/'.join(phases)} on {len(low)} GPU(s): "
        f"a larger KV cache/batch could recover ~{_fmt_gpu_s(gpu_s)} ({{share}})"
    )
    evidence = MemoryHeadroomEvidence(
        intervals=_intervals(runs, "w"),
        gpus=_sorted_gpus(low),
        phases=phases,
        mem_peak_frac=round(peak, 4),
        mem_peak_bytes=int(low["peak_b"].max()),
        mem_total_bytes=int(low["total_b"].max()),
        mem_target_frac=th.mem_target_frac,
        phase_gpu_s=round(float(low["gpu_s"].sum()), 3),
        model="lost = phase GPU-s x d/(1+d), d = target - peak"
        + (f" x {th.mem_update_factor}" if factor != 1.0 else ""),
    )
    if gmu:
        evidence.knobs = {str(k): v for k, v in gmu.items()}
    return _finding("memory_headroom", parts, th, gpu_s, confidence, summary, evidence)


def _memory_state(ctx: AnalysisContext) -> tuple[bool, bool] | None:
    """Whether one part's unclaimed samples read memory used, and whether any is in a
    rollout; None without samples."""
    s = ctx.unclaimed_samples
    if s.empty:
        return None
    phase, names = label_codes(s["phase"])
    rollout = "rollout" in names and bool((phase == names.index("rollout")).any())
    return bool(np.isfinite(_num(s, "mem_used_bytes")).any()), rollout


def _listed_totals(ctx: AnalysisContext, s: pd.DataFrame) -> np.ndarray:
    """Per sample of ``s``: its GPU's memory in the run's inventory (``meta.gpus``; the first
    listing of a GPU; NaN when unlisted), looked up once per GPU (a join of the samples on
    host and GPU number would look it up once per sample)."""
    listed = [g for g in ctx.run.meta.gpus or [] if isinstance(g, dict)]
    gpu = pd.to_numeric(pd.Series([g.get("index") for g in listed], dtype=object),
                        errors="coerce").to_numpy(np.float64)  # fmt: skip
    total = pd.to_numeric(pd.Series([g.get("mem_total_bytes") for g in listed], dtype=object),
                          errors="coerce").to_numpy(np.float64)  # fmt: skip
    of_gpu: dict[tuple[str, float], float] = {}
    for g, number, value in zip(listed, gpu.tolist(), total.tolist()):
        if number == number:  # a GPU number (not NaN): its first listing counts
            of_gpu.setdefault((str(g.get("host")), number), value)
    code, gpus = _gpu_codes(ctx, s)
    hosts = as_texts(gpus["host"])
    per_gpu = [of_gpu.get((h, float(n)), np.nan) for h, n in zip(hosts, gpus["gpu"].tolist())]
    return np.array([*per_gpu, np.nan], dtype=np.float64)[code]  # code -1 takes the NaN


def _headroom(ctx: AnalysisContext, th: Thresholds, rollout: bool) -> dict | None:
    """One part's GPUs in rollout (``rollout``) or else update samples: per GPU the peak
    share of memory used, GPU-seconds, peak and total bytes; the update phases seen; the runs
    of those samples on GPUs below the headroom limit. None without such samples."""
    s = ctx.unclaimed_samples
    if s.empty:
        return None
    used, total = _num(s, "mem_used_bytes"), _num(s, "mem_total_bytes")
    # total from the inventory when samples lack it
    if not np.isfinite(total).all():
        total = np.where(np.isfinite(total), total, _listed_totals(ctx, s))
    phase, names = label_codes(s["phase"])  # compared as codes, not strings
    code_of = {name: i for i, name in enumerate(names)}
    if rollout:
        use = phase == code_of.get("rollout", -2)
        phases: set = set()
    else:
        update = [code_of[p] for p in UPDATE_PHASES if p in code_of]
        use = np.isin(phase, update) & ~_offload_mask(s, th)
        phases = {names[c] for c in np.unique(phase[use])}
    use &= np.isfinite(used) & np.isfinite(total) & (total > 0)
    if not use.any():
        return None
    with np.errstate(invalid="ignore", divide="ignore"):
        frac = used / total
    per_gpu = _per_gpu(
        ctx, s, use,
        {"peak": (frac, "max"), "gpu_s": (s["dt_s"].to_numpy(np.float64), "sum"),
         "peak_b": (used, "max"), "total_b": (total, "max")},
    )  # fmt: skip
    low = per_gpu[per_gpu["peak"] < 1.0 - th.memory_headroom_frac]
    on_low = _on_gpus(ctx, s, low["host"].astype(str), low["gpu"])
    runs = _runs(s, use & on_low, s["dt_s"].to_numpy(np.float64))
    return {"per_gpu": per_gpu, "phases": phases, "runs": runs}
