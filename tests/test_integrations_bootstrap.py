"""The zero-code bootstrap: what it costs, what it chains to, how it fails, how watch sets it.

Each test runs a fresh interpreter, as ``gpuprof watch`` runs the user's command.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

from conftest import ROOT, clean_env, run_gpuprof

from gpuprof.analyzers.findings import Finding
from gpuprof.analyzers.recommend import recommend
from gpuprof.api import load_run
from gpuprof.integrations import bootstrap_dir

BOOT = bootstrap_dir()


def _python(code: str, tmp_path: Path, *, extra_path: str = "", **env: str):
    paths = [BOOT, str(ROOT), extra_path]
    full = clean_env(**env)
    full["PYTHONPATH"] = os.pathsep.join(p for p in paths if p)
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        capture_output=True,
        text=True,
        env=full,
        cwd=tmp_path,
        timeout=60,
    )


FINDER_STATE = """
import sys
print(any(type(f).__name__ == "_Finder" for f in sys.meta_path))
print("gpuprof" in sys.modules, "pandas" in sys.modules)
"""


def test_active_under_a_run_without_importing_gpuprof(tmp_path):
    proc = _python(FINDER_STATE, tmp_path, GPUPROF_RUN_DIR=str(tmp_path / "run"))
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["True", "False", "False"]
    assert proc.stderr == ""


def test_inactive_outside_a_run_and_when_turned_off(tmp_path):
    outside = _python(FINDER_STATE, tmp_path)
    off = _python(FINDER_STATE, tmp_path, GPUPROF_RUN_DIR=str(tmp_path), GPUPROF_AUTO="0")
    for proc in (outside, off):
        assert proc.returncode == 0, proc.stderr
        assert proc.stdout.split()[0] == "False"


def test_chains_to_the_sitecustomize_it_shadows(tmp_path):
    other = tmp_path / "other"
    other.mkdir()
    (other / "sitecustomize.py").write_text("import sys\nsys.other_site_ran = True\n")
    proc = _python(
        """
        import sys
        print(getattr(sys, "other_site_ran", False))
        print(sys.modules["sitecustomize"].__file__)
        print(any(type(f).__name__ == "_Finder" for f in sys.meta_path))
        """,
        tmp_path,
        extra_path=str(other),
        GPUPROF_RUN_DIR=str(tmp_path / "run"),
    )
    assert proc.returncode == 0, proc.stderr
    ran, module_file, finder = proc.stdout.split()
    assert ran == "True"
    assert Path(module_file) == other / "sitecustomize.py"
    assert finder == "True"


def _frozen_openrlhf(root: Path) -> None:
    """A package at OpenRLHF's module path whose class refuses new attributes, so the
    adapter's patch fails at import time (as on a framework version it does not know)."""
    pkg = root / "openrlhf" / "trainer" / "ppo_utils"
    pkg.mkdir(parents=True)
    for folder in (root / "openrlhf", root / "openrlhf" / "trainer", pkg):
        (folder / "__init__.py").write_text("")
    (pkg / "samples_generator.py").write_text(
        textwrap.dedent(
            """
            class _Frozen(type):
                def __setattr__(cls, name, value):
                    raise TypeError("class is frozen")


            class SamplesGenerator(metaclass=_Frozen):
                def generate_samples(self):
                    return "samples"
            """
        )
    )


