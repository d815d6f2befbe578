"""The driver's side of a watched Ray job: one sampler actor per other node, their rows into
``<run>/<node>.sqlite``, their clocks measured, nodes that join or are lost.

Why a thread in the driver rather than a named receiver actor: the driver is the watched
command (or its descendant), on the watcher's machine, so (1) the run directory is local to
it — a receiver actor pinned to "the driver's node" does not exist when the driver is not a
cluster node (Ray Client) and is on another machine when the raylet it attached to is; (2)
its wall clock *is* the watcher's (same machine, same environment), the clock every node is
aligned on, so round trips measure exactly the offset the run needs; (3) nothing named is
left in the cluster to collide with another job, and no extra process runs. Actors cannot
call into a driver, so the thread *pulls*: every second (`TICK_S`; every `pull_period_s` past
32 nodes) it asks every sampler for what accumulated (`NodeSampler.take`): per table, one
Arrow IPC stream the sampler encoded (`gpuprof.columnar.encode_chunk`), which is queued as it
is on that node's `gpuprof.store.BufferedWriter` (one writer per file, all on this machine,
so SQLite's WAL never spans machines) and committed at once as one row of the file's
``chunks`` table. The driver does no work per sample: its cost is a few Ray calls per node
per pull (every reply read in one ``ray.get``) and one blob insert per table (per-row inserts
of 64 nodes' rows took a third of a core: docs/PERFORMANCE.md).

Clock offsets: ``t0`` and ``t1`` read here around a call that reads the node's clock ``n``;
the node's offset is ``(t0 + t1) / 2 - n`` (add it to the node's times to get the run's),
good to ``(t1 - t0) / 2``; the tightest of `CLOCK_ROUNDS` round trips is kept (more, up to
`CLOCK_MAX_ROUNDS` within `CLOCK_BUDGET_S`, while none is tighter than `CLOCK_TIGHT_NS`: on a
loaded machine most round trips wait on the scheduler), measured when a node starts and every
`CLOCK_EVERY_S`, and stored in the node's file as the ``"clock"``
metadata document that `gpuprof.clocks.stored_offset` reads. Rows are stored on the node's
own clock, as every writer of a run does; the loader applies the offset.

All failures are one line on stderr and the training goes on.
"""

from __future__ import annotations

import contextlib
import os
import sys
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, TextIO

from gpuprof import __version__
from gpuprof.integrations.ray_cluster.sampler import NodeSampler
from gpuprof.integrations.ray_cluster.setup_hook import is_reference
from gpuprof.model import RECORD_TYPES, Event, RunMeta
from gpuprof.nodes import now_ns

if TYPE_CHECKING:  # imported when the first node's file opens (`_store`): the samplers are
    # placed first, before the driver spends a second importing pandas and pyarrow
    from gpuprof import store

