"""Join GPU samples with the phase the process driving each GPU was in.

The analyzers that explain idle time all start from the same question: *while this GPU sample
was taken, what was the rank that uses the GPU doing?* It is answered in three steps:

1. `ownership.gpu_owner` decides which span-recording process drives each GPU.
2. `gpu_phase_samples` (this module) gives every GPU sample the innermost phase of its owner at
   that instant (`spans._label`) and the GPU-seconds the sample stands for.
3. `breakdown.phase_breakdown` and `breakdown.run_totals` aggregate those GPU-seconds by
   phase / step / GPU.

Conventions: a sample at ``t_ns`` stands for ``[t_ns, next sample of the same GPU)``; a span
covers ``[start_ns, end_ns)``. ``busy_frac`` is ``util_gpu_pct / 100`` — NVML's "a kernel was
running" share, *not* SM activity (a one-thread kernel reads 100 %); ``sm_busy_frac`` is the GPM
``sm_active_pct / 100`` where the GPU has GPM (Hopper and newer). Everything is vectorised:
loops run over owners, GPUs and nesting depths, never over samples or spans. Bad input (no
samples, no spans, NaN metrics, GPUs nobody owns) degrades to NaN / ``"(none)"`` rows, never an
exception.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from gpuprof.analyzers.grouping import group_rows
from gpuprof.analyzers.ownership import _gpu_owner
from gpuprof.analyzers.spans import (
    NO_PHASE,
    STEP_PHASE,
    _innermost,
    _label,
    _num,
    _steps,
    valid_spans,
)
from gpuprof.analyzers.texts import as_texts
from gpuprof.model import Run

_SAMPLE_COLUMNS = [
    "host", "gpu", "t_ns", "dt_s", "owner_host", "pid", "rank", "phase", "step", "in_span",
    "util_gpu_pct", "sm_active_pct", "busy_frac", "sm_busy_frac", "busy_gpu_s", "idle_gpu_s",
    "sm_busy_gpu_s", "mem_used_bytes", "mem_total_bytes", "pcie_bytes", "nvlink_bytes", "row",
]  # fmt: skip


def gpu_phase_samples(
    run: Run,
    *,
    spans: pd.DataFrame | None = None,
    owners: pd.DataFrame | None = None,
    host_codes: tuple[np.ndarray, pd.Index] | None = None,
    spans_dropped: int | None = None,
) -> pd.DataFrame:
    """One row per GPU sample with the phase its owner was in at that instant.

    Columns (sorted by host, gpu, t_ns):

    - ``host``, ``gpu``, ``t_ns``; ``dt_s`` = seconds to the GPU's next sample (the last one gets
      the GPU's median interval, a lone sample ``meta.interval_s`` or 0);
    - ``owner_host``, ``pid``, ``rank`` of the owner (`gpu_owner`; NaN when none);
    - ``phase``: the owner's innermost (deepest) span covering ``t_ns``; ``"step"`` only when
      no other span covers it; ``"(none)"`` outside every span; ``step``: the step number
      (the phase span's, else the enclosing step span's; NaN unknown); ``in_span`` (bool);
    - ``util_gpu_pct``, ``sm_active_pct`` as sampled; ``busy_frac`` = util_gpu_pct/100 and
      ``sm_busy_frac`` = sm_active_pct/100 (0–1, NaN when not measured);
    - ``busy_gpu_s`` = busy_frac·dt_s, ``idle_gpu_s`` = (1−busy_frac)·dt_s,
      ``sm_busy_gpu_s`` = sm_busy_frac·dt_s (GPU-seconds, NaN when not measured);
    - ``mem_used_bytes``, ``mem_total_bytes``; ``pcie_bytes`` and ``nvlink_bytes`` = (tx+rx
      rate)·dt_s, bytes moved during the sample (NaN when neither direction was measured);
    - ``row``: the sample's position in ``run.gpu`` (to fetch other columns without a join).

    ``frame.attrs["spans_dropped"]`` counts spans ignored for ending before they started.
    ``host_codes``: `gpu_host_codes` of the run, when the caller has them; ``spans_dropped``:
    the count `valid_spans` gave with ``spans``, when the caller has it.
    """
    if spans is None or spans_dropped is None:
        valid, dropped = valid_spans(run)
        spans = valid if spans is None else spans
    else:
        dropped = spans_dropped
    owners = _gpu_owner(run, spans) if owners is None else owners
    out = _samples(run, spans, owners, host_codes)
    out.attrs["spans_dropped"] = dropped
    return out


def gpu_host_codes(run: Run) -> tuple[np.ndarray, pd.Index]:
    """The hosts of ``run.gpu`` as codes into their sorted names (-1: missing) and the names
    (computed once by an analysis context: both the owners and the samples need them)."""
    return _sorted_codes(run.gpu["host"])


def _samples(
    run: Run,
    spans: pd.DataFrame,
    owners: pd.DataFrame,
    host_codes: tuple[np.ndarray, pd.Index] | None = None,
) -> pd.DataFrame:
    gpu = run.gpu
    if gpu is None or gpu.empty:
        return _empty_samples()
    t_raw = pd.to_numeric(gpu["t_ns"], errors="coerce") if "t_ns" in gpu else None
    # hosts as codes into their sorted names (the order sorting the strings gives), -1: none
    host_all, host_names = _sorted_codes(gpu["host"]) if host_codes is None else host_codes
    number_all = _num(gpu, "gpu")
    keep = (
        (host_all >= 0)
        & np.isfinite(number_all)
        & (t_raw.notna().to_numpy() if t_raw is not None else False)
    )
    rows = np.flatnonzero(keep)
    if len(rows) == 0:
        return _empty_samples()
    g = gpu if len(rows) == len(gpu) else gpu.loc[keep]
    host_code, host_names = _used_codes(host_all[rows], host_names)
    number = number_all[rows].astype(np.int64)
    t = t_raw.to_numpy()[rows].astype(np.int64)
    order = _gpu_time_order(host_code, number, t)
    host_code, number, t, rows = host_code[order], number[order], t[order], rows[order]
    n = len(t)
    # the samples of one GPU are one contiguous block
    new_gpu = np.ones(n, dtype=bool)
    new_gpu[1:] = (host_code[1:] != host_code[:-1]) | (number[1:] != number[:-1])
    starts = np.flatnonzero(new_gpu)
    block = np.cumsum(new_gpu) - 1
    dt = _block_durations(t, block, len(starts), run.meta.interval_s)

    # owners per GPU (a left join on a few rows, then spread over each GPU's samples), looked
    # up in a dict of the owners' rows: a frame's join costs more than the few GPUs
    of_gpu: dict[tuple, int] = {}
    several = False
    for i, key in enumerate(zip(owners["host"].to_numpy(object), owners["gpu"].to_numpy())):
        several |= key in of_gpu
        of_gpu.setdefault(key, i)
    at = np.array(
        [of_gpu.get(key, -1)
         for key in zip(host_names.to_numpy(object)[host_code[starts]], number[starts])],
        dtype=np.int64,
    )  # fmt: skip
    if several:  # a GPU with several owner rows: the samples joined row by row
        counts: dict[tuple, int] = {}
        for key in zip(owners["host"].to_numpy(object), owners["gpu"].to_numpy()):
            counts[key] = counts.get(key, 0) + 1
        keys = zip(host_names.to_numpy(object)[host_code[starts]], number[starts])
        if any(counts.get(key, 0) > 1 for key in keys):
            return _samples_joined(run, spans, owners)
    found = at >= 0

    def owner_column(name: str) -> np.ndarray:  # the owners' values, NaN where none
        values = owners[name].to_numpy(object if name == "owner_host" else np.float64)
        return np.where(found, values[np.maximum(at, 0)], np.nan)

    owner_host, pid, rank = (owner_column(c) for c in ("owner_host", "pid", "rank"))
    phase_code, phase_names, step, in_span = _label_blocks(spans, owner_host, pid, starts, t)

    frame = {
        "host": pd.Categorical.from_codes(host_code, categories=host_names),
        "gpu": number,
        "t_ns": t,
        "dt_s": dt,
        "owner_host": _categorical(owner_host, block),
        "pid": pid[block],
        "rank": rank[block],
        "phase": _categorical(phase_names, phase_code),
        "step": step,
        "in_span": in_span,
    }
    metric_names = ["util_gpu_pct", "sm_active_pct", "mem_used_bytes", "mem_total_bytes",
                    "pcie_tx_bytes_s", "pcie_rx_bytes_s", "nvlink_tx_bytes_s",
                    "nvlink_rx_bytes_s"]  # fmt: skip
    metrics = {name: _num(g, name, order) for name in metric_names}
    util, sm = metrics["util_gpu_pct"], metrics["sm_active_pct"]
    busy_frac = np.clip(util / 100.0, 0.0, 1.0)  # NVML can overshoot by rounding
    sm_busy_frac = np.clip(sm / 100.0, 0.0, 1.0)
    frame.update(
        util_gpu_pct=util,
        sm_active_pct=sm,
        busy_frac=busy_frac,
        sm_busy_frac=sm_busy_frac,
        busy_gpu_s=busy_frac * dt,
        idle_gpu_s=(1.0 - busy_frac) * dt,
        sm_busy_gpu_s=sm_busy_frac * dt,
        mem_used_bytes=metrics["mem_used_bytes"],
        mem_total_bytes=metrics["mem_total_bytes"],
        pcie_bytes=_link_bytes(
            metrics["pcie_tx_bytes_s"], metrics["pcie_rx_bytes_s"], dt, overwrite=True
        ),
        nvlink_bytes=_link_bytes(
            metrics["nvlink_tx_bytes_s"], metrics["nvlink_rx_bytes_s"], dt, overwrite=True
        ),
        row=rows,
    )
    # fresh arrays: no copy into 2-D blocks (a third of the time of this function)
    return pd.DataFrame({name: frame[name] for name in _SAMPLE_COLUMNS}, copy=False)


def _sorted_codes(column: pd.Series) -> tuple[np.ndarray, pd.Index]:
    """A column's values as ``str``, coded by their place in the sorted distinct names (-1:
    missing)."""
    codes, uniques = pd.factorize(column)
    names = [str(u) for u in uniques]
    distinct = sorted(set(names))
    place = {name: i for i, name in enumerate(distinct)}
    remap = np.array([*(place[name] for name in names), -1], dtype=np.int64)
    return remap[codes], _object_index(distinct)  # code -1 picks the trailing -1


def _used_codes(codes: np.ndarray, names: pd.Index) -> tuple[np.ndarray, pd.Index]:
    """``codes`` (into sorted ``names``) renumbered to the names they use."""
    used = np.bincount(codes, minlength=len(names)) > 0
    if used.all():
        return codes, names
    return (np.cumsum(used) - 1)[codes], names[used]


def _gpu_time_order(host: np.ndarray, gpu: np.ndarray, t: np.ndarray) -> np.ndarray:
    """The stable order of samples by host code, GPU, time (``np.lexsort``), found with one
    small-integer sort when the samples already come in time order (as runs are loaded)."""
    if len(t) > 1 and bool((t[1:] >= t[:-1]).all()):
        lo, width = int(gpu.min()), int(gpu.max()) - int(gpu.min()) + 1
        if width * (int(host.max()) + 1) < 2**16:  # a radix sort for 16-bit keys
            key = (host * width + (gpu - lo)).astype(np.uint16)
            return np.argsort(key, kind="stable")
    return np.lexsort((t, gpu, host))


def _categorical(values: np.ndarray, codes: np.ndarray) -> pd.Categorical:
    """The categorical of ``values[codes]``: categories the distinct non-null values used,
    sorted (an `_object_index`), computed on the few distinct values instead of every row."""
    values = np.asarray(values, dtype=object)
    used = np.bincount(codes, minlength=len(values)) > 0
    ok = used & pd.notna(values)
    if not all(isinstance(v, str) for v in values[ok]):
        return pd.Categorical(values[codes])  # mixed types: pandas decides the order
    categories = _object_index(sorted(set(values[ok])))
    place = {name: i for i, name in enumerate(categories)}
    remap = np.array([place[v] if k else -1 for v, k in zip(values, ok)], dtype=np.int64)
    return pd.Categorical.from_codes(remap[codes], dtype=pd.CategoricalDtype(categories))


def _object_index(names: list[str]) -> pd.Index:
    """Category labels as Python strings (an object index, not pandas' Arrow-backed ``str``):
    turning a column of millions of labels into an object array then takes one numpy take,
    where Arrow-backed labels would build every string again."""
    return pd.Index(np.array(names, dtype=object), dtype=object)


def _object_labels(cat: pd.Categorical) -> pd.Categorical:
    """``cat`` with its string categories as an `_object_index`."""
    if not isinstance(cat.categories.dtype, pd.StringDtype):
        return cat
    dtype = pd.CategoricalDtype(_object_index(list(cat.categories)))
    return pd.Categorical.from_codes(cat.codes, dtype=dtype)


def _block_durations(
    t: np.ndarray, block: np.ndarray, n_blocks: int, interval_s: float | None
) -> np.ndarray:
    """Seconds from each sample to the next one of its GPU (``block``: each sample's GPU, the
    samples sorted by GPU and time); a GPU's last sample gets that GPU's median interval."""
    dt = np.full(len(t), np.nan)
    if len(t) > 1:
        same = block[1:] == block[:-1]
        dt[:-1] = np.where(same, (t[1:] - t[:-1]) / 1e9, np.nan)
    median = pd.Series(dt).groupby(block).median().reindex(np.arange(n_blocks))
    fallback = float(interval_s) if interval_s and np.isfinite(interval_s) else 0.0
    last = median.fillna(fallback).to_numpy()[block]
    return np.where(np.isnan(dt), last, dt)


def _label_blocks(
    spans: pd.DataFrame, owner_host: np.ndarray, pid: np.ndarray, starts: np.ndarray,
    t: np.ndarray,
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:  # fmt: skip
    """Phase (codes into the returned names, ``"(none)"`` outside spans), step and in-span flag
    of each sample, from the spans of the owner of its GPU (``owner_host``, ``pid``: one per
    block of samples starting at ``starts``, NaN pid without an owner)."""
    n = len(t)
    span_phase, names = pd.factorize(spans["phase"].to_numpy(object)) if len(spans) else (
        np.zeros(0, dtype=np.int64), np.zeros(0, dtype=object))  # fmt: skip
    names = np.array([*names, NO_PHASE, STEP_PHASE], dtype=object)
    none_code, step_code = len(names) - 2, len(names) - 1
    phase = np.full(n, none_code, dtype=np.int64)
    step = np.full(n, np.nan)
    in_span = np.zeros(n, dtype=bool)
    if not len(spans):
        return phase, names, step, in_span
    ends = np.append(starts[1:], n)
    by_proc = group_rows([spans["host"], spans["pid"]])
    # the span columns the lookup reads, as arrays (row selections of a frame cost more)
    columns = {c: spans[c].to_numpy() for c in ("is_step", "depth", "start_ns", "end_ns", "step")}
    owned = np.flatnonzero(~np.isnan(pid))
    for (o_host, o_pid), blocks in group_rows([owner_host[owned], pid[owned]]).items():
        span_rows = by_proc.get((o_host, int(o_pid)))
        if span_rows is None:
            continue
        b = owned[blocks]
        where = np.concatenate([np.arange(starts[i], ends[i]) for i in b])
        proc_spans = {c: values[span_rows] for c, values in columns.items()}
        inner = _innermost(proc_spans, t[where], False)
        whole = _innermost(proc_spans, t[where], True)
        code = span_phase[span_rows]
        has_inner, has_whole = inner >= 0, whole >= 0
        phase[where] = np.where(
            has_inner, code[np.maximum(inner, 0)], np.where(has_whole, step_code, none_code)
        )
        step[where], in_span[where] = _steps(proc_spans, inner, whole)
    return phase, names, step, in_span


def _samples_joined(run: Run, spans: pd.DataFrame, owners: pd.DataFrame) -> pd.DataFrame:
    """`_samples` joining the owners row by row, as pandas does: for owner tables with
    several rows for one GPU (each sample then appears once per row)."""
    gpu = run.gpu
    if gpu is None or gpu.empty:
        return _empty_samples()
    t_raw = pd.to_numeric(gpu["t_ns"], errors="coerce") if "t_ns" in gpu else None
    keep = (
        gpu["host"].notna().to_numpy()
        & np.isfinite(_num(gpu, "gpu"))
        & (t_raw.notna().to_numpy() if t_raw is not None else False)
    )
    g = gpu.loc[keep]
    if g.empty:
        return _empty_samples()
    frame = pd.DataFrame(
        {
            "host": as_texts(g["host"]),
            "gpu": _num(g, "gpu").astype(np.int64),
            "t_ns": t_raw[keep].to_numpy(np.int64),
            "row": np.flatnonzero(keep),
        }
    )
    metric_names = ["util_gpu_pct", "sm_active_pct", "mem_used_bytes", "mem_total_bytes",
                    "pcie_tx_bytes_s", "pcie_rx_bytes_s", "nvlink_tx_bytes_s",
                    "nvlink_rx_bytes_s"]  # fmt: skip
    for name in metric_names:
        frame[name] = _num(g, name)
    frame = frame.sort_values(["host", "gpu", "t_ns"], kind="stable", ignore_index=True)
    frame["dt_s"] = _durations(frame, run.meta.interval_s)

    frame = frame.merge(
        owners[["host", "gpu", "owner_host", "pid", "rank"]], on=["host", "gpu"], how="left"
    )
    n = len(frame)
    phase = np.full(n, NO_PHASE, dtype=object)
    step = np.full(n, np.nan)
    in_span = np.zeros(n, dtype=bool)
    t = frame["t_ns"].to_numpy(np.int64)
    by_proc = spans.groupby(["host", "pid"], sort=False).indices if len(spans) else {}
    owned = frame[frame["pid"].notna()]
    for (o_host, o_pid), rows in owned.groupby(["owner_host", "pid"], sort=False).indices.items():
        span_rows = by_proc.get((o_host, int(o_pid)))
        if span_rows is None:
            continue
        where = owned.index.to_numpy()[rows]
        proc_spans = spans.iloc[span_rows].reset_index(drop=True)
        phase[where], step[where], in_span[where] = _label(proc_spans, t[where])
    # labels as categoricals: comparisons and group-bys then work on small integer codes
    frame["phase"] = _object_labels(pd.Categorical(phase))
    frame["step"] = step
    frame["in_span"] = in_span
    for name in ("host", "owner_host"):
        frame[name] = _object_labels(pd.Categorical(frame[name].to_numpy(object)))

    util = frame["util_gpu_pct"].to_numpy()
    sm = frame["sm_active_pct"].to_numpy()
    dt = frame["dt_s"].to_numpy()
    frame["busy_frac"] = np.clip(util / 100.0, 0.0, 1.0)  # NVML can overshoot by rounding
    frame["sm_busy_frac"] = np.clip(sm / 100.0, 0.0, 1.0)
    frame["busy_gpu_s"] = frame["busy_frac"] * dt
    frame["idle_gpu_s"] = (1.0 - frame["busy_frac"]) * dt
    frame["sm_busy_gpu_s"] = frame["sm_busy_frac"] * dt
    frame["pcie_bytes"] = _bytes(frame, "pcie", dt)
    frame["nvlink_bytes"] = _bytes(frame, "nvlink", dt)
    return frame[_SAMPLE_COLUMNS]


def _durations(frame: pd.DataFrame, interval_s: float | None) -> np.ndarray:
    """Seconds from each sample to the next one of the same GPU (frame sorted by GPU, time);
    a GPU's last sample gets that GPU's median interval."""
    t = frame["t_ns"].to_numpy(np.int64)
    code = frame.groupby(["host", "gpu"], sort=False).ngroup().to_numpy()
    dt = np.full(len(t), np.nan)
    if len(t) > 1:
        same = code[1:] == code[:-1]
        dt[:-1] = np.where(same, (t[1:] - t[:-1]) / 1e9, np.nan)
    median = pd.Series(dt).groupby(code).median().reindex(np.arange(code.max() + 1))
    fallback = float(interval_s) if interval_s and np.isfinite(interval_s) else 0.0
    last = median.fillna(fallback).to_numpy()[code]
    return np.where(np.isnan(dt), last, dt)


def _bytes(frame: pd.DataFrame, link: str, dt: np.ndarray) -> np.ndarray:
    return _link_bytes(
        frame[f"{link}_tx_bytes_s"].to_numpy(), frame[f"{link}_rx_bytes_s"].to_numpy(), dt
    )


def _link_bytes(
    tx: np.ndarray, rx: np.ndarray, dt: np.ndarray, overwrite: bool = False
) -> np.ndarray:
    """Bytes moved in each sample: (tx + rx rate) · dt, NaN when neither was measured
    (``overwrite``: ``tx`` and ``rx`` are scratch arrays)."""
    none = np.isnan(tx) & np.isnan(rx)
    rate = np.nan_to_num(tx, copy=not overwrite) + np.nan_to_num(rx, copy=not overwrite)
    rate[none] = np.nan
    return rate * dt


def _empty_samples() -> pd.DataFrame:
    dtypes = {"host": object, "gpu": np.int64, "t_ns": np.int64, "owner_host": object,
              "phase": object, "in_span": bool, "row": np.int64}  # fmt: skip
    return pd.DataFrame(
        {c: pd.Series([], dtype=dtypes.get(c, np.float64)) for c in _SAMPLE_COLUMNS}
    )