def test_a_failed_patch_warns_once_and_the_program_runs(tmp_path):
    _frozen_openrlhf(tmp_path)
    proc = _python(
        """
        import openrlhf.trainer.ppo_utils.samples_generator as m
        print(m.SamplesGenerator().generate_samples())
        print(type(m.__loader__).__name__, type(m.__spec__.loader).__name__)
        """,
        tmp_path,
        extra_path=str(tmp_path),
        GPUPROF_RUN_DIR=str(tmp_path / "run"),
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["samples", "SourceFileLoader", "SourceFileLoader"]
    lines = proc.stderr.splitlines()
    assert len(lines) == 1, proc.stderr
    assert lines[0].startswith("gpuprof: could not instrument OpenRLHF (TypeError: class is")
    assert lines[0].endswith("it runs unprofiled")


PRINT_PATH = "import os; print(os.environ.get('PYTHONPATH', ''))"


def test_watch_puts_the_bootstrap_first_and_keeps_the_users_path(tmp_path):
    env = clean_env()
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), "/opt/user-libs"])
    proc = run_gpuprof(
        "watch", "--no-nvml", "-q", "-o", str(tmp_path / "run"), "--",
        sys.executable, "-c", PRINT_PATH,
        env=env,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    parts = proc.stdout.strip().split(os.pathsep)
    assert parts[0] == BOOT
    assert parts[1:] == [str(ROOT), "/opt/user-libs"]


def test_watch_no_auto_leaves_the_path_alone(tmp_path):
    proc = run_gpuprof(
        "watch", "--no-auto", "--no-nvml", "-q", "-o", str(tmp_path / "run"), "--",
        sys.executable, "-c", PRINT_PATH,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert BOOT not in proc.stdout.strip().split(os.pathsep)
    assert proc.stdout.strip().split(os.pathsep)[0] == str(ROOT)


def test_recorded_knobs_reach_the_run_and_the_recommender(tmp_path):
    run_dir = tmp_path / "run"
    code = (
        "import gpuprof.hooks as h; "
        "h.record_knobs('verl', {'actor_rollout_ref.rollout.gpu_memory_utilization': 0.35,"
        " 'data.max_response_length': 1024}, '0.9.1')"
    )
    proc = run_gpuprof(
        "watch", "--no-nvml", "-q", "-o", str(run_dir), "--", sys.executable, "-c", code
    )
    assert proc.returncode == 0, proc.stderr
    meta = load_run(run_dir).meta
    assert meta.framework == "verl"
    assert meta.knobs["actor_rollout_ref.rollout.gpu_memory_utilization"] == 0.35
    assert meta.knobs["verl.__version__"] == "0.9.1"
    finding = Finding("memory_headroom", 100.0, 0.2, 0.9, "memory left unused", {})
    recs = {r.knob: r for r in recommend([finding], meta)}
    gmu = recs["actor_rollout_ref.rollout.gpu_memory_utilization"]
    assert gmu.current == 0.35  # read from what the process recorded, not a default
    assert gmu.suggested > 0.35


def test_knobs_recorded_without_a_watcher_merge_from_the_loaded_run(tmp_path):
    from gpuprof.integrations.recorded import merge_run_events

    run_dir = tmp_path / "run"
    code = (
        "import sys, gpuprof, gpuprof.hooks as h; gpuprof.init(sys.argv[1]); "
        "h.record_knobs('trl', {'max_completion_length': 64}, '1.16.0'); "
        "h.record_knobs('trl', {'max_completion_length': 128, 'num_generations': 8})"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code, str(run_dir)], env=clean_env(), capture_output=True
    )
    assert proc.returncode == 0, proc.stderr
    run = load_run(run_dir)
    assert run.meta.knobs == {}
    assert merge_run_events(run)
    assert run.meta.framework == "trl"
    assert run.meta.knobs["max_completion_length"] == 128  # the later record wins
    assert run.meta.knobs["num_generations"] == 8
    assert run.meta.knobs["trl.__version__"] == "1.16.0"


def test_analysis_loading_merges_knobs_recorded_without_a_watcher(tmp_path):
    from gpuprof.loader import load_for_analysis

    run_dir = tmp_path / "run"
    code = (
        "import sys, gpuprof, gpuprof.hooks as h; gpuprof.init(sys.argv[1]); "
        "h.record_knobs('trl', {'num_generations': 8}, '1.16.0')"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code, str(run_dir)], env=clean_env(), capture_output=True
    )
    assert proc.returncode == 0, proc.stderr
    run = load_for_analysis(run_dir)
    assert run.meta.framework == "trl" and run.meta.knobs["num_generations"] == 8
