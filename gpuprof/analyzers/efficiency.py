"""Efficiency figures: tokens/s and model FLOPs utilisation (MFU) per phase, the cost of idle
GPU time, and the framework's own logged MFU / throughput beside them.

Pure: no I/O. A model's ``config.json`` is read by the caller (`gpuprof.api`) and handed in
through `EfficiencyOptions`; `attach_options` puts those options on an `AnalysisContext` so
that `efficiency_summary` (called by `diagnose.summarize`) and the busy-time stalls see them.
The parts live in their own modules: the GPUs' data-sheet figures (`hardware`), the model's
size (`model_size`), each phase's tokens and FLOPs per token (`phase_work`); what the figures
say about the step's bound is `bound` and `roofline`.

Definitions (units in the names):

- **peak FLOP/s**: the vendor data sheet's dense (no structured sparsity) tensor throughput of
  one GPU at the training dtype (bf16; fp16 on GPUs without bf16), `hardware.GPU_TABLE`;
- **MFU** = achieved model FLOP/s / (peak FLOP/s × GPUs in the phase), 0–1, with the model
  FLOPs per token of `phase_work`. Recomputation (gradient checkpointing) and padding are not
  model FLOPs: they lower MFU, as they should;
- **tokens/s**: rollout — generated (response) tokens over rollout wall time; log-prob and
  value passes — prompt + response tokens over the phase's wall time; update — trained
  tokens (prompt + response, × PPO epochs) over the update's wall time.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd

from gpuprof.analyzers import attr_columns
from gpuprof.analyzers.findings import AnalysisContext, Finding
from gpuprof.analyzers.grouping import stable_order
from gpuprof.analyzers.hardware import match_gpu
from gpuprof.analyzers.model_size import CRITIC_PATH_KNOBS, model_path, model_size, params_from_name
from gpuprof.analyzers.parts import Parts, facts, sampled
from gpuprof.analyzers.phase_work import (
    CRITIC_PHASES,
    PHASE_WORK,
    _sum_min_count_1,
    attention_flops,
    combine_step_rows,
    combine_steps_wall,
    combine_walls,
    process_keys,
    step_rows,
    steps_wall_sums,
    valid_spans,
    wall_sums,
)
from gpuprof.analyzers.settings import num as _num
from gpuprof.analyzers.settings import options_of, run_settings

__all__ = ["FRAMEWORK_MFU_PHASE", "efficiency_summary", "figures"]

FRAMEWORK_MFU_PHASE: dict[str, str] = {
    "perf/mfu/actor": "update_actor",
    "perf/mfu/critic": "update_critic",
    "perf/mfu/actor_infer": "old_logprob",
    "perf/mfu/ref": "ref_logprob",
}
"""verl's logged MFU keys → the phase they time."""

VERL_MFU_NOTE = (
    "verl's perf/mfu/* is a fraction (1.0 = 100%) of verl's own per-GPU peak table (bf16 "
    "dense, matched by a substring of the device name; verl/utils/flops_counter.py): the "
    "estimated FLOPs of the worker call (6 × parameters × tokens plus attention, over the PPO "
    "epochs; actor_infer, the old-log-prob forward, a third of that) over the call's time, "
    "divided by that peak and by the world size. It times the worker's compute only, so it "
    "reads higher than gpuprof's MFU, which counts the phase's wall time. 0 means verl did not "
    "know the GPU (its peak is then infinite) or the model type."
)
VERL_MFU_ABOVE_ONE = (
    "a logged perf/mfu above 1 is impossible as a fraction of the real peak: verl's table gave "
    "this GPU too low a peak (verl 0.3 and earlier matched 'NVIDIA GH200 480GB' to its H20 "
    "row, 148 TFLOP/s, by the substring 'H20'; the GH200's dense bf16 peak is 989.5)"
)


# --------------------------------------------------------------------------------------------
# The figures


@dataclass
class _Figures:
    """Everything `efficiency_summary` reports, kept for the busy-time stalls."""

    gpu: dict[str, Any]
    peak: float | None
    model: dict[str, Any] | None
    phases: list[dict[str, Any]]
    run: dict[str, Any]
    framework: dict[str, Any]
    notes: list[str] = field(default_factory=list)
    seq_mean: float | None = None
    step_rows: pd.DataFrame | None = None
    """`phase_work.step_rows` of the run (one row per step span with its token figures)."""
    phase_walls: pd.DataFrame | None = None
    """`phase_work.phase_walls` of the run (wall seconds per phase and step)."""
    attention_counted: bool = False


