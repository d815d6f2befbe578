"""Run tests again and again with the cores busy: the proof that a test holds under load.

    python benchmarks/under_load.py --runs 20 --spinners 2 TEST_ID [TEST_ID ...]

Starts ``--spinners`` processes that each burn a core (``while True: pass``) and keeps them
running while the given pytest node ids run ``--runs`` times in a row, each run a fresh
``python -m pytest``. Prints one line per run (passed or failed, seconds, the load average) and
the failures' output, and exits non-zero when any run failed. ``--load N`` adds spinners until
the one-minute load average reaches N (the "load 8–12" a busy CI machine shows).
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SPIN = "while True: pass"


def spin(count: int) -> list[subprocess.Popen]:
    """``count`` processes burning a core each."""
    return [subprocess.Popen([sys.executable, "-c", SPIN]) for _ in range(count)]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("tests", nargs="+", help="pytest node ids")
    parser.add_argument("--runs", type=int, default=20)
    parser.add_argument("--spinners", type=int, default=2, help="processes burning a core")
    parser.add_argument("--load", type=float, default=0.0,
                        help="add spinners until the 1-min load average reaches this")  # fmt: skip
    args = parser.parse_args()

    spinners = spin(args.spinners)
    failed = 0
    try:
        if args.load:
            deadline = time.monotonic() + 90
            while os.getloadavg()[0] < args.load and time.monotonic() < deadline:
                if len(spinners) < 4 * args.load:
                    spinners += spin(1)
                time.sleep(5)
        print(f"{len(spinners)} spinners, load {os.getloadavg()[0]:.1f}", flush=True)
        for run in range(1, args.runs + 1):
            start = time.monotonic()
            proc = subprocess.run(
                [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-x",
                 *args.tests],
                cwd=ROOT, capture_output=True, text=True,
            )  # fmt: skip
            took = time.monotonic() - start
            ok = proc.returncode == 0
            failed += not ok
            print(f"run {run:2d}: {'passed' if ok else 'FAILED'}  {took:5.1f} s  "
                  f"load {os.getloadavg()[0]:.1f}", flush=True)  # fmt: skip
            if not ok:
                print(proc.stdout[-6000:], proc.stderr[-2000:], sep="\n", flush=True)
    finally:
        for p in spinners:
            p.kill()
        for p in spinners:
            p.wait()
    print(f"{args.runs - failed} of {args.runs} runs passed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
