"""Integer group codes and per-group counts over sample arrays, in numpy.

The analyzers group hundreds of thousands of GPU samples by time bin, by GPU and by both;
``pandas`` ``groupby(...).transform("sum")`` builds (and sorts) a group index each time, which
made those group-bys the slowest part of a diagnosis. Here a group is a dense integer code
(``0 .. n-1``) computed once, and a per-group sum is one ``np.bincount``. Codes are dense
offsets when the values span a small range (time bins, GPU numbers) and hash-factorized
otherwise, so a few far-apart values never allocate a huge count array.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import pandas as pd

_DENSE_SLACK = 1024
"""A value range up to ``4 · len + _DENSE_SLACK`` is counted as offsets, not factorized."""


def dense_codes(values: np.ndarray) -> tuple[np.ndarray, int]:
    """Codes ``0 .. n-1`` (int64) that are equal exactly where integer ``values`` are, and n.

    Not necessarily consecutive: offsets from the minimum when the range is small (then n is
    the range), else the order of first appearance.
    """
    values = np.asarray(values)
    if len(values) == 0:
        return np.zeros(0, dtype=np.int64), 0
    lo, hi = int(values.min()), int(values.max())
    if hi - lo <= 4 * len(values) + _DENSE_SLACK:
        return values.astype(np.int64) - lo, hi - lo + 1
    codes, uniques = pd.factorize(values)
    return codes.astype(np.int64, copy=False), len(uniques)


def stable_order(keys: np.ndarray | pd.Series) -> np.ndarray:
    """The permutation ``np.argsort(keys, kind="stable")`` gives for text keys (processes'
    ``host:pid``, one per step row), found by sorting the distinct keys alone: an argsort of
    Python strings compares objects, ~0.7 s for the 1.8 M step rows of a cluster-day."""
    keys = np.asarray(keys, dtype=object)
    if len(keys) < 2:
        return np.arange(len(keys))
    codes, _ = pd.factorize(keys, sort=True)
    return np.argsort(codes, kind="stable")


def appearance_codes(
    columns: Sequence[np.ndarray | pd.Series], missing_is_value: bool = False
) -> np.ndarray:
    """For rows given as parallel columns: the group number of each row's combination of
    values, numbered in order of first appearance; -1 where any value is missing (as
    ``DataFrame.groupby(columns, sort=False, observed=True).ngroup()``), or with
    ``missing_is_value`` a missing value is a value like the others (as
    ``DataFrame.drop_duplicates`` sees them)."""
    n = len(columns[0]) if len(columns) else 0
    if n == 0:
        return np.zeros(0, dtype=np.int64)
    key = np.zeros(n, dtype=np.int64)
    span = 1  # the combined key is below this
    valid = np.ones(n, dtype=bool)
    for column in columns:
        codes = _codes(column)
        if missing_is_value:
            codes = np.where(codes < 0, int(codes.max(initial=-1)) + 1, codes)
        valid &= codes >= 0
        width = max(int(codes.max()) + 1 if len(codes) else 0, 1)
        if span * width >= 2**62:  # renumber the key so far before it could overflow
            key = pd.factorize(key)[0].astype(np.int64)
            span = int(key.max()) + 1
        key = key * width + np.maximum(codes, 0)
        span *= width
    out = np.full(n, -1, dtype=np.int64)
    out[valid] = _factorize(key[valid])
    return out


def group_rows(columns: Sequence[np.ndarray | pd.Series]) -> dict[tuple, np.ndarray]:
    """For rows given as parallel key columns: each combination of values (a tuple) → the
    positions of its rows, ascending; rows with a missing value are in none. What
    ``DataFrame.groupby(columns, sort=False).indices`` gives, without building a group-by
    (a few hundred microseconds each on a small run's spans)."""
    codes = appearance_codes(columns)
    first = first_rows(codes)
    if not len(first):
        return {}
    valid = np.flatnonzero(codes >= 0)
    order = valid[np.argsort(codes[valid], kind="stable")]
    ends = np.cumsum(np.bincount(codes[valid], minlength=len(first)))
    values = [(c.to_numpy() if isinstance(c, pd.Series) else np.asarray(c))[first] for c in columns]
    return dict(zip(zip(*values), np.split(order, ends[:-1])))


def inner_join_rows(
    left: Sequence[np.ndarray | pd.Series], right: Sequence[np.ndarray | pd.Series]
) -> tuple[np.ndarray, np.ndarray]:
    """The row pairs of an inner join on parallel key columns, as positions into the left and
    the right rows: each left row in order, with its matching right rows in theirs, a missing
    value matching a missing value — the rows ``left.merge(right, on=keys, how="inner")``
    pairs, without building either frame."""
    nl = len(left[0]) if len(left) else 0
    columns = [_joined(_values(a), _values(b)) for a, b in zip(left, right)]
    codes = appearance_codes(columns, missing_is_value=True)
    lc, rc = codes[:nl], codes[nl:]
    n = int(codes.max(initial=-1)) + 1
    order = np.argsort(rc, kind="stable")
    counts = np.bincount(rc, minlength=n)
    starts = np.cumsum(counts) - counts
    each = counts[lc]
    left_rows = np.repeat(np.arange(nl), each)
    # the k-th match of a left row is its key's k-th right row
    k = np.arange(len(left_rows)) - np.repeat(np.cumsum(each) - each, each)
    return left_rows, order[np.repeat(starts[lc], each) + k]


def isin_rows(
    left: Sequence[np.ndarray | pd.Series], right: Sequence[np.ndarray | pd.Series]
) -> np.ndarray:
    """Per left row (parallel key columns): whether its combination of values is one of the
    right rows' — ``MultiIndex.from_arrays(left).isin(MultiIndex.from_arrays(right))`` — on
    integer codes of both."""
    n = len(left[0]) if len(left) else 0
    columns = [_joined(_values(a), _values(b)) for a, b in zip(left, right)]
    codes = appearance_codes(columns, missing_is_value=True)
    return np.isin(codes[:n], codes[n:])


def _values(column: np.ndarray | pd.Series) -> np.ndarray:
    return column.to_numpy() if isinstance(column, pd.Series) else np.asarray(column)


def _joined(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Two key columns end to end: numbers as numbers (a value equals its equal whatever the
    side's dtype), anything else as Python objects."""
    if a.dtype.kind in "iuf" and b.dtype.kind in "iuf":
        return np.concatenate([a, b])
    return np.concatenate([a.astype(object), b.astype(object)])


def first_valid(group: np.ndarray, n: int, values: np.ndarray) -> np.ndarray:
    """Per group (codes ``0…n-1``) its first value that is not NaN, in row order (NaN when
    none is): a group-by's ``first``."""
    out = np.full(n, np.nan)
    ok = np.flatnonzero(~np.isnan(values))
    codes, first = np.unique(group[ok], return_index=True)
    out[codes] = values[ok[first]]
    return out


def group_medians(group: np.ndarray, n: int, values: np.ndarray) -> np.ndarray:
    """Per group (codes ``0…n-1``) the median of its values that are not NaN (NaN: none),
    as a group-by's ``median``: the middle value, or the mean of the two middle ones."""
    out = np.full(n, np.nan)
    ok = np.flatnonzero(~np.isnan(values))
    if not len(ok):
        return out
    order = ok[np.lexsort((values[ok], group[ok]))]
    g, v = group[order], values[order]
    counts = np.bincount(g, minlength=n)
    starts = np.cumsum(counts) - counts
    has = np.flatnonzero(counts)
    lo = starts[has] + (counts[has] - 1) // 2
    hi = starts[has] + counts[has] // 2
    out[has] = np.where(lo == hi, v[lo], (v[lo] + v[hi]) / 2)
    return out


def _codes(column: np.ndarray | pd.Series) -> np.ndarray:
    """Codes of one column's values (-1: missing), categorical codes as they are."""
    if isinstance(column, pd.Series) and isinstance(column.dtype, pd.CategoricalDtype):
        return column.cat.codes.to_numpy(np.int64)
    values = column.to_numpy() if isinstance(column, pd.Series) else np.asarray(column)
    if values.dtype.kind in "iu":  # integers have no missing value: offsets, no hashing
        return dense_codes(values)[0]
    return _factorize(values)


def _factorize(values: np.ndarray) -> np.ndarray:
    """``pd.factorize(values)[0]`` (codes in order of first appearance, -1 for missing), found
    on the runs of equal neighbours when there are few (samples come grouped by GPU, so GPU
    and owner keys change a handful of times in 10⁵–10⁶ rows): the run values are factorized
    and their codes spread over the runs, without hashing every row."""
    n = len(values)
    if n > 64 and values.dtype.kind in "iuf":
        change = values[1:] != values[:-1]
        if values.dtype.kind == "f":  # NaN equals NaN here: one run of missing values
            change &= ~(np.isnan(values[1:]) & np.isnan(values[:-1]))
        runs = int(change.sum()) + 1
        if runs <= n // 8:
            first = np.concatenate([[0], np.flatnonzero(change) + 1])
            run_codes = pd.factorize(values[first])[0]
            return np.repeat(run_codes, np.diff(np.append(first, n))).astype(np.int64)
    return pd.factorize(values)[0].astype(np.int64, copy=False)


def asof_backward(
    left_t: np.ndarray,
    right_t: np.ndarray,
    tolerance: int,
    left_keys: Sequence[np.ndarray] = (),
    right_keys: Sequence[np.ndarray] = (),
) -> np.ndarray:
    """For each left row, the position in the right rows of the one with the same keys and
    the latest ``right_t <= left_t``, at most ``tolerance`` before it; -1 where there is none
    or a key is missing. Of several right rows at that instant, the last (in their order).

    What ``pandas.merge_asof(left, right, on=t, by=keys, direction="backward",
    tolerance=tolerance)`` picks when ``right`` is stable-sorted by time, without building
    either frame: the keys become integer codes and one search places every row.
    """
    left_t = np.asarray(left_t, dtype=np.int64)
    right_t = np.asarray(right_t, dtype=np.int64)
    nl, nr = len(left_t), len(right_t)
    out = np.full(nl, -1, dtype=np.int64)
    if nl == 0 or nr == 0:
        return out
    if len(left_keys):
        codes = appearance_codes(
            [np.concatenate([np.asarray(a), np.asarray(b)]) for a, b in zip(left_keys, right_keys)]
        )
        lc, rc = codes[:nl], codes[nl:]
    else:
        lc, rc = np.zeros(nl, dtype=np.int64), np.zeros(nr, dtype=np.int64)
    rows = np.flatnonzero(rc >= 0)
    rows = rows[np.lexsort((right_t[rows], rc[rows]))]  # by key, then time; stable
    queries = np.flatnonzero(lc >= 0)
    if len(rows) == 0 or len(queries) == 0:
        return out
    lo = min(int(right_t.min()), int(left_t[queries].min()))
    width = max(int(right_t.max()), int(left_t[queries].max())) - lo + 1
    n_codes = int(max(rc.max(), lc.max())) + 1
    if n_codes * width < 2**62:  # key and time in one int64: one search for every row
        placed = rc[rows] * width + (right_t[rows] - lo)
        wanted = lc[queries] * width + (left_t[queries] - lo)
        at = np.searchsorted(placed, wanted, side="right") - 1
        hit = at >= 0
        cand = rows[np.maximum(at, 0)]
        hit &= rc[cand] == lc[queries]
    else:  # times too far apart to share an int64 with the key: one search per key
        hit = np.zeros(len(queries), dtype=bool)
        cand = np.zeros(len(queries), dtype=np.int64)
        bounds = np.searchsorted(rc[rows], np.arange(n_codes + 1))
        for code in np.unique(lc[queries]):
            mine = np.flatnonzero(lc[queries] == code)
            seg = rows[bounds[code] : bounds[code + 1]]
            at = np.searchsorted(right_t[seg], left_t[queries[mine]], side="right") - 1
            hit[mine] = at >= 0
            cand[mine] = seg[np.maximum(at, 0)] if len(seg) else 0
    hit &= left_t[queries] - right_t[cand] <= tolerance
    out[queries[hit]] = cand[hit]
    return out


def first_rows(codes: np.ndarray) -> np.ndarray:
    """Positions of the first row of each group, in group order (``codes`` numbered in order
    of first appearance, as `appearance_codes` gives them; -1 skipped): where a code exceeds
    every code before it."""
    valid = np.flatnonzero(codes >= 0)
    c = codes[valid]
    new = np.ones(len(c), dtype=bool)
    new[1:] = c[1:] > np.maximum.accumulate(c)[:-1]
    return valid[new]


def time_bins(t_ns: np.ndarray, dt_s: np.ndarray) -> np.ndarray:
    """Each sample's time bin: samples of all GPUs binned on the median sampling period (1 s
    when unknown), counted from the first sample."""
    period_ns = float(np.nanmedian(dt_s)) * 1e9 if np.isfinite(dt_s).any() else 0.0
    if not np.isfinite(period_ns) or period_ns <= 0:
        period_ns = 1e9
    return np.round((t_ns - t_ns.min()) / period_ns).astype(np.int64)


class BinGroups:
    """Samples grouped by time bin and by (time bin, GPU), for counts over *other* GPUs.

    ``bins`` and ``gpu`` are integer arrays, one value per sample (any integers: GPU -1 is a
    GPU like the others). Built once, `others` then costs two ``np.bincount``.
    """

    def __init__(self, bins: np.ndarray, gpu: np.ndarray) -> None:
        bins = np.asarray(bins)
        gpu = np.asarray(gpu)
        self.bin, self.n_bins = dense_codes(bins)
        gpu_code, n_gpus = dense_codes(gpu)
        if self.n_bins * max(n_gpus, 1) <= 4 * len(bins) + _DENSE_SLACK:
            self.pair, self.n_pairs = self.bin * n_gpus + gpu_code, self.n_bins * n_gpus
        else:
            self.pair, self.n_pairs = dense_codes(self.bin * n_gpus + gpu_code)

    def others(self, flag: np.ndarray) -> np.ndarray:
        """For each sample: the sum of ``flag`` over the samples of OTHER GPUs in its time bin
        (int64; a bool flag counts them)."""
        flag = np.asarray(flag)
        if len(flag) == 0:
            return np.zeros(0, dtype=np.int64)
        if flag.dtype == bool:
            in_bin = np.bincount(self.bin[flag], minlength=self.n_bins)
            own = np.bincount(self.pair[flag], minlength=self.n_pairs)
        else:
            w = flag.astype(np.int64)
            in_bin = np.zeros(self.n_bins, dtype=np.int64)
            own = np.zeros(self.n_pairs, dtype=np.int64)
            np.add.at(in_bin, self.bin, w)
            np.add.at(own, self.pair, w)
        return (in_bin[self.bin] - own[self.pair]).astype(np.int64, copy=False)


def label_codes(column: pd.Series) -> tuple[np.ndarray, list]:
    """A label column as integer codes (-1: missing) and the labels they stand for: the
    categories of a categorical column as they are, else the labels in order of appearance.
    ``codes == names.index(x)`` is ``column == x``, without comparing strings row by row."""
    if isinstance(column.dtype, pd.CategoricalDtype):
        return column.cat.codes.to_numpy(np.int64), list(column.cat.categories)
    codes, uniques = pd.factorize(column, use_na_sentinel=True)
    return codes.astype(np.int64, copy=False), list(uniques)


def per_frame(owner: object, frame: pd.DataFrame, name: str, compute: Callable[[], Any]) -> Any:
    """``compute()`` once per ``frame`` object, kept on ``owner`` (an analysis context): the
    frame is held with the value, so its ``id`` can't be reused by another frame meanwhile."""
    cache = owner.__dict__.setdefault("_per_frame_cache", {})
    hit = cache.get((name, id(frame)))
    if hit is None or hit[0] is not frame:
        hit = cache[(name, id(frame))] = (frame, compute())
    return hit[1]
