"""Stall detectors for idle time explained by *where* it happens: a phase, its tail, the gaps.

Each detector is ``detect_<kind>(ctx, th) -> Finding | None`` (see `findings`). They split the
run's idle GPU-time between them without double counting:

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

from gpuprof.analyzers.alignment import NO_PHASE, STEP_PHASE
from gpuprof.analyzers.findings import AnalysisContext, Finding, Thresholds


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
_TAIL_FIRST_FRAC = 1.0 / 3.0  # a rollout's steady level: its first third
_TAIL_LAST_FRAC = 0.1  # its tail: the last tenth
_TAIL_MIN_SAMPLES = 3  # head, body and tail: what a merged long run keeps (see loader)
_LONG_RESPONSE_RATIO = 3.0  # response length max / mean above this: long tail of responses
_MAX_INTERVALS = 20
_MAX_GPUS = 64


# --------------------------------------------------------------------------------------------
# Shared helpers


def _memo(ctx: AnalysisContext, key: str, fn: Callable[[], Any]) -> Any:
    """Compute ``fn()`` once per context (several detectors share these figures)."""
    cache = ctx.__dict__.setdefault("_stalls_phase_cache", {})
    if key not in cache:
        cache[key] = fn()
    return cache[key]


def _samples(ctx: AnalysisContext) -> pd.DataFrame | None:
    """The aligned samples, or None when there is no utilisation reading at all."""
    s = ctx.samples
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


def _merge(starts: np.ndarray, ends: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Union of intervals ``[start, end)`` as sorted, disjoint intervals."""
    if len(starts) == 0:
        return starts, ends
    order = np.argsort(starts, kind="stable")
    s, e = starts[order], ends[order]
    reach = np.maximum.accumulate(e)
    new = np.ones(len(s), dtype=bool)
    new[1:] = s[1:] > reach[:-1]
    group = np.cumsum(new) - 1
    out_s = s[new]
    out_e = pd.Series(reach).groupby(group).max().to_numpy()
    return out_s, out_e


def _top_intervals(starts: np.ndarray, ends: np.ndarray, weight: np.ndarray | None = None):
    """Up to ``_MAX_INTERVALS`` intervals, the heaviest (default: longest), by start time."""
    if len(starts) == 0:
        return []
    w = (ends - starts).astype(np.float64) if weight is None else weight
    keep = np.argsort(-w, kind="stable")[:_MAX_INTERVALS]
    keep = keep[np.argsort(starts[keep], kind="stable")]
    return [[int(starts[i]), int(ends[i])] for i in keep]


def _phase_intervals(ctx: AnalysisContext, phases: Iterable[str]) -> list[list[int]]:
    sp = _spans(ctx)
    sp = sp[sp["phase"].isin(list(phases))]
    s, e = _merge(sp["start_ns"].to_numpy(np.int64), sp["end_ns"].to_numpy(np.int64))
    return _top_intervals(s, e)


def _in_intervals(t: np.ndarray, starts: np.ndarray, ends: np.ndarray) -> np.ndarray:
    """Whether each time lies in the union of the intervals."""
    if len(starts) == 0 or len(t) == 0:
        return np.zeros(len(t), dtype=bool)
    s, e = _merge(starts, ends)
    i = np.searchsorted(s, t, side="right") - 1
    return (i >= 0) & (t < e[np.clip(i, 0, len(e) - 1)])


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
    owners = sp.loc[sp["phase"] == phase, ["host", "pid"]].drop_duplicates()
    owners = owners.rename(columns={"host": "owner_host"}).astype({"pid": np.float64})
    gpus = s.dropna(subset=["pid"])[["owner_host", "pid", "host", "gpu"]].drop_duplicates()
    n = len(gpus.merge(owners, on=["owner_host", "pid"], how="inner"))
    return wall * n if n else np.nan


