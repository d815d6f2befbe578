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
import pandas as pd
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
    ``max`` (NaN where no finite sample fell in the bin) and ``width`` (bin width)."""

    centers: np.ndarray
    mean: np.ndarray
    min: np.ndarray
    max: np.ndarray
    width: float


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
    one row per series (the heatmap); without it, one row pooled over all samples.
    """
    bins = max(1, int(bins))
    width = (end - start) / bins if end > start else 1.0
    t = np.asarray(t, dtype=np.float64)
    y = np.asarray(y, dtype=np.float64)
    ok = np.isfinite(t) & np.isfinite(y)
    col = np.clip(((t[ok] - start) / width).astype(np.int64), 0, bins - 1)
    rows = 1 if group is None else int(group.max()) + 1 if len(group) else 1
    row = np.zeros(len(col), dtype=np.int64) if group is None else np.asarray(group)[ok]
    cell = row * bins + col
    shape = (rows, bins)
    size = rows * bins
    frame = pd.DataFrame({"cell": cell, "y": y[ok]})
    stats = frame.groupby("cell", sort=False)["y"].agg(["mean", "min", "max"])
    out = {name: np.full(size, np.nan) for name in ("mean", "min", "max")}
    index = stats.index.to_numpy(np.int64)
    for name in out:
        out[name][index] = stats[name].to_numpy()
    centers = start + (np.arange(bins) + 0.5) * width
    reshape = (lambda a: a.reshape(shape)) if group is not None else (lambda a: a)
    return Binned(centers, reshape(out["mean"]), reshape(out["min"]), reshape(out["max"]), width)
