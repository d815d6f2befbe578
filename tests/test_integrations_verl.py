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

import lazy_rfc3987
import pytest
from conftest import ROOT, clean_env

from gpuprof.api import load_run
from gpuprof.integrations import bootstrap_dir

if any(importlib.util.find_spec(name) is None for name in ("verl", "ray", "omegaconf")):
    pytest.skip("verl (with ray and omegaconf) is not installed", allow_module_level=True)


@pytest.fixture(scope="module")
def lazy_imports(tmp_path_factory) -> str:
    """A directory to put first on the ``PYTHONPATH`` of the processes that import verl (which
    imports Ray): `lazy_rfc3987`."""
    return lazy_rfc3987.lazy_imports(tmp_path_factory.mktemp("imports"))


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
def verl_run(tmp_path_factory, lazy_imports):
    tmp = tmp_path_factory.mktemp("verl")
    run_dir = tmp / "run"
    env = clean_env(GPUPROF_RUN_DIR=str(run_dir))
    env["PYTHONPATH"] = os.pathsep.join([lazy_imports, bootstrap_dir(), str(ROOT)])
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


# ------------------------------------------------------------------ live against logged

PPO_LOOP = textwrap.dedent(
    """
    # a PPO step shaped as verl's RayPPOTrainer.fit times it, with verl's own timers, metrics
    # and console logger; the work in each phase is a wait of a known length (a sleep: phases of
    # a busy wait stretch by the scheduler's delays on shared cores, the shortest ones most,
    # which moved the step's composition by 5 points with the cores busy)
    import time

    import torch
    from verl import DataProto
    from verl.trainer.ppo.metric_utils import compute_timing_metrics
    from verl.trainer.ppo.utils import Role
    from verl.utils.debug import marked_timer
    from verl.utils.logger.aggregate_logger import LocalLogger

    WORK = {"gen": 0.060, "reward": 0.010, "old_log_prob": 0.012, "ref": 0.012, "values": 0.015,
            "adv": 0.004, "update_critic": 0.045, "update_actor": 0.030, "update_weights": 0.008}


    def work(seconds):
        time.sleep(seconds)


    batch = DataProto.from_dict(tensors={
        "responses": torch.ones(4, 6, dtype=torch.long),
        "attention_mask": torch.ones(4, 10, dtype=torch.long),
        "response_mask": torch.ones(4, 6, dtype=torch.long),
    })
    logger = LocalLogger(print_to_console=True)
    for step in range(1, 9):
        timing_raw = {}
        with marked_timer("step", timing_raw):
            with marked_timer("gen", timing_raw, color="red"):
                work(WORK["gen"])
                timing_raw.update({"generate_sequences": WORK["gen"] * 0.9})  # the workers' own
            work(0.003)  # batch bookkeeping between phases, as fit does
            with marked_timer("reward", timing_raw, color="yellow"):
                work(WORK["reward"])
            with marked_timer("old_log_prob", timing_raw, color="blue"):
                work(WORK["old_log_prob"])
            with marked_timer(str(Role.RefPolicy), timing_raw, color="olive"):
                work(WORK["ref"])
            with marked_timer("values", timing_raw, color="cyan"):
                work(WORK["values"])
            with marked_timer("adv", timing_raw, color="brown"):
                work(WORK["adv"])
            with marked_timer("update_critic", timing_raw, color="pink"):
                work(WORK["update_critic"])
            with marked_timer("update_actor", timing_raw, color="red"):
                work(WORK["update_actor"])
            with marked_timer("update_weights", timing_raw, color="red"):
                work(WORK["update_weights"])
        metrics = {"training/global_step": step}
        metrics.update(compute_timing_metrics(batch=batch, timing_raw=timing_raw))
        logger.log(data=metrics, step=step)
    """
)


