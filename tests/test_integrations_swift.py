"""The ms-swift adapter against ms-swift's real ``profiling_context`` / ``profiling_decorator``.

``swift.rlhf_trainers.utils`` imports on CPU beside the TRL this project tests with; ms-swift's
GRPO trainer module itself needs TRL < 1.0, so the trainer-shaped class below calls the real
helpers with the names ms-swift's GRPO trainer and rollout mixin use.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import textwrap

import pytest
from conftest import ROOT, clean_env

from gpuprof.api import load_run
from gpuprof.integrations import bootstrap_dir

if importlib.util.find_spec("swift") is None:
    pytest.skip("ms-swift is not installed", allow_module_level=True)

TRAINER = """
import json, sys, time
from types import SimpleNamespace
from swift.rlhf_trainers.utils import profiling_context, profiling_decorator


class GRPOTrainer:
    args = SimpleNamespace(report_to=[])
    is_main_process = True

    @profiling_decorator
    def _generate_and_score_completions(self, inputs):
        with profiling_context(self, "generate"):
            time.sleep(0.01)
        return self._score_completions(inputs)

    @profiling_decorator
    def _score_completions(self, inputs):
        return self._compute_rewards_per_func(inputs)

    @profiling_decorator
    def _compute_rewards_per_func(self, inputs):
        return [len(x) for x in inputs]

    @profiling_decorator
    def _move_model_to_vllm(self):
        pass

    @profiling_decorator
    def compute_loss(self, model, inputs):
        return sum(inputs)


trainer = GRPOTrainer()
rewards = trainer._generate_and_score_completions(["ab", "c"])
trainer._move_model_to_vllm()
loss = trainer.compute_loss(None, rewards)
"""

ZERO_CODE = TRAINER + "print(json.dumps({'rewards': rewards, 'loss': loss}))\n"

EXPLICIT = (
    "import gpuprof, gpuprof.integrations.swift as adapter\n"
    + "import swift.rlhf_trainers.utils\n"
    + "assert adapter.install()\n"
    + TRAINER
    + "print(json.dumps({'rewards': rewards, 'loss': loss}))\n"
)

EXPECTED = [
    ("GRPOTrainer._generate_and_score_completions", "rollout"),
    ("GRPOTrainer.generate", "rollout"),
    ("GRPOTrainer._score_completions", "reward"),
    ("GRPOTrainer._compute_rewards_per_func", "reward"),
    ("GRPOTrainer._move_model_to_vllm", "reshard"),
    ("GRPOTrainer.compute_loss", "update_actor"),
]


def _run(tmp_path, code: str, *, bootstrap: bool):
    run_dir = tmp_path / "run"
    env = clean_env(GPUPROF_RUN_DIR=str(run_dir))
    paths = [bootstrap_dir(), str(ROOT)] if bootstrap else [str(ROOT)]
    env["PYTHONPATH"] = os.pathsep.join(paths)
    proc = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "could not instrument" not in proc.stderr
    return json.loads(proc.stdout.strip().splitlines()[-1]), load_run(run_dir)


@pytest.mark.parametrize("bootstrap", [True, False], ids=["zero-code", "explicit"])
def test_profiling_contexts_become_canonical_phases(tmp_path, bootstrap):
    result, run = _run(tmp_path, ZERO_CODE if bootstrap else EXPLICIT, bootstrap=bootstrap)
    assert result == {"rewards": [2, 1], "loss": 3}  # the trainer's results are untouched
    spans = run.spans.sort_values(["start_ns", "end_ns"], ascending=[True, False])
    assert list(zip(spans["name"], spans["phase"])) == EXPECTED
    generate = spans[spans["name"] == "GRPOTrainer.generate"].iloc[0]
    assert generate["end_ns"] - generate["start_ns"] >= 10_000_000
