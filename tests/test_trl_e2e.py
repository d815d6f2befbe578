"""TRL's GRPOTrainer on a tiny local model under ``gpuprof watch``, with no gpuprof code in it:
every step has its rollout, reward and update spans, and the run knows TRL's knobs."""

from __future__ import annotations

import sys

import pytest
from conftest import ROOT, run_gpuprof

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
    assert knobs["max_completion_length"] == 8
    assert knobs["per_device_train_batch_size"] == 4
    assert knobs["gradient_accumulation_steps"] == 1


def test_a_healthy_tiny_trl_run_gets_no_finding(watched):
    """Hand-labelled: nothing in this run stalls (rollout, reward and update each take their
    part of a short CPU step); the diagnosis must not invent a stall."""
    assert diagnose(watched).findings == []
