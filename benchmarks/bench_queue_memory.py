"""Memory of a process whose hooks record faster than their writer commits.

    python benchmarks/bench_queue_memory.py [--seconds 20]
    GPUPROF_PURE_PYTHON_HOOKS=1 python benchmarks/bench_queue_memory.py   # without the C part

A Python process records empty phases in a tight loop (over a million a second on one core,
about five times what one SQLite writer commits) for ``--seconds``, recording into a run of its
own; its RSS is read from /proc at fixed times. Variants: the default queue bound
(`hooks.MAX_QUEUED_SPANS`), a bound of 100 000 (``GPUPROF_MAX_QUEUED_SPANS``), and a loop paced
at 10 000 spans/s that the writer keeps up with. Reported per variant: RSS (MB) at each time,
spans made, spans committed and spans the run says were dropped. A flat RSS once the bound is
reached is the point; without a bound the queue grew by ~100 MB per million spans.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from gpuprof import store  # noqa: E402

PRODUCER = textwrap.dedent(
    """
    import sys, time, gpuprof
    seconds, pace = float(sys.argv[1]), float(sys.argv[2])
    phase, made = gpuprof.phase, 0
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        for _ in range(1000):
            with phase("update"):
                pass
        made += 1000
        if pace:
            time.sleep(1000 / pace)
    print(made, flush=True)
    """
)


def rss_mb(pid: int) -> float:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return float("nan")


def run(tmp: Path, name: str, seconds: float, pace: float, bound: int | None) -> dict:
    # GPUPROF_PURE_PYTHON_HOOKS passes: the same figures for the hooks' pure-Python fallback
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith("GPUPROF_") or k == "GPUPROF_PURE_PYTHON_HOOKS"
    }
    env["PYTHONPATH"] = str(ROOT)
    env["GPUPROF_RUN_DIR"] = str(tmp / name)
    if bound:
        env["GPUPROF_MAX_QUEUED_SPANS"] = str(bound)
    proc = subprocess.Popen([sys.executable, "-c", PRODUCER, str(seconds), str(pace)],
                            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, env=env,
                            text=True)  # fmt: skip
    marks = [t for t in (1, 2, 5, 10, 20, 40) if t < seconds] + [seconds - 0.2]
    started, rss = time.monotonic(), []
    for t in marks:
        time.sleep(max(0.0, started + t - time.monotonic()))
        rss.append((t, rss_mb(proc.pid)))
    made = int(proc.communicate(timeout=600)[0].strip())
    loaded = store.load_run(tmp / name)
    dropped = loaded.events[loaded.events["kind"] == "dropped"]
    n_dropped = max((a.get("spans", 0) for a in dropped["attrs"]), default=0)
    return {"rss": rss, "made": made, "committed": len(loaded.spans), "dropped": n_dropped}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seconds", type=float, default=20.0)
    args = parser.parse_args()
    variants = [
        ("tight loop, default bound", 0.0, None),
        ("tight loop, bound 100 000", 0.0, 100_000),
        ("10 000 spans/s, default bound", 10_000.0, None),
    ]
    with tempfile.TemporaryDirectory() as name:
        for i, (label, pace, bound) in enumerate(variants):
            r = run(Path(name), f"v{i}", args.seconds, pace, bound)
            curve = "  ".join(f"{t:g}s {mb:.0f}" for t, mb in r["rss"])
            print(f"{label}: RSS MB {curve} | made {r['made']:,} committed {r['committed']:,} "
                  f"dropped {r['dropped']:,}", flush=True)  # fmt: skip


if __name__ == "__main__":
    main()
