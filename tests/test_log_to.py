"""`gpuprof watch --log-to wandb|tensorboard|mlflow`: gpuprof's live figures, the diagnosis and
the report logged into the trackers' own runs by a real watch on simulated GPUs, read back with
each tracker's own reader; and trackers that are misconfigured, unreachable, missing or hung,
which cost one line each and never the command's exit code or pace.

Nothing here touches the network: W&B runs offline with its directories under the test's
temporary directory, MLflow writes a local file store, TensorBoard a local directory.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from conftest import clean_env, gpuprof_cmd, run_gpuprof, wandb_offline
from simnvml import simnvml_env, write_scenario

from gpuprof import store
from gpuprof.model import GpuSample
from gpuprof.reports.live import LiveState
from gpuprof.reports.live_run import LiveRun
from gpuprof.reports.trackers import (
    diagnosis_figures,
    live_figures,
    metric_name,
    parse_log_to,
    target,
)

pytest_plugins = ["simnvml.fixtures"]

S = 1_000_000_000
STEPS = 14


def training_loop(steps: int = STEPS) -> str:
    """A training loop of ``steps`` steps of ~0.18 s (a short rollout, a long reward phase)
    that exits with 3."""
    return textwrap.dedent(
        f"""
        import sys, time, gpuprof
        for step in range({steps}):
            with gpuprof.phase("rollout"):
                time.sleep(0.03)
            with gpuprof.phase("reward"):
                time.sleep(0.15)
            gpuprof.step(n=step)
        sys.exit(3)
        """
    )


# ----- what is logged, for known readings


def _gpu(gpu: int, t_ns: int, util: float) -> GpuSample:
    return GpuSample("n1", gpu, f"GPU-{gpu}", t_ns, util_gpu_pct=util)


def test_live_figures_utilization_over_the_window_idle_by_phase_steps_and_top_finding():
    live = LiveRun(LiveState(idle_util_pct=10), "n1")
    for k in range(41):  # 10 s at 4 Hz: GPU 0 idle from 2 s to 6 s, GPU 1 at 50 %
        t = k * S // 4
        live.take((t, [_gpu(0, t, 0 if 2 * S < t <= 6 * S else 90), _gpu(1, t, 50)], None))
    live.state.add_spans([(7, 0, "update_actor", 0, 10 * S), (7, 0, "reward", 2 * S, 6 * S)])
    live.state.add_steps([(7, 0, 3 * S), (7, 0, 5 * S), (7, 0, 7 * S)])
    figures, window = live_figures(live)
    m = figures.metrics
    assert m["gpuprof/gpu_util_pct_by_gpu/gpu0"] == pytest.approx(90 * 6 / 10)
    assert m["gpuprof/gpu_util_pct_by_gpu/gpu1"] == pytest.approx(50)
    assert m["gpuprof/gpu_util_pct"] == pytest.approx((54 + 50) / 2)
    assert m["gpuprof/sampled_gpu_s"] == pytest.approx(20)
    # a reading stands for the quarter second before it: the one at 6 s falls after the span
    assert m["gpuprof/idle_gpu_s_by_phase/reward"] == pytest.approx(3.75)
    assert m["gpuprof/idle_gpu_s_by_phase/update_actor"] == pytest.approx(0.25)
    assert m["gpuprof/idle_gpu_s"] == pytest.approx(4)
    assert m["gpuprof/steps"] == 3 and figures.step == 3
    assert m["gpuprof/step_time_s"] == pytest.approx(2.0)
    assert m["gpuprof/top_finding/idle_gpu_s"] == pytest.approx(3.75)
    assert m["gpuprof/top_finding/share_pct"] == pytest.approx(100 * 3.75 / 20)
    assert figures.texts == {"gpuprof/top_finding": "reward_bound (reward): 3.8 GPU-s idle, 19% "
                                                    "of the GPU-time so far"}  # fmt: skip
    # the next point is over the time since this one: both GPUs at 100 %
    for k in range(41, 81):
        t = k * S // 4
        live.take((t, [_gpu(0, t, 100), _gpu(1, t, 100)], None))
    figures, _ = live_figures(live, window)
    assert figures.metrics["gpuprof/gpu_util_pct"] == pytest.approx(100)
    assert figures.metrics["gpuprof/gpu_util_pct_by_gpu/gpu0"] == pytest.approx(100)
    # no phase: idle time is "no_phase", and nothing stands out
    empty = LiveRun(LiveState(), "n1")
    empty.take((0, [_gpu(0, 0, 0)], None))
    empty.take((S, [_gpu(0, S, 0)], None))
    figures, _ = live_figures(empty)
    assert figures.metrics["gpuprof/idle_gpu_s_by_phase/no_phase"] == pytest.approx(1)
    assert "gpuprof/top_finding/idle_gpu_s" not in figures.metrics and not figures.texts
    assert figures.step == 0


def test_diagnosis_figures_and_names_every_tracker_accepts():
    document = {
        "summary": {"mean_util_gpu_pct": 41.5, "idle_gpu_s": 12.0, "steps": 14,
                    "step_time_p50_s": 0.18, "mean_sm_active_pct": None,
                    "phases": [{"phase": "reward", "idle_gpu_s": 9.5},
                               {"phase": "odd name (x)", "idle_gpu_s": 1.0}],
                    "bound": {"verdict": "reward bounds the step"}},
        "findings": [{"kind": "reward_bound", "gpu_seconds_lost": 9.5, "share": 0.4,
                      "summary": "reward scoring takes 83% of the step"}],
    }  # fmt: skip
    figures = diagnosis_figures(document, step=14)
    assert figures.step == 14
    assert figures.metrics == {
        "gpuprof/diagnosis/gpu_util_pct": 41.5,
        "gpuprof/diagnosis/idle_gpu_s": 12.0,
        "gpuprof/diagnosis/steps": 14.0,
        "gpuprof/diagnosis/step_time_p50_s": 0.18,
        "gpuprof/diagnosis/idle_gpu_s_by_phase/reward": 9.5,
        "gpuprof/diagnosis/idle_gpu_s_by_phase/odd name _x_": 1.0,
        "gpuprof/diagnosis/top_finding/gpu_s_lost": 9.5,
        "gpuprof/diagnosis/top_finding/share_pct": 40.0,
    }
    assert figures.texts == {
        "gpuprof/diagnosis/top_finding": "reward_bound: reward scoring takes 83% of the step",
        "gpuprof/diagnosis/bound": "reward bounds the step",
    }
    assert metric_name("idle_gpu_s_by_phase", "../a:b") == "gpuprof/idle_gpu_s_by_phase/__a_b"
    message = figures.message("final")
    assert json.loads(json.dumps(message, allow_nan=False)) == message


def test_log_to_names_and_where_each_tracker_logs(tmp_path):
    assert parse_log_to(["wandb,MLflow", " tensorboard ", "wandb"]) == [
        "wandb", "mlflow", "tensorboard"]  # fmt: skip
    assert parse_log_to(["tb w&b"]) == ["tensorboard", "wandb"]
    with pytest.raises(ValueError, match="unknown tracker 'comet'"):
        parse_log_to(["wandb,comet"])
    cwd, run_dir = str(tmp_path), tmp_path / "run"
    verl = ["python3", "-m", "verl.trainer.main_ppo", "trainer.project_name=grpo",
            "trainer.experiment_name=qwen-7b",
            "trainer.logger=['console','mlflow','tensorboard']"]  # fmt: skip
    # W&B: the training's run in shared mode when online with a run id, else grouped
    spec = target("wandb", verl, {"WANDB_RUN_ID": "abc123"}, cwd, run_dir)
    assert spec["shared"] and spec["run_id"] == "abc123"
    assert (spec["project"], spec["name"]) == ("grpo", "qwen-7b")
    spec = target("wandb", verl, {"WANDB_RUN_ID": "abc123", "WANDB_MODE": "offline"}, cwd, run_dir)
    assert not spec["shared"] and spec["dir"] == cwd
    openrlhf = ["python", "-m", "openrlhf.cli.train_ppo_ray", "--wandb_project", "rlhf",
                "--wandb_group", "g1", "--wandb_run_name", "r1", "--use_tensorboard",
                "logs/tb"]  # fmt: skip
    spec = target("wandb", openrlhf, {}, cwd, run_dir)
    assert (spec["project"], spec["group"], spec["name"], spec["shared"]) == (
        "rlhf", "g1", "r1", False)  # fmt: skip
    # MLflow: verl's experiment and its own default tracking URI
    spec = target("mlflow", verl, {}, cwd, run_dir)
    assert spec["tracking_uri"] == "sqlite:////tmp/mlruns.db"
    assert (spec["experiment_name"], spec["run_name"], spec["run_id"]) == (
        "grpo", "qwen-7b", None)  # fmt: skip
    env = {"MLFLOW_TRACKING_URI": "http://mlflow:5000", "MLFLOW_RUN_ID": "r9"}
    spec = target("mlflow", ["python", "train.py"], env, cwd, run_dir)
    assert (spec["tracking_uri"], spec["run_id"]) == ("http://mlflow:5000", "r9")
    # TensorBoard: a gpuprof directory in the training's log directory
    tb = lambda argv, env={}: target("tensorboard", argv, env, cwd, run_dir)["dir"]  # noqa: E731
    assert tb(verl) == str(tmp_path / "tensorboard_log/grpo/qwen-7b/gpuprof")
    assert tb(verl, {"TENSORBOARD_DIR": "/logs/x"}) == "/logs/x/gpuprof"
    trl = ["accelerate", "launch", "train_grpo.py", "--output_dir", "out", "--logging_dir", "tb"]
    assert tb(trl) == str(tmp_path / "tb/gpuprof")
    assert tb(trl[:-2]) == str(tmp_path / "out/runs/gpuprof")
    assert tb(openrlhf) == str(tmp_path / "logs/tb/r1/gpuprof")
    assert tb(["python", "train.py"]) == str(run_dir / "tensorboard")


def test_wandb_settings_are_valid_for_both_ways_of_logging():
    """Shared mode needs W&B's servers, so it is not run here: its settings are checked."""
    wandb = pytest.importorskip("wandb")
    from gpuprof.reports.tracker_sink import wandb_settings

    shared = wandb.Settings(**wandb_settings(shared=True))
    assert (shared.mode, shared.x_primary, shared.x_label) == ("shared", False, "gpuprof")
    assert not shared.x_update_finish_state and shared.console == "off"
    own = wandb.Settings(**wandb_settings(shared=False))
    assert own.x_primary and own.x_disable_stats and own.console == "off"


