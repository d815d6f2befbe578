"""``idle_allocation``: stretches of minutes in which the job's GPUs all sat idle with nothing
running on them that the run knows of.

A run that hangs in a collective, waits on a file system or a remote service, sits in a
debugger or between jobs of a notebook keeps its GPUs (often with their memory held) while
doing nothing; a phase span covering the stretch would name the cause, and then the phase's
own stall claims it instead. Only stretches where no GPU of the job worked and no owner was in
a named phase (bare ``step`` spans or none) count, and only those of at least
``th.idle_allocation_min_s``: short gaps stay with ``idle_unattributed``. The stretches are
claimed so that later stalls don't explain them again.

Every GPU of the job takes part: each part of the run (`parts.Parts`) gives the time its GPUs
were quiet and the time they were not, and the stretches are found on all of them together.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from gpuprof.analyzers.evidence import IdleAllocationEvidence
from gpuprof.analyzers.findings import AnalysisContext, Finding, Thresholds
from gpuprof.analyzers.parts import Parts
from gpuprof.analyzers.stalls._phase import _MAX_GPUS, _WAIT_PHASES, _conf, _minutes, _num, _samples
from gpuprof.intervals import difference, in_union, top_intervals, union


def detect(ctx: AnalysisContext | Parts, th: Thresholds) -> Finding | None:
    """Stretches in which every GPU is below ``th.idle_util_pct`` with its owner in no named
    phase; the idle GPU-time of those lasting ``th.idle_allocation_min_s`` or more is lost."""
    parts = ctx if isinstance(ctx, Parts) else Parts.of(ctx)
    quiet = [q for q in parts.map(_quiet_time, th) if q is not None]
    if not quiet or not any(q[0] for q in quiet):
        return None
    # quiet time of the whole job: covered by quiet samples, by no other sample of any GPU
    cat = [np.concatenate([q[k] for q in quiet]) for k in range(1, 5)]
    a, b = difference(*cat)
    long = (b - a) >= th.idle_allocation_min_s * 1e9
    if not long.any():
        return None
    a, b = a[long], b[long]
    got = [g for g in parts.map(_in_stretches, th, a, b) if g is not None]
    idle = np.concatenate([g["idle"] for g in got]) if got else np.zeros(0)
    lost = float(idle.sum())  # the samples in the whole run's order: the same sum
    share = parts.share(lost)
    if share < th.min_share:
        return None
    parts.each(_claim, th, a, b)
    mem = pd.concat([g["mem"] for g in got]) if got else pd.Series(dtype=float)
    held = float(mem.sum()) if len(mem) else np.nan
    longest = float(((b - a) / 1e9).max())
    run_s = max(parts.facts.duration_s or 0.0, 1e-9)
    whole = bool(longest >= 0.9 * run_s)
    held_txt = f" holding {held / 2**30:.1f} GiB" if np.isfinite(held) and held > 2**30 else ""
    summary = (
        f"every GPU of the job idle{held_txt} with nothing running for {len(a)} stretch"
        f"{'es' if len(a) > 1 else ''} of {_span_txt(longest)} at most: {_minutes(lost)} "
        f"({share:.0%}) of the allocation held idle"
    )
    gpus = sorted(pair for g in got for pair in g["gpus"])
    return Finding(
        kind="idle_allocation",
        gpu_seconds_lost=lost,
        share=share,
        confidence=_conf(0.6 + 0.3 * min(1.0, longest / 1800.0) + 0.2 * share),
        summary=summary,
        evidence=IdleAllocationEvidence(
            intervals=top_intervals(a, b),
            gpus=[f"{h}:{int(n)}" for h, n in gpus][:_MAX_GPUS],
            phases=sorted({p for g in got for p in g["phases"]}),
            idle_stretch_s_longest=_num(longest),
            idle_stretches=len(a),
            mem_held_bytes=_num(held, ".0f"),
            idle_gpu_s=_num(lost),
            whole_run=whole,
        ),
    )


def _quiet(s: pd.DataFrame, th: Thresholds) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Each sample's start and end (ns) and whether it is quiet: idle with its owner in no
    named phase."""
    t = s["t_ns"].to_numpy(np.int64)
    end = t + np.round(np.nan_to_num(s["dt_s"].to_numpy(np.float64)) * 1e9).astype(np.int64)
    busy = s["busy_frac"].to_numpy(np.float64)
    quiet = np.isfinite(busy) & (busy < th.idle_util_pct / 100.0)
    quiet &= s["phase"].isin(list(_WAIT_PHASES)).to_numpy()
    return t, end, quiet


def _quiet_time(ctx: AnalysisContext, th: Thresholds) -> tuple | None:
    """One part's quiet time and other time, each as the union of its samples: ``(any quiet,
    quiet starts, quiet ends, other starts, other ends)``; None without a busy reading."""
    s = _samples(ctx)
    if s is None:
        return None
    t, end, quiet = _quiet(s, th)
    return (bool(quiet.any()), *union(t[quiet], end[quiet]), *union(t[~quiet], end[~quiet]))


def _in_stretches(
    ctx: AnalysisContext, th: Thresholds, a: np.ndarray, b: np.ndarray
) -> dict | None:
    """One part's quiet samples inside the stretches ``[a, b)``: their idle GPU-seconds (in
    sample order), the most memory each GPU held in them, its GPUs and the phases seen."""
    s = _samples(ctx)
    if s is None:
        return None
    t, _, quiet = _quiet(s, th)
    mask = quiet & in_union(t, a, b)
    idle = np.nan_to_num(s["idle_gpu_s"].to_numpy(np.float64))[mask]
    mem = s["mem_used_bytes"].to_numpy(np.float64)[mask]
    keys = s.loc[mask, ["host", "gpu"]]
    per_gpu_mem = pd.Series(mem).groupby([keys["host"].to_numpy(), keys["gpu"].to_numpy()]).max()
    pairs = keys.drop_duplicates()
    return {
        "idle": idle,
        "mem": per_gpu_mem,
        "gpus": [(str(h), int(g)) for h, g in zip(pairs["host"], pairs["gpu"])],
        "phases": {str(p) for p in s.loc[mask, "phase"].unique()},
    }


def _claim(ctx: AnalysisContext, th: Thresholds, a: np.ndarray, b: np.ndarray) -> None:
    s = _samples(ctx)
    if s is None:
        return
    t, _, quiet = _quiet(s, th)
    mask = quiet & in_union(t, a, b)
    claim = np.zeros(len(ctx.samples), dtype=bool)
    claim[ctx.samples.index.get_indexer(s.index[mask])] = True
    ctx.claim(claim)


def _span_txt(seconds: float) -> str:
    return f"{seconds / 60:.0f} min" if seconds >= 120 else f"{seconds:.0f} s"
