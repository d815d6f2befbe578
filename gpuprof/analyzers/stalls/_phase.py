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

What compares GPUs with each other (the other GPUs' state in the same time bin, the run's
sampling period, whether the loader is to blame for the heads of steps) is counted over every
part of a run (`parts.Parts`: `wait_inputs`, `phase_idle`, `cpu_during`, `loader_evidence`),
so a node's waiting GPUs see the other nodes' GPUs.

Phases that any healthy job has (reward scoring, weight sync, loading a batch) get an
allowance: only their idle GPU-time beyond a share of the run's GPU-time
(``Thresholds.*_allowance_share``) is counted as lost. Phase GPU-time comes from the span
timeline where spans exist (exact even when spans are shorter than the sampling period) and its
idle share from the samples.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from fractions import Fraction
from typing import Any

import numpy as np
import pandas as pd

from gpuprof.analyzers.findings import AnalysisContext, Thresholds
from gpuprof.analyzers.grouping import (
    _DENSE_SLACK,
    BinGroups,
    appearance_codes,
    dense_codes,
    first_rows,
    group_rows,
    label_codes,
    per_frame,
    time_bins,
)
from gpuprof.analyzers.parts import Parts, exact_sum, value_counts
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


def _parts(ctx: AnalysisContext | Parts) -> Parts:
    """``ctx`` as `Parts` (a context alone: the whole run, its one part)."""
    return ctx if isinstance(ctx, Parts) else Parts.of(ctx)


def _parts_memo(parts: Parts, key: str, fn: Callable[[], Any]) -> Any:
    """`_memo` for figures of the whole run made from every part (kept on the first part,
    over the samples each part left unclaimed)."""
    cache = parts.lead.__dict__.setdefault("_stalls_parts_cache", {})
    key = f"{_claim_state(parts)}:{key}"
    if key not in cache:
        cache[key] = fn()
    return cache[key]


def _claimed_count(ctx: AnalysisContext) -> int:
    return int(ctx.claimed.sum())


def _claim_state(parts: Parts) -> str:
    """The samples each part has claimed so far, as a key (figures over the unclaimed)."""
    return ",".join(str(n) for n in parts.map(_claimed_count))


def _has_samples(ctx: AnalysisContext) -> bool:
    """Whether the part has unclaimed samples with a utilisation reading (`_samples`)."""
    return _samples(ctx) is not None


def _any_samples(parts: Parts) -> bool:
    """Whether any part has `_samples` (else the detectors read phase times alone)."""
    return any(parts.map(_has_samples))


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
    return _joined_labels([_gpu_pairs(frame)])


def _gpu_pairs(frame: pd.DataFrame, rows: np.ndarray | None = None) -> list[tuple[str, int]]:
    """The distinct (host, GPU) of a frame's samples (its ``rows``, positions, when given),
    in order of first appearance: one part's share of `_joined_labels`."""
    host, gpu = frame["host"], frame["gpu"]
    if rows is not None:
        host, gpu = host.iloc[rows], gpu.iloc[rows]
    first = first_rows(appearance_codes([host, gpu], missing_is_value=True))
    hosts, gpus = host.to_numpy(object)[first], gpu.to_numpy()[first]
    return [(str(h), int(g)) for h, g in zip(hosts, gpus.tolist())]


def _phases_of(frame: pd.DataFrame, rows: np.ndarray) -> set[str]:
    """The phases of a frame's ``rows`` (positions) as text: what ``{str(p) for p in
    frame["phase"].iloc[rows].unique()}`` gives, read off the column's codes."""
    codes, names = label_codes(frame["phase"])
    used = np.unique(codes[rows])
    return {str(names[c]) if c >= 0 else str(np.nan) for c in used}


def _joined_labels(pairs: Iterable[list[tuple[str, int]]]) -> list[str]:
    """``host:gpu`` of the parts' `_gpu_pairs`, sorted, the first `_MAX_GPUS`."""
    joined = sorted({pair for part in pairs for pair in part})
    return [f"{h}:{g}" for h, g in joined][:_MAX_GPUS]


def _phase_intervals(ctx: AnalysisContext | Parts, phases: Iterable[str]) -> list[list[int]]:
    """The longest stretches covered by spans of ``phases`` on any node (`top_intervals`)."""
    phases = list(phases)
    got = _parts(ctx).map(_phase_union, phases)
    s, e = union(np.concatenate([g[0] for g in got]), np.concatenate([g[1] for g in got]))
    return top_intervals(s, e)