def _gpu_name(ctx: AnalysisContext) -> tuple[str | None, list[str]]:
    named = options_of(ctx).gpu_name
    if named:  # the user's --gpu: a run without an inventory, or one that names it wrongly
        return named, [named]
    names = [str(g.get("name")) for g in ctx.run.meta.gpus or [] if g.get("name")]
    if not names:  # a log that printed the device's name (imported as the gpu_name knob)
        logged = (ctx.run.meta.knobs or {}).get("gpu_name")
        return (str(logged), [str(logged)]) if logged else (None, [])
    counts = pd.Series(names).value_counts()
    return str(counts.index[0]), sorted(set(names))


def _run_gpus(ctx: AnalysisContext, settings: Mapping[str, Any]) -> tuple[int | None, str]:
    run = ctx.run
    recorded = sampled(ctx)
    if recorded.samples:
        return int(recorded.gpus), "GPU samples"
    if run.meta.gpus:
        return len(run.meta.gpus), "GPU inventory"
    per_node = _num(settings.get("trainer.n_gpus_per_node"))
    nodes = _num(settings.get("trainer.nnodes", 1)) or 1.0
    if per_node:
        return int(per_node * nodes), "trainer.n_gpus_per_node × trainer.nnodes"
    return None, "unknown"


def _phase_gpus(ctx: AnalysisContext) -> dict[str, int]:
    if not (sampled(ctx).samples and facts(ctx).spans):
        return {}
    table = ctx.by_phase
    if "gpus" not in table:
        return {}
    return {str(p): int(g) for p, g in zip(table["phase"], table["gpus"]) if g == g and g > 0}


def perf_values(spans: pd.DataFrame) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """The ``perf/*`` figures the step spans carry, per key: the processes (``host:pid``)
    and the finite values, in the spans' order (a part's share of `framework_metrics`)."""
    rows = np.flatnonzero(spans["phase"].to_numpy(object) == "step") if len(spans) else []
    if not len(rows):
        return {}
    attrs = list(spans["attrs"].to_numpy(object)[rows])
    keys = [k for k in attr_columns.key_names(attrs) if str(k).startswith("perf/")]
    if not keys:
        return {}
    owners = process_keys(spans.iloc[rows])
    out = {}
    for key in keys:
        column = attr_columns.number(attrs, key)
        kept = ~np.isnan(column)
        if kept.any():
            out[str(key)] = (owners[kept], column[kept])
    return out


def _framework_metrics(
    spans: pd.DataFrame, events: pd.DataFrame, framework: str | None
) -> dict[str, Any]:
    return framework_metrics([perf_values(spans)], [untimed_values(events)], framework)


def untimed_values(events: pd.DataFrame) -> dict[str, np.ndarray]:
    """The ``perf/*`` figures of step events that have no span (``untimed``: steps a log
    gives figures for but no duration), per key, the finite values in the events' order
    (a part's share of `framework_metrics`). Events without a host count nowhere: a run cut
    into parts by host has none of them in any part."""
    if not len(events) or "kind" not in events or "attrs" not in events:
        return {}
    keep = (events["kind"] == "step").to_numpy(bool)
    if "host" in events:
        keep = keep & events["host"].notna().to_numpy(bool)
    attrs = [a for a in events["attrs"][keep] if isinstance(a, Mapping) and a.get("untimed")]
    if not attrs:
        return {}
    out = {}
    for key in attr_columns.key_names(attrs):
        if str(key).startswith("perf/"):
            column = attr_columns.number(attrs, key)
            if (~np.isnan(column)).any():
                out[str(key)] = column[~np.isnan(column)]
    return out


def _mean(values: np.ndarray) -> float:
    """The mean of ``values`` from their correctly rounded sum: the same in any order."""
    try:
        return math.fsum(values) / len(values)
    except (ValueError, OverflowError):  # infinities of both signs, or a sum past float
        return float(np.mean(values))


