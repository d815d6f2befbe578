"""The metrics endpoint on a Ray cluster's head: what following 64 nodes costs the watcher.

    python benchmarks/bench_metrics_follow.py [--nodes 64] [--seconds 30] [--repeats 3]
                                              [--spans-per-s 160]

A child process plays the Ray driver's recorder: for ``--nodes - 1`` other nodes it writes
``<run>/<node>.sqlite`` as the recorder does (a run document naming the watcher's node, a
``"clock"`` document, one Arrow chunk per table per pull through `store.BufferedWriter`,
committed after each pull, every `recorder.pull_period_s` — 2 s at 64 nodes). Each pull of a
node holds what its sampler ships: 8 GPUs at 10 Hz with every gauge the endpoint serves, the
host every 0.5 s, ``--spans-per-s`` worker spans and a step a second per worker (8 workers).
The rows are made here (same shapes as a `NodeSampler` pull), not sampled.

In this process the real `MetricsExporter` (its `RunTail`, collector and HTTP server) runs
as `watch --metrics-port` runs it, with no GPU of its own. Figures, medians over
``--repeats`` windows of ``--seconds``: the CPU of the exporter's polling thread (its own
thread clock) per wall second, for the whole cluster and, interleaved, for the watcher's
node alone (``other_nodes=False``, the files left unread); and one scrape of the whole
cluster (``generate_latest`` on the exporter's registry, as the HTTP handler calls it):
CPU ms and exposition size.
"""

from __future__ import annotations

import argparse
import multiprocessing
import shutil
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from prometheus_client import generate_latest  # noqa: E402

from gpuprof import columnar, store  # noqa: E402
from gpuprof.integrations.ray_cluster.recorder import pull_period_s  # noqa: E402
from gpuprof.model import RunMeta  # noqa: E402
from gpuprof.reports.prometheus import MetricsExporter  # noqa: E402

S = 1_000_000_000
GPUS = 8
WORKERS = 8
RUN_ID = "bench-run"
WATCHER = "node0"


def pull_rows(node: str, t0_ns: int, period_s: float, spans_per_s: float) -> dict[str, list]:
    """One pull of a node's sampler: rows in each table's column order."""
    gpu, host, spans, events = [], [], [], []
    ticks = round(period_s * 10)
    for k in range(ticks):
        t = t0_ns + k * S // 10
        for i in range(GPUS):
            busy = 80.0 if (k + i) % 5 else 3.0
            gpu.append((node, i, f"GPU-{node}-{i}", t, busy, 40.0, 60 * 2**30, 80 * 2**30,
                        1.2e9, 2.4e9, 3e10, 3e10, 550.0, 1980.0, 61.0, 0, 70.0, 35.0, 20.0,
                        30.0))  # fmt: skip
        if k % 5 == 0:
            host.append((node, t, 35.0, 300 * 2**30, 2048 * 2**30, 128))
    per_worker = max(1, round(spans_per_s * period_s / WORKERS))
    for w in range(WORKERS):
        pid = 1000 + w
        for j in range(per_worker):
            start = t0_ns + int(j * period_s * S / per_worker)
            end = start + int(period_s * S / per_worker * 0.8)
            phase = ("rollout", "reward", "old_logprob", "update_actor")[j % 4]
            spans.append((node, pid, pid, w, w, phase, phase, 1, 0, start, end, None, None, "{}"))
        for j in range(max(1, round(period_s))):
            events.append((node, pid, w, t0_ns + j * S, "step", "step", "{}"))
    return {"gpu": gpu, "host": host, "spans": spans, "events": events}