def _phase_idle(ctx: AnalysisContext, s: pd.DataFrame, phases: Iterable[str]) -> dict | None:
    """Idle figures of the samples in ``phases``: GPU-s (span-exact where possible), idle GPU-s,
    idle share, mean util, PCIe/NVLink bytes and rates; None when nothing was measured."""
    phases = list(phases)
    sub = s[s["phase"].isin(phases)]
    util = sub["util_gpu_pct"].to_numpy(np.float64)
    dt = sub["dt_s"].to_numpy(np.float64)
    m = np.isfinite(util)
    meas_dt = float(dt[m].sum())
    if meas_dt <= 0:
        return None
    gpu_s = idle_gpu_s = 0.0
    for phase in phases:
        p = (sub["phase"] == phase).to_numpy() & m
        if not p.any():
            continue
        frac = float(sub["idle_gpu_s"].to_numpy(np.float64)[p].sum() / dt[p].sum())
        exact = _phase_gpu_s(ctx, s, phase)
        sampled = float(sub["dt_s"].to_numpy(np.float64)[(sub["phase"] == phase).to_numpy()].sum())
        g = exact if np.isfinite(exact) and exact > 0 else sampled
        gpu_s += g
        idle_gpu_s += g * frac
    pcie = sub["pcie_bytes"].to_numpy(np.float64)
    nvl = sub["nvlink_bytes"].to_numpy(np.float64)
    return {
        "gpu_s": gpu_s,
        "idle_gpu_s": idle_gpu_s,
        "idle_frac": idle_gpu_s / gpu_s if gpu_s > 0 else np.nan,
        "util_pct": float((util[m] * dt[m]).sum() / meas_dt),
        "gpus": _gpu_labels(sub[m]),
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
            inside = _in_intervals(host_t[rows], starts, ends) & np.isfinite(cpu)
            host_cpu.append(cpu[inside])
        rows = proc_rows.get(str(h))
        if rows is not None:
            if roles_ok is not None:
                rows = rows[roles_ok[rows]]
            rows = rows[_in_intervals(proc_t[rows], starts, ends)]
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
    t = s["t_ns"].to_numpy(np.int64)
    dt = s["dt_s"].to_numpy(np.float64)
    period_ns = float(np.nanmedian(dt)) * 1e9 if np.isfinite(dt).any() else 0.0
    if not np.isfinite(period_ns) or period_ns <= 0:
        period_ns = 1e9
    bins = np.round((t - t.min()) / period_ns).astype(np.int64)
    busy = s["busy_frac"].to_numpy(np.float64) >= th.busy_util_pct / 100.0
    return _others(busy, bins, _gpu_key(s)), bins


def _gpu_key(s: pd.DataFrame) -> np.ndarray:
    return s.groupby(["host", "gpu"], sort=False, observed=True).ngroup().to_numpy()


def _others(flag: np.ndarray, bins: np.ndarray, gpu: np.ndarray) -> np.ndarray:
    """For each sample: how many samples of OTHER GPUs in its time bin have ``flag`` (samples
    of unequal length — merged long runs — can put two of one GPU in one bin)."""
    f = pd.Series(flag.astype(np.int64))
    in_bin = f.groupby(bins).transform("sum").to_numpy()
    own = f.groupby([bins, gpu]).transform("sum").to_numpy()
    return in_bin - own


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
        workers = None
        for k, v in (ctx.run.meta.knobs or {}).items():
            if str(k).endswith("num_workers"):
                try:
                    workers = int(v)
                except (TypeError, ValueError):
                    continue
        out["num_workers"] = workers
        cpus = (out.get("loader_cpu_pct", 0.0), out.get("main_cpu_pct", 0.0))
        out["saturated"] = max(cpus) >= th.process_core_pinned_pct
        out["few_workers"] = workers is not None and workers <= 1
        out["any"] = out["saturated"] or out["few_workers"]
        return out

    return _memo(ctx, f"loader:{head}:{th.process_core_pinned_pct}", compute)


# --------------------------------------------------------------------------------------------
# Detectors


def detect_reshard_idle(ctx: AnalysisContext, th: Thresholds) -> Finding | None:
    """GPUs idle inside weight-sync (``reshard``) spans beyond a healthy sync's share."""
    s = _samples(ctx)
    if s is None:
        return None
    st = _phase_idle(ctx, s, ["reshard"])
    if st is None or st["idle_frac"] < 0.5:  # a sync that keeps GPUs busy is not this stall
        return None
    waiting = _waiting_on(ctx, s, th, ["reshard"])
    lost = _excess(ctx, th, st["idle_gpu_s"] + waiting, "reshard")
    share = ctx.share(lost)
    if share < th.min_share:
        return None
    sp = _spans(ctx)
    sp = sp[sp["phase"] == "reshard"]
    mean_span_s = float(((sp["end_ns"] - sp["start_ns"]) / 1e9).mean()) if len(sp) else np.nan
    nbytes = _span_attr(ctx, "reshard", ("bytes", "weight_bytes", "nbytes"))
    bw = nbytes / mean_span_s if np.isfinite(nbytes) and mean_span_s > 0 else np.nan
    # a transfer burst: link traffic during the sync well above the run's mean
    out = s[s["phase"] != "reshard"]
    base = np.nanmax([_rate(out["pcie_bytes"].to_numpy(float), out["dt_s"].to_numpy(float)),
                      _rate(out["nvlink_bytes"].to_numpy(float), out["dt_s"].to_numpy(float)),
                      0.0])  # fmt: skip
    link = np.nanmax([st["pcie_bytes_s"], st["nvlink_bytes_s"], 0.0])
    burst = bool(link > 2.0 * base and link > 0)
    conf = _conf(0.45 + 0.4 * st["idle_frac"] + (0.1 if burst else 0.0) + 0.5 * share)
    bw_txt = f"; {bw / 1e9:.1f} GB/s effective for {nbytes / 1e9:.1f} GB" if np.isfinite(bw) else ""
    summary = (
        f"GPUs idle {st['idle_frac']:.0%} of weight sync (reshard, {mean_span_s:.1f} s per sync); "
        f"{_minutes(lost)} ({share:.0%}) beyond a healthy sync{bw_txt}"
    )
    return Finding(
        kind="reshard_idle",
        gpu_seconds_lost=lost,
        share=share,
        confidence=conf,
        summary=summary,
        evidence={
            "intervals": _phase_intervals(ctx, ["reshard"]),
            "gpus": st["gpus"],
            "phases": ["reshard"],
            "reshard_gpu_s": _num(st["gpu_s"]),
            "reshard_idle_gpu_s": _num(st["idle_gpu_s"]),
            "reshard_util_gpu_pct": _num(st["util_pct"]),
            "reshard_span_mean_s": _num(mean_span_s, ".3f"),
            "reshard_syncs": len(sp),
            "weight_bytes": _num(nbytes, ".0f"),
            "effective_bandwidth_bytes_s": _num(bw, ".0f"),
            "pcie_bytes_s": _num(st["pcie_bytes_s"], ".0f"),
            "nvlink_bytes_s": _num(st["nvlink_bytes_s"], ".0f"),
            "link_burst": burst,
            "waiting_gpus_idle_gpu_s": _num(waiting),
            "allowance_share": _allowance(th, "reshard"),
        },
    )


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


def detect_reward_bound(ctx: AnalysisContext, th: Thresholds) -> Finding | None:
    """GPUs idle inside reward spans (beyond a healthy scoring share), host CPU busy."""
    s = _samples(ctx)
    if s is None:
        return None
    st = _phase_idle(ctx, s, ["reward"])
    if st is None or st["idle_frac"] < 0.5:  # a GPU reward model keeps the GPUs busy
        return None
    waiting = _waiting_on(ctx, s, th, ["reward"])
    lost = _excess(ctx, th, st["idle_gpu_s"] + waiting, "reward")
    share = ctx.share(lost)
    if share < th.min_share:
        return None
    cpu = _cpu_during(ctx, _phase_where(ctx, "reward"), {"main", "trainer", "other", "reward"})
    host_cpu = cpu.get("host_cpu_pct", np.nan)
    proc_cpu = cpu.get("proc_cpu_pct", np.nan)
    host_busy = bool(host_cpu >= th.host_cpu_busy_pct)
    pinned = bool(proc_cpu >= th.process_core_pinned_pct)
    if host_busy or pinned:
        conf = 0.7 + 0.15 * (host_busy + pinned)
        cpu_txt = f"host CPU {host_cpu:.0f}% busy"
        if not host_busy:
            cpu_txt = f"scorer at {proc_cpu:.0f}% of a core"
    elif cpu:  # CPU measured and not busy: the scorer waits on something else
        conf = 0.35
        cpu_txt = f"host CPU only {host_cpu:.0f}% (remote scorer or I/O?)"
    else:
        conf = 0.5
        cpu_txt = "host CPU not measured"
    conf = _conf(conf + 0.5 * share - 0.1)
    summary = (
        f"GPUs idle {st['idle_frac']:.0%} of reward scoring "
        f"({_minutes(lost)}, {share:.0%} beyond a healthy share); {cpu_txt}"
    )
    return Finding(
        kind="reward_bound",
        gpu_seconds_lost=lost,
        share=share,
        confidence=conf,
        summary=summary,
        evidence={
            "intervals": _phase_intervals(ctx, ["reward"]),
            "gpus": st["gpus"],
            "phases": ["reward"],
            "reward_gpu_s": _num(st["gpu_s"]),
            "reward_idle_gpu_s": _num(st["idle_gpu_s"]),
            "reward_util_gpu_pct": _num(st["util_pct"]),
            "host_cpu_pct": _num(host_cpu),
            "scorer_process_cpu_pct": _num(proc_cpu),
            "host_cpu_busy": host_busy,
            "scorer_pinned": pinned,
            "waiting_gpus_idle_gpu_s": _num(waiting),
            "allowance_share": _allowance(th, "reward"),
        },
    )


def detect_dataloader_starvation(ctx: AnalysisContext, th: Thresholds) -> Finding | None:
    """GPUs waiting for input: idle in ``dataload`` spans, or at each step's head when no
    dataload span exists and the loader is visibly slow."""
    s = _samples(ctx)
    if s is None:
        return None
    sp = _spans(ctx)
    if (sp["phase"] == "dataload").any():
        st = _phase_idle(ctx, s, ["dataload"])
        if st is None or st["idle_frac"] < 0.5:
            return None
        waiting = _waiting_on(ctx, s, th, ["dataload"])
        idle_gpu_s, where = st["idle_gpu_s"] + waiting, "dataload spans"
        gpus, intervals = st["gpus"], _phase_intervals(ctx, ["dataload"])
        ev = _loader_evidence(ctx, s, th)
    else:
        head = _step_head_claim(ctx, s, th)
        if not head.any():
            return None
        sub = s[head]
        idle_gpu_s, where = float(np.nansum(sub["idle_gpu_s"].to_numpy())), "the head of steps"
        gpus = _gpu_labels(sub)
        t = sub["t_ns"].to_numpy(np.int64)
        a, b = _merge(t, t + (sub["dt_s"].to_numpy(np.float64) * 1e9).astype(np.int64))
        intervals = _top_intervals(a, b)
        ev = _loader_evidence(ctx, s, th, head=True)
    lost = _excess(ctx, th, idle_gpu_s, "dataload")
    share = ctx.share(lost)
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
        evidence={
            "intervals": intervals,
            "gpus": gpus,
            "phases": ["dataload"] if where == "dataload spans" else [STEP_PHASE],
            "dataload_idle_gpu_s": _num(idle_gpu_s),
            "loader_cpu_pct": _num(ev.get("loader_cpu_pct", np.nan)),
            "main_cpu_pct": _num(ev.get("main_cpu_pct", np.nan)),
            "dataloader_num_workers": ev.get("num_workers"),
            "loader_saturated": bool(ev.get("saturated")),
            "allowance_share": _allowance(th, "dataload"),
        },
    )


