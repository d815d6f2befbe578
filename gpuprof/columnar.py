"""Columnar side files of a run file: the tables of a finished run, in Parquet.

While a run goes on, every record is a row in its host's SQLite file (crash-safe, many
writers). Read back, SQLite hands over each row as Python objects; the same tables as Parquet
columns load 7–9× faster and take 2.4× less disk (`benchmarks/bench_columnar.py`, 1–4 h on 8
GPUs), can be read one GPU at a time, and open in pandas, DuckDB or Spark as they are. So when
a run ends (and when `save_run` writes a whole run) the tables of each file move into
``<file stem>.<table>.parquet`` beside it::

    <run>/node0.sqlite              metadata (and any rows a late writer adds)
    <run>/node0.gpu.parquet         GPU samples, one row group per GPU, sorted by time
    <run>/node0.host.parquet        host samples
    <run>/node0.procs.parquet       process samples
    <run>/node0.gpu_procs.parquet   per-GPU process samples
    <run>/node0.spans.parquet       spans (attrs as JSON text), likewise events and logs
    <run>/node0.threads.parquet     per-thread CPU; likewise the Python stacks py-spy sampled
                                    (stack_frames, stacks, stack_samples)

The SQLite file's ``meta`` table lists the side files under the key ``columnar``; the listing
and the deletion of the moved rows happen in one transaction, after the Parquet file is in
place, so a crash at any point leaves every row either in SQLite or in a listed side file,
never in both and never in neither (an unlisted side file is ignored). Columns and types are
those of the record classes in `gpuprof.model`.
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
import sqlite3
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa

from gpuprof.errors import RunError
from gpuprof.model import RECORD_TYPES, column_kinds, columns

TABLES: tuple[str, ...] = ("gpu", "host", "procs", "gpu_procs", "spans", "events", "logs",
                           "threads", "stack_frames", "stacks", "stack_samples")  # fmt: skip
"""The tables that get side files: all of them (only ``meta`` stays in SQLite)."""
SAMPLE_TABLES: tuple[str, ...] = ("gpu", "host", "procs", "gpu_procs")
"""The high-volume sample tables (merged into buckets when a long run is loaded)."""

SORT_KEYS: dict[str, list[str]] = {
    "gpu": ["host", "gpu", "t_ns"],
    "host": ["host", "t_ns"],
    "procs": ["host", "pid", "t_ns"],
    "gpu_procs": ["host", "gpu", "pid", "t_ns"],
    "spans": ["start_ns"],
    "events": ["t_ns"],
    "logs": ["t_ns"],
    "threads": ["host", "pid", "tid", "t_ns"],
    "stack_frames": ["frame_id"],
    "stacks": ["stack_id"],
    "stack_samples": ["host", "t_ns"],
}
META_KEY = "columnar"
"""Key of the ``meta`` row that lists a file's side files: ``{table: file name}``."""

_ARROW_TYPES = {
    "int": pa.int64(), "float": pa.float64(), "str": pa.string(), "bool": pa.bool_(),
    "json": pa.string(),  # dict columns (attrs) as JSON text
}  # fmt: skip


def side_file(db_path: Path, table: str) -> Path:
    """``<dir>/<stem>.<table>.parquet`` for the run file ``<dir>/<stem>.sqlite``."""
    return db_path.with_name(f"{db_path.stem}.{table}.parquet")


_READ_ERRORS = (pa.ArrowException, ValueError, KeyError, TypeError, OSError)
"""What pyarrow raises for a damaged file or one of another shape."""


def _check_columns(path: Path, table: str) -> None:
    """`RunError` when the file lacks a column of ``table`` (a file of another shape): read
    with the table's schema, pyarrow would quietly fill the missing columns with nulls."""
    present = set(_parquet().ParquetFile(path).schema_arrow.names)
    missing = [name for name in schema(table).names if name not in present]
    if missing:
        raise RunError(
            f"{path}: not a {table} side file (no column {', '.join(missing[:4])}"
            f"{'…' if len(missing) > 4 else ''})"
        )


