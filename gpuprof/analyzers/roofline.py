"""How far each busy phase is from what the hardware allows for the work it did.

Three measures, from the strongest to the one that needs nothing but the phase times:

- **MFU** of the compute phases (update, reference / old log-prob, values): model FLOPs over
  the GPUs' peak (`efficiency.figures`); needs the GPU model and the model's size.
- **Decode roofline** of generation: a decode iteration of an inference engine reads every
  weight once for the whole running batch, plus the KV cache of each running sequence, so a
  generated token costs ``weights / concurrency + context × KV bytes per token`` of memory
  traffic. `decode_roofline` sets the bytes and FLOPs of the rollout's tokens against the
  GPUs' HBM bandwidth and peak and gives the memory-bandwidth utilisation and the least time
  the hardware allows; needs the GPU model, the model's size and, for the KV term and the
  concurrency, its ``config.json`` and the batch settings.
- **Cross-phase ratios** that need no GPU: the seconds per token of the update (per PPO epoch)
  and of generation, each over the seconds per token of the fastest forward pass of the same
  step (reference or old log-prob: a prefill of the same batch on the same GPUs). A forward +
  backward costs 3 forwards (6N against 2N FLOPs per token), so an update per epoch near 3× a
  forward pass is healthy and tens of times one is not; public verl logs put a decoded token
  at 2.5–7.4 forward tokens (`Thresholds.gen_forward_ratio_healthy`). Where the framework logs
  its own per-token times (verl ``timing_per_token_ms/*``) they are kept beside the ratio.

Pure: no I/O.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np
import pandas as pd

from gpuprof.analyzers.grouping import appearance_codes, first_rows
from gpuprof.analyzers.hardware import GpuSpec
from gpuprof.analyzers.model_size import ModelSize
from gpuprof.analyzers.settings import num

__all__ = [
    "FORWARD_PHASES",
    "DecodeRoofline",
    "TokenRatios",
    "decode_roofline",
    "rollout_settings",
    "token_ratios",
]

FORWARD_PHASES: tuple[str, ...] = ("ref_logprob", "old_logprob")
"""Forward passes over the step's whole batch (prompt + response) with the actor's
architecture: the yardstick of the cross-phase ratios (``values`` runs the critic, which may
be another model)."""

TRAIN_OVER_FORWARD = 3.0
"""FLOPs of a forward + backward over a forward pass (6N / 2N per token)."""


# --------------------------------------------------------------------------------------------
# Cross-phase ratios


@dataclass(frozen=True)
class TokenRatios:
    """Per-token cost of the update and of generation against a forward pass of the same
    steps (medians over the steps that ran both).

    ``forward_phase``: the pass used (the faster per token of reference / old log-prob);
    ``update_per_epoch``: update seconds per trained token per PPO epoch over the forward's
    seconds per token (3 is the FLOP ratio); ``generation``: rollout seconds per generated
    token over the forward's seconds per token; ``epochs``: PPO epochs assumed;
    ``steps``: steps the medians are over; ``source``: where the token counts came from.
    """

    forward_phase: str | None
    update_per_epoch: float | None
    generation: float | None
    epochs: float
    steps: int
    source: str

    def to_dict(self) -> dict[str, Any]:
        return {k: (round(v, 3) if isinstance(v, float) else v) for k, v in asdict(self).items()}


def _epochs(settings: Mapping[str, Any]) -> float:
    for knob in ("actor_rollout_ref.actor.ppo_epochs", "num_iterations", "max_epochs",
                 "train.max_epochs"):  # fmt: skip
        value = num(settings.get(knob))
        if value is not None and value > 0:
            return value
    return 1.0


def token_ratios(
    walls: pd.DataFrame,
    steps: pd.DataFrame,
    settings: Mapping[str, Any],
    min_forward_s: float = 0.0,
) -> TokenRatios | None:
    """`TokenRatios` from per-(phase, step) wall seconds (`phase_work.phase_walls`) and
    per-step token figures (`phase_work.step_rows`); None without a forward pass.

    The batch is the same in every phase of a step, so relative token counts suffice: a
    forward pass and the update process the same prompt + response tokens (the update once
    per epoch), so their seconds compare directly; generation makes the response tokens, so
    its ratio needs the mean prompt and response lengths. Steps whose forward pass is shorter
    than ``min_forward_s`` are left out: a pass of milliseconds is its fixed per-call costs
    (launches, Python, the optimizer step beside it), not its tokens.
    """
    if walls.empty:
        return None
    index, table = _by_step(walls)
    forward = [p for p in FORWARD_PHASES if p in table and (table[p] > 0).any()]
    if not forward:
        return None
    # the faster forward pass is the yardstick (a reference model with offloaded parameters
    # reads slower than the actor); both process the same tokens, so seconds compare directly
    medians = {p: float(np.nanmedian(np.where(table[p] > 0, table[p], np.nan))) for p in forward}
    fwd_phase = min(medians, key=lambda p: medians[p])
    fwd = table[fwd_phase]
    fwd = np.where((fwd > 0) & (fwd >= min_forward_s), fwd, np.nan)
    if not np.isfinite(fwd).any():
        return None
    epochs = _epochs(settings)

    def median_ratio(values: np.ndarray) -> tuple[float | None, int]:
        values = values[np.isfinite(values) & (values > 0)]
        return (float(np.median(values)), len(values)) if len(values) else (None, 0)

    update, n_update = (None, 0)
    if "update_actor" in table:  # the same tokens as the forward pass, once per epoch
        update, n_update = median_ratio(table["update_actor"] / fwd / epochs)
    generation, n_gen = (None, 0)
    lengths = (
        steps.groupby("step")[["prompt_mean", "response_mean"]].mean().reindex(index)
        if len(steps)
        else None
    )
    if "rollout" in table and lengths is not None:
        prompt = lengths["prompt_mean"].to_numpy(float)
        response = lengths["response_mean"].to_numpy(float)
        response = np.where(response > 0, response, np.nan)
        # seconds per generated token over seconds per forward token (prompt + response)
        per_gen = table["rollout"] / response
        generation, n_gen = median_ratio(per_gen / (fwd / (prompt + response)))
    if update is None and generation is None:
        return None
    return TokenRatios(
        forward_phase=fwd_phase,
        update_per_epoch=update,
        generation=generation,
        epochs=epochs,
        steps=max(n_update, n_gen),
        source="phase times" + (" and the steps' mean prompt / response lengths" if n_gen else ""),
    )


def _by_step(walls: pd.DataFrame) -> tuple[pd.Index, dict[str, np.ndarray]]:
    """``walls.pivot_table(index="step", columns="phase", values="wall_s", aggfunc="sum")``
    as its index and a column per phase. `phase_work.phase_walls` has one row per (phase,
    step): each cell is then that row's seconds (a sum of one, NaN as 0), put in place
    without the pivot's group-by."""
    phase, step = walls["phase"].to_numpy(object), walls["step"].to_numpy()
    codes = appearance_codes([phase, step])  # -1: a missing phase or step
    if (codes < 0).any() or len(first_rows(codes)) < len(codes):
        table = walls.pivot_table(index="step", columns="phase", values="wall_s", aggfunc="sum")
        return table.index, {p: table[p].to_numpy(float) for p in table.columns}
    steps, at = np.unique(step, return_inverse=True)
    wall = walls["wall_s"].to_numpy(np.float64)
    wall = np.where(np.isnan(wall), 0.0, wall)
    columns: dict[str, np.ndarray] = {}
    for name in sorted(set(phase.tolist())):
        rows = np.flatnonzero(phase == name)
        column = np.full(len(steps), np.nan)
        column[at[rows]] = wall[rows]
        columns[name] = column
    return pd.Index(steps, name="step"), columns


