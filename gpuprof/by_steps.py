"""A run diagnosed a stretch of steps at a time, on every core: ``analyze RUN --by-steps N``.

The run's recorded steps are cut into consecutive stretches of N steps
(`step_window.consecutive`). Each stretch is read and diagnosed alone, exactly as
``analyze --steps A:B`` would (`loader.load_for_analysis` with the stretch, then
`api.analyze`), in a forked worker process, so that several stretches are diagnosed at once
and each worker's memory follows one stretch, not the run. `analyzers.over_steps.combine`
then puts the stretches' diagnoses together in step order. The result does not depend on
the number of workers.

A run whose form is not kept yet (`load_cache`) has it made first, in a child process: a
long run's file by file (`keep_by_file`, in the memory of one file or part of the GPUs per
worker), a shorter one's by reading it whole when that fits in memory (`KEEP_SPAN_BYTES` a
span, within `MEMORY_BUDGET_BYTES` or half the memory free). Every stretch then reads only
its own batches of the kept form instead of decoding every run file. Where no form could be
kept (a run still being written, a read-only directory), each stretch reads the run files
(their rows outside the stretch dropped as they are read), which a note says.

Memory: each worker holds one stretch at a time (`stretch_bytes`); without ``--workers``,
no more of them run at once than hold `MEMORY_BUDGET_BYTES` together.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from gpuprof import keep_by_file, load_cache, loader, step_window, store
from gpuprof.analyzers.over_steps import combine
from gpuprof.footprint import available_bytes
from gpuprof.step_window import StepWindow

MEMORY_BUDGET_BYTES = 2 * 1024**3
"""What the stretches' worker processes may hold together, when ``--workers`` is not given:
fewer workers diagnose at once when a stretch is large (`stretch_bytes`)."""
STRETCH_BASE_BYTES = 200 * 2**20
"""A worker's memory before its stretch: the interpreter, pandas, the kept form's index."""
STRETCH_GPU_STEP_BYTES = 24 * 1024
"""A worker's memory per GPU and step of its stretch (`bench_analyze_steps.py`: 256 GPUs ×
24 steps of the 256 × 4 h run peak at 272 MB, ~110 MB of it the interpreter)."""
KEEP_SPAN_BYTES = 700
"""Memory of reading a run whole to keep its form, per span (spans and the merged samples
both grow with ranks × steps: 1.1 GB for the 722 k spans of 256 GPUs × 4 h)."""


def diagnose(
    run_dir: str | os.PathLike,
    per: int,
    *,
    workers: int | None = None,
    gpu_hour_price: float | None = None,
    model_params: str | None = None,
    gpu: str | None = None,
    ray: str | None = None,
) -> dict[str, Any]:
    """The stretch-by-stretch document (`over_steps.combine`) of the run at ``run_dir``,
    ``per`` steps a stretch, diagnosed on ``workers`` processes (default: every core this
    process may use, fewer when their stretches would hold more than `MEMORY_BUDGET_BYTES`
    together), or as tasks of the Ray cluster at ``ray`` (`loader._RayWorkers`: one CPU
    each, placed by Ray; its nodes must see the run directory at the same path). Raises
    `store.RunError` (one line) for an unreadable run, one without recorded steps or a Ray
    cluster that cannot be used, `ValueError` for ``per`` < 1 or a ``model_params`` that is
    no count."""
    windows = step_window.consecutive(run_dir, per)
    notes = []
    if load_cache.enabled() and load_cache.step_times(run_dir) is None:
        spans = _spans(run_dir)
        # a long run: kept file by file; a short one (not merged) read whole when it fits
        if not loader.in_child(keep_by_file.build, run_dir, workers) and (
            spans * KEEP_SPAN_BYTES <= max(MEMORY_BUDGET_BYTES, available_bytes() // 2)
        ):
            loader.in_child(_keep_whole, run_dir)
        if load_cache.step_times(run_dir) is not None:
            windows = step_window.consecutive(run_dir, per)  # on the kept form's aligned clock
        else:
            notes.append(
                f"no form of the run could be kept first ({spans:,} spans; read whole: ~"
                f"{spans * KEEP_SPAN_BYTES / 2**30:.1f} GB): each stretch read the run files, "
                "all of them"
            )
    n = min(workers or loader.default_workers(), len(windows))
    if not workers and n > 1 and ray is None:
        each = stretch_bytes(len(store.gpu_keys(run_dir)), max(w.steps for w in windows))
        fits = max(1, MEMORY_BUDGET_BYTES // each)
        if fits < n:
            notes.append(
                f"stretches diagnosed {fits} at a time (of {n} cores), ~{each / 2**20:,.0f} MB "
                f"each, to hold under {MEMORY_BUDGET_BYTES / 2**30:g} GB together (--workers "
                "sets it)"
            )
            n = fits
    options = {"gpu_hour_price": gpu_hour_price, "model_params": model_params, "gpu": gpu}
    calls = [(run_dir, window, options) for window in windows]
    pool_of = (lambda: loader._RayWorkers(ray)) if ray else (lambda: loader._Workers(n))
    with pool_of() as pool:
        diagnoses = pool.map(_diagnose_stretch, calls)
    doc = combine(diagnoses, per)
    doc["notes"] = [*doc["notes"], *notes, *pool.notices]
    return doc


def stretch_bytes(gpus: int, steps: int) -> int:
    """About what one worker holds to diagnose a stretch of ``steps`` steps of ``gpus``
    GPUs (bytes)."""
    return STRETCH_BASE_BYTES + STRETCH_GPU_STEP_BYTES * max(1, gpus) * max(1, steps)


def _spans(run_dir: str | os.PathLike) -> int:
    try:
        return store.count_rows(run_dir, "spans")
    except Exception:  # a count the files cannot give: read each stretch from them
        return 2**62


def _keep_whole(run_dir: str | os.PathLike) -> None:
    """Read the run whole as `analyze` does, which keeps its form beside it."""
    loader.load_for_analysis(run_dir, loader.MAX_GPU_SAMPLES)


def _diagnose_stretch(
    run_dir: str | os.PathLike, window: StepWindow, options: dict[str, Any]
) -> dict[str, Any]:
    """One stretch's diagnosis document, as ``analyze --steps A:B --json`` makes it."""
    from gpuprof import api

    run = loader.load_for_analysis(Path(run_dir), loader.MAX_GPU_SAMPLES, workers=1, steps=window)
    return api.analyze(run, **options).to_dict()


def trimmed(doc: dict[str, Any], top: int | None) -> dict[str, Any]:
    """``doc`` with only the ``top`` largest kinds and recommendations, over the run and in
    each stretch (``--top``); the sums are those of every finding."""
    if not top:
        return doc
    stretches = []
    for row in doc["stretches"]:
        d = row["diagnosis"]
        d = {**d, "findings": d["findings"][:top], "recommendations": d["recommendations"][:top]}
        stretches.append({**row, "findings": row["findings"][:top], "diagnosis": d})
    return {
        **doc,
        "kinds": doc["kinds"][:top],
        "recommendations": doc["recommendations"][:top],
        "stretches": stretches,
    }
