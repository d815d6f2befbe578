"""``update_bound``: the actor update is slow for the tokens it trains.

Busy-but-slow time: the GPUs run kernels, but offloaded parameters, recomputation, padding,
thin micro-batches or a parallel layout that does not fit keep the update slow. Two measures
(`stalls._bound`): the update's model FLOPs utilisation against the GPUs' peak when
the GPU model and the model's size are known, else the update's seconds per token per PPO epoch
over a forward pass's of the same steps (~3× is healthy; tens of times is not) — a ratio, so
the finding is hedged.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from gpuprof.analyzers.efficiency import figures
from gpuprof.analyzers.evidence import UpdateBoundEvidence
from gpuprof.analyzers.findings import AnalysisContext, Finding, Thresholds
from gpuprof.analyzers.parts import Parts
from gpuprof.analyzers.settings import num as _num
from gpuprof.analyzers.settings import run_settings
from gpuprof.analyzers.stalls._bound import FORWARD_NAME, assess
from gpuprof.analyzers.stalls._busy import explained_in, phase_gpu_s
from gpuprof.analyzers.stalls._phase import _phase_intervals
from gpuprof.analyzers.stalls._resource import _finding, _fmt_gpu_s

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


def _set_as(
    settings: Mapping[str, Any], table: tuple[tuple[str, Any, str], ...]
) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """The rows of ``table`` (knob, costly value, why) the run's settings match, as causes,
    and those knobs' values."""
    causes, knobs = [], {}
    for knob, bad, why in table:
        value = settings.get(knob)
        if value is not None and value == bad and type(value) is type(bad):
            causes.append({"knob": knob, "value": value, "why": why})
            knobs[knob] = value
    return causes, knobs


def _causes(settings: Mapping[str, Any]) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """The run's settings known to slow an update, and their values."""
    causes, knobs = _set_as(settings, _CAUSES)
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


