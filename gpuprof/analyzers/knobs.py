"""The knob catalogue: which setting of which framework fixes which stall, in one data table.

Each row of `CATALOGUE` names a knob exactly as its framework spells it (without the leading
``--`` of a command-line flag), the framework versions the spelling applies to (a PEP 440
specifier set, ``""`` for every version), how to compute a suggested value (``rule`` and
``arg``, see `SUGGEST_RULES`), the framework's default (used when the current value is not
on the command line), a rationale template and the expected-gain factor: the fraction of the
finding's lost GPU-seconds this knob typically wins back.

Rows that share ``framework``, ``kind`` and ``setting`` are alternative spellings of one
setting across versions; `recommend` keeps one of them.

Names and version ranges were checked against the frameworks' own sources (release tags):
verl ``verl/trainer/config/*.yaml`` (v0.2 … v0.7.0 and main), TRL ``trl/trainer/grpo_config.py``
(v0.14 … v1.9), ms-swift ``swift/`` arguments (v3.0 … v4.5), OpenRLHF
``openrlhf/cli/train_ppo_ray.py`` (v0.5 … v0.11; flat flags until v0.10.1, dotted groups such as
``--vllm.gpu_memory_utilization`` from v0.10.2). PyTorch rows are the plain-PyTorch fallback:
PyTorch API arguments (``DataLoader``, ``torch.compile``, DDP) or the usual names of a
hand-written loop's own settings.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from gpuprof.analyzers.evidence import Evidence

FRAMEWORKS: tuple[str, ...] = ("verl", "trl", "swift", "openrlhf", "pytorch")
"""Frameworks the catalogue covers; ``pytorch`` is also the fallback for the others."""


@dataclass(frozen=True)
class KnobEntry:
    """One catalogue row: a knob of one framework that addresses one stall kind.

    ``default`` is the framework's default value, or ``"@other_knob"`` when the default is
    another knob's value (TRL ``steps_per_generation`` defaults to
    ``gradient_accumulation_steps``). ``gain`` is 0–1. ``rationale`` is a `str.format`
    template over ``knob``, ``current``, ``suggested`` and ``lost_gpu_s``.
    """

    framework: str
    kind: str
    setting: str
    knob: str
    versions: str
    rule: str
    arg: Any
    default: Any
    gain: float
    rationale: str


# --------------------------------------------------------------------------------------------
# Suggestion rules: (base value, rule argument, finding evidence, context) -> suggested value.
# ``base`` is the current value, or the framework default when the current one is unknown.
# ``context`` holds run facts (``gpus_per_host``). Returning None means "no concrete value".

SuggestFn = Callable[[Any, Any, Mapping[str, Any], dict[str, Any]], Any]


def _num(value: Any) -> float | None:
    if isinstance(value, bool) or value is None:
        return None
    try:
        out = float(value)
    except (TypeError, ValueError):
        return None
    return out if math.isfinite(out) else None


def _like(base: Any, value: float) -> int | float:
    """``value`` as an int when the base value was an integer."""
    if isinstance(base, int) or (isinstance(base, float) and base.is_integer()):
        return round(value)
    return round(value, 3)


def evidence_value(evidence: Mapping[str, Any], name: str) -> Any:
    """Field ``name`` of a finding's evidence, as a rule reads it.

    Typed evidence (`Evidence`) is read by attribute, so a rule and a detector that disagree on
    a name fail loudly (``AttributeError``) instead of falling back to a generic suggestion;
    a plain mapping (a hand-built finding) is read with ``.get``.
    """
    if isinstance(evidence, Evidence):
        return getattr(evidence, name)
    return evidence.get(name) if isinstance(evidence, Mapping) else None


EVIDENCE_READS: dict[str, str] = {
    "memory_fraction": "mem_peak_frac",
    "less_often": "every_n_steps",
    "cap_length": "response_length_mean_tokens",
}
"""Rule → the evidence field its evidence-driven branch reads (tests check every catalogue row
whose rule is here against the real finding of its kind)."""


def _headroom(evidence: Mapping[str, Any], base: float) -> float:
    """Unused memory share (0–1) at the measured peak, else what ``base`` leaves below 0.9."""
    peak = _num(evidence_value(evidence, EVIDENCE_READS["memory_fraction"]))
    if peak is not None:
        return min(1.0, max(0.0, 1.0 - peak))
    return max(0.0, 0.9 - base)


def _rule_memory_fraction(base: Any, arg: Any, ev: dict[str, Any], ctx: dict[str, Any]) -> Any:
    # raise a memory fraction by most of the unused memory, capped at ``arg`` (0.9)
    current = _num(base)
    if current is None:
        return None
    cap = float(arg)
    return round(max(current, min(cap, current + _headroom(ev, current) * 0.8)), 2)


def _rule_workers(base: Any, arg: Any, ev: dict[str, Any], ctx: dict[str, Any]) -> Any:
    current = _num(base) or 0.0
    return int(max(int(arg), 2 * current))


def _rule_set(base: Any, arg: Any, ev: dict[str, Any], ctx: dict[str, Any]) -> Any:
    return arg


def _rule_multiply(base: Any, arg: Any, ev: dict[str, Any], ctx: dict[str, Any]) -> Any:
    current = _num(base)
    if current is None or current <= 0:
        return None
    return _like(base, current * float(arg))


def _rule_divide(base: Any, arg: Any, ev: dict[str, Any], ctx: dict[str, Any]) -> Any:
    current = _num(base)
    if current is None or current <= 0:
        return None
    return max(1, int(current // float(arg)))


def _rule_less_often(base: Any, arg: Any, ev: dict[str, Any], ctx: dict[str, Any]) -> Any:
    # every-N-steps settings: N <= 0 means "never" already, so this setting is not the cause;
    # without a current value or default, the period the detector measured stands in for it
    current = _num(base)
    if current is None:
        period = _num(evidence_value(ev, EVIDENCE_READS["less_often"]))
        return int(period * float(arg)) if period is not None and period > 0 else None
    if current <= 0:
        return None
    return _like(base, current * float(arg))


RELATIVE: dict[str, str] = {
    "multiply": "{arg}× the current value",
    "less_often": "every {arg}× as many steps as now",
    "divide": "the current value ÷ {arg}",
    "cap_length": "about {arg}× the mean response length",
    "memory_fraction": "current + 0.8 × the unused share (at most {arg})",
}
"""How a rule's suggestion reads when the current value is unknown and has no default."""


