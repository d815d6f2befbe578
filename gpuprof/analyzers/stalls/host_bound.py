"""``host_bound``: Kernel launches / Python too slow to keep the GPU busy."""

from __future__ import annotations

from fractions import Fraction
from typing import Any

import numpy as np
import pandas as pd

from gpuprof.analyzers.evidence import HostBoundEvidence
from gpuprof.analyzers.findings import AnalysisContext, Finding, Thresholds
from gpuprof.analyzers.grouping import appearance_codes, asof_backward, first_rows, isin_rows
from gpuprof.analyzers.parts import Parts, exact_sum
from gpuprof.analyzers.stalls._phase import _gpu_pairs, _memo, _parts
from gpuprof.analyzers.stalls._resource import (
    COMPUTE_PHASES,
    _finding,
    _fmt_gpu_s,
    _gpu_codes,
    _intervals,
    _joined_gpus,
    _num,
    _offload_mask,
    _runs,
    _sorted_gpus,
)
from gpuprof.analyzers.texts import as_texts
from gpuprof.analyzers.threads import thread_kind, thread_table
from gpuprof.intervals import in_union, union


def detect(ctx: AnalysisContext | Parts, th: Thresholds) -> Finding | None:
    """Launch-bound compute phases (`_launch_bound`), else GPUs idle while the host blocks in
    the CUDA allocator or a synchronisation (`_blocked_in_runtime`, from profiler traces)."""
    parts = _parts(ctx)
    return _launch_bound(parts, th) or _blocked_in_runtime(parts, th)


def _launch_bound(parts: Parts, th: Thresholds) -> Finding | None:
    """Moderate utilisation in compute phases while the rank's (or main) process uses a core.

    Process CPU is summed over its threads: a trainer reads 100% or more from CUDA spin-wait
    and NCCL threads alone, so a process at a core is not proof of a Python-bound loop. Where
    the run recorded its threads' CPU (`ThreadSample`), a process's CPU is therefore that of
    its **busiest Python thread** (`analyzers.threads`: the threads py-spy sampled, else the
    main thread); elsewhere the process's total stands in. The loss comes from the
    utilisation shortfall. A compute-phase sample is host-bound when, at that
    instant (nearest earlier process sample, within three process-sampling intervals), the GPU
    owner's process or a ``main`` process (the driver, which dispatches for every GPU; on any
    node) reads at least
    ``th.process_core_pinned_pct`` of one core.
    Per (GPU, phase, step) the lost share of those samples' time is
    ``th.host_bound_util_ref - mean util`` (kernels are launched too slowly to keep the GPU busy).
    Update samples claimed by ``offload_thrash`` are skipped.
    """
    seen = [g for g in parts.map(_proc_times) if g is not None]
    if not seen:
        return None
    t_sorted = np.unique(np.concatenate([g[0] for g in seen]))
    step_ns = float(np.median(np.diff(t_sorted))) if len(t_sorted) > 1 else 1e9
    tol = pd.Timedelta(int(max(3 * step_ns, 1e9)), "ns").value
    # the main (driver) process dispatches work for every GPU of the job, wherever it runs
    main = pd.concat([g[1] for g in seen], ignore_index=True)
    main_max = main.groupby("t_ns", sort=False)["cpu"].max().reset_index()
    got = [g for g in parts.map(_pinned, th, tol, main_max) if g is not None]
    if not any(g["pinned"] for g in got):
        return None
    g = pd.concat([x["groups"] for x in got], ignore_index=True)
    # a trainer process reads a core or more from spin-wait alone: only a clear utilisation
    # shortfall (not a few points of noise or of another stall) is launch-bound
    g = g[g["util"] < th.host_bound_util_max]
    if g.empty:
        return None
    g["lost"] = g["gpu_s"] * (th.host_bound_util_ref - g["util"]).clip(0)
    gpu_s = float(g["lost"].sum())
    mean_util = float(g["uw"].sum() / g["gpu_s"].sum())
    # the pinned samples' figures, added up exactly (`exact_sum`): the same however cut
    rows = {k: [x["rows"][k] for x in got if "rows" in x] for k in _PINNED_FIGURES}
    compute_s = float(sum(x["compute_s"] for x in got))
    pinned_s = float(sum(rows["dt"], Fraction(0)))
    pinned_share = pinned_s / compute_s if compute_s > 0 else 0
    cpu_mean = _mean_of(rows["cpu"])
    own_share = float(sum(n for n, _ in rows["own"])) / max(1, sum(m for _, m in rows["own"]))
    sm_mean = _mean_of(rows["sm"])
    confidence = 0.45 + 0.3 * min(1.0, pinned_share) + 0.15 * own_share
    confidence += 0.1 if mean_util < 85 else 0.0
    intervals = g.groupby(["phase", "step"]).agg(
        start_ns=("start_ns", "min"), end_ns=("end_ns", "max"), w=("lost", "sum")
    )
    evidence = HostBoundEvidence(
        intervals=_intervals(intervals.reset_index(), "w"),
        gpus=_sorted_gpus(g),
        phases=sorted(set(g["phase"])),
        util_gpu_pct=round(mean_util, 1),
        process_cpu_pct_of_core=round(cpu_mean, 1),
        pinned_share_of_compute=round(pinned_share, 4),
        rank_process_pinned_share=round(own_share, 4),
        cpu_measure="process",
    )
    who = f"a process runs at {cpu_mean:.0f}% of a core"
    if any(x["by_thread"] for x in got):
        _thread_evidence(evidence, parts, evidence.intervals)
        if evidence.python_thread:
            evidence.cpu_measure = "busiest_python_thread"
            who = (f"the busiest Python thread ({evidence.python_thread}) runs at "
                   f"{evidence.python_thread_cpu_pct:.0f}% of a core")  # fmt: skip
    summary = (
        f"util {mean_util:.0f}% in compute phases while {who} ({pinned_share:.0%} of compute "
        f"time): ~{_fmt_gpu_s(gpu_s)} ({{share}}) lost to launch/Python overhead"
    )
    if np.isfinite(sm_mean):
        evidence.sm_active_pct = round(sm_mean, 1)
    return _finding("host_bound", parts, th, gpu_s, confidence, summary, evidence)