def test_an_unknown_tracker_is_bad_input(tmp_path):
    result = run_gpuprof("watch", "--log-to", "wandb,comet", "-o", str(tmp_path / "run"), "--",
                         sys.executable, "-c", "pass")  # fmt: skip
    assert result.returncode == 2
    assert result.stderr.strip() == (
        "gpuprof: error: --log-to: unknown tracker 'comet'; choose from wandb, tensorboard, mlflow"
    )
    assert not (tmp_path / "run").exists()


# ----- a real watch on simulated GPUs, read back with each tracker's reader


def _scenario() -> dict:
    def gpu(i: int, util: float) -> dict:
        return {"name": "NVIDIA H100 80GB HBM3", "uuid": f"GPU-{i:08d}-test",
                "series": {"util_gpu_pct": util, "mem_used_bytes": 20 * 2**30}}  # fmt: skip

    return {"gpus": [gpu(0, 5), gpu(1, 80)]}  # GPU 0 idle, GPU 1 busy


def tracker_env(tmp: Path, lib: Path, **extra: str) -> dict[str, str]:
    """The watch's environment: simulated GPUs, W&B offline and MLflow's file store under
    ``tmp``."""
    base = clean_env(**wandb_offline(tmp), MLFLOW_TRACKING_URI=(tmp / "mlruns").as_uri(),
                     MLFLOW_ALLOW_FILE_STORE="true")  # fmt: skip
    for name in ("WANDB_RUN_ID", "WANDB_PROJECT", "MLFLOW_RUN_ID", "MLFLOW_EXPERIMENT_NAME",
                 "MLFLOW_EXPERIMENT_ID", "TENSORBOARD_DIR", "TENSORBOARD_LOGGING_DIR"):  # fmt: skip
        base.pop(name, None)
    base.update(extra)
    return simnvml_env(lib, write_scenario(tmp / "scenario.txt", _scenario()), base=base)


