"""verl: its timer names (integration) and log keys and patterns (importer), its rows of
the knob catalogue, and how the simulator spells its settings: one place for the names the
importer, the integration, the recommender and the simulator share."""

from __future__ import annotations

import re
from dataclasses import replace

from gpuprof.frameworks._knob import (
    _AR,
    _DYN,
    _EVAL,
    _GEN_EAGER,
    _GEN_GMU,
    _GEN_PREFIX,
    _GEN_SEQS,
    _GEN_TP,
    _GMU,
    _K,
    _LEN,
    _OFFLOAD,
    _SAVE,
    _UNUSED,
    _UPD_EXPERTS,
    _UPD_MICRO,
    _UPD_OFFLOAD,
    _UPD_RECOMPUTE,
    _WORKERS,
    KnobEntry,
)

KNOBS: tuple[KnobEntry, ...] = (
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
    _K("verl", "rollout_bound", "gmu", f"{_AR}.rollout.gpu_memory_utilization", "",
       "memory_fraction", 0.85, 0.5, 0.5, _GEN_GMU),
    _K("verl", "rollout_bound", "eager", f"{_AR}.rollout.enforce_eager", "", "set", False, True,
       0.3, _GEN_EAGER),
    _K("verl", "rollout_bound", "tp", f"{_AR}.rollout.tensor_model_parallel_size", "", "divide",
       2, 2, 0.3, _GEN_TP),
    _K("verl", "rollout_bound", "max_seqs", f"{_AR}.rollout.max_num_seqs", "", "multiply", 2,
       1024, 0.2, _GEN_SEQS),
    _K("verl", "rollout_bound", "max_batched_tokens", f"{_AR}.rollout.max_num_batched_tokens",
       "", "multiply", 2, 8192, 0.2,
       "{knob}={current}: the engine schedules at most this many tokens per iteration; "
       "{suggested} admits more sequences per iteration."),
    _K("verl", "rollout_bound", "prefix_cache", f"{_AR}.rollout.enable_prefix_caching", "",
       "set_when_sampled", True, True, 0.15, _GEN_PREFIX),
    _K("verl", "update_bound", "expert_parallel",
       f"{_AR}.actor.megatron.expert_model_parallel_size", "", "expert_parallel", 8, 1, 0.3,
       _UPD_EXPERTS),
    _K("verl", "update_bound", "micro_batch", f"{_AR}.actor.ppo_micro_batch_size_per_gpu", "",
       "multiply", 4, None, 0.3, _UPD_MICRO),
    _K("verl", "update_bound", "param_offload", f"{_AR}.actor.fsdp_config.param_offload", "",
       "set", False, False, 0.4, _UPD_OFFLOAD),
    _K("verl", "update_bound", "optimizer_offload", f"{_AR}.actor.fsdp_config.optimizer_offload",
       "", "set", False, False, 0.3, _UPD_OFFLOAD),
    _K("verl", "update_bound", "recompute", f"{_AR}.model.enable_gradient_checkpointing", "",
       "set", False, True, 0.2, _UPD_RECOMPUTE),
    _K("verl", "update_bound", "ulysses", f"{_AR}.actor.ulysses_sequence_parallel_size", "",
       "multiply", 2, 1, 0.15,
       "{knob}={current}: every sequence stays on one GPU, so long sequences force tiny "
       "micro-batches; {suggested} splits each sequence over GPUs (for sequences of 8k tokens "
       "and more)."),
    _K("verl", "update_bound", "dynamic_batch", f"{_AR}.actor.use_dynamic_bsz", ">=0.3", "set",
       True, False, 0.4,
       "{knob}={current}: micro-batches padded to a fixed sequence count do few model FLOPs "
       "per kernel; {suggested} packs them to a token budget (set ppo_max_token_len_per_gpu)."),
    _K("verl", "update_bound", "remove_padding", f"{_AR}.model.use_remove_padding", ">=0.3", "set",
       True, False, 0.3,
       "{knob}={current}: pad tokens are computed and count for nothing; {suggested} runs the "
       "update on packed sequences."),
    _K("verl", "unused_gpu", "gpus", "trainer.n_gpus_per_node", "", "gpus_per_host", 8, 8, 0.9,
       _UNUSED),
)  # fmt: skip

