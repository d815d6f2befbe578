"""GPU device counters and per-process GPU use, read through NVML (``nvidia-ml-py``).

NVML is loaded and initialised in `NvmlCollector.open`, never at import. Every NVML call goes
through one helper, `NvmlCollector._query`, which turns NVML's errors into "not available":

- not supported / no permission / function not found (old driver) -> None, one line in
  ``notices`` per function and GPU, and the call is not made again;
- GPU lost -> the GPU is marked lost, one ``nvml_fault`` event is emitted, it is skipped from
  then on and stays in the inventory with ``lost: True``;
- not found (no new samples since the last query) -> None for this tick only;
- anything else -> None, never an exception.

Figures and their units (see `gpuprof.model.GpuSample`):

- ``util_gpu_pct`` / ``util_mem_pct``: NVML's "a kernel was running" / "device memory was read
  or written" share of time, 0-100. At ticks `BUFFERED_UTIL_MIN_S` or more apart, the mean of
  the driver's buffered samples (``nvmlDeviceGetSamples``) since the previous tick; at closer
  ticks, and when no new buffered sample is there, ``nvmlDeviceGetUtilizationRates`` (the
  driver's last sample period, as nvidia-smi shows).
- ``pcie_tx/rx_bytes_s``: the PCIe byte counter fields (``NVML_FI_DEV_PCIE_COUNT_TX/RX_BYTES``),
  cumulative and read without blocking, differenced between ticks: the mean over the interval
  since the previous tick. None on the first tick, after a wrap or reset (the counter went
  down) and on a tick whose reading failed.
  On drivers or GPUs without those fields the fallback is ``nvmlDeviceGetPcieThroughput``
  (KB/s times 1024), which measures a 20 ms window and blocks for about as long per call. So
  it is read for at most ONE GPU per tick, rotating over the GPUs that need it: a tick blocks
  for at most ~40 ms (TX and RX) however many GPUs there are. Such a GPU has PCIe figures
  only on the ticks it is read, and then they describe those 20 ms, not the whole interval;
  on the other ticks they are None (a previous reading is never carried forward).
- ``nvlink_tx/rx_bytes_s``: the NVLink data throughput fields, cumulative KiB counters summed
  over all links, differenced between ticks (None on the first tick).
- ``power_w`` (NVML: mW), ``sm_clock_mhz``, ``temp_c``, ``clock_event_reasons`` (bit mask).
- ``sm_active_pct``, ``sm_occupancy_pct``, ``tensor_active_pct`` (any tensor pipe),
  ``dram_active_pct`` (DRAM bandwidth used vs peak): GPM metrics (Hopper and newer) between
  consecutive ticks; None where GPM is not supported.

The PCIe and NVLink counters come from one ``nvmlDeviceGetFieldValues`` call per GPU per tick.
Each field has its own status: a field the GPU does not have (not supported, not permitted, or
an id the driver does not know) is dropped from later requests, with one line in ``notices``
per GPU and kind, without affecting the others.
"""

from __future__ import annotations

import contextlib
import os
import time
from dataclasses import dataclass, field
from typing import Any

from gpuprof.model import Event, GpuProcSample, GpuSample

# Values from nvml.h; they are part of NVML's stable ABI, so they do not depend on the
# installed nvidia-ml-py exposing every constant.
_SUCCESS = 0
_ERROR_INVALID_ARGUMENT = 2
_ERROR_NOT_SUPPORTED = 3
_ERROR_NO_PERMISSION = 4
_ERROR_NOT_FOUND = 6
_ERROR_DRIVER_NOT_LOADED = 9
_ERROR_LIBRARY_NOT_FOUND = 12
_ERROR_FUNCTION_NOT_FOUND = 13
_ERROR_GPU_IS_LOST = 15

