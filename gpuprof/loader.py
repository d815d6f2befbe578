"""Loading a run for analysis and reports: whole, or merged down to a bounded size.

A run of up to `MAX_GPU_SAMPLES` GPU samples is loaded as recorded. A longer one (a day on 64
GPUs at 10 Hz is 55 million samples, over 10 GB as frames) is loaded at a coarser resolution:
GPU samples are streamed one GPU at a time and merged by `analyzers.resample.reduce_gpu`, never
across a span boundary of the GPU's owner, so time per phase keeps its full-resolution
accuracy. Host, process and GPU-process samples beyond their own budgets (`MAX_HOST_ROWS`) are
merged into time buckets, never finer than the GPU samples'. Memory then stays near the budget
whatever the length of the run, and the run's notices say what was done.

A long run is read on every core the process may use (`workers`, ``GPUPROF_WORKERS``): the
run files' host-side tables one file per task, then the GPU samples in parts (round-robin
over the GPUs, `store.iter_gpu_parts`), each part read and merged by one worker process and
the parts put back in the stream's order, so the result is the same, row for row, as one
process reading it all. The workers are forked (Linux): a script calling this needs no
``if __name__ == "__main__"`` guard. Elsewhere, or with one core, one process does it all.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import math
import multiprocessing
import os
import re
import sys
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from gpuprof import load_cache, printed_timings, step_window, store
from gpuprof.analyzers import resample
from gpuprof.analyzers.ownership import gpu_owner
from gpuprof.analyzers.spans import valid_spans
from gpuprof.errors import RunError
from gpuprof.integrations.recorded import merge_run_events
from gpuprof.model import Run
from gpuprof.step_window import ReadFilter, StepWindow

MAX_GPU_SAMPLES = 1_500_000
"""GPU samples analysed at full resolution; beyond it they are merged (see module doc)."""
MAX_HOST_ROWS: dict[str, int] = {"host": 100_000, "procs": 400_000, "gpu_procs": 200_000}
"""Rows of each host-side sample table kept at full resolution."""
MANY_SPANS = 4_000_000
"""Spans past which loading a whole run says how to read less: spans are not merged (about
130 B each in memory), so a run with millions of them (a thousand ranks for a day) is best
looked at a stretch of steps at a time (``--steps``, `step_window`), or N steps at a time
(``--by-steps``, `by_steps`)."""
ENV_WORKERS = "GPUPROF_WORKERS"
"""Processes that read a long run (default: the cores this process may use)."""


def default_workers() -> int:
    """`ENV_WORKERS` when set to a positive number, else the cores this process may run on."""
    try:
        given = int(os.environ.get(ENV_WORKERS) or 0)
    except ValueError:
        given = 0
    if given > 0:
        return given
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):
        return max(1, os.cpu_count() or 1)


def load_for_analysis(
    run_dir: str | os.PathLike,
    max_gpu_samples: int | None = MAX_GPU_SAMPLES,
    *,
    merge: int | None = None,
    workers: int | None = None,
    ray: str | None = None,
    steps: str | StepWindow | None = None,
) -> Run:
    """The run in ``run_dir``, with about ``max_gpu_samples`` GPU samples at most.

    ``None`` loads everything as recorded; ``merge`` merges exactly that many consecutive GPU
    samples (within phases) whatever the run's size, to see what merging does. ``workers``:
    processes that read and merge a run too long to load as recorded (default
    `default_workers`; 1: this process alone); ``ray``: the address of a Ray cluster whose
    tasks do that work instead (`_RayWorkers`); the result depends on neither. Framework
    knobs that adapters recorded as events join the run's metadata (a watcher does this when
    the run ends; processes that called ``gpuprof.init`` themselves have none). ``steps``:
    only that stretch of the run's steps (``"A:B"`` or a resolved `step_window.StepWindow`),
    read alone: memory and time follow its length. Raises `store.RunError` (one line) for an
    unreadable run or a stretch with no recorded step, `ValueError` for a malformed
    ``steps``.
    """
    printed_timings.ensure(run_dir)
    if steps is not None:
        window = step_window.resolve(run_dir, steps) if isinstance(steps, str) else steps
        run = _load(run_dir, max_gpu_samples, merge, workers, ray, window)
        step_window.cut(run, window)
    else:
        run = _load(run_dir, max_gpu_samples, merge, workers, ray)
        _note_many_spans(run)
    merge_run_events(run)
    printed_timings.add_notes(run, run_dir)
    return run


def load_for_diagnosis(
    run_dir: str | os.PathLike, *, workers: int | None = None, ray: str | None = None,
    steps: str | StepWindow | None = None, defer_from: int | None = None,
) -> tuple[Run, load_cache.KeptSeries | None]:  # fmt: skip
    """The run `load_for_analysis` loads (default budget), and None; or, when the whole run
    is asked for, its merged form is kept and holds at least ``defer_from`` GPU samples, the
    run without its sampled series, its spans and its step events (`model.NODE_READ_TABLES`,
    left empty; the events of other kinds are read) and where they are: a diagnosis in parts
    reads each node's in the worker that analyses it (`analyzers.diagnose`'s ``series``), so
    that no process holds them all. A long run not kept yet whose spans are more than loading
    it whole may hold (`_first_of_long`) is kept file by file first (`keep_by_file`), so
    that it is never whole in one process either."""
    printed_timings.ensure(run_dir)
    if steps is None and ray is None and defer_from is not None:
        made_under = load_cache.key(run_dir, kept_settings(MAX_GPU_SAMPLES, None))
        got = None
        if made_under is not None:
            got = load_cache.read_without_series(run_dir, made_under, defer_from)
            if got is None and _first_of_long(run_dir, defer_from):
                # analysed the first time: its form kept file by file (one file or part of
                # the GPUs per worker, in a child whose memory goes back), then read so
                from gpuprof import keep_by_file

                if in_child(keep_by_file.build, run_dir, workers):
                    got = load_cache.read_without_series(run_dir, made_under, defer_from)
        if got is not None:
            run, series = got
            _note_many_spans(run, series.rows.get("spans", 0))
            merge_run_events(run)
            printed_timings.add_notes(run, run_dir)
            return run, series
    return load_for_analysis(run_dir, MAX_GPU_SAMPLES, workers=workers, ray=ray, steps=steps), None


def _first_of_long(run_dir: str | os.PathLike, least: int) -> bool:
    """Whether ``run_dir`` has no kept form yet, holds more GPU samples than the budget and at
    least ``least``, and more spans than reading it whole may hold (`by_steps`'s rule:
    ~`KEEP_SPAN_BYTES` a span, past `MEMORY_BUDGET_BYTES`): a long run, analysed the first
    time, that is kept file by file. A smaller one is read whole, as before: the whole kept
    form then reads faster every later time (0.19 against 0.64 s at 256 GPUs × 4 h,
    `bench_kept_read.py`)."""
    from gpuprof.by_steps import KEEP_SPAN_BYTES, MEMORY_BUDGET_BYTES

    if load_cache.step_times(run_dir) is not None:  # kept, under other settings
        return False
    try:
        total = store.count_rows(run_dir, "gpu")
        spans = store.count_rows(run_dir, "spans")
    except Exception:  # unreadable: the load says why
        return False
    long = total > MAX_GPU_SAMPLES and total >= least
    return long and spans * KEEP_SPAN_BYTES > MEMORY_BUDGET_BYTES


def in_child(fn: Callable[..., Any], *args: Any) -> Any:
    """``fn(*args)`` in a forked child process (its memory goes back when it ends), or here
    where forking is not available; None when the child fails (the caller reads the run
    files instead)."""
    if "fork" not in multiprocessing.get_all_start_methods():
        return fn(*args)
    try:
        with concurrent.futures.ProcessPoolExecutor(
            max_workers=1, mp_context=multiprocessing.get_context("fork")
        ) as pool:
            return pool.submit(fn, *args).result()
    except Exception:
        return None


def kept_settings(max_gpu_samples: int | None, merge: int | None) -> dict[str, Any]:
    """The load settings a kept form is made under (`load_cache.key`)."""
    return {"max_gpu_samples": max_gpu_samples, "merge": merge, "host_rows": MAX_HOST_ROWS}


def _note_many_spans(run: Run, spans: int | None = None) -> None:
    """Say so in ``run``'s notices when it holds more than `MANY_SPANS` spans (``spans``:
    how many, when they are not in ``run.spans`` but read node by node)."""
    spans = len(run.spans) if spans is None else spans
    if spans > MANY_SPANS:
        run.meta.notices = [
            *run.meta.notices,
            f"{spans:,} spans held in memory (they are not merged): --steps A:B "
            "reads one stretch of the run's steps, in memory that follows its length; "
            "--by-steps N the whole run N steps at a time, on every core",
        ]


def _load(
    run_dir: str | os.PathLike, max_gpu_samples: int | None, merge: int | None,
    workers: int | None, ray: str | None = None, window: StepWindow | None = None,
) -> Run:  # fmt: skip
    merge = merge if merge is not None and merge > 1 else None
    within = step_window.read_filter(window) if window is not None else None
    if merge is None and max_gpu_samples is None:
        return store.load_run(run_dir, reduce=within)
    # a finished run loaded before under the same settings is read as it was kept; a
    # stretch of its steps, from the kept batches that reach into it (merged as the whole
    # run was, so its steps read as they do in the whole run's diagnosis)
    made_under = load_cache.key(run_dir, kept_settings(max_gpu_samples, merge))
    span = (window.start_ns, window.end_ns) if window is not None else None
    kept = load_cache.read(run_dir, made_under, span) if made_under is not None else None
    if (
        kept is None and window is not None and made_under is not None and ray is None
        and merge is None and max_gpu_samples == MAX_GPU_SAMPLES
    ):  # fmt: skip
        # a stretch of a long run whose form is not kept yet: kept first, file by file (in
        # the memory of one file or part of the GPUs per worker), then read as any other
        from gpuprof import keep_by_file

        if keep_by_file.build(run_dir, workers):
            kept = load_cache.read(run_dir, made_under, span)
    if kept is not None:
        if window is not None:  # how the whole run was merged: its counts are the run's
            kept.meta.notices = [
                f"the whole run: {n}" if _merge_notice(n) else n for n in kept.meta.notices
            ]
        return kept
    if window is not None:
        made_under = None  # a stretch read from the files is not the whole run's to keep
    # within a stretch, the rows it holds: about its share of the run's time
    share = window.fraction if window is not None else 1.0
    total = math.ceil(store.count_rows(run_dir, "gpu") * share)
    if merge is not None:
        return _load_merged(
            run_dir, total, None, set(), {}, merge, workers, ray, made_under, window
        )  # fmt: skip
    rows = {table: math.ceil(store.count_rows(run_dir, table) * share) for table in MAX_HOST_ROWS}
    big = {t for t, n in rows.items() if n > MAX_HOST_ROWS[t]}
    if total <= max_gpu_samples and not big:
        run = store.load_run(run_dir, reduce=within)
        _keep(run_dir, made_under, run)
        return run

    return _load_merged(
        run_dir, total, max_gpu_samples, big, rows, None, workers, ray, made_under, window
    )  # fmt: skip


@dataclasses.dataclass
class _TableReducer:
    """Merges a file's host-side table beyond its budget into time buckets (`load_run`'s
    ``reduce``); ``windows`` keeps the bucket width used per table."""

    big: set[str]
    rows: dict[str, int]
    gpu_window_ns: int
    windows: dict[str, int] = dataclasses.field(default_factory=dict)
    within: ReadFilter | None = None
    """A stretch of the run's steps: what lies outside it goes first."""

    def __call__(self, table: str, frame: pd.DataFrame) -> pd.DataFrame:
        if self.within is not None:
            frame = self.within(table, frame)
        if table not in self.big or frame.empty:
            return frame
        step = math.ceil(self.rows[table] / MAX_HOST_ROWS[table])
        window = max(self.gpu_window_ns, step * resample.typical_interval_ns(table, frame))
        self.windows[table] = max(self.windows.get(table, 0), window)
        return resample.reduce_table(table, frame, window)


