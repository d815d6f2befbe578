"""The kept form of a long run (`load_cache`) made file by file, without loading the run.

`loader.load_for_analysis` keeps what it made of a finished run beside it, but only by
making it whole: every span and every merged GPU sample in one process, ~0.7 KB a span (a
cluster-day is ~17 M spans). `build` makes the same kept form, table for table and row for
row, while holding one run file's host-side tables, or one part of the GPUs, per worker:

1. each run file's host-side tables are read (merged into buckets past their budgets, as the
   loader does) and summarised: its metadata, its ranks' collectives (what aligns the nodes'
   clocks), its span-recording processes (what decides which process owns each GPU), its
   process and GPU-process samples;
2. the run's clock offsets and the GPUs' owners are found from those summaries, as
   `store.load_run` and `ownership.gpu_owner` find them from the whole run;
3. each file's tables, as step 1 read them (kept aside as Arrow, faster to read back than
   the file is to decode again), are put on the run's clock, typed and sorted as the whole
   run's tables would be, and written as parts of the kept tables; the instants its
   processes' spans start and end (where the GPUs they own may not be merged across) come
   back;
4. the GPU samples are merged a part of the GPUs per worker (`loader._reduce_gpu_part`) and
   written as parts, each row with its place in the samples' stream.

A kept table made this way is a list of part files (`load_cache` reads them in order and
sorts the rows as the whole run's table is sorted: stably by time, and GPU samples at the
same instant in stream order), so reading it gives what loading the run whole gives, and a
stretch of steps decodes only the batches of each part that reach into it. Memory: one file
or one GPU part per worker, plus the span boundaries of the GPUs' owners (16 B a span) and
the ranks' collectives.
"""

from __future__ import annotations

import math
import os
import shutil
import uuid
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from gpuprof import clocks, load_cache, loader, store
from gpuprof.analyzers import resample
from gpuprof.analyzers.ownership import _gpu_owner
from gpuprof.analyzers.spans import valid_spans
from gpuprof.model import INTERNED_TABLES, RECORD_TYPES, Run, RunMeta, span_depths
from gpuprof.step_window import step_times

_READ = "read"
"""Where, inside the kept form being made, step 1 keeps each file's tables for step 3."""
_SIDE = ("procs", "gpu_procs")
"""Host-side tables the owners of the GPUs are found from (bounded by the loader's budgets)."""
PART_ROWS = 500_000
"""Merged GPU samples a part of the GPUs holds, about, at most: the GPUs are merged in
enough parts that each worker's part stays near this, whatever the run's size."""


class _Abandon(Exception):
    """What was made cannot stand for the run (it did not end, or its files changed while
    they were read): nothing is kept."""


def build(run_dir: str | Path, workers: int | None = None) -> bool:
    """Keep the form `loader.load_for_analysis` (default settings) makes of the finished long
    run at ``run_dir``, made file by file; False when nothing was kept: the run is not long
    enough to be merged (it loads whole in little memory), not finished, changed while it
    was read, or its directory cannot be written."""
    run_dir = Path(run_dir)
    settings = loader.kept_settings(loader.MAX_GPU_SAMPLES, None)
    made_under = load_cache.key(run_dir, settings)
    if made_under is None or not os.access(run_dir, os.W_OK):  # nothing to keep, or nowhere
        return False
    total = store.count_rows(run_dir, "gpu")
    if total <= loader.MAX_GPU_SAMPLES:
        return False
    rows = {table: store.count_rows(run_dir, table) for table in loader.MAX_HOST_ROWS}
    big = {t for t, n in rows.items() if n > loader.MAX_HOST_ROWS[t]}
    stream = store.iter_gpu_samples(run_dir)
    interval_ns = loader._interval_ns(next(stream, None))
    stream.close()
    reducer = loader._TableReducer(
        big, rows, math.ceil(total / loader.MAX_GPU_SAMPLES) * interval_ns
    )
    paths = store.run_files(run_dir)
    if not _finished(run_dir, paths):  # found from the files' metadata alone, before reading
        return False
    tmp = run_dir / f"{load_cache.DIRNAME}.tmp-{uuid.uuid4().hex[:8]}"
    made = uuid.uuid4().hex
    try:
        tmp.mkdir()
    except OSError:
        return False
    try:
        (tmp / _READ).mkdir()
        with loader._Workers(workers or loader.default_workers()) as pool:
            meta, parts, steps = _made(run_dir, paths, reducer, total, rows, pool, (tmp, made))
        shutil.rmtree(tmp / _READ)
        if meta.end_ns is None:
            raise _Abandon("not finished")
        if made_under != load_cache.key(run_dir, settings):
            raise _Abandon("changed while read")
        return load_cache.place(run_dir, tmp, made_under, made, meta, parts, steps)
    except (_Abandon, ValueError, TypeError, OSError):
        shutil.rmtree(tmp, ignore_errors=True)
        return False
    except BaseException:  # a damaged run file (RunError), an interrupt: nothing half-made
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def _finished(run_dir: Path, paths: list[Path]) -> bool:
    """Whether the run's metadata, put together as a load does, says it ended."""
    metas = []
    for path in paths:
        meta, _ = store.read_file(path, tuple(RECORD_TYPES))
        metas.extend(v for k, v in meta.items() if k == "run" or k.startswith("run."))
    return store.merge_meta(metas, run_dir).end_ns is not None


