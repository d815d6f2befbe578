"""The run's span timeline: which spans are usable, and which phase a process was in at an instant.

A span covers ``[start_ns, end_ns)``. `valid_spans` drops the spans nothing can be done with
(no host/pid/start/end, ending before they start) and recomputes their nesting ``depth`` and
their ``self_ns`` (`self_ns`: the time each is its process's innermost span — what every sum
of phase time adds);
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
    if not (isinstance(column.dtype, np.dtype) and column.dtype.kind in "iuf"):
        column = pd.to_numeric(column, errors="coerce")  # numbers already: as they are
    values = column.to_numpy(dtype=dtype, na_value=np.nan)
    return values if rows is None else values[rows]


def valid_spans(run: Run) -> tuple[pd.DataFrame, int]:
    """The run's usable spans and how many were dropped.

    Dropped: spans without host/pid/start/end and spans ending before they start (clock
    trouble or a bad import). The rest get ``depth`` recomputed from their nesting within
    their thread (hand-built or imported frames may carry none), ``is_step`` and ``self_ns``
    (`self_ns`).
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
    out["self_ns"] = self_ns(out)
    return out, dropped


def _empty_spans() -> pd.DataFrame:
    """`valid_spans` of a run without spans: the columns, empty (numpy arrays of each dtype:
    a frame of empty Series costs a millisecond)."""
    dtypes = {"host": object, "pid": np.int64, "tid": np.float64, "rank": np.float64,
              "local_rank": np.float64, "phase": object, "step": np.float64,
              "start_ns": np.int64, "end_ns": np.int64, "depth": np.int64, "is_step": bool,
              "self_ns": np.int64}  # fmt: skip
    return pd.DataFrame({c: np.zeros(0, dtype=t) for c, t in dtypes.items()})


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


# --------------------------------------------------------------------------------------------
# Self time: each instant of a process belongs to its innermost span


def owned_segments(
    spans: pd.DataFrame, in_step: bool = False, axis: tuple | None = None
) -> tuple[np.ndarray, ...]:
    """Each process's timeline cut where its innermost span changes: ``(start_ns, end_ns,
    owner)``, ``owner`` the row position in ``spans`` of the span that owns the segment — the
    innermost phase span covering it (`_label`'s rule), else the step span; segments no span
    covers are left out. Segments of one process are disjoint, so a phase's segments add up to
    its **self time**: its spans less the spans of other phases nested in them, a phase nested
    in itself counted once.

    ``spans``: `valid_spans` rows (``host``, ``pid``, ``start_ns``, ``end_ns``, ``depth``,
    ``is_step``). Vectorised over every process at once: each process's times are moved onto
    a stretch of one axis of their own, so no loop runs over processes or spans.
    ``in_step``: also return, per segment, whether a step span of its process covers it.
    ``axis``: `_shared_axis` of ``spans`` when the caller has made it.
    """
    n = len(spans)
    empty = np.zeros(0, dtype=np.int64)
    nothing = (empty, empty, empty, np.zeros(0, bool)) if in_step else (empty, empty, empty)
    if n == 0:
        return nothing
    axis = axis or _shared_axis(spans)
    if axis is None:  # processes too far apart for one axis: one by one
        return _segments_by_process(spans, in_step)
    s, e, proc, shift = axis
    columns = {"start_ns": s, "end_ns": e, "depth": spans["depth"].to_numpy(np.int64),
               "is_step": spans["is_step"].to_numpy(bool)}  # fmt: skip
    points = np.sort(np.concatenate([s, e]))  # sorted, then distinct: cheaper than np.unique
    points = points[np.concatenate([[True], points[1:] != points[:-1]])]
    if len(points) < 2:
        return nothing
    t = points[:-1]
    inner = _innermost(columns, t, step=False)
    whole = _innermost(columns, t, step=True)
    owner = np.where(inner >= 0, inner, whole)
    keep = owner >= 0
    owner, seg_s, seg_e = owner[keep], t[keep], points[1:][keep]
    back = shift[proc[owner]]
    if in_step:
        return seg_s - back, seg_e - back, owner, whole[keep] >= 0
    return seg_s - back, seg_e - back, owner


