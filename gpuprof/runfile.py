"""Writing run files: SQLite in WAL mode, one per host (or per process without a watcher).

What every writer needs and nothing more: the schema, opening and initialising a file, rows and
row chunks inserted in one transaction, metadata documents, the buffered writer the watcher
and the samplers use, and why a write failed. It imports SQLite and the record classes only,
never pandas, NumPy or Arrow, so a hooked training process that records spans (every rank,
every Ray worker) pays for none of them; `gpuprof.store` re-exports all of it beside the
reading side.
"""

from __future__ import annotations

import contextlib
import json
import operator
import os
import sqlite3
import threading
import time
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from gpuprof.errors import RunError
from gpuprof.model import RECORD_TYPES, SCHEMA_VERSION, column_kinds, columns

APPLICATION_ID = 0x47505546  # "GPUF": marks a SQLite file as a gpuprof run file
BUSY_TIMEOUT_S = 30.0
FLUSH_INTERVAL_S = 0.5
"""Writers commit at least this often; a crash loses no more than this (plus one commit)."""

_SQL_TYPES = {"int": "INTEGER", "float": "REAL", "str": "TEXT", "bool": "INTEGER", "json": "TEXT"}
_NETWORK_FS = {
    "nfs",
    "nfs4",
    "cifs",
    "smb3",
    "smbfs",
    "lustre",
    "gpfs",
    "beegfs",
    "glusterfs",
    "cephfs",
    "ceph",
    "9p",
    "afs",
    "fuse.sshfs",
    "fuse.juicefs",
    "fuse.s3fs",
    "fuse.gcsfuse",
    "wekafs",
}


def _table_sql(table: str) -> str:
    record_type = RECORD_TYPES[table]
    kinds = column_kinds(record_type)
    cols = ", ".join(f"{c} {_SQL_TYPES[kinds[c]]}" for c in columns(record_type))
    return f"CREATE TABLE IF NOT EXISTS {table} ({cols})"


def _insert_sql(table: str) -> str:
    cols = columns(RECORD_TYPES[table])
    return f"INSERT INTO {table} ({', '.join(cols)}) VALUES ({', '.join('?' * len(cols))})"


_INSERT = {table: _insert_sql(table) for table in RECORD_TYPES}
# attrgetter over the record's fields: ~10x quicker than dataclasses.astuple, which deep-copies
_ROW_OF = {table: operator.attrgetter(*columns(t)) for table, t in RECORD_TYPES.items()}
_JSON_NAMES = {
    table: [n for n, k in column_kinds(rt).items() if k == "json"]
    for table, rt in RECORD_TYPES.items()
}
_JSON_COLUMNS = {
    table: [columns(RECORD_TYPES[table]).index(n) for n in names]
    for table, names in _JSON_NAMES.items()
}


def host_file(run_dir: str | os.PathLike, host: str, pid: int | None = None) -> Path:
    """Path of a host's file in a run directory (``pid`` for a process without a watcher)."""
    name = f"{host}.sqlite" if pid is None else f"{host}.{pid}.sqlite"
    return Path(run_dir) / name


def filesystem_type(path: str | os.PathLike) -> str | None:
    """The filesystem type of the mount holding ``path`` (Linux /proc/mounts), else None."""
    try:
        target = os.path.realpath(path)
        best, best_type = "", None
        with open("/proc/mounts", encoding="utf-8", errors="replace") as mounts:
            for line in mounts:
                parts = line.split()
                if len(parts) < 3:
                    continue
                mount_point = parts[1].replace("\\040", " ")
                inside = target == mount_point or target.startswith(mount_point.rstrip("/") + "/")
                if inside and len(mount_point) >= len(best):
                    best, best_type = mount_point, parts[2]
        return best_type
    except OSError:
        return None


def is_network_filesystem(path: str | os.PathLike) -> bool:
    """True when ``path`` lies on a filesystem where SQLite's WAL mode is unsafe."""
    fs = filesystem_type(path)
    return fs is not None and (fs in _NETWORK_FS or fs.startswith("fuse."))


