"""Text columns as arrays of Python strings, without pandas' round trip through its text dtype.

Under pandas 3, ``series.astype(str)`` makes an Arrow-backed text column, and
``.to_numpy(object)`` then makes Python strings of it again: for host names and phases that are
strings already (as a run's tables hold them), two conversions of every value for nothing,
~0.5 µs a value (seconds over a cluster-day's 18 M spans).
"""

from __future__ import annotations

import numpy as np
import pandas as pd


def as_texts(column: pd.Series | np.ndarray) -> np.ndarray:
    """What ``pd.Series(column).astype(str).to_numpy(object)`` gives: the values as an object
    array of strings. Taken as they are when every value is a string already (no missing
    one); otherwise converted exactly as that expression converts them."""
    if isinstance(column, pd.Series):
        values = column.to_numpy(dtype=object)
    else:
        values = np.asarray(column, dtype=object)
    if pd.api.types.infer_dtype(values, skipna=False) == "string":
        return values
    return pd.Series(values, dtype=object).astype(str).to_numpy(object)