_GPU_UTILIZATION_SAMPLES = 1
_MEMORY_UTILIZATION_SAMPLES = 2
_PCIE_UTIL_TX_BYTES = 0
_PCIE_UTIL_RX_BYTES = 1
_CLOCK_SM = 1
_TEMPERATURE_GPU = 0
_FI_NVLINK_THROUGHPUT_DATA_TX = 138
_FI_NVLINK_THROUGHPUT_DATA_RX = 139
_FI_PCIE_COUNT_TX_BYTES = 197
_FI_PCIE_COUNT_RX_BYTES = 198
_ALL_LINKS = 0xFFFFFFFF
"""scopeId asking a per-link field for the sum over all links."""
_COUNTER_FIELDS = (
    (_FI_NVLINK_THROUGHPUT_DATA_TX, _ALL_LINKS),
    (_FI_NVLINK_THROUGHPUT_DATA_RX, _ALL_LINKS),
    (_FI_PCIE_COUNT_TX_BYTES, 0),
    (_FI_PCIE_COUNT_RX_BYTES, 0),
)
"""(fieldId, scopeId) of the cumulative counters read in one nvmlDeviceGetFieldValues call."""
_COUNTER_BYTES = {
    _FI_NVLINK_THROUGHPUT_DATA_TX: 1024,  # KiB
    _FI_NVLINK_THROUGHPUT_DATA_RX: 1024,
    _FI_PCIE_COUNT_TX_BYTES: 1,  # bytes
    _FI_PCIE_COUNT_RX_BYTES: 1,
}
"""Bytes per unit of each counter field."""
_PCIE_FIELD_COUNTER = {
    _FI_PCIE_COUNT_TX_BYTES: _PCIE_UTIL_TX_BYTES,
    _FI_PCIE_COUNT_RX_BYTES: _PCIE_UTIL_RX_BYTES,
}
"""The nvmlDeviceGetPcieThroughput counter standing in for each PCIe counter field."""
_PCIE_THROUGHPUT = "nvmlDeviceGetPcieThroughput"
_MEMORY_V2 = 0x02000028
"""``nvmlMemory_v2``: sizeof(nvmlMemory_v2_t) | 2 << 24."""

_GPM_METRICS_GET_VERSION = 1
_GPM_SM_UTIL = 2
_GPM_SM_OCCUPANCY = 3
_GPM_ANY_TENSOR_UTIL = 5
_GPM_DRAM_BW_UTIL = 10
_GPM_METRIC_IDS = (_GPM_SM_UTIL, _GPM_SM_OCCUPANCY, _GPM_ANY_TENSOR_UTIL, _GPM_DRAM_BW_UTIL)
"""In the order of GpuSample's sm_active, sm_occupancy, tensor_active, dram_active."""

_VALUE_FIELDS = ("dVal", "uiVal", "ulVal", "ullVal", "sllVal", "siVal", "usVal")
"""Member of ``nvmlValue_t`` to read for each ``nvmlValueType_t`` (its index)."""

_PROC_UTIL_HOLD_NS = 500_000_000
"""How long per-process SM figures are reused when the driver has no newer sample."""

BUFFERED_UTIL_MIN_S = 0.5
"""Shortest spacing of ticks (s) at which utilisation is the mean of the driver's buffered
samples. The buffer gains a sample every 1/6 s, so a closer tick finds at most one new sample,
which ``nvmlDeviceGetUtilizationRates`` gives too; and one ``nvmlDeviceGetSamples`` call took
2.1 ms on a real H100 and H200 (driver 580, `benchmarks/probe_nvml_fields.py`), against 10 µs
for the rates: two per GPU and tick were 80% of the sampler's NVML time. NVML calls serialise
on the driver's lock, which other clients of the driver then wait for."""

_UNAVAILABLE = (_ERROR_NOT_SUPPORTED, _ERROR_NO_PERMISSION, _ERROR_FUNCTION_NOT_FOUND)
_FIELD_UNAVAILABLE = (*_UNAVAILABLE, _ERROR_INVALID_ARGUMENT)
"""A field's nvmlReturn saying it will never have a value on this GPU (invalid argument: a
field id the driver does not know)."""


def _value(value_type: int, value: Any) -> float | int:
    """Read an ``nvmlValue_t`` union according to its ``nvmlValueType_t``."""
    name = _VALUE_FIELDS[value_type] if 0 <= value_type < len(_VALUE_FIELDS) else "uiVal"
    return getattr(value, name)


