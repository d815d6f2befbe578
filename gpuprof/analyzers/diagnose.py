"""Run every stall detector over a run and assemble the diagnosis: findings, recommendations,
a summary, and notes on what the run lacked.

``diagnose(run)`` never raises on a well-formed `Run`, however empty: a detector that fails is
reported in ``notes`` and the others go on.
"""

from __future__ import annotations

import pickle
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from fractions import Fraction
from typing import Any

import numpy as np
import pandas as pd

from gpuprof.analyzers import lanes
from gpuprof.analyzers.basic import finite_or_none, step_times
from gpuprof.analyzers.basis import data_basis
from gpuprof.analyzers.efficiency import efficiency_summary
from gpuprof.analyzers.findings import (
    BUSY_LOSS_KINDS,
    STEP_INDEPENDENT_KINDS,
    AnalysisContext,
    Finding,
    Thresholds,
)
from gpuprof.analyzers.nodes import node_summary
from gpuprof.analyzers.parts import Parts, exact_sum, facts, sampled
from gpuprof.analyzers.stacks import attach_stacks
from gpuprof.analyzers.stalls import DETECTORS, SIDE_BY_SIDE, STALLS, Stall
from gpuprof.analyzers.stalls._bound import bound_summary
from gpuprof.analyzers.stalls._startup import claim_startup
from gpuprof.analyzers.stalls._timing import RESIDUE, timing
from gpuprof.model import Run

JSON_SCHEMA_VERSION = 2
"""Version of the ``gpuprof analyze --json`` document (docs/ANALYZE_JSON.md)."""

__all__ = [
    "DETECTORS",
    "Diagnosis",
    "diagnose",
    "diagnose_parts",
    "no_finding_sentence",
    "nothing_to_judge",
    "summarize",
]


@dataclass
class Diagnosis:
    """What `diagnose` found: findings sorted by GPU-seconds lost, ranked recommendations,
    headline figures (``summary``) and ``notes`` on missing or suspicious data."""

    findings: list[Finding]
    recommendations: list[Any]
    summary: dict[str, Any]
    notes: list[str] = field(default_factory=list)

    def to_dict(self, top: int | None = None) -> dict[str, Any]:
        findings = self.findings[:top] if top else self.findings
        recs = self.recommendations[:top] if top else self.recommendations
        return {
            "schema_version": JSON_SCHEMA_VERSION,
            "summary": self.summary,
            "findings": [f.to_dict() for f in findings],
            "recommendations": [r.to_dict() for r in recs],
            "notes": list(self.notes),
        }


def diagnose(
    run: Run,
    thresholds: Thresholds | None = None,
    *,
    context: AnalysisContext | None = None,
    workers: int = 1,
    series: Any = None,
    budget: int | None = None,
    spill_dir: str | None = None,
) -> Diagnosis:
    """Findings, recommendations and summary of ``run`` (no I/O but ``series``).

    ``context``: an `AnalysisContext` of the same run whose alignment the caller also uses
    (the report's per-step table), so it is computed once. ``workers`` ≥ `PARTS_MIN_WORKERS`:
    a run of several nodes and at least `PARTS_MIN_SAMPLES` GPU samples (below `FEW_WORKERS`
    workers, `PARTS_MIN_SAMPLES_FEW`) whose context has not aligned its samples yet is
    diagnosed in ``workers`` parts of consecutive nodes, each held by a process of its own
    (`part_workers`); ``workers`` > 1: another run of at least
    `SIDE_BY_SIDE_MIN_SAMPLES` runs the two groups of detectors that do not depend on each
    other (`stalls.SIDE_BY_SIDE`) at once, one in a forked child (`lanes`). The diagnosis is
    the same either way. Only a process without threads that may hold locks should ask for
    it.

    ``series``: where the sampled series of a ``run`` read without them are
    (`load_cache.KeptSeries`, `loader.load_for_diagnosis`): in parts, each worker reads its
    nodes' own; otherwise they are read here first. Raises `load_cache.SeriesUnreadable`
    when they no longer read (the run was kept again meanwhile, or its kept form damaged).

    ``budget``: bytes the parts of a run of several nodes may hold in memory, all processes
    together: the run is diagnosed node by node on ``workers`` processes (one: this one
    alone), the parts used longest ago written to disk when the budget is full
    (`held_parts`, into ``spill_dir``: by default `held_parts.spill_root`); the same
    diagnosis, whatever the budget. Raises `errors.RunError` when it
    cannot go on so (a part does not read back, the disk is full) rather than read the run
    whole here.
    """
    th = thresholds or Thresholds()
    ctx = context if context is not None and context.run is run else AnalysisContext(run)
    if budget is not None and "samples" not in ctx.__dict__:
        got = _within(run, th, ctx, workers, series, budget, spill_dir)
        if got is not None:
            return got
    samples = series.rows.get("gpu", 0) if series is not None else len(run.gpu)
    least = parts_min_samples(workers)
    if least is not None and samples >= least and "samples" not in ctx.__dict__:
        from gpuprof.analyzers.part_workers import PartsLost, WorkerParts
        from gpuprof.analyzers.parts import node_groups

        groups = node_groups(run, workers, series=series)
        if groups is not None and len(groups) > 1:
            options = ctx.__dict__.get("_efficiency_options")
            try:
                with WorkerParts(run, workers, options=options, series=series) as parts:
                    return diagnose_parts(parts, th)
            except PartsLost:  # a worker died: the run is diagnosed here, from the start
                pass
    if series is not None:  # in this process after all: with its series
        run = replace(run, **series.read())
        options = ctx.__dict__.get("_efficiency_options")
        ctx = AnalysisContext(run)
        if options is not None:
            ctx.__dict__["_efficiency_options"] = options
    return diagnose_parts(Parts.of(ctx), th, workers=workers)


