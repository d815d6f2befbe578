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

from gpuprof.analyzers.evidence import CommBoundEvidence
from gpuprof.analyzers.findings import AnalysisContext, Finding, Thresholds
from gpuprof.analyzers.nodes import is_multi_node, link_figures, run_collectives, run_ranks_per_node
from gpuprof.analyzers.stalls._resource import (
    UPDATE_PHASES,
    _collectives,
    _finding,
    _fmt_gpu_s,
    _inside,
    _intervals,
    _num,
    _sorted_gpus,
    _spans,
    _update_windows,
)


def detect(ctx: AnalysisContext, th: Thresholds) -> Finding | None:
    """Collectives take a large share of update time, or exposed NCCL kernels a large share of a
    trace's busy GPU time (`_from_trace_kernels`).

    From spans: per owner, the wall time of collective spans (not barrier waits) inside its
    update spans over its update time, ``c``. The exposed communication above what a healthy,
    overlapped update shows (``th.collective_healthy_frac``) is lost: ``(c - healthy) x update
    GPU-s``. Reported when ``c >= th.collective_min_frac``; NVLink/PCIe traffic and SM activity
    (GPM) during the collectives raise the confidence.
    """
    return _from_spans(ctx, th) or _from_trace_kernels(ctx, th)


def _from_spans(ctx: AnalysisContext, th: Thresholds) -> Finding | None:
    """Collective spans inside update spans (see `detect`)."""
    s = ctx.samples
    spans = _spans(ctx)
    if s.empty or spans.empty:
        return None
    upd = spans[spans["phase"].isin(UPDATE_PHASES).to_numpy()]
    coll = spans[_collectives(ctx) & ~spans["wait"].to_numpy()]
    if upd.empty or coll.empty:
        return None
    upd = upd.sort_values("start_ns", kind="stable").reset_index(drop=True)
    keys = ["host", "pid"]
    m = pd.merge_asof(
        coll[["host", "pid", "start_ns", "end_ns"]].sort_values("start_ns", kind="stable"),
        upd[["host", "pid", "start_ns", "end_ns"]].rename(
            columns={"start_ns": "u_start", "end_ns": "u_end"}
        ),
        left_on="start_ns",
        right_on="u_start",
        by=keys,
        direction="backward",
    ).dropna(subset=["u_end"])
    if m.empty:
        return None
    overlap = np.clip(np.minimum(m["end_ns"], m["u_end"]) - m["start_ns"], 0, None) / 1e9
    coll_s = m.assign(c=overlap).groupby(keys)["c"].sum()
    upd_s = upd.assign(d=(upd["end_ns"] - upd["start_ns"]) / 1e9).groupby(keys)["d"].sum()
    per_owner = pd.DataFrame({"coll_s": coll_s, "upd_s": upd_s}).fillna(0.0)
    per_owner = per_owner[per_owner["upd_s"] > 0]
    if per_owner.empty:
        return None
    per_owner["frac"] = (per_owner["coll_s"] / per_owner["upd_s"]).clip(0, 1)
    frac = float(per_owner["coll_s"].sum() / per_owner["upd_s"].sum())
    if frac < th.collective_min_frac:
        return None
    # GPU-seconds inside update windows per owner
    window = _update_windows(ctx, spans)
    dt = s["dt_s"].to_numpy(np.float64)
    w = pd.DataFrame({"host": s["owner_host"].to_numpy(object), "pid": _num(s, "pid"), "dt": dt})[
        window
    ]
    gpu_upd = w.groupby(keys)["dt"].sum()
    per_owner = per_owner.join(gpu_upd.rename("gpu_s"), how="inner")
    excess = (per_owner["frac"] - th.collective_healthy_frac).clip(0)
    per_owner["lost"] = per_owner["gpu_s"] * excess
    gpu_s = float(per_owner["lost"].sum())
    # link traffic and SM activity inside the collective spans
    coll_sorted = coll.reset_index(drop=True)
    in_coll = (_inside(s, coll_sorted) >= 0) & window
    nvl = _num(s, "nvlink_bytes")
    sm = _num(s, "sm_active_pct")
    util = _num(s, "util_gpu_pct")
    figures: dict[str, Any] = {}
    conf = 0.5 + 0.3 * min(1.0, (frac - th.collective_min_frac) / 0.3)
    if in_coll.any():
        wd = dt[in_coll]
        ok = np.isfinite(nvl[in_coll]) & (wd > 0)
        if ok.any():
            rate = float(nvl[in_coll][ok].sum() / wd[ok].sum() / 2.0)
            figures["nvlink_bytes_s_per_direction"] = round(rate, 0)
        ok_sm = np.isfinite(sm[in_coll])
        ok_u = np.isfinite(util[in_coll])
        if ok_sm.any():
            sm_mean = float(np.average(sm[in_coll][ok_sm], weights=wd[ok_sm] + 1e-12))
            figures["sm_active_pct_in_collectives"] = round(sm_mean, 1)
            conf += 0.1 if sm_mean < 50 else 0.0
        if ok_u.any():
            u_mean = float(np.average(util[in_coll][ok_u], weights=wd[ok_u] + 1e-12))
            figures["util_gpu_pct_in_collectives"] = round(u_mean, 1)
            conf += 0.1 if u_mean >= th.busy_util_pct else 0.0
    worst = m.assign(w=overlap).rename(columns={"start_ns": "start_ns", "end_ns": "end_ns"})
    worst = worst.drop_duplicates(["start_ns", "end_ns"])
    owners = per_owner.reset_index()
    gpus_df = s[window & s["owner_host"].notna().to_numpy()]
    gpus_df = gpus_df[
        pd.MultiIndex.from_arrays([gpus_df["owner_host"], gpus_df["pid"]]).isin(
            pd.MultiIndex.from_arrays([owners["host"], owners["pid"].astype(float)])
        )
    ]
    links = _links_in_update(ctx, m) if is_multi_node(spans) else {}
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
        gpus=_sorted_gpus(gpus_df) if len(gpus_df) else [],
        phases=sorted(set(upd["phase"])),
        collective_share_of_update=round(frac, 4),
        collective_s_per_owner_mean=round(float(per_owner["coll_s"].mean()), 3),
        update_s_per_owner_mean=round(float(per_owner["upd_s"].mean()), 3),
        source="collective_spans",
        **figures,
    )
    return _finding("comm_bound", ctx, th, gpu_s, conf, summary, evidence)