def _phase_union(ctx: AnalysisContext, phases: list[str]) -> tuple[np.ndarray, np.ndarray]:
    sp = _spans(ctx)
    rows = np.flatnonzero(sp["phase"].isin(phases).to_numpy())
    return union(sp["start_ns"].to_numpy(np.int64)[rows], sp["end_ns"].to_numpy(np.int64)[rows])


def _phase_gpu_s(ctx: AnalysisContext, s: pd.DataFrame, phase: str) -> float:
    """GPU-seconds the owners spent in ``phase``, from the span timeline (NaN if unknown).

    ``by_phase.wall_s`` is the owners' mean wall time in the phase; times the GPUs those
    owners drive, it is exact even for spans shorter than the sampling period.
    """
    wall = _phase_wall(ctx, phase)
    if not np.isfinite(wall):
        return np.nan
    n = _owned_in_phase(ctx, s, phase)
    return wall * n if n else np.nan


def _phase_wall(ctx: AnalysisContext, phase: str) -> float:
    """The owners' mean wall seconds in ``phase`` (the run's ``by_phase``); NaN when none."""
    table = ctx.by_phase
    rows = np.flatnonzero(table["phase"].to_numpy(object) == phase)
    if not len(rows):
        return np.nan
    wall = float(table["wall_s"].to_numpy()[rows[0]])
    return wall if np.isfinite(wall) and wall > 0 else np.nan


def _owned_in_phase(ctx: AnalysisContext, s: pd.DataFrame, phase: str) -> int:
    """How many GPUs of ``s`` have an owner that recorded a ``phase`` span."""
    sp = _spans(ctx)
    # distinct first: a set built over every span's row iterates pandas' text column in Python
    # (seconds over a cluster-day's spans); a usable span's pid is finite, so each is one key
    rows = np.flatnonzero(sp["phase"].to_numpy(object) == phase)
    host, pid = sp["host"].to_numpy(object)[rows], sp["pid"].to_numpy()[rows]
    first = first_rows(appearance_codes([host, pid], missing_is_value=True))
    owners = {(h, float(p)) for h, p in zip(host[first].tolist(), pid[first].tolist())}

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

    return sum(key in owners for key in per_frame(ctx, s, "owned_gpus", owned))


def _phase_idle(ctx: AnalysisContext, s: pd.DataFrame, phases: Iterable[str]) -> dict | None:
    """Idle figures of the samples in ``phases``: GPU-s (span-exact where possible), idle GPU-s,
    idle share, mean util, PCIe/NVLink bytes and rates; None when nothing was measured."""
    phases = list(phases)
    return _phase_idle_joined(ctx, phases, [_phase_idle_part(ctx, s, phases)])


def phase_idle(parts: Parts, phases: Iterable[str]) -> dict | None:
    """`_phase_idle` of every part's unclaimed samples together (None when none was
    measured)."""
    phases = list(phases)
    got = [g for g in parts.map(_phase_idle_of, phases) if g is not None]
    return _phase_idle_joined(parts.lead, phases, got)


def _phase_idle_of(ctx: AnalysisContext, phases: list[str]) -> dict | None:
    s = _samples(ctx)
    return None if s is None else _phase_idle_part(ctx, s, phases)


def _phase_idle_part(ctx: AnalysisContext, s: pd.DataFrame, phases: list[str]) -> dict:
    """One part's sums behind `_phase_idle`."""
    codes, names = label_codes(s["phase"])
    code_of = {name: i for i, name in enumerate(names)}
    in_phases = np.isin(codes, [code_of[p] for p in phases if p in code_of])
    codes = codes[in_phases]
    util = s["util_gpu_pct"].to_numpy(np.float64)[in_phases]
    dt = s["dt_s"].to_numpy(np.float64)[in_phases]
    m = np.isfinite(util)
    idle = s["idle_gpu_s"].to_numpy(np.float64)[in_phases]
    per_phase = {}
    for phase in phases:
        in_phase = codes == code_of.get(phase, -2)
        p = in_phase & m
        if p.any():
            per_phase[phase] = {"idle": exact_sum(idle[p]), "dt": exact_sum(dt[p]),
                                "sampled": exact_sum(dt[in_phase]),
                                "owned": _owned_in_phase(ctx, s, phase)}  # fmt: skip
    links = {}
    for name in ("pcie_bytes", "nvlink_bytes"):
        nbytes = s[name].to_numpy(np.float64)[in_phases]
        finite = np.isfinite(nbytes)
        ok = finite & (dt > 0)
        links[name] = (exact_sum(nbytes), bool(finite.any()),
                       exact_sum(nbytes[ok]), exact_sum(dt[ok]), bool(ok.any()))  # fmt: skip
    measured = np.flatnonzero(in_phases)[m]
    # one measured sample per GPU is enough to name the GPUs (all of those without a key)
    gpu = per_frame(ctx, s, "gpu_key", lambda: _gpu_key(s))[measured]
    one = np.unique(gpu, return_index=True)[1]
    measured = np.union1d(measured[one[gpu[one] >= 0]], measured[gpu < 0])
    return {"meas_dt": exact_sum(dt[m]), "util_w": exact_sum(util[m] * dt[m]),
            "phases": per_phase,
            "links": links, "gpus": _gpu_pairs(s, measured)}  # fmt: skip