def _within(
    run: Run, th: Thresholds, ctx: AnalysisContext, workers: int, series: Any, budget: int,
    spill_dir: str | None,
) -> Diagnosis | None:  # fmt: skip
    """`diagnose` within ``budget`` (node by node, parts written out when it is full); None
    for a run of one node, which is not cut."""
    from gpuprof.analyzers.held_parts import SpillFailed, clear_stale, spill_root
    from gpuprof.analyzers.part_workers import PartsLost, WorkerParts
    from gpuprof.analyzers.parts import node_groups

    if node_groups(run, None, series=series) is None:
        return None
    options = ctx.__dict__.get("_efficiency_options")
    spill_dir = str(spill_dir if spill_dir is not None else spill_root())
    clear_stale(spill_dir)
    try:
        with WorkerParts(
            run, workers, options=options, series=series, budget=budget, spill_dir=spill_dir
        ) as parts:
            return diagnose_parts(parts, th)
    except (PartsLost, SpillFailed) as exc:
        from gpuprof.errors import RunError

        raise RunError(f"the diagnosis within {budget / 1e9:.1f} GB stopped: {exc}") from None


def parts_min_samples(workers: int) -> int | None:
    """GPU samples from which a run of several nodes is diagnosed in ``workers`` parts (None:
    never, on so few workers)."""
    if workers < PARTS_MIN_WORKERS:
        return None
    # the lanes hold out longer against few parts
    return PARTS_MIN_SAMPLES_FEW if workers < FEW_WORKERS else PARTS_MIN_SAMPLES


PARTS_MIN_SAMPLES = 200_000
"""GPU samples below which a run of several nodes is diagnosed in this process (with its
lanes): forking the workers and combining their figures then costs about what they save."""

FEW_WORKERS = 4
"""Workers below which a run needs `PARTS_MIN_SAMPLES_FEW` samples to be diagnosed in parts."""

PARTS_MIN_SAMPLES_FEW = 400_000
"""`PARTS_MIN_SAMPLES` on 2–3 workers, where two parts break even with the two lanes later
(`bench_part_workers.py --workers 2`, two nodes of 8 GPUs: 214 k samples, parts 0.66 s against
lanes 0.54 s; 427 k, 0.83 s each; 256 GPUs × 4 h, 1.15 M, 4.03 s against 4.83 s)."""

PARTS_MIN_WORKERS = 2
"""Cores from which a run of several nodes is diagnosed in parts rather than in this process
with its two lanes. Since the parts read the spans too (what this process does alone is
~0.6 s of 6.5 s at 256 GPUs × 4 h), two parts beat the two lanes on two cores: 4.03 s
against 4.83 s (one process 6.22 s; docs/PERFORMANCE.md). Before that, with 2.2–3.1 s of
span work in this process, the lanes were faster below 4 cores."""