def _proc_samples(ctx: AnalysisContext) -> pd.DataFrame | None:
    """One part's process samples (host, pid, t_ns, cpu, role; ``cpu`` its busiest Python
    thread's where threads were recorded, with ``by_thread``), or None."""

    def compute() -> pd.DataFrame | None:
        procs = ctx.run.procs
        if procs is None or procs.empty or "cpu_pct" not in procs:
            return None
        cpu = _num(procs, "cpu_pct")
        p = pd.DataFrame(
            {
                # object columns: pandas would otherwise turn every string into an Arrow string
                "host": pd.Series(as_texts(procs["host"]), dtype=object),
                "pid": _num(procs, "pid"),
                "t_ns": _num(procs, "t_ns"),
                "cpu": cpu,
                "role": pd.Series(procs["role"].astype(object).to_numpy(), dtype=object)
                if "role" in procs
                else None,
            }
        ).dropna(subset=["pid", "t_ns", "cpu"])
        if p.empty:
            return None
        p["t_ns"] = p["t_ns"].astype(np.int64)
        threads = thread_table(ctx.run)
        return _by_python_thread(p, threads) if threads is not None else p

    return _memo(ctx, "host_bound_procs", compute)


def _proc_times(ctx: AnalysisContext) -> tuple[np.ndarray, pd.DataFrame] | None:
    """One part's process sampling instants and its ``main`` processes' readings (t_ns, cpu);
    None when it has no process readings."""
    p = _proc_samples(ctx)
    if p is None:
        return None
    main = p[p["role"] == "main"] if "role" in p else p.iloc[:0]
    return np.unique(p["t_ns"].to_numpy()), main[["t_ns", "cpu"]]


