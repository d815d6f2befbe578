"""The stall detectors, one module per kind, and the order `diagnose` applies them in.

Each module holds one detector, ``detect(ctx, th) -> Finding | None`` over an
`AnalysisContext` (pure: no I/O, no printing), whose finding carries that kind's typed evidence
(`gpuprof.analyzers.evidence`). Every detector but ``rollout_bound`` and ``update_bound`` also
takes a run seen as parts (`gpuprof.analyzers.parts.Parts`, one node's share each): it asks
each part for partial figures (``parts.map``) and decides once on the combined ones, so a run
diagnosed node by node finds what the whole run finds. `STALLS` lists them as `Stall` records
in the order they are applied; a record says what GPU-time its kind claims, so that later kinds
don't count it again:

- GPUs the job never used (``unused_gpu``), GPUs reading busy while stuck
  (``phantom_util``) and long stretches of an allocation with nothing running
  (``idle_allocation``) are claimed first, in ``ctx.claimed``: no later detector explains
  that time again (a bubble, unattributed idle, memory headroom, imbalance…);
- then idle time by where it happens, partitioned through the owners' phases (see `_phase`):
  inside a claimed phase or waiting for it, the decaying tail of rollouts, waiting while other
  GPUs work, idle with nothing explaining it;
- then resource limits on busy GPUs, with the hand-offs described in `_resource`; GPUs held
  at their power limit (``power_cap``) or far hotter than their peers (``hot_gpu``) are named
  by those kinds, and ``throttling`` counts the reduced clocks of the other GPUs.

Detectors that only need phase timing (framework logs without GPU samples) fall back to the
framework's own per-step times (`_timing`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from gpuprof.analyzers.evidence import EVIDENCE, Evidence
from gpuprof.analyzers.findings import AnalysisContext, Finding, Thresholds
from gpuprof.analyzers.stalls import (
    comm_bound,
    dataloader_starvation,
    generation_tail,
    host_bound,
    hot_gpu,
    idle_allocation,
    idle_unattributed,
    imbalance,
    memory_headroom,
    offload_thrash,
    periodic_stall,
    phantom_util,
    pipeline_bubble,
    power_cap,
    reshard_idle,
    reward_bound,
    rollout_bound,
    throttling,
    unused_gpu,
    update_bound,
)

Detector = Callable[[AnalysisContext, Thresholds], "Finding | None"]


@dataclass(frozen=True)
class Stall:
    """One stall kind: its detector, what GPU-time it claims, and its evidence class."""

    kind: str
    detect: Detector
    claims: str
    evidence: type[Evidence]


def _stall(kind: str, detect: Detector, claims: str) -> Stall:
    return Stall(kind, detect, claims, EVIDENCE[kind])


STALLS: tuple[Stall, ...] = (
    _stall("unused_gpu", unused_gpu.detect,
           "every sample of a GPU the job never ran on (recorded in ctx.claimed)"),
    _stall("phantom_util", phantom_util.detect,
           "every sample of a GPU reading busy with no memory and no process (in ctx.claimed)"),
    _stall("idle_allocation", idle_allocation.detect,
           "stretches of minutes with every GPU idle (recorded in ctx.claimed)"),
    _stall("reshard_idle", reshard_idle.detect,
           "idle in reshard spans and GPUs waiting on them, beyond an allowance"),
    _stall("reward_bound", reward_bound.detect,
           "idle in reward spans and GPUs waiting on them, beyond an allowance"),
    _stall("dataloader_starvation", dataloader_starvation.detect,
           "idle in dataload spans (or at step heads with a visibly slow loader)"),
    _stall("periodic_stall", periodic_stall.detect,
           "idle in checkpoint/eval spans and GPUs waiting on them"),
    _stall("generation_tail", generation_tail.detect,
           "the shortfall below a rollout's steady level after its first third"),
    _stall("pipeline_bubble", pipeline_bubble.detect,
           "waiting GPUs while others work, capped by what serialising added"),
    _stall("idle_unattributed", idle_unattributed.detect,
           "waiting GPUs while the whole job idles, outside claimed phases"),
    _stall("offload_thrash", offload_thrash.detect,
           "update samples with heavy PCIe and low compute"),
    _stall("comm_bound", comm_bound.detect,
           "collective share of update time above a healthy allowance"),
    _stall("power_cap", power_cap.detect,
           "clock time lost on busy GPUs held at their power limit"),
    _stall("hot_gpu", hot_gpu.detect,
           "clock time a GPU far hotter than its peers loses, times the GPUs waiting for it"),
    _stall("throttling", throttling.detect,
           "time lost to reduced clocks on power/thermal-limited GPUs"),
    _stall("host_bound", host_bound.detect,
           "compute-phase samples while a process is pinned (not offload samples)"),
    _stall("memory_headroom", memory_headroom.detect,
           "a share of rollout (or update) time on GPUs with unused memory"),
    _stall("imbalance", imbalance.detect,
           "others' wait for a straggler rank, or work a low GPU left to its peers"),
    _stall("rollout_bound", rollout_bound.detect,
           "rollout time beyond what a healthy engine takes for its tokens, less earlier findings"),
    _stall("update_bound", update_bound.detect,
           "update time beyond a reachable MFU or a healthy forward ratio, less earlier findings"),
)  # fmt: skip
"""Every stall kind, in the order `diagnose` applies them."""

SIDE_BY_SIDE: tuple[tuple[str, ...], tuple[str, ...]] = (
    ("reshard_idle", "reward_bound", "dataloader_starvation", "periodic_stall",
     "generation_tail", "pipeline_bubble", "idle_unattributed"),
    ("offload_thrash", "comm_bound", "power_cap", "hot_gpu", "throttling", "host_bound",
     "memory_headroom", "imbalance"),
)  # fmt: skip
"""Two consecutive runs of `STALLS` that may run at once, in two processes (`lanes`): none of
their detectors claims GPU-time, and none reads a finding of the other run (``throttling``
reads ``power_cap``'s and ``hot_gpu``'s, in its own run; ``rollout_bound`` and
``update_bound``, which read every earlier finding, come after both). The two take about the
same time (the idle partition of the first; offload, collectives, clocks, host and spread in
the second)."""

DETECTORS: dict[str, Detector] = {s.kind: s.detect for s in STALLS}
"""Stall kind → detector."""

__all__ = ["DETECTORS", "SIDE_BY_SIDE", "STALLS", "Detector", "Stall"]
