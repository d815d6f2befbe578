"""Speed and memory of `diagnose` (what `gpuprof analyze` runs) at several run sizes.

    python benchmarks/bench_analyze.py [--gpus 8] [--hours 0.25 0.5 1 2] [--repeats 3]

Each size is a simulated GRPO run (`gpuprof.sim`, GPU samples every 0.1 s, host every 0.5 s,
with two pathologies) generated in a fresh subprocess; the subprocess times `diagnose(run)`
(alignment, every detector, recommendations, summary). Memory is that process's own: its RSS
holding the simulated run just before `diagnose`, and its peak RSS during `diagnose` (the
high-water mark reset to the current RSS just before, `measure.reset_hwm`; so the simulation's
own peak is not counted). The table gives the median time, time per million GPU samples (flat
when cost grows linearly), the run's RSS and the peak. Target (issue 3): 1 h x 8 GPUs at 10 Hz
(~288 000 GPU samples) in <= 2 s.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

CHILD = """
import gc, json, sys, time
sys.path[:0] = [{root!r}, {root!r} + "/benchmarks"]
import measure
from gpuprof.analyzers.diagnose import diagnose
from gpuprof.sim import Pathology, SimConfig, simulate
from gpuprof.sim.config import DEFAULT_PHASE_S
hours, gpus = float(sys.argv[1]), int(sys.argv[2])
step_s = sum(v for k, v in DEFAULT_PHASE_S.items() if k not in ("values", "update_critic"))
cfg = SimConfig(gpus=gpus, steps=max(1, round(hours * 3600 / step_s)), seed=1,
                pathologies=[Pathology("reward_bound", 0.6), Pathology("reshard_idle", 0.5)])
run = simulate(cfg).run
gc.collect()
held = measure.rss_bytes()
if not measure.reset_hwm():
    raise SystemExit("cannot reset the high-water mark (/proc/self/clear_refs)")
t0 = time.perf_counter()
d = diagnose(run)
elapsed = time.perf_counter() - t0
print(json.dumps({{"samples": len(run.gpu), "spans": len(run.spans), "s": elapsed,
                  "held": held, "rss": measure.hwm_bytes(),
                  "findings": [f.kind for f in d.findings]}}))
"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gpus", type=int, default=8)
    parser.add_argument(
        "--hours", type=float, nargs="+", default=[0.25, 0.5, 1.0, 2.0],
        help="nominal run lengths; the table shows the simulated length",
    )  # fmt: skip
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    code = CHILD.format(root=str(ROOT))
    print(f"{'hours':>6s} {'GPUs':>5s} {'GPU samples':>12s} {'spans':>7s} {'median s':>9s} "
          f"{'s / M samples':>14s} {'run RSS MB':>11s} {'peak RSS MB':>12s}")  # fmt: skip
    for hours in args.hours:
        results = []
        for _ in range(args.repeats):
            out = subprocess.run([sys.executable, "-c", code, str(hours), str(args.gpus)],
                                 capture_output=True, text=True, check=True)  # fmt: skip
            results.append(json.loads(out.stdout.strip().splitlines()[-1]))
        t = statistics.median(r["s"] for r in results)
        n = results[0]["samples"]
        held = statistics.median(r["held"] for r in results) / 2**20
        rss = statistics.median(r["rss"] for r in results) / 2**20
        run_hours = n / args.gpus * 0.1 / 3600  # the simulated length (pathologies add time)
        print(f"{run_hours:6.2f} {args.gpus:5d} {n:12,d} {results[0]['spans']:7,d} {t:9.2f} "
              f"{t / (n / 1e6):14.2f} {held:11.0f} {rss:12.0f}")  # fmt: skip


if __name__ == "__main__":
    main()
