"""``reshard_idle``: GPUs idle while weights move from the trainer to the inference engine."""

from __future__ import annotations

import numpy as np

from gpuprof.analyzers.evidence import PHASE_TIMING, ReshardIdleEvidence
from gpuprof.analyzers.findings import AnalysisContext, Finding, Thresholds
from gpuprof.analyzers.nodes import weight_sync_crosses_nodes
from gpuprof.analyzers.parts import Parts
from gpuprof.analyzers.stalls._phase import (
    _allowance,
    _any_samples,
    _conf,
    _excess,
    _minutes,
    _num,
    _parts,
    _phase_intervals,
    _rates_outside,
    _span_attr,
    _spans,
    _waiting_on,
    phase_idle,
)
from gpuprof.analyzers.stalls._timing import phase_loss


def detect(ctx: AnalysisContext | Parts, th: Thresholds) -> Finding | None:
    """GPUs idle inside weight-sync (``reshard``) spans beyond a healthy sync's share."""
    parts = _parts(ctx)
    if not _any_samples(parts):
        return _from_timing(parts.lead, th)
    st = phase_idle(parts, ["reshard"])
    if (
        st is None or st["idle_frac"] < th.phase_idle_min_frac
    ):  # a sync that keeps GPUs busy is not this stall
        return None
    waiting = _waiting_on(parts, th, ["reshard"])
    lost = _excess(parts, th, st["idle_gpu_s"] + waiting, "reshard")
    share = parts.share(lost)
    if share < th.min_share:
        return None
    syncs = parts.map(_syncs)
    n_syncs = sum(n for _, n in syncs)
    mean_span_s = float(sum(t for t, _ in syncs) / n_syncs) if n_syncs else np.nan
    nbytes = _span_attr(parts, "reshard", ("bytes", "weight_bytes", "nbytes"))
    bw = nbytes / mean_span_s if np.isfinite(nbytes) and mean_span_s > 0 else np.nan
    # a transfer burst: link traffic during the sync well above the run's mean
    base = np.nanmax([*_rates_outside(parts, "reshard"), 0.0])
    link = np.nanmax([st["pcie_bytes_s"], st["nvlink_bytes_s"], 0.0])
    burst = bool(link > th.link_burst_ratio * base and link > 0)
    conf = _conf(0.45 + 0.4 * st["idle_frac"] + (0.1 if burst else 0.0) + 0.5 * share)
    bw_txt = f"; {bw / 1e9:.1f} GB/s effective for {nbytes / 1e9:.1f} GB" if np.isfinite(bw) else ""
    crosses = weight_sync_crosses_nodes(parts)
    summary = (
        f"GPUs idle {st['idle_frac']:.0%} of weight sync (reshard, {mean_span_s:.1f} s per sync); "
        f"{_minutes(lost)} ({share:.0%}) beyond a healthy sync{bw_txt}"
        f"{'; the weights cross nodes' if crosses else ''}"
    )
    return Finding(
        kind="reshard_idle",
        gpu_seconds_lost=lost,
        share=share,
        confidence=conf,
        summary=summary,
        evidence=ReshardIdleEvidence(
            intervals=_phase_intervals(parts, ["reshard"]),
            gpus=st["gpus"],
            phases=["reshard"],
            reshard_gpu_s=_num(st["gpu_s"]),
            reshard_idle_gpu_s=_num(st["idle_gpu_s"]),
            reshard_util_gpu_pct=_num(st["util_pct"]),
            reshard_span_mean_s=_num(mean_span_s, ".3f"),
            reshard_syncs=n_syncs,
            weight_bytes=_num(nbytes, ".0f"),
            effective_bandwidth_bytes_s=_num(bw, ".0f"),
            pcie_bytes_s=_num(st["pcie_bytes_s"], ".0f"),
            nvlink_bytes_s=_num(st["nvlink_bytes_s"], ".0f"),
            link_burst=burst,
            waiting_gpus_idle_gpu_s=_num(waiting),
            allowance_share=_allowance(th, "reshard"),
            crosses_nodes=crosses,
        ),
    )


def _syncs(ctx: AnalysisContext) -> tuple[float, int]:
    """One part's reshard spans: their summed self seconds (a sync nested in a sync counted
    once) and how many."""
    sp = _spans(ctx)
    sp = sp[sp["phase"] == "reshard"]
    return float(sp["self_ns"].sum()) / 1e9, len(sp)


def _from_timing(ctx: AnalysisContext, th: Thresholds) -> Finding | None:
    """From a framework's phase times alone: weight-sync time beyond a healthy share of the
    run, every GPU waiting (the sync stops generation and training alike)."""
    pl = phase_loss(ctx, ["reshard"], _allowance(th, "reshard"))
    if pl is None or pl.share < th.min_share:
        return None
    t = pl.timing
    per_sync = pl.seconds / max(1, pl.steps_with_phase)
    summary = (
        f"weight sync takes {pl.share_of_step:.0%} of step time ({per_sync:.1f} s per sync): "
        f"{_minutes(pl.lost_gpu_s)} ({pl.share:.0%}) beyond a healthy sync with "
        f"{t.the_gpus()} waiting{t.gpu_note()} — from the framework's phase times"
    )
    return Finding(
        kind="reshard_idle",
        gpu_seconds_lost=pl.lost_gpu_s,
        share=pl.share,
        confidence=_conf(0.45 + 0.5 * pl.share),
        summary=summary,
        evidence=ReshardIdleEvidence(
            intervals=t.intervals(["reshard"]),
            phases=["reshard"],
            basis=PHASE_TIMING,
            reshard_gpu_s=_num(pl.seconds * t.gpus),
            reshard_span_mean_s=_num(per_sync, ".3f"),
            reshard_syncs=pl.steps_with_phase,
            reshard_share_of_step=_num(pl.share_of_step, ".3f"),
            allowance_share=_allowance(th, "reshard"),
        ),
    )
