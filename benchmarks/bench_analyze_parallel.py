"""`gpuprof analyze` of a long run on one process and on several: wall time, CPU, memory.

    python benchmarks/bench_analyze_parallel.py --gpus 256 --hours 4 [--workers 1 2]
                                                [--repeats 3] [--dir /tmp/gpuprof-par]
    python benchmarks/bench_analyze_parallel.py --run RUN_DIR [--workers 1 2] [--repeats 3]
    python benchmarks/bench_analyze_parallel.py --run RUN_DIR --kept-only [--roots A B]
                                                [--first] [--save-json FILE]

A run directory as `watch` leaves it (made like `bench_analyze_scale.py`'s: a simulated hour
of GRPO on the GPUs, repeated back to back), or one given with ``--run``. For each number of
workers, interleaved with the others in every round, two fresh processes, each started from a
small spawner (`measure.run`), from bytecode compiled on a first, untimed run (kept under
``--dir``/pycache), as an installed package runs:

- ``load``: `gpuprof.loader.load_for_analysis` alone, the part that reads and merges the run
  (what the workers share out);
- ``analyze``: ``python -m gpuprof analyze RUN --json --workers N``, the whole command.

Both with keeping the merged form turned off (``GPUPROF_LOAD_CACHE=0``): they merge the run
each time. With ``--kept``, two more per round and number of workers, the whole command with
keeping on: ``first`` with nothing kept (it merges and keeps the merged form, as the first
`analyze` or `watch`'s own summary of a long run does), then ``kept``, which reads it.

Reported per number of workers: the medians of wall time and of CPU (user + system of the
process and the workers it waited for), and the peak total RSS and PSS of the whole process
tree (polled every 0.1 s, the workers included; RSS counts a page that forked processes
share in each of them, PSS once over all). The JSON documents of every run must be
byte-identical whatever the workers and whether the merged form was kept (the diagnosis
depends on neither).

``--kept-only``: only ``kept``, from the merged form the run already has (a run too large to
merge and analyse more than once here), and with ``--first`` ``first`` before it (the kept
form removed first); ``--roots``: the same for each checkout given (its ``gpuprof``
imported first), interleaved in every round, to compare versions side by side.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import shutil
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "benchmarks")]

import measure  # noqa: E402

LOAD = (
    "import sys, time; from gpuprof.loader import load_for_analysis; "
    "run = load_for_analysis(sys.argv[1], workers=int(sys.argv[2])); "
    "print(len(run.gpu))"
)


WARM = (
    "import pandas, numpy, pyarrow, pyarrow.compute, pyarrow.ipc, pyarrow.parquet, "
    "concurrent.futures, multiprocessing; import gpuprof.cli, gpuprof.api, gpuprof.loader, "
    "gpuprof.analyzers.diagnose, gpuprof.reports.fmt"
)
"""Imports compiled into the bytecode cache before anything is timed."""


def make_run(gpus: int, hours: int, base_dir: Path) -> Path:
    """The run directory of ``hours`` hours on ``gpus`` GPUs (kept and reused)."""
    from bench_analyze_scale import base_config, write_tiled_dir

    from gpuprof.sim import simulate_to

    run_dir = base_dir / f"{gpus}x{hours}h"
    if (run_dir / "done").exists():
        return run_dir
    base = base_dir / f"{gpus}-base-1h"
    if not (base / "done").exists():
        simulate_to(base_config(gpus), base)
        (base / "done").touch()
    write_tiled_dir(base, hours, run_dir)
    (run_dir / "done").touch()
    return run_dir


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--run", type=Path, help="an existing run directory")
    parser.add_argument("--gpus", type=int, default=256)
    parser.add_argument("--hours", type=int, default=4)
    parser.add_argument("--workers", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--dir", type=Path, default=Path("/tmp/gpuprof-par"))
    parser.add_argument("--kept", action="store_true",
                        help="also analyze keeping the merged form, then reading it")  # fmt: skip
    parser.add_argument("--kept-only", action="store_true",
                        help="only analyze from the merged form the run has kept")  # fmt: skip
    parser.add_argument("--first", action="store_true", help="with --kept-only: first too")
    parser.add_argument("--roots", type=Path, nargs="+", help="checkouts to compare (kept-only)")
    parser.add_argument("--save-json", type=Path,
                        help="kept-only: write the first run's JSON document here")  # fmt: skip
    args = parser.parse_args()
    run_dir = args.run or make_run(args.gpus, args.hours, args.dir)
    print(f"run: {run_dir}")
    from gpuprof import load_cache

    # the children run from bytecode compiled once (as an installed package does), kept
    # outside the checkout
    base = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    base["PYTHONPYCACHEPREFIX"] = str(args.dir / "pycache")
    on = {k: v for k, v in base.items() if k != load_cache.ENV_CACHE}
    off = {**base, load_cache.ENV_CACHE: "0"}
    measure.run([sys.executable, "-m", "compileall", "-q", str(ROOT / "gpuprof")], env=off)
    measure.run([sys.executable, "-c", WARM], env=off)
    kept_dir = run_dir / load_cache.DIRNAME
    if args.kept_only:
        _kept_only(args, run_dir, on)
        return
    figures: dict[tuple[str, int], list[dict]] = {}
    digests: set[str] = set()
    for _ in range(args.repeats):
        for workers in args.workers:
            analyze = [sys.executable, "-m", "gpuprof", "analyze", str(run_dir), "--json",
                       "--workers", str(workers)]  # fmt: skip
            load = measure.run([sys.executable, "-c", LOAD, str(run_dir), str(workers)],
                               poll=True, env=off)  # fmt: skip
            whole = measure.run(analyze, poll=True, env=off)
            digests.add(hashlib.sha256(whole["stdout"]).hexdigest())
            figures.setdefault(("load", workers), []).append(load)
            figures.setdefault(("analyze", workers), []).append(whole)
            if args.kept:
                shutil.rmtree(kept_dir, ignore_errors=True)
                first = measure.run(analyze, poll=True, env=on)
                if not (kept_dir / "run.json").exists():
                    raise SystemExit("the first analyze kept no merged form")
                kept = measure.run(analyze, poll=True, env=on)
                for done in (first, kept):
                    digests.add(hashlib.sha256(done["stdout"]).hexdigest())
                figures.setdefault(("first", workers), []).append(first)
                figures.setdefault(("kept", workers), []).append(kept)
    if args.kept:
        size = sum(p.stat().st_size for p in kept_dir.iterdir())
        print(f"merged form kept: {size / 2**20:.0f} MB in {kept_dir}")
    print("part     workers  median wall s  median CPU s  peak tree RSS MB  peak tree PSS MB")
    for (part, workers), runs in sorted(figures.items()):
        wall = statistics.median(r["wall_s"] for r in runs)
        cpu = statistics.median(r["user_s"] + r["sys_s"] for r in runs)
        peak = max(max(r["peak_rss_bytes"], r.get("tree_rss_bytes") or 0) for r in runs)
        pss = max(r.get("tree_pss_bytes") or 0 for r in runs)
        print(f"{part:8} {workers:7d}  {wall:13.2f}  {cpu:12.2f}  {peak / 2**20:16.0f}  "
              f"{pss / 2**20:16.0f}")  # fmt: skip
    print("JSON identical for every number of workers (and kept or not):", len(digests) == 1)


def _kept_only(args: argparse.Namespace, run_dir: Path, env: dict[str, str]) -> None:
    """``analyze`` from the kept form only, per checkout and number of workers."""
    from gpuprof import load_cache

    kept_dir = run_dir / load_cache.DIRNAME
    if not args.first and not (kept_dir / "run.json").exists():
        raise SystemExit(f"{run_dir} has no kept form: analyze it once first")
    roots = args.roots or [ROOT]
    parts = ("first", "kept") if args.first else ("kept",)
    figures: dict[tuple[str, int], list[dict]] = {}
    digests: set[str] = set()
    for _ in range(args.repeats):
        for root in roots:
            for workers in args.workers:
                cmd = [sys.executable, "-m", "gpuprof", "analyze", str(run_dir), "--json",
                       "--workers", str(workers)]  # fmt: skip
                for part in parts:
                    if part == "first":
                        shutil.rmtree(kept_dir, ignore_errors=True)
                    got = measure.run(cmd, poll=True, check=True, cwd=root,
                                      env={**env, "PYTHONPATH": str(root)})  # fmt: skip
                    digests.add(hashlib.sha256(got["stdout"]).hexdigest())
                    figures.setdefault((part, str(root), workers), []).append(got)
                    if args.save_json and not args.save_json.exists():
                        args.save_json.write_bytes(got["stdout"])
    print("part   checkout                      workers  median wall s  median CPU s  "
          "peak tree PSS MB")  # fmt: skip
    for (part, root, workers), runs in figures.items():
        wall = statistics.median(r["wall_s"] for r in runs)
        cpu = statistics.median(r["user_s"] + r["sys_s"] for r in runs)
        pss = max(r.get("tree_pss_bytes") or 0 for r in runs)
        print(f"{part:6} {root:28} {workers:8d}  {wall:13.2f}  {cpu:12.2f}  "
              f"{pss / 2**20:16.0f}")  # fmt: skip
    print("JSON identical for every checkout and number of workers:", len(digests) == 1)


if __name__ == "__main__":
    main()
