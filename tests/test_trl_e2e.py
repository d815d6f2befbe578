"""TRL's GRPOTrainer on a tiny local model under ``gpuprof watch``, with no gpuprof code in it:
every step has its rollout, reward and update spans, the run knows TRL's knobs, and the step's
composition counts each phase by its self time (the callback's training step, mapped to the
update, encloses TRL's generation): generation bounds the step on every screen."""

from __future__ import annotations

import json
import sys

import pytest
from conftest import ROOT, clean_env, run_gpuprof

from gpuprof.analyzers.diagnose import diagnose
from gpuprof.api import load_run

pytest.importorskip("trl")

STEPS = 3
EXAMPLE = ROOT / "examples" / "trl_grpo_tiny.py"


@pytest.fixture(scope="module")
def watched(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("trl")
    run_dir = tmp / "run"
    proc = run_gpuprof(
        "watch", "--no-nvml", "-q", "-o", str(run_dir), "--",
        sys.executable, str(EXAMPLE), "--steps", str(STEPS), "--output-dir", str(tmp / "out"),
        timeout=300,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert f"trained {STEPS} steps" in proc.stdout
    assert "could not instrument" not in proc.stderr
    return load_run(run_dir)


def test_every_step_has_rollout_reward_and_update(watched):
    spans = watched.spans
    steps = spans[spans["name"] == "step"]
    assert sorted(steps["step"]) == list(range(STEPS))
    for n in range(STEPS):
        mine = spans[(spans["step"] == n) & (spans["name"] != "step")]
        phases = set(mine["phase"])
        assert {"rollout", "reward", "update_actor", "ref_logprob"} <= phases, (n, phases)
        step_span = steps[steps["step"] == n].iloc[0]
        # the step's phases lie inside the step
        assert (mine["start_ns"] >= step_span["start_ns"]).all()
        assert (mine["end_ns"] <= step_span["end_ns"]).all()
        names = set(mine["name"])
        assert "GRPOTrainer.transformers.generate" in names
        assert "GRPOTrainer.good_word_reward" in names  # the reward function, by its name
        assert "optimizer_step" in names


def test_rollout_precedes_update_within_each_step(watched):
    spans = watched.spans
    for n in range(STEPS):
        mine = spans[spans["step"] == n]
        generate = mine[mine["name"] == "GRPOTrainer.transformers.generate"]["end_ns"].max()
        optimizer = mine[mine["name"] == "optimizer_step"]["start_ns"].min()
        assert generate < optimizer


def test_the_run_knows_trl_and_its_settings(watched):
    assert watched.meta.framework == "trl"
    knobs = watched.meta.knobs
    assert knobs["max_completion_length"] == 16
    assert knobs["per_device_train_batch_size"] == 4
    assert knobs["gradient_accumulation_steps"] == 1


def test_a_healthy_tiny_trl_run_gets_no_finding(watched):
    """Hand-labelled: nothing in this run stalls (rollout, reward and update each take their
    part of a short CPU step); the diagnosis must not invent a stall."""
    assert diagnose(watched).findings == []


def _self_seconds_by_hand(spans) -> dict[str, float]:
    """Each phase's seconds from the spans' own arithmetic, by TRL's shape: the update is the
    training step (and the update spans inside it) less _prepare_inputs; rollout is
    _prepare_inputs less the reference pass and the reward inside it."""
    dur = (spans["end_ns"] - spans["start_ns"]) / 1e9
    name, phase = spans["name"], spans["phase"]
    prepare = dur[name == "GRPOTrainer._prepare_inputs"].sum()
    inside_prepare = dur[(phase == "ref_logprob") | (name == "GRPOTrainer._calculate_rewards")]
    return {
        "rollout": float(prepare - inside_prepare.sum()),
        "ref_logprob": float(dur[phase == "ref_logprob"].sum()),
        "reward": float(dur[name == "GRPOTrainer._calculate_rewards"].sum()),
        "update_actor": float(dur[name == "training_step"].sum() - prepare),
    }


def test_generation_bounds_the_step_by_self_time(watched, tmp_path):
    from gpuprof.analyzers.basic import phase_table

    spans = watched.spans
    # TRL's shape, as the composition must read it: the step's update encloses generation
    outer = spans[spans["name"] == "training_step"]
    prepare = spans[spans["name"] == "GRPOTrainer._prepare_inputs"]
    assert len(outer) == STEPS and len(prepare) == STEPS
    assert (prepare["start_ns"].to_numpy() > outer["start_ns"].to_numpy()).all()
    expected = _self_seconds_by_hand(spans)
    steps = spans[spans["phase"] == "step"]
    step_s = float((steps["end_ns"] - steps["start_ns"]).sum()) / 1e9
    table = phase_table(watched).set_index("phase")
    for phase, seconds in expected.items():
        assert table.loc[phase, "total_s"] == pytest.approx(seconds, rel=1e-6, abs=1e-6), phase
    assert table["step_share"].sum() == pytest.approx(1.0, abs=1e-6)
    d = diagnose(watched)
    bound = d.summary["bound"]
    shares = {r["phase"]: r["share"] for r in bound["composition"]}
    assert sum(shares.values()) == pytest.approx(1.0, abs=0.01)
    for phase in ("rollout", "update_actor", "ref_logprob"):
        assert shares[phase] == pytest.approx(expected[phase] / step_s, abs=0.01), phase
    assert bound["bound"] == ["rollout"], bound["verdict"]
    assert shares["rollout"] > shares["update_actor"]


# ------------------------------------------------------------------ live against logged


@pytest.fixture(scope="module")
def live_and_logged(tmp_path_factory):
    """One TRL run under ``watch`` that also logs TRL's own profiling timings to MLflow (a
    local file store): the live capture and the run TRL logged, imported."""
    pytest.importorskip("mlflow")
    tmp = tmp_path_factory.mktemp("trl-mlflow")
    store = tmp / "mlruns"
    env = clean_env(MLFLOW_TRACKING_URI=store.as_uri(), MLFLOW_ALLOW_FILE_STORE="true",
                    MLFLOW_EXPERIMENT_NAME="trl-tiny")  # fmt: skip
    live = tmp / "live"
    proc = run_gpuprof(
        "watch", "--no-nvml", "-q", "-o", str(live), "--",
        sys.executable, str(EXAMPLE), "--steps", "6", "--report-to", "mlflow",
        "--output-dir", str(tmp / "out"), timeout=300, env=env,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    runs = [p for p in store.glob("*/*") if (p / "metrics").is_dir()]
    assert len(runs) == 1, runs
    logged = tmp / "logged"
    proc = run_gpuprof("import", str(runs[0]), "-o", str(logged))
    assert proc.returncode == 0, proc.stderr
    return live, logged


def _shares(run_dir) -> dict[str, float]:
    proc = run_gpuprof("analyze", str(run_dir), "--json")
    assert proc.returncode == 0, proc.stderr
    bound = json.loads(proc.stdout)["summary"]["bound"]
    return {r["phase"]: r["share"] for r in bound["composition"]}


def test_live_and_logged_compositions_agree(live_and_logged):
    """The step's composition from the live spans and from TRL's own logged profiling
    timings (``profiling/Time taken: …`` and ``step_time``) agree within a few points on
    every phase TRL times. TRL times no backward pass nor optimizer step: in the logged run
    those read as step time no phase covers, which the live capture charges to the update
    (the callback's training step), so the update is compared with that time added."""
    live, logged = (_shares(d) for d in live_and_logged)
    assert live["rollout"] > 0.5 and logged["rollout"] > 0.5
    for phase in ("rollout", "ref_logprob", "reward"):
        assert logged[phase] == pytest.approx(live[phase], abs=0.05), (phase, live, logged)
    update_logged = logged.get("update_actor", 0.0) + logged.get("(other)", 0.0)
    update_live = live["update_actor"] + live.get("(other)", 0.0)
    assert update_logged == pytest.approx(update_live, abs=0.05), (live, logged)
    assert sum(live.values()) == pytest.approx(1.0, abs=0.01)
    assert sum(logged.values()) == pytest.approx(1.0, abs=0.01)
