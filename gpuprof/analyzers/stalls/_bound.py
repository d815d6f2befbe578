"""What bounds the step: the phases that take most of it, whether the GPUs work or wait in them,
and how far each busy phase is from what the hardware allows for the work it did.

Idle time by cause says where the GPUs waited; this is the other half, for the time they were
busy. From one step line up:

- **composition**: each phase's share of the steps — wall time from the framework's phase times
  when the run has no GPU samples, GPU-time inside the steps when it has them (with the GPUs'
  utilisation in each phase);
- **bound**: the one phase at or above ``Thresholds.bound_dominant_share`` of the step, or
  at least ``bound_relative_min_share`` of it and ``bound_relative_ratio`` times every other
  part of it (dominance relative to the rest of the step), else the two largest when together
  they reach ``bound_pair_share``, else none ("no phase dominates"); a bounding phase is
  *busy* (generation, update, log-prob passes: GPU work) or a *wait* (reward, weight sync,
  loading, checkpoint, evaluation: GPUs idle, explained by the idle-time findings);
- **efficiency** of each busy phase against the hardware (`roofline`): MFU of the compute
  phases, the decode roofline of generation, and with no GPU known the cross-phase ratios; the
  framework's own figures (verl ``perf/mfu/*``, ``timing_per_token_ms/*``) beside them, an
  impossible one (MFU above 100%) named as such; the critic update against the actor's on
  the same tokens (verl's MFU of each, or their times when the critic trains the actor's
  model). Each phase gets a verdict: ``slow``,
  ``healthy``, ``borderline`` or ``not judged`` with why.

`assess` computes it once per `AnalysisContext`; the ``rollout_bound`` and ``update_bound``
stalls and `bound_summary` (the ``bound`` section of the diagnosis) read it. Pure: no I/O.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd

from gpuprof.analyzers import attr_columns
from gpuprof.analyzers.efficiency import FRAMEWORK_MFU_PHASE, figures
from gpuprof.analyzers.findings import AnalysisContext, Thresholds
from gpuprof.analyzers.grouping import stable_order
from gpuprof.analyzers.hardware import match_gpu
from gpuprof.analyzers.model_size import model_size
from gpuprof.analyzers.parts import Parts, facts, median_of_counts, sampled, value_counts
from gpuprof.analyzers.phase_work import process_keys
from gpuprof.analyzers.roofline import FORWARD_PHASES, DecodeRoofline, decode_roofline, token_ratios
from gpuprof.analyzers.settings import num, options_of, run_settings
from gpuprof.analyzers.stalls._timing import RESIDUE, timing

__all__ = ["BUSY_PHASES", "WAIT_PHASES", "Assessment", "assess", "bound_summary"]

BUSY_PHASES: frozenset[str] = frozenset(
    {"rollout", "ref_logprob", "old_logprob", "values", "update_actor", "update_critic"}
)
"""Phases whose time is GPU work (generation, forward passes, updates)."""
WAIT_PHASES: frozenset[str] = frozenset(
    {"reward", "reshard", "dataload", "checkpoint", "eval", "advantage"}
)
"""Phases in which the GPUs of a typical job wait (CPU scoring, weight movement, loading,
saving, validation, the advantage computation on the driver)."""

OTHER = "(other)"
"""The part of the steps no named phase covers."""

_WORK_NAME = {
    "rollout": "generation",
    "ref_logprob": "the reference log-prob pass",
    "old_logprob": "the old log-prob pass",
    "values": "the value pass",
    "update_actor": "the actor update",
    "update_critic": "the critic update",
}

FORWARD_NAME = {"ref_logprob": "reference log-prob", "old_logprob": "old log-prob"}
"""How a sentence names the forward pass a ratio is taken against."""

TIMING_PER_TOKEN_PHASE: dict[str, str] = {
    "timing_per_token_ms/gen": "rollout",
    "timing_per_token_ms/ref": "ref_logprob",
    "timing_per_token_ms/old_log_prob": "old_logprob",
    "timing_per_token_ms/values": "values",
    "timing_per_token_ms/update_actor": "update_actor",
    "timing_per_token_ms/update_critic": "update_critic",
}
"""verl's logged per-token times (ms per token of the whole batch; per response token for
``gen``) → the phase they time."""


@dataclass
class PhaseVerdict:
    """One busy phase against what the hardware allows: ``verdict`` is ``slow``, ``healthy``,
    ``borderline`` (between the healthy and the slow level) or ``not judged``; ``measure``
    the figure it rests on (``mfu``, ``framework_mfu``, ``decode_roofline``,
    ``forward_ratio``), ``value`` and ``expected`` that figure and its healthy level,
    ``why`` the sentence; ``figures`` every figure known for the phase."""

    phase: str
    verdict: str
    measure: str | None
    value: float | None
    expected: float | None
    why: str
    figures: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {
            "phase": self.phase,
            "verdict": self.verdict,
            "measure": self.measure,
            "value": _round(self.value),
            "expected": _round(self.expected),
            "why": self.why,
            "figures": {k: _round(v) for k, v in self.figures.items()},
        }


@dataclass
class Assessment:
    """`assess`'s result: the composition rows (phase, seconds, share, activity, util), the
    phases that bound the step, per-phase verdicts and the figures they rest on."""

    basis: str | None
    steps: int
    step_s: float | None
    composition: list[dict[str, Any]]
    bound: list[str]
    verdicts: dict[str, PhaseVerdict]
    ratios: dict[str, Any] | None
    decode: DecodeRoofline | None
    framework: dict[str, Any]
    notes: list[str]
    nothing_to_judge: str | None = None

    def share(self, phase: str) -> float:
        return next((float(r["share"]) for r in self.composition if r["phase"] == phase), 0.0)

    def seconds(self, phase: str) -> float:
        return next((float(r["seconds"]) for r in self.composition if r["phase"] == phase), 0.0)


def _round(value: Any) -> Any:
    if isinstance(value, float):
        return round(value, 4) if abs(value) < 100 else round(value, 1)
    return value


# --------------------------------------------------------------------------------------------
# Composition


def _composition(
    ctx: AnalysisContext, th: Thresholds
) -> tuple[str | None, int, float | None, list[dict]]:
    t = timing(ctx)
    if t is not None:  # no GPU samples: the framework's phase times
        total = float(t.steps["wall_s"].sum())
        if total <= 0:
            return None, 0, None, []
        rows = []
        for phase in t.phases:
            secs = float(t.steps[phase].sum())
            if secs > 0:
                activity = (
                    "busy" if phase in BUSY_PHASES else "wait" if phase in WAIT_PHASES else None
                )
                rows.append({"phase": phase, "seconds": secs, "share": secs / total,
                             "activity": activity, "util_gpu_pct": None})  # fmt: skip
        other = total - sum(r["seconds"] for r in rows)
        if other > RESIDUE * total:
            rows.append({"phase": OTHER, "seconds": other, "share": other / total,
                         "activity": None, "util_gpu_pct": None})  # fmt: skip
        return "phase_timing", len(t.steps), total / len(t.steps), rows
    if not sampled(ctx).samples or ctx.facts.first_span_ns is None:  # no span in any part
        return None, 0, None, []
    table = ctx.by_phase
    table = table[table["phase"] != "(none)"]
    total = float(table["gpu_s"].sum())
    if total <= 0:
        return None, 0, None, []
    n_steps = len(ctx.facts.steps)  # the distinct steps of the step spans, from every part
    gpus = max(1, int(table["gpus"].max() or 1))
    rows = []
    for row in table.itertuples(index=False):
        if not row.gpu_s > 0:
            continue
        util = float(row.util_gpu_pct) if row.util_gpu_pct == row.util_gpu_pct else None
        busy = row.busy_gpu_s / row.gpu_s if row.gpu_s > 0 else None
        activity = None if busy is None else "busy" if busy >= th.phase_idle_min_frac else "wait"
        name = OTHER if row.phase == "step" else str(row.phase)
        rows.append({"phase": name, "seconds": float(row.gpu_s) / gpus,
                     "share": float(row.gpu_s) / total, "activity": activity,
                     "util_gpu_pct": util})  # fmt: skip
    step_s = total / gpus / n_steps if n_steps else None
    return "gpu_samples", n_steps, step_s, rows


def _bound(rows: list[dict[str, Any]], th: Thresholds) -> list[str]:
    named = sorted((r for r in rows if r["phase"] != OTHER), key=lambda r: -r["share"])
    if not named:
        return []
    top = named[0]["share"]
    if top >= th.bound_dominant_share:
        return [named[0]["phase"]]
    # dominance relative to the rest of the step: the next phase, and the time no phase covers
    rest = max((r["share"] for r in rows if r is not named[0]), default=0.0)
    if top >= th.bound_relative_min_share and top >= th.bound_relative_ratio * rest:
        return [named[0]["phase"]]
    pair = named[:2]
    if (
        len(pair) == 2
        and sum(r["share"] for r in pair) >= th.bound_pair_share
        and all(r["share"] >= th.bound_member_share for r in pair)
    ):
        return [r["phase"] for r in pair]
    return []


# --------------------------------------------------------------------------------------------
# Framework figures


def _framework(ctx: AnalysisContext) -> dict[str, Any]:
    """verl's own MFU and per-token times, per phase, with plausibility."""
    metrics = figures(ctx).framework["metrics"]
    out: dict[str, Any] = {}
    for key, phase in FRAMEWORK_MFU_PHASE.items():
        m = metrics.get(key)
        if not m:
            continue
        mean = float(m["mean"])
        status = (
            "impossible (above 100%)" if m["max"] > 1.0 else "not computed" if mean == 0 else "ok"
        )
        out.setdefault(phase, {})["framework_mfu"] = {"key": key, "mean": mean, "status": status}
    per_token = _step_attr_means(ctx, tuple(TIMING_PER_TOKEN_PHASE))
    for key, value in per_token.items():
        out.setdefault(TIMING_PER_TOKEN_PHASE[key], {})["framework_ms_per_token"] = {
            "key": key,
            "mean": value,
        }
    return out