# --------------------------------------------------------------------------------------------
# Decode roofline

_TP_KNOBS = (
    "actor_rollout_ref.rollout.tensor_model_parallel_size",  # verl
    "vllm_tensor_parallel_size",  # TRL, ms-swift, OpenRLHF < 0.10.2
    "vllm.tensor_parallel_size",  # OpenRLHF >= 0.10.2
)
_GMU_KNOBS = (
    "actor_rollout_ref.rollout.gpu_memory_utilization",
    "vllm_gpu_memory_utilization",
    "vllm.gpu_memory_utilization",
)
_MAX_SEQS_KNOBS = (
    "actor_rollout_ref.rollout.max_num_seqs",
    "vllm_max_num_seqs",
    "vllm.max_num_seqs",
)
_EAGER_KNOBS = (
    "actor_rollout_ref.rollout.enforce_eager",
    "vllm_enforce_eager",
    "vllm.enforce_eager",
    "enforce_eager",
)
_N_KNOBS = (
    "actor_rollout_ref.rollout.n",
    "num_generations",  # TRL, ms-swift
    "n_samples_per_prompt",  # OpenRLHF < 0.10.2
    "rollout.n_samples_per_prompt",
)
_BATCH_KNOBS = (
    "data.train_batch_size",  # verl: prompts per step
    "rollout_batch_size",  # OpenRLHF < 0.10.2: prompts per rollout
    "rollout.batch_size",
)
_DEFAULT_MAX_SEQS = 256
"""vLLM's ``max_num_seqs`` default for the engine verl, TRL and OpenRLHF start (vLLM
``SchedulerConfig``; verl's rollout config writes 1024)."""


