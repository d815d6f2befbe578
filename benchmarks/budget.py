"""The performance budget: instructions, not seconds, so a noisy machine cannot fool it.

    python benchmarks/budget.py                  # measure, compare, exit 1 when over budget
    python benchmarks/budget.py --update --why "pandas 3.1 -> 3.2"   # move the budget

One process runs under ``valgrind --tool=callgrind`` and counts the instructions of three
regions of gpuprof's everyday path, each gated by ``sys.call_tracing`` (callgrind collects only
inside that C function, ``--toggle-collect``, and dumps when it returns, ``--dump-after``):

- ``imports``: importing the entry point, the API and the analyzers (pandas, NumPy and Arrow
  under them), what every command pays first;
- ``hooks_per_pair``: one ``with gpuprof.phase(...)`` enter and exit while recording, on the
  training thread (the writer thread stopped first, as in ``bench_hooks_instructions.py``);
- ``analyze``: ``gpuprof analyze RUN --json`` after those imports, on a fixed small simulated
  run (``gpuprof demo``'s default scenario, 8 GPUs x 3 minutes, seed 0, its kept form made by
  one analysis before, as ``watch`` leaves it), one worker: loading, every detector, the
  recommendations and the JSON.

Each is compared with ``benchmarks/budget.json``: more than ``TOLERANCE`` above its budget
fails, with the figures. A budget moves only with ``--update --why TEXT`` (the reason and the
versions measured are kept in the file; say it in docs/PERFORMANCE.md too). ``--prelude FILE``
runs a Python file in the measured process after the imports' region, before the others (the
tests slow a detector this way to show the check fails). Instruction counts depend on the
Python, NumPy, pandas and Arrow builds (the versions are printed beside the figures) and on the
vector extensions their code picks at run time; valgrind's virtual CPU offers at most AVX2 (no
AVX-512), so a host with AVX-512 counts as an AVX2 host does (NumPy picks its X86_V3 paths
under valgrind on both).
"""

from __future__ import annotations

import argparse
import compileall
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
BUDGET = ROOT / "benchmarks" / "budget.json"
TOLERANCE = 0.10
"""How far above its budget a region may go (a fraction) before the check fails."""
REGIONS = ("imports", "hooks_per_pair", "analyze")
PAIRS = 20_000
"""Enter/exit pairs in the hooks region (its count is divided by this)."""

CHILD = r"""
import importlib, os, runpy, sys
run_dir, prelude, pairs = sys.argv[1], sys.argv[2], int(sys.argv[3])

def imports():
    for name in ("gpuprof.cli", "gpuprof.api", "gpuprof.analyzers.diagnose"):
        importlib.import_module(name)

sys.call_tracing(imports, ())
if prelude:  # after the imports' region, before the others
    runpy.run_path(prelude, run_name="__prelude__")
import gpuprof
from gpuprof import hooks
gpuprof.init(os.path.join(os.getcwd(), "hooks-run"))  # removed with the cwd
recorder = hooks._recorder
recorder.stop.set()  # the training thread's cost only
recorder.thread.join()

def pairs_loop():
    phase = gpuprof.phase
    for _ in range(pairs):
        with phase("rollout"):
            pass

sys.call_tracing(pairs_loop, ())
sys.argv = ["gpuprof", "analyze", run_dir, "--json"]
sys.stdout = open(os.devnull, "w")
sys.call_tracing(runpy.run_module, ("gpuprof", None, "__main__", True))
"""


def make_run(path: Path) -> Path:
    """The fixed small run, analysed once so that its kept form exists (as after ``watch``)."""
    if not path.exists():
        from gpuprof import api

        api.demo(path, scenario="default", gpus=8, duration_s=180.0, seed=0)
        first = subprocess.run([sys.executable, "-m", "gpuprof", "analyze", str(path), "--json"],
                               capture_output=True, text=True, env=_env())  # fmt: skip
        if first.returncode != 0:
            raise SystemExit(f"budget: the first analysis failed: {first.stderr.strip()[-300:]}")
    return path


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("GPUPROF_")}
    env.update(GPUPROF_WORKERS="1", PYTHONHASHSEED="0")
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    return env


def _totals(out: Path) -> list[int]:
    """The instruction totals of callgrind's dumps ``out.1``, ``out.2``... in order (the last
    region may end in the final dump, ``out`` itself: added to it)."""
    parts = sorted(out.parent.glob(out.name + ".*"), key=lambda p: int(p.suffix[1:]))
    totals = [_total(p) for p in parts]
    if out.exists() and totals:
        totals[-1] += _total(out)
    return totals


def _total(path: Path) -> int:
    match = re.search(r"^totals:\s*(\d+)", path.read_text(errors="replace"), re.MULTILINE)
    return int(match.group(1)) if match else 0