def _step_attr_means(ctx: AnalysisContext, keys: tuple[str, ...]) -> dict[str, float]:
    """The mean of each of ``keys`` over the step spans that carry it (process by process,
    each process's steps in order: the same however the run is divided into parts), the keys
    in the order they first appear."""
    got = [g for g in Parts.of(ctx).map(_step_attr_columns, keys) if g is not None]
    if not got:
        return {}
    owners = np.concatenate([o for o, _ in got])
    order = stable_order(owners)
    columns = {key: np.concatenate([c[key] for _, c in got])[order] for key in keys}
    first = {key: np.flatnonzero(~np.isnan(c))[:1] for key, c in columns.items()}
    # in the order the keys first appear over the steps, as they are reported
    present = sorted((k for k in keys if len(first[k])), key=lambda k: first[k][0])
    return {key: attr_columns.mean_of(columns[key]) for key in present}


def _step_attr_columns(
    ctx: AnalysisContext, keys: tuple[str, ...]
) -> tuple[np.ndarray, dict[str, np.ndarray]] | None:
    """One part's step spans: their processes (``host:pid``) and each key's values (NaN where
    a step has none), in the spans' order; None without step spans. A span without a host is
    in no part: read nowhere."""
    spans = ctx.run.spans
    if spans is None or spans.empty or "attrs" not in spans:
        return None
    steps = spans[((spans["phase"] == "step") & spans["host"].notna()).to_numpy(bool)]
    if steps.empty:
        return None
    attrs = list(steps["attrs"])
    owners = process_keys(steps)
    return owners, {key: attr_columns.number(attrs, key) for key in keys}


