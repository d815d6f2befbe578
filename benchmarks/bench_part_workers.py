"""The diagnosis of a loaded multi-node run: one process, two lanes, or parts in workers.

    python benchmarks/bench_part_workers.py [--run /tmp/gpuprof-scale256/4h] [--workers 2]
                                            [--repeats 3]

Each round runs, interleaved, one fresh process per way (the run is loaded from its kept form
before the clock starts, with the same loader the CLI uses):

- ``single``: `diagnose` with one worker;
- ``lanes``: `diagnose` with two workers on the lanes (`lanes`: two groups of detectors at
  once), the parts turned off;
- ``parts``: the run in ``--workers`` parts of consecutive nodes, one held by this process
  and each other by a forked worker (`part_workers`), forced whatever the cores.

Reported: medians of the diagnosis's wall seconds, CPU seconds (the process and its reaped
children), the process's own peak RSS and its RSS once the run was loaded, and the largest
child's peak RSS (a forked child's RSS counts the pages it still shares with the parent:
the sum overstates what the tree holds); and whether every JSON document is the single
process's, to the byte.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

_CHILD = r"""
import hashlib, json, resource, sys, time
sys.path.insert(0, {root!r})
from gpuprof import loader
from gpuprof.analyzers import diagnose as d
from gpuprof.analyzers.part_workers import WorkerParts
from gpuprof.reports.fmt import render_json
run = loader.load_for_analysis({run!r})
base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
way, workers = {way!r}, {workers}
t, c = time.perf_counter(), time.process_time()
if way == "single":
    doc = d.diagnose(run, workers=1)
elif way == "lanes":
    d.PARTS_MIN_WORKERS = 10**9
    doc = d.diagnose(run, workers=2)
else:
    with WorkerParts(run, workers) as parts:
        doc = d.diagnose_parts(parts)
wall = time.perf_counter() - t
kids = resource.getrusage(resource.RUSAGE_CHILDREN)
cpu = time.process_time() - c + kids.ru_utime + kids.ru_stime
peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
print(json.dumps({{"wall": wall, "cpu": cpu, "rss": peak, "loaded": base,
                  "child_rss": kids.ru_maxrss,
                  "doc": hashlib.sha256(render_json(doc.to_dict()).encode()).hexdigest()}}))
"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--run", type=Path, default=Path("/tmp/gpuprof-scale256/4h"))
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    if not args.run.is_dir():
        sys.exit(f"no run directory at {args.run}")
    ways = ("single", "lanes", "parts")
    got: dict[str, list[dict]] = {w: [] for w in ways}
    for _ in range(args.repeats):
        for way in ways:
            code = _CHILD.format(root=str(ROOT), run=str(args.run), way=way, workers=args.workers)
            out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                                 check=True, cwd=ROOT)  # fmt: skip
            got[way].append(json.loads(out.stdout.strip().splitlines()[-1]))
    print(f"run: {args.run}; parts: {args.workers}; {args.repeats} rounds, medians")
    print(f"{'way':<7} {'wall s':>7} {'CPU s':>7} {'RSS MB':>7} {'loaded MB':>9} {'child MB':>8}")
    for way in ways:
        rows = got[way]

        def med(key: str, rows=rows) -> float:
            return statistics.median(r[key] for r in rows)

        print(f"{way:<7} {med('wall'):>7.2f} {med('cpu'):>7.2f} {med('rss') / 1024:>7.0f}"
              f" {med('loaded') / 1024:>9.0f} {med('child_rss') / 1024:>8.0f}")  # fmt: skip
    docs = {r["doc"] for rows in got.values() for r in rows}
    print(f"JSON identical for every way: {len(docs) == 1}")


if __name__ == "__main__":
    main()
