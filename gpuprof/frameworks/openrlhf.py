"""OpenRLHF: its trainer methods (integration) and log keys and patterns (importer), its
rows of the knob catalogue, and how the simulator spells its settings: one place for the
names the importer, the integration, the recommender and the simulator share."""

from __future__ import annotations

import re

from gpuprof.frameworks._knob import (
    _DYN,
    _EVAL,
    _GEN_EAGER,
    _GEN_GMU,
    _GEN_PREFIX,
    _GEN_TP,
    _GMU,
    _K,
    _LEN,
    _OFFLOAD,
    _SAVE,
    _UPD_MICRO,
    _UPD_OFFLOAD,
    _WORKERS,
    KnobEntry,
)

KNOBS: tuple[KnobEntry, ...] = (
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
    _K("openrlhf", "idle_unattributed", "logging", "logging_steps", "<0.10.2",
       "multiply_in_step", 10, 1, 0.3,
       "{knob}={current}: logging gathers metrics across ranks and syncs the GPU; every "
       "{suggested} steps does it less often."),
    _K("openrlhf", "idle_unattributed", "logging", "logger.logging_steps", ">=0.10.2",
       "multiply_in_step", 10, 1, 0.3,
       "{knob}={current}: logging gathers metrics across ranks and syncs the GPU; every "
       "{suggested} steps does it less often."),
    _K("openrlhf", "rollout_bound", "gmu", "vllm_gpu_memory_utilization", ">=0.6,<0.10.2",
       "memory_fraction", 0.9, 0.95, 0.4, _GEN_GMU),
    _K("openrlhf", "rollout_bound", "gmu", "vllm.gpu_memory_utilization", ">=0.10.2",
       "memory_fraction", 0.9, 0.95, 0.4, _GEN_GMU),
    _K("openrlhf", "rollout_bound", "eager", "enforce_eager", "<0.10.2", "set", False, False, 0.3,
       _GEN_EAGER),
    _K("openrlhf", "rollout_bound", "eager", "vllm.enforce_eager", ">=0.10.2", "set", False,
       False, 0.3, _GEN_EAGER),
    _K("openrlhf", "rollout_bound", "tp", "vllm_tensor_parallel_size", "<0.10.2", "divide", 2, 1,
       0.2, _GEN_TP),
    _K("openrlhf", "rollout_bound", "tp", "vllm.tensor_parallel_size", ">=0.10.2", "divide", 2,
       1, 0.2, _GEN_TP),
    _K("openrlhf", "rollout_bound", "prefix_cache", "enable_prefix_caching", "<0.10.2",
       "set_when_sampled", True, False, 0.15, _GEN_PREFIX),
    _K("openrlhf", "rollout_bound", "prefix_cache", "vllm.enable_prefix_caching", ">=0.10.2",
       "set_when_sampled", True, False, 0.15, _GEN_PREFIX),
    _K("openrlhf", "update_bound", "micro_batch", "micro_train_batch_size", "<0.10.2",
       "multiply", 2, 8, 0.3, _UPD_MICRO),
    _K("openrlhf", "update_bound", "micro_batch", "train.micro_batch_size", ">=0.10.2",
       "multiply", 2, 8, 0.3, _UPD_MICRO),
    _K("openrlhf", "update_bound", "packing", "packing_samples", ">=0.5,<0.10.2", "set", True,
       False, 0.3,
       "{knob}={current}: pad tokens are computed and count for nothing; {suggested} packs "
       "sequences without padding."),
    _K("openrlhf", "update_bound", "packing", "ds.packing_samples", ">=0.10.2", "set", True,
       False, 0.3,
       "{knob}={current}: pad tokens are computed and count for nothing; {suggested} packs "
       "sequences without padding."),
    _K("openrlhf", "update_bound", "adam_offload", "adam_offload", "<0.10.2", "set", False, False,
       0.3, _UPD_OFFLOAD),
    _K("openrlhf", "update_bound", "adam_offload", "ds.adam_offload", ">=0.10.2", "set", False,
       False, 0.3, _UPD_OFFLOAD),
)  # fmt: skip
"""The knob catalogue's rows for this framework (see `gpuprof.analyzers.knobs`)."""


