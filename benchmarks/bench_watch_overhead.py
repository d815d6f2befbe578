"""Step-time overhead of `gpuprof watch` on the CPU GRPO example.

    python benchmarks/bench_watch_overhead.py [--pairs 20] [--steps 30] [--no-simnvml]
    python benchmarks/bench_watch_overhead.py --log-to wandb,tensorboard,mlflow [--pairs 10]
    python benchmarks/bench_watch_overhead.py --real-nvml --example-args "--device cuda ..."

Runs ``examples/grpo_tiny.py`` alternately bare and under ``gpuprof watch`` (hooks recording,
GPU sampling at 10 Hz on 8 simulated GPUs through the real NVML bindings, host sampling), in
one session so machine noise hits both alike. The example prints each step's wall time; step 0
(warm-up) is dropped. Reported: the median step time of each variant over all its steps, the
ratio of those medians, and the median over pairs of the per-pair ratio. The example's phase
hooks run in both variants (outside a run they are no-ops), so the ratio is the cost of
recording plus sampling. ``--real-nvml`` samples the machine's own GPUs instead of simulated
ones, and ``--example-args`` passes options to the example (e.g. ``--device cuda`` and a model
big enough to keep a real GPU busy).

With ``--log-to``, each round runs a third variant, ``watch --log-to … --log-interval 1``
(W&B offline, MLflow and TensorBoard in local directories), and the ratio of interest is
``logged/watched``: what the trackers' child processes and the watcher's figures thread cost
the training step; also the wall time each watch took from start to exit (the end-of-run upload
included).
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
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


def tracker_env(env: dict[str, str] | None, tmp: Path) -> dict[str, str]:
    """``env`` with W&B offline and MLflow's file store under ``tmp``."""
    out = dict(env or os.environ)
    out.update(WANDB_MODE="offline", WANDB_SILENT="true", WANDB_DIR=str(tmp),
               WANDB_CONFIG_DIR=str(tmp / "wandb-config"), WANDB_CACHE_DIR=str(tmp / "cache"),
               WANDB_DATA_DIR=str(tmp / "data"), MLFLOW_TRACKING_URI=(tmp / "mlruns").as_uri(),
               MLFLOW_ALLOW_FILE_STORE="true", TENSORBOARD_DIR=str(tmp / "tb"))  # fmt: skip
    return out


def run_once(watched: bool, steps: int, env: dict[str, str] | None, log_to: str | None = None,
             extra: list[str] = (), nvml: bool | None = None
             ) -> tuple[list[float], float]:  # fmt: skip
    """The step times (ms) of one run, and its wall time (s). ``nvml``: whether watch samples
    GPUs (default: when ``env`` holds the simulated NVML)."""
    cmd = [sys.executable, str(EXAMPLE), "--steps", str(steps), *extra]
    if watched:
        run_dir = tempfile.mkdtemp(prefix="gpuprof-overhead-")
        sample = bool(env) if nvml is None else nvml
        flags = ["--quiet", "-o", run_dir] + ([] if sample else ["--no-nvml"])
        if log_to:
            flags += ["--log-to", log_to, "--log-interval", "1"]
            env = tracker_env(env, Path(run_dir) / "trackers")
        cmd = [sys.executable, "-m", "gpuprof", "watch", *flags, "--", *cmd]
    started = time.monotonic()
    out = subprocess.run(
        cmd, capture_output=True, text=True, check=True, cwd=ROOT, env=env if watched else None
    ).stdout
    took = time.monotonic() - started
    times = [float(ms) for step, ms in _STEP.findall(out) if int(step) > 0]
    if len(times) != steps - 1:
        raise SystemExit(f"expected {steps - 1} step times from {cmd}, got {len(times)}")
    return times, took


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pairs", type=int, default=20)
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--no-simnvml", action="store_true", help="watch without NVML sampling")
    parser.add_argument("--log-to", help="also run watch --log-to these trackers")
    parser.add_argument("--real-nvml", action="store_true", help="sample this machine's GPUs")
    parser.add_argument("--example-args", default="", help="options for the example, one string")
    args = parser.parse_args()
    fake = not (args.no_simnvml or args.real_nvml)
    env = simnvml_env(Path(tempfile.mkdtemp(prefix="simnvml-"))) if fake else None
    nvml = args.real_nvml or fake
    extra = args.example_args.split()
    bare: list[float] = []
    watched: list[float] = []
    logged: list[float] = []
    pair_ratios: list[float] = []
    log_ratios: list[float] = []
    walls: dict[str, list[float]] = {"watched": [], "logged": []}
    for _ in range(args.pairs):
        b, _ = run_once(False, args.steps, None, extra=extra)
        w, took = run_once(True, args.steps, env, extra=extra, nvml=nvml)
        walls["watched"].append(took)
        bare += b
        watched += w
        pair_ratios.append(statistics.median(w) / statistics.median(b))
        if args.log_to:
            g, took = run_once(True, args.steps, env, args.log_to, extra=extra, nvml=nvml)
            walls["logged"].append(took)
            logged += g
            log_ratios.append(statistics.median(g) / statistics.median(w))
    b_med, w_med = statistics.median(bare), statistics.median(watched)
    sampling = "this machine's GPUs" if args.real_nvml else "8 simulated GPUs" if fake else None
    print(f"{args.pairs} pairs x {args.steps - 1} steps; GPU sampling: "
          f"{sampling + ' at 10 Hz' if sampling else 'none'}; example args: {extra}")  # fmt: skip
    print(f"{'variant':10s} {'median step ms':>15s}")
    print(f"{'bare':10s} {b_med:15.2f}")
    print(f"{'watched':10s} {w_med:15.2f}")
    print(f"ratio of medians watched/bare: {w_med / b_med:.4f}")
    print(f"median of per-pair ratios:     {statistics.median(pair_ratios):.4f}")
    print("per-pair ratios: " + " ".join(f"{r:.3f}" for r in pair_ratios))
    if args.log_to:
        g_med = statistics.median(logged)
        print(f"{'logged':10s} {g_med:15.2f}   (watch --log-to {args.log_to})")
        print(f"ratio of medians logged/watched: {g_med / w_med:.4f}")
        print(f"median of per-round ratios:      {statistics.median(log_ratios):.4f}")
        print("per-round ratios: " + " ".join(f"{r:.3f}" for r in log_ratios))
        print(f"median wall time of a watch: {statistics.median(walls['watched']):.2f} s, "
              f"with --log-to {statistics.median(walls['logged']):.2f} s")  # fmt: skip


if __name__ == "__main__":
    main()