def _read_reduced(path: Path, skip: tuple[str, ...], reducer: _TableReducer) -> tuple:
    """One file's metadata and frames (`store.read_file`) and the bucket widths used."""
    reducer = dataclasses.replace(reducer, windows={})
    meta, frames = store.read_file(path, skip, reducer)
    return meta, frames, reducer.windows


class _Workers:
    """``map(fn, calls)`` → ``[fn(*args) for args in calls]``, on forked worker processes
    when there are several workers and several calls, else in this process. A pool that
    breaks (a worker killed, say) is said once and the rest runs here."""

    def __init__(self, workers: int) -> None:
        fork = (
            sys.platform.startswith("linux") and "fork" in multiprocessing.get_all_start_methods()
        )
        self.workers = max(1, workers) if fork else 1
        self.notices: list[str] = []
        self._pool: concurrent.futures.ProcessPoolExecutor | None = None

    def map(self, fn: Callable[..., Any], calls: Iterable[Sequence[Any]]) -> list[Any]:
        calls = [tuple(args) for args in calls]
        if self.workers > 1 and len(calls) > 1:
            try:
                if self._pool is None:
                    self._pool = concurrent.futures.ProcessPoolExecutor(
                        max_workers=min(self.workers, len(calls)),
                        mp_context=multiprocessing.get_context("fork"),
                    )  # fmt: skip
                futures = [self._pool.submit(fn, *args) for args in calls]
                return [future.result() for future in futures]
            except concurrent.futures.process.BrokenProcessPool as exc:
                self.notices.append(f"reading on {self.workers} processes failed ({exc}): "
                                    "read by one process instead")  # fmt: skip
                self.close()
                self.workers = 1
        return [fn(*args) for args in calls]

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=True, cancel_futures=True)
            self._pool = None

    def __enter__(self) -> _Workers:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class _RayWorkers:
    """`_Workers`' ``map`` as Ray tasks on the cluster at ``address`` (``auto``: the one this
    machine belongs to), placed by Ray's own scheduler; ``workers`` is the cluster's CPUs,
    the number of GPU parts. Every node running a task must see the run directory at the same
    path (the head's disk, or a shared file system) and have gpuprof installed."""

    MAX_PARTS = 256
    """GPU parts at most, however many CPUs the cluster has (each part re-reads the side
    files' footers)."""

    def __init__(self, address: str) -> None:
        try:
            import ray
        except ImportError:
            raise RunError("--ray needs Ray (pip install ray)") from None
        self.ray = ray
        self.notices: list[str] = []
        self._started = False
        why = _unreachable(address)
        if why:  # Ray itself retries an address that does not answer for minutes
            raise RunError(f"--ray {address}: cannot use the Ray cluster ({why})")
        try:
            if not ray.is_initialized():
                ray.init(address=address, logging_level="ERROR", log_to_driver=False)
                self._started = True
            cpus = int(ray.cluster_resources().get("CPU", 1))
        except Exception as exc:
            raise RunError(f"--ray {address}: cannot use the Ray cluster ({_short(exc)})") from None
        self.workers = max(1, min(cpus, self.MAX_PARTS))

    def map(self, fn: Callable[..., Any], calls: Iterable[Sequence[Any]]) -> list[Any]:
        task = self.ray.remote(num_cpus=1, max_retries=1)(fn)
        calls = [tuple(args) for args in calls]
        # an argument every call shares (the GPUs' span boundaries) goes to the object store
        # once, not once per task
        shared = {}
        for i in range(min((len(args) for args in calls), default=0)):
            first = calls[0][i]
            if len(calls) > 1 and all(args[i] is first for args in calls) and not isinstance(
                first, str | int | float | Path | type(None)
            ):  # fmt: skip
                shared[i] = self.ray.put(first)
        refs = [task.remote(*(shared.get(i, a) for i, a in enumerate(args))) for args in calls]
        try:
            return self.ray.get(refs)
        except self.ray.exceptions.RayTaskError as exc:
            cause = exc.as_instanceof_cause()
            if isinstance(cause, RunError):
                raise RunError(str(cause).splitlines()[0]) from None
            raise RunError(f"a Ray task reading the run failed ({_short(exc)})") from None

    def close(self) -> None:
        if self._started:
            self.ray.shutdown()
            self._started = False

    def __enter__(self) -> _RayWorkers:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _unreachable(address: str, timeout_s: float = 3.0) -> str | None:
    """Why nothing answers at a ``host:port`` Ray address (``ray://`` too), or None: it
    answers, or the address is a word (``auto``, ``local``) Ray resolves itself."""
    import socket

    host, sep, port = address.removeprefix("ray://").rpartition(":")
    if not sep or not port.isdigit():
        return None
    try:
        with socket.create_connection((host.strip("[]") or "127.0.0.1", int(port)), timeout_s):
            return None
    except OSError as exc:
        return f"nothing answers at {host}:{port}: {exc.strerror or exc}"