SIM_PHASE_NAMES: dict[str, str] = {
    "dataload": "dataloader",
    "rollout": "make_experience",
    "reward": "compute_reward",
    "old_logprob": "compute_log_prob",
    "ref_logprob": "compute_ref_log_prob",
    "values": "compute_values",
    "advantage": "compute_advantage",
    "update_actor": "ppo_train",
    "update_critic": "critic_train",
    "reshard": "broadcast_to_vllm",
    "checkpoint": "save_checkpoint",
    "eval": "evaluate",
}
"""Canonical phase → the name the simulator gives its spans, as this framework's timers do."""


SIM_FLAGS: dict[str, str] = {
    "gpu_memory_utilization": "vllm.gpu_memory_utilization",
    "tensor_parallel_size": "vllm.tensor_parallel_size",
    "train_batch_size": "rollout.batch_size",
    "num_generations": "rollout.n_samples_per_prompt",
    "max_response_length": "rollout.max_new_tokens",
    "optimizer_offload": "ds.adam_offload",
    "use_dynamic_bsz": "train.dynamic_batch_enable",
    "micro_batch_size_per_gpu": "train.micro_batch_size",
    "save_freq": "ckpt.save_steps",
    "test_freq": "eval.steps",
    "colocate": "train.colocate_all",
    "async_generate": "train.async_enable",
}
"""The simulator's generic settings → this framework's flag."""


SIM_ENTRY: tuple[str, ...] = ("python3", "-m", "openrlhf.cli.train_ppo_ray")
"""The start of the launch command the simulator writes."""


LOG_PHASES: dict[str, str] = {
    "generation": "rollout",
    "make_experience": "make_experience",
    "ppo_train": "update_actor",
    "broadcast": "reshard",
}
"""OpenRLHF's ``timing/<name>`` phases → canonical phase, in the order a step runs them.
``make_experience`` (log-probs, rewards, values, advantages together) has no single canonical
phase and keeps its own name."""


LOG_GLOBAL_STEP = re.compile(r"Global step (\d+):\s*(\{.*\})\s*$")


LOG_LAUNCH = re.compile(r"(?:-m\s+|/)openrlhf[./]cli[./]\w+")


LOG_TIMING_KEY = re.compile(r"^timing/(.+)$")


METHODS: dict[str, list[tuple[str, str, str]]] = {
    "openrlhf.trainer.ppo_utils.samples_generator": [
        ("SamplesGenerator", "generate_samples", "rollout"),
    ],
    "openrlhf.trainer.ppo_utils.experience_maker": [
        ("RemoteExperienceMaker", "make_experience_batch", "make_experience"),
        ("RemoteExperienceMaker", "make_experience", "make_experience"),
        ("RemoteExperienceMaker", "make_experience_list", "rollout"),
        ("RemoteExperienceMaker", "compute_advantages_and_returns", "advantage"),
    ],
    "openrlhf.trainer.ppo_trainer": [
        ("BasePPOTrainer", "ppo_train", "update_actor"),
        ("BasePPOTrainer", "broadcast_to_vllm", "reshard"),
        ("BasePPOTrainer", "save_logs_and_checkpoints", "checkpoint"),
        ("PPOTrainer", "ppo_train", "update_actor"),
        ("PPOTrainer", "_broadcast_to_vllm", "reshard"),
        ("PPOTrainer", "evaluate", "eval"),
        ("PPOTrainer", "save_logs_and_checkpoints", "checkpoint"),
    ],
    "openrlhf.trainer.ray.ppo_actor": [
        ("ActorPPOTrainer", "ppo_train", "update_actor"),
        ("ActorPPOTrainer", "broadcast_to_vllm", "reshard"),
        ("ActorPPOTrainer", "_broadcast_to_vllm", "reshard"),
        ("PolicyModelActor", "forward", "old_logprob"),
    ],
    "openrlhf.trainer.ray.ppo_critic": [
        ("CriticPPOTrainer", "ppo_train", "update_critic"),
        ("CriticModelActor", "forward", "values"),
    ],
    "openrlhf.trainer.ray.launcher": [
        ("ReferenceModelActor", "forward", "ref_logprob"),
        ("RewardModelActor", "forward", "reward"),
    ],
}
"""Module → (class, method, canonical phase) wrapped when the module is imported."""
