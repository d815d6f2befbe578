"""`gpuprof watch` with simulated GPUs: the real pynvml loads the simulated libnvidia-ml.so.1."""

from __future__ import annotations

import sys
import textwrap

import pytest
from conftest import ROOT, clean_env, run_gpuprof
from simnvml import simnvml_env, write_scenario

from gpuprof import store

pytest_plugins = ["simnvml.fixtures"]

PHASES = ["dataload", "rollout", "reward", "old_logprob", "ref_logprob", "advantage",
          "update_actor", "reshard"]  # fmt: skip


def eight_gpus(extra: dict | None = None) -> dict:
    """Eight GPM-capable GPUs; ``extra`` maps a GPU index to overrides, "top" to scenario keys."""
    extra = extra or {}
    gpus = []
    for i in range(8):
        gpus.append(
            {
                "name": "NVIDIA H100 80GB HBM3",
                "gpm": True,
                "series": {
                    "util_gpu_pct": [(0, 10 + i), (1.0, 80 + i)],
                    "mem_used_bytes": (10 + i) * 2**30,
                    "power_mw": 300_000 + 1000 * i,
                    "sm_active_pct": 40 + i,
                },
                **extra.get(i, {}),
            }
        )
    return {"gpus": gpus, **extra.get("top", {})}


def watch_sim(tmp_path, lib, scenario, argv, *flags):
    path = write_scenario(tmp_path / "scenario.txt", scenario)
    run_dir = tmp_path / "run"
    env = simnvml_env(lib, path, base=clean_env())
    result = run_gpuprof("watch", "-o", str(run_dir), *flags, "--", *argv, env=env, timeout=240)
    return result, run_dir


def test_watch_the_example_on_eight_simulated_gpus(tmp_path, simnvml_lib):
    pytest.importorskip("torch")
    steps = 4
    argv = [sys.executable, str(ROOT / "examples" / "grpo_tiny.py"), "--steps", str(steps),
            "--batch-size", "8", "--num-workers", "1"]  # fmt: skip
    result, run_dir = watch_sim(tmp_path, simnvml_lib, eight_gpus(), argv)
    assert result.returncode == 0, result.stderr
    run = store.load_run(run_dir)
    # samples for every GPU, with the scenario's values
    assert sorted(run.gpu["gpu"].unique()) == list(range(8))
    assert len(run.meta.gpus) == 8 and run.meta.driver_version
    per_gpu = run.gpu.groupby("gpu")
    assert (per_gpu.size() >= 5).all()
    mem = per_gpu["mem_used_bytes"].max()
    assert list(mem) == [(10 + i) * 2**30 for i in range(8)]
    assert list(per_gpu["power_w"].max()) == [300.0 + i for i in range(8)]
    assert set(run.gpu["util_gpu_pct"].dropna()) <= {10.0 + i for i in range(8)} | {
        80.0 + i for i in range(8)
    }
    # spans for every phase of every step
    spans = run.spans
    for phase in [*PHASES, "step"]:
        steps_seen = sorted(spans.loc[spans["phase"] == phase, "step"].unique())
        assert steps_seen == list(range(steps)), (phase, steps_seen)
    # the example's own output was stored, with the per-step lines
    assert run.logs["line"].str.startswith("step ").sum() == steps
    # the summary names every GPU and phase
    for phase in PHASES:
        assert phase in result.stderr
    assert "H100" in result.stderr
    # then a diagnosis of the run, pointing at the full one
    assert f"full diagnosis: gpuprof analyze {run_dir}" in result.stderr
    assert "Findings, by GPU-time lost" in result.stderr or "No stall above" in result.stderr


def test_a_gpu_lost_mid_run_is_recorded_and_watch_goes_on(tmp_path, simnvml_lib):
    scenario = eight_gpus({3: {"lost_at_s": 0.6}})
    code = textwrap.dedent(
        """
        import time, gpuprof
        for i in range(6):
            with gpuprof.phase("rollout"):
                time.sleep(0.25)
            gpuprof.step()
        """
    )
    result, run_dir = watch_sim(tmp_path, simnvml_lib, scenario, [sys.executable, "-c", code],
                                "--interval", "0.1")  # fmt: skip
    assert result.returncode == 0, result.stderr
    run = store.load_run(run_dir)
    faults = run.events[run.events["kind"] == "nvml_fault"]
    assert list(faults["name"]) == ["gpu_lost"]
    assert faults.iloc[0]["attrs"]["gpu"] == 3
    lost_at = faults.iloc[0]["t_ns"]
    gpu3 = run.gpu[run.gpu["gpu"] == 3]
    assert gpu3["t_ns"].max() < lost_at  # no samples after it was lost
    others = run.gpu[run.gpu["gpu"] != 3]
    assert (others.groupby("gpu")["t_ns"].max() > lost_at + 0.5e9).all()  # the rest go on
    assert len(run.spans[run.spans["phase"] == "rollout"]) == 6
    assert "lost" in result.stderr


def test_without_the_library_watch_profiles_the_host_and_says_so_once(tmp_path):
    env = clean_env(LD_LIBRARY_PATH=str(tmp_path))  # no libnvidia-ml.so.1 anywhere
    run_dir = tmp_path / "run"
    code = "import gpuprof\nwith gpuprof.phase('rollout'): pass"
    result = run_gpuprof("watch", "-o", str(run_dir), "--", sys.executable, "-c", code, env=env)
    assert result.returncode == 0
    nvml_lines = [line for line in result.stderr.splitlines() if "NVML" in line]
    assert len(nvml_lines) == 2, result.stderr  # the notice when starting, repeated in the summary
    assert nvml_lines[0].startswith("gpuprof: NVML not available")
    assert "Traceback" not in result.stderr
    run = store.load_run(run_dir)
    assert run.gpu.empty and len(run.host) >= 1 and len(run.spans) == 1


def test_unsupported_metric_is_a_notice_not_an_error(tmp_path, simnvml_lib):
    fault = {"function": "nvmlDeviceGetPowerUsage", "error": "not_supported", "gpu": 2}
    scenario = eight_gpus({"top": {"faults": [fault]}})
    argv = [sys.executable, "-c", "import time; time.sleep(0.5)"]
    result, run_dir = watch_sim(tmp_path, simnvml_lib, scenario, argv)
    assert result.returncode == 0
    run = store.load_run(run_dir)
    power = run.gpu.groupby("gpu")["power_w"]
    assert power.count()[2] == 0 and (power.count().drop(2) > 0).all()  # NaN, never 0
    assert any("nvmlDeviceGetPowerUsage" in n and "GPU 2" in n for n in run.meta.notices)
