"""A run followed while it is recorded, for what serves its figures live: the Prometheus
endpoint (`gpuprof.reports.prometheus`) and the experiment-tracker logger
(`gpuprof.reports.trackers`).

`LiveRun` holds the watcher's node's `LiveState` (fed from the sampler's newest readings and
the spans and steps its run files gain) and, on a Ray cluster, one state per other node whose
rows the driver records on this machine, with the last value of each GPU and host reading.
`RunFollower` is the thread that feeds it: the sampler's readings every `READINGS_POLL_S`,
the run files (`gpuprof.run_tail`) at most every `STORE_POLL_S`. Nothing here touches the
hardware or raises into the watcher: a failure becomes one of at most `MAX_ERRORS` notices.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

from gpuprof.nodes import natural_key
from gpuprof.reports.live import STORE_POLL_S, LiveState, Readings
from gpuprof.run_tail import NodeRows, RunTail

READINGS_POLL_S = 0.25
"""How often the follower takes the sampler's newest readings; each reading's idle GPUs are
charged to the phase it falls in, as in the live view."""
MAX_ERRORS = 3
"""Notices kept about failures (the watch goes on without the figures that failed)."""

STALL_KIND_OF_PHASE = {
    "reshard": "reshard_idle",
    "reward": "reward_bound",
    "dataload": "dataloader_starvation",
    "checkpoint": "periodic_stall",
    "eval": "periodic_stall",
    "rollout": "generation_tail",
}
"""The stall kind the analyzer charges idle time inside a phase to; others: ``phase_idle``."""


def stall_kind(phase: str) -> str:
    """The stall kind named for the "top finding so far" of idle time in ``phase``."""
    return STALL_KIND_OF_PHASE.get(phase, "phase_idle")


class LiveRun:
    """The watcher's node's `LiveState` and the other nodes' states, with the last GPU and
    host readings of every node.

    ``state`` and ``node`` are the watcher's node: ``readings`` gives its freshest GPU values
    (``Sampler.latest``); ``gpus`` is the run's GPU inventory (``RunMeta.gpus``: host, index,
    uuid, name). The cluster's other nodes, whose rows a Ray driver records on this machine,
    come through `take_rows`, each with a state of its own. Thread-safe: whoever reads it
    holds ``lock``.
    """

    gpu_attrs: tuple[str, ...] = ("util_gpu_pct", "mem_used_bytes", "mem_total_bytes")
    """`GpuSample` attributes whose last value is held per GPU."""
    host_attrs: tuple[str, ...] = ("cpu_pct", "mem_used_bytes", "mem_total_bytes")
    """`HostSample` attributes whose last value is held per node."""

    def __init__(
        self,
        state: LiveState,
        node: str,
        *,
        readings: Callable[[], Readings | None] | None = None,
        gpus: Sequence[dict[str, Any]] = (),
        lock: threading.Lock | None = None,
    ) -> None:
        self.state = state
        self.node = node
        self.readings = readings
        self.gpus = list(gpus)
        self.lock = lock or threading.Lock()
        self.errors: list[str] = []
        self.others: dict[str, LiveState] = {}
        """The other nodes' states, from the rows their files gained."""
        self._held: dict[tuple[str, int], dict[str, tuple[int, float]]] = {}
        """(host, GPU) → attribute → (t_ns, value) of its last reading."""
        self._uuid: dict[tuple[str, int], str] = {}
        self._host: dict[str, tuple[int, dict[str, float]]] = {}
        """node → (t_ns, host attribute → value) of its last host sample."""
        self._arrived: dict[str, float] = {}
        """node → when (monotonic s) its file last gave samples."""
        self._lost: set[str] = set()
        self._offsets: dict[str, int] = {}
        self._ips: dict[str, str] = {}
        """Another node → its IP address in Ray's node table."""

    # ----- inputs (any thread)
    def take(self, readings: Readings | None) -> None:
        """Take the sampler's newest readings into the state and the held values."""
        if readings is None:
            return
        with self.lock:
            self.state.add_readings(readings)
            t_ns, gpus, host = readings
            for g in gpus:
                key = (g.host, g.gpu)
                if g.uuid:
                    self._uuid[key] = g.uuid
                held = self._held.setdefault(key, {})
                for attr in self.gpu_attrs:
                    value = getattr(g, attr, None)
                    if value is not None:
                        held[attr] = (g.t_ns or t_ns, float(value))
            if host is not None:
                values = {a: getattr(host, a, None) for a in self.host_attrs}
                self._host[self.node] = (t_ns, {a: float(v) for a, v in values.items()
                                                if v is not None})  # fmt: skip

    def take_rows(self, node: str, rows: NodeRows) -> None:
        """What a node's files gained (`gpuprof.run_tail`): spans and steps of the
        watcher's node, or everything a Ray driver recorded for another node."""
        with self.lock:
            if node == self.node:
                self.state.add_rows(rows)
                return
            state = self.others.get(node)
            if state is None:
                state = self.others[node] = LiveState(self.state.idle_util_pct)
            if rows.gpu is not None and rows.gpu.num_rows:
                self._take_gpu_table(node, rows.gpu, state)
                self._arrived[node] = time.monotonic()
            if rows.host is not None and rows.host.num_rows:
                last = rows.host.slice(rows.host.num_rows - 1).to_pylist()[0]
                values = {a: last.get(a) for a in self.host_attrs}
                self._host[node] = (int(last["t_ns"]), {a: float(v) for a, v in values.items()
                                                        if v is not None})  # fmt: skip
                self._arrived[node] = time.monotonic()
            state.add_rows(rows)
            if rows.lost_ns is not None:
                self._lost.add(node)

    def _take_gpu_table(self, node: str, table: pa.Table, state: LiveState) -> None:
        """A node's GPU samples: the last value of each attribute per GPU is held, and the
        utilisation goes into the node's idle accounting."""
        t = _ints(table.column("t_ns"))
        gpu = _ints(table.column("gpu"))
        # rows come in the order they were sampled: each GPU's last row holds its newest values,
        # and the last tick's rows are usually all of them
        count = len(np.unique(gpu))
        tick = table.slice(table.num_rows - count)
        if len(set(tick.column("gpu").to_pylist())) < count:
            _, from_end = np.unique(gpu[::-1], return_index=True)
            tick = table.take(len(gpu) - 1 - from_end)
        last = tick.to_pylist()
        gaps = set()
        for row in last:
            key = (node, int(row["gpu"]))
            if row["uuid"]:
                self._uuid[key] = row["uuid"]
            held = self._held.setdefault(key, {})
            for attr in self.gpu_attrs:
                value = row[attr]
                if value is not None:
                    held[attr] = (int(row["t_ns"]), float(value))
                elif table.column(attr).null_count < table.num_rows:
                    gaps.add(attr)
        for attr in gaps:  # read for some GPUs in some rows (PCIe without NVML's counters)
            values = _floats(table.column(attr))
            valid = np.flatnonzero(~np.isnan(values))
            order = valid[np.argsort(gpu[valid], kind="stable")]
            g = gpu[order]
            for i in order[np.r_[g[1:] != g[:-1], True]].tolist():
                self._held.setdefault((node, int(gpu[i])), {})[attr] = (int(t[i]), float(values[i]))
        state.add_gpu_samples(t, gpu, _floats(table.column("util_gpu_pct")))

    def set_others(
        self,
        inventory: Sequence[dict[str, Any]],
        offsets: dict[str, int],
        addresses: dict[str, str] | None = None,
    ) -> None:
        """The other nodes' GPU inventories, clock offsets and IP addresses, as their files
        state them."""
        with self.lock:
            known = {(str(g.get("host")), g.get("index")) for g in self.gpus}
            self.gpus.extend(g for g in inventory
                             if (str(g.get("host")), g.get("index")) not in known)  # fmt: skip
            self._offsets = dict(offsets)
            if addresses is not None:
                self._ips = dict(addresses)

    def error(self, message: str) -> None:
        if len(self.errors) < MAX_ERRORS and message not in self.errors:
            self.errors.append(message)

    # ----- reading (hold ``lock``)
    def states(self) -> list[tuple[str, LiveState]]:
        """Every node's state, the watcher's first, then the others in natural order."""
        others = sorted(self.others.items(), key=lambda kv: natural_key(kv[0]))
        return [(self.node, self.state), *others]

    def order(self, node: str) -> tuple:
        return (node != self.node, natural_key(node))

    def gpu_order(self, key: tuple[str, int]) -> tuple:
        return (*self.order(key[0]), key[1])


