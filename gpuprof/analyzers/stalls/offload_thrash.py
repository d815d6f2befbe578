"""``offload_thrash``: Parameter / optimizer offload saturating PCIe during the update."""

from __future__ import annotations

import numpy as np
import pandas as pd

from gpuprof.analyzers.evidence import OffloadThrashEvidence
from gpuprof.analyzers.findings import AnalysisContext, Finding, Thresholds
from gpuprof.analyzers.links import pcie_bytes_s, pcie_link
from gpuprof.analyzers.parts import Parts, exact_sum
from gpuprof.analyzers.stalls._phase import _gpu_pairs, _parts
from gpuprof.analyzers.stalls._resource import (
    UPDATE_PHASES,
    _finding,
    _fmt_gpu_s,
    _gpu_codes,
    _intervals,
    _joined_gpus,
    _num,
    _runs,
    _spans,
    _update_windows,
)


def detect(ctx: AnalysisContext | Parts, th: Thresholds) -> Finding | None:
    """Heavy PCIe traffic with low compute during update: parameter/optimizer offload.

    Per update sample with PCIe above ``th.pcie_heavy_bytes_s`` per direction, the lost share
    of its time is the larger of the kernel-free share (``1 - util``) and the time the copies
    need at the GPU's own link rate (``rate / link``, `links.pcie_link`), i.e. the copies are
    assumed not to overlap compute. Reported only when those samples' compute is low (util below
    ``th.low_compute_util_pct`` or, with GPM, SM activity below ``th.low_compute_sm_pct``), which
    keeps collective traffic over the NIC (util stays ~100%) for ``comm_bound``.
    """
    parts = _parts(ctx)
    got = [g for g in parts.map(_heavy_rows, th) if g is not None]
    if not any(g["pcie"] for g in got):
        return None
    # the heavy samples of every part, in the whole run's sample order
    heavy = [g for g in got if g["heavy"] is not None]
    if not heavy:
        return None
    rows = {k: np.concatenate([g["heavy"][k] for g in heavy]) for k in heavy[0]["heavy"]}
    w = rows["dt"]
    if w.sum() <= 0:
        return None
    util, sm = rows["util"], rows["sm"]
    u_ok = np.isfinite(util)
    sm_ok = np.isfinite(sm)
    mean_util = float(np.average(util[u_ok], weights=w[u_ok])) if u_ok.any() else np.nan
    mean_sm = float(np.average(sm[sm_ok], weights=w[sm_ok])) if sm_ok.any() else np.nan
    # util (kernel running) first: NCCL traffic over the NIC keeps it ~100% with SMs low
    if np.isfinite(mean_util):
        low_compute = mean_util < th.low_compute_util_pct
    else:
        low_compute = bool(np.isfinite(mean_sm) and mean_sm < th.low_compute_sm_pct)
    if not low_compute:
        return None
    link_txt = ", ".join(sorted(set().union(*parts.map(_links))))
    gpu_s = float(sum(g["lost_s"] for g in heavy))
    update_s = float(sum(g["update_s"] for g in got))
    heavy_share = float(w.sum() / update_s) if update_s > 0 else 0.0
    runs = pd.concat([g["runs"] for g in heavy], ignore_index=True)
    rate = float(np.average(rows["per_dir"], weights=w))
    knobs = {k: v for k, v in (parts.meta.knobs or {}).items() if "offload" in str(k)}
    confidence = 0.45 + 0.3 * min(1.0, heavy_share) + 0.15 * min(1.0, rate / 30e9)
    confidence += 0.1 if any(v is True for v in knobs.values()) else 0.0
    phases = sorted(set(rows["phase"]) & set(UPDATE_PHASES)) or list(UPDATE_PHASES[:1])
    summary = (
        f"PCIe {rate / 1e9:.0f} GB/s per direction during {heavy_share:.0%} of update with "
        f"util {mean_util:.0f}%: offload copies cost ~{_fmt_gpu_s(gpu_s)} ({{share}})"
    )
    evidence = OffloadThrashEvidence(
        intervals=_intervals(runs, "w"),
        gpus=_joined_gpus(g["gpus"] for g in heavy),
        phases=phases,
        pcie_bytes_s_per_direction=round(rate, 0),
        pcie_link_bytes_s=round(float(np.median(rows["link_rate"])), 0),
        pcie_link=link_txt,
        pcie_heavy_share_of_update=round(heavy_share, 4),
        update_gpu_s=round(update_s, 3),
        util_gpu_pct=None if not np.isfinite(mean_util) else round(mean_util, 1),
        sm_active_pct=None if not np.isfinite(mean_sm) else round(mean_sm, 1),
    )
    if knobs:
        evidence.knobs = {str(k): v for k, v in knobs.items()}
    return _finding("offload_thrash", parts, th, gpu_s, confidence, summary, evidence)