def connect(path: str | os.PathLike, *, create: bool = True) -> sqlite3.Connection:
    """Open (and with ``create`` initialise) a run file for writing, in WAL mode.

    Raises `RunError` for a file that is not a gpuprof run file or has a newer schema.
    """
    path = Path(path)
    try:
        conn = sqlite3.connect(
            path, timeout=BUSY_TIMEOUT_S, isolation_level=None, check_same_thread=False
        )
        _check_header(conn, path, allow_new=create)
        if create:
            with contextlib.suppress(sqlite3.OperationalError):
                conn.execute("PRAGMA journal_mode=WAL")
            conn.execute("PRAGMA synchronous=NORMAL")
            conn.execute("BEGIN IMMEDIATE")
            try:
                version = conn.execute("PRAGMA user_version").fetchone()[0]
                if version == 0:
                    conn.execute(f"PRAGMA application_id={APPLICATION_ID}")
                if version < SCHEMA_VERSION:  # older files gain the chunks table below
                    conn.execute(f"PRAGMA user_version={SCHEMA_VERSION}")
                for table in RECORD_TYPES:
                    conn.execute(_table_sql(table))
                conn.execute(CHUNKS_SQL)
                conn.execute(
                    "CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL)"
                )
                conn.execute("COMMIT")
            except BaseException:
                conn.execute("ROLLBACK")
                raise
        return conn
    except sqlite3.DatabaseError as exc:
        raise RunError(f"{path}: not a readable gpuprof run file ({exc})") from None


def _check_header(conn: sqlite3.Connection, path: Path, *, allow_new: bool) -> None:
    version = conn.execute("PRAGMA user_version").fetchone()[0]
    app_id = conn.execute("PRAGMA application_id").fetchone()[0]
    if version == 0 and app_id == 0:
        if allow_new:
            return
        raise RunError(f"{path}: not a gpuprof run file (no gpuprof header)")
    if app_id != APPLICATION_ID:
        raise RunError(f"{path}: not a gpuprof run file (application id {app_id:#x})")
    if version > SCHEMA_VERSION:
        raise RunError(
            f"{path}: written by a newer gpuprof (schema {version}, this one reads up to "
            f"{SCHEMA_VERSION}); upgrade gpuprof to read it"
        )


def encode_row(table: str, row: Sequence[Any]) -> tuple:
    """A row ready for SQLite: JSON-encode dict columns, leave the rest."""
    idx = _JSON_COLUMNS[table]
    if not idx:
        return tuple(row)
    out = list(row)
    for i in idx:
        out[i] = json.dumps(out[i] or {}, default=str, separators=(",", ":"))
    return tuple(out)


def insert_rows(
    conn: sqlite3.Connection,
    batch: dict[str, list[Sequence[Any]]],
    chunks: Sequence[tuple[str, int, bytes]] = (),
) -> None:
    """Insert rows of several tables in one transaction (rows already in column order), and
    row chunks (see `insert_encoded`)."""
    insert_encoded(
        conn,
        {table: [encode_row(table, r) for r in rows] for table, rows in batch.items()},
        chunks,
    )


CHUNKS_SQL = (
    "CREATE TABLE IF NOT EXISTS chunks (tbl TEXT NOT NULL, n INTEGER NOT NULL, data BLOB NOT NULL)"
)
"""Rows that arrived as Arrow IPC streams (`columnar.encode_chunk`, from a Ray node's
sampler): ``tbl`` the table, ``n`` the rows, ``data`` the stream. Read with the table's rows;
moved into the side files by compaction like them."""


def insert_encoded(
    conn: sqlite3.Connection,
    batch: dict[str, list[Sequence[Any]]],
    chunks: Sequence[tuple[str, int, bytes]] = (),
) -> None:
    """Like `insert_rows` for rows whose JSON columns are already strings (the hooks' path);
    ``chunks``: (table, rows, Arrow IPC stream) for the ``chunks`` table, same transaction."""
    conn.execute("BEGIN IMMEDIATE")
    try:
        for table, rows in batch.items():
            if rows:
                conn.executemany(_INSERT[table], rows)
        if chunks:
            conn.executemany("INSERT INTO chunks (tbl, n, data) VALUES (?, ?, ?)", chunks)
        conn.execute("COMMIT")
    except BaseException:
        with contextlib.suppress(sqlite3.Error):
            conn.execute("ROLLBACK")
        raise


def write_meta(conn: sqlite3.Connection, key: str, value: dict[str, Any]) -> None:
    """Store one metadata document (``run`` holds the watcher's `RunMeta`)."""
    conn.execute(
        "INSERT OR REPLACE INTO meta (key, value) VALUES (?, ?)",
        (key, json.dumps(value, default=str)),
    )


def write_meta_now(path: str | os.PathLike, key: str, value: dict[str, Any]) -> bool:
    """Store one metadata document through a fresh connection; False when it cannot be
    written (the disk is still full, the file system read-only, the file gone)."""
    if not Path(path).exists():
        return False
    try:
        conn = connect(path, create=False)
    except Exception:
        return False
    try:
        write_meta(conn, key, value)
        conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        return True
    except Exception:
        return False
    finally:
        with contextlib.suppress(sqlite3.Error):
            conn.close()