# the update_bound rows above tune the actor's update; the critic's, in its own words, follow.
# Spellings by release, checked against verl's tags (v0.2 … v0.9.0) and 0.9.1 as installed:
# from v0.8.0 the critic's FSDP settings moved from critic.model.fsdp_config.* to critic.fsdp.*
# (the old spelling is rejected), and critic.ppo_micro_batch_size_per_gpu, use_dynamic_bsz
# and ulysses_sequence_parallel_size are accepted but never reach the critic's engine, which
# always packs micro-batches to critic.ppo_max_token_len_per_gpu.
_CRITIC_MICRO = (
    "{knob}={current}: the critic trains on micro-batches that leave its matrix multiplies "
    "thin; {suggested} does more model FLOPs per kernel (lower it again on OOM)."
)
_CRITIC_TOKENS = (
    "{knob}={current}: the critic packs each micro-batch to that many tokens per GPU; "
    "{suggested} gives each kernel more tokens (lower it again on OOM)."
)
_CRITIC_DYN = (
    "{knob}={current}: the critic's micro-batches are padded to a fixed sequence count; "
    "{suggested} packs them to a token budget (critic.ppo_max_token_len_per_gpu)."
)
_CRITIC_OFFLOAD = (
    "{knob}={current}: the critic update waits on copies over PCIe every step; {suggested} "
    "keeps the critic's state on the GPU when memory allows."
)
_CRITIC_RECOMPUTE = (
    "{knob}={current}: the critic's backward recomputes every layer's forward (about a third "
    "more work); {suggested} keeps the activations when memory allows."
)
_CRITIC_ROWS: tuple[KnobEntry, ...] = (
    _K("verl", "update_bound", "critic_micro_batch", "critic.ppo_micro_batch_size_per_gpu",
       ">=0.2,<0.8", "multiply", 4, None, 0.3, _CRITIC_MICRO, "update_critic"),
    _K("verl", "update_bound", "critic_token_budget", "critic.ppo_max_token_len_per_gpu", "",
       "multiply", 2, 32768, 0.3, _CRITIC_TOKENS, "update_critic"),
    _K("verl", "update_bound", "critic_dynamic_batch", "critic.use_dynamic_bsz", ">=0.2,<0.8",
       "set", True, False, 0.4, _CRITIC_DYN, "update_critic"),
    _K("verl", "update_bound", "critic_param_offload", "critic.model.fsdp_config.param_offload",
       "<0.8", "set", False, False, 0.4, _CRITIC_OFFLOAD, "update_critic"),
    _K("verl", "update_bound", "critic_param_offload", "critic.fsdp.param_offload", ">=0.8",
       "set", False, False, 0.4, _CRITIC_OFFLOAD, "update_critic"),
    _K("verl", "update_bound", "critic_optimizer_offload",
       "critic.model.fsdp_config.optimizer_offload", "<0.8", "set", False, False, 0.3,
       _CRITIC_OFFLOAD, "update_critic"),
    _K("verl", "update_bound", "critic_optimizer_offload", "critic.fsdp.optimizer_offload",
       ">=0.8", "set", False, False, 0.3, _CRITIC_OFFLOAD, "update_critic"),
    _K("verl", "update_bound", "critic_recompute", "critic.model.enable_gradient_checkpointing",
       "", "set", False, True, 0.2, _CRITIC_RECOMPUTE, "update_critic"),
    _K("verl", "update_bound", "critic_remove_padding", "critic.model.use_remove_padding",
       ">=0.2,<0.8", "set", True, False, 0.3,
       "{knob}={current}: the critic computes pad tokens that count for nothing; {suggested} "
       "trains it on packed sequences.", "update_critic"),
)  # fmt: skip

KNOBS = (
    tuple(
        replace(row, phase="update_actor") if row.kind == "update_bound" else row for row in KNOBS
    )
    + _CRITIC_ROWS
)
"""The knob catalogue's rows for this framework (see `gpuprof.analyzers.knobs`)."""


