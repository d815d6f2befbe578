"""Following a run while it is recorded: what the live view and the metrics endpoint read.

The watcher's own file is not all of a run. On the watcher's node, processes that did not
inherit the watcher's file write their own: Ray workers started by a raylet that was running
before the watch (verl's TaskRunner and workers on a ``ray start`` cluster:
``<node>.<pid>.sqlite``) and the other srun tasks of the node (``<node>.task<k>.sqlite``). On
a Ray cluster the driver's recorder writes every other node's samples and spans into
``<node>.sqlite`` as Arrow chunks (docs/MULTINODE.md). `RunTail` finds these files with a
directory scan every `SCAN_S` and reads each by rowid, so a poll returns only what is new,
grouped by node.

Only files written on this machine are read. SQLite's WAL index is shared memory, which
another machine cannot see: in a run directory shared by the watchers of a torchrun/Slurm
launch (``other_nodes=False``) the other nodes' files are left alone, and each node's watcher
follows its own node. A file that cannot be read yet (being created, locked) is tried again at
the next poll; nothing here raises into the caller's thread.
"""

from __future__ import annotations

import contextlib
import json
import re
import sqlite3
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from gpuprof import columnar, store

SCAN_S = 3.0
"""How often the run directory is listed for files that appeared (a node joining, a worker
starting); the files already followed are read at every poll."""
ROW_LIMIT = 100_000
"""Plain rows read per table and file in one poll (the rest comes at the next)."""
CHUNK_LIMIT = 2_000
"""Arrow chunks read per file in one poll (at most four per pull of a node's sampler)."""
CHUNK_TABLES = ("gpu", "host", "spans", "events")
"""The chunk tables a follower needs: samples, spans and step events (not process rows)."""
STEP_COLUMNS = ("pid", "rank", "t_ns")


@dataclass
class NodeRows:
    """What one node's files gained since the last poll.

    ``spans`` are ``(pid, rank, phase, start_ns, end_ns)`` of span rows, ``span_table`` the
    spans that came as chunks; ``steps`` ``(pid, rank, t_ns)`` (in time order from
    `RunTail.poll`, in the file's order from `FileTail.poll`); ``gpu`` (every
    sample) and ``host`` (the newest pull's) hold the samples a Ray driver stored for another
    node (columns of `GpuSample` / `HostSample`; the watcher's own node has its sampler
    instead); ``lost_ns`` is set when the driver recorded the node as lost. All times are on
    the node's own clock.
    """

    spans: list[tuple] = field(default_factory=list)
    steps: list[tuple] = field(default_factory=list)
    span_table: pa.Table | None = None
    """Spans that came as Arrow chunks (`Span` columns), kept as columns: hundreds a pull."""
    gpu: pa.Table | None = None
    host: pa.Table | None = None
    lost_ns: int | None = None

    def extend(self, other: NodeRows) -> None:
        self.spans.extend(other.spans)
        self.steps.extend(other.steps)
        self.span_table = _concat(self.span_table, other.span_table)
        self.gpu = _concat(self.gpu, other.gpu)
        self.host = _concat(self.host, other.host)
        if other.lost_ns is not None:
            self.lost_ns = other.lost_ns

    def span_count(self) -> int:
        return len(self.spans) + (0 if self.span_table is None else self.span_table.num_rows)

    def __bool__(self) -> bool:
        tables = (self.span_table, self.gpu, self.host)
        return bool(self.spans or self.steps or any(t is not None for t in tables)
                    or self.lost_ns is not None)  # fmt: skip


def _concat(a: pa.Table | None, b: pa.Table | None) -> pa.Table | None:
    if a is None or b is None:
        return a if b is None else b
    return pa.concat_tables([a, b])