def _ints(column: pa.ChunkedArray) -> np.ndarray:
    return np.asarray(column.to_numpy(zero_copy_only=False), dtype=np.int64)


def _floats(column: pa.ChunkedArray) -> np.ndarray:
    """A numeric column as float64, NaN where it is null."""
    return np.asarray(column.to_numpy(zero_copy_only=False), dtype=np.float64)


class RunFollower:
    """The thread that feeds a `LiveRun`: the sampler's newest readings every ``period_s``,
    what the run files gained (`RunTail`) at most every `STORE_POLL_S`, and ``on_tick()``
    after each round; once more, files included, when it is stopped. ``on_start()`` runs
    first, in the thread. ``what`` names the user
    of the figures in its notices ("metrics endpoint"). Failures become notices in
    ``live.errors``; nothing raises."""

    def __init__(
        self,
        live: LiveRun,
        db_path: Path | str,
        *,
        run_dir: Path | None = None,
        run_id: str | None = None,
        other_nodes: bool = True,
        what: str,
        name: str,
        period_s: float = READINGS_POLL_S,
        on_tick: Callable[[], None] | None = None,
        on_start: Callable[[], None] | None = None,
    ) -> None:
        self.live = live
        self.what = what
        self.period_s = period_s
        self.on_tick = on_tick
        self.on_start = on_start
        self.tail = RunTail(Path(db_path), live.node, run_dir=run_dir, run_id=run_id,
                            other_nodes=other_nodes)  # fmt: skip
        self._next_poll = 0.0
        self._stop = threading.Event()
        self.thread = threading.Thread(target=self._run, name=name, daemon=True)

    def start(self) -> None:
        self.thread.start()

    def stop(self, timeout_s: float = 5.0) -> None:
        """Stop after one last round (at most ``timeout_s``)."""
        self._stop.set()
        if self.thread.is_alive():
            self.thread.join(timeout=timeout_s)

    def _round(self, force: bool = False) -> None:
        """The newest readings, and the run files when their time has come (or ``force``)."""
        live = self.live
        started = time.monotonic()
        try:
            if live.readings is not None:
                live.take(live.readings())
            if force or started >= self._next_poll:
                batches = self.tail.poll()  # outside the lock: file I/O
                # the nodes' GPUs, clocks and addresses before their rows: a scrape between
                # the two would serve a GPU's readings without its model or its clock offset
                live.set_others(self.tail.inventory(), self.tail.offsets(),
                                self.tail.addresses())  # fmt: skip
                for node, rows in batches.items():
                    live.take_rows(node, rows)
                self._next_poll = started + STORE_POLL_S
            if self.on_tick is not None and not force:
                self.on_tick()
        except Exception as exc:  # never let the figures disturb the watch
            live.error(f"{self.what}: {exc!r}")

    def _run(self) -> None:
        if self.on_start is not None:  # in this thread: it may wait (name resolution)
            try:
                self.on_start()
            except Exception as exc:
                self.live.error(f"{self.what}: {exc!r}")
        try:
            while not self._stop.is_set():
                started = time.monotonic()
                self._round()
                self._stop.wait(max(0.0, self.period_s - (time.monotonic() - started)))
            self._round(force=True)  # what the files gained since the last round
        finally:
            self.tail.close()  # in the thread that opened it
