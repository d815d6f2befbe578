"""The OpenRLHF adapter.

OpenRLHF can't be imported here: its trainer modules import vLLM and flash-attn, which need a
GPU. So (1) the adapter's method table is checked against OpenRLHF's real source (parsed, not
imported) when the package is installed, and (2) the adapter's behaviour — method spans,
step boundaries numbered by ``global_step``, the ``timing/…`` values of each step, the knobs
from OpenRLHF's nested ``args`` — is exercised zero-code on a small package laid out at
OpenRLHF's module paths with its class and method names and signatures.
"""

from __future__ import annotations

import ast
import importlib.util
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from conftest import ROOT, clean_env

from gpuprof.api import load_run
from gpuprof.integrations import bootstrap_dir
from gpuprof.integrations.openrlhf import METHODS


def _real_source_root() -> Path | None:
    spec = importlib.util.find_spec("openrlhf")  # finds, does not import
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(next(iter(spec.submodule_search_locations))).parent


def _methods(path: Path) -> dict[str, dict[str, list[str]]]:
    """Class → method → argument names, from a source file."""
    tree = ast.parse(path.read_text())
    out: dict[str, dict[str, list[str]]] = {}
    for node in tree.body:
        if isinstance(node, ast.ClassDef):
            out[node.name] = {
                f.name: [a.arg for a in f.args.args]
                for f in node.body
                if isinstance(f, (ast.FunctionDef, ast.AsyncFunctionDef))
            }
    return out


CURRENT = {  # what OpenRLHF 0.9 and later define (older names in METHODS are for older versions)
    ("openrlhf.trainer.ppo_utils.samples_generator", "SamplesGenerator", "generate_samples"),
    ("openrlhf.trainer.ppo_utils.experience_maker", "RemoteExperienceMaker", "make_experience"),
    ("openrlhf.trainer.ppo_utils.experience_maker", "RemoteExperienceMaker",
     "compute_advantages_and_returns"),
    ("openrlhf.trainer.ppo_trainer", "BasePPOTrainer", "ppo_train"),
    ("openrlhf.trainer.ppo_trainer", "BasePPOTrainer", "broadcast_to_vllm"),
    ("openrlhf.trainer.ppo_trainer", "PPOTrainer", "evaluate"),
    ("openrlhf.trainer.ray.ppo_actor", "ActorPPOTrainer", "ppo_train"),
    ("openrlhf.trainer.ray.ppo_actor", "PolicyModelActor", "forward"),
    ("openrlhf.trainer.ray.ppo_critic", "CriticModelActor", "forward"),
    ("openrlhf.trainer.ray.launcher", "ReferenceModelActor", "forward"),
    ("openrlhf.trainer.ray.launcher", "RewardModelActor", "forward"),
}  # fmt: skip


def test_method_table_matches_openrlhfs_real_source():
    root = _real_source_root()
    if root is None:
        pytest.skip("OpenRLHF is not installed (pip install --no-deps openrlhf)")
    found = set()
    for module, rows in METHODS.items():
        path = root / (module.replace(".", "/") + ".py")
        classes = _methods(path)
        for cls, method, _phase in rows:
            if method in classes.get(cls, {}):
                found.add((module, cls, method))
    assert found >= CURRENT, CURRENT - found
    trainer = _methods(root / "openrlhf/trainer/ppo_trainer.py")["BasePPOTrainer"]
    assert trainer["train_step"][:3] == ["self", "rollout_samples", "global_step"]
    assert "__init__" in trainer  # where the adapter reads self.args


FILES = {
    "openrlhf/__init__.py": "",
    "openrlhf/trainer/__init__.py": "",
    "openrlhf/trainer/ppo_utils/__init__.py": "",
    "openrlhf/trainer/ppo_utils/samples_generator.py": """
        import time

        class SamplesGenerator:
            def generate_samples(self, **generate_kwargs):
                time.sleep(0.03)
                return ["s1", "s2"], 1.0, 2, False
    """,
    "openrlhf/trainer/ppo_utils/experience_maker.py": """
        import time

        class RemoteExperienceMaker:
            def make_experience_batch(self, rollout_samples):
                return self.compute_advantages_and_returns(self.make_experience(rollout_samples))

            def make_experience(self, samples_list):
                time.sleep(0.012)
                return [s.upper() for s in samples_list]

            def compute_advantages_and_returns(self, experiences):
                time.sleep(0.004)
                return experiences
    """,
    "openrlhf/trainer/ppo_trainer.py": """
        import time
        from types import SimpleNamespace
        from openrlhf.trainer.ppo_utils.experience_maker import RemoteExperienceMaker
        from openrlhf.trainer.ppo_utils.samples_generator import SamplesGenerator

        class BasePPOTrainer:
            def __init__(self, strategy):
                self.args = strategy.args
                self.experience_maker = RemoteExperienceMaker()
                self.samples_generator = SamplesGenerator()

            def train_step(self, rollout_samples, global_step):
                t0 = time.time()
                self.experience_maker.make_experience_batch(rollout_samples)
                make_experience_time = time.time() - t0
                t0 = time.time()
                status = self.ppo_train(global_step)
                ppo_train_time = time.time() - t0
                t0 = time.time()
                self.broadcast_to_vllm()
                status["timing/make_experience"] = make_experience_time
                status["timing/ppo_train"] = ppo_train_time
                status["timing/broadcast"] = time.time() - t0
                return status, global_step + 1

            def ppo_train(self, global_steps):
                time.sleep(0.02)
                return {"policy_loss": 0.5}

            def broadcast_to_vllm(self):
                time.sleep(0.004)

        class PPOTrainer(BasePPOTrainer):
            def fit(self, global_step=0):
                for _ in range(3):  # as OpenRLHF 0.11's fit times and logs a step
                    t_gen_start = time.time()
                    samples, _, _, _ = self.samples_generator.generate_samples()
                    generation_time = time.time() - t_gen_start
                    status, global_step = self.train_step(samples, global_step)
                    status["timing/generation"] = generation_time
                    status["timing/step_total"] = sum(
                        v for k, v in status.items() if k.startswith("timing/")
                    )
                    print(f"Global step {global_step}: {status}")
    """,
}