def detect(ctx: AnalysisContext | Parts, th: Thresholds) -> Finding | None:
    """The actor update slow for its tokens (`bound.assess`'s ``update_actor`` verdict), else
    the critic update slow against the actor's (`_critic`).

    By MFU (below ``th.low_mfu``): lost = the update's GPU-seconds × (1 − MFU /
    ``th.reachable_mfu``); silent when the framework's own logged MFU for the update is at or
    above ``th.reachable_mfu`` (it times the compute alone and disagrees), or when attention
    FLOPs were not counted on long sequences (``th.mfu_long_sequence_tokens``). By the forward
    ratio (at or above ``th.update_forward_ratio_slow``): lost = the update's GPU-seconds × (1 −
    ``th.update_forward_ratio_healthy`` / ratio). What earlier findings explain inside the
    update is not counted again. The settings known to slow an update (offload, gradient
    checkpointing, no dynamic batch, padding kept, small micro-batches) are the ``causes``.
    """
    ctx = ctx.whole if isinstance(ctx, Parts) else ctx  # figures of the run as a whole
    a = assess(ctx, th)
    verdict = a.verdicts.get("update_actor")
    if verdict is None or verdict.verdict != "slow" or verdict.value is None:
        return _critic(ctx, th)
    fig = figures(ctx)
    update = next((p for p in fig.phases if p["phase"] == "update_actor"), {})
    update_gpu_s, total, basis = phase_gpu_s(ctx, "update_actor")
    logged = fig.framework["metrics"].get("perf/mfu/actor")
    logged_mfu = logged["mean"] if logged else None
    settings = run_settings(ctx.run.meta)
    causes, knobs = _causes(settings)
    cause_text = "; ".join(f"{c['knob']}={c['value']}" for c in causes[:3])
    model = fig.model or {}
    if verdict.measure == "mfu":
        mfu = float(verdict.value)
        long_seq = fig.seq_mean is None or fig.seq_mean > th.mfu_long_sequence_tokens
        if not fig.attention_counted and long_seq:
            return None
        if logged_mfu is not None and th.reachable_mfu <= logged_mfu <= 1.0:
            return None
        if basis == "gpu_samples" and not update_gpu_s and update.get("gpus"):
            update_gpu_s = float(update["wall_s"]) * int(update["gpus"])
        if not total:
            total = float(fig.run.get("gpu_s") or 0.0)
        lost = update_gpu_s * max(0.0, 1.0 - mfu / th.reachable_mfu)
        source = str(model.get("source") or "")
        confidence = 0.5
        confidence += 0.15 if source == "--model-params" or source.startswith("config.json") else 0
        confidence += 0.1 if logged_mfu is not None and logged_mfu < th.low_mfu else 0.0
        confidence -= 0.1 if not fig.attention_counted else 0.0
        head = (
            f"update_actor reaches {mfu:.1%} MFU ({update.get('tokens_per_s') or 0:.0f} trained "
            f"tokens/s on {update.get('gpus')} × {fig.gpu.get('model')}): at "
            f"{th.reachable_mfu:.0%} it would save"
        )
    elif verdict.measure == "framework_mfu":
        mfu = float(verdict.value)
        lost = update_gpu_s * max(0.0, 1.0 - mfu / th.reachable_mfu)
        confidence = 0.55  # the framework's own count of its own FLOPs
        head = (
            f"update_actor reaches {mfu:.1%} MFU by {ctx.run.meta.framework or 'the framework'}'s "
            f"own count (perf/mfu/actor): at {th.reachable_mfu:.0%} it would save"
        )
    else:
        ratio = float(verdict.value)
        lost = update_gpu_s * max(0.0, 1.0 - th.update_forward_ratio_healthy / ratio)
        confidence = 0.45  # a ratio of two phases, not a measurement against the hardware
        fwd_phase = str((a.ratios or {}).get("forward_phase"))
        fwd = FORWARD_NAME.get(fwd_phase, fwd_phase)
        head = (
            f"update_actor takes {ratio:.1f}× the {fwd} pass over the same tokens per epoch "
            f"(a forward + backward is ~3×, healthy runs {th.update_forward_ratio_healthy:g}×): "
            f"at a healthy ratio it would save"
        )
    lost -= explained_in(ctx, "update_actor")
    confidence += 0.1 if causes else 0.0
    summary = f"{head} ~{_fmt_gpu_s(max(lost, 0.0))} ({{share}})" + (
        f"; settings that slow it: {cause_text}" if cause_text else ""
    )
    evidence = UpdateBoundEvidence(
        intervals=_phase_intervals(ctx, ["update_actor"]),
        gpus=[],
        phases=["update_actor"],
        basis=basis,
        measure=str(verdict.measure),
        update_share_of_step=round(a.share("update_actor"), 4),
        update_gpu_s=round(update_gpu_s, 3),
        mfu=round(float(verdict.value), 5) if verdict.measure == "mfu" else update.get("mfu"),
        threshold_mfu=th.low_mfu,
        reachable_mfu=th.reachable_mfu,
        forward_ratio=(a.ratios or {}).get("update_per_epoch"),
        forward_phase=(a.ratios or {}).get("forward_phase"),
        healthy_forward_ratio=th.update_forward_ratio_healthy,
        ppo_epochs=(a.ratios or {}).get("epochs"),
        tokens_per_s=update.get("tokens_per_s"),
        flops_per_token=update.get("flops_per_token"),
        peak_flops_per_gpu=fig.peak,
        gpu_model=fig.gpu.get("model"),
        model_params=model.get("flops_params"),
        model_total_params=model.get("params"),
        model_params_source=model.get("source"),
        framework_mfu=logged_mfu,
        causes=causes,
        knobs=knobs or None,
    )
    return _finding("update_bound", ctx, th, lost, confidence, summary, evidence, total_gpu_s=total)


_CRITIC_CAUSES: tuple[tuple[str, Any, str], ...] = (
    ("critic.fsdp.param_offload", True,
     "critic parameters offloaded to CPU: every forward and backward waits for them over PCIe"),
    ("critic.model.fsdp_config.param_offload", True,
     "critic parameters offloaded to CPU: every forward and backward waits for them over PCIe"),
    ("critic.fsdp.optimizer_offload", True,
     "critic optimizer state offloaded to CPU: the optimizer step runs over PCIe"),
    ("critic.model.fsdp_config.optimizer_offload", True,
     "critic optimizer state offloaded to CPU: the optimizer step runs over PCIe"),
    ("critic.use_dynamic_bsz", False,
     "no dynamic batch for the critic: micro-batches padded to a fixed count"),
    ("critic.model.use_remove_padding", False,
     "critic keeps padding: pad tokens are computed and count for nothing"),
)  # fmt: skip
"""(knob, value that costs the critic's efficiency, why), in verl's words."""


