"""The CPU GRPO example runs end to end, prints a line per step and scores answers correctly."""

from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "examples" / "grpo_tiny.py"
TINY = [
    "--batch-size", "4", "--group-size", "2", "--num-digits", "3", "--max-new-tokens", "5",
    "--d-model", "32", "--layers", "1", "--heads", "2",
]  # fmt: skip
STEP_LINE = re.compile(r"^step\s+(\d+)\s+reward\s+([\d.]+)\s+exact\s+([\d.]+)\s+loss\s+\S+")


@pytest.fixture(scope="module")
def grpo():
    """The example loaded as a module (examples/ is not a package)."""
    spec = importlib.util.spec_from_file_location("grpo_tiny", EXAMPLE)
    module = importlib.util.module_from_spec(spec)
    sys.modules["grpo_tiny"] = module  # dataclasses look their module up while building
    try:
        spec.loader.exec_module(module)
        yield module
    finally:
        sys.modules.pop("grpo_tiny", None)


def test_script_runs_with_dataloader_workers():
    """As a user runs it, with a forked DataLoader worker and the hooks imported normally."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("GPUPROF_")}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    proc = subprocess.run(
        [sys.executable, str(EXAMPLE), "--steps", "3", "--num-workers", "1", *TINY],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    steps = [m for line in proc.stdout.splitlines() if (m := STEP_LINE.match(line))]
    assert [int(m[1]) for m in steps] == [0, 1, 2]
    for m in steps:
        assert 0.0 <= float(m[2]) <= 1.0
        assert 0.0 <= float(m[3]) <= 1.0
    assert "done: 3 steps" in proc.stdout


def test_main_is_deterministic_and_in_range(grpo):
    threads = torch.get_num_threads()
    try:
        first = grpo.main(["--steps", "2", *TINY])
        second = grpo.main(["--steps", "2", *TINY])
    finally:
        torch.set_num_threads(threads)
    assert len(first) == 2
    assert [s.reward for s in first] == [s.reward for s in second]
    for stats in first:
        assert 0.0 <= stats.reward <= 1.0
        assert stats.tokens > 0
        assert stats.seconds > 0


def test_reward_rule(grpo):
    assert grpo.score("4321.", "4321") == pytest.approx(1.0)
    assert grpo.score("4321", "4321") == pytest.approx(0.8)  # right digits, never ended
    assert grpo.score("43.", "4321") == pytest.approx(0.2 + 0.8 * 2 / 4)
    assert grpo.score("432100.", "4321") == pytest.approx(0.2 + 0.8 * 4 / 6)  # extra digits
    assert grpo.score("4+21.", "4321") == pytest.approx(0.8 * 3 / 4)  # not digits-only
    assert grpo.score(".", "4321") == 0.0
    assert grpo.score("", "4321") == 0.0


def test_group_advantages(grpo):
    rewards = torch.tensor([1.0, 0.0, 0.5, 0.5, 0.2, 0.2, 0.2, 0.2])
    adv = grpo.group_advantages(rewards, group_size=4).view(2, 4)
    assert adv[0].mean().item() == pytest.approx(0.0, abs=1e-6)
    assert adv[0, 0] > adv[0, 2] > adv[0, 1]
    assert torch.equal(adv[1], torch.zeros(4))  # identical answers carry no signal


def test_completion_mask_stops_after_eos(grpo):
    ids = torch.tensor([grpo.encode("12.__"), grpo.encode("1234."), grpo.encode("12345")])
    expected = torch.tensor([[1, 1, 1, 0, 0], [1, 1, 1, 1, 1], [1, 1, 1, 1, 1]]).float()
    assert torch.equal(grpo.completion_mask(ids), expected)