def _phase_idle_joined(lead: AnalysisContext, phases: list[str], got: list[dict]) -> dict | None:
    """`_phase_idle` from the parts' `_phase_idle_part` (one part: the whole run's)."""

    def total(values: list) -> Any:
        return values[0] if len(values) == 1 else sum(values)

    meas_dt = float(total([g["meas_dt"] for g in got])) if got else 0.0
    if meas_dt <= 0:
        return None
    gpu_s = idle_gpu_s = 0.0
    for phase in phases:
        mine = [g["phases"][phase] for g in got if phase in g["phases"]]
        if not mine:
            continue
        frac = float(total([m["idle"] for m in mine]) / total([m["dt"] for m in mine]))
        wall, owned = _phase_wall(lead, phase), sum(m["owned"] for m in mine)
        exact = wall * owned if np.isfinite(wall) and owned else np.nan
        sampled = float(total([m["sampled"] for m in mine]))
        g = exact if np.isfinite(exact) and exact > 0 else sampled
        gpu_s += g
        idle_gpu_s += g * frac
    out = {
        "gpu_s": gpu_s,
        "idle_gpu_s": idle_gpu_s,
        "idle_frac": idle_gpu_s / gpu_s if gpu_s > 0 else np.nan,
        "util_pct": float(total([g["util_w"] for g in got]) / meas_dt),
        "gpus": _joined_labels(g["gpus"] for g in got),
    }
    for name in ("pcie_bytes", "nvlink_bytes"):
        links = [g["links"][name] for g in got]
        out[name] = float(total([x[0] for x in links])) if any(x[1] for x in links) else np.nan
        ok = any(x[4] for x in links)
        rate = float(total([x[2] for x in links]) / total([x[3] for x in links])) if ok else np.nan
        out[f"{name}_s"] = rate
    return out


def _rate(nbytes: np.ndarray, dt: np.ndarray) -> float:
    """Mean per-GPU rate (bytes/s) over the samples that measured it; NaN when none did."""
    ok = np.isfinite(nbytes) & (dt > 0)
    return float(nbytes[ok].sum() / dt[ok].sum()) if ok.any() else np.nan


def _rates_outside(parts: Parts, phase: str) -> tuple[float, float]:
    """The mean PCIe and NVLink rates (bytes/s, `_rate`) of every part's unclaimed samples
    outside ``phase``."""
    got = [g for g in parts.map(_link_sums, phase) if g is not None]
    out = []
    for k in range(2):
        mine = [g[k] for g in got if g[k][2]]
        out.append(float(sum(m[0] for m in mine) / sum(m[1] for m in mine)) if mine else np.nan)
    return out[0], out[1]


def _link_sums(ctx: AnalysisContext, phase: str) -> list[tuple[float, float, bool]] | None:
    """Per link (PCIe, NVLink): bytes and seconds of one part's unclaimed samples outside
    ``phase`` that measured it, and whether any did (None without samples)."""
    s = _samples(ctx)
    if s is None:
        return None
    out = (s["phase"] != phase).to_numpy()
    dt = s["dt_s"].to_numpy(float)[out]
    sums = []
    for name in ("pcie_bytes", "nvlink_bytes"):
        nbytes = s[name].to_numpy(float)[out]
        ok = np.isfinite(nbytes) & (dt > 0)
        sums.append((exact_sum(nbytes[ok]), exact_sum(dt[ok]), bool(ok.any())))
    return sums


def _excess(ctx: AnalysisContext | Parts, th: Thresholds, idle_gpu_s: float, phase: str) -> float:
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


def _phase_where(ctx: AnalysisContext, phase: str) -> dict[str, np.ndarray]:
    """The spans of ``phase`` as (host, start_ns, end_ns) intervals (arrays)."""
    sp = _spans(ctx)
    rows = np.flatnonzero(sp["phase"].to_numpy(object) == phase)
    return {"host": sp["host"].to_numpy(object)[rows],
            "start_ns": sp["start_ns"].to_numpy(np.int64)[rows],
            "end_ns": sp["end_ns"].to_numpy(np.int64)[rows]}  # fmt: skip


