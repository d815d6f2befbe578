"""The NVML collector against the real nvidia-ml-py and the simulated NVML library.

Cases that need a different library build, or no library at all, run in a subprocess: pynvml
loads its library once per process and caches every function pointer it looks up.
"""

from __future__ import annotations

import ctypes
import itertools
import json
import math
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from simnvml import GPM_FUNCTIONS, SCENARIO_ENV, simnvml_env, write_scenario

import gpuprof.collectors.nvml
from gpuprof.collectors.nvml import BUFFERED_UTIL_MIN_S, NvmlCollector

pytest_plugins = ["simnvml.fixtures"]

GiB = 2**30
REPO_ROOT = Path(gpuprof.collectors.nvml.__file__).resolve().parents[2]


def two_gpus() -> dict:
    """GPU 0 is GPM-capable, GPU 1 is not; every figure differs between them."""
    return {
        "driver_version": "575.51.03",
        "nvml_version": "12.575.51.03",
        "cuda_driver_version": 12090,
        "gpus": [
            {
                "name": "NVIDIA H100 80GB HBM3",
                "uuid": "GPU-aaaaaaaa-0000-0000-0000-000000000000",
                "pci_bus_id": "00000000:18:00.0",
                "mem_total_bytes": 80 * GiB,
                "mem_reserved_bytes": GiB // 2,
                "gpm": True,
                "series": {
                    "util_gpu_pct": 42,
                    "util_mem_pct": 17,
                    "mem_used_bytes": 30 * GiB,
                    "pcie_tx_kb_s": 1500,
                    "pcie_rx_kb_s": 2500,
                    "nvlink_tx_kib_s": 2_000_000,
                    "nvlink_rx_kib_s": 1_000_000,
                    "power_mw": 350_500,
                    "sm_clock_mhz": 1980,
                    "temp_c": 61,
                    "clock_event_reasons": 0x4,
                    "sm_active_pct": 63.5,
                    "sm_occupancy_pct": 31.25,
                    "tensor_active_pct": 48.0,
                    "dram_active_pct": 22.5,
                },
            },
            {
                "name": "NVIDIA A100-SXM4-40GB",
                "pcie_link_gen": 4,  # an A100 on a Gen4 x8 slot
                "pcie_link_width": 8,
                "uuid": "GPU-bbbbbbbb-0000-0000-0000-000000000001",
                "pci_bus_id": "00000000:3B:00.0",
                "mem_total_bytes": 40 * GiB,
                "gpm": False,
                "series": {
                    "util_gpu_pct": 7,
                    "util_mem_pct": 3,
                    "mem_used_bytes": 5 * GiB,
                    "pcie_tx_kb_s": 10,
                    "pcie_rx_kb_s": 20,
                    "nvlink_tx_kib_s": 300_000,
                    "nvlink_rx_kib_s": 400_000,
                    "power_mw": 90_000,
                    "sm_clock_mhz": 1410,
                    "temp_c": 40,
                    "clock_event_reasons": 0x1,
                },
            },
        ],
    }


def opened(simnvml, scenario: dict) -> NvmlCollector:
    simnvml.use(scenario)
    collector = NvmlCollector("node0")
    assert collector.open(), collector.notice
    return collector


@pytest.fixture
def collectors():
    """Collectors made by a test; closed at the end so pynvml's init count returns to zero."""
    made: list[NvmlCollector] = []
    yield made
    for c in made:
        c.close()


def two_ticks(collector: NvmlCollector, gap_s: float = 0.25):
    first = collector.sample(time.time_ns())
    time.sleep(gap_s)
    return first, collector.sample(time.time_ns())


# -- values ----------------------------------------------------------------------------------


