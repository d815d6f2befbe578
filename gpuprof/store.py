"""The run directory: SQLite files written while a run goes on, read back as one `Run`.

Layout of a run directory::

    <run>/<host>.sqlite        written on <host> by its watcher's sampler and every hooked
                               process on that host (SQLite WAL mode, many writers)
    <run>/<host>.<pid>.sqlite  written by one process that has no watcher on its host
                               (e.g. a Ray worker started on another node), merged on load

SQLite's WAL mode needs every writer of a file on one host (they share a memory-mapped index),
so a file is only ever written from the host in its name; when the run directory sits on a
network filesystem the watcher writes to a local spool file and moves it in when the run ends
(see docs/STORE.md). Writers batch rows in memory and commit at least once a second, so a
crash or SIGKILL loses at most the last second.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import os
import shutil
import sqlite3
import time
from collections.abc import Callable, Collection, Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa

from gpuprof import clocks, columnar
from gpuprof.errors import RunError
from gpuprof.model import (
    INTERNED_TABLES,
    RECORD_TYPES,
    STACK_TABLES,
    Run,
    RunMeta,
    column_kinds,
    columns,
    empty_frame,
    span_depths,
)
from gpuprof.runfile import (  # the writing side, re-exported: `store` is the whole store
    _INSERT as _INSERT,
)
from gpuprof.runfile import (
    _JSON_COLUMNS as _JSON_COLUMNS,
)
from gpuprof.runfile import (
    _JSON_NAMES as _JSON_NAMES,
)
from gpuprof.runfile import (
    _ROW_OF as _ROW_OF,
)
from gpuprof.runfile import (
    APPLICATION_ID as APPLICATION_ID,
)
from gpuprof.runfile import (
    BUSY_TIMEOUT_S as BUSY_TIMEOUT_S,
)
from gpuprof.runfile import (
    CHUNK as CHUNK,
)
from gpuprof.runfile import (
    CHUNKS_SQL as CHUNKS_SQL,
)
from gpuprof.runfile import (
    FLUSH_INTERVAL_S as FLUSH_INTERVAL_S,
)
from gpuprof.runfile import (
    BufferedWriter as BufferedWriter,
)
from gpuprof.runfile import (
    _check_header as _check_header,
)
from gpuprof.runfile import (
    connect as connect,
)
from gpuprof.runfile import (
    encode_row as encode_row,
)
from gpuprof.runfile import (
    failure_reason as failure_reason,
)
from gpuprof.runfile import (
    filesystem_type as filesystem_type,
)
from gpuprof.runfile import (
    host_file as host_file,
)
from gpuprof.runfile import (
    insert_encoded as insert_encoded,
)
from gpuprof.runfile import (
    insert_rows as insert_rows,
)
from gpuprof.runfile import (
    is_network_filesystem as is_network_filesystem,
)
from gpuprof.runfile import (
    write_meta as write_meta,
)
from gpuprof.runfile import (
    write_meta_now as write_meta_now,
)

Reducer = Callable[[str, pd.DataFrame], pd.DataFrame]
"""``reduce(table, frame) -> frame`` applied to each file's table as a run is loaded. It gets
a side file's strings as categoricals, in the file's own order, unless it has a false
``categorical`` attribute (a reducer that only drops rows)."""


def run_files(run_dir: str | os.PathLike) -> list[Path]:
    """The run files of a run directory, host files first."""
    run_dir = Path(run_dir)
    if not run_dir.exists():
        raise RunError(f"{run_dir}: no such run directory")
    if run_dir.is_file():
        return [run_dir]
    files = sorted(run_dir.glob("*.sqlite"), key=lambda p: (p.name.count("."), p.name))
    if not files:
        raise RunError(f"{run_dir}: not a gpuprof run directory (no .sqlite run files)")
    return files


_SORT_KEY = {"spans": "start_ns"}
"""The column a loaded table is sorted by (stable), when not ``t_ns``."""


def read_file(
    path: Path, skip: Collection[str] = (), reduce: Reducer | None = None
) -> tuple[dict[str, dict[str, Any]], dict[str, pd.DataFrame]]:
    """Metadata and typed frames of one run file (its columnar side files included), tables
    in ``skip`` left out, each other table passed through ``reduce(table, frame)`` when
    given."""
    try:
        if path.stat().st_size == 0:
            raise RunError(f"{path}: empty file (the run never wrote data)")
        # read-write when we may, so closing folds away the -wal/-shm files of a finished run
        mode = "rw" if os.access(path, os.W_OK) and os.access(path.parent, os.W_OK) else "ro"
        conn = sqlite3.connect(f"file:{path}?mode={mode}", uri=True, timeout=BUSY_TIMEOUT_S)
    except (sqlite3.Error, OSError) as exc:
        raise RunError(f"{path}: cannot open ({exc})") from None
    try:
        _check_header(conn, path, allow_new=False)
        meta = {
            key: json.loads(value)
            for key, value in conn.execute("SELECT key, value FROM meta").fetchall()
        }
        sides = _side_files(path, conn)
        present = _table_names(conn)
        frames = {}
        for table in RECORD_TYPES:
            if table in skip:
                continue
            # a file written before the table existed has no rows of it
            frame = read_table(conn, table) if table in present else _empty(table)
            chunked = read_chunks(conn, table)
            if len(chunked):
                frame = (_typed(table, pd.concat([chunked, frame], ignore_index=True))
                         if len(frame) else chunked)  # fmt: skip
            if table in sides:
                # in the order the merged table gets below (a stable sort by time), unless
                # ``reduce`` reads the file's own order, with strings as categoricals (a
                # reducer that only drops rows says so: it reads what a plain load reads)
                coded = reduce is not None and getattr(reduce, "categorical", True)
                order = (None if coded or table in INTERNED_TABLES
                         else _SORT_KEY.get(table, "t_ns"))  # fmt: skip
                side = columnar.read(sides[table], table, coded, order)
                for name in _JSON_NAMES[table]:
                    side[name] = _json_column(side[name])
                if len(frame):
                    side = _typed(table, pd.concat([side, frame], ignore_index=True))
                frame = side
            frames[table] = reduce(table, frame) if reduce is not None and len(frame) else frame
        return meta, frames
    except sqlite3.DatabaseError as exc:
        raise RunError(f"{path}: damaged or not a gpuprof run file ({exc})") from None
    except (json.JSONDecodeError, ValueError, OSError, pa.ArrowException) as exc:
        raise RunError(f"{path}: damaged data ({exc})") from None
    finally:
        conn.close()


def _table_names(conn: sqlite3.Connection) -> set[str]:
    """The tables an open run file has (files older than a table lack it, see
    `model.STACK_TABLES`)."""
    return {name for (name,) in conn.execute("SELECT name FROM sqlite_master WHERE type='table'")}


def _side_files(path: Path, conn: sqlite3.Connection) -> dict[str, Path]:
    """The columnar side files a run file lists (see `gpuprof.columnar`)."""
    sides = {}
    for table, name in columnar.listed(conn).items():
        side = path.with_name(name)
        if table not in columnar.TABLES or "/" in name or not side.exists():
            raise RunError(f"{path}: its {table} samples file {name!r} is missing")
        sides[table] = side
    return sides


def read_table(
    conn: sqlite3.Connection, table: str, where: str = "", params: Sequence[Any] = ()
) -> pd.DataFrame:
    """Rows of one table of an open run file (optionally filtered) as a typed frame."""
    cursor = conn.execute(f"SELECT * FROM {table} {where}", tuple(params))
    names = [d[0] for d in cursor.description]
    return _typed(table, pd.DataFrame.from_records(cursor.fetchall(), columns=names))


def read_chunks(conn: sqlite3.Connection, table: str, upto: int | None = None) -> pd.DataFrame:
    """The rows of ``table`` held in the file's ``chunks`` (up to chunk rowid ``upto``), as a
    typed frame; empty for a file without chunks."""
    if not has_chunks(conn):
        return _empty(table)
    where, params = "WHERE tbl = ?", [table]
    if upto is not None:
        where += " AND rowid <= ?"
        params.append(upto)
    blobs = [b for (b,) in conn.execute(f"SELECT data FROM chunks {where} ORDER BY rowid", params)]
    if not blobs:
        return _empty(table)
    # the table's Arrow schema gives the model's dtypes, as for a side file: no _typed pass
    frame = columnar.to_frame(columnar.decode_chunks(table, blobs))
    for name in _JSON_NAMES[table]:
        frame[name] = _json_column(frame[name])
    return frame


def _chunk_gpu_keys(conn: sqlite3.Connection) -> pd.DataFrame:
    """``host``, ``gpu``, ``uuid`` of every GPU with samples in the file's chunks, decoding
    only those columns into Python objects (the samples stay in Arrow)."""
    if not has_chunks(conn):
        return pd.DataFrame()
    blobs = [b for (b,) in conn.execute("SELECT data FROM chunks WHERE tbl = 'gpu'")]
    if not blobs:
        return pd.DataFrame()
    data = columnar.decode_chunks("gpu", blobs).select(["host", "gpu", "uuid"])
    keys = data.group_by(["host", "gpu"], use_threads=False).aggregate([("uuid", "max")])
    return keys.rename_columns(["host", "gpu", "uuid"]).to_pandas()


def has_chunks(conn: sqlite3.Connection) -> bool:
    """Whether the file has a ``chunks`` table (files of schema 1 do not)."""
    row = conn.execute("SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'chunks'")
    return row.fetchone() is not None


def _typed(table: str, frame: pd.DataFrame) -> pd.DataFrame:
    """Give a raw frame the model's dtypes: numbers with gaps become float64 (NaN = missing)."""
    record_type = RECORD_TYPES[table]
    if frame.empty:
        return _empty(table)
    kinds = column_kinds(record_type)
    out = {}
    for name in columns(record_type):
        col = frame[name] if name in frame else pd.Series([None] * len(frame))
        kind = kinds[name]
        if kind == "json":
            out[name] = col.map(_json_or_empty)
        elif kind == "bool":
            out[name] = col.fillna(0).astype(bool)
        elif kind in ("int", "float"):
            values = pd.to_numeric(col, errors="coerce")
            if values.dtype.kind == "f" and np.isinf(values.to_numpy()).any():
                values = values.where(np.isfinite(values))  # ±inf is no reading: missing
            if kind == "int" and not values.isna().any():
                out[name] = values.astype(np.int64)
            else:
                out[name] = values.astype(np.float64)
        else:
            out[name] = _text_column(col)
    typed = pd.DataFrame(out)
    # a row without its host, its time or a GPU index cannot be placed (a hand-edited file
    # or another tool's rows): dropped rather than let through as NaN keys
    keys = [name for name in _ROW_KEYS if name in typed]
    missing = typed[keys].isna().any(axis=1).to_numpy()
    if "gpu" in typed:  # NVML indices count from 0 and stay small (a node has a few GPUs)
        index = typed["gpu"]
        missing = missing | ~((index >= 0) & (index < _GPU_INDEX_LIMIT)).to_numpy()
    return typed[~missing].reset_index(drop=True) if missing.any() else typed


