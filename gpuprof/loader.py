"""Loading a run for analysis and reports: whole, or merged down to a bounded size.

A run of up to `MAX_GPU_SAMPLES` GPU samples is loaded as recorded. A longer one (a day on 64
GPUs at 10 Hz is 55 million samples, over 10 GB as frames) is loaded at a coarser resolution:
GPU samples are streamed one GPU at a time and merged by `analyzers.resample.reduce_gpu`, never
across a span boundary of the GPU's owner, so time per phase keeps its full-resolution
accuracy. Host, process and GPU-process samples beyond their own budgets (`MAX_HOST_ROWS`) are
merged into time buckets, never finer than the GPU samples'. Memory then stays near the budget
whatever the length of the run, and the run's notices say what was done.
"""

from __future__ import annotations

import dataclasses
import math
import os

import numpy as np
import pandas as pd

from gpuprof import store
from gpuprof.analyzers import resample
from gpuprof.analyzers.ownership import gpu_owner
from gpuprof.analyzers.spans import valid_spans
from gpuprof.integrations.recorded import merge_run_events
from gpuprof.model import Run

MAX_GPU_SAMPLES = 1_500_000
"""GPU samples analysed at full resolution; beyond it they are merged (see module doc)."""
MAX_HOST_ROWS: dict[str, int] = {"host": 100_000, "procs": 400_000, "gpu_procs": 200_000}
"""Rows of each host-side sample table kept at full resolution."""


def load_for_analysis(
    run_dir: str | os.PathLike,
    max_gpu_samples: int | None = MAX_GPU_SAMPLES,
    *,
    merge: int | None = None,
) -> Run:
    """The run in ``run_dir``, with about ``max_gpu_samples`` GPU samples at most.

    ``None`` loads everything as recorded; ``merge`` merges exactly that many consecutive GPU
    samples (within phases) whatever the run's size, to see what merging does. Framework knobs
    that adapters recorded as events join the run's metadata (a watcher does this when the run
    ends; processes that called ``gpuprof.init`` themselves have none). Raises
    `store.RunError` (one line) for an unreadable run.
    """
    run = _load(run_dir, max_gpu_samples, merge)
    merge_run_events(run)
    return run


def _load(run_dir: str | os.PathLike, max_gpu_samples: int | None, merge: int | None) -> Run:
    if merge is not None and merge > 1:
        return _load_merged(run_dir, store.count_rows(run_dir, "gpu"), None, set(), {}, merge)
    if max_gpu_samples is None:
        return store.load_run(run_dir)
    total = store.count_rows(run_dir, "gpu")
    rows = {table: store.count_rows(run_dir, table) for table in MAX_HOST_ROWS}
    big = {t for t, n in rows.items() if n > MAX_HOST_ROWS[t]}
    if total <= max_gpu_samples and not big:
        return store.load_run(run_dir)

    return _load_merged(run_dir, total, max_gpu_samples, big, rows, None)


def _load_merged(
    run_dir: str | os.PathLike,
    total: int,
    max_gpu_samples: int | None,
    big: set[str],
    rows: dict[str, int],
    merge: int | None,
) -> Run:
    factor = 1
    interval_ns = 0
    if merge is not None or (max_gpu_samples is not None and total > max_gpu_samples):
        stream = store.iter_gpu_samples(run_dir)
        interval_ns = _interval_ns(next(stream, None))
        stream.close()
        factor = merge or math.ceil(total / max(1, max_gpu_samples or 1))
    gpu_window_ns = factor * interval_ns
    windows: dict[str, int] = {}

    def reduce(table: str, frame: pd.DataFrame) -> pd.DataFrame:
        if table not in big:
            return frame
        step = math.ceil(rows[table] / MAX_HOST_ROWS[table])
        window = max(gpu_window_ns, step * resample.typical_interval_ns(table, frame))
        windows[table] = max(windows.get(table, 0), window)
        return resample.reduce_table(table, frame, window)

    skip = ("gpu",) if factor > 1 else ()
    run = store.load_run(run_dir, skip=skip, reduce=reduce)
    notices = []
    if factor > 1:
        run.gpu = _reduced_gpu(run_dir, run, total, max_gpu_samples, merge)
        notices.append(
            f"long run: {total:,} GPU samples analysed as {len(run.gpu):,} (up to "
            f"{run.gpu.attrs.get('factor', factor)} consecutive samples merged within each phase)"
        )
    for table, window in sorted(windows.items()):
        notices.append(f"{rows[table]:,} {table} samples merged into {window / 1e9:g} s buckets")
    run.meta.notices = [*run.meta.notices, *notices]
    return run


def _reduced_gpu(
    run_dir: str | os.PathLike, run: Run, total: int, budget: int | None, merge: int | None
) -> pd.DataFrame:
    """The run's GPU samples merged to about ``budget`` rows (or by exactly ``merge``), one
    GPU at a time."""
    keys = store.gpu_keys(run_dir)
    inventory = pd.DataFrame(
        {"host": keys["host"].astype(object), "gpu": keys["gpu"].astype(np.int64),
         "uuid": keys["uuid"].astype(object)}
    )  # fmt: skip
    stub = dataclasses.replace(run, gpu=inventory)
    spans, _ = valid_spans(stub)
    bounds = resample.owner_boundaries(spans, gpu_owner(stub))
    # every span boundary may add a row: leave room for them in the budget
    n_bounds = sum(len(b) for b in bounds.values())
    if merge is not None:
        factor = merge
    else:
        budget = budget or 1
        factor = math.ceil(total / max(budget - n_bounds, budget // 4, 1))
    # the samples come as recorded, on their node's clock: onto the run's, like every other
    # table (`store.load_run`), before they are cut at the spans' boundaries
    offsets = {node: int(c.get("offset_ns") or 0) for node, c in run.meta.clocks.items()}
    parts = []
    for frame in store.iter_gpu_samples(run_dir, categories=True):
        key = (frame["host"].iloc[0], int(frame["gpu"].iloc[0]))
        if offsets.get(key[0]):
            frame["t_ns"] = frame["t_ns"].to_numpy(np.int64) + offsets[key[0]]
        parts.append(resample.reduce_gpu(frame, bounds.get(key), factor))
    for part in parts:  # one category set per column, so the concatenation keeps codes
        for name in ("host", "uuid"):
            part[name] = part[name].astype(object)
    gpu = pd.concat(parts, ignore_index=True)
    del parts
    gpu = gpu.sort_values("t_ns", kind="stable", ignore_index=True)
    gpu.attrs["factor"] = factor
    return gpu


def _interval_ns(frame: pd.DataFrame | None) -> int:
    """The typical sampling interval of one GPU's samples, in ns (0.1 s when unknown)."""
    if frame is None or len(frame) < 2:
        return 100_000_000
    gaps = np.diff(frame["t_ns"].to_numpy(np.int64))
    gaps = gaps[gaps > 0]
    return int(np.median(gaps)) if len(gaps) else 100_000_000