def _shared_axis(
    spans: pd.DataFrame,
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray] | None:
    """The spans' times on one axis where each process has a stretch of its own: ``(start,
    end, process code, shift)`` with ``start = start_ns + shift[process]``; None when the
    processes' stretches would not fit in int64."""
    start = spans["start_ns"].to_numpy(np.int64)
    end = spans["end_ns"].to_numpy(np.int64)
    proc = spans.groupby(["host", "pid"], sort=False, dropna=False).ngroup().to_numpy(np.int64)
    n_proc = int(proc.max()) + 1
    lo = np.full(n_proc, np.iinfo(np.int64).max, dtype=np.int64)
    hi = np.full(n_proc, np.iinfo(np.int64).min, dtype=np.int64)
    np.minimum.at(lo, proc, start)
    np.maximum.at(hi, proc, end)
    if float((hi - lo + 1).astype(np.float64).sum()) >= 2.0**62:
        return None
    offset = np.zeros(n_proc, dtype=np.int64)
    offset[1:] = np.cumsum((hi - lo + 1)[:-1])
    shift = offset - lo
    return start + shift[proc], end + shift[proc], proc, shift


def _segments_by_process(spans: pd.DataFrame, in_step: bool) -> tuple[np.ndarray, ...]:
    proc = spans.groupby(["host", "pid"], sort=False, dropna=False).ngroup().to_numpy(np.int64)
    parts = []
    for p in range(int(proc.max()) + 1):
        rows = np.flatnonzero(proc == p)
        got = owned_segments(spans.iloc[rows], in_step)
        parts.append((got[0], got[1], rows[got[2]], *got[3:]))
    return tuple(np.concatenate([p[i] for p in parts]) for i in range(len(parts[0])))


def _flat_self(spans: pd.DataFrame, axis: tuple) -> tuple[np.ndarray, np.ndarray] | None:
    """`self_ns` and `self_in_steps_ns` the quick way when no process's phase spans overlap
    one another and neither do its step spans (the usual shape: phases side by side inside
    steps); None otherwise. A phase span's self time is then its length, a step's is its
    length less the phase time inside it. ``axis``: `_shared_axis` of ``spans``."""
    s, e = axis[0], axis[1]
    is_step = spans["is_step"].to_numpy(bool)
    flat = []
    for mask in (~is_step, is_step):
        rows = np.flatnonzero(mask)
        rows = rows[np.argsort(s[rows], kind="stable")]  # processes lie apart on the axis
        if len(rows) > 1 and bool((s[rows][1:] < e[rows][:-1]).any()):
            return None  # overlapping (nested) spans of one kind: the full computation
        flat.append((s[rows], e[rows]))
    length = e - s
    own = length.copy()
    own[is_step] -= _covered(*flat[0], s[is_step], e[is_step])
    in_step = own.copy()
    in_step[~is_step] = _covered(*flat[1], s[~is_step], e[~is_step])
    return own, in_step


def _covered(starts: np.ndarray, ends: np.ndarray, a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """How much of each ``[a, b)`` the sorted disjoint intervals ``[starts, ends)`` cover."""
    if len(starts) == 0 or len(a) == 0:
        return np.zeros(len(a), dtype=np.int64)
    cum = np.concatenate([[0], np.cumsum(ends - starts)])

    def before(x: np.ndarray) -> np.ndarray:  # covered time before each instant of x
        k = np.searchsorted(starts, x, side="right") - 1
        kk = np.maximum(k, 0)
        inside = np.clip(x - starts[kk], 0, ends[kk] - starts[kk])
        return np.where(k >= 0, cum[kk] + inside, 0)

    return before(b) - before(a)


def self_times(spans: pd.DataFrame) -> tuple[np.ndarray, np.ndarray]:
    """`self_ns` and `self_in_steps_ns` of ``spans`` in one pass."""
    n = len(spans)
    if n == 0:
        return np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64)
    axis = _shared_axis(spans)
    flat = _flat_self(spans, axis) if axis is not None else None
    if flat is not None:
        return flat
    s, e, owner, inside = owned_segments(spans, in_step=True, axis=axis)
    # float sums are exact while a span's self time stays under 2**53 ns (104 days)
    own = np.bincount(owner, weights=e - s, minlength=n)
    in_steps = np.bincount(owner, weights=np.where(inside, e - s, 0), minlength=n)
    return np.rint(own).astype(np.int64), np.rint(in_steps).astype(np.int64)


def self_ns(spans: pd.DataFrame) -> np.ndarray:
    """Each span's self time in ns (int64): the time in which it is its process's innermost
    span (`owned_segments`). A phase's self times add up to the time its process spent in it
    and nowhere deeper; a step span's is the step time no phase covers. ``spans``: as for
    `owned_segments`."""
    return self_times(spans)[0]


def self_in_steps_ns(spans: pd.DataFrame) -> np.ndarray:
    """Each span's self time (ns, int64) inside its process's step spans: `self_ns` less what
    lies outside every step (a phase a framework times after its step timer has stopped)."""
    return self_times(spans)[1]
