"""Step-time overhead of `gpuprof watch` on the CPU GRPO example.

    python benchmarks/bench_watch_overhead.py [--pairs 5] [--steps 30] [-- extra example args]

Runs ``examples/grpo_tiny.py`` alternately bare and under ``gpuprof watch`` (hooks recording,
sampler at 10 Hz), ``pairs`` times each, in one session so machine noise hits both alike. The
example prints its median step time; the table gives the median of those medians per variant and
the ratio watched / bare. The example's own phase hooks run in both variants (outside a run they
are no-ops), so the ratio is the cost of recording plus sampling.
"""

from __future__ import annotations

import argparse
import re
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
EXAMPLE = ROOT / "examples" / "grpo_tiny.py"
_MEDIAN = re.compile(r"median step ([0-9.]+) ms")


def run_once(watched: bool, steps: int, extra: list[str], nvml: bool) -> float:
    cmd = [sys.executable, str(EXAMPLE), "--steps", str(steps), *extra]
    if watched:
        run_dir = tempfile.mkdtemp(prefix="gpuprof-overhead-")
        flags = ["--quiet", "-o", run_dir] + ([] if nvml else ["--no-nvml"])
        cmd = [sys.executable, "-m", "gpuprof", "watch", *flags, "--", *cmd]
    out = subprocess.run(cmd, capture_output=True, text=True, check=True, cwd=ROOT).stdout
    match = _MEDIAN.search(out)
    if not match:
        raise SystemExit(f"no median step time in output of {cmd}")
    return float(match.group(1))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pairs", type=int, default=5)
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--no-nvml", action="store_true", help="watch without NVML sampling")
    parser.add_argument("extra", nargs="*", help="arguments for the example")
    args = parser.parse_args()
    bare, watched = [], []
    for _ in range(args.pairs):
        bare.append(run_once(False, args.steps, args.extra, not args.no_nvml))
        watched.append(run_once(True, args.steps, args.extra, not args.no_nvml))
    b, w = statistics.median(bare), statistics.median(watched)
    print(f"{'variant':10s} {'median step ms':>15s}  runs")
    print(f"{'bare':10s} {b:15.1f}  {' '.join(f'{x:.1f}' for x in bare)}")
    print(f"{'watched':10s} {w:15.1f}  {' '.join(f'{x:.1f}' for x in watched)}")
    print(f"ratio watched/bare: {w / b:.4f}")


if __name__ == "__main__":
    main()
