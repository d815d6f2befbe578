"""Interval arithmetic on half-open ``[start, end)`` intervals of integer nanoseconds.

One implementation shared by the importers (busy time of a trace), the analyzers (idle time
inside phases, evidence intervals) and the renderers (phase bands, finding tracks). Everything
is vectorised with numpy; inputs need not be sorted.
"""

from __future__ import annotations

import numpy as np

__all__ = ["covered_ns", "difference", "in_union", "top_intervals", "union"]


def union(starts: np.ndarray, ends: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The sorted, disjoint intervals covering ``[starts, ends)``; touching ones are merged.

    Returns ``(starts, ends)`` of the union, in the dtype of the inputs.
    """
    starts = np.asarray(starts)
    ends = np.asarray(ends)
    if len(starts) == 0:
        return starts[:0], ends[:0]
    order = np.argsort(starts, kind="stable")
    s, e = starts[order], ends[order]
    reach = np.maximum.accumulate(e)
    new = np.empty(len(s), dtype=bool)
    new[0] = True
    new[1:] = s[1:] > reach[:-1]
    first = np.flatnonzero(new)
    return s[first], np.maximum.reduceat(e, first)


def covered_ns(starts: np.ndarray, ends: np.ndarray) -> int:
    """Total time (ns) covered by the union of ``[starts, ends)``."""
    s, e = union(starts, ends)
    return int((e - s).sum())


def in_union(t: np.ndarray, starts: np.ndarray, ends: np.ndarray) -> np.ndarray:
    """For each instant of ``t``: whether it lies inside the union of the intervals."""
    t = np.asarray(t)
    if len(starts) == 0 or len(t) == 0:
        return np.zeros(len(t), dtype=bool)
    s, e = union(starts, ends)
    i = np.searchsorted(s, t, side="right") - 1
    return (i >= 0) & (t < e[np.clip(i, 0, len(e) - 1)])


def top_intervals(
    starts: np.ndarray, ends: np.ndarray, weight: np.ndarray | None = None, n: int = 20
) -> list[list[int]]:
    """Up to ``n`` intervals as ``[[start_ns, end_ns], …]``: the heaviest by ``weight``
    (default: the longest), listed in time order."""
    if len(starts) == 0:
        return []
    w = (np.asarray(ends) - np.asarray(starts)).astype(np.float64) if weight is None else weight
    keep = np.argsort(-np.asarray(w, dtype=np.float64), kind="stable")[:n]
    keep = keep[np.argsort(np.asarray(starts)[keep], kind="stable")]
    return [[int(starts[i]), int(ends[i])] for i in keep]


def difference(
    starts: np.ndarray, ends: np.ndarray, cut_starts: np.ndarray, cut_ends: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """The union of ``[starts, ends)`` less the union of ``[cut_starts, cut_ends)``, as sorted
    disjoint intervals."""
    s, e = union(starts, ends)
    cs, ce = union(cut_starts, cut_ends)
    if len(s) == 0 or len(cs) == 0:
        return s, e
    # boundaries of both unions on one line; a point is kept while inside s/e and outside cs/ce
    points = np.concatenate([s, e, cs, ce])
    delta = np.concatenate(
        [np.ones(len(s)), -np.ones(len(e)), -np.ones(len(cs)) * 2, np.ones(len(ce)) * 2]
    ).astype(np.int64)
    order = np.lexsort((delta, points))  # at one instant, ends and cut starts apply first
    points, level = points[order], np.cumsum(delta[order])
    # kept where level == 1 (inside the base, outside every cut: cuts count -2 each)
    keep = level == 1
    out_s = points[:-1][keep[:-1]]
    out_e = points[1:][keep[:-1]]
    nonempty = out_e > out_s
    return union(out_s[nonempty], out_e[nonempty])