def watch(tmp: Path, env: dict[str, str], *flags: str, child: str | None = None, args=(),
          log_interval: str = "1") -> tuple[subprocess.CompletedProcess, float]:  # fmt: skip
    """``gpuprof watch FLAGS -- python -c CHILD ARGS`` (the `training_loop` by default); the
    result and its wall time (s)."""
    child = child or training_loop()
    if "--log-timeout" not in flags:  # a bound, not a wait: on a loaded machine the trackers'
        flags = (*flags, "--log-timeout", "60")  # processes, at idle priority, take longer
    argv = gpuprof_cmd("watch", "--interval", "0.05", "--log-interval", log_interval, "-o",
                       str(tmp / "run"), *flags, "--", sys.executable, "-c", child,
                       *args)  # fmt: skip
    started = time.monotonic()
    result = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=180,
                            cwd=tmp)  # fmt: skip
    return result, time.monotonic() - started


def tracker_lines(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if line.startswith("gpuprof: --log-to")]


def wandb_records(run_dir: Path) -> list[tuple[str, dict]]:
    """Every record of an offline W&B run, read by wandb's own reader (as `gpuprof import`)."""
    import wandb

    from gpuprof.collectors.importers.wandb_run import _records

    (file,) = run_dir.glob("run-*.wandb")
    return list(_records(file, Path(wandb.__file__).parent))


