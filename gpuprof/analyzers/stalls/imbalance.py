"""``imbalance``: a straggler rank the others wait for, or a GPU doing far less work than its
peers in the same phases.

Two signs, the first that shows wins: span times (a rank whose phases run longer than the
median rank's, `_stragglers`), and, when the spans show none or there are no spans, the GPUs'
own busy measure (`_low_gpus`): a GPU whose utilisation (or GPM SM activity) in a phase stays
far below its peers' is given less work — an uneven split of batches or sequences, a rank that
skips work, a device placement that sends everything to the others.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from gpuprof.analyzers.evidence import ImbalanceEvidence
from gpuprof.analyzers.findings import AnalysisContext, Finding, Thresholds
from gpuprof.analyzers.grouping import (
    appearance_codes,
    dense_codes,
    first_rows,
    group_medians,
    label_codes,
)
from gpuprof.analyzers.parts import Parts, deal
from gpuprof.analyzers.stalls._phase import _memo, _parts
from gpuprof.analyzers.stalls._resource import (
    NOT_WORK_PHASES,
    _collectives,
    _finding,
    _fmt_gpu_s,
    _gpu_codes,
    _gpu_label,
    _intervals,
    _on_gpus,
    _runs,
    _spans,
    _throttled_gpus,
    top_clock,
)


def detect(ctx: AnalysisContext | Parts, th: Thresholds) -> Finding | None:
    """A straggler rank (from span times), else a GPU far less busy than its peers."""
    parts = _parts(ctx)
    return _stragglers(parts, th) or _low_gpus(parts, th)


def _stragglers(parts: Parts, th: Thresholds) -> Finding | None:
    """A straggler rank whose phases run longer while the other ranks wait.

    Per (phase, step), each rank's (process's) summed span time is compared with the median
    rank's; when the slowest exceeds it by ``th.imbalance_spread_frac``, every other GPU of
    the phase waits for it (data-parallel steps synchronise): lost = ``(slowest - median) x
    (GPUs of the phase - GPUs of the straggler)``, i.e. (n−1) × delay. Ranks on throttled GPUs
    are compared only with each other (their shared slowdown is ``throttling``'s).
    """
    state = parts.map(_span_state)
    if not any(x["spans"] for x in state) or not any(x["samples"] for x in state):
        return None
    max_clock = top_clock(parts)
    throttled = set().union(*parts.map(_throttled_gpus, th, max_clock))
    got = _straggler_rows(parts, th, throttled)
    if got is None:
        return None
    stragglers, gpu_of = got
    # the slowest subgroup's straggler sets the pace of the phase-step (of equal ones, the
    # first by host and process)
    stragglers = stragglers.sort_values(
        ["dur", "host", "pid"], ascending=[False, True, True], kind="stable"
    ).drop_duplicates(["phase", "step"])
    if stragglers.empty:
        return None
    stragglers = stragglers.assign(
        delay_s=stragglers["mx"] - stragglers["med"],
    )
    stragglers["w"] = stragglers["delay_s"] * (stragglers["all_gpus"] - stragglers["n_gpu"])
    flagged = stragglers.assign(lost=stragglers["w"])
    gpu_s = float(flagged["lost"].sum())
    who = stragglers.groupby(["host", "pid"])["w"].sum().sort_values(ascending=False,
                                                                     kind="stable")  # fmt: skip
    top_host, top_pid = who.index[0]
    top = gpu_of.loc[(top_host, top_pid)] if (top_host, top_pid) in gpu_of.index else None
    ranks = [r for r in parts.map(_rank_of, top_host, top_pid) if r is not None]
    rank = ranks[0] if ranks else None
    spread = float((stragglers["mx"] / stragglers["med"].where(stragglers["med"] > 0)).median())
    # per-GPU utilisation / memory spread as supporting figures
    figs = parts.map(_spread)
    per_gpu = pd.concat([x["per_gpu"] for x in figs if x["per_gpu"] is not None])
    barriers = sum(x["barriers"] for x in figs)
    confidence = 0.5 + 0.2 * min(1.0, (spread - 1.0) / 0.5 if np.isfinite(spread) else 0.0)
    confidence += 0.15 * min(1.0, who.iloc[0] / max(gpu_s, 1e-12))
    confidence += 0.15 if barriers else 0.0
    multi_node = len(set().union(*(x["hosts"] for x in figs))) > 1
    straggler_label = (
        f"pid {int(top_pid)} on {top_host}" if rank is None
        else f"rank {rank} on {top_host}" if multi_node
        else f"rank {rank}"
    )  # fmt: skip
    summary = (
        f"{straggler_label} straggles: its phases run {spread - 1:.0%} longer than the median "
        f"rank in {len(stragglers)} phase-steps; others wait ~{_fmt_gpu_s(gpu_s)} ({{share}})"
    )
    evidence = ImbalanceEvidence(
        intervals=_intervals(stragglers, "w"),
        gpus=[_gpu_label(top["host"], top["gpu"])] if top is not None else [],
        phases=sorted(set(stragglers["phase"])),
        straggler_rank=rank,
        straggler_pid=int(top_pid),
        straggler_host=str(top_host),
        slowdown_frac_median=round(spread - 1.0, 4) if np.isfinite(spread) else None,
        delay_s_total=round(float(stragglers["delay_s"].sum()), 3),
        phase_steps_flagged=len(stragglers),
        barrier_spans=barriers,
        util_gpu_pct_spread=round(float(per_gpu["util"].max() - per_gpu["util"].min()), 2)
        if per_gpu["util"].notna().any()
        else None,
        mem_peak_bytes_spread=float(per_gpu["mem"].max() - per_gpu["mem"].min())
        if per_gpu["mem"].notna().any()
        else None,
    )
    return _finding("imbalance", parts, th, gpu_s, confidence, summary, evidence)


def _rank_of(ctx: AnalysisContext, host: str, pid: float) -> int | None:
    """The rank the first span of process ``pid`` on ``host`` carries (None: none does, or
    the process is another part's)."""
    spans = _spans(ctx)
    if spans.empty:
        return None
    ranks = spans.loc[(spans["host"] == host) & (spans["pid"] == pid), "rank"].dropna()
    return int(ranks.iloc[0]) if len(ranks) else None


def _span_state(ctx: AnalysisContext) -> dict:
    """Whether one part has usable spans and unclaimed samples."""
    s = ctx.unclaimed_samples
    return {"spans": not _spans(ctx).empty, "samples": s is not None and not s.empty}


def _spread(ctx: AnalysisContext) -> dict:
    """One part's barrier spans and span hosts, and per GPU its mean utilisation and peak
    memory."""
    s = ctx.unclaimed_samples
    spans = _spans(ctx)
    out = {"barriers": int(spans["wait"].to_numpy().sum()) if len(spans) else 0,
           "hosts": set(spans["host"].dropna().unique()) if len(spans) else set(),
           "per_gpu": None}  # fmt: skip
    if s is not None and not s.empty:
        gpu, _ = _gpu_codes(ctx, s)
        keep = gpu >= 0
        per_gpu = pd.DataFrame(
            {"util": s["util_gpu_pct"].to_numpy(np.float64)[keep],
             "mem": s["mem_used_bytes"].to_numpy(np.float64)[keep]},
            copy=False,
        ).groupby(gpu[keep], sort=True)  # fmt: skip
        out["per_gpu"] = pd.DataFrame({"util": per_gpu["util"].mean(), "mem": per_gpu["mem"].max()})
    return out


def _paces(per: pd.DataFrame) -> dict[str, np.ndarray]:
    """``per``'s rank-steps (``phase``, ``step``, ``hot``, ``dur`` s, ``n_gpu``) with, per
    (phase, step, throttled or not), its ``ranks``, the slowest's ``mx`` s and ``med`` s, the
    pace the others kept; and ``all_gpus``, the GPUs of each (phase, step): one value per
    row, as the group-bys' transforms give them, figured on the rows' group codes."""
    phase_step, subgroup = _group_keys(per)
    dur = per["dur"].to_numpy(np.float64)
    n_gpu = per["n_gpu"].to_numpy()
    sub, n_sub = dense_codes(subgroup)
    ranks = np.bincount(sub, minlength=n_sub)
    mx = np.full(n_sub, np.nan)
    np.fmax.at(mx, sub, dur)
    mx = mx[sub]
    # the pace the others kept: the median of every rank but the slowest (with two ranks the
    # median of both would hide half the delay)
    med = group_medians(sub, n_sub, np.where(dur < mx, dur, np.nan))[sub]
    med = np.where(np.isnan(med), mx, med)
    ps, n_ps = dense_codes(phase_step)
    all_gpus = np.zeros(n_ps, dtype=n_gpu.dtype)
    np.add.at(all_gpus, ps, n_gpu)  # GPU counts: whole numbers, any order sums them exactly
    return {"ranks": ranks[sub], "mx": mx, "med": med, "all_gpus": all_gpus[ps]}


def _group_keys(per: pd.DataFrame) -> tuple[np.ndarray, np.ndarray]:
    """The keys ``per``'s rows are grouped by, each as one int64 code: (phase, step), and
    (phase, step, on a throttled GPU). A group-by on the text phase column factorizes it
    again for every figure: ~2 s of the parent's own time on a cluster-day's 10⁶-10⁷
    rank-steps. Every row has a phase and a step (`_rank_work`'s group-by keeps no other)."""
    phase = pd.factorize(per["phase"])[0].astype(np.int64)
    step = pd.factorize(per["step"])[0].astype(np.int64)
    phase_step = phase * (int(step.max(initial=0)) + 1) + step
    return phase_step, phase_step * 2 + per["hot"].to_numpy(bool)


def _straggler_rows(
    parts: Parts, th: Thresholds, throttled: set[tuple[str, int]]
) -> tuple[pd.DataFrame, pd.DataFrame] | None:
    """The rank-steps that straggle (`_slowest`, in the order of the parts' rank-steps, as
    one pass over every step gives them) and the owners' GPUs (`_rank_work`'s ``gpu_of``);
    None without work spans or without a straggler."""
    owners: dict[int, pd.DataFrame] = {}  # per part with work spans, its owners' GPUs
    found = []
    # a stretch of steps at a time: each rank-step is one row in this process while its
    # stretch is judged, and a cluster-day has 10⁷ of them (its phase-steps each lie in one
    # stretch, and the stragglers are put back in the order of one pass: the same figures)
    for window in _step_windows(parts):
        got = parts.map(_rank_work, throttled, window)
        for i, g in enumerate(got):
            if g is not None:
                owners.setdefault(i, g["gpu_of"])
        per = [g["per"].assign(part=i) for i, g in enumerate(got) if g is not None]
        if per:
            found.append(_slowest(pd.concat(per, ignore_index=True) if len(per) > 1 else per[0],
                                  th))  # fmt: skip
        del got, per
    if not owners:
        return None
    stragglers = pd.concat(found, ignore_index=True) if found else pd.DataFrame()
    if stragglers.empty:
        return None
    owners = {i: _gpu_of(o) for i, o in owners.items()}
    stragglers = stragglers.sort_values(["part", "first"], kind="stable")
    stragglers = stragglers.drop(columns=["part", "first"]).reset_index(drop=True)
    return stragglers, pd.concat([owners[i] for i in sorted(owners)])


RANK_STEPS_PER_PASS = 2_000_000
"""Work spans from which the straggler figures are made a stretch of steps at a time, about
this many at once (a row each, ~80 B, in the process that judges them, and in each part's
reply): a cluster-day's 18 M spans in ten stretches instead of 1.2 GB of rows at once."""


def _step_windows(parts: Parts) -> list[tuple[float, float] | None]:
    """The stretches of steps (first, last) the straggler figures are made in, of about
    `RANK_STEPS_PER_PASS` work spans each; ``[None]``, every step at once, for a run with
    fewer spans than that."""
    if parts.facts.valid_spans <= RANK_STEPS_PER_PASS:
        return [None]
    counts = [c for c in parts.map(_work_steps) if c is not None]
    if not counts:
        return [None]
    per_step = pd.concat(counts).groupby(level=0, sort=True).sum()
    steps = per_step.index.to_numpy(np.float64)
    n = int(np.ceil(per_step.sum() / RANK_STEPS_PER_PASS))
    return [(float(steps[g[0]]), float(steps[g[-1]])) for g in deal(per_step.tolist(), n)]


def _work_mask(ctx: AnalysisContext) -> np.ndarray:
    """Which of the part's usable spans are work: not waiting, not a collective, in a step."""
    spans = _spans(ctx)

    def compute() -> np.ndarray:
        return (
            ~spans["phase"].isin(NOT_WORK_PHASES).to_numpy()
            & ~_collectives(ctx)
            & ~spans["wait"].to_numpy()
            & np.isfinite(spans["step"].to_numpy(np.float64))
        )

    return _memo(ctx, "work_spans", compute)


def _work_steps(ctx: AnalysisContext) -> pd.Series | None:
    """One part's work spans per step (None without)."""
    spans = _spans(ctx)
    s = ctx.unclaimed_samples
    if spans.empty or s is None or s.empty:
        return None
    return spans["step"][_work_mask(ctx)].value_counts(sort=False)


def _slowest(per: pd.DataFrame, th: Thresholds) -> pd.DataFrame:
    """The rank-steps of ``per`` (every rank of each of its phase-steps) that straggle: the
    slowest of a phase-step that runs longer than the pace the others kept."""
    known = np.isfinite(per["n_gpu"].to_numpy(np.float64))
    if not known.all():
        per = per[known]
    if per.empty:
        return per
    paces = _paces(per)
    mx, med = paces["mx"], paces["med"]
    slow = (paces["ranks"] >= 2) & (mx > med * (1 + th.imbalance_spread_frac)) & (mx > 0)
    rows = np.flatnonzero(slow & (per["dur"].to_numpy(np.float64) >= mx))
    return per.iloc[rows].assign(**{k: v[rows] for k, v in paces.items()})


def _rank_work(
    ctx: AnalysisContext, throttled: set[tuple[str, int]],
    window: tuple[float, float] | None = None,
) -> dict | None:  # fmt: skip
    """One part's ranks: per (phase, step, host, pid) their work spans' seconds and stretch,
    GPUs, whether on a throttled GPU and ``first``, the place of the group's first span
    among the part's work spans; per owner its first GPU. ``window``: only the steps from
    its first to its last. None without work spans."""
    spans = _spans(ctx)
    s = ctx.unclaimed_samples
    if spans.empty or s is None or s.empty:
        return None
    work = np.flatnonzero(_work_mask(ctx))
    first = np.arange(len(work))  # the place of each among the part's work spans
    if window is not None:
        step = spans["step"].to_numpy(np.float64)[work]
        inside = (step >= window[0]) & (step <= window[1])
        work, first = work[inside], first[inside]
    if not len(work):
        return None
    # GPUs per owner process (a controller may drive several): each GPU's first sample that
    # has an owner, in sample order (as dropna + drop_duplicates on host and gpu)
    gpu, _ = _gpu_codes(ctx, s)
    with_owner = np.flatnonzero(s["pid"].notna().to_numpy() & (gpu >= 0))
    owners = s.iloc[np.sort(with_owner[np.unique(gpu[with_owner], return_index=True)[1]])]
    owner_keys = list(zip(owners["owner_host"].to_numpy(object), owners["pid"].to_numpy()))
    n_gpu: dict[tuple, int] = {}
    for key in owner_keys:
        n_gpu[key] = n_gpu.get(key, 0) + 1
    # per (phase, step, host, pid), in order of first appearance: pandas' sums of the spans'
    # seconds, their first start and last end, on one integer code
    keys = [spans[k].iloc[work] for k in ("phase", "step", "host", "pid")]
    group = appearance_codes(keys)
    at = first_rows(group)
    start = spans["start_ns"].to_numpy(np.int64)[work]
    end = spans["end_ns"].to_numpy(np.int64)[work]
    dur = (spans["end_ns"].to_numpy() - spans["start_ns"].to_numpy())[work] / 1e9
    starts = np.full(len(at), np.iinfo(np.int64).max)
    ends = np.full(len(at), np.iinfo(np.int64).min)
    np.minimum.at(starts, group, start)
    np.maximum.at(ends, group, end)
    host, pid = keys[2].to_numpy(object)[at], keys[3].to_numpy()[at]
    counts = [n_gpu.get(key, np.nan) for key in zip(host, pid)]
    per = pd.DataFrame(
        {
            **{k.name: k.iloc[at].reset_index(drop=True) for k in keys},
            "dur": pd.Series(dur, copy=False).groupby(group, sort=False).sum().to_numpy(),
            "start_ns": starts,
            "end_ns": ends,
            "first": first[at],
            # a reindex leaves NaN (a float column) where an owner has no GPU
            "n_gpu": np.array(counts, dtype=np.float64 if np.nan in counts else np.int64),
        }
    )
    # ranks on throttled GPUs are compared with each other only: their common slowdown is
    # ``throttling``'s, a straggler among them is still imbalance
    if throttled:
        where = _gpu_of(owners)
        gpu_at = dict(zip(where.index, zip(where["host"], where["gpu"])))
        per["hot"] = [
            isinstance(h, str) and x == x and (h, int(x)) in throttled
            for h, x in (gpu_at.get(key, (np.nan, np.nan)) for key in zip(host, pid))
        ]
    else:  # no throttled GPU: no rank is on one
        per["hot"] = np.zeros(len(per), dtype=bool)
    return {
        "per": per,
        "gpu_of": owners,
    }


def _gpu_of(owners: pd.DataFrame) -> pd.DataFrame:
    """Per owner process (``owner_host``, ``pid``) of the part's GPUs' first samples with an
    owner: its first GPU's ``host`` and ``gpu``."""
    return owners.groupby(["owner_host", "pid"])[["host", "gpu"]].first()


def _low_gpus(parts: Parts, th: Thresholds) -> Finding | None:
    """GPUs far less busy than their peers in the same phase.

    Per (phase, GPU), the time-weighted busy measure (GPM SM activity where every sample has
    it, else NVML utilisation). In a phase where the peers' median is at least
    ``th.busy_util_pct``, a GPU below ``th.imbalance_busy_gap_frac`` of that median does less
    work: lost = its GPU-seconds in the phase × (median − its level) / 100, the work its peers'
    pace says it could have done. Phases where every GPU idles (reward, sync) say nothing.
    """
    state = [g for g in parts.map(_level_state) if g is not None]
    if sum(n for n, _ in state) < 2:
        return None
    use_sm = all(all_sm for _, all_sm in state)
    got = [g for g in parts.map(_phase_levels, use_sm) if g is not None]
    if not got:
        return None
    per = pd.concat(got, ignore_index=True)
    per = per[per["gpu_s"] > 0].reset_index(drop=True)
    per["level"] = per["lw"] / per["gpu_s"]
    grp = per.groupby("phase", sort=False)["level"]
    per["peers"] = grp.transform("size")
    per["median"] = grp.transform("median")
    low = per[
        (per["peers"] >= 2)
        & (per["median"] >= th.busy_util_pct)
        & (per["level"] < th.imbalance_busy_gap_frac * per["median"])
    ].copy()
    if low.empty:
        return None
    low["lost"] = low["gpu_s"] * (low["median"] - low["level"]) / 100.0
    gpu_s = float(low["lost"].sum())
    labels = sorted({_gpu_label(h, g) for h, g in zip(low["host"], low["gpu"])})
    level_low = float(np.average(low["level"], weights=low["gpu_s"]))
    level_peers = float(np.average(low["median"], weights=low["gpu_s"]))
    measure = "sm_active_pct" if use_sm else "util_gpu_pct"
    what = "SM activity" if use_sm else "utilisation"
    phases = sorted({str(p) for p in low["phase"]})
    mem = per.groupby(["host", "gpu"])["mem"].max()
    confidence = 0.5 + 0.3 * min(1.0, (level_peers - level_low) / max(level_peers, 1e-9))
    named = [p for p in phases if p not in NOT_WORK_PHASES]
    where = f"in the same phases ({', '.join(named[:4])})" if named else "over the same time"
    summary = (
        f"{len(labels)} GPU(s) ({', '.join(labels[:6])}) run at {level_low:.0f}% {what} "
        f"while their peers run at {level_peers:.0f}% {where}: ~{_fmt_gpu_s(gpu_s)} "
        "({share}) of work left undone"
    )
    pairs = list(zip(low["host"].astype(str), low["gpu"].astype(int)))
    runs = pd.concat(parts.map(_low_runs, pairs, phases), ignore_index=True)
    evidence = ImbalanceEvidence(
        intervals=_intervals(runs, "w"),
        gpus=labels,
        phases=phases,
        low_gpus=labels,
        low_util_gpu_pct=round(level_low, 1),
        peer_util_gpu_pct=round(level_peers, 1),
        measure=measure,
        util_gpu_pct_spread=round(level_peers - level_low, 2),
        mem_peak_bytes_spread=float(mem.max() - mem.min()) if mem.notna().any() else None,
    )
    return _finding("imbalance", parts, th, gpu_s, confidence, summary, evidence)


def _level_state(ctx: AnalysisContext) -> tuple[int, bool] | None:
    """One part's GPUs (one more for samples without a GPU) and whether every unclaimed
    sample has GPM SM activity; None without samples."""
    s = ctx.unclaimed_samples
    if s is None or s.empty:
        return None
    gpu, gpus = _gpu_codes(ctx, s)
    n = len(gpus) + bool((gpu < 0).any())
    return n, bool(np.isfinite(s["sm_active_pct"].to_numpy(np.float64)).all())


def _phase_levels(ctx: AnalysisContext, use_sm: bool) -> pd.DataFrame | None:
    """One part's busy measure per (phase, GPU): GPU-seconds, weighted level, peak memory;
    in order of first appearance."""
    s = ctx.unclaimed_samples
    if s is None or s.empty:
        return None
    gpu, gpus = _gpu_codes(ctx, s)
    sm = s["sm_active_pct"].to_numpy(np.float64)
    util = s["util_gpu_pct"].to_numpy(np.float64)
    level = sm if use_sm else util
    dt = s["dt_s"].to_numpy(np.float64)
    ok = np.isfinite(level) & (dt > 0)
    # per (phase, GPU) in order of first appearance, as a group-by on them with sort=False
    phase, phase_names = label_codes(s["phase"])
    rows = np.flatnonzero(ok & (phase >= 0) & (gpu >= 0))  # a missing key: no group
    if not len(rows):
        return None
    group = appearance_codes([phase[rows], gpu[rows]])
    first = rows[first_rows(group)]
    per = pd.DataFrame(
        {
            "phase": np.array(phase_names, dtype=object)[phase[first]],
            "host": gpus["host"].to_numpy()[gpu[first]],
            "gpu": gpus["gpu"].to_numpy()[gpu[first]],
        }
    )
    sums = pd.DataFrame({"gpu_s": dt[rows], "lw": (level * dt)[rows]}, copy=False)
    sums = sums.groupby(group, sort=True).sum()  # pandas' sums, as the group-by computed them
    per["gpu_s"] = sums["gpu_s"].to_numpy()
    per["lw"] = sums["lw"].to_numpy()
    mem = pd.Series(s["mem_used_bytes"].to_numpy(np.float64)[rows], copy=False)
    per["mem"] = mem.groupby(group, sort=True).max().to_numpy()
    return per


def _low_runs(ctx: AnalysisContext, pairs: list[tuple], phases: list[str]) -> pd.DataFrame:
    """One part's runs of samples of the GPUs ``pairs`` in ``phases``."""
    s = ctx.unclaimed_samples
    if s is None or s.empty:
        return _runs(pd.DataFrame(), np.zeros(0, dtype=bool), np.zeros(0))
    hosts = [h for h, _ in pairs]
    numbers = [g for _, g in pairs]
    on_low = _on_gpus(ctx, s, hosts, numbers)
    phase, phase_names = label_codes(s["phase"])
    code_of = {name: i for i, name in enumerate(phase_names)}
    in_phases = np.isin(phase, [code_of[p] for p in phases if p in code_of])
    return _runs(s, on_low & in_phases, s["dt_s"].to_numpy(np.float64))
