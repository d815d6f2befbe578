"""Experiment-tracker runs imported with the trackers' own libraries: a real W&B offline run
(its system monitor reading the simulated NVML library), W&B history exports, TensorBoard event
files from the real ``SummaryWriter`` and MLflow file-store runs from MLflow's client.

Nothing here touches the network: W&B runs offline with its directories under the test's
temporary directory, MLflow writes a local file store.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from conftest import clean_env, run_gpuprof, wandb_offline
from simnvml import simnvml_env, write_scenario

from gpuprof.collectors.importers import (
    ImportFormatError,
    detect,
    detect_dir,
    detect_uri,
    mlflow_run,
    tensorboard_events,
    wandb_history,
    wandb_run,
)
from gpuprof.collectors.importers.tracker_keys import INSTALL_HINT
from gpuprof.importing import parse_file
from gpuprof.store import load_run

pytest_plugins = ["simnvml.fixtures"]

GEN_S, UPDATE_S, STEP_S = 0.3, 0.1, 0.45
VERL_STEP = {
    "timing_s/gen": GEN_S,
    "timing_s/update_actor": UPDATE_S,
    "timing_s/step": STEP_S,
    "perf/mfu/actor": 0.31,
    "response_length/mean": 412.0,
    "actor/pg_loss": -0.02,
}
VERL_CONFIG = {
    "actor_rollout_ref": {"rollout": {"gpu_memory_utilization": 0.3, "n": 8}},
    "data": {"train_batch_size": 64},
    "trainer": {"n_gpus_per_node": 2},
}

WANDB_WRITER = """
import json, sys, time
import wandb
spec = json.loads(sys.argv[1])
stats = spec["stats_s"]
settings = wandb.Settings(x_stats_sampling_interval=stats or 15.0, x_disable_stats=not stats)
run = wandb.init(project="grpo", config=spec["config"], settings=settings)
for step, row in enumerate(spec["rows"], start=1):
    time.sleep(spec["sleep_s"])
    run.log({k: (float("nan") if v == "nan" else v) for k, v in row.items()}, step=step)
