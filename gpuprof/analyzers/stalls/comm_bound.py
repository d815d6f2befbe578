"""``comm_bound``: collectives taking a large share of update time, or of a trace's GPU time.

Two sources: collective spans inside update spans (the hooks, NCCL flight records), or a
PyTorch-profiler trace's own NCCL kernels (``gpu_time`` events of the Kineto import): the
*exposed* communication — NCCL kernels running while no compute kernel does, as HTA's
communication / computation overlap counts it — is what the GPUs spend waiting on the network;
communication overlapped with compute costs nothing.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd

from gpuprof.analyzers.breakdown import keyed_sums
from gpuprof.analyzers.evidence import CommBoundEvidence
from gpuprof.analyzers.findings import AnalysisContext, Finding, Thresholds
from gpuprof.analyzers.grouping import asof_backward
from gpuprof.analyzers.nodes import link_figures, run_collectives, run_ranks_per_node
from gpuprof.analyzers.parts import Parts, exact_sum
from gpuprof.analyzers.stalls._phase import _gpu_pairs, _memo, _parts
from gpuprof.analyzers.stalls._resource import (
    UPDATE_PHASES,
    _collectives,
    _finding,
    _fmt_gpu_s,
    _inside,
    _intervals,
    _joined_gpus,
    _num,
    _spans,
    _update_windows,
)
from gpuprof.analyzers.texts import as_texts


def detect(ctx: AnalysisContext | Parts, th: Thresholds) -> Finding | None:
    """Collectives take a large share of update time, or exposed NCCL kernels a large share of a
    trace's busy GPU time (`_from_trace_kernels`).

    From spans: per owner, the wall time of collective spans (not barrier waits) inside its
    update spans over its update time, ``c``. The exposed communication above what a healthy,
    overlapped update shows (``th.collective_healthy_frac``) is lost: ``(c - healthy) x update
    GPU-s``. Reported when ``c >= th.collective_min_frac``; NVLink/PCIe traffic and SM activity
    (GPM) during the collectives raise the confidence.
    """
    parts = _parts(ctx)
    return _from_spans(parts, th) or _from_trace_kernels(parts, th)


def _from_spans(parts: Parts, th: Thresholds) -> Finding | None:
    """Collective spans inside update spans (see `detect`)."""
    owned = [o for o in parts.map(_owner_seconds) if o is not None]
    if not owned:
        return None
    per_owner = pd.concat(owned)
    per_owner = per_owner[per_owner["upd_s"] > 0]
    if per_owner.empty:
        return None
    per_owner["frac"] = (per_owner["coll_s"] / per_owner["upd_s"]).clip(0, 1)
    frac = float(per_owner["coll_s"].sum() / per_owner["upd_s"].sum())
    if frac < th.collective_min_frac:
        return None
    got = [g for g in parts.map(_in_update) if g is not None]
    # GPU-seconds inside update windows per owner
    gpu_upd = pd.concat([g["gpu_upd"] for g in got]).rename("gpu_s")
    per_owner = per_owner.join(gpu_upd, how="inner")
    excess = (per_owner["frac"] - th.collective_healthy_frac).clip(0)
    per_owner["lost"] = per_owner["gpu_s"] * excess
    gpu_s = float(per_owner["lost"].sum())
    # link traffic and SM activity inside the collective spans
    rows = {k: np.concatenate([g["in_coll"][k] for g in got]) for k in got[0]["in_coll"]}
    nvl, sm, util, wd = rows["nvl"], rows["sm"], rows["util"], rows["dt"]
    figures: dict[str, Any] = {}
    conf = 0.5 + 0.3 * min(1.0, (frac - th.collective_min_frac) / 0.3)
    if len(wd):
        ok = np.isfinite(nvl) & (wd > 0)
        if ok.any():
            rate = float(nvl[ok].sum() / wd[ok].sum() / 2.0)
            figures["nvlink_bytes_s_per_direction"] = round(rate, 0)
        ok_sm = np.isfinite(sm)
        ok_u = np.isfinite(util)
        if ok_sm.any():
            sm_mean = float(np.average(sm[ok_sm], weights=wd[ok_sm] + 1e-12))
            figures["sm_active_pct_in_collectives"] = round(sm_mean, 1)
            conf += 0.1 if sm_mean < 50 else 0.0
        if ok_u.any():
            u_mean = float(np.average(util[ok_u], weights=wd[ok_u] + 1e-12))
            figures["util_gpu_pct_in_collectives"] = round(u_mean, 1)
            conf += 0.1 if u_mean >= th.busy_util_pct else 0.0
    # the longest collectives (of one start and end, the one that overlapped most)
    worst = pd.concat([g["worst"] for g in got], ignore_index=True)
    worst = worst.sort_values(
        ["start_ns", "end_ns", "w"], ascending=[True, True, False], kind="stable"
    ).drop_duplicates(["start_ns", "end_ns"])
    owners = [(str(h), float(p)) for h, p in per_owner.index]
    gpus = _joined_gpus(parts.map(_owned_update_gpus, owners))
    multi_node = len(set().union(*parts.map(_ranked_hosts))) > 1
    links = _links_in_update(parts) if multi_node else {}
    summary = (
        f"collectives take {frac:.0%} of update time (healthy ~{th.collective_healthy_frac:.0%}): "
        f"~{_fmt_gpu_s(gpu_s)} ({{share}}) of exposed communication{_links_text(links)}"
    )
    for label, key in (("inter-node", "inter_node"), ("intra-node", "intra_node")):
        if label in links:
            figures[f"{key}_collective_s"] = links[label]["seconds"]
            figures[f"{key}_bandwidth_bytes_s"] = links[label]["bandwidth_bytes_s"]
    evidence = CommBoundEvidence(
        intervals=_intervals(worst, "w"),
        gpus=gpus,
        phases=sorted(set().union(*(g["phases"] for g in got))),
        collective_share_of_update=round(frac, 4),
        collective_s_per_owner_mean=round(float(per_owner["coll_s"].mean()), 3),
        update_s_per_owner_mean=round(float(per_owner["upd_s"].mean()), 3),
        source="collective_spans",
        **figures,
    )
    return _finding("comm_bound", parts, th, gpu_s, conf, summary, evidence)


_KEYS = ["host", "pid"]


def _update_collectives(ctx: AnalysisContext) -> tuple[pd.DataFrame, pd.DataFrame] | None:
    """One part's update spans (by start) and its collectives inside them, each with the end
    of its update span (None without samples, updates or such collectives). Once per part."""
    return _memo(ctx, "update_collectives", lambda: _find_update_collectives(ctx))


def _find_update_collectives(ctx: AnalysisContext) -> tuple[pd.DataFrame, pd.DataFrame] | None:
    s = ctx.samples
    spans = _spans(ctx)
    if s.empty or spans.empty:
        return None
    start, end = spans["start_ns"].to_numpy(np.int64), spans["end_ns"].to_numpy(np.int64)
    upd_rows = np.flatnonzero(spans["phase"].isin(UPDATE_PHASES).to_numpy())
    coll_rows = np.flatnonzero(_collectives(ctx) & ~spans["wait"].to_numpy())
    if not len(upd_rows) or not len(coll_rows):
        return None
    upd_rows = upd_rows[np.argsort(start[upd_rows], kind="stable")]
    upd = spans.iloc[upd_rows].reset_index(drop=True)
    # each collective (by start) with the owner's last update span starting at or before it:
    # a backward ``merge_asof`` by host and pid (`asof_backward`), the collectives that have
    # none left out
    left = coll_rows[np.argsort(start[coll_rows], kind="stable")]
    host, pid = spans["host"].to_numpy(object), spans["pid"].to_numpy()
    found = asof_backward(
        start[left], start[upd_rows], np.iinfo(np.int64).max,
        [host[left], pid[left]], [host[upd_rows], pid[upd_rows]],
    )  # fmt: skip
    hit = np.flatnonzero(found >= 0)
    if not len(hit):
        return None
    rows, u = left[hit], found[hit]
    # the update span's times taken as integers: a column merged with gaps is float64, whose
    # 256 ns steps at epoch nanoseconds would make the overlaps depend on the other hosts
    # merged alongside (a run diagnosed node by node has none, and no gap)
    m = pd.DataFrame(
        {
            "host": spans["host"].iloc[rows].to_numpy(),
            "pid": pid[rows],
            "start_ns": start[rows],
            "end_ns": end[rows],
            "u_start": start[upd_rows][u],
            "u_end": end[upd_rows][u],
        },
        index=hit,
    )
    return upd, m


def _overlap(m: pd.DataFrame) -> pd.Series:
    """Seconds of each collective inside its update span."""
    return np.clip(np.minimum(m["end_ns"], m["u_end"]) - m["start_ns"], 0, None) / 1e9


def _owner_seconds(ctx: AnalysisContext) -> pd.DataFrame | None:
    """One part's owner processes: seconds of collectives inside update spans and of update
    spans (None: `_update_collectives` found none)."""
    got = _update_collectives(ctx)
    if got is None:
        return None
    upd, m = got
    # each owner's sums in row order (`keyed_sums`): the same however the run is cut
    coll_s = keyed_sums(m.assign(c=_overlap(m)), _KEYS, ["c"])["c"].sort_index()
    d = upd.assign(d=(upd["end_ns"] - upd["start_ns"]) / 1e9)
    upd_s = keyed_sums(d, _KEYS, ["d"])["d"].sort_index()
    return pd.DataFrame({"coll_s": coll_s, "upd_s": upd_s}).fillna(0.0)


def _in_update(ctx: AnalysisContext) -> dict | None:
    """One part's GPU-seconds in update windows per owner process, the samples inside the
    collectives, the collectives with their overlap (None: `_update_collectives` found
    none)."""
    got = _update_collectives(ctx)
    if got is None:
        return None
    upd, m = got
    s, spans = ctx.samples, _spans(ctx)
    overlap = _overlap(m)
    window = _update_windows(ctx, spans)
    dt = s["dt_s"].to_numpy(np.float64)
    w = pd.DataFrame({"host": s["owner_host"].to_numpy(object), "pid": _num(s, "pid"), "dt": dt})
    coll = spans[_collectives(ctx) & ~spans["wait"].to_numpy()].reset_index(drop=True)
    in_coll = (_inside(s, coll) >= 0) & window
    return {
        "gpu_upd": keyed_sums(w[window], _KEYS, ["dt"])["dt"].sort_index(),
        "in_coll": {
            "nvl": _num(s, "nvlink_bytes")[in_coll],
            "sm": _num(s, "sm_active_pct")[in_coll],
            "util": _num(s, "util_gpu_pct")[in_coll],
            "dt": dt[in_coll],
        },
        "worst": m.assign(w=overlap)[["start_ns", "end_ns", "w"]],
        "phases": set(upd["phase"]),
    }


def _ranked_hosts(ctx: AnalysisContext) -> set:
    """The hosts of one part's spans that carry a rank (`nodes.is_multi_node`)."""
    spans = _spans(ctx)
    return set(spans.dropna(subset=["rank"])["host"]) if len(spans) else set()