def mlflow_client(tmp: Path):
    os.environ["MLFLOW_ALLOW_FILE_STORE"] = "true"
    from mlflow.tracking import MlflowClient

    return MlflowClient(tracking_uri=(tmp / "mlruns").as_uri())


def tensorboard_scalars(log_dir: Path) -> tuple[dict[str, list], dict[str, list[str]]]:
    """Scalars (tag → [(step, value)]) and texts (tag → [text]) of a directory's event files,
    read with TensorBoard's `EventAccumulator`."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(log_dir), size_guidance={"scalars": 0, "tensors": 0})
    acc.Reload()
    scalars = {t: [(e.step, e.value) for e in acc.Scalars(t)] for t in acc.Tags()["scalars"]}
    texts = {t: [e.tensor_proto.string_val[0].decode() for e in acc.Tensors(t)]
             for t in acc.Tags()["tensors"]}  # fmt: skip
    return scalars, texts


def _check_live(values: dict[str, list[float]], steps: list[float]) -> None:
    """The live figures of the CHILD loop on the scenario's GPUs."""
    assert len(values["gpuprof/gpu_util_pct"]) >= 2
    assert values["gpuprof/gpu_util_pct_by_gpu/gpu0"][-1] == pytest.approx(5, abs=1)
    assert values["gpuprof/gpu_util_pct_by_gpu/gpu1"][-1] == pytest.approx(80, abs=1)
    assert values["gpuprof/gpu_util_pct"][-1] == pytest.approx(42.5, abs=1)
    idle = values["gpuprof/idle_gpu_s_by_phase/reward"]
    assert idle == sorted(idle) and idle[-1] > 0.5  # GPU 0's idle time in the reward phases
    assert values["gpuprof/step_time_s"][-1] == pytest.approx(0.185, abs=0.05)
    assert steps == sorted(steps) and steps[-1] == STEPS