def test_values_equal_the_scenario(simnvml, collectors):
    collectors.append(c := opened(simnvml, two_gpus()))
    (first, first_events), (second, events) = two_ticks(c)
    assert first_events == [] and events == []
    assert [s.gpu for s in first] == [0, 1] and [s.gpu for s in second] == [0, 1]
    # counters that are differenced have nothing to compare with on the first tick
    assert first[0].nvlink_tx_bytes_s is None and first[0].sm_active_pct is None
    assert first[0].pcie_tx_bytes_s is None and first[1].pcie_rx_bytes_s is None

    g0, g1 = second
    assert (g0.host, g0.uuid) == ("node0", "GPU-aaaaaaaa-0000-0000-0000-000000000000")
    assert g0.util_gpu_pct == 42 and g0.util_mem_pct == 17
    assert g0.mem_used_bytes == 30 * GiB  # v2: the driver's reserved memory is not "used"
    assert g0.mem_total_bytes == 80 * GiB
    # PCIe from the cumulative byte counters, never the blocking 20 ms window function
    assert g0.pcie_tx_bytes_s == pytest.approx(1500 * 1024, rel=1e-3)
    assert g0.pcie_rx_bytes_s == pytest.approx(2500 * 1024, rel=1e-3)
    assert simnvml.calls("nvmlDeviceGetPcieThroughput") == 0
    assert simnvml.calls("nvmlDeviceGetFieldValues") == 4  # one per GPU per tick: all 4 fields
    assert g0.nvlink_tx_bytes_s == pytest.approx(2_000_000 * 1024, rel=1e-3)
    assert g0.nvlink_rx_bytes_s == pytest.approx(1_000_000 * 1024, rel=1e-3)
    assert g0.power_w == 350.5
    assert g0.sm_clock_mhz == 1980 and g0.temp_c == 61 and g0.clock_event_reasons == 0x4
    assert g0.sm_active_pct == pytest.approx(63.5)
    assert g0.sm_occupancy_pct == pytest.approx(31.25)
    assert g0.tensor_active_pct == pytest.approx(48.0)
    assert g0.dram_active_pct == pytest.approx(22.5)

    assert g1.util_gpu_pct == 7 and g1.util_mem_pct == 3 and g1.mem_used_bytes == 5 * GiB
    assert g1.pcie_tx_bytes_s == pytest.approx(10 * 1024, rel=1e-3)
    assert g1.pcie_rx_bytes_s == pytest.approx(20 * 1024, rel=1e-3)
    assert g1.power_w == 90.0 and g1.temp_c == 40
    assert g1.nvlink_rx_bytes_s == pytest.approx(400_000 * 1024, rel=1e-3)
    assert g1.clock_event_reasons == 0x1
    # not GPM-capable: SM activity is unknown, not 0
    assert (g1.sm_active_pct, g1.sm_occupancy_pct, g1.tensor_active_pct) == (None, None, None)
    assert g1.dram_active_pct is None
    assert any("GPM not supported on GPU 1" in n for n in c.notices)


def test_inventory_and_versions(simnvml, collectors):
    collectors.append(c := opened(simnvml, two_gpus()))
    assert c.inventory() == [
        {
            "host": "node0",
            "index": 0,
            "uuid": "GPU-aaaaaaaa-0000-0000-0000-000000000000",
            "name": "NVIDIA H100 80GB HBM3",
            "pci_bus_id": "00000000:18:00.0",
            "mem_total_bytes": 80 * GiB,
            "pcie_link_gen_max": 5,  # the simulated library's default link
            "pcie_link_width_max": 16,
            "gpm_supported": True,
            "lost": False,
        },
        {
            "host": "node0",
            "index": 1,
            "uuid": "GPU-bbbbbbbb-0000-0000-0000-000000000001",
            "name": "NVIDIA A100-SXM4-40GB",
            "pci_bus_id": "00000000:3B:00.0",
            "mem_total_bytes": 40 * GiB,
            "pcie_link_gen_max": 4,
            "pcie_link_width_max": 8,
            "gpm_supported": False,
            "lost": False,
        },
    ]
    assert c.versions() == {
        "driver_version": "575.51.03",
        "nvml_version": "12.575.51.03",
        "cuda_driver_version": 12090,
    }


def _window_means(values, period_s, t1_range, t2_range):
    """Possible means of the buffered samples after the one newest at t1 up to t2.

    Sample k averages ((k-1)P, kP]; the exact ticks are only known within [before, after].
    """
    ks1 = {math.floor(t / period_s) for t in t1_range}
    ks2 = {math.floor(t / period_s) for t in t2_range}
    means = set()
    for k1 in ks1:
        for k2 in ks2:
            ks = range(k1 + 1, k2 + 1)
            means.add(sum(values(k) for k in ks) / len(ks))
    return means