SIM_PHASE_NAMES: dict[str, str] = {
    "dataload": "data",
    "rollout": "gen",
    "reward": "reward",
    "old_logprob": "old_log_prob",
    "ref_logprob": "ref",
    "values": "values",
    "advantage": "adv",
    "update_actor": "update_actor",
    "update_critic": "update_critic",
    "reshard": "update_weights",
    "checkpoint": "save_checkpoint",
    "eval": "testing",
}
"""Canonical phase → the name the simulator gives its spans, as this framework's timers do."""


SIM_FLAGS: dict[str, str] = {
    "gpu_memory_utilization": "actor_rollout_ref.rollout.gpu_memory_utilization",
    "tensor_parallel_size": "actor_rollout_ref.rollout.tensor_model_parallel_size",
    "train_batch_size": "data.train_batch_size",
    "num_generations": "actor_rollout_ref.rollout.n",
    "max_response_length": "data.max_response_length",
    "dataloader_num_workers": "data.dataloader_num_workers",
    "param_offload": "actor_rollout_ref.actor.fsdp_config.param_offload",
    "optimizer_offload": "actor_rollout_ref.actor.fsdp_config.optimizer_offload",
    "update_weights_bucket_megabytes": (
        "actor_rollout_ref.rollout.checkpoint_engine.update_weights_bucket_megabytes"
    ),
    "use_dynamic_bsz": "actor_rollout_ref.actor.use_dynamic_bsz",
    "micro_batch_size_per_gpu": "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu",
    "reward_manager": "reward_model.reward_manager",
    "save_freq": "trainer.save_freq",
    "test_freq": "trainer.test_freq",
    "fsdp_size": "actor_rollout_ref.actor.fsdp_config.fsdp_size",
}
"""The simulator's generic settings → this framework's flag."""


SIM_ENTRY: tuple[str, ...] = ("python3", "-m", "verl.trainer.main_ppo")
"""The start of the launch command the simulator writes."""


LOG_PHASES: dict[str, str] = {
    "gen": "rollout",
    "gen_max": "rollout",
    "reward": "reward",
    "old_log_prob": "old_logprob",
    "ref": "ref_logprob",
    "values": "values",
    "adv": "advantage",
    "update_critic": "update_critic",
    "update_actor": "update_actor",
    "update_weights": "reshard",
    "sync": "reshard",
    "dump_rollout_generations": "dump_rollout_generations",
    "testing": "eval",
    "save_checkpoint": "checkpoint",
}
"""verl's ``marked_timer`` names of top-level step phases → canonical phase, in the order
``RayPPOTrainer.fit`` runs them. Other ``timing_s/…`` keys (``generate_sequences``,
``generation_timing/max``, ``agent_loop/…``, ``start_profile``) time parts of these phases or
bookkeeping; they are kept on the step span's attrs under ``sub_timing_s``, not laid out."""


LOG_STEP_AT = re.compile(r"(?:^|\s)step:(\d+)\s+-\s")


LOG_TIMING_KEY = re.compile(r"^timing(?:_s)?/(.+)$")


LOG_LAUNCH = re.compile(
    r"(?:^|[\s/])(?:python[\d.]*|torchrun|accelerate|ray\s+job\s+submit.*?--)\s.*?"
    r"(?:-m\s+)?(?:verl|recipe)\.[\w.]*main\w*"
)


SUB_TIMER_PHASES: dict[str, str] = {
    "generate_sequences": "rollout",
    "rm": "reward",
    "sync_rollout_weights": "reshard",
}
"""verl timers that run inside a step phase above (the rollout worker's generation, the reward
model's pass, the rollout side of a weight sync): the integration records them as nested spans;
the log importer keeps them under ``sub_timing_s``."""

LOG_NESTED: frozenset[str] = frozenset(
    {*SUB_TIMER_PHASES, "reshard", "start_profile", "stop_profile"}
)
"""``timing_s/<name>`` keys without a ``/`` that are no step phase of their own: timers inside
one (the rollout worker's ``generate_sequences`` and ``reshard`` run inside ``gen``) and the
profiler's bookkeeping. The log importer keeps them under ``sub_timing_s``; any other unknown
top-level key (a recipe's own timer, ``get_batch_rollout_with_filtering``) is a phase."""

TIMER_PHASES: dict[str, str] = {**LOG_PHASES, **SUB_TIMER_PHASES}
"""Every verl timer name the integration maps (other names go through `gpuprof.phases`)."""