def detect_generation_tail(ctx: AnalysisContext, th: Thresholds) -> Finding | None:
    """Rollout utilisation decaying at the end of each rollout span (few sequences left)."""
    s = _samples(ctx)
    if s is None:
        return None
    phase = s["phase"].to_numpy(object)
    gkey = s.groupby(["host", "gpu"], sort=False).ngroup().to_numpy()
    new = np.ones(len(s), dtype=bool)
    new[1:] = (phase[1:] != phase[:-1]) | (gkey[1:] != gkey[:-1])
    inst = np.cumsum(new)
    roll = (phase == "rollout") & np.isfinite(s["busy_frac"].to_numpy(np.float64))
    if not roll.any():
        return None
    r = pd.DataFrame(
        {
            "inst": inst[roll],
            "busy": s["busy_frac"].to_numpy(np.float64)[roll],
            "dt": s["dt_s"].to_numpy(np.float64)[roll],
            "t": s["t_ns"].to_numpy(np.int64)[roll],
            "step": s["step"].to_numpy(np.float64)[roll],
        }
    )
    # position of each sample's midpoint within its rollout (0–1), by time rather than by
    # sample count, so samples of unequal length (merged long runs) weigh what they cover
    g = r.groupby("inst", sort=False)
    t0 = g["t"].transform("min").to_numpy(np.int64)
    end = (r["t"] + (r["dt"] * 1e9).round()).groupby(r["inst"], sort=False).transform("max")
    span_ns = np.maximum(end.to_numpy(np.float64) - t0, 1.0)
    mid = ((r["t"].to_numpy(np.int64) - t0) + r["dt"].to_numpy() * 0.5e9) / span_ns
    first = mid < _TAIL_FIRST_FRAC
    last = mid >= 1.0 - _TAIL_LAST_FRAC
    after = ~first
    w = r["dt"].to_numpy(np.float64)
    r["first_w"] = np.where(first, w, 0.0)
    r["first_b"] = np.where(first, r["busy"] * w, 0.0)
    r["last_w"] = np.where(last, w, 0.0)
    r["last_b"] = np.where(last, r["busy"] * w, 0.0)
    per = r.groupby("inst", sort=False).agg(
        n=("busy", "size"),
        first_w=("first_w", "sum"),
        first_b=("first_b", "sum"),
        last_w=("last_w", "sum"),
        last_b=("last_b", "sum"),
        step=("step", "first"),
        t0=("t", "min"),
        t1=("t", "max"),
    )
    with np.errstate(invalid="ignore", divide="ignore"):
        per["first"] = np.where(per["first_w"] > 0, per["first_b"] / per["first_w"], np.nan)
        per["last"] = np.where(per["last_w"] > 0, per["last_b"] / per["last_w"], np.nan)
    base = per["first"].reindex(r["inst"]).to_numpy()
    # lost: the signed shortfall below the span's steady level after its first third
    r["deficit"] = np.where(after, (base - r["busy"].to_numpy()) * r["dt"].to_numpy(), 0.0)
    per["deficit"] = r.groupby("inst", sort=False)["deficit"].sum().clip(lower=0.0)
    per = per[(per["n"] >= _TAIL_MIN_SAMPLES) & (per["first"] >= th.busy_util_pct / 100.0)]
    if per.empty:
        return None
    per["ratio"] = per["last"] / per["first"]
    step_key = per["step"].fillna(-1.0)
    by_step = per.groupby(step_key)["ratio"].median()
    tail_steps = by_step[by_step < th.tail_util_drop_frac]
    if len(tail_steps) == 0 or len(tail_steps) < 0.5 * len(by_step):
        return None
    tailing = per[step_key.isin(tail_steps.index) & (per["ratio"] < th.tail_util_drop_frac)]
    lost = float(tailing["deficit"].sum())
    share = ctx.share(lost)
    if share < th.min_share:
        return None
    resp_max = _span_attr(ctx, "rollout", ("response_length_max", "response_length/max"))
    resp_mean = _span_attr(ctx, "rollout", ("response_length_mean", "response_length/mean"))
    resp_ratio = resp_max / resp_mean if resp_mean and np.isfinite(resp_mean) else np.nan
    long_resp = bool(resp_ratio >= _LONG_RESPONSE_RATIO)
    ratio = float(by_step.median())
    conf = _conf(0.55 + 0.5 * (th.tail_util_drop_frac - ratio) + (0.15 if long_resp else 0.0))
    resp_txt = (
        f"; response length max {resp_max:.0f} vs mean {resp_mean:.0f} tokens"
        if np.isfinite(resp_ratio)
        else ""
    )
    summary = (
        f"Rollout utilisation falls to {ratio:.0%} of its level at the end of generation in "
        f"{len(tail_steps)}/{len(by_step)} steps: {_minutes(lost)} ({share:.0%}) idle in the "
        f"tail{resp_txt}"
    )
    worst = tailing.sort_values("deficit", ascending=False)
    starts = worst["t0"].to_numpy(np.int64)
    ends = worst["t1"].to_numpy(np.int64)
    m_s, m_e = _merge(starts, ends)
    return Finding(
        kind="generation_tail",
        gpu_seconds_lost=lost,
        share=share,
        confidence=conf,
        summary=summary,
        evidence={
            "intervals": _top_intervals(m_s, m_e),
            "gpus": _gpu_labels(s[np.isin(inst, tailing.index.to_numpy()) & roll]),
            "phases": ["rollout"],
            "tail_to_head_util_ratio": _num(ratio, ".3f"),
            "tail_steps": len(tail_steps),
            "steps": len(by_step),
            "tail_idle_gpu_s": _num(lost),
            "response_length_max_tokens": _num(resp_max),
            "response_length_mean_tokens": _num(resp_mean),
            "response_length_max_to_mean": _num(resp_ratio, ".2f"),
        },
    )


