"""Shared helpers of the detectors that explain idle time by *where* it happens: a phase, its
tail, the gaps between phases.

Those detectors (one module each in this package) split the run's idle GPU-time between them
without double counting:

- idle inside ``reshard`` spans → ``reshard_idle``; ``reward`` → ``reward_bound``;
  ``dataload`` (or the idle head of a step, when no dataload span exists and the loader is
  visibly the cause) → ``dataloader_starvation``; ``checkpoint``/``eval`` → ``periodic_stall``;
- the decaying end of ``rollout`` spans → ``generation_tail``;
- idle with the owner only in its ``step`` span or outside every span (``"(none)"``): while
  other GPUs of the job work → ``pipeline_bubble``; while the other GPUs' owners sit in one of
  the phases above → that phase's kind (waiting for the reward scorer is reward time); while
  the whole job idles → ``idle_unattributed``.

Phases that any healthy job has (reward scoring, weight sync, loading a batch) get an
allowance: only their idle GPU-time beyond a share of the run's GPU-time
(``Thresholds.*_allowance_share``) is counted as lost. Phase GPU-time comes from the span
timeline where spans exist (exact even when spans are shorter than the sampling period) and its
idle share from the samples.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

import numpy as np
import pandas as pd

from gpuprof.analyzers.findings import AnalysisContext, Thresholds
from gpuprof.analyzers.grouping import (
    BinGroups,
    appearance_codes,
    first_rows,
    label_codes,
    per_frame,
    time_bins,
)
from gpuprof.analyzers.spans import NO_PHASE, STEP_PHASE
from gpuprof.intervals import in_union, top_intervals, union


def _allowance(th: Thresholds, phase: str) -> float:
    """Idle GPU-time a healthy job spends in ``phase``, as a share of the run's GPU-time; only
    idle beyond it is reported as lost (a well-tuned job still scores, syncs and loads)."""
    return {
        "reward": th.reward_allowance_share,
        "reshard": th.reshard_allowance_share,
        "dataload": th.dataload_allowance_share,
    }.get(phase, 0.0)


_WAIT_PHASES = frozenset({NO_PHASE, STEP_PHASE, "wait", "waiting", "idle"})
"""Owner states that explain nothing: idle here is a bubble or unattributed."""


_PERIODIC_PHASES = ("checkpoint", "eval")


_CLAIMED_PHASES = ("reward", "reshard", "dataload", "checkpoint", "eval")
"""Phases another detector owns, in the order they claim GPUs that wait for them."""


_TAIL_MIN_SAMPLES = 3  # head, body and tail: what a merged long run keeps (see loader)


_MAX_INTERVALS = 20


_MAX_GPUS = 64


def _memo(ctx: AnalysisContext, key: str, fn: Callable[[], Any]) -> Any:
    """Compute ``fn()`` once per context (several detectors share these figures)."""
    cache = ctx.__dict__.setdefault("_stalls_phase_cache", {})
    key = f"{int(ctx.claimed.sum())}:{key}"  # figures over the samples left unclaimed
    if key not in cache:
        cache[key] = fn()
    return cache[key]


def _samples(ctx: AnalysisContext) -> pd.DataFrame | None:
    """The aligned samples not claimed by an earlier stall (`AnalysisContext.claimed`), or None
    when there is no utilisation reading at all."""
    s = ctx.unclaimed_samples
    if s is None or s.empty or ctx.total_gpu_s <= 0:
        return None
    if not np.isfinite(s["util_gpu_pct"].to_numpy(np.float64)).any():
        return None
    return s


def _spans(ctx: AnalysisContext) -> pd.DataFrame:
    return ctx.spans


def _gpu_labels(frame: pd.DataFrame) -> list[str]:
    pairs = frame[["host", "gpu"]].drop_duplicates().sort_values(["host", "gpu"])
    return [f"{h}:{int(g)}" for h, g in zip(pairs["host"], pairs["gpu"])][:_MAX_GPUS]


def _phase_intervals(ctx: AnalysisContext, phases: Iterable[str]) -> list[list[int]]:
    sp = _spans(ctx)
    sp = sp[sp["phase"].isin(list(phases))]
    s, e = union(sp["start_ns"].to_numpy(np.int64), sp["end_ns"].to_numpy(np.int64))
    return top_intervals(s, e)


def _phase_gpu_s(ctx: AnalysisContext, s: pd.DataFrame, phase: str) -> float:
    """GPU-seconds the owners spent in ``phase``, from the span timeline (NaN if unknown).

    ``by_phase.wall_s`` is the owners' mean wall time in the phase; times the GPUs those
    owners drive, it is exact even for spans shorter than the sampling period.
    """
    row = ctx.by_phase[ctx.by_phase["phase"] == phase]
    if row.empty:
        return np.nan
    wall = float(row["wall_s"].iloc[0])
    if not np.isfinite(wall) or wall <= 0:
        return np.nan
    sp = _spans(ctx)
    owners = sp.loc[sp["phase"] == phase, ["host", "pid"]]
    owners = {(h, float(p)) for h, p in zip(owners["host"], owners["pid"])}

    # the (owner_host, pid) of each distinct (owner_host, pid, host, gpu) of the samples
    def owned() -> list[tuple[Any, float]]:
        gpu = per_frame(ctx, s, "gpu_key", lambda: _gpu_key(s))
        host_code, host_names = label_codes(s["owner_host"])
        pid = s["pid"].to_numpy(np.float64)
        first = first_rows(gpu)
        at = first[np.maximum(gpu, 0)]  # each sample's GPU's first sample
        same = host_code == host_code[at]
        same &= (pid == pid[at]) | (np.isnan(pid) & np.isnan(pid[at]))
        if (gpu >= 0).all() and same.all():  # one owner per GPU: its first sample says it
            rows = first[~np.isnan(pid[first])]
        else:
            frame = s[["owner_host", "pid", "host", "gpu"]]
            keep = np.flatnonzero(~np.isnan(pid))
            codes = appearance_codes(
                [frame[c].iloc[keep] for c in frame.columns], missing_is_value=True
            )
            rows = keep[first_rows(codes)]
        names = np.array([*host_names, np.nan], dtype=object)  # code -1: no owner host
        return list(zip(names[host_code[rows]], pid[rows]))

    n = sum(key in owners for key in per_frame(ctx, s, "owned_gpus", owned))
    return wall * n if n else np.nan


def _phase_idle(ctx: AnalysisContext, s: pd.DataFrame, phases: Iterable[str]) -> dict | None:
    """Idle figures of the samples in ``phases``: GPU-s (span-exact where possible), idle GPU-s,
    idle share, mean util, PCIe/NVLink bytes and rates; None when nothing was measured."""
    phases = list(phases)
    codes, names = label_codes(s["phase"])
    code_of = {name: i for i, name in enumerate(names)}
    in_phases = np.isin(codes, [code_of[p] for p in phases if p in code_of])
    codes = codes[in_phases]
    util = s["util_gpu_pct"].to_numpy(np.float64)[in_phases]
    dt = s["dt_s"].to_numpy(np.float64)[in_phases]
    m = np.isfinite(util)
    meas_dt = float(dt[m].sum())
    if meas_dt <= 0:
        return None
    idle = s["idle_gpu_s"].to_numpy(np.float64)[in_phases]
    gpu_s = idle_gpu_s = 0.0
    for phase in phases:
        in_phase = codes == code_of.get(phase, -2)
        p = in_phase & m
        if not p.any():
            continue
        frac = float(idle[p].sum() / dt[p].sum())
        exact = _phase_gpu_s(ctx, s, phase)
        sampled = float(dt[in_phase].sum())
        g = exact if np.isfinite(exact) and exact > 0 else sampled
        gpu_s += g
        idle_gpu_s += g * frac
    pcie = s["pcie_bytes"].to_numpy(np.float64)[in_phases]
    nvl = s["nvlink_bytes"].to_numpy(np.float64)[in_phases]
    measured = np.flatnonzero(in_phases)[m]
    # one measured sample per GPU is enough to name the GPUs (all of those without a key)
    gpu = per_frame(ctx, s, "gpu_key", lambda: _gpu_key(s))[measured]
    one = np.unique(gpu, return_index=True)[1]
    measured = np.union1d(measured[one[gpu[one] >= 0]], measured[gpu < 0])
    return {
        "gpu_s": gpu_s,
        "idle_gpu_s": idle_gpu_s,
        "idle_frac": idle_gpu_s / gpu_s if gpu_s > 0 else np.nan,
        "util_pct": float((util[m] * dt[m]).sum() / meas_dt),
        "gpus": _gpu_labels(s.iloc[measured][["host", "gpu"]]),
        "pcie_bytes": float(np.nansum(pcie)) if np.isfinite(pcie).any() else np.nan,
        "nvlink_bytes": float(np.nansum(nvl)) if np.isfinite(nvl).any() else np.nan,
        "pcie_bytes_s": _rate(pcie, dt),
        "nvlink_bytes_s": _rate(nvl, dt),
    }


def _rate(nbytes: np.ndarray, dt: np.ndarray) -> float:
    """Mean per-GPU rate (bytes/s) over the samples that measured it; NaN when none did."""
    ok = np.isfinite(nbytes) & (dt > 0)
    return float(nbytes[ok].sum() / dt[ok].sum()) if ok.any() else np.nan


def _excess(ctx: AnalysisContext, th: Thresholds, idle_gpu_s: float, phase: str) -> float:
    """Idle GPU-seconds beyond the healthy allowance of ``phase``."""
    return max(0.0, idle_gpu_s - _allowance(th, phase) * ctx.total_gpu_s)


def _num(value: float, fmt: str = ".1f") -> float | None:
    """A JSON-able figure: rounded float, None for NaN."""
    if value is None or not np.isfinite(value):
        return None
    return float(format(float(value), fmt))


def _minutes(gpu_s: float) -> str:
    """GPU-seconds as text: GPU-s, GPU-min, or GPU-h from an hour on (every stall's summary)."""
    if gpu_s >= 3600:
        return f"{gpu_s / 3600:.1f} GPU-h"
    return f"{gpu_s / 60:.1f} GPU-min" if gpu_s >= 60 else f"{gpu_s:.1f} GPU-s"


def _conf(x: float) -> float:
    return float(min(0.95, max(0.05, x)))


def _phase_where(ctx: AnalysisContext, phase: str) -> pd.DataFrame:
    """The spans of ``phase`` as (host, start_ns, end_ns) intervals."""
    sp = _spans(ctx)
    return sp.loc[sp["phase"] == phase, ["host", "start_ns", "end_ns"]]


def _times(frame: pd.DataFrame) -> np.ndarray:
    t = pd.to_numeric(frame["t_ns"], errors="coerce")
    return t.fillna(-1).to_numpy(np.int64)


def _cpu_during(ctx: AnalysisContext, where: pd.DataFrame, roles: set[str] | None) -> dict:
    """CPU while the intervals ``where`` (host, start_ns, end_ns) run on their host: the host's
    system CPU (``host_cpu_pct``, % of all cores) and the busiest watched process among
    ``roles`` (None: all) (``proc_cpu_pct``, % of one core). A key is absent when no sample
    falls inside the intervals."""
    out: dict[str, float] = {}
    host, procs = ctx.run.host, ctx.run.procs
    host_ok = host is not None and len(host) > 0 and {"cpu_pct", "t_ns", "host"} <= set(host)
    procs_ok = (
        procs is not None and len(procs) > 0 and {"cpu_pct", "t_ns", "host", "pid"} <= set(procs)
    )
    if where.empty or not (host_ok or procs_ok):
        return out
    host_t, host_cpu_all, host_rows = _memo(ctx, "host_cpu", lambda: _by_host(host, host_ok))
    proc_t, proc_cpu_all, proc_rows = _memo(ctx, "proc_cpu", lambda: _by_host(procs, procs_ok))
    roles_ok = None
    if procs_ok and roles is not None and "role" in procs:
        roles_ok = procs["role"].isin(list(roles)).to_numpy()
    pids = pd.to_numeric(procs["pid"], errors="coerce").to_numpy(np.float64) if procs_ok else None
    host_cpu, proc_frames = [], []
    for h, w in where.groupby("host", sort=False):
        starts = w["start_ns"].to_numpy(np.int64)
        ends = w["end_ns"].to_numpy(np.int64)
        rows = host_rows.get(str(h))
        if rows is not None:
            cpu = host_cpu_all[rows]
            inside = in_union(host_t[rows], starts, ends) & np.isfinite(cpu)
            host_cpu.append(cpu[inside])
        rows = proc_rows.get(str(h))
        if rows is not None:
            if roles_ok is not None:
                rows = rows[roles_ok[rows]]
            rows = rows[in_union(proc_t[rows], starts, ends)]
            proc_frames.append(
                pd.DataFrame({"host": str(h), "pid": pids[rows], "cpu": proc_cpu_all[rows]})
            )
    cpu = np.concatenate(host_cpu) if host_cpu else np.zeros(0)
    if len(cpu):
        out["host_cpu_pct"] = float(cpu.mean())
    if proc_frames:
        pf = pd.concat(proc_frames, ignore_index=True).dropna(subset=["cpu"])
        if len(pf):
            out["proc_cpu_pct"] = float(pf.groupby(["host", "pid"])["cpu"].mean().max())
    return out


def _by_host(frame: pd.DataFrame, ok: bool) -> tuple[np.ndarray, np.ndarray, dict[str, np.ndarray]]:
    """Times, CPU readings and the row indices of each host of a host/process sample frame
    (computed once per run: comparing host strings row by row is the slow part)."""
    if not ok:
        return np.zeros(0, np.int64), np.zeros(0), {}
    codes, names = pd.factorize(frame["host"].astype(object), use_na_sentinel=True)
    order = np.argsort(codes, kind="stable")
    bounds = np.searchsorted(codes[order], np.arange(len(names) + 1))
    rows = {str(n): order[bounds[i] : bounds[i + 1]] for i, n in enumerate(names)}
    cpu = pd.to_numeric(frame["cpu_pct"], errors="coerce").to_numpy(np.float64)
    return _times(frame), cpu, rows


def _busy_by_bin(s: pd.DataFrame, th: Thresholds) -> tuple[np.ndarray, np.ndarray]:
    """For each sample: how many *other* GPUs of the job were working at that instant, and the
    sample's time bin (samples of all GPUs binned on the median sampling period)."""
    bins = time_bins(s["t_ns"].to_numpy(np.int64), s["dt_s"].to_numpy(np.float64))
    busy = s["busy_frac"].to_numpy(np.float64) >= th.busy_util_pct / 100.0
    return _others(busy, bins, _gpu_key(s)), bins


def _gpu_key(s: pd.DataFrame) -> np.ndarray:
    """Each sample's GPU as a group number (``groupby(["host", "gpu"], sort=False).ngroup()``)."""
    return appearance_codes([s["host"], s["gpu"]])


def _others(flag: np.ndarray, bins: np.ndarray, gpu: np.ndarray) -> np.ndarray:
    """For each sample: how many samples of OTHER GPUs in its time bin have ``flag`` (samples
    of unequal length — merged long runs — can put two of one GPU in one bin)."""
    return BinGroups(bins, gpu).others(flag)


def _is_idle(s: pd.DataFrame, th: Thresholds) -> np.ndarray:
    return s["busy_frac"].to_numpy(np.float64) < th.idle_util_pct / 100.0


def _step_head(ctx: AnalysisContext, s: pd.DataFrame) -> np.ndarray:
    """Samples in the bare ``step`` span before the owner's first phase span of that step
    (empty when the run times its loading with ``dataload`` spans)."""

    def compute() -> np.ndarray:
        sp = _spans(ctx)
        if sp.empty or (sp["phase"] == "dataload").any():
            return np.zeros(len(s), dtype=bool)
        key = s.groupby(["host", "gpu", "step"], sort=False, dropna=False).ngroup().to_numpy()
        in_phase = ~s["phase"].isin(list(_WAIT_PHASES)).to_numpy()
        t = s["t_ns"].to_numpy(np.int64)
        first = pd.Series(np.where(in_phase, t, np.iinfo(np.int64).max)).groupby(key)
        first = first.transform("min").to_numpy()
        return (s["phase"] == STEP_PHASE).to_numpy() & (t < first) & s["step"].notna().to_numpy()

    return _memo(ctx, "step_head", compute)


def _head_where(s: pd.DataFrame, head: np.ndarray) -> pd.DataFrame:
    t = s["t_ns"].to_numpy(np.int64)[head]
    end = t + (np.nan_to_num(s["dt_s"].to_numpy(np.float64)[head]) * 1e9).astype(np.int64)
    return pd.DataFrame({"host": s["host"].to_numpy(object)[head], "start_ns": t, "end_ns": end})


def _step_head_claim(ctx: AnalysisContext, s: pd.DataFrame, th: Thresholds) -> np.ndarray:
    """The idle heads of steps (`_step_head`) that ``dataloader_starvation`` claims: only when
    the loader is visibly the cause there (`_loader_evidence`)."""
    head = _step_head(ctx, s)
    if not head.any() or not _loader_evidence(ctx, s, th, head=True)["any"]:
        return np.zeros(len(s), dtype=bool)
    return head


def _num_workers(ctx: AnalysisContext) -> int | None:
    """The run's configured DataLoader workers (any ``…num_workers`` knob), None if unknown."""
    workers = None
    for k, v in (ctx.run.meta.knobs or {}).items():
        if str(k).endswith("num_workers"):
            try:
                workers = int(v)
            except (TypeError, ValueError):
                continue
    return workers


def _loader_evidence(
    ctx: AnalysisContext, s: pd.DataFrame, th: Thresholds, head: bool = False
) -> dict[str, Any]:
    """Signs that input loading is slow: a loader/main process pinned while loading (in
    ``dataload`` spans, or in the idle step heads when ``head``), or 0–1 configured workers."""

    def compute() -> dict[str, Any]:
        out: dict[str, Any] = {}
        where = _head_where(s, _step_head(ctx, s)) if head else _phase_where(ctx, "dataload")
        cpu = _cpu_during(ctx, where, {"dataloader"})
        if "proc_cpu_pct" in cpu:
            out["loader_cpu_pct"] = cpu["proc_cpu_pct"]
        main = _cpu_during(ctx, where, {"main", "trainer"})
        if "proc_cpu_pct" in main:
            out["main_cpu_pct"] = main["proc_cpu_pct"]
        workers = _num_workers(ctx)
        out["num_workers"] = workers
        cpus = (out.get("loader_cpu_pct", 0.0), out.get("main_cpu_pct", 0.0))
        out["saturated"] = max(cpus) >= th.process_core_pinned_pct
        out["few_workers"] = workers is not None and workers <= 1
        out["any"] = out["saturated"] or out["few_workers"]
        return out

    return _memo(ctx, f"loader:{head}:{th.process_core_pinned_pct}", compute)


def _span_attr(ctx: AnalysisContext, phase: str, keys: tuple[str, ...]) -> float:
    """Mean of the first numeric attr among ``keys`` over the spans of ``phase`` (NaN)."""
    frame = _attrs(ctx, phase)
    for key in keys:
        if key in frame:
            v = pd.to_numeric(frame[key], errors="coerce")
            if v.notna().any():
                return float(v.mean())
    return np.nan


def _attrs(ctx: AnalysisContext, phase: str) -> pd.DataFrame:
    def compute() -> pd.DataFrame:
        spans = ctx.run.spans
        if spans is None or spans.empty or "attrs" not in spans or "phase" not in spans:
            return pd.DataFrame()
        attrs = spans.loc[spans["phase"] == phase, "attrs"]
        rows = [a if isinstance(a, dict) else {} for a in attrs]
        return pd.DataFrame(rows) if rows else pd.DataFrame()

    return _memo(ctx, f"attrs:{phase}", compute)


def _starts_ends(sp: pd.DataFrame) -> tuple[np.ndarray, np.ndarray]:
    return sp["start_ns"].to_numpy(np.int64), sp["end_ns"].to_numpy(np.int64)


def _wait_split(ctx: AnalysisContext, s: pd.DataFrame, th: Thresholds) -> dict[str, Any]:
    """Samples whose owner only waits (bare step span or no span), split by what the rest of
    the job did at that instant (samples of all GPUs binned on the sampling period):

    - ``bubble``: another GPU worked, or another owner was in an unclaimed phase (a serial
      gap such as advantage computation);
    - ``claimed[p]``: the others were idle in a phase another detector claims (``reward``,
      ``reshard``, ``dataload``, ``checkpoint``, ``eval``): waiting for it belongs to it;
    - ``alone``: the whole job waited — nothing explains it.
    """

    def compute() -> dict[str, Any]:
        # one grouping by (time bin, GPU) serves every count over the other GPUs
        bins = time_bins(s["t_ns"].to_numpy(np.int64), s["dt_s"].to_numpy(np.float64))
        groups = BinGroups(bins, per_frame(ctx, s, "gpu_key", lambda: _gpu_key(s)))
        others_busy = groups.others(s["busy_frac"].to_numpy(np.float64) >= th.busy_util_pct / 100.0)
        codes, names = label_codes(s["phase"])
        code_of = {name: i for i, name in enumerate(names)}
        in_wait = np.isin(codes, [code_of[p] for p in _WAIT_PHASES if p in code_of])
        waiting = in_wait & ~_step_head_claim(ctx, s, th)
        idle = np.nan_to_num(s["idle_gpu_s"].to_numpy(np.float64))
        is_idle = _is_idle(s, th)
        others_in_phase = groups.others(~in_wait)  # waiting samples aren't counted
        bubble = waiting & is_idle & (others_busy > 0)
        rest = waiting & ~bubble
        claimed: dict[str, np.ndarray] = {}
        taken = np.zeros(len(s), dtype=bool)
        for p in _CLAIMED_PHASES:
            if p in code_of:
                n_p = groups.others(codes == code_of[p])
                claimed[p] = rest & ~taken & (n_p > 0)
            else:  # no sample in the phase: nobody waits for it
                claimed[p] = np.zeros(len(s), dtype=bool)
            taken |= claimed[p]
        bubble |= rest & ~taken & (others_in_phase > 0) & is_idle
        alone = rest & ~taken & (others_in_phase == 0)
        return {"bubble": bubble, "alone": alone, "claimed": claimed, "idle": idle, "bins": bins}

    return _memo(ctx, f"wait:{th.busy_util_pct}:{th.process_core_pinned_pct}", compute)


def _waiting_on(ctx: AnalysisContext, s: pd.DataFrame, th: Thresholds, phases: list[str]):
    """Idle GPU-seconds of GPUs that only waited while the rest of the job was in ``phases``."""
    split = _wait_split(ctx, s, th)
    mask = np.zeros(len(s), dtype=bool)
    for p in phases:
        mask |= split["claimed"].get(p, mask)
    return float(split["idle"][mask].sum())


def _sample_intervals(s: pd.DataFrame, mask: np.ndarray, idle: np.ndarray) -> list[list[int]]:
    """The worst contiguous stretches of masked samples, as ``[start_ns, end_ns]``."""
    from gpuprof.analyzers.parts import stretches, top_stretches

    t = s["t_ns"].to_numpy(np.int64)
    return top_stretches([stretches(t, s["dt_s"].to_numpy(np.float64), mask, idle)])
