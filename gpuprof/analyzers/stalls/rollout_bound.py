"""``rollout_bound``: generation is slow for the tokens it makes.

Busy-but-slow time in the rollout: the inference engine runs, but a KV cache too small for a
full batch, a tensor-parallel split a small model does not need, eager mode (no CUDA graphs)
or too few sequences per engine keep each decode iteration from sharing its weight reads over
a large batch. Two measures (`stalls._bound`): the decode roofline (the GPUs' memory
bandwidth at the engine's concurrency) when the GPU model and the model's size are known, else
the seconds per generated token over a forward pass's seconds per token of the same steps — a
ratio, so the finding is hedged. A long tail of responses is ``generation_tail``'s; what it
explains is not counted again.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from gpuprof.analyzers.efficiency import figures
from gpuprof.analyzers.evidence import RolloutBoundEvidence
from gpuprof.analyzers.findings import AnalysisContext, Finding, Thresholds
from gpuprof.analyzers.model_size import model_size
from gpuprof.analyzers.parts import Parts
from gpuprof.analyzers.roofline import rollout_settings
from gpuprof.analyzers.settings import num, options_of, run_settings
from gpuprof.analyzers.stalls._bound import FORWARD_NAME, _step_attr_means, assess
from gpuprof.analyzers.stalls._busy import explained_in, phase_gpu_s
from gpuprof.analyzers.stalls._phase import _phase_intervals
from gpuprof.analyzers.stalls._resource import _finding, _fmt_gpu_s

LOW_MEMORY_SHARE = 0.5
"""An engine given less than this share of GPU memory holds a small KV cache (vLLM's default
is 0.9; verl's 0.5)."""
SMALL_MODEL_PARAMS = 14e9
"""A model up to this size fits one 80 GB GPU in bf16 with room for KV cache: splitting it
over several GPUs adds all-reduces per layer and shrinks each engine's batch."""
SMALL_CONCURRENCY = 32
"""Fewer running sequences per engine than this leave decode reading the weights for few
tokens (memory-bound far below the bandwidth a large batch amortises)."""


def _causes(
    settings: Mapping[str, Any], concurrency: float | None, params: float | None
) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """The run's generation settings known to slow decoding, and their values."""
    rs = rollout_settings(settings)
    causes: list[dict[str, Any]] = []

    def add(name: str, why: str) -> None:
        knob, value = rs[name]
        if knob is not None:
            causes.append({"knob": knob, "value": value, "why": why})

    gmu = num(rs["gpu_memory_utilization"][1])
    if gmu is not None and gmu < LOW_MEMORY_SHARE:
        add(
            "gpu_memory_utilization",
            f"the engine may use {gmu:.0%} of GPU memory: a small KV cache caps the batch",
        )
    eager = rs["enforce_eager"][1]
    if eager is True or str(eager).lower() == "true":
        add("enforce_eager", "eager mode: no CUDA graphs, every decode iteration relaunches "
                             "its kernels from Python")  # fmt: skip
    tp = num(rs["tp"][1])
    if tp is not None and tp > 1 and params is not None and params <= SMALL_MODEL_PARAMS:
        add("tp", f"a {params / 1e9:.3g}B model split over {tp:g} GPUs per engine: all-reduces "
                  "every layer and fewer engines")  # fmt: skip
    if concurrency is not None and concurrency < SMALL_CONCURRENCY:
        causes.append({"knob": None, "value": round(concurrency, 1),
                       "why": f"~{concurrency:.0f} sequences per engine at a time: each decode "
                              "iteration reads all weights for few tokens"})  # fmt: skip
    knobs = {c["knob"]: c["value"] for c in causes if c["knob"]}
    return causes, knobs


def _rollout_mem_peak_frac(ctx: AnalysisContext) -> float | None:
    """The highest share of its memory any GPU used in the rollout, over every part."""
    peaks = [p for p in Parts.of(ctx).map(_mem_peak_part) if p is not None]
    return round(max(peaks), 4) if peaks else None


def _mem_peak_part(ctx: AnalysisContext) -> float | None:
    s = ctx.samples if len(ctx.run.gpu) and len(ctx.spans) else None
    if s is None or s.empty or "mem_used_bytes" not in s:
        return None
    rows = s[s["phase"] == "rollout"]
    if rows.empty:
        return None
    used = rows["mem_used_bytes"].to_numpy(np.float64)
    total = rows["mem_total_bytes"].to_numpy(np.float64)
    ok = np.isfinite(used) & np.isfinite(total) & (total > 0)
    return float(np.max(used[ok] / total[ok])) if ok.any() else None


def detect(ctx: AnalysisContext | Parts, th: Thresholds) -> Finding | None:
    """Generation slow for its tokens (`bound.assess`'s ``rollout`` verdict).

    By the decode roofline (efficiency below ``th.decode_efficiency_low``): lost = the
    rollout's GPU-seconds × (1 − efficiency / ``th.decode_efficiency_reachable``). By the
    forward ratio (at or above ``th.gen_forward_ratio_slow``): lost = the rollout's GPU-seconds
    × (1 − ``th.gen_forward_ratio_healthy`` / ratio). What earlier findings explain inside the
    rollout (a long tail, memory headroom, waiting GPUs) is not counted again.
    """
    ctx = ctx.whole if isinstance(ctx, Parts) else ctx  # figures of the run as a whole
    a = assess(ctx, th)
    verdict = a.verdicts.get("rollout")
    if verdict is None or verdict.verdict != "slow" or verdict.value is None:
        return None
    rollout_gpu_s, total, basis = phase_gpu_s(ctx, "rollout")
    if not total:
        total = float(figures(ctx).run.get("gpu_s") or 0.0)
    value = float(verdict.value)
    decode = a.decode if verdict.measure == "decode_roofline" else None
    if decode is not None:
        lost = rollout_gpu_s * max(0.0, 1.0 - value / th.decode_efficiency_reachable)
        confidence = 0.55 - 0.1 * min(2, len(decode.assumptions))
        head = (
            f"generation takes {1 / max(value, 1e-9):.1f}× the least time the GPUs' memory "
            f"bandwidth allows for its tokens ({decode.bandwidth_util:.0%} of HBM bandwidth at "
            f"~{decode.concurrency:.0f} running sequences per engine): at "
            f"{th.decode_efficiency_reachable:.0%} of that bound it would save"
        )
    else:
        lost = rollout_gpu_s * max(0.0, 1.0 - th.gen_forward_ratio_healthy / value)
        confidence = 0.45  # a ratio of two phases, not a measurement against the hardware
        fwd_phase = str((a.ratios or {}).get("forward_phase"))
        fwd = FORWARD_NAME.get(fwd_phase, fwd_phase)
        head = (
            f"generation is {a.share('rollout'):.0%} of the step and a generated token costs "
            f"{value:.1f}× a token of the {fwd} pass (healthy runs ≤ "
            f"{th.gen_forward_ratio_healthy:g}×): at a healthy ratio it would save"
        )
    lost -= explained_in(ctx, "rollout")
    settings = run_settings(ctx.run.meta)
    size, _ = model_size(options_of(ctx), settings)
    params = size.params or size.flops_params if size is not None else None
    causes, knobs = _causes(settings, decode.concurrency if decode else None, params)
    confidence += 0.1 if causes else 0.0
    cause_text = "; ".join(
        f"{c['knob']}={c['value']}" if c["knob"] else c["why"] for c in causes[:3]
    )
    summary = f"{head} ~{_fmt_gpu_s(max(lost, 0.0))} ({{share}})" + (
        f"; settings that slow it: {cause_text}" if cause_text else ""
    )
    steps = [v for v in [_response_mean(ctx)] if v is not None]
    evidence = RolloutBoundEvidence(
        intervals=_phase_intervals(ctx, ["rollout"]),
        gpus=[],
        phases=["rollout"],
        basis=basis,
        measure=str(verdict.measure),
        rollout_share_of_step=round(a.share("rollout"), 4),
        rollout_gpu_s=round(rollout_gpu_s, 3),
        forward_ratio=(a.ratios or {}).get("generation"),
        forward_phase=(a.ratios or {}).get("forward_phase"),
        healthy_forward_ratio=th.gen_forward_ratio_healthy,
        decode_efficiency=round(decode.efficiency, 4) if decode else None,
        reachable_decode_efficiency=th.decode_efficiency_reachable,
        bandwidth_util=round(decode.bandwidth_util, 4) if decode else None,
        concurrency=round(decode.concurrency, 1) if decode else None,
        concurrency_source=decode.concurrency_source if decode else None,
        tokens_per_s_per_gpu=round(decode.tokens_per_s_per_gpu, 1) if decode else None,
        response_length_mean_tokens=steps[0] if steps else None,
        mem_peak_frac=_rollout_mem_peak_frac(ctx),
        gpu_model=figures(ctx).gpu.get("model"),
        causes=causes,
        knobs=knobs or None,
    )
    return _finding(
        "rollout_bound", ctx, th, lost, confidence, summary, evidence, total_gpu_s=total
    )


def _response_mean(ctx: AnalysisContext) -> float | None:
    """The mean ``response_length/mean`` the step spans of every part report."""
    mean = _step_attr_means(ctx, ("response_length/mean",)).get("response_length/mean")
    return None if mean is None else round(mean, 1)