# --------------------------------------------------------------------------------------------
# Verdicts


def _gpu_spec(ctx: AnalysisContext):
    fig = figures(ctx)
    return match_gpu(fig.gpu.get("name")) if fig.gpu.get("name") else None


def _decode(ctx: AnalysisContext, steps: pd.DataFrame, settings: dict) -> DecodeRoofline | None:
    fig = figures(ctx)
    entry = next((p for p in fig.phases if p["phase"] == "rollout"), None)
    spec = _gpu_spec(ctx)
    size, _ = model_size(options_of(ctx), settings)
    if entry is None or spec is None or size is None or not entry.get("tokens"):
        return None
    if not entry.get("gpus") or not entry.get("wall_s"):
        return None
    prompt = num(steps["prompt_mean"].mean()) if len(steps) else None
    response = num(steps["response_mean"].mean()) if len(steps) else None
    response_max = _step_attr_means(ctx, ("response_length/max",)).get("response_length/max")
    mem = _memory_bytes(ctx)
    n_steps = max(1, int(entry.get("steps_with_tokens") or 1))
    return decode_roofline(
        generated_tokens=float(entry["tokens"]) / n_steps,
        wall_s=float(entry["wall_s"]) / max(1, int(entry.get("steps") or 1)),
        gpus=int(entry["gpus"]),
        gpu=spec,
        model=size,
        settings=settings,
        prompt_mean=prompt,
        response_mean=response,
        response_max=response_max,
        memory_bytes=mem,
    )