CHUNK = "\0chunk"
"""`BufferedWriter`'s queue entry for a row chunk (not a table name)."""


class BufferedWriter:
    """Collects rows in memory and commits them from a background thread.

    ``add`` is a list append (no lock, no I/O) so it is safe on a hot path; a daemon thread
    commits everything gathered every ``flush_interval_s``. ``on_error`` receives the first
    exception the thread meets; the writer then drops data rather than raise into its caller.
    """

    def __init__(
        self,
        path: str | os.PathLike,
        *,
        flush_interval_s: float = FLUSH_INTERVAL_S,
        on_error: Any = None,
        name: str = "gpuprof-writer",
    ) -> None:
        self.path = Path(path)
        self.flush_interval_s = flush_interval_s
        self._pending: list[tuple[str, Sequence[Any]]] = []
        self._meta: dict[str, dict[str, Any]] = {}
        self._conn: sqlite3.Connection | None = None
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._on_error = on_error
        self.failed = False
        self.failed_at_ns: int | None = None
        """When writing stopped (wall clock, ns), or None."""
        self.rows_written = 0
        self._thread = threading.Thread(target=self._loop, name=name, daemon=True)
        self._thread.start()

    def add(self, table: str, row: Sequence[Any]) -> None:
        """Queue one row (a tuple in the table's column order)."""
        self._pending.append((table, row))

    def add_records(self, table: str, records: Iterable[Any]) -> None:
        """Queue record dataclass instances of the table's type."""
        row_of = _ROW_OF[table]
        self._pending.extend([(table, row_of(record)) for record in records])

    def add_chunk(self, table: str, rows: int, data: bytes) -> None:
        """Queue a chunk of ``rows`` rows of ``table`` already encoded as an Arrow IPC stream
        (`columnar.encode_chunk`): stored as it is, one row of the ``chunks`` table."""
        self._pending.append((CHUNK, (table, rows, data)))

    def set_meta(self, key: str, value: dict[str, Any]) -> None:
        """Queue a metadata document; written with the next commit."""
        self._meta[key] = value

    def flush(self) -> None:
        """Commit everything queued so far (called by the thread; callable from any thread)."""
        with self._lock:
            if self.failed:
                self._pending.clear()
                return
            pending, self._pending = self._pending, []
            meta, self._meta = self._meta, {}
            if not pending and not meta:
                return
            batch: dict[str, list[Sequence[Any]]] = {}
            for table, row in pending:
                batch.setdefault(table, []).append(row)
            chunks = batch.pop(CHUNK, [])
            try:
                if self._conn is not None and not self.path.exists():
                    # SQLite would go on writing into the unlinked file: nothing would be kept
                    raise RunError(f"{self.path.parent}: the run directory was removed")
                if self._conn is None:
                    self._conn = connect(self.path)
                insert_rows(self._conn, batch, chunks)
                for key, value in meta.items():
                    write_meta(self._conn, key, value)
                self.rows_written += len(pending)
            except Exception as exc:  # never raise into the process we are profiling
                self.failed = True
                self.failed_at_ns = time.time_ns()
                if self._on_error is not None:
                    self._on_error(exc)

    def _loop(self) -> None:
        while not self._stop.wait(self.flush_interval_s):
            self.flush()

    def close(self) -> None:
        """Stop the thread, commit what is left and close the file."""
        self._stop.set()
        if self._thread.is_alive() and self._thread is not threading.current_thread():
            self._thread.join(timeout=5.0)
        self.flush()
        with self._lock:
            if self._conn is not None:
                with contextlib.suppress(sqlite3.Error):
                    self._conn.close()
                self._conn = None


# --------------------------------------------------------------------------------------------
# Reading


def failure_reason(exc: BaseException, path: str | os.PathLike | None = None) -> str:
    """A short human reason for a write failure: disk full, read-only, directory removed…

    SQLite's errors carry no errno ("unable to open database file"), so with ``path`` (the
    file that could not be written) the file system itself is asked as well.
    """
    import errno

    text = str(exc).lower()
    code = getattr(exc, "errno", None)
    if code == errno.ENOSPC or "disk is full" in text or "no space" in text:
        return "disk full"
    if code == errno.EROFS or "read-only" in text or "readonly" in text:
        return "read-only file system"
    if "was removed" in text or code == errno.ENOENT:
        return "run directory removed"
    if path is not None:
        directory = Path(path).parent
        try:
            fs = os.statvfs(directory)
        except OSError:
            return "run directory removed" if not directory.exists() else f"{exc}"
        if fs.f_flag & os.ST_RDONLY:
            return "read-only file system"
        if fs.f_bavail == 0:
            return "disk full"
    return f"{type(exc).__name__}: {exc}"