class FileTail:
    """Reads what one run file gained since the last call: span rows, step (and node-lost)
    events and, with ``chunks``, the Arrow chunks a Ray driver stored for another node."""

    def __init__(self, path: Path, *, chunks: bool = False) -> None:
        self.path = path
        self.chunks = chunks
        self.conn: sqlite3.Connection | None = None
        self.span_rowid = 0
        self.event_rowid = 0
        self.chunk_rowid = 0
        self.damaged = 0
        """Chunks that could not be decoded (skipped; the loader reports them)."""
        self._version: int | None = None

    def poll(self) -> NodeRows:
        out = NodeRows()
        try:
            if self.conn is None:
                self.conn = store.connect(self.path, create=False)
            # changes when another connection commits: an unchanged file costs one query
            version = self.conn.execute("PRAGMA data_version").fetchone()[0]
            if version == self._version:
                return out
            complete = self._rows(out)
            if self.chunks:
                complete = self._chunks(out) and complete
            if complete:  # else the rest is read at the next poll, whatever the version
                self._version = version
        except Exception:  # a locked or half-created file: what was read is kept
            pass
        return out

    def _rows(self, out: NodeRows) -> bool:
        """Span rows and events added since the last call; False when a limit was reached."""
        conn = self.conn
        spans = []
        if not self.chunks:  # a driver stores a node's spans as chunks, its own events as rows
            spans = conn.execute(
                "SELECT rowid, pid, rank, phase, start_ns, end_ns FROM spans WHERE rowid > ? "
                "ORDER BY rowid LIMIT ?",
                (self.span_rowid, ROW_LIMIT),
            ).fetchall()
        if spans:
            self.span_rowid = spans[-1][0]
            out.spans.extend(r[1:] for r in spans)
        events = conn.execute(
            "SELECT rowid, pid, rank, t_ns, kind FROM events WHERE rowid > ? "
            "AND kind IN ('step', 'node_lost') ORDER BY rowid LIMIT ?",
            (self.event_rowid, ROW_LIMIT),
        ).fetchall()
        if events:
            self.event_rowid = events[-1][0]
            for _, pid, rank, t_ns, kind in events:
                if kind == "step":
                    out.steps.append((pid, rank, t_ns))
                else:
                    out.lost_ns = t_ns
        return len(spans) < ROW_LIMIT and len(events) < ROW_LIMIT

    def _chunks(self, out: NodeRows) -> bool:
        """Chunks added since the last call; False when the limit was reached."""
        marks = ", ".join("?" * len(CHUNK_TABLES))
        rows = self.conn.execute(
            f"SELECT rowid, tbl, data FROM chunks WHERE rowid > ? AND tbl IN ({marks}) "
            "ORDER BY rowid LIMIT ?",
            (self.chunk_rowid, *CHUNK_TABLES, CHUNK_LIMIT),
        ).fetchall()
        if not rows:
            return True
        self.chunk_rowid = rows[-1][0]
        blobs: dict[str, list[bytes]] = {}
        for _, table, data in rows:
            blobs.setdefault(table, []).append(data)
        if "host" in blobs:  # only the newest host sample is served
            blobs["host"] = blobs["host"][-1:]
        for table, parts in blobs.items():
            data = self._decode(table, parts)
            if data is None or not data.num_rows:
                continue
            if table == "gpu":
                out.gpu = _concat(out.gpu, data)
            elif table == "host":
                out.host = _concat(out.host, data)
            elif table == "spans":
                out.span_table = _concat(out.span_table, data)
            else:
                steps = data.filter(pc.equal(data.column("kind"), "step"))
                out.steps.extend(zip(*(steps.column(c).to_pylist() for c in STEP_COLUMNS)))
        return len(rows) < CHUNK_LIMIT

    def _decode(self, table: str, blobs: list[bytes]) -> pa.Table | None:
        try:
            return columnar.decode_chunks(table, blobs)
        except (pa.ArrowException, ValueError, OSError):
            pass
        good = []  # one damaged chunk costs only itself
        for blob in blobs:
            try:
                good.append(columnar.decode_chunks(table, [blob]))
            except (pa.ArrowException, ValueError, OSError):
                self.damaged += 1
        return pa.concat_tables(good) if good else None

    def documents(self) -> dict[str, Any]:
        """The file's metadata documents (``run``, ``clock``…); empty while unreadable."""
        try:
            if self.conn is None:
                self.conn = store.connect(self.path, create=False)
            rows = self.conn.execute("SELECT key, value FROM meta").fetchall()
        except Exception:
            return {}
        out = {}
        for key, value in rows:
            with contextlib.suppress(ValueError, TypeError):
                out[key] = json.loads(value)
        return out

    def close(self) -> None:
        if self.conn is not None:
            with contextlib.suppress(Exception):
                self.conn.close()
            self.conn = None


@dataclass
class _Recorded:
    """A file a Ray driver records for another node, as far as its documents tell."""

    tail: FileTail
    node: str
    gpus: list[dict[str, Any]]
    offset_ns: int = 0
    address: str = ""
    """The node's IP in Ray's node table, as the driver recorded it."""


