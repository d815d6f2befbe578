"""ms-swift: its profiling-context names (integration), its rows of
the knob catalogue, and how the simulator spells its settings: one place for the names the
importer, the integration, the recommender and the simulator share."""

from __future__ import annotations

from gpuprof.frameworks._knob import (
    _EVAL,
    _GEN_EAGER,
    _GEN_GMU,
    _GEN_PREFIX,
    _GEN_SEQS,
    _GEN_TP,
    _GEN_VLLM,
    _GMU,
    _K,
    _LEN,
    _OFFLOAD,
    _SAVE,
    _SYNC_LESS,
    _UNUSED,
    _UPD_EXPERTS,
    _UPD_MICRO,
    _UPD_OFFLOAD,
    _WORKERS,
    KnobEntry,
)
from gpuprof.phases import INHERIT

KNOBS: tuple[KnobEntry, ...] = (
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
    _K("swift", "idle_unattributed", "logging", "logging_steps", "", "multiply_in_step", 10, 5, 0.3,
       "{knob}={current}: logging gathers metrics across ranks and syncs the GPU; every "
       "{suggested} steps does it less often."),
    _K("swift", "unused_gpu", "gpus", "NPROC_PER_NODE", "", "gpus_per_host", 1, 1, 0.9,
       _UNUSED),
    _K("swift", "rollout_bound", "use_vllm", "use_vllm", ">=3.2", "set", True, False, 0.6,
       _GEN_VLLM),
    _K("swift", "rollout_bound", "gmu", "vllm_gpu_memory_utilization", ">=3.2",
       "memory_fraction", 0.85, 0.9, 0.4, _GEN_GMU),
    _K("swift", "rollout_bound", "eager", "vllm_enforce_eager", ">=3.2", "set", False, False, 0.3,
       _GEN_EAGER),
    _K("swift", "rollout_bound", "tp", "vllm_tensor_parallel_size", ">=3.2", "divide", 2, 1, 0.2,
       _GEN_TP),
    _K("swift", "rollout_bound", "max_seqs", "vllm_max_num_seqs", ">=3.2", "multiply", 2, 256,
       0.2, _GEN_SEQS),
    # True in ms-swift 3; 4.x defaults to None, which leaves it to vLLM (on in its V1 engine)
    _K("swift", "rollout_bound", "prefix_cache", "vllm_enable_prefix_caching", ">=3.2",
       "set_when_sampled", True, True, 0.15, _GEN_PREFIX),
    _K("swift", "update_bound", "expert_parallel", "expert_model_parallel_size", ">=3.5",
       "expert_parallel", 8, 1, 0.3, _UPD_EXPERTS),
    _K("swift", "update_bound", "micro_batch", "per_device_train_batch_size", "", "multiply", 2,
       1, 0.3, _UPD_MICRO),
    _K("swift", "update_bound", "offload_model", "offload_model", ">=3.3", "set", False, False,
       0.3, _UPD_OFFLOAD),
    _K("swift", "update_bound", "offload_optimizer", "offload_optimizer", ">=3.3", "set", False,
       False, 0.3, _UPD_OFFLOAD),
)  # fmt: skip
"""The knob catalogue's rows for this framework (see `gpuprof.analyzers.knobs`)."""


SIM_PHASE_NAMES: dict[str, str] = {
    "dataload": "dataloader",
    "rollout": "generate",
    "reward": "_score_completions",
    "old_logprob": "_get_per_token_logps",
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
    "param_offload": "offload_model",
    "optimizer_offload": "offload_optimizer",
    "update_weights_bucket_megabytes": "move_model_batches",
    "save_freq": "save_steps",
    "test_freq": "eval_steps",
    "colocate": "vllm_mode",
    "async_generate": "async_generate",
}
"""The simulator's generic settings → this framework's flag."""


SIM_ENTRY: tuple[str, ...] = ("swift", "rlhf", "--rlhf_type", "grpo")
"""The start of the launch command the simulator writes."""


PROFILING_PHASES: dict[str, str] = {
    "_generate_and_score_completions": "rollout",
    "_generate_completions": "rollout",
    "generate": "rollout",
    "_dynamic_sampling": "rollout",
    "resample_encode_failed_inputs": "rollout",
    "_score_completions": "reward",
    "_compute_rewards_per_func": "reward",
    "_move_model_to_vllm": "reshard",
    "export_weights": "reshard",
    "export_adapter_weights": "reshard",
    "compute_ref_old_logps": "old_logprob",
    "compute_loss": "update_actor",
    "loss_func": "update_actor",
    "forward_step": "update_actor",
    "training_step": "update_actor",
    "_prepare_inputs": "rollout",
    "_prepare_batch_inputs": INHERIT,
    "_get_per_token_logps_and_entropies": INHERIT,
    "_get_last_hidden_state": INHERIT,
    "log_metrics": INHERIT,
}
"""ms-swift's profiling names → canonical phases."""