TICK_S = 1.0
"""How often rows are taken from the samplers of a cluster of up to `PULLS_PER_S` nodes; the
writers commit right after each pull. Each pull is a Ray call per node and each commit a
transaction per node file, whatever their size: at 0.5 s, 64 nodes cost the driver 10% of a
core (benchmarks/bench_multinode_scale.py). A node's rows reach the run within a pull period,
which is also what a crash of the driver loses of them."""
PULLS_PER_S = 32
"""The most Ray calls a second the recorder makes to take rows: past `PULLS_PER_S` nodes the
period grows with the cluster (2 s at 64 nodes), so the driver's cost stays under 5% of a
core; the samplers then ship more rows per call, which costs the same per row."""
MAX_PULL_S = 5.0
"""The longest pull period, whatever the number of nodes (past 160 the cost grows again)."""
MEMBERSHIP_S = 3.0
"""How often the cluster's node list is read (nodes that joined, nodes marked dead)."""
PLACE_TIMEOUT_S = 60.0
"""How long a sampler may take to start on its node (its worker process, the job's
runtime_env) before the node is given up; ``GPUPROF_RAY_PLACE_TIMEOUT_S`` overrides."""
START_POLL_S = 0.1
"""How often, between pulls, the recorder looks for samplers that have started."""
TAKE_WAIT_S = 0.3
"""How long one tick waits for the samplers' replies (later replies are read next tick)."""
CLOCK_ROUNDS = 8
"""Round trips per clock measurement at least; the tightest is kept."""
CLOCK_TIGHT_NS = 2_000_000
"""A round trip this short bounds the offset to ±1 ms: past `CLOCK_ROUNDS`, round trips go on
until one is (or `CLOCK_MAX_ROUNDS`, or `CLOCK_BUDGET_S`)."""
CLOCK_MAX_ROUNDS = 64
"""Round trips per clock measurement at most."""
CLOCK_BUDGET_S = 1.0
"""Time one clock measurement may take past its first `CLOCK_ROUNDS` round trips."""
CLOCK_EVERY_S = 60.0
"""How often each node's clock offset is measured again (clocks drift: NTP-disciplined clocks
by microseconds per minute). At most one node is measured per tick, so in a large cluster each is
measured less often (every ~128 s at 64 nodes, with 2 s ticks): 8 round trips per tick at
most, what benchmarks/bench_multinode_scale.py charges to the driver."""
FINISH_WAIT_S = 10.0
"""At the end, how long the samplers' last rows are waited for."""
NODE_TABLE_WAIT_S = 10.0
"""As the job ends, the longest the driver waits for Ray's node table (``ray.nodes()``, which
takes no timeout)."""
FINISH_LOCK_WAIT_S = 30.0
"""As the job ends, the longest the driver waits for its recording thread to leave a call to
Ray (a loaded machine makes such calls take seconds; a hung one must not hang the job)."""
FINISH_START_S = 5.0
"""At the end, how long samplers still being placed or started are waited for (a job shorter
than their start-up would otherwise end with those nodes unrecorded);
``GPUPROF_RAY_FINISH_START_S`` overrides."""
MAX_TICK_FAILURES = 5
"""Consecutive failed ticks after which the recorder gives up (one line)."""
WRITER_BACKSTOP_S = 5.0
"""The nodes' writers commit after every pull (`ClusterRecorder.tick`); their own thread
only commits what else was queued (a notice, a node lost) this often."""


def pull_period_s(nodes: int) -> float:
    """Seconds between two pulls of every sampler when ``nodes`` samplers are active:
    `TICK_S` up to `PULLS_PER_S` nodes, then growing with the cluster, at most `MAX_PULL_S`."""
    return min(MAX_PULL_S, max(TICK_S, nodes / PULLS_PER_S))


@dataclass(frozen=True)
class ClockEstimate:
    """A node's clock against the reference: ``offset_ns`` is added to the node's times;
    ``error_ns`` bounds how wrong that can be (half the round trip); ``rtt_ns`` the round
    trip it came from."""

    offset_ns: int
    error_ns: int
    rtt_ns: int


