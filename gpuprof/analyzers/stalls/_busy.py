"""What the busy-time stalls (``rollout_bound``, ``update_bound``) share: a phase's GPU-seconds
on either basis and what earlier findings already explain in it."""

from __future__ import annotations

from gpuprof.analyzers.findings import AnalysisContext
from gpuprof.analyzers.parts import facts, sampled
from gpuprof.analyzers.stalls._timing import phase_seconds, timing


def phase_gpu_s(ctx: AnalysisContext, phase: str) -> tuple[float, float, str]:
    """``(GPU-seconds in phase, the run's GPU-seconds, basis)``: from the framework's phase
    times × the job's GPUs without GPU samples, else from the samples labelled with it."""
    t = timing(ctx)
    if t is not None:
        return float(phase_seconds(t, [phase]).sum()) * t.gpus, t.total_gpu_s, "phase_timing"
    table = ctx.by_phase if sampled(ctx).samples and facts(ctx).valid_spans else None
    if table is None or table.empty:
        return 0.0, 0.0, "gpu_samples"
    rows = table[table["phase"] == phase]
    return float(rows["gpu_s"].sum()), ctx.total_gpu_s, "gpu_samples"


def explained_in(ctx: AnalysisContext, phase: str) -> float:
    """GPU-seconds the findings applied so far lost inside ``phase`` (a long tail, memory
    headroom, offload copies, exposed collectives…), not to be counted again."""
    return sum(f.gpu_seconds_lost for f in ctx.found if phase in f.evidence.phases)
