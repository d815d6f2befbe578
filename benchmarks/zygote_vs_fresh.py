"""What the tests' zygote saves per command: ``python -m gpuprof`` forked from it against a fresh
process, side by side.

    python benchmarks/zygote_vs_fresh.py [--rounds 7]

Makes a 60-second demo run of eight GPUs, then runs each command ``--rounds`` times both ways,
alternating (the zygote's way, then the fresh process), and prints the median wall seconds of
each and their ratio. Run from the repository root; uses the tests' own helpers.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

import conftest  # the tests' run_gpuprof and its zygote


def timed(args: list[str], fresh: bool) -> float:
    os.environ["FRESH_GPUPROF_PROCESSES"] = "1" if fresh else "0"
    started = time.perf_counter()
    result = conftest.run_gpuprof(*args)
    elapsed = time.perf_counter() - started
    if result.returncode != 0:
        raise SystemExit(f"{args}: exit {result.returncode}: {result.stderr[-300:]}")
    return elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=7)
    rounds = parser.parse_args().rounds
    with tempfile.TemporaryDirectory() as folder:
        run = str(Path(folder, "demo"))
        timed(["demo", "-o", run, "--duration", "60"], fresh=False)  # starts the zygote too
        commands = (["--help"], ["summary", run], ["analyze", run, "--json"],
                    ["report", run, "-o", str(Path(folder, "r.html"))])  # fmt: skip
        print(f"{'command':<16} {'zygote s':>9} {'fresh s':>8} {'saved s':>8}")
        for args in commands:
            forked, fresh = [], []
            for _ in range(rounds):
                forked.append(timed(args, fresh=False))
                fresh.append(timed(args, fresh=True))
            a, b = statistics.median(forked), statistics.median(fresh)
            print(f"{args[0]:<16} {a:9.3f} {b:8.3f} {b - a:8.3f}")


if __name__ == "__main__":
    main()