_ROW_KEYS = ("host", "t_ns", "start_ns", "end_ns")
_GPU_INDEX_LIMIT = 2**16
"""A GPU index at or above this is no device's (a mistyped row: 2**63 - 1 once overflowed the
report's per-GPU keys); such a row is dropped like one without its host."""


def _text_column(col: pd.Series) -> pd.Series:
    """Text or None in every row (SQLite keeps whatever type a writer gave a column)."""
    if pd.api.types.infer_dtype(col, skipna=True) in ("string", "empty"):
        return col.astype(object)
    return col.map(
        lambda v: v if v is None or isinstance(v, str)
        else v.decode("utf-8", "replace") if isinstance(v, bytes)
        else None if isinstance(v, float) and np.isnan(v)
        else str(v)
    ).astype(object)  # fmt: skip


_EMPTY_FRAMES: dict[str, pd.DataFrame] = {}


def _empty(table: str) -> pd.DataFrame:
    """`empty_frame` of a table, built once per table (building one reads the record's type
    hints: a run's load asks for several) and copied for each caller."""
    if table not in _EMPTY_FRAMES:
        _EMPTY_FRAMES[table] = empty_frame(RECORD_TYPES[table])
    return _EMPTY_FRAMES[table].copy()


def _json_column(texts: pd.Series) -> pd.Series:
    """JSON text → dicts, each distinct text parsed once (most rows repeat a few shapes);
    rows with the same text share one dict, which readers must not modify."""
    codes, uniques = pd.factorize(texts, use_na_sentinel=True)
    parsed = np.empty(len(uniques) + 1, dtype=object)
    for i, text in enumerate(uniques):
        parsed[i] = _json_or_empty(text)
    parsed[-1] = {}  # code -1: missing
    return pd.Series(parsed[codes], index=texts.index, dtype=object)


