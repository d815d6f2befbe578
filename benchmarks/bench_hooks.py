"""Hook cost: one phase enter+exit, next to a bare context manager and torch's record_function.

    python benchmarks/bench_hooks.py [--n 20000] [--repeats 41]

Each variant runs ``n`` enter/exit pairs per repeat; variants are interleaved repeat by repeat
so machine noise hits them alike; the table gives the median ns per pair and the difference
from ``contextlib.nullcontext()``. The recording variant drains its queue between repeats (the
writer thread does that twice a second in real use) and is timed with the writer thread idle, so
the figure is the cost on the training thread; the writer's own cost per span is reported
separately (it runs in the same interpreter, off the hot path).
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import tempfile
import time


def _time_pairs(factory, n: int) -> float:
    start = time.perf_counter_ns()
    for _ in range(n):
        with factory():
            pass
    return (time.perf_counter_ns() - start) / n


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=20_000)
    parser.add_argument("--repeats", type=int, default=41)
    args = parser.parse_args()

    import gpuprof
    from gpuprof import hooks

    variants = {
        "contextlib.nullcontext()": contextlib.nullcontext,
        "gpuprof.phase, outside a run": lambda: gpuprof.phase("rollout"),
    }
    try:
        import torch.profiler

        variants["torch.profiler.record_function"] = lambda: torch.profiler.record_function(
            "rollout"
        )
    except ImportError:
        print("torch not installed: record_function not measured")

    run_dir = tempfile.mkdtemp(prefix="gpuprof-bench-")
    results: dict[str, list[float]] = {name: [] for name in variants}
    results["gpuprof.phase, recording"] = []
    writer_ns: list[float] = []
    for _ in range(args.repeats):
        hooks._recorder, hooks._checked = None, True  # outside a run
        for name, factory in variants.items():
            results[name].append(_time_pairs(factory, args.n))
        gpuprof.init(run_dir)
        recorder = hooks._recorder
        recorder.stop.set()  # keep the writer thread out of the timed loop
        recorder.thread.join()
        results["gpuprof.phase, recording"].append(
            _time_pairs(lambda: gpuprof.phase("rollout"), args.n)
        )
        queued = len(recorder.spans)
        t0 = time.perf_counter_ns()
        recorder.flush()
        writer_ns.append((time.perf_counter_ns() - t0) / max(queued, 1))
        gpuprof.shutdown()

    base = statistics.median(results["contextlib.nullcontext()"])
    print(f"{'variant':34s} {'median ns/pair':>15s} {'vs nullcontext':>15s}")
    for name, values in results.items():
        med = statistics.median(values)
        print(f"{name:34s} {med:15.0f} {med - base:+15.0f}")
    print(f"{'writer thread, per span (off path)':34s} {statistics.median(writer_ns):15.0f}")


if __name__ == "__main__":
    main()
