"""The performance budget (``benchmarks/budget.py``): instruction counts of the imports, the
hooks' recording path and ``analyze`` on a fixed small run, held to ``benchmarks/budget.json``
within 10 %. Counted by callgrind, so the load of the machine does not move them."""

from __future__ import annotations

import shutil
import subprocess
import sys

import pytest
from conftest import ROOT, clean_env

pytestmark = pytest.mark.skipif(
    shutil.which("valgrind") is None, reason="valgrind not installed (.ci/run installs it)"
)

SLOWED_DETECTOR = """
from gpuprof.analyzers import diagnose

_apply = diagnose._apply


def slowed(stall, ctx, th, findings, notes):
    if stall.kind == "reward_bound":  # a detector that walks every GPU sample in Python
        for _ in range(30):
            sum(float(u) for u in ctx.run.gpu["util_gpu_pct"].tolist())
    _apply(stall, ctx, th, findings, notes)


diagnose._apply = slowed
"""


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    path = tmp_path_factory.mktemp("budget") / "run"
    made = _check(path, "--make-run")
    assert made.returncode == 0, made.stderr
    return path


def _check(run_dir, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "budget.py"), "--run-dir", str(run_dir),
         *args], capture_output=True, text=True, env=clean_env(), timeout=900,
    )  # fmt: skip


def _rows(stdout: str) -> dict[str, str]:
    return {line.split()[0]: line for line in stdout.splitlines() if line.strip()}


def test_the_everyday_path_is_within_its_budget(run_dir):
    checked = _check(run_dir)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    rows = _rows(checked.stdout)
    for region in ("imports", "hooks_per_pair", "analyze"):
        assert region in rows and "OVER BUDGET" not in rows[region], checked.stdout


def test_a_slowed_detector_fails_the_budget_with_its_figures(run_dir, tmp_path):
    prelude = tmp_path / "slowed.py"
    prelude.write_text(SLOWED_DETECTOR)
    checked = _check(run_dir, "--prelude", str(prelude))
    assert checked.returncode == 1, checked.stdout + checked.stderr
    rows = _rows(checked.stdout)
    assert "OVER BUDGET" in rows["analyze"], checked.stdout
    assert "OVER BUDGET" not in rows["imports"] + rows["hooks_per_pair"], checked.stdout
    assert "move the budget with --update --why" in checked.stdout