def _json_or_empty(value: Any) -> dict[str, Any]:
    if isinstance(value, dict):  # already parsed (frames of several files being merged)
        return value
    if not value or value == "{}":  # most rows: skip the parser
        return {}
    try:
        parsed = json.loads(value)
    except (TypeError, ValueError):
        return {}
    return parsed if isinstance(parsed, dict) else {}


def merge_runs(sources: Sequence[str | os.PathLike], dest: str | os.PathLike) -> list[Path]:
    """Join run directories recorded separately (one per node, no shared filesystem) into
    ``dest``: every run file with its side files, copied consistently (SQLite's backup API, so
    a file still being written is copied as of one commit). All or nothing: written into a
    temporary directory beside ``dest`` and renamed. Raises `RunError` for a source that is not
    a run, two sources holding a file of the same name (two nodes with one name: set
    ``GPUPROF_HOST``), or a ``dest`` that exists and is not empty."""
    dest = Path(dest)
    if dest.exists() and (not dest.is_dir() or any(dest.iterdir())):
        raise RunError(f"{dest}: exists and is not empty")
    plan: dict[str, tuple[Path, Path]] = {}  # file name → (source run file, its source dir)
    for source in map(Path, sources):
        if not source.is_dir():
            raise RunError(f"{source}: not a run directory")
        for path in run_files(source):
            if path.name in plan:
                raise RunError(
                    f"{plan[path.name][1]} and {source} both hold {path.name}: two nodes with "
                    "one name (set GPUPROF_HOST on each node to tell them apart)"
                )
            plan[path.name] = (path, source)
    tmp = dest.with_name(f".{dest.name}.merging-{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    written = []
    try:
        for name, (path, _) in sorted(plan.items()):
            target = tmp / name
            try:
                src = sqlite3.connect(f"file:{path}?mode=ro", uri=True, timeout=BUSY_TIMEOUT_S)
                out = sqlite3.connect(target)
                try:
                    src.backup(out)
                    sides = columnar.listed(src) if _has_meta(src) else {}
                finally:
                    out.close()
                    src.close()
            except sqlite3.Error as exc:
                raise RunError(f"{path}: cannot be copied ({exc})") from None
            written.append(target)
            for side_name in sides.values():
                side = path.with_name(side_name)
                if "/" in side_name or not side.exists():
                    raise RunError(f"{path}: its samples file {side_name!r} is missing")
                shutil.copyfile(side, tmp / side_name)
                written.append(tmp / side_name)
        if dest.exists():
            dest.rmdir()
        os.replace(tmp, dest)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return [dest / p.name for p in written]


def _has_meta(conn: sqlite3.Connection) -> bool:
    row = conn.execute("SELECT 1 FROM sqlite_master WHERE type='table' AND name='meta'")
    return row.fetchone() is not None


def node_ranks(run_dir: str | os.PathLike) -> dict[int, bool]:
    """Node rank → whether that node's watcher has finished (its metadata has an end), read
    from the run files of a directory being written by several nodes; unreadable files and
    files without a node rank are skipped."""
    out: dict[int, bool] = {}
    for path in Path(run_dir).glob("*.sqlite"):
        meta = file_meta(path, timeout_s=1.0) or {}
        rank = meta.get("node_rank")
        if isinstance(rank, int) and not isinstance(rank, bool):
            out[rank] = out.get(rank, True) and meta.get("end_ns") is not None
    return out


def merge_meta(metas: list[dict[str, Any]], run_dir: Path) -> RunMeta:
    """One `RunMeta` from the watcher metadata of every host file."""
    if not metas:
        return RunMeta(run_id=run_dir.name)
    try:
        parsed = [RunMeta.from_dict(m) for m in metas]
    except ValueError as exc:
        raise RunError(f"{run_dir}: bad run metadata ({exc})") from None
    # node rank 0's document leads (its node is the time reference), then the others; a
    # watcher's before the per-node documents a Ray driver writes (they have no command)
    parsed.sort(key=lambda m: (not m.command, m.node_rank is None, m.node_rank or 0))
    base = parsed[0]
    if base.reference_node is None:  # named by a Ray driver's per-node documents
        base.reference_node = next((m.reference_node for m in parsed if m.reference_node), None)
    if base.node_rank == 0 and base.reference_node is None and base.hosts:
        base.reference_node = base.hosts[0]
    for other in parsed[1:]:
        base.hosts = sorted(set(base.hosts) | set(other.hosts))
        base.gpus = base.gpus + [g for g in other.gpus if g not in base.gpus]
        base.notices = base.notices + other.notices
        base.nodes = {**base.nodes, **other.nodes}
        if other.start_ns is not None:
            base.start_ns = min(filter(None, (base.start_ns, other.start_ns)))
        if other.end_ns is not None:
            base.end_ns = max(filter(None, (base.end_ns, other.end_ns)))
        if base.exit_code in (None, 0) and other.exit_code:
            base.exit_code = other.exit_code
    return base


def _align_nodes(
    meta: RunMeta, tables: dict[str, pd.DataFrame], measured: set[str],
    span_hosts: set[str] | None = None,
) -> dict[str, clocks.ClockOffset]:  # fmt: skip
    """Put nodes without a measured offset on the reference node's clock, estimated from the
    collectives their ranks took part in (in place); the offsets applied. ``span_hosts``:
    the hosts of the run's spans, when ``tables["spans"]`` holds only their collectives
    (`keep_by_file`)."""
    if span_hosts is None:
        span_hosts = set(tables["spans"]["host"].dropna().unique().tolist())
    nodes = sorted(set(meta.hosts) | span_hosts)
    if len(nodes) < 2:
        return {}
    reference = meta.reference_node or (meta.hosts[0] if meta.hosts else nodes[0])
    todo = [n for n in nodes if n not in measured and n != reference]
    if not todo:
        return {}
    found = clocks.estimate_from_collectives(tables["spans"], reference, todo)
    for node, offset in found.items():
        clocks.shift_node(tables, node, offset.offset_ns)
    if found:
        found[reference] = clocks.ClockOffset(reference, 0, 0, "reference", reference)
    return found


FileReader = Callable[[Sequence[Path]], Iterable[tuple[dict[str, Any], dict[str, pd.DataFrame]]]]
"""``read(paths)`` → each run file's metadata and frames (`read_file`), in the files' order."""


def load_run(
    run_dir: str | os.PathLike,
    *,
    skip: Collection[str] = (),
    reduce: Reducer | None = None,
    read: FileReader | None = None,
) -> Run:
    """Read every run file of a run directory (or one file) and merge them into a `Run`.

    Works on a run that is still being written or whose writer was killed. Raises `RunError`
    with one line naming the bad file. Tables named in ``skip`` are left empty (a caller that
    streams GPU samples with `iter_gpu_samples` skips ``gpu``); ``reduce(table, frame)``, when
    given, is applied to each file's frame of each table before the files are merged, which
    bounds memory for very long runs. ``read`` reads the files instead of this process (in
    other processes, say), with ``skip`` and ``reduce`` its own business; what it returns for
    each file must be what `read_file` would.
    """
    run_dir = Path(run_dir)
    metas: list[dict[str, Any]] = []
    parts: dict[str, list[pd.DataFrame]] = {table: [] for table in RECORD_TYPES}
    offsets: dict[str, clocks.ClockOffset] = {}
    paths = run_files(run_dir)
    if read is None:
        read = lambda paths: (read_file(p, skip, reduce) for p in paths)  # noqa: E731
    for path, (meta, frames) in zip(paths, read(paths), strict=True):
        metas.extend(value for key, value in meta.items() if key == "run" or key.startswith("run."))
        # a node's offset measured while recording (e.g. round trips through Ray)
        stored = clocks.stored_offset(path.name.split(".")[0], meta.get("clock"))
        if stored is not None:
            clocks.shift(frames, stored.offset_ns)
            offsets[stored.node] = stored
        for table, frame in frames.items():
            if not frame.empty:
                parts[table].append(frame)
    meta = merge_meta(metas, run_dir if run_dir.is_dir() else run_dir.parent)
    tables = {}
    for table, frames in parts.items():
        if not frames:
            tables[table] = _empty(table)
            continue
        frame = frames[0]
        if len(frames) > 1:
            frame = _typed(table, pd.concat(frames, ignore_index=True))
        tables[table] = frame
    offsets.update(_align_nodes(meta, tables, set(offsets)))
    meta.clocks = {node: offset.to_dict() for node, offset in sorted(offsets.items())}
    for table, frame in tables.items():
        if frame.empty:
            continue
        if table in INTERNED_TABLES:  # the same frame or stack recorded by several files
            key = INTERNED_TABLES[table]
            tables[table] = frame.drop_duplicates(key, ignore_index=True)
            continue
        sort_key = _SORT_KEY.get(table, "t_ns")
        if frame[sort_key].is_monotonic_increasing:  # a stable sort would keep every row
            frame = frame.reset_index(drop=True)
        else:
            frame = frame.sort_values(sort_key, kind="stable", ignore_index=True)
        if table == "spans":
            frame["depth"] = span_depths(frame)
        tables[table] = frame
    if not meta.hosts:
        hosts = set()
        for frame in tables.values():
            if "host" in frame and len(frame):
                hosts.update(frame["host"].dropna().unique().tolist())
        meta.hosts = sorted(hosts)
    return Run(meta=meta, **tables)


def iter_gpu_samples(
    run_dir: str | os.PathLike, categories: bool = False
) -> Iterator[pd.DataFrame]:
    """The run's GPU samples one GPU of one file at a time, each frame sorted by time.

    Memory stays at one GPU's samples, whatever the length of the run. With ``categories``
    the string columns (host, uuid) of side-file samples come as pandas categoricals.
    """
    for _, frame in iter_gpu_parts(run_dir, categories):
        yield frame


def iter_gpu_parts(
    run_dir: str | os.PathLike, categories: bool = False, part: int = 0, parts: int = 1
) -> Iterator[tuple[tuple[int, int, int], pd.DataFrame]]:
    """Part ``part`` of ``parts`` of `iter_gpu_samples`, each frame with its place in the
    whole stream (sorting the parts' frames by it gives the stream's order).

    The parts split the side files' row groups (one GPU each) round-robin over the whole
    run, and give each file's GPU rows still in SQLite to one part; a part reads only what
    is its own (the footers of every side file aside), so ``parts`` processes can read a run
    together.
    """
    seen = 0  # side-file row groups before this file's: the round-robin runs across files
    for index, path in enumerate(run_files(Path(run_dir))):
        try:
            conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True, timeout=BUSY_TIMEOUT_S)
        except sqlite3.Error as exc:
            raise RunError(f"{path}: cannot open ({exc})") from None
        try:
            _check_header(conn, path, allow_new=False)
            sides = _side_files(path, conn)
            if "gpu" in sides:
                n_groups = columnar.count_groups(sides["gpu"]) if parts > 1 else 0
                mine = [g for g in range(n_groups) if (seen + g) % parts == part]
                select = None if parts == 1 else set(mine).__contains__
                frames = columnar.read_groups(sides["gpu"], "gpu", categories, select)
                for group, frame in zip(mine if parts > 1 else itertools.count(), frames):
                    yield (index, 0, group), frame.sort_values("t_ns", kind="stable",
                                                               ignore_index=True)  # fmt: skip
                seen += n_groups
            if index % parts != part:
                continue
            rows = read_table(conn, "gpu")
            chunked = read_chunks(conn, "gpu")
            if len(chunked):
                rows = pd.concat([chunked, rows], ignore_index=True) if len(rows) else chunked
            groups = rows.groupby(["host", "gpu"], sort=True, dropna=False)
            for group, (_, frame) in enumerate(groups):
                yield (index, 1, group), frame.sort_values("t_ns", kind="stable",
                                                           ignore_index=True)  # fmt: skip
        except sqlite3.DatabaseError as exc:
            raise RunError(f"{path}: damaged or not a gpuprof run file ({exc})") from None
        except (OSError, pa.ArrowException) as exc:
            raise RunError(f"{path}: damaged data ({exc})") from None
        finally:
            conn.close()


