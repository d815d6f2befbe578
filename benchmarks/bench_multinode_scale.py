"""Multi-node scale: a Ray job on 64 nodes x 8 GPUs, what each part of the recording costs.

    python benchmarks/bench_multinode_scale.py [--seconds 20] [--nodes 64] [--hours 1]
                                               [--repeats 3] [--spans-per-s 20]
                                               [--analyze-repeats 1] [--compacted]
                                               [--layout auto|rows|chunks]
                                               [--skip ship,receive,ray,analyze]
                                               [--dir /tmp/gpuprof-multinode] [--keep]

Four parts, each through the real code (issue: "the simulated cost of 64 nodes x 8 GPUs"):

1. **ship** — what one node sends. A real `NodeSampler` in its own process (as the actor
   is), sampling 8 simulated GPUs through the real ``nvidia-ml-py`` bindings (tests/simnvml)
   and the host with its process tree, at 10 Hz (host every 0.5 s), while 8 worker processes
   (the node's Ray workers, one per GPU) record ``--spans-per-s`` spans each through the
   real hooks into the node's spool files, which the sampler tails (`SpoolTail`): a step a
   second of 4 phases, collectives as the torch.distributed wrapper records them (op, bytes,
   group size) and the step. Every `TICK_S` (the recorder's tick) the batch `take()` returns is
   serialised as Ray ships an actor's return value, with pickle protocol 5
   (``len(pickle.dumps(batch, protocol=5))``; part 3 compares it with Ray's own serializer):
   bytes per pull and per second, per table, and the sampler process's CPU (sampling,
   tailing and pickling).
2. **receive** — the head's receiver. The real `ClusterRecorder` thread (membership,
   placing, ``take`` every pull period, every reply read in one ``ray.get`` and committed
   at once, a clock measurement of 8 round trips per tick when due) over a fake Ray of
   ``--nodes`` sampler nodes whose ``take`` replies are the pulls recorded in part 1 (joined
   to the period), pickled per node (host renamed, times shifted) before the clock starts;
   the fake's ``ray.get`` unpickles them, as Ray's driver deserialises a reply. Figure: CPU
   time of the whole process per wall second, split into the recorder thread (of which
   unpickling) and the writers' threads (per-thread CPU clocks). Variants, interleaved: the
   recorder's period for ``--nodes`` (`pull_period_s`: 2 s at 64) with the workers' spans
   and without them (the sampler's rows alone), and with spans at `TICK_S` (1 s) beside
   them. What a fake cannot show is Ray's own work in the driver per call (submitting, the
   reply through gRPC): that is part 3.
3. **ray** — Ray's own cost in the driver, measured with a real local Ray: 4 actors
   answer the recorder's pattern of calls for ``--nodes`` nodes (per tick, one ``take``
   per node, the replies read in one ``ray.get``, and 8 clock round trips) with the
   batches of part 1, and the driver process's CPU is read over the window (all its
   threads, Ray's C++ ones included), less an idle window. Two pull periods, interleaved:
   `TICK_S` and the recorder's for ``--nodes`` (2 s where that is `TICK_S`). This includes
   deserialising the replies; the receiver's total is part 2 less its unpickling plus this
   at the same period.
4. **analyze** — the run such a job leaves, ``--nodes`` nodes x 8 GPUs for ``--hours``
   at 10 Hz: the watcher's node file compacted to Parquet as `watch` leaves it, every other
   node's file as the recorder writes it (its rows as one Arrow chunk per pull and table
   where this tree's recorder stores chunks, else SQLite rows: ``--layout``; its own run
   document naming the reference node, a ``"clock"`` document with the node's offset, its
   rows on its own clock): what ``analyze`` reads while the run goes on or after its driver
   was killed. ``--compacted`` then compacts them as `watch` does when the job ends
   (several files at once, `api.compact`) and measures again. Made from
   simulated GRPO on 8 nodes x 8 GPUs (`gpuprof.sim`, the job and pathologies of
   bench_analyze_scale.py) copied node by node (host, GPU uuid and rank renumbered, times
   moved to each node's clock). Then ``gpuprof analyze RUN --json`` and
   ``gpuprof report RUN`` as fresh processes (``cli.main`` as ``python -m gpuprof`` runs
   it, with the time spent loading, diagnosing, in the per-node summary and drawing
   recorded), interleaved, ``--analyze-repeats`` times: wall time, CPU, peak RSS
   (the process's ``VmHWM``, or its processes' total RSS polled every 0.1 s), the report's
   size, the diagnosis's ``nodes`` section.

Budgets: <= 100 KB/s shipped per node at 10 Hz; <= 5% of one core for the head's receiver;
analysis and report within the existing ones (docs/PERFORMANCE.md: 24 h x 64 GPUs, ~55 M GPU
samples, analysed in <= 60 s within 4 GB; a report <= 10 MB).
"""

from __future__ import annotations

import argparse
import contextlib
import io
import itertools
import json
import os
import pickle
import shutil
import socket
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import textwrap
import threading
import time
import types
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT / "benchmarks"))

from gpuprof.clocks import TIME_COLUMNS  # noqa: E402
from gpuprof.integrations.ray_cluster import recorder as recorder_mod  # noqa: E402
from gpuprof.integrations.ray_cluster.recorder import TICK_S, pull_period_s  # noqa: E402
from gpuprof.model import RECORD_TYPES, columns  # noqa: E402

GPUS_PER_NODE = 8
RUN_ID, SESSION = "bench", "s1"

# -- part 1: one node's sampler ---------------------------------------------------------------

WORKER = textwrap.dedent(
    """
    import sys, time
    import gpuprof
    from gpuprof import hooks

    rate, seconds = float(sys.argv[1]), float(sys.argv[2])
    # one step a second: 4 phases, collectives (as the torch.distributed wrapper records
    # them) for the rest of the rate, and the step itself
    per_step = max(0, int(round(rate)) - 5)
    end = time.monotonic() + seconds
    step = 0
    while time.monotonic() < end:
        t0 = time.monotonic()
        with gpuprof.phase("rollout", tokens=4096 + step):
            time.sleep(0.2)
        with gpuprof.phase("reward", items=64):
            time.sleep(0.05)
        with gpuprof.phase("old_logprob"):
            time.sleep(0.05)
        with gpuprof.phase("update_actor", micro_batches=8):
            for i in range(per_step):
                op = "all_gather_into_tensor" if i % 2 == 0 else "reduce_scatter_tensor"
                with hooks.framework_phase(op, "collective", op=op, bytes=134217728,
                                           group_size=512):
                    time.sleep(0.3 / max(1, per_step))
        gpuprof.step(tokens=262144)
        step += 1
        time.sleep(max(0.0, 1.0 - (time.monotonic() - t0)))
    gpuprof.shutdown()
    """
)


