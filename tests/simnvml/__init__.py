"""A simulated NVML library for tests and benchmarks on machines without a GPU.

``simnvml.c`` is compiled against the real ``nvml.h`` (from the ``nvidia-nvml-dev`` package) into
``libnvidia-ml.so.1``, which the real ``nvidia-ml-py`` (``import pynvml``) loads like the driver's
library. What the GPUs report comes from a scenario file named by ``GPUPROF_SIMNVML_SCENARIO``,
read at the first ``nvmlInit``.

Typical use::

    lib = build_library(cache_dir)                       # .../libnvidia-ml.so.1, cached
    write_scenario(path, {"gpus": [{"series": {"util_gpu_pct": [(0, 30), (2, 90)]}}]})
    subprocess.run(cmd, env=simnvml_env(lib, path))     # LD_LIBRARY_PATH + scenario variable

or, inside the current process, :func:`use_in_process` (see ``fixtures.py``).

Scenario dict (every key optional)::

    {
        "origin": 1700000000.0,        # unix time of scenario t=0; default: the nvmlInit instant
        "sample_period_s": 1 / 6,      # period of the nvmlDeviceGetSamples ring buffer
        "sample_buffer": 100,          # entries that buffer holds
        "driver_version": "550.54.15", "nvml_version": "12.550.54.15",
        "cuda_driver_version": 12040,
        "init_error": "driver_not_loaded",    # every nvmlInit fails with this error
        "gpus": [                      # or an int: that many default GPUs
            {
                "name": "NVIDIA H100 80GB HBM3", "uuid": "GPU-…", "pci_bus_id": "00000000:18:00.0",
                "mem_total_bytes": 80 * 2**30, "mem_reserved_bytes": 0,
                "gpm": True,           # GPM-capable (Hopper+): SM/tensor/DRAM activity
                "nvlink_links": 18,    # 0: the NVLink throughput fields are not supported
                "pcie_counters": True, # False: the PCIe byte counter fields are not supported
                "pcie_counter_wrap_bytes": 2**32,   # those counters wrap modulo this; 0: never
                "lost_at_s": 3.0,      # falls off the bus then: every call says GPU_IS_LOST
                "series": {            # a constant, or [(t_s, value), …] held piecewise
                    "util_gpu_pct": [(0, 20), (1.5, 95)], "util_mem_pct": 40,
                    "mem_used_bytes": 30 * 2**30,
                    "pcie_tx_kb_s": 1000, "pcie_rx_kb_s": 2000,          # NVML's KB/s
                    "nvlink_tx_kib_s": 5e6, "nvlink_rx_kib_s": 4e6,      # summed into KiB counters
                    "power_mw": 350_000, "sm_clock_mhz": 1980, "temp_c": 61,
                    "clock_event_reasons": 0x4,
                    "sm_active_pct": 70, "sm_occupancy_pct": 35,
                    "tensor_active_pct": 50, "dram_active_pct": 25,
                },
                "processes": [
                    {"pid": 4242, "used_mem_bytes": 2**30, "sm_util_pct": 40,
                     "type": "compute", "start_s": 0, "end_s": None},
                ],
            },
        ],
        "faults": [            # gpu None (or absent): every GPU and the system-level calls
            {"function": "nvmlDeviceGetPowerUsage", "error": "not_supported", "gpu": 1},
            {"function": "field:197", "error": "invalid_argument", "gpu": 0},  # one field
        ],
        "latency_us": {"nvmlDeviceGetPcieThroughput": 20_000},   # extra time per call
    }

Times are seconds of scenario time: since ``nvmlInit``, or since ``origin`` when given.
``pcie_tx_kb_s``/``pcie_rx_kb_s`` are what ``nvmlDeviceGetPcieThroughput`` returns and, integrated
(1 KB = 1024 bytes), the cumulative byte counters of the fields ``NVML_FI_DEV_PCIE_COUNT_TX_BYTES``
(197) and ``NVML_FI_DEV_PCIE_COUNT_RX_BYTES`` (198). A fault on the pseudo-function
``field:<id>`` sets that one entry's ``nvmlReturn`` in ``nvmlDeviceGetFieldValues``, which
itself still succeeds (``invalid_argument`` stands for a field id the driver does not know).
Error names: not_supported, no_permission, gpu_is_lost, not_found, unknown, driver_not_loaded,
timeout, uninitialized, invalid_argument, insufficient_size, irq_issue, reset_required,
lib_rm_version_mismatch, argument_version_mismatch, no_data.
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib.metadata
import itertools
import math
import os
import re
import shutil
import subprocess
import tempfile
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

SOURCE = Path(__file__).with_name("simnvml.c")
LIBRARY_NAME = "libnvidia-ml.so.1"
SCENARIO_ENV = "GPUPROF_SIMNVML_SCENARIO"

GPM_FUNCTIONS = (
    "nvmlGpmQueryDeviceSupport",
    "nvmlGpmSampleAlloc",
    "nvmlGpmSampleFree",
    "nvmlGpmSampleGet",
    "nvmlGpmMetricsGet",
)
"""Exported names to leave out (``without=GPM_FUNCTIONS``) to look like a pre-GPM driver."""

SERIES_KEYS = (
    "util_gpu_pct",
    "util_mem_pct",
    "mem_used_bytes",
    "pcie_tx_kb_s",
    "pcie_rx_kb_s",
    "nvlink_tx_kib_s",
    "nvlink_rx_kib_s",
    "power_mw",
    "sm_clock_mhz",
    "temp_c",
    "clock_event_reasons",
    "sm_active_pct",
    "sm_occupancy_pct",
    "tensor_active_pct",
    "dram_active_pct",
)
"""Metric names a GPU's ``series`` may hold, in NVML's units."""

_CFLAGS = (
    "-std=c11",
    "-O2",
    "-Wall",
    "-Wextra",
    "-Werror",
    "-fPIC",
    "-shared",
    f"-Wl,-soname,{LIBRARY_NAME}",  # the driver library's soname, as loaders see it
)
_POINTS_PER_LINE = 64
_IDENT = re.compile(r"^nvml[A-Za-z0-9_]+$")


class SimNvmlUnavailable(RuntimeError):
    """gcc or nvml.h is missing, so the simulated library cannot be built."""


def nvml_header() -> Path | None:
    """``nvml.h`` from the installed ``nvidia-nvml-dev`` distribution, or None."""
    try:
        files = importlib.metadata.files("nvidia-nvml-dev") or []
    except importlib.metadata.PackageNotFoundError:
        return None
    for f in files:
        if f.name == "nvml.h":
            path = Path(f.locate())
            if path.is_file():
                return path
    return None


def unavailable_reason() -> str | None:
    """Why the library cannot be built here (for ``pytest.skip``), or None when it can."""
    if shutil.which("gcc") is None:
        return "gcc not found: cannot build the simulated NVML library"
    if nvml_header() is None:
        return "nvml.h not found (install nvidia-nvml-dev): cannot build the simulated NVML library"
    return None


def build_library(out_dir: str | os.PathLike[str], *, without: tuple[str, ...] = ()) -> Path:
    """Compile ``simnvml.c`` into ``<out_dir>/<key>/libnvidia-ml.so.1`` and return that path.

    ``without`` names exported functions to leave out, as an old driver would: each is renamed
    at compile time (``-DnvmlX=simnvml_omitted_nvmlX``) so pynvml raises
    ``NVMLError_FunctionNotFound`` for it. Builds are cached by a hash of the source, the
    header, the flags and ``without``; each variant gets its own directory so it can be put on
    ``LD_LIBRARY_PATH``. Concurrent builders are safe (atomic rename).
    """
    reason = unavailable_reason()
    if reason:
        raise SimNvmlUnavailable(reason)
    header = nvml_header()
    assert header is not None
    omitted = tuple(sorted(set(without)))
    for name in omitted:
        if not _IDENT.match(name):
            raise ValueError(f"not an NVML function name: {name!r}")
    defines = tuple(f"-D{name}=simnvml_omitted_{name}" for name in omitted)
    digest = hashlib.sha256()
    for part in (SOURCE.read_bytes(), header.read_bytes(), " ".join(_CFLAGS + defines).encode()):
        digest.update(hashlib.sha256(part).digest())
    target_dir = Path(out_dir) / f"simnvml-{digest.hexdigest()[:16]}"
    target = target_dir / LIBRARY_NAME
    if target.is_file():
        return target
    target_dir.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=".build-", suffix=".so", dir=target_dir)
    os.close(fd)
    cmd = ["gcc", *_CFLAGS, *defines, f"-I{header.parent}", str(SOURCE), "-o", tmp, "-lm"]
    try:
        result = subprocess.run(cmd, capture_output=True, text=True)
        if result.returncode != 0:
            raise RuntimeError(f"building the simulated NVML library failed:\n{result.stderr}")
        os.replace(tmp, target)
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
    return target


def _number(value: float) -> str:
    if isinstance(value, bool):
        return str(int(value))
    if isinstance(value, int):
        return str(value)
    if math.isinf(value):
        return "inf" if value > 0 else "-inf"
    return repr(float(value))


def _points(value: Any) -> list[tuple[float, float]]:
    if isinstance(value, (int, float)):
        return [(0.0, value)]
    points = [(float(t), v) for t, v in value]
    if any(b[0] <= a[0] for a, b in itertools.pairwise(points)):
        raise ValueError("series times must increase")
    return points


def _one_word(key: str, value: Any) -> str:
    text = str(value)
    if not text or any(c.isspace() for c in text):
        raise ValueError(f"{key} must be one word: {value!r}")
    return text


def scenario_lines(scenario: Mapping[str, Any]) -> list[str]:
    """The scenario file's lines for a scenario dict (see the module docstring)."""
    lines = ["simnvml 1"]
    for key in ("driver_version", "nvml_version"):
        if key in scenario:
            lines.append(f"{key} {scenario[key]}")
    if "cuda_driver_version" in scenario:
        lines.append(f"cuda_driver_version {int(scenario['cuda_driver_version'])}")
    if scenario.get("origin") is not None:
        lines.append(f"origin {float(scenario['origin']):.6f}")
    if "sample_period_s" in scenario:
        lines.append(f"sample_period_us {max(1, round(scenario['sample_period_s'] * 1e6))}")
    if "sample_buffer" in scenario:
        lines.append(f"sample_buffer {int(scenario['sample_buffer'])}")
    if scenario.get("init_error"):
        lines.append(f"init_error {_one_word('init_error', scenario['init_error'])}")

    gpus = scenario.get("gpus", 1)
    if isinstance(gpus, int):
        gpus = [{} for _ in range(gpus)]
    lines.append(f"gpus {len(gpus)}")
    for i, gpu in enumerate(gpus):
        if "name" in gpu:
            lines.append(f"gpu {i} name {gpu['name']}")
        for key in ("uuid", "pci_bus_id"):
            if key in gpu:
                lines.append(f"gpu {i} {key} {_one_word(key, gpu[key])}")
        for key in ("mem_total_bytes", "mem_reserved_bytes", "nvlink_links", "pcie_link_gen",
                    "pcie_link_width"):  # fmt: skip
            if key in gpu:
                lines.append(f"gpu {i} {key} {int(gpu[key])}")
        for key in ("gpm", "pcie_counters"):
            if key in gpu:
                lines.append(f"gpu {i} {key} {int(bool(gpu[key]))}")
        if "pcie_counter_wrap_bytes" in gpu:
            lines.append(f"gpu {i} pcie_counter_wrap {int(gpu['pcie_counter_wrap_bytes'])}")
        if gpu.get("lost_at_s") is not None:
            lines.append(f"gpu {i} lost_at_s {_number(gpu['lost_at_s'])}")
        for metric, value in gpu.get("series", {}).items():
            if metric not in SERIES_KEYS:
                raise ValueError(f"unknown series {metric!r}; known: {', '.join(SERIES_KEYS)}")
            points = _points(value)
            for start in range(0, len(points), _POINTS_PER_LINE):
                chunk = points[start : start + _POINTS_PER_LINE]
                pairs = " ".join(f"{_number(t)}:{_number(v)}" for t, v in chunk)
                lines.append(f"series {i} {metric} {pairs}")
        for proc in gpu.get("processes", ()):
            kind = proc.get("type", "compute")
            if kind not in ("compute", "graphics"):
                raise ValueError(f"process type must be compute or graphics: {kind!r}")
            end = proc.get("end_s")
            lines.append(
                f"proc {i} {int(proc['pid'])} {kind} {int(proc.get('used_mem_bytes', 0))} "
                f"{int(proc.get('sm_util_pct', 0))} {_number(proc.get('start_s', -math.inf))} "
                f"{_number(math.inf if end is None else end)}"
            )
    for fault in scenario.get("faults", ()):
        gpu = fault.get("gpu")
        lines.append(
            f"fault {_one_word('function', fault['function'])} "
            f"{_one_word('error', fault['error'])} {'*' if gpu is None else int(gpu)}"
        )
    for function, us in scenario.get("latency_us", {}).items():
        lines.append(f"latency {_one_word('function', function)} {int(us)}")
    return lines