def test_log_to_every_tracker_into_the_training_runs(tmp_path, simnvml_lib):
    """One watch logging to the three trackers: W&B offline grouped with the training's run
    id, MLflow into the training's own run (MLFLOW_RUN_ID), TensorBoard into a gpuprof
    directory of the training's ``--logging_dir``."""
    for module in ("wandb", "mlflow", "tensorboard"):
        pytest.importorskip(module)
    client = mlflow_client(tmp_path)
    experiment = client.create_experiment("grpo")
    training = client.create_run(experiment, run_name="qwen-grpo").info.run_id
    env = tracker_env(tmp_path, simnvml_lib, WANDB_RUN_ID="trainrun1", WANDB_PROJECT="grpo",
                      MLFLOW_RUN_ID=training)  # fmt: skip
    result, _ = watch(tmp_path, env, "--log-to", "wandb,mlflow", "--log-to", "tensorboard",
                      args=["--logging_dir", str(tmp_path / "tb")])  # fmt: skip
    assert result.returncode == 3, result.stderr
    assert "Traceback" not in result.stderr
    (wandb_dir,) = (tmp_path / "wandb").glob("offline-run-*")
    assert tracker_lines(result.stderr) == [
        f"gpuprof: --log-to wandb: run {wandb_dir.name.split('-')[-1]} in project grpo, grouped "
        f"with run trainrun1 (offline: wandb sync {wandb_dir})",
        f"gpuprof: --log-to mlflow: into the training's run {training} at "
        f"{(tmp_path / 'mlruns').as_uri()}",
        f"gpuprof: --log-to tensorboard: {tmp_path / 'tb' / 'gpuprof'}",
    ]
    run_dir = tmp_path / "run"
    run = store.load_run(run_dir)
    assert run.meta.exit_code == 3 and not [n for n in run.meta.notices if "--log-to" in n]
    diagnosis = json.loads((run_dir / "diagnosis.json").read_text())
    assert diagnosis["schema_version"] >= 2 and diagnosis["findings"]
    top = diagnosis["findings"][0]

    # W&B: a run of its own, grouped with the training's, its history and summary
    records = wandb_records(wandb_dir)
    (info,) = [body for kind, body in records if kind == "run"]
    assert (info["run_group"], info["job_type"]) == ("trainrun1", "gpuprof")
    assert info["project"] == "grpo"
    history = [body["item"] for kind, body in records if kind == "history"]
    values: dict[str, list[float]] = {}
    for item in history:
        for key, value in item.items():
            values.setdefault(key, []).append(value)
    _check_live(values, values["gpuprof/steps"])
    summary: dict = {}
    for kind, body in records:
        if kind == "summary":
            summary.update(body.get("update") or {})
    assert summary["gpuprof/diagnosis/top_finding"].startswith(top["kind"])
    assert summary["gpuprof/diagnosis/gpu_util_pct"] == pytest.approx(42.5, abs=1)
    assert summary["gpuprof/diagnosis/top_finding/gpu_s_lost"] == pytest.approx(
        top["gpu_seconds_lost"])  # fmt: skip
    (artifact,) = [body for kind, body in records if kind == "artifact"]
    attached = {entry["path"] for entry in artifact["manifest"]["contents"]}
    assert attached == {"report.html", "diagnosis.json"} and artifact["type"] == "gpuprof-report"

    # MLflow: the training's own run holds the figures and files; its status is left alone
    got = client.get_run(training)
    assert got.info.status == "RUNNING"
    assert got.data.metrics["gpuprof/diagnosis/gpu_util_pct"] == pytest.approx(42.5, abs=1)
    assert got.data.tags["gpuprof/diagnosis/top_finding"].startswith(top["kind"])
    history = {key: client.get_metric_history(training, key) for key in got.data.metrics}
    history = {k: sorted(v, key=lambda m: m.timestamp) for k, v in history.items()}
    values = {k: [m.value for m in v] for k, v in history.items()}
    _check_live(values, [m.step for m in history["gpuprof/steps"]])
    files = {f.path for f in client.list_artifacts(training, "gpuprof")}
    assert files == {"gpuprof/report.html", "gpuprof/diagnosis.json"}
    assert len(client.search_runs([experiment])) == 1  # no run of its own

    # TensorBoard: a gpuprof run beside the training's, with the report and diagnosis
    log_dir = tmp_path / "tb" / "gpuprof"
    scalars, texts = tensorboard_scalars(log_dir)
    _check_live({k: [v for _, v in points] for k, points in scalars.items()},
                [s for s, _ in scalars["gpuprof/steps"]])  # fmt: skip
    assert scalars["gpuprof/diagnosis/idle_gpu_s_by_phase/reward"][-1][0] == STEPS
    assert texts["gpuprof/diagnosis/top_finding"][-1].startswith(top["kind"])
    assert "gpuprof/top_finding" in texts  # the live top finding
    assert json.loads((log_dir / "diagnosis.json").read_text()) == diagnosis
    assert (log_dir / "report.html").read_bytes() == (run_dir / "report.html").read_bytes()


LINKED_CHILD = textwrap.dedent(
    """
    import sys, time, gpuprof, wandb
    from mlflow.tracking import MlflowClient
    client = MlflowClient()
    experiment = client.get_experiment_by_name("grpo") or client.create_experiment("grpo")
    mlflow_run = client.create_run(getattr(experiment, "experiment_id", experiment)).info.run_id
    run = wandb.init(settings=wandb.Settings(x_disable_stats=True))  # WANDB_PROJECT, as HF
    with open(sys.argv[1], "w") as out:
        out.write(mlflow_run + " " + run.id)
    for step in range(8):
        with gpuprof.phase("reward"):
            time.sleep(0.2)
        gpuprof.step(n=step)
        run.log({"loss": 1.0 / (step + 1)})
    run.finish()
    client.set_terminated(mlflow_run)
    """
)


