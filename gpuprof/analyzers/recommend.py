"""Findings -> ranked, concrete knob changes for the run's framework.

`recommend` looks each finding's kind up in the knob catalogue (`gpuprof.analyzers.knobs`) for
the run's framework (from ``RunMeta.framework`` or detected from the command line), keeps the
spelling that fits the framework version, reads the knob's current value from
``RunMeta.knobs`` or the command line, computes a suggested value with the row's rule, and
ranks the results by expected gain (GPU-seconds) × the finding's confidence. A kind the
framework has no knob for falls back to the plain-PyTorch advice.
"""

from __future__ import annotations

import itertools
import re
from dataclasses import dataclass
from typing import Any

from gpuprof.analyzers.findings import Finding
from gpuprof.analyzers.knobs import (
    CATALOGUE,
    FRAMEWORKS,
    NOT_THE_CAUSE,
    RELATIVE,
    SUGGEST_RULES,
    KnobEntry,
)
from gpuprof.commandline import coerce, parse_knobs, tokens
from gpuprof.frameworks import framework_module
from gpuprof.model import RunMeta

_ALIASES: dict[str, str] = {
    "open_r1": "trl",
    "open-r1": "trl",
    "openr1": "trl",
    "ms-swift": "swift",
    "ms_swift": "swift",
    "torch": "pytorch",
}
_TRL_FLAGS = frozenset(
    {"use_vllm", "vllm_mode", "num_generations", "max_completion_length", "steps_per_generation"}
)
_LATEST: tuple[int, ...] = (999999,)
_SPEC = re.compile(r"^\s*(>=|<=|==|!=|>|<)\s*([0-9][\w.]*)\s*$")


@dataclass
class Recommendation:
    """One concrete action.

    ``current`` is the knob's value as the run set it (None when neither the recorded knobs
    nor the command line say); ``default`` the framework default the suggestion was computed
    from in that case. ``expected_gain_share`` is the finding's share × the knob's gain factor
    (0–1 of the run's GPU-time); ``expected_gain_gpu_s`` the GPU-seconds that is.
    """

    kind: str
    framework: str
    knob: str
    current: Any
    suggested: Any
    expected_gain_share: float
    expected_gain_gpu_s: float
    confidence: float
    rationale: str
    versions: str = ""
    default: Any = None
    fallback: bool = False
    """True when the advice is plain-PyTorch because the framework has no knob for the kind."""

    @property
    def score(self) -> float:
        """Ranking key: expected GPU-seconds won back × confidence."""
        return self.expected_gain_gpu_s * self.confidence

    def to_dict(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "framework": self.framework,
            "knob": self.knob,
            "current": self.current,
            "suggested": self.suggested,
            "expected_gain_share": round(float(self.expected_gain_share), 5),
            "expected_gain_gpu_s": round(float(self.expected_gain_gpu_s), 3),
            "confidence": round(float(self.confidence), 3),
            "rationale": self.rationale,
            "versions": self.versions,
            "default": self.default,
            "fallback": self.fallback,
        }


# --------------------------------------------------------------------------------------------
# Command-line parsing


def _norm(name: str) -> str:
    return name.lstrip("-+").replace("-", "_").lower()


def detect_framework(meta: RunMeta) -> str:
    """``meta.framework`` when it names a known framework, else guessed from the command."""
    if meta.framework:
        name = meta.framework.strip().lower()
        name = _ALIASES.get(name, name)
        if name in FRAMEWORKS:
            return name
    argv = tokens(meta.command)
    text = " ".join(argv)
    low = text.lower()
    if "verl.trainer" in low or any(t.lstrip("+").startswith("actor_rollout_ref.") for t in argv):
        return "verl"
    if "openrlhf" in low:
        return "openrlhf"
    for a, b in itertools.pairwise(argv):
        if a.rsplit("/", 1)[-1] == "swift" and b in ("rlhf", "sft", "pt", "rollout"):
            return "swift"
    if "swift.cli" in low or "swift/cli" in low:
        return "swift"
    if (
        any(t.rsplit("/", 1)[-1] == "trl" for t in argv)
        or re.search(r"\btrl\b", low)
        or "grpotrainer" in low
        or "open_r1" in low
        or "open-r1" in low
    ):
        return "trl"
    # a GRPO script launched with TRL's GRPOConfig flags (swift was ruled out above)
    flags = {_norm(k) for k in parse_knobs(argv)}
    if flags & _TRL_FLAGS:
        return "trl"
    return "pytorch"


# --------------------------------------------------------------------------------------------
# Catalogue selection


