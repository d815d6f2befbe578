"""Store throughput: spans per second committed to one host file, by 1 and by 4 processes.

    python benchmarks/bench_store.py [--spans 200000] [--repeats 5]

Each writer process records ``spans`` phases through the public hooks and exits; the figure is
the total spans committed divided by the wall time from the first process start to the last
process end (process start-up excluded: each process waits on a shared start time). Medians
over ``repeats``; every run is checked for lost spans.
"""

from __future__ import annotations

import argparse
import socket
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from gpuprof import store

WRITER = textwrap.dedent(
    """
    import sys, time, gpuprof
    from gpuprof import hooks
    run_dir, n, start_at = sys.argv[1], int(sys.argv[2]), float(sys.argv[3])
    gpuprof.init(run_dir)
    while time.time() < start_at:
        time.sleep(0.001)
    t0 = time.time()
    for i in range(n):
        with gpuprof.phase("rollout", i=i):
            pass
    gpuprof.shutdown()
    print(t0, time.time())
    """
)


def one_run(processes: int, spans: int) -> float:
    run_dir = Path(tempfile.mkdtemp(prefix="gpuprof-store-bench-"))
    host = socket.gethostname()
    env = {
        "GPUPROF_DB": str(store.host_file(run_dir, host)),
        "GPUPROF_HOST": host,
        "PATH": "/usr/bin:/bin",
        "PYTHONPATH": str(Path(__file__).resolve().parent.parent),
    }
    start_at = time.time() + 1.5
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", WRITER, str(run_dir), str(spans), str(start_at)],
            env=env,
            stdout=subprocess.PIPE,
            text=True,
        )
        for _ in range(processes)
    ]
    times = [tuple(map(float, p.communicate()[0].split())) for p in procs]
    wall = max(t[1] for t in times) - min(t[0] for t in times)
    count = len(store.load_run(run_dir).spans)
    if count != processes * spans:
        raise SystemExit(f"lost spans: {count} of {processes * spans}")
    return processes * spans / wall


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--spans", type=int, default=200_000)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    print(f"{'writers':>8s} {'spans each':>11s} {'median spans/s':>15s}  all runs")
    for processes in (1, 4):
        rates = [one_run(processes, args.spans) for _ in range(args.repeats)]
        shown = " ".join(f"{r:,.0f}" for r in rates)
        print(f"{processes:8d} {args.spans:11,d} {statistics.median(rates):15,.0f}  {shown}")


if __name__ == "__main__":
    main()