def _times(frame: pd.DataFrame) -> np.ndarray:
    t = pd.to_numeric(frame["t_ns"], errors="coerce")
    return t.fillna(-1).to_numpy(np.int64)


def _cpu_during(ctx: AnalysisContext, where: dict[str, np.ndarray], roles: set[str] | None) -> dict:
    """CPU while the intervals ``where`` (host, start_ns, end_ns arrays) run on their host:
    the host's system CPU (``host_cpu_pct``, % of all cores) and the busiest watched process
    among ``roles`` (None: all) (``proc_cpu_pct``, % of one core). A key is absent when no
    sample falls inside the intervals."""
    return _cpu_joined([_cpu_part(ctx, where, roles)])


def cpu_during(parts: Parts, phase: str, roles: set[str] | None) -> dict:
    """`_cpu_during` the spans of ``phase`` on every node (each part holds its node's spans,
    host and process samples)."""
    return _cpu_joined(parts.map(_cpu_in_phase, phase, roles))


def _cpu_in_phase(ctx: AnalysisContext, phase: str, roles: set[str] | None) -> dict:
    return _cpu_part(ctx, _phase_where(ctx, phase), roles)


def _cpu_part(ctx: AnalysisContext, where: dict[str, np.ndarray], roles: set[str] | None) -> dict:
    """One part's CPU readings inside ``where``: the host readings per host (hosts in sorted
    order) and the process readings per host (host, pids, cpu)."""
    out: dict[str, list] = {"host": [], "procs": []}
    host, procs = ctx.run.host, ctx.run.procs
    host_ok = host is not None and len(host) > 0 and {"cpu_pct", "t_ns", "host"} <= set(host)
    procs_ok = (
        procs is not None and len(procs) > 0 and {"cpu_pct", "t_ns", "host", "pid"} <= set(procs)
    )
    if not len(where["host"]) or not (host_ok or procs_ok):
        return out
    host_t, host_cpu_all, host_rows = _memo(ctx, "host_cpu", lambda: _by_host(host, host_ok))
    proc_t, proc_cpu_all, proc_rows = _memo(ctx, "proc_cpu", lambda: _by_host(procs, procs_ok))
    roles_ok = None
    if procs_ok and roles is not None and "role" in procs:
        roles_ok = procs["role"].isin(list(roles)).to_numpy()
    pids = _memo(ctx, "proc_pid", lambda: _pids(procs)) if procs_ok else None
    # hosts in sorted order: the readings of a run cut into parts by node come in that order
    names = np.array([str(h) for h in where["host"]], dtype=object)
    by_host = group_rows([names])
    for (h,) in sorted(by_host):
        at = by_host[(h,)]
        starts, ends = where["start_ns"][at], where["end_ns"][at]
        rows = host_rows.get(h)
        if rows is not None:
            cpu = host_cpu_all[rows]
            inside = in_union(host_t[rows], starts, ends) & np.isfinite(cpu)
            out["host"].append(cpu[inside])
        rows = proc_rows.get(h)
        if rows is not None:
            if roles_ok is not None:
                rows = rows[roles_ok[rows]]
            rows = rows[in_union(proc_t[rows], starts, ends)]
            out["procs"].append((h, pids[rows], proc_cpu_all[rows]))
    return out


def _pids(procs: pd.DataFrame) -> np.ndarray:
    return pd.to_numeric(procs["pid"], errors="coerce").to_numpy(np.float64)


def _cpu_joined(got: list[dict]) -> dict:
    """`_cpu_during` from the parts' `_cpu_part`."""
    out: dict[str, float] = {}
    host_cpu = [a for g in got for a in g["host"]]
    cpu = np.concatenate(host_cpu) if host_cpu else np.zeros(0)
    if len(cpu):
        out["host_cpu_pct"] = float(cpu.mean())
    procs = [p for g in got for p in g["procs"]]
    if procs:
        host = np.concatenate([np.full(len(p[1]), p[0], dtype=object) for p in procs])
        pid, cpu = (np.concatenate([p[i] for p in procs]) for i in (1, 2))
        read = ~np.isnan(cpu)
        if read.any():
            # the busiest process: the largest of the processes' mean readings (pandas'
            # means, as a group-by on host and pid gives them; a reading without a pid in none)
            group = appearance_codes([host[read], pid[read]])
            ok = group >= 0
            means = pd.Series(cpu[read][ok], copy=False).groupby(group[ok]).mean()
            out["proc_cpu_pct"] = float(means.max())
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