def _pinned(ctx: AnalysisContext, th: Thresholds, tol: int, main_max: pd.DataFrame) -> dict | None:
    """One part's compute samples with their owner's or a main process pinned at a core:
    per (GPU, phase, step) their seconds, weighted utilisation and stretch; their CPU, own
    CPU and SM activity (in sample order); the part's compute seconds. None without them."""
    s = ctx.unclaimed_samples
    p = _proc_samples(ctx)
    if s is None or s.empty or p is None:
        return None
    compute = s["phase"].isin(COMPUTE_PHASES).to_numpy() & ~_offload_mask(s, th)
    if not compute.any():
        return None
    rows = np.flatnonzero(compute)
    t = s["t_ns"].to_numpy(np.int64)[rows]
    p_t = p["t_ns"].to_numpy(np.int64)
    p_cpu = p["cpu"].to_numpy(np.float64)
    # the rank's own process at that instant (nearest earlier reading, within tolerance)
    own_cpu = np.full(len(s), np.nan)
    at = asof_backward(
        t, p_t, tol,
        [s["owner_host"].astype(object).to_numpy()[rows], _num(s, "pid")[rows]],
        [p["host"].to_numpy(object), p["pid"].to_numpy(np.float64)],
    )  # fmt: skip
    own_cpu[rows[at >= 0]] = p_cpu[at[at >= 0]]
    main_cpu = np.full(len(s), np.nan)
    if not main_max.empty:
        at = asof_backward(t, main_max["t_ns"].to_numpy(np.int64), tol)
        main_cpu[rows[at >= 0]] = main_max["cpu"].to_numpy(np.float64)[at[at >= 0]]
    pinned_cpu = np.fmax(own_cpu, main_cpu)
    pinned = compute & (pinned_cpu >= th.process_core_pinned_pct)
    util = _num(s, "util_gpu_pct")
    pinned &= np.isfinite(util)
    dt = s["dt_s"].to_numpy(np.float64)
    out = {
        "pinned": bool(pinned.any()),
        "by_thread": bool("by_thread" in p and p["by_thread"].any()),
    }
    if not pinned.any():
        return out
    # per (GPU, phase, step), grouped on integer codes (as ``groupby([host, gpu, phase,
    # step], sort=False)``: groups in order of first appearance, the same sums)
    gpu_code, _ = _gpu_codes(ctx, s)
    step = np.nan_to_num(_num(s, "step")[pinned], nan=-1.0)
    key = appearance_codes([gpu_code[pinned], s["phase"][pinned], step])
    kept = key >= 0
    t0 = s["t_ns"].to_numpy(np.int64)[pinned]
    work = pd.DataFrame(
        {
            "dt": dt[pinned],
            "uw": util[pinned] * dt[pinned],
            "t0": t0,
            "t1": t0 + (dt[pinned] * 1e9).astype(np.int64),
        }
    )[kept]
    grouped = work.groupby(key[kept], sort=True)
    first = np.flatnonzero(pinned)[first_rows(key)]
    g = pd.DataFrame(
        {
            "host": pd.Series(s["host"].to_numpy(object)[first], dtype=object),
            "gpu": s["gpu"].to_numpy()[first],
            "phase": pd.Series(s["phase"].to_numpy(object)[first], dtype=object),
            "step": step[first_rows(key)],
            "gpu_s": grouped["dt"].sum().to_numpy(),
            "uw": grouped["uw"].sum().to_numpy(),
            "start_ns": grouped["t0"].min().to_numpy(),
            "end_ns": grouped["t1"].max().to_numpy(),
        }
    )
    g = g[g["gpu_s"] > 0].reset_index(drop=True)
    g["util"] = g["uw"] / g["gpu_s"] / 100.0
    out.update(
        groups=g,
        rows=_pinned_figures(dt[pinned], pinned_cpu[pinned], own_cpu[pinned],
                             _num(s, "sm_active_pct")[pinned], th),
        compute_s=exact_sum(dt[compute]),
    )  # fmt: skip
    return out


_PINNED_FIGURES = ("dt", "cpu", "own", "sm")


