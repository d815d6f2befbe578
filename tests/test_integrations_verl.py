"""The verl adapter against verl's real modules (they import on CPU), zero-code as under watch.

The script imports verl's timers the way its trainers do (``from verl.utils.debug import
marked_timer``) and times a PPO-shaped loop with the names ``RayPPOTrainer.fit`` uses.
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

if any(importlib.util.find_spec(name) is None for name in ("verl", "ray", "omegaconf")):
    pytest.skip("verl (with ray and omegaconf) is not installed", allow_module_level=True)

SCRIPT = textwrap.dedent(
    """
    import json, os, time
    from verl.utils.debug import marked_timer, simple_timer
    import verl.trainer.ppo.ray_trainer as ray_trainer
    from verl.trainer.ppo.utils import Role
    from omegaconf import OmegaConf
    from gpuprof.integrations._patch import read_knobs

    timing = {}
    for step in range(2):
        with marked_timer("step", timing):
            with marked_timer("gen", timing, color="red"):
                time.sleep(0.02)
            with marked_timer("reward", timing, color="yellow"):
                pass
            with marked_timer("old_log_prob", timing, color="blue"):
                pass
            with marked_timer(str(Role.RefPolicy), timing, color="olive"):
                pass
            with marked_timer("adv", timing, color="brown"):
                pass
            with marked_timer("update_actor", timing, color="red"):
                pass
            with simple_timer("update_weights", timing):
                pass
    config_dir = os.path.dirname(ray_trainer.__file__).replace("ppo", "config")
    config = OmegaConf.load(os.path.join(config_dir, "_generated_ppo_trainer.yaml"))
    print(json.dumps({
        "timing": timing,
        "trainer_timer_wrapped": hasattr(ray_trainer.marked_timer, "__gpuprof_original__"),
        "init_wrapped": hasattr(
            ray_trainer.RayPPOTrainer.__dict__["__init__"], "__gpuprof_original__"
        ),
        "knobs": read_knobs("verl", config),
        "gmu": config.actor_rollout_ref.rollout.gpu_memory_utilization,
    }))
    """
)


@pytest.fixture(scope="module")
def verl_run(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("verl")
    run_dir = tmp / "run"
    env = clean_env(GPUPROF_RUN_DIR=str(run_dir))
    env["PYTHONPATH"] = os.pathsep.join([bootstrap_dir(), str(ROOT)])
    proc = subprocess.run(
        [sys.executable, "-c", SCRIPT], env=env, capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "could not instrument" not in proc.stderr
    return json.loads(proc.stdout.strip().splitlines()[-1]), load_run(run_dir)


def test_marked_timers_become_phases_and_steps(verl_run):
    _, run = verl_run
    spans = run.spans.sort_values("start_ns")
    steps = spans[spans["name"] == "step"]
    assert sorted(steps["step"]) == [0, 1]
    expected = [
        ("gen", "rollout"),
        ("reward", "reward"),
        ("old_log_prob", "old_logprob"),
        ("ref", "ref_logprob"),
        ("adv", "advantage"),
        ("update_actor", "update_actor"),
        ("update_weights", "reshard"),
    ]
    for n in (0, 1):
        mine = spans[(spans["step"] == n) & (spans["name"] != "step")]
        assert list(zip(mine["name"], mine["phase"])) == expected
        bounds = steps[steps["step"] == n].iloc[0]
        assert (mine["start_ns"] >= bounds["start_ns"]).all()
        assert (mine["end_ns"] <= bounds["end_ns"]).all()
    gen = spans[spans["name"] == "gen"]
    assert ((gen["end_ns"] - gen["start_ns"]) >= 20_000_000).all()


def test_verls_own_timing_is_unchanged(verl_run):
    result, run = verl_run
    timing = result["timing"]
    assert set(timing) == {
        "step", "gen", "reward", "old_log_prob", "ref", "adv", "update_actor", "update_weights",
    }  # fmt: skip
    assert timing["gen"] >= 0.04  # two steps of 20 ms
    assert timing["step"] >= timing["gen"]
    spans = run.spans
    gen_s = ((spans[spans["name"] == "gen"]["end_ns"] - spans[spans["name"] == "gen"]["start_ns"])
             .sum() / 1e9)  # fmt: skip
    assert gen_s == pytest.approx(timing["gen"], abs=0.005)


def test_trainer_references_are_rebound_and_knobs_read_from_verls_config(verl_run):
    result, _ = verl_run
    assert result["trainer_timer_wrapped"]  # ray_trainer imported marked_timer by name
    assert result["init_wrapped"]
    knobs = result["knobs"]
    assert knobs["actor_rollout_ref.rollout.gpu_memory_utilization"] == result["gmu"]
    assert "data.dataloader_num_workers" in knobs
    assert "actor_rollout_ref.actor.use_dynamic_bsz" in knobs


RAY_SCRIPT = textwrap.dedent(
    """
    import json, sys
    import ray

    ray.init(num_cpus=1, include_dashboard=False, log_to_driver=False)

    @ray.remote
    class TaskRunner:  # where verl's trainer loop runs: a Ray actor on the driver's node
        def run(self):
            import os, sys, time
            from verl.utils.debug import marked_timer
            timing = {}
            with marked_timer("gen", timing):
                time.sleep(0.01)
            with marked_timer("update_actor", timing):
                pass
            time.sleep(1.5)  # the hooks' writer commits twice a second
            bootstrapped = any(type(f).__name__ == "_Finder" for f in sys.meta_path)
            return {"pid": os.getpid(), "bootstrapped": bootstrapped}

    runner = TaskRunner.remote()
    print(json.dumps({"driver": __import__("os").getpid(), **ray.get(runner.run.remote())}))
    ray.shutdown()
    """
)


def test_the_bootstrap_reaches_a_local_ray_actor(tmp_path):
    run_dir = tmp_path / "run"
    # RAY_ADDRESS=local: a new Ray of its own, even while another cluster on this machine
    # (another test run's) has left its address in /tmp/ray/ray_current_cluster
    env = clean_env(GPUPROF_RUN_DIR=str(run_dir), RAY_USAGE_STATS_ENABLED="0", RAY_ADDRESS="local")
    env["PYTHONPATH"] = os.pathsep.join([bootstrap_dir(), str(ROOT)])
    proc = subprocess.run(
        [sys.executable, "-c", RAY_SCRIPT], env=env, capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert result["bootstrapped"] and result["pid"] != result["driver"]
    spans = load_run(run_dir).spans
    assert list(zip(spans["name"], spans["phase"])) == [
        ("gen", "rollout"),
        ("update_actor", "update_actor"),
    ]
    assert set(spans["pid"]) == {result["pid"]}  # recorded by the actor's own process