def _first_line(exc: BaseException) -> str:
    return str(exc).strip().splitlines()[0][:200] if str(exc).strip() else type(exc).__name__


def _parquet():
    """``pyarrow.parquet``, imported on first use: a run without side files (and the hooks in
    a training process, which import the store) never needs it."""
    import pyarrow.parquet

    return pyarrow.parquet


@functools.cache
def schema(table: str) -> pa.Schema:
    """The Arrow schema of a sample table (the record class's fields, nullable); cached, as
    working it out from the record's type hints costs ~0.3 ms, more than decoding a chunk."""
    kinds = column_kinds(RECORD_TYPES[table])
    return pa.schema([(name, _ARROW_TYPES[kinds[name]]) for name in columns(RECORD_TYPES[table])])


def to_arrow(table: str, frame: pd.DataFrame) -> pa.Table:
    """A frame with the table's columns as an Arrow table (NaN in int columns → null)."""
    sch = schema(table)
    kinds = column_kinds(RECORD_TYPES[table])
    arrays = []
    for fld in sch:
        col = frame[fld.name] if fld.name in frame else pd.Series([None] * len(frame))
        if kinds[fld.name] == "json":
            text = [_json_text(v) for v in col]
            arrays.append(pa.array(text, type=fld.type))
        elif pa.types.is_string(fld.type):
            values = col.astype(object).where(col.notna(), None)
            arrays.append(pa.array(values.to_numpy(object), type=fld.type))
        elif pa.types.is_boolean(fld.type):
            arrays.append(pa.array(col.fillna(False).to_numpy(bool), type=fld.type))
        elif pa.types.is_integer(fld.type) and pd.api.types.is_integer_dtype(col.dtype):
            # straight from the integers: a detour through float64 rounds ns timestamps
            ints = col.astype("Int64")
            mask = ints.isna().to_numpy()
            arrays.append(pa.array(ints.fillna(0).to_numpy(np.int64), type=fld.type, mask=mask))
        else:
            values = pd.to_numeric(col, errors="coerce").to_numpy(np.float64)
            mask = np.isnan(values)
            if pa.types.is_integer(fld.type):
                values = np.where(mask, 0, values).astype(np.int64)
            arrays.append(pa.array(values, type=fld.type, mask=mask))
    return pa.Table.from_arrays(arrays, schema=sch)


def from_columns(table: str, data: dict[str, object], n: int) -> pa.Table:
    """The Arrow table `to_arrow` makes of a frame of ``n`` rows of ``table``, made straight
    from column arrays (as `gpuprof.sim.cluster.typed_frame` takes them) without pandas.

    A value may be an array of ``n``, one value for every row, or None (a missing metric:
    null; for a ``json`` column ``{}``; for a ``bool`` one False); NaN in a number column
    is null, as in `to_arrow`.
    """
    sch = schema(table)
    kinds = column_kinds(RECORD_TYPES[table])
    arrays = []
    for fld in sch:
        value, kind = data.get(fld.name), kinds[fld.name]
        if kind == "json":
            values = [{}] * n if value is None else value
            arrays.append(pa.array([_json_text(v) for v in values], type=fld.type))
        elif kind == "str":
            if value is None or isinstance(value, str):
                arrays.append(pa.repeat(pa.scalar(value, fld.type), n))
            else:
                arrays.append(pa.array(np.asarray(value, dtype=object), type=fld.type,
                                       from_pandas=True))  # fmt: skip
        elif kind == "bool":
            flags = np.broadcast_to(np.asarray(False if value is None else value, bool), (n,))
            arrays.append(pa.array(flags, type=fld.type))
        elif value is None:
            arrays.append(pa.nulls(n, fld.type))
        else:
            arr = np.broadcast_to(np.asarray(value), (n,))
            if kind == "int" and arr.dtype.kind in "iub":
                arrays.append(pa.array(arr.astype(np.int64, copy=False), type=fld.type))
                continue
            values = arr.astype(np.float64, copy=False)
            mask = np.isnan(values)
            if kind == "int":
                values = np.where(mask, 0, values).astype(np.int64)
            arrays.append(pa.array(values, type=fld.type, mask=mask if mask.any() else None))
    return pa.Table.from_arrays(arrays, schema=sch)