def test_utilization_averages_the_driver_samples_since_the_last_tick(simnvml, collectors):
    period = 0.1
    origin = time.time()
    scenario = {
        "origin": origin,
        "sample_period_s": period,
        "gpus": [{"series": {"util_gpu_pct": [(0, 20), (0.4, 80)], "util_mem_pct": 10}}],
    }
    collectors.append(c := opened(simnvml, scenario))
    before1 = time.time() - origin
    (first,), _ = c.sample(time.time_ns())
    after1 = time.time() - origin
    time.sleep(max(0.0, 0.85 - (time.time() - origin)))
    before2 = time.time() - origin
    (second,), _ = c.sample(time.time_ns())
    after2 = time.time() - origin

    assert first.util_gpu_pct == 20  # only the newest sample on the first tick
    expected = _window_means(
        lambda k: 20 if k <= 4 else 80, period, (before1, after1), (before2, after2)
    )
    assert second.util_gpu_pct in expected
    # not the last sample period alone, which nvmlDeviceGetUtilizationRates would give
    assert 20 < second.util_gpu_pct < 80
    assert second.util_mem_pct == 10


def test_close_ticks_read_utilization_rates_not_the_buffer(simnvml, collectors):
    """At 10 Hz a tick finds at most one new buffered sample (one per 1/6 s), which the rates
    call gives for ~10 µs where reading the buffer took ~2 ms per call on a real H100: the
    buffer is read on the first tick only (its newest sample), then the rates."""
    scenario = two_gpus()
    collectors.append(c := opened(simnvml, scenario))
    # the ticks' own times say how far apart they are (not how long this machine took)
    t0 = time.time_ns()
    c.sample(t0)
    # 2 GPUs x (GPU, memory) x 2 C calls (pynvml asks the buffer's size first)
    assert simnvml.calls("nvmlDeviceGetSamples") == 8
    rates = simnvml.calls("nvmlDeviceGetUtilizationRates")
    for k in range(1, 6):
        (gpu0, gpu1), _ = c.sample(t0 + k * 100_000_000)
    assert simnvml.calls("nvmlDeviceGetSamples") == 8
    assert simnvml.calls("nvmlDeviceGetUtilizationRates") == rates + 10
    assert (gpu0.util_gpu_pct, gpu0.util_mem_pct, gpu1.util_gpu_pct) == (42, 17, 7)
    # ticks far enough apart average the buffer again
    c.sample(t0 + 500_000_000 + int(BUFFERED_UTIL_MIN_S * 1e9))
    assert simnvml.calls("nvmlDeviceGetSamples") == 16


def test_utilization_falls_back_to_rates_without_buffered_samples(simnvml, collectors):
    scenario = two_gpus()
    scenario["faults"] = [{"function": "nvmlDeviceGetSamples", "error": "not_supported"}]
    collectors.append(c := opened(simnvml, scenario))
    _, (second, _) = two_ticks(c, 0.05)
    assert [(s.util_gpu_pct, s.util_mem_pct) for s in second] == [(42, 17), (7, 3)]
    assert not any("nvmlDeviceGetSamples" in n for n in c.notices)  # the fallback covers it
    calls = simnvml.calls("nvmlDeviceGetSamples")
    c.sample(time.time_ns())
    assert simnvml.calls("nvmlDeviceGetSamples") == calls  # not retried


# -- degraded functions ----------------------------------------------------------------------


def test_unsupported_function_is_none_with_one_notice_and_not_retried(simnvml, collectors):
    scenario = two_gpus()
    scenario["faults"] = [
        {"function": "nvmlDeviceGetPowerUsage", "error": "not_supported", "gpu": 1}
    ]
    collectors.append(c := opened(simnvml, scenario))
    for _ in range(3):
        samples, events = c.sample(time.time_ns())
        assert [s.power_w for s in samples] == [350.5, None]
        assert samples[1].temp_c == 40  # the rest of GPU 1 is still read
        assert events == []
    assert [n for n in c.notices if "PowerUsage" in n] == [
        "nvmlDeviceGetPowerUsage not supported on GPU 1"
    ]
    assert simnvml.calls("nvmlDeviceGetPowerUsage") == 3 + 1  # GPU 0 each tick, GPU 1 once