def _run_phases(ctx: AnalysisContext) -> frozenset:
    """The phases of every span of the run (of every part, for a part of a run)."""
    return _parts(ctx).facts.phases


def _step_head(ctx: AnalysisContext, s: pd.DataFrame) -> np.ndarray:
    """Samples in the bare ``step`` span before the owner's first phase span of that step
    (none when the run has no spans, or times its loading with ``dataload`` spans)."""

    def compute() -> np.ndarray:
        phases = _run_phases(ctx)
        if not phases or "dataload" in phases:
            return np.zeros(len(s), dtype=bool)
        key = s.groupby(["host", "gpu", "step"], sort=False, dropna=False).ngroup().to_numpy()
        in_phase = ~s["phase"].isin(list(_WAIT_PHASES)).to_numpy()
        t = s["t_ns"].to_numpy(np.int64)
        first = pd.Series(np.where(in_phase, t, np.iinfo(np.int64).max)).groupby(key)
        first = first.transform("min").to_numpy()
        return (s["phase"] == STEP_PHASE).to_numpy() & (t < first) & s["step"].notna().to_numpy()

    return _memo(ctx, "step_head", compute)


def _head_where(s: pd.DataFrame, head: np.ndarray) -> dict[str, np.ndarray]:
    t = s["t_ns"].to_numpy(np.int64)[head]
    end = t + (np.nan_to_num(s["dt_s"].to_numpy(np.float64)[head]) * 1e9).astype(np.int64)
    return {"host": s["host"].to_numpy(object)[head], "start_ns": t, "end_ns": end}


def _step_head_claim(ctx: AnalysisContext, s: pd.DataFrame, th: Thresholds) -> np.ndarray:
    """The idle heads of steps (`_step_head`) that ``dataloader_starvation`` claims: only when
    the loader is visibly the cause there (`_loader_evidence`)."""
    head = _step_head(ctx, s)
    if not head.any() or not _loader_evidence(ctx, s, th, head=True)["any"]:
        return np.zeros(len(s), dtype=bool)
    return head


def _any_head(ctx: AnalysisContext) -> bool:
    s = _samples(ctx)
    return s is not None and bool(_step_head(ctx, s).any())


def _head_claimed(parts: Parts, th: Thresholds) -> bool:
    """Whether ``dataloader_starvation`` claims the idle heads of steps (`_step_head_claim`),
    the loader judged on every part's step heads."""

    def compute() -> bool:
        return any(parts.map(_any_head)) and loader_evidence(parts, th, head=True)["any"]

    return _parts_memo(parts, f"head_claim:{th.process_core_pinned_pct}", compute)


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
        where = _head_where(s, _step_head(ctx, s)) if head else _phase_where(ctx, "dataload")
        return _loader_joined(
            ctx, th, [_cpu_part(ctx, where, {"dataloader"})],
            [_cpu_part(ctx, where, {"main", "trainer"})],
        )  # fmt: skip

    return _memo(ctx, f"loader:{head}:{th.process_core_pinned_pct}", compute)


def loader_evidence(parts: Parts, th: Thresholds, head: bool = False) -> dict[str, Any]:
    """`_loader_evidence` over every part (each part's step heads or ``dataload`` spans on
    its own node's CPU readings)."""

    def compute() -> dict[str, Any]:
        got = parts.map(_loader_cpu, head)
        return _loader_joined(parts.lead, th, [g[0] for g in got], [g[1] for g in got])

    return _parts_memo(parts, f"loader:{head}:{th.process_core_pinned_pct}", compute)


def _loader_cpu(ctx: AnalysisContext, head: bool) -> tuple[dict, dict]:
    """One part's loader and main-process CPU readings in its step heads or dataload spans."""
    if head:
        s = _samples(ctx)
        where = _NO_WHERE if s is None else _head_where(s, _step_head(ctx, s))
    else:
        where = _phase_where(ctx, "dataload")
    return _cpu_part(ctx, where, {"dataloader"}), _cpu_part(ctx, where, {"main", "trainer"})


_NO_WHERE = {"host": np.zeros(0, dtype=object), "start_ns": np.zeros(0, np.int64),
             "end_ns": np.zeros(0, np.int64)}  # fmt: skip


