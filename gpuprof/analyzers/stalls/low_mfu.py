"""``low_mfu``: the actor update turns a small share of the GPUs' peak FLOPs into model FLOPs.

Busy-but-slow time: the GPUs run kernels, but offloaded parameters, recomputation, padding or
thin micro-batches keep the model FLOPs per second low. The figures (tokens, FLOPs per token,
the GPU's peak) come from `gpuprof.analyzers.efficiency`.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import numpy as np

from gpuprof.analyzers.efficiency import figures
from gpuprof.analyzers.evidence import LowMfuEvidence
from gpuprof.analyzers.findings import AnalysisContext, Finding, Thresholds
from gpuprof.analyzers.settings import num as _num
from gpuprof.analyzers.settings import run_settings
from gpuprof.analyzers.stalls._phase import _phase_intervals
from gpuprof.analyzers.stalls._resource import _fmt_gpu_s

_CAUSES: tuple[tuple[str, Any, str], ...] = (
    ("actor_rollout_ref.actor.fsdp_config.param_offload", True,
     "parameters offloaded to CPU: every forward and backward waits for them over PCIe"),
    ("actor_rollout_ref.actor.fsdp_config.optimizer_offload", True,
     "optimizer state offloaded to CPU: the optimizer step runs over PCIe"),
    ("actor_rollout_ref.model.enable_gradient_checkpointing", True,
     "gradient checkpointing recomputes the forward (~1/3 more FLOPs that are not model FLOPs)"),
    ("actor_rollout_ref.actor.use_dynamic_bsz", False,
     "no dynamic batch: micro-batches are padded to a fixed count, not packed to a token budget"),
    ("actor_rollout_ref.model.use_remove_padding", False,
     "padding kept: pad tokens are computed and count for nothing"),
    ("offload_param_device", "cpu", "DeepSpeed parameter offload to CPU"),
    ("offload_optimizer_device", "cpu", "DeepSpeed optimizer offload to CPU"),
    ("offload_model", True, "model offloaded between phases (ms-swift)"),
    ("offload_optimizer", True, "optimizer offloaded between phases (ms-swift)"),
    ("adam_offload", True, "Adam state offloaded to CPU (OpenRLHF)"),
    ("ds.adam_offload", True, "Adam state offloaded to CPU (OpenRLHF)"),
    ("gradient_checkpointing", True,
     "gradient checkpointing recomputes the forward (~1/3 more FLOPs that are not model FLOPs)"),
)  # fmt: skip
"""(knob, value that costs MFU, why) — the settings that lower update MFU."""

_MICRO_BATCH_KNOBS = (
    "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu",
    "per_device_train_batch_size",
    "micro_train_batch_size",
    "train.micro_batch_size",
)
SMALL_MICRO_BATCH = 2
"""A micro-batch of at most this many sequences per GPU (without dynamic batching) leaves the
matrix multiplies too thin to fill the tensor cores on short sequences."""


def _causes(settings: Mapping[str, Any]) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    causes, knobs = [], {}
    for knob, bad, why in _CAUSES:
        value = settings.get(knob)
        if value is not None and value == bad and type(value) is type(bad):
            causes.append({"knob": knob, "value": value, "why": why})
            knobs[knob] = value
    dynamic = settings.get("actor_rollout_ref.actor.use_dynamic_bsz") is True
    for knob in _MICRO_BATCH_KNOBS:
        value = _num(settings.get(knob))
        if value is not None and value <= SMALL_MICRO_BATCH and not dynamic:
            causes.append(
                {"knob": knob, "value": settings.get(knob),
                 "why": f"micro-batch of {value:g} sequence(s) per GPU: thin matrix multiplies"}
            )  # fmt: skip
            knobs[knob] = settings.get(knob)
    return causes, knobs


def detect(ctx: AnalysisContext, th: Thresholds) -> Finding | None:
    """The actor update's MFU below ``th.low_mfu``.

    Lost GPU-seconds: the update's GPU-seconds × (1 − MFU / ``th.reachable_mfu``), the time a
    reachable MFU would save. Needs the GPU's peak, the model's size and the update's trained
    tokens; silent when any is missing, when the framework's own logged MFU for the update is
    at or above ``th.reachable_mfu`` (it times the compute alone and disagrees), or when
    attention FLOPs were not counted on long sequences (``th.mfu_long_sequence_tokens``). The
    settings known to cost MFU (offload, gradient checkpointing, no dynamic batch, small
    micro-batches) are the evidence's ``causes``.
    """
    fig = figures(ctx)
    update = next((p for p in fig.phases if p["phase"] == "update_actor"), None)
    if update is None or update.get("mfu") is None or not update.get("gpus"):
        return None
    mfu = float(update["mfu"])
    if mfu >= th.low_mfu:
        return None
    long_seq = fig.seq_mean is None or fig.seq_mean > th.mfu_long_sequence_tokens
    if not fig.attention_counted and long_seq:
        return None
    logged = fig.framework["metrics"].get("perf/mfu/actor")
    logged_mfu = logged["mean"] if logged else None
    if logged_mfu is not None and th.reachable_mfu <= logged_mfu <= 1.0:
        return None
    update_gpu_s = float(update["wall_s"]) * int(update["gpus"])
    lost = update_gpu_s * max(0.0, 1.0 - mfu / th.reachable_mfu)
    # what earlier stalls already explain in the update (exposed collectives, offload copies,
    # throttled clocks, launch overhead, a straggler) is not counted again
    explained = sum(f.gpu_seconds_lost for f in ctx.found if "update_actor" in f.evidence.phases)
    lost -= explained
    if not math.isfinite(lost) or lost <= 0:
        return None
    total = ctx.total_gpu_s if len(ctx.run.gpu) else (fig.run.get("gpu_s") or 0.0)
    share = float(min(1.0, lost / total)) if total > 0 else 0.0
    if share < th.min_share:
        return None
    settings = run_settings(ctx.run.meta)
    causes, knobs = _causes(settings)
    model = fig.model or {}
    source = str(model.get("source") or "")
    confidence = 0.5
    confidence += 0.15 if source == "--model-params" or source.startswith("config.json") else 0.0
    confidence += 0.1 if causes else 0.0
    confidence += 0.1 if logged_mfu is not None and logged_mfu < th.low_mfu else 0.0
    confidence -= 0.1 if not fig.attention_counted else 0.0
    cause_text = "; ".join(f"{c['knob']}={c['value']}" for c in causes[:3])
    summary = (
        f"update_actor reaches {mfu:.1%} MFU ({update['tokens_per_s']:.0f} trained tokens/s on "
        f"{update['gpus']} × {fig.gpu.get('model')}): at {th.reachable_mfu:.0%} it would save "
        f"~{_fmt_gpu_s(lost)} ({share:.0%})"
        + (f"; settings that cost MFU: {cause_text}" if cause_text else "")
    )
    evidence = LowMfuEvidence(
        intervals=_phase_intervals(ctx, ["update_actor"]),
        gpus=[],
        phases=["update_actor"],
        basis="gpu_samples" if len(ctx.run.gpu) else "phase_timing",
        mfu=round(mfu, 5),
        threshold_mfu=th.low_mfu,
        reachable_mfu=th.reachable_mfu,
        update_gpu_s=round(update_gpu_s, 3),
        tokens_per_s=update["tokens_per_s"],
        flops_per_token=update["flops_per_token"],
        peak_flops_per_gpu=fig.peak,
        gpu_model=fig.gpu.get("model"),
        model_params=model.get("flops_params"),
        model_params_source=model.get("source"),
        framework_mfu=logged_mfu,
        causes=causes,
        knobs=knobs or None,
    )
    return Finding(
        kind="low_mfu",
        gpu_seconds_lost=float(lost),
        share=share,
        confidence=float(np.clip(confidence, 0.0, 1.0)),
        summary=summary,
        evidence=evidence,
    )