def _rule_cap_length(base: Any, arg: Any, ev: dict[str, Any], ctx: dict[str, Any]) -> Any:
    # cap the response length near ``arg`` × the mean response (a power of two), never above
    # the current cap; without a measured mean, halve the current cap
    current = _num(base)
    mean = _num(evidence_value(ev, EVIDENCE_READS["cap_length"]))
    if mean is not None and mean > 0:
        cap = 2 ** math.ceil(math.log2(mean * float(arg)))
        return int(cap if current is None else min(current, cap))
    return None if current is None else max(1, int(current // 2))


def _rule_gpus_per_host(base: Any, arg: Any, ev: dict[str, Any], ctx: dict[str, Any]) -> Any:
    return int(ctx.get("gpus_per_host") or arg)


SUGGEST_RULES: dict[str, SuggestFn] = {
    "memory_fraction": _rule_memory_fraction,
    "workers": _rule_workers,
    "set": _rule_set,
    "multiply": _rule_multiply,
    "divide": _rule_divide,
    "less_often": _rule_less_often,
    "cap_length": _rule_cap_length,
    "gpus_per_host": _rule_gpus_per_host,
}
"""Rule name -> function computing the suggested value (see the module docstring)."""


_K = KnobEntry
_AR = "actor_rollout_ref"
_GMU = (
    "{knob}={current}: the inference engine reserves only that share of GPU memory for weights "
    "and KV cache, so fewer sequences run at once and generation takes longer; {suggested} "
    "uses the unused memory (watch for OOM in the update phase)."
)
_WORKERS = (
    "{knob}={current}: the main process loads and collates batches itself while the GPUs wait; "
    "{suggested} worker processes prefetch the next batches in parallel."
)
_SAVE = (
    "{knob}={current}: checkpoints stop every GPU for a while; saving every {suggested} steps "
    "cuts that stall by most of its {lost_gpu_s} GPU-seconds."
)
_EVAL = (
    "{knob}={current}: validation runs stall training; every {suggested} steps costs a "
    "fraction of it."
)
_LEN = (
    "{knob}={current}: a few very long responses keep the engine running with most sequences "
    "done; a cap of {suggested} tokens cuts the tail (check the clip ratio stays low)."
)
_OFFLOAD = (
    "{knob}={current}: state is copied over PCIe every step and the GPUs wait on the copies; "
    "{suggested} keeps it on the GPU when memory allows."
)
_DYN = (
    "{knob}={current}: fixed-count micro-batches of uneven lengths leave GPUs waiting for the "
    "slowest rank; {suggested} packs micro-batches by token budget."
)
_SYNC_LESS = (
    "{knob}={current}: weights move to the inference engine once per generation round; "
    "{suggested} generates for more optimizer steps per sync, so GPUs idle in syncs less often."
)

_UNUSED = (
    "{knob}={current}: some GPUs given to the job never ran work; {suggested} puts every GPU "
    "of the node to work (or ask the scheduler / CUDA_VISIBLE_DEVICES for fewer GPUs)."
)

CATALOGUE: tuple[KnobEntry, ...] = (
    # ------------------------------------------------------------------------------- verl
    _K("verl", "reshard_idle", "bucket", f"{_AR}.rollout.update_weights_bucket_megabytes",
       ">=0.5,<=0.7.0", "multiply", 4, 512, 0.5,
       "{knob}={current}: weights move to the engine in many small buckets, each with its own "
       "launch and sync; {suggested} MB buckets need far fewer transfers."),
    _K("verl", "reshard_idle", "bucket",
       f"{_AR}.rollout.checkpoint_engine.update_weights_bucket_megabytes",
       ">0.7.0", "multiply", 4, 2048, 0.5,
       "{knob}={current}: weights move to the engine in many small buckets, each with its own "
       "launch and sync; {suggested} MB buckets need far fewer transfers."),
    _K("verl", "pipeline_bubble", "colocate", f"{_AR}.hybrid_engine", "", "set", True, True, 0.6,
       "{knob}={current}: generation and training run on separate GPUs that wait for each "
       "other; the hybrid engine ({suggested}) time-shares the same GPUs."),
    _K("verl", "pipeline_bubble", "async_rollout", f"{_AR}.rollout.mode", ">=0.4", "set",
       "async", "sync", 0.3,
       "{knob}={current}: the trainer waits for the whole batch to finish generating; "
       "{suggested} rollout streams requests through the agent loop and overlaps stages."),
    _K("verl", "dataloader_starvation", "workers", "data.dataloader_num_workers", ">=0.5",
       "workers", 4, 8, 0.7, _WORKERS),
    _K("verl", "reward_bound", "reward_async", "reward_model.launch_reward_fn_async", ">=0.4",
       "set", True, False, 0.6,
       "{knob}={current}: reward scoring runs on the CPU while every GPU waits; {suggested} "
       "scores in a Ray task overlapped with the log-prob computation."),
    _K("verl", "reward_bound", "reward_manager", "reward_model.reward_manager", "", "set",
       "prime", "naive", 0.4,
       "{knob}={current}: responses are scored one by one in the driver; the {suggested} "
       "manager scores them in a process pool."),
    _K("verl", "generation_tail", "max_len", "data.max_response_length", "", "cap_length", 4,
       None, 0.4, _LEN),
    _K("verl", "generation_tail", "async_rollout", f"{_AR}.rollout.mode", ">=0.4", "set",
       "async", "sync", 0.3,
       "{knob}={current}: the batch waits for its longest response; {suggested} rollout lets "
       "finished requests move on while the tail generates."),
    _K("verl", "memory_headroom", "gmu", f"{_AR}.rollout.gpu_memory_utilization", "",
       "memory_fraction", 0.9, 0.5, 0.6, _GMU),
    _K("verl", "memory_headroom", "dynamic_bsz", f"{_AR}.actor.use_dynamic_bsz", "", "set", True,
       False, 0.3,
       "{knob}={current}: update micro-batches have a fixed sample count sized for the longest "
       "sequences; {suggested} fills each micro-batch up to ppo_max_token_len_per_gpu tokens."),
    _K("verl", "memory_headroom", "max_token_len", f"{_AR}.actor.ppo_max_token_len_per_gpu", "",
       "multiply", 2, 16384, 0.2,
       "{knob}={current}: with dynamic batching each micro-batch holds at most this many "
       "tokens; {suggested} uses the free memory for bigger micro-batches."),
    _K("verl", "memory_headroom", "max_batched_tokens", f"{_AR}.rollout.max_num_batched_tokens",
       "", "multiply", 2, 8192, 0.2,
       "{knob}={current}: the engine schedules at most this many tokens per step; "
       "{suggested} batches more prefill work per step."),
    _K("verl", "offload_thrash", "param_offload", f"{_AR}.actor.fsdp_config.param_offload", "",
       "set", False, False, 0.6, _OFFLOAD),
    _K("verl", "offload_thrash", "optimizer_offload",
       f"{_AR}.actor.fsdp_config.optimizer_offload", "", "set", False, False, 0.4, _OFFLOAD),
    _K("verl", "comm_bound", "fsdp_size", f"{_AR}.actor.fsdp_config.fsdp_size", "",
       "gpus_per_host", 8, -1, 0.4,
       "{knob}={current}: parameters are sharded over every GPU, so each all-gather crosses "
       "nodes; {suggested} (one node) shards within NVLink and replicates across nodes."),
    _K("verl", "host_bound", "dynamic_bsz", f"{_AR}.actor.use_dynamic_bsz", "", "set", True,
       False, 0.5,
       "{knob}={current}: many tiny micro-batches leave the GPU waiting on Python and kernel "
       "launches; {suggested} packs micro-batches by token budget."),
    _K("verl", "host_bound", "micro_batch", f"{_AR}.actor.ppo_micro_batch_size_per_gpu", "",
       "multiply", 4, None, 0.4,
       "{knob}={current}: each micro-batch is too small to keep the GPU busy between launches; "
       "{suggested} amortises the launch overhead."),
    _K("verl", "host_bound", "eager", f"{_AR}.rollout.enforce_eager", "", "set", False, True,
       0.2,
       "{knob}={current}: the engine launches every decode kernel from Python; {suggested} "
       "enables CUDA graphs."),
    _K("verl", "imbalance", "dynamic_bsz", f"{_AR}.actor.use_dynamic_bsz", "", "set", True,
       False, 0.5, _DYN),
    _K("verl", "imbalance", "balance_batch", "trainer.balance_batch", ">=0.4", "set", True,
       True, 0.4,
       "{knob}={current}: ranks get batches of very different token counts; {suggested} "
       "reorders the batch so every rank gets a similar number of tokens."),
    _K("verl", "periodic_stall", "save", "trainer.save_freq", "", "less_often", 4, -1, 0.5,
       _SAVE),
    _K("verl", "periodic_stall", "eval", "trainer.test_freq", "", "less_often", 4, -1, 0.3,
       _EVAL),
    # -------------------------------------------------------------------------- TRL / Open-R1
    _K("trl", "reshard_idle", "ds3_gather", "ds3_gather_for_generation", ">=0.15", "set", True,
       True, 0.5,
       "{knob}={current}: ZeRO-3 parameters are gathered for the weight sync one by one; "
       "{suggested} gathers the model at once (needs the memory for a full copy)."),
    _K("trl", "reshard_idle", "steps_per_gen", "steps_per_generation", ">=0.18", "multiply", 2,
       "@gradient_accumulation_steps", 0.4, _SYNC_LESS),
    _K("trl", "reshard_idle", "vllm_mode", "vllm_mode", ">=0.18", "set", "colocate", "server",
       0.3,
       "{knob}={current}: weights are broadcast to a separate vLLM server after every "
       "generation round; {suggested} loads them into the in-process engine."),
    _K("trl", "pipeline_bubble", "vllm_mode", "vllm_mode", ">=0.18", "set", "colocate",
       "server", 0.6,
       "{knob}={current}: the trainer GPUs idle while the vLLM server generates and vice "
       "versa; {suggested} runs generation on the training GPUs."),
    _K("trl", "dataloader_starvation", "workers", "dataloader_num_workers", "", "workers", 4, 0,
       0.7, _WORKERS),
    _K("trl", "generation_tail", "max_len", "max_completion_length", "", "cap_length", 4, 256,
       0.4, _LEN),
    _K("trl", "memory_headroom", "gmu", "vllm_gpu_memory_utilization", ">=0.14",
       "memory_fraction", 0.9, 0.3, 0.6, _GMU),
    _K("trl", "memory_headroom", "sleep", "vllm_enable_sleep_mode", ">=0.23", "set", True, False,
       0.2,
       "{knob}={current}: the colocated engine keeps its weights and KV cache during the "
       "update; {suggested} frees them so the update can use larger batches."),
    _K("trl", "memory_headroom", "batch", "per_device_train_batch_size", "", "multiply", 2, 8,
       0.3,
       "{knob}={current}: the update leaves memory unused; {suggested} processes more "
       "completions per forward pass."),
    _K("trl", "offload_thrash", "param_offload", "offload_param_device", "", "set", "none",
       "none", 0.6,
       "{knob}={current} (accelerate launch, DeepSpeed): parameters stream over PCIe every "
       "step; {suggested} keeps them on the GPU when memory allows."),
    _K("trl", "offload_thrash", "optimizer_offload", "offload_optimizer_device", "", "set",
       "none", "none", 0.4,
       "{knob}={current} (accelerate launch, DeepSpeed): optimizer states stream over PCIe; "
       "{suggested} keeps them on the GPU when memory allows."),
    _K("trl", "offload_thrash", "sleep", "vllm_enable_sleep_mode", ">=0.23", "set", False, False,
       0.2,
       "{knob}={current}: waking the engine copies weights and cache back over PCIe every "
       "step; {suggested} keeps them resident if memory allows."),
    _K("trl", "comm_bound", "grad_accum", "gradient_accumulation_steps", "", "multiply", 2, 1,
       0.3,
       "{knob}={current}: gradients are reduced after few micro-batches; {suggested} "
       "reduces them half as often per sample."),
    _K("trl", "host_bound", "batch", "per_device_train_batch_size", "", "multiply", 2, 8, 0.3,
       "{knob}={current}: small per-device batches leave the GPU waiting on Python; "
       "{suggested} amortises the launch overhead."),
    _K("trl", "host_bound", "compile", "torch_compile", "", "set", True, False, 0.3,
       "{knob}={current}: every op is launched from Python; {suggested} compiles the model "
       "and fuses kernels."),
    _K("trl", "periodic_stall", "save", "save_steps", "", "less_often", 4, 500, 0.5, _SAVE),
    _K("trl", "periodic_stall", "eval", "eval_steps", "", "less_often", 4, 500, 0.3, _EVAL),
    _K("trl", "idle_unattributed", "logging", "logging_steps", "", "multiply", 10, 10, 0.3,
       "{knob}={current}: logging gathers metrics across ranks and syncs the GPU; every "
       "{suggested} steps does it less often (if the idle time is not logging, wrap the code "
       "in a gpuprof phase to find out what it is)."),
    # ----------------------------------------------------------------------------- ms-swift
    _K("swift", "reshard_idle", "move_batches", "move_model_batches", ">=3.3", "divide", 4,
       None, 0.4,
       "{knob}={current}: the model moves to vLLM in that many layer batches, each a separate "
       "gather and load; {suggested} batches move it in fewer, larger pieces."),
    _K("swift", "reshard_idle", "steps_per_gen", "steps_per_generation", ">=3.5", "multiply", 2,
       "@gradient_accumulation_steps", 0.4, _SYNC_LESS),
    _K("swift", "reshard_idle", "vllm_mode", "vllm_mode", ">=3.5", "set", "colocate", "server",
       0.3,
       "{knob}={current}: weights are sent to an external vLLM server each round; "
       "{suggested} loads them into the in-process engine."),
    _K("swift", "pipeline_bubble", "async_generate", "async_generate", ">=3.2", "set", True,
       False, 0.6,
       "{knob}={current}: training waits for each generation round; {suggested} generates the "
       "next batch while the current one trains (one step off-policy)."),
    _K("swift", "pipeline_bubble", "vllm_mode", "vllm_mode", ">=3.5", "set", "colocate",
       "server", 0.5,
       "{knob}={current}: trainer and vLLM server GPUs wait for each other; {suggested} "
       "runs generation on the training GPUs."),
    _K("swift", "dataloader_starvation", "workers", "dataloader_num_workers", "", "workers", 4,
       0, 0.7, _WORKERS),
    _K("swift", "generation_tail", "max_len", "max_completion_length", "", "cap_length", 4, 512,
       0.4, _LEN),
    _K("swift", "memory_headroom", "gmu", "vllm_gpu_memory_utilization", ">=3.2",
       "memory_fraction", 0.9, 0.9, 0.6, _GMU),
    _K("swift", "memory_headroom", "batch", "per_device_train_batch_size", "", "multiply", 2, 1,
       0.3,
       "{knob}={current}: the update leaves memory unused; {suggested} processes more "
       "completions per forward pass."),
    _K("swift", "memory_headroom", "sleep", "sleep_level", ">=3.3", "set", 1, 0, 0.2,
       "{knob}={current}: the colocated engine keeps its memory during training; "
       "{suggested} releases it so the update can use larger batches."),
    _K("swift", "offload_thrash", "param_offload", "offload_model", ">=3.3", "set", False,
       False, 0.6, _OFFLOAD),
    _K("swift", "offload_thrash", "optimizer_offload", "offload_optimizer", ">=3.3", "set",
       False, False, 0.4, _OFFLOAD),
    _K("swift", "comm_bound", "grad_accum", "gradient_accumulation_steps", "", "multiply", 2, 1,
       0.3,
       "{knob}={current}: gradients are reduced after few micro-batches; {suggested} "
       "reduces them half as often per sample."),
    _K("swift", "host_bound", "batch", "per_device_train_batch_size", "", "multiply", 2, 1, 0.3,
       "{knob}={current}: small per-device batches leave the GPU waiting on Python; "
       "{suggested} amortises the launch overhead."),
    _K("swift", "periodic_stall", "save", "save_steps", "", "less_often", 4, 500, 0.5, _SAVE),
    _K("swift", "periodic_stall", "eval", "eval_steps", "", "less_often", 4, 500, 0.3, _EVAL),
    _K("swift", "idle_unattributed", "logging", "logging_steps", "", "multiply", 10, 5, 0.3,
       "{knob}={current}: logging gathers metrics across ranks and syncs the GPU; every "
       "{suggested} steps does it less often."),
    # ----------------------------------------------------------------------------- OpenRLHF
    _K("openrlhf", "reshard_idle", "sync_backend", "vllm_sync_backend", ">=0.5,<0.10.2", "set",
       "nccl", "nccl", 0.5,
       "{knob}={current}: weights reach the vLLM engines over a slow backend; {suggested} "
       "broadcasts them GPU to GPU."),
    _K("openrlhf", "reshard_idle", "sync_backend", "vllm.sync_backend", ">=0.10.2", "set",
       "nccl", "nccl", 0.5,
       "{knob}={current}: weights reach the vLLM engines over a slow backend; {suggested} "
       "broadcasts them GPU to GPU."),
    _K("openrlhf", "reshard_idle", "colocate", "colocate_all_models", ">=0.6,<0.10.2", "set",
       True, False, 0.3,
       "{knob}={current}: weights cross the network to separate engine GPUs; colocating "
       "({suggested}) shares them over CUDA IPC."),
    _K("openrlhf", "reshard_idle", "colocate", "train.colocate_all", ">=0.10.2", "set", True,
       False, 0.3,
       "{knob}={current}: weights cross the network to separate engine GPUs; colocating "
       "({suggested}) shares them over CUDA IPC."),
    _K("openrlhf", "pipeline_bubble", "colocate", "colocate_all_models", ">=0.6,<0.10.2", "set",
       True, False, 0.6,
       "{knob}={current}: actor, reference and vLLM GPUs wait for each other in turn; "
       "{suggested} time-shares one set of GPUs (hybrid engine)."),
    _K("openrlhf", "pipeline_bubble", "colocate", "train.colocate_all", ">=0.10.2", "set", True,
       False, 0.6,
       "{knob}={current}: actor, reference and vLLM GPUs wait for each other in turn; "
       "{suggested} time-shares one set of GPUs (hybrid engine)."),
    _K("openrlhf", "pipeline_bubble", "async", "async_train", ">=0.8,<0.10.2", "set", True,
       False, 0.5,
       "{knob}={current}: training waits for generation; {suggested} overlaps the next "
       "rollout with the current update."),
    _K("openrlhf", "pipeline_bubble", "async", "train.async_enable", ">=0.10.2", "set", True,
       False, 0.5,
       "{knob}={current}: training waits for generation; {suggested} overlaps the next "
       "rollout with the current update."),
    _K("openrlhf", "dataloader_starvation", "workers", "data.dataloader_num_workers",
       ">=0.10.2", "workers", 4, 0, 0.7, _WORKERS),
    _K("openrlhf", "generation_tail", "max_len", "generate_max_len", "<0.9.8", "cap_length", 4,
       1024, 0.4, _LEN),
    _K("openrlhf", "generation_tail", "max_len", "max_new_tokens", ">=0.9.8,<0.10.2",
       "cap_length", 4, 1024, 0.4, _LEN),
    _K("openrlhf", "generation_tail", "max_len", "rollout.max_new_tokens", ">=0.10.2",
       "cap_length", 4, 1024, 0.4, _LEN),
    _K("openrlhf", "generation_tail", "partial", "train.partial_rollout_enable", ">=0.10.2",
       "set", True, False, 0.3,
       "{knob}={current}: each round waits for its longest responses; {suggested} carries "
       "unfinished ones over to the next round."),
    _K("openrlhf", "memory_headroom", "gmu", "vllm_gpu_memory_utilization", ">=0.6,<0.10.2",
       "memory_fraction", 0.9, 0.95, 0.6, _GMU),
    _K("openrlhf", "memory_headroom", "gmu", "vllm.gpu_memory_utilization", ">=0.10.2",
       "memory_fraction", 0.9, 0.95, 0.6, _GMU),
    _K("openrlhf", "memory_headroom", "dynamic_batch", "use_dynamic_batch", ">=0.9,<0.10.2",
       "set", True, False, 0.3, _DYN),
    _K("openrlhf", "memory_headroom", "dynamic_batch", "train.dynamic_batch_enable", ">=0.10.2",
       "set", True, False, 0.3, _DYN),
    _K("openrlhf", "memory_headroom", "packing", "packing_samples", ">=0.5,<0.10.2", "set",
       True, False, 0.2,
       "{knob}={current}: padded micro-batches waste memory and compute on pad tokens; "
       "{suggested} packs sequences without padding."),
    _K("openrlhf", "memory_headroom", "packing", "ds.packing_samples", ">=0.10.2", "set", True,
       False, 0.2,
       "{knob}={current}: padded micro-batches waste memory and compute on pad tokens; "
       "{suggested} packs sequences without padding."),
    _K("openrlhf", "offload_thrash", "adam_offload", "adam_offload", "<0.10.2", "set", False,
       False, 0.6, _OFFLOAD),
    _K("openrlhf", "offload_thrash", "adam_offload", "ds.adam_offload", ">=0.10.2", "set", False,
       False, 0.6, _OFFLOAD),
    _K("openrlhf", "offload_thrash", "ds_sleep", "deepspeed_enable_sleep", ">=0.6.4,<0.10.2",
       "set", False, False, 0.2,
       "{knob}={current}: DeepSpeed state is offloaded and reloaded around every rollout; "
       "{suggested} keeps it resident if memory allows."),
    _K("openrlhf", "offload_thrash", "ds_sleep", "ds.enable_sleep", ">=0.10.2", "set", False,
       False, 0.2,
       "{knob}={current}: DeepSpeed state is offloaded and reloaded around every rollout; "
       "{suggested} keeps it resident if memory allows."),
    _K("openrlhf", "comm_bound", "zero_stage", "zero_stage", "<0.10.2", "set", 2, 2, 0.3,
       "{knob}={current}: ZeRO-3 gathers parameters for every forward and backward; ZeRO-"
       "{suggested} keeps parameters replicated when they fit."),
    _K("openrlhf", "comm_bound", "zero_stage", "ds.zero_stage", ">=0.10.2", "set", 2, 2, 0.3,
       "{knob}={current}: ZeRO-3 gathers parameters for every forward and backward; ZeRO-"
       "{suggested} keeps parameters replicated when they fit."),
    _K("openrlhf", "host_bound", "dynamic_batch", "use_dynamic_batch", ">=0.9,<0.10.2", "set",
       True, False, 0.4, _DYN),
    _K("openrlhf", "host_bound", "dynamic_batch", "train.dynamic_batch_enable", ">=0.10.2",
       "set", True, False, 0.4, _DYN),
    _K("openrlhf", "host_bound", "micro_batch", "micro_train_batch_size", "<0.10.2", "multiply",
       2, 8, 0.3,
       "{knob}={current}: tiny micro-batches leave the GPU waiting on Python; {suggested} "
       "amortises the launch overhead."),
    _K("openrlhf", "host_bound", "micro_batch", "train.micro_batch_size", ">=0.10.2",
       "multiply", 2, 8, 0.3,
       "{knob}={current}: tiny micro-batches leave the GPU waiting on Python; {suggested} "
       "amortises the launch overhead."),
    _K("openrlhf", "imbalance", "dynamic_batch", "use_dynamic_batch", ">=0.9,<0.10.2", "set",
       True, False, 0.5, _DYN),
    _K("openrlhf", "imbalance", "dynamic_batch", "train.dynamic_batch_enable", ">=0.10.2", "set",
       True, False, 0.5, _DYN),
    _K("openrlhf", "periodic_stall", "save", "save_steps", "<0.10.2", "less_often", 4, -1, 0.5,
       _SAVE),
    _K("openrlhf", "periodic_stall", "save", "ckpt.save_steps", ">=0.10.2", "less_often", 4, -1,
       0.5, _SAVE),
    _K("openrlhf", "periodic_stall", "eval", "eval_steps", "<0.10.2", "less_often", 4, -1, 0.3,
       _EVAL),
    _K("openrlhf", "periodic_stall", "eval", "eval.steps", ">=0.10.2", "less_often", 4, -1, 0.3,
       _EVAL),
    _K("openrlhf", "idle_unattributed", "logging", "logging_steps", "<0.10.2", "multiply", 10, 1,
       0.3,
       "{knob}={current}: logging gathers metrics across ranks and syncs the GPU; every "
       "{suggested} steps does it less often."),
    _K("openrlhf", "idle_unattributed", "logging", "logger.logging_steps", ">=0.10.2",
       "multiply", 10, 1, 0.3,
       "{knob}={current}: logging gathers metrics across ranks and syncs the GPU; every "
       "{suggested} steps does it less often."),
    # ------------------------------------------------------------------------- low MFU
    _K("verl", "low_mfu", "dynamic_batch", f"{_AR}.actor.use_dynamic_bsz", ">=0.3", "set", True,
       False, 0.4,
       "{knob}={current}: micro-batches padded to a fixed sequence count do few model FLOPs "
       "per kernel; {suggested} packs them to a token budget (set ppo_max_token_len_per_gpu)."),
    _K("verl", "low_mfu", "remove_padding", f"{_AR}.model.use_remove_padding", ">=0.3", "set",
       True, False, 0.3,
       "{knob}={current}: pad tokens are computed and count for nothing; {suggested} runs the "
       "update on packed sequences."),
    _K("pytorch", "low_mfu", "compile", "torch.compile", "", "set", True, None, 0.3,
       "The update turns little of the GPU's peak into model FLOPs; torch.compile fuses the "
       "small kernels of a thin micro-batch (and check offload and gradient checkpointing, "
       "listed in the evidence, are needed)."),
    # ------------------------------------------------------------- unused GPUs, any launcher
    _K("verl", "unused_gpu", "gpus", "trainer.n_gpus_per_node", "", "gpus_per_host", 8, 8, 0.9,
       _UNUSED),
    _K("trl", "unused_gpu", "gpus", "num_processes", "", "gpus_per_host", 1, 1, 0.9, _UNUSED),
    _K("swift", "unused_gpu", "gpus", "NPROC_PER_NODE", "", "gpus_per_host", 1, 1, 0.9,
       _UNUSED),
    # ------------------------------------------------------ plain PyTorch (and the fallback)
    _K("pytorch", "unused_gpu", "gpus", "nproc_per_node", "", "gpus_per_host", 1, 1, 0.9,
       _UNUSED),
    _K("pytorch", "idle_allocation", "timeout", "init_process_group.timeout", "", "set",
       "timedelta(minutes=10)", None, 0.5,
       "The job held its GPUs idle for minutes with nothing running: a hung collective or a "
       "wait on storage or a service. A collective timeout of {suggested} (with "
       "TORCH_NCCL_ASYNC_ERROR_HANDLING=1) makes a hang fail fast instead of holding the "
       "allocation; the evidence intervals show when it happened."),
    _K("pytorch", "reshard_idle", "bucket", "weight_sync_bucket_mb", "", "multiply", 4, 64, 0.4,
       "{knob}={current}: a hand-written weight sync that sends tensors one by one pays a "
       "launch and sync per tensor; flatten them into {suggested} MB buckets."),
    _K("pytorch", "pipeline_bubble", "async", "async_rollout", "", "set", True, False, 0.4,
       "{knob}={current}: generation and training GPUs take turns; overlapping the next "
       "rollout with the current update ({suggested}, one step off-policy) fills the bubble."),
    _K("pytorch", "dataloader_starvation", "workers", "num_workers", "", "workers", 4, 0, 0.7,
       _WORKERS),
    _K("pytorch", "dataloader_starvation", "pin_memory", "pin_memory", "", "set", True, False,
       0.1,
       "DataLoader {knob}={current}: host-to-device copies go through pageable memory; "
       "{suggested} allows asynchronous copies (with .to(device, non_blocking=True))."),
    _K("pytorch", "reward_bound", "reward_workers", "ProcessPoolExecutor.max_workers", "",
       "workers", 4, 1, 0.5,
       "Reward scoring runs on one CPU core while every GPU waits; score the batch in a "
       "process pool of {suggested} workers (or overlap it with the log-prob pass)."),
    _K("pytorch", "generation_tail", "max_len", "max_new_tokens", "", "cap_length", 4, None,
       0.4, _LEN),
    _K("pytorch", "memory_headroom", "batch", "batch_size", "", "multiply", 2, None, 0.4,
       "{knob}={current}: peak memory stays well below the GPU's; {suggested} uses it for "
       "more samples per step."),
    _K("pytorch", "offload_thrash", "offload", "CPUOffload.offload_params", "", "set", False,
       False, 0.6,
       "FSDP {knob}={current}: parameters cross PCIe every step; {suggested} keeps them on "
       "the GPU when memory allows."),
    _K("pytorch", "comm_bound", "bucket", "DistributedDataParallel.bucket_cap_mb", "",
       "multiply", 4, 25, 0.3,
       "{knob}={current}: many small all-reduces; {suggested} MB buckets use the links "
       "better and overlap with backward."),
    _K("pytorch", "comm_bound", "grad_accum", "gradient_accumulation_steps", "", "multiply", 2,
       1, 0.3,
       "{knob}={current}: gradients are reduced every micro-batch; {suggested} steps with "
       "no_sync() between reductions halve the traffic per sample."),
    _K("pytorch", "host_bound", "compile", "torch.compile.mode", "", "set", "reduce-overhead",
       None, 0.5,
       "The GPU waits on Python and kernel launches; torch.compile(mode='{suggested}') fuses "
       "kernels and replays them as CUDA graphs."),
    _K("pytorch", "host_bound", "batch", "batch_size", "", "multiply", 2, None, 0.3,
       "{knob}={current}: small batches leave the GPU waiting on launches; {suggested} "
       "amortises them."),
    _K("pytorch", "imbalance", "balance", "batch_sampler", "", "set", "token-balanced", None,
       0.4,
       "Ranks get batches of uneven token counts and the rest wait for the straggler; a "
       "{suggested} sampler gives every rank a similar token count."),
    _K("pytorch", "throttling", "power", "nvidia-smi --power-limit", "", "set",
       "the board's default limit", None, 0.5,
       "Clocks drop under power or thermal limits; restore {suggested} and check the node's "
       "cooling (the throttled GPUs are in the evidence)."),
    _K("pytorch", "periodic_stall", "save", "save_every", "", "less_often", 4, None, 0.5,
       _SAVE),
    _K("pytorch", "periodic_stall", "eval", "eval_every", "", "less_often", 4, None, 0.3,
       _EVAL),
    _K("pytorch", "idle_unattributed", "logging", "log_every", "", "multiply", 10, 1, 0.3,
       "{knob}={current}: per-step logging calls .item() and syncs the GPU; every {suggested} "
       "steps does it less often (wrap unexplained code in a gpuprof phase to find the rest)."),
)  # fmt: skip
"""The knob catalogue: every (framework, stall kind, knob) the recommender knows."""


def entries(framework: str | None = None, kind: str | None = None) -> list[KnobEntry]:
    """Catalogue rows for a framework and/or a stall kind, in table order."""
    return [
        e
        for e in CATALOGUE
        if (framework is None or e.framework == framework) and (kind is None or e.kind == kind)
    ]