def diagnose_parts(
    parts: Parts, thresholds: Thresholds | None = None, *, workers: int = 1
) -> Diagnosis:
    """`diagnose` of the run ``parts`` are of: the same diagnosis whether the run is its one
    part or cut into several (`parts.by_node`). ``workers``: as `diagnose`'s, for a run of
    one part."""
    th = thresholds or Thresholds()
    whole = parts.whole
    run = whole.run
    # the detectors take a context when the run is one part (its lanes fork with it)
    target: AnalysisContext | Parts = whole if parts.count == 1 else parts
    has_samples = sampled(parts).samples > 0
    notes = data_notes(whole, th)
    findings: list[Finding] = []
    try:  # start-up and warm-up are claimed first: no stall counts them
        startup = claim_startup(target) if has_samples else None
    except Exception as exc:
        startup = None
        notes.append(f"start-up analysis failed: {type(exc).__name__}: {exc}")
    nodes: list = []  # node_summary's value or failure, when made while a lane runs

    def per_node() -> None:
        try:
            nodes.append(node_summary(whole, th))
        except Exception as exc:  # the per-node figures must not cost the diagnosis
            nodes.append(exc)

    _apply_stalls(target, th, findings, notes, workers, while_waiting=per_node)
    if not any(f.kind == "hot_gpu" for f in findings) and has_samples:
        from gpuprof.analyzers.stalls.hot_gpu import warnings as hot_warnings

        notes.extend(hot_warnings(target, th))  # hot but no measurable loss (yet): still say so
    findings.sort(key=lambda f: (-f.gpu_seconds_lost, f.kind))
    summary = summarize(whole, findings, startup=startup)
    findings = few_steps_hedged(findings, summary["data_basis"], th)
    try:
        attach_stacks(whole, findings)
    except Exception as exc:  # the findings stand without their stacks
        notes.append(f"stack analysis failed: {type(exc).__name__}: {exc}")
    recommendations = _recommend(findings, run, notes)
    summary["bound"] = bound_summary(whole, th)
    if not nodes:
        per_node()
    if isinstance(nodes[0], Exception):
        summary["nodes"] = None
        notes.append(f"per-node analysis failed: {type(nodes[0]).__name__}: {nodes[0]}")
    else:
        summary["nodes"] = nodes[0]
    return Diagnosis(findings, recommendations, summary, notes)


SIDE_BY_SIDE_MIN_SAMPLES = 50_000
"""GPU samples below which every detector runs in this process: the groups then take a few
tens of milliseconds, about what forking a child costs."""


def _apply(
    stall: Stall, ctx: AnalysisContext | Parts, th: Thresholds, findings: list, notes: list
) -> None:
    """One detector: its finding (when it reaches ``th.min_share``) into ``findings`` and
    ``ctx.found``, or a note when it fails."""
    try:
        finding = stall.detect(ctx, th)
    except Exception as exc:  # one broken detector must not hide the others' findings
        notes.append(f"{stall.kind} analysis failed: {type(exc).__name__}: {exc}")
        return
    if finding is not None and finding.share >= th.min_share:
        findings.append(finding)
        ctx.found.append(finding)


def _apply_stalls(
    ctx: AnalysisContext | Parts,
    th: Thresholds,
    findings: list,
    notes: list,
    workers: int,
    while_waiting: Callable[[], None] | None = None,
) -> None:
    """Every detector of `STALLS` in its declared order (earlier stalls claim GPU-time
    first), the two `SIDE_BY_SIDE` groups at once when ``workers`` > 1 and the run is large
    enough: findings, notes and ``ctx.found`` come out as from one process.
    ``while_waiting``: work that needs no finding (the per-node figures), done here once
    this process's group is through, while the child may still run."""
    at = [s.kind for s in STALLS].index(SIDE_BY_SIDE[0][0])
    mid, end = at + len(SIDE_BY_SIDE[0]), at + len(SIDE_BY_SIDE[0]) + len(SIDE_BY_SIDE[1])
    before, one, two, after = STALLS[:at], STALLS[at:mid], STALLS[mid:end], STALLS[end:]
    for stall in before:
        _apply(stall, ctx, th, findings, notes)
    lane = None
    one_part = isinstance(ctx, AnalysisContext)
    if one_part and workers > 1 and len(ctx.run.gpu) >= SIDE_BY_SIDE_MIN_SAMPLES:
        kept = _memo_keys(ctx)
        lane = lanes.start(lambda: _side_lane(ctx, th, one, kept))
    if lane is None:
        for stall in (*one, *two):
            _apply(stall, ctx, th, findings, notes)
    else:
        found = list(ctx.found)
        found_two, notes_two = [], []
        for stall in two:
            _apply(stall, ctx, th, found_two, notes_two)
        if while_waiting is not None:
            while_waiting()
        got = lane.result()
        if got is lanes.FAILED:  # the child sent nothing: its group runs here, as it would have
            ctx.found[:] = found
            found_one, notes_one = [], []
            for stall in one:
                _apply(stall, ctx, th, found_one, notes_one)
        else:
            found_one, notes_one, memos = got
            _take_memos(ctx, memos)
        findings.extend([*found_one, *found_two])
        notes.extend([*notes_one, *notes_two])
        ctx.found[:] = [*found, *found_one, *found_two]
    for stall in after:
        _apply(stall, ctx, th, findings, notes)


