"""Lay a `Plan` out in time: per GPU group, a list of contiguous segments, plus the truth costs.

GPUs with the same timeline form a group (all GPUs; or rollout vs trainer GPUs under split
placement; a straggler rank; a throttled host). A segment is ``[start_s, end_s)`` with a kind:
``phase`` (a phase span is recorded), ``barrier`` (waiting in a collective for slower ranks:
NCCL spins, so util reads high while SMs idle), or ``idle`` (nothing runs, no phase span).
Loops here are over steps × phases, never over samples.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from gpuprof.sim.config import SimConfig
from gpuprof.sim.pathologies import COMPUTE_PHASES, Plan


@dataclass
class Segment:
    start_s: float
    end_s: float
    phase: str
    kind: str
    """``phase``, ``barrier`` or ``idle``."""
    step: int


@dataclass
class Group:
    """GPUs sharing one timeline; ``slow``: phase -> duration factor, tagged ``slow_kind``."""

    name: str
    gpus: np.ndarray
    role: str
    """``all`` (colocated), ``rollout`` or ``train`` (split placement)."""
    slow: dict[str, float] = field(default_factory=dict)
    slow_kind: str | None = None
    segs: list[Segment] = field(default_factory=list)

    def add(self, start: float, end: float, phase: str, kind: str, step: int) -> None:
        if end > start:
            self.segs.append(Segment(start, end, phase, kind, step))


@dataclass
class Cost:
    """Lost GPU-seconds of one stall kind and the intervals (seconds from start) it covers."""

    gpu_seconds: float = 0.0
    intervals: list[tuple[float, float]] = field(default_factory=list)

    def add(self, gpu_seconds: float, start: float, end: float) -> None:
        if gpu_seconds > 0 and end > start:
            self.gpu_seconds += gpu_seconds
            self.intervals.append((start, end))


@dataclass
class Timeline:
    groups: list[Group]
    step_bounds: list[tuple[float, float]]
    costs: dict[str, Cost]
    duration_s: float
    placement: str


def make_groups(config: SimConfig, plan: Plan, placement: str) -> list[Group]:
    """Partition the GPUs into groups with one timeline each."""
    n = config.gpus
    role = np.full(n, "all", dtype=object)
    if placement == "split":
        n_roll = config.n_rollout_gpus
        role[:n_roll] = "rollout"
        role[n_roll:] = "train"
    slow_kind = np.full(n, "", dtype=object)
    factor = np.ones(n)
    if plan.throttle is not None:
        gpus, ratio = plan.throttle
        slow_kind[gpus] = "throttling"
        factor[gpus] = 1.0 / ratio
    if plan.power_cap is not None:
        slow_kind[:] = "power_cap"
        factor[:] = 1.0 / plan.power_cap[2]
    if plan.hot is not None:
        gpu, ratio = plan.hot[0], plan.hot[1]
        if 1.0 / ratio >= factor[gpu]:
            slow_kind[gpu], factor[gpu] = "hot_gpu", 1.0 / ratio
    if plan.straggler is not None:
        rank, f = plan.straggler
        if f >= factor[rank]:
            slow_kind[rank], factor[rank] = "imbalance", f
    groups = []
    keys = sorted({(r, k, f) for r, k, f in zip(role, slow_kind, factor)})
    for r, k, f in keys:
        idx = np.flatnonzero((role == r) & (slow_kind == k) & (factor == f))
        phases = COMPUTE_PHASES if r != "rollout" else ("rollout",)
        slow = dict.fromkeys(phases, float(f)) if k else {}
        groups.append(Group(f"{r}:{k or 'ok'}", idx, r, slow, k or None))
    return groups


class _Layout:
    """Builds the timeline step by step; holds the clock, the noise and the cost ledger."""

    def __init__(self, config: SimConfig, plan: Plan, groups: list[Group], rng) -> None:
        self.cfg, self.plan, self.groups, self.rng = config, plan, groups, rng
        self.n = config.gpus
        self.costs: dict[str, Cost] = {}

    def cost(self, kind: str) -> Cost:
        return self.costs.setdefault(kind, Cost())

    def noise(self) -> float:
        """A multiplicative duration jitter around 1 (relative sd ``config.noise``)."""
        return float(np.exp(self.cfg.noise * self.rng.standard_normal()))

    def duration(self, phase: str, start: float, nf: float) -> float:
        """Wall seconds of a phase this step (healthy + injected), booking the injected cost.

        ``nf`` scales both: the noise draw, times the work-per-GPU factor under split placement.
        """
        d = self.plan.dur.get(phase, 0.0)
        for e in self.plan.extra.get(phase, []):
            self.cost(e.kind).add(
                e.seconds * nf * self.n * e.lost, start, start + (d + e.seconds) * nf
            )
            d += e.seconds
        return d * nf

    def stage(
        self, t: float, phase: str, groups: list[Group], step: int, scale: float = 1.0
    ) -> float:
        """Run one phase on ``groups`` from ``t``; faster groups wait at the barrier.

        ``scale`` multiplies the duration: a GPU phase run on a subset of the job's GPUs
        (split placement) does the same work on fewer GPUs, so it takes longer.
        """
        d0 = self.duration(phase, t, self.noise() * scale)
        if d0 <= 0:
            return t
        ds = [d0 * g.slow.get(phase, 1.0) for g in groups]
        wall = max(ds)
        for g, d in zip(groups, ds):
            g.add(t, t + d, phase, "phase", step)
            g.add(t + d, t + wall, phase, "barrier", step)
        if wall > d0 * (1 + 1e-9):
            slowest = groups[int(np.argmax(ds))]
            n_part = sum(len(g.gpus) for g in groups)
            # a slowed GPU's own time is lost too (it runs below its clocks); a straggler's
            # extra work is not
            slowed = slowest.slow_kind in ("throttling", "hot_gpu", "power_cap")
            waiting = n_part if slowed else n_part - len(slowest.gpus)
            self.cost(slowest.slow_kind or "imbalance").add((wall - d0) * waiting, t, t + wall)
        return t + wall

    def idle(self, t: float, seconds: float, groups: list[Group], step: int) -> float:
        for g in groups:
            g.add(t, t + seconds, "idle", "idle", step)
        return t + seconds


def layout(config: SimConfig, plan: Plan, rng: np.random.Generator) -> Timeline:
    """Lay out every step of the job and book each injected stall's lost GPU-seconds."""
    placement = config.effective_placement
    groups = make_groups(config, plan, placement)
    lay = _Layout(config, plan, groups, rng)
    ppo = config.algorithm == "ppo"
    train_phases = ["old_logprob", "ref_logprob", *(["values"] if ppo else []), "advantage"]
    train_phases += ["update_actor", *(["update_critic"] if ppo else [])]
    t = 0.0
    bounds = []
    for step in range(config.steps):
        t0 = t
        t = lay.stage(t, "dataload", groups, step)
        if placement == "colocated":
            t = lay.stage(t, "rollout", groups, step)
            t = lay.stage(t, "reward", groups, step)
            if plan.gap_s > 0:
                gap = plan.gap_s * lay.noise()
                lay.cost("idle_unattributed").add(gap * lay.n, t, t + gap)
                t = lay.idle(t, gap, groups, step)
            for phase in train_phases:
                t = lay.stage(t, phase, groups, step)
        else:
            t = _split_step(lay, t, train_phases, step)
        t = lay.stage(t, "reshard", groups, step)
        if plan.hang is not None and step == plan.hang[0]:
            lay.cost("idle_allocation").add(plan.hang[1] * lay.n, t, t + plan.hang[1])
            t = lay.idle(t, plan.hang[1], groups, step)
        if plan.periodic is not None and (step + 1) % plan.periodic[0] == 0:
            _, ckpt_s, eval_s = plan.periodic
            for phase, secs in (("checkpoint", ckpt_s), ("eval", eval_s)):
                d = secs * lay.noise()
                for g in groups:
                    g.add(t, t + d, phase, "phase", step)
                lay.cost("periodic_stall").add(d * lay.n, t, t + d)
                t += d
        bounds.append((t0, t))
    return Timeline(groups, bounds, lay.costs, t, placement)