def _pinned_figures(
    dt: np.ndarray, cpu: np.ndarray, own: np.ndarray, sm: np.ndarray, th: Thresholds
) -> dict[str, Any]:
    """One part's pinned samples as the figures the run's are combined from (a few numbers,
    not a row a sample): their seconds (exact); the sum (exact) and count of the finite
    readings of the pinning CPU and of SM activity; how many of them had their rank's own
    process pinned, of how many."""

    def finite(values: np.ndarray) -> tuple[Fraction, int]:
        ok = np.isfinite(values)
        return exact_sum(values[ok]), int(ok.sum())

    own_pinned = int((own >= th.process_core_pinned_pct).sum())
    return {"dt": exact_sum(dt), "cpu": finite(cpu), "own": (own_pinned, len(own)),
            "sm": finite(sm)}  # fmt: skip


def _mean_of(parts: list[tuple[Fraction, int]]) -> float:
    """The mean of values given as the parts' (exact sum, count); NaN without any."""
    count = sum(n for _, n in parts)
    return float(sum((total for total, _ in parts), Fraction(0)) / count) if count else np.nan


SPINNING_CPU_PCT = 50.0
"""A thread that is not Python's, above this percent of a core in the pinned intervals, is
named in the evidence (``spinning_threads``)."""


def _by_python_thread(p: pd.DataFrame, threads: pd.DataFrame) -> pd.DataFrame:
    """Process samples with ``cpu`` replaced, for processes whose threads were recorded, by
    their busiest Python thread's CPU at the same reading (0 when none was busy: the
    process's threads are read at its own samples); ``by_thread`` marks those rows."""
    host = p["host"].to_numpy(object)
    pid = p["pid"].to_numpy().astype(np.int64)
    t = p["t_ns"].to_numpy(np.int64)
    t_host = threads["host"].to_numpy(object)
    t_pid = threads["pid"].to_numpy().astype(np.int64)
    by_thread = isin_rows([host, pid], [t_host, t_pid])
    # the busiest Python thread at each process reading: the largest CPU of the Python
    # threads' readings of the same process and instant (NaN: none), on codes of both
    py = np.flatnonzero(threads["python"].to_numpy(bool))
    codes = appearance_codes(
        [np.concatenate([host, t_host[py]]), np.concatenate([pid, t_pid[py]]),
         np.concatenate([t, threads["t_ns"].to_numpy(np.int64)[py]])],
    )  # fmt: skip
    busiest = np.full(int(codes.max(initial=-1)) + 1, np.nan)
    np.fmax.at(busiest, codes[len(p) :], threads["cpu"].to_numpy(np.float64)[py])
    got = busiest[codes[: len(p)]]
    return p.assign(cpu=np.where(by_thread, np.nan_to_num(got, nan=0.0), p["cpu"].to_numpy()),
                    by_thread=by_thread)  # fmt: skip


def _thread_evidence(evidence: HostBoundEvidence, parts: Parts,
                     intervals: list[list[int]]) -> None:  # fmt: skip
    """The busiest Python thread inside the finding's intervals, and the other threads
    busy there (CUDA, NCCL, OpenMP… spinning), into ``evidence`` (each part's threads)."""
    if not intervals:
        return
    s, e = union(np.array([a for a, _ in intervals], np.int64),
                 np.array([b for _, b in intervals], np.int64))  # fmt: skip
    got = [m for m in parts.map(_thread_means, s, e) if m is not None]
    if not got:
        return
    mean = pd.concat(got, ignore_index=True)
    # busiest first; of equal ones, by host, process and thread
    mean = mean.sort_values(["cpu", "host", "pid", "tid"], ascending=[False, True, True, True],
                            kind="stable")  # fmt: skip
    py = mean[mean["python"]]
    if len(py):
        top = py.iloc[0]
        evidence.python_thread = f"{top['name']} (pid {int(top['pid'])}, thread {int(top['tid'])})"
        evidence.python_thread_cpu_pct = round(float(top["cpu"]), 1)
    spin = mean[~mean["python"] & (mean["cpu"] >= SPINNING_CPU_PCT)].head(8)
    evidence.spinning_threads = [
        {"thread": str(r.name), "pid": int(r.pid), "tid": int(r.tid),
         "kind": thread_kind(str(r.name)), "cpu_pct": round(float(r.cpu), 1)}
        for r in spin.itertuples(index=False)
    ]  # fmt: skip