_NOT_SENT = ("_found", "_per_frame_cache")
"""Context entries a lane's child never sends back: the findings (sent as its result) and
figures kept per frame object (the parent's frames are other objects)."""


def _memo_keys(ctx: AnalysisContext) -> dict[str, frozenset | None]:
    """The context's figures before a lane starts: name → the keys of a dict of figures
    (``_stalls_phase_cache``…), or None for one figure."""
    return {
        name: frozenset(value) if isinstance(value, dict) else None
        for name, value in ctx.__dict__.items()
    }


def _side_lane(
    ctx: AnalysisContext, th: Thresholds, stalls: tuple[Stall, ...], kept: dict
) -> tuple[list, list, list]:
    """In a lane's child: the group's findings and notes, and every figure it added to the
    context (pickled one by one; one that does not pickle stays behind), so the parent does
    not compute them again."""
    findings: list[Finding] = []
    notes: list[str] = []
    for stall in stalls:
        _apply(stall, ctx, th, findings, notes)
    memos = []
    for name, value in ctx.__dict__.items():
        if name in _NOT_SENT:
            continue
        if name not in kept:
            items = [(name, None, value)]
        elif isinstance(value, dict) and kept[name] is not None:
            items = [(name, key, v) for key, v in value.items() if key not in kept[name]]
        else:
            continue
        for name_, key, v in items:
            try:
                memos.append((name_, key, pickle.dumps(v, protocol=pickle.HIGHEST_PROTOCOL)))
            except Exception:  # the parent computes it again if it needs it
                continue
    return findings, notes, memos


def _take_memos(ctx: AnalysisContext, memos: list) -> None:
    """A lane's figures into the context, where it has none of its own."""
    for name, key, blob in memos:
        try:
            value = pickle.loads(blob)
        except Exception:  # a figure the parent can compute again
            continue
        if key is None:
            ctx.__dict__.setdefault(name, value)
        else:
            target = ctx.__dict__.setdefault(name, {})
            if isinstance(target, dict):
                target.setdefault(key, value)


def few_steps_hedged(
    findings: list[Finding], basis: dict[str, Any], th: Thresholds
) -> list[Finding]:
    """Findings with their confidence capped and the reason in their summary when the data
    is thin: every finding of a run with fewer than `Thresholds.few_readings` GPU readings
    per GPU (a pasted snapshot), and the step-based ones of a run with `Thresholds.few_steps`
    steps or fewer (one or two steps can't tell a pattern from a one-off, and the first step
    also holds start-up)."""
    timing = basis.get("phase_timing") or {}
    steps = int(timing.get("steps") or 0)
    gpu = basis.get("gpu_samples") or {}
    readings = gpu.get("samples", 0) / max(1, gpu.get("gpus") or 1) if gpu else None
    few_readings = readings is not None and readings < th.few_readings
    few_steps = bool(timing) and steps <= th.few_steps
    if not few_readings and not few_steps:
        return findings
    out = []
    for f in findings:
        if few_readings:
            why = (
                f" — low confidence: only {readings:.0f} reading(s) per GPU, a snapshot rather "
                "than a record of the run"
            )
        elif f.kind in STEP_INDEPENDENT_KINDS:
            out.append(f)
            continue
        elif steps:
            why = (
                f" — low confidence: only {steps} step{'s' if steps != 1 else ''}, which can't "
                "tell a pattern from a one-off"
            )
        else:
            why = " — low confidence: no step boundaries"
        confidence = min(float(f.confidence), th.few_steps_max_confidence)
        out.append(replace(f, confidence=confidence, summary=f.summary + why))
    return out


