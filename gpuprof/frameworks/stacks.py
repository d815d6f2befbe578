"""The RL stacks gpuprof reads from their printed or dumped per-step timings alone (no patch, no
reader of their own): how each names its timers, which timer nests in which, which key is the
whole step, and how to tell its output apart.

The tolerant step-timings reader (`gpuprof.collectors.importers.step_timings`) reads any of
them; a stack recognised here lends it its vocabulary (phase names, nesting, launch command),
so that a name the generic word rules would guess wrong (slime's ``train_wait``, DeepSpeed-
Chat's ``gather``) gets the stack's meaning. verl, TRL, ms-swift and OpenRLHF keep their own
modules beside this one (their knobs and integrations live there).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from gpuprof.frameworks import verl


@dataclass(frozen=True)
class Stack:
    """One RL stack's timing vocabulary.

    ``phases``: timer name (the key with its timing prefix and ``_time``/``latency`` suffix
    removed, lower case) → canonical phase. ``parents``: timer → the timer it runs inside
    (its time is part of the parent's, never added to it). ``totals``: timers that are the
    whole step. ``after``: timers the stack runs after its step timer stopped (validation,
    checkpointing outside ``total_step_time``). ``ignore``: timers under a timing prefix that
    are no phase of the step (an elapsed clock, a wait already counted elsewhere).
    ``signature``: a pattern over a file's text that names the stack. ``launch``: its launch
    command in a log (for knobs). ``step_header``: a line that opens one step's block, its
    number in group 1. ``order``: the order the stack runs its timers in a step, for laying
    out a record that prints them in another (NeMo-RL's ``Timing:`` block sorts them by
    time); timers it does not list keep their place after the listed ones.
    """

    name: str
    signature: re.Pattern[str]
    phases: dict[str, str] = field(default_factory=dict)
    parents: dict[str, str] = field(default_factory=dict)
    totals: frozenset[str] = frozenset()
    after: frozenset[str] = frozenset()
    ignore: frozenset[str] = frozenset()
    launch: re.Pattern[str] | None = None
    step_header: re.Pattern[str] | None = None
    order: tuple[str, ...] = ()
    total_lags: bool = False
    """The step total a record carries is the previous step's (ROLL's ``time/step_total``)."""
    """The order the stack runs its timers in a step, for laying out a record that prints
    them in another (NeMo-RL's ``Timing:`` block sorts them by time); unknown ones follow."""


NEMO_RL = Stack(
    name="nemo-rl",
    signature=re.compile(
        r"timing/train/|policy_and_reference_logprobs|nemo_rl[./]|examples/run_grpo|"
        r"prepare_for_generation"
    ),
    phases={
        "generation": "rollout",
        "prepare_for_generation": "reshard",
        "transfer_and_update_weights": "reshard",
        "data_processing": "dataload",
        "reward_calculation": "reward",
        "policy_and_reference_logprobs": "ref_logprob",
        "policy_training": "update_actor",
        "training_prep": "update_actor",
        "checkpointing": "checkpoint",
        "validation": "eval",
        "total_validation": "eval",
        "logprob_inference_prep": "old_logprob",
        "compute_advantages": "advantage",
        "advantage_calculation": "advantage",
    },
    parents={
        "transfer_and_update_weights": "prepare_for_generation",
        "get_logprobs": "policy_and_reference_logprobs",
        "get_reference_policy_logprobs": "policy_and_reference_logprobs",
    },
    totals=frozenset({"total_step", "total_step_time"}),
    launch=re.compile(r"(?:examples/run_\w+\.py|nemo_rl\.\w+)"),
    order=(
        "data_processing",
        "prepare_for_generation",
        "weight_sync",
        "idle",
        "buffer_sampling",
        "generation",
        "exposed_generation",
        "reward_calculation",
        "dynamic_sampling",
        "logprob_inference_prep",
        "teacher_logprob_inference_prep",
        "policy_and_reference_logprobs",
        "teacher_logprob_inference",
        "advantage_calculation",
        "training_prep",
        "policy_training",
        "recompute_kv_scales",
        "validation",
        "total_validation",
        "checkpointing",
    ),
)
"""NVIDIA NeMo-RL: ``timing/train/<timer>`` in its metric dumps and W&B logs, and the
``Timing:`` block it prints after each step (every timer but the total, largest first, nested
ones as lines of their own); ``prepare_for_generation/total`` holds
``transfer_and_update_weights``, ``policy_and_reference_logprobs`` the ``get_logprobs/*``
timers; validation (``timing/validation/total_validation_time``, the ``Validation Timing:``
block) and checkpointing run inside ``total_step_time``."""

SLIME = Stack(
    name="slime",
    signature=re.compile(
        r"perf/(?:rollout|train_wait|update_weights|actor_train|wake_up|step|total_train)_time|"
        r"\bslime[./]|train_async\.py"
    ),
    phases={
        "rollout": "rollout",
        "train_wait": "rollout",
        "train": "update_actor",
        "actor_train": "update_actor",
        "critic_train": "update_critic",
        "log_probs": "old_logprob",
        "ref_log_probs": "ref_logprob",
        "update_weights": "reshard",
        "sleep": "reshard",
        "wake_up": "reshard",
        "data_preprocess": "dataload",
        "save_model": "checkpoint",
        "eval": "eval",
    },
    parents={
        "rollout": "train_wait",
        "sleep": "train_wait",
        "update_weights": "train_wait",
        "wake_up": "train_wait",
        "data_preprocess": "train_wait",
        "save_model": "train_wait",
        "actor_train": "train",
        "critic_train": "train",
        "log_probs": "train",
        "ref_log_probs": "train",
        "cp_seq_kl_prep": "train",
    },
    totals=frozenset({"step", "total_train"}),
    order=("train_wait", "rollout", "train"),
    launch=re.compile(r"\btrain(?:_async)?\.py\b"),
    step_header=re.compile(r"\b(?:perf|rollout)\s+(\d+)\s*:"),
)
"""THUDM slime: ``perf N: {'perf/<timer>_time': …}`` per rollout id, from the trainer
(``train_metric_utils``) and from the rollout manager (``perf/rollout_time`` and throughputs).
A step is ``train_wait`` + ``train`` (``perf/step_time``; ``total_train_time`` before its
rename): while the trainer waits for the rollout, the engine sleeps, takes the new weights
and wakes up (``sleep``, ``update_weights``, ``wake_up``, ``data_preprocess`` run inside
``train_wait``, and the rollout manager's ``rollout_time`` is what it waits for); the
log-prob passes and the actor's training run inside ``train``."""

AREAL = Stack(
    name="areal",
    signature=re.compile(r"timeperf/|\bareal[./]|realhf[./]"),
    phases={
        "rollout": "rollout",
        "generate": "rollout",
        "recompute_logp": "old_logprob",
        "ref_logp": "ref_logprob",
        "compute_advantage": "advantage",
        "train_step": "update_actor",
        "ppo_update": "update_actor",
        "update_weights": "reshard",
        "save": "checkpoint",
        "checkpoint_for_recover": "checkpoint",
        "eval": "eval",
        "clear_batches": "dataload",
    },
    totals=frozenset({"e2e", "step", "total"}),
    order=(
        "rollout",
        "generate",
        "recompute_logp",
        "ref_logp",
        "compute_advantage",
        "train_step",
        "ppo_update",
        "update_weights",
        "save",
        "checkpoint_for_recover",
        "eval",
        "clear_batches",
    ),
    launch=re.compile(r"areal\.launcher\.\w+|examples/\S*gsm8k\S*\.py"),
    step_header=re.compile(r"\bTrain step (\d+)(?:/\d+)? done"),
)
"""inclusionAI AReaL: ``timeperf/<timer>`` in the stats table its ``StatsLogger`` prints
after ``Epoch e/E Step s/S Train step N/M done.`` (``tabulate``'s ``fancy_grid``, several
key/value column pairs side by side); the timers run one after another in the step. With
asynchronous rollout, ``timeperf/rollout`` is the exposed wait for a ready batch, not the
generation time."""

ROLL = Stack(
    name="roll",
    signature=re.compile(
        r"time/step_(?:generate|train|model_update|total)|time/(?:ref|old)_log_probs|"
        r"\broll[./]pipeline"
    ),
    phases={
        "step_stop_server": "reshard",
        "step_model_update": "reshard",
        "val_step": "eval",
        "step_generate": "rollout",
        "ref_log_probs_values": "ref_logprob",
        "old_log_probs": "old_logprob",
        "get_sample_level_mask": "reward",
        "reward_postprocess": "reward",
        "get_token_reward": "reward",
        "compute_advantage": "advantage",
        "step_train": "update_actor",
        "do_checkpoint": "checkpoint",
        "actor_train": "update_actor",
        "actor_infer": "rollout",
        "reference": "ref_logprob",
        "critic": "update_critic",
    },
    parents={
        "actor_train": "step_train",
        "critic": "step_train",
        "actor_infer": "step_generate",
        "reference": "ref_log_probs_values",
    },
    totals=frozenset({"step_total"}),
    order=(
        "step_stop_server",
        "step_model_update",
        "val_step",
        "step_generate",
        "ref_log_probs_values",
        "old_log_probs",
        "get_sample_level_mask",
        "reward_postprocess",
        "get_token_reward",
        "compute_advantage",
        "step_train",
    ),
    total_lags=True,
    launch=re.compile(r"examples/start_\w+\.py|roll\.pipeline"),
)
"""Alibaba ROLL (RLVR pipeline): ``time/<timer>`` per step from the driver, in loop order
(``step_model_update``, ``val_step``, ``step_generate``, ``ref_log_probs_values``,
``old_log_probs``, per-domain ``<domain>/time/…`` post-processing, ``step_train``); the
workers' ``time/<cluster>/<func>/{total,onload,execute,offload}`` sit inside the driver's
timers. ``time/step_total`` is logged one step late: the value at step N is step N-1's (0 at
step 0)."""

DEEPSPEED_CHAT = Stack(
    name="deepspeed-chat",
    signature=re.compile(
        r"E2E latency=|Gather latency=|Generate time=|step3_rlhf|End-to-End\s*=>\s*Latency"
    ),
    phases={
        "e2e": "step",
        "end-to-end": "step",
        "end_to_end": "step",
        "gather": "reshard",
        "generate": "rollout",
        "generation": "rollout",
        "training": "update_actor",
    },
    totals=frozenset({"e2e", "end-to-end", "end_to_end"}),
    ignore=frozenset({"others"}),
    launch=re.compile(r"step3_rlhf_finetuning/main\.py|\bmain\.py\b.*--actor_model_name_or_path"),
)
"""DeepSpeed-Chat step 3: DeepSpeed's hybrid engine prints ``|E2E latency=…s |Gather
latency=…s |Generate time=…s |Training time=…s |Others=…`` after each step line. ``Generate``
excludes the gathering of the actor's ZeRO-3 shards before it (``Gather``, which ``Others``
holds: Generate + Training + Others = E2E); ``Others`` is the rest of the step, what no phase
covers. DS-Chat's own ``End-to-End => Latency`` block is Generation + Training."""

DEEPSPEED_PIPE = Stack(
    name="deepspeed-pipeline",
    signature=re.compile(r"time \(ms\)\s*\|\s*(?:batch_input|train_batch|pipe_send|comms)"),
    phases={
        "train_batch": "step",
        "batch_input": "dataload",
        "forward_microstep": "update_actor",
        "backward_microstep": "update_actor",
        "backward_inner_microstep": "update_actor",
        "backward_allreduce_microstep": "collective",
        "step_microstep": "update_actor",
        "forward": "update_actor",
        "backward": "update_actor",
        "backward_inner": "update_actor",
        "backward_allreduce": "collective",
        "comms": "collective",
        "reduce_grads": "collective",
        "reduce_tied_grads": "collective",
        "pipe_send_output": "collective",
        "pipe_recv_grad": "collective",
        "pipe_send_grad": "collective",
        "pipe_recv_input": "collective",
        "step": "update_actor",
        "optimizer_step": "update_actor",
    },
    parents={
        "backward_inner": "backward",
        "backward_allreduce": "backward",
        "reduce_tied_grads": "comms",
        "reduce_grads": "comms",
        "step_clipping": "optimizer_step",
        "step_step": "optimizer_step",
        "step_zero_grad": "optimizer_step",
        "step_check_overflow": "optimizer_step",
    },
    totals=frozenset({"train_batch"}),
    ignore=frozenset(
        {
            "forward_microstep",
            "backward_microstep",
            "backward_inner_microstep",
            "backward_allreduce_microstep",
            "step_microstep",
        }
    ),
)
"""DeepSpeed's pipeline engine with ``wall_clock_breakdown`` (EleutherAI's DeeperSpeed adds
``comms``, ``reduce_grads``, ``train_batch``): ``time (ms) | train_batch: … | batch_input: … |
forward: … | backward: … | … | step: …``. ``train_batch`` is the whole step (DeeperSpeed reads
it after resetting it: 0 there), ``step`` the optimizer step; the ``*_microstep`` timers add up
the same work as the global ones (left out), ``backward`` holds ``backward_inner`` and
``backward_allreduce``, ``comms`` the gradient reductions, ``step`` its ``_step_*`` parts."""

LLAMA_FACTORY = Stack(
    name="llamafactory",
    signature=re.compile(r"llamafactory|llamafactory-cli|stage:\s*ppo|--stage\s+ppo"),
    phases={"generate": "rollout", "get_rewards": "reward", "ppo_step": "update_actor"},
    launch=re.compile(r"llamafactory-cli\s+train|src/train\.py"),
)
"""LLaMA-Factory's PPO stage (TRL's PPOTrainer underneath)."""

SKYRL = Stack(
    name="skyrl",
    signature=re.compile(r"\bskyrl[./]|skyrl_entrypoint"),
    phases={
        "generate": "rollout",
        "postprocess_generator_output": "reward",
        "convert_to_training_input": "dataload",
        "fwd_logprobs_values_reward": "ref_logprob",
        "compute_advantages_and_returns": "advantage",
        "train_critic_and_policy": "update_actor",
        "policy_train": "update_actor",
        "critic_train": "update_critic",
        "sync_weights": "reshard",
        "save_checkpoints": "checkpoint",
        "eval": "eval",
    },
    totals=frozenset({"step"}),
    launch=re.compile(r"skyrl(?:_train)?\.entrypoints\.\w+|main_base\.py"),
)
"""NovaSky SkyRL (the trainer marin's RL runs use): ``Started: '<timer>'`` / ``Finished:
'<timer>', time cost: Xs`` lines, nested as they open and close (``step`` around the phases,
``train_critic_and_policy`` around ``policy_train``); ``fwd_logprobs_values_reward`` is the
forward passes of the reference, the policy, the critic and the reward model."""

MARIN = Stack(
    name="marin",
    signature=re.compile(r"\bmarin\b|fwd_logprobs_values_reward|policy_train"),
    phases={
        "generate": "rollout",
        "policy_train": "update_actor",
        "fwd_logprobs_values_reward": "ref_logprob",
        "sync_weights": "reshard",
        "save_checkpoints": "checkpoint",
    },
)
"""marin's RL loop (``generate``, ``fwd_logprobs_values_reward``, ``policy_train``,
``sync_weights``)."""

VERL = Stack(
    name="verl",
    signature=re.compile(r"\bactor_rollout_ref\.|\bverl\.trainer\b|\bVeRL\b|\bverl\b"),
    phases=dict(verl.LOG_PHASES),
    totals=frozenset({"step", "total_step"}),
    after=frozenset({"testing", "save_checkpoint"}),
    launch=re.compile(r"\bactor_rollout_ref\.\S+=|(?:-m\s+)?(?:verl|recipe)\.[\w.]*main\w*"),
)
"""verl's timers as users re-type or re-log them (``timing/gen: 124.45s`` lines, a table):
what its console reader (`importers.verl_log`) does not take; its own names and launch keys."""

STACKS: tuple[Stack, ...] = (
    NEMO_RL, SLIME, AREAL, ROLL, DEEPSPEED_CHAT, DEEPSPEED_PIPE, LLAMA_FACTORY, SKYRL, MARIN,
    VERL,
)  # fmt: skip
"""Stacks in the order their signatures are tried (the most specific first)."""


def recognise(text: str) -> Stack | None:
    """The stack whose signature ``text`` carries first in `STACKS` order; None for none."""
    for stack in STACKS:
        if stack.signature.search(text):
            return stack
    return None
