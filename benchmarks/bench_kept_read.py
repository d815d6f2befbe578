"""Reading a run's kept form: whole, and one part's series alone, side by side per checkout.

    python benchmarks/bench_kept_read.py RUN_DIR [--roots A B] [--parts 2 16] [--repeats 3]

``RUN_DIR`` must have its kept form (`load_cache`; `analyze` it once). Each round, for each
checkout given (its ``gpuprof`` imported first; default this one), in a fresh process started
from a small spawner (`measure.run`):

- ``whole``: `loader.load_for_analysis` of the run, what `report`, `watch`'s summary and an
  `analyze` in one process read;
- ``part/N``: with N parts, the first part's sampled series alone
  (`load_cache.KeptSeries.read`, what each worker of `analyze` reads), after the run without
  them; timed apart from that (checkouts without `KeptSeries` skip it).

Printed: the median wall time of the reading itself (s) and the largest peak RSS of the
process (its own high-water mark).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "benchmarks")]

import measure  # noqa: E402

WHOLE = """
import sys, time, json
from gpuprof import loader
t = time.perf_counter()
run = loader.load_for_analysis(sys.argv[1])
print(json.dumps({"s": time.perf_counter() - t, "rows": len(run.gpu)}))
"""

PART = """
import sys, time, json
from gpuprof import loader
from gpuprof.analyzers.parts import node_groups
if not hasattr(loader, "load_for_diagnosis"):
    print(json.dumps(None)); raise SystemExit
run, series = loader.load_for_diagnosis(sys.argv[1], defer_from=1)
groups = node_groups(run, int(sys.argv[2]), series=series)
t = time.perf_counter()
got = series.read(groups[0])
print(json.dumps({"s": time.perf_counter() - t, "rows": len(got["gpu"])}))
"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("run", type=Path)
    parser.add_argument("--roots", type=Path, nargs="+", default=[ROOT])
    parser.add_argument("--parts", type=int, nargs="+", default=[2, 16])
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    jobs = [("whole", WHOLE, [])] + [(f"part/{n}", PART, [str(n)]) for n in args.parts]
    figures: dict[tuple[str, str], list[dict]] = {}
    env = {k: v for k, v in os.environ.items() if k != "GPUPROF_LOAD_CACHE"}  # kept forms on
    for _ in range(args.repeats):
        for root in args.roots:
            for name, code, extra in jobs:
                got = measure.run([sys.executable, "-c", code, str(args.run), *extra],
                                  cwd=root, env={**env, "PYTHONPATH": str(root)},
                                  check=True)  # fmt: skip
                out = json.loads(got["stdout"])
                if out is not None:
                    figures.setdefault((name, str(root)), []).append({**out, **got})
    print(f"run: {args.run}")
    print("read     checkout                      median s  peak RSS MB  GPU rows")
    for (name, root), runs in figures.items():
        s = statistics.median(r["s"] for r in runs)
        rss = max(r["peak_rss_bytes"] for r in runs)
        print(f"{name:8} {root:28} {s:9.2f}  {rss / 2**20:11.0f}  {runs[0]['rows']:,}")


if __name__ == "__main__":
    main()