CHUNK_MAGIC = b"GPC1"
"""A row chunk: this, the Arrow IPC stream's length (8 bytes, little-endian), then the stream
compressed whole with zstd. One compression of the whole stream rather than Arrow's per-buffer
compression: 3x smaller and 10x faster to read for chunks of a few dozen rows."""
_CHUNK_CODEC = pa.Codec("zstd", compression_level=1)


def encode_chunk(table: str, rows: list[tuple]) -> bytes:
    """Rows of a table (tuples in column order) as one compressed Arrow IPC stream: what a
    node's sampler ships through Ray, stored as it arrives in the run file's ``chunks`` table,
    so the receiving side does no work per row."""
    return encode_arrow(_rows_to_arrow(table, rows))


def encode_arrow(data: pa.Table) -> bytes:
    """An Arrow table of a record table's schema as a row chunk (see `encode_chunk`)."""
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, data.schema) as writer:
        writer.write_table(data)
    raw = sink.getvalue()
    packed = _CHUNK_CODEC.compress(raw, asbytes=True)
    return CHUNK_MAGIC + raw.size.to_bytes(8, "little") + packed


def _rows_to_arrow(table: str, rows: list[tuple]) -> pa.Table:
    """Column by column straight from the tuples (a few dozen rows: pandas would cost more
    than the data); through `to_arrow` when a value does not fit its column's type."""
    sch = schema(table)
    kinds = column_kinds(RECORD_TYPES[table])
    try:
        cols = list(zip(*rows)) if rows else [() for _ in sch]
        arrays = []
        for fld, values in zip(sch, cols):
            if kinds[fld.name] == "json":
                values = [_json_text(v) for v in values]
            arrays.append(pa.array(values, type=fld.type, from_pandas=True))
        return pa.Table.from_arrays(arrays, schema=sch)
    except (pa.ArrowException, TypeError, ValueError):
        frame = pd.DataFrame.from_records(rows, columns=columns(RECORD_TYPES[table]))
        return to_arrow(table, frame)


def decode_chunks(table: str, blobs: Iterable[bytes]) -> pa.Table:
    """Chunks of one table (`encode_chunk`) as one Arrow table with the table's schema."""
    sch = schema(table)
    batches = []
    for blob in blobs:
        if bytes(blob[:4]) != CHUNK_MAGIC:
            raise pa.ArrowInvalid("not a gpuprof row chunk")
        size = int.from_bytes(blob[4:12], "little")
        raw = _CHUNK_CODEC.decompress(blob[12:], decompressed_size=size)
        for batch in pa.ipc.open_stream(raw):
            batches.append(batch if batch.schema.equals(sch) else
                           pa.Table.from_batches([batch]).select(sch.names).cast(sch)
                           .to_batches()[0])  # fmt: skip
    return pa.Table.from_batches(batches, schema=sch) if batches else sch.empty_table()


def _json_text(value: object) -> str:
    if isinstance(value, str):
        return value  # already encoded (rows read straight from SQLite)
    if not value:
        return "{}"
    return json.dumps(value, default=str, separators=(",", ":"))


def write(path: Path, table: str, frame: pd.DataFrame) -> None:
    """Write a sample frame as a side file, atomically (temporary name, then rename).

    Rows are sorted by `SORT_KEYS`; GPU samples get one row group per GPU so a reader can
    take one GPU at a time.
    """
    if table == "gpu" and len(frame):
        groups = frame.groupby(["host", "gpu"], sort=True, dropna=False).indices
        write_groups(path, table, (frame.iloc[rows] for rows in groups.values()))
    else:
        write_groups(path, table, [frame])


