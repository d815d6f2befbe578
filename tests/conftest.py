"""Shared test helpers: run gpuprof in a subprocess the way a user would."""

from __future__ import annotations

import atexit
import os
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import Phase, settings
from zygote import Zygote

# Hypothesis's "explain" phase traces every line of a failing example again and again (over
# five minutes for one failure of tests/test_run_dir_fuzz.py); the shrunk example is what a
# failure needs, so the suite stops there
settings.register_profile(
    "suite", phases=[Phase.explicit, Phase.reuse, Phase.generate, Phase.target, Phase.shrink]
)
settings.load_profile("suite")

ROOT = Path(__file__).resolve().parent.parent
SHARED_FIXTURES = ROOT.parent / "shared" / "fixtures"


def gpuprof_cmd(*args: str) -> list[str]:
    """The gpuprof CLI as a subprocess command line."""
    return [sys.executable, "-m", "gpuprof", *args]


def clean_env(**extra: str) -> dict[str, str]:
    """The environment for a child: no inherited gpuprof run, the repo importable."""
    # the hooks' implementation switch is a property of the test, not a run: it passes
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith("GPUPROF_") or k == "GPUPROF_PURE_PYTHON_HOOKS"
    }
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    env.update(extra)
    return env


def wandb_offline(tmp: Path) -> dict[str, str]:
    """Environment variables that keep W&B offline, quiet and inside ``tmp`` (its runs in
    ``tmp/wandb``)."""
    return {
        "WANDB_MODE": "offline",
        "WANDB_SILENT": "true",
        "WANDB_DIR": str(tmp),
        "WANDB_CONFIG_DIR": str(tmp / "wandb-config"),
        "WANDB_CACHE_DIR": str(tmp / "wandb-cache"),
        "WANDB_DATA_DIR": str(tmp / "wandb-data"),
    }


def run_gpuprof(
    *args: str, timeout: float = 120, text: bool = True, cwd=None, env=None, **kwargs
) -> subprocess.CompletedProcess:
    """``python -m gpuprof ARGS`` to its end, output captured: forked from this worker's zygote
    (``tests/zygote.py``, the same ``__main__`` without ~1 s of imports) where it can stand for
    a fresh process, else in a fresh process (always with ``FRESH_GPUPROF_PROCESSES=1``).

    A request with other ``LD_*`` variables (the simulated NVML library's directory) is
    forked from a zygote started with them: the dynamic loader reads them once, at start."""
    env = env or clean_env()
    args = tuple(map(str, args))
    if not kwargs and os.environ.get("FRESH_GPUPROF_PROCESSES") != "1":
        zygote = _zygote_for(env)
        if zygote is not None:
            return zygote.run(list(args), env, cwd, timeout, text)
    return subprocess.run(
        gpuprof_cmd(*args), capture_output=True, timeout=timeout, env=env, text=text, cwd=cwd,
        **kwargs,
    )  # fmt: skip


_ZYGOTES: dict[tuple[tuple[str, str], ...], Zygote] = {}
_MOST_ZYGOTES = 3
"""Zygotes a worker keeps: one per set of the dynamic loader's variables (``LD_*``, read
once when a process starts), such as the simulated NVML library's directory."""


def _zygote_for(env: dict[str, str]) -> Zygote | None:
    loader = tuple(sorted((k, v) for k, v in env.items() if k.startswith("LD_")))
    zygote = _ZYGOTES.get(loader)
    if zygote is None:
        if len(_ZYGOTES) >= _MOST_ZYGOTES:
            return None
        base = {k: v for k, v in clean_env().items() if not k.startswith("LD_")}
        zygote = _ZYGOTES[loader] = Zygote({**base, **dict(loader)})
        atexit.register(zygote.close)
    return zygote if zygote.serves(env) else None


def pytest_configure(config: pytest.Config) -> None:
    """Compile gpuprof and the tests' helper modules to bytecode once, before any test runs.

    Hundreds of tests start ``python -m gpuprof`` or a watched program that imports gpuprof;
    where the environment sets PYTHONDONTWRITEBYTECODE (as container images often do) each of
    those processes would compile every module it imports again (~0.4 s of CPU per process).
    Existing bytecode is still read under that variable, so writing it here once is enough.
    Done by the main process only (pytest-xdist's workers start after it)."""
    if hasattr(config, "workerinput"):
        return
    import compileall

    for folder in (ROOT / "gpuprof", ROOT / "tests", ROOT / "examples"):
        compileall.compile_dir(folder, quiet=2, workers=1)


def pytest_xdist_auto_num_workers(config: pytest.Config) -> int:
    """Workers for ``-n auto``: one more than the cores this process may run on. On two cores
    with one worker each, the suite kept them 148 % busy of 200 %: much of its time is spent
    waiting for watched programs, their sleeps and the processes they start. A third worker
    fills that (179 %, docs/PERFORMANCE.md)."""
    return len(os.sched_getaffinity(0)) + 1


SLOWEST_FIRST = (
    "test_run_dir_fuzz.py",
    "test_parts.py",
    "test_ray_cluster.py",
    "test_budget.py",
    "test_labelled_runs.py",
    "test_by_steps.py",
    "test_stacks_watch.py",
    "test_watch.py",
    "test_printed_timings.py",
    "test_log_to.py",
    "test_kept_series.py",
    "test_held_parts.py",
    "test_integrations_verl.py",
    "test_trl_e2e.py",
    "test_multinode_torchrun.py",
    "test_load_cache.py",
    "test_step_window.py",
    "test_reliability.py",
    "test_import_trackers.py",
    "test_report_browser.py",
    "test_integrations_swift.py",
    "test_analyze_cli.py",
    "test_import_fuzz_variants.py",
)
"""The modules that take longest (measured with ``--durations``, longest first). pytest-xdist
hands whole modules (``--dist loadscope``) to its workers in collection order; started first,
the long ones no longer leave one core idle at the end while the other finishes a module
started last. A module missing here only runs later; none is skipped."""


def pytest_collection_modifyitems(session: pytest.Session, config: pytest.Config, items) -> None:
    rank = {name: i for i, name in enumerate(SLOWEST_FIRST)}
    # sorted is stable: the tests of a module, and the other modules, keep their order
    items.sort(key=lambda item: rank.get(item.path.name, len(rank)))


@pytest.fixture(autouse=True)
def _no_inherited_run(monkeypatch):
    """Tests never record into a run of an enclosing `gpuprof watch`."""
    for name in list(os.environ):
        if name.startswith("GPUPROF_") and name != "GPUPROF_SIMNVML_SCENARIO":
            monkeypatch.delenv(name, raising=False)
    # a merged run read in this process is merged afresh (tests compare ways of merging the
    # same directory); tests/test_load_cache.py turns keeping it back on
    monkeypatch.setenv("GPUPROF_LOAD_CACHE", "0")