def _short(exc: BaseException) -> str:
    lines = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {lines[-1] if lines else ''}"[:300]


def _load_merged(
    run_dir: str | os.PathLike,
    total: int,
    max_gpu_samples: int | None,
    big: set[str],
    rows: dict[str, int],
    merge: int | None,
    workers: int | None = None,
    ray: str | None = None,
    made_under: dict[str, Any] | None = None,
    window: StepWindow | None = None,
) -> Run:
    """The run merged; kept beside it (`load_cache`) when ``made_under`` is its key and the
    run is finished and did not change while it was read. With ``window``, only that stretch
    of its steps is read (give or take `step_window.READ_MARGIN_NS`)."""
    factor = 1
    interval_ns = 0
    if merge is not None or (max_gpu_samples is not None and total > max_gpu_samples):
        stream = store.iter_gpu_samples(run_dir)
        interval_ns = _interval_ns(next(stream, None))
        stream.close()
        factor = merge or math.ceil(total / max(1, max_gpu_samples or 1))
    within = step_window.read_filter(window) if window is not None else None
    reducer = _TableReducer(big, rows, factor * interval_ns, within=within)
    windows: dict[str, int] = {}
    skip = ("gpu",) if factor > 1 else ()

    pool_of = (
        (lambda: _RayWorkers(ray)) if ray else (lambda: _Workers(workers or default_workers()))
    )
    with pool_of() as pool:

        def read(paths: Sequence[Path]) -> list[tuple]:
            out = []
            for meta, frames, used in pool.map(_read_reduced, [(p, skip, reducer) for p in paths]):
                for table, window in used.items():
                    windows[table] = max(windows.get(table, 0), window)
                out.append((meta, frames))
            return out

        run = store.load_run(run_dir, read=read)
        if factor > 1:
            span = (window.start_ns, window.end_ns) if window is not None else None
            run.gpu = _reduced_gpu(run_dir, run, total, max_gpu_samples, merge, pool, span)
    notices = []
    about = "about " if window is not None else ""  # a stretch's counts are estimated
    if factor > 1:
        notices.append(
            f"{_LONG_RUN}{about}{total:,} GPU samples analysed as {len(run.gpu):,} (up to "
            f"{run.gpu.attrs.get('factor', factor)} consecutive samples merged within each phase)"
        )
    for table, width in sorted(windows.items()):
        notices.append(
            f"{about}{rows[table]:,} {table} samples merged into {width / 1e9:g} s buckets"
        )
    run.meta.notices = [*run.meta.notices, *notices]
    _keep(run_dir, made_under, run)
    # how this reading went (a pool that broke) is this reading's, not the run's to keep
    run.meta.notices = [*run.meta.notices, *pool.notices]
    return run