def _owned_update_gpus(ctx: AnalysisContext, owners: list[tuple]) -> list[tuple[str, int]]:
    """One part's GPUs with samples in an update window of one of ``owners`` (host, pid)."""
    s = ctx.samples
    if s.empty or not owners:
        return []
    window = _update_windows(ctx, _spans(ctx))
    frame = s[window & s["owner_host"].notna().to_numpy()]
    keys = pd.MultiIndex.from_arrays(
        [as_texts(frame["owner_host"]), frame["pid"].to_numpy(np.float64)]
    )
    return _gpu_pairs(frame[keys.isin(owners)])


def _from_trace_kernels(parts: Parts, th: Thresholds) -> Finding | None:
    """Exposed communication from a trace's NCCL kernels (the ``gpu_time`` events).

    Per GPU: exposed = NCCL time with no compute kernel running, overlapped = the rest of its
    NCCL time; reported when exposed communication is at least ``th.collective_min_frac`` of
    the GPU's busy time; lost = exposed − ``th.collective_healthy_frac`` × busy.
    """
    got = [g for g in parts.map(_kernel_sums, th) if g is not None]
    exposed = float(sum(g["exposed"] for g in got))
    overlapped = float(sum(g["overlapped"] for g in got))
    busy = float(sum(g["busy"] for g in got))
    lost = float(sum(g["lost"] for g in got))
    measured_overlap = any(g["measured_overlap"] for g in got)
    gpus = [x for g in got for x in g["gpus"]]
    if busy <= 0 or exposed / busy < th.collective_min_frac:
        return None
    frac = exposed / busy
    conf = 0.5 + 0.3 * min(1.0, (frac - th.collective_min_frac) / 0.3)
    overlap_text = (
        f"; {overlapped / (exposed + overlapped):.0%} of NCCL time overlapped compute"
        if measured_overlap and exposed + overlapped > 0
        else ""
    )
    summary = (
        f"exposed NCCL kernels (no compute kernel running) take {frac:.0%} of the GPUs' busy "
        f"time (healthy ~{th.collective_healthy_frac:.0%}){overlap_text}: ~{_fmt_gpu_s(lost)} "
        "({share}) waiting on communication — from the trace's kernels"
    )
    evidence = CommBoundEvidence(
        intervals=[],
        gpus=sorted(set(gpus)),
        phases=[],
        exposed_comm_gpu_s=round(exposed, 6),
        overlapped_comm_gpu_s=round(overlapped, 6) if measured_overlap else None,
        comm_share_of_busy=round((exposed + overlapped) / busy, 4) if measured_overlap else None,
        exposed_share_of_busy=round(frac, 4),
        source="trace_kernels",
    )
    return _finding("comm_bound", parts, th, lost, conf, summary, evidence)