def _loader_joined(
    ctx: AnalysisContext, th: Thresholds, loader: list[dict], main: list[dict]
) -> dict[str, Any]:
    out: dict[str, Any] = {}
    cpu = _cpu_joined(loader)
    if "proc_cpu_pct" in cpu:
        out["loader_cpu_pct"] = cpu["proc_cpu_pct"]
    cpu = _cpu_joined(main)
    if "proc_cpu_pct" in cpu:
        out["main_cpu_pct"] = cpu["proc_cpu_pct"]
    workers = _num_workers(ctx)
    out["num_workers"] = workers
    cpus = (out.get("loader_cpu_pct", 0.0), out.get("main_cpu_pct", 0.0))
    out["saturated"] = max(cpus) >= th.process_core_pinned_pct
    out["few_workers"] = workers is not None and workers <= 1
    out["any"] = out["saturated"] or out["few_workers"]
    return out


def _span_attr(ctx: AnalysisContext | Parts, phase: str, keys: tuple[str, ...]) -> float:
    """Mean of the first numeric attr among ``keys`` over the spans of ``phase`` on every
    node (NaN)."""
    got = _parts(ctx).map(_attr_sums, phase, keys)
    for key in keys:
        mine = [g[key] for g in got if key in g]
        count = sum(m[1] for m in mine)
        if count:
            return float(sum(m[0] for m in mine) / count)
    return np.nan


def _attr_sums(ctx: AnalysisContext, phase: str, keys: tuple[str, ...]) -> dict:
    """One part's sum and count of each numeric attr among ``keys`` of its ``phase`` spans."""
    frame = _attrs(ctx, phase)
    out = {}
    for key in keys:
        if key in frame:
            v = pd.to_numeric(frame[key], errors="coerce")
            out[key] = (v.sum(), int(v.count()))
    return out


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


def _flags_of(ctx: AnalysisContext, s: pd.DataFrame, th: Thresholds) -> dict[str, np.ndarray]:
    """`_wait_flags` of a part's samples ``s``, once per frame and threshold."""
    return per_frame(ctx, s, f"wait_flags:{th.busy_util_pct}", lambda: _wait_flags(s, th))


def _wait_flags(s: pd.DataFrame, th: Thresholds) -> dict[str, np.ndarray]:
    """The per-sample flags counted over the other GPUs of each time bin: working, in a
    phase (not only waiting), and in each phase another detector claims."""
    codes, names = label_codes(s["phase"])
    code_of = {name: i for i, name in enumerate(names)}
    in_wait = np.isin(codes, [code_of[p] for p in _WAIT_PHASES if p in code_of])
    flags = {"busy": s["busy_frac"].to_numpy(np.float64) >= th.busy_util_pct / 100.0,
             "active": ~in_wait}  # fmt: skip
    for p in _CLAIMED_PHASES:
        flags[p] = codes == code_of.get(p, -2)
    return flags


def _bins(s: pd.DataFrame, t0: int, period_ns: float) -> np.ndarray:
    return np.round((s["t_ns"].to_numpy(np.int64) - t0) / period_ns).astype(np.int64)


def _grid_part(ctx: AnalysisContext) -> tuple[int, tuple] | None:
    """One part's share of the time grid: its first sample and its sampling intervals as
    distinct values and counts (None without samples)."""
    s = _samples(ctx)
    return None if s is None else _grid_of(s)


def _grid_of(s: pd.DataFrame) -> tuple[int, tuple] | None:
    if not len(s):
        return None
    dt = s["dt_s"].to_numpy(np.float64)
    return int(s["t_ns"].min()), value_counts(dt)


def _flag_counts(
    ctx: AnalysisContext, t0: int, period_ns: float, th: Thresholds
) -> dict[str, np.ndarray] | None:
    """One part's samples per time bin of the run's grid with each `_wait_flags` flag."""
    s = _samples(ctx)
    return None if s is None else _counts_of(s, t0, period_ns, _flags_of(ctx, s, th))


def _counts_of(s: pd.DataFrame, t0: int, period_ns: float, flags: dict) -> dict:
    """Per flag, the time bins that hold flagged samples and how many (`bin_counts`)."""
    if not len(s):
        return {}
    bins = _bins(s, t0, period_ns)
    return {name: bin_counts(bins[flag]) for name, flag in flags.items()}