def test_no_permission_is_none(simnvml, collectors):
    scenario = two_gpus()
    for gpu in scenario["gpus"]:
        gpu["pcie_counters"] = False  # PCIe through the nvmlDeviceGetPcieThroughput fallback
    scenario["faults"] = [
        {"function": "nvmlDeviceGetClockInfo", "error": "no_permission"},
        {"function": "nvmlDeviceGetPcieThroughput", "error": "no_permission", "gpu": 0},
    ]
    collectors.append(c := opened(simnvml, scenario))
    samples, _ = c.sample(time.time_ns())
    assert [s.sm_clock_mhz for s in samples] == [None, None]
    # GPU 0's turn: not permitted. GPU 1 then has every turn, GPU 0 is not tried again.
    assert [s.pcie_tx_bytes_s for s in samples] == [None, None]
    for _ in range(2):
        samples, _ = c.sample(time.time_ns())
        assert [s.pcie_tx_bytes_s for s in samples] == [None, 10 * 1024]
    assert simnvml.calls("nvmlDeviceGetPcieThroughput") == 1 + 2 * 2
    assert "nvmlDeviceGetClockInfo not permitted on GPU 0" in c.notices
    assert "nvmlDeviceGetPcieThroughput not permitted on GPU 0" in c.notices


def test_unexpected_errors_give_none_never_an_exception(simnvml, collectors):
    scenario = two_gpus()
    scenario["faults"] = [
        {"function": name, "error": "unknown"}
        for name in (
            "nvmlDeviceGetFieldValues",
            "nvmlGpmMetricsGet",
            "nvmlDeviceGetTemperatureV",
            "nvmlDeviceGetTemperature",
            "nvmlDeviceGetComputeRunningProcesses_v3",
            "nvmlDeviceGetComputeRunningProcesses_v2",
        )
    ]
    collectors.append(c := opened(simnvml, scenario))
    _, (samples, events) = two_ticks(c, 0.05)
    assert events == []
    assert [(s.nvlink_tx_bytes_s, s.sm_active_pct, s.temp_c) for s in samples] == [
        (None, None, None),
        (None, None, None),
    ]
    assert [s.power_w for s in samples] == [350.5, 90.0]
    assert c.sample_processes(time.time_ns(), set()) == []


def test_gpu_without_nvlink_has_no_nvlink_figures(simnvml, collectors):
    scenario = two_gpus()
    scenario["gpus"][1]["nvlink_links"] = 0
    collectors.append(c := opened(simnvml, scenario))
    _, (samples, _) = two_ticks(c, 0.05)
    assert samples[0].nvlink_tx_bytes_s is not None
    assert (samples[1].nvlink_tx_bytes_s, samples[1].nvlink_rx_bytes_s) == (None, None)
    assert "NVLink throughput counters not available on GPU 1" in c.notices
    # the PCIe counters in the same request are unaffected
    assert samples[1].pcie_rx_bytes_s == pytest.approx(20 * 1024, rel=1e-3)
    assert not any("PCIe" in n for n in c.notices)
    assert simnvml.calls("nvmlDeviceGetPcieThroughput") == 0


# -- PCIe: counters, and the blocking fallback one GPU per tick ------------------------------

PCIE_KB_S = [(1500, 2500), (100, 200), (300, 400)]


def three_gpus(without_counters: str) -> dict:
    """GPU 0 has the PCIe byte counter fields; GPUs 1 and 2 lack them, in one of three ways."""
    gpus = [
        {"series": {"pcie_tx_kb_s": tx, "pcie_rx_kb_s": rx, "nvlink_tx_kib_s": 1e6}}
        for tx, rx in PCIE_KB_S
    ]
    faults = []
    for i in (1, 2):
        if without_counters == "flag":  # the fields are NOT_SUPPORTED
            gpus[i]["pcie_counters"] = False
        elif without_counters == "unknown_field_ids":  # a driver older than the fields
            faults += [
                {"function": f"field:{fid}", "error": "invalid_argument", "gpu": i}
                for fid in (197, 198)
            ]
        else:  # a driver refusing the whole request for ids it does not know
            faults.append(
                {"function": "nvmlDeviceGetFieldValues", "error": "invalid_argument", "gpu": i}
            )
    return {"gpus": gpus, "faults": faults}


