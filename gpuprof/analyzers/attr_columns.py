"""Values kept in span and event ``attrs`` dicts, read one key at a time as columns.

A step span's attrs hold the framework's figures for the step (tokens, mean lengths, verl's
``perf/…`` metrics); a long run has hundreds of thousands of step spans. Reading a key over
all of them in one pass and doing the arithmetic on arrays costs a fraction of calling
`settings.num` per value inside a Python loop per span, and gives the same numbers.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from itertools import repeat
from typing import Any

import numpy as np

from gpuprof.analyzers.settings import num

_PLAIN = frozenset({int, float, type(None)})
"""Value types numpy converts to float64 as `num` does (None → NaN); bool is not one of them."""


def values(attrs: Iterable[Any], key: str) -> list[Any]:
    """``attrs[key]`` for each attrs dict (None where it is absent or the attrs no dict)."""
    if iter(attrs) is attrs:  # a one-pass iterator: the slow path below may need a second
        attrs = list(attrs)
    try:
        # every attrs a dict (as the store reads them): the loop runs in C, twice as fast
        return list(map(dict.get, attrs, repeat(key)))
    except TypeError:  # one is something else (None, NaN)
        return [a.get(key) if isinstance(a, dict) else None for a in attrs]


def numbers(raw: Sequence[Any]) -> np.ndarray:
    """Each value as `settings.num` reads it, as float64: NaN where it gives None (absent,
    boolean, text that is no number, NaN, ±inf)."""
    if set(map(type, raw)) <= _PLAIN:
        out = np.array(raw, dtype=np.float64)
        out[~np.isfinite(out)] = np.nan
        return out
    return np.array([np.nan if (n := num(v)) is None else n for v in raw], dtype=np.float64)


def number(attrs: Iterable[Any], key: str) -> np.ndarray:
    """``attrs[key]`` of each attrs dict as float64 (`numbers`)."""
    return numbers(values(attrs, key))


def first_number(attrs: Sequence[Any], keys: Iterable[str]) -> np.ndarray:
    """Per attrs dict, the first of ``keys`` that holds a finite number (NaN: none does)."""
    out = np.full(len(attrs), np.nan)
    for key in keys:
        missing = np.isnan(out)
        if not missing.any():
            break
        out = np.where(missing, number(attrs, key), out)
    return out


def key_names(attrs: Iterable[Any]) -> set[str]:
    """Every key any of the attrs dicts has."""
    names: set[str] = set()
    for a in attrs:
        if isinstance(a, dict):
            names.update(a)
    return names


def mean_of(column: np.ndarray) -> float | None:
    """Mean of the finite values (None when there are none), summed as `np.mean` sums the
    list of those values."""
    kept = column[~np.isnan(column)]
    return float(np.mean(kept)) if len(kept) else None
