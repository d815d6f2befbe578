"""Phase timing without GPU samples: what a framework's own per-step times justify.

A verl, OpenRLHF or ms-swift log says how long each phase of each step took but nothing about
the GPUs. Some stalls still show there: a phase that scores rewards or syncs weights while
every GPU waits takes a share of each step, checkpoints and evaluations come back every N
steps, per-worker generation times spread from a fast worker to a slow one. The detectors fall
back to these figures when the run has spans but no GPU samples; their findings say so
(``basis="phase_timing"``) and assume what the phase does to the GPUs (named in each summary).

GPU-seconds are wall seconds times the job's GPU count, read from the run's inventory or the
launch command (verl ``trainer.n_gpus_per_node`` × ``trainer.nnodes``; TRL/accelerate
``num_processes``; torchrun ``nproc_per_node``); without one, figures are per GPU.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

from gpuprof.analyzers.findings import AnalysisContext
from gpuprof.analyzers.spans import STEP_PHASE
from gpuprof.intervals import covered_ns, top_intervals

_GPU_COUNT_KNOBS: tuple[tuple[str, ...], ...] = (
    ("trainer.n_gpus_per_node", "trainer.nnodes"),
    ("num_processes",),
    ("nproc_per_node",),
    ("NPROC_PER_NODE",),
)
"""Launch knobs that give the job's GPU count (their product), in the order they are tried."""

RESIDUE = 1e-6
"""Step time no phase covers (the step's own time) is listed when above this share of the
steps: only rounding is left out, so the phase table, the step's composition and the report
list the same rows."""


@dataclass
class Timing:
    """Per-step phase times of a run without GPU samples.

    ``steps``: one row per step (index: step number) with ``wall_s`` (the step's wall time,
    phases that run after the step's own timer included) and one column of self seconds per
    phase (a phase nested in another is not counted in the one that encloses it).
    ``gpus``: the job's GPU count (1 when unknown, then ``gpus_known`` is False).
    ``wall_s``: the time the spans cover. ``total_gpu_s = wall_s × gpus``.
    """

    steps: pd.DataFrame
    phases: list[str]
    gpus: int
    gpus_known: bool
    wall_s: float
    spans: pd.DataFrame

    @property
    def total_gpu_s(self) -> float:
        return self.wall_s * self.gpus

    def share(self, gpu_s: float) -> float:
        total = self.total_gpu_s
        return float(min(1.0, max(0.0, gpu_s / total))) if total > 0 else 0.0

    def gpu_note(self) -> str:
        return "" if self.gpus_known else " (GPU count unknown: figures per GPU)"

    def the_gpus(self) -> str:
        """ "the 16 GPUs", or "the GPUs" when the count is unknown."""
        return f"the {self.gpus} GPUs" if self.gpus_known else "the GPUs"

    def intervals(self, phases: list[str]) -> list[list[int]]:
        sp = self.spans[self.spans["phase"].isin(phases)]
        return top_intervals(sp["start_ns"].to_numpy(np.int64), sp["end_ns"].to_numpy(np.int64))

    def step_attr(self, *keys: str) -> np.ndarray:
        """Per step: the first numeric value among ``keys`` in the step span's attrs (nested
        ``sub_timing_s`` included), NaN where absent."""
        out = np.full(len(self.steps), np.nan)
        for i, attrs in enumerate(self.steps["attrs"]):
            if not isinstance(attrs, dict):
                continue
            sub = attrs.get("sub_timing_s") if isinstance(attrs.get("sub_timing_s"), dict) else {}
            for key in keys:
                value = attrs.get(key, sub.get(key))
                if isinstance(value, int | float) and not isinstance(value, bool):
                    out[i] = float(value)
                    break
        return out


def gpu_count(ctx: AnalysisContext) -> int | None:
    """The job's GPU count: the run's GPU inventory, else the launch command's knobs."""
    listed = {
        (g.get("host"), g.get("index"))
        for g in ctx.run.meta.gpus or []
        if isinstance(g, dict) and g.get("index") is not None
    }
    if listed:
        return len(listed)
    knobs = ctx.run.meta.knobs or {}
    for names in _GPU_COUNT_KNOBS:
        values = [_positive_int(knobs.get(n)) for n in names]
        if values[0] is not None:
            return int(np.prod([v if v is not None else 1 for v in values]))
    return None


def _positive_int(value: Any) -> int | None:
    try:
        out = int(value)
    except (TypeError, ValueError):
        return None
    return out if out > 0 else None


def timing(ctx: AnalysisContext) -> Timing | None:
    """The run's per-step phase times when it has step spans but no GPU utilisation samples
    (None otherwise: then the sample-based detectors apply). Computed once per context."""
    cache = ctx.__dict__.setdefault("_stalls_timing", {})
    if "timing" not in cache:
        cache["timing"] = _timing(ctx)
    return cache["timing"]


