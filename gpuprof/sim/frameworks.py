"""Each framework's vocabulary: its phase names, command line, and the knobs parsed from it.

Pathologies set generic settings (``gpu_memory_utilization`` 0.3, ``param_offload`` True…);
this module spells them with each framework's own flag names, so a simulated run's
``RunMeta.knobs`` looks like what the knob parser would read from a real command line.
"""

from __future__ import annotations

from typing import Any

PHASE_NAMES: dict[str, dict[str, str]] = {
    "verl": {
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
    },
    "trl": {
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
    },
    "swift": {
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
    },
    "openrlhf": {
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
    },
}
"""Framework -> canonical phase -> the name its own timers/profiling contexts use."""

# generic setting -> framework -> flag name as the framework spells it (None: no such flag)
FLAGS: dict[str, dict[str, str]] = {
    "gpu_memory_utilization": {
        "verl": "actor_rollout_ref.rollout.gpu_memory_utilization",
        "trl": "vllm_gpu_memory_utilization",
        "swift": "vllm_gpu_memory_utilization",
        "openrlhf": "vllm.gpu_memory_utilization",
    },
    "tensor_parallel_size": {
        "verl": "actor_rollout_ref.rollout.tensor_model_parallel_size",
        "trl": "vllm_tensor_parallel_size",
        "swift": "vllm_tensor_parallel_size",
        "openrlhf": "vllm.tensor_parallel_size",
    },
    "train_batch_size": {
        "verl": "data.train_batch_size",
        "trl": "per_device_train_batch_size",
        "swift": "per_device_train_batch_size",
        "openrlhf": "rollout.batch_size",
        "pytorch": "batch_size",
    },
    "num_generations": {
        "verl": "actor_rollout_ref.rollout.n",
        "trl": "num_generations",
        "swift": "num_generations",
        "openrlhf": "rollout.n_samples_per_prompt",
    },
    "max_response_length": {
        "verl": "data.max_response_length",
        "trl": "max_completion_length",
        "swift": "max_completion_length",
        "openrlhf": "rollout.max_new_tokens",
        "pytorch": "max_new_tokens",
    },
    "dataloader_num_workers": {
        "verl": "data.dataloader_num_workers",
        "trl": "dataloader_num_workers",
        "swift": "dataloader_num_workers",
        "pytorch": "num_workers",
    },
    "param_offload": {
        "verl": "actor_rollout_ref.actor.fsdp_config.param_offload",
        "swift": "offload_model",
    },
    "optimizer_offload": {
        "verl": "actor_rollout_ref.actor.fsdp_config.optimizer_offload",
        "swift": "offload_optimizer",
        "openrlhf": "ds.adam_offload",
    },
    "update_weights_bucket_megabytes": {
        "verl": "actor_rollout_ref.rollout.checkpoint_engine.update_weights_bucket_megabytes",
        "swift": "move_model_batches",
    },
    "ds3_gather_for_generation": {"trl": "ds3_gather_for_generation"},
    "use_dynamic_bsz": {
        "verl": "actor_rollout_ref.actor.use_dynamic_bsz",
        "openrlhf": "train.dynamic_batch_enable",
    },
    "micro_batch_size_per_gpu": {
        "verl": "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu",
        "trl": "gradient_accumulation_steps",
        "openrlhf": "train.micro_batch_size",
    },
    "reward_manager": {"verl": "reward_model.reward_manager"},
    "save_freq": {
        "verl": "trainer.save_freq",
        "trl": "save_steps",
        "swift": "save_steps",
        "openrlhf": "ckpt.save_steps",
        "pytorch": "save_every",
    },
    "test_freq": {
        "verl": "trainer.test_freq",
        "trl": "eval_steps",
        "swift": "eval_steps",
        "openrlhf": "eval.steps",
    },
    "colocate": {
        "trl": "vllm_mode",
        "swift": "vllm_mode",
        "openrlhf": "train.colocate_all",
    },
    "async_generate": {"swift": "async_generate", "openrlhf": "train.async_enable"},
    "fsdp_size": {"verl": "actor_rollout_ref.actor.fsdp_config.fsdp_size"},
}

_ENTRY: dict[str, list[str]] = {
    "verl": ["python3", "-m", "verl.trainer.main_ppo"],
    "trl": ["accelerate", "launch", "--config_file", "zero3.yaml", "grpo_train.py"],
    "swift": ["swift", "rlhf", "--rlhf_type", "grpo"],
    "openrlhf": ["python3", "-m", "openrlhf.cli.train_ppo_ray"],
    "pytorch": ["torchrun", "train_grpo.py"],
}


def _spelled(framework: str, generic: str, value: Any) -> Any:
    """The value as the framework's flag takes it (TRL/ms-swift ``vllm_mode`` is a word)."""
    if generic == "colocate" and framework in ("trl", "swift"):
        return "colocate" if value else "server"
    if generic == "micro_batch_size_per_gpu" and framework == "trl":
        # TRL has no micro-batch flag; a tiny micro batch shows as many accumulation steps
        return max(1, 16 // int(value))
    return value


def build_command(
    framework: str, settings: dict[str, Any], gpus: int, gpus_per_host: int, algorithm: str
) -> tuple[list[str], dict[str, Any]]:
    """The command line (argv) and the knobs parsed from it, keyed by the framework's flag names.

    ``settings`` maps generic names (keys of `FLAGS`) to values; settings the framework has
    no flag for are left out of both.
    """
    argv = list(_ENTRY[framework])
    knobs: dict[str, Any] = {}
    per_node = min(gpus, gpus_per_host)  # the launcher's processes per node
    if framework == "pytorch":
        argv.insert(1, f"--nproc_per_node={per_node}")
        knobs["nproc_per_node"] = per_node
    elif framework == "trl":
        argv[2:2] = ["--num_processes", str(per_node)]
        knobs["num_processes"] = per_node
    if framework == "verl":
        adv = "grpo" if algorithm == "grpo" else "gae"
        argv.append(f"algorithm.adv_estimator={adv}")
        argv.append(f"trainer.n_gpus_per_node={per_node}")
        knobs["trainer.n_gpus_per_node"] = per_node
        argv.append(f"trainer.nnodes={-(-gpus // gpus_per_host)}")
        argv.append("actor_rollout_ref.model.path=Qwen/Qwen2.5-3B-Instruct")
        knobs["algorithm.adv_estimator"] = adv
    elif framework in ("trl", "swift"):
        argv += ["--model", "Qwen/Qwen2.5-3B-Instruct", "--use_vllm", "true"]
        knobs["use_vllm"] = True
    elif framework == "openrlhf":
        argv += ["--actor.pretrain", "Qwen/Qwen2.5-3B-Instruct"]
        argv += ["--vllm.num_engines", str(max(1, gpus // 2))]
        knobs["vllm.num_engines"] = max(1, gpus // 2)
    for generic, value in settings.items():
        flag = FLAGS.get(generic, {}).get(framework)
        if flag is None or value is None:
            continue
        value = _spelled(framework, generic, value)
        knobs[flag] = value
        if framework == "verl":
            argv.append(f"{flag}={value}")
        elif isinstance(value, bool) and framework == "openrlhf":
            if value:  # OpenRLHF booleans are store_true switches
                argv.append(f"--{flag}")
        else:
            text = str(value).lower() if isinstance(value, bool) else str(value)
            argv += [f"--{flag}", text]
    return argv, knobs
