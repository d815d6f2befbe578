"""Run tests again and again with the cores busy: the proof that a test holds under load.

    python benchmarks/under_load.py --runs 20 --spinners 2 TEST_ID [TEST_ID ...]

Starts ``--spinners`` processes that each burn a core (``while True: pass``) and keeps them
running while the given pytest node ids run ``--runs`` times in a row, each run a fresh
``python -m pytest``. Prints one line per run (passed or failed, seconds, the load average) and
the failures' output, and exits non-zero when any run failed. ``--load N`` adds spinners until
the one-minute load average reaches N (the "load 8–12" a busy CI machine shows).

``kill PID`` (SIGTERM) or Ctrl-C stops it and takes the spinners and the running pytest, with
everything it started, down too (a loop started with ``&`` from a script ignores SIGINT).
Each run's full output is kept with ``--keep DIR`` (one ``run-NN.log`` per run), and its
``tmp_path`` folders too (pytest's ``--basetemp DIR/run-NN``), to read the runs it recorded.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil

ROOT = Path(__file__).resolve().parents[1]
SPIN = "while True: pass"


def spin(count: int) -> list[subprocess.Popen]:
    """``count`` processes burning a core each."""
    return [subprocess.Popen([sys.executable, "-c", SPIN]) for _ in range(count)]


def _stop(signum, frame) -> None:
    print(f"stopped by signal {signum}", flush=True)
    raise SystemExit(128 + signum)


def _kill_tree(proc: subprocess.Popen) -> None:
    """The pytest run and everything it started (watchers, launchers, ranks), though a
    watcher puts its command in a process group of its own."""
    try:
        family = [psutil.Process(proc.pid), *psutil.Process(proc.pid).children(recursive=True)]
    except psutil.NoSuchProcess:
        family = []
    for member in family:
        with contextlib.suppress(psutil.NoSuchProcess):
            member.kill()
    proc.wait()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("tests", nargs="+", help="pytest node ids")
    parser.add_argument("--runs", type=int, default=20)
    parser.add_argument("--spinners", type=int, default=2, help="processes burning a core")
    parser.add_argument("--load", type=float, default=0.0,
                        help="add spinners until the 1-min load average reaches this")  # fmt: skip
    parser.add_argument("--keep", type=Path, help="write each run's full output here")
    args = parser.parse_args()
    signal.signal(signal.SIGTERM, _stop)
    signal.signal(signal.SIGINT, _stop)
    if args.keep:
        args.keep.mkdir(parents=True, exist_ok=True)

    spinners = spin(args.spinners)
    proc = None
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
            keep = ["--basetemp", str(args.keep / f"run-{run:02d}")] if args.keep else []
            proc = subprocess.Popen(
                [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-x", *keep,
                 *args.tests],
                cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
            )  # fmt: skip
            stdout, stderr = proc.communicate()
            took = time.monotonic() - start
            ok = proc.returncode == 0
            proc = None
            if args.keep:
                (args.keep / f"run-{run:02d}.log").write_text(stdout + "\n" + stderr)
            failed += not ok
            print(f"run {run:2d}: {'passed' if ok else 'FAILED'}  {took:5.1f} s  "
                  f"load {os.getloadavg()[0]:.1f}", flush=True)  # fmt: skip
            if not ok:
                print(stdout[-6000:], stderr[-2000:], sep="\n", flush=True)
    finally:
        if proc is not None:
            _kill_tree(proc)
        for p in spinners:
            p.kill()
        for p in spinners:
            p.wait()
    print(f"{args.runs - failed} of {args.runs} runs passed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
