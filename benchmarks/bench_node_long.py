"""`gpuprof analyze` of one 8-GPU node recorded for hours to a week, as a fresh process.

    python benchmarks/bench_node_long.py [--hours 4 24 168] [--repeats 3] [--dir /tmp/gpuprof-node]
                                         [--max-memory SIZE] [--by-steps N]

A run of one node is never cut into parts (`analyzers.parts` cuts by node), so what bounds
its whole-run diagnosis is what the loader makes of a long run: GPU samples merged within
each phase, process and host samples into buckets (`loader`'s notes say how many), and its
spans, which grow with its steps. Each run directory is written once by ``gpuprof demo
--gpus 8 --duration H*3600`` (the simulator streams what it writes: a week is ~2 minutes),
then ``python -m gpuprof analyze DIR --json`` is run ``--repeats`` times from a small
spawner (`measure.run`): wall, CPU, the peak RSS of the analyze process alone, and the peak
PSS of its process tree (``--by-steps`` diagnoses stretches in worker processes), the median
of each. Prints what the diagnosis read (merged GPU samples, steps, from its JSON) and the
document's SHA-256, which must not change between repeats.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import statistics
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "benchmarks")]

import measure  # noqa: E402


def prepared(base: Path, hours: float) -> Path:
    """The run directory of one 8-GPU node for ``hours``, written by ``gpuprof demo`` once."""
    run_dir = base / f"node-{hours:g}h"
    if not (run_dir / "node0.sqlite").exists():
        subprocess.run([sys.executable, "-m", "gpuprof", "demo", "--gpus", "8", "--duration",
                        str(hours * 3600), "-o", str(run_dir)], cwd=ROOT, check=True,
                       stdout=subprocess.DEVNULL)  # fmt: skip
    return run_dir


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hours", type=float, nargs="+", default=[4.0, 24.0, 168.0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--dir", type=Path, default=Path("/tmp/gpuprof-node"))
    parser.add_argument("--max-memory", default=None, help="passed to analyze")
    parser.add_argument("--by-steps", default=None, help="passed to analyze")
    args = parser.parse_args()
    limit = ["--max-memory", args.max_memory] if args.max_memory else []
    limit += ["--by-steps", args.by_steps] if args.by_steps else []
    print("hours  merged GPU samples      steps   wall s   CPU s   peak RSS GB  tree PSS GB  "
          "exit  document")  # fmt: skip
    for hours in args.hours:
        run_dir = prepared(args.dir, hours)
        argv = [sys.executable, "-m", "gpuprof", "analyze", str(run_dir), "--json", *limit]
        got = [measure.run(argv, cwd=ROOT, check=False, poll=True) for _ in range(args.repeats)]
        codes = {g["returncode"] for g in got}
        digests = {hashlib.sha256(g["stdout"]).hexdigest()[:8] for g in got}
        samples = steps = "-"
        if codes == {0} and not args.by_steps:
            basis = json.loads(got[0]["stdout"])["summary"]["data_basis"]
            samples = f"{basis['gpu_samples']['samples']:,}"
            steps = f"{basis['phase_timing']['steps']:,}"
        elif codes != {0}:
            print(got[0]["stderr"].decode().strip().splitlines()[-1])
        wall = statistics.median(g["wall_s"] for g in got)
        cpu = statistics.median(g["user_s"] + g["sys_s"] for g in got)
        rss = statistics.median(g["peak_rss_bytes"] for g in got) / 1e9
        tree = statistics.median(g["tree_pss_bytes"] for g in got) / 1e9
        exits = ",".join(map(str, sorted(codes)))
        print(f"{hours:5g}  {samples!s:>18}  {steps!s:>9}  {wall:7.2f}  {cpu:6.2f}  "
              f"{rss:12.2f}  {tree:13.2f}  {exits}  {','.join(sorted(digests))}")  # fmt: skip


if __name__ == "__main__":
    main()
