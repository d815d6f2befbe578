"""`gpuprof analyze RUN --steps A:B --json`: a stretch of a long run's steps read and diagnosed
alone, against the whole run, each as a fresh process.

    python benchmarks/bench_analyze_steps.py [--dir /tmp/gpuprof-scale256/4h]
                                             [--steps 0:12 0:72 0:144] [--repeats 3]
                                             [--workers 2] [--before OLD_CHECKOUT]
                                             [--by-steps 24 48]

``--dir`` is a finished run directory as `watch` leaves it (host files with Parquet side files;
`bench_analyze_parallel.py` writes 256 GPUs x 4 h there, ~290 steps). The whole run is
analysed from the form the loader keeps beside it (written by an untimed first run, as after
`watch`); a stretch is read from the run files, everything outside it dropped as each file is
read. Variants are interleaved repeat by repeat; each runs from a fresh spawner
(`measure.run`), which gives the command's own peak RSS, and its process tree is polled for
total PSS (the loader's worker processes share pages with it). The table gives medians: wall
seconds, CPU seconds (user + system), peak RSS of the command and peak PSS of its tree, with
the stretch the diagnosis says it read. ``--by-steps N``: the whole run diagnosed N steps at a
time (`gpuprof.by_steps`), its stretches on ``--workers`` processes. ``--no-whole``: the
whole run is not analysed (nor its form kept first: the first variant then keeps it).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import measure

ROOT = Path(__file__).resolve().parent.parent


def _linked_copy(run_dir: str, name: str) -> str:
    """A copy of ``run_dir`` whose run files are hard links (no data copied) and whose kept
    form is its own: two checkouts that keep different formats do not replace each other's."""
    copy = f"{run_dir.rstrip('/')}.{name}"
    if not Path(copy).is_dir():
        Path(copy).mkdir()
        for entry in Path(run_dir).iterdir():
            if entry.is_file():
                os.link(entry, Path(copy) / entry.name)
    return copy


def _argv(run_dir: str, steps: str | None, workers: int) -> list[str]:
    """``steps``: ``A:B`` for --steps, ``by N`` for --by-steps N, None for the whole run."""
    argv = [sys.executable, "-m", "gpuprof", "analyze", run_dir, "--json"]
    argv += ["--workers", str(workers)]
    if steps and steps.startswith("by "):
        return [*argv, f"--by-steps={steps.split()[1]}"]
    return argv + ([f"--steps={steps}"] if steps else [])


def _said(document: dict) -> list[str]:
    """What the document says it read: the stretch, or how many stretches."""
    if "by_steps" in document:
        how = document["by_steps"]
        return [f"{how['stretches']} stretches of {how['steps_per_stretch']} steps"]
    return [n for n in document.get("notes", []) if "alone" in n]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dir", default="/tmp/gpuprof-scale256/4h")
    parser.add_argument("--steps", nargs="*", default=["0:12", "0:72", "0:144"])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--by-steps", nargs="*", type=int, default=[])
    parser.add_argument(
        "--no-whole", action="store_true",
        help="time no whole-run analysis (a cluster-day's takes minutes and ~20 GB)",
    )  # fmt: skip
    parser.add_argument(
        "--before", help="another checkout whose whole-run analysis is timed alongside, on a "
        "copy of the run (hard links) with a kept form of its own",
    )  # fmt: skip
    args = parser.parse_args()
    if not Path(args.dir).is_dir():
        sys.exit(f"{args.dir}: no run; python benchmarks/bench_analyze_parallel.py writes one")
    here = {**os.environ, "PYTHONPATH": str(ROOT)}
    # variant → (run directory, stretch, environment)
    variants: dict[str, tuple[str, str | None, dict]] = {}
    if args.before:
        before = {**os.environ, "PYTHONPATH": str(Path(args.before).resolve())}
        variants["before: whole run (kept)"] = (_linked_copy(args.dir, "before"), None, before)
    if not args.no_whole:
        variants["whole run (kept form)"] = (args.dir, None, here)
    variants.update({f"--steps {s}": (args.dir, s, here) for s in args.steps})
    variants.update({f"--by-steps {n}": (args.dir, f"by {n}", here) for n in args.by_steps})
    for run_dir, steps, env in variants.values():
        if steps is None:  # leaves the kept form
            measure.run(_argv(run_dir, None, args.workers), env=env)
    print(f"load average {os.getloadavg()[0]:.2f}", file=sys.stderr)
    results: dict[str, list[dict]] = {name: [] for name in variants}
    for _ in range(args.repeats):
        for name, (run_dir, steps, env) in variants.items():
            got = measure.run(_argv(run_dir, steps, args.workers), env=env, poll=True)
            got["notes"] = _said(json.loads(got["stdout"]))
            results[name].append(got)
    print(f"load average {os.getloadavg()[0]:.2f}", file=sys.stderr)
    head = f"{'variant':24s} {'wall s':>7s} {'CPU s':>7s} {'RSS MB':>7s} {'tree PSS MB':>11s}"
    print(head + "  notes")
    for name, runs in results.items():
        wall = statistics.median(r["wall_s"] for r in runs)
        cpu = statistics.median(r["user_s"] + r["sys_s"] for r in runs)
        rss = statistics.median(r["peak_rss_bytes"] for r in runs)
        pss = statistics.median(r["tree_pss_bytes"] for r in runs)
        notes = runs[0]["notes"]
        print(f"{name:24s} {wall:7.2f} {cpu:7.2f} {measure.mb(rss):>7s} {measure.mb(pss):>11s}  "
              + "; ".join(notes))  # fmt: skip


if __name__ == "__main__":
    main()