def gpu_keys(run_dir: str | os.PathLike) -> pd.DataFrame:
    """Every GPU with samples in the run: ``host``, ``gpu``, ``uuid`` (one row each), read
    without loading the samples' metrics."""
    parts = []
    for path in run_files(Path(run_dir)):
        try:
            conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True, timeout=BUSY_TIMEOUT_S)
            try:
                _check_header(conn, path, allow_new=False)
                rows = conn.execute("SELECT host, gpu, max(uuid) FROM gpu GROUP BY host, gpu")
                parts.append(pd.DataFrame(rows.fetchall(), columns=["host", "gpu", "uuid"]))
                chunked = _chunk_gpu_keys(conn)
                if len(chunked):
                    parts.append(chunked)
                sides = _side_files(path, conn)
            finally:
                conn.close()
            if "gpu" in sides:
                parts.append(columnar.group_keys(sides["gpu"]))
        except sqlite3.DatabaseError as exc:
            raise RunError(f"{path}: damaged or not a gpuprof run file ({exc})") from None
        except (OSError, pa.ArrowException) as exc:
            raise RunError(f"{path}: damaged data ({exc})") from None
    keys = pd.concat(parts, ignore_index=True) if parts else pd.DataFrame()
    if keys.empty:
        return pd.DataFrame({"host": [], "gpu": [], "uuid": []}).astype(object)
    keys = keys.dropna(subset=["host", "gpu"]).astype({"host": object, "uuid": object})
    return keys.drop_duplicates(["host", "gpu"], ignore_index=True)