def _memory_bytes(ctx: AnalysisContext) -> float | None:
    """The median memory size over every GPU sample (bytes), None when none says."""
    value = median_of_counts(Parts.of(ctx).map(_memory_counts))
    return float(value) if value == value and value > 0 else None


def _memory_counts(ctx: AnalysisContext) -> tuple[np.ndarray, np.ndarray]:
    gpu = ctx.run.gpu
    if gpu is None or gpu.empty or "mem_total_bytes" not in gpu:
        return np.zeros(0), np.zeros(0, np.int64)
    return value_counts(pd.to_numeric(gpu["mem_total_bytes"], errors="coerce").to_numpy())


def _verdicts(ctx: AnalysisContext, th: Thresholds, ratios, decode, framework) -> dict:
    fig = figures(ctx)
    out: dict[str, PhaseVerdict] = {}
    critic_gap = _critic_seconds_ratio(ctx, fig.phase_walls)
    entries = {p["phase"]: p for p in fig.phases}
    for phase in sorted(set(entries) | set(framework), key=_phase_order):
        if phase not in BUSY_PHASES:
            continue
        entry = entries.get(phase, {})
        figs: dict[str, Any] = {
            k: entry.get(k)
            for k in ("tokens", "tokens_per_s_per_gpu", "mfu", "gpus")
            if entry.get(k) is not None
        }
        for k, v in framework.get(phase, {}).items():
            figs[k] = v["mean"]
            if k == "framework_mfu":
                figs["framework_mfu_status"] = v["status"]
        why_not = _why_not(phase, entry, th, ctx)
        out[phase] = _verdict(phase, th, entry, figs, ratios, decode, why_not,
                              framework.get("update_actor"), critic_gap)  # fmt: skip
    return out


def _critic_verdict(
    th: Thresholds, figs: dict[str, Any], actor: dict | None, seconds: float | None
) -> PhaseVerdict | None:
    """The critic update against the actor's on the same tokens: verl's own MFU of each (the
    critic's over the actor's), else the actor's update seconds per epoch over the critic's
    when the critic trains the actor's model (``seconds``); None when neither is known."""
    critic_mfu = figs.get("framework_mfu")
    actor_mfu = (actor or {}).get("framework_mfu") or {}
    measure = value = None
    if (
        critic_mfu is not None and figs.get("framework_mfu_status") == "ok"
        and actor_mfu.get("status") == "ok" and actor_mfu.get("mean")
    ):  # fmt: skip
        measure, value = "critic_actor_mfu", float(critic_mfu) / float(actor_mfu["mean"])
        figs["actor_framework_mfu"] = float(actor_mfu["mean"])
        why = (
            f"the critic update reaches {float(critic_mfu):.1%} MFU by the framework's own "
            f"count against the actor update's {float(actor_mfu['mean']):.1%} ({value:.2f}×"
        )
    elif seconds is not None:
        measure, value = "critic_actor_time", seconds
        why = (
            f"the critic update takes {1 / value:.1f}× the actor update's time per epoch "
            f"training the same model on the same tokens ({value:.2f}× its efficiency"
        )
    if measure is None or value is None:
        return None
    figs["critic_actor_ratio"] = value
    why += f"; healthy runs ≥ {th.critic_actor_healthy:g}×)"
    state = (
        "slow" if value <= th.critic_actor_slow
        else "healthy" if value >= th.critic_actor_healthy else "borderline"
    )  # fmt: skip
    return PhaseVerdict("update_critic", state, measure, value, th.critic_actor_healthy, why, figs)


