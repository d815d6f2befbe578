"""Where the time of `analyze` goes when a long run is diagnosed in worker parts, measured.

    python benchmarks/bench_parts_parent.py RUN_DIR [--workers 2] [--budget GB | --max-memory GB]

`bench_parts_scaling.py` times the parts' calls in one process, so it holds every part at
once: a cluster-day does not fit that way. This runs `analyze`'s own path in this process
(`loader.load_for_diagnosis`, then `api.analyze` with its series read by the workers, as the
command does) and clocks, in the parent:

- ``load``: reading the run (without its sampled series when its merged form is kept);
- ``parts``: making the parts (the census of the series, forking, this process's own part);
- ``waiting``: inside `WorkerParts.map`: this process's part's calls and the wait for the
  workers' (what more cores would shorten: on N cores, about ``waiting × workers / N``);
- ``serial``: the rest of the diagnosis, what this process does alone whatever the cores.

and, measured from outside (`measure.run`), the wall and CPU time, the peak PSS of the process
tree (each page forked processes share counted once) and the parent's own peak RSS. Prints
the JSON document's SHA-256 too.
"""

from __future__ import annotations

import argparse
import hashlib
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "benchmarks")]

import measure  # noqa: E402

from gpuprof import api, loader  # noqa: E402
from gpuprof.analyzers import part_workers  # noqa: E402
from gpuprof.analyzers.diagnose import parts_min_samples  # noqa: E402
from gpuprof.reports.fmt import render_json  # noqa: E402


def clocked(
    run_dir: Path, workers: int, budget: int | None = None, max_memory: int | None = None
) -> None:
    """`analyze`'s path in this process, clocked; prints the figures and the digest."""
    clocks = {"made": 0.0, "waiting": 0.0}
    real_init, real_map = part_workers.WorkerParts.__init__, part_workers.WorkerParts.map

    def timed_init(self, *a, **k):
        t, waited = time.perf_counter(), clocks["waiting"]
        real_init(self, *a, **k)
        # the facts' call made in it is a map: waiting, not making
        clocks["made"] += time.perf_counter() - t - (clocks["waiting"] - waited)

    def timed_map(self, *a, **k):
        t = time.perf_counter()
        try:
            return real_map(self, *a, **k)
        finally:
            clocks["waiting"] += time.perf_counter() - t

    part_workers.WorkerParts.__init__ = timed_init
    part_workers.WorkerParts.map = timed_map
    t0 = time.perf_counter()
    run, series = loader.load_for_diagnosis(run_dir, workers=workers,
                                            defer_from=parts_min_samples(workers))  # fmt: skip
    t1 = time.perf_counter()
    spilled = []
    real_close = part_workers.WorkerParts.close

    def counted_close(self):
        spilled.append(self.spilled)
        real_close(self)

    part_workers.WorkerParts.close = counted_close
    spill_dir = None
    if max_memory is not None:  # as `analyze --max-memory` picks the processes and budget
        from gpuprof.cli import _Memory, _within_memory

        workers, held = _within_memory(run_dir, series, workers, True, _Memory(False, max_memory))
        if held is not None:
            budget, spill_dir = held
    doc = render_json(api.analyze(run, workers=workers, series=series, budget=budget,
                                  spill_dir=spill_dir).to_dict())  # fmt: skip
    t2 = time.perf_counter()
    serial = (t2 - t1) - clocks["waiting"] - clocks["made"]
    print(f"series read by the workers: {series is not None}")
    print(f"load        {t1 - t0:8.2f} s")
    print(f"analyze     {t2 - t1:8.2f} s")
    print(f"  made      {clocks['made']:8.2f} s  (the parts: census, forks, this process's part)")
    print(f"  waiting   {clocks['waiting']:8.2f} s  (in the parts' calls)")
    print(f"  serial    {serial:8.2f} s  (the rest)")
    if budget is not None:
        print(f"budget {budget / 1e9:.2f} GB: this process wrote out {spilled[0][0]} parts, "
              f"read back {spilled[0][1]}")  # fmt: skip
    print("sha256", hashlib.sha256(doc.encode()).hexdigest())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("run", type=Path)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--budget", type=float, default=None,
                        help="GB the parts may hold, all processes together (analyze's "
                             "--max-memory less the processes' own)")  # fmt: skip
    parser.add_argument("--max-memory", type=float, default=None,
                        help="GB: analyze --max-memory's processes and budget")  # fmt: skip
    parser.add_argument("--inner", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.inner:
        budget = None if args.budget is None else int(args.budget * 1e9)
        limit = None if args.max_memory is None else int(args.max_memory * 1e9)
        clocked(args.run, args.workers, budget, limit)
        return
    # measured from a small spawner: the tree's PSS is the analysis's own
    budget = ["--budget", str(args.budget)] if args.budget is not None else []
    budget += ["--max-memory", str(args.max_memory)] if args.max_memory is not None else []
    got = measure.run([sys.executable, __file__, str(args.run), "--workers", str(args.workers),
                       "--inner", *budget], poll=True, check=True)  # fmt: skip
    print(f"run: {args.run}  workers: {args.workers}")
    print(got["stdout"].decode(), end="")
    print(f"wall {got['wall_s']:.2f} s, CPU {got['user_s'] + got['sys_s']:.2f} s, "
          f"peak tree PSS {got['tree_pss_bytes'] / 2**30:.2f} GiB, "
          f"this process's peak RSS {got['peak_rss_bytes'] / 2**30:.2f} GiB")  # fmt: skip


if __name__ == "__main__":
    main()
