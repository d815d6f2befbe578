"""A run recorded by `gpuprof watch` on a real H100 (tests/fixtures_gpu/README.md).

The simulated NVML library stands in for the driver everywhere else; these tests hold the
product to what the real driver gave: the fields it read, the diagnosis of a real CUDA run,
and agreement with nvidia-smi logging the same GPU beside it.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np

from gpuprof import loader

FIXTURES = Path(__file__).resolve().parent / "fixtures_gpu"
RUN = FIXTURES / "h100_grpo_watch"
SMI = FIXTURES / "h100_grpo_nvidia_smi.csv"


def gpuprof(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "gpuprof", *args],
        capture_output=True,
        text=True,
        env={**os.environ, **(env or {})},
        check=False,
    )


def copied_run(tmp_path: Path) -> Path:
    """The run in a writable place: analysis keeps what it derives beside the run's files."""
    run = tmp_path / "h100_grpo_watch"
    shutil.copytree(RUN, run)
    return run


def test_real_h100_run_is_diagnosed(tmp_path):
    out = gpuprof("analyze", str(copied_run(tmp_path)), "--json")
    assert out.returncode == 0, out.stderr
    doc = json.loads(out.stdout)
    summary = doc["summary"]
    assert summary["gpus"] == 1 and summary["steps"] == 40
    # GPM read through the real driver on Hopper: SM activity beside NVML's utilisation
    assert 60 < summary["mean_sm_active_pct"] < summary["mean_util_gpu_pct"] < 80
    assert summary["data_basis"]["gpu_samples"]["interval_s"] == 0.1
    # the example's policy generates without a KV cache: the rollout takes most of the step
    bound = summary["bound"]
    assert bound["bound"] == ["rollout"] and 0.55 < bound["composition"][0]["share"] < 0.7
    # 1.3 GB held of 80 GB: the one stall the run has
    assert [f["kind"] for f in doc["findings"]] == ["memory_headroom"]
    # a VM with one GPU has no NVLink: said once, not taken for zero traffic
    assert doc["notes"] == ["NVLink throughput counters not available on GPU 0"]
    assert summary["idle_gpu_s_by_cause"]["startup"] > 5


def test_live_collector_agrees_with_nvidia_smi_beside_it(tmp_path):
    """The mean utilisation over the window both recorded: gpuprof's NVML sampling against
    nvidia-smi's own log of the same GPU, imported (71.6% and 72.1% when recorded)."""
    imported = tmp_path / "smi"
    out = gpuprof("import", str(SMI), "-o", str(imported), env={"TZ": "UTC"})
    assert out.returncode == 0, out.stderr
    live = loader.load_for_analysis(copied_run(tmp_path)).gpu
    smi = loader.load_for_analysis(imported).gpu
    lo = max(live["t_ns"].min(), smi["t_ns"].min())
    hi = min(live["t_ns"].max(), smi["t_ns"].max())
    assert (hi - lo) / 1e9 > 45  # the window is the whole watched run

    def mean_util(gpu) -> float:
        inside = (gpu["t_ns"] >= lo) & (gpu["t_ns"] <= hi)
        return float(np.nanmean(gpu.loc[inside, "util_gpu_pct"]))

    assert abs(mean_util(live) - mean_util(smi)) < 1.5
    assert 65 < mean_util(live) < 80
