"""The sampler actor that gpuprof starts on every Ray node other than the watcher's.

One `NodeSampler` per node, pinned there (``NodeAffinitySchedulingStrategy(soft=False)``),
reserving no CPU and no GPU. It reads the node's GPUs through NVML (`NvmlCollector`) and its
host and Ray process tree (`HostCollector` rooted at the node's raylet) with the watcher's
`Sampler` at the watcher's interval, keeping the rows in memory; it also tails the spool
files the node's worker hooks write (`SpoolTail`). The driver takes what accumulated about
twice a second (`take`) and writes it into ``<run>/<node>.sqlite``, and times round trips to
`clock` to put the node on the run's time axis. Every timestamp here is this node's clock
(`gpuprof.nodes.now_ns`), exactly as the watcher stamps its own rows.

Nothing here raises into Ray: a collector that fails is a notice and the rest goes on.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import socket
import sqlite3
import threading
import time
from pathlib import Path
from typing import Any

from gpuprof import nodes
from gpuprof.integrations.ray_cluster import setup_hook
from gpuprof.model import RECORD_TYPES, columns

MAX_BUFFERED_ROWS = 1_000_000
"""Rows kept for the driver at most (minutes of 8 GPUs at 10 Hz, while the driver is slow to
take them); beyond it new rows are dropped and counted."""
TAIL_LIMIT = 50_000
"""Rows read from one spool file's table per take (bounds one reply's size)."""
SPOOL_TABLES = ("spans", "events")
"""The tables worker hooks write."""
ENV_START_DELAY = "GPUPROF_SIM_SAMPLER_DELAY_S"
"""For tests, set in one node's environment: its sampler waits this long (s) before it
starts, as a node whose imports or NVML take long would."""
STALE_SPOOL_S = 24 * 3600.0
"""A spool directory of another run untouched this long (s) is removed when a sampler starts."""


class RowBuffer:
    """Stands in for `gpuprof.store.BufferedWriter` under `Sampler`: rows (tuples in the
    table's column order) are kept until `take`. The node's raylet, the root of the watched
    process tree, is relabelled ``other``: ``main`` means the job's driver."""

    def __init__(self, max_rows: int = MAX_BUFFERED_ROWS, host: str | None = None) -> None:
        self.max_rows = max_rows
        self.host = host
        """The node's name in the run: rows kept under another (sampled before the driver
        named the node) are renamed as they are taken."""
        self._rows: dict[str, list[tuple]] = {}
        self._count = 0
        self.dropped = 0
        self._lock = threading.Lock()
        self._getters = {t: _row_getter(t) for t in RECORD_TYPES}
        self._hosted = {t for t in RECORD_TYPES if columns(RECORD_TYPES[t])[0] == "host"}

    def add(self, table: str, row: tuple) -> None:
        with self._lock:
            if self._count >= self.max_rows:
                self.dropped += 1
                return
            self._rows.setdefault(table, []).append(tuple(row))
            self._count += 1

    def add_records(self, table: str, records: Any) -> None:
        getter = self._getters[table]
        for record in records:
            if table == "procs" and record.role == "main":
                record.role = "other"
            self.add(table, getter(record))

    def take(self) -> dict[str, list[tuple]]:
        with self._lock:
            rows, self._rows, self._count = self._rows, {}, 0
        host = self.host
        if host is not None:  # the host is the first column of the tables that have one
            for table, kept in rows.items():
                if table in self._hosted and any(row[0] != host for row in kept):
                    rows[table] = [(host, *row[1:]) for row in kept]
        return rows


def _row_getter(table: str) -> Any:
    import operator

    return operator.attrgetter(*columns(RECORD_TYPES[table]))


class SpoolTail:
    """Reads the rows the node's worker hooks appended to ``<spool>/*.sqlite`` since the last
    call (by rowid: the hooks only insert). Rows come back with ``host`` set to the node's
    name in the run and ``attrs`` decoded, ready for a `BufferedWriter`."""

    def __init__(self, directory: Path, host: str) -> None:
        self.directory = directory
        self.host = host
        self._conns: dict[Path, sqlite3.Connection] = {}
        self._rowids: dict[tuple[Path, str], int] = {}
        self._columns = {t: columns(RECORD_TYPES[t]) for t in SPOOL_TABLES}
        self.complete: set[Path] = set()
        """Files whose last poll returned everything they held."""

    def poll(self, limit: int = TAIL_LIMIT) -> dict[str, list[tuple]]:
        out: dict[str, list[tuple]] = {t: [] for t in SPOOL_TABLES}
        try:
            paths = sorted(self.directory.glob("*.sqlite"))
        except OSError:
            return out
        for path in paths:
            done = True
            for table in SPOOL_TABLES:
                rows = self._read(path, table, limit)
                done = done and len(rows) < limit
                out[table].extend(rows)
            if done:
                self.complete.add(path)
            else:
                self.complete.discard(path)
        return out

    def _read(self, path: Path, table: str, limit: int) -> list[tuple]:
        cols = self._columns[table]
        try:
            conn = self._conns.get(path)
            if conn is None:
                conn = sqlite3.connect(path, timeout=1.0, isolation_level=None)
                self._conns[path] = conn
            last = self._rowids.get((path, table), 0)
            rows = conn.execute(
                f"SELECT rowid, {', '.join(cols)} FROM {table} WHERE rowid > ? "
                "ORDER BY rowid LIMIT ?",
                (last, limit),
            ).fetchall()
        except sqlite3.Error:  # not created yet, or locked: the next poll reads it
            return []
        if not rows:
            return []
        self._rowids[(path, table)] = rows[-1][0]
        attrs = cols.index("attrs")
        out = []
        for row in rows:
            values = list(row[1:])
            values[0] = self.host
            values[attrs] = _decode(values[attrs])
            out.append(tuple(values))
        return out

    def remove_finished(self) -> int:
        """Delete the spool files fully read whose writing process has exited; returns how
        many (files of running processes stay: they may still write)."""
        removed = 0
        for path in list(self.complete):
            pid = _pid_of(path)
            if pid is None or _alive(pid):
                continue
            conn = self._conns.pop(path, None)
            if conn is not None:
                with contextlib.suppress(sqlite3.Error):
                    conn.close()
            for suffix in ("", "-wal", "-shm"):
                with contextlib.suppress(OSError):
                    os.unlink(f"{path}{suffix}")
            self.complete.discard(path)
            removed += 1
        return removed

    def close(self) -> None:
        for conn in self._conns.values():
            with contextlib.suppress(sqlite3.Error):
                conn.close()
        self._conns.clear()


def remove_stale_spools(keep: Path, older_than_s: float = STALE_SPOOL_S) -> int:
    """Delete the spool directories of earlier runs on this node untouched for
    ``older_than_s`` (their processes are long gone and what they wrote was shipped);
    returns how many."""
    removed = 0
    now = time.time()
    for run in keep.parent.iterdir():
        if run == keep or not run.is_dir():
            continue
        files = [p for p in run.rglob("*") if p.is_file()]
        if all(now - p.stat().st_mtime > older_than_s for p in files):
            shutil.rmtree(run, ignore_errors=True)
            removed += 1
    return removed


def _decode(text: Any) -> dict[str, Any]:
    if isinstance(text, dict):
        return text
    try:
        value = json.loads(text) if text else {}
    except (TypeError, ValueError):
        return {}
    return value if isinstance(value, dict) else {}


def _pid_of(path: Path) -> int | None:
    """``<node>.<pid>.sqlite`` → pid."""
    parts = path.name.split(".")
    try:
        return int(parts[-2]) if len(parts) >= 3 else None
    except ValueError:
        return None


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:
        return True
    return True


def _setting(settings: dict[str, Any], key: str, default: int) -> int:
    value = settings.get(key)
    if isinstance(value, int | float) and not isinstance(value, bool) and value > 0:
        return int(value)
    return default


def _start_delay_s() -> float:
    try:
        return max(0.0, float(os.environ.get(ENV_START_DELAY) or 0.0))
    except ValueError:
        return 0.0


def _raylet_pid() -> int | None:
    """The raylet that started this worker: the root of the node's Ray process tree."""
    try:
        import psutil

        for parent in psutil.Process().parents():
            if parent.name() == "raylet":
                return parent.pid
    except Exception:
        pass
    return None


class NodeSampler:
    """The per-node actor (the driver wraps it with ``ray.remote``). Created with the
    watcher's settings, it starts sampling at once, as the node's own name, from a thread
    (so that `hello` answers meanwhile): a short job must not end before a node's first
    sample because of round trips to the driver. Its methods are then called by the
    driver's recorder thread, one at a time: `hello` (who this node is; its GPUs once it
    samples), `start` when it did not sample yet at `hello` or the driver names the node
    otherwise (two nodes with one name), `take` every pull period, `clock` for round trips
    and `finish` at the end.

    Created without ``interval_s`` it waits for `start` to sample (a benchmark drives it
    that way)."""

    def __init__(self, run_id: str, session: str, interval_s: float | None = None,
                 host_interval_s: float | None = None, nvml: bool = True,
                 stacks: dict[str, Any] | None = None) -> None:  # fmt: skip
        self.run_id = run_id
        self.session = session
        self.name = nodes.node_name()
        self.sampler: Any = None
        self.nvml: Any = None
        self.stacks_settings = stacks
        """`RunMeta.stacks` of the watcher: sample the node's Python stacks at these rates
        (None: not)."""
        self.stacks: Any = None
        """The node's `StackSampler`, from the first `take` (once the driver knows this is
        not the watcher's node, whose own watcher samples it)."""
        self._stacks_tried = False
        self.buffer = RowBuffer()
        self.tail: SpoolTail | None = None
        self.notices: list[str] = []
        self._sent: set[str] = set()
        self.info: dict[str, Any] = {"gpus": [], "versions": {}, "nvml": False}
        self._starting: threading.Thread | None = None
        if interval_s is not None:
            self._starting = threading.Thread(
                target=self._begin, args=(self.name, interval_s, host_interval_s, nvml),
                name="gpuprof-node-start", daemon=True,
            )  # fmt: skip
            self._starting.start()

    def _begin(self, name: str, interval_s: float, host_interval_s: float | None,
               nvml: bool) -> None:  # fmt: skip
        try:
            delay = _start_delay_s()
            if delay:  # tests: a node whose sampler starts late (see ENV_START_DELAY)
                time.sleep(delay)
            self._start(name, interval_s, host_interval_s, nvml)
        except Exception as exc:  # never into Ray: the driver's `start` says it
            self._note(f"{name}: sampling did not start ({type(exc).__name__}: {exc})")

    def hello(self) -> dict[str, Any]:
        """Who this node is: its name, its machine, whether the name is its own
        (``GPUPROF_HOST`` set) — the driver decides from these whether it is the watcher's —
        and, when it samples already, what `start` returns."""
        return {
            "node": nodes.node_name(),
            "machine": socket.gethostname(),
            "own_name": bool(os.environ.get(nodes.ENV_NODE)),
            "pid": os.getpid(),
            **(self._info() if self._started() else {}),
        }

    def _started(self) -> bool:
        return self.sampler is not None and (self._starting is None
                                             or not self._starting.is_alive())  # fmt: skip

    def start(self, name: str, interval_s: float, host_interval_s: float | None,
              nvml: bool, stacks: dict[str, Any] | None = None) -> dict[str, Any]:  # fmt: skip
        """Sample as ``name`` (the node's name in the run): started here unless it already
        samples (then the rows, those kept so far included, are renamed); returns the node's
        GPU inventory, driver versions, notices and ``start_ns``, its first sample's time."""
        if stacks is not None:
            self.stacks_settings = stacks
        if self._starting is not None:
            self._starting.join()  # started as the node's own name: renamed below
        if self.sampler is not None:
            if name != self.name:
                self._rename(name)
            return self._info()
        return self._start(name, interval_s, host_interval_s, nvml)

    def _start(self, name: str, interval_s: float, host_interval_s: float | None,
               nvml: bool) -> dict[str, Any]:  # fmt: skip
        self.name = name
        self.buffer.host = name
        # sampling first: the spool's set-up and its tidying can wait, a short job cannot
        self._sample(name, interval_s, host_interval_s, nvml)
        spool = setup_hook.spool_dir(self.run_id, self.session, nodes.node_name())
        self.tail = SpoolTail(spool, name)
        with contextlib.suppress(Exception):
            remove_stale_spools(spool.parent)
        return self._info()

    def _sample(self, name: str, interval_s: float, host_interval_s: float | None,
                nvml: bool) -> None:  # fmt: skip
        from gpuprof.collectors.sampler import Sampler

        info = self.info
        collector = None
        if nvml:
            try:
                from gpuprof.collectors.nvml import NvmlCollector

                collector = NvmlCollector(name)
                if collector.open():
                    info.update(gpus=collector.inventory(), versions=collector.versions(),
                                nvml=True)  # fmt: skip
                else:
                    self.notices.append(
                        f"{name}: {collector.notice or 'NVML not available: profiling host only'}"
                    )
                    collector = None
            except Exception as exc:
                self.notices.append(f"{name}: NVML not available ({exc}): profiling host only")
                collector = None
        else:
            self.notices.append(f"{name}: NVML sampling turned off (--no-nvml)")
        self.nvml = collector
        host = None
        try:
            from gpuprof.collectors.host import HostCollector

            host = HostCollector(name, _raylet_pid() or os.getpid(),
                                 threads=self.stacks_settings is not None)  # fmt: skip
        except Exception as exc:
            self.notices.append(f"{name}: host sampling not available ({exc})")
        self.sampler = Sampler(self.buffer, host, collector, interval_s=interval_s,
                               host_interval_s=host_interval_s)  # fmt: skip
        info["start_ns"] = nodes.now_ns()  # the first tick samples at once
        self.sampler.start()

    def _rename(self, name: str) -> None:
        old, self.name = self.name, name
        self.buffer.host = name
        for collector in (self.nvml, getattr(self.sampler, "host", None), self.stacks):
            if collector is not None:
                collector.host = name
        self.info["gpus"] = [{**g, "host": name} if g.get("host") == old else g
                             for g in self.info["gpus"]]  # fmt: skip
        self.notices = [n.replace(f"{old}: ", f"{name}: ", 1) if n.startswith(f"{old}: ")
                        else n for n in self.notices]  # fmt: skip
        if self.tail is not None:
            self.tail.host = name

    def _info(self) -> dict[str, Any]:
        return dict(self.info)

    def clock(self) -> int:
        """This node's wall clock now (ns since the epoch): the node end of a round trip."""
        return nodes.now_ns()

    def take(self) -> dict[str, Any]:
        """Everything sampled and spooled since the last call, and new notices."""
        if not self._stacks_tried and self._started():
            self._start_stacks()
        rows = self.buffer.take()
        if self.tail is not None:
            try:
                for table, spooled in self.tail.poll().items():
                    if spooled:
                        rows.setdefault(table, []).extend(spooled)
            except Exception as exc:
                self._note(f"{self.name}: reading the workers' spool failed ({exc})")
        notices = self._new_notices()
        # imported at the first take, after sampling started (pyarrow and pandas take a
        # second or more to import on a loaded node)
        from gpuprof import columnar

        chunks = {}
        for table, table_rows in rows.items():
            if table_rows:
                try:
                    chunks[table] = (len(table_rows), columnar.encode_chunk(table, table_rows))
                except Exception as exc:  # one bad row must not cost the node its record
                    self._note(f"{self.name}: {len(table_rows)} {table} rows not shipped ({exc})")
        return {"chunks": chunks, "notices": notices, "dropped": self.buffer.dropped}

    def finish(self) -> dict[str, Any]:
        """Stop sampling and return what is left; spool files of exited processes go."""
        self._stacks_tried = True  # none started now
        if self.stacks is not None:
            with contextlib.suppress(Exception):
                self.stacks.stop()  # its rounds end and are stored: the take below ships them
                self.buffer.add_records("events", [self.stacks.cost_event()])
        if self.sampler is not None:
            self.sampler.stop()
        batch = self.take()
        if self.nvml is not None:
            with contextlib.suppress(Exception):
                self.nvml.close()
        if self.tail is not None:
            with contextlib.suppress(Exception):
                self.tail.remove_finished()
            self.tail.close()
        return batch

    def _start_stacks(self) -> None:
        """Sample the Python stacks of the node's Ray workers (py-spy, as the watcher does
        its own node's), when the watcher does and this node samples; a node without py-spy
        says so once."""
        self._stacks_tried = True
        settings, host = self.stacks_settings, getattr(self.sampler, "host", None)
        if settings is None or host is None:
            return
        try:
            from gpuprof.collectors import stacks as stack_collector

            pyspy, why = stack_collector.find_pyspy()
            if pyspy is None:
                self._note(f"{self.name}: Python stacks: {why}: the node goes on without stacks")
                return
            sampler = self.sampler

            def gpu_idle() -> bool | None:
                latest = sampler.latest()
                return stack_collector.gpus_idle(latest[1]) if latest else None

            self.stacks = stack_collector.StackSampler(
                self.buffer, self.name, host.stack_targets, gpu_idle, pyspy=pyspy,
                rate_hz=_setting(settings, "rate_hz", stack_collector.RATE_HZ),
                idle_rate_hz=_setting(settings, "idle_rate_hz", stack_collector.IDLE_RATE_HZ),
                notify=lambda line: self._note(f"{self.name}: {line}"),
            )  # fmt: skip
            self.stacks.start()
        except Exception as exc:  # stacks are extra: sampling goes on without them
            self._note(f"{self.name}: Python stacks not sampled ({type(exc).__name__}: {exc})")
            self.stacks = None

    def _note(self, line: str) -> None:
        if line not in self.notices:
            self.notices.append(line)

    def _new_notices(self) -> list[str]:
        found = list(self.notices)
        if self.nvml is not None:
            found += [f"{self.name}: {n}" for n in self.nvml.notices]
        if self.sampler is not None:
            found += [f"{self.name}: {n}" for n in self.sampler.errors]
        fresh = [n for n in dict.fromkeys(found) if n not in self._sent]
        self._sent.update(fresh)
        return fresh
