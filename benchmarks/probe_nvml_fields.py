"""What gpuprof's NVML collector reads from a real driver (needs a real NVIDIA GPU).

    python benchmarks/probe_nvml_fields.py [--seconds 12] [--period 0.1] [--out probe.json]

Opens `NvmlCollector` as `watch` does and samples every ``--period`` seconds for ``--seconds``.
In the middle third a thread runs back-to-back bf16 matrix products and copies a pinned host
buffer to the GPU (so PCIe counters, SM activity and clocks have something to show), if torch
with CUDA is importable. Prints one JSON document: the inventory and versions the watcher
stores, the collector's notices, and for each `GpuSample` field the share of samples that held
a value and its min/median/max over the idle and the busy thirds; the GPU-process reading of
this process; the wall time of one `sample()` call (median and 99th percentile, µs), which is
what the sampler thread costs per tick and GPU; and the same for each NVML function it called
(``nvml_call_us``, by total time), to say which one costs it. Not run in CI.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import socket
import statistics
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def _load(stop: threading.Event, started: threading.Event) -> None:
    import torch

    a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    host = torch.empty(256 << 20, dtype=torch.uint8).pin_memory()
    dev = torch.empty_like(host, device="cuda")
    started.set()
    while not stop.is_set():
        for _ in range(20):
            a = (a @ a).clamp_(-1, 1)
        dev.copy_(host, non_blocking=True)
        torch.cuda.synchronize()


def _timed(calls: dict[str, list[float]]) -> None:
    """Wrap every ``nvml*`` function of pynvml so each call's wall time (µs) is kept."""
    import pynvml

    def wrap(name: str, fn):
        def timed(*args, **kwargs):
            t = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                calls.setdefault(name, []).append((time.perf_counter() - t) * 1e6)

        return timed

    for name in dir(pynvml):
        fn = getattr(pynvml, name)
        if name.startswith("nvml") and callable(fn) and not isinstance(fn, type):
            setattr(pynvml, name, wrap(name, fn))


def _stats(values: list[float]) -> dict[str, float] | None:
    if not values:
        return None
    return {"min": min(values), "median": statistics.median(values), "max": max(values)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=12.0)
    parser.add_argument("--period", type=float, default=0.1)
    parser.add_argument("--out", help="also write the JSON document here")
    args = parser.parse_args()

    sys.path.insert(0, str(ROOT))
    from gpuprof.collectors.nvml import NvmlCollector

    calls: dict[str, list[float]] = {}
    _timed(calls)
    nvml = NvmlCollector(socket.gethostname())
    opened = nvml.open()
    calls.clear()  # the calls of one tick, not of opening
    doc: dict = {"opened": opened, "notice": nvml.notice}
    if not opened:
        print(json.dumps(doc, indent=1))
        return
    doc["inventory"] = nvml.inventory()
    doc["versions"] = nvml.versions()

    stop, started = threading.Event(), threading.Event()
    load = None
    try:
        import torch

        if torch.cuda.is_available():
            load = threading.Thread(target=_load, args=(stop, started), daemon=True)
    except ImportError:
        pass

    thirds: dict[str, list] = {"idle": [], "busy": [], "after": []}
    costs: list[float] = []
    procs = []
    t0 = time.perf_counter()
    third = args.seconds / 3
    while (elapsed := time.perf_counter() - t0) < args.seconds:
        phase = "idle" if elapsed < third else "busy" if elapsed < 2 * third else "after"
        if phase == "busy" and load is not None and not load.is_alive() and not stop.is_set():
            load.start()
            started.wait(30)
        if phase == "after":
            stop.set()
        c = time.perf_counter()
        samples, _events = nvml.sample(time.time_ns())
        costs.append((time.perf_counter() - c) * 1e6)
        thirds[phase].extend(samples)
        if phase == "busy" and not procs:
            procs = nvml.sample_processes(time.time_ns(), {os.getpid()})
        time.sleep(max(0.0, args.period - (time.perf_counter() - c)))
    stop.set()

    fields = [f.name for f in dataclasses.fields(thirds["idle"][0])] if thirds["idle"] else []
    every = [s for part in thirds.values() for s in part]
    report = {}
    for name in fields:
        if name in ("host", "gpu", "uuid", "t_ns"):
            continue
        held = [getattr(s, name) for s in every if getattr(s, name) is not None]
        report[name] = {
            "held_share": round(len(held) / len(every), 3) if every else 0.0,
            **{
                part: _stats(
                    [float(getattr(s, name)) for s in rows if getattr(s, name) is not None]
                )
                for part, rows in thirds.items()
            },
        }
    doc["load"] = "torch bf16 matmuls + pinned H2D copies" if load is not None else None
    doc["samples"] = {part: len(rows) for part, rows in thirds.items()}
    doc["fields"] = report
    doc["gpu_process_of_this_pid"] = [dataclasses.asdict(p) for p in procs]
    doc["sample_call_us"] = {
        "median": statistics.median(costs),
        "p99": sorted(costs)[int(0.99 * (len(costs) - 1))],
        "calls": len(costs),
    }
    doc["nvml_call_us"] = {
        name: {
            "calls": len(us),
            "median": round(statistics.median(us), 1),
            "p99": round(sorted(us)[int(0.99 * (len(us) - 1))], 1),
            "total_ms": round(sum(us) / 1e3, 1),
        }
        for name, us in sorted(calls.items(), key=lambda kv: -sum(kv[1]))
    }
    doc["notices"] = nvml.notices
    nvml.close()
    text = json.dumps(doc, indent=1, default=str)
    print(text)
    if args.out:
        with open(args.out, "w") as fh:
            fh.write(text)


if __name__ == "__main__":
    main()
