"""What a diagnosis rests on: GPU samples, phase timing, framework counters — stated in one
line with every diagnosis, so that "no finding" is never read as "no stall" when the run held
nothing to judge.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd

from gpuprof.analyzers import attr_columns
from gpuprof.analyzers.findings import AnalysisContext
from gpuprof.analyzers.parts import Parts, median_of_counts, sampled, value_counts

_NOT_COUNTERS = frozenset(
    {
        "framework",
        "source",
        "sub_timing_s",
        "log_line",
        "log_window_steps",
        "tokens",
        "step",
        "untimed",
    }
)
"""Step attributes that are bookkeeping, not figures the framework measured."""

COUNTERS_SHOWN = 4
"""Counter names spelled out in the line; the rest are counted."""


def data_basis(ctx: AnalysisContext, steps: int) -> dict[str, Any]:
    """The data the diagnosis is judged on.

    ``gpu_samples``: ``{"gpus", "samples", "interval_s"}`` (the sampling interval the run
    records, else the median seconds between samples of one GPU) or None; ``phase_timing``:
    ``{"steps", "phases"}`` (canonical phases other than the step itself) or None;
    ``framework_counters``: names of the figures the framework logged per step
    (``perf/mfu/actor``…), ``perf/*`` first; ``line``: all of it in one sentence. ``gpus``:
    the distinct (host, gpu) pairs of every GPU sample.
    """
    gpu = _gpu_samples(ctx)
    # each part's spans and step events: their phases and the counters their steps carry
    got = Parts.of(ctx).map(_span_basis)
    phases = sorted(set().union(*(p for p, _ in got)) - {"step"})
    timing = {"steps": int(steps), "phases": phases} if steps or phases else None
    names = set().union(*(n for _, n in got))
    counters = _ordered(names)
    return {
        "gpu_samples": gpu,
        "phase_timing": timing,
        "framework_counters": counters,
        "line": basis_line(gpu, timing, counters),
    }


def basis_line(
    gpu: dict[str, Any] | None, timing: dict[str, Any] | None, counters: list[str]
) -> str:
    """``Judged on: GPU samples (8 GPUs, 48,000 samples every 0.1 s); phase timing (16 steps,
    9 phases); framework counters (perf/mfu/actor, …)`` — or why there is nothing to judge."""
    parts = []
    if gpu:
        every = f" every {gpu['interval_s']:g} s" if gpu.get("interval_s") else ""
        parts.append(f"GPU samples ({gpu['gpus']} GPUs, {gpu['samples']:,} samples{every})")
    if timing:
        n = timing["steps"]
        phases = len(timing["phases"])
        steps = f"{n} step{'s' if n != 1 else ''}" if n else "no step boundaries"
        parts.append(f"phase timing ({steps}, {phases} phase{'s' if phases != 1 else ''})")
    if counters:
        shown = ", ".join(counters[:COUNTERS_SHOWN])
        more = len(counters) - COUNTERS_SHOWN
        parts.append(f"framework counters ({shown}{f', +{more} more' if more > 0 else ''})")
    if not gpu and not timing:
        missing = "no GPU samples and no step or phase times: nothing to attribute"
        return f"Judged on: nothing — the run holds {missing}" + (
            f" (only framework counters: {', '.join(counters[:COUNTERS_SHOWN])})"
            if counters
            else ""
        )
    return "Judged on: " + "; ".join(parts)


def _gpu_samples(ctx: AnalysisContext) -> dict[str, Any] | None:
    got = sampled(ctx)
    if not got.samples:
        return None
    count, n = got.gpus, got.samples
    recorded = ctx.run.meta.interval_s
    if isinstance(recorded, int | float) and recorded > 0:  # the cadence the run was taken at
        return {"gpus": count, "samples": n, "interval_s": round(float(recorded), 3)}
    median = median_of_counts(Parts.of(ctx).map(_gap_counts))
    interval = float(np.round(median, 3)) if median == median else None
    return {"gpus": count, "samples": n, "interval_s": interval}


def _gap_counts(ctx: AnalysisContext) -> tuple[np.ndarray, np.ndarray]:
    """One part's seconds between consecutive samples of one GPU, as `value_counts`."""
    gpu = ctx.run.gpu
    if not len(gpu):
        return np.zeros(0), np.zeros(0, np.int64)
    ordered = gpu.sort_values(["host", "gpu", "t_ns"])
    host, number = ordered["host"].to_numpy(), ordered["gpu"].to_numpy()
    same = (host[1:] == host[:-1]) & (number[1:] == number[:-1])
    gaps = np.diff(ordered["t_ns"].to_numpy(dtype="int64"))[same] / 1e9
    return value_counts(gaps[gaps > 0])


def _span_basis(ctx: AnalysisContext) -> tuple[set[str], set[str]]:
    """One part's span phases and the counters its step spans and step events carry (a span
    without a host is in no part: read nowhere)."""
    spans = ctx.run.spans
    if len(spans) and "host" in spans:
        missing = spans["host"].isna().to_numpy(bool)
        if missing.any():  # a copy only where there is something to leave out
            spans = spans[~missing]
    phases = set(spans["phase"].dropna()) if len(spans) else set()
    steps = len(spans) and "attrs" in spans
    attrs = list(spans.loc[spans["phase"] == "step", "attrs"]) if steps else []
    return phases, _counter_names(attrs + _untimed_attrs(ctx.run.events))


def _untimed_attrs(events: pd.DataFrame) -> list[Any]:
    """The attrs of step events (steps a log gives figures for but no duration) that have a
    host: a run cut into parts by host has no other in any part."""
    if len(events) and "attrs" in events and "kind" in events:
        keep = events["kind"] == "step"
        if "host" in events:
            keep &= events["host"].notna()
        return list(events.loc[keep, "attrs"])
    return []


def _counter_names(attrs_list: list[Any]) -> set[str]:
    return {
        key
        for key in attr_columns.key_names(attrs_list) - _NOT_COUNTERS
        if any(_number(v) for v in attr_columns.values(attrs_list, key))
    }


def _ordered(names: set[str]) -> list[str]:
    # the framework's own performance figures first: they are what a reader looks for
    return sorted(names, key=lambda name: (not name.startswith("perf/"), name))


def _counters(spans: pd.DataFrame, events: pd.DataFrame) -> list[str]:
    """The names of the figures the steps of ``spans`` and ``events`` carry, ordered."""
    attrs_list = []
    if len(spans) and "attrs" in spans:
        attrs_list += list(spans.loc[spans["phase"] == "step", "attrs"])
    return _ordered(_counter_names(attrs_list + _untimed_attrs(events)))


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)
