"""Kineto trace import and temporal breakdown: time and peak memory, against HTA's.

Traces: the real single-GPU trace from ``../shared/fixtures/kineto`` (68 k events) as it is,
and tiled end to end (each copy shifted past the previous one) to about 1 M and 3 M events —
the event mix of a real training loop at the size of a long profile. Without the fixture,
a synthetic trace with the same categories is used.

Each measurement runs in a fresh process; its peak is that process's own high-water mark
(``VmHWM``, `measure.hwm_bytes`). Not ``ru_maxrss``: Linux carries that across ``exec`` from
the process it was forked from, and this one builds the tiled trace in memory, so every child
read at least this process's size (the figures before 2026-11 were that floor):

- ``import``: `kineto.parse` (what ``gpuprof import`` does per file);
- ``breakdown``: `temporal_breakdown` of the file (load + figures);
- ``hta``: ``TraceAnalysis(trace_dir=…).get_temporal_breakdown()`` when HTA is installed.

Run: ``python benchmarks/bench_import_kineto.py [--repeat 3] [--sizes 1,15,45]``.
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
FIXTURE = ROOT.parent / "shared/fixtures/kineto/hta_ns_resolution_rank-0.pt.trace.json.gz"

CHILD = r"""
import sys, time, json, logging, os, pathlib
kind, path = sys.argv[1], sys.argv[2]
sys.path[:0] = [{root!r}, {root!r} + "/benchmarks"]
import measure
# modules are imported before the clock starts: the figures are the work on the trace
if kind == "hta":
    logging.disable(logging.CRITICAL)
    from hta.trace_analysis import TraceAnalysis
else:
    from gpuprof.collectors.importers import kineto
    from gpuprof.collectors.importers.kineto_breakdown import temporal_breakdown
t0 = time.perf_counter()
if kind == "import":
    out = kineto.parse(pathlib.Path(path))
    what = {{k: len(v) for k, v in out.frames.items()}}
elif kind == "breakdown":
    what = temporal_breakdown(path).iloc[0][["idle_pct", "compute_pct"]].round(2).tolist()
else:
    frame = TraceAnalysis(trace_dir=os.path.dirname(path)).get_temporal_breakdown(
        visualize=False)
    what = frame.iloc[0][["idle_time_pctg", "compute_time_pctg"]].tolist()
seconds = time.perf_counter() - t0
peak = measure.hwm_bytes()
print(json.dumps({{"s": seconds, "peak": peak, "what": what}}))
"""


def tiled_trace(copies: int, out: Path) -> int:
    """Write ``copies`` of the fixture trace end to end; returns the number of events."""
    doc = json.loads(gzip.decompress(FIXTURE.read_bytes()))
    events = doc["traceEvents"]
    timed = [e for e in events if isinstance(e.get("ts"), int | float)]
    t_min = min(e["ts"] for e in timed)
    span = max(e["ts"] + e.get("dur", 0) for e in timed) - t_min + 1000.0
    tiled = []
    for k in range(copies):
        shift = k * span
        for e in events:
            e2 = dict(e)
            if "ts" in e2:
                e2["ts"] = e2["ts"] + shift
            name = e2.get("name")
            if isinstance(name, str) and name.startswith("ProfilerStep#"):
                e2["name"] = f"ProfilerStep#{int(name.split('#')[1]) + 100 * k}"
            tiled.append(e2)
    doc["traceEvents"] = tiled
    out.write_bytes(gzip.compress(json.dumps(doc).encode(), compresslevel=1))
    return len(tiled)


def synthetic_trace(copies: int, out: Path) -> int:
    """A trace with the categories of a training loop, when the fixture is absent."""
    events, t = [], 1.7e15
    for step in range(60 * copies):
        events.append({"ph": "X", "cat": "user_annotation", "name": f"ProfilerStep#{step}",
                       "pid": 1, "tid": 1, "ts": t, "dur": 9000.0})  # fmt: skip
        for i in range(300):
            ts = t + i * 30
            events.append({"ph": "X", "cat": "cpu_op", "name": "aten::mm", "pid": 1,
                           "tid": 1, "ts": ts, "dur": 10.0})  # fmt: skip
            events.append({"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel",
                           "pid": 1, "tid": 1, "ts": ts + 1, "dur": 4.0,
                           "args": {"correlation": step * 1000 + i}})  # fmt: skip
            events.append({"ph": "X", "cat": "kernel", "name": "gemm", "pid": 0, "tid": 7,
                           "ts": ts + 8, "dur": 20.0, "args": {"device": 0, "stream": 7,
                           "correlation": step * 1000 + i}})  # fmt: skip
        t += 10_000
    out.write_bytes(gzip.compress(json.dumps({"traceEvents": events}).encode(), 1))
    return len(events)


def measure(kind: str, path: Path, repeat: int) -> dict:
    runs = []
    for _ in range(repeat):
        done = subprocess.run(
            [sys.executable, "-c", CHILD.format(root=str(ROOT)), kind, str(path)],
            capture_output=True,
            text=True,
            timeout=3600,
        )
        if done.returncode != 0:
            return {"error": done.stderr.strip().splitlines()[-1:]}
        runs.append(json.loads(done.stdout.strip().splitlines()[-1]))
    return {
        "s": statistics.median(r["s"] for r in runs),
        "peak_mb": statistics.median(r["peak"] for r in runs) / 2**20,
        "what": runs[0]["what"],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--sizes", default="1,15,45", help="copies of the trace, comma list")
    parser.add_argument("--no-hta", action="store_true")
    args = parser.parse_args()
    try:
        import hta  # noqa: F401

        have_hta = not args.no_hta
    except ImportError:
        have_hta = False
    print(f"python {sys.version.split()[0]}, {os.cpu_count()} CPUs, load {os.getloadavg()[0]:.2f}")
    for copies in (int(c) for c in args.sizes.split(",")):
        with tempfile.TemporaryDirectory() as tmp:
            path = Path(tmp) / "rank-0.json.gz"
            make = tiled_trace if FIXTURE.exists() else synthetic_trace
            t0 = time.perf_counter()
            n = make(copies, path)
            made = time.perf_counter() - t0
            size = path.stat().st_size / 2**20
            print(f"\n{n:,} events ({size:.1f} MB gzip, written in {made:.0f} s)")
            results = {k: measure(k, path, args.repeat) for k in ("import", "breakdown")}
            if have_hta:
                results["hta"] = measure("hta", path, args.repeat)
            for kind, r in results.items():
                if "error" in r:
                    print(f"  {kind:9s} failed: {r['error']}")
                    continue
                print(f"  {kind:9s} {r['s']:8.2f} s  peak {r['peak_mb']:7.0f} MB  {r['what']}")
            if have_hta and "s" in results["hta"] and "s" in results["breakdown"]:
                ratio = results["hta"]["s"] / results["breakdown"]["s"]
                print(f"  HTA / breakdown time: {ratio:.1f}x")


if __name__ == "__main__":
    main()