def _heavy_rows(ctx: AnalysisContext, th: Thresholds) -> dict | None:
    """One part's update samples with heavy PCIe traffic: their columns (in sample order),
    GPUs and runs; the part's update GPU-seconds and PCIe links; whether it measured PCIe at
    all. None without samples."""
    s = ctx.samples
    if s.empty:
        return None
    pcie = bool(np.isfinite(_num(s, "pcie_bytes")).any())
    spans = _spans(ctx)
    window = _update_windows(ctx, spans)
    dt = s["dt_s"].to_numpy(np.float64)
    out: dict = {"pcie": pcie, "update_s": exact_sum(dt[window]), "heavy": None}
    if not pcie:
        return out
    with np.errstate(invalid="ignore", divide="ignore"):
        per_dir = s["pcie_bytes"].to_numpy(np.float64) / np.where(dt > 0, dt, np.nan) / 2.0
    heavy = window & (per_dir > th.pcie_heavy_bytes_s)
    if not heavy.any():
        return out
    util = _num(s, "util_gpu_pct")
    idle_frac = np.where(np.isfinite(util), 1.0 - np.clip(util / 100.0, 0, 1), 0.0)
    link_rate = np.full(len(s), np.nan)
    link_rate[heavy] = _link_rates(ctx, s[heavy])
    copy_frac = np.clip(np.nan_to_num(per_dir) / link_rate, 0.0, 1.0)
    lost = np.where(heavy, dt * np.maximum(idle_frac, copy_frac), 0.0)
    out["heavy"] = {
        "dt": dt[heavy], "util": util[heavy], "sm": _num(s, "sm_active_pct")[heavy],
        "per_dir": per_dir[heavy], "link_rate": link_rate[heavy], "lost": lost[heavy],
        "phase": s["phase"].to_numpy(object)[heavy],
    }  # fmt: skip
    out["lost_s"] = exact_sum(lost)  # over every sample, as the whole run's sum is taken
    out["runs"] = _runs(s, heavy, lost)
    out["gpus"] = _gpu_pairs(s, np.flatnonzero(heavy))
    return out


def _inventory(ctx: AnalysisContext) -> dict[tuple[str, int], dict]:
    return {
        (str(g.get("host")), int(g["index"])): g
        for g in ctx.run.meta.gpus or []
        if isinstance(g, dict) and isinstance(g.get("index"), int)
    }


def _link_rates(ctx: AnalysisContext, s) -> np.ndarray:
    """Per sample of ``s``: its GPU's PCIe rate per direction (bytes/s)."""
    inventory = _inventory(ctx)
    codes, uniq = pd.MultiIndex.from_arrays([s["host"].astype(str), s["gpu"]]).factorize()
    links = [pcie_link(inventory.get((str(h), int(g)))) for h, g in uniq]
    return np.array([pcie_bytes_s(gen, lanes) for gen, lanes, _ in links])[codes]


def _links(ctx: AnalysisContext) -> set[str]:
    """One part's GPUs' PCIe links as text ("Gen4 x16", "Gen4 x16 (assumed)")."""
    s = ctx.samples
    if s.empty:
        return set()
    _, gpus = _gpu_codes(ctx, s)
    inventory = _inventory(ctx)
    links = [pcie_link(inventory.get((str(h), int(g)))) for h, g in zip(gpus["host"], gpus["gpu"])]
    return {f"Gen{g} x{w}" + ("" if known else " (assumed)") for g, w, known in links}
