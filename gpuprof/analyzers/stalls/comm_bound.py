"""``comm_bound``: Collectives taking a large share of update time."""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd

from gpuprof.analyzers.evidence import CommBoundEvidence
from gpuprof.analyzers.findings import AnalysisContext, Finding, Thresholds
from gpuprof.analyzers.nodes import collectives, is_multi_node, link_figures
from gpuprof.analyzers.stalls._resource import (
    UPDATE_PHASES,
    _collective_mask,
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
    """Collectives take a large share of update time.

    From spans: per owner, the wall time of collective spans (not barrier waits) inside its
    update spans over its update time, ``c``. The exposed communication above what a healthy,
    overlapped update shows (``th.collective_healthy_frac``) is lost: ``(c - healthy) x update
    GPU-s``. Reported when ``c >= th.collective_min_frac``; NVLink/PCIe traffic and SM activity
    (GPM) during the collectives raise the confidence.
    """
    s = ctx.samples
    spans = _spans(ctx)
    if s.empty or spans.empty:
        return None
    upd = spans[spans["phase"].isin(UPDATE_PHASES).to_numpy()]
    coll = spans[_collective_mask(spans) & ~spans["wait"].to_numpy()]
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
        **figures,
    )
    return _finding("comm_bound", ctx, th, gpu_s, conf, summary, evidence)


def _links_in_update(ctx: AnalysisContext, inside: pd.DataFrame) -> dict[str, dict[str, Any]]:
    """Per link type, the collectives found inside update spans (``inside``: their host, pid
    and start), from the run's collective spans, whose attributes carry group size and
    bytes."""
    coll = collectives(ctx.run.spans)
    if coll.empty:
        return {}
    keys = ["host", "pid", "start_ns"]
    found = inside[keys].drop_duplicates()
    coll = coll.merge(found.astype({"pid": coll["pid"].dtype}), on=keys, how="inner")
    return {row["link"]: row for row in link_figures(coll, ctx.run.spans)}


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
