"""Start-up, warm-up and wind-down: the time before a run's first step, its slow first steps,
and the time after its last step.

Before the first step a job creates its CUDA contexts, loads the model, starts the inference
engine, compiles; its first steps capture CUDA graphs, autotune kernels and fill caches. The
GPUs idle or run slowly through it, but no knob of the training loop wins it back, so it is
reported as start-up and never counted as a stall: `claim_startup` claims its GPU samples
(`AnalysisContext.claim`) before any stall looks at them.

- **start-up**: every GPU sample before the first step span starts (the first span of any
  phase when the run records no steps);
- **warm-up steps**: leading steps, at most `MAX_WARMUP_STEPS`, that take at least
  `WARMUP_RATIO` × the median step of the rest (a run of at least `MIN_STEPS` steps);
- **wind-down**: every GPU sample after the last step ends (the final save, teardown, or a
  profiler window that stops inside a step that never ends in the trace).

The steps are the whole run's (`parts.Facts`): a run analysed node by node claims the same
samples on every node.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from gpuprof.analyzers.findings import AnalysisContext
from gpuprof.analyzers.parts import Parts, exact_sum

__all__ = ["claim_startup", "startup_window"]

MIN_STEPS = 4
"""Steps a run needs before a slow first step can be told from a slow run."""
MAX_WARMUP_STEPS = 2
"""At most this many leading steps count as warm-up."""
WARMUP_RATIO = 1.5
"""A leading step at least this many times the median of the others is warm-up (compilation,
CUDA-graph capture and cache filling take seconds to minutes on the first step)."""


def startup_window(ctx: AnalysisContext | Parts) -> tuple[int, list[int], int | None] | None:
    """``(end_ns, warm-up steps, wind-down start_ns)``: start-up lasts until ``end_ns`` (the
    end of the warm-up steps, else the first step's start), wind-down from the last step's end
    (None without steps); None when the run has no spans."""
    facts = (ctx if isinstance(ctx, Parts) else Parts.of(ctx)).facts
    if facts.first_span_ns is None:
        return None
    per = facts.steps
    if per.empty:
        return facts.first_span_ns, [], None
    end = int(per["start"].iloc[0])
    warmup: list[int] = []
    if len(per) >= MIN_STEPS:
        dur = (per["end"] - per["start"]).to_numpy(np.float64)
        for i in range(min(MAX_WARMUP_STEPS, len(per) - MIN_STEPS + 1)):
            rest = np.median(dur[i + 1 :])
            if rest > 0 and dur[i] >= WARMUP_RATIO * rest:
                warmup.append(int(per.index[i]))
                end = int(per["end"].iloc[i])
            else:
                break
    return end, warmup, int(per["end"].max())


def claim_startup(ctx: AnalysisContext | Parts) -> dict[str, Any] | None:
    """Claim the GPU samples of start-up, warm-up and wind-down (see the module docstring) on
    every part and return the ``startup`` entry of the summary: ``until_ns``, ``seconds``
    (from the first GPU sample), ``gpu_s``, ``idle_gpu_s``, ``warmup_steps``,
    ``wind_down_s``, ``wind_down_idle_gpu_s``; None when there is none."""
    parts = ctx if isinstance(ctx, Parts) else Parts.of(ctx)
    window = startup_window(parts)
    if window is None or parts.facts.t_min_ns is None:
        return None
    end, warmup, last = window
    got = parts.map(_claim, end, last)
    if not any(g is not None for g in got):
        return None
    got = [g for g in got if g is not None]
    t_min, t_max = parts.facts.t_min_ns, parts.facts.t_max_ns
    return {
        "until_ns": end,
        "seconds": round(max(0, end - t_min) / 1e9, 3),
        "gpu_s": round(float(sum(g[0] for g in got)), 3),
        "idle_gpu_s": round(float(sum(g[1] for g in got)), 3),
        "warmup_steps": warmup,
        "wind_down_s": round(max(0, t_max - last) / 1e9, 3) if any(g[3] for g in got) else 0.0,
        "wind_down_idle_gpu_s": round(float(sum(g[2] for g in got)), 3),
    }


def _claim(
    ctx: AnalysisContext, end: int, last: int | None
) -> tuple[float, float, float, bool] | None:
    """One part's samples of start-up (before ``end``) and wind-down (from ``last``) claimed:
    their GPU-seconds and idle GPU-seconds of start-up, idle GPU-seconds of wind-down, and
    whether any sample is in the wind-down; None when none is in either."""
    s = ctx.samples
    if s is None or s.empty:
        return None
    t = s["t_ns"].to_numpy(np.int64)
    before = t < end
    after = t >= last if last is not None else np.zeros(len(t), dtype=bool)
    if not (before.any() or after.any()):
        return None
    ctx.claim(before | after)
    idle = s["idle_gpu_s"].to_numpy(np.float64)
    dt = s["dt_s"].to_numpy(np.float64)
    return (exact_sum(dt[before]), exact_sum(idle[before]), exact_sum(idle[after]),
            bool(after.any()))  # fmt: skip