def _first(settings: Mapping[str, Any], knobs: tuple[str, ...]) -> tuple[str | None, Any]:
    for knob in knobs:
        if knob in settings and settings[knob] is not None:
            return knob, settings[knob]
    return None, None


def rollout_settings(settings: Mapping[str, Any]) -> dict[str, tuple[str | None, Any]]:
    """The generation settings the decode roofline and the ``rollout_bound`` causes read, as
    ``name -> (knob as spelled in the run, value)``: tensor parallelism, memory share, max
    running sequences, eager mode, samples per prompt, prompts per step."""
    return {
        "tp": _first(settings, _TP_KNOBS),
        "gpu_memory_utilization": _first(settings, _GMU_KNOBS),
        "max_num_seqs": _first(settings, _MAX_SEQS_KNOBS),
        "enforce_eager": _first(settings, _EAGER_KNOBS),
        "n": _first(settings, _N_KNOBS),
        "prompts": _first(settings, _BATCH_KNOBS),
    }


@dataclass(frozen=True)
class DecodeRoofline:
    """Generation against the GPUs' memory bandwidth and peak.

    ``concurrency``: sequences an engine decodes at once (``concurrency_source`` says from
    what); ``bytes_per_token``: memory read per generated token (weights shared by the
    running batch + the KV cache of the token's context); ``bandwidth_util``: the bytes of
    the tokens generated over (wall × GPUs × HBM bandwidth), 0–1; ``min_s``: the least time
    the hardware allows for those tokens at that concurrency (bandwidth or FLOPs, whichever
    binds, and at least the longest response's iterations); ``efficiency`` = min_s / wall.
    ``kv_capacity_tokens``: tokens of KV cache an engine holds at its memory share, when
    known. ``assumptions``: what was not known and was assumed.
    """

    gpus: int
    tp: int
    engines: float
    concurrency: float
    concurrency_source: str
    bytes_per_token: float
    kv_bytes_per_token: float | None
    tokens_per_s_per_gpu: float
    bandwidth_util: float
    min_s: float
    efficiency: float
    kv_capacity_tokens: float | None
    assumptions: tuple[str, ...]

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["assumptions"] = list(self.assumptions)
        return {k: (round(v, 4) if isinstance(v, float) else v) for k, v in out.items()}