def _kernel_sums(ctx: AnalysisContext, th: Thresholds) -> dict | None:
    """One part's NCCL kernel time from its ``gpu_time`` events: exposed, overlapped, busy
    and lost seconds, and its GPUs (None without such events)."""
    ev = ctx.run.events
    if ev is None or ev.empty or "kind" not in ev:
        return None
    rows = ev[ev["kind"] == "gpu_time"]
    sums: dict[str, list[float]] = {"exposed": [], "overlapped": [], "busy": [], "lost": []}
    out: dict[str, Any] = {"gpus": [], "measured_overlap": False}
    for host, attrs in zip(rows["host"], rows["attrs"]):
        if not isinstance(attrs, dict):
            continue
        comm = _ns_s(attrs.get("communication_ns"))
        b = _ns_s(attrs.get("busy_ns"))
        if comm is None or not b:
            continue
        every = _ns_s(attrs.get("communication_all_ns"))
        out["measured_overlap"] |= every is not None
        sums["exposed"].append(comm)
        sums["overlapped"].append(max(0.0, every - comm) if every is not None else 0.0)
        sums["busy"].append(b)
        sums["lost"].append(max(0.0, comm - th.collective_healthy_frac * b))
        out["gpus"].append(f"{host}:{attrs.get('gpu')}")
    return {**out, **{k: exact_sum(v) for k, v in sums.items()}}