@pytest.mark.parametrize("without_counters", ["flag", "unknown_field_ids", "whole_request"])
def test_pcie_fallback_reads_one_gpu_per_tick_in_turn(simnvml, collectors, without_counters):
    collectors.append(c := opened(simnvml, three_gpus(without_counters)))
    turns = []
    for tick in range(5):
        calls = simnvml.calls("nvmlDeviceGetPcieThroughput")
        samples, _ = c.sample(time.time_ns())
        # TX and RX of one GPU: one tick blocks for at most ~40 ms on a real driver
        assert simnvml.calls("nvmlDeviceGetPcieThroughput") - calls == 2
        g0, g1, g2 = samples
        if tick == 0:
            assert (g0.pcie_tx_bytes_s, g0.pcie_rx_bytes_s) == (None, None)
        else:
            assert g0.pcie_tx_bytes_s == pytest.approx(1500 * 1024, rel=1e-2)
            assert g0.pcie_rx_bytes_s == pytest.approx(2500 * 1024, rel=1e-2)
        read = [s for s in (g1, g2) if s.pcie_tx_bytes_s is not None]
        assert len(read) == 1
        (s,) = read
        turns.append(s.gpu)
        tx, rx = PCIE_KB_S[s.gpu]
        assert (s.pcie_tx_bytes_s, s.pcie_rx_bytes_s) == (tx * 1024, rx * 1024)
        # the GPU not read this tick has no PCIe figure, not the last one carried forward
        other = g2 if s is g1 else g1
        assert (other.pcie_tx_bytes_s, other.pcie_rx_bytes_s) == (None, None)
        if without_counters != "whole_request" and tick > 0:
            assert g1.nvlink_tx_bytes_s == pytest.approx(1e6 * 1024, rel=1e-2)
        time.sleep(0.02)
    assert turns == [1, 2, 1, 2, 1]
    pcie_notices = [n for n in c.notices if "PCIe" in n]
    assert [n.split(":")[0] for n in pcie_notices] == [
        "PCIe byte counters not available on GPU 1",
        "PCIe byte counters not available on GPU 2",
    ]


def test_pcie_counter_fields_are_handled_one_by_one(simnvml, collectors):
    """Only RX lacks a counter: TX comes from it, RX alone from the fallback."""
    scenario = two_gpus()
    del scenario["gpus"][1]
    scenario["faults"] = [{"function": "field:198", "error": "no_permission", "gpu": 0}]
    collectors.append(c := opened(simnvml, scenario))
    (first,), _ = c.sample(time.time_ns())
    assert (first.pcie_tx_bytes_s, first.pcie_rx_bytes_s) == (None, 2500 * 1024)
    time.sleep(0.05)
    (second,), _ = c.sample(time.time_ns())
    assert second.pcie_tx_bytes_s == pytest.approx(1500 * 1024, rel=1e-2)
    assert second.pcie_rx_bytes_s == 2500 * 1024
    assert second.nvlink_tx_bytes_s == pytest.approx(2_000_000 * 1024, rel=1e-2)
    assert simnvml.calls("nvmlDeviceGetPcieThroughput") == 2  # RX only, once per tick
    assert simnvml.calls("nvmlDeviceGetFieldValues") == 2


def test_pcie_counter_wrap_gives_none_not_a_bogus_rate(simnvml, collectors):
    rate = 8192  # KB/s = 8 MiB/s: the 2 MiB counter wraps every 0.25 s
    scenario = {
        "gpus": [
            {
                "pcie_counter_wrap_bytes": 2 * 2**20,
                "series": {"pcie_tx_kb_s": rate, "pcie_rx_kb_s": rate},
            }
        ]
    }
    collectors.append(c := opened(simnvml, scenario))
    values = []
    deadline = time.monotonic() + 2.0
    while None not in values[1:] and time.monotonic() < deadline:
        (s,), _ = c.sample(time.time_ns())
        values.append(s.pcie_tx_bytes_s)
        time.sleep(0.02)
    assert values[0] is None and None in values[1:]  # the wrap
    rates = [v for v in values[1:] if v is not None]
    assert rates and rates == pytest.approx([rate * 1024] * len(rates), rel=1e-2)