def write_groups(path: Path, table: str, frames: Iterable[pd.DataFrame | pa.Table]) -> int:
    """Write frames as the row groups of one side file, atomically; returns the rows written.

    Each frame is sorted by `SORT_KEYS` and becomes its own row group(s). Arrow tables (of
    the table's `schema`, e.g. from `from_columns`) are written as they are: already in
    that order.
    """
    tmp = path.with_name(path.name + ".partial")
    rows = 0
    try:
        with _parquet().ParquetWriter(tmp, schema(table), compression="zstd") as writer:
            for frame in frames:
                if isinstance(frame, pa.Table):
                    data = frame
                elif len(frame):
                    frame = frame.sort_values(SORT_KEYS[table], kind="stable")
                    data = to_arrow(table, frame)
                else:
                    continue
                if data.num_rows:
                    writer.write_table(data, row_group_size=1 << 30)
                    rows += data.num_rows
                del frame, data  # before the next frame is made
        os.replace(tmp, path)
    finally:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
    return rows


def to_frame(data: pa.Table, categories: bool = False) -> pd.DataFrame:
    """An Arrow table as a frame with the model's dtypes: strings as objects (or, with
    ``categories``, as pandas categoricals: far cheaper for millions of rows), ints with nulls
    as float64 (NaN = missing)."""
    text = [
        f.name for f in data.schema if pa.types.is_string(f.type) or pa.types.is_dictionary(f.type)
    ]
    if categories:
        for name in text:
            i = data.schema.get_field_index(name)
            col = data.column(i)
            if not pa.types.is_dictionary(col.type):
                data = data.set_column(i, name, col.dictionary_encode())
        return data.to_pandas(split_blocks=True)
    frame = data.drop_columns(text).to_pandas(split_blocks=True)
    for name in text:  # in schema order, where they were
        values = pd.Series(_objects(data.column(name)), frame.index, dtype=object, copy=False)
        frame.insert(data.schema.get_field_index(name), name, values)
    return frame


def _objects(column: pa.ChunkedArray) -> np.ndarray:
    """A string column as an object array (NaN for nulls), each distinct string made into a
    Python string once: much faster than converting row by row for repetitive columns."""
    encoded = column.combine_chunks()
    if not pa.types.is_dictionary(encoded.type):
        encoded = encoded.dictionary_encode()
    values = np.array([*encoded.dictionary.to_pylist(), np.nan], dtype=object)
    indices = encoded.indices.fill_null(len(values) - 1).to_numpy(zero_copy_only=False)
    return values[indices]


def read(
    path: Path, table: str, categories: bool = False, order_by: str | None = None
) -> pd.DataFrame:
    """A whole side file as a frame (strings as categoricals with ``categories``); `RunError`
    naming the file when it is damaged or holds another table. ``order_by``: the rows in
    stable order of that column (when it has no nulls), put in order before they become a
    frame — the order `store.load_run` gives its tables, at a fraction of a frame's sort."""
    try:
        _check_columns(path, table)
        if categories:
            return to_frame(_parquet().read_table(path, schema=schema(table)), categories)
        # strings straight from the dictionary pages: each distinct one becomes a Python string
        sch = schema(table)
        text = [f.name for f in sch if pa.types.is_string(f.type)]
        coded = pa.schema(
            [pa.field(f.name, pa.dictionary(pa.int32(), f.type)) if f.name in text else f
             for f in sch]
        )  # fmt: skip
        data = _parquet().read_table(path, schema=coded, read_dictionary=text)
        return to_frame(_in_order(data, order_by) if order_by else data)
    except _READ_ERRORS as exc:
        raise RunError(f"{path}: unreadable {table} side file ({_first_line(exc)})") from None


def _in_order(data: pa.Table, column: str) -> pa.Table:
    """``data`` in stable order of ``column`` (as it is when already in order, or when the
    column has nulls: the frame's own sort then decides)."""
    key = data.column(column)
    if key.null_count or len(key) < 2:
        return data
    values = key.to_numpy()
    if (values[1:] >= values[:-1]).all():
        return data
    return data.combine_chunks().take(np.argsort(values, kind="stable"))