def detect_periodic_stall(ctx: AnalysisContext, th: Thresholds) -> Finding | None:
    """Checkpoint / eval phases every N steps with the GPUs idle."""
    s = _samples(ctx)
    if s is None:
        return None
    sp = _spans(ctx)
    sp = sp[sp["phase"].isin(list(_PERIODIC_PHASES))]
    if sp.empty:
        return None
    phases = sorted(set(sp["phase"]))
    st = _phase_idle(ctx, s, phases)
    if st is None:
        return None
    waiting = _waiting_on(ctx, s, th, phases)
    lost = st["idle_gpu_s"] + waiting
    share = ctx.share(lost)
    if share < th.min_share:
        return None
    steps = np.unique(sp["step"].dropna().to_numpy(np.float64))
    all_steps = np.unique(_spans(ctx)["step"].dropna().to_numpy(np.float64))
    period = float(np.median(np.diff(steps))) if len(steps) >= 2 else np.nan
    regular = len(steps) >= 2 and bool(np.all(np.diff(steps) == period))
    occurrences = max(1, len(steps)) if len(steps) else len(_merge(*_starts_ends(sp))[0])
    per_event = lost / occurrences
    # a normal step's idle GPU-seconds, for scale
    normal = s[~s["phase"].isin(phases) & ~s["step"].isin(steps) & s["step"].notna()]
    n_normal = normal["step"].nunique()
    normal_idle = float(np.nansum(normal["idle_gpu_s"])) / n_normal if n_normal else np.nan
    ratio = per_event / normal_idle if normal_idle and np.isfinite(normal_idle) else np.nan
    spike = bool(ratio >= th.periodic_min_ratio) if np.isfinite(ratio) else False
    conf = _conf(0.5 + (0.2 if regular else 0.0) + (0.15 if spike else 0.0) + 0.5 * share)
    every = f"every {period:.0f} steps" if np.isfinite(period) else f"{occurrences}×"
    summary = (
        f"{'/'.join(phases)} {every} keeps GPUs idle {st['idle_frac']:.0%} of the time: "
        f"{_minutes(lost)} ({share:.0%})"
        + (f", {ratio:.1f}× a normal step's idle" if np.isfinite(ratio) else "")
    )
    return Finding(
        kind="periodic_stall",
        gpu_seconds_lost=lost,
        share=share,
        confidence=conf,
        summary=summary,
        evidence={
            "intervals": _phase_intervals(ctx, phases),
            "gpus": st["gpus"],
            "phases": phases,
            "every_n_steps": _num(period, ".0f"),
            "occurrences": int(occurrences),
            "steps_total": len(all_steps),
            "stall_steps": [int(x) for x in steps[:_MAX_INTERVALS]],
            "idle_gpu_s": _num(lost),
            "idle_gpu_s_per_occurrence": _num(per_event),
            "normal_step_idle_gpu_s": _num(normal_idle),
            "waiting_gpus_idle_gpu_s": _num(waiting),
            "util_gpu_pct": _num(st["util_pct"]),
        },
    )


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
        others_busy, bins = _busy_by_bin(s, th)
        phase = s["phase"].to_numpy(object)
        in_wait = s["phase"].isin(list(_WAIT_PHASES)).to_numpy()
        waiting = in_wait & ~_step_head_claim(ctx, s, th)
        idle = np.nan_to_num(s["idle_gpu_s"].to_numpy(np.float64))
        gpu = _gpu_key(s)
        others_in_phase = _others(~in_wait, bins, gpu)  # waiting samples aren't counted
        bubble = waiting & _is_idle(s, th) & (others_busy > 0)
        rest = waiting & ~bubble
        claimed: dict[str, np.ndarray] = {}
        taken = np.zeros(len(s), dtype=bool)
        for p in _CLAIMED_PHASES:
            n_p = _others(phase == p, bins, gpu)
            claimed[p] = rest & ~taken & (n_p > 0)
            taken |= claimed[p]
        bubble |= rest & ~taken & (others_in_phase > 0) & _is_idle(s, th)
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
    if not mask.any():
        return []
    t = s["t_ns"].to_numpy(np.int64)[mask]
    e = t + (s["dt_s"].to_numpy(np.float64)[mask] * 1e9).astype(np.int64)
    a, b = _merge(t, e + 1)  # touching samples join
    where = np.searchsorted(a, t, side="right") - 1
    weight = pd.Series(idle[mask]).groupby(where).sum().reindex(range(len(a))).fillna(0.0)
    return _top_intervals(a, b, weight.to_numpy())


