"""TRL / Open-R1: its profiling-context names (integration), its rows of
the knob catalogue, and how the simulator spells its settings: one place for the names the
importer, the integration, the recommender and the simulator share."""

from __future__ import annotations

from gpuprof.frameworks._knob import (
    _EVAL,
    _GEN_GMU,
    _GEN_TP,
    _GEN_VLLM,
    _GMU,
    _K,
    _LEN,
    _SAVE,
    _SYNC_LESS,
    _UNUSED,
    _UPD_MICRO,
    _UPD_RECOMPUTE,
    _WORKERS,
    KnobEntry,
)
from gpuprof.phases import INHERIT

KNOBS: tuple[KnobEntry, ...] = (
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
    _K("trl", "idle_unattributed", "logging", "logging_steps", "", "multiply_in_step", 10, 10, 0.3,
       "{knob}={current}: logging gathers metrics across ranks and syncs the GPU; every "
       "{suggested} steps does it less often (if the idle time is not logging, wrap the code "
       "in a gpuprof phase to find out what it is)."),
    _K("trl", "unused_gpu", "gpus", "num_processes", "", "gpus_per_host", 1, 1, 0.9, _UNUSED),
    _K("trl", "rollout_bound", "use_vllm", "use_vllm", ">=0.14", "set", True, False, 0.6,
       _GEN_VLLM),
    _K("trl", "rollout_bound", "gmu", "vllm_gpu_memory_utilization", ">=0.14",
       "memory_fraction", 0.85, 0.3, 0.4, _GEN_GMU),
    _K("trl", "rollout_bound", "tp", "vllm_tensor_parallel_size", ">=0.18", "divide", 2, 1, 0.2,
       _GEN_TP),
    _K("trl", "update_bound", "micro_batch", "per_device_train_batch_size", "", "multiply", 2, 8,
       0.3, _UPD_MICRO),
    _K("trl", "update_bound", "recompute", "gradient_checkpointing", "", "set", False, False,
       0.2, _UPD_RECOMPUTE),
    _K("trl", "update_bound", "liger", "use_liger_kernel", "", "set", True, False, 0.2,
       "{knob}={current}: the loss materialises the full logits of every token; "
       "{suggested} fuses it (and the MLP / norm kernels) for more tokens per micro-batch."),
)  # fmt: skip
"""The knob catalogue's rows for this framework (see `gpuprof.analyzers.knobs`)."""


SIM_PHASE_NAMES: dict[str, str] = {
    "dataload": "dataloader",
    "rollout": "vLLM.generate",
    "reward": "_calculate_rewards",
    "old_logprob": "_get_per_token_logps_and_entropies",
    "ref_logprob": "ref_per_token_logps",
    "advantage": "compute_advantages",
    "update_actor": "training_step",
    "reshard": "_move_model_to_vllm",
    "checkpoint": "_save_checkpoint",
    "eval": "evaluate",
}
"""Canonical phase → the name the simulator gives its spans, as this framework's timers do."""


SIM_FLAGS: dict[str, str] = {
    "gpu_memory_utilization": "vllm_gpu_memory_utilization",
    "tensor_parallel_size": "vllm_tensor_parallel_size",
    "train_batch_size": "per_device_train_batch_size",
    "num_generations": "num_generations",
    "max_response_length": "max_completion_length",
    "dataloader_num_workers": "dataloader_num_workers",
    "ds3_gather_for_generation": "ds3_gather_for_generation",
    "micro_batch_size_per_gpu": "gradient_accumulation_steps",
    "save_freq": "save_steps",
    "test_freq": "eval_steps",
    "colocate": "vllm_mode",
}
"""The simulator's generic settings → this framework's flag."""


SIM_ENTRY: tuple[str, ...] = (
    "accelerate",
    "launch",
    "--config_file",
    "zero3.yaml",
    "grpo_train.py",
)
"""The start of the launch command the simulator writes."""


PROFILING_PHASES: dict[str, str] = {
    "_generate_and_score_completions": "rollout",
    "_generate": "rollout",
    "_generate_single_turn": "rollout",
    "transformers.generate": "rollout",
    "transformers.generate_batch": "rollout",
    "vLLM.generate": "rollout",
    "generate": "rollout",
    "_calculate_rewards": "reward",
    "sync_weights": "reshard",
    "_move_model_to_vllm": "reshard",
    "compute_loss": "update_actor",
    "training_step": "update_actor",
    "optimizer_step": "update_actor",
    "_prepare_inputs": "rollout",
    "_get_per_token_logps_and_entropies": INHERIT,
    "_get_per_token_logps": INHERIT,
}
"""TRL's profiling names (without the trainer-class prefix) → canonical phases."""