def version_tuple(text: str | None) -> tuple[int, ...] | None:
    """``"v0.10.2.post1"`` -> ``(0, 10, 2)``: the leading numeric release components."""
    if not text:
        return None
    parts: list[int] = []
    for piece in str(text).strip().lstrip("vV").split("."):
        digits = re.match(r"\d+", piece)
        if digits is None:
            break
        parts.append(int(digits.group()))
        if digits.end() < len(piece):
            break  # "0rc1", "1dev": stop at the pre/dev marker
    if not parts:
        return None
    while len(parts) > 1 and parts[-1] == 0:
        parts.pop()
    return tuple(parts)


def version_in(version: tuple[int, ...], spec: str) -> bool:
    """Whether ``version`` satisfies a comma-joined specifier such as ``">=0.5,<=0.7.0"``."""
    for clause in filter(None, (c.strip() for c in spec.split(","))):
        match = _SPEC.match(clause)
        if match is None:
            continue  # unparseable clause: do not exclude
        bound = version_tuple(match.group(2)) or (0,)
        op = match.group(1)
        ok = {
            ">=": version >= bound,
            "<=": version <= bound,
            ">": version > bound,
            "<": version < bound,
            "==": version == bound,
            "!=": version != bound,
        }[op]
        if not ok:
            return False
    return True


def _applies(entry: KnobEntry, version: tuple[int, ...] | None) -> bool:
    return not entry.versions or version is None or version_in(version, entry.versions)


def _select(
    framework: str, kind: str, version: tuple[int, ...] | None, present: set[str]
) -> list[KnobEntry]:
    """One row per setting: the spelling for the version, else the one the run uses, else
    the newest."""
    rows = [e for e in CATALOGUE if e.framework == framework and e.kind == kind]
    if version is not None:
        return [e for e in rows if _applies(e, version)]
    chosen: dict[str, KnobEntry] = {}
    for entry in rows:
        best = chosen.get(entry.setting)
        if best is None or _rank_unknown(entry, present) > _rank_unknown(best, present):
            chosen[entry.setting] = entry
    return list(chosen.values())


def _rank_unknown(entry: KnobEntry, present: set[str]) -> tuple[bool, bool]:
    return (_norm(entry.knob) in present, _applies(entry, _LATEST))


class _Settings:
    """The run's settings: recorded knobs first, then the parsed command line."""

    def __init__(self, meta: RunMeta) -> None:
        self.values: dict[str, Any] = {}
        for key, value in parse_knobs(meta.command).items():
            self.values[_norm(key)] = coerce(value)
        for key, value in (meta.knobs or {}).items():
            self.values[_norm(str(key))] = coerce(value)

    def get(self, knob: str) -> tuple[bool, Any]:
        key = _norm(knob)
        return (key in self.values, self.values.get(key))


def _context(meta: RunMeta, framework: str, settings: _Settings) -> dict[str, Any]:
    per_host: dict[str, int] = {}
    for gpu in meta.gpus or []:
        host = str(gpu.get("host", ""))
        per_host[host] = per_host.get(host, 0) + 1
    return {
        "gpus_per_host": max(per_host.values()) if per_host else None,
        "samples_per_prompt": _samples_per_prompt(framework, settings),
        # verl's Megatron config (ppo_megatron_trainer, actor.megatron.*), `megatron rlhf`
        "megatron": any("megatron" in str(part).lower() for part in meta.command or [])
        or any("megatron" in key for key in settings.values),
    }


def _samples_per_prompt(framework: str, settings: _Settings) -> int | None:
    """Responses generated per prompt (verl ``rollout.n``, TRL ``num_generations``…) when the
    run's settings name it; None when unknown."""
    try:
        knob = framework_module(framework).SIM_FLAGS.get("num_generations")
    except KeyError:  # a framework without a module: no setting to read
        return None
    if not knob:
        return None
    known, value = settings.get(knob)
    number = _positive(value) if known else None
    return int(number) if number is not None else None


def _fmt(value: Any) -> str:
    if value is None:
        return "unset"
    if isinstance(value, bool):
        return str(value)
    if isinstance(value, float):
        return f"{value:g}"
    return str(value)


