"""Loading a run for analysis and reports: whole, or merged down to a bounded size.

A run of up to `MAX_GPU_SAMPLES` GPU samples is loaded as recorded. A longer one (a day on 64
GPUs at 10 Hz is 55 million samples, over 10 GB as frames) is loaded at a coarser resolution:
GPU samples are streamed one GPU at a time and merged by `analyzers.resample.reduce_gpu`, never
across a span boundary of the GPU's owner, so time per phase keeps its full-resolution
accuracy; host and process samples are merged into buckets of the same width. Memory then
stays near the budget whatever the length of the run, and the run's notices say what was done.
"""

from __future__ import annotations

import dataclasses
import math
import os

import numpy as np
import pandas as pd

from gpuprof import store
from gpuprof.analyzers import alignment, resample
from gpuprof.model import Run

MAX_GPU_SAMPLES = 2_000_000
"""GPU samples analysed at full resolution; beyond it they are merged (see module doc)."""


def load_for_analysis(
    run_dir: str | os.PathLike, max_gpu_samples: int | None = MAX_GPU_SAMPLES
) -> Run:
    """The run in ``run_dir``, with at most about ``max_gpu_samples`` GPU samples.

    ``None`` loads everything. Raises `store.RunError` (one line) for an unreadable run.
    """
    total = store.count_rows(run_dir, "gpu")
    if max_gpu_samples is None or total <= max_gpu_samples:
        return store.load_run(run_dir)
    factor = math.ceil(total / max(1, max_gpu_samples))
    keys = store.gpu_keys(run_dir)
    # the sampling interval sets the bucket width of the host-side tables
    stream = store.iter_gpu_samples(run_dir)
    interval_ns = _interval_ns(next(stream, None))
    stream.close()
    window_ns = max(1, factor * interval_ns)
    run = store.load_run(
        run_dir, skip=("gpu",), reduce=lambda t, f: resample.reduce_table(t, f, window_ns)
    )
    inventory = pd.DataFrame(
        {"host": keys["host"].astype(object), "gpu": keys["gpu"].astype(np.int64),
         "uuid": keys["uuid"].astype(object)}
    )  # fmt: skip
    stub = dataclasses.replace(run, gpu=inventory)
    spans, _ = alignment.valid_spans(stub)
    bounds = resample.owner_boundaries(spans, alignment.gpu_owner(stub))
    parts = []
    for frame in store.iter_gpu_samples(run_dir, categories=True):
        key = (frame["host"].iloc[0], int(frame["gpu"].iloc[0]))
        parts.append(resample.reduce_gpu(frame, bounds.get(key), factor))
    run.gpu = pd.concat(parts, ignore_index=True).sort_values(
        "t_ns", kind="stable", ignore_index=True
    )
    seconds = factor * interval_ns / 1e9
    run.meta.notices = [
        *run.meta.notices,
        f"long run: {total:,} GPU samples analysed as {len(run.gpu):,} "
        f"(up to {factor} consecutive samples, ~{seconds:g} s, merged within each phase)",
    ]
    return run


def _interval_ns(frame: pd.DataFrame | None) -> int:
    """The typical sampling interval of one GPU's samples, in ns (0.1 s when unknown)."""
    if frame is None or len(frame) < 2:
        return 100_000_000
    gaps = np.diff(frame["t_ns"].to_numpy(np.int64))
    gaps = gaps[gaps > 0]
    return int(np.median(gaps)) if len(gaps) else 100_000_000
