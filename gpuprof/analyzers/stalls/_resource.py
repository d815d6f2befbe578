"""Shared helpers of the resource-stall detectors: the GPUs are not idle-waiting on a phase, a
resource limits them (``memory_headroom``, ``offload_thrash``, ``comm_bound``, ``host_bound``,
``imbalance``, ``throttling``; one module each in this package). Work is vectorised over
samples and spans; loops run over GPUs, steps or phases.

Who claims what (no double counting):

- ``offload_thrash`` claims update-phase samples with heavy PCIe traffic and low compute;
  ``host_bound`` and ``memory_headroom`` leave those samples alone.
- ``comm_bound`` claims the collective (non-barrier) share of update time above a healthy
  allowance; barrier waits (``nccl:barrier`` / ``attrs.wait``) are left to ``imbalance`` and
  ``throttling``.
- ``throttling`` claims the time lost to reduced clocks on GPUs whose clock-event reasons show
  a power or thermal limit; ``imbalance`` ignores stragglers that are throttled GPUs.
- ``host_bound`` claims compute-phase samples while the rank's process (or the main process)
  is pinned at ~one full core.
- ``memory_headroom`` claims a share of rollout time (or update time when no rollout is
  recorded) on GPUs whose peak memory leaves headroom.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import numpy as np
import pandas as pd

from gpuprof.analyzers import attr_columns
from gpuprof.analyzers.evidence import Evidence
from gpuprof.analyzers.findings import AnalysisContext, Finding, Thresholds
from gpuprof.analyzers.grouping import (
    appearance_codes,
    first_rows,
    group_medians,
    label_codes,
    per_frame,
)
from gpuprof.analyzers.stalls._phase import _gpu_key, _memo, _minutes
from gpuprof.analyzers.texts import as_texts

UPDATE_PHASES = ("update_actor", "update_critic")


COMPUTE_PHASES = ("old_logprob", "ref_logprob", "values", "update_actor", "update_critic")
"""Trainer-side GPU phases (forward/backward passes) where launch overhead shows."""


NOT_WORK_PHASES = ("step", "collective", "(none)", "(unnamed)")
"""Phases that are not units of per-rank work (compared across ranks by ``imbalance``)."""


# NVML nvmlClocksEventReason* bits (nvml.h) that mean "a power or thermal limit cut the clocks"
REASON_SW_POWER_CAP = 0x4


REASON_HW_SLOWDOWN = 0x8


REASON_SW_THERMAL = 0x20


REASON_HW_THERMAL = 0x40


REASON_HW_POWER_BRAKE = 0x80


THROTTLE_REASON_MASK = (
    REASON_SW_POWER_CAP
    | REASON_HW_SLOWDOWN
    | REASON_SW_THERMAL
    | REASON_HW_THERMAL
    | REASON_HW_POWER_BRAKE
)


THROTTLE_REASON_NAMES = {
    REASON_SW_POWER_CAP: "sw_power_cap",
    REASON_HW_SLOWDOWN: "hw_slowdown",
    REASON_SW_THERMAL: "sw_thermal_slowdown",
    REASON_HW_THERMAL: "hw_thermal_slowdown",
    REASON_HW_POWER_BRAKE: "hw_power_brake",
}


_COLLECTIVE_WORDS = ("allreduce", "all_reduce", "all_gather", "allgather", "reduce_scatter",
                     "reducescatter", "broadcast", "all_to_all", "alltoall")  # fmt: skip


_MAX_INTERVALS = 20


def _num(frame: pd.DataFrame, name: str) -> np.ndarray:
    if frame is None or name not in frame:
        return np.full(0 if frame is None else len(frame), np.nan)
    column = frame[name]
    if not (isinstance(column.dtype, np.dtype) and column.dtype.kind in "iuf"):
        column = pd.to_numeric(column, errors="coerce")  # numbers already: as they are
    return column.to_numpy(np.float64, na_value=np.nan)


def _gpu_label(host: Any, gpu: Any) -> str:
    return f"{host}:{int(gpu)}"


def _spans(ctx: AnalysisContext) -> pd.DataFrame:
    """The run's usable spans with name and a barrier flag; empty frame when none (computed
    once per context: several detectors use them)."""
    cache = ctx.__dict__.setdefault("_stalls_resource_cache", {})
    if "spans" not in cache:
        cache["spans"] = _usable_spans(ctx)
    return cache["spans"]


def _usable_spans(ctx: AnalysisContext) -> pd.DataFrame:
    cols = ["host", "pid", "rank", "phase", "name", "step", "start_ns", "end_ns", "wait"]
    spans = ctx.run.spans
    if spans is None or len(spans) == 0 or "start_ns" not in spans or "end_ns" not in spans:
        return pd.DataFrame({c: pd.Series([], dtype=object) for c in cols})
    start, end, pid = _num(spans, "start_ns"), _num(spans, "end_ns"), _num(spans, "pid")
    ok = np.isfinite(start) & np.isfinite(end) & (end >= start) & np.isfinite(pid)
    ok &= spans["host"].notna().to_numpy() if "host" in spans else False
    kept = spans.loc[ok]
    phase = kept["phase"].astype(object).fillna("(unnamed)") if "phase" in kept else None
    name = kept["name"].astype(object).fillna("") if "name" in kept else None
    attrs = kept["attrs"] if "attrs" in kept else pd.Series([{}] * len(kept), dtype=object)
    wait = np.fromiter(map(bool, attr_columns.values(attrs, "wait")), bool, len(attrs))
    out = pd.DataFrame(
        {
            "host": as_texts(kept["host"]),
            "pid": pid[ok],
            "rank": _num(kept, "rank"),
            "phase": phase.to_numpy(object) if phase is not None else "(unnamed)",
            "name": as_texts(name) if name is not None else "",
            "step": _num(kept, "step"),
            "start_ns": pd.to_numeric(kept["start_ns"]).to_numpy(np.int64),
            "end_ns": pd.to_numeric(kept["end_ns"]).to_numpy(np.int64),
            "wait": wait.astype(bool),
        }
    )
    lname = out["name"].str.lower()
    out["wait"] = out["wait"] | lname.str.contains("barrier", regex=False)
    return out


def _collective_mask(spans: pd.DataFrame) -> np.ndarray:
    """Spans that are collectives: phase ``collective``, ``nccl:*`` names or collective words."""
    if spans.empty:
        return np.zeros(0, dtype=bool)
    lname = spans["name"].astype(str).str.lower()
    hit = (spans["phase"] == "collective").to_numpy() | lname.str.startswith("nccl").to_numpy()
    for word in _COLLECTIVE_WORDS:
        hit |= lname.str.contains(word, regex=False).to_numpy()
    return hit


def _collectives(ctx: AnalysisContext) -> np.ndarray:
    """`_collective_mask` of the context's `_spans`, once per context (callers don't modify
    it)."""
    spans = _spans(ctx)
    return per_frame(ctx, spans, "collectives", lambda: _collective_mask(spans))


def _inside(samples: pd.DataFrame, spans: pd.DataFrame) -> np.ndarray:
    """Position in ``spans`` of a span of the sample's owner covering the sample (-1: none).

    Spans of one owner are assumed not to overlap each other (e.g. all of one phase): the
    span is the owner's last one starting at or before the sample (of spans starting at the
    same instant, the last in ``spans``), if it has not ended — a backward ``merge_asof`` by
    owner, done one owner at a time.
    """
    out = np.full(len(samples), -1, dtype=np.int64)
    if samples.empty or spans.empty:
        return out
    t = samples["t_ns"].to_numpy(np.int64)
    pid = _num(samples, "pid")
    host_code, host_names = label_codes(samples["owner_host"])
    owned = (host_code >= 0) & np.isfinite(pid)
    if not owned.any():
        return out
    start = spans["start_ns"].to_numpy(np.int64)
    end = spans["end_ns"].to_numpy(np.int64)
    keys = pd.DataFrame({"host": spans["host"].astype(object).to_numpy(),
                         "pid": spans["pid"].to_numpy(np.float64)})  # fmt: skip
    by_owner = keys.groupby(["host", "pid"], sort=False).indices
    # each (owner host, pid) of the samples once: owners are few, samples many
    rows = np.flatnonzero(owned)
    codes = appearance_codes([host_code[rows], pid[rows]])
    order = np.argsort(codes, kind="stable")
    first = first_rows(codes)
    bounds = np.searchsorted(codes[order], np.arange(len(first) + 1))
    for k, r in enumerate(rows[first]):
        positions = by_owner.get((host_names[host_code[r]], pid[r]))
        if positions is None:
            continue
        pos = positions[np.argsort(start[positions], kind="stable")]
        these = rows[order[bounds[k] : bounds[k + 1]]]
        at = np.searchsorted(start[pos], t[these], side="right") - 1
        hit = at >= 0
        cand = pos[np.maximum(at, 0)]
        hit &= t[these] < end[cand]
        out[these[hit]] = cand[hit]
    return out


def _gpu_columns(ctx: AnalysisContext) -> pd.DataFrame:
    """The clock and power columns of ``run.gpu`` for each row of ``ctx.samples``, in order
    (built once per context: several detectors read them; callers don't modify it)."""

    def compute() -> pd.DataFrame:
        g, rows = ctx.run.gpu, ctx.samples["row"].to_numpy(np.int64)
        return pd.DataFrame(
            {
                "sm_clock_mhz": _num(g, "sm_clock_mhz")[rows],
                "reasons": _num(g, "clock_event_reasons")[rows],
                "temp_c": _num(g, "temp_c")[rows],
                "power_w": _num(g, "power_w")[rows],
            },
            index=ctx.samples.index,
        )

    return per_frame(ctx, ctx.samples, "gpu_columns", compute)


def _gpu_columns_of(ctx: AnalysisContext, s: pd.DataFrame) -> pd.DataFrame:
    """`_gpu_columns` for the rows of ``s`` (``ctx.samples`` or a row selection of it, such as
    the unclaimed samples), once per frame (callers don't modify it)."""
    g = _gpu_columns(ctx)
    if s is ctx.samples:
        return g
    return per_frame(ctx, s, "gpu_columns_of", lambda: g.loc[s.index])


def _gpu_codes(ctx: AnalysisContext, s: pd.DataFrame) -> tuple[np.ndarray, pd.DataFrame]:
    """Each sample's GPU as a number (`_phase._gpu_key`: in order of first appearance, -1
    without host or GPU) and the ``host`` and ``gpu`` of each number, once per frame."""
    code = per_frame(ctx, s, "gpu_key", lambda: _gpu_key(s))

    def table() -> pd.DataFrame:
        first = first_rows(code)
        return pd.DataFrame(
            {"host": s["host"].iloc[first].astype(object).to_numpy(),
             "gpu": s["gpu"].to_numpy()[first]}
        )  # fmt: skip

    return code, per_frame(ctx, s, "gpu_table", table)


def _on_gpus(ctx: AnalysisContext, s: pd.DataFrame, hosts: Any, gpus: Any) -> np.ndarray:
    """Per sample of ``s``: its (host, gpu) is one of ``zip(hosts, gpus)`` (what
    ``MultiIndex.isin`` says, looked up once per GPU instead of once per sample)."""
    code, table = _gpu_codes(ctx, s)
    wanted = set(zip(hosts, gpus))
    hit = [(h, g) in wanted for h, g in zip(table["host"], table["gpu"])]
    return np.array([*hit, False], dtype=bool)[code]  # code -1 takes the trailing False


def _per_gpu(
    ctx: AnalysisContext, s: pd.DataFrame, mask: np.ndarray, columns: dict[str, tuple[Any, str]]
) -> pd.DataFrame:
    """Per GPU of the masked samples of ``s``: ``host``, ``gpu`` and each of ``columns``
    (name → (one value per sample of ``s``, a group-by reduction)), sorted by host and GPU —
    ``groupby(["host", "gpu"]).agg(...).reset_index()`` over those samples, grouped by GPU
    number instead of hashing host strings."""
    code, gpus = _gpu_codes(ctx, s)
    keep = np.flatnonzero(np.asarray(mask, dtype=bool) & (code >= 0))
    number, group = np.unique(code[keep], return_inverse=True)  # the GPUs with samples
    n = len(number)
    out: dict[str, Any] = {}
    for name, (values, how) in columns.items():
        v = np.asarray(values)[keep]
        if v.dtype.kind == "f" and how in ("max", "median"):  # exact on arrays (NaN skipped)
            if how == "max":
                out[name] = np.full(n, np.nan)
                np.fmax.at(out[name], group, v)
            else:
                out[name] = group_medians(group, n, v)
        else:  # sums and means: pandas' own, in row order
            out[name] = getattr(pd.Series(v, copy=False).groupby(group, sort=True), how)()
            out[name] = out[name].to_numpy()
    host, gpu = gpus["host"].to_numpy()[number], gpus["gpu"].to_numpy()[number]
    order = np.lexsort((_rank(gpu), _rank(host)))  # as a stable sort on host, then GPU
    return pd.DataFrame(
        {"host": host[order], "gpu": gpu[order], **{k: v[order] for k, v in out.items()}}
    )


def _rank(values: np.ndarray) -> np.ndarray:
    """Each value's place among the sorted distinct values, missing ones last (the ranks a
    sort by the values orders rows by)."""
    codes, uniques = pd.factorize(values, sort=True)
    return np.where(codes < 0, len(uniques), codes)


def _sample_frame(ctx: AnalysisContext, s: pd.DataFrame, columns: dict[str, str]) -> pd.DataFrame:
    """The unclaimed samples ``s`` as a flat frame: host (kept as Arrow strings: no copy),
    gpu, t_ns, dt_s (NaN as 0), util, and the `_gpu_columns` named in ``columns`` (frame
    name → column)."""
    g = _gpu_columns_of(ctx, s)
    frame = {
        "host": s["host"].astype(str).reset_index(drop=True),
        "gpu": s["gpu"].to_numpy(np.int64),
        "t_ns": s["t_ns"].to_numpy(np.int64),
        "dt_s": np.nan_to_num(s["dt_s"].to_numpy(np.float64)),
        "util": s["util_gpu_pct"].to_numpy(np.float64),
    }
    for name, column in columns.items():
        frame[name] = g[column].to_numpy(np.float64)
    return pd.DataFrame(frame)


def _intervals(frame: pd.DataFrame, weight: str, n: int = _MAX_INTERVALS) -> list[list[int]]:
    """The ``n`` worst ``[start_ns, end_ns]`` rows of ``frame`` by ``weight``, in time order."""
    if frame.empty:
        return []
    top = frame.nlargest(n, weight).sort_values("start_ns")
    return [[int(a), int(b)] for a, b in zip(top["start_ns"], top["end_ns"])]


def _runs(samples: pd.DataFrame, mask: np.ndarray, weight: np.ndarray) -> pd.DataFrame:
    """Contiguous runs of masked samples per GPU: start_ns, end_ns, summed weight."""
    s = samples
    if s.empty or not mask.any():
        # integer times even when empty: a float64 part would turn the runs of every part
        # joined with it (`pd.concat`) into float64, rounded to 256 ns at epoch nanoseconds
        return pd.DataFrame({"start_ns": np.zeros(0, np.int64), "end_ns": np.zeros(0, np.int64),
                             "w": np.zeros(0)})  # fmt: skip
    host = label_codes(s["host"])[0]
    gpu = s["gpu"].to_numpy()
    m = mask.astype(bool)
    brk = np.ones(len(s), dtype=bool)
    brk[1:] = (host[1:] != host[:-1]) | (gpu[1:] != gpu[:-1]) | (m[1:] != m[:-1])
    run_id = np.cumsum(brk)[m]
    t = s["t_ns"].to_numpy(np.int64)[m]
    end = t + np.round(s["dt_s"].to_numpy(np.float64)[m] * 1e9).astype(np.int64)
    first = np.flatnonzero(np.diff(run_id, prepend=-1))  # a run's samples are neighbours
    w = pd.Series(weight[m], copy=False).groupby(run_id, sort=True).sum()  # pandas' sum
    return pd.DataFrame(
        {
            "start_ns": np.minimum.reduceat(t, first),
            "end_ns": np.maximum.reduceat(end, first),
            "w": w.to_numpy(),
        }
    )


def _finding(
    kind: str,
    ctx: AnalysisContext,
    th: Thresholds,
    gpu_s: float,
    confidence: float,
    summary: str,
    evidence: Evidence,
    total_gpu_s: float | None = None,
) -> Finding | None:
    """The finding, or None below the noise threshold; ``{share}`` in ``summary`` is filled
    in. ``total_gpu_s``: the run's GPU-seconds when they do not come from GPU samples (a
    framework log's phase times × its GPU count)."""
    if not np.isfinite(gpu_s) or gpu_s <= 0:
        return None
    if total_gpu_s is None:
        share = ctx.share(gpu_s)
    else:
        share = float(min(1.0, gpu_s / total_gpu_s)) if total_gpu_s > 0 else 0.0
    if share < th.min_share:
        return None
    return Finding(
        kind=kind,
        gpu_seconds_lost=float(gpu_s),
        share=share,
        confidence=float(np.clip(confidence, 0.0, 1.0)),
        summary=summary.replace("{share}", f"{share:.0%}"),
        evidence=evidence,
    )


_fmt_gpu_s = _minutes
"""GPU-seconds as text: one formatter for every stall's summary."""


def _sorted_gpus(frame: pd.DataFrame) -> list[str]:
    keys = frame[["host", "gpu"]].drop_duplicates().sort_values(["host", "gpu"])
    return [_gpu_label(h, g) for h, g in zip(keys["host"], keys["gpu"])]


def _joined_gpus(pairs: Iterable[list[tuple[str, int]]]) -> list[str]:
    """`_sorted_gpus` of the parts' GPUs (`_phase._gpu_pairs` of each), all of them."""
    return [_gpu_label(h, g) for h, g in sorted({p for part in pairs for p in part})]


def _offload_mask(samples: pd.DataFrame, th: Thresholds) -> np.ndarray:
    """Update samples with heavy PCIe traffic and low compute (claimed by ``offload_thrash``)."""
    s = samples
    dt = s["dt_s"].to_numpy(np.float64)
    with np.errstate(invalid="ignore", divide="ignore"):
        per_dir = s["pcie_bytes"].to_numpy(np.float64) / np.where(dt > 0, dt, np.nan) / 2.0
    heavy = per_dir > th.pcie_heavy_bytes_s
    return heavy & s["phase"].isin(UPDATE_PHASES).to_numpy()


def _update_windows(ctx: AnalysisContext, spans: pd.DataFrame) -> np.ndarray:
    """Per sample: inside an update span of its owner (also where a child span is innermost);
    computed once per context and spans (callers don't modify it)."""

    def compute() -> np.ndarray:
        s = ctx.samples
        in_update = s["phase"].isin(UPDATE_PHASES).to_numpy()
        if spans.empty:
            return in_update
        upd = spans[spans["phase"].isin(UPDATE_PHASES).to_numpy()].reset_index(drop=True)
        return in_update | (_inside(s, upd) >= 0)

    return per_frame(ctx, spans, "update_windows", compute)


def _throttle_samples(
    ctx: AnalysisContext, th: Thresholds, max_clock: float | None = None
) -> pd.DataFrame | None:
    """Busy samples with their lost share to reduced clocks (``lost_frac``), or None (one
    frame per context, thresholds and top clock, shared: callers don't modify it).
    ``max_clock``: the top SM clock of the whole run (`_top_clock`), when ``ctx`` is one part
    of it; by default the context's own."""
    if max_clock is None:
        max_clock = _top_clock([_clocks_seen(ctx)])
    key = f"throttle:{th.busy_util_pct}:{th.clock_drop_frac}:{max_clock}"
    return _memo(ctx, key, lambda: _throttle_frame(ctx, th, max_clock))


def _clocks_seen(ctx: AnalysisContext) -> tuple[float, list[float]]:
    """The highest SM clock one part's samples read (NaN: none) and its inventory's
    maximum clocks."""
    s = ctx.samples
    clock = _gpu_columns(ctx)["sm_clock_mhz"].to_numpy(np.float64) if len(s) else np.zeros(0)
    seen = float(np.nanmax(clock)) if np.isfinite(clock).any() else np.nan
    inv = [
        float(x.get("max_sm_clock_mhz"))
        for x in ctx.run.meta.gpus or []
        if isinstance(x, dict) and isinstance(x.get("max_sm_clock_mhz"), int | float)
    ]
    return seen, inv


def _top_clock(seen: list[tuple[float, list[float]]]) -> float:
    """The top SM clock of a run from its parts' `_clocks_seen`: the highest read, or the
    inventory's maximum when higher."""
    read = [x for x, _ in seen if np.isfinite(x)]
    max_seen = max(read) if read else np.nan
    inv_max = [v for _, inv in seen for v in inv]
    return max([max_seen, *inv_max]) if inv_max else max_seen


def top_clock(parts: Any) -> float:
    """`_top_clock` of every part of ``parts`` (`parts.Parts`)."""
    return _top_clock(parts.map(_clocks_seen))


def _throttle_frame(ctx: AnalysisContext, th: Thresholds, max_clock: float) -> pd.DataFrame | None:
    s = ctx.samples
    if s.empty:
        return None
    g = _gpu_columns(ctx)
    if not np.isfinite(g["sm_clock_mhz"]).any():
        return None
    m = pd.concat([s[["host", "gpu", "t_ns", "dt_s", "step", "util_gpu_pct"]], g], axis=1)
    m = m[_first_of_each(m, ["host", "gpu", "t_ns"])]
    clock = m["sm_clock_mhz"].to_numpy(np.float64)
    if not np.isfinite(max_clock) or max_clock <= 0:
        return None
    reasons = m["reasons"].to_numpy(np.float64)
    has_reasons = np.isfinite(reasons)
    bits = np.where(has_reasons, reasons, 0).astype(np.int64)
    busy = m["util_gpu_pct"].to_numpy(np.float64) >= th.busy_util_pct
    ratio = clock / max_clock
    limited = np.where(has_reasons, (bits & THROTTLE_REASON_MASK) != 0, ratio < th.clock_drop_frac)
    hot = busy & limited & np.isfinite(clock)
    m["hot"] = hot
    m["bits"] = bits
    m["lost_frac"] = np.where(hot, np.clip(1.0 - ratio, 0.0, 1.0), 0.0)
    m["has_reasons"] = has_reasons
    m.attrs["max_clock_mhz"] = max_clock
    return m


def _first_of_each(frame: pd.DataFrame, keys: list[str]) -> np.ndarray:
    """``~frame.duplicated(keys)``: the first row of each combination of ``keys``. Where the
    rows are in key order (the aligned samples are, by host, GPU and time), duplicates are
    neighbours and comparing each row with the previous one finds them."""
    codes = [label_codes(frame[k])[0] if k == "host" else frame[k].to_numpy() for k in keys]
    n = len(frame)
    if n < 2:
        return np.ones(n, dtype=bool)
    same = np.ones(n - 1, dtype=bool)  # row i+1 equals row i on every key so far
    for c in codes:
        if c.dtype.kind not in "iu":
            return ~frame.duplicated(keys).to_numpy()
        if (same & (c[1:] < c[:-1])).any():  # not in key order
            return ~frame.duplicated(keys).to_numpy()
        same &= c[1:] == c[:-1]
    return np.concatenate([[True], ~same])


def _throttled_gpus(
    ctx: AnalysisContext, th: Thresholds, max_clock: float | None = None
) -> set[tuple[str, int]]:
    """GPUs throttled at least a fifth of their busy time (``max_clock``: see
    `_throttle_samples`)."""
    m = _throttle_samples(ctx, th, max_clock)
    if m is None or not m["hot"].any():
        return set()
    busy = m[m["util_gpu_pct"] >= th.busy_util_pct]
    share = busy.groupby(["host", "gpu"])["hot"].mean()
    return {(str(h), int(g)) for (h, g), v in share.items() if v >= 0.2}
