"""The TRL adapter against TRL's real profiling module and transformers' real callback API."""

from __future__ import annotations

import pytest

pytest.importorskip("trl")

from gpuprof import hooks
from gpuprof.api import load_run
from gpuprof.integrations import trl as adapter


@pytest.fixture(scope="module", autouse=True)
def _trl_modules():
    """TRL's and transformers' modules, imported when this module's tests run rather than
    when it is collected: every pytest-xdist worker collects every module, and these
    imports (torch, transformers' trainer) cost each of them about 6 s."""
    global TrainerControl, TrainerState, GRPOConfig, profiling
    from transformers import TrainerControl, TrainerState
    from trl import GRPOConfig
    from trl.extras import profiling


@pytest.fixture
def run_dir(tmp_path):
    assert hooks.init(tmp_path / "run")
    yield tmp_path / "run"
    hooks.shutdown()


def _spans(run_dir):
    hooks.flush()
    spans = load_run(run_dir).spans
    return spans.sort_values(["start_ns", "end_ns"], ascending=[True, False])


def test_trl_profiling_contexts_become_canonical_phases(run_dir):
    assert adapter.install()
    assert adapter.install()  # twice is harmless
    PC = profiling.ProfilingContext
    with PC("GRPOTrainer._prepare_inputs", report_to=[]):
        with PC("GRPOTrainer.transformers.generate", report_to=[]):
            pass
        # the user's reward function, timed under its own name inside _calculate_rewards
        with (
            PC("GRPOTrainer._calculate_rewards", report_to=[]),
            PC("GRPOTrainer.my_reward_func", report_to=[]),
        ):
            pass
        with PC("GRPOTrainer.sync_weights", report_to=[]):
            pass
    with (
        PC("GRPOTrainer.compute_loss", report_to=[]),
        PC("GRPOTrainer._get_per_token_logps_and_entropies", report_to=[]),
    ):
        pass
    with PC("standalone_name", report_to=[]):
        pass
    got = list(zip(*(_spans(run_dir)[c] for c in ("name", "phase"))))
    assert got == [
        ("GRPOTrainer._prepare_inputs", "rollout"),
        ("GRPOTrainer.transformers.generate", "rollout"),
        ("GRPOTrainer._calculate_rewards", "reward"),
        ("GRPOTrainer.my_reward_func", "reward"),
        ("GRPOTrainer.sync_weights", "reshard"),
        ("GRPOTrainer.compute_loss", "update_actor"),
        ("GRPOTrainer._get_per_token_logps_and_entropies", "update_actor"),
        ("standalone_name", "standalone_name"),
    ]


def test_profiling_decorator_on_a_non_trainer_object(run_dir):
    """TRL's decorator path for objects with an ``accelerator`` (its vLLM generation class)."""
    adapter.install()

    class Accelerator:
        is_main_process = True

    class VLLMGeneration:
        accelerator = Accelerator()

        @profiling.profiling_decorator
        def generate(self, n):
            return list(range(n))

    assert VLLMGeneration().generate(3) == [0, 1, 2]
    spans = _spans(run_dir)
    assert list(spans["name"]) == ["VLLMGeneration.generate"]
    assert list(spans["phase"]) == ["rollout"]


def test_timing_still_reaches_trls_own_metric(run_dir, monkeypatch):
    adapter.install()
    logged = []
    monkeypatch.setattr(
        profiling.ProfilingContext, "_log_metrics", lambda self, d: logged.append(d)
    )
    with profiling.ProfilingContext("GRPOTrainer.vLLM.generate", report_to=[]):
        pass
    assert len(logged) == 1 and logged[0] >= 0
    assert list(_spans(run_dir)["phase"]) == ["rollout"]


def test_callback_steps_update_and_knobs(run_dir, tmp_path):
    args = GRPOConfig(
        output_dir=str(tmp_path / "out"),
        max_completion_length=96,
        num_generations=4,
        per_device_train_batch_size=4,
        report_to="none",
        use_cpu=True,
    )
    state, control = TrainerState(), TrainerControl()
    # two callbacks, as when one is added by hand to a trainer watch already equipped
    callbacks = [adapter.GpuprofCallback(), adapter.GpuprofCallback()]

    def event(name):
        for callback in callbacks:
            getattr(callback, name)(args, state, control)

    event("on_train_begin")
    for step in range(3):
        event("on_step_begin")
        with adapter.tracker.span("GRPOTrainer.transformers.generate", "transformers.generate"):
            pass
        event("on_pre_optimizer_step")
        event("on_optimizer_step")
        state.global_step = step + 1
        event("on_step_end")
    event("on_train_end")

    run = load_run(run_dir)
    spans = run.spans
    steps = spans[spans["name"] == "step"]
    assert sorted(steps["step"]) == [0, 1, 2]
    for n in range(3):
        mine = spans[spans["step"] == n]
        assert sorted(mine["name"]) == sorted(
            ["step", "training_step", "GRPOTrainer.transformers.generate", "optimizer_step"]
        )
        phase = dict(zip(mine["name"], mine["phase"]))
        assert phase["training_step"] == "update_actor"
        assert phase["optimizer_step"] == "update_actor"
        assert phase["GRPOTrainer.transformers.generate"] == "rollout"
    knobs = run.events[run.events["kind"] == "knobs"]
    assert list(knobs["name"]) == ["trl"]
    values = knobs["attrs"].iloc[0]["knobs"]
    assert values["max_completion_length"] == 96
    assert values["per_device_train_batch_size"] == 4
    assert values["use_vllm" if "use_vllm" in values else "vllm_mode"] is not None


def test_outside_a_run_nothing_is_recorded_and_trl_still_times(tmp_path):
    adapter.install()
    assert not hooks.enabled()
    with profiling.ProfilingContext("GRPOTrainer._calculate_rewards", report_to=[]) as ctx:
        pass
    assert ctx._start_time is not None
    assert not list(tmp_path.iterdir())
