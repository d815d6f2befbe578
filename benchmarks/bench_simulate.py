"""The simulator writing a run directory: wall time, CPU and peak memory of that process alone.

    python benchmarks/bench_simulate.py [--sizes 8x1 8x6 8x24 64x1 256x1 1024x0.25]
                                        [--repeats 3] [--dir /tmp/gpuprof-sim]
                                        [--whole] [--whole-max-samples 4000000]
                                        [--roots OTHER_CHECKOUT ...]

Each size ``GPUSxHOURS`` is the run ``gpuprof demo --gpus GPUS --duration HOURS*3600``
simulates (the default scenario: reward-bound, reshard and memory-headroom stalls; GPU samples
every 0.1 s, host and process samples every 0.5 s, 8 GPUs a node), written as a run directory
by a fresh process: ``stream`` is `gpuprof.sim.simulate_to` (one host file at a time, one
GPU's samples at a time); ``--whole`` adds ``whole``, what ``demo`` did before it: the run
made in memory (`simulate`) and then written (`store.save_run`), for sizes up to
``--whole-max-samples`` GPU samples (it needs ~0.9 KB a sample). ``--roots`` runs the same
on other checkouts (``whole`` only where a checkout has no `simulate_to`).

Each figure is the process's own (`measure.run`: started from a small spawner, so the peak
RSS is that process's high-water mark, not this benchmark's): wall and CPU seconds of the
whole process, CPU µs per GPU sample of the simulation and writing alone (imports excluded;
on a shared machine CPU time is the steadier figure). Repeats are interleaved across sizes
and modes; the table gives medians, and the directory is deleted after each run.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "benchmarks"))

import measure  # noqa: E402

CHILD = """
import json, os, sys, time
mode, gpus, seconds, out = sys.argv[1], int(sys.argv[2]), float(sys.argv[3]), sys.argv[4]
t0 = time.perf_counter()
from gpuprof import store
from gpuprof.sim import Pathology, SimConfig
from gpuprof.sim.config import DEFAULT_PHASE_S
imported = time.perf_counter() - t0
# the run `gpuprof demo --gpus GPUS --duration SECONDS` simulates (api.demo)
step_s = sum(v for k, v in DEFAULT_PHASE_S.items() if k not in ("values", "update_critic"))
steps = max(3, round(seconds / step_s))
cfg = SimConfig(gpus=gpus, steps=steps, time_scale=seconds / (steps * step_s), seed=0,
                pathologies=[Pathology("reward_bound", 0.7), Pathology("reshard_idle", 0.6),
                             Pathology("memory_headroom", 0.6)])
t1, c1 = time.perf_counter(), time.process_time()
if mode == "stream":
    from gpuprof.sim import simulate_to
    samples = simulate_to(cfg, out).gpu_samples
else:
    from gpuprof.sim import simulate
    run = simulate(cfg).run
    samples = len(run.gpu)
    store.save_run(run, out)
took, cpu = time.perf_counter() - t1, time.process_time() - c1
size = sum(p.stat().st_size for p in os.scandir(out))
print(json.dumps({"samples": samples, "s": took, "sim_cpu": cpu, "import_s": imported,
                  "bytes": size}))
"""


def parse_size(text: str) -> tuple[int, float]:
    gpus, hours = text.lower().split("x")
    return int(gpus), float(hours)


def has_stream(root: Path) -> bool:
    return "def simulate_to(" in (root / "gpuprof/sim/cluster.py").read_text()


def one(root: Path, mode: str, gpus: int, hours: float, work: Path) -> dict:
    out = work / "run"
    shutil.rmtree(out, ignore_errors=True)
    env = {k: v for k, v in os.environ.items() if not k.startswith("GPUPROF_")}
    env["PYTHONPATH"] = str(root)
    argv = [sys.executable, "-c", CHILD, mode, str(gpus), str(hours * 3600), str(out)]
    try:
        r = measure.run(argv, cwd=work, env=env)
    finally:
        shutil.rmtree(out, ignore_errors=True)
    doc = json.loads(r["stdout"].decode().strip().splitlines()[-1])
    doc.update(wall=r["wall_s"], cpu=r["user_s"] + r["sys_s"], rss=r["peak_rss_bytes"])
    return doc


def machine() -> str:
    model = "unknown CPU"
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            model = line.split(":", 1)[1].strip()
            break
    return f"{os.cpu_count()} CPUs ({model}), CPython {platform.python_version()}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", nargs="+", default=["8x1", "8x6", "8x24", "64x1", "256x1",
                                                       "1024x0.25"])  # fmt: skip
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--dir", type=Path, default=Path("/tmp/gpuprof-sim"))
    parser.add_argument("--whole", action="store_true", help="also simulate + save_run")
    parser.add_argument("--whole-max-samples", type=int, default=4_000_000)
    parser.add_argument("--roots", type=Path, nargs="*", default=[])
    args = parser.parse_args()
    args.dir.mkdir(parents=True, exist_ok=True)
    sizes = [parse_size(s) for s in args.sizes]
    cases = []  # (label, root, mode, gpus, hours)
    for root in [ROOT, *args.roots]:
        label = "this" if root == ROOT else str(root)
        modes = ["stream"] if has_stream(root) else []
        if args.whole or not modes:
            modes.append("whole")
        for gpus, hours in sizes:
            for mode in modes:
                samples = gpus * hours * 36_000
                if mode == "whole" and samples > args.whole_max_samples:
                    continue
                cases.append((label, root, mode, gpus, hours))
    print(machine())
    load0 = os.getloadavg()
    results: dict[tuple, list[dict]] = {c: [] for c in cases}
    for _ in range(args.repeats):  # interleaved: every case once per round
        for case in cases:
            label, root, mode, gpus, hours = case
            results[case].append(one(root, mode, gpus, hours, args.dir))
            r = results[case][-1]
            print(f"  {label} {mode} {gpus}x{hours:g} h: {r['wall']:.1f} s, "
                  f"{measure.mb(r['rss'])} MB", flush=True)  # fmt: skip
    load1 = os.getloadavg()
    print(f"load average {load0[0]:.1f} before, {load1[0]:.1f} after (1-minute)")
    print(f"{'checkout':>8s} {'mode':>6s} {'GPUs':>5s} {'hours':>6s} {'GPU samples':>12s} "
          f"{'wall s':>8s} {'cpu s':>7s} {'CPU µs/sample':>14s} {'peak RSS MB':>12s} "
          f"{'files MB':>9s}")  # fmt: skip
    for case, rs in results.items():
        label, _, mode, gpus, hours = case
        wall = statistics.median(r["wall"] for r in rs)
        cpu = statistics.median(r["cpu"] for r in rs)
        sim = statistics.median(r["sim_cpu"] for r in rs)
        n = rs[0]["samples"]
        print(f"{label[-8:]:>8s} {mode:>6s} {gpus:5d} {hours:6g} {n:12,d} {wall:8.1f} {cpu:7.1f} "
              f"{sim / n * 1e6:14.2f} {statistics.median(r['rss'] for r in rs) / 2**20:12,.0f} "
              f"{rs[0]['bytes'] / 2**20:9,.0f}")  # fmt: skip


if __name__ == "__main__":
    main()