def read_groups(
    path: Path, table: str, categories: bool = False, select: Callable[[int], bool] | None = None
) -> Iterator[pd.DataFrame]:
    """A side file one row group at a time (one GPU at a time for the ``gpu`` table);
    strings as categoricals with ``categories`` (see `to_frame`); only the row groups
    ``select(index)`` accepts, when given (the others are not read)."""
    text = [f.name for f in schema(table) if pa.types.is_string(f.type)]
    try:
        _check_columns(path, table)
        # dictionary pages read straight into categoricals: no Python string per row
        parquet = _parquet().ParquetFile(path, read_dictionary=text if categories else None)
        for i in range(parquet.num_row_groups):
            if select is not None and not select(i):
                continue
            data = parquet.read_row_group(i)
            yield to_frame(data if categories else data.cast(schema(table)), categories)
    except _READ_ERRORS as exc:
        raise RunError(f"{path}: unreadable {table} side file ({_first_line(exc)})") from None


def group_keys(path: Path) -> pd.DataFrame:
    """``host``, ``gpu``, ``uuid`` of each row group of a GPU side file, from the footer's
    column statistics (one GPU per row group), without reading any data."""
    try:
        meta = _parquet().ParquetFile(path).metadata
    except _READ_ERRORS as exc:
        raise RunError(f"{path}: unreadable side file ({_first_line(exc)})") from None
    names = [meta.schema.column(j).name for j in range(meta.num_columns)]
    rows = []
    for i in range(meta.num_row_groups):
        group = meta.row_group(i)
        values = []
        for name in ("host", "gpu", "uuid"):
            stats = group.column(names.index(name)).statistics
            ok = stats is not None and stats.has_min_max
            values.append(stats.max if ok else None)
        rows.append(values)
    return pd.DataFrame(rows, columns=["host", "gpu", "uuid"], dtype=object)


def count_groups(path: Path) -> int:
    """Row groups in a side file, from its footer (one per GPU in a ``gpu`` side file)."""
    try:
        return int(_parquet().ParquetFile(path).metadata.num_row_groups)
    except _READ_ERRORS as exc:
        raise RunError(f"{path}: unreadable side file ({_first_line(exc)})") from None


def count(path: Path) -> int:
    """Rows in a side file, from its footer (no data read)."""
    return int(_parquet().ParquetFile(path).metadata.num_rows)


def listed(conn: sqlite3.Connection) -> dict[str, str]:
    """The side files a run file lists: ``{table: file name}``."""
    row = conn.execute("SELECT value FROM meta WHERE key = ?", (META_KEY,)).fetchone()
    if row is None:
        return {}
    value = json.loads(row[0])
    return {str(k): str(v) for k, v in value.items()} if isinstance(value, dict) else {}