def _timing(ctx: AnalysisContext) -> Timing | None:
    from gpuprof.analyzers.parts import sampled

    if sampled(ctx).util_finite:
        return None
    sp = ctx.spans
    if sp.empty or not (sp["phase"] == STEP_PHASE).any():
        return None
    sp = sp[np.isfinite(sp["step"].to_numpy(np.float64))]
    dur = (sp["end_ns"] - sp["start_ns"]).to_numpy(np.float64) / 1e9
    own = sp["self_ns"].to_numpy(np.float64) / 1e9
    frame = pd.DataFrame({"pid": sp["pid"].to_numpy(), "phase": sp["phase"].to_numpy(object),
                          "step": sp["step"].to_numpy(np.float64), "dur": dur,
                          "self": own})  # fmt: skip
    # several processes may log the same steps (ranks): the slowest sets the pace
    steps_only = frame[frame["phase"] == STEP_PHASE]
    step_wall = steps_only.groupby(["step", "pid"])["dur"].sum().groupby(level="step").max()
    # a step's phases — inside it, and laid beside it (verl times testing and save_checkpoint
    # after the step timer has stopped) — by self time: a phase nested in another (TRL's
    # generation inside its training_step) is taken out of the one that encloses it
    named = frame[frame["phase"] != STEP_PHASE]
    per = (
        named.groupby(["step", "phase", "pid"])["self"].sum().groupby(level=["step", "phase"]).max()
    ).unstack("phase", fill_value=0.0)
    per = per.reindex(step_wall.index, fill_value=0.0)
    # phases timed after the step's own timer (verl's testing / save_checkpoint) add to its wall
    inside = per.sum(axis=1).to_numpy()
    wall = np.maximum(step_wall.to_numpy(), inside)
    after = _after_step(sp)
    wall = (
        wall
        + per.reindex(columns=[p for p in after if p in per], fill_value=0.0).sum(axis=1).to_numpy()
    )
    steps = per.assign(wall_s=wall)
    attrs = ctx.run.spans
    step_attrs = {}
    if attrs is not None and len(attrs) and "attrs" in attrs:
        rows = attrs[attrs["phase"] == STEP_PHASE]
        for st, a in zip(pd.to_numeric(rows["step"], errors="coerce"), rows["attrs"]):
            if np.isfinite(st) and isinstance(a, dict) and st not in step_attrs:
                step_attrs[float(st)] = a
    steps["attrs"] = [step_attrs.get(float(s)) for s in steps.index]
    n = gpu_count(ctx)
    covered = covered_ns(sp["start_ns"].to_numpy(np.int64), sp["end_ns"].to_numpy(np.int64))
    return Timing(
        steps=steps,
        phases=[c for c in per.columns],
        gpus=n or 1,
        gpus_known=n is not None,
        wall_s=max(covered / 1e9, float(np.sum(wall))),
        spans=sp,
    )


def _after_step(sp: pd.DataFrame) -> list[str]:
    """Phases whose spans start at or after their step span's end (laid after the step)."""
    steps = sp[sp["phase"] == STEP_PHASE].groupby("step")["end_ns"].max()
    other = sp[sp["phase"] != STEP_PHASE]
    ends = steps.reindex(other["step"]).to_numpy(np.float64)
    after = other["start_ns"].to_numpy(np.float64) >= ends
    return sorted(set(other["phase"].to_numpy(object)[after]))


def phase_seconds(t: Timing, phases: list[str]) -> np.ndarray:
    """Per step: the seconds spent in ``phases``."""
    cols = [p for p in phases if p in t.steps]
    if not cols:
        return np.zeros(len(t.steps))
    return t.steps[cols].to_numpy(np.float64).sum(axis=1)


@dataclass
class PhaseLoss:
    """What a phase costs from timing alone: its seconds over the run, its share of step
    time, and the GPU-seconds beyond a healthy allowance (all GPUs assumed to wait)."""

    timing: Timing
    seconds: float
    share_of_step: float
    lost_gpu_s: float
    share: float
    steps_with_phase: int


def phase_loss(ctx: AnalysisContext, phases: list[str], allowance_share: float) -> PhaseLoss | None:
    """`PhaseLoss` of ``phases`` in a run without GPU samples (None: the run has samples, or
    no such phase)."""
    t = timing(ctx)
    if t is None:
        return None
    secs = phase_seconds(t, phases)
    total = float(secs.sum())
    if total <= 0 or t.wall_s <= 0:
        return None
    lost = max(0.0, total - allowance_share * t.wall_s) * t.gpus
    return PhaseLoss(t, total, total / t.wall_s, lost, t.share(lost), int((secs > 0).sum()))