def node_child(out: Path, seconds: float, workers: int, spans_per_s: float) -> None:
    """The sampler actor's process (``--node-child``): NodeSampler on 8 simulated GPUs, its
    worker processes spooling spans, a pull every TICK_S pickled as Ray would ship it."""
    from simnvml import SCENARIO_ENV, write_scenario

    from gpuprof import nodes
    from gpuprof.integrations.ray_cluster import setup_hook
    from gpuprof.integrations.ray_cluster.sampler import NodeSampler

    name = nodes.node_name()
    spool = setup_hook.spool_dir(RUN_ID, SESSION, name)
    spool.mkdir(parents=True, exist_ok=True)
    env = dict(os.environ, GPUPROF_RUN_DIR=str(spool), GPUPROF_HOST=name, PYTHONPATH=str(ROOT))
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", WORKER, str(spans_per_s), str(seconds + 15)], env=env
        )
        for _ in range(workers)
    ]
    scenario = {
        "gpus": [
            {
                "gpm": True,
                "nvlink_links": 18,
                "series": {
                    "util_gpu_pct": [(0, 30), (5, 90), (10, 20), (15, 95)],
                    "pcie_tx_kb_s": 1e5,
                    "power_mw": [(0, 350_000), (7, 600_000)],
                },
                "processes": [
                    {"pid": procs[i % workers].pid, "used_mem_bytes": 2**36, "sm_util_pct": 50}
                ],
            }
            for i in range(GPUS_PER_NODE)
        ]
    }
    os.environ[SCENARIO_ENV] = str(write_scenario(out.with_suffix(".scenario"), scenario))
    sampler = NodeSampler(RUN_ID, SESSION)
    info = sampler.start(name, 0.1, None, True)
    time.sleep(4.0)  # imports of the workers, NVML, first tree walk
    sampler.take()
    pulls = []
    cpu0, t0 = time.process_time(), time.monotonic()
    due = t0
    while True:
        due += TICK_S
        time.sleep(max(0.0, due - time.monotonic()))
        now = time.monotonic()
        if now - t0 > seconds + 1e-3:
            break
        c0 = time.thread_time()
        batch = sampler.take()
        blob = pickle.dumps(batch, protocol=5)
        pulls.append({"t": now - t0, "blob": blob, "cpu_s": time.thread_time() - c0})
    cpu1, t1 = time.process_time(), time.monotonic()
    for p in procs:
        p.kill()
    for p in procs:
        p.wait()
    sampler.finish()
    # the rows of the pulls cover from t0 to the last pull
    doc = {
        "info": info,
        "pulls": pulls,
        "cpu_pct": 100.0 * (cpu1 - cpu0) / (t1 - t0),
        "window_s": pulls[-1]["t"],
        "node": name,
    }
    out.write_bytes(pickle.dumps(doc, protocol=5))


def ship(args: argparse.Namespace, work: Path) -> dict[str, Any]:
    from simnvml import build_library, simnvml_env

    lib = build_library(work / "simnvml")
    out = work / "ship.pickle"
    env = simnvml_env(lib, work / "unused-scenario")
    env.update(PYTHONPATH=str(ROOT), GPUPROF_HOST="node1", GPUPROF_SPOOL_DIR=str(work / "spool"))
    for name in ("GPUPROF_RUN_DIR", "GPUPROF_DB", "RAY_ADDRESS"):
        env.pop(name, None)
    cmd = [
        sys.executable,
        __file__,
        "--node-child",
        str(out),
        "--seconds",
        str(args.seconds),
        "--spans-per-s",
        str(args.spans_per_s),
    ]
    load0 = os.getloadavg()
    subprocess.run(cmd, env=env, check=True)
    doc = pickle.loads(out.read_bytes())
    doc["load"] = (load0[0], os.getloadavg()[0])
    return doc


def ship_figures(doc: dict[str, Any]) -> dict[str, Any]:
    pulls = doc["pulls"]
    sizes = [len(p["blob"]) for p in pulls]
    k = max(1, round(1 / TICK_S))  # pulls per second, or one pull of a second or more
    per_s = [sum(sizes[i : i + k]) / (k * TICK_S) for i in range(0, len(sizes) - k + 1, k)]
    tables: dict[str, list[int]] = {}
    rows: dict[str, int] = {}
    for p in pulls:
        for table, (n, size) in table_parts(pickle.loads(p["blob"])).items():
            tables.setdefault(table, []).append(size)
            rows[table] = rows.get(table, 0) + n
    window = doc["window_s"]
    return {
        "pulls": len(pulls),
        "pull_bytes_median": statistics.median(sizes),
        "pull_bytes_max": max(sizes),
        "per_s_median": statistics.median(per_s),
        "per_s_max": max(per_s),
        "mean_per_s": sum(sizes) / window,
        "table_bytes_per_s": {t: sum(v) / window for t, v in sorted(tables.items())},
        "table_rows_per_s": {t: n / window for t, n in sorted(rows.items())},
        "take_cpu_ms_median": 1e3 * statistics.median(p["cpu_s"] for p in pulls),
        "sampler_cpu_pct": doc["cpu_pct"],
    }


def print_ship(fig: dict[str, Any], doc: dict[str, Any], args: argparse.Namespace) -> None:
    print(
        f"\n1. ship: one node, 8 simulated GPUs at 10 Hz, host every 0.5 s, "
        f"{len(doc['info'].get('gpus', []))} GPUs in its inventory, {args.spans_per_s:g} "
        f"spans/s x 8 workers, {fig['pulls']} pulls in {doc['window_s']:.1f} s "
        f"(load average {doc['load'][0]:.2f} -> {doc['load'][1]:.2f})"
    )
    print(
        f"   bytes/s shipped (pickle protocol 5): median {fig['per_s_median'] / 1e3:.1f} KB/s, "
        f"max {fig['per_s_max'] / 1e3:.1f} KB/s, mean {fig['mean_per_s'] / 1e3:.1f} KB/s "
        f"(budget 100 KB/s)"
    )
    print(
        f"   per pull ({TICK_S:g} s): median {fig['pull_bytes_median'] / 1e3:.1f} KB, "
        f"max {fig['pull_bytes_max'] / 1e3:.1f} KB"
    )
    print(f"   {'table':10s} {'rows/s':>8s} {'KB/s':>7s} {'B/row':>6s}")
    for table, b in fig["table_bytes_per_s"].items():
        n = fig["table_rows_per_s"][table]
        print(f"   {table:10s} {n:8.1f} {b / 1e3:7.2f} {b / n if n else 0:6.0f}")
    print(
        f"   sampler process CPU {fig['sampler_cpu_pct']:.2f}% of a core; take()+pickle "
        f"{fig['take_cpu_ms_median']:.2f} ms per pull (median)"
    )