def measure(run_dir: Path, prelude: Path | None = None) -> dict[str, float]:
    """Instructions of each region (`REGIONS`), from one process under callgrind."""
    valgrind = shutil.which("valgrind")
    if valgrind is None:
        raise SystemExit("budget: valgrind is not installed (Debian: apt-get install valgrind)")
    # gpuprof's modules read from bytecode, as installed: compiling them is not the imports'
    # cost (and PYTHONDONTWRITEBYTECODE would make every measured process compile them again)
    compileall.compile_dir(ROOT / "gpuprof", quiet=2, workers=1)
    with tempfile.TemporaryDirectory(prefix="gpuprof-budget-") as tmp:
        out = Path(tmp) / "callgrind.out"
        script = Path(tmp) / "child.py"
        script.write_text(CHILD)
        cmd = [valgrind, "--tool=callgrind", "--collect-atstart=no",
               "--toggle-collect=sys_call_tracing", "--dump-after=sys_call_tracing",
               f"--callgrind-out-file={out}", os.path.realpath(sys.executable), str(script),
               str(run_dir), str(prelude or ""), str(PAIRS)]  # fmt: skip
        done = subprocess.run(cmd, capture_output=True, text=True, env=_env(), cwd=tmp)
        if done.returncode != 0:
            said = [ln for ln in done.stderr.splitlines() if ln.strip() and not ln.startswith("==")]
            last = said[-1] if said else f"exit {done.returncode}"
            raise SystemExit(f"budget: the measured process failed: {last}")
        totals = _totals(out)
    if len(totals) != len(REGIONS) or not all(totals):
        raise SystemExit(f"budget: expected {len(REGIONS)} regions with instructions, got "
                         f"{totals} (a Python without the sys_call_tracing symbol?)")  # fmt: skip
    imports, pairs, analyze = totals
    return {"imports": imports, "hooks_per_pair": pairs / PAIRS, "analyze": analyze}


def _budget() -> dict:
    """The committed budget; one line and exit 1 when it is missing or not a budget."""
    try:
        recorded = json.loads(BUDGET.read_text())
        if not all(isinstance(recorded.get(r), int | float) for r in REGIONS):
            raise ValueError(f"it lacks a number for one of {', '.join(REGIONS)}")
    except (OSError, ValueError, AttributeError) as exc:
        raise SystemExit(f"budget: {BUDGET.relative_to(ROOT)} cannot be read: {exc}") from None
    return recorded


def versions() -> dict[str, str]:
    """What instruction counts depend on, besides gpuprof."""
    import numpy
    import pandas
    import pyarrow

    return {"python": sys.version.split()[0], "numpy": numpy.__version__,
            "pandas": pandas.__version__, "pyarrow": pyarrow.__version__}  # fmt: skip


def compare(measured: dict[str, float], budget: dict[str, float]) -> tuple[list[str], bool]:
    """Lines of the table and whether every region is within `TOLERANCE` of its budget."""
    lines = [f"{'region':16s} {'measured':>15s} {'budget':>15s} {'change':>8s}"]
    ok = True
    for region in REGIONS:
        got, allowed = measured[region], budget[region]
        change = got / allowed - 1.0
        verdict = ""
        if change > TOLERANCE:
            ok = False
            verdict = f"  OVER BUDGET (more than +{TOLERANCE:.0%})"
        elif change < -TOLERANCE:
            verdict = "  under budget: move it down (--update --why ...)"
        lines.append(f"{region:16s} {got:15,.0f} {allowed:15,.0f} {change:+8.1%}{verdict}")
    return lines, ok


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--update", action="store_true", help="write the measured budget")
    parser.add_argument("--why", help="the reason the budget moves (with --update)")
    parser.add_argument("--prelude", type=Path, help="a Python file run before the regions")
    parser.add_argument("--run-dir", type=Path, help="where the fixed run is kept")
    parser.add_argument("--make-run", action="store_true", help="only make the run (--run-dir)")
    args = parser.parse_args()
    if args.make_run:
        if not args.run_dir:
            parser.error("--make-run needs --run-dir")
        make_run(args.run_dir)
        return 0
    if args.update and not args.why:
        parser.error("--update needs --why: the reason the budget moves")
    recorded = {} if args.update else _budget()  # before a minute of measuring, not after
    with tempfile.TemporaryDirectory(prefix="gpuprof-budget-run-") as tmp:
        run_dir = make_run(args.run_dir or Path(tmp) / "run")
        measured = measure(run_dir, args.prelude)
    now = versions()
    if args.update:
        BUDGET.write_text(json.dumps({**measured, "versions": now, "why": args.why},
                                     indent=2) + "\n")  # fmt: skip
        print(f"budget written to {BUDGET.relative_to(ROOT)}")
        return 0
    lines, ok = compare(measured, recorded)
    print("\n".join(lines))
    print(f"measured with {now}; budget set with {recorded.get('versions')} "
          f"({recorded.get('why')})")  # fmt: skip
    if not ok:
        print(
            f"budget: over budget by more than {TOLERANCE:.0%}: make the change cheaper, or "
            "move the budget with --update --why and say why in docs/PERFORMANCE.md"
        )
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