def count_rows(run_dir: str | os.PathLike, table: str) -> int:
    """Rows of one table over the whole run (side files counted from their footers)."""
    total = 0
    for path in run_files(Path(run_dir)):
        try:
            conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True, timeout=BUSY_TIMEOUT_S)
            try:
                _check_header(conn, path, allow_new=False)
                if table in STACK_TABLES and table not in _table_names(conn):
                    sides = _side_files(path, conn)
                    total += columnar.count(sides[table]) if table in sides else 0
                    continue
                total += conn.execute(f"SELECT count(*) FROM {table}").fetchone()[0]
                if has_chunks(conn):
                    n = conn.execute("SELECT sum(n) FROM chunks WHERE tbl = ?", (table,))
                    total += n.fetchone()[0] or 0
                sides = _side_files(path, conn)
            finally:
                conn.close()
            if table in sides:
                total += columnar.count(sides[table])
        except sqlite3.DatabaseError as exc:
            raise RunError(f"{path}: damaged or not a gpuprof run file ({exc})") from None
        except (OSError, pa.ArrowException) as exc:
            raise RunError(f"{path}: damaged data ({exc})") from None
    return total


def compact_run(
    run_dir: str | os.PathLike, files: Sequence[Path] | None = None, workers: int = 1
) -> list[str]:
    """Move the sample tables of every run file (or of ``files``) into columnar side files
    (`gpuprof.columnar`).

    Done when a run ends; safe to repeat, safe against a crash at any point and beside a
    process still writing (rows it adds meanwhile stay). ``workers`` > 1 compacts that many
    files at once in child processes (each file is independent; a Ray run leaves one per
    node). Returns the side files written.
    """
    paths = list(files) if files is not None else run_files(Path(run_dir))
    workers = max(1, min(workers, len(paths)))
    if workers == 1:
        return [name for path in paths for name in _compact_file(path)]
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor

    # spawned, not forked: the caller may have threads (writers, a watcher's sampler)
    context = multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(workers, mp_context=context) as pool:
        return [name for names in pool.map(_compact_file, paths) for name in names]