def bin_index(bins: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The time bins of ``bins``, ascending, and each value's place among them: every bin
    from the first to the last where the values lie close together (as `dense_codes`
    counts), else only the bins that hold one.

    Not one entry per bin from the run's first sample: the samples of a run can lie far
    apart (files of different days imported as one run: ~10^8 bins of a second, ~1 GB an
    array, each written to every worker), and only bins that hold samples are ever read."""
    bins = np.asarray(bins, dtype=np.int64)
    if not len(bins):
        return np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64)
    lo, hi = int(bins.min()), int(bins.max())
    if hi - lo <= 4 * len(bins) + _DENSE_SLACK:
        return np.arange(lo, hi + 1, dtype=np.int64), bins - lo
    keys, where = np.unique(bins, return_inverse=True)
    return keys.astype(np.int64, copy=False), where.reshape(-1)


def bin_counts(bins: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The time bins of ``bins`` (`bin_index`) and how many of ``bins`` fall in each."""
    keys, where = bin_index(bins)
    return keys, np.bincount(where, minlength=len(keys))


def add_bin_counts(*counts: tuple[np.ndarray, ...]) -> tuple[np.ndarray, ...]:
    """Counts per time bin of several parts (each its bins, `bin_index`, and one or more
    count arrays) added up per bin: the bins, ascending, and the summed counts."""
    merged, where = bin_index(np.concatenate([c[0] for c in counts]))
    sums = []
    for i in range(1, len(counts[0])):
        total = np.zeros(len(merged), dtype=np.int64)
        np.add.at(total, where, np.concatenate([c[i] for c in counts]).astype(np.int64))
        sums.append(total)
    return (merged, *sums)


def count_in_bins(counts: tuple[np.ndarray, np.ndarray], bins: np.ndarray) -> np.ndarray:
    """For each of ``bins``, its count in ``counts`` (`bin_counts`, `add_bin_counts`; 0 for
    a bin not there)."""
    keys, values = counts
    if not len(keys):
        return np.zeros(len(bins), dtype=np.int64)
    if int(keys[-1]) - int(keys[0]) == len(keys) - 1:  # every bin from the first to the last
        at = np.clip(bins - keys[0], 0, len(keys) - 1)
    else:
        at = np.minimum(np.searchsorted(keys, bins), len(keys) - 1)
    return np.where(keys[at] == bins, values[at], 0)


def _wait_grid(grid: list, counts: list) -> dict[str, Any]:
    """The time grid of every part's samples (`grouping.time_bins`: from the first sample,
    on the median sampling period) and, per time bin, how many samples of every part have
    each `_wait_flags` flag (``grid`` and ``counts``: the parts' `_grid_part` and
    `_flag_counts`)."""
    from gpuprof.analyzers.parts import median_of_counts

    grid = [g for g in grid if g is not None]
    if not grid:
        return {"t0": 0, "period_ns": 1e9, "totals": {}}
    median = median_of_counts([g[1] for g in grid])
    period_ns = float(median) * 1e9 if np.isfinite(median) else 0.0
    if not np.isfinite(period_ns) or period_ns <= 0:
        period_ns = 1e9
    return {"t0": min(g[0] for g in grid), "period_ns": period_ns, "totals": counts}


def _wait_totals(parts: Parts, th: Thresholds) -> dict[str, Any]:
    """`_wait_grid` of every part's unclaimed samples."""

    def compute() -> dict[str, Any]:
        grid = _wait_grid(parts.map(_grid_part), {})
        got = [c for c in parts.map(_flag_counts, grid["t0"], grid["period_ns"], th) if c]
        totals: dict[str, tuple[np.ndarray, np.ndarray]] = {}
        for name in dict.fromkeys(name for counts in got for name in counts):
            totals[name] = add_bin_counts(*(c[name] for c in got if name in c))
        return {**grid, "totals": totals, "key": _claim_state(parts)}

    return _parts_memo(parts, f"wait_grid:{th.busy_util_pct}", compute)


def _wait_split(
    ctx: AnalysisContext,
    s: pd.DataFrame,
    th: Thresholds,
    grid: dict[str, Any] | None = None,
    head: np.ndarray | None = None,
) -> dict[str, Any]:
    """Samples whose owner only waits (bare step span or no span), split by what the rest of
    the job did at that instant (samples of all GPUs binned on the sampling period):

    - ``bubble``: another GPU worked, or another owner was in an unclaimed phase (a serial
      gap such as advantage computation);
    - ``claimed[p]``: the others were idle in a phase another detector claims (``reward``,
      ``reshard``, ``dataload``, ``checkpoint``, ``eval``): waiting for it belongs to it;
    - ``alone``: the whole job waited — nothing explains it.

    ``grid`` (`_wait_totals` of every part) and ``head`` (the step heads claimed, `_split_of`)
    when ``s`` is one part's samples; without them the job is ``s`` alone.
    """

    def compute() -> dict[str, Any]:
        if grid is None:
            got = _wait_grid([_grid_of(s)], {})
            counts = _counts_of(s, got["t0"], got["period_ns"], _flags_of(ctx, s, th))
            shared = {**got, "totals": counts}
        else:
            shared = grid
        claim = head if head is not None else _step_head_claim(ctx, s, th)
        bins = _bins(s, shared["t0"], shared["period_ns"]) if len(s) else np.zeros(0, np.int64)
        gpu = per_frame(ctx, s, "gpu_key", lambda: _gpu_key(s))
        pair, n_pairs = dense_codes(bins * (int(gpu.max(initial=0)) + 2) + (gpu + 1))
        flags = _flags_of(ctx, s, th)

        def others(name: str) -> np.ndarray:  # samples of the other GPUs in the bin
            total = shared["totals"].get(name)
            if total is None or not len(s):
                return np.zeros(len(s), dtype=np.int64)
            own = np.bincount(pair[flags[name]], minlength=n_pairs)
            return count_in_bins(total, bins) - own[pair]

        others_busy = others("busy")
        in_wait = ~flags["active"]
        waiting = in_wait & ~claim
        idle = np.nan_to_num(s["idle_gpu_s"].to_numpy(np.float64))
        is_idle = _is_idle(s, th)
        others_in_phase = others("active")  # waiting samples aren't counted
        bubble = waiting & is_idle & (others_busy > 0)
        rest = waiting & ~bubble
        claimed: dict[str, np.ndarray] = {}
        taken = np.zeros(len(s), dtype=bool)
        for p in _CLAIMED_PHASES:
            claimed[p] = rest & ~taken & (others(p) > 0)
            taken |= claimed[p]
        bubble |= rest & ~taken & (others_in_phase > 0) & is_idle
        alone = rest & ~taken & (others_in_phase == 0)
        return {"bubble": bubble, "alone": alone, "claimed": claimed, "idle": idle, "bins": bins}

    if grid is not None:
        return compute()
    return _memo(ctx, f"wait:{th.busy_util_pct}:{th.process_core_pinned_pct}", compute)


def wait_inputs(parts: Parts, th: Thresholds) -> tuple[dict[str, Any], bool]:
    """What every part's `_split_of` needs from the others: the time grid with every part's
    per-bin counts (`_wait_totals`), and whether the idle heads of steps are claimed."""
    return _wait_totals(parts, th), _head_claimed(parts, th)


def _split_of(
    ctx: AnalysisContext, th: Thresholds, grid: dict[str, Any], heads: bool
) -> tuple[pd.DataFrame, dict[str, Any]] | None:
    """One part's unclaimed samples and their `_wait_split` against every part (``grid`` and
    ``heads``: `wait_inputs`); None without samples. Once per part and claim state."""
    s = _samples(ctx)
    if s is None:
        return None

    def compute() -> dict[str, Any]:
        head = _step_head(ctx, s) if heads else np.zeros(len(s), dtype=bool)
        return _wait_split(ctx, s, th, grid, head)

    key = f"split:{grid.get('key')}:{heads}:{th.busy_util_pct}:{th.process_core_pinned_pct}"
    return s, _memo(ctx, key, compute)


def _waiting_idle(
    ctx: AnalysisContext, th: Thresholds, grid: dict[str, Any], heads: bool, phases: list[str]
) -> Fraction:
    """One part's idle GPU-seconds of GPUs that only waited while the job was in ``phases``
    (exact: `parts.exact_sum`)."""
    got = _split_of(ctx, th, grid, heads)
    if got is None:
        return Fraction(0)
    split = got[1]
    mask = np.zeros(len(split["idle"]), dtype=bool)
    for p in phases:
        mask |= split["claimed"].get(p, mask)
    return exact_sum(split["idle"][mask])


def _waiting_on(parts: Parts, th: Thresholds, phases: list[str]) -> float:
    """Idle GPU-seconds of GPUs that only waited while the rest of the job was in ``phases``:
    the same to the last bit however the run is cut into parts."""
    grid, heads = wait_inputs(parts, th)
    return float(sum(parts.map(_waiting_idle, th, grid, heads, list(phases))))


def _sample_intervals(s: pd.DataFrame, mask: np.ndarray, idle: np.ndarray) -> list[list[int]]:
    """The worst contiguous stretches of masked samples, as ``[start_ns, end_ns]``."""
    from gpuprof.analyzers.parts import stretches, top_stretches

    t = s["t_ns"].to_numpy(np.int64)
    return top_stretches([stretches(t, s["dt_s"].to_numpy(np.float64), mask, idle)])