def framework_metrics(
    parts: list[dict[str, tuple[np.ndarray, np.ndarray]]],
    untimed: list[dict[str, np.ndarray]],
    framework: str | None,
) -> dict[str, Any]:
    """The framework's own ``perf/*`` figures over the steps, from `perf_values` of
    disjoint sets of processes (each key's values in the order of their processes) and
    `untimed_values` of the step events that have no span. Each figure (mean, min, max,
    count) is the same however the run is divided into parts: the mean is of the correctly
    rounded sum (`math.fsum`)."""
    keys = {k for part in parts for k in part} | {k for part in untimed for k in part}
    values: dict[str, np.ndarray] = {}
    for key in keys:
        held = [part[key] for part in parts if key in part]
        column = np.concatenate([v for _, v in held]) if held else np.empty(0)
        if len(column) > 1:  # process by process, however the processes were divided
            owners = np.concatenate([o for o, _ in held])
            column = column[stable_order(owners)]
        logged = [part[key] for part in untimed if key in part]
        column = np.concatenate([column, *logged])
        if len(column):
            values[key] = column
    metrics = {
        key: {
            "mean": _mean(v),
            "min": float(np.min(v)),
            "max": float(np.max(v)),
            "steps": len(v),
        }
        for key, v in sorted(values.items())
    }
    notes, warnings = [], []
    if any(k.startswith("perf/mfu/") for k in metrics):
        notes.append(VERL_MFU_NOTE)
        if any(m["max"] > 1.0 for k, m in metrics.items() if k.startswith("perf/mfu/")):
            warnings.append(VERL_MFU_ABOVE_ONE)
    if "perf/throughput" in metrics:
        notes.append(
            "verl's perf/throughput: prompt + response tokens of the step over (step time × "
            "GPUs), in tokens/s per GPU"
        )
    return {"name": framework, "metrics": metrics, "notes": notes, "warnings": warnings}


THROUGHPUT_KEY = "perf/throughput_tflops_per_gpu"
"""Megatron's ``throughput per GPU (TFLOP/s/GPU)`` as the Megatron reader keeps it per step."""


def _with_throughput_mfu(
    framework: dict[str, Any], peak: float | None, gpu_model: str | None
) -> dict[str, Any]:
    """The framework's own model TFLOP/s per GPU (Megatron) as MFU against the GPU's peak,
    when both are known: ``metrics["perf/mfu/from_throughput"]`` and a note naming both."""
    logged = framework["metrics"].get(THROUGHPUT_KEY)
    if not logged or not peak:
        return framework
    mfu = {k: logged[k] * 1e12 / peak for k in ("mean", "min", "max")}
    framework["metrics"]["perf/mfu/from_throughput"] = {**mfu, "steps": logged["steps"]}
    framework["notes"].append(
        f"MFU {mfu['mean']:.1%} from the framework's own {logged['mean']:.0f} TFLOP/s per GPU "
        f"over the {gpu_model or 'GPU'}'s peak of {peak / 1e12:.0f} TFLOP/s"
    )
    return framework


def _per_step(steps: pd.DataFrame) -> pd.DataFrame:
    """Tokens per step (summed, NaN when no row has them) and mean lengths per step."""
    grouped = steps.groupby("step")
    sums = {c: _sum_min_count_1(steps[c], grouped[c]) for c in ("batch_tokens", "generated",
                                                              "trained")}  # fmt: skip
    means = {c: grouped[c].mean() for c in ("prompt_mean", "response_mean")}
    return pd.DataFrame({**sums, **means})