def _compact_file(path: Path) -> list[str]:
    try:
        tables = columnar.compact(path, read_table, read_chunks)
    except sqlite3.DatabaseError as exc:
        raise RunError(f"{path}: damaged or not a gpuprof run file ({exc})") from None
    except (OSError, pa.ArrowException) as exc:
        raise RunError(f"{path}: could not be compacted ({exc})") from None
    return [columnar.side_file(path, table).name for table in tables]


def file_meta(
    path: str | os.PathLike, key: str = "run", timeout_s: float = 5.0
) -> dict[str, Any] | None:
    """One metadata document of a run file; None when the file, its ``meta`` table or the
    document is missing or unreadable (or locked past ``timeout_s``). Nothing is written,
    but the file is opened read-write: a read-only connection to a WAL file leaves its
    ``-wal`` and ``-shm`` files behind when it is the last to close."""
    try:
        conn = sqlite3.connect(f"file:{path}?mode=rw", uri=True, timeout=timeout_s)
        try:
            row = conn.execute("SELECT value FROM meta WHERE key = ?", (key,)).fetchone()
        finally:
            conn.close()
        value = json.loads(row[0]) if row else None
    except (sqlite3.Error, ValueError, TypeError):
        return None
    return value if isinstance(value, dict) else None


def recorded_nodes(run_dir: str | os.PathLike, run_id: str, reference: str) -> list[Path]:
    """The files of ``run_dir`` a Ray driver's recorder wrote for the run ``run_id`` whose
    watcher is on node ``reference`` (their ``"run"`` document names it the reference node):
    the cluster's other nodes, which the watcher compacts when the run ends."""
    return [path for path in sorted(Path(run_dir).glob("*.sqlite"))
            if recorded_for(file_meta(path), run_id, reference)]  # fmt: skip