_LONG_RUN = "long run: "
_BUCKETS = re.compile(r"(about )?[\d,]+ \w+ samples merged into ")


def _merge_notice(text: str) -> bool:
    """Whether ``text`` is one of the notices `_load_merged` gives of its merging."""
    return text.startswith(_LONG_RUN) or _BUCKETS.match(text) is not None


def _keep(run_dir: str | os.PathLike, made_under: dict[str, Any] | None, run: Run) -> None:
    """Keep ``run`` as `load_for_analysis` made it of ``run_dir`` (`load_cache`) when it is
    finished and its files did not change while they were read."""
    if made_under is None or run.meta.end_ns is None:
        return
    if made_under == load_cache.key(run_dir, made_under["settings"]):
        load_cache.write(run_dir, made_under, run)


def _reduced_gpu(
    run_dir: str | os.PathLike,
    run: Run,
    total: int,
    budget: int | None,
    merge: int | None,
    pool: _Workers | _RayWorkers,
    span: tuple[int, int] | None = None,
) -> pd.DataFrame:
    """The run's GPU samples merged to about ``budget`` rows (or by exactly ``merge``), one
    GPU at a time, in ``pool``'s workers (a part of the GPUs each); with ``span``
    (start, end epoch ns on the run's clock), only the samples taken within it."""
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
    n = pool.workers
    calls = [(run_dir, part, n, bounds, factor, offsets, span) for part in range(n)]
    ordered = sorted((item for got in pool.map(_reduce_gpu_part, calls) for item in got),
                     key=lambda item: item[0])  # fmt: skip
    parts = [frame for _, frame in ordered]
    del ordered
    for part in parts:  # one category set per column, so the concatenation keeps codes
        for name in ("host", "uuid"):
            part[name] = part[name].astype(object)
    if not parts:  # a run with no GPU samples (a framework's log alone) has none to merge
        gpu = run.gpu.copy()
    else:
        gpu = pd.concat(parts, ignore_index=True)
        gpu = gpu.sort_values("t_ns", kind="stable", ignore_index=True)
    del parts
    gpu.attrs["factor"] = factor
    return gpu