def _critic_causes(settings: Mapping[str, Any]) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """The run's settings known to slow the critic's update (a critic micro-batch thinner
    than the actor's among them), and their values."""
    causes, knobs = _set_as(settings, _CRITIC_CAUSES)
    micro = _num(settings.get("critic.ppo_micro_batch_size_per_gpu"))
    actor_micro = _num(settings.get("actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu"))
    dynamic = settings.get("critic.use_dynamic_bsz") is True
    if (
        micro is not None
        and not dynamic
        and (micro <= SMALL_MICRO_BATCH or (actor_micro is not None and micro < actor_micro))
    ):
        than = f", under the actor's {actor_micro:g}" if actor_micro and micro < actor_micro else ""
        causes.append({"knob": "critic.ppo_micro_batch_size_per_gpu",
                       "value": settings.get("critic.ppo_micro_batch_size_per_gpu"),
                       "why": f"critic micro-batch of {micro:g} sequence(s) per GPU{than}: "
                              "thin matrix multiplies"})  # fmt: skip
        knobs["critic.ppo_micro_batch_size_per_gpu"] = settings.get(
            "critic.ppo_micro_batch_size_per_gpu"
        )
    return causes, knobs


def _critic(ctx: AnalysisContext, th: Thresholds) -> Finding | None:
    """The critic update slow against the actor's on the same tokens (`bound.assess`'s
    ``update_critic`` verdict). Lost = the critic update's GPU-seconds × (1 − its efficiency
    over the actor's / ``th.critic_actor_healthy``): what it would save running as
    efficiently as a healthy critic does beside its actor."""
    a = assess(ctx, th)
    verdict = a.verdicts.get("update_critic")
    if verdict is None or verdict.verdict != "slow" or verdict.value is None:
        return None
    ratio = float(verdict.value)
    critic_gpu_s, total, basis = phase_gpu_s(ctx, "update_critic")
    if not total:
        total = float(figures(ctx).run.get("gpu_s") or 0.0)
    lost = critic_gpu_s * max(0.0, 1.0 - ratio / th.critic_actor_healthy)
    lost -= explained_in(ctx, "update_critic")
    causes, knobs = _critic_causes(run_settings(ctx.run.meta))
    cause_text = "; ".join(f"{c['knob']}={c['value']}" for c in causes[:3])
    figs = verdict.figures
    if verdict.measure == "critic_actor_mfu":
        head = (
            f"update_critic reaches {figs.get('framework_mfu', 0):.1%} MFU by "
            f"{ctx.run.meta.framework or 'the framework'}'s own count (perf/mfu/critic), "
            f"{ratio:.2f}× the actor update's {figs.get('actor_framework_mfu', 0):.1%} on the "
            f"same tokens (healthy runs ≥ {th.critic_actor_healthy:g}×)"
        )
        confidence = 0.55  # the framework's own counts of both updates
    else:
        head = (
            f"update_critic takes {1 / ratio:.1f}× the actor update's time per epoch training "
            f"the same model on the same tokens (healthy runs ≤ {1 / th.critic_actor_healthy:.2g}×)"
        )
        confidence = 0.45  # a ratio of two phases' times
    confidence += 0.1 if causes else 0.0
    share_of_step = a.share("update_critic")
    bound = "update_critic" in a.bound
    summary = (
        f"{head}{'; it bounds the step' if bound else ''} ({share_of_step:.0%} of it): at a "
        f"healthy ratio it would save ~{_fmt_gpu_s(max(lost, 0.0))} ({{share}})"
        + (f"; settings that slow it: {cause_text}" if cause_text else "")
    )
    evidence = UpdateBoundEvidence(
        intervals=_phase_intervals(ctx, ["update_critic"]),
        gpus=[],
        phases=["update_critic"],
        basis=basis,
        measure=str(verdict.measure),
        phase="update_critic",
        update_share_of_step=round(share_of_step, 4),
        update_gpu_s=round(critic_gpu_s, 3),
        framework_mfu=figs.get("framework_mfu"),
        actor_framework_mfu=figs.get("actor_framework_mfu"),
        critic_actor_ratio=round(ratio, 4),
        healthy_critic_actor_ratio=th.critic_actor_healthy,
        ppo_epochs=None,
        causes=causes,
        knobs=knobs or None,
    )
    return _finding("update_bound", ctx, th, lost, confidence, summary, evidence, total_gpu_s=total)
