"""``unused_gpu``: a GPU of the allocation the job never ran work on.

The commonest waste is the one no phase explains: a job given two GPUs that uses one (a
missing ``--nproc_per_node``, ``CUDA_VISIBLE_DEVICES`` or ``n_gpus_per_node``; a device
string hard-coded to ``cuda:0``), or a job on a GPU node whose PyTorch never saw CUDA.
Such a GPU reads ~0% for the whole run with little or no memory used (a CUDA context alone is a
few hundred MiB). Every sample of it is lost and is claimed here, so that later stalls (bubbles,
unattributed idle, memory headroom, imbalance) don't explain it again.

Whether a GPU is unused is decided on its own samples, in the part that holds them
(`parts.Parts`); whether the run lost enough to say so, on every GPU's figures together.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from gpuprof.analyzers.evidence import UnusedGpuEvidence
from gpuprof.analyzers.findings import AnalysisContext, Finding, Thresholds
from gpuprof.analyzers.parts import Parts, stretches, top_stretches
from gpuprof.analyzers.stalls._phase import _conf, _minutes, _num
from gpuprof.analyzers.stalls._resource import _gpu_codes, _on_gpus


def detect(ctx: AnalysisContext | Parts, th: Thresholds) -> Finding | None:
    """GPUs whose busy measure stayed at ~0% (``th.unused_util_pct``) for the whole run, at
    least ``th.unused_min_s`` of samples, with at most ``th.unused_mem_bytes`` used."""
    parts = ctx if isinstance(ctx, Parts) else Parts.of(ctx)
    if parts.total_gpu_s <= 0:
        return None
    got = [g for g in parts.map(_measure, th) if g is not None]
    if not got or not any(_unused(g[0], th).any() for g in got):
        return None
    per = pd.concat([g[0] for g in got]).sort_index()
    unused = _unused(per, th)
    if not unused.any():
        return None
    idle = per[unused]
    lost = float(idle["gpu_s"].sum())
    share = parts.share(lost)
    if share < th.min_share:
        return None
    parts.each(_claim, list(idle.index))
    labels = [f"{h}:{int(g)}" for h, g in idle.index]
    n_all = len(per)
    used = n_all - len(idle)
    mem = float(idle["mem_max"].max()) if np.isfinite(idle["mem_max"]).any() else np.nan
    mem_txt = f", at most {mem / 2**20:.0f} MiB used" if np.isfinite(mem) else ""
    if used:
        what = f"{len(idle)} of {n_all} GPUs never ran work ({', '.join(labels[:8])}){mem_txt}"
    else:
        what = f"the job never ran work on its GPU{'s' if n_all > 1 else ''}{mem_txt}"
    summary = f"{what}: {_minutes(lost)} ({share:.0%}) of the allocation unused"
    return Finding(
        kind="unused_gpu",
        gpu_seconds_lost=lost,
        share=share,
        confidence=_conf(0.8 + 0.2 * share),
        summary=summary,
        evidence=UnusedGpuEvidence(
            intervals=top_stretches([g[1] for g in got]),
            gpus=labels,
            phases=[],
            util_gpu_pct_max=_num(float(idle["busy_max"].max())),
            mem_used_bytes_max=_num(mem, ".0f"),
            unused_gpu_s=_num(lost),
            used_gpus=int(used),
        ),
    )


def _unused(per: pd.DataFrame, th: Thresholds) -> np.ndarray:
    """Which GPUs of ``per`` look unused (a mask, row by row)."""
    with np.errstate(invalid="ignore"):
        return (
            (per["measured"].to_numpy() > 0)
            & (per["busy_max"].to_numpy(np.float64) <= th.unused_util_pct)
            & (per["gpu_s"].to_numpy(np.float64) >= th.unused_min_s)
            # NaN memory (not reported) passes
            & ~(per["mem_max"].to_numpy(np.float64) > th.unused_mem_bytes)
        )


def _measure(ctx: AnalysisContext, th: Thresholds) -> tuple[pd.DataFrame, tuple] | None:
    """One part's GPUs: per GPU (indexed by host and GPU, sorted) the highest busy reading,
    measured samples, GPU-seconds and most memory used; and the stretches of the samples of
    the GPUs that look unused (`parts.stretches`). None without a busy reading."""
    s = ctx.samples
    if s is None or s.empty:
        return None
    util = s["util_gpu_pct"].to_numpy(np.float64)
    sm = s["sm_active_pct"].to_numpy(np.float64)
    busy = np.where(np.isfinite(util), util, sm)
    if not np.isfinite(busy).any():
        return None
    # per GPU, sorted by host and GPU (group numbers, not strings, for the 10⁵–10⁶ samples)
    code, gpus = _gpu_codes(ctx, s)
    ok = code >= 0
    dt = s["dt_s"].to_numpy(np.float64)
    # the group-by's figures on the GPU numbers (every number has samples): maxima and counts
    # on arrays, the seconds summed by pandas as the group-by sums them
    n, group = len(gpus), code[ok]
    busy_max, mem_max = np.full(n, np.nan), np.full(n, np.nan)
    np.fmax.at(busy_max, group, busy[ok])
    np.fmax.at(mem_max, group, s["mem_used_bytes"].to_numpy(np.float64)[ok])
    gpu_s = pd.Series(dt[ok], copy=False).groupby(group, sort=True).sum().to_numpy()
    host, number = gpus["host"].to_numpy(), gpus["gpu"].to_numpy()
    order = np.lexsort((number, pd.factorize(host, sort=True)[0]))  # as ``sort_index``
    per = pd.DataFrame(
        {"busy_max": busy_max[order],
         "measured": np.bincount(group[np.isfinite(busy[ok])], minlength=n)[order],
         "gpu_s": gpu_s[order], "mem_max": mem_max[order]},
        index=pd.MultiIndex.from_arrays([host[order], number[order]], names=["host", "gpu"]),
    )  # fmt: skip
    unused = per[_unused(per, th)]
    if len(unused):
        hosts, numbers = zip(*unused.index)
        mask = _on_gpus(ctx, s, hosts, numbers)
    else:
        mask = np.zeros(len(s), dtype=bool)
    return per, stretches(s["t_ns"].to_numpy(np.int64), dt, mask, dt)


def _claim(ctx: AnalysisContext, gpus: list[tuple]) -> None:
    s = ctx.samples
    if s is None or s.empty:
        return
    hosts, numbers = zip(*gpus)
    ctx.claim(_on_gpus(ctx, s, hosts, numbers))