def _thread_means(ctx: AnalysisContext, s: np.ndarray, e: np.ndarray) -> pd.DataFrame | None:
    """One part's threads' mean CPU inside the stretches ``[s, e)`` (per process reading)."""
    threads = thread_table(ctx.run)
    if threads is None:
        return None
    inside = threads[in_union(threads["t_ns"].to_numpy(np.int64), s, e)]
    if inside.empty:
        return None
    ticks = inside.groupby(["host", "pid"])["t_ns"].nunique()
    mean = inside.groupby(["host", "pid", "tid", "name", "python"], sort=False)["cpu"].sum()
    mean = mean / ticks.reindex(mean.index.droplevel([2, 3, 4])).to_numpy()
    return mean.reset_index()


RUNTIME_PHASES = ("cuda_alloc", "cuda_sync")
"""Spans of blocking CUDA runtime calls (the Kineto importer makes them)."""


def _blocked_in_runtime(parts: Parts, th: Thresholds) -> Finding | None:
    """Idle GPU-time while the owner sits in a blocking CUDA runtime call: allocating or
    freeing device memory (``cuda_alloc``: ``torch.cuda.empty_cache()`` between steps, an
    allocator without cached blocks) or waiting on the device (``cuda_sync``). Nothing is
    launched meanwhile, so the idle time is the host's."""
    got = [g for g in parts.map(_runtime_idle) if g is not None]
    if not got:
        return None
    gpu_s = float(sum(g["idle"] for g in got))
    calls = pd.concat([g["calls"] for g in got], ignore_index=True)
    dur = (calls["end_ns"] - calls["start_ns"]).to_numpy(np.float64) / 1e9
    by_phase = pd.Series(dur).groupby(calls["phase"].to_numpy(object)).sum()
    alloc_s = float(by_phase.get("cuda_alloc", 0.0))
    sync_s = float(by_phase.get("cuda_sync", 0.0))
    what = "allocating / freeing device memory" if alloc_s >= sync_s else "synchronising"
    summary = (
        f"GPUs idle while the host blocks in the CUDA runtime, mostly {what} "
        f"({len(calls)} calls: {alloc_s:.1f} s in cudaMalloc/cudaFree, {sync_s:.1f} s in "
        f"synchronisations): ~{_fmt_gpu_s(gpu_s)} ({{share}})"
    )
    evidence = HostBoundEvidence(
        intervals=_intervals(pd.concat([g["runs"] for g in got], ignore_index=True), "w"),
        gpus=_joined_gpus(g["gpus"] for g in got),
        phases=sorted(set(calls["phase"])),
        sync_ops=len(calls),
        sync_s=round(sync_s, 3),
        alloc_s=round(alloc_s, 3),
    )
    confidence = 0.55 + 0.3 * min(1.0, gpu_s / max(parts.total_gpu_s, 1e-9) * 4)
    return _finding("host_bound", parts, th, gpu_s, confidence, summary, evidence)


def _runtime_idle(ctx: AnalysisContext) -> dict | None:
    """One part's idle seconds in blocking CUDA runtime calls, their runs and GPUs, and its
    runtime call spans; None when its samples saw no such call."""
    s = ctx.unclaimed_samples
    if s is None or s.empty or not s["phase"].isin(RUNTIME_PHASES).any():
        return None
    inside = s["phase"].isin(RUNTIME_PHASES).to_numpy()
    idle = np.nan_to_num(s["idle_gpu_s"].to_numpy(np.float64))
    spans = ctx.spans
    return {
        "idle": exact_sum(idle[inside]),
        "runs": _runs(s, inside, idle),
        "gpus": _gpu_pairs(s, np.flatnonzero(inside)),
        "calls": spans.loc[spans["phase"].isin(RUNTIME_PHASES), ["phase", "start_ns", "end_ns"]],
    }