# -- part 2: the head's receiver over a fake Ray -----------------------------------------------


# A pull is ``{"rows": {table: [tuple, ...]}, ...}`` (rows in column order) or, where the
# sampler encodes them, ``{"chunks": {table: (rows, Arrow IPC stream)}, ...}``; both are
# handled below, whichever the sampler under test returns.


def _payload(batch: dict[str, Any]) -> tuple[str, dict[str, Any]]:
    key = "chunks" if "chunks" in batch else "rows"
    return key, batch.get(key) or {}


def table_parts(batch: dict[str, Any]) -> dict[str, tuple[int, int]]:
    """Table -> (rows, bytes it takes in the pickled reply) of a pulled batch."""
    key, payload = _payload(batch)
    if key == "chunks":
        return {t: (int(n), len(blob)) for t, (n, blob) in payload.items()}
    return {t: (len(r), len(pickle.dumps(r, protocol=5))) for t, r in payload.items()}


def _arrow(blob: bytes, table: str) -> Any:
    from gpuprof import columnar

    return columnar.decode_chunks(table, [blob])


def _ipc(data: Any) -> bytes:
    """An Arrow table as a row chunk, framed and compressed as the sampler's chunks are."""
    from gpuprof import columnar

    return columnar.encode_arrow(data)


def _retime_arrow(data: Any, table: str, host: str, shift_ns: int) -> Any:
    import pyarrow as pa
    import pyarrow.compute as pc

    names = data.schema.names
    out = data.set_column(
        names.index("host"), "host", pa.array([host] * len(data), data.schema.field("host").type)
    )
    for col in TIME_COLUMNS.get(table, ()):
        if col in names and shift_ns:
            i = names.index(col)
            out = out.set_column(i, col, pc.add(out.column(i), shift_ns))
    return out


def _retime(batch: dict[str, Any], host: str, shift_ns: int) -> dict[str, Any]:
    """A copy of a pulled batch as another node would send it: host renamed (one string
    object, as a sampler's rows share theirs), times moved by ``shift_ns``."""
    key, payload = _payload(batch)
    out: dict[str, Any] = {}
    for table, rows in payload.items():
        if key == "chunks":
            n, blob = rows
            out[table] = (n, _ipc(_retime_arrow(_arrow(blob, table), table, host, shift_ns)))
            continue
        cols = columns(RECORD_TYPES[table])
        idx = [cols.index(c) for c in TIME_COLUMNS.get(table, ()) if c in cols]
        new = []
        for row in rows:
            values = list(row)
            values[0] = host
            for i in idx:
                if values[i] is not None:
                    values[i] += shift_ns
            new.append(tuple(values))
        out[table] = new
    return {key: out, "notices": list(batch.get("notices") or []), "dropped": 0}


class _Ref:
    __slots__ = ("blob", "value")

    def __init__(self, value: Any = None, blob: bytes | None = None) -> None:
        self.value, self.blob = value, blob


class _ReplayActor:
    """A node's sampler as the recorder sees it through Ray: hello, start (the inventory of
    part 1 renamed), clock, and take answering the node's pre-pickled pulls in turn."""

    def __init__(self, fake: _ReplayRay, node_id: str) -> None:
        self.fake, self.index = fake, fake.index[node_id]
        self.name = f"node{self.index}"
        self.blobs = fake.blobs[self.index]
        self.next = 0

    def __getattr__(self, method: str) -> Any:
        from gpuprof.nodes import now_ns

        def remote(*args: Any) -> _Ref:
            if method == "hello":
                return _Ref(
                    {
                        "node": self.name,
                        "machine": f"m{self.index}",
                        "own_name": True,
                        "pid": 1000 + self.index,
                    }
                )
            if method == "start":
                info = dict(self.fake.info)
                info["gpus"] = [dict(g, host=self.name) for g in info.get("gpus", [])]
                return _Ref(info)
            if method == "clock":
                return _Ref(now_ns())
            if method == "take":
                blob, rows = self.blobs[min(self.next, len(self.blobs) - 1)]
                self.next += 1
                self.fake.takes += 1
                self.fake.rows += rows
                return _Ref(blob=blob)
            if method == "finish":
                return _Ref({"rows": {}, "notices": [], "dropped": 0})
            raise AttributeError(method)

        return types.SimpleNamespace(remote=remote)


class _ReplayRay:
    """What `ClusterRecorder` calls of Ray, for ``nodes`` sampler nodes and the head."""

    __version__ = "2.60.0"

    def __init__(
        self, nodes: int, blobs: dict[int, list[tuple[bytes, int]]], info: dict[str, Any]
    ) -> None:
        self.exceptions = types.SimpleNamespace(
            RayActorError=RuntimeError, ActorUnavailableError=KeyError
        )
        self.head = "f" * 56
        self.ids = {self.head: 0} | {f"{i:056x}": i for i in range(1, nodes + 1)}
        self.index = dict(self.ids)
        self.blobs, self.info = blobs, info
        self.decode_s = 0.0
        self.takes = 0
        self.rows = 0

    def nodes(self) -> list[dict[str, Any]]:
        return [
            {"NodeID": i, "Alive": True, "NodeManagerAddress": f"10.0.{n // 250}.{n % 250}"}
            for i, n in self.ids.items()
        ]

    def remote(self, cls: type) -> Any:
        fake = self

        class Handle:
            def options(self, scheduling_strategy: Any, **_: Any) -> Any:
                node_id = scheduling_strategy.node_id
                return types.SimpleNamespace(remote=lambda *a: _ReplayActor(fake, node_id))

        return Handle()

    def wait(self, refs: list, num_returns: int = 1, timeout: float | None = None) -> tuple:
        return list(refs), []

    def get(self, ref: _Ref, timeout: float | None = None) -> Any:
        if ref.blob is None:
            return ref.value
        c0 = time.thread_time()
        value = pickle.loads(ref.blob)  # what Ray's driver does with a reply's bytes
        self.decode_s += time.thread_time() - c0
        return value

    def kill(self, actor: Any) -> None:
        pass

    def is_initialized(self) -> bool:
        return True


SPAN_TABLES = ("spans", "events")
"""What the workers' hooks write (the rest is the sampler's)."""


def without_spans(batch: dict[str, Any]) -> dict[str, Any]:
    """A pulled batch without the workers' spans and events: the sampler's rows alone."""
    key, payload = _payload(batch)
    return dict(batch, **{key: {t: r for t, r in payload.items() if t not in SPAN_TABLES}})


