"""The diagnosis of one loaded run in one process and in two lanes (`analyzers.lanes`).

    python benchmarks/bench_diagnose_lanes.py --pickle /tmp/bench_diagnose_NAME.pickle
                                              [--workers 1 2] [--repeats 5]

The run is a pickle `bench_diagnose_steps.py` wrote (read once, so the reading is not
timed). Every repeat starts one fresh process per number of workers, interleaved: it
unpickles the run, then times ``api.analyze(run, workers=N)`` alone: wall clock, CPU of the
process and of the lane's child it waited for (``getrusage``), and the peak RSS of each.
Reported: medians per number of workers, and whether every JSON document is byte-identical
(the diagnosis must not depend on the workers).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

CHILD = r"""
import json, pickle, resource, sys, time
sys.path.insert(0, sys.argv[1])
from gpuprof import api
from gpuprof.reports.fmt import render_json
import gpuprof.analyzers.diagnose, gpuprof.analyzers.recommend, gpuprof.analyzers.settings
run = pickle.load(open(sys.argv[2], "rb"))
workers = int(sys.argv[3])
self0 = resource.getrusage(resource.RUSAGE_SELF)
kids0 = resource.getrusage(resource.RUSAGE_CHILDREN)
t = time.perf_counter()
doc = render_json(api.analyze(run, workers=workers).to_dict())
wall = time.perf_counter() - t
self1 = resource.getrusage(resource.RUSAGE_SELF)
kids1 = resource.getrusage(resource.RUSAGE_CHILDREN)
cpu = lambda a, b: (b.ru_utime - a.ru_utime) + (b.ru_stime - a.ru_stime)
print(json.dumps({"wall": wall, "cpu_self": cpu(self0, self1), "cpu_child": cpu(kids0, kids1),
                  "rss_self_mb": self1.ru_maxrss / 1024, "rss_child_mb": kids1.ru_maxrss / 1024,
                  "doc": doc}))
"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pickle", required=True, type=Path)
    parser.add_argument("--workers", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    results: dict[int, list[dict]] = {w: [] for w in args.workers}
    for _ in range(args.repeats):
        for w in args.workers:
            out = subprocess.run(
                [sys.executable, "-c", CHILD, str(ROOT), str(args.pickle), str(w)],
                capture_output=True, text=True, check=True,
            )  # fmt: skip
            results[w].append(json.loads(out.stdout.strip().splitlines()[-1]))
    print(f"run: {args.pickle}; {args.repeats} repeats, interleaved; load average "
          f"{os.getloadavg()[0]:.1f}")  # fmt: skip
    print(f"{'workers':>7} {'wall s':>8} {'min':>6} {'CPU self s':>11} {'CPU child s':>12} "
          f"{'peak RSS MB self / child':>26}")  # fmt: skip
    for w, rows in results.items():
        med = {k: statistics.median(r[k] for r in rows) for k in rows[0] if k != "doc"}
        print(f"{w:>7} {med['wall']:>8.2f} {min(r['wall'] for r in rows):>6.2f} "
              f"{med['cpu_self']:>11.2f} {med['cpu_child']:>12.2f} "
              f"{med['rss_self_mb']:>12.0f} / {med['rss_child_mb']:.0f}")  # fmt: skip
    docs = {hashlib.sha256(r["doc"].encode()).hexdigest() for v in results.values() for r in v}
    print(f"JSON documents identical across workers and repeats: {len(docs) == 1}")


if __name__ == "__main__":
    main()