def test_log_to_runs_of_their_own_linked_to_the_training_runs(tmp_path, simnvml_lib):
    """No run id in the environment (GPUPROF_LOG_TO instead of the flag): W&B and MLflow get
    runs of their own, linked to the runs the training itself started."""
    for module in ("wandb", "mlflow"):
        pytest.importorskip(module)
    env = tracker_env(tmp_path, simnvml_lib, GPUPROF_LOG_TO="mlflow wandb",
                      MLFLOW_EXPERIMENT_NAME="grpo", WANDB_PROJECT="grpo")  # fmt: skip
    ids = tmp_path / "ids.txt"
    result, _ = watch(tmp_path, env, child=LINKED_CHILD, args=[str(ids)])
    assert result.returncode == 0, result.stderr
    mlflow_training, wandb_training = ids.read_text().split()
    lines = tracker_lines(result.stderr)
    assert len(lines) == 2 and "Traceback" not in result.stderr, result.stderr
    # MLflow: a run nested under the training's, finished
    client = mlflow_client(tmp_path)
    experiment = client.get_experiment_by_name("grpo").experiment_id
    (own,) = [r for r in client.search_runs([experiment]) if r.info.run_id != mlflow_training]
    assert own.data.tags["mlflow.parentRunId"] == mlflow_training
    assert own.data.tags["gpuprof.run_dir"] == str(tmp_path / "run")
    assert own.info.status == "FINISHED" and own.info.run_name.endswith("-gpuprof")
    assert own.data.metrics["gpuprof/steps"] == 8
    assert {f.path for f in client.list_artifacts(own.info.run_id, "gpuprof")} == {
        "gpuprof/report.html", "gpuprof/diagnosis.json"}  # fmt: skip
    assert lines[0] == (f"gpuprof: --log-to mlflow: run {own.info.run_id} under the training's "
                        f"run {mlflow_training} at {(tmp_path / 'mlruns').as_uri()}")  # fmt: skip
    # W&B: a run of its own beside the training's, naming it
    runs = {p.name.split("-")[-1]: p for p in (tmp_path / "wandb").glob("offline-run-*")}
    assert wandb_training in runs and len(runs) == 2
    (own_id,) = runs.keys() - {wandb_training}
    records = wandb_records(runs[own_id])
    (info,) = [body for kind, body in records if kind == "run"]
    assert info["job_type"] == "gpuprof"
    config: dict = {}
    for kind, body in records:
        if kind in ("run", "config"):  # the config at the start, then its updates
            config.update(body.get("update") or (body.get("config") or {}).get("update") or {})
    assert config["training_run_id"] == wandb_training
    assert lines[1].startswith(f"gpuprof: --log-to wandb: run {own_id} in project grpo")


LATE_EXPERIMENT_CHILD = textwrap.dedent(
    """
    import time, gpuprof
    from mlflow.tracking import MlflowClient
    time.sleep(2.5)  # the training makes its experiment a few seconds in, with no get-or-create
    client = MlflowClient()
    run = client.create_run(client.create_experiment("grpo")).info.run_id
    for step in range(4):
        with gpuprof.phase("reward"):
            time.sleep(0.2)
        gpuprof.step(n=step)
    client.set_terminated(run)
    """
)


def test_an_experiment_the_training_makes_late_is_left_to_it(tmp_path, simnvml_lib):
    # gpuprof's own MLflow run waits for the named experiment rather than create it first,
    # which would make the training's create_experiment fail ("already exists")
    pytest.importorskip("mlflow")
    env = tracker_env(tmp_path, simnvml_lib, MLFLOW_EXPERIMENT_NAME="grpo")
    # the wait is a minute of the watch, whatever the points' interval: the child (which
    # imports MLflow, seconds on a loaded machine, then sleeps) makes its experiment well within
    result, _ = watch(tmp_path, env, "--log-to", "mlflow", child=LATE_EXPERIMENT_CHILD)
    assert result.returncode == 0, result.stderr
    assert "already exists" not in result.stderr
    client = mlflow_client(tmp_path)
    experiment = client.get_experiment_by_name("grpo").experiment_id
    runs = client.search_runs([experiment])
    assert len(runs) == 2
    (own,) = [r for r in runs if r.data.tags.get("gpuprof.role") == "profiler"]
    assert own.info.status == "FINISHED" and own.data.metrics["gpuprof/steps"] == 4
    assert own.data.tags["mlflow.parentRunId"] in {r.info.run_id for r in runs}


