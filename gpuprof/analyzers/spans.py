"""The run's span timeline: which spans are usable, and which phase a process was in at an instant.

A span covers ``[start_ns, end_ns)``. `valid_spans` drops the spans nothing can be done with
(no host/pid/start/end, ending before they start) and recomputes their nesting ``depth``;
`_label` gives, for instants of one process, its innermost (deepest) covering span's phase and
step — ``"step"`` (`STEP_PHASE`) only where no other span covers the instant, ``"(none)"``
(`NO_PHASE`) outside every span. Both are vectorised: loops run over nesting depths, never over
spans or instants.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd

from gpuprof.model import Run, span_depths

NO_PHASE = "(none)"
"""Phase label of a sample no span of its owner covers (or of a GPU without an owner)."""

STEP_PHASE = "step"
"""The whole-step phase: it only labels a sample when no other span covers it."""

_MAX_DEPTH_LEVELS = 32  # deeper levels are merged into one (see `_innermost`)


# --------------------------------------------------------------------------------------------
# Input clean-up


def _num(
    frame: pd.DataFrame, name: str, rows: np.ndarray | None = None, dtype: Any = np.float64
) -> np.ndarray:
    """A column as a numpy array of ``dtype`` (its ``rows`` when given); missing column or
    junk → NaN."""
    if name not in frame:
        return np.full(len(frame) if rows is None else len(rows), np.nan)
    column = frame[name]
    if rows is not None and column.dtype in (np.float64, np.int64):  # no coercion needed
        return column.to_numpy().take(rows).astype(dtype, copy=False)
    values = pd.to_numeric(column, errors="coerce").to_numpy(dtype=dtype, na_value=np.nan)
    return values if rows is None else values[rows]


def valid_spans(run: Run) -> tuple[pd.DataFrame, int]:
    """The run's usable spans and how many were dropped.

    Dropped: spans without host/pid/start/end and spans ending before they start (clock
    trouble or a bad import). The rest get ``depth`` recomputed from their nesting within
    their thread (hand-built or imported frames may carry none) and ``is_step``.
    """
    spans = run.spans
    if spans is None or len(spans) == 0:
        return _empty_spans(), 0
    start = _num(spans, "start_ns")
    end = _num(spans, "end_ns")
    ok = np.isfinite(start) & np.isfinite(end)
    # compare as int64: float64 can't tell apart instants < 256 ns apart at epoch magnitudes
    start_i = np.where(ok, start, 0).astype(np.int64)
    end_i = np.where(ok, end, 0).astype(np.int64)
    if spans["start_ns"].dtype == np.int64 and spans["end_ns"].dtype == np.int64:
        start_i, end_i = spans["start_ns"].to_numpy(), spans["end_ns"].to_numpy()
    ok &= end_i >= start_i
    ok &= spans["host"].notna().to_numpy() & np.isfinite(_num(spans, "pid"))
    dropped = int((~ok).sum())
    kept = spans.loc[ok]
    out = pd.DataFrame(
        {
            "host": kept["host"].astype(object).to_numpy(),
            "pid": _num(kept, "pid").astype(np.int64),
            "tid": _num(kept, "tid"),
            "rank": _num(kept, "rank"),
            "local_rank": _num(kept, "local_rank"),
            "phase": kept["phase"].astype(object).fillna("(unnamed)").to_numpy()
            if "phase" in kept
            else np.full(len(kept), "(unnamed)", dtype=object),
            "step": _num(kept, "step"),
            # int64 ns: float64 would lose sub-microsecond precision at epoch magnitudes
            "start_ns": pd.to_numeric(kept["start_ns"]).to_numpy(np.int64),
            "end_ns": pd.to_numeric(kept["end_ns"]).to_numpy(np.int64),
        }
    )
    out["depth"] = span_depths(out) if len(out) else np.zeros(0, dtype=np.int64)
    out["is_step"] = (out["phase"] == STEP_PHASE).to_numpy(bool)
    return out, dropped


def _empty_spans() -> pd.DataFrame:
    return pd.DataFrame(
        {
            "host": pd.Series([], dtype=object),
            "pid": pd.Series([], dtype=np.int64),
            **{c: pd.Series([], dtype=np.float64) for c in ("tid", "rank", "local_rank")},
            "phase": pd.Series([], dtype=object),
            "step": pd.Series([], dtype=np.float64),
            "start_ns": pd.Series([], dtype=np.int64),
            "end_ns": pd.Series([], dtype=np.int64),
            "depth": pd.Series([], dtype=np.int64),
            "is_step": pd.Series([], dtype=bool),
        }
    )


# --------------------------------------------------------------------------------------------
# Innermost span lookup


def _cover(starts: np.ndarray, ends: np.ndarray, t: np.ndarray) -> np.ndarray:
    """For spans sorted by start, the index of a span covering each time in ``t`` (-1: none).

    Prefers the latest-starting span (within one thread and depth spans are disjoint, so it is
    the only candidate); when that one has already ended, an earlier span may still cover
    ``t`` (spans of several threads overlap): the one reaching furthest, found with a running
    maximum of the end times, covers ``t`` whenever any span does.
    """
    if len(starts) == 0:
        return np.full(len(t), -1, dtype=np.int64)
    idx = np.searchsorted(starts, t, side="right") - 1
    ok = idx >= 0
    idx0 = np.where(ok, idx, 0)
    hit = ok & (t < ends[idx0])
    run_max = np.maximum.accumulate(ends)
    pos = np.arange(len(ends))
    reach = np.maximum.accumulate(np.where(ends == run_max, pos, 0))[idx0]
    hit_late = ok & ~hit & (t < ends[reach])
    return np.where(hit, idx0, np.where(hit_late, reach, -1))


def _innermost(spans: pd.DataFrame | dict, t: np.ndarray, step: bool) -> np.ndarray:
    """Row position in ``spans`` of the deepest span covering each time (-1: none), among
    the ``step`` spans (``step=True``) or the others. Loops over nesting depths only.
    ``spans``: a frame, or its ``is_step``, ``depth``, ``start_ns``, ``end_ns`` as arrays."""
    chosen = np.full(len(t), -1, dtype=np.int64)
    positions = np.flatnonzero(np.asarray(spans["is_step"]) == step)
    if len(positions) == 0 or len(t) == 0:
        return chosen
    # async code (many requests in flight on one event-loop thread) yields overlapping spans
    # whose derived "depth" is the number in flight — possibly thousands of levels; merging
    # the deepest levels bounds the loop, and `_cover` still finds a covering span there
    depth = np.minimum(np.asarray(spans["depth"])[positions], _MAX_DEPTH_LEVELS - 1)
    all_starts = np.asarray(spans["start_ns"])[positions]
    all_ends = np.asarray(spans["end_ns"])[positions]
    for d in np.unique(depth)[::-1]:  # deepest first: it wins wherever it covers
        mask = depth == d
        pos = positions[mask]
        starts = all_starts[mask]
        ends = all_ends[mask]
        order = np.argsort(starts, kind="stable")
        found = _cover(starts[order], ends[order], t)
        take = (chosen < 0) & (found >= 0)
        chosen[take] = pos[order[found[take]]]
    return chosen


def _label(spans: pd.DataFrame | dict, t: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Phase (object array, ``"(none)"`` outside spans), step (float, NaN unknown) and an
    in-span flag for each time in ``t``, from one process's spans (a frame, or its columns as
    arrays)."""
    n = len(t)
    phase = np.full(n, NO_PHASE, dtype=object)
    step = np.full(n, np.nan)
    if len(spans["start_ns"]) == 0 or n == 0:
        return phase, step, np.zeros(n, dtype=bool)
    span_phase = np.asarray(spans["phase"], dtype=object)
    inner = _innermost(spans, t, step=False)
    whole = _innermost(spans, t, step=True)
    has_inner, has_whole = inner >= 0, whole >= 0
    phase[has_whole] = STEP_PHASE
    phase[has_inner] = span_phase[inner[has_inner]]
    step, covered = _steps(spans, inner, whole)
    return phase, step, covered


def _steps(
    spans: pd.DataFrame | dict, inner: np.ndarray, whole: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """Step number (the phase span's own, else the enclosing step span's; NaN unknown) and
    in-span flag, from `_innermost` positions of the phase (``inner``) and step (``whole``)
    span covering each time."""
    span_step = np.asarray(spans["step"], dtype=np.float64)
    has_inner, has_whole = inner >= 0, whole >= 0
    step = np.where(has_whole, span_step[np.maximum(whole, 0)], np.nan)
    inner_step = np.where(has_inner, span_step[np.maximum(inner, 0)], np.nan)
    step = np.where(np.isnan(inner_step), step, inner_step)
    return step, has_inner | has_whole