def test_sample_never_blocks_on_pcie_throughput_with_counters(simnvml, collectors):
    scenario = {
        "gpus": [{"series": {"pcie_tx_kb_s": 1000 * (i + 1)}} for i in range(8)],
        "latency_us": {"nvmlDeviceGetPcieThroughput": 20_000},  # as a real driver blocks
    }
    collectors.append(c := opened(simnvml, scenario))
    durations = []
    for _ in range(3):
        start = time.perf_counter()
        samples, _ = c.sample(time.time_ns())
        durations.append(time.perf_counter() - start)
        assert len(samples) == 8
        time.sleep(0.01)
    assert min(durations) < 0.010, durations  # one blocking call alone would take 20 ms
    assert simnvml.calls("nvmlDeviceGetPcieThroughput") == 0
    assert [s.pcie_tx_bytes_s for s in samples] == pytest.approx(
        [1000 * (i + 1) * 1024 for i in range(8)], rel=1e-2
    )


def test_fallback_blocks_for_one_gpu_per_tick(simnvml, collectors):
    scenario = {
        "gpus": [{"pcie_counters": False} for _ in range(8)],
        "latency_us": {"nvmlDeviceGetPcieThroughput": 20_000},
    }
    collectors.append(c := opened(simnvml, scenario))
    start = time.perf_counter()
    samples, _ = c.sample(time.time_ns())
    elapsed = time.perf_counter() - start
    assert 0.040 <= elapsed < 0.100, elapsed  # TX + RX of one GPU, not 8 x 40 ms
    assert sum(s.pcie_tx_bytes_s is not None for s in samples) == 1


def test_gpu_lost_mid_run(simnvml, collectors):
    scenario = two_gpus()
    scenario["gpus"][1]["lost_at_s"] = 0.2
    collectors.append(c := opened(simnvml, scenario))
    samples, events = c.sample(time.time_ns())
    assert [s.gpu for s in samples] == [0, 1] and events == []
    time.sleep(0.3)
    seen_events = []
    for _ in range(3):
        samples, events = c.sample(time.time_ns())
        assert [s.gpu for s in samples] == [0]
        assert samples[0].util_gpu_pct == 42
        seen_events += events
    assert len(seen_events) == 1
    (event,) = seen_events
    assert (event.kind, event.name, event.host) == ("nvml_fault", "gpu_lost", "node0")
    assert event.attrs == {
        "gpu": 1,
        "uuid": "GPU-bbbbbbbb-0000-0000-0000-000000000001",
        "error": "GPU is lost",
    }
    assert [g["lost"] for g in c.inventory()] == [False, True]
    assert [p.gpu for p in c.sample_processes(time.time_ns(), set())] == []
    assert any(n.startswith("GPU 1 lost") for n in c.notices)


def test_gpu_lost_before_open_stays_in_inventory(simnvml, collectors):
    scenario = two_gpus()
    scenario["gpus"][0]["lost_at_s"] = -1.0
    collectors.append(c := opened(simnvml, scenario))
    assert [(g["index"], g["lost"]) for g in c.inventory()] == [(0, True), (1, False)]
    samples, events = c.sample(time.time_ns())
    assert [s.gpu for s in samples] == [1]
    assert [(e.name, e.attrs["gpu"]) for e in events] == [("gpu_lost", 0)]
    assert c.sample(time.time_ns())[1] == []


def test_driver_not_loaded(simnvml):
    simnvml.use({"init_error": "driver_not_loaded", "gpus": 1})
    c = NvmlCollector("node0")
    assert c.open() is False
    assert c.notice == "NVML not available (NVIDIA driver not loaded): profiling host only"
    assert c.notices == [c.notice]
    assert c.sample(time.time_ns()) == ([], [])
    assert c.sample_processes(time.time_ns(), {1}) == []
    assert c.inventory() == []
    assert c.versions()["driver_version"] is None
    c.close()


def test_no_gpu(simnvml):
    simnvml.use({"gpus": 0})
    c = NvmlCollector("node0")
    assert c.open() is False
    assert c.notice == "NVML found no GPU: profiling host only"


# -- processes -------------------------------------------------------------------------------