def decode_roofline(
    *,
    generated_tokens: float,
    wall_s: float,
    gpus: int,
    gpu: GpuSpec,
    model: ModelSize,
    settings: Mapping[str, Any],
    prompt_mean: float | None,
    response_mean: float | None,
    response_max: float | None = None,
    sequences: float | None = None,
    memory_bytes: float | None = None,
) -> DecodeRoofline | None:
    """The decode roofline of ``generated_tokens`` produced in ``wall_s`` on ``gpus`` GPUs
    (see `DecodeRoofline`); None without tokens, time or GPUs.

    ``sequences``: sequences generated (else prompts per step × samples per prompt from the
    settings); ``memory_bytes``: one GPU's memory (else the data sheet's). Concurrency per
    engine is the least of its share of the sequences, the engine's ``max_num_seqs`` and the
    sequences its KV cache holds at full length.
    """
    if not (generated_tokens > 0 and wall_s > 0 and gpus > 0):
        return None
    assumptions: list[str] = []
    rs = rollout_settings(settings)
    tp = int(num(rs["tp"][1]) or 1)
    tp = max(1, min(tp, gpus))
    if rs["tp"][0] is None:
        assumptions.append("tensor parallel size 1 (not in the run's settings)")
    engines = gpus / tp
    weights = model.weight_bytes
    kvb = model.kv_bytes_per_token
    prompt = prompt_mean or 0.0
    response = response_mean or (generated_tokens / sequences if sequences else None)
    context = prompt + (response or 0.0) / 2.0
    # how many sequences an engine runs at once
    if sequences is None:
        prompts, n = num(rs["prompts"][1]), num(rs["n"][1]) or 1.0
        sequences = prompts * n if prompts else None
    if sequences is None and response:
        sequences = generated_tokens / response
    limits: list[tuple[float, str]] = []
    if sequences:
        limits.append((sequences / engines, "the step's sequences over the engines"))
    max_seqs = num(rs["max_num_seqs"][1])
    if max_seqs is None:
        max_seqs = float(_DEFAULT_MAX_SEQS)
        assumptions.append(f"max_num_seqs {_DEFAULT_MAX_SEQS} (vLLM's default)")
    limits.append((max_seqs, "max_num_seqs"))
    kv_capacity = None
    gmu = num(rs["gpu_memory_utilization"][1])
    mem = memory_bytes or gpu.memory_bytes
    if kvb and gmu:
        free = tp * mem * gmu - weights
        if free > 0:
            kv_capacity = free / kvb
            full = prompt + (response_max or response or 0.0)
            if full > 0:
                limits.append((kv_capacity / full, "the KV cache at gpu_memory_utilization"))
    concurrency, source = min(limits, key=lambda x: x[0])
    concurrency = max(1.0, concurrency)
    if kvb is None:
        assumptions.append("KV-cache reads not counted (no config.json): bandwidth is a floor")
    per_token = weights / concurrency + (context * kvb if kvb else 0.0)
    total_bytes = generated_tokens * per_token
    bandwidth = gpus * gpu.hbm_bytes_s
    peak = gpu.flops(gpu.training_dtype() or "bf16") or 0.0
    memory_s = total_bytes / bandwidth
    compute_s = 2.0 * model.flops_params * generated_tokens / (gpus * peak) if peak else 0.0
    # an engine iterates at least once per token of its longest response
    iteration_s = (weights / tp) / gpu.hbm_bytes_s
    tail_s = (response_max or 0.0) * iteration_s
    min_s = max(memory_s, compute_s, tail_s)
    return DecodeRoofline(
        gpus=int(gpus),
        tp=tp,
        engines=engines,
        concurrency=float(concurrency),
        concurrency_source=source,
        bytes_per_token=per_token,
        kv_bytes_per_token=kvb,
        tokens_per_s_per_gpu=generated_tokens / wall_s / gpus,
        bandwidth_util=min(1.0, total_bytes / (wall_s * bandwidth)),
        min_s=min_s,
        efficiency=min(1.0, min_s / wall_s),
        kv_capacity_tokens=kv_capacity,
        assumptions=tuple(assumptions),
    )