def figures(ctx: AnalysisContext) -> _Figures:
    """The run's efficiency figures (computed once per context; options from `attach_options`)."""
    cached = ctx.__dict__.get("_efficiency")
    if cached is not None:
        return cached
    options = options_of(ctx)
    run = ctx.run
    settings = run_settings(run.meta)
    notes: list[str] = []

    name, names = _gpu_name(ctx)
    peak_row = match_gpu(name)
    dtype = peak_row.training_dtype() if peak_row else None
    peak = peak_row.flops(dtype) if peak_row and dtype else None
    gpu = {
        "name": name,
        "model": peak_row.model if peak_row else None,
        "dtype": dtype,
        "peak_flops_per_gpu": peak,
        "source": peak_row.source if peak_row else None,
    }
    if len(names) > 1:
        notes.append(f"mixed GPU models ({', '.join(names)}): peak of the most common, {name}")
    if name is None:
        notes.append("MFU not available: the run does not name its GPUs (pass --gpu NAME)")
    elif peak is None:
        notes.append(f"MFU not available: no peak FLOP/s known for {name!r}")

    size, why = model_size(options, settings)
    critic_size = size
    if size is None:
        notes.append(f"model FLOPs not available: {why}")
    else:
        _, critic_path = model_path(settings, CRITIC_PATH_KNOBS)
        critic_named = params_from_name(critic_path)
        if critic_named is not None and options.model_params is None:
            critic_size = critic_named

    # the spans' figures, each part's processes at a time (`span_work`), added up
    work = Parts.of(ctx).map(span_work, settings)
    steps = combine_step_rows([w["step_rows"] for w in work])
    walls = combine_walls([w["walls"] for w in work])
    steps_wall = combine_steps_wall([w["steps_wall"] for w in work])
    per_step = (
        _per_step(steps)
        if len(steps)
        else pd.DataFrame(
            columns=["batch_tokens", "generated", "trained", "prompt_mean", "response_mean"]
        )
    )
    prompt_mean = _num(per_step["prompt_mean"].mean()) if len(per_step) else None
    response_mean = _num(per_step["response_mean"].mean()) if len(per_step) else None
    seq_mean = (
        prompt_mean + response_mean
        if prompt_mean is not None and response_mean is not None
        else None
    )

    run_gpus, gpus_from = _run_gpus(ctx, settings)
    phase_gpus = _phase_gpus(ctx)
    phases: list[dict[str, Any]] = []
    attention_counted = False
    total_flops = 0.0
    # the walls' columns as arrays once: a phase's rows are then a mask, not a frame
    wall_phase = walls["phase"].to_numpy(object) if len(walls) else np.zeros(0, dtype=object)
    wall_step = walls["step"].to_numpy() if len(walls) else None
    wall_tokens = walls["span_tokens"].to_numpy(float) if len(walls) else None
    wall_s = walls["wall_s"].to_numpy(float) if len(walls) else None
    for phase, (kind, factor) in PHASE_WORK.items():
        rows = np.flatnonzero(wall_phase == phase)
        if not len(rows):
            continue
        column = {"generated": "generated", "forward": "batch_tokens", "trained": "trained"}[kind]
        tokens_by_step = wall_tokens[rows]
        from_steps = (
            per_step[column].reindex(wall_step[rows]).to_numpy(float)
            if len(per_step)
            else np.full(len(rows), np.nan)
        )
        source = "phase spans' tokens" if np.isfinite(tokens_by_step).any() else "step tokens"
        tokens = np.where(np.isfinite(tokens_by_step), tokens_by_step, from_steps)
        wall = wall_s[rows]
        ok = np.isfinite(tokens) & (wall > 0)
        entry: dict[str, Any] = {
            "phase": phase,
            "token_kind": kind,
            "wall_s": float(wall.sum()),
            "steps": len(rows),
            "steps_with_tokens": int(ok.sum()),
            "tokens": float(tokens[ok].sum()) if ok.any() else None,
            "tokens_source": source if ok.any() else None,
            "tokens_per_s": None,
            "gpus": phase_gpus.get(phase, run_gpus),
            "tokens_per_s_per_gpu": None,
            "flops_per_token": None,
            "achieved_flops_per_s": None,
            "mfu": None,
        }
        if not ok.any():
            phases.append(entry)
            continue
        wall_ok = float(wall[ok].sum())
        entry["tokens_per_s"] = entry["tokens"] / wall_ok
        if entry["gpus"]:
            entry["tokens_per_s_per_gpu"] = entry["tokens_per_s"] / entry["gpus"]
        model = critic_size if phase in CRITIC_PHASES else size
        if model is not None:
            per_token = factor * model.flops_params
            attention = attention_flops(phase, model, prompt_mean, response_mean)
            if attention is not None:
                per_token += attention
                attention_counted = True
            entry["flops_per_token"] = per_token
            flops = per_token * entry["tokens"]
            total_flops += flops
            entry["achieved_flops_per_s"] = flops / wall_ok
            if peak and entry["gpus"]:
                entry["mfu"] = entry["achieved_flops_per_s"] / (peak * entry["gpus"])
        phases.append(entry)

    total_gpu_s = ctx.total_gpu_s if sampled(ctx).samples else 0.0
    gpu_s_source = "GPU samples"
    if total_gpu_s <= 0:
        duration = steps_wall
        total_gpu_s = duration * run_gpus if duration and run_gpus else 0.0
        gpu_s_source = f"steps' wall time × {run_gpus} GPUs ({gpus_from})" if total_gpu_s else ""
    batch_total = _num(per_step["batch_tokens"].sum(min_count=1)) if len(per_step) else None
    run_fig: dict[str, Any] = {
        "gpus": run_gpus,
        "gpus_source": gpus_from,
        "gpu_s": total_gpu_s or None,
        "gpu_s_source": gpu_s_source or None,
        "tokens": batch_total,
        "tokens_per_s": batch_total / steps_wall if batch_total and steps_wall else None,
        "tokens_per_s_per_gpu": None,
        "achieved_flops": total_flops if total_flops > 0 else None,
        "mfu": None,
    }
    if run_fig["tokens_per_s"] and run_gpus:
        run_fig["tokens_per_s_per_gpu"] = run_fig["tokens_per_s"] / run_gpus
    if total_flops > 0 and peak and total_gpu_s > 0:
        run_fig["mfu"] = total_flops / (peak * total_gpu_s)
    above = [p["phase"] for p in phases if p["mfu"] is not None and p["mfu"] > 1.0]
    if above:
        notes.append(
            f"MFU above 100% in {', '.join(above)}: the model size or the token counts are "
            "too high for this run (check --model-params and the step's tokens)"
        )
    if size is not None and not attention_counted and any(p["flops_per_token"] for p in phases):
        notes.append(
            "attention FLOPs not counted (no config.json with the model's shape, or no "
            "sequence lengths): MFU is a lower bound"
        )
    result = _Figures(
        gpu=gpu,
        peak=peak,
        model=size.to_dict() if size is not None else None,
        phases=phases,
        run=run_fig,
        framework=_with_throughput_mfu(
            framework_metrics(
                [w["perf"] for w in work], [w["untimed"] for w in work], run.meta.framework
            ),
            peak,
            gpu.get("model"),
        ),
        notes=notes,
        seq_mean=seq_mean,
        step_rows=steps,
        phase_walls=walls,
        attention_counted=attention_counted,
    )
    ctx.__dict__["_efficiency"] = result
    return result


