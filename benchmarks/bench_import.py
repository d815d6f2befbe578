"""Speed of `gpuprof import` on large device-metric logs.

    python benchmarks/bench_import.py [--gpus 8] [--hours 1 6] [--repeats 3]

For each length it writes, in a temporary directory, the logs one node of ``--gpus`` GPUs
sampled every second would leave:

- ``nvidia-smi-csv``: ``--query-gpu`` with 11 fields and units (one row per GPU per second);
- ``nvidia-smi-dmon``: ``dmon -o DT`` (pwr gtemp mtemp sm mem enc dec mclk pclk), headers
  repeated every 10 samples as dmon does;
- ``dcgm-prometheus``: dcgm-exporter's default scrape (12 gauges with HELP/TYPE lines) once a
  second, concatenated, with millisecond timestamps.

and times, medians over ``--repeats``: ``parse`` (the importer alone) and ``import`` (detect,
parse, merge and write the run directory, as the command does). Rows/s is GPU samples per
second of ``import``.
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from gpuprof.collectors.importers import dcgm, nvidia_smi, nvidia_smi_dmon  # noqa: E402
from gpuprof.importing import import_files  # noqa: E402

T0 = 1_714_521_600
SMI_HEADER = (
    "timestamp, index, uuid, name, pci.bus_id, utilization.gpu [%], utilization.memory [%], "
    "memory.used [MiB], memory.total [MiB], power.draw [W], clocks.sm [MHz], temperature.gpu\n"
)
DCGM_METRICS = (
    "DCGM_FI_DEV_SM_CLOCK", "DCGM_FI_DEV_MEM_CLOCK", "DCGM_FI_DEV_GPU_TEMP",
    "DCGM_FI_DEV_POWER_USAGE", "DCGM_FI_DEV_PCIE_REPLAY_COUNTER", "DCGM_FI_DEV_GPU_UTIL",
    "DCGM_FI_DEV_MEM_COPY_UTIL", "DCGM_FI_DEV_ENC_UTIL", "DCGM_FI_DEV_DEC_UTIL",
    "DCGM_FI_DEV_FB_FREE", "DCGM_FI_DEV_FB_USED", "DCGM_FI_DEV_XID_ERRORS",
)  # fmt: skip


def _stamp(t: int) -> str:
    return time.strftime("%Y/%m/%d %H:%M:%S", time.gmtime(t))


def write_smi(path: Path, gpus: int, seconds: int) -> int:
    with path.open("w") as fh:
        fh.write(SMI_HEADER)
        for t in range(seconds):
            stamp = _stamp(T0 + t)
            for g in range(gpus):
                fh.write(
                    f"{stamp}.{g:03d}, {g}, GPU-{g:08d}, NVIDIA H100 80GB HBM3, "
                    f"00000000:{g + 16:02X}:00.0, {(t * 7 + g) % 101} %, {t % 60} %, "
                    f"{40000 + t % 1000} MiB, 81559 MiB, {300 + (t % 350)}.25 W, 1980 MHz, "
                    f"{60 + g}\n"
                )
    return gpus * seconds


def write_dmon(path: Path, gpus: int, seconds: int) -> int:
    with path.open("w") as fh:
        for t in range(seconds):
            if t % 10 == 0:
                fh.write(
                    "#Date       Time        gpu    pwr  gtemp  mtemp     sm    mem    enc    dec"
                    "   mclk   pclk\n#YYYYMMDD   HH:MM:SS    Idx      W      C      C      %"
                    "      %      %      %    MHz    MHz\n"
                )
            day, clock = time.strftime("%Y%m%d %H:%M:%S", time.gmtime(T0 + t)).split()
            for g in range(gpus):
                fh.write(
                    f" {day}   {clock}   {g:4d}  {300 + t % 350:5d}  {60 + g:5d}      -"
                    f"  {(t * 7 + g) % 101:5d}  {t % 60:5d}      0      0   2619   1980\n"
                )
    return gpus * seconds


def write_dcgm(path: Path, gpus: int, seconds: int) -> int:
    with path.open("w") as fh:
        for t in range(seconds):
            ms = (T0 + t) * 1000
            for metric in DCGM_METRICS:
                fh.write(f"# HELP {metric} help.\n# TYPE {metric} gauge\n")
                for g in range(gpus):
                    fh.write(
                        f'{metric}{{gpu="{g}",UUID="GPU-{g:08d}",device="nvidia{g}",'
                        f'modelName="NVIDIA H100 80GB HBM3",Hostname="node1"}} '
                        f"{(t * 7 + g) % 101} {ms}\n"
                    )
    return gpus * seconds


FORMATS = {
    "nvidia-smi-csv": (write_smi, nvidia_smi, "smi.csv"),
    "nvidia-smi-dmon": (write_dmon, nvidia_smi_dmon, "dmon.txt"),
    "dcgm-prometheus": (write_dcgm, dcgm, "scrapes.prom"),
}


def _median_s(fn, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gpus", type=int, default=8)
    parser.add_argument("--hours", type=float, nargs="+", default=[1.0, 6.0])
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    print(f"{args.gpus} GPUs, 1 s samples; medians of {args.repeats}")
    print(f"{'format':16} {'hours':>5} {'rows':>9} {'MB':>7} {'parse s':>8} {'import s':>9} "
          f"{'rows/s':>9}")  # fmt: skip
    for hours in args.hours:
        for name, (writer, module, file_name) in FORMATS.items():
            rows, size_mb, parse_s, import_s = _bench(
                writer, module, file_name, args.gpus, round(hours * 3600), args.repeats
            )
            print(
                f"{name:16} {hours:5g} {rows:9d} {size_mb:7.1f} {parse_s:8.2f} {import_s:9.2f} "
                f"{rows / import_s:9.0f}"
            )


def _bench(writer, module, file_name: str, gpus: int, seconds: int, repeats: int):
    """(GPU samples, file MB, parse s, import s) for one format and length."""
    tmp = Path(tempfile.mkdtemp(prefix="gpuprof-bench-import-"))
    try:
        path = tmp / file_name
        rows = writer(path, gpus, seconds)
        size_mb = path.stat().st_size / 1e6
        parse_s = _median_s(lambda: module.parse(path), repeats)
        outputs = iter(tmp / f"run{i}" for i in range(repeats))
        import_s = _median_s(lambda: import_files([path], next(outputs)), repeats)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return rows, size_mb, parse_s, import_s


if __name__ == "__main__":
    main()
