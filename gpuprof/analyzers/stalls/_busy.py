"""What the busy-time stalls (``rollout_bound``, ``update_bound``) share: a phase's GPU-seconds
on either basis, what earlier findings already explain in it, and the finding they make."""

from __future__ import annotations

import math

import numpy as np

from gpuprof.analyzers.evidence import Evidence
from gpuprof.analyzers.findings import AnalysisContext, Finding, Thresholds
from gpuprof.analyzers.stalls._timing import phase_seconds, timing


def phase_gpu_s(ctx: AnalysisContext, phase: str) -> tuple[float, float, str]:
    """``(GPU-seconds in phase, the run's GPU-seconds, basis)``: from the framework's phase
    times × the job's GPUs without GPU samples, else from the samples labelled with it."""
    t = timing(ctx)
    if t is not None:
        return float(phase_seconds(t, [phase]).sum()) * t.gpus, t.total_gpu_s, "phase_timing"
    table = ctx.by_phase if len(ctx.run.gpu) and len(ctx.spans) else None
    if table is None or table.empty:
        return 0.0, 0.0, "gpu_samples"
    rows = table[table["phase"] == phase]
    return float(rows["gpu_s"].sum()), ctx.total_gpu_s, "gpu_samples"


def explained_in(ctx: AnalysisContext, phase: str) -> float:
    """GPU-seconds the findings applied so far lost inside ``phase`` (a long tail, memory
    headroom, offload copies, exposed collectives…), not to be counted again."""
    return sum(f.gpu_seconds_lost for f in ctx.found if phase in f.evidence.phases)


def busy_finding(
    kind: str,
    lost: float,
    total: float,
    th: Thresholds,
    confidence: float,
    summary: str,
    evidence: Evidence,
) -> Finding | None:
    """The finding, or None when ``lost`` is not above the noise threshold; ``{share}`` and
    ``{lost}`` in ``summary`` are filled in."""
    if not math.isfinite(lost) or lost <= 0 or total <= 0:
        return None
    share = float(min(1.0, lost / total))
    if share < th.min_share:
        return None
    return Finding(
        kind=kind,
        gpu_seconds_lost=float(lost),
        share=share,
        confidence=float(np.clip(confidence, 0.0, 1.0)),
        summary=summary.replace("{share}", f"{share:.0%}"),
        evidence=evidence,
    )