def _critic_seconds_ratio(ctx: AnalysisContext, walls: pd.DataFrame | None) -> float | None:
    """The actor update's seconds per epoch over the critic update's on the same steps, when
    the run's settings say the critic trains the actor's model (verl ``critic.model.path``
    equal to ``actor_rollout_ref.model.path``); None otherwise."""
    settings = run_settings(ctx.run.meta)
    actor_path = settings.get("actor_rollout_ref.model.path")
    if walls is None or walls.empty or not actor_path:
        return None
    if settings.get("critic.model.path") != actor_path:
        return None
    per = walls[walls["phase"].isin(["update_actor", "update_critic"])]
    table = per.pivot_table(index="step", columns="phase", values="wall_s", aggfunc="sum")
    if not {"update_actor", "update_critic"} <= set(table.columns):
        return None
    table = table.dropna()
    actor_s, critic_s = float(table["update_actor"].sum()), float(table["update_critic"].sum())
    if actor_s <= 0 or critic_s <= 0:
        return None
    actor_epochs = num(settings.get("actor_rollout_ref.actor.ppo_epochs")) or 1.0
    critic_epochs = num(settings.get("critic.ppo_epochs")) or actor_epochs
    return (actor_s / actor_epochs) / (critic_s / critic_epochs)


def _phase_order(phase: str) -> int:
    order = ("rollout", "old_logprob", "ref_logprob", "values", "update_critic", "update_actor")
    return order.index(phase) if phase in order else len(order)


def _verdict(
    phase, th, entry, figs, ratios, decode, why_not: str, framework_actor=None, critic_gap=None
) -> PhaseVerdict:
    name = _WORK_NAME.get(phase, phase)
    mfu = entry.get("mfu")
    if phase == "update_actor" and mfu is not None:
        figs["reachable_mfu"] = th.reachable_mfu
        slow = mfu < th.low_mfu
        return PhaseVerdict(
            phase, "slow" if slow else "healthy", "mfu", mfu, th.reachable_mfu,
            f"{name} reaches {mfu:.1%} MFU ({'below' if slow else 'at or above'} "
            f"{th.low_mfu:.0%}; a tuned update reaches ~{th.reachable_mfu:.0%})", figs,
        )  # fmt: skip
    logged = figs.get("framework_mfu")
    if (
        phase == "update_actor"
        and logged is not None
        and figs.get("framework_mfu_status") == "ok"
        and logged < th.low_mfu
    ):
        # the framework's own MFU (it times the update's compute alone, so it reads higher
        # than a wall-clock MFU): below the threshold, the update is slow whatever the ratio
        figs["reachable_mfu"] = th.reachable_mfu
        return PhaseVerdict(
            phase, "slow", "framework_mfu", float(logged), th.reachable_mfu,
            f"{name} reaches {logged:.1%} MFU by the framework's own count (below "
            f"{th.low_mfu:.0%}; a tuned update reaches ~{th.reachable_mfu:.0%})", figs,
        )  # fmt: skip
    if phase == "update_critic":
        critic = _critic_verdict(th, figs, framework_actor, critic_gap)
        if critic is not None:
            return critic
    if ratios is not None:
        fwd = FORWARD_NAME.get(str(ratios.forward_phase), str(ratios.forward_phase))
        if phase == "update_actor" and ratios.update_per_epoch is not None:
            r = ratios.update_per_epoch
            figs["forward_ratio"] = r
            state = _ratio_state(r, th.update_forward_ratio_healthy, th.update_forward_ratio_slow)
            epochs = f" per PPO epoch ({ratios.epochs:g})" if ratios.epochs != 1 else ""
            return PhaseVerdict(
                phase, state, "forward_ratio", r,
                th.update_forward_ratio_healthy,
                f"{name} takes {r:.1f}× the {fwd} pass over the same tokens{epochs}; a "
                f"forward + backward costs ~3× a forward (healthy runs "
                f"{th.update_forward_ratio_healthy:g}×)",
                figs,
            )  # fmt: skip
        if phase == "rollout" and ratios.generation is not None:
            r = ratios.generation
            figs["forward_ratio"] = r
            if decode is not None:
                figs.update({"bandwidth_util": decode.bandwidth_util,
                             "decode_efficiency": decode.efficiency})  # fmt: skip
            state = _ratio_state(r, th.gen_forward_ratio_healthy, th.gen_forward_ratio_slow)
            return PhaseVerdict(
                phase, state, "forward_ratio", r,
                th.gen_forward_ratio_healthy,
                f"a generated token costs {r:.1f}× a token of the {fwd} pass (healthy runs "
                f"≤ {th.gen_forward_ratio_healthy:g}×)", figs,
            )  # fmt: skip
    if phase == "rollout" and decode is not None:  # no forward pass to compare with
        figs.update({"bandwidth_util": decode.bandwidth_util, "concurrency": decode.concurrency,
                     "decode_efficiency": decode.efficiency})  # fmt: skip
        slow = decode.efficiency < th.decode_efficiency_low
        return PhaseVerdict(
            phase, "slow" if slow else "healthy", "decode_roofline", decode.efficiency,
            th.decode_efficiency_reachable,
            f"{name} takes {1 / max(decode.efficiency, 1e-9):.1f}× the least time the GPUs' "
            f"memory bandwidth allows at {decode.concurrency:.0f} running sequences per engine "
            f"({decode.bandwidth_util:.0%} of HBM bandwidth)", figs,
        )  # fmt: skip
    if mfu is not None:
        why = f"{name} reaches {mfu:.1%} MFU (no healthy level set for it)"
        return PhaseVerdict(phase, "not judged", "mfu", mfu, None, why, figs)
    return PhaseVerdict(phase, "not judged", None, None, None, why_not, figs)