@dataclass
class _Gpu:
    """What the collector keeps per GPU between ticks."""

    index: int
    handle: Any = None
    uuid: str | None = None
    name: str | None = None
    pci_bus_id: str | None = None
    mem_total_bytes: int | None = None
    pcie_link_gen_max: int | None = None
    pcie_link_width_max: int | None = None
    gpm_supported: bool = False
    lost: bool = False
    util_seen_us: dict[int, int] = field(default_factory=dict)
    """Newest driver sample timestamp seen, per sampling type (NVML's clock, microseconds)."""
    fields: list[tuple[int, int]] = field(default_factory=lambda: list(_COUNTER_FIELDS))
    """(fieldId, scopeId) still requested from nvmlDeviceGetFieldValues each tick."""
    counter_prev: dict[int, tuple[int, int]] = field(default_factory=dict)
    """fieldId -> (value, timestamp us) of the previous successful counter reading."""
    pcie_fallback: list[int] = field(default_factory=list)
    """nvmlDeviceGetPcieThroughput counters (TX, RX) to read for want of counter fields."""
    gpm_samples: list[Any] = field(default_factory=list)
    gpm_next: int = 0
    gpm_primed: bool = False
    gpm_request: Any = None
    proc_util_seen_us: int = 0
    proc_util_last: dict[int, float] = field(default_factory=dict)
    proc_util_t_ns: int = 0


