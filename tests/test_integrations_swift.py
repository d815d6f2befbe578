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


# -- ms-swift's GRPO end to end, in ms-swift's own environment --------------------------------
# ms-swift 4.6 pins trl<1.0 and transformers<5.20, so its trainer runs in an environment of
# its own: SWIFT_PYTHON names that environment's interpreter (with torch 2.13 CPU, ms-swift
# and msgspec installed), e.g. `python -m venv swiftenv && swiftenv/bin/pip install
# torch==2.13.0 ms-swift==4.6.0 msgspec`.
SWIFT_PYTHON = os.environ.get("SWIFT_PYTHON")


HAND_TIMERS = """
# ms-swift's GRPO run as its CLI starts it, with its real trainer's methods timed by hand
# (perf_counter around each call, no gpuprof): the reference the live capture is checked
# against, since ms-swift logs its profiled calls only to W&B rows that merge them
import atexit, collections, json, runpy, sys, time

import swift.rlhf_trainers.grpo_trainer as grpo

calls = collections.defaultdict(list)


def timed(name):
    fn = getattr(grpo.GRPOTrainer, name)

    def wrapper(self, *args, **kwargs):
        start = time.perf_counter()
        try:
            return fn(self, *args, **kwargs)
        finally:
            calls[name].append((start, time.perf_counter()))

    setattr(grpo.GRPOTrainer, name, wrapper)


for name in ("training_step", "_prepare_inputs", "_score_completions",
             "_get_per_token_logps_and_entropies"):
    timed(name)
out = sys.argv.pop(1)
atexit.register(lambda: open(out, "w").write(json.dumps(calls)))
sys.argv[0] = "swift-rlhf"
runpy.run_module("swift.cli.rlhf", run_name="__main__")
"""


@pytest.fixture(scope="module")
def swift_grpo(tmp_path_factory):
    """ms-swift's real GRPO trainer (its own environment) on the tiny model, 3 steps, under
    ``gpuprof watch``, its methods also timed by hand; ms-swift's own logging.jsonl kept."""
    from conftest import run_gpuprof

    tmp = tmp_path_factory.mktemp("swift")
    model_dir, data = tmp / "tiny", tmp / "prompts.jsonl"
    build = (
        "import json, sys; sys.path.insert(0, sys.argv[1]); import trl_grpo_tiny as ex; "
        "tok = ex.build_tokenizer(); m = ex.build_model(tok); "
        "m.save_pretrained(sys.argv[2]); tok.save_pretrained(sys.argv[2]); "
        "rows = [{'messages': [{'role': 'user', 'content': f'{s} {v}'}]} "
        "for s in ('the cat', 'a dog', 'the red cat') for v in ('runs', 'sits')]; "
        "open(sys.argv[3], 'w').write(''.join(json.dumps(r) + chr(10) for r in rows))"
    )
    subprocess.run(
        [SWIFT_PYTHON, "-c", build, str(ROOT / "examples"), str(model_dir), str(data)],
        check=True,
        capture_output=True,
        timeout=300,
    )
    driver, hand = tmp / "hand_timed.py", tmp / "hand.json"
    driver.write_text(HAND_TIMERS)
    run_dir = tmp / "run"
    proc = run_gpuprof(
        "watch", "--no-nvml", "-q", "-o", str(run_dir), "--",
        SWIFT_PYTHON, str(driver), str(hand), "--rlhf_type", "grpo",
        "--model", str(model_dir), "--model_type", "llama", "--template", "default",
        "--dataset", str(data), "--reward_funcs", "repetition", "--num_generations", "4",
        "--per_device_train_batch_size", "4", "--max_completion_length", "16",
        "--max_steps", "3", "--beta", "0.04", "--use_vllm", "false",
        "--torch_dtype", "float32", "--tuner_type", "full", "--report_to", "none",
        "--save_strategy", "no", "--dataloader_num_workers", "0", "--logging_steps", "1",
        "--output_dir", str(tmp / "out"),
        timeout=600,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "could not instrument" not in proc.stderr
    logged = [json.loads(line) for f in (tmp / "out").glob("*/logging.jsonl")
              for line in f.read_text().splitlines() if line.strip()]  # fmt: skip
    return run_dir, json.loads(hand.read_text()), logged


@pytest.mark.skipif(not SWIFT_PYTHON, reason="SWIFT_PYTHON (an ms-swift environment) not set")
def test_swift_grpo_under_watch_has_rollout_reward_and_update_each_step(swift_grpo):
    run_dir, _, _ = swift_grpo
    run = load_run(run_dir)
    spans = run.spans
    assert sorted(spans[spans["name"] == "step"]["step"]) == [0, 1, 2]
    for n in (0, 1, 2):
        phases = set(spans[(spans["step"] == n) & (spans["name"] != "step")]["phase"])
        assert {"rollout", "reward", "old_logprob", "ref_logprob", "update_actor"} <= phases
    assert run.meta.framework == "swift"
    assert run.meta.knobs["max_completion_length"] == 16


def _inside(call: list[float], outer: list[list[float]]) -> bool:
    return any(s <= call[0] and call[1] <= e for s, e in outer)


@pytest.mark.skipif(not SWIFT_PYTHON, reason="SWIFT_PYTHON (an ms-swift environment) not set")
def test_live_composition_agrees_with_swifts_code_paths_timed_by_hand(swift_grpo):
    """The step's composition from the live capture against ms-swift's own methods timed by
    hand around the same calls: rollout is _prepare_inputs less the reward scoring and the
    log-prob passes inside it, the update is the training step less _prepare_inputs. And
    ms-swift's own logged step_time (logging.jsonl) against the live training step."""
    from conftest import run_gpuprof

    run_dir, hand, logged = swift_grpo
    seconds = {k: sum(e - s for s, e in v) for k, v in hand.items()}
    step_s = seconds["training_step"]
    logps_in_prepare = sum(
        e - s for s, e in hand["_get_per_token_logps_and_entropies"]
        if _inside([s, e], hand["_prepare_inputs"])
    )  # fmt: skip
    expected = {
        "rollout": (seconds["_prepare_inputs"] - seconds["_score_completions"]
                    - logps_in_prepare) / step_s,
        "reward": seconds["_score_completions"] / step_s,
        "logprob passes": logps_in_prepare / step_s,
        "update_actor": (step_s - seconds["_prepare_inputs"]) / step_s,
    }  # fmt: skip
    doc = json.loads(run_gpuprof("analyze", str(run_dir), "--json").stdout)
    live = {r["phase"]: r["share"] for r in doc["summary"]["bound"]["composition"]}
    live["logprob passes"] = live.get("old_logprob", 0.0) + live.get("ref_logprob", 0.0)
    # the callback's step span holds the training step and a little of the trainer's loop
    live["update_actor"] += live.get("(other)", 0.0)
    for phase, share in expected.items():
        assert live[phase] == pytest.approx(share, abs=0.05), (phase, live, expected)
    assert doc["summary"]["bound"]["bound"] == ["rollout"]
    # ms-swift's own step_time, step by step, against the live training-step spans
    spans = load_run(run_dir).spans
    steps = spans[spans["name"] == "training_step"].sort_values("step")
    live_s = ((steps["end_ns"] - steps["start_ns"]) / 1e9).tolist()
    own = [r["step_time"] for r in logged if "step_time" in r]
    assert len(own) == len(live_s) == 3
    for mine, theirs in zip(live_s, own):
        assert mine == pytest.approx(theirs, rel=0.1, abs=0.005)