def estimate_offset(readings: Iterable[tuple[int, int, int]]) -> ClockEstimate | None:
    """The offset from round trips ``(t0, node_ns, t1)`` (``t0``/``t1`` on the reference
    clock before and after the node read its own): the tightest round trip's midpoint minus
    the node's reading. None without a usable round trip (``t1 < t0``)."""
    best: ClockEstimate | None = None
    for t0, node_ns, t1 in readings:
        rtt = t1 - t0
        if rtt < 0:
            continue
        if best is None or rtt < best.rtt_ns:
            best = ClockEstimate((t0 + t1) // 2 - node_ns, (rtt + 1) // 2, rtt)
    return best


@dataclass
class _Node:
    """One Ray node as the recorder sees it."""

    ray_id: str
    address: str
    actor: Any = None
    state: str = "placing"
    """placing → starting → active → lost / finished; or watcher (the watcher's own node,
    sampled by the watcher) or failed (no sampler: one line said why)."""
    since: float = field(default_factory=time.monotonic)
    pending: Any = None
    """The outstanding call's ObjectRef (hello, start or take)."""
    name: str | None = None
    writer: store.BufferedWriter | None = None
    meta: RunMeta | None = None
    offset_ns: int = 0
    next_clock: float = 0.0
    dropped: int = 0
    asked_ns: int = 0
    """When its sampler was asked for (the driver's clock, the run's)."""
    from_ns: int | None = None
    """Its first sample, on the run's clock."""
    heard_ns: int | None = None
    """When its sampler last replied with rows (the run's clock)."""

    @property
    def label(self) -> str:
        return self.name or f"{self.address} ({self.ray_id[:8]})"


class ClusterRecorder:
    """Records every node of the Ray cluster the driver is connected to, other than the
    watcher's, into ``run_dir``; `start` once ``ray.init`` returned, `finish` before Ray
    shuts down (at exit)."""

    def __init__(
        self,
        ray: Any,
        run_dir: Path,
        run_id: str,
        session: str,
        reference: str,
        reference_machine: str,
        *,
        interval_s: float = 0.1,
        host_interval_s: float | None = None,
        nvml: bool = True,
        stacks: dict[str, Any] | None = None,
        stream: TextIO | None = None,
        own_node_id: str | None = None,
    ) -> None:
        self.ray = ray
        self.run_dir = run_dir
        self.run_id = run_id
        self.session = session
        self.reference = reference
        self.reference_machine = reference_machine
        self.interval_s = interval_s
        self.host_interval_s = host_interval_s
        self.nvml = nvml
        self.stacks = stacks
        """How the nodes' samplers sample Python stacks (`RunMeta.stacks`; None: not)."""
        self.stream = stream
        self.own_node_id = own_node_id
        """The Ray node this driver started itself (``ray.init()`` without an address): its
        raylet has the driver's environment, so it is the watcher's node without asking."""
        self.place_timeout_s = _env_float("GPUPROF_RAY_PLACE_TIMEOUT_S", PLACE_TIMEOUT_S)
        self.finish_start_s = _env_float("GPUPROF_RAY_FINISH_START_S", FINISH_START_S)
        self.nodes: dict[str, _Node] = {}
        self.lines: list[str] = []
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._table_reader: threading.Thread | None = None
        self._next_membership = 0.0
        self._failures = 0
        self._finished = False
        self._actor_class: Any = None
        self._strategy: Callable[[str], Any] | None = None
        self.period_s = TICK_S
        """The current pull period (`pull_period_s` of the nodes being recorded)."""

    # -- life cycle ----------------------------------------------------------------------------

    def start(self) -> bool:
        """Start recording the cluster from a daemon thread; False (with one line) when this
        Ray lacks what it needs."""
        if not self.prepare():
            return False
        self._thread = threading.Thread(target=self._run, name="gpuprof-ray", daemon=True)
        self._thread.start()
        return True

    def prepare(self) -> bool:
        """What `tick` needs from Ray; False (with one line) when this Ray lacks it."""
        try:
            from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy
        except ImportError:
            version = getattr(self.ray, "__version__", "?")
            self._say(f"Ray {version} has no NodeAffinitySchedulingStrategy (Ray >= 2.0 "
                      "needed): the GPUs of the cluster's other nodes are not sampled")  # fmt: skip
            return False
        self._strategy = lambda node_id: NodeAffinitySchedulingStrategy(node_id, soft=False)
        self._actor_class = self.ray.remote(NodeSampler)
        return True

    def _run(self) -> None:
        while not self._stop.is_set():
            began = time.monotonic()
            try:
                with self._lock:
                    if self._stop.is_set() or not self.ray.is_initialized():
                        return
                    self.tick()
                self._failures = 0
            except Exception as exc:
                self._failures += 1
                if self._failures >= MAX_TICK_FAILURES:
                    self._say(f"recording the Ray cluster stopped ({type(exc).__name__}: "
                              f"{exc}); what was recorded so far is kept")  # fmt: skip
                    return
            self._between_ticks(began + self.period_s)

    def _between_ticks(self, until: float) -> None:
        """Wait for the next tick; meanwhile answer samplers that are starting within
        `START_POLL_S`, not a pull period later: a node's record begins there."""
        while not self._stop.is_set():
            left = until - time.monotonic()
            if left <= 0:
                return
            with self._lock:
                starting = [n for n in self.nodes.values() if n.state in ("placing", "starting")]
                if starting and not self._stop.is_set() and self.ray.is_initialized():
                    for node in starting:
                        self._advance(node)
            self._stop.wait(min(left, START_POLL_S) if starting else left)

    def finish(self) -> None:
        """Stop the thread, take the samplers' last rows, close every node's file. Safe to
        call more than once, and from ``atexit``; never raises."""
        if self._finished:
            return
        self._finished = True
        self._stop.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout=FINISH_WAIT_S)
        # bounded: a thread stuck in a call to Ray must not keep the job from ending
        if self._lock.acquire(timeout=FINISH_LOCK_WAIT_S):
            try:
                self._await_starting()
                self._finish_nodes()
            except Exception as exc:
                self._say(f"could not take the Ray nodes' last samples ({type(exc).__name__}: "
                          f"{exc}); what was recorded before is kept")  # fmt: skip
            finally:
                self._lock.release()
        else:
            self._say("the Ray nodes' last samples were not taken (the recorder's thread is "
                      "stuck in a call to Ray); what was recorded before is kept")  # fmt: skip
        for node in self.nodes.values():
            if node.writer is not None:
                with contextlib.suppress(Exception):
                    node.writer.close()

    def _await_starting(self) -> None:
        """Give samplers still being placed or started up to ``finish_start_s`` to start, so
        that a short job still gets their rows; say which nodes were never recorded."""
        deadline = time.monotonic() + self.finish_start_s
        while True:  # the caller holds the lock; the recorder's thread has stopped
            waiting = [n for n in self.nodes.values() if n.state in ("placing", "starting")]
            if not waiting or not self.ray.is_initialized():
                break
            for node in waiting:
                self._advance(node)
            if time.monotonic() >= deadline:
                break
            time.sleep(0.1)
        for node in self.nodes.values():
            if node.state in ("placing", "starting"):
                what = "placed" if node.state == "placing" else "started"
                waited = time.monotonic() - node.since
                self._fail(node, f"its sampler was still being {what} when the job ended "
                                 f"({waited:.1f} s after it was asked for)")  # fmt: skip

    def _finish_nodes(self) -> None:
        connected = self.ray.is_initialized()
        if connected:  # a node Ray already knows is dead was lost, not finished
            self._mark_dead(at_end=True)
        active = [n for n in self.nodes.values() if n.state == "active"]
        if connected and active:
            calls, last = [], []
            for node in active:
                if node.pending is not None:
                    calls.append((node, node.pending))
                last.append(node.actor.finish.remote())
                calls.append((node, last[-1]))
            refs = [ref for _, ref in calls]
            ready, _ = self.ray.wait(refs, num_returns=len(refs), timeout=FINISH_WAIT_S)
            ready = set(ready)
            for node, ref in calls:
                if ref in ready and node.state == "active":  # a node lost at its take is lost
                    self._receive(node, ref, at_end=True)
            # a node whose sampler never answered the last call is not a finished record:
            # dead by now (Ray may take seconds to notice a lost node), or out of reach
            silent = [n for n, ref in zip(active, last) if ref not in ready]
            if any(n.state == "active" for n in silent):
                self._mark_dead(at_end=True)
            for node in silent:
                if node.state == "active":
                    self._lost(node, f"its sampler did not answer within {FINISH_WAIT_S:g} s "
                                     "when the job ended", at_end=True)  # fmt: skip
        end = now_ns()
        for node in active:
            if node.state == "active":
                node.state = "finished"
                node.meta.end_ns = end
                node.writer.set_meta("run", node.meta.to_dict())
        if connected:
            for node in self.nodes.values():
                if node.actor is not None:
                    with contextlib.suppress(Exception):
                        self.ray.kill(node.actor)

    # -- one round ---------------------------------------------------------------------------

    def tick(self) -> None:
        """One round: the node list (every `MEMBERSHIP_S`), samplers starting, rows taken,
        one clock measurement when due."""
        now = time.monotonic()
        if now >= self._next_membership:
            self._next_membership = now + MEMBERSHIP_S
            self._membership()
        for node in list(self.nodes.values()):
            if node.state in ("placing", "starting"):
                self._advance(node)
        self._take()
        due = [n for n in self.nodes.values() if n.state == "active" and n.next_clock <= now]
        if due:
            self._measure_clock(min(due, key=lambda n: n.next_clock))

    def _mark_dead(self, at_end: bool = False) -> None:
        """The recorded or starting nodes Ray's node table says are dead: lost. Never raises
        (the table may be out of reach while Ray shuts down)."""
        table = self._node_table()
        for info in table or ():
            node = self.nodes.get(info.get("NodeID"))
            if node is None or info.get("Alive"):
                continue
            if node.state in ("placing", "starting", "active"):
                self._lost(node, "Ray marked the node dead", at_end=at_end)

    def _node_table(self) -> list[dict[str, Any]] | None:
        """Ray's node table as the job ends, or None when it did not come within
        `NODE_TABLE_WAIT_S` (the call has no timeout of its own; it is left to finish in a
        thread of its own) or failed."""
        if self._table_reader is not None and self._table_reader.is_alive():
            return None  # the last read has not come back: one stuck thread, never more
        box: list[Any] = []

        def read() -> None:
            with contextlib.suppress(Exception):
                box.append(self.ray.nodes())

        reader = threading.Thread(target=read, name="gpuprof-ray-nodes", daemon=True)
        self._table_reader = reader
        reader.start()
        reader.join(NODE_TABLE_WAIT_S)
        return box[0] if box else None

    def _membership(self) -> None:
        # read as it comes, however long that takes on a loaded machine: a node missing from
        # the table is never recorded nor named (the end is bounded on its own)
        for info in self.ray.nodes():
            ray_id = info.get("NodeID")
            if not ray_id:
                continue
            node = self.nodes.get(ray_id)
            alive = bool(info.get("Alive"))
            if node is None:
                if alive:
                    address = str(info.get("NodeManagerAddress") or "?")
                    self.nodes[ray_id] = node = _Node(ray_id, address)
                    if ray_id == self.own_node_id:
                        node.state = "watcher"
                    else:
                        self._place(node)
            elif not alive and node.state in ("placing", "starting", "active"):
                self._lost(node, "Ray marked the node dead")

    def _place(self, node: _Node) -> None:
        node.since = time.monotonic()
        node.asked_ns = now_ns()
        try:
            node.actor = self._actor_class.options(
                scheduling_strategy=self._strategy(node.ray_id),
                num_cpus=0,
                num_gpus=0,
                max_restarts=0,
            ).remote(self.run_id, self.session, self.interval_s, self.host_interval_s, self.nvml,
                     self.stacks)  # fmt: skip
            node.pending = node.actor.hello.remote()
        except Exception as exc:
            self._fail(node, f"no sampler could be started there ({type(exc).__name__}: {exc})")

    def _advance(self, node: _Node) -> None:
        ready, _ = self.ray.wait([node.pending], timeout=0)
        if not ready:
            if node.state == "placing" and time.monotonic() - node.since > self.place_timeout_s:
                self._fail(node, f"its sampler was not placed within {self.place_timeout_s:g} s")
            return
        ref, node.pending = node.pending, None
        try:
            reply = self.ray.get(ref)
        except Exception as exc:
            self._fail(node, f"its sampler did not start ({_short(exc)}; is gpuprof installed "
                             "there?)")  # fmt: skip
            return
        if node.state == "placing":
            self._identify(node, reply)
        else:
            self._open(node, reply)

    def _identify(self, node: _Node, hello: dict[str, Any]) -> None:
        name = str(hello.get("node") or node.address)
        if is_reference(name, str(hello.get("machine")), bool(hello.get("own_name")),
                        self.reference, self.reference_machine):  # fmt: skip
            node.state = "watcher"  # the watcher samples its own node
            with contextlib.suppress(Exception):
                self.ray.kill(node.actor)
            node.actor = None
            return
        taken = {self.reference} | {n.name for n in self.nodes.values() if n.name}
        if name in taken:
            unique = f"{name}-{node.ray_id[:8]}"
            self._say(f"two nodes are called {name}: the one at {node.address} is recorded "
                      f"as {unique} (set GPUPROF_HOST on each node to name them)")  # fmt: skip
            name = unique
        node.name = name
        if name == hello.get("node") and hello.get("start_ns") is not None:
            self._open(node, hello)  # it samples since it started: no second round trip
            return
        node.state = "starting"  # renamed (its rows so far too), or a sampler that waits
        node.pending = node.actor.start.remote(name, self.interval_s, self.host_interval_s,
                                               self.nvml, self.stacks)  # fmt: skip

    def _open(self, node: _Node, info: dict[str, Any]) -> None:
        name = node.name
        versions = info.get("versions") or {}
        node.meta = RunMeta(
            run_id=self.run_id,
            hosts=[name],
            gpus=list(info.get("gpus") or []),
            driver_version=versions.get("driver_version"),
            nvml_version=versions.get("nvml_version"),
            cuda_driver_version=versions.get("cuda_driver_version"),
            start_ns=now_ns(),
            interval_s=self.interval_s,
            gpuprof_version=__version__,
            reference_node=self.reference,
        )

        def stopped(exc: BaseException, label: str = name) -> None:
            self._say(f"recording of node {label} stopped: "
                      f"{_store().failure_reason(exc, node.writer.path)}")  # fmt: skip

        store = _store()
        node.writer = store.BufferedWriter(store.host_file(self.run_dir, name),
                                           flush_interval_s=WRITER_BACKSTOP_S, on_error=stopped,
                                           name=f"gpuprof-{name}")  # fmt: skip
        node.state = "active"
        self._measure_clock(node)
        start_ns = info.get("start_ns")
        if isinstance(start_ns, int) and not isinstance(start_ns, bool):
            node.from_ns = start_ns + node.offset_ns  # on the run's clock
        else:
            node.from_ns = now_ns()
        after = max(0.0, (node.from_ns - node.asked_ns) / 1e9)
        notice = (f"node {name} recorded from {_clock(node.from_ns)} ({after:.1f} s after its "
                  "sampler was asked for)")  # fmt: skip
        self._account(node, "recorded", notice)
        node.writer.flush()

    def _account(
        self,
        node: _Node,
        state: str,
        notice: str,
        why: str | None = None,
        lost_ns: int | None = None,
    ) -> None:
        """Say in the node's file how it was recorded (``RunMeta.nodes``, on the run's
        clock, with its address in Ray's node table, which Ray's metrics name ``ip``) and put
        ``notice``, the line saying it, in the run's notices. A node with no
        file yet (never recorded) gets one holding just that, so the run says so too."""
        if node.writer is None:
            name = node.name or f"ray-{node.address}-{node.ray_id[:8]}"
            node.meta = RunMeta(run_id=self.run_id, start_ns=node.asked_ns or None,
                                gpuprof_version=__version__,
                                reference_node=self.reference)  # fmt: skip
            try:
                store = _store()
                node.writer = store.BufferedWriter(store.host_file(self.run_dir, name),
                                                   flush_interval_s=WRITER_BACKSTOP_S,
                                                   name=f"gpuprof-{name}")  # fmt: skip
            except Exception as exc:
                self._say(f"could not write how node {node.label} was recorded ({_short(exc)})")
                return
        status = {"state": state, "asked_ns": node.asked_ns or None, "from_ns": node.from_ns,
                  "notice": notice, "address": node.address}  # fmt: skip
        if state == "lost":
            status["lost_ns"] = now_ns() if lost_ns is None else lost_ns
        if why:
            status["why"] = why
        old = node.meta.nodes.get(node.label, {}).get("notice")
        node.meta.nodes[node.label] = status
        node.meta.notices = [n for n in node.meta.notices if n != old]
        node.meta.notices.append(notice)
        node.writer.set_meta("run", node.meta.to_dict())

    def _take(self) -> None:
        active = [n for n in self.nodes.values() if n.state == "active"]
        self.period_s = pull_period_s(len(active))
        if not active:
            return
        for node in active:
            if node.pending is None:
                node.pending = node.actor.take.remote()
        refs = [n.pending for n in active]
        ready, _ = self.ray.wait(refs, num_returns=len(refs), timeout=TAKE_WAIT_S)
        ready = set(ready)
        replied = [n for n in active if n.pending in ready]
        try:  # one call for every reply: Ray's cost in the driver is per call
            batches = self.ray.get([n.pending for n in replied])
        except Exception:  # a node's error: each reply is read on its own below
            batches = [None] * len(replied)
        for node, batch in zip(replied, batches):
            ref, node.pending = node.pending, None
            self._receive(node, ref, batch)
            if node.writer is not None:
                node.writer.flush()  # committed now: a crash loses at most this period

    def _receive(
        self, node: _Node, ref: Any, batch: dict[str, Any] | None = None, at_end: bool = False
    ) -> None:
        """Write one reply of a node's sampler (``batch``, else read from ``ref``); a dead
        sampler is a lost node (``at_end``: found while the job ends)."""
        exceptions = self.ray.exceptions
        try:
            if batch is None:
                batch = self.ray.get(ref)
        except getattr(exceptions, "ActorUnavailableError", ()):
            return  # unreachable for a moment: asked again next tick
        except exceptions.RayActorError as exc:
            self._lost(node, f"its sampler died: {_short(exc)}", at_end=at_end)
            return
        except Exception as exc:
            self._say(f"a reply from node {node.label} was lost ({_short(exc)})")
            return
        node.heard_ns = now_ns()
        writer = node.writer
        for table, chunk in (batch.get("chunks") or {}).items():
            # stored as shipped: no work per row here, whatever the number of nodes
            if table in RECORD_TYPES and isinstance(chunk, tuple) and len(chunk) == 2:
                writer.add_chunk(table, int(chunk[0]), chunk[1])
        notices = batch.get("notices") or []
        dropped = int(batch.get("dropped") or 0)
        if dropped > node.dropped:
            node.dropped = dropped
            notices = [*notices, f"{node.name}: {dropped} samples dropped (the driver fell "
                                 "behind taking them)"]  # fmt: skip
        if notices:
            for line in notices:
                if "NVML not available" in line:
                    self._say(line)
            node.meta.notices.extend(n for n in notices if n not in node.meta.notices)
            writer.set_meta("run", node.meta.to_dict())

    def _measure_clock(self, node: _Node) -> None:
        """Round trips to the node's sampler; the tightest one's offset goes into the node's
        file as its ``"clock"`` document."""
        node.next_clock = time.monotonic() + CLOCK_EVERY_S
        readings = []
        try:
            if node.pending is not None:  # the actor answers in order: let it reply first
                self.ray.wait([node.pending], timeout=5.0)
            deadline = None
            tightest = None
            while len(readings) < CLOCK_MAX_ROUNDS:
                t0 = now_ns()
                node_ns = self.ray.get(node.actor.clock.remote(), timeout=5.0)
                t1 = now_ns()
                readings.append((t0, int(node_ns), t1))
                tightest = t1 - t0 if tightest is None else min(tightest, t1 - t0)
                if len(readings) < CLOCK_ROUNDS:
                    continue
                if tightest <= CLOCK_TIGHT_NS:
                    break
                deadline = deadline or time.monotonic() + CLOCK_BUDGET_S
                if time.monotonic() > deadline:
                    break
        except Exception:
            pass  # a node being lost shows in its next take; a slow one is measured next time
        estimate = estimate_offset(readings)
        if estimate is None:
            return
        node.offset_ns = estimate.offset_ns
        node.writer.set_meta("clock", {
            "node": node.name,
            "offset_ns": estimate.offset_ns,
            "error_ns": estimate.error_ns,
            "method": "ray-rtt",
            "reference": self.reference,
        })  # fmt: skip

    # -- faults ------------------------------------------------------------------------------

    def _lost(self, node: _Node, reason: str, at_end: bool = False) -> None:
        """A node whose sampler is gone: its record ends. During the run it is lost when the
        driver finds out; found while the job ends (``at_end``), when it last replied, which
        is when it was last known to be there."""
        was_active = node.state == "active"
        node.state = "lost"
        node.pending = None
        t = now_ns()
        if not was_active:  # lost before its sampler started: never recorded
            self._never(node, f"{reason} before its sampler started")
            return
        if at_end and node.heard_ns is not None:
            t = node.heard_ns
        notice = f"node {node.label} lost at {_clock(t)} ({reason})"
        if node.from_ns is not None:
            notice += f", recorded from {_clock(node.from_ns)}"
        if at_end:
            self._say(f"{notice}: its record ends at its last reply")
        else:
            self._say(f"{notice}: its record ends there; the run goes on")
        attrs = {"reason": reason, "ray_node_id": node.ray_id, "address": node.address}
        # stored on the node's clock, like every row of its file
        event = Event(node.name, 0, None, t - node.offset_ns, "node_lost", node.name, attrs)
        node.writer.add_records("events", [event])
        node.meta.end_ns = t
        self._account(node, "lost", notice, reason, lost_ns=t)
        node.writer.flush()

    def _fail(self, node: _Node, reason: str) -> None:
        node.state = "failed"
        node.pending = None
        self._never(node, reason)
        if node.actor is not None:
            with contextlib.suppress(Exception):
                self.ray.kill(node.actor)

    def _never(self, node: _Node, reason: str) -> None:
        """One line, and the run's notices, for a node of the cluster with no record."""
        notice = f"node {node.label} never recorded: {reason}"
        self._say(notice)
        self._account(node, "never_recorded", notice, reason)
        if node.writer is not None:
            node.writer.flush()

    def _say(self, line: str) -> None:
        self.lines.append(line)
        try:
            print(f"gpuprof: {line}", file=self.stream or sys.stderr, flush=True)
        except Exception:
            pass


def _short(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0][:200]}" if text else type(exc).__name__


def _store() -> Any:
    from gpuprof import store

    return store


def _clock(t_ns: int) -> str:
    """A time of the run as the notices give it: local wall-clock time to the second."""
    return time.strftime("%H:%M:%S", time.localtime(t_ns / 1e9))


def _env_float(name: str, default: float) -> float:
    try:
        value = float(os.environ.get(name) or default)
    except ValueError:
        return default
    return value if value > 0 else default
