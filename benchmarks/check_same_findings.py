"""Do two checkouts diagnose the same runs identically? For speed work that must not change
a finding: the ``analyze --json`` documents (and optionally the HTML reports) of one checkout
against another's, on

- the whole-process benchmark's run (``bench_analyze_process.py``, 1 h x 8 GPUs);
- every case of the labelled corpus (``diagnosis_labelled.py``): each file imported once, by
  the ``--before`` checkout, then analysed by both through the CLI;
- the simulator's scenarios of ``diagnosis.py`` (``diagnose(run).to_dict()`` in one process
  per checkout), as simulated and, with ``--merge N``, written and loaded with N samples merged;
- with ``--reports N``, the HTML reports (``gpuprof report``) of the first N run directories.

    python benchmarks/check_same_findings.py --before CHECKOUT [--after CHECKOUT]
        [--scenarios 240] [--seed 0] [--merge 10] [--work /tmp/gpuprof-same] [--reports N]
        [--skip bench,labelled,sim] [--tolerance REL]

Prints each document that differs (the first differing line) and a count; exits 1 on any
difference. With ``--tolerance REL``, documents that differ only in numbers within REL of
each other (floating-point sums taken in another order) are counted apart, and only a larger
difference (text, a count, a number further apart: a rounded figure that moved) fails.
The run directories of the corpus are kept under ``--work`` and reused.
"""

from __future__ import annotations

import argparse
import difflib
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
BENCH_RUN = Path("/tmp/gpuprof-process/8gpu-1h")

_SIM = r"""
import dataclasses, json, sys, tempfile
sys.path[:0] = [{root!r}, {bench!r}]
from diagnosis import scenarios
from gpuprof import store
from gpuprof.analyzers.diagnose import diagnose
from gpuprof.loader import load_for_analysis
from gpuprof.reports.terminal import render_json
from gpuprof.sim import simulate
with open({out!r}, "w") as out:
    for i, (group, cfg) in enumerate(scenarios({n}, {seed})):
        run = simulate(cfg).run
        out.write(json.dumps([i, "whole", render_json(diagnose(run).to_dict())]) + "\n")
        if {merge} > 1:
            with tempfile.TemporaryDirectory() as tmp:
                store.save_run(run, tmp)
                merged = load_for_analysis(tmp, merge={merge})
            doc = render_json(diagnose(merged).to_dict())
            out.write(json.dumps([i, "merged", doc]) + "\n")
"""