def test_live_and_logged_compositions_agree(tmp_path, lazy_imports):
    """A PPO step timed as verl's RayPPOTrainer.fit times it (its real marked_timer, the
    workers' generate_sequences merged into the timings, compute_timing_metrics and verl's
    console logger), under ``gpuprof watch``: the step's composition from the live spans and
    from the timing_s/* lines verl printed, imported, agree within a few points."""
    from conftest import run_gpuprof

    script = tmp_path / "ppo_loop.py"
    script.write_text(PPO_LOOP)
    live = tmp_path / "live"
    env = clean_env()
    env["PYTHONPATH"] = os.pathsep.join([lazy_imports, env["PYTHONPATH"]])
    proc = run_gpuprof("watch", "--no-nvml", "-q", "-o", str(live), "--", sys.executable,
                       str(script), timeout=300, env=env)  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    log = tmp_path / "console.log"
    log.write_text(proc.stdout)
    assert proc.stdout.count("timing_s/update_critic:") == 8
    logged = tmp_path / "logged"
    assert run_gpuprof("import", str(log), "-o", str(logged)).returncode == 0
    shares = []
    for run_dir in (live, logged):
        doc = json.loads(run_gpuprof("analyze", str(run_dir), "--json").stdout)
        bound = doc["summary"]["bound"]
        assert bound["basis"] == "phase_timing"
        shares.append({r["phase"]: r["share"] for r in bound["composition"]})
    live_s, logged_s = shares
    named = {"rollout", "reward", "old_logprob", "ref_logprob", "values", "advantage",
             "update_critic", "update_actor", "reshard"}  # fmt: skip
    assert named <= set(live_s) and named <= set(logged_s), (live_s, logged_s)
    for phase in named:
        assert logged_s[phase] == pytest.approx(live_s[phase], abs=0.03), (phase, shares)
    # the generation the workers time (generate_sequences) is nested in gen: counted once
    assert live_s["rollout"] == pytest.approx(0.060 / 0.204, abs=0.04)


RAY_SCRIPT = textwrap.dedent(
    """
    import json, sys
    import ray

    ray.init(num_cpus=1, include_dashboard=False, log_to_driver=False)

    @ray.remote
    class TaskRunner:  # where verl's trainer loop runs: a Ray actor on the driver's node
        def run(self):
            import contextlib, glob, os, sqlite3, sys, time
            from verl.utils.debug import marked_timer
            timing = {}
            with marked_timer("gen", timing):
                time.sleep(0.01)
            with marked_timer("update_actor", timing):
                pass
            # until the hooks' writer (every quarter second) has committed both spans here
            path = os.path.join(os.environ["GPUPROF_RUN_DIR"], f"*.{os.getpid()}.sqlite")
            end, spans = time.monotonic() + 120, 0
            while spans < 2 and time.monotonic() < end:
                time.sleep(0.05)
                for name in glob.glob(path):
                    with contextlib.suppress(sqlite3.Error):
                        with contextlib.closing(sqlite3.connect(name, timeout=1)) as conn:
                            spans = conn.execute("SELECT count(*) FROM spans").fetchone()[0]
            bootstrapped = any(type(f).__name__ == "_Finder" for f in sys.meta_path)
            return {"pid": os.getpid(), "bootstrapped": bootstrapped}

    runner = TaskRunner.remote()
    print(json.dumps({"driver": __import__("os").getpid(), **ray.get(runner.run.remote())}))
    ray.shutdown()
    """
)


def test_the_bootstrap_reaches_a_local_ray_actor(tmp_path, lazy_imports):
    run_dir = tmp_path / "run"
    # RAY_ADDRESS=local: a new Ray of its own, even while another cluster on this machine
    # (another test run's) has left its address in /tmp/ray/ray_current_cluster
    env = clean_env(GPUPROF_RUN_DIR=str(run_dir), RAY_USAGE_STATS_ENABLED="0", RAY_ADDRESS="local")
    env["PYTHONPATH"] = os.pathsep.join([lazy_imports, bootstrap_dir(), str(ROOT)])
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