DRIVER = """
from types import SimpleNamespace
from openrlhf.trainer.ppo_trainer import PPOTrainer

args = SimpleNamespace(
    vllm=SimpleNamespace(gpu_memory_utilization=0.45, num_engines=2),
    train=SimpleNamespace(colocate_all=True, dynamic_batch_enable=False),
)
PPOTrainer(SimpleNamespace(args=args)).fit()
"""


def _run_stand_in(tmp_path: Path, run_dir: Path) -> subprocess.CompletedProcess:
    """The stand-in package laid out under ``tmp_path/pkg`` and its driver run zero-code,
    recording into ``run_dir``."""
    for name, text in FILES.items():
        path = tmp_path / "pkg" / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(text))
    env = clean_env(GPUPROF_RUN_DIR=str(run_dir))
    env["PYTHONPATH"] = os.pathsep.join([bootstrap_dir(), str(ROOT), str(tmp_path / "pkg")])
    proc = subprocess.run(
        [sys.executable, "-c", DRIVER], env=env, capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 0, proc.stderr
    return proc


def test_adapter_records_methods_steps_and_knobs_zero_code(tmp_path):
    run_dir = tmp_path / "run"
    proc = _run_stand_in(tmp_path, run_dir)
    assert proc.stderr == ""
    assert proc.stdout.count("Global step") == 3

    run = load_run(run_dir)
    spans = run.spans.sort_values(["start_ns", "end_ns"], ascending=[True, False])
    steps = spans[spans["name"] == "step"]
    assert sorted(steps["step"]) == [0, 1, 2]  # train_step's global_step argument
    expected = [
        ("SamplesGenerator.generate_samples", "rollout"),
        ("RemoteExperienceMaker.make_experience_batch", "make_experience"),
        ("RemoteExperienceMaker.make_experience", "make_experience"),
        ("RemoteExperienceMaker.compute_advantages_and_returns", "advantage"),
        ("BasePPOTrainer.ppo_train", "update_actor"),
        ("BasePPOTrainer.broadcast_to_vllm", "reshard"),
    ]
    for n in range(3):
        mine = spans[(spans["step"] == n) & (spans["name"] != "step")]
        assert list(zip(mine["name"], mine["phase"])) == expected
        bounds = steps[steps["step"] == n].iloc[0]
        assert mine["start_ns"].min() >= bounds["start_ns"]  # the step starts at generation
        assert mine["end_ns"].max() <= bounds["end_ns"]
        attrs = bounds["attrs"]
        assert set(attrs) >= {"timing/make_experience", "timing/ppo_train", "timing/broadcast"}
        assert attrs["timing/ppo_train"] >= 0.02
    knobs = run.events[run.events["kind"] == "knobs"]
    assert list(knobs["name"]) == ["openrlhf"]
    values = knobs["attrs"].iloc[0]["knobs"]
    assert values["vllm.gpu_memory_utilization"] == 0.45
    assert values["train.colocate_all"] is True


def test_live_and_logged_compositions_agree(tmp_path):
    """The same stand-in run, live and as its printed ``Global step`` lines (OpenRLHF's own
    ``timing/generation``, ``make_experience``, ``ppo_train``, ``broadcast`` and
    ``step_total``), imported: the step's composition agrees within a few points. OpenRLHF
    times the advantage computation inside make_experience; live, it is a phase of its own
    nested there (by self time), so the two are compared together."""
    import json

    from conftest import run_gpuprof

    live = tmp_path / "live"
    proc = _run_stand_in(tmp_path, live)
    log = tmp_path / "console.log"
    log.write_text(proc.stdout)
    logged = tmp_path / "logged"
    assert run_gpuprof("import", str(log), "-o", str(logged)).returncode == 0
    shares = []
    for run_dir in (live, logged):
        doc = json.loads(run_gpuprof("analyze", str(run_dir), "--json").stdout)
        shares.append({r["phase"]: r["share"] for r in doc["summary"]["bound"]["composition"]})
    live_s, logged_s = shares
    for phase in ("rollout", "update_actor", "reshard"):
        assert logged_s[phase] == pytest.approx(live_s[phase], abs=0.04), (phase, shares)
    experience = live_s["make_experience"] + live_s["advantage"]
    assert logged_s["make_experience"] == pytest.approx(experience, abs=0.04), shares
    assert live_s["advantage"] > 0.03  # nested in make_experience, taken out of it
