"""Step-time overhead of `gpuprof watch` on the CPU GRPO example.

    python benchmarks/bench_watch_overhead.py [--pairs 20] [--steps 30] [--no-simnvml]

Runs ``examples/grpo_tiny.py`` alternately bare and under ``gpuprof watch`` (hooks recording,
GPU sampling at 10 Hz on 8 simulated GPUs through the real NVML bindings, host sampling), in
one session so machine noise hits both alike. The example prints each step's wall time; step 0
(warm-up) is dropped. Reported: the median step time of each variant over all its steps, the
ratio of those medians, and the median over pairs of the per-pair ratio. The example's phase
hooks run in both variants (outside a run they are no-ops), so the ratio is the cost of
recording plus sampling.
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
_STEP = re.compile(r"^step\s+(\d+)\s.*\btime\s+([0-9.]+) ms", re.MULTILINE)


def simnvml_env(tmp: Path) -> dict[str, str]:
    sys.path.insert(0, str(ROOT / "tests"))
    from simnvml import build_library, simnvml_env, write_scenario

    lib = build_library(tmp)
    gpus = [{"gpm": True, "series": {"util_gpu_pct": [(0, 30), (3, 90)]}} for _ in range(8)]
    return simnvml_env(lib, write_scenario(tmp / "scenario.txt", {"gpus": gpus}))


def run_once(watched: bool, steps: int, env: dict[str, str] | None) -> list[float]:
    cmd = [sys.executable, str(EXAMPLE), "--steps", str(steps)]
    if watched:
        run_dir = tempfile.mkdtemp(prefix="gpuprof-overhead-")
        flags = ["--quiet", "-o", run_dir] + ([] if env else ["--no-nvml"])
        cmd = [sys.executable, "-m", "gpuprof", "watch", *flags, "--", *cmd]
    out = subprocess.run(
        cmd, capture_output=True, text=True, check=True, cwd=ROOT, env=env if watched else None
    ).stdout
    times = [float(ms) for step, ms in _STEP.findall(out) if int(step) > 0]
    if len(times) != steps - 1:
        raise SystemExit(f"expected {steps - 1} step times from {cmd}, got {len(times)}")
    return times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pairs", type=int, default=20)
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--no-simnvml", action="store_true", help="watch without NVML sampling")
    args = parser.parse_args()
    env = None if args.no_simnvml else simnvml_env(Path(tempfile.mkdtemp(prefix="simnvml-")))
    bare: list[float] = []
    watched: list[float] = []
    pair_ratios: list[float] = []
    for _ in range(args.pairs):
        b = run_once(False, args.steps, None)
        w = run_once(True, args.steps, env)
        bare += b
        watched += w
        pair_ratios.append(statistics.median(w) / statistics.median(b))
    b_med, w_med = statistics.median(bare), statistics.median(watched)
    print(f"{args.pairs} pairs x {args.steps - 1} steps; GPU sampling: "
          f"{'none' if env is None else '8 simulated GPUs at 10 Hz'}")  # fmt: skip
    print(f"{'variant':10s} {'median step ms':>15s}")
    print(f"{'bare':10s} {b_med:15.2f}")
    print(f"{'watched':10s} {w_med:15.2f}")
    print(f"ratio of medians watched/bare: {w_med / b_med:.4f}")
    print(f"median of per-pair ratios:     {statistics.median(pair_ratios):.4f}")
    print("per-pair ratios: " + " ".join(f"{r:.3f}" for r in pair_ratios))


if __name__ == "__main__":
    main()