def recorded_for(meta: dict[str, Any] | None, run_id: str | None, reference: str) -> bool:
    """Whether a file's ``"run"`` document is that of a node a Ray driver recorded for the run
    ``run_id`` watched from node ``reference`` (not the reference node's own file)."""
    if not isinstance(meta, dict):
        return False
    hosts = meta.get("hosts") or []
    return (meta.get("run_id") == run_id and meta.get("reference_node") == reference
            and bool(hosts) and hosts[0] != reference)  # fmt: skip


def save_run(run: Run, run_dir: str | os.PathLike) -> list[Path]:
    """Write a whole `Run` (simulated or imported) as a run directory, one file per host.

    Each file is written under a temporary name and renamed into place, so a failure leaves
    nothing half-written. Returns the files written.
    """
    hosts = set(run.meta.hosts)
    for table in RECORD_TYPES:
        frame = getattr(run, table)
        if len(frame) and "host" in frame:
            hosts.update(frame["host"].dropna().astype(str).unique().tolist())
    written = []
    for i, host in enumerate(sorted(hosts) or ["localhost"]):
        tables = []
        for table in RECORD_TYPES:
            frame = getattr(run, table)
            if len(frame) and "host" in frame:
                frame = frame[frame["host"] == host]
            elif i > 0:  # host-less tables (interned frames, stacks): in the first file
                frame = frame.iloc[:0]
            tables.append((table, frame))
        # the run's metadata lives in the first host's file, as a watcher's would
        written += write_host_file(run_dir, host, tables, run.meta if i == 0 else None)
    return written