def merged(batches: list[dict[str, Any]], k: int) -> list[dict[str, Any]]:
    """Every ``k`` consecutive pulls as one (what a pull every ``k`` x TICK_S would carry)."""
    import pyarrow as pa

    out = []
    for i in range(0, len(batches) - k + 1, k):
        parts: dict[str, list] = {}
        key = "rows"
        for b in batches[i : i + k]:
            key, payload = _payload(b)
            for table, rows in payload.items():
                parts.setdefault(table, []).append(rows)
        if key == "chunks":
            joined = {
                t: (sum(n for n, _ in v), _ipc(pa.concat_tables([_arrow(b, t) for _, b in v])))
                for t, v in parts.items()
            }
        else:
            joined = {t: [r for rows in v for r in rows] for t, v in parts.items()}
        out.append({key: joined, "notices": [], "dropped": 0})
    return out


def replay_blobs(
    batches: list[dict[str, Any]], nodes: int, pulls: int, period_s: float = TICK_S
) -> dict[int, list[tuple[bytes, int]]]:
    """Per node 1..nodes, ``pulls`` pickled replies and the rows in each: ``batches`` (one
    pull every ``period_s``) in turn, renamed to the node, moved by the recorded window at
    each pass (so times keep increasing)."""
    period_ns = int(len(batches) * period_s * 1e9)
    out = {}
    for n in range(1, nodes + 1):
        host = f"node{n}"
        out[n] = []
        for j in range(pulls):
            batch = _retime(batches[j % len(batches)], host, (j // len(batches)) * period_ns)
            rows = sum(n for n, _ in table_parts(batch).values())
            out[n].append((pickle.dumps(batch, protocol=5), rows))
    return out


def _thread_cpu(threads: list[threading.Thread]) -> float:
    """CPU seconds of these threads of this process (their per-thread CPU clocks)."""
    total = 0.0
    for thread in threads:
        with contextlib.suppress(OSError, TypeError):  # a thread that has ended
            total += time.clock_gettime(time.pthread_getcpuclockid(thread.ident))
    return total


def _cpu(rec: list[threading.Thread], writers: list[threading.Thread]) -> tuple[float, ...]:
    return (time.process_time(), _thread_cpu(rec), _thread_cpu(writers), time.monotonic())


def receive_once(
    info: dict[str, Any],
    blobs: dict[int, list[tuple[bytes, int]]],
    args: argparse.Namespace,
    run_dir: Path,
    period_s: float,
) -> dict[str, Any]:
    from gpuprof.integrations.ray_cluster.recorder import ClusterRecorder

    shutil.rmtree(run_dir, ignore_errors=True)
    run_dir.mkdir(parents=True)
    fake = _ReplayRay(args.nodes, blobs, info)
    lines = io.StringIO()
    rec = ClusterRecorder(
        fake,
        run_dir,
        RUN_ID,
        SESSION,
        "node0",
        socket.gethostname(),
        interval_s=0.1,
        stream=lines,
        own_node_id=fake.head,
    )
    chosen = recorder_mod.pull_period_s
    recorder_mod.pull_period_s = lambda nodes: period_s  # the variant's period
    try:
        assert rec.start(), lines.getvalue()
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            states = [n.state for n in rec.nodes.values() if n.ray_id != fake.head]
            if len(states) == args.nodes and all(s == "active" for s in states):
                break
            time.sleep(0.1)
        else:
            raise SystemExit(f"nodes not active: {lines.getvalue()}")
        time.sleep(2.0 * period_s)  # every writer has committed once
        writers = [n.writer for n in rec.nodes.values() if n.writer is not None]
        writer_threads = [w._thread for w in writers]
        rec_thread = [rec._thread]
        load0 = os.getloadavg()[0]
        rows0, takes0, dec0 = fake.rows, fake.takes, fake.decode_s
        c0, r0, w0, t0 = _cpu(rec_thread, writer_threads)
        time.sleep(args.seconds)
        c1, r1, w1, t1 = _cpu(rec_thread, writer_threads)
        rows1, takes, decode = fake.rows, fake.takes - takes0, fake.decode_s - dec0
        rec.finish()
    finally:
        recorder_mod.pull_period_s = chosen
    wall = t1 - t0
    said = [line for line in lines.getvalue().splitlines() if line.strip()]
    return {
        "cpu_pct": 100.0 * (c1 - c0) / wall,
        "recorder_pct": 100.0 * (r1 - r0) / wall,
        "writers_pct": 100.0 * (w1 - w0) / wall,
        "decode_pct": 100.0 * decode / wall,
        "takes_per_s": takes / wall,
        "rows_per_s": (rows1 - rows0) / wall,
        "load": (load0, os.getloadavg()[0]),
        "lines": said,
    }


def receive_variants(nodes: int) -> list[tuple[str, bool, float]]:
    """(label, with the workers' spans, pull period): the recorder's period for ``nodes``
    with and without spans, and, where it is longer, `TICK_S` with spans beside it."""
    period = pull_period_s(nodes)
    out = [(f"sampler + spans, {period:g} s", True, period),
           (f"sampler only, {period:g} s", False, period)]  # fmt: skip
    if period != TICK_S:
        out.append((f"sampler + spans, {TICK_S:g} s", True, TICK_S))
    return out


def receive(doc: dict[str, Any], args: argparse.Namespace, work: Path) -> dict[str, list]:
    t = time.perf_counter()
    batches = [pickle.loads(p["blob"]) for p in doc["pulls"]]
    variants = receive_variants(args.nodes)
    blobs = {}
    for label, spans, period in variants:
        k = max(1, round(period / TICK_S))
        pulls = merged(batches if spans else [without_spans(b) for b in batches], k)
        blobs[label] = replay_blobs(pulls, args.nodes, int((args.seconds + 20) / period) + 4,
                                    period)  # fmt: skip
    mb = {v: sum(len(b) for bs in blobs[v].values() for b, _ in bs) / 1e6 for v in blobs}
    print(
        f"\n2. receive: the recorder over a fake Ray of {args.nodes} nodes (pull period "
        f"{pull_period_s(args.nodes):g} s at that size), {args.seconds:g} s windows, variants "
        f"interleaved; replies prepared in {time.perf_counter() - t:.1f} s ("
        + ", ".join(f"{v}: {m:.0f} MB" for v, m in mb.items())
        + ")",
        flush=True,
    )
    out: dict[str, list] = {label: [] for label, _, _ in variants}
    for i in range(args.repeats):
        for label, _, period in variants:
            r = receive_once(doc["info"], blobs[label], args, work / "receive-run", period)
            r["period"] = period
            out[label].append(r)
            print(
                f"   {label:22s} run {i + 1}: process {r['cpu_pct']:5.2f}% of a core "
                f"(recorder thread {r['recorder_pct']:.2f}%, of which unpickling "
                f"{r['decode_pct']:.2f}%; writers {r['writers_pct']:.2f}%), "
                f"{r['takes_per_s']:.1f} takes/s, {r['rows_per_s']:,.0f} rows/s received, "
                f"load {r['load'][0]:.2f}->{r['load'][1]:.2f}",
                flush=True,
            )
            if r["lines"]:
                print("   recorder said: " + " | ".join(r["lines"][:3]))
    for label, rs in out.items():
        med = {
            k: statistics.median(r[k] for r in rs)
            for k in ("cpu_pct", "recorder_pct", "decode_pct", "writers_pct", "rows_per_s")
        }
        print(
            f"   {label:22s} median: {med['cpu_pct']:.2f}% (recorder "
            f"{med['recorder_pct']:.2f}%, unpickling {med['decode_pct']:.2f}%, writers "
            f"{med['writers_pct']:.2f}%), {med['rows_per_s']:,.0f} rows/s"
        )
    return out


# -- part 3: Ray's own cost per call in the driver ---------------------------------------------


def pull_periods(nodes: int) -> tuple[float, ...]:
    """Seconds between two takes from a node, measured side by side: `TICK_S` and the
    recorder's period for ``nodes`` (2 s when that is `TICK_S`)."""
    period = pull_period_s(nodes)
    return (TICK_S, period if period != TICK_S else 2.0)


def ray_child(blobs_path: Path, out: Path, nodes: int, seconds: float, repeats: int) -> None:
    """``--ray-child``: a local Ray, 4 actors answering the recorder's calls for ``nodes``
    nodes (per tick: one take per node, then one clock measurement of 8 round trips); the
    driver's CPU over windows idle and at each pull period, interleaved."""
    import ray

    from gpuprof.integrations.ray_cluster.recorder import CLOCK_ROUNDS

    batches = [pickle.loads(b) for b in pickle.loads(blobs_path.read_bytes())]
    ray.init(
        address="local",
        num_cpus=2,
        include_dashboard=False,
        log_to_driver=False,
        configure_logging=False,
    )

    @ray.remote(num_cpus=0)
    class Replay:
        def __init__(self, by_period: dict[float, list[dict]]) -> None:
            self.by_period = by_period
            self.next = 0

        def take(self, period: float) -> dict:
            batches = self.by_period[period]
            self.next += 1
            return batches[self.next % len(batches)]

        def clock(self) -> int:
            return time.time_ns()

    periods = pull_periods(nodes)
    by_period = {p: merged(batches, round(p / TICK_S)) for p in periods}
    actors = 4
    handles = [Replay.remote(by_period) for _ in range(actors)]
    ray.get([h.clock.remote() for h in handles])
    ctx = ray._private.worker.global_worker.get_serialization_context()
    sizes = []
    for batch in batches:
        with contextlib.suppress(Exception):
            sizes.append(
                (len(pickle.dumps(batch, protocol=5)), int(ctx.serialize(batch).total_bytes))
            )

    def tick(k: int, period: float) -> int:
        refs = [handles[i % actors].take.remote(period) for i in range(nodes)]
        ready, _ = ray.wait(refs, num_returns=len(refs), timeout=5.0)
        ray.get(ready)  # one call for every reply, as the recorder reads them
        h = handles[k % actors]
        for _ in range(CLOCK_ROUNDS):
            ray.get(h.clock.remote(), timeout=5.0)
        return len(ready)

    def window(period: float | None) -> dict[str, Any]:
        load0 = os.getloadavg()[0]
        c0, t0 = time.process_time(), time.monotonic()
        k, got, late, due = 0, 0, 0, t0
        while time.monotonic() - t0 < seconds:
            if period is None:
                time.sleep(0.5)
                continue
            got += tick(k, period)
            k += 1
            due += period
            wait = due - time.monotonic()
            late += wait < 0
            time.sleep(max(0.0, wait))
        wall = time.monotonic() - t0
        return {
            "period": period,
            "cpu_pct": 100 * (time.process_time() - c0) / wall,
            "ticks": k,
            "takes": got,
            "late": late,
            "wall_s": wall,
            "load": (load0, os.getloadavg()[0]),
        }

    for k in range(6):  # warm up: workers, connections
        tick(k, periods[0])
        time.sleep(TICK_S)
    results = [window(None)]
    for _ in range(repeats):
        results += [window(p) for p in periods]
    ray.shutdown()
    out.write_text(json.dumps({"windows": results, "sizes": sizes}))


def ray_part(doc: dict[str, Any], args: argparse.Namespace, work: Path) -> dict[str, Any]:
    blobs_path = work / "ray-blobs.pickle"
    blobs_path.write_bytes(pickle.dumps([p["blob"] for p in doc["pulls"]], protocol=5))
    out = work / "ray.json"
    print(
        f"\n3. ray: the driver's CPU for {args.nodes} nodes' calls (a take per node per pull, "
        "8 clock round trips per tick), real local Ray, 4 actors, idle window first, "
        "pull periods interleaved",
        flush=True,
    )
    env = dict(os.environ, PYTHONPATH=str(ROOT), RAY_USAGE_STATS_ENABLED="0")
    env.pop("RAY_ADDRESS", None)
    cmd = [
        sys.executable,
        __file__,
        "--ray-child",
        str(blobs_path),
        str(out),
        "--nodes",
        str(args.nodes),
        "--seconds",
        str(args.seconds),
        "--repeats",
        str(args.repeats),
    ]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True)
    if proc.returncode != 0:
        print(f"   Ray part failed: {proc.stderr[-1500:]}")
        return {}
    doc3 = json.loads(out.read_text())
    idle = doc3["windows"][0]
    print(f"   idle: driver {idle['cpu_pct']:.2f}% of a core (load {idle['load'][0]:.2f})")
    per_period: dict[float, list[float]] = {}
    for w in doc3["windows"][1:]:
        calls = w["takes"] + w["ticks"] * 8
        ray_pct = w["cpu_pct"] - idle["cpu_pct"]
        per_call = ray_pct / 100 * w["wall_s"] / max(1, calls) * 1e6
        per_period.setdefault(w["period"], []).append(ray_pct)
        print(
            f"   pull every {w['period']:g} s: driver {w['cpu_pct']:.2f}% -> Ray's calls "
            f"{ray_pct:.2f}%; {w['ticks']} ticks ({w['late']} late), {w['takes']} takes, "
            f"{per_call:.0f} us CPU per call; load {w['load'][0]:.2f}->{w['load'][1]:.2f}",
            flush=True,
        )
    med = {p: statistics.median(v) for p, v in per_period.items()}
    print("   median: " + ", ".join(f"pull every {p:g} s {v:.2f}%" for p, v in med.items()))
    if doc3["sizes"]:
        pk = sum(a for a, _ in doc3["sizes"])
        ray_b = sum(b for _, b in doc3["sizes"])
        print(
            f"   Ray's serializer vs pickle protocol 5 on the same {len(doc3['sizes'])} "
            f"pulls: {ray_b:,} vs {pk:,} bytes ({ray_b / pk:.4f}x)"
        )
    return med


# -- part 4: the run directory, analyze and report ---------------------------------------------


def _step_s(pathologies: list) -> float:
    from gpuprof.sim import SimConfig, simulate

    run = simulate(SimConfig(gpus=8, steps=4, seed=1, pathologies=pathologies)).run
    return (int(run.gpu["t_ns"].max()) - int(run.gpu["t_ns"].min())) / 1e9 / 4


def base_run(hours: float) -> Any:
    """Simulated GRPO on 8 nodes x 8 GPUs covering about ``hours`` (bench_analyze_scale's
    job and pathologies)."""
    from bench_analyze_scale import PATHOLOGIES

    from gpuprof.sim import SimConfig, simulate

    steps = max(2, round(hours * 3600 / _step_s(PATHOLOGIES)))
    config = SimConfig(gpus=64, steps=steps, seed=1, pathologies=PATHOLOGIES)
    return simulate(config).run


def _offset_ns(n: int) -> int:
    """Node n's clock lead over the reference (ns): a few ms either way, as NTP leaves it."""
    return 0 if n == 0 else ((n * 7919) % 9001 - 4500) * 1_000


def chunked_store() -> bool:
    """Whether this tree's recorder stores what nodes ship as Arrow chunks (else rows)."""
    from gpuprof import store

    return hasattr(store.BufferedWriter, "add_chunk")


ARRIVAL = {"spans": "end_ns"}
"""The column that says when a row reaches a pull (a span is tailed once it has ended)."""


def _to_chunks(src: Path, dest: Path, tick_s: float) -> int:
    """Write ``src``'s rows into a new file ``dest`` as the recorder stores a node's pulls:
    per pull of ``tick_s`` and table, one Arrow IPC chunk; returns the chunks written."""
    from gpuprof import columnar, store

    rconn = sqlite3.connect(src)
    conn = store.connect(dest)
    written = 0
    try:
        for key, value in rconn.execute("SELECT key, value FROM meta").fetchall():
            store.write_meta(conn, key, json.loads(value))
        period = int(tick_s * 1e9)
        for table in RECORD_TYPES:
            frame = store.read_table(rconn, table)
            if not len(frame):
                continue
            arrival = ARRIVAL.get(table, "t_ns")
            frame = frame.sort_values(arrival, kind="stable", ignore_index=True)
            data = columnar.to_arrow(table, frame)
            pull = (frame[arrival].to_numpy("int64") // period).astype("int64")
            bounds = [0, *(int(i) + 1 for i in (pull[1:] != pull[:-1]).nonzero()[0]), len(pull)]
            chunks = [
                (table, b - a, _ipc(data.slice(a, b - a))) for a, b in itertools.pairwise(bounds)
            ]
            for i in range(0, len(chunks), 5000):
                store.insert_encoded(conn, {}, chunks[i : i + 5000])
            written += len(chunks)
        conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    finally:
        conn.close()
        rconn.close()
    return written


def _make_node(job: tuple) -> int:
    """One node's file of the run (see `write_node_run`); returns the chunks written."""
    from gpuprof import __version__, store
    from gpuprof.model import RunMeta

    n, name, copy, src, run_dir, work, ranks, gpus, base_meta, start, end, chunks, pull_s = job
    tmp = Path(work) / f"tmp-{name}.sqlite"
    shutil.copyfile(src, tmp)
    off = _offset_ns(n)  # rows on the node's own clock: the reference's minus its lead
    conn = sqlite3.connect(tmp, isolation_level=None)
    try:
        conn.execute("BEGIN")
        for table in RECORD_TYPES:
            sets = ["host = ?"]
            params: list[Any] = [name]
            for col in TIME_COLUMNS.get(table, ()):
                sets.append(f"{col} = {col} - ?")
                params.append(-off)
            if table == "gpu" and copy:
                sets.append("uuid = uuid || ?")
                params.append(f"-{copy}")
            if table in ("spans", "events") and copy:
                sets.append("rank = rank + ?")
                params.append(copy * ranks)
            conn.execute(f"UPDATE {table} SET {', '.join(sets)}", params)
        if n:  # the recorder relabels the node's root process; only the watcher has logs
            conn.execute("UPDATE procs SET role = 'other' WHERE role = 'main'")
            conn.execute("DELETE FROM logs")
        if n == 0:  # the watcher's document: the command, its node
            meta = RunMeta.from_dict(base_meta)
            meta.hosts, meta.gpus = [name], gpus
        else:  # the recorder's per-node document, and the clock it measured
            meta = RunMeta(
                run_id=RUN_ID,
                hosts=[name],
                gpus=gpus,
                start_ns=start,
                end_ns=end,
                interval_s=0.1,
                gpuprof_version=__version__,
                reference_node="node0",
            )
            clock = {
                "node": name,
                "offset_ns": off,
                "error_ns": 150_000,
                "method": "ray-rtt",
                "reference": "node0",
            }
            store.write_meta(conn, "clock", clock)
        store.write_meta(conn, "run", meta.to_dict())
        conn.execute("COMMIT")
    finally:
        conn.close()
    dest = store.host_file(run_dir, name)
    if n and chunks:
        written = _to_chunks(tmp, dest, pull_s)
        tmp.unlink()
        return written
    os.replace(tmp, dest)
    return 0


def write_node_run(
    base: Any, nodes: int, run_dir: Path, work: Path, chunks: bool
) -> dict[str, Any]:
    """The run directory a Ray job on ``nodes`` nodes leaves (see the module doc): node0's
    file as `watch` leaves it (compacted), the others as the recorder writes them (rows, or
    one Arrow chunk per pull and table where the recorder stores chunks)."""
    import multiprocessing

    from gpuprof import store

    shutil.rmtree(run_dir, ignore_errors=True)
    run_dir.mkdir(parents=True)
    base_dir = work / "base-files"
    shutil.rmtree(base_dir, ignore_errors=True)
    base_dir.mkdir(parents=True)
    hosts = sorted(base.gpu["host"].unique(), key=lambda h: int(h[4:]))
    ranks = int(base.spans["rank"].max()) + 1
    for h in hosts:  # one SQLite file per simulated host, rows as a writer inserts them
        conn = store.connect(base_dir / f"{h}.sqlite")
        try:
            for table in RECORD_TYPES:
                frame = getattr(base, table)
                if not len(frame):
                    continue
                frame = frame[frame["host"] == h]
                rows = list(store._frame_rows(table, frame))
                for i in range(0, len(rows), 200_000):
                    store.insert_rows(conn, {table: rows[i : i + 200_000]})
            conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        finally:
            conn.close()
    start, end = int(base.meta.start_ns or base.gpu["t_ns"].min()), int(base.gpu["t_ns"].max())
    jobs = []
    for n in range(nodes):
        copy, h = divmod(n, len(hosts))
        name = f"node{n}"
        gpus = [
            dict(g, host=name, uuid=f"{g['uuid']}-{copy}" if copy else g["uuid"])
            for g in base.meta.gpus
            if g.get("host") == hosts[h]
        ]
        src = base_dir / f"{hosts[h]}.sqlite"
        meta = base.meta.to_dict()
        pull_s = pull_period_s(nodes - 1)  # the recorder's, for the nodes other than its own
        jobs.append(
            (n, name, copy, src, run_dir, work, ranks, gpus, meta, start, end, chunks, pull_s)
        )
    with multiprocessing.get_context("fork").Pool(2) as pool:
        written = sum(pool.map(_make_node, jobs, chunksize=1))
    store.compact_run(store.host_file(run_dir, "node0"))  # what `watch` does to its own file
    shutil.rmtree(base_dir, ignore_errors=True)
    totals: dict[str, Any] = {"chunks": written}
    totals["bytes"] = sum(p.stat().st_size for p in run_dir.iterdir())
    for table in ("gpu", "spans", "procs", "gpu_procs", "host"):
        totals[table] = store.count_rows(run_dir, table)
    return totals


def _tree_rss(pid: int, peak: list[int], done: threading.Event) -> None:
    """The largest total RSS of process ``pid`` and its descendants, polled every 0.1 s."""
    import psutil

    with contextlib.suppress(psutil.Error):
        root = psutil.Process(pid)
        while not done.wait(0.1):
            total = 0
            for proc in [root, *root.children(recursive=True)]:
                with contextlib.suppress(psutil.Error):
                    total += proc.memory_info().rss
            peak[0] = max(peak[0], total)


def _run_child(cmd: list[str], env: dict[str, str] | None = None) -> dict[str, Any]:
    """Run a fresh process: wall s, user+sys s, peak RSS bytes, its stdout.

    The peak is the largest total RSS of the process and its children, polled every 0.1 s
    (``tree_rss``), not ``wait4``'s ``ru_maxrss``: that starts at the RSS of this process at
    the fork (Linux keeps the high-water mark across exec), and this process holds the base
    run (over 1 GB), so every child's would read at least that."""
    start = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=ROOT, env=env)
    peak, done = [0], threading.Event()
    poller = threading.Thread(target=_tree_rss, args=(proc.pid, peak, done), daemon=True)
    poller.start()
    chunks: list[bytes] = []
    reader = threading.Thread(target=lambda: chunks.append(proc.stdout.read()), daemon=True)
    reader.start()
    err = proc.stderr.read()
    _, status, usage = os.wait4(proc.pid, 0)
    done.set()
    poller.join()
    reader.join()
    elapsed = time.perf_counter() - start
    proc.returncode = os.waitstatus_to_exitcode(status)
    if proc.returncode != 0:
        raise SystemExit(f"{' '.join(cmd[2:5])} failed: {err.decode()[-2000:]}")
    return {
        "s": elapsed,
        "cpu_s": usage.ru_utime + usage.ru_stime,
        "rss": peak[0],
        "out": b"".join(chunks),
    }


CLI = textwrap.dedent(
    """
    import json, os, sys, time
    t0 = time.perf_counter()
    from gpuprof import api, cli
    import gpuprof.analyzers.diagnose as diagnose
    took = {}
    def timed(owner, name, key):
        inner = getattr(owner, name)
        def wrapper(*a, **k):
            c = time.perf_counter()
            try:
                return inner(*a, **k)
            finally:
                took[key] = took.get(key, 0.0) + time.perf_counter() - c
        setattr(owner, name, wrapper)
    timed(api, "load_for_analysis", "load_s")
    timed(api, "analyze", "diagnose_s")
    timed(diagnose, "node_summary", "nodes_s")
    if sys.argv[1] == "report":
        import gpuprof.reports.html as html
        timed(html, "write_html", "render_s")
    took["import_s"] = time.perf_counter() - t0
    sys.argv = ["gpuprof", *sys.argv[1:]]
    try:
        cli.main()
    finally:
        with open("/proc/self/status") as f:  # this process's own high-water mark
            hwm = [line.split()[1] for line in f if line.startswith("VmHWM:")]
        took["vmhwm_bytes"] = int(hwm[0]) * 1024 if hwm else 0
        with open(os.environ["BENCH_TIMES"], "w") as f:
            json.dump(took, f)
    """
)
"""``gpuprof analyze|report`` as ``python -m gpuprof`` runs them (`cli.main`), with the time
spent loading, diagnosing, in the per-node summary and rendering written to a file."""


def gpuprof_cli(argv: list[str], work: Path) -> dict[str, Any]:
    times = work / "times.json"
    env = dict(os.environ, BENCH_TIMES=str(times), PYTHONPATH=str(ROOT))
    load0 = os.getloadavg()[0]
    r = _run_child([sys.executable, "-c", CLI, *argv], env)
    r["parts"] = json.loads(times.read_text())
    r["rss"] = max(r["rss"], r["parts"].pop("vmhwm_bytes", 0))  # a spike between two polls
    r["load"] = (load0, os.getloadavg()[0])
    return r


def measure_run(run_dir: Path, label: str, repeats: int, work: Path) -> dict[str, Any]:
    """``analyze --json`` and ``report`` of ``run_dir``, interleaved, ``repeats`` times."""
    html = run_dir.with_suffix(".html")  # kept with the run by --keep
    results: dict[str, list[dict[str, Any]]] = {"analyze": [], "report": []}
    for i in range(repeats):
        for what in ("analyze", "report"):
            if what == "analyze":
                r = gpuprof_cli(["analyze", str(run_dir), "--json"], work)
                r["doc"] = json.loads(r["out"])
            else:
                r = gpuprof_cli(["report", str(run_dir), "-o", str(html)], work)
                r["mb"] = html.stat().st_size / 1e6
            results[what].append(r)
            parts = r["parts"]
            print(
                f"   {label}: {what:7s} run {i + 1}: {r['s']:6.1f} s wall, {r['cpu_s']:6.1f} s "
                f"CPU, peak RSS {r['rss'] / 2**20:5.0f} MB"
                + (f", {r['mb']:.2f} MB" if what == "report" else "")
                + f"; loading {parts.get('load_s', 0):.1f} s, diagnosis "
                f"{parts.get('diagnose_s', 0):.1f} s (per-node summary "
                f"{parts.get('nodes_s', 0):.2f} s)"
                + (f", drawing {parts.get('render_s', 0):.1f} s" if what == "report" else "")
                + f"; load {r['load'][0]:.2f}->{r['load'][1]:.2f}",
                flush=True,
            )
    for what, rs in results.items():
        print(
            f"   {label}: {what:7s} median {statistics.median(r['s'] for r in rs):.1f} s, "
            f"peak RSS {max(r['rss'] for r in rs) / 2**20:.0f} MB"
        )
    doc = results["analyze"][0]["doc"]
    nodes = doc.get("summary", {}).get("nodes") or {}
    merged_note = [x for x in doc.get("notes", []) if "analysed as" in x]
    failed = [x for x in doc.get("notes", []) if "failed" in x]
    findings = ", ".join(f"{f['kind']} ({f['share']:.3f})" for f in doc.get("findings", []))
    print(
        f"   {label}: summary.nodes: {len(nodes.get('nodes') or [])} nodes, "
        f"{len(json.dumps(nodes)):,} bytes of JSON, clocks "
        f"{sum(1 for n in nodes.get('nodes') or [] if n.get('clock'))} applied; "
        f"failures: {failed or 'none'}"
    )
    print(f"   {label}: {merged_note[0] if merged_note else 'no merging'}")
    print(f"   {label}: findings {findings}")
    return results


def analyze_part(args: argparse.Namespace, work: Path) -> None:
    run_dir = args.dir / f"{args.nodes}x{GPUS_PER_NODE}"
    t = time.perf_counter()
    base = base_run(args.hours)
    span_h = (base.gpu["t_ns"].max() - base.gpu["t_ns"].min()) / 3.6e12
    print(
        f"\n4. analyze: simulated {len(base.meta.hosts)} nodes x 8 GPUs, {span_h:.2f} h, "
        f"{len(base.gpu):,} GPU samples in {time.perf_counter() - t:.0f} s",
        flush=True,
    )
    t = time.perf_counter()
    chunks = {"auto": chunked_store(), "rows": False, "chunks": True}[args.layout]
    totals = write_node_run(base, args.nodes, run_dir, work, chunks)
    del base
    print(
        f"   run directory {run_dir}: {args.nodes} node files, {totals['gpu']:,} GPU samples, "
        f"{totals['spans']:,} spans, {totals['procs']:,} process samples, "
        f"{totals['gpu_procs']:,} GPU-process samples, {totals['host']:,} host samples, "
        f"{totals['bytes'] / 1e9:.2f} GB; other nodes' files as "
        + (f"{totals['chunks']:,} Arrow chunks" if chunks else "SQLite rows")
        + f"; written in {time.perf_counter() - t:.0f} s",
        flush=True,
    )
    measure_run(run_dir, "as recorded (uncompacted)", args.analyze_repeats, work)
    if args.compacted:
        load0 = os.getloadavg()[0]
        # what `watch` does when the job ends (`api._compact_cluster`), as `gpuprof compact`:
        # the node files, as many at once as there are cores (at most 8)
        workers = min(args.nodes, os.cpu_count() or 1, 8)
        code = "import sys; from gpuprof import api; api.compact(sys.argv[1])"
        r = _run_child([sys.executable, "-c", code, str(run_dir)])
        size = sum(p.stat().st_size for p in run_dir.iterdir()) / 1e9
        print(
            f"   compacting the directory ({workers} files at once): {r['s']:.0f} s, peak RSS "
            f"{r['rss'] / 2**20:.0f} MB (all its processes), {size:.2f} GB after; load "
            f"{load0:.2f}->{os.getloadavg()[0]:.2f}",
            flush=True,
        )
        measure_run(run_dir, "compacted (as watch leaves it)", args.analyze_repeats, work)
    if not args.keep:
        shutil.rmtree(run_dir, ignore_errors=True)
        run_dir.with_suffix(".html").unlink(missing_ok=True)


# -- main --------------------------------------------------------------------------------------


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=20.0, help="window of parts 1-3, s")
    parser.add_argument("--nodes", type=int, default=64)
    parser.add_argument("--hours", type=float, default=1.0, help="length of part 4's run")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument(
        "--spans-per-s",
        type=float,
        default=20.0,
        help="spans each of a node's 8 workers records per second",
    )
    parser.add_argument("--skip", default="", help="parts to leave out: ship,receive,ray,analyze")
    parser.add_argument("--dir", type=Path, default=Path("/tmp/gpuprof-multinode"))
    parser.add_argument("--analyze-repeats", type=int, default=1, help="part 4's repeats")
    parser.add_argument(
        "--layout",
        choices=("auto", "rows", "chunks"),
        default="auto",
        help="part 4: the other nodes' files as rows or Arrow chunks (auto: as this tree's "
        "recorder stores them)",
    )
    parser.add_argument(
        "--compacted",
        action="store_true",
        help="part 4: then compact every node file and measure again",
    )
    parser.add_argument("--keep", action="store_true", help="keep part 4's run directory")
    parser.add_argument("--node-child", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--ray-child", type=Path, nargs=2, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.node_child:
        node_child(args.node_child, args.seconds, GPUS_PER_NODE, args.spans_per_s)
        return
    if args.ray_child:
        ray_child(*args.ray_child, args.nodes, args.seconds, args.repeats)
        return

    skip = set(filter(None, args.skip.split(",")))
    work = Path(tempfile.mkdtemp(prefix="gpuprof-multinode-"))
    print(f"load average at start: {_loadavg()}")
    try:
        if not {"ship", "receive", "ray"} <= skip:
            doc = ship(args, work)
            print_ship(ship_figures(doc), doc, args)
            rec = receive(doc, args, work) if "receive" not in skip else {}
            ray = ray_part(doc, args, work) if "ray" not in skip else {}
            if rec and ray:
                print()
                for variant, rs in rec.items():
                    cpu = statistics.median(r["cpu_pct"] for r in rs)
                    dec = statistics.median(r["decode_pct"] for r in rs)
                    period = rs[0]["period"]
                    calls = ray.get(period)
                    if calls is None:
                        continue
                    print(
                        f"   receiver total, {variant}: {cpu:.2f}% (recorder and writers) - "
                        f"{dec:.2f}% (unpickling, counted in Ray's) + {calls:.2f}% (Ray's "
                        f"calls at {period:g} s) = {cpu - dec + calls:.2f}% of a core "
                        "(budget 5%)"
                    )
        if "analyze" not in skip:
            analyze_part(args, work)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print(f"load average at end: {_loadavg()}")


def _loadavg() -> str:
    return Path("/proc/loadavg").read_text().strip()


if __name__ == "__main__":
    main()
