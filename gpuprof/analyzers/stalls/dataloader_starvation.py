"""``dataloader_starvation``: GPUs waiting for the next batch of input."""

from __future__ import annotations

import numpy as np

from gpuprof.analyzers.evidence import PHASE_TIMING, DataloaderStarvationEvidence
from gpuprof.analyzers.findings import AnalysisContext, Finding, Thresholds
from gpuprof.analyzers.parts import Parts, exact_sum
from gpuprof.analyzers.spans import STEP_PHASE
from gpuprof.analyzers.stalls._phase import (
    _allowance,
    _any_samples,
    _conf,
    _excess,
    _gpu_pairs,
    _head_claimed,
    _joined_labels,
    _minutes,
    _num,
    _num_workers,
    _parts,
    _phase_intervals,
    _samples,
    _step_head,
    _waiting_on,
    loader_evidence,
    phase_idle,
)
from gpuprof.analyzers.stalls._timing import phase_loss
from gpuprof.intervals import top_intervals, union


def detect(ctx: AnalysisContext | Parts, th: Thresholds) -> Finding | None:
    """GPUs waiting for input: idle in ``dataload`` spans, or at each step's head when no
    dataload span exists and the loader is visibly slow."""
    parts = _parts(ctx)
    if not _any_samples(parts):
        return _from_timing(parts.lead, th)
    if "dataload" in parts.facts.phases:
        st = phase_idle(parts, ["dataload"])
        if st is None or st["idle_frac"] < th.phase_idle_min_frac:
            return None
        waiting = _waiting_on(parts, th, ["dataload"])
        idle_gpu_s, where = st["idle_gpu_s"] + waiting, "dataload spans"
        gpus, intervals = st["gpus"], _phase_intervals(parts, ["dataload"])
        ev = loader_evidence(parts, th)
    else:
        if not _head_claimed(parts, th):
            return None
        got = [g for g in parts.map(_heads) if g is not None]
        if not got:
            return None
        idle_gpu_s, where = float(sum(g[0] for g in got)), "the head of steps"
        gpus = _joined_labels(g[1] for g in got)
        a, b = union(np.concatenate([g[2] for g in got]), np.concatenate([g[3] for g in got]))
        intervals = top_intervals(a, b)
        ev = loader_evidence(parts, th, head=True)
    lost = _excess(parts, th, idle_gpu_s, "dataload")
    share = parts.share(lost)
    if share < th.min_share:
        return None
    reasons = []
    if ev.get("saturated"):
        cpu = max(ev.get("loader_cpu_pct", 0.0), ev.get("main_cpu_pct", 0.0))
        reasons.append(f"loader CPU {cpu:.0f}% of a core")
    if ev.get("few_workers"):
        reasons.append(f"{ev['num_workers']} dataloader workers")
    conf = _conf((0.75 if ev.get("any") else 0.45) + 0.1 * len(reasons) + 0.5 * share - 0.1)
    summary = f"GPUs wait for input in {where}: {_minutes(lost)} ({share:.0%}) idle" + (
        f"; {', '.join(reasons)}" if reasons else ""
    )
    return Finding(
        kind="dataloader_starvation",
        gpu_seconds_lost=lost,
        share=share,
        confidence=conf,
        summary=summary,
        evidence=DataloaderStarvationEvidence(
            intervals=intervals,
            gpus=gpus,
            phases=["dataload"] if where == "dataload spans" else [STEP_PHASE],
            dataload_idle_gpu_s=_num(idle_gpu_s),
            loader_cpu_pct=_num(ev.get("loader_cpu_pct", np.nan)),
            main_cpu_pct=_num(ev.get("main_cpu_pct", np.nan)),
            dataloader_num_workers=ev.get("num_workers"),
            loader_saturated=bool(ev.get("saturated")),
            allowance_share=_allowance(th, "dataload"),
        ),
    )


def _heads(ctx: AnalysisContext) -> tuple | None:
    """One part's idle heads of steps (`_step_head`): idle GPU-seconds, GPUs, and the
    stretches they cover; None when it has none."""
    s = _samples(ctx)
    head = None if s is None else _step_head(ctx, s)
    if head is None or not head.any():
        return None
    rows = np.flatnonzero(head)
    t = s["t_ns"].to_numpy(np.int64)[rows]
    a, b = union(t, t + (s["dt_s"].to_numpy(np.float64)[rows] * 1e9).astype(np.int64))
    return exact_sum(s["idle_gpu_s"].to_numpy()[rows]), _gpu_pairs(s, rows), a, b


def _from_timing(ctx: AnalysisContext, th: Thresholds) -> Finding | None:
    """From phase times alone (a framework log, or a trace without GPU kernels): time in
    ``dataload`` spans beyond a healthy share, every GPU waiting for the batch."""
    pl = phase_loss(ctx, ["dataload"], _allowance(th, "dataload"))
    if pl is None or pl.share < th.min_share:
        return None
    t = pl.timing
    ev = _num_workers(ctx)
    summary = (
        f"loading input takes {pl.share_of_step:.0%} of step time: {_minutes(pl.lost_gpu_s)} "
        f"({pl.share:.0%}) with the GPUs waiting{t.gpu_note()}"
        + (f"; {ev} dataloader workers" if ev is not None and ev <= 1 else "")
    )
    return Finding(
        kind="dataloader_starvation",
        gpu_seconds_lost=pl.lost_gpu_s,
        share=pl.share,
        confidence=_conf(0.45 + 0.5 * pl.share + (0.15 if ev is not None and ev <= 1 else 0.0)),
        summary=summary,
        evidence=DataloaderStarvationEvidence(
            intervals=t.intervals(["dataload"]),
            phases=["dataload"],
            basis=PHASE_TIMING,
            dataload_idle_gpu_s=_num(pl.seconds * t.gpus),
            dataload_share_of_step=_num(pl.share_of_step, ".3f"),
            dataloader_num_workers=ev,
            allowance_share=_allowance(th, "dataload"),
        ),
    )