def cli(root: Path, *args: str) -> subprocess.CompletedProcess:
    """``python -m gpuprof ARGS`` run from ``root`` (``-m`` puts it first on sys.path)."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    return subprocess.run([sys.executable, "-m", "gpuprof", *args], capture_output=True,
                          text=True, timeout=900, cwd=root, env=env)  # fmt: skip


def first_difference(a: str, b: str) -> str:
    for line in difflib.unified_diff(a.splitlines(), b.splitlines(), lineterm="", n=0):
        if line.startswith(("-", "+")) and not line.startswith(("---", "+++")):
            return line[:300]
    return "(whitespace only)"


def corpus_runs(before: Path, work: Path) -> list[tuple[str, Path]]:
    """Every labelled case as a run directory under ``work`` (made once, by ``before``)."""
    sys.path.insert(0, str(ROOT / "benchmarks"))
    import diagnosis_labelled as dl

    dl.SRC = before
    cases = [(n, m) for n, m, _ in dl.CASES] + [(n, m) for n, m, _, _ in dl.public_cases()]
    runs = []
    for i, (name, make) in enumerate(cases):
        if name.startswith("fixture") and not dl.FIXTURES.is_dir():
            continue
        target = work / f"case{i:03d}"
        if not (target / "run").is_dir():
            target.mkdir(parents=True, exist_ok=True)
            try:
                make(target)
            except dl.ImportRejected:
                continue  # rejected by the import: nothing to analyse
        if (target / "run").is_dir():
            runs.append((name, target / "run"))
    return runs


TOLERANCE: float | None = None
"""``--tolerance``: numbers within this relative difference count as the same."""
NEAR: list[str] = []
"""Documents that differed only within `TOLERANCE`."""


def compare(label: str, a: str, b: str, diffs: list[str]) -> None:
    if a == b:
        return
    if TOLERANCE is not None:
        far = far_apart(_json(a), _json(b), TOLERANCE)
        if far is None:
            NEAR.append(label)
            return
        diffs.append(label)
        print(f"DIFFERS {label}: {far}")
        return
    diffs.append(label)
    print(f"DIFFERS {label}: {first_difference(a, b)}")


def _json(text: str):
    """A document as compared: the JSON after ``rc=N``, or the text when it is no JSON."""
    head, _, body = text.partition("\n") if text.startswith("rc=") else ("", "", text)
    try:
        return [head, json.loads(body)]
    except ValueError:
        return [head, body]


def far_apart(a, b, tol: float, path: str = ""):
    """Where ``a`` and ``b`` differ by more than ``tol`` (relative, for numbers), or None."""
    if isinstance(a, dict) and isinstance(b, dict):
        if list(a) != list(b):
            return f"{path}: keys differ"
        return next((d for k in a if (d := far_apart(a[k], b[k], tol, f"{path}.{k}"))), None)
    if isinstance(a, list) and isinstance(b, list):
        if len(a) != len(b):
            return f"{path}: {len(a)} items != {len(b)}"
        pairs = enumerate(zip(a, b))
        return next((d for i, (x, y) in pairs if (d := far_apart(x, y, tol, f"{path}[{i}]"))),
                    None)  # fmt: skip
    numbers = (int, float)
    if isinstance(a, numbers) and isinstance(b, numbers) and not isinstance(a, bool):
        if a == b or abs(a - b) <= tol * max(abs(a), abs(b)):
            return None
        return f"{path}: {a!r} != {b!r}"
    return None if a == b else f"{path}: {str(a)[:80]!r} != {str(b)[:80]!r}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--before", type=Path, required=True)
    parser.add_argument("--after", type=Path, default=ROOT)
    parser.add_argument("--scenarios", type=int, default=240)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--merge", type=int, default=10)
    parser.add_argument("--work", type=Path, default=Path("/tmp/gpuprof-same"))
    parser.add_argument(
        "--reports",
        type=int,
        default=0,
        metavar="N",
        help="also compare the HTML reports of the first N run directories",
    )
    parser.add_argument("--skip", default="", help="comma-separated: bench, labelled, sim")
    parser.add_argument("--tolerance", type=float, default=None, metavar="REL")
    args = parser.parse_args()
    global TOLERANCE
    TOLERANCE = args.tolerance
    sys.stdout.reconfigure(line_buffering=True)
    roots = [args.before.resolve(), args.after.resolve()]
    skip = set(filter(None, args.skip.split(",")))
    args.work.mkdir(parents=True, exist_ok=True)
    diffs: list[str] = []
    checked = 0

    runs: list[tuple[str, Path]] = []
    if "bench" not in skip and BENCH_RUN.is_dir():
        runs.append(("bench 8gpu-1h", BENCH_RUN))
    if "labelled" not in skip:
        runs += corpus_runs(roots[0], args.work / "labelled")
    for i, (name, run) in enumerate(runs):
        outs = [cli(r, "analyze", str(run), "--json") for r in roots]
        a, b = (f"rc={p.returncode}\n{p.stdout}" for p in outs)
        compare(f"analyze {name}", a, b, diffs)
        checked += 1
        if i < args.reports:
            with tempfile.TemporaryDirectory() as tmp:
                pages = []
                for i, r in enumerate(roots):
                    path = Path(tmp) / f"{i}.html"
                    proc = cli(r, "report", str(run), "-o", str(path))
                    pages.append(path.read_text() if path.exists() else f"rc={proc.returncode}")
                compare(f"report {name}", *pages, diffs)
                checked += 1
    print(f"{len(runs)} run directories analysed")

    if "sim" not in skip:
        docs = []
        for i, r in enumerate(roots):
            out = args.work / f"sim-{i}.jsonl"
            code = _SIM.format(root=str(r), bench=str(r / "benchmarks"), out=str(out),
                               n=args.scenarios, seed=args.seed, merge=args.merge)  # fmt: skip
            env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
            subprocess.run([sys.executable, "-c", code], check=True, cwd=r, env=env)
            docs.append([json.loads(line) for line in out.read_text().splitlines()])
        if len(docs[0]) != len(docs[1]):
            diffs.append("simulator: different document counts")
        for (i, how, a), (_, _, b) in zip(*docs):
            compare(f"scenario {i} ({how})", a, b, diffs)
            checked += 1
        print(f"{len(docs[0])} simulator documents ({args.scenarios} scenarios, seed {args.seed})")

    near = f", {len(NEAR)} only within the tolerance" if TOLERANCE is not None else ""
    print(f"{checked} documents compared, {len(diffs)} differ{near}")
    sys.exit(1 if diffs else 0)


if __name__ == "__main__":
    main()