def _build(
    entry: KnobEntry,
    finding: Finding,
    settings: _Settings,
    ctx: dict[str, Any],
    *,
    fallback: bool,
) -> Recommendation | None:
    known, current = settings.get(entry.knob)
    if not known:
        current = None
    default = entry.default
    if isinstance(default, str) and default.startswith("@"):
        default = settings.get(default[1:])[1] or 1
    base = current if known and current is not None else default
    evidence = finding.evidence or {}
    observed = None
    if entry.rule == "less_often" and not known:
        # an every-N setting not on the command line: the period the run shows is its value
        # (a config file set it), whatever the framework's default says
        if not _times_phase(entry, evidence):
            return None
        observed = _positive(evidence.get("every_n_steps"))
        if observed is not None:
            base = int(observed) if float(observed).is_integer() else observed
    suggested = SUGGEST_RULES[entry.rule](base, entry.arg, evidence, ctx)
    if suggested is NOT_THE_CAUSE:
        return None
    if suggested is None:
        if known or entry.rule not in RELATIVE:
            return None  # e.g. an every-N setting already at "never"
        suggested = RELATIVE[entry.rule].format(arg=entry.arg)
    if known and current == suggested and type(current) is type(suggested):
        return None  # already set as suggested: this knob is not the cause
    # not on the command line, and its default is what we would suggest: the run's config file
    # may set it otherwise, so the advice is to check it (at half the weight)
    check = not known and default == suggested and type(default) is type(suggested)
    gain = entry.gain * (0.5 if check else 1.0)
    share = min(1.0, max(0.0, float(finding.share) * gain))
    gain_s = max(0.0, float(finding.gpu_seconds_lost) * gain)
    if known:
        shown = _fmt(current)
    elif observed is not None:
        shown = f"{_fmt(base)} (observed period)"
    elif check:
        shown = "set in a config file"
    else:
        shown = f"{_fmt(default)} (default)"
    rationale = entry.rationale.format(
        knob=entry.knob,
        current=shown,
        suggested=_fmt(suggested),
        lost_gpu_s=f"{float(finding.gpu_seconds_lost):.0f}",
    )
    if check:
        rationale = (
            f"Check {entry.knob}: it is not on the command line and its default is already "
            f"{_fmt(default)}, but the finding fits it being set otherwise. " + rationale
        )
    if evidence.get("measure") == "forward_ratio":
        rationale += (
            " The gain is an estimate: the finding rests on a ratio of phase times, not on a "
            "measurement against the GPUs."
        )
    return Recommendation(
        kind=finding.kind,
        framework=entry.framework,
        knob=entry.knob,
        current=current if known or observed is None else shown,
        suggested=suggested,
        expected_gain_share=share,
        expected_gain_gpu_s=gain_s,
        confidence=min(1.0, max(0.0, float(finding.confidence))),
        rationale=rationale,
        versions=entry.versions,
        default=None if known or observed is not None else default,
        fallback=fallback,
    )


_PERIODIC_PHASE = {"save": "checkpoint", "eval": "eval"}
"""A periodic setting → the phase it schedules (a save period does not cause validations)."""


def _times_phase(entry: KnobEntry, evidence: Any) -> bool:
    """Whether a periodic-stall knob schedules one of the phases the finding names (or the
    finding names none: a spike no phase explains)."""
    phase = _PERIODIC_PHASE.get(entry.setting)
    named = [p for p in (evidence.get("phases") or []) if p in _PERIODIC_PHASE.values()]
    return phase is None or not named or phase in named


def _positive(value: Any) -> float | None:
    try:
        number = float(value)
    except (TypeError, ValueError):
        return None
    return number if number > 0 and number == number else None


def recommend(
    findings: list[Finding], meta: RunMeta, *, framework_version: str | None = None
) -> list[Recommendation]:
    """Ranked knob changes for the findings (best expected gain × confidence first).

    ``framework_version`` (e.g. ``"0.4.1"``) picks the knob spellings of that version; without
    it the spelling the command line uses wins, else the newest. A kind with no row for the
    framework (at that version) gets the plain-PyTorch advice, flagged ``fallback``.
    """
    framework = detect_framework(meta)
    version = version_tuple(framework_version)
    settings = _Settings(meta)
    present = set(settings.values)
    ctx = _context(meta, framework, settings)
    out: list[Recommendation] = []
    for finding in findings:
        rows = _select(framework, finding.kind, version, present)
        fallback = not rows and framework != "pytorch"
        if fallback:
            rows = _select("pytorch", finding.kind, None, present)
        seen: set[str] = set()
        phases = set((finding.evidence or {}).get("phases") or [])
        for entry in rows:
            # a row for one phase of its kind (the critic's update) when the finding says so
            if entry.knob in seen or (entry.phase and phases and entry.phase not in phases):
                continue
            rec = _build(entry, finding, settings, ctx, fallback=fallback)
            if rec is not None:
                seen.add(entry.knob)
                out.append(rec)
    out.sort(key=lambda r: (-r.score, -r.expected_gain_share, r.kind, r.knob))
    return out
