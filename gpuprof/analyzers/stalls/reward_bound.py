"""``reward_bound``: GPUs idle while rewards are scored (usually on the CPU)."""

from __future__ import annotations

import numpy as np

from gpuprof.analyzers.evidence import PHASE_TIMING, RewardBoundEvidence
from gpuprof.analyzers.findings import AnalysisContext, Finding, Thresholds
from gpuprof.analyzers.parts import Parts
from gpuprof.analyzers.stalls._phase import (
    _allowance,
    _any_samples,
    _conf,
    _cpu_during,
    _excess,
    _minutes,
    _num,
    _parts,
    _phase_intervals,
    _phase_where,
    _waiting_on,
    cpu_during,
    phase_idle,
)
from gpuprof.analyzers.stalls._timing import phase_loss


def detect(ctx: AnalysisContext | Parts, th: Thresholds) -> Finding | None:
    """GPUs idle inside reward spans (beyond a healthy scoring share), host CPU busy."""
    parts = _parts(ctx)
    if not _any_samples(parts):
        return _from_timing(parts.lead, th)
    st = phase_idle(parts, ["reward"])
    if (
        st is None or st["idle_frac"] < th.phase_idle_min_frac
    ):  # a GPU reward model keeps the GPUs busy
        return None
    waiting = _waiting_on(parts, th, ["reward"])
    lost = _excess(parts, th, st["idle_gpu_s"] + waiting, "reward")
    share = parts.share(lost)
    if share < th.min_share:
        return None
    cpu = cpu_during(parts, "reward", {"main", "trainer", "other", "reward"})
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
        evidence=RewardBoundEvidence(
            intervals=_phase_intervals(parts, ["reward"]),
            gpus=st["gpus"],
            phases=["reward"],
            reward_gpu_s=_num(st["gpu_s"]),
            reward_idle_gpu_s=_num(st["idle_gpu_s"]),
            reward_util_gpu_pct=_num(st["util_pct"]),
            host_cpu_pct=_num(host_cpu),
            scorer_process_cpu_pct=_num(proc_cpu),
            host_cpu_busy=host_busy,
            scorer_pinned=pinned,
            waiting_gpus_idle_gpu_s=_num(waiting),
            allowance_share=_allowance(th, "reward"),
        ),
    )


def _from_timing(ctx: AnalysisContext, th: Thresholds) -> Finding | None:
    """From a framework's phase times alone: reward time beyond a healthy share of the run,
    with every GPU assumed idle while it runs (rule-based scoring on the CPU, as in verl's
    colocated trainer; a reward model on the GPUs would be busy time)."""
    pl = phase_loss(ctx, ["reward"], _allowance(th, "reward"))
    if pl is None or pl.share < th.min_share:
        return None
    t = pl.timing
    per_step = pl.seconds / max(1, pl.steps_with_phase)
    # a watched run has host samples: the scorer's CPU confirms a CPU-side scorer
    cpu = _cpu_during(ctx, _phase_where(ctx, "reward"), {"main", "trainer", "other", "reward"})
    proc_cpu = cpu.get("proc_cpu_pct", np.nan)
    pinned = bool(proc_cpu >= th.process_core_pinned_pct)
    how = (
        f"the scorer at {proc_cpu:.0f}% of a core"
        if np.isfinite(proc_cpu)
        else "from the framework's phase times, assuming a CPU-side scorer"
    )
    summary = (
        f"reward scoring takes {pl.share_of_step:.0%} of step time ({per_step:.1f} s per "
        f"step): {_minutes(pl.lost_gpu_s)} ({pl.share:.0%}) beyond a healthy share with "
        f"{t.the_gpus()} waiting{t.gpu_note()}; {how}"
    )
    return Finding(
        kind="reward_bound",
        gpu_seconds_lost=pl.lost_gpu_s,
        share=pl.share,
        confidence=_conf(0.4 + 0.5 * pl.share + (0.15 if pinned else 0.0)),
        summary=summary,
        evidence=RewardBoundEvidence(
            intervals=t.intervals(["reward"]),
            phases=["reward"],
            basis=PHASE_TIMING,
            host_cpu_pct=_num(cpu.get("host_cpu_pct", np.nan)),
            scorer_process_cpu_pct=_num(proc_cpu),
            scorer_pinned=pinned,
            reward_gpu_s=_num(pl.seconds * t.gpus),
            reward_share_of_step=_num(pl.share_of_step, ".3f"),
            allowance_share=_allowance(th, "reward"),
        ),
    )