class NvmlCollector:
    """Reads every GPU of this host through NVML; one instance per watcher.

    Call `open` first; when it returns False, NVML is unavailable and ``notice`` says why in
    one line, and the other methods return empty results. ``notices`` lists, one line each,
    every function or GPU that degraded (not supported, no permission, lost…).
    """

    def __init__(self, host: str) -> None:
        self.host = host
        self.notice: str | None = None
        """Why `open` failed, as one human line; None when it did not."""
        self.notices: list[str] = []
        """Human lines about degraded collection, one per distinct function/GPU."""
        self._nvml: Any = None
        self._opened: bool | None = None
        self._gpus: list[_Gpu] = []
        self._missing: set[str] = set()
        self._unavailable: set[tuple[str, int | None]] = set()
        self._noted: set[str] = set()
        self._events: list[Event] = []
        self._last_error: int | None = None
        self._t_ns = 0
        self._tick_ns: int | None = None
        """The previous tick's time (ns), for the spacing `BUFFERED_UTIL_MIN_S` is compared to."""
        self._buffered_util = False
        """Whether this tick reads utilisation from the driver's buffered samples."""
        self._pcie_last = -1
        """Index of the GPU whose PCIe was last read through the blocking fallback."""
        self._mismatch_error: Any = ()

    # -- lifecycle ---------------------------------------------------------------------------

    def open(self) -> bool:
        """Load and initialise NVML and list the GPUs; False (with ``notice``) if unavailable."""
        if self._opened is not None:
            return self._opened
        self._opened = False
        self._t_ns = time.time_ns()
        self._gpus = []
        self._missing.clear()
        self._unavailable.clear()
        self._pcie_last = -1
        try:
            import pynvml
        except ImportError:
            return self._fail("NVML not available (nvidia-ml-py is not installed)")
        try:
            pynvml.nvmlInit()
        except pynvml.NVMLError as err:
            code = getattr(err, "value", None)
            if code == _ERROR_LIBRARY_NOT_FOUND:
                return self._fail("NVML not available (libnvidia-ml.so.1 not found)")
            if code == _ERROR_DRIVER_NOT_LOADED:
                return self._fail("NVML not available (NVIDIA driver not loaded)")
            return self._fail(f"NVML not available (nvmlInit failed: {err})")
        except Exception as err:  # e.g. OSError from a broken library file
            return self._fail(f"NVML not available ({err})")
        self._nvml = pynvml
        self._mismatch_error = getattr(pynvml, "NVMLLibraryMismatchError", ())
        count = self._query(None, "nvmlDeviceGetCount")
        if not count:
            self._shutdown()
            why = "NVML found no GPU" if count == 0 else "NVML could not count the GPUs"
            return self._fail(why)
        self._gpus = [self._open_gpu(i) for i in range(count)]
        no_gpm = [str(g.index) for g in self._gpus if g.handle is not None and not g.gpm_supported]
        if no_gpm:
            self._note(
                f"GPM not supported on GPU {', '.join(no_gpm)}: no SM/tensor activity there "
                "(util_gpu_pct only says a kernel was running)"
            )
        self._opened = True
        return True

    def _fail(self, reason: str) -> bool:
        self.notice = f"{reason}: profiling host only"
        self.notices.append(self.notice)
        return False

    def _open_gpu(self, index: int) -> _Gpu:
        gpu = _Gpu(index)
        handle = self._query(gpu, "nvmlDeviceGetHandleByIndex", index)
        if handle is None:
            if not gpu.lost:
                self._note(f"GPU {index} cannot be opened: not sampled")
            return gpu
        gpu.handle = handle
        gpu.uuid = self._query(gpu, "nvmlDeviceGetUUID", handle)
        gpu.name = self._query(gpu, "nvmlDeviceGetName", handle)
        pci = self._query(gpu, "nvmlDeviceGetPciInfo", handle)
        if pci is not None:
            bus_id = pci.busId
            gpu.pci_bus_id = bus_id.decode() if isinstance(bus_id, bytes) else bus_id
        memory = self._memory(gpu)
        gpu.mem_total_bytes = memory.total if memory is not None else None
        # the link's maximum (an idle GPU trains its link down: the current one says little)
        gpu.pcie_link_gen_max = self._query(gpu, "nvmlDeviceGetMaxPcieLinkGeneration", handle)
        gpu.pcie_link_width_max = self._query(gpu, "nvmlDeviceGetMaxPcieLinkWidth", handle)
        support = self._query(gpu, "nvmlGpmQueryDeviceSupport", handle, quiet=True)
        if support is not None and support.isSupportedDevice:
            gpu.gpm_supported = self._open_gpm(gpu)
        return gpu

    def _open_gpm(self, gpu: _Gpu) -> bool:
        """Two GPM sample buffers used alternately, and one reusable metrics request."""
        nvml = self._nvml
        for _ in range(2):
            sample = self._query(None, "nvmlGpmSampleAlloc")
            if sample is None:
                self._free_gpm(gpu)
                return False
            gpu.gpm_samples.append(sample)
        request_type = getattr(nvml, "c_nvmlGpmMetricsGet_t", None)
        if request_type is None:  # an nvidia-ml-py without GPM support
            self._free_gpm(gpu)
            return False
        request = request_type()
        request.version = _GPM_METRICS_GET_VERSION
        request.numMetrics = len(_GPM_METRIC_IDS)
        for i, metric_id in enumerate(_GPM_METRIC_IDS):
            request.metrics[i].metricId = metric_id
        gpu.gpm_request = request
        return True

    def _free_gpm(self, gpu: _Gpu) -> None:
        for sample in gpu.gpm_samples:
            self._query(None, "nvmlGpmSampleFree", sample)
        gpu.gpm_samples = []

    def close(self) -> None:
        """Free NVML resources and shut NVML down; safe to call more than once.

        After it, `sample` and `sample_processes` return nothing until `open` is called again.
        """
        if not self._opened:
            return
        for gpu in self._gpus:
            self._free_gpm(gpu)
        self._shutdown()
        self._opened = None  # a later open() starts afresh

    def _shutdown(self) -> None:
        with contextlib.suppress(Exception):
            self._nvml.nvmlShutdown()

    # -- the one query helper ----------------------------------------------------------------

    def _query(
        self, gpu: _Gpu | None, name: str, *args: Any, quiet: bool = False, key: str | None = None
    ) -> Any:
        """Call pynvml's ``name`` function; its result, or None when it is not available.

        ``gpu`` is the GPU the call concerns (None for system-level calls). ``key`` names the
        call in notices and in the skip lists when it differs from ``name`` (two variants of
        one wrapper). ``quiet`` suppresses the notice when a fallback follows.
        """
        key = key or name
        index = gpu.index if gpu is not None else None
        if key in self._missing:
            self._last_error = _ERROR_FUNCTION_NOT_FOUND
            return None
        if (key, index) in self._unavailable:
            self._last_error = _ERROR_NOT_SUPPORTED
            return None
        if gpu is not None and gpu.lost:
            self._last_error = _ERROR_GPU_IS_LOST
            return None
        nvml = self._nvml
        self._last_error = None
        try:
            fn = getattr(nvml, name)
        except AttributeError:  # an old nvidia-ml-py without this wrapper
            self._missing.add(key)
            self._last_error = _ERROR_FUNCTION_NOT_FOUND
            return None
        try:
            return fn(*args)
        except nvml.NVMLError as err:
            self._on_error(gpu, key, err, quiet)
        except self._mismatch_error:  # an unversioned wrapper on an old driver
            self._last_error = _ERROR_FUNCTION_NOT_FOUND
            self._missing.add(key)
            if not quiet:
                self._note(f"{key} not found in the NVML library (older driver)")
        except Exception as err:
            self._last_error = -1
            if not quiet:
                self._note(f"{key} failed{_on(index)}: {err!r}")
        return None

    def _on_error(self, gpu: _Gpu | None, key: str, err: Any, quiet: bool) -> None:
        code = getattr(err, "value", None)
        index = gpu.index if gpu is not None else None
        self._last_error = code
        if code == _ERROR_FUNCTION_NOT_FOUND:
            self._missing.add(key)
            if not quiet:
                self._note(f"{key} not found in the NVML library (older driver)")
        elif code in (_ERROR_NOT_SUPPORTED, _ERROR_NO_PERMISSION):
            self._unavailable.add((key, index))
            if not quiet:
                what = "not supported" if code == _ERROR_NOT_SUPPORTED else "not permitted"
                self._note(f"{key} {what}{_on(index)}")
        elif code == _ERROR_GPU_IS_LOST and gpu is not None:
            self._mark_lost(gpu, str(err))
        elif code == _ERROR_NOT_FOUND:
            pass  # no new data since the last query: normal, try again next tick
        elif not quiet:
            self._note(f"{key} failed{_on(index)}: {err}")

    def _note(self, line: str) -> None:
        if line not in self._noted:
            self._noted.add(line)
            self.notices.append(line)

    def _mark_lost(self, gpu: _Gpu, error: str) -> None:
        if gpu.lost:
            return
        gpu.lost = True
        self._free_gpm(gpu)
        attrs = {"gpu": gpu.index, "uuid": gpu.uuid, "error": error}
        self._events.append(
            Event(self.host, os.getpid(), None, self._t_ns, "nvml_fault", "gpu_lost", attrs)
        )
        self._note(f"GPU {gpu.index} lost ({error}): not sampled any more")

    # -- description -------------------------------------------------------------------------

    def inventory(self) -> list[dict[str, Any]]:
        """One dict per GPU: host, index, uuid, name, pci_bus_id, mem_total_bytes,
        pcie_link_gen_max, pcie_link_width_max (the PCIe link's maximum generation and lanes the
        GPU and system allow), gpm_supported, lost. A lost GPU stays listed with ``lost: True``."""
        return [
            {
                "host": self.host,
                "index": g.index,
                "uuid": g.uuid,
                "name": g.name,
                "pci_bus_id": g.pci_bus_id,
                "mem_total_bytes": g.mem_total_bytes,
                "pcie_link_gen_max": g.pcie_link_gen_max,
                "pcie_link_width_max": g.pcie_link_width_max,
                "gpm_supported": g.gpm_supported,
                "lost": g.lost,
            }
            for g in self._gpus
        ]

    def versions(self) -> dict[str, Any]:
        """``driver_version`` and ``nvml_version`` (strings) and ``cuda_driver_version``
        (int, e.g. 12040 for CUDA 12.4); None where unavailable."""
        if not self._opened:
            return {"driver_version": None, "nvml_version": None, "cuda_driver_version": None}
        cuda = self._query(None, "nvmlSystemGetCudaDriverVersion", quiet=True)
        if cuda is None:
            cuda = self._query(None, "nvmlSystemGetCudaDriverVersion_v2")
        return {
            "driver_version": self._query(None, "nvmlSystemGetDriverVersion"),
            "nvml_version": self._query(None, "nvmlSystemGetNVMLVersion"),
            "cuda_driver_version": cuda,
        }

    # -- device sampling ---------------------------------------------------------------------

    def sample(self, t_ns: int) -> tuple[list[GpuSample], list[Event]]:
        """One `GpuSample` per GPU still on the bus at ``t_ns`` (ns since the epoch), and the
        fault events since the last call (``nvml_fault``/``gpu_lost`` once per lost GPU)."""
        self._t_ns = t_ns
        spacing_ns = None if self._tick_ns is None else t_ns - self._tick_ns
        # the first tick reads the buffer too: the next one averages from the newest it saw
        self._buffered_util = spacing_ns is None or spacing_ns >= BUFFERED_UTIL_MIN_S * 1e9
        self._tick_ns = t_ns
        read: list[tuple[_Gpu, GpuSample]] = []
        if self._opened:
            for gpu in self._gpus:
                if gpu.handle is None or gpu.lost:
                    continue
                sample = self._sample_gpu(gpu, t_ns)
                if not gpu.lost:
                    read.append((gpu, sample))
            self._pcie_fallback(read)
        # a GPU lost mid-reading gives no half-filled sample
        samples = [sample for gpu, sample in read if not gpu.lost]
        events, self._events = self._events, []
        return samples, events

    def _sample_gpu(self, gpu: _Gpu, t_ns: int) -> GpuSample:
        h = gpu.handle
        s = GpuSample(self.host, gpu.index, gpu.uuid, t_ns, mem_total_bytes=gpu.mem_total_bytes)
        s.util_gpu_pct, s.util_mem_pct = self._utilization(gpu)
        memory = self._memory(gpu)
        if memory is not None:
            s.mem_used_bytes = memory.used
            s.mem_total_bytes = memory.total
        rates = self._counters(gpu, t_ns)
        s.pcie_tx_bytes_s = rates.get(_FI_PCIE_COUNT_TX_BYTES)
        s.pcie_rx_bytes_s = rates.get(_FI_PCIE_COUNT_RX_BYTES)
        s.nvlink_tx_bytes_s = rates.get(_FI_NVLINK_THROUGHPUT_DATA_TX)
        s.nvlink_rx_bytes_s = rates.get(_FI_NVLINK_THROUGHPUT_DATA_RX)
        power_mw = self._query(gpu, "nvmlDeviceGetPowerUsage", h)
        s.power_w = power_mw / 1000.0 if power_mw is not None else None
        clock = self._query(gpu, "nvmlDeviceGetClockInfo", h, _CLOCK_SM)
        s.sm_clock_mhz = float(clock) if clock is not None else None
        temp = self._query(gpu, "nvmlDeviceGetTemperatureV", h, _TEMPERATURE_GPU, quiet=True)
        if temp is None and not gpu.lost:
            temp = self._query(gpu, "nvmlDeviceGetTemperature", h, _TEMPERATURE_GPU)
        s.temp_c = float(temp) if temp is not None else None
        reasons = self._query(gpu, "nvmlDeviceGetCurrentClocksEventReasons", h, quiet=True)
        if reasons is None and not gpu.lost:
            reasons = self._query(gpu, "nvmlDeviceGetCurrentClocksThrottleReasons", h)
        s.clock_event_reasons = reasons
        if gpu.gpm_samples:
            gpm = self._gpm(gpu)
            s.sm_active_pct, s.sm_occupancy_pct, s.tensor_active_pct, s.dram_active_pct = gpm
        return s

    def _memory(self, gpu: _Gpu) -> Any:
        """v2 (used excludes the driver's reserved memory) where the driver has it, else v1."""
        memory = self._query(
            gpu,
            "nvmlDeviceGetMemoryInfo",
            gpu.handle,
            _MEMORY_V2,
            quiet=True,
            key="nvmlDeviceGetMemoryInfo_v2",
        )
        if memory is None and not gpu.lost:
            memory = self._query(gpu, "nvmlDeviceGetMemoryInfo", gpu.handle)
        return memory

    def _utilization(self, gpu: _Gpu) -> tuple[float | None, float | None]:
        if self._buffered_util:
            util_gpu = self._buffered(gpu, _GPU_UTILIZATION_SAMPLES)
            util_mem = self._buffered(gpu, _MEMORY_UTILIZATION_SAMPLES)
        else:
            # a later buffered read takes the newest sample, not all since a tick long past
            gpu.util_seen_us.clear()
            util_gpu = util_mem = None
        if (util_gpu is None or util_mem is None) and not gpu.lost:
            rates = self._query(gpu, "nvmlDeviceGetUtilizationRates", gpu.handle)
            if rates is not None:
                util_gpu = float(rates.gpu) if util_gpu is None else util_gpu
                util_mem = float(rates.memory) if util_mem is None else util_mem
        return util_gpu, util_mem

    def _buffered(self, gpu: _Gpu, sampling_type: int) -> float | None:
        """Mean of the driver's samples newer than the last one seen; None when none is."""
        seen = gpu.util_seen_us.get(sampling_type, 0)
        result = self._query(
            gpu, "nvmlDeviceGetSamples", gpu.handle, sampling_type, seen, quiet=True
        )
        if not result:
            return None
        value_type, samples = result
        fresh = [x for x in samples if x.timeStamp > seen]
        if not fresh:
            return None
        newest = max(fresh, key=lambda x: x.timeStamp)
        gpu.util_seen_us[sampling_type] = newest.timeStamp
        if seen == 0:
            # The whole buffer reaches back many seconds before this run: take the newest.
            fresh = [newest]
        return sum(_value(value_type, x.sampleValue) for x in fresh) / len(fresh)

    def _counters(self, gpu: _Gpu, t_ns: int) -> dict[int, float]:
        """fieldId -> bytes/s over the interval since the previous tick, for the cumulative
        counter fields that have two successive readings without a wrap or reset."""
        rates: dict[int, float] = {}
        if not gpu.fields:
            return rates
        requested = gpu.fields
        values = self._query(gpu, "nvmlDeviceGetFieldValues", gpu.handle, requested)
        if values is None:
            gpu.counter_prev.clear()
            if self._last_error in _UNAVAILABLE:  # the call itself: no counter on this GPU
                self._drop_fields(gpu, requested)
            elif self._last_error == _ERROR_INVALID_ARGUMENT:
                # A driver may refuse the whole request for a field id it does not know:
                # the PCIe counters are the newest fields asked for, so they go first.
                self._drop_fields(gpu, [f for f in requested if f[0] in _PCIE_FIELD_COUNTER])
            return rates
        dropped = []
        for (field_id, scope), v in zip(requested, values, strict=True):
            before = gpu.counter_prev.pop(field_id, None)
            if v.nvmlReturn != _SUCCESS:
                if v.nvmlReturn in _FIELD_UNAVAILABLE:
                    dropped.append((field_id, scope))
                continue  # a failed reading: None now, and nothing to difference next tick
            now = int(_value(v.valueType, v.value))
            stamp_us = v.timestamp or t_ns // 1000
            gpu.counter_prev[field_id] = (now, stamp_us)
            if before is None or now < before[0] or stamp_us <= before[1]:
                continue  # first reading, or the counter wrapped or was reset
            dt_s = (stamp_us - before[1]) / 1e6
            rates[field_id] = (now - before[0]) * float(_COUNTER_BYTES[field_id]) / dt_s
        if dropped:
            self._drop_fields(gpu, dropped)
        return rates

    def _drop_fields(self, gpu: _Gpu, fields: list[tuple[int, int]]) -> None:
        """Stop requesting counter fields the GPU does not have; PCIe ones fall back."""
        gone = {f[0] for f in fields}
        gpu.fields = [f for f in gpu.fields if f[0] not in gone]
        for field_id in gone:
            gpu.counter_prev.pop(field_id, None)
        if gone & {_FI_NVLINK_THROUGHPUT_DATA_TX, _FI_NVLINK_THROUGHPUT_DATA_RX}:
            self._note(f"NVLink throughput counters not available on GPU {gpu.index}")
        fallback = [_PCIE_FIELD_COUNTER[f] for f in sorted(gone) if f in _PCIE_FIELD_COUNTER]
        if fallback:
            gpu.pcie_fallback = sorted({*gpu.pcie_fallback, *fallback})
            self._note(
                f"PCIe byte counters not available on GPU {gpu.index}: PCIe read with "
                f"{_PCIE_THROUGHPUT} (20 ms window), one such GPU per tick"
            )

    def _pcie_fallback(self, read: list[tuple[_Gpu, GpuSample]]) -> None:
        """PCIe of at most one GPU without counter fields, through the blocking
        ``nvmlDeviceGetPcieThroughput`` (~20 ms per call), taking turns from tick to tick."""
        waiting = [
            (gpu, sample)
            for gpu, sample in read
            if gpu.pcie_fallback
            and _PCIE_THROUGHPUT not in self._missing
            and (_PCIE_THROUGHPUT, gpu.index) not in self._unavailable
        ]
        if not waiting:
            return
        after = [pair for pair in waiting if pair[0].index > self._pcie_last]
        gpu, sample = (after or waiting)[0]
        self._pcie_last = gpu.index
        for counter in gpu.pcie_fallback:
            kb_s = self._query(gpu, _PCIE_THROUGHPUT, gpu.handle, counter)
            value = kb_s * 1024.0 if kb_s is not None else None
            if counter == _PCIE_UTIL_TX_BYTES:
                sample.pcie_tx_bytes_s = value
            else:
                sample.pcie_rx_bytes_s = value

    def _gpm(self, gpu: _Gpu) -> tuple[float | None, ...]:
        """GPM metrics between the previous tick's sample and this one (None on the first)."""
        none = (None,) * len(_GPM_METRIC_IDS)
        current = gpu.gpm_samples[gpu.gpm_next]
        if self._query(gpu, "nvmlGpmSampleGet", gpu.handle, current) is None:
            gpu.gpm_primed = False
            return none
        previous = gpu.gpm_samples[1 - gpu.gpm_next]
        gpu.gpm_next = 1 - gpu.gpm_next
        primed, gpu.gpm_primed = gpu.gpm_primed, True
        if not primed:
            return none
        request = gpu.gpm_request
        request.sample1 = previous
        request.sample2 = current
        if self._query(gpu, "nvmlGpmMetricsGet", request) is None:
            return none
        return tuple(
            float(request.metrics[i].value) if request.metrics[i].nvmlReturn == _SUCCESS else None
            for i in range(len(_GPM_METRIC_IDS))
        )

    # -- processes ---------------------------------------------------------------------------

    def sample_processes(self, t_ns: int, watched_pids: set[int]) -> list[GpuProcSample]:
        """Processes on each live GPU with their device memory (bytes) and SM share (0-100,
        None where NVML does not give it); ``watched`` when the pid is in ``watched_pids``.

        NVML reports host pids: inside a container with its own pid namespace they do not
        match the container's, and ``watched`` stays False.
        """
        self._t_ns = t_ns
        out: list[GpuProcSample] = []
        if not self._opened:
            return out
        for gpu in self._gpus:
            if gpu.handle is None or gpu.lost:
                continue
            memory = self._process_memory(gpu)
            if gpu.lost or not memory:
                continue
            sm = self._process_sm(gpu, t_ns)
            for pid, mem in memory.items():
                util = None if sm is None else sm.get(pid, 0.0)
                out.append(
                    GpuProcSample(self.host, t_ns, gpu.index, pid, mem, util, pid in watched_pids)
                )
        return out

    def _process_memory(self, gpu: _Gpu) -> dict[int, int | None]:
        """pid -> used device memory (bytes, None if unknown) over compute and graphics lists."""
        memory: dict[int, int | None] = {}
        for kind in ("Compute", "Graphics"):
            name = f"nvmlDeviceGet{kind}RunningProcesses"
            infos = self._query(gpu, f"{name}_v3", gpu.handle, quiet=True)
            if infos is None and not gpu.lost:
                infos = self._query(gpu, f"{name}_v2", gpu.handle)
            for info in infos or ():
                used = info.usedGpuMemory
                before = memory.get(info.pid)
                memory[info.pid] = used if before is None or (used or 0) > before else before
        return memory

    def _process_sm(self, gpu: _Gpu, t_ns: int) -> dict[int, float] | None:
        """pid -> SM share over the last interval; None when NVML cannot say."""
        seen = gpu.proc_util_seen_us
        samples = self._query(gpu, "nvmlDeviceGetProcessUtilization", gpu.handle, seen)
        if samples is None:
            if self._last_error != _ERROR_NOT_FOUND:
                return None
            # No newer sample: the driver lists only processes that used the SMs, so none did,
            # unless we are polling faster than the driver samples.
            if t_ns - gpu.proc_util_t_ns < _PROC_UTIL_HOLD_NS:
                return gpu.proc_util_last
            return {}
        fresh = [x for x in samples if x.timeStamp > seen]
        if not fresh:
            return gpu.proc_util_last
        newest = max(x.timeStamp for x in fresh)
        if seen == 0:
            fresh = [x for x in fresh if x.timeStamp == newest]
        per_pid: dict[int, list[int]] = {}
        for x in fresh:
            per_pid.setdefault(x.pid, []).append(x.smUtil)
        gpu.proc_util_seen_us = newest
        gpu.proc_util_last = {pid: sum(v) / len(v) for pid, v in per_pid.items()}
        gpu.proc_util_t_ns = t_ns
        return gpu.proc_util_last


def _on(index: int | None) -> str:
    return f" on GPU {index}" if index is not None else ""
