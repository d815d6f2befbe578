"""How late NVML's utilization and GPM's SM activity see GPU work (needs a real NVIDIA GPU).

    python benchmarks/probe_nvml_lag.py [--period 0.1] [--bursts 6] [--gpu 0]

A polling thread reads ``nvmlDeviceGetUtilizationRates`` and GPM SM activity (between its
previous GPM sample and this one) every ``--period`` seconds; the main thread runs bursts of
0.5 s of back-to-back bf16 matmuls (each synchronised, so a burst's host-clock start and end
bound its GPU work) separated by 1.5 s of idle. For each burst it prints how long after the
burst's start each reading first reaches 50%, and how long after its end each drops below 50%:
with no lag, a reading taken ``period`` after the work began would show it, and the first
reading after the end would show the drop within one ``period``. Needs torch with CUDA and
nvidia-ml-py; not run in CI.
"""

from __future__ import annotations

import argparse
import statistics
import threading
import time


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--period", type=float, default=0.1, help="seconds between readings")
    parser.add_argument("--bursts", type=int, default=6)
    parser.add_argument("--gpu", type=int, default=0)
    args = parser.parse_args()

    import pynvml
    import torch

    pynvml.nvmlInit()
    handle = pynvml.nvmlDeviceGetHandleByIndex(args.gpu)
    print(f"GPU: {pynvml.nvmlDeviceGetName(handle)}, driver {pynvml.nvmlSystemGetDriverVersion()}")
    samples = [pynvml.nvmlGpmSampleAlloc(), pynvml.nvmlGpmSampleAlloc()]
    request = pynvml.c_nvmlGpmMetricsGet_t()
    request.version, request.numMetrics = 1, 1
    request.metrics[0].metricId = 2  # NVML_GPM_METRIC_SM_UTIL
    rows: list[tuple[float, float, float]] = []
    stop = threading.Event()

    def poll() -> None:
        k = 0
        pynvml.nvmlGpmSampleGet(handle, samples[0])
        while not stop.wait(args.period):
            t = time.time()
            util = pynvml.nvmlDeviceGetUtilizationRates(handle).gpu
            previous, current = samples[k % 2], samples[(k + 1) % 2]
            pynvml.nvmlGpmSampleGet(handle, current)
            request.sample1, request.sample2 = previous, current
            pynvml.nvmlGpmMetricsGet(request)
            rows.append((t, float(util), float(request.metrics[0].value)))
            k += 1

    torch.cuda.set_device(args.gpu)
    x = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    torch.cuda.synchronize()
    poller = threading.Thread(target=poll, daemon=True)
    poller.start()
    time.sleep(2.0)
    bursts = []
    for _ in range(args.bursts):
        start = time.time()
        while time.time() - start < 0.5:
            _ = x @ x
            torch.cuda.synchronize()
        bursts.append((start, time.time()))
        time.sleep(1.5)
    stop.set()
    poller.join()

    def after(column: int, rising: bool, t0: float) -> float | None:
        for row in rows:
            if row[0] >= t0 and (row[column] >= 50) == rising:
                return (row[0] - t0) * 1e3
        return None

    figures: dict[str, list[float]] = {}
    for start, end in bursts[1:]:  # the first burst also wakes the GPU up
        for name, column in (("util", 1), ("sm_active", 2)):
            for edge, rising, t0 in (("rise", True, start), ("fall", False, end)):
                value = after(column, rising, t0)
                if value is not None:
                    figures.setdefault(f"{name} {edge}", []).append(value)
    print(f"readings every {args.period * 1e3:.0f} ms; median ms after the burst's edge:")
    for name, values in figures.items():
        print(f"  {name:15s} {statistics.median(values):6.0f}  ({len(values)} bursts)")


if __name__ == "__main__":
    main()
