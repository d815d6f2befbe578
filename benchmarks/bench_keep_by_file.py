"""Making a long run's kept form: loaded whole (what `analyze` does the first time) against
made file by file (`gpuprof.keep_by_file`), each as a fresh process.

    python benchmarks/bench_keep_by_file.py [--dir /tmp/gpuprof-scale256/4h] [--repeats 3]
                                            [--workers 2] [--check] [--commands]
                                            [--tile-from /tmp/gpuprof-scale256/base-1h --hours 8]

``--dir`` is a finished run directory (`bench_analyze_parallel.py` writes 256 GPUs x 4 h
there). Each variant works on its own copy of the run (hard links, no data copied) whose
kept form is removed before every repeat; variants are interleaved repeat by repeat and run
from a fresh spawner (`measure.run`), which gives the command's own peak RSS, and its
process tree is polled for total PSS (the worker processes share pages with it). The table
gives medians: wall seconds, CPU seconds (user + system), peak RSS of the command and peak
PSS of its tree. ``--check`` then reads both kept forms and compares them table for table;
``--commands`` adds the first ``analyze --steps 0:24`` and ``--by-steps 24`` of the run (each
keeps its form file by file first).
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import measure
from bench_analyze_steps import _linked_copy

ROOT = Path(__file__).resolve().parent.parent
KEPT = ".gpuprof-loaded"

CODE = {
    "whole load": "from gpuprof import loader; loader.load_for_analysis({dir!r}, workers={w})",
    "file by file": "from gpuprof import keep_by_file; "
    "assert keep_by_file.build({dir!r}, workers={w})",
}
COMMANDS = {  # the first analysis of a stretch, or stretch by stretch, of a run not kept yet
    "--steps 0:24": ["--steps=0:24"],
    "--by-steps 24": ["--by-steps=24"],
}


def _check(whole_dir: str, by_file_dir: str) -> None:
    import pandas.testing as pdt

    from gpuprof import load_cache, loader
    from gpuprof.model import RECORD_TYPES

    settings = {"max_gpu_samples": loader.MAX_GPU_SAMPLES, "merge": None,
                "host_rows": loader.MAX_HOST_ROWS}  # fmt: skip
    a = load_cache.read(whole_dir, load_cache.key(whole_dir, settings))
    b = load_cache.read(by_file_dir, load_cache.key(by_file_dir, settings))
    assert a is not None and b is not None, "a kept form is missing"
    for table in RECORD_TYPES:
        pdt.assert_frame_equal(getattr(a, table), getattr(b, table))
    assert a.meta.to_dict() == b.meta.to_dict()
    print(f"check: the two kept forms are equal ({len(a.gpu):,} merged GPU samples, "
          f"{len(a.spans):,} spans)")  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dir", default="/tmp/gpuprof-scale256/4h")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--check", action="store_true")
    parser.add_argument(
        "--tile-from", help="a one-hour run directory to tile into --dir when it is missing "
        "(bench_analyze_scale.write_tiled_dir), --hours long",
    )  # fmt: skip
    parser.add_argument("--hours", type=float, default=8)
    parser.add_argument(
        "--commands", action="store_true",
        help="also time `analyze --steps 0:24` and `--by-steps 24` on the run not kept yet",
    )  # fmt: skip
    args = parser.parse_args()
    if not Path(args.dir).is_dir() and args.tile_from:
        from bench_analyze_scale import write_tiled_dir

        write_tiled_dir(Path(args.tile_from), args.hours, Path(args.dir))
        print(f"{args.dir}: {args.hours} h tiled from {args.tile_from}", file=sys.stderr)
    if not Path(args.dir).is_dir():
        sys.exit(f"{args.dir}: no run; python benchmarks/bench_analyze_parallel.py writes one")
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    env.pop("GPUPROF_LOAD_CACHE", None)
    names = [*CODE, *(COMMANDS if args.commands else ())]
    dirs = {name: _linked_copy(args.dir, name.strip("-").replace(" ", "-").replace(":", "-"))
            for name in names}  # fmt: skip
    print(f"load average {os.getloadavg()[0]:.2f}", file=sys.stderr)
    results: dict[str, list[dict]] = {name: [] for name in names}
    for _ in range(args.repeats):
        for name in names:
            shutil.rmtree(Path(dirs[name]) / KEPT, ignore_errors=True)
            if name in CODE:
                code = CODE[name].format(dir=dirs[name], w=args.workers)
                argv = [sys.executable, "-c", code]
            else:
                argv = [sys.executable, "-m", "gpuprof", "analyze", dirs[name], "--json",
                        f"--workers={args.workers}", *COMMANDS[name]]  # fmt: skip
            got = measure.run(argv, env=env, poll=True)
            if got.get("returncode"):
                sys.exit(f"{name} failed: {got.get('stderr', '')[-2000:]}")
            results[name].append(got)
    print(f"load average {os.getloadavg()[0]:.2f}", file=sys.stderr)
    print(f"{'variant':14s} {'wall s':>7s} {'CPU s':>7s} {'RSS MB':>7s} {'tree PSS MB':>11s}")
    for name, runs in results.items():
        wall = statistics.median(r["wall_s"] for r in runs)
        cpu = statistics.median(r["user_s"] + r["sys_s"] for r in runs)
        rss = statistics.median(r["peak_rss_bytes"] for r in runs)
        pss = statistics.median(r["tree_pss_bytes"] for r in runs)
        print(f"{name:14s} {wall:7.2f} {cpu:7.2f} {measure.mb(rss):>7s} {measure.mb(pss):>11s}")
    if args.check:
        _check(dirs["whole load"], dirs["file by file"])


if __name__ == "__main__":
    main()