def detect_idle_unattributed(ctx: AnalysisContext, th: Thresholds) -> Finding | None:
    """Idle GPU-time outside every phase span while the whole job idles."""
    s = _samples(ctx)
    if s is None:
        return None
    split = _wait_split(ctx, s, th)
    mask, idle = split["alone"], split["idle"]
    lost = float(idle[mask].sum())
    share = ctx.share(lost)
    no_spans = _spans(ctx).empty
    run_idle = ctx.totals.get("idle_gpu_s") or 0.0
    measured = ctx.total_gpu_s - (ctx.totals.get("unknown_gpu_s") or 0.0)
    run_idle_share = run_idle / measured if measured > 0 else 0.0
    if share < th.min_share or (no_spans and run_idle_share < th.no_span_idle_share):
        return None
    sub = s[mask]
    outside = float(idle[mask & (s["phase"] == NO_PHASE).to_numpy()].sum())
    conf = _conf((0.45 if no_spans else 0.7) + 0.5 * share)
    where = "no phase spans recorded" if no_spans else "outside every phase span"
    summary = (
        f"GPUs idle {_minutes(lost)} ({share:.0%}) {where}, with no GPU of the job working"
        + ("; wrap that code in gpuprof.phase(...) to name it" if not no_spans else "")
    )
    return Finding(
        kind="idle_unattributed",
        gpu_seconds_lost=lost,
        share=share,
        confidence=conf,
        summary=summary,
        evidence={
            "intervals": _sample_intervals(s, mask, idle),
            "gpus": _gpu_labels(sub),
            "phases": sorted({str(p) for p in sub["phase"].unique()}),
            "idle_gpu_s": _num(lost),
            "idle_in_step_gpu_s": _num(lost - outside),
            "idle_outside_spans_gpu_s": _num(outside),
            "run_idle_share": _num(run_idle_share, ".3f"),
            "spans_recorded": not no_spans,
        },
    )


