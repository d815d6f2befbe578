"""What the loader made of a finished run, kept beside it so that a run is read once.

`loader.load_for_analysis` reads a run's files (decoding, types, clocks, order, span depths)
and merges a run too long to analyse as recorded (a cluster-day is tens of millions of GPU
samples, minutes of CPU to decode and merge). What it makes (the `Run` as loaded) is kept in
the run directory, in ``.gpuprof-loaded/``: one Arrow IPC file per table (LZ4; text
dictionary-encoded) and ``run.json`` with the run's metadata and the key the files were made
under. A later load with the same key reads those instead of the run files; `gpuprof watch`'s
own summary makes them as the run ends, so the first ``analyze`` after it is already fast.
Each table is kept in batches whose times ``run.json`` records, so that a stretch of the run
(``--steps``, `step_window`) decodes only the batches that reach into it. A long run's kept
form may also be made file by file (`keep_by_file`): each table is then a list of part files
(`write_part`, put in place by `place`), read one after the other and sorted as the whole
run's table is (`_in_order`); what is read is the same. A run may also be read without its
sampled series (`read_without_series`), which are then read node by node where they are
analysed (`KeptSeries`: the rows of some hosts, filtered batch by batch as they are decoded).

The key is the run files' names, sizes and modification times (the SQLite files and their
columnar side files), the load settings and this format's version: any change to the run,
or to how it is loaded, misses. Nothing is kept for a run still being written (no end
time, or a write-ahead log not yet folded in), for a read-only directory (silently: the
load costs what it did), or when ``GPUPROF_LOAD_CACHE=0``. The files hold data only
(Arrow and JSON, no pickle): reading a run directory from someone else runs no code of
theirs. A file that does not read is ignored and rewritten.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import uuid
from collections.abc import Collection, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from gpuprof import store
from gpuprof.model import (
    INTERNED_TABLES,
    NODE_READ_TABLES,
    RECORD_TYPES,
    Run,
    RunMeta,
    column_kinds,
)

DIRNAME = ".gpuprof-loaded"
ENV_CACHE = "GPUPROF_LOAD_CACHE"
"""``0`` (or ``off``, ``no``, ``false``): neither read nor write the kept form."""
VERSION = 2
"""Bump when what `loader` makes of a run changes (reading, merging, bucketing, the tables)
or how it is kept: older kept files then miss. 2: tables kept in batches with their times."""
BATCH_ROWS = 262_144
"""Rows per record batch of a kept table. Each batch's time range is kept with it, so a
stretch of a run (`read` with ``span``) decodes only the batches that reach into it, one at
a time: memory follows the stretch, not the run."""
PLACE = "_place"
"""Column of a GPU part kept file by file (`keep_by_file`): each row's place in the samples'
stream (`store.iter_gpu_parts`) as one int64, what orders samples taken at the same instant;
dropped on reading."""
_MADE = b"gpuprof.made"
"""Schema metadata of each kept table: the writing it belongs to (``run.json``'s ``made``)."""
_DATA_SUFFIXES = (".sqlite", ".parquet")
_WAL = ".sqlite-wal"


def enabled() -> bool:
    return os.environ.get(ENV_CACHE, "").strip().lower() not in ("0", "off", "no", "false")


def key(run_dir: str | os.PathLike, settings: dict[str, Any]) -> dict[str, Any] | None:
    """What a kept form must have been made under to stand for ``run_dir`` loaded with
    ``settings`` (JSON values), or None: nothing is kept for this run (not a directory,
    turned off, or a write-ahead log still holds rows)."""
    run_dir = Path(run_dir)
    if not enabled() or not run_dir.is_dir():
        return None
    files = []
    try:
        for entry in sorted(os.scandir(run_dir), key=lambda e: e.name):
            if entry.name.startswith(".") or not entry.is_file():
                continue
            if entry.name.endswith(_WAL):
                if entry.stat().st_size > 0:
                    return None  # being written, or its rows not folded in yet
                continue  # an empty log: touched by every reader, says nothing
            if entry.name.endswith(_DATA_SUFFIXES):
                stat = entry.stat()
                files.append([entry.name, stat.st_size, stat.st_mtime_ns])
    except OSError:
        return None
    if not files:
        return None
    return {"version": VERSION, "settings": settings, "files": files}


def read(
    run_dir: str | os.PathLike, want: dict[str, Any], span: tuple[int, int] | None = None,
    *, hosts: Sequence[str] | None = None, only: Collection[str] | None = None,
    without_step_events: bool = False,
) -> Run | None:  # fmt: skip
    """The kept form of ``run_dir`` when it was made under ``want``, else None. With ``span``
    (start, end epoch ns), only the rows of each table that may lie within it: the batches
    whose times reach into it, less the rows of those outside it (spans: those that do not
    overlap it); `step_window.cut` makes the exact cut. ``only``: just these tables (the
    others without rows, with their kept columns); ``hosts``: of each table with a ``host``
    column, only the rows these hosts recorded, in the table's order (`parts.cut`'s rows);
    ``without_step_events``: the events less those of kind ``step`` (which grow with ranks
    × steps)."""
    where = Path(run_dir) / DIRNAME
    try:
        with open(where / "run.json", encoding="utf-8") as handle:
            kept = json.load(handle)
        if kept.get("key") != want:
            return None
        meta = RunMeta.from_dict(kept["meta"])
        tables = {}
        for table, spec in kept["tables"].items():
            if table not in RECORD_TYPES:
                return None
            skip = only is not None and table not in only
            drop = ("step",) if without_step_events and table == "events" else None
            tables[table] = _read_table(where, kept["made"], table, spec, span, hosts, skip,
                                        drop)  # fmt: skip
    except Exception:  # missing, half-copied, from another version: made again
        return None
    return Run(meta=meta, **tables)


def _read_table(
    where: Path, made: str, table: str, spec: dict[str, Any], span: tuple[int, int] | None,
    hosts: Sequence[str] | None, empty: bool = False, drop_kinds: Sequence[str] | None = None,
) -> pd.DataFrame:  # fmt: skip
    """One kept table (`read`); ``empty``: none of its rows, its columns as kept;
    ``drop_kinds``: less its rows of these kinds. Raises ValueError when a file is of
    another writing or holds other rows than it should."""
    import pyarrow as pa

    pieces = []
    listed = spec.get("parts") or [{"file": f"{table}.arrow", **spec}]
    if hosts is not None and not empty:
        # a part that names its hosts and none of these holds none of their rows: unopened
        # (one node's spans of a cluster-day are one file of 128, not all of them decoded)
        wanted = {str(h) for h in hosts}
        named = [p for p in listed if p.get("hosts") is None or wanted & set(p["hosts"])]
        listed = named or listed[:1]  # one read for the columns when no part holds them
    for part in listed:
        with pa.memory_map(str(where / part["file"])) as source:
            reader = pa.ipc.open_file(source)
            # a file of another writing (two loads keeping at once, under different
            # settings, swapped the directory while this one read it)
            if (reader.schema.metadata or {}).get(_MADE) != made.encode():
                raise ValueError(f"{part['file']}: written by another making")
            if empty:
                pieces.append(reader.schema.empty_table())
                break
            times = {"times": part["times"]} if part.get("times") is not None else {}
            pieces.append(_batches(reader, {**spec, **times}, span, hosts, drop_kinds))
    data = pieces[0] if len(pieces) == 1 else pa.concat_tables(pieces)
    del pieces
    whole = span is None and hosts is None and not drop_kinds
    if whole and not empty and data.num_rows != spec["rows"]:
        raise ValueError(f"{table}: {data.num_rows} rows kept, {spec['rows']} recorded")
    if "parts" in spec:
        data = _in_order(table, data)
    frame = _frame(data, {**spec, "rows": data.num_rows})
    del data
    return frame


class SeriesUnreadable(store.RunError):
    """The sampled series of a run read without them no longer read: its kept form was made
    again (another load, other settings) or damaged since. The run is to be read afresh."""


class KeptSeries:
    """Where the sampled series, the spans and the events (`model.NODE_READ_TABLES`) of a
    run read without them (`read_without_series`) are read from: node by node, by whoever
    analyses those nodes (a worker holding a part of the run, `analyzers.part_workers`), or
    whole.
    What is read is what `read` gives, the same rows in the same order."""

    def __init__(self, run_dir: Path, want: dict[str, Any], kept: dict[str, Any]):
        self.run_dir = Path(run_dir)
        self._want = want
        self._made = str(kept["made"])
        self._specs = {t: kept["tables"][t] for t in NODE_READ_TABLES if t in kept["tables"]}
        self.rows: dict[str, int] = {t: int(s["rows"]) for t, s in self._specs.items()}
        """Rows of each table read here."""
        self._census: tuple[bool, dict[str, int], set[str]] | None = None

    def read(self, hosts: Sequence[str] | None = None) -> dict[str, pd.DataFrame]:
        """Each table read here, whole or (``hosts``) the rows those hosts recorded. Raises
        `SeriesUnreadable` when the kept form changed since the run was read (another load
        kept it again) or does not read: the run is to be read afresh."""
        where = self.run_dir / DIRNAME
        try:
            return {t: _read_table(where, self._made, t, spec, None, hosts)
                    for t, spec in self._specs.items()}  # fmt: skip
        except Exception as exc:
            raise SeriesUnreadable(self._unreadable(exc)) from None

    def discard(self) -> None:
        """Remove the kept form these series were to be read from when it is still that
        writing (one kept again meanwhile by another load stays), so that the next load reads
        the run's files afresh: a damaged form would otherwise be found again, whose tables
        without the series still read."""
        where = self.run_dir / DIRNAME
        try:
            with open(where / "run.json", encoding="utf-8") as handle:
                made = str(json.load(handle).get("made"))
        except FileNotFoundError:
            return
        except Exception:  # its own description damaged too: it goes as well
            made = self._made
        if made != self._made:
            return
        old = self.run_dir / f"{DIRNAME}.old-{uuid.uuid4().hex[:8]}"
        with contextlib.suppress(OSError):
            where.rename(old)
            shutil.rmtree(old, ignore_errors=True)

    def _unreadable(self, exc: Exception) -> str:
        return (f"{self.run_dir}: its kept form changed, or does not read, since the run was "
                f"read ({type(exc).__name__})")  # fmt: skip

    def census(self) -> tuple[bool, dict[str, int], set[str]]:
        """What the parts of the run are cut by, without reading the series: whether any GPU
        utilisation reading is a finite number, the GPU samples each host recorded, and the
        hosts with rows in any table read here (read once). Raises as `read` does."""
        import pyarrow as pa

        if self._census is not None:
            finite, counts, named = self._census
            return finite, dict(counts), set(named)
        finite, counts, named = False, {}, set()
        where = self.run_dir / DIRNAME
        try:
            for table, spec in self._specs.items():
                names = [c["name"] for c in spec["columns"]]
                wanted = [n for n in ("host", "util_gpu_pct") if n in names]
                if not wanted or (table != "gpu" and "host" not in wanted):
                    continue
                fields = [names.index(n) for n in wanted]
                options = pa.ipc.IpcReadOptions(included_fields=fields)
                for part in spec.get("parts") or [{"file": f"{table}.arrow"}]:
                    with pa.memory_map(str(where / part["file"])) as source:
                        reader = pa.ipc.open_file(source, options=options)
                        if (reader.schema.metadata or {}).get(_MADE) != self._made.encode():
                            raise ValueError(f"{part['file']}: written by another making")
                        for i in range(reader.num_record_batches):
                            batch = reader.get_batch(i)
                            if "host" in wanted:
                                got = _host_counts(batch.column("host"))
                                named |= set(got)
                                if table == "gpu":
                                    for host, n in got.items():
                                        counts[host] = counts.get(host, 0) + n
                            if table == "gpu" and "util_gpu_pct" in wanted and not finite:
                                util = batch.column("util_gpu_pct").to_pandas()
                                util = pd.to_numeric(util, errors="coerce").to_numpy(np.float64)
                                finite = bool(np.isfinite(util).any())
        except Exception as exc:
            raise SeriesUnreadable(self._unreadable(exc)) from None
        self._census = (finite, counts, named)
        return finite, dict(counts), set(named)


def _host_counts(column: Any) -> dict[str, int]:
    """Rows per host of a kept ``host`` column (dictionary-encoded text; nulls not counted)."""
    import pyarrow as pa
    import pyarrow.compute as pc

    if not pa.types.is_dictionary(column.type):
        column = pc.dictionary_encode(column)
    indices = column.indices.to_numpy(zero_copy_only=False)
    if column.null_count:
        indices = indices[pc.is_valid(column).to_numpy(zero_copy_only=False)]
    counts = np.bincount(indices.astype(np.int64), minlength=len(column.dictionary))
    names = column.dictionary.to_pylist()
    return {str(names[i]): int(counts[i]) for i in np.flatnonzero(counts)}


def read_without_series(
    run_dir: str | os.PathLike, want: dict[str, Any], least: int = 0
) -> tuple[Run, KeptSeries] | None:
    """The kept form of ``run_dir`` (made under ``want``) without its sampled series, its spans
    and its step events (`model.NODE_READ_TABLES`: empty, with their kept columns; of the
    events, those of other kinds), and where they are read from; None when it is not kept,
    or it holds fewer than ``least`` GPU samples (it is then read whole, with `read`)."""
    try:
        with open(Path(run_dir) / DIRNAME / "run.json", encoding="utf-8") as handle:
            kept = json.load(handle)
        if kept.get("key") != want or int(kept["tables"]["gpu"]["rows"]) < least:
            return None
        series = KeptSeries(Path(run_dir), want, kept)
    except Exception:  # none kept, another version, cut short: read as the caller would
        return None
    # the events less the step events, which each part reads with its own
    only = [t for t in RECORD_TYPES if t not in NODE_READ_TABLES or t == "events"]
    run = read(run_dir, want, only=only, without_step_events=True)
    if run is None:
        return None
    return run, series


def step_times(run_dir: str | os.PathLike) -> pd.DataFrame | None:
    """The step times (`step_window.step_times`, on the run's clock) the kept form recorded,
    when it stands for the run's files as they are now (whatever the load settings it was
    made under), else None."""
    try:
        with open(Path(run_dir) / DIRNAME / "run.json", encoding="utf-8") as handle:
            kept = json.load(handle)
        now = key(run_dir, {})
        made = kept["key"]
        if now is None or made["version"] != VERSION or made["files"] != now["files"]:
            return None
        rows = np.asarray(kept["steps"], dtype=np.int64).reshape(-1, 3)
    except Exception:  # none kept, another version, cut short: the files say
        return None
    index = pd.Index(rows[:, 0], dtype=np.int64, name="step")
    return pd.DataFrame({"start_ns": rows[:, 1], "end_ns": rows[:, 2]}, index=index)


def _batches(
    reader: Any, spec: dict[str, Any], span: tuple[int, int] | None,
    hosts: Sequence[str] | None = None, drop_kinds: Sequence[str] | None = None,
) -> Any:  # fmt: skip
    """The kept table ``reader`` reads, whole, or with ``span`` its batches that reach into
    it (by the times kept in ``spec``), each less its rows outside it, or with ``hosts``
    (a table with a ``host`` column) each less the rows other hosts recorded, or with
    ``drop_kinds`` (a table with a ``kind`` column) each less its rows of those kinds,
    decoded one at a time."""
    import pyarrow as pa
    import pyarrow.compute as pc

    by_host = hosts is not None and "host" in reader.schema.names
    by_kind = bool(drop_kinds) and "kind" in reader.schema.names
    if (span is None or "times" not in spec) and not by_host and not by_kind:  # whole
        return reader.read_all()
    times = spec.get("times") if span is not None else None
    if times is not None and len(times) != reader.num_record_batches:
        raise ValueError("batch times do not match the batches")
    wanted = pa.array(sorted({str(h) for h in hosts}), type=pa.string()) if by_host else None
    dropped = pa.array(sorted(drop_kinds), type=pa.string()) if by_kind else None
    parts = []
    for i in range(reader.num_record_batches):
        if times is not None:
            first, last = times[i]
            if first is None or last < span[0] or first > span[1]:
                continue  # `end` itself counts: a step's event
        batch = reader.get_batch(i)
        keep = None
        if times is not None:
            start, end = span
            if spec.get("overlap"):  # spans: kept when they overlap the stretch
                keep = pc.and_(pc.less(batch["start_ns"], end), pc.greater(batch["end_ns"], start))
            else:
                t = batch[spec["time"]]
                keep = pc.and_(pc.greater_equal(t, start), pc.less_equal(t, end))
        if by_host:
            mine = _of_hosts(batch.column("host"), wanted)
            keep = mine if keep is None else pc.and_(keep, mine)
        if by_kind:
            other = pc.invert(_of_hosts(batch.column("kind"), dropped))
            keep = other if keep is None else pc.and_(keep, other)
        parts.append(batch.filter(keep) if keep is not None else batch)
        del batch
    if not parts:
        return reader.schema.empty_table()
    return pa.Table.from_batches(parts, schema=reader.schema)


def _of_hosts(column: Any, wanted: Any) -> Any:
    """Whether each row of a kept text column (``host``, ``kind``) is one of ``wanted`` (a
    null is not)."""
    import pyarrow as pa
    import pyarrow.compute as pc

    if pa.types.is_dictionary(column.type):  # each distinct name looked up once
        known = pc.is_in(column.dictionary, value_set=wanted)
        return pc.fill_null(pc.take(known, column.indices), False)
    return pc.fill_null(pc.is_in(column, value_set=wanted), False)


def _in_order(table: str, data: Any) -> Any:
    """A table kept in parts (`keep_by_file`; Arrow, as read), its parts' rows one after the
    other, in the order of the whole run's table: stably by time, GPU samples at the same
    instant in their stream's order (their kept place, then dropped). Ordered before it is
    made a frame: a dictionary-encoded text column moves its codes, not its objects."""
    if PLACE in data.column_names:
        place = data.column(PLACE).to_numpy()
        data = data.drop_columns([PLACE])
    else:
        place = None
    if table in INTERNED_TABLES or data.num_rows == 0:
        return data
    t = data.column(store._SORT_KEY.get(table, "t_ns")).to_numpy()
    if place is not None:
        order = np.lexsort((place, t))
    elif (t[1:] >= t[:-1]).all():
        return data
    else:
        order = np.argsort(t, kind="stable")
    if (order[1:] > order[:-1]).all():
        return data
    return data.take(order)


def _times(table: str, frame: pd.DataFrame) -> dict[str, Any]:
    """How a stretch of ``table`` is found by time: the column it is cut by and, per batch of
    `BATCH_ROWS` rows, the earliest and latest time in it (spans: earliest start, latest
    end; None for a batch without times); a table without times has none."""
    if table == "spans":
        begin, finish = frame["start_ns"].to_numpy(np.int64), frame["end_ns"].to_numpy(np.int64)
        spec = {"time": "start_ns", "overlap": True}
    elif "t_ns" in frame:
        begin = finish = frame["t_ns"].to_numpy(np.int64)
        spec = {"time": "t_ns"}
    else:
        return {}
    ranges = []
    for at in range(0, len(frame), BATCH_ROWS):
        first, last = begin[at : at + BATCH_ROWS], finish[at : at + BATCH_ROWS]
        ranges.append([int(first.min()), int(last.max())] if len(first) else [None, None])
    return {**spec, "times": ranges}


def write(run_dir: str | os.PathLike, made_under: dict[str, Any], run: Run) -> bool:
    """Keep ``run`` (``run_dir`` loaded under ``made_under``) beside it; False when it could
    not be (read-only, disk full, a column Arrow cannot hold): nothing half-written stays."""
    import pyarrow as pa

    run_dir = Path(run_dir)
    tmp = run_dir / f"{DIRNAME}.tmp-{uuid.uuid4().hex[:8]}"
    try:
        tmp.mkdir()
        specs = {}
        made = uuid.uuid4().hex
        options = pa.ipc.IpcWriteOptions(compression="lz4")
        for table in RECORD_TYPES:
            frame = getattr(run, table)
            data, specs[table] = _arrow(table, frame)
            specs[table].update(_times(table, frame))
            data = data.replace_schema_metadata({_MADE: made})
            with (
                pa.OSFile(str(tmp / f"{table}.arrow"), "wb") as sink,
                pa.ipc.new_file(sink, data.schema, options=options) as writer,
            ):
                # batches of BATCH_ROWS, as `_times` describes them (none for no rows)
                for batch in data.combine_chunks().to_batches(max_chunksize=BATCH_ROWS):
                    writer.write_batch(batch)
        from gpuprof.step_window import step_times  # the loader's own reading of steps

        steps = step_times(run.spans) if len(run.spans) else None
        kept = {
            "key": made_under, "made": made, "meta": run.meta.to_dict(), "tables": specs,
            # each step's earliest start and latest end: what a stretch (--steps) is cut by
            "steps": [] if steps is None else [[int(n), int(a), int(b)] for n, a, b in
                                                steps.itertuples()],
        }  # fmt: skip
        with open(tmp / "run.json", "w", encoding="utf-8") as handle:
            json.dump(kept, handle)
        _swap_in(run_dir, tmp)
        return True
    except Exception:
        shutil.rmtree(tmp, ignore_errors=True)
        return False


def write_part(into: tuple[Path, str], table: str, index: int, frame: pd.DataFrame) -> dict:
    """One part of a kept table made file by file (`keep_by_file`): ``frame`` written into
    the directory of ``into`` (with the writing's id) in batches of `BATCH_ROWS`, and what
    `place` needs of it: its file, rows, columns (`_arrow`), attrs and batch times."""
    import pyarrow as pa

    where, made = into
    data, spec = _arrow(table, frame)
    spec.update(_times(table, frame))
    if "host" in frame:  # a node's read (`KeptSeries.read`) opens only the parts it is in
        spec["hosts"] = sorted({str(h) for h in frame["host"].dropna().unique()})
    name = f"{table}.{index:05d}.arrow"
    data = data.replace_schema_metadata({_MADE: made})
    options = pa.ipc.IpcWriteOptions(compression="lz4")
    with (
        pa.OSFile(str(Path(where) / name), "wb") as sink,
        pa.ipc.new_file(sink, data.schema, options=options) as writer,
    ):
        for batch in data.combine_chunks().to_batches(max_chunksize=BATCH_ROWS):
            writer.write_batch(batch)
    return {**spec, "file": name}


def read_part(where: Path, made: str, spec: dict[str, Any]) -> pd.DataFrame:
    """The frame `write_part` wrote (``spec`` is what it returned), as it was."""
    import pyarrow as pa

    with pa.memory_map(str(Path(where) / spec["file"])) as source:
        reader = pa.ipc.open_file(source)
        if (reader.schema.metadata or {}).get(_MADE) != made.encode():
            raise ValueError(f"{spec['file']}: written by another making")
        data = reader.read_all()
    return _frame(data, spec)


def place(
    run_dir: str | os.PathLike, tmp: Path, made_under: dict[str, Any], made: str,
    meta: RunMeta, parts: dict[str, list[dict[str, Any]]], steps: pd.DataFrame | None,
) -> bool:  # fmt: skip
    """Put the kept form whose parts (`write_part`) are in ``tmp`` in place, as `write` does
    with a whole one; ValueError when the parts of a table disagree on its columns."""
    specs = {table: _joined(table, got) for table, got in parts.items()}
    kept = {
        "key": made_under, "made": made, "meta": meta.to_dict(), "tables": specs,
        "steps": [] if steps is None else [[int(n), int(a), int(b)] for n, a, b in
                                            steps.itertuples()],
    }  # fmt: skip
    with open(tmp / "run.json", "w", encoding="utf-8") as handle:
        json.dump(kept, handle)
    _swap_in(Path(run_dir), tmp)
    return True


def _swap_in(run_dir: Path, tmp: Path) -> None:
    """``tmp`` becomes the kept form; the old form goes first, so that a reader in between
    finds none and reads the run files."""
    final = run_dir / DIRNAME
    old = run_dir / f"{DIRNAME}.old-{uuid.uuid4().hex[:8]}"
    with contextlib.suppress(FileNotFoundError):
        final.rename(old)
        shutil.rmtree(old, ignore_errors=True)
    tmp.rename(final)


def _joined(table: str, parts: list[dict[str, Any]]) -> dict[str, Any]:
    """One table's spec from its parts': the columns they share (text with NaN gaps where a
    part has them), the rows they hold, and each part's file and batch times."""
    first = parts[0]
    names = [c["name"] for c in first["columns"]]
    if any(len(p["columns"]) != len(names) for p in parts):
        raise ValueError(f"{table}: the parts disagree on the columns")
    columns = []
    for i, name in enumerate(names):
        got = [p["columns"][i] for p in parts]
        if any(c["name"] != name for c in got) or len({c["dtype"] for c in got}) != 1:
            raise ValueError(f"{table}.{name}: the parts disagree on the column")
        hows = {c["how"] for c in got}
        if hows == {"text", "text-nan"}:
            if any(c["how"] == "text" and c.get("gaps") for c in got):
                raise ValueError(f"{table}.{name} mixes None and NaN")
            hows = {"text-nan"}
        if len(hows) != 1:
            raise ValueError(f"{table}.{name}: the parts disagree on the column")
        columns.append({"name": name, "how": hows.pop(), "dtype": got[0]["dtype"]})
    spec: dict[str, Any] = {
        "columns": columns,
        "rows": sum(p["rows"] for p in parts),
        "attrs": first.get("attrs") or {},
        "parts": [
            {"file": p["file"], "rows": p["rows"], "times": p.get("times"),
             **({"hosts": p["hosts"]} if "hosts" in p else {})}
            for p in parts
        ],
    }  # fmt: skip
    for key in ("time", "overlap"):
        if key in first:
            spec[key] = first[key]
    return spec


def _arrow(table: str, frame: pd.DataFrame) -> tuple[Any, dict[str, Any]]:
    """``frame`` as an Arrow table, and what `_frame` needs to make it again as it was:
    each column's dtype and how it is held; ``frame.attrs`` (JSON values)."""
    import pyarrow as pa

    if not frame.index.equals(pd.RangeIndex(len(frame))):
        raise TypeError(f"{table}: an index other than 0..n-1 is not kept")
    kinds = column_kinds(RECORD_TYPES[table])
    arrays, columns = [], []
    for name in frame.columns:
        col = frame[name]
        dtype = col.dtype
        text = dtype == np.dtype(object)
        if isinstance(dtype, pd.CategoricalDtype):
            arrays.append(pa.array(col))
            how = "category"
        elif text and kinds.get(name) == "json":
            arrays.append(pa.array(_json_texts(col), type=pa.string()).dictionary_encode())
            how = "json"
        elif text:
            values = col.to_numpy()
            # text, and None or NaN where there is none (whichever the reading gave)
            arrays.append(pa.array(values, type=pa.string(), from_pandas=True).dictionary_encode())
            gaps = values[pd.isna(values)]
            nones = sum(v is None for v in gaps)
            if 0 < nones < len(gaps):
                raise TypeError(f"{table}.{name} mixes None and NaN")
            how = "text" if nones or not len(gaps) else "text-nan"
            columns.append({"name": str(name), "how": how, "dtype": str(dtype),
                            "gaps": bool(len(gaps))})  # fmt: skip
            continue
        elif isinstance(dtype, np.dtype) and dtype.kind in "iufb":
            arrays.append(pa.array(col.to_numpy()))  # NaN stays NaN (no from_pandas)
            how = "numpy"
        elif dtype.kind in "iufb":  # pandas' nullable numbers (Int64…): a mask of gaps
            arrays.append(pa.array(col))
            how = "nullable"
        else:
            raise TypeError(f"{table}.{name}: {dtype} is not kept")
        columns.append({"name": str(name), "how": how, "dtype": str(dtype)})
    data = pa.Table.from_arrays(arrays, names=[c["name"] for c in columns])
    return data, {"columns": columns, "rows": len(frame), "attrs": frame.attrs}


def _frame(data: Any, spec: dict[str, Any]) -> pd.DataFrame:
    """The frame `_arrow` made ``data`` of (``data`` is consumed: its buffers are let go as
    the columns are converted)."""
    columns = spec["columns"]
    rows = spec["rows"]
    held = {c["name"]: (i, c["how"], data.column(c["name"])) for i, c in enumerate(columns)
            if c["how"] in _OBJECT_HOWS}  # fmt: skip
    rest = data.drop_columns(list(held)) if held else data
    del data
    if rest.num_columns:
        # numbers and categories in one conversion, a block per column (no copy to stack them)
        frame = rest.to_pandas(split_blocks=True, self_destruct=True)
    else:
        frame = pd.DataFrame(index=pd.RangeIndex(rows))
    del rest
    for column in columns:
        if column["how"] == "nullable":
            frame[column["name"]] = frame[column["name"]].astype(
                pd.api.types.pandas_dtype(column["dtype"])
            )
    for name, (position, how, values) in sorted(held.items(), key=lambda item: item[1][0]):
        objects = pd.Series(_objects(values, how), index=frame.index, dtype=object, copy=False)
        frame.insert(position, name, objects)
    frame.attrs.update(spec.get("attrs") or {})
    return frame


_OBJECT_HOWS = ("json", "text", "text-nan")


def _objects(values: Any, how: str) -> np.ndarray:
    """A dictionary-encoded text column as Python objects: each distinct text made once (and
    each distinct JSON text parsed once, as `store` reads JSON columns); a gap is None, or NaN
    for ``text-nan``."""
    import pyarrow as pa
    import pyarrow.compute as pc

    array = values.combine_chunks() if isinstance(values, pa.ChunkedArray) else values
    if not pa.types.is_dictionary(array.type):
        array = array.dictionary_encode()
    uniques = array.dictionary.to_numpy(zero_copy_only=False)
    made = np.empty(len(uniques) + 1, dtype=object)
    if how == "json":
        for i, text in enumerate(uniques):
            made[i] = store._json_or_empty(text)
    else:
        made[:-1] = uniques
    made[-1] = np.nan if how == "text-nan" else None
    codes = pc.fill_null(array.indices, -1).to_numpy(zero_copy_only=False)
    return made[codes]


def _json_texts(col: pd.Series) -> np.ndarray:
    """Each dict of a JSON column as text, each distinct object encoded once."""
    texts = np.empty(len(col), dtype=object)
    seen: dict[int, str] = {}
    for i, value in enumerate(col.to_numpy()):
        if value is None:
            texts[i] = None
            continue
        text = seen.get(id(value))
        if text is None:
            text = seen[id(value)] = json.dumps(value, allow_nan=True)
        texts[i] = text
    return texts
