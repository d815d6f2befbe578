"""The knob catalogue: which setting of which framework fixes which stall, as data: each
framework's rows live in its module under `gpuprof.frameworks` (``KNOBS``), beside the names
its timers and logs use.

Each row of `CATALOGUE` names a knob exactly as its framework spells it (without the leading
``--`` of a command-line flag), the framework versions the spelling applies to (a PEP 440
specifier set, ``""`` for every version), how to compute a suggested value (``rule`` and
``arg``, see `SUGGEST_RULES`), the framework's default (used when the current value is not
on the command line), a rationale template and the expected-gain factor: the fraction of the
finding's lost GPU-seconds this knob typically wins back.

Rows that share ``framework``, ``kind`` and ``setting`` are alternative spellings of one
setting across versions; `recommend` keeps one of them.

Names and version ranges were checked against the frameworks' own sources (release tags):
verl ``verl/trainer/config/*.yaml`` (v0.2 … v0.7.0 and main), TRL ``trl/trainer/grpo_config.py``
(v0.14 … v1.9), ms-swift ``swift/`` arguments (v3.0 … v4.5), OpenRLHF
``openrlhf/cli/train_ppo_ray.py`` (v0.5 … v0.11; flat flags until v0.10.1, dotted groups such as
``--vllm.gpu_memory_utilization`` from v0.10.2). PyTorch rows are the plain-PyTorch fallback:
PyTorch API arguments (``DataLoader``, ``torch.compile``, DDP) or the usual names of a
hand-written loop's own settings.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from typing import Any

from gpuprof.analyzers.evidence import Evidence
from gpuprof.analyzers.settings import num as _num
from gpuprof.frameworks import FRAMEWORKS, framework_module
from gpuprof.frameworks._knob import KnobEntry

# --------------------------------------------------------------------------------------------
# Suggestion rules: (base value, rule argument, finding evidence, context) -> suggested value.
# ``base`` is the current value, or the framework default when the current one is unknown.
# ``context`` holds run facts (``gpus_per_host``). Returning None means "no concrete value".

SuggestFn = Callable[[Any, Any, Mapping[str, Any], dict[str, Any]], Any]


def _like(base: Any, value: float) -> int | float:
    """``value`` as an int when the base value was an integer."""
    if isinstance(base, int) or (isinstance(base, float) and base.is_integer()):
        return round(value)
    return round(value, 3)


def evidence_value(evidence: Mapping[str, Any], name: str) -> Any:
    """Field ``name`` of a finding's evidence, as a rule reads it.

    Typed evidence (`Evidence`) is read by attribute, so a rule and a detector that disagree on
    a name fail loudly (``AttributeError``) instead of falling back to a generic suggestion;
    a plain mapping (a hand-built finding) is read with ``.get``.
    """
    if isinstance(evidence, Evidence):
        return getattr(evidence, name)
    return evidence.get(name) if isinstance(evidence, Mapping) else None


EVIDENCE_READS: dict[str, str] = {
    "memory_fraction": "mem_peak_frac",
    "less_often": "every_n_steps",
    "cap_length": "response_length_mean_tokens",
}
"""Rule → the evidence field its evidence-driven branch reads (tests check every catalogue row
whose rule is here against the real finding of its kind)."""


def _headroom(evidence: Mapping[str, Any], base: float) -> float:
    """Unused memory share (0–1) at the measured peak, else what ``base`` leaves below 0.9."""
    peak = _num(evidence_value(evidence, EVIDENCE_READS["memory_fraction"]))
    if peak is not None:
        return min(1.0, max(0.0, 1.0 - peak))
    return max(0.0, 0.9 - base)


def _rule_memory_fraction(base: Any, arg: Any, ev: dict[str, Any], ctx: dict[str, Any]) -> Any:
    # raise a memory fraction by most of the unused memory, capped at ``arg`` (0.9)
    current = _num(base)
    if current is None:
        return None
    cap = float(arg)
    return round(max(current, min(cap, current + _headroom(ev, current) * 0.8)), 2)


def _rule_workers(base: Any, arg: Any, ev: dict[str, Any], ctx: dict[str, Any]) -> Any:
    current = _num(base) or 0.0
    return int(max(int(arg), 2 * current))


def _rule_set(base: Any, arg: Any, ev: dict[str, Any], ctx: dict[str, Any]) -> Any:
    return arg


def _rule_multiply(base: Any, arg: Any, ev: dict[str, Any], ctx: dict[str, Any]) -> Any:
    current = _num(base)
    if current is None or current <= 0:
        return None
    return _like(base, current * float(arg))


def _rule_divide(base: Any, arg: Any, ev: dict[str, Any], ctx: dict[str, Any]) -> Any:
    current = _num(base)
    if current is None or current <= 0:
        return None
    return max(1, int(current // float(arg)))


def _rule_less_often(base: Any, arg: Any, ev: dict[str, Any], ctx: dict[str, Any]) -> Any:
    # every-N-steps settings: N <= 0 means "never" already, so this setting is not the cause;
    # without a current value or default, the period the detector measured stands in for it
    current = _num(base)
    if current is None:
        period = _num(evidence_value(ev, EVIDENCE_READS["less_often"]))
        return int(period * float(arg)) if period is not None and period > 0 else None
    if current <= 0:
        return None
    return _like(base, current * float(arg))


RELATIVE: dict[str, str] = {
    "multiply": "{arg}× the current value",
    "divide": "the current value ÷ {arg}",
    "cap_length": "about {arg}× the mean response length",
    "memory_fraction": "current + 0.8 × the unused share (at most {arg})",
}
"""How a rule's suggestion reads when the current value is unknown and has no default.
``less_often`` has none: without the current period or one the run shows, there is no
sentence to make ("every every 4× as many steps")."""


NOT_THE_CAUSE = object()
"""What a rule returns when the evidence says its knob is not the cause (no advice at all,
unlike None: no concrete value, which may still read as a relative suggestion)."""

CAP_BINDING_CLIP_RATIO = 0.5
"""With at least this share of responses cut at the length cap, the cap is what most
responses reach, not a tail to cut: no shorter cap is suggested."""


def _rule_cap_length(base: Any, arg: Any, ev: dict[str, Any], ctx: dict[str, Any]) -> Any:
    # cap the response length near ``arg`` × the mean response (a power of two), never above
    # the current cap; without a measured mean, halve the current cap
    clip = _num(evidence_value(ev, "response_clip_ratio")) if ev else None
    if clip is not None and clip >= CAP_BINDING_CLIP_RATIO:
        return NOT_THE_CAUSE
    current = _num(base)
    mean = _num(evidence_value(ev, EVIDENCE_READS["cap_length"]))
    if mean is not None and mean > 0:
        cap = 2 ** math.ceil(math.log2(mean * float(arg)))
        return int(cap if current is None else min(current, cap))
    return None if current is None else max(1, int(current // 2))


def _rule_gpus_per_host(base: Any, arg: Any, ev: dict[str, Any], ctx: dict[str, Any]) -> Any:
    return int(ctx.get("gpus_per_host") or arg)


def _rule_set_when_sampled(base: Any, arg: Any, ev: dict[str, Any], ctx: dict[str, Any]) -> Any:
    # a per-prompt cache only pays when each prompt is sampled several times
    samples = ctx.get("samples_per_prompt")
    return arg if samples is not None and samples > 1 else NOT_THE_CAUSE


def _rule_multiply_in_step(base: Any, arg: Any, ev: dict[str, Any], ctx: dict[str, Any]) -> Any:
    # per-step work (logging that syncs the GPU) explains idle time inside steps only: not a
    # run with no phase spans at all, nor idle time wholly before the first or after the last
    # step; evidence that does not say (older runs, other kinds) leaves the advice as it was
    if ev and evidence_value(ev, "spans_recorded") is False:
        return NOT_THE_CAUSE
    in_step = _num(evidence_value(ev, "idle_in_step_gpu_s")) if ev else None
    if in_step is not None and in_step <= 0:
        return NOT_THE_CAUSE
    return _rule_multiply(base, arg, ev, ctx)


MOE_TOTAL_OVER_ACTIVE = 1.5
"""A model whose total parameters are at least this many times its active ones is a mixture
of experts (Mixtral 8x7B: 3.6×, Qwen3-30B-A3B: 10×; a dense model: 1×)."""


def _rule_expert_parallel(base: Any, arg: Any, ev: dict[str, Any], ctx: dict[str, Any]) -> Any:
    # expert parallelism only exists for a mixture of experts trained with Megatron, and only
    # helps when every GPU still holds every expert
    active = _num(evidence_value(ev, "model_params")) if ev else None
    total = _num(evidence_value(ev, "model_total_params")) if ev else None
    if not (active and total and total >= MOE_TOTAL_OVER_ACTIVE * active):
        return NOT_THE_CAUSE
    if not ctx.get("megatron"):
        return NOT_THE_CAUSE
    current = _num(base)
    if current is not None and current > 1:
        return NOT_THE_CAUSE
    return int(min(float(arg), ctx.get("gpus_per_host") or float(arg)))


SUGGEST_RULES: dict[str, SuggestFn] = {
    "memory_fraction": _rule_memory_fraction,
    "workers": _rule_workers,
    "set": _rule_set,
    "multiply": _rule_multiply,
    "divide": _rule_divide,
    "less_often": _rule_less_often,
    "cap_length": _rule_cap_length,
    "gpus_per_host": _rule_gpus_per_host,
    "set_when_sampled": _rule_set_when_sampled,
    "expert_parallel": _rule_expert_parallel,
    "multiply_in_step": _rule_multiply_in_step,
}
"""Rule name -> function computing the suggested value (see the module docstring)."""


CATALOGUE: tuple[KnobEntry, ...] = tuple(
    row for name in FRAMEWORKS for row in framework_module(name).KNOBS
)
"""The knob catalogue: every (framework, stall kind, knob) the recommender knows."""


def entries(framework: str | None = None, kind: str | None = None) -> list[KnobEntry]:
    """Catalogue rows for a framework and/or a stall kind, in table order."""
    return [
        e
        for e in CATALOGUE
        if (framework is None or e.framework == framework) and (kind is None or e.kind == kind)
    ]