def detect_pipeline_bubble(ctx: AnalysisContext, th: Thresholds) -> Finding | None:
    """Some GPUs idle (their owner only waiting) while other GPUs of the job work.

    Lost time per step: the step's wall time beyond its busiest GPU's working time (what
    perfect overlap would leave) times the GPUs, capped by the GPU-seconds actually idle in
    such waits — a split placement waiting for the slower side only costs what serialising
    the two sides added.
    """
    s = _samples(ctx)
    if s is None or s[["host", "gpu"]].drop_duplicates().shape[0] < 2:
        return None
    split = _wait_split(ctx, s, th)
    mask, idle = split["bubble"], split["idle"]
    if not mask.any():
        return None
    step = s["step"].fillna(-1.0).to_numpy(np.float64)
    gkey = s.groupby(["host", "gpu"], sort=False).ngroup().to_numpy()
    dt = s["dt_s"].to_numpy(np.float64)
    waiting = split["bubble"] | split["alone"]
    busy = s["busy_frac"].to_numpy(np.float64) >= th.busy_util_pct / 100.0
    working = ~waiting | busy
    frame = pd.DataFrame(
        {
            "step": step,
            "g": gkey,
            "wall": dt,
            "work": np.where(working, dt, 0.0),
            "bubble": np.where(mask, idle, 0.0),
        }
    )
    per_gpu = frame.groupby(["step", "g"], sort=False).sum()
    per_step = per_gpu.groupby(level="step").agg(
        wall=("wall", "max"), work=("work", "max"), bubble=("bubble", "sum"), gpus=("wall", "size")
    )
    extra_s = (per_step["wall"] - per_step["work"]).clip(lower=0.0)
    lost_step = np.minimum(per_step["bubble"], extra_s * per_step["gpus"])
    lost = float(lost_step.sum())
    share = ctx.share(lost)
    if share < th.min_share:
        return None
    bubble_gpu_s = float(per_step["bubble"].sum())
    # per instant: share of the job's GPUs idle-waiting while others work
    bins = split["bins"]
    frac = (
        pd.Series(mask.astype(np.float64)).groupby(bins).mean()
        if len(bins)
        else pd.Series(dtype=float)
    )
    in_bubble = frac[frac > 0]
    mean_frac = float(in_bubble.mean()) if len(in_bubble) else np.nan
    time_share = float(len(in_bubble) / frac.size) if frac.size else np.nan
    sub = s[mask]
    waiting_gpus = _gpu_labels(sub)
    n_gpus = int(s[["host", "gpu"]].drop_duplicates().shape[0])
    conf = _conf(0.55 + 0.3 * min(1.0, lost / max(bubble_gpu_s, 1e-9)) + 0.5 * share)
    summary = (
        f"{len(waiting_gpus)}/{n_gpus} GPUs wait while others work "
        f"({mean_frac:.0%} of the job idle during {time_share:.0%} of the run): "
        f"{_minutes(lost)} ({share:.0%}) lost to serialisation"
    )
    return Finding(
        kind="pipeline_bubble",
        gpu_seconds_lost=lost,
        share=share,
        confidence=conf,
        summary=summary,
        evidence={
            "intervals": _sample_intervals(s, mask, idle),
            "gpus": waiting_gpus,
            "phases": sorted({str(p) for p in sub["phase"].unique()}),
            "bubble_idle_gpu_s": _num(bubble_gpu_s),
            "serial_extra_gpu_s": _num(float((extra_s * per_step["gpus"]).sum())),
            "idle_gpus_frac_in_bubble": _num(mean_frac, ".3f"),
            "bubble_time_share": _num(time_share, ".3f"),
        },
    )


DETECTORS: dict[str, Callable[[AnalysisContext, Thresholds], Finding | None]] = {
    "reshard_idle": detect_reshard_idle,
    "reward_bound": detect_reward_bound,
    "dataloader_starvation": detect_dataloader_starvation,
    "generation_tail": detect_generation_tail,
    "periodic_stall": detect_periodic_stall,
    "idle_unattributed": detect_idle_unattributed,
    "pipeline_bubble": detect_pipeline_bubble,
}
"""Stall kind → detector, for the kinds this module explains."""