def _recommend(findings: list[Finding], run: Run, notes: list[str]) -> list[Any]:
    from gpuprof.analyzers.recommend import recommend

    try:
        return recommend(findings, run.meta)
    except Exception as exc:
        notes.append(f"recommendations failed: {type(exc).__name__}: {exc}")
        return []


def summarize(
    ctx: AnalysisContext, findings: list[Finding], *, startup: dict[str, Any] | None = None
) -> dict[str, Any]:
    """Headline figures: duration (s), GPUs, GPU-hours, mean utilisation (and which measure),
    idle GPU-seconds by cause (``startup``: before the first step and in warm-up steps, not a
    stall), step time p50/p95 (s), tokens/s, share of time per phase."""
    run = ctx.run
    got = sampled(ctx)
    totals = ctx.totals if got.samples else {}
    steps = step_figures(ctx)
    idle_total = finite_or_none(totals.get("idle_gpu_s"))
    by_cause: dict[str, float] = {}
    busy_loss: dict[str, float] = {}
    for f in findings:
        into = busy_loss if f.kind in BUSY_LOSS_KINDS else by_cause
        into[f.kind] = round(into.get(f.kind, 0.0) + f.gpu_seconds_lost, 3)
    for key, cause in (("idle_gpu_s", "startup"), ("wind_down_idle_gpu_s", "wind_down")):
        if startup and startup.get(key):
            by_cause[cause] = round(float(startup[key]), 3)
    if idle_total is not None:
        by_cause["other_idle"] = round(max(0.0, idle_total - sum(by_cause.values())), 3)
    phases = []
    if facts(ctx).spans and got.samples:
        table = ctx.by_phase
        for row in table.itertuples(index=False):
            phases.append(
                {
                    "phase": row.phase,
                    "wall_s": finite_or_none(row.wall_s),
                    "gpu_s": finite_or_none(row.gpu_s),
                    "idle_gpu_s": finite_or_none(row.idle_gpu_s),
                    "util_gpu_pct": finite_or_none(row.util_gpu_pct),
                    "share": finite_or_none(row.share),
                }
            )
    basis = "gpu_samples"
    gpus = int(totals.get("gpus") or got.gpus)
    gpu_hours = (finite_or_none(totals.get("gpu_s")) or 0.0) / 3600.0
    t = timing(ctx)
    if t is not None:  # no GPU samples: the framework's phase times are the figures
        basis = "phase_timing"
        gpus = t.gpus if t.gpus_known else gpus
        gpu_hours = t.total_gpu_s / 3600.0 if t.gpus_known else gpu_hours
        walls = [(p, float(t.steps[p].sum())) for p in t.phases]
        # step time no phase covers (the phases are self times: they add up to the steps)
        other = float(t.steps["wall_s"].sum()) - sum(w for _, w in walls)
        if other > RESIDUE * t.wall_s:
            walls.append(("step", other))
        phases = [
            {"phase": p, "wall_s": finite_or_none(w), "gpu_s": None, "idle_gpu_s": None,
             "util_gpu_pct": None, "share": finite_or_none(w / t.wall_s) if t.wall_s else None}
            for p, w in sorted(walls, key=lambda x: -x[1])
        ]  # fmt: skip
    return {
        "run_id": run.meta.run_id,
        "stretch": dict(run.meta.steps) if run.meta.steps else None,
        "basis": basis,
        "framework": run.meta.framework,
        "duration_s": run.duration_s,
        "gpus": gpus,
        "gpu_hours": gpu_hours,
        "mean_util_gpu_pct": finite_or_none(totals.get("util_gpu_pct")),
        "mean_sm_active_pct": finite_or_none(totals.get("sm_active_pct")),
        "busy_measure": totals.get("busy_measure", "util_gpu_pct"),
        "idle_gpu_s": idle_total,
        "idle_gpu_s_by_cause": by_cause,
        "busy_loss_gpu_s_by_cause": busy_loss,
        "steps": steps["steps"],
        "step_time_p50_s": steps["p50_s"],
        "step_time_p95_s": steps["p95_s"],
        "tokens_per_s": steps["tokens_per_s"],
        "phases": phases,
        "startup": startup,
        "efficiency": efficiency_summary(ctx, findings),
        "data_basis": data_basis(ctx, steps["steps"]),
    }