def _from_trace_kernels(ctx: AnalysisContext, th: Thresholds) -> Finding | None:
    """Exposed communication from a trace's NCCL kernels (the ``gpu_time`` events).

    Per GPU: exposed = NCCL time with no compute kernel running, overlapped = the rest of its
    NCCL time; reported when exposed communication is at least ``th.collective_min_frac`` of
    the GPU's busy time; lost = exposed − ``th.collective_healthy_frac`` × busy.
    """
    ev = ctx.run.events
    if ev is None or ev.empty or "kind" not in ev:
        return None
    rows = ev[ev["kind"] == "gpu_time"]
    exposed = overlapped = busy = lost = 0.0
    gpus: list[str] = []
    measured_overlap = False
    for host, attrs in zip(rows["host"], rows["attrs"]):
        if not isinstance(attrs, dict):
            continue
        comm = _ns_s(attrs.get("communication_ns"))
        b = _ns_s(attrs.get("busy_ns"))
        if comm is None or not b:
            continue
        every = _ns_s(attrs.get("communication_all_ns"))
        measured_overlap |= every is not None
        exposed += comm
        overlapped += max(0.0, every - comm) if every is not None else 0.0
        busy += b
        lost += max(0.0, comm - th.collective_healthy_frac * b)
        gpus.append(f"{host}:{attrs.get('gpu')}")
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
    return _finding("comm_bound", ctx, th, lost, conf, summary, evidence)


def _ns_s(value: Any) -> float | None:
    return float(value) / 1e9 if isinstance(value, int | float) and value == value else None


def _links_in_update(ctx: AnalysisContext, inside: pd.DataFrame) -> dict[str, dict[str, Any]]:
    """Per link type, the collectives found inside update spans (``inside``: their host, pid
    and start), from the run's collective spans, whose attributes carry group size and
    bytes."""
    coll = run_collectives(ctx)
    if coll.empty:
        return {}
    keys = ["host", "pid", "start_ns"]
    found = inside[keys].drop_duplicates()
    coll = coll.merge(found.astype({"pid": coll["pid"].dtype}), on=keys, how="inner")
    links = link_figures(coll, ctx.run.spans, run_ranks_per_node(ctx))
    return {row["link"]: row for row in links}


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