def _split_step(lay: _Layout, t: float, train_phases: list[str], step: int) -> float:
    """Rollout GPUs generate while trainer GPUs score and train; ``bubble`` serialises them."""
    plan = lay.plan
    roll = [g for g in lay.groups if g.role == "rollout"]
    train = [g for g in lay.groups if g.role == "train"]
    if plan.gap_s > 0:
        gap = plan.gap_s * lay.noise()
        lay.cost("idle_unattributed").add(gap * lay.n, t, t + gap)
        t = lay.idle(t, gap, lay.groups, step)
    n_roll = sum(len(g.gpus) for g in roll)
    t_roll_end = lay.stage(t, "rollout", roll, step, scale=lay.n / n_roll)
    rollout_s = t_roll_end - t
    # async (bubble 0): trainer works on the previous batch at once; sync: waits for rollout
    t_train = t + plan.bubble * rollout_s
    lay.idle(t, t_train - t, train, step)
    te = t_train
    for phase in ["reward", *train_phases]:
        # reward and advantage are CPU work; the GPU passes get the trainer GPUs' share of work
        scale = lay.n / (lay.n - n_roll) if phase in COMPUTE_PHASES else 1.0
        te = lay.stage(te, phase, train, step, scale=scale)
    work_s = te - t_train
    end = max(t_roll_end, te)
    lay.idle(t_roll_end, end - t_roll_end, roll, step)
    lay.idle(te, end - te, train, step)
    extra = end - max(t_roll_end, t + work_s)
    if plan.bubble > 0:
        lay.cost("pipeline_bubble").add(extra * lay.n, t, end)
    return end