def span_work(ctx: AnalysisContext, settings: Mapping[str, Any]) -> dict[str, Any]:
    """One part's share of the figures read off the spans and step events (those of its
    processes): its `step_rows`, `wall_sums`, `steps_wall_sums`, `perf_values` and
    `untimed_values`."""
    spans = valid_spans(ctx.run.spans)
    return {
        "step_rows": step_rows(spans, settings),
        "walls": wall_sums(spans, ctx.spans["self_ns"].to_numpy()),
        "steps_wall": steps_wall_sums(spans),
        "perf": perf_values(spans),
        "untimed": untimed_values(ctx.run.events),
    }


def _cost(
    ctx: AnalysisContext, fig: _Figures, findings: list[Finding], price: float | None
) -> dict[str, Any]:
    idle = _num(ctx.totals.get("idle_gpu_s")) if sampled(ctx).samples else None
    total = float(fig.run.get("gpu_s") or 0.0)

    def money(gpu_s: float | None) -> float | None:
        return None if price is None or gpu_s is None else gpu_s / 3600.0 * price

    return {
        "gpu_hour_price": price,
        "gpu_hours": total / 3600.0 if total > 0 else None,
        "gpu_hours_source": fig.run.get("gpu_s_source") if total > 0 else None,
        "run_cost": money(total) if total > 0 else None,
        "idle_gpu_hours": idle / 3600.0 if idle is not None else None,
        "idle_cost": money(idle),
        "findings": [
            {
                "kind": f.kind,
                "gpu_seconds_lost": float(f.gpu_seconds_lost),
                "gpu_hours_lost": float(f.gpu_seconds_lost) / 3600.0,
                "cost": money(float(f.gpu_seconds_lost)),
            }
            for f in findings
        ],
    }


def efficiency_summary(
    ctx: AnalysisContext, findings: list[Finding] | None = None
) -> dict[str, Any]:
    """The ``efficiency`` entry of the diagnosis summary (docs/ANALYZE_JSON.md), JSON-able.

    ``gpu``: the GPU model matched in `PEAK_TABLE` and its peak FLOP/s; ``model``: where the
    parameter count came from; ``phases``: per phase with model work (rollout, log-prob and
    value passes, updates) its tokens, wall s, tokens/s (and per GPU), FLOPs per token,
    achieved FLOP/s and MFU (0–1); ``run``: tokens/s over the steps and whole-run MFU (the
    phases' model FLOPs over peak × the run's GPU-seconds); ``framework``: the framework's own
    ``perf/*`` figures (verl's MFU and throughput) with what they mean; ``cost``: idle
    GPU-hours and, with a price, their cost and each finding's; ``notes``: why a figure is not
    available. Options come from `attach_options`.
    """
    try:
        fig = figures(ctx)
    except Exception as exc:  # efficiency figures must never take the diagnosis down
        return {"notes": [f"efficiency figures failed: {type(exc).__name__}: {exc}"]}
    price = options_of(ctx).gpu_hour_price
    phases = []
    for entry in fig.phases:
        logged = [
            {"key": key, **fig.framework["metrics"][key]}
            for key, phase in FRAMEWORK_MFU_PHASE.items()
            if phase == entry["phase"] and key in fig.framework["metrics"]
        ]
        phases.append({**entry, "framework_mfu": logged or None})
    return {
        "gpu": fig.gpu,
        "model": fig.model,
        "phases": phases,
        "run": fig.run,
        "framework": fig.framework,
        "cost": _cost(ctx, fig, list(findings or []), price),
        "notes": list(fig.notes),
    }