def _ratio_state(ratio: float, healthy: float, slow: float) -> str:
    """``slow`` at or above ``slow``, ``healthy`` up to ``healthy``, ``borderline`` between."""
    return "slow" if ratio >= slow else "healthy" if ratio <= healthy else "borderline"


def _why_not(phase: str, entry: dict, th: Thresholds, ctx: AnalysisContext) -> str:
    if phase == "update_critic":
        return (
            "no MFU of both updates (perf/mfu/critic and perf/mfu/actor) and no sign that the "
            "critic trains the actor's model (critic.model.path)"
        )
    if phase not in ("rollout", "update_actor"):
        return "no healthy level to compare with"
    fig = figures(ctx)
    walls = fig.phase_walls
    forward = walls[walls["phase"].isin(FORWARD_PHASES)] if walls is not None else None
    if forward is None or forward.empty:
        yardstick = "no forward pass of the same steps"
    elif float(forward["wall_s"].max()) < th.ratio_min_forward_s:
        yardstick = (
            f"the forward pass takes under {th.ratio_min_forward_s:g} s, its fixed per-call "
            "costs rather than its tokens"
        )
    else:
        yardstick = "no prompt / response lengths to count generated tokens"
    hardware = "no GPU model with a known peak" if not fig.peak else "no model size"
    return f"{hardware} (--gpu, --model-params), and {yardstick}"


# --------------------------------------------------------------------------------------------
# The assessment


def assess(ctx: AnalysisContext, th: Thresholds | None = None) -> Assessment:
    """The step's bound and per-phase verdicts of ``ctx``'s run (computed once per context)."""
    cached = ctx.__dict__.get("_bound")
    if cached is not None:
        return cached
    th = th or Thresholds()
    basis, n_steps, step_s, rows = _composition(ctx, th)
    notes: list[str] = []
    settings = run_settings(ctx.run.meta)
    fig = figures(ctx)  # its per-step tokens and phase walls, computed once
    steps, walls = fig.step_rows, fig.phase_walls
    ratios = token_ratios(walls, steps, settings, th.ratio_min_forward_s)
    decode = None
    try:
        decode = _decode(ctx, steps, settings)
    except (ValueError, ZeroDivisionError) as exc:  # a figure the run got wrong
        notes.append(f"decode roofline not available: {exc}")
    if decode is not None and decode.assumptions:
        notes.append("decode roofline assumes " + "; ".join(decode.assumptions))
    framework = _framework(ctx)
    for figs in framework.values():
        status = figs.get("framework_mfu", {}).get("status")
        if status and status != "ok":
            key = figs["framework_mfu"]["key"]
            notes.append(f"{key} is {status}: not used as evidence")
    verdicts = _verdicts(ctx, th, ratios, decode, framework)
    result = Assessment(
        basis=basis,
        steps=n_steps,
        step_s=step_s,
        composition=sorted(rows, key=lambda r: -r["share"]),
        bound=_bound(rows, th),
        verdicts=verdicts,
        ratios=ratios.to_dict() if ratios else None,
        decode=decode,
        framework=framework,
        notes=notes,
        nothing_to_judge=None if rows else _nothing(ctx),
    )
    ctx.__dict__["_bound"] = result
    return result