def _ns_s(value: Any) -> float | None:
    return float(value) / 1e9 if isinstance(value, int | float) and value == value else None


def _links_in_update(parts: Parts) -> dict[str, dict[str, Any]]:
    """Per link type, the collectives found inside update spans, from the run's collective
    spans, whose attributes carry group size and bytes (every part's)."""
    coll = [c for c in parts.map(_update_collective_rows) if c is not None and len(c)]
    if not coll:
        return {}
    ranks = max(parts.map(run_ranks_per_node))
    links = link_figures(pd.concat(coll, ignore_index=True), pd.DataFrame(), ranks)
    return {row["link"]: row for row in links}


def _update_collective_rows(ctx: AnalysisContext) -> pd.DataFrame | None:
    """One part's collectives (`nodes.run_collectives`) that lie inside its update spans."""
    got = _update_collectives(ctx)
    coll = run_collectives(ctx)
    if got is None or coll.empty:
        return None
    keys = ["host", "pid", "start_ns"]
    found = got[1][keys].drop_duplicates()
    return coll.merge(found.astype({"pid": coll["pid"].dtype}), on=keys, how="inner")


def _links_text(links: dict[str, dict[str, Any]]) -> str:
    """ "; 80% of it between nodes at 3.1 GB/s effective (within nodes 40 GB/s)"."""
    inter, intra = links.get("inter-node"), links.get("intra-node")
    if inter is None:
        return "; none of it crosses nodes" if intra is not None else ""
    total = inter["seconds"] + (intra["seconds"] if intra else 0.0)
    share = inter["seconds"] / total if total > 0 else 1.0
    text = f"; {share:.0%} of it between nodes"
    if inter["bandwidth_bytes_s"]:
        text += f" at {inter['bandwidth_bytes_s'] / 1e9:.1f} GB/s effective"
        if intra and intra["bandwidth_bytes_s"]:
            text += f" (within nodes {intra['bandwidth_bytes_s'] / 1e9:.1f} GB/s)"
    return text
