"""`gpuprof watch` sampling the Python stacks of real processes with py-spy, end to end.

A GRPO-like loop (``tests/workloads/grpo_slow.py``) with a deliberately slow reward function
names that function as the top stack of ``reward_bound``; with a slow ``__getitem__`` in a
DataLoader worker process, it names that under ``dataloader_starvation``. Without py-spy, or
where py-spy may not read the process (no ptrace permission), the watch goes on and says why
in one line. Everything goes through the CLI as a user would; the runs have no GPU
(``--no-nvml``: findings from phase timing), so stacks are sampled at the rate given.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
from pathlib import Path

import pytest
from conftest import ROOT, clean_env, gpuprof_cmd, run_gpuprof

from gpuprof import store
from gpuprof.collectors.stacks import find_pyspy

pytest_plugins = ["simnvml.fixtures"]

WORKLOAD = ROOT / "tests" / "workloads" / "grpo_slow.py"
PYSPY, WHY = find_pyspy()
needs_pyspy = pytest.mark.skipif(PYSPY is None, reason=f"{WHY}")
pytest.importorskip("torch")


def watch(tmp_path: Path, *args: str, flags: tuple[str, ...] = ("--stacks-rate", "20"),
          env: dict[str, str] | None = None, prefix: tuple[str, ...] = ()):  # fmt: skip
    run_dir = tmp_path / "run"
    cmd = [*prefix, *gpuprof_cmd("watch", "--no-nvml", "-o", str(run_dir), *flags, "--",
                                 sys.executable, str(WORKLOAD), *args)]  # fmt: skip
    import subprocess

    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600,
                          env=env or clean_env())  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc, run_dir


def analyze(run_dir: Path) -> dict:
    proc = run_gpuprof("analyze", str(run_dir), "--json", timeout=300)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


def finding(doc: dict, kind: str) -> dict:
    found = [f for f in doc["findings"] if f["kind"] == kind]
    assert found, [f["kind"] for f in doc["findings"]]
    return found[0]


def gpuprof_lines(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if line.startswith("gpuprof: ")]


@needs_pyspy
def test_a_slow_reward_function_is_the_top_stack_of_reward_bound(tmp_path):
    proc, run_dir = watch(tmp_path, "--slow", "reward", "--steps", "5", "--cost", "1.0")
    assert not [line for line in gpuprof_lines(proc.stderr) if "stacks" in line.lower()]
    doc = analyze(run_dir)
    stacks = finding(doc, "reward_bound")["stacks"]
    top = stacks["top"][0]
    assert (top["function"], Path(top["file"]).name) == ("verify", "grpo_slow.py"), stacks
    assert top["user_code"] and top["share"] >= 0.5 and top["processes"][0].startswith("main ")
    assert top["chain"][-1].startswith("verify (") and stacks["rate_hz"] == 20
    assert stacks["headline"].startswith(f"{top['share']:.0%} of the busy Python time in ")
    # the stacks are in the run: compacted into their side files with the rest
    run = store.load_run(run_dir)
    assert len(run.stack_samples) and len(run.threads) and len(run.stack_frames)
    assert (run_dir / f"{run.meta.hosts[0]}.stack_samples.parquet").exists()
    cost = run.events[run.events["kind"] == "collector"]["attrs"].iloc[0]
    assert cost["rounds"] >= 1 and cost["pyspy_cpu_s"] > 0
    # the terminal diagnosis names it under the finding
    text = run_gpuprof("analyze", str(run_dir)).stdout
    assert "Python:" in text and "grpo_slow.py:" in text and "verify()" in text
    # the report holds its flame graph, as data the page draws
    html = (run_dir / "report.html").read_text()
    assert 'class="flame" data-flame=' in html and '"flames":' in html
    # and the stacks export for speedscope and flamegraph.pl, the finding's or all
    out = tmp_path / "reward.folded"
    result = run_gpuprof("export", str(run_dir), "-f", "collapsed", "--finding", "reward_bound",
                         "-o", str(out))  # fmt: skip
    assert result.returncode == 0, result.stderr
    heaviest = out.read_text().splitlines()[0]  # busy time: the reward function's lines
    assert heaviest.startswith("process main ") and ";verify (" in heaviest, heaviest
    result = run_gpuprof("export", str(run_dir), "-f", "speedscope")
    assert result.returncode == 0, result.stderr
    speedscope = json.loads((run_dir / "stacks.speedscope.json").read_text())
    assert any(f["name"] == "verify" for f in speedscope["shared"]["frames"])
    assert {p["type"] for p in speedscope["profiles"]} == {"sampled"}


@needs_pyspy
def test_a_slow_getitem_in_a_loader_worker_is_named_under_dataloader_starvation(tmp_path):
    _, run_dir = watch(tmp_path, "--slow", "loader", "--steps", "6", "--cost", "1.0")
    doc = analyze(run_dir)
    stacks = finding(doc, "dataloader_starvation")["stacks"]
    top = stacks["top"][0]
    assert top["function"] == "SlowPrompts.__getitem__", stacks
    # sampled in the DataLoader's worker process, not the trainer
    assert top["processes"][0].startswith("dataloader ")
    assert stacks["processes"] >= 2


def test_pyspy_comes_with_gpuprof_where_it_ships_wheels():
    """`pip install gpuprof` (the README's main command) brings py-spy on the platforms it ships
    wheels for, so a first watch records stacks; elsewhere it is left to the ``stacks`` extra
    and the one notice line."""
    from importlib.metadata import requires

    from packaging.requirements import Requirement

    needs = [Requirement(r) for r in requires("gpuprof") or []]
    pyspy = [r for r in needs if r.name == "py-spy"]
    regular = [r for r in pyspy if r.marker is None or "extra" not in str(r.marker)]
    assert len(regular) == 1 and regular[0].marker is not None
    marker = regular[0].marker
    wheels = [("linux", "x86_64"), ("linux", "aarch64"), ("linux", "i686"), ("linux", "armv7l"),
              ("darwin", "arm64"), ("darwin", "x86_64"), ("win32", "AMD64")]  # fmt: skip
    for platform, machine in wheels:
        assert marker.evaluate({"sys_platform": platform, "platform_machine": machine})
    for platform, machine in [("linux", "ppc64le"), ("linux", "s390x"), ("win32", "ARM64"),
                              ("freebsd14", "amd64")]:  # fmt: skip
        assert not marker.evaluate({"sys_platform": platform, "platform_machine": machine})
    if marker.evaluate():  # this machine: installed with gpuprof, and found by the watch
        assert PYSPY is not None, WHY


def test_without_pyspy_the_watch_goes_on_with_one_line(tmp_path):
    env = clean_env(GPUPROF_PYSPY=str(tmp_path / "no-such-py-spy"))
    proc, run_dir = watch(tmp_path, "--slow", "reward", "--steps", "2", "--cost", "0.3", env=env)
    said = [line for line in gpuprof_lines(proc.stderr) if "py-spy" in line]
    assert len(said) == 1 and "py-spy not found" in said[0], proc.stderr[-2000:]
    run = store.load_run(run_dir)
    assert run.stack_samples.empty and any("py-spy not found" in n for n in run.meta.notices)
    assert len(run.spans) and len(run.procs)  # the rest of the run as before
    result = run_gpuprof("export", str(run_dir), "-f", "collapsed")
    assert result.returncode == 2 and "no Python stacks" in result.stderr


def test_no_stacks_turns_sampling_off_quietly(tmp_path):
    proc, run_dir = watch(tmp_path, "--slow", "reward", "--steps", "2", "--cost", "0.3",
                          flags=("--no-stacks",))  # fmt: skip
    assert not [line for line in gpuprof_lines(proc.stderr) if "stack" in line.lower()]
    run = store.load_run(run_dir)
    assert run.stack_samples.empty and run.threads.empty
    assert "Python stacks turned off (--no-stacks)" in run.meta.notices


NOT_DUMPABLE = """
import ctypes, runpy, sys
ctypes.CDLL(None).prctl(4, 0, 0, 0, 0)  # PR_SET_DUMPABLE 0: only CAP_SYS_PTRACE may trace it
sys.argv = sys.argv[1:]
runpy.run_path(sys.argv[0], run_name="__main__")
"""


@needs_pyspy
@pytest.mark.skipif(shutil.which("capsh") is None or os.geteuid() != 0,
                    reason="needs root and capsh to drop CAP_SYS_PTRACE")  # fmt: skip
def test_a_process_py_spy_may_not_read_degrades_with_one_line(tmp_path):
    """The watcher without CAP_SYS_PTRACE (a container without --cap-add SYS_PTRACE) and a
    command that is not dumpable: py-spy is refused by the kernel, as it would be there."""
    wrapper = tmp_path / "not_dumpable.py"
    wrapper.write_text(NOT_DUMPABLE)
    run_dir = tmp_path / "run"
    inner = [*gpuprof_cmd("watch", "--no-nvml", "-o", str(run_dir), "--stacks-rate", "20",
                          "--", sys.executable, str(wrapper), str(WORKLOAD), "--slow",
                          "reward", "--steps", "3", "--cost", "0.5")]  # fmt: skip
    import shlex
    import subprocess

    cmd = ["capsh", "--drop=cap_sys_ptrace", "--", "-c", shlex.join(inner)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600, env=clean_env())
    assert proc.returncode == 0, proc.stderr[-3000:]
    said = [line for line in gpuprof_lines(proc.stderr) if "py-spy" in line]
    assert len(said) == 1, proc.stderr[-3000:]
    assert "permission denied" in said[0] and "SYS_PTRACE" in said[0]
    assert "ptrace_scope" in said[0] and "goes on" in said[0]
    run = store.load_run(run_dir)
    assert len(run.spans) and run.meta.exit_code == 0
    assert any("permission denied" in n for n in run.meta.notices)
    # the denied process has no stacks after it made itself undumpable (py-spy may have
    # caught its first instants, while the interpreter started); others of its tree may
    main = run.stack_samples[run.stack_samples["role"] == "main"]
    assert main["seconds"].sum() < 1.0, main


@needs_pyspy
def test_stacks_are_sampled_faster_once_the_gpus_go_idle(tmp_path, simnvml_lib):
    """Two simulated GPUs busy for the first 4 s, then idle: the trainer's round at the low
    rate is cut short and sampling goes on at the idle rate; reward_bound, judged on the GPU
    samples, names the reward function."""
    from simnvml import simnvml_env, write_scenario

    gpus = [{"series": {"util_gpu_pct": [(0, 90), (4, 0)], "mem_used_bytes": 20 * 2**30}}
            for _ in range(2)]  # fmt: skip
    scenario = write_scenario(tmp_path / "scenario.txt", {"gpus": gpus})
    run_dir = tmp_path / "run"
    env = simnvml_env(simnvml_lib, scenario, base=clean_env())
    proc = run_gpuprof("watch", "-o", str(run_dir), "--", sys.executable, str(WORKLOAD),
                       "--slow", "reward", "--steps", "6", "--cost", "1.0", env=env,
                       timeout=600)  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    run = store.load_run(run_dir)
    main = run.stack_samples[run.stack_samples["role"] == "main"]
    assert set(main["rate_hz"]) == {2.0, 20.0}, sorted(set(main["rate_hz"]))
    idle_from = int(run.gpu.loc[run.gpu["util_gpu_pct"] == 0, "t_ns"].min())
    assert main.loc[main["rate_hz"] == 20.0, "t_ns"].min() >= idle_from - 10**9
    stacks = finding(analyze(run_dir), "reward_bound")["stacks"]
    assert stacks["top"][0]["function"] == "verify", stacks
