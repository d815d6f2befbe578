"""Canonical phase names and the aliases frameworks use for them.

Spans keep the name they were given (``Span.name``) and carry the canonical one
(``Span.phase``); unknown names are kept as they are.
"""

from __future__ import annotations

INHERIT = "<inherit>"
"""Phase-map value: the span takes the canonical phase of the framework span around it."""

CANONICAL_PHASES: tuple[str, ...] = (
    "rollout",
    "reward",
    "ref_logprob",
    "old_logprob",
    "values",
    "advantage",
    "reshard",
    "update_actor",
    "update_critic",
    "dataload",
    "checkpoint",
    "eval",
    "step",
)

_ALIASES: dict[str, str] = {
    "gen": "rollout",
    "generate": "rollout",
    "generation": "rollout",
    "generate_sequences": "rollout",
    "vllm.generate": "rollout",
    "make_experience": "rollout",
    "gen_max": "rollout",
    "rewards": "reward",
    "_calculate_rewards": "reward",
    "calculate_rewards": "reward",
    "compute_rm_score": "reward",
    "compute_reward": "reward",
    "reward_model": "reward",
    "ref": "ref_logprob",
    "ref_log_prob": "ref_logprob",
    "compute_ref_log_prob": "ref_logprob",
    "old_log_prob": "old_logprob",
    "compute_log_prob": "old_logprob",
    "value": "values",
    "compute_values": "values",
    "adv": "advantage",
    "compute_advantage": "advantage",
    "update_weights": "reshard",
    "sync_weights": "reshard",
    "_move_model_to_vllm": "reshard",
    "move_model_to_vllm": "reshard",
    "broadcast_to_vllm": "reshard",
    "load_weights": "reshard",
    "wake_up": "reshard",
    "sleep": "reshard",
    "weight_sync": "reshard",
    "broadcast": "reshard",
    "update_policy": "update_actor",
    # PyTorch profiler ranges: Optimizer.step#AdamW.step (named optimizer.step on import) and
    # the "## optimizer ##" region training loops mark around it
    "optimizer.step": "update_actor",
    "optimizer_step": "update_actor",
    "optimizer": "update_actor",
    "actor_update": "update_actor",
    "ppo_train": "update_actor",
    "critic_update": "update_critic",
    "data": "dataload",
    "data_loading": "dataload",
    "data_load": "dataload",
    "dataloader": "dataload",
    "save_checkpoint": "checkpoint",
    "testing": "eval",
    "evaluate": "eval",
    "validate": "eval",
}


def canonical_phase(name: str) -> str:
    """The canonical phase for a framework's name; unknown names come back unchanged."""
    if name in CANONICAL_PHASES:
        return name
    return _ALIASES.get(name, _ALIASES.get(name.lower(), name))
