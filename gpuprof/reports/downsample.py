"""Reduce long time series to what a browser can draw without hiding the dips.

Two reductions, both vectorised:

- `keep_shape`: per series, the indices of the points to draw, chosen by MinMaxLTTB
  (``tsdownsample``): the min and max of every bucket are candidates, so a one-sample drop to 0%
  utilisation survives a 400:1 reduction, where plain averaging or every-n-th would lose it.
- `bin_stats`: many series pooled onto one regular time grid (mean, min, max per bin), for the
  aggregate lines, the heatmap and link / host rows.

Times are whatever unit the caller passes (the renderer uses seconds since the run start).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from tsdownsample import MinMaxLTTBDownsampler

_MIN_OUT = 4  # tsdownsample needs a few points to pick from


def keep_shape(x: np.ndarray, y: np.ndarray, n_out: int) -> np.ndarray:
    """Indices (sorted) of at most ``n_out`` points of ``(x, y)`` that keep its peaks and dips.

    ``x`` must be increasing. NaN values in ``y`` (metric not measured) are kept out of the
    choice; when they are all NaN no index is returned. A series already short enough comes
    back whole.
    """
    x = np.asarray(x, dtype=np.float64)
    y = np.asarray(y, dtype=np.float64)
    finite = np.flatnonzero(np.isfinite(y))
    if len(finite) <= max(n_out, _MIN_OUT):
        return finite
    xs, ys = x[finite], y[finite]
    picked = MinMaxLTTBDownsampler().downsample(xs, ys, n_out=max(int(n_out), _MIN_OUT))
    return finite[np.sort(picked)]


@dataclass
class Binned:
    """Per-bin statistics on a regular grid: ``centers`` (bin middles), ``mean``, ``min``,
    ``max`` (NaN where no finite sample fell in the bin), ``count`` of samples and ``width``
    (bin width). Arrays are ``(bins,)`` or ``(series, bins)``."""

    centers: np.ndarray
    mean: np.ndarray
    min: np.ndarray
    max: np.ndarray
    count: np.ndarray
    width: float

    def pooled(self) -> Binned:
        """Statistics over all series together (rows of a grouped result merged)."""
        if self.mean.ndim == 1:
            return self
        count = self.count.sum(axis=0)
        total = np.nansum(np.where(self.count > 0, self.mean * self.count, 0.0), axis=0)
        with np.errstate(invalid="ignore", divide="ignore"):
            mean = np.where(count > 0, total / np.maximum(count, 1), np.nan)
        empty = count == 0
        lo = np.where(empty, np.nan, np.fmin.reduce(self.min, axis=0))
        hi = np.where(empty, np.nan, np.fmax.reduce(self.max, axis=0))
        return Binned(self.centers, mean, lo, hi, count, self.width)


def bin_stats(
    t: np.ndarray,
    y: np.ndarray,
    start: float,
    end: float,
    bins: int,
    group: np.ndarray | None = None,
) -> Binned:
    """Pool ``y`` sampled at ``t`` into ``bins`` equal bins over ``[start, end]``.

    With ``group`` (an integer code per sample, 0..G-1) the result arrays are ``(G, bins)``:
    one row per series (the heatmap); without it, one row pooled over all samples. Samples
    already ordered by (group, t) — the renderer's layout — are reduced in one pass
    (``ufunc.reduceat``); other orders are sorted first.
    """
    bins = max(1, int(bins))
    width = (end - start) / bins if end > start else 1.0
    t = np.asarray(t, dtype=np.float64)
    y = np.asarray(y, dtype=np.float64)
    ok = np.isfinite(t) & np.isfinite(y)
    rows = 1 if group is None or not len(group) else int(np.max(group)) + 1
    col = np.clip(((t[ok] - start) / width).astype(np.int64), 0, bins - 1)
    cell = col if group is None else np.asarray(group)[ok].astype(np.int64) * bins + col
    values = y[ok]
    if len(cell) > 1 and (np.diff(cell) < 0).any():
        order = np.argsort(cell, kind="stable")
        cell, values = cell[order], values[order]
    size = rows * bins
    mean, lo, hi = (np.full(size, np.nan) for _ in range(3))
    count = np.zeros(size, dtype=np.int64)
    if len(cell):
        first = np.concatenate([[0], np.flatnonzero(np.diff(cell)) + 1])
        where = cell[first]
        n = np.diff(np.concatenate([first, [len(cell)]]))
        count[where] = n
        mean[where] = np.add.reduceat(values, first) / n
        lo[where] = np.minimum.reduceat(values, first)
        hi[where] = np.maximum.reduceat(values, first)
    centers = start + (np.arange(bins) + 0.5) * width
    if group is not None:
        shape = (rows, bins)
        return Binned(centers, mean.reshape(shape), lo.reshape(shape), hi.reshape(shape),
                      count.reshape(shape), width)  # fmt: skip
    return Binned(centers, mean, lo, hi, count, width)
