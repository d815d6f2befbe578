"""The end of a watch (`gpuprof.watch_end`): the summary, the diagnosis and the report made
from one reading and one diagnosis of the run, in a process of their own whose death costs
them alone — the watcher still exits with the watched command's code."""

from __future__ import annotations

import importlib.util
import json
import os
import signal
import subprocess
import time
from pathlib import Path

import psutil
from conftest import clean_env, gpuprof_cmd

from gpuprof import api, load_cache, loader, store, watch_end
from gpuprof.reports.fmt import render_json
from gpuprof.sim import SimConfig, simulate


def _saved(tmp_path: Path) -> Path:
    run_dir = tmp_path / "run"
    store.save_run(simulate(SimConfig(gpus=4, steps=6, seed=3)).run, run_dir)
    return run_dir


def _when_the_end_starts(watcher: subprocess.Popen, act) -> bool:
    """``act(process)`` on the watcher's end-of-watch process as soon as it runs (polled every
    10 ms, for at most 60 s); whether it was found before the watcher ended."""
    deadline = time.monotonic() + 60
    while watcher.poll() is None and time.monotonic() < deadline:
        try:
            children = psutil.Process(watcher.pid).children()
        except psutil.NoSuchProcess:
            return False
        for child in children:
            try:
                if any("gpuprof.watch_end" in part for part in child.cmdline()):
                    act(child)
                    return True
            except psutil.NoSuchProcess:
                continue
        time.sleep(0.01)
    return False


def test_the_run_is_read_and_diagnosed_once_for_summary_headline_and_report(
    tmp_path, monkeypatch, capsys
):
    # a path longer than the terminal is wide (as under pytest-xdist's directories, where the
    # summary's last line was once cut at 80 columns): it is printed whole, to be copied
    run_dir = _saved(tmp_path / ("a_long_directory_name_" * 4))
    want = json.loads(render_json(api.analyze(loader.load_for_analysis(run_dir)).to_dict()))
    loads, diagnoses = [], []
    real_load, real_analyze = loader.load_for_analysis, api.analyze

    def load(*args, **kwargs):
        loads.append(args)
        return real_load(*args, **kwargs)

    def analyze(*args, **kwargs):
        diagnoses.append(kwargs.get("workers"))
        return real_analyze(*args, **kwargs)

    monkeypatch.setattr(loader, "load_for_analysis", load)
    monkeypatch.setattr(api, "load_for_analysis", load)
    monkeypatch.setattr(api, "analyze", analyze)
    monkeypatch.setenv("GPUPROF_WORKERS", "2")
    made = watch_end.finish(run_dir, quiet=False)
    assert len(loads) == 1 and diagnoses == [2]  # every core (here: as many as asked)
    assert made.report == run_dir / "report.html" and made.report.stat().st_size > 10_000
    assert made.document == want
    err = capsys.readouterr().err
    for said in ("mean GPU util", f"run saved to {run_dir}", "full diagnosis:",
                 f"report: {made.report}"):  # fmt: skip
        assert said in err, said
    assert err.index("run saved to") < err.index("full diagnosis:") < err.index("report:")


def test_an_unreadable_run_is_one_line_and_nothing_made(tmp_path, capsys):
    (tmp_path / "run").mkdir()
    made = watch_end.finish(tmp_path / "run", quiet=False)
    assert made.report is None and made.document is None
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("gpuprof: error:")


def test_a_kill_of_the_end_of_the_watch_costs_the_summary_not_the_exit_code(tmp_path):
    # the end's process killed as the kernel kills the largest process when memory runs out
    run_dir = tmp_path / "w"
    trackers = ["--log-to", "tensorboard"] if importlib.util.find_spec("tensorboard") else []
    watcher = subprocess.Popen(
        gpuprof_cmd("watch", "--no-nvml", "-o", str(run_dir), *trackers, "--", "python", "-c",
                    "import sys, time; time.sleep(0.5); sys.exit(5)"),
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=clean_env(),
    )  # fmt: skip
    killed = _when_the_end_starts(watcher, lambda end: end.kill())
    _, err = watcher.communicate(timeout=60)
    assert killed, err
    assert watcher.returncode == 5
    lines = [line for line in err.splitlines() if line.startswith("gpuprof: error:")]
    assert len(lines) == 1, err
    assert "killed (SIGKILL, out of memory?)" in lines[0]
    assert f"gpuprof analyze {run_dir} --by-steps 24" in lines[0]
    assert not (run_dir / "report.html").exists()
    run = store.load_run(run_dir)
    assert run.meta.exit_code == 5  # the run itself is saved
    if trackers:  # the trackers got the live figures alone, and the run says why
        assert not (run_dir / "diagnosis.json").exists()
        assert any("the diagnosis is not logged" in n for n in run.meta.notices), err


def test_ctrl_c_during_the_end_of_the_watch_is_one_line_and_the_exit_code(tmp_path):
    # Ctrl-C in a terminal signals the foreground process group: the watcher's (the end runs
    # in a session of its own, the watcher stops it)
    run_dir = tmp_path / "w"
    # as at a terminal: a shell without job control starts background commands (CI's, so
    # perhaps this test) with SIGINT ignored, which the watcher would inherit; a handler
    # here is reset to the default in the watcher by exec
    before = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        watcher = subprocess.Popen(
            gpuprof_cmd("watch", "--no-nvml", "-o", str(run_dir), "--", "python", "-c",
                        "import sys, time; time.sleep(0.5); sys.exit(4)"),
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=clean_env(),
            start_new_session=True,
        )  # fmt: skip
    finally:
        signal.signal(signal.SIGINT, before)
    # at once: the end is still starting (its imports alone take ~0.3 s)
    sent = _when_the_end_starts(watcher, lambda _: os.killpg(watcher.pid, signal.SIGINT))
    _, err = watcher.communicate(timeout=60)
    assert sent, err
    assert watcher.returncode == 4, err
    assert "Traceback" not in err, err
    lines = [line for line in err.splitlines() if line.startswith("gpuprof: error:")]
    assert len(lines) == 1 and "interrupted" in lines[0], err


def test_no_report_leaves_the_run_saved_and_undiagnosed(tmp_path):
    """``--no-report``: the command's exit code, one line naming the run and how to diagnose
    it, and nothing read or made at the end (no report, no kept form)."""
    run_dir = tmp_path / "w"
    got = subprocess.run(
        gpuprof_cmd("watch", "--no-nvml", "--no-report", "-o", str(run_dir), "--", "python", "-c",
                    "import sys, time; time.sleep(0.3); sys.exit(4)"),
        capture_output=True, text=True, env=clean_env(), timeout=120,
    )  # fmt: skip
    assert got.returncode == 4, got.stderr
    assert "Traceback" not in got.stderr
    lines = [line for line in got.stderr.splitlines() if "--no-report" in line]
    assert lines == [f"gpuprof: the run is saved in {run_dir} (--no-report): "
                     f"gpuprof analyze {run_dir}"], got.stderr  # fmt: skip
    assert not (run_dir / "report.html").exists()
    assert not (run_dir / load_cache.DIRNAME).exists()
    assert store.load_run(run_dir).meta.exit_code == 4
