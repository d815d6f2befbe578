"""What ``import gpuprof`` costs a training process: time, RSS, and the modules it brings.

    python benchmarks/bench_hook_import.py [--repeats 21] [--roots OLD NEW ...] [--recording]

Every training script with hooks imports gpuprof, in every Ray worker and data-loader process,
watched or not. Each repeat starts a fresh interpreter (nothing cached in memory between them
but the OS page cache, warm for all alike) that imports gpuprof, enters and leaves one phase and
records a step, outside any run, and reports from inside itself: the wall time of those lines,
its own RSS before and after them (``VmRSS`` of /proc/self/status: the measured process alone),
and which of pandas, pyarrow, numpy and sqlite3 were loaded. Checkouts given with ``--roots``
are measured alternately, repeat by repeat; the table gives medians. With ``--recording`` the
process is inside a run (``GPUPROF_RUN_DIR`` set: a rank or Ray worker of a watched run), so
its first phase also opens its run file and its span and step are written when it exits.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

CHILD = """
import json, sys, time

def rss_kb():
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])

rss0 = rss_kb()
t0 = time.perf_counter()
import gpuprof
with gpuprof.phase("rollout"):
    pass
gpuprof.step(tokens=1)
dt = time.perf_counter() - t0
heavy = sorted({m.split(".")[0] for m in sys.modules} & {"pandas", "pyarrow", "numpy", "sqlite3"})
print(json.dumps({"s": dt, "rss_kb": rss_kb() - rss0, "heavy": heavy,
                  "gpuprof": gpuprof.__file__}))
"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=21)
    parser.add_argument("--roots", nargs="+", default=[str(ROOT)])
    parser.add_argument("--recording", action="store_true", help="inside a run")
    args = parser.parse_args()
    results: dict[str, list[dict]] = {root: [] for root in args.roots}
    for _ in range(args.repeats):
        for root in args.roots:
            env = {k: v for k, v in os.environ.items() if not k.startswith("GPUPROF_")}
            env["PYTHONPATH"] = os.path.abspath(root)
            with tempfile.TemporaryDirectory(prefix="gpuprof-import-") as run_dir:
                if args.recording:
                    env["GPUPROF_RUN_DIR"] = run_dir
                out = subprocess.run([sys.executable, "-c", CHILD], env=env, capture_output=True,
                                     text=True, check=True, cwd=tempfile.gettempdir())  # fmt: skip
                if args.recording:
                    assert list(Path(run_dir).glob("*.sqlite")), "nothing recorded"
            results[root].append(json.loads(out.stdout))
    print(f"{'checkout':30s} {'import+hooks ms':>16s} {'RSS +MB':>8s}  data libraries loaded")
    for root, runs in results.items():
        assert all(Path(r["gpuprof"]).is_relative_to(os.path.abspath(root)) for r in runs)
        ms = statistics.median(r["s"] for r in runs) * 1e3
        mb = statistics.median(r["rss_kb"] for r in runs) / 1024
        heavy = ", ".join(runs[0]["heavy"]) or "none"
        print(f"{os.path.basename(os.path.abspath(root)):30s} {ms:16.1f} {mb:8.1f}  {heavy}")


if __name__ == "__main__":
    main()
