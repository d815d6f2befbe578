"""Hook cost: one phase enter+exit, next to a bare context manager and torch's record_function.

    python benchmarks/bench_hooks.py [--n 20000] [--repeats 41]
    python benchmarks/bench_hooks.py --roots OLD_CHECKOUT NEW_CHECKOUT [--rounds 5]
    python benchmarks/bench_hooks.py --implementations [--rounds 5]

Each variant is timed as the statement a user writes (``with gpuprof.phase("rollout"): pass``,
compiled into a loop by `timeit`, so no helper call is counted for one variant and not for
another), ``n`` pairs per repeat; variants are interleaved repeat by repeat so machine noise hits
them alike. The table gives the median ns per pair and the difference from
``contextlib.nullcontext()``. The recording variant drains its queue between repeats (the
writer thread does that four times a second in real use) and is timed with the writer thread
idle, so the figure is the cost on the training thread; the writer's own cost per span is
reported separately (it runs in the same interpreter, off the hot path).

``--roots`` runs this benchmark in fresh processes with each checkout's ``gpuprof`` first on
the path, alternating checkouts ``--rounds`` times, and prints the median of each variant's
per-round medians per checkout: before/after figures measured side by side.
``--implementations`` does the same within this checkout for the two implementations of
`phase`: the C hot path (`gpuprof._cphase`, built by the install) and the pure-Python fallback
(``GPUPROF_PURE_PYTHON_HOOKS=1``).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import timeit


def _time(stmt: str, names: dict, n: int) -> float:
    """ns per execution of ``stmt`` (a ``with`` statement), ``n`` times in a compiled loop."""
    return timeit.timeit(stmt, globals=names, number=n) / n * 1e9


def measure(n: int, repeats: int) -> dict[str, float]:
    """Median ns per enter+exit pair of each variant (and the writer's ns per span)."""
    import gpuprof
    from gpuprof import hooks

    names = {"contextlib": contextlib, "gpuprof": gpuprof}
    variants = {
        "contextlib.nullcontext()": "with contextlib.nullcontext(): pass",
        "gpuprof.phase, outside a run": 'with gpuprof.phase("rollout"): pass',
    }
    try:
        import torch.profiler

        names["torch"] = torch
        variants["torch.profiler.record_function"] = (
            'with torch.profiler.record_function("rollout"): pass'
        )
    except ImportError:
        print("torch not installed: record_function not measured", file=sys.stderr)

    reset = getattr(hooks, "_set_recorder", None)
    run_dir = tempfile.mkdtemp(prefix="gpuprof-bench-")
    results: dict[str, list[float]] = {name: [] for name in variants}
    results["gpuprof.phase, recording"] = []
    writer_ns: list[float] = []
    for _ in range(repeats):
        if reset is not None:
            reset(None)  # outside a run
        else:  # a checkout from before `_set_recorder`
            hooks._recorder, hooks._checked = None, True
        for name, stmt in variants.items():
            results[name].append(_time(stmt, names, n))
        gpuprof.init(run_dir)
        recorder = hooks._recorder
        recorder.stop.set()  # keep the writer thread out of the timed loop
        recorder.thread.join()
        results["gpuprof.phase, recording"].append(
            _time('with gpuprof.phase("rollout"): pass', names, n)
        )
        queued = len(recorder.spans)
        t0 = time.perf_counter_ns()
        recorder.flush()
        writer_ns.append((time.perf_counter_ns() - t0) / max(queued, 1))
        gpuprof.shutdown()
    medians = {name: statistics.median(values) for name, values in results.items()}
    medians["writer thread, per span (off path)"] = statistics.median(writer_ns)
    return medians


def _print(medians: dict[str, float], title: str = "variant") -> None:
    base = medians["contextlib.nullcontext()"]
    print(f"{title:34s} {'median ns/pair':>15s} {'vs nullcontext':>15s}")
    for name, value in medians.items():
        diff = "" if name.startswith("writer") else f"{value - base:+15.0f}"
        print(f"{name:34s} {value:15.0f} {diff}")


def compare(setups: dict[str, dict[str, str]], rounds: int, n: int, repeats: int) -> None:
    """Each setup (a title and the environment it adds) in a fresh process, alternately."""
    per_setup: dict[str, list[dict[str, float]]] = {title: [] for title in setups}
    for _ in range(rounds):
        for title, extra in setups.items():
            env = {**os.environ, **extra}
            env.pop("GPUPROF_RUN_DIR", None)
            out = subprocess.run(
                [sys.executable, __file__, "--json", "--n", str(n), "--repeats", str(repeats)],
                env=env, capture_output=True, text=True, check=True, cwd=tempfile.gettempdir(),
            )  # fmt: skip
            per_setup[title].append(json.loads(out.stdout))
    for title, runs in per_setup.items():
        medians = {name: statistics.median(run[name] for run in runs) for name in runs[0]}
        _print(medians, title=title)
        print()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=20_000)
    parser.add_argument("--repeats", type=int, default=41)
    parser.add_argument("--roots", nargs="+", help="checkouts to compare, side by side")
    parser.add_argument(
        "--implementations", action="store_true",
        help="compare the C hot path of `phase` with the pure-Python fallback",
    )  # fmt: skip
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--json", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.roots:
        setups = {
            os.path.basename(os.path.abspath(root)) or root: {"PYTHONPATH": os.path.abspath(root)}
            for root in args.roots
        }
        compare(setups, args.rounds, args.n, args.repeats)
        return
    if args.implementations:
        here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
        setups = {
            "pure Python": {"PYTHONPATH": here, "GPUPROF_PURE_PYTHON_HOOKS": "1"},
            "C hot path": {"PYTHONPATH": here, "GPUPROF_PURE_PYTHON_HOOKS": ""},
        }
        compare(setups, args.rounds, args.n, args.repeats)
        return
    medians = measure(args.n, args.repeats)
    if args.json:
        print(json.dumps(medians))
    else:
        _print(medians)


if __name__ == "__main__":
    main()