def _reduce_gpu_part(
    run_dir: str | os.PathLike, part: int, parts: int, bounds: dict[tuple, np.ndarray],
    factor: int, offsets: dict[str, int], span: tuple[int, int] | None = None,
) -> list[tuple[tuple[int, int, int], pd.DataFrame]]:  # fmt: skip
    """Part ``part`` of ``parts`` of the run's GPU samples (`store.iter_gpu_parts`), each GPU
    put on the run's clock, cut to ``span`` when given and merged by ``factor`` within
    ``bounds``, with its place in the stream."""
    out = []
    for place, frame in store.iter_gpu_parts(run_dir, True, part, parts):
        key = (frame["host"].iloc[0], int(frame["gpu"].iloc[0]))
        if offsets.get(key[0]):
            frame["t_ns"] = frame["t_ns"].to_numpy(np.int64) + offsets[key[0]]
        if span is not None:
            t = frame["t_ns"].to_numpy(np.int64)
            frame = frame[(t >= span[0]) & (t < span[1])].reset_index(drop=True)
            if frame.empty:
                continue
        out.append((place, resample.reduce_gpu(frame, bounds.get(key), factor)))
    return out


def _interval_ns(frame: pd.DataFrame | None) -> int:
    """The typical sampling interval of one GPU's samples, in ns (0.1 s when unknown)."""
    if frame is None or len(frame) < 2:
        return 100_000_000
    gaps = np.diff(frame["t_ns"].to_numpy(np.int64))
    gaps = gaps[gaps > 0]
    return int(resample.typical_gap(gaps)) if len(gaps) else 100_000_000