class RunTail:
    """Follows the files of a run that this machine writes (see the module's docstring).

    ``own_file`` is the watcher's file and ``node`` its node; ``run_dir`` the run directory
    (None: only ``own_file``); ``run_id`` the run's id, which a Ray driver's files name;
    ``other_nodes``: also follow the files a Ray driver writes for the cluster's other nodes
    (False for a watcher of a torchrun/Slurm launch, whose run directory other machines write).
    """

    def __init__(
        self,
        own_file: Path,
        node: str,
        *,
        run_dir: Path | None = None,
        run_id: str | None = None,
        other_nodes: bool = True,
    ) -> None:
        self.node = node
        self.run_dir = run_dir
        self.run_id = run_id
        self.other_nodes = other_nodes and run_dir is not None and bool(run_id)
        self.own: dict[Path, FileTail] = {Path(own_file): FileTail(Path(own_file))}
        self.recorded: dict[Path, _Recorded] = {}
        self._ignored: set[Path] = set()
        self._own_name = re.compile(rf"^{re.escape(node)}(?:\.(?:\d+|task\d+))?\.sqlite$")
        self._next_scan = 0.0

    def poll(self) -> dict[str, NodeRows]:
        """What every followed file gained since the last poll, by node name."""
        now = time.monotonic()
        if self.run_dir is not None and now >= self._next_scan:
            self._next_scan = now + SCAN_S
            with contextlib.suppress(Exception):
                self._scan()
        out: dict[str, NodeRows] = {}
        own = out.setdefault(self.node, NodeRows())
        for tail in self.own.values():
            own.extend(tail.poll())
        for rec in self.recorded.values():
            rows = rec.tail.poll()
            if rows:
                out.setdefault(rec.node, NodeRows()).extend(rows)
        for rows in out.values():
            rows.steps.sort(key=lambda row: row[2])
        return out

    def inventory(self) -> list[dict[str, Any]]:
        """The GPUs of the other nodes followed (their files' run documents)."""
        return [g for rec in self.recorded.values() for g in rec.gpus]

    def offsets(self) -> dict[str, int]:
        """Each other node's clock offset (ns to add to its times) as its file states it."""
        return {rec.node: rec.offset_ns for rec in self.recorded.values()}

    def addresses(self) -> dict[str, str]:
        """Each other node's IP address in Ray's node table, where its file states it."""
        return {rec.node: rec.address for rec in self.recorded.values() if rec.address}

    def _scan(self) -> None:
        for path in sorted(self.run_dir.glob("*.sqlite")):
            if path in self.own or path in self._ignored:
                continue
            rec = self.recorded.get(path)
            if rec is not None:  # the clock is measured again every minute
                self._read_documents(rec)
                continue
            if self._own_name.match(path.name):
                self.own[path] = FileTail(path)
            elif self.other_nodes:
                self._classify(path)
            else:
                self._ignored.add(path)

    def _classify(self, path: Path) -> None:
        tail = FileTail(path, chunks=True)
        meta = tail.documents().get("run")
        if not isinstance(meta, dict):
            tail.close()
            return  # no document yet: looked at again at the next scan
        if not store.recorded_for(meta, self.run_id, self.node):
            tail.close()
            self._ignored.add(path)
            return
        rec = _Recorded(tail, str(meta["hosts"][0]), [])
        self._read_documents(rec)
        self.recorded[path] = rec

    @staticmethod
    def _read_documents(rec: _Recorded) -> None:
        documents = rec.tail.documents()
        run, clock = documents.get("run"), documents.get("clock")
        if isinstance(run, dict):
            gpus = [dict(g, host=rec.node) for g in run.get("gpus") or [] if isinstance(g, dict)]
            rec.gpus = gpus or rec.gpus
            nodes = run.get("nodes")
            status = nodes.get(rec.node) if isinstance(nodes, dict) else None
            address = status.get("address") if isinstance(status, dict) else None
            if isinstance(address, str) and address:
                rec.address = address
        offset = clock.get("offset_ns") if isinstance(clock, dict) else None
        if isinstance(offset, int) and not isinstance(offset, bool):
            rec.offset_ns = offset

    def close(self) -> None:
        for tail in self.own.values():
            tail.close()
        for rec in self.recorded.values():
            rec.tail.close()