def step_figures(ctx: AnalysisContext) -> dict[str, Any]:
    """The run's recorded steps (``step`` spans of every process, `basic.step_times`) as the
    summary gives them: ``steps`` (distinct step numbers), ``p50_s`` and ``p95_s`` of the
    processes' step durations (s), ``tokens_per_s`` (`basic.tokens_per_s`, its sums exact:
    the same however the run is divided into parts), from every part's step spans."""
    got = Parts.of(ctx).map(_step_part)
    numbers = np.concatenate([g["numbers"] for g in got])
    durations = np.concatenate([g["durations"] for g in got])
    tokens = sum((g["tokens"] for g in got), Fraction(0))
    seconds = sum((g["seconds"] for g in got), Fraction(0))
    processes = len(set().union(*(g["processes"] for g in got)))
    throughput = None
    if processes and seconds > 0:
        throughput = float(tokens) / (float(seconds) / processes)
    return {
        "steps": len(np.unique(numbers)),
        "p50_s": finite_or_none(np.percentile(durations, 50)) if len(durations) else None,
        "p95_s": finite_or_none(np.percentile(durations, 95)) if len(durations) else None,
        "tokens_per_s": throughput,
    }


def _step_part(ctx: AnalysisContext) -> dict[str, Any]:
    """One part's share of `step_figures`: its step numbers (distinct, not NaN), its step
    durations (s), and over its steps that report tokens, their tokens and seconds (exact
    sums) and their processes. A step without a host is in no part: counted nowhere."""
    steps = step_times(ctx.run)
    steps = steps[steps["host"].notna().to_numpy(bool)] if len(steps) else steps
    if steps.empty:
        return {"numbers": np.zeros(0), "durations": np.zeros(0), "tokens": Fraction(0),
                "seconds": Fraction(0), "processes": set()}  # fmt: skip
    numbers = pd.to_numeric(steps["step"], errors="coerce").to_numpy(np.float64)
    tokens = steps["tokens"].to_numpy(dtype=float)
    durations = steps["duration_s"].to_numpy(dtype=float)
    ok = np.isfinite(tokens) & np.isfinite(durations)
    return {
        "numbers": np.unique(numbers[~np.isnan(numbers)]),
        "durations": durations,
        "tokens": exact_sum(tokens[ok]),
        "seconds": exact_sum(durations[ok]),
        "processes": set(zip(steps["host"][ok], steps["pid"][ok])),
    }


def nothing_to_judge(diagnosis: Diagnosis) -> str | None:
    """Why the run gives the analyzers nothing to judge (no GPU samples and no phase
    timing), or None when it does."""
    s = diagnosis.summary
    if s.get("basis") == "gpu_samples" and (s.get("gpus") or 0) > 0:
        return None
    bound = s.get("bound") or {}
    if bound.get("composition"):
        return None
    return (
        "nothing to judge — the run holds no GPU samples and no step or phase times: "
        "nothing to attribute"
    )


def no_finding_sentence(diagnosis: Diagnosis, th: Thresholds | None = None) -> tuple[str, bool]:
    """What to say when there is no finding, and whether it is good news: "no stall" only
    when the data could have shown one; with nothing to judge, or too few steps, or phase
    times without GPU samples, the sentence says how far the data goes."""
    th = th or Thresholds()
    why = nothing_to_judge(diagnosis)
    if why:
        return f"No finding: {why}.", False
    s = diagnosis.summary
    timing = (s.get("data_basis") or {}).get("phase_timing") or {}
    steps = int(timing.get("steps") or 0)
    gpu = (s.get("data_basis") or {}).get("gpu_samples") or {}
    has_gpu = bool(gpu)
    per_gpu = gpu.get("samples", 0) / max(1, gpu.get("gpus") or 1)
    if has_gpu and per_gpu < th.few_readings:
        return (
            f"No stall above the noise threshold in {per_gpu:.0f} reading(s) per GPU — too few "
            "to rule one out.",
            False,
        )
    if timing and steps <= th.few_steps:
        unit = f"{steps} step{'s' if steps != 1 else ''}" if steps else "phase times without steps"
        return (
            f"No stall above the noise threshold in {unit} — too few to rule one out.",
            False,
        )
    if not has_gpu:
        return (
            "No stall above the noise threshold in the phase times; without GPU samples, "
            "idle time inside a phase can't be seen.",
            False,
        )
    return "No stall above the noise threshold was found.", True


