"""Hook cost in instructions, which the load of a shared machine does not change.

    python benchmarks/bench_hooks_instructions.py [--roots BEFORE .] [--n 100000]

`bench_hooks.py` times enter+exit pairs; on a machine other jobs keep busy its nanoseconds move
by hundreds from one run to the next. This counts the instructions the interpreter executes
instead (``valgrind --tool=callgrind``, the whole process): for each checkout and variant, a
process running ``n`` pairs and one running none, the same otherwise; the difference over
``n`` is the instructions of one pair. Variants as in `bench_hooks.py`: ``nullcontext()``,
``gpuprof.phase`` outside a run, and recording (writer thread stopped, as there: the cost on
the training thread). Instructions are not time (a cache miss costs hundreds of cycles, a
``clock_gettime`` through the vDSO few instructions), so the figure says whether a change of
the hot path does less work; the time budget is still `bench_hooks.py`'s on a quiet machine.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile

CHILD = r"""
import contextlib, sys, tempfile
import gpuprof
from gpuprof import hooks
variant, n = sys.argv[1], int(sys.argv[2])
if variant == "recording":
    gpuprof.init(tempfile.mkdtemp(prefix="gpuprof-instr-"))
    recorder = hooks._recorder
    recorder.stop.set()  # keep the writer thread out of the count
    recorder.thread.join()
stmt = ("with contextlib.nullcontext(): pass" if variant == "nullcontext"
        else 'with gpuprof.phase("rollout"): pass')
exec(compile(f"for _ in range(n):\n    {stmt}\n", "loop", "exec"),
     {"contextlib": contextlib, "gpuprof": gpuprof, "n": n})
assert (variant == "recording") == gpuprof.enabled()
import os
os._exit(0)  # no flush or teardown: the same work whatever n
"""

VARIANTS = ("nullcontext", "outside", "recording")


def instructions(root: str, variant: str, n: int) -> int:
    """Instructions (``Ir``) of one process running ``n`` pairs of ``variant``."""
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "callgrind.out")
        env = {**os.environ, "PYTHONPATH": os.path.abspath(root)}
        env.pop("GPUPROF_RUN_DIR", None)
        subprocess.run(
            ["valgrind", "--tool=callgrind", f"--callgrind-out-file={out}",
             sys.executable, "-c", CHILD, variant, str(n)],
            env=env, capture_output=True, text=True, check=True, cwd=tmp,
        )  # fmt: skip
        with open(out) as handle:
            text = handle.read()
    match = re.search(r"^summary:\s+(\d+)", text, re.MULTILINE) or re.search(
        r"^totals:\s+(\d+)", text, re.MULTILINE
    )
    if match is None:
        raise SystemExit("callgrind wrote no instruction total")
    return int(match.group(1))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--roots", nargs="+", default=["."])
    parser.add_argument("--n", type=int, default=100_000)
    args = parser.parse_args()
    print(f"{'checkout':24} {'variant':14} {'instructions/pair':>18} {'vs nullcontext':>15}")
    for root in args.roots:
        per_pair = {}
        for variant in VARIANTS:
            delta = instructions(root, variant, args.n) - instructions(root, variant, 0)
            per_pair[variant] = delta / args.n
        name = os.path.basename(os.path.abspath(root))
        for variant, value in per_pair.items():
            diff = value - per_pair["nullcontext"]
            print(f"{name:24} {variant:14} {value:18.0f} {diff:+15.0f}")


if __name__ == "__main__":
    main()
