"""Where `diagnose` spends its CPU, step by step, on one loaded run, for one or more trees.

    python benchmarks/bench_diagnose_steps.py --run RUN_DIR [--roots BEFORE .] [--repeats 3]
                                              [--top 25]

The run is read once (`gpuprof.loader.load_for_analysis`, with the first tree) and kept as a
pickle beside this benchmark's other files, so that every measurement starts from the same
`Run` and the reading is not timed. Then, for every repeat, one fresh process per tree, the
trees interleaved: the process unpickles the run, then runs the steps `diagnose` runs, in its
order (the alignment of the samples first, each stall detector, the summary, the bound and the
per-node figures, the recommendations), timing each with the process's CPU clock, and writes
the diagnosis as the ``--json`` document `analyze` prints (`api.analyze`, timed whole in a
fresh context: the figure to compare).

Reported: per step, the median CPU ms over the repeats for each tree (the steps that take the
most first), the medians of the totals, and whether the JSON documents of all trees and
repeats are byte-identical (the trees must find the same thing).
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

CHILD = r"""
import json, pickle, sys, time
root, pickled = sys.argv[1], sys.argv[2]
sys.path.insert(0, root)
import gpuprof
assert gpuprof.__file__.startswith(root), gpuprof.__file__
from gpuprof.analyzers import diagnose as d
from gpuprof.analyzers.findings import AnalysisContext, Thresholds
from gpuprof.reports.fmt import render_json
run = pickle.load(open(pickled, "rb"))
times = {}

def timed(name, fn):
    t = time.process_time()
    try:
        return fn()
    finally:
        times[name] = times.get(name, 0.0) + time.process_time() - t

# the steps of `diagnose`, timed one by one; then `diagnose` itself gives the document
steps_ctx = AnalysisContext(run)
th = Thresholds()
# the samples aligned and counted (`sampled` since session 11, `_recorded_gpus` before)
count = getattr(d, "_recorded_gpus", None) or d.sampled
timed("align samples (recorded_gpus)", lambda: count(steps_ctx))
timed("data_notes", lambda: d.data_notes(run, th))
if len(run.gpu):
    timed("claim_startup", lambda: d.claim_startup(steps_ctx))
found = []
for stall in d.STALLS:
    f = timed(stall.kind, lambda: stall.detect(steps_ctx, th))
    if f is not None and f.share >= th.min_share:
        found.append(f)
        steps_ctx.found.append(f)
timed("summarize", lambda: d.summarize(steps_ctx, found))
timed("bound_summary", lambda: d.bound_summary(steps_ctx, th))
timed("node_summary", lambda: d.node_summary(steps_ctx, th))
from gpuprof import api
t = time.process_time()
diagnosis = api.analyze(run)
total = time.process_time() - t
doc = render_json(diagnosis.to_dict())
print(json.dumps({"steps": times, "total": total, "doc": doc}))
"""


def pickled_run(run_dir: Path, root: Path, out: Path) -> Path:
    """The run read by ``root``'s loader, pickled (once) to ``out``."""
    if not out.exists():
        code = (
            "import pickle, sys; sys.path.insert(0, sys.argv[1]); "
            "from gpuprof.loader import load_for_analysis; "
            "pickle.dump(load_for_analysis(sys.argv[2]), open(sys.argv[3], 'wb'), protocol=5)"
        )
        tmp = out.with_suffix(".tmp")
        subprocess.run([sys.executable, "-c", code, str(root), str(run_dir), str(tmp)], check=True)
        tmp.rename(out)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--run", type=Path, required=True, help="a run directory")
    parser.add_argument("--roots", type=Path, nargs="+", default=[Path(".")])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--top", type=int, default=25)
    parser.add_argument("--pickle", type=Path, help="where to keep the read run")
    args = parser.parse_args()
    roots = [r.resolve() for r in args.roots]
    store = args.pickle or Path("/tmp") / f"bench_diagnose_{args.run.resolve().name}.pickle"
    pickled = pickled_run(args.run.resolve(), roots[0], store)
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    steps: dict[Path, dict[str, list[float]]] = {r: {} for r in roots}
    totals: dict[Path, list[float]] = {r: [] for r in roots}
    docs: set[str] = set()
    for _ in range(args.repeats):
        for root in roots:  # interleaved: every round runs each tree once
            out = subprocess.run(
                [sys.executable, "-c", CHILD, str(root), str(pickled)],
                check=True, capture_output=True, text=True, env=env, cwd="/",
            )  # fmt: skip
            result = json.loads(out.stdout)
            for name, cpu in result["steps"].items():
                steps[root].setdefault(name, []).append(cpu)
            totals[root].append(result["total"])
            docs.add(hashlib.sha256(result["doc"].encode()).hexdigest())
    names = list(steps[roots[0]])
    names.sort(key=lambda n: -max(statistics.median(steps[r].get(n, [0.0])) for r in roots))
    header = f"{'step (CPU ms, median of ' + str(args.repeats) + ')':44}"
    print(header + "".join(f"{r.name[:12]:>14}" for r in roots))
    for name in names[: args.top]:
        row = [statistics.median(steps[r].get(name, [0.0])) * 1e3 for r in roots]
        print(f"{name:44}" + "".join(f"{v:14.0f}" for v in row))
    rest = names[args.top :]
    if rest:
        row = [sum(statistics.median(steps[r].get(n, [0.0])) for n in rest) * 1e3 for r in roots]
        print(f"{'the other ' + str(len(rest)) + ' steps':44}" + "".join(f"{v:14.0f}" for v in row))
    row = [sum(statistics.median(v) for v in steps[r].values()) * 1e3 for r in roots]
    print(f"{'all steps above':44}" + "".join(f"{v:14.0f}" for v in row))
    row = [statistics.median(totals[r]) * 1e3 for r in roots]
    print(f"{'diagnose() whole, fresh context':44}" + "".join(f"{v:14.0f}" for v in row))
    print(f"JSON documents identical across trees and repeats: {len(docs) == 1}")
    print(f"load average: {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()
