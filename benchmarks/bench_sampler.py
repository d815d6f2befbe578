"""Watcher CPU: `gpuprof watch` at 10 Hz on 8 simulated GPUs, as % of one core.

    python benchmarks/bench_sampler.py [--seconds 20] [--repeats 3] [--interval 0.1]

Builds the simulated ``libnvidia-ml.so.1`` (tests/simnvml, gcc + nvml.h from nvidia-nvml-dev),
watches an idle command with 4 worker processes (so the host collector has a process tree to
walk), and reads the watcher process's CPU time (user + system, all its threads: sampler,
writer, output pumps) over a window that starts after start-up. The real bindings and the real
psutil run; only the driver is simulated, so the figure excludes time a real driver spends
inside NVML calls.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))

from simnvml import build_library, simnvml_env, write_scenario  # noqa: E402

CHILD = """
import multiprocessing as mp, time
def idle():
    time.sleep(3600)
if __name__ == "__main__":
    ps = [mp.get_context("fork").Process(target=idle) for _ in range(4)]
    [p.start() for p in ps]
    time.sleep(3600)
"""


def scenario() -> dict:
    return {
        "gpus": [
            {
                "gpm": True,
                "nvlink_links": 18,
                "series": {"util_gpu_pct": [(0, 30), (5, 90), (10, 20)], "pcie_tx_kb_s": 1e5},
                "processes": [{"pid": 10_000 + i, "used_mem_bytes": 2**33, "sm_util_pct": 50}],
            }
            for i in range(8)
        ]
    }


def one_run(lib: Path, seconds: float, interval: float, tmp: Path) -> tuple[float, int]:
    scen = write_scenario(tmp / "scenario.txt", scenario())
    run_dir = Path(tempfile.mkdtemp(prefix="gpuprof-sampler-bench-"))
    env = simnvml_env(lib, scen)
    env["PYTHONPATH"] = str(ROOT)
    cmd = [sys.executable, "-m", "gpuprof", "watch", "--quiet", "--interval", str(interval),
           "-o", str(run_dir), "--", sys.executable, "-c", CHILD]  # fmt: skip
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    watcher = psutil.Process(proc.pid)
    time.sleep(3.0)  # imports, NVML init, first tree walk
    c0, t0 = sum(watcher.cpu_times()[:2]), time.monotonic()
    time.sleep(seconds)
    c1, t1 = sum(watcher.cpu_times()[:2]), time.monotonic()
    for child in watcher.children(recursive=True):
        child.kill()
    proc.wait(timeout=30)
    from gpuprof import store

    gpu_rows = len(store.load_run(run_dir).gpu)
    return 100.0 * (c1 - c0) / (t1 - t0), gpu_rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--interval", type=float, default=0.1)
    args = parser.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="gpuprof-simnvml-"))
    lib = build_library(tmp)
    results = [one_run(lib, args.seconds, args.interval, tmp) for _ in range(args.repeats)]
    cpu = [r[0] for r in results]
    print(
        f"8 simulated GPUs, 4 worker processes, interval {args.interval} s, {args.seconds} s window"
    )
    print(f"watcher CPU, % of one core: median {statistics.median(cpu):.2f}  runs "
          + " ".join(f"{c:.2f}" for c in cpu))  # fmt: skip
    print(f"GPU samples stored per run: {[r[1] for r in results]}")


if __name__ == "__main__":
    main()