run.finish()
"""


def write_wandb_run(
    tmp: Path, rows: list[dict], *, config=None, sleep_s=0.0, stats_s=0.0, env=None
) -> Path:
    """A real offline W&B run written by wandb in a child process; returns its ``wandb/``."""
    pytest.importorskip("wandb")
    base = env or clean_env()
    base.update(wandb_offline(tmp))
    spec = {"config": config or {}, "rows": rows, "sleep_s": sleep_s, "stats_s": stats_s}
    subprocess.run(
        [sys.executable, "-c", WANDB_WRITER, json.dumps(spec)],
        env=base,
        check=True,
        timeout=120,
        capture_output=True,
    )
    return tmp / "wandb"


def import_and_analyze(tmp: Path, *sources: Path | str) -> tuple[dict, subprocess.CompletedProcess]:
    out = tmp / "imported"
    result = run_gpuprof("import", *map(str, sources), "-o", str(out))
    assert result.returncode == 0, result.stderr
    analyzed = run_gpuprof("analyze", str(out), "--json")
    assert analyzed.returncode == 0, analyzed.stderr
    return json.loads(analyzed.stdout), result


def phases_of(report: dict) -> set[str]:
    return set(report["summary"]["data_basis"]["phase_timing"]["phases"])


# --------------------------------------------------------------------------------------------
# W&B


def test_a_wandb_offline_run_with_system_gpu_metrics_is_imported_and_diagnosed(
    tmp_path, simnvml_lib
):
    """verl keys logged per step and the GPUs W&B's own system monitor sampled (here from the
    simulated NVML library): phases, steps, GPU samples on the same clock, the bound."""
    scenario = write_scenario(
        tmp_path / "scenario.txt",
        {
            "gpus": [
                {
                    "name": "NVIDIA H100 80GB HBM3",
                    "series": {
                        "util_gpu_pct": 15,
                        "mem_used_bytes": 20 * 2**30,
                        "power_mw": 180_000,
                        "temp_c": 48,
                        "pcie_tx_kb_s": 1000,
                    },
                },
                {"series": {"util_gpu_pct": 15, "mem_used_bytes": 20 * 2**30}},
            ]
        },
    )
    rows = [dict(VERL_STEP) for _ in range(8)]
    rows[2]["actor/pg_loss"] = "nan"
    env = simnvml_env(simnvml_lib, scenario, base=clean_env())
    wandb_dir = write_wandb_run(
        tmp_path, rows, config=VERL_CONFIG, sleep_s=STEP_S, stats_s=0.2, env=env
    )
    run_dir = next(wandb_dir.glob("offline-run-*"))
    assert detect_dir(run_dir) is wandb_run and detect_dir(wandb_dir) is wandb_run

    report, result = import_and_analyze(tmp_path, run_dir)
    summary = report["summary"]
    basis = summary["data_basis"]
    assert basis["phase_timing"]["steps"] == 8
    assert phases_of(report) == {"rollout", "update_actor"}
    assert basis["gpu_samples"]["gpus"] == 2 and basis["gpu_samples"]["samples"] >= 10
    assert summary["bound"]["bound"] == ["rollout"]
    assert "perf/mfu/actor" in basis["framework_counters"]
    assert "W&B's system metrics" in result.stderr and "NaN" in result.stderr

    run = load_run(tmp_path / "imported")
    assert run.meta.framework == "verl"
    assert run.meta.knobs["actor_rollout_ref.rollout.gpu_memory_utilization"] == 0.3
    assert run.meta.gpus[0]["name"] == "NVIDIA H100 80GB HBM3"
    assert run.meta.gpus[0]["mem_total_bytes"] == 80 * 2**30
    gpu0 = run.gpu[run.gpu["gpu"] == 0]
    assert (gpu0["util_gpu_pct"] == 15).all()
    assert (gpu0["mem_used_bytes"] == 20 * 2**30).all()
    assert (gpu0["power_w"] == 180).all() and (gpu0["pcie_tx_bytes_s"] == 1024 * 1000).all()
    # one clock: the GPU samples and the steps overlap in wall-clock time
    steps = run.spans[run.spans["phase"] == "step"]
    assert gpu0["t_ns"].min() < steps["end_ns"].max()
    assert steps["start_ns"].min() < gpu0["t_ns"].max()
    assert abs(steps["start_ns"].min() / 1e9 - time.time()) < 600
    durations = (steps["end_ns"] - steps["start_ns"]) / 1e9
    assert np.allclose(durations, STEP_S)
    kept = steps["attrs"].iloc[0]
    assert kept["response_length/mean"] == 412.0 and kept["metrics"]["actor/pg_loss"] == -0.02
    assert "actor/pg_loss" not in steps["attrs"].iloc[2].get("metrics", {})
    # the recommendation reads the config's current value
    knob = [r for r in report["recommendations"] if r["knob"].endswith("gpu_memory_utilization")]
    assert knob and "0.3" in str(knob[0]["current"])


def test_a_wandb_run_without_usable_keys_is_one_line(tmp_path):
    wandb_dir = write_wandb_run(tmp_path, [{"loss": 0.5}, {"loss": 0.4}])
    result = run_gpuprof("import", str(wandb_dir), "-o", str(tmp_path / "out"))
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "no usable keys in this W&B run" in lines[0] and "loss" in lines[0]
    assert not (tmp_path / "out").exists()


def test_a_wandb_file_alone_and_several_runs(tmp_path):
    rows = [dict(VERL_STEP) for _ in range(3)]
    wandb_dir = write_wandb_run(tmp_path / "a", rows)
    file = next(wandb_dir.glob("offline-run-*/run-*.wandb"))
    assert detect(file) is wandb_run
    part = parse_file(file)
    assert part.format == "wandb-run" and part.anchored
    assert set(part.frames["spans"]["phase"]) == {"rollout", "update_actor", "step"}
    # a second run in the same wandb/ directory: the directory is ambiguous
    second = wandb_dir / "offline-run-20991231_000000-zzzzzzzz"
    second.mkdir()
    (second / "run-zzzzzzzz.wandb").write_bytes(file.read_bytes())
    with pytest.raises(ImportFormatError, match="holds 2 W&B runs"):
        parse_file(wandb_dir)


def test_a_missing_tracker_library_is_one_line_naming_the_extra(tmp_path, monkeypatch):
    run_dir = tmp_path / "wandb" / "offline-run-20260101_000000-abc"
    run_dir.mkdir(parents=True)
    (run_dir / "run-abc.wandb").write_bytes(b":W&B\x00\x01\x00")
    monkeypatch.setitem(sys.modules, "wandb", None)  # import wandb raises ImportError
    with pytest.raises(ImportFormatError) as caught:
        parse_file(run_dir)
    assert INSTALL_HINT in str(caught.value) and "\n" not in str(caught.value)


def test_tracker_libraries_are_imported_only_when_such_a_run_is(tmp_path):
    csv = tmp_path / "smi.csv"
    csv.write_text("timestamp, index, utilization.gpu [%]\n2024/01/01 00:00:00.000, 0, 50 %\n")
    code = (
        "import sys; from pathlib import Path\n"
        "from gpuprof.collectors.importers import detect, detect_dir, modules\n"
        "modules(); detect(Path(sys.argv[1]))\n"
        "try: detect_dir(Path(sys.argv[2]))\n"
        "except Exception: pass\n"
        "print(sorted(m for m in ('wandb', 'mlflow', 'tensorboard') if m in sys.modules))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code, str(csv), str(tmp_path)],
        capture_output=True,
        text=True,
        env=clean_env(),
        check=True,
    )
    assert done.stdout.strip() == "[]"


# --------------------------------------------------------------------------------------------
# W&B history exports


def history_frame(steps: int = 6, t0: float = 1_760_000_000.0) -> pd.DataFrame:
    """What ``run.history()`` returns: ``_step``, ``_runtime``, ``_timestamp`` and the keys,
    system metrics (``stream="system"``) as ``system.gpu.N.*`` rows of their own."""
    rows = []
    for step in range(1, steps + 1):
        end = t0 + step * STEP_S * 10
        rows.append(
            {
                "_step": step,
                "_runtime": end - t0,
                "_timestamp": end,
                **{k: v * 10 if k.startswith("timing") else v for k, v in VERL_STEP.items()},
            }
        )
        for k in range(4):  # four system samples per step, GPU busy 90%
            rows.append(
                {
                    "_timestamp": end - k * 1.0,
                    "_runtime": end - k - t0,
                    "system.gpu.0.gpu": 90.0,
                    "system.gpu.0.memoryAllocatedBytes": 3e10,
                    "system.gpu.0.powerWatts": 400.0,
                }
            )

    frame = pd.DataFrame(rows)
    frame.loc[3, "timing_s/gen"] = np.nan  # a step without that value: not a row to reject
    return frame


@pytest.mark.parametrize("kind", ["csv", "jsonl", "json", "parquet"])
def test_a_wandb_history_export_is_imported(tmp_path, kind):
    frame = history_frame()
    path = tmp_path / f"history.{kind}"
    if kind == "csv":
        frame.to_csv(path)  # with the index column, as pandas writes it
    elif kind == "jsonl":  # scan_history() dicts, one per line, missing keys absent
        lines = [
            json.dumps({k: v for k, v in r.items() if pd.notna(v)})
            for r in frame.to_dict("records")
        ]
        path.write_text("\n".join(lines) + "\n")
    elif kind == "json":
        frame.to_json(path, orient="records")
    else:
        frame.to_parquet(path)
    assert detect(path) is wandb_history
    part = parse_file(path)
    spans = part.frames["spans"]
    assert part.anchored and part.meta["framework"] == "verl"
    assert (spans["phase"] == "step").sum() == 6
    assert set(spans["phase"]) == {"rollout", "update_actor", "step"}
    gpu = part.frames["gpu"]
    assert len(gpu) == 24 and (gpu["util_gpu_pct"] == 90).all()
    assert (gpu["mem_used_bytes"] == 3e10).all()
    assert any("every 1 s" in n for n in part.notes)


def test_a_wandb_history_csv_diagnosed_through_the_cli(tmp_path):
    path = tmp_path / "history.csv"
    history_frame(steps=8).to_csv(path, index=False)
    report, _ = import_and_analyze(tmp_path, path)
    assert report["summary"]["data_basis"]["phase_timing"]["steps"] == 8
    assert report["summary"]["bound"]["bound"] == ["rollout"]
    assert report["summary"]["data_basis"]["gpu_samples"]["interval_s"] == 1.0


def test_a_wandb_chart_export_is_read_unanchored(tmp_path):
    path = tmp_path / "chart.csv"
    path.write_text(
        "Step,grpo-7b - timing_s/gen,grpo-7b - timing_s/gen__MIN,grpo-7b - timing_s/gen__MAX\n"
        "1,30.5,30.5,30.5\n2,31.0,31.0,31.0\n"
    )
    assert detect(path) is wandb_history
    part = parse_file(path)
    assert not part.anchored
    assert list(part.frames["spans"]["phase"]) == ["rollout", "step", "rollout", "step"]


# --------------------------------------------------------------------------------------------
# TensorBoard


def write_tensorboard(log_dir: Path, steps: int, keys: dict[str, float] | None = None) -> None:
    from torch.utils.tensorboard import SummaryWriter

    writer = SummaryWriter(str(log_dir))
    for step in range(1, steps + 1):
        for key, value in (keys or VERL_STEP).items():
            writer.add_scalar(key, value, step)
    writer.close()


def test_tensorboard_event_files_are_imported_recursively(tmp_path):
    pytest.importorskip("tensorboard")
    root = tmp_path / "tensorboard_log"
    write_tensorboard(root / "grpo" / "qwen-7b", steps=5)
    assert detect_dir(root) is tensorboard_events
    report, result = import_and_analyze(tmp_path, root)
    # written in a burst (no training between): laid one after another, and said so
    assert "moved to start where the previous one ended" in result.stderr
    assert report["summary"]["data_basis"]["phase_timing"]["steps"] == 5
    assert phases_of(report) == {"rollout", "update_actor"}
    assert report["summary"]["bound"]["bound"] == ["rollout"]
    assert "actor/pg_loss" in result.stderr  # kept, and said where
    # one event file alone
    event_file = next(root.rglob("events.out.tfevents.*"))
    assert detect(event_file) is tensorboard_events
    part = parse_file(event_file)
    assert part.anchored and (part.frames["spans"]["phase"] == "step").sum() == 5
    steps = part.frames["spans"].query("phase == 'step'")
    assert abs(steps["end_ns"].max() / 1e9 - time.time()) < 600


def test_tensorboard_runs_that_log_the_same_tag_are_several_runs(tmp_path):
    pytest.importorskip("tensorboard")
    write_tensorboard(tmp_path / "logs" / "run1", steps=2)
    write_tensorboard(tmp_path / "logs" / "run2", steps=2)
    result = run_gpuprof("import", str(tmp_path / "logs"), "-o", str(tmp_path / "out"))
    assert result.returncode == 2
    assert len(result.stderr.strip().splitlines()) == 1 and "both log" in result.stderr


def test_tensorboard_with_no_usable_keys_is_one_line(tmp_path):
    pytest.importorskip("tensorboard")
    write_tensorboard(tmp_path / "logs", steps=3, keys={"train/loss": 0.3})
    result = run_gpuprof("import", str(tmp_path / "logs"), "-o", str(tmp_path / "out"))
    assert result.returncode == 2
    line = result.stderr.strip()
    assert "\n" not in line and "no usable keys in this TensorBoard run" in line


# --------------------------------------------------------------------------------------------
# MLflow


@pytest.fixture
def mlflow_store(tmp_path, monkeypatch):
    pytest.importorskip("mlflow")
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")
    return tmp_path / "mlruns"


def write_mlflow_run(store: Path, *, steps: int, trl: bool = False) -> str:
    """A file-store run written with MLflow's client: verl-style params and per-step metrics
    (or TRL's profiled calls), plus ``system/gpu_0_*`` as MLflow's system monitor logs them."""
    from mlflow.entities import Metric, Param
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=store.resolve().as_uri())
    experiment = client.create_experiment(f"grpo-{time.monotonic_ns()}")
    run = client.create_run(experiment)
    run_id = run.info.run_id
    t0 = int(time.time() * 1000) - steps * 10_000
    metrics = []
    for step in range(1, steps + 1):
        end = t0 + step * 10_000
        if trl:  # TRL's profiling_context: mlflow.log_metrics({...}, step=global_step)
            for name, seconds, at in (
                ("_generate", 6.0, end - 3500),
                ("_calculate_rewards", 1.0, end - 2000),
                ("training_step", 2.0, end),
            ):
                key = f"profiling/Time taken: GRPOTrainer.{name}"
                metrics.append(Metric(key, seconds, at, step))
        else:
            for key, value in VERL_STEP.items():
                scaled = value * 20 if key.startswith("timing") else value
                metrics.append(Metric(key, scaled, end, step))
        for k in range(10):  # the system monitor: its own sample counter as step
            at = end - 10_000 + k * 1000
            metrics += [
                Metric("system/gpu_0_utilization_percentage", 30.0, at, step * 10 + k),
                Metric("system/gpu_0_memory_usage_megabytes", 40_000.0, at, step * 10 + k),
                Metric("system/gpu_0_memory_usage_percentage", 50.0, at, step * 10 + k),
                Metric("system/cpu_utilization_percentage", 12.0, at, step * 10 + k),
            ]

    params = [Param("actor_rollout_ref.rollout.gpu_memory_utilization", "0.3")]
    for start in range(0, len(metrics), 1000):
        client.log_batch(
            run_id, metrics=metrics[start : start + 1000], params=params if start == 0 else []
        )
    client.set_terminated(run_id)
    return run_id


def test_an_mlflow_file_store_run_is_imported_and_diagnosed(tmp_path, mlflow_store):
    run_id = write_mlflow_run(mlflow_store, steps=6)
    run_dir = next(mlflow_store.glob(f"*/{run_id}"))
    for where in (run_dir, run_dir.parent, mlflow_store):
        assert detect_dir(where) is mlflow_run
    report, result = import_and_analyze(tmp_path, mlflow_store)
    basis = report["summary"]["data_basis"]
    assert basis["phase_timing"]["steps"] == 6
    assert phases_of(report) == {"rollout", "update_actor"}
    assert basis["gpu_samples"] == {"gpus": 1, "samples": 60, "interval_s": 1.0}
    assert report["summary"]["bound"]["bound"] == ["rollout"]
    assert "cpu_utilization_percentage" in result.stderr  # said, not silently dropped
    run = load_run(tmp_path / "imported")
    assert run.meta.knobs["actor_rollout_ref.rollout.gpu_memory_utilization"] == 0.3
    assert (run.gpu["mem_used_bytes"] == 4e10).all()
    assert run.meta.gpus[0]["mem_total_bytes"] == 8e10


def test_an_mlflow_run_by_uri_and_trl_profiled_calls(tmp_path, mlflow_store, monkeypatch):
    run_id = write_mlflow_run(mlflow_store, steps=4, trl=True)
    assert detect_uri(f"runs:/{run_id}") is mlflow_run
    monkeypatch.setenv("MLFLOW_TRACKING_URI", mlflow_store.resolve().as_uri())
    part = parse_file(Path(f"runs:/{run_id}"))
    assert part.meta["framework"] == "trl"
    spans = part.frames["spans"]
    phases = spans.groupby("phase").size().to_dict()
    assert phases == {"rollout": 4, "reward": 4, "update_actor": 4, "step": 4}
    reward = spans[spans["phase"] == "reward"].iloc[0]
    assert (reward["end_ns"] - reward["start_ns"]) == 1_000_000_000
    # the CLI the same way (the URI names no file)
    env = clean_env(MLFLOW_TRACKING_URI=mlflow_store.resolve().as_uri())
    result = run_gpuprof("import", f"runs:/{run_id}", "-o", str(tmp_path / "out"), env=env)
    assert result.returncode == 0, result.stderr


def test_an_mlflow_tree_of_several_runs_is_one_line(tmp_path, mlflow_store):
    write_mlflow_run(mlflow_store, steps=2)
    write_mlflow_run(mlflow_store, steps=2)
    with pytest.raises(ImportFormatError, match="holds 2 MLflow runs"):
        parse_file(mlflow_store)


# --------------------------------------------------------------------------------------------
# bad input


def test_an_empty_directory_is_one_line_exit_2(tmp_path):
    (tmp_path / "empty").mkdir()
    result = run_gpuprof("import", str(tmp_path / "empty"), "-o", str(tmp_path / "out"))
    assert result.returncode == 2
    assert result.stderr.strip().count("\n") == 0
    assert "no W&B run, MLflow run or TensorBoard event files" in result.stderr