def data_notes(run: Run | AnalysisContext, th: Thresholds | None = None) -> list[str]:
    """What the run lacks or gets wrong, as human lines (the analysis still runs). ``run``:
    a run, or the context of one (`parts.Parts.whole`: its samples' figures from its parts)."""
    ctx = run if isinstance(run, AnalysisContext) else AnalysisContext(run)
    run = ctx.run
    got = sampled(ctx)
    notes = list(run.meta.notices)
    if not got.samples:
        notes.append("no GPU samples: GPU findings need NVML data (a CPU-only or host-only run)")
    else:
        for column, label in (("util_gpu_pct", "GPU utilization"), ("mem_used_bytes", "memory")):
            if column not in got.valued:
                notes.append(f"{label} was never available: findings that need it are skipped")
        if "sm_active_pct" not in got.valued:
            notes.append(
                "no GPM SM-activity (pre-Hopper GPU or not supported): utilization is NVML's "
                "'a kernel was running', which overstates how busy the SMs were"
            )
    recorded = facts(ctx)
    if not recorded.spans:
        notes.append(
            "no phase spans: idle time can't be attributed to phases "
            "(use gpuprof.phase() or a framework integration)"
        )
    elif recorded.backwards_spans:
        notes.append(f"{recorded.backwards_spans} spans end before they start and were ignored")
    dropped = dropped_spans(run)
    if dropped:
        notes.append(
            f"{dropped} spans were dropped: the hooks' queue was full while the writer fell "
            "behind (raise GPUPROF_MAX_QUEUED_SPANS, or record fewer spans)"
        )
    notes.extend(_clock_skew_notes(ctx, th or Thresholds()))
    return notes


def _clock_skew_notes(ctx: AnalysisContext, th: Thresholds) -> list[str]:
    run, hosts = ctx.run, sampled(ctx).hosts
    if len(hosts) < 2:
        return []
    clocks = run.meta.clocks or {}
    aligned = {n: c for n, c in clocks.items() if c.get("method") != "reference"}
    if aligned:
        worst = max((c.get("error_ns") or 0 for c in aligned.values()), default=0)
        methods = ", ".join(sorted({str(c.get("method")) for c in aligned.values()}))
        missing = [str(h) for h in hosts if h not in clocks]
        line = (
            f"node clocks aligned on {run.meta.reference_node or 'the first node'}: worst "
            f"error ±{worst / 1e6:.1f} ms ({methods})"
        )
        if missing:
            line += f"; not aligned: {', '.join(missing[:8])}"
        return [line]
    got = Parts.of(ctx).map(_first_sample_per_host)
    first = pd.concat(got).groupby(level=0).min()
    spread_s = float(first.max() - first.min()) / 1e9
    if spread_s > th.clock_skew_note_s:
        return [
            f"hosts' first samples are {spread_s:.1f} s apart: clocks may be skewed "
            "(cross-host figures such as pipeline bubbles are less certain)"
        ]
    return []


def _first_sample_per_host(ctx: AnalysisContext) -> pd.Series:
    """One part's first sample time of each host (ns)."""
    return ctx.run.gpu.groupby("host")["t_ns"].min()


def dropped_spans(run: Run) -> int:
    """Spans the processes' bounded queues dropped (their ``dropped`` events; each holds the
    process's running total, so the last of each process counts)."""
    ev = run.events
    if ev is None or ev.empty or "kind" not in ev:
        return 0
    rows = ev[ev["kind"] == "dropped"]
    if rows.empty:
        return 0
    totals: dict[tuple, int] = {}
    for host, pid, attrs in zip(rows["host"], rows["pid"], rows["attrs"]):
        n = attrs.get("spans") if isinstance(attrs, dict) else None
        if isinstance(n, int | float):
            key = (host, pid)
            totals[key] = max(totals.get(key, 0), int(n))
    return sum(totals.values())