def processes_scenario() -> dict:
    scenario = two_gpus()
    scenario["gpus"][0]["processes"] = [
        {"pid": 4001, "used_mem_bytes": 20 * GiB, "sm_util_pct": 65},
        {"pid": 4002, "used_mem_bytes": 2 * GiB, "sm_util_pct": 0},
    ]
    scenario["gpus"][1]["processes"] = [
        {"pid": 4003, "used_mem_bytes": 3 * GiB, "sm_util_pct": 12},
        {"pid": 4004, "used_mem_bytes": GiB, "type": "graphics"},
        {"pid": 4005, "used_mem_bytes": GiB, "start_s": 100.0},  # not started yet
    ]
    return scenario


def test_processes_per_gpu_with_watched(simnvml, collectors):
    collectors.append(c := opened(simnvml, processes_scenario()))
    t_ns = time.time_ns()
    procs = c.sample_processes(t_ns, {4001, 4003, 999})
    assert {(p.gpu, p.pid, p.gpu_mem_bytes, p.sm_util_pct, p.watched) for p in procs} == {
        (0, 4001, 20 * GiB, 65.0, True),
        (0, 4002, 2 * GiB, 0.0, False),
        (1, 4003, 3 * GiB, 12.0, True),
        (1, 4004, GiB, 0.0, False),
    }
    assert all(p.host == "node0" and p.t_ns == t_ns for p in procs)


def test_processes_without_process_utilization(simnvml, collectors):
    scenario = processes_scenario()
    scenario["faults"] = [
        {"function": "nvmlDeviceGetProcessUtilization", "error": "not_supported", "gpu": 0}
    ]
    collectors.append(c := opened(simnvml, scenario))
    procs = c.sample_processes(time.time_ns(), set())
    assert {(p.gpu, p.pid, p.sm_util_pct) for p in procs} == {
        (0, 4001, None),
        (0, 4002, None),
        (1, 4003, 12.0),
        (1, 4004, 0.0),
    }
    assert "nvmlDeviceGetProcessUtilization not supported on GPU 0" in c.notices


# -- the simulated library itself ------------------------------------------------------------


def test_sim_get_samples_has_the_driver_buffer_semantics(simnvml):
    import pynvml

    simnvml.use({"sample_period_s": 0.05, "sample_buffer": 40, "gpus": 1})
    pynvml.nvmlInit()
    try:
        handle = pynvml.nvmlDeviceGetHandleByIndex(0)
        fn = pynvml.nvmlLib.nvmlDeviceGetSamples
        value_type, count = ctypes.c_uint(), ctypes.c_uint(0)
        utilization = pynvml.NVML_GPU_UTILIZATION_SAMPLES
        # size query: NULL buffer gives the number of buffered entries
        size_query = fn(
            handle,
            utilization,
            ctypes.c_ulonglong(0),
            ctypes.byref(value_type),
            ctypes.byref(count),
            None,
        )
        assert size_query == pynvml.NVML_SUCCESS
        assert count.value == 40
        _, samples = pynvml.nvmlDeviceGetSamples(handle, utilization, 0)
        stamps = [s.timeStamp for s in samples]
        assert len(stamps) == 40 and stamps == sorted(stamps)
        assert {b - a for a, b in itertools.pairwise(stamps)} == {50_000}  # µs
        # nothing newer than the newest: NOT_FOUND, as the driver says
        with pytest.raises(pynvml.NVMLError_NotFound):
            pynvml.nvmlDeviceGetSamples(handle, utilization, stamps[-1])
        time.sleep(0.12)
        _, newer = pynvml.nvmlDeviceGetSamples(handle, utilization, stamps[-1])
        assert 2 <= len(newer) <= 3 and newer[0].timeStamp == stamps[-1] + 50_000
    finally:
        pynvml.nvmlShutdown()


def test_library_build_is_cached_and_can_omit_functions(simnvml_build):
    full = simnvml_build()
    assert full.name == "libnvidia-ml.so.1"
    mtime = full.stat().st_mtime_ns
    assert simnvml_build() == full and full.stat().st_mtime_ns == mtime
    no_gpm = simnvml_build(without=GPM_FUNCTIONS)
    assert no_gpm != full and no_gpm.name == full.name
    lib = ctypes.CDLL(str(no_gpm))
    assert not any(hasattr(lib, name) for name in GPM_FUNCTIONS)
    assert hasattr(lib, "nvmlDeviceGetSamples")