def write_host_file(
    run_dir: str | os.PathLike,
    host: str,
    tables: Iterable[tuple[str, pd.DataFrame | pa.Table | Iterable[pd.DataFrame | pa.Table]]],
    meta: RunMeta | None = None,
) -> list[Path]:
    """Write one host's file of a finished run: ``<host>.sqlite`` with the tables as its
    Parquet side files, and ``meta`` (the run's metadata, which goes in one file of the run).

    ``tables`` yields ``(table, rows)`` with ``rows`` a frame of that table, an Arrow table
    of its schema already in the side file's order (`columnar.write_groups`), or, for
    ``gpu``, such frames or tables of one GPU each (its row group; in GPU order): a writer
    that makes them one at a time never holds more than one GPU's samples. Tables are taken
    as ``tables`` yields them, so a generator can make the next table after the previous one
    is written. The file is written under a temporary name and renamed into place; returns
    the files written.
    """
    run_dir = Path(run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    final = host_file(run_dir, host)
    tmp = final.with_name(final.name + ".partial")
    for suffix in ("", "-wal", "-shm"):
        with contextlib.suppress(OSError):
            os.unlink(f"{tmp}{suffix}")
    conn = connect(tmp)
    sides: list[Path] = []
    try:
        batch: dict[str, list] = {}
        listing: dict[str, str] = {}
        for table, rows in tables:
            side = columnar.side_file(final, table)
            if isinstance(rows, pa.Table):
                rows = [rows]
            if isinstance(rows, pd.DataFrame):
                if table in columnar.TABLES and len(rows):
                    sides.append(side)
                    columnar.write(side, table, rows)
                    listing[table] = side.name
                else:
                    batch[table] = list(_frame_rows(table, rows))
                continue
            sides.append(side)
            if columnar.write_groups(side, table, rows):
                listing[table] = side.name
            else:  # nothing to list: no file, as for an empty frame
                sides.remove(side)
                os.unlink(side)
                batch[table] = []
        batch = {t: batch[t] for t in RECORD_TYPES if t in batch}  # save_run's order
        insert_rows(conn, batch)
        if listing:
            listing = {t: listing[t] for t in RECORD_TYPES if t in listing}
            write_meta(conn, columnar.META_KEY, listing)
        if meta is not None:
            write_meta(conn, "run", meta.to_dict())
        conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    except BaseException:
        for side in sides:
            with contextlib.suppress(OSError):
                os.unlink(side)
        raise
    finally:
        conn.close()
    os.replace(tmp, final)
    return [final, *sides]


def _frame_rows(table: str, frame: pd.DataFrame) -> Iterable[tuple]:
    """Rows of a frame in the table's column order, NaN turned back into NULL."""
    cols = columns(RECORD_TYPES[table])
    kinds = column_kinds(RECORD_TYPES[table])
    if frame.empty:
        return []
    data = []
    for name in cols:
        values = frame[name] if name in frame else pd.Series([None] * len(frame))
        kind = kinds[name]
        if kind in ("int", "float", "bool"):
            arr = values.to_numpy(dtype=object)
            mask = pd.isna(values).to_numpy()
            if kind == "int":
                arr = [None if m else int(v) for v, m in zip(arr, mask)]
            elif kind == "bool":
                arr = [None if m else bool(v) for v, m in zip(arr, mask)]
            else:
                arr = [None if m else float(v) for v, m in zip(arr, mask)]
            data.append(arr)
        else:
            data.append(values.tolist())
    return zip(*data)


def finalize_file(src: Path, dest: Path) -> None:
    """Fold the WAL into the main file and, for a spooled file, move it into the run dir."""
    with contextlib.suppress(sqlite3.Error):
        conn = sqlite3.connect(src, timeout=BUSY_TIMEOUT_S)
        try:
            conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        finally:
            conn.close()
    if src.resolve() == dest.resolve():
        return
    tmp = dest.with_name(dest.name + ".partial")
    shutil.copyfile(src, tmp)
    os.replace(tmp, dest)
    for suffix in ("", "-wal", "-shm"):
        with contextlib.suppress(OSError):
            os.unlink(f"{src}{suffix}")


def now_ns() -> int:
    """Wall-clock time in integer nanoseconds since the Unix epoch."""
    return time.time_ns()