def write_scenario(path: str | os.PathLike[str], scenario: Mapping[str, Any]) -> Path:
    """Write a scenario dict as the file the simulated library reads; returns the path."""
    path = Path(path)
    path.write_text("\n".join(scenario_lines(scenario)) + "\n")
    return path


def simnvml_env(
    library: str | os.PathLike[str],
    scenario_path: str | os.PathLike[str],
    base: Mapping[str, str] | None = None,
) -> dict[str, str]:
    """Environment for a subprocess that should load the simulated library.

    ``library`` is the built ``libnvidia-ml.so.1`` (or its directory); its directory is put
    first on ``LD_LIBRARY_PATH``, which the dynamic loader reads when the process starts.
    """
    env = dict(os.environ if base is None else base)
    lib_dir = Path(library)
    if lib_dir.name == LIBRARY_NAME:
        lib_dir = lib_dir.parent
    old = env.get("LD_LIBRARY_PATH")
    env["LD_LIBRARY_PATH"] = f"{lib_dir}{os.pathsep}{old}" if old else str(lib_dir)
    env[SCENARIO_ENV] = str(scenario_path)
    return env


def call_count(library: str | os.PathLike[str], function: str) -> int:
    """How often ``function`` was called in this process since the library's last nvmlInit."""
    import ctypes

    counter = ctypes.CDLL(str(library)).simnvml_calls
    counter.restype = ctypes.c_long
    counter.argtypes = [ctypes.c_char_p]
    return int(counter(function.encode()))


@contextlib.contextmanager
def use_in_process(library: str | os.PathLike[str]) -> Iterator[Any]:
    """Make this process's pynvml use ``library`` until the block ends; yields ``pynvml``.

    pynvml loads its library once (``pynvml.nvmlLib``) and caches every function pointer it
    looks up, so both are swapped under its load lock and restored afterwards. Everything
    initialised inside the block must be shut down before it ends. Set
    ``GPUPROF_SIMNVML_SCENARIO`` before ``nvmlInit``: the library reads it then.
    """
    import ctypes

    import pynvml

    lib = ctypes.CDLL(str(library))
    with pynvml.libLoadLock:
        previous = pynvml.nvmlLib
        pynvml.nvmlLib = lib
        pynvml._nvmlGetFunctionPointer_cache.clear()
    try:
        yield pynvml
    finally:
        with pynvml.libLoadLock:
            pynvml.nvmlLib = previous
            pynvml._nvmlGetFunctionPointer_cache.clear()