# -- subprocess cases: another library build, or none ----------------------------------------

CHILD = r"""
import dataclasses, json, sys, time
from gpuprof.collectors.nvml import NvmlCollector

out = {"pynvml_at_import": "pynvml" in sys.modules}
c = NvmlCollector("child")
out["ok"] = c.open()
out["notice"] = c.notice
if out["ok"]:
    c.sample(time.time_ns())
    time.sleep(0.15)
    samples, events = c.sample(time.time_ns())
    out["samples"] = [dataclasses.asdict(s) for s in samples]
    out["events"] = [dataclasses.asdict(e) for e in events]
    out["procs"] = [dataclasses.asdict(p) for p in c.sample_processes(time.time_ns(), {4001})]
    out["inventory"] = c.inventory()
    c.close()
out["notices"] = c.notices
print(json.dumps(out))
"""


def run_child(env: dict[str, str]) -> dict:
    env = dict(env)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO_ROOT), env.get("PYTHONPATH")) if p)
    proc = subprocess.run(
        [sys.executable, "-c", CHILD], env=env, capture_output=True, text=True, timeout=60
    )
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_library_missing(tmp_path):
    env = {k: v for k, v in os.environ.items() if k not in ("LD_LIBRARY_PATH", SCENARIO_ENV)}
    env["LD_LIBRARY_PATH"] = str(tmp_path)  # an empty directory
    out = run_child(env)
    if out["ok"]:
        pytest.skip("a real libnvidia-ml.so.1 is installed on this machine")
    assert out["pynvml_at_import"] is False  # NVML is only touched by open()
    assert out["notice"] == "NVML not available (libnvidia-ml.so.1 not found): profiling host only"
    assert out["notices"] == [out["notice"]]


OLD_DRIVER = (
    *GPM_FUNCTIONS,
    "nvmlDeviceGetMemoryInfo_v2",
    "nvmlDeviceGetTemperatureV",
    "nvmlDeviceGetCurrentClocksEventReasons",
    "nvmlDeviceGetComputeRunningProcesses_v3",
    "nvmlDeviceGetGraphicsRunningProcesses_v3",
)


def test_old_driver_without_gpm_and_newer_functions(simnvml_build, tmp_path):
    library = simnvml_build(without=OLD_DRIVER)
    scenario = write_scenario(tmp_path / "scenario.txt", processes_scenario())
    out = run_child(simnvml_env(library, scenario))
    assert out["ok"], out["notice"]
    assert [g["gpm_supported"] for g in out["inventory"]] == [False, False]
    g0, g1 = out["samples"]
    # GPM functions missing: FunctionNotFound is handled, the GPM figures are unknown
    for key in ("sm_active_pct", "sm_occupancy_pct", "tensor_active_pct", "dram_active_pct"):
        assert g0[key] is None and g1[key] is None
    # the older variants stand in for the missing ones
    assert g0["mem_used_bytes"] == 30 * GiB + GiB // 2  # v1 counts reserved memory as used
    assert (g0["temp_c"], g0["clock_event_reasons"], g0["util_gpu_pct"]) == (61, 4, 42)
    assert g0["nvlink_tx_bytes_s"] == pytest.approx(2_000_000 * 1024, rel=1e-3)
    assert out["events"] == []
    assert {(p["gpu"], p["pid"], p["watched"]) for p in out["procs"]} == {
        (0, 4001, True),
        (0, 4002, False),
        (1, 4003, False),
        (1, 4004, False),
    }
    assert any(n.startswith("GPM not supported on GPU 0, 1") for n in out["notices"])
    assert not any("Temperature" in n or "MemoryInfo" in n for n in out["notices"])


def test_watcher_style_subprocess_with_eight_gpus(simnvml_lib, tmp_path):
    scenario = {"gpus": [{"gpm": True, "series": {"util_gpu_pct": 10 * i}} for i in range(8)]}
    path = write_scenario(tmp_path / "scenario.txt", scenario)
    out = run_child(simnvml_env(simnvml_lib, path))
    assert out["ok"]
    assert [s["util_gpu_pct"] for s in out["samples"]] == [10.0 * i for i in range(8)]
    assert len({g["uuid"] for g in out["inventory"]}) == 8