def test_an_experiment_nobody_makes_is_made_after_a_minute_of_the_watch(tmp_path):
    """The wait for the training's experiment is a minute of the watch's clock, whatever the
    points' interval: points before it are kept, the one after it makes the experiment and
    the run, and every kept point lands in it."""
    pytest.importorskip("mlflow")
    from gpuprof.reports.tracker_sink import EXPERIMENT_WAIT_S, MlflowWriter

    client = mlflow_client(tmp_path)
    start = 1_700_000_000.0
    writer = MlflowWriter({"tracking_uri": (tmp_path / "mlruns").as_uri(), "start_s": start,
                           "experiment_name": "grpo", "gpuprof_run_dir": str(tmp_path / "run"),
                           "gpuprof_run_id": "r1"})  # fmt: skip
    writer.open()

    def point(step: int, t: float) -> dict:
        return {"op": "log", "step": step, "t": t, "metrics": {"gpuprof/steps": step},
                "texts": {}}  # fmt: skip

    for step, t in enumerate((1.0, 20.0, EXPERIMENT_WAIT_S - 1)):  # 0.1 s points or 10 s
        writer.log(point(step, start + t))
    assert client.get_experiment_by_name("grpo") is None and writer.run_id is None
    writer.log(point(3, start + EXPERIMENT_WAIT_S))
    experiment = client.get_experiment_by_name("grpo").experiment_id
    (own,) = client.search_runs([experiment])
    history = client.get_metric_history(own.info.run_id, "gpuprof/steps")
    assert [m.step for m in history] == [0, 1, 2, 3]
    writer.close()


# ----- trackers that fail: one line each, the command untouched


def closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _no_tracebacks(stderr: str) -> None:
    assert "Traceback" not in stderr, stderr
    assert "Error:" not in stderr.replace("gpuprof: error", ""), stderr


def test_misconfigured_trackers_are_one_line_each_and_the_command_goes_on(tmp_path, simnvml_lib):
    for module in ("wandb", "mlflow", "tensorboard"):
        pytest.importorskip(module)
    port = closed_port()
    not_a_dir = tmp_path / "a-file"
    not_a_dir.write_text("")
    env = tracker_env(tmp_path, simnvml_lib, MLFLOW_TRACKING_URI=f"http://127.0.0.1:{port}",
                      WANDB_MODE="bogus")  # fmt: skip
    result, took = watch(tmp_path, env, "--log-to", "mlflow,wandb,tensorboard",
                         child=training_loop(6),
                         args=["--logging_dir", str(not_a_dir)])  # fmt: skip
    assert result.returncode == 3, result.stderr
    _no_tracebacks(result.stderr)
    assert sorted(tracker_lines(result.stderr)) == [
        f"gpuprof: --log-to mlflow: cannot reach http://127.0.0.1:{port} (connection refused); "
        "going on without it",
        f"gpuprof: --log-to tensorboard: cannot write {not_a_dir / 'gpuprof'} (not a directory); "
        "going on without it",
        "gpuprof: --log-to wandb: invalid setting mode: Input should be 'online', 'offline', "
        "'shared', 'disabled', 'dryrun' or 'run'; going on without it",
    ]
    run = store.load_run(tmp_path / "run")
    assert run.meta.exit_code == 3
    assert len([n for n in run.meta.notices if n.startswith("--log-to")]) == 3
    steps = run.events[run.events["kind"] == "step"]
    assert len(steps) == 6
    assert took < 30


def test_a_missing_tracker_package_is_one_line_naming_the_extra(tmp_path):
    shadow = tmp_path / "shadow" / "wandb"
    shadow.mkdir(parents=True)
    (shadow / "__init__.py").write_text("raise ImportError('no wandb here')\n")
    env = clean_env()
    env["PYTHONPATH"] = os.pathsep.join([env["PYTHONPATH"], str(tmp_path / "shadow")])
    result = run_gpuprof("watch", "--no-nvml", "--log-to", "wandb", "-o", str(tmp_path / "run"),
                         "--", sys.executable, "-c", "raise SystemExit(5)", env=env)  # fmt: skip
    assert result.returncode == 5, result.stderr
    _no_tracebacks(result.stderr)
    assert tracker_lines(result.stderr) == [
        "gpuprof: --log-to wandb: the wandb package is not installed "
        "(pip install 'gpuprof[trackers]'); going on without it"
    ]