def _nothing(ctx: AnalysisContext) -> str:
    if not facts(ctx).spans:
        return "nothing to judge: the run has no phase timing (no spans, no framework step times)"
    return "nothing to judge: the phases cover no step time"


def _verdict_text(a: Assessment) -> str | None:
    if not a.composition:
        return None
    if not a.bound:
        top = ", ".join(f"{r['phase']} {r['share']:.0%}" for r in a.composition[:3])
        return f"no phase dominates the step: {top}"
    rows = [next(r for r in a.composition if r["phase"] == p) for p in a.bound]
    shares = [
        f"{r['share']:.0%}" + (" with the GPUs waiting" if r["activity"] == "wait" else "")
        for r in rows
    ]
    if len(a.bound) == 1:
        text = f"{a.bound[0]} bounds the step ({shares[0]} of it"
    else:
        text = f"{a.bound[0]} and {a.bound[1]} bound the step ({shares[0]} and {shares[1]}"
    text += f", {a.step_s:.1f} s per step)" if a.step_s else ")"
    unjudged: dict[str, list[str]] = {}
    for phase in a.bound:
        v = a.verdicts.get(phase)
        if v is None:
            continue
        if v.verdict == "slow":
            text += f"; {v.why}: slow for its tokens"
        elif v.verdict == "healthy":
            text += f"; {v.why}: within the healthy range"
        elif v.verdict == "borderline":
            text += f"; {v.why}: above the healthy range, not yet slow"
        else:
            unjudged.setdefault(v.why, []).append(phase)
    for why, phases in unjudged.items():
        text += f"; {' and '.join(phases)}: speed not judged ({why})"
    return text


def bound_summary(ctx: AnalysisContext, th: Thresholds | None = None) -> dict[str, Any]:
    """The ``bound`` section of the diagnosis (docs/ANALYZE_JSON.md), JSON-able: ``basis``,
    ``verdict`` (one sentence, or None with ``nothing_to_judge``), ``bound`` (the phases that
    bound the step), ``composition`` (per phase: seconds per step, share 0–1, ``activity``
    busy / wait, ``util_gpu_pct``), ``phases`` (per busy phase its verdict and figures),
    ``ratios`` (the cross-phase ratios), ``decode`` (the decode roofline), ``notes``."""
    try:
        a = assess(ctx, th)
    except Exception as exc:  # the bound must never take the diagnosis down
        return {"basis": None, "verdict": None, "nothing_to_judge": None,
                "notes": [f"step bound failed: {type(exc).__name__}: {exc}"]}  # fmt: skip
    per_step = max(1, a.steps)
    return {
        "basis": a.basis,
        "verdict": _verdict_text(a),
        "nothing_to_judge": a.nothing_to_judge,
        "bound": list(a.bound),
        "steps": a.steps,
        "step_s": _round(a.step_s),
        "composition": [
            {
                "phase": r["phase"],
                "seconds_per_step": _round(r["seconds"] / per_step),
                "share": _round(r["share"]),
                "activity": r["activity"],
                "util_gpu_pct": _round(r["util_gpu_pct"]),
            }
            for r in a.composition
        ],
        "phases": [v.to_dict() for v in a.verdicts.values()],
        "ratios": a.ratios,
        "decode": a.decode.to_dict() if a.decode else None,
        "notes": list(a.notes),
    }
