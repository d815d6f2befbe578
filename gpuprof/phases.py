"""Canonical phase names and the aliases frameworks use for them.

Spans keep the name they were given (``Span.name``) and carry the canonical one
(``Span.phase``); unknown names are kept as they are.
"""

from __future__ import annotations

import functools
import re

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


_SPECIFIC_WORDS: tuple[tuple[str, str], ...] = (
        (r"update_?weight|sync_?weight|weight_?sync|reshard|broadcast|load_?weight|wake_?up",
         "reshard"),
        (r"rollout|generat|(^|[_/])gen($|[_/])|sampling", "rollout"),
        (r"reward|(^|_)rm($|_)|score", "reward"),
        (r"(^|_)ref($|_)|ref_?log", "ref_logprob"),
        (r"old_?log_?prob|old_?logp", "old_logprob"),
        (r"(^|_)values?($|_)", "values"),
        (r"(^|_)adv(antage)?s?($|_)", "advantage"),
        (r"critic", "update_critic"),
        (r"update_?actor|actor_?update|update_?policy|policy_?(train|update)", "update_actor"),
        (r"checkpoint|(^|_)save", "checkpoint"),
        (r"(^|_)(eval|valid|test)", "eval"),
        (r"data_?load|dataloader|load_?data", "dataload"),
        (r"all_?reduce|all_?gather|reduce_?scatter|all_?to_?all|nccl|(^|_)comm($|_|unication)",
         "collective"),
    )  # fmt: skip
_GENERIC_WORDS: tuple[tuple[str, str], ...] = (
    (r"train|update|optim|(^|_)(fwd|bwd|forward|backward)($|_)", "update_actor"),
    (r"log_?prob|logp", "old_logprob"),
)
_NO_GUESS_WORDS = r"^(misc|other|rest|total|overhead)\b"


@functools.cache
def _patterns() -> tuple[re.Pattern[str], tuple[tuple[tuple[re.Pattern[str], str], ...], ...]]:
    """The name patterns, compiled at first use: the hooks import this module in every
    training process, where only `canonical_phase` is used."""
    tables = tuple(
        tuple((re.compile(pattern), phase) for pattern, phase in words)
        for words in (_SPECIFIC_WORDS, _GENERIC_WORDS)
    )
    return re.compile(_NO_GUESS_WORDS), tables


def phase_from_name(name: str) -> str | None:
    """The canonical phase a timer name not known to any framework says it is, or None.

    For framework logs only: an unknown ``timing_s/<name>`` key is a phase of its own, and its
    name often says what it times (``get_batch_rollout_with_filtering`` → ``rollout``,
    ``policy_train`` → ``update_actor``, ``save_checkpoints`` → ``checkpoint``). A name that
    points at two phases (``fwd_logprobs_values_reward``) or at none gets None: it keeps its
    own name rather than a wrong one. Specific words (rollout, reward, ref, critic…) are tried
    before generic ones (train, update, fwd/bwd).
    """
    known = canonical_phase(name)
    if known != name or name in CANONICAL_PHASES:
        return known
    lowered = name.lower().strip()
    no_guess, tables = _patterns()
    if no_guess.match(lowered):
        return None
    for table in tables:
        found = {phase for pattern, phase in table if pattern.search(lowered)}
        if len(found) == 1:
            return found.pop()
        if found:
            return None
    return None