def compact(
    db_path: Path,
    read_table: Callable[..., pd.DataFrame],
    read_chunks: Callable[..., pd.DataFrame] | None = None,
) -> list[str]:
    """Move the sample tables of one run file into side files; returns the tables moved.

    ``read_table(conn, table, where, params)`` reads rows of a table as a typed frame, and
    ``read_chunks(conn, table, upto)`` the table's rows held in the ``chunks`` table (the
    store's readers). GPU samples are read and written one GPU at a time, so the memory needed
    is that of one GPU's samples or of the largest other table (chunked GPU rows are read
    whole). Rows already in a side file are kept (merged with the new ones).
    """
    conn = sqlite3.connect(db_path, timeout=30.0, isolation_level=None)
    moved: list[str] = []
    try:
        done = listed(conn)
        chunked = read_chunks is not None and _has_table(conn, "chunks")
        for table in TABLES:
            if not _has_table(conn, table):  # a file older than the table (model.STACK_TABLES)
                continue
            # rows up to this rowid move; rows a still-running process adds meanwhile stay
            last = conn.execute(f"SELECT max(rowid) FROM {table}").fetchone()[0]
            last_chunk = None
            if chunked:
                last_chunk = conn.execute(
                    "SELECT max(rowid) FROM chunks WHERE tbl = ?", (table,)
                ).fetchone()[0]
            if last is None and last_chunk is None:
                continue
            old = db_path.with_name(done[table]) if table in done else None
            old = old if old is not None and old.exists() else None
            dest = side_file(db_path, table)
            parts = [read(old, table)] if old is not None and table != "gpu" else []
            if last_chunk is not None:
                parts.append(read_chunks(conn, table, last_chunk))
            if table == "gpu":
                extra = pd.concat(parts, ignore_index=True) if parts else None
                write_groups(dest, table, _gpu_groups(conn, old, read_table, last or 0, extra))
            else:
                if last is not None:
                    parts.append(read_table(conn, table, "WHERE rowid <= ?", (last,)))
                frame = pd.concat(parts, ignore_index=True) if len(parts) > 1 else parts[0]
                write(dest, table, frame)
                del frame, parts
            moved.append(table)
            done[table] = dest.name
            # listing + deletion in one transaction, after the side file is in place
            conn.execute("BEGIN IMMEDIATE")
            try:
                if last is not None:
                    conn.execute(f"DELETE FROM {table} WHERE rowid <= ?", (last,))
                if last_chunk is not None:
                    conn.execute(
                        "DELETE FROM chunks WHERE tbl = ? AND rowid <= ?", (table, last_chunk)
                    )
                conn.execute(
                    "INSERT OR REPLACE INTO meta (key, value) VALUES (?, ?)",
                    (META_KEY, json.dumps(done)),
                )
                conn.execute("COMMIT")
            except BaseException:
                with contextlib.suppress(sqlite3.Error):
                    conn.execute("ROLLBACK")
                raise
        if moved:
            with contextlib.suppress(sqlite3.Error):
                conn.execute("VACUUM")  # give the moved rows' pages back to the filesystem
                conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    finally:
        conn.close()
    return moved


def _has_table(conn: sqlite3.Connection, name: str) -> bool:
    row = conn.execute("SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = ?", (name,))
    return row.fetchone() is not None


def _gpu_groups(
    conn: sqlite3.Connection,
    old: Path | None,
    read_table: Callable[..., pd.DataFrame],
    last: int,
    extra: pd.DataFrame | None = None,
) -> Iterator[pd.DataFrame]:
    """Each GPU's samples (side file rows first, then ``extra`` rows (from chunks), then
    SQLite rows up to rowid ``last``), one frame per GPU."""
    keys = set(conn.execute("SELECT DISTINCT host, gpu FROM gpu WHERE rowid <= ?", (last,)))
    extra_groups: dict[tuple, pd.DataFrame] = {}
    if extra is not None and len(extra):
        for (host, gpu), frame in extra.groupby(["host", "gpu"], sort=False, dropna=False):
            key = (None if pd.isna(host) else host, None if pd.isna(gpu) else int(gpu))
            extra_groups[key] = frame
        keys |= set(extra_groups)
    old_groups: dict[tuple, int] = {}
    if old is not None:
        parquet = _parquet().ParquetFile(old)
        for i in range(parquet.num_row_groups):
            first = parquet.read_row_group(i, columns=["host", "gpu"]).slice(0, 1).to_pylist()
            if first:
                old_groups[(first[0]["host"], first[0]["gpu"])] = i
        keys |= set(old_groups)
    for host, gpu in sorted(keys, key=lambda k: (str(k[0]), -1 if k[1] is None else k[1])):
        parts = []
        if (host, gpu) in old_groups:
            group = _parquet().ParquetFile(old).read_row_group(old_groups[(host, gpu)])
            parts.append(to_frame(group))
        if (host, gpu) in extra_groups:
            parts.append(extra_groups[(host, gpu)])
        if host is None or gpu is None:
            where = "WHERE host IS ? AND gpu IS ? AND rowid <= ?"
        else:
            where = "WHERE host = ? AND gpu = ? AND rowid <= ?"
        parts.append(read_table(conn, "gpu", where, (host, gpu, last)))
        yield pd.concat(parts, ignore_index=True) if len(parts) > 1 else parts[0]