@contextlib.contextmanager
def _silent_mlflow(tmp_path: Path, simnvml_lib: Path):
    """The watch's environment with MLflow pointed at a server that takes connections and
    never answers (its requests hang for 120 s), for as long as the block runs."""
    with socket.socket() as server:  # listens, never accepts: requests hang
        server.bind(("127.0.0.1", 0))
        server.listen(16)
        url = f"http://127.0.0.1:{server.getsockname()[1]}"
        yield tracker_env(tmp_path, simnvml_lib, MLFLOW_TRACKING_URI=url,
                          MLFLOW_HTTP_REQUEST_TIMEOUT="120")  # fmt: skip


def test_a_tracker_that_never_answers_costs_the_end_of_run_timeout_only(tmp_path, simnvml_lib):
    """A tracking server that takes connections and never answers: the command's steps keep
    their pace, and the watch ends once --log-timeout is spent, with one line."""
    pytest.importorskip("mlflow")
    with _silent_mlflow(tmp_path, simnvml_lib) as env:
        result, took = watch(tmp_path, env, "--log-to", "mlflow", "--log-timeout", "2",
                             child=training_loop(8))  # fmt: skip
    assert result.returncode == 3, result.stderr
    _no_tracebacks(result.stderr)
    assert tracker_lines(result.stderr) == [
        "gpuprof: --log-to mlflow: the end-of-run upload did not finish within 2 s; "
        "going on without it"
    ]
    run = store.load_run(tmp_path / "run")
    step_s = run.events[run.events["kind"] == "step"]["t_ns"].diff().dropna() / 1e9
    assert step_s.median() == pytest.approx(0.185, abs=0.04)
    assert run.meta.notices[-1] == tracker_lines(result.stderr)[0].removeprefix("gpuprof: ")
    assert took < 45  # a request waits 120 s for its answer


def test_ctrl_c_while_the_watch_waits_for_a_tracker_is_one_line_and_the_exit_code(
    tmp_path, simnvml_lib
):
    """Ctrl-C once the command ended, while the watch waits for a tracker that never answers:
    the wait stops, the tracker's process is stopped, one line says so (and the run keeps
    it), and the watch exits with the command's code, without a traceback."""
    pytest.importorskip("mlflow")
    import psutil

    with _silent_mlflow(tmp_path, simnvml_lib) as env:
        argv = gpuprof_cmd("watch", "--interval", "0.05", "--log-interval", "1", "-o",
                           str(tmp_path / "run"), "--log-to", "mlflow", "--log-timeout", "120",
                           "--", sys.executable, "-c", training_loop(4))  # fmt: skip
        # as at a terminal (see test_watch_end.py): the watcher starts with SIGINT's default
        before = signal.signal(signal.SIGINT, signal.default_int_handler)
        try:
            watcher = subprocess.Popen(argv, env=env, stdout=subprocess.PIPE,
                                       stderr=subprocess.PIPE, text=True, cwd=tmp_path,
                                       start_new_session=True)  # fmt: skip
        finally:
            signal.signal(signal.SIGINT, before)
        # the end of the watch (its own process) came and went: the watcher now waits
        seen_end, deadline = False, time.monotonic() + 120
        while watcher.poll() is None and time.monotonic() < deadline:
            try:
                names = [" ".join(c.cmdline()) for c in psutil.Process(watcher.pid).children()]
            except psutil.Error:
                names = []
            ending = any("gpuprof.watch_end" in n for n in names)
            if seen_end and not ending:
                break
            seen_end = seen_end or ending
            time.sleep(0.02)
        time.sleep(1.0)
        assert seen_end and watcher.poll() is None
        signalled = time.monotonic()
        os.killpg(watcher.pid, signal.SIGINT)
        _, err = watcher.communicate(timeout=60)
        took = time.monotonic() - signalled
    assert watcher.returncode == 3, err
    _no_tracebacks(err)
    assert tracker_lines(err) == [
        "gpuprof: --log-to mlflow: the end-of-run upload was interrupted (Ctrl-C); "
        "going on without it"
    ], err
    assert took < 15, took  # not the 120 s the tracker would have been given
    assert store.load_run(tmp_path / "run").meta.notices[-1] == tracker_lines(err)[0].removeprefix(
        "gpuprof: "
    )