def _made(
    run_dir: Path, paths: list[Path], reducer: Any, total: int, rows: dict[str, int],
    pool: Any, into: tuple[Path, str],
) -> tuple[RunMeta, dict[str, list[dict[str, Any]]], pd.DataFrame | None]:  # fmt: skip
    """Steps 1–4: the parts written into ``into`` (directory, the writing's id), and the
    run's metadata, the parts of each table (`load_cache.write_part`) and its step times."""
    skip = ("gpu",)
    scans = pool.map(_scan, [(p, i, skip, reducer, into) for i, p in enumerate(paths)])
    metas = [m for scan in scans for m in scan["metas"]]
    meta = store.merge_meta(metas, run_dir if run_dir.is_dir() else run_dir.parent)
    offsets = {s["stored"].node: s["stored"] for s in scans if s["stored"] is not None}
    # how many files hold rows of each table: one file's frame is taken as read, several
    # are put together and typed (`store.load_run`); a column typed int in one and float in
    # another is float in all
    holders = {t: sum(t in s["filled"] for s in scans) for t in RECORD_TYPES}
    dtypes = _common_dtypes(scans, holders)
    side = {t: _together([s[t] for s in scans], t, holders[t]) for t in ("events", *_SIDE)}
    tables = {"spans": _together([s["collectives"] for s in scans], "spans", holders["spans"]),
              **side}  # fmt: skip
    span_hosts = set().union(*(s["span_hosts"] for s in scans))
    found = store._align_nodes(meta, tables, set(offsets), span_hosts)
    offsets.update(found)
    meta.clocks = {node: offset.to_dict() for node, offset in sorted(offsets.items())}
    for name in side:  # as the whole run's, on the run's clock and in its order
        side[name] = _ordered(name, tables[name])
    if not meta.hosts:
        meta.hosts = sorted(set().union(*(s["hosts"] for s in scans)))
    owners = _owners(run_dir, meta, side, scans)
    estimated = {node: o.offset_ns for node, o in found.items()}
    calls = [(p, i, s["read"], s["stored"], estimated, holders, dtypes, owners, into)
             for i, (p, s) in enumerate(zip(paths, scans, strict=True))]  # fmt: skip
    written = pool.map(_write_file, calls)
    bounds = {key: b for got in written for key, b in got["bounds"].items()}
    windows: dict[str, int] = {}
    for scan in scans:
        for table, width in scan["windows"].items():
            windows[table] = max(windows.get(table, 0), width)
    n_bounds = sum(len(b) for b in bounds.values())
    budget = loader.MAX_GPU_SAMPLES
    factor = math.ceil(total / max(budget - n_bounds, budget // 4, 1))
    clock = {node: int(c.get("offset_ns") or 0) for node, c in meta.clocks.items()}
    # parts small enough that a worker holds little of the merged samples at a time, and at
    # least one per worker
    n = max(pool.workers, math.ceil((min(total, budget) + n_bounds) / PART_ROWS))
    pool.close()  # the GPU parts' workers are forked with the boundaries in their memory
    _BOUNDS.update(bounds)
    del bounds
    try:
        gpu_parts = pool.map(
            _write_gpu_part, [(run_dir, k, n, factor, clock, into) for k in range(n)]
        )
    finally:
        _BOUNDS.clear()
    parts: dict[str, list[dict[str, Any]]] = {t: [] for t in RECORD_TYPES}
    for got in written:
        for table, part in got["parts"].items():
            parts[table].append(part)
    parts["gpu"] = [p for p in gpu_parts if p is not None]
    interned = {t: [got["interned"][t] for got in written if t in got["interned"]]
                for t in INTERNED_TABLES}  # fmt: skip
    for table, frames in interned.items():
        frame = _together(frames, table, holders[table])
        frame = frame.drop_duplicates(INTERNED_TABLES[table], ignore_index=True)
        parts[table] = [load_cache.write_part(into, table, 0, frame)]
    merged_rows = sum(p["rows"] for p in parts["gpu"])
    notices = [
        f"{loader._LONG_RUN}{total:,} GPU samples analysed as {merged_rows:,} (up to "
        f"{factor} consecutive samples merged within each phase)"
    ]
    for table, width in sorted(windows.items()):
        notices.append(f"{rows[table]:,} {table} samples merged into {width / 1e9:g} s buckets")
    meta.notices = [*meta.notices, *notices]
    for table in RECORD_TYPES:
        if not parts[table]:  # no rows anywhere: the empty table, as one part
            parts[table] = [load_cache.write_part(into, table, 0, store._empty(table))]
    for part in parts["gpu"]:
        part["attrs"] = {"factor": factor}
    per_file = [got["steps"] for got in written if got["steps"] is not None]
    steps = None
    if per_file:
        steps = (
            pd.concat(per_file)
            .groupby(level=0)
            .agg(start_ns=("start_ns", "min"), end_ns=("end_ns", "max"))
        )
    return meta, parts, steps


def _scan(
    path: Path, index: int, skip: tuple[str, ...], reducer: Any, into: tuple[Path, str]
) -> dict[str, Any]:
    """Step 1 for one file: what the run's clocks and the GPUs' owners are found from; the
    file's tables as read, kept aside for step 3 (``read``: `_READ` parts, Arrow IPC, which
    reads back far faster than decoding and bucketing the file again)."""
    meta, frames, windows = loader._read_reduced(path, skip, reducer)
    scratch = (into[0] / _READ, into[1])
    read = {t: load_cache.write_part(scratch, t, index, f) for t, f in frames.items() if len(f)}
    stored = clocks.stored_offset(path.name.split(".")[0], meta.get("clock"))
    if stored is not None:
        clocks.shift(frames, stored.offset_ns)
    spans = frames["spans"]
    dtypes = {t: {c: str(d) for c, d in store._typed(t, f).dtypes.items()}
              for t, f in frames.items() if not f.empty and t not in INTERNED_TABLES}  # fmt: skip
    collectives = spans.iloc[0:0]
    processes = pd.DataFrame()
    if len(spans):
        collectives = _calls(spans[(spans["phase"] == "collective") & spans["rank"].notna()])
        processes = _processes(spans.sort_values("start_ns", kind="stable", ignore_index=True))
    events = frames["events"]
    if len(events) and "kind" in events:
        events = events[events["kind"] == "process"].reset_index(drop=True)
    hosts = set()
    for frame in frames.values():
        if "host" in frame and len(frame):
            hosts.update(frame["host"].dropna().unique().tolist())
    return {
        "metas": [v for k, v in meta.items() if k == "run" or k.startswith("run.")],
        "read": read,
        "stored": stored,
        "windows": windows,
        "filled": {t for t, f in frames.items() if not f.empty},
        "dtypes": dtypes,
        "collectives": collectives,
        "processes": processes,
        "span_hosts": set(spans["host"].dropna().unique().tolist()) if len(spans) else set(),
        "hosts": hosts,
        "events": events,
        **{t: frames[t] for t in _SIDE},
    }


_CALL_COLUMNS = ("host", "rank", "phase", "name", "start_ns", "end_ns", "gpu_start_ns",
                 "gpu_end_ns", "attrs")  # fmt: skip
"""What `clocks.estimate_from_collectives` reads of a collective span."""


def _calls(collectives: pd.DataFrame) -> pd.DataFrame:
    """The collectives as the clocks' estimate reads them, each attrs reduced to the two
    keys it reads and shared between calls that agree (a cluster-day has millions)."""
    out = collectives[list(_CALL_COLUMNS)].reset_index(drop=True)
    shared: dict[tuple, dict[str, Any]] = {}
    small = []
    for attrs in out["attrs"]:
        a = attrs if isinstance(attrs, dict) else {}
        key = (a.get("async"), a.get("group_size"))
        got = shared.get(key)
        if got is None:
            got = shared[key] = {
                k: v for k, v in zip(("async", "group_size"), key) if v is not None
            }
        small.append(got)
    out["attrs"] = pd.Series(small, index=out.index, dtype=object)
    return out


def _processes(spans: pd.DataFrame) -> pd.DataFrame:
    """The file's span-recording processes as `ownership._span_processes` reads them from
    the run's valid spans (in time order): one row each, its first rank and local rank, and
    its spans' time as one span from 0."""
    valid, _ = valid_spans(Run(meta=RunMeta(run_id=""), spans=spans))
    if valid.empty:
        return pd.DataFrame()
    dur = valid["end_ns"].to_numpy(np.int64) - valid["start_ns"].to_numpy(np.int64)
    got = (
        valid.assign(dur_ns=dur)
        .groupby(["host", "pid"], sort=False)
        .agg(rank=("rank", "first"), local_rank=("local_rank", "first"), dur_ns=("dur_ns", "sum"))
        .reset_index()
    )
    return pd.DataFrame({
        "host": got["host"].astype(object), "pid": got["pid"].astype(np.int64),
        "rank": got["rank"].astype(np.float64), "local_rank": got["local_rank"].astype(np.float64),
        "start_ns": np.zeros(len(got), dtype=np.int64), "end_ns": got["dur_ns"].astype(np.int64),
    })  # fmt: skip


def _common_dtypes(scans: list[dict], holders: dict[str, int]) -> dict[str, dict[str, str]]:
    """Per table read from several files, each column's dtype in the whole run's typed
    table: float64 where a file's is (an int column with gaps somewhere)."""
    out: dict[str, dict[str, str]] = {}
    for table, count in holders.items():
        if count < 2 or table in INTERNED_TABLES:
            continue
        seen: dict[str, set[str]] = {}
        for scan in scans:
            for column, dtype in scan["dtypes"].get(table, {}).items():
                seen.setdefault(column, set()).add(dtype)
        out[table] = {c: ("float64" if "float64" in d else d.pop()) for c, d in seen.items()
                      if len(d) == 1 or d <= {"int64", "float64"}}  # fmt: skip
    return out


def _together(frames: Sequence[pd.DataFrame], table: str, holders: int) -> pd.DataFrame:
    """Frames of several files as `store.load_run` puts a table together (typed when more
    than one file holds rows of it)."""
    filled = [f for f in frames if not f.empty]
    if not filled:
        return store._empty(table)
    if len(filled) == 1 and holders < 2:
        return filled[0]
    return store._typed(table, pd.concat(filled, ignore_index=True))


def _ordered(table: str, frame: pd.DataFrame) -> pd.DataFrame:
    """``frame`` in the whole run's order (stably by time)."""
    if frame.empty:
        return frame
    key = store._SORT_KEY.get(table, "t_ns")
    if frame[key].is_monotonic_increasing:
        return frame.reset_index(drop=True)
    return frame.sort_values(key, kind="stable", ignore_index=True)


def _owners(
    run_dir: Path, meta: RunMeta, side: dict[str, pd.DataFrame], scans: list[dict]
) -> pd.DataFrame:
    """`ownership.gpu_owner` of the whole run, from the files' span-recording processes."""
    keys = store.gpu_keys(run_dir)
    inventory = pd.DataFrame(
        {"host": keys["host"].astype(object), "gpu": keys["gpu"].astype(np.int64),
         "uuid": keys["uuid"].astype(object)}
    )  # fmt: skip
    processes = [s["processes"] for s in scans if len(s["processes"])]
    spans = pd.concat(processes, ignore_index=True) if processes else pd.DataFrame(
        {"host": [], "pid": [], "rank": [], "local_rank": [], "start_ns": [], "end_ns": []}
    )  # fmt: skip
    stub = Run(meta=meta, gpu=inventory, **side)
    return _gpu_owner(stub, spans)


def _write_file(
    path: Path, index: int, read: dict[str, dict[str, Any]], stored: Any,
    estimated: dict[str, int], holders: dict[str, int], dtypes: dict[str, dict[str, str]],
    owners: pd.DataFrame, into: tuple[Path, str],
) -> dict[str, Any]:  # fmt: skip
    """Step 3 for one file (its tables as step 1 read them, ``read``): on the run's clock,
    typed and sorted as the whole run's, written as parts; the span boundaries of the GPUs
    its processes own; its steps."""
    frames = {t: load_cache.read_part(into[0] / _READ, into[1], spec) for t, spec in read.items()}
    if stored is not None:
        clocks.shift(frames, stored.offset_ns)
    for node, offset in estimated.items():
        clocks.shift_node(frames, node, offset)
    out: dict[str, Any] = {"parts": {}, "interned": {}, "bounds": {}, "steps": None}
    for table, frame in frames.items():
        if frame.empty or table == "gpu":
            continue
        frame = _together([frame], table, holders[table])
        if table in INTERNED_TABLES:
            out["interned"][table] = frame
            continue
        for column, dtype in dtypes.get(table, {}).items():
            if column in frame and str(frame[column].dtype) != dtype:
                frame[column] = frame[column].astype(dtype)
        frame = _ordered(table, frame)
        if table == "spans":
            frame["depth"] = span_depths(frame)
            valid, _ = valid_spans(Run(meta=RunMeta(run_id=""), spans=frame))
            recorded = set(zip(valid["host"], valid["pid"].astype(np.int64), strict=True))
            mine = owners[[
                (h, int(p)) in recorded if h is not None and np.isfinite(p) else False
                for h, p in zip(owners["owner_host"], owners["pid"], strict=True)
            ]]  # fmt: skip
            out["bounds"] = resample.owner_boundaries(valid, mine)
            steps = step_times(frame)
            out["steps"] = steps if len(steps) else None
        out["parts"][table] = load_cache.write_part(into, table, index, frame)
    return out


_BOUNDS: dict[tuple, np.ndarray] = {}
"""The GPUs' owners' span boundaries while the GPU parts are merged: set before their worker
processes are forked, so that each has them without a copy sent (tens of MB at 256 GPUs ×
4 h; 16 B per span)."""


def _write_gpu_part(
    run_dir: Path, part: int, parts: int, factor: int, offsets: dict[str, int],
    into: tuple[Path, str],
) -> dict[str, Any] | None:  # fmt: skip
    """Step 4: part ``part`` of ``parts`` of the GPU samples merged as the loader merges them
    (`loader._reduce_gpu_part`, within `_BOUNDS`), with each row's place, written as one kept
    part."""
    got = sorted(loader._reduce_gpu_part(run_dir, part, parts, _BOUNDS, factor, offsets),
                 key=lambda item: item[0])  # fmt: skip
    if not got:
        return None
    frames = []
    for (index, kind, group), frame in got:
        for name in ("host", "uuid"):
            frame[name] = frame[name].astype(object)
        frame[load_cache.PLACE] = np.int64((index << 34) | (kind << 32) | group)
        frames.append(frame)
    frame = pd.concat(frames, ignore_index=True)
    frame = frame.sort_values("t_ns", kind="stable", ignore_index=True)
    return load_cache.write_part(into, "gpu", part, frame)
