"""How would the diagnosis node by node scale with cores? Measured part by part, on paper.

    python benchmarks/bench_parts_scaling.py [--run /tmp/gpuprof-scale256/4h]
                                             [--parts 1 2 4 8 16 32] [--repeats 1]

This machine has two cores; the question is what 16 would do. For each number of parts N the
run (loaded once, its kept form when there is one) is cut into N parts of consecutive nodes
(`parts.by_node`) and diagnosed in this one process (`diagnose_parts`), timing every call
each part answers (`Parts.map`) apart from the rest. Printed per N:

- ``serial``: CPU seconds outside the parts' calls — the decisions on the combined figures,
  what reads the run as a whole (its spans: efficiency, the bound, the per-node figures, the
  notes). One process does this whatever the cores.
- ``parts``: CPU seconds of all the parts' calls together (what the cores share), cutting
  each part out of the run included (each worker cuts its own).
- ``critical``: the sum over calls of the slowest part's time: what the parts' calls take when
  each part has a core of its own and the calls come one after another, as they do.
- ``on N cores``: serial + critical: the wall time the diagnosis would take with a worker
  per part on N cores, the parent's own waits on the pipes not counted (`part_workers`
  measures those: compare ``bench_analyze_parallel.py`` at two workers).
- whether the JSON document is the single-process one, to the byte.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from gpuprof import loader  # noqa: E402
from gpuprof.analyzers.diagnose import diagnose, diagnose_parts  # noqa: E402
from gpuprof.analyzers.findings import AnalysisContext  # noqa: E402
from gpuprof.analyzers.parts import (  # noqa: E402
    Parts,
    combined_facts,
    cut,
    node_groups,
    partial_facts,
)
from gpuprof.reports.fmt import render_json  # noqa: E402


class TimedParts(Parts):
    """`Parts` that clock each part's share of every call (CPU seconds)."""

    calls: list[list[float]]

    def map(self, fn, *args):
        times, out = [], []
        for ctx in self.contexts:
            t = time.process_time()
            out.append(fn(ctx, *args))
            times.append(time.process_time() - t)
        self.calls.append(times)
        return out


def measure(run, n: int) -> dict:
    t0 = time.process_time()
    calls: list[list[float]] = []
    TimedParts.calls = calls
    groups = node_groups(run, n)
    if groups is None:
        pieces = [run]
    else:  # each worker cuts its own part (`part_workers`): a call of the parts
        cuts = []
        pieces = []
        for group in groups:
            t = time.process_time()
            pieces.append(cut(run, group))
            cuts.append(time.process_time() - t)
        calls.append(cuts)
    contexts = [AnalysisContext(p) for p in pieces]
    # each part's share of the run's facts is a call of the parts, as in `part_workers`
    partials = []
    times = []
    for ctx in contexts:
        t = time.process_time()
        partials.append(partial_facts(ctx))
        times.append(time.process_time() - t)
    calls.append(times)
    parts = TimedParts(contexts, combined_facts(run.meta, partials), whole=run)
    doc = render_json(diagnose_parts(parts).to_dict())
    total = time.process_time() - t0
    in_parts = sum(sum(c) for c in calls)
    critical = sum(max(c) for c in calls if c)
    return {
        "parts": len(pieces),
        "total": total,
        "serial": total - in_parts,
        "in_parts": in_parts,
        "critical": critical,
        "calls": len(calls),
        "doc": doc,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--run", type=Path, default=Path("/tmp/gpuprof-scale256/4h"))
    parser.add_argument("--parts", type=int, nargs="+", default=[1, 2, 4, 8, 16, 32])
    parser.add_argument("--repeats", type=int, default=1)
    args = parser.parse_args()
    if not args.run.is_dir():
        sys.exit(f"no run directory at {args.run}")
    run = loader.load_for_analysis(args.run)
    print(f"run: {args.run}: {len(run.gpu):,} GPU samples, {len(run.spans):,} spans")
    t = time.process_time()
    want = render_json(diagnose(run, workers=1).to_dict())
    print(f"single process, one part: {time.process_time() - t:.2f} CPU s")
    print(f"{'N':>3} {'parts':>5} {'calls':>5} {'serial s':>9} {'parts s':>8} {'critical s':>10}"
          f" {'on N cores s':>12}  same")  # fmt: skip
    for n in args.parts:
        got = [measure(run, n) for _ in range(args.repeats)]

        def med(key: str, got=got) -> float:
            return statistics.median(g[key] for g in got)

        same = all(g["doc"] == want for g in got)
        print(f"{n:>3} {got[0]['parts']:>5} {got[0]['calls']:>5} {med('serial'):>9.2f}"
              f" {med('in_parts'):>8.2f} {med('critical'):>10.2f}"
              f" {med('serial') + med('critical'):>12.2f}  {same}")  # fmt: skip


if __name__ == "__main__":
    main()