def driver(run_dir: Path, nodes: int, seconds: float, spans_per_s: float, ready) -> None:
    """The recorder's writes for the other nodes, at its pull period, for ``seconds``."""
    period = pull_period_s(nodes - 1)
    writers = {}
    for n in range(1, nodes):
        name = f"node{n}"
        writer = store.BufferedWriter(store.host_file(run_dir, name), flush_interval_s=5.0)
        meta = RunMeta(run_id=RUN_ID, hosts=[name], reference_node=WATCHER,
                       gpus=[{"host": name, "index": i, "uuid": f"GPU-{name}-{i}",
                              "name": "NVIDIA H100 80GB HBM3"} for i in range(GPUS)])  # fmt: skip
        writer.set_meta("run", meta.to_dict())
        writer.set_meta("clock", {"node": name, "offset_ns": n * 1000, "error_ns": 50,
                                  "method": "ray-rtt", "reference": WATCHER})  # fmt: skip
        writer.flush()
        writers[name] = writer
    ready.set()
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        started = time.monotonic()
        t0 = time.time_ns()
        for name, writer in writers.items():
            for table, rows in pull_rows(name, t0, period, spans_per_s).items():
                writer.add_chunk(table, len(rows), columnar.encode_chunk(table, rows))
            writer.flush()
        time.sleep(max(0.0, period - (time.monotonic() - started)))
    for writer in writers.values():
        writer.close()


def thread_cpu_s(thread: threading.Thread) -> float:
    return time.clock_gettime(time.pthread_getcpuclockid(thread.ident))


def window(run_dir: Path, seconds: float, other_nodes: bool) -> tuple[float, float, int, int]:
    """(exporter thread CPU share, scrape CPU ms, exposition bytes, nodes served)."""
    own = store.host_file(run_dir, WATCHER)
    exporter = MetricsExporter(lambda: None, own, node=WATCHER, address=("127.0.0.1", 0),
                               run_dir=run_dir, run_id=RUN_ID,
                               other_nodes=other_nodes)  # fmt: skip
    exporter.start()
    try:
        time.sleep(3.0)  # past the first scan and the backlog of the files so far
        c0, w0 = thread_cpu_s(exporter._thread), time.monotonic()
        time.sleep(seconds)
        share = (thread_cpu_s(exporter._thread) - c0) / (time.monotonic() - w0)
        scrapes = []
        for _ in range(5):
            t = time.thread_time()
            text = generate_latest(exporter.registry)
            scrapes.append((time.thread_time() - t) * 1e3)
        served = len(exporter.collector.others) + 1
    finally:
        exporter.stop()
    return share, statistics.median(scrapes), len(text), served


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=64)
    parser.add_argument("--seconds", type=float, default=30.0)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--spans-per-s", type=float, default=160.0)
    args = parser.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="gpuprof-bench-follow-"))
    run_dir = tmp / RUN_ID
    run_dir.mkdir()
    conn = store.connect(store.host_file(run_dir, WATCHER))
    store.write_meta(conn, "run", RunMeta(run_id=RUN_ID, hosts=[WATCHER]).to_dict())
    conn.close()
    ctx = multiprocessing.get_context("spawn")
    ready = ctx.Event()
    total = args.repeats * 2 * (args.seconds + 4) + 10
    child = ctx.Process(target=driver, args=(run_dir, args.nodes, total, args.spans_per_s, ready))
    child.start()
    try:
        ready.wait(60)
        results: dict[bool, list] = {True: [], False: []}
        for _ in range(args.repeats):
            for other_nodes in (True, False):
                results[other_nodes].append(window(run_dir, args.seconds, other_nodes))
    finally:
        child.terminate()
        child.join()
        shutil.rmtree(tmp, ignore_errors=True)
    period = pull_period_s(args.nodes - 1)
    print(
        f"{args.nodes} nodes x {GPUS} GPUs, pulls every {period:g} s, "
        f"{args.spans_per_s:g} spans/s per node, {args.repeats} x {args.seconds:g} s"
    )
    for other_nodes, label in ((True, "whole cluster"), (False, "watcher's node only")):
        rows = results[other_nodes]
        shares = [r[0] * 100 for r in rows]
        print(
            f"{label:22s} polling thread, % of a core: median {statistics.median(shares):.2f}"
            f"  runs {' '.join(f'{s:.2f}' for s in shares)}  nodes served {rows[-1][3]}"
        )
        if other_nodes:
            print(
                f"{'':22s} one scrape: {statistics.median(r[1] for r in rows):.1f} ms CPU, "
                f"{rows[-1][2] / 1e3:.0f} kB"
            )


if __name__ == "__main__":
    main()
