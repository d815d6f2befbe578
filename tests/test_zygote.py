"""The tests' zygote (``tests/zygote.py``) stands for ``python -m gpuprof``: the same output,
exit codes and end, and gpuprof's modules safe to import once for many commands."""

from __future__ import annotations

import ast
import signal
import subprocess
import sys

import conftest
import pytest
from conftest import ROOT, clean_env, gpuprof_cmd, run_gpuprof
from simnvml import simnvml_env, write_scenario
from zygote import Zygote

from gpuprof import store

pytest_plugins = ["simnvml.fixtures"]


@pytest.fixture(scope="module")
def zygote():
    z = Zygote(clean_env())
    yield z
    z.close()


@pytest.fixture(scope="module")
def demo_run(tmp_path_factory):
    run_dir = tmp_path_factory.mktemp("zygote") / "demo"
    made = subprocess.run(
        gpuprof_cmd("demo", "-o", str(run_dir), "--duration", "60"),
        capture_output=True, text=True, env=clean_env(), timeout=120,
    )  # fmt: skip
    assert made.returncode == 0, made.stderr
    return run_dir


def _fresh(*args: str, cwd=None) -> subprocess.CompletedProcess:
    return subprocess.run(
        gpuprof_cmd(*args), capture_output=True, text=True, env=clean_env(), cwd=cwd, timeout=120
    )


@pytest.mark.parametrize(
    "args",
    [
        ("--help",),
        ("analyze", "--help"),
        ("analyze", "{run}", "--json"),
        ("analyze", "{run}", "--top", "2"),
        ("summary", "{run}"),
        ("compare", "{run}", "{run}"),
        ("analyze", "{run}/no-such-run"),  # bad input: one line, exit 2
        ("analyze", "{run}", "--top", "0"),  # typer's usage error
        ("no-such-command",),
    ],
)
def test_a_forked_command_is_the_fresh_process(zygote, demo_run, args):
    args = tuple(a.format(run=demo_run) for a in args)
    forked = zygote.run(list(args), clean_env(), None, 120, True)
    fresh = _fresh(*args)
    assert (forked.returncode, forked.stdout, forked.stderr) == (
        fresh.returncode,
        fresh.stdout,
        fresh.stderr,
    )


def test_the_working_directory_and_environment_are_the_requests(zygote, demo_run, tmp_path):
    # a relative run directory is found from the request's working directory
    forked = zygote.run(["summary", demo_run.name], clean_env(), demo_run.parent, 120, True)
    assert forked.returncode == 0, forked.stderr
    assert forked.stdout == _fresh("summary", demo_run.name, cwd=demo_run.parent).stdout
    # and a variable of the request (the terminal width) reaches the child
    narrow = zygote.run(["--help"], clean_env(COLUMNS="50"), None, 120, True)
    assert max(map(len, narrow.stdout.splitlines())) <= 50


def test_a_timeout_kills_the_child_and_raises_as_subprocess_does(zygote, demo_run):
    with pytest.raises(subprocess.TimeoutExpired):
        zygote.run(["watch", "--", sys.executable, "-c", "import time; time.sleep(5)"],
                   clean_env(), demo_run.parent, 1.5, True)  # fmt: skip


def test_a_child_killed_by_a_signal_reports_it_as_subprocess_does(zygote, tmp_path):
    # the watcher keeps the watched command's exit: killed by SIGTERM → -15 from a shell's view;
    # here the forked gpuprof itself is the one killed
    script = tmp_path / "kill_me.py"
    script.write_text("import os, signal; os.kill(os.getppid(), signal.SIGKILL)\n")
    ended = zygote.run(["watch", "--", sys.executable, str(script)], clean_env(), tmp_path, 60,
                       True)  # fmt: skip
    assert ended.returncode == -signal.SIGKILL


def test_requests_the_zygote_cannot_reproduce_run_fresh(zygote):
    assert zygote.serves(clean_env(GPUPROF_WORKERS="1", COLUMNS="50"))
    # what a fresh interpreter or a preloaded library reads when it starts
    assert not zygote.serves(clean_env(PYTHONPATH="/elsewhere"))
    assert not zygote.serves(clean_env(PYTHONIOENCODING="latin-1"))
    assert not zygote.serves(clean_env(OMP_NUM_THREADS="7"))
    assert not zygote.serves(clean_env(LD_LIBRARY_PATH="/opt/simulated-nvml"))


def test_a_watch_given_a_library_path_finds_the_library(monkeypatch, tmp_path, simnvml_lib):
    """The loader reads LD_LIBRARY_PATH once, when a process starts: a watch whose environment
    points at the simulated NVML library is forked from a zygote started with that path, and
    samples its GPU."""
    monkeypatch.delenv("FRESH_GPUPROF_PROCESSES", raising=False)
    scenario = write_scenario(tmp_path / "scenario.txt", {"gpus": [{"name": "NVIDIA H100"}]})
    env = simnvml_env(simnvml_lib, scenario, base=clean_env())
    run_dir = tmp_path / "run"
    script = "import time; time.sleep(0.6)"
    watched = run_gpuprof("watch", "-o", str(run_dir), "--interval", "0.1", "--no-auto", "--",
                          sys.executable, "-c", script, env=env, timeout=120)  # fmt: skip
    assert watched.returncode == 0, watched.stderr
    assert len(store.load_run(run_dir).gpu) > 0
    # forked, from a zygote of its own that started with that library path
    loaders = [dict(key).get("LD_LIBRARY_PATH") for key in conftest._ZYGOTES]
    assert env["LD_LIBRARY_PATH"] in loaders


def test_fresh_processes_when_asked_for_or_fed_stdin(monkeypatch):
    def no_zygote(env):
        raise AssertionError("the zygote was asked")

    monkeypatch.setattr(conftest, "_zygote_for", no_zygote)
    monkeypatch.delenv("FRESH_GPUPROF_PROCESSES", raising=False)
    assert run_gpuprof("--help", input="").returncode == 0
    monkeypatch.setenv("FRESH_GPUPROF_PROCESSES", "1")
    assert run_gpuprof("--help").returncode == 0


_STATE_AT_IMPORT = {"environ", "getenv", "getcwd", "cwd", "cpu_count", "getpid", "time"}


def _reads_at_import(tree: ast.Module) -> list[str]:
    """Names of process state read by module-level code (function bodies excluded)."""
    found = []

    def visit(node: ast.AST) -> None:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            return
        if isinstance(node, ast.Attribute) and node.attr in _STATE_AT_IMPORT:
            found.append(f"{node.attr} (line {node.lineno})")
        for child in ast.iter_child_nodes(node):
            visit(child)

    for statement in tree.body:
        visit(statement)
    return found


def test_gpuprof_modules_read_no_process_state_when_imported():
    """The zygote imports gpuprof once for many commands: a module that read the environment,
    the working directory or the clock at import would give every command the zygote's."""
    offenders = {}
    for path in sorted((ROOT / "gpuprof").rglob("*.py")):
        if "integrations" in path.parts:
            continue  # loaded inside training processes, never by the zygote
        reads = _reads_at_import(ast.parse(path.read_text(), str(path)))
        if reads:
            offenders[str(path.relative_to(ROOT))] = reads
    assert not offenders


def test_the_check_above_sees_a_module_level_read():
    tree = ast.parse(
        "import os\nWORKERS = int(os.environ.get('N', 2))\ndef f():\n    os.getcwd()\n"
    )
    assert _reads_at_import(tree) == ["environ (line 2)"]
