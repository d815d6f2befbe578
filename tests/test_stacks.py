"""Python stacks sampled by py-spy and per-thread CPU: the collector's parsing, the store, the
analysis (top stacks per finding, host_bound on the busiest Python thread) and the exports.

The runs watched here are in ``test_stacks_watch.py``; these tests need no py-spy, except the
one sampling a real process (skipped without it).
"""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import sys
import time

import numpy as np
import pandas as pd
import pytest

from gpuprof import store
from gpuprof.analyzers.diagnose import diagnose
from gpuprof.analyzers.findings import AnalysisContext, Thresholds
from gpuprof.analyzers.stacks import StackIndex, is_user_file, short_file
from gpuprof.analyzers.stalls import host_bound
from gpuprof.analyzers.threads import thread_kind
from gpuprof.collectors import stacks as collector
from gpuprof.collectors.host import read_threads
from gpuprof.model import Run, RunMeta, StackSample, ThreadSample, empty_frame
from gpuprof.reports.stacks import collapsed, speedscope
from gpuprof.sim import Pathology, SimConfig, simulate

T0 = 1_800_000_000 * 10**9  # a window boundary (whole seconds since the epoch)
S = 10**9


# ------------------------------------------------------------------------ the collector


def _events(tid, ts, ph, frames):
    return [{"tid": tid, "ts": ts, "ph": ph, "name": n, "pid": 1,
             "args": {"filename": f, "line": line}} for n, f, line in frames]  # fmt: skip


THREAD = ("thread (101): MainThread", "", 0)
MAIN = ("main", "/home/u/train.py", 10)
VERIFY = ("verify", "/home/u/reward.py", 87)
WAIT = ("Queue.get", "/usr/lib/python3.11/queue.py", 180)


def test_chrometrace_becomes_seconds_per_window_thread_and_stack():
    events = (
        _events(7, 0, "B", [THREAD, MAIN, VERIFY])
        + _events(7, 500_000, "E", [VERIFY])  # 0.5 s: verify left, the queue wait began
        + _events(7, 500_000, "B", [WAIT])
        + _events(7, 1_500_000, "E", [WAIT, MAIN, THREAD])  # the round ended at 1.5 s
    )
    parsed = collector.parse_chrometrace(events, T0, S)
    got = {(w - T0, tid, name, frames[-1][0]): v for (w, tid, name, frames), v in
           parsed.seconds.items()}  # fmt: skip
    assert set(got) == {(0, 101, "MainThread", "verify"), (0, 101, "MainThread", "Queue.get"),
                        (S, 101, "MainThread", "Queue.get")}  # fmt: skip
    seconds, first, last = got[(0, 101, "MainThread", "verify")]
    assert seconds == pytest.approx(0.5) and first == T0 and last == T0 + S // 2
    seconds, first, last = got[(0, 101, "MainThread", "Queue.get")]
    assert seconds == pytest.approx(0.5) and (first, last) == (T0 + S // 2, T0 + S)
    assert got[(S, 101, "MainThread", "Queue.get")][0] == pytest.approx(0.5)
    # the thread frame is not part of the stack; frames keep their file and line
    frames = next(k[3] for k in parsed.seconds if k[3][-1][0] == "verify")
    assert frames == (MAIN, VERIFY)


def test_a_thread_without_its_os_id_keeps_its_name():
    events = _events(9, 0, "B", [("thread (0x7f00aa): worker", "", 0), MAIN]) + _events(
        9, 250_000, "E", [MAIN, ("thread (0x7f00aa): worker", "", 0)])  # fmt: skip
    ((_, tid, name, frames),) = collector.parse_chrometrace(events, T0, S).seconds
    assert tid is None and name == "worker" and frames == (MAIN,)


def test_frame_and_stack_ids_are_stable_content_hashes():
    a = collector.frame_id("verify", "/home/u/reward.py", 87)
    assert a == collector.frame_id("verify", "/home/u/reward.py", 87)
    assert a != collector.frame_id("verify", "/home/u/reward.py", 88)
    assert 0 <= a < 2**63
    assert collector.stack_id([1, 2]) != collector.stack_id([2, 1])


@pytest.mark.parametrize(
    ("text", "why"),
    [
        ("Error: Failed to get process executable name. Check that the process is running.\n"
         "\nCaused by:\n    0: Permission denied (os error 13)", "permission"),
        ("Error: Failed to find python version from target process", "not_python"),
        ("Error: Unsupported version of Python: 2.6.9", "unsupported"),
        ("Error: Failed to get process executable name.\n    0: No such file or directory "
         "(os error 2)", "gone"),
        ("Error: something new", "other"),
    ],
)  # fmt: skip
def test_pyspy_errors_are_told_apart(text, why):
    assert collector.pyspy_failure(text) == why


def test_gpus_idle_when_most_gpus_read_idle():
    class G:
        def __init__(self, u):
            self.util_gpu_pct = u

    assert collector.gpus_idle([]) is None
    assert collector.gpus_idle([G(None)]) is None
    assert collector.gpus_idle([G(0), G(3), G(90), G(95)]) is True
    assert collector.gpus_idle([G(0), G(80), G(90)]) is False


def test_read_threads_of_this_process():
    threads = read_threads(__import__("os").getpid())
    assert threads, "no /proc/<pid>/task here"
    me = threads[__import__("os").getpid()]
    assert me.cpu_s > 0 and me.name


class _Writer:
    def __init__(self):
        self.rows: dict[str, list] = {}

    def add_records(self, table, records):
        self.rows.setdefault(table, []).extend(records)


BUSY = """
import threading, time
def spin_here():
    end = time.time() + 60
    while time.time() < end:
        sum(i * i for i in range(2000))
threading.Thread(target=lambda: time.sleep(60), name="sleeper", daemon=True).start()
print("ready", flush=True)
spin_here()
"""


def test_a_real_process_is_sampled_with_its_threads(tmp_path):
    pyspy, why = collector.find_pyspy()
    if pyspy is None:
        pytest.skip(why)
    proc = subprocess.Popen([sys.executable, "-c", BUSY], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().strip() == "ready"
        writer = _Writer()
        target = collector.Target(proc.pid, "main", "python")
        sampler = collector.StackSampler(writer, "h", lambda: [target], pyspy=pyspy,
                                         rate_hz=20)  # fmt: skip
        sampler.start()
        deadline = time.monotonic() + 60
        time.sleep(2.0)
        while sampler.rounds == 0 and time.monotonic() < deadline:
            time.sleep(0.1)
        sampler.stop()
    finally:
        proc.kill()
        proc.wait()
    assert sampler.notices == []
    samples = writer.rows["stack_samples"]
    frames = {f.frame_id: f for f in writer.rows["stack_frames"]}
    stacks = {s.stack_id: [frames[int(x)] for x in s.frames.split()]
              for s in writer.rows["stacks"]}  # fmt: skip
    threads = {s.thread for s in samples}
    assert {"MainThread", "sleeper"} <= threads
    main = [s for s in samples if s.thread == "MainThread"]
    assert all(s.tid == proc.pid and s.pid == proc.pid and s.role == "main" for s in main)
    leaves = {stacks[s.stack_id][-1].name for s in main} | {
        f.name for s in main for f in stacks[s.stack_id]}  # fmt: skip
    assert "spin_here" in leaves
    assert sum(s.seconds for s in main) > 0.5
    assert all(0 < s.seconds <= s.span_s + 1e-6 and s.rate_hz == 20 for s in samples)
    assert sampler.pyspy_cpu_s > 0 and sampler.cost_event().attrs["rounds"] >= 1


# ------------------------------------------------------------------------ a synthetic run


def _frames_and_stacks(paths):
    """stack_frames / stacks frames for the given stacks (lists of (name, file, line))."""
    frames, stacks, ids = {}, {}, []
    for path in paths:
        fids = []
        for name, file, line in path:
            fid = collector.frame_id(name, file, line)
            frames[fid] = (fid, name, file, line)
            fids.append(fid)
        sid = collector.stack_id(fids)
        stacks[sid] = (sid, " ".join(map(str, fids)))
        ids.append(sid)
    return (pd.DataFrame(list(frames.values()), columns=["frame_id", "name", "file", "line"]),
            pd.DataFrame(list(stacks.values()), columns=["stack_id", "frames"]), ids)  # fmt: skip


SIMPLIFY = ("simplify", "/venv/lib/python3.11/site-packages/sympy/simplify/simplify.py", 600)
HOOKS = ("_loop", "/venv/lib/python3.11/site-packages/gpuprof/hooks.py", 120)


def synthetic_run(with_threads: bool = True) -> Run:
    """Two seconds of a main process: busy in verify → sympy's simplify, then blocked in a
    queue; a helper thread busy throughout; gpuprof's own writer thread (left out)."""
    frames, stacks, (busy, blocked, helper, own) = _frames_and_stacks(
        [[MAIN, VERIFY, SIMPLIFY], [MAIN, WAIT], [("loop", "/home/u/helper.py", 3)], [HOOKS]]
    )
    rows = [
        StackSample("h", T0, 1.0, 1.0, 10, 10, "MainThread", "main", busy, 1.0, 20.0),
        StackSample("h", T0 + S, 1.0, 1.0, 10, 10, "MainThread", "main", blocked, 1.0, 20.0),
        *(StackSample("h", T0 + k * S, 1.0, 1.0, 10, 11, "helper", "main", helper, 1.0, 20.0)
          for k in (0, 1)),
        StackSample("h", T0, 1.0, 1.0, 10, 12, "gpuprof-hooks", "main", own, 1.0, 20.0),
    ]  # fmt: skip
    samples = pd.DataFrame([[getattr(r, c) for c in r.__slots__] for r in rows],
                           columns=list(StackSample.__slots__))  # fmt: skip
    run = Run(RunMeta(run_id="syn", cwd="/home/u"), stack_frames=frames, stacks=stacks,
              stack_samples=samples)  # fmt: skip
    if with_threads:
        readings = [  # the main thread busy in the first second only; the helper at 40%
            ThreadSample("h", T0 + S // 2, 10, 10, "python", 100.0, 0.0, 0.5),
            ThreadSample("h", T0 + S, 10, 10, "python", 80.0, 20.0, 0.5),
            *(ThreadSample("h", T0 + k * S // 2, 10, 11, "python", 40.0, None, 0.5)
              for k in (1, 2, 3, 4)),
        ]  # fmt: skip
        run.threads = pd.DataFrame([[getattr(r, c) for c in r.__slots__] for r in readings],
                                   columns=list(ThreadSample.__slots__))  # fmt: skip
    return run


def test_top_stacks_name_the_leaf_most_user_function_and_the_library_call():
    index = StackIndex(synthetic_run())
    summary = index.summary([[T0, T0 + 2 * S]])
    assert summary.activity == "thread_cpu"
    # busy: the main thread's first second, and 40% of the helper's two seconds
    assert summary.busy_s == pytest.approx(1.0 + 0.8)
    assert summary.blocked_s == pytest.approx(1.0 + 1.2)
    top = summary.top[0]
    assert (top.function, top.line, top.short_file) == ("verify", 87, "reward.py")
    assert top.calls == "simplify (sympy/simplify/simplify.py:600)"
    assert top.chain == ["main (train.py:10)", "verify (reward.py:87)", top.calls]
    assert top.share == pytest.approx(1.0 / 1.8) and top.processes == ["main 10"]
    assert summary.top[1].function == "loop"
    assert "gpuprof-hooks" not in {t for g in summary.top for t in g.threads}
    # the main thread was blocked half of the time, in the queue
    assert summary.main_blocked_share == pytest.approx(0.5)
    assert summary.blocked[0].function == "main" and "Queue.get" in summary.blocked[0].calls
    assert summary.headline().startswith("56% of the busy Python time in reward.py:87 verify()")
    doc = summary.to_dict()
    assert json.loads(json.dumps(doc)) == doc and doc["top"][0]["function"] == "verify"


def test_intervals_select_the_time_they_cover():
    index = StackIndex(synthetic_run())
    first_half = index.summary([[T0, T0 + S // 2]])
    assert first_half.top[0].function == "verify"
    assert first_half.busy_s == pytest.approx(0.5 + 0.2)
    second = index.summary([[T0 + S, T0 + 2 * S]])
    assert second.top[0].function == "loop" and second.blocked[0].function == "main"
    assert index.summary([[T0 - 5 * S, T0 - S]]) is None


def test_without_thread_readings_every_sampled_second_counts_as_busy():
    summary = StackIndex(synthetic_run(with_threads=False)).summary([[T0, T0 + 2 * S]])
    assert summary.activity == "unknown" and summary.blocked_s == 0
    assert summary.busy_s == pytest.approx(4.0)
    assert "sampled Python time" in summary.headline()


def test_flame_tree_of_the_busy_time():
    tree = StackIndex(synthetic_run()).tree([[T0, T0 + 2 * S]])
    assert tree["n"] == "all" and tree["v"] == pytest.approx(1.8)
    main = next(c for c in tree["c"] if c["n"] == "main")
    assert main["u"] and main["c"][0]["n"] == "verify" and main["c"][0]["c"][0]["n"] == "simplify"
    assert not main["c"][0]["c"][0]["u"]
    blocked = StackIndex(synthetic_run()).tree([[T0, T0 + 2 * S]], blocked=True)
    assert blocked["v"] == pytest.approx(1.0) and blocked["c"][0]["c"][0]["n"] == "Queue.get"


@pytest.mark.parametrize(
    ("path", "user"),
    [
        ("/home/u/reward.py", True),
        ("<string>", True),
        ("<frozen importlib._bootstrap>", False),
        ("/usr/lib/python3.11/queue.py", False),
        ("/root/.pyenv/versions/3.11.7/lib/python3.11/threading.py", False),
        ("/venv/lib/python3.12/site-packages/torch/nn/modules/module.py", False),
        ("/usr/lib/python3/dist-packages/numpy/core.py", False),
        ("/venv/lib/python3.11/site-packages/gpuprof/hooks.py", False),
        ("/work/repo/gpuprof/integrations/verl.py", False),
    ],
)
def test_user_code_is_what_is_not_the_stdlib_a_package_or_gpuprof(path, user):
    assert is_user_file(path) is user


def test_short_file_names():
    assert short_file("/home/u/proj/rl/reward.py", "/home/u/proj") == "rl/reward.py"
    assert short_file("/venv/lib/python3.11/site-packages/sympy/core.py") == "sympy/core.py"
    assert short_file("/usr/lib/python3.11/queue.py") == "queue.py"
    assert short_file("/elsewhere/x.py", "/home/u") == "x.py"


def test_thread_kinds_from_their_names():
    assert thread_kind("cuda-EvtHandlr") == "CUDA driver"
    assert thread_kind("NCCL Progress 3") == "NCCL"
    assert thread_kind("pt_autograd_0") == "PyTorch autograd engine"
    assert thread_kind("python") is None


# ------------------------------------------------------------------------ the store


def test_the_new_tables_round_trip_through_a_run_directory(tmp_path):
    run = synthetic_run()
    run.meta.hosts = ["h", "g"]
    store.save_run(run, tmp_path / "run")
    back = store.load_run(tmp_path / "run")
    for table in ("threads", "stack_frames", "stacks", "stack_samples"):
        assert len(getattr(back, table)) == len(getattr(run, table)), table
    # interned rows are written once (the first host's file) and read once
    assert back.stack_frames["frame_id"].is_unique
    summary = StackIndex(back).summary([[T0, T0 + 2 * S]])
    assert summary.top[0].function == "verify"


def test_a_file_written_before_the_stack_tables_loads(tmp_path):
    run = Run(RunMeta(run_id="old", hosts=["h"]))
    store.save_run(run, tmp_path / "run")
    path = tmp_path / "run" / "h.sqlite"
    conn = sqlite3.connect(path)
    for table in ("threads", "stack_frames", "stacks", "stack_samples"):
        conn.execute(f"DROP TABLE {table}")
    conn.commit()
    conn.close()
    back = store.load_run(tmp_path / "run")
    assert back.stack_samples.empty and list(back.threads.columns) == list(
        empty_frame(ThreadSample).columns)  # fmt: skip
    assert store.count_rows(tmp_path / "run", "stack_samples") == 0
    store.compact_run(tmp_path / "run")  # compaction skips the tables the file lacks
    store.load_run(tmp_path / "run")


# ------------------------------------------------------------------------ the exports


def test_speedscope_document_follows_the_file_format():
    doc = speedscope(synthetic_run(), idle=True)
    assert doc["$schema"] == "https://www.speedscope.app/file-format-schema.json"
    names = [f["name"] for f in doc["shared"]["frames"]]
    assert {"main", "verify", "simplify", "Queue.get", "loop"} <= set(names)
    assert "_loop" not in names  # gpuprof's own thread
    profiles = {p["name"]: p for p in doc["profiles"]}
    main = profiles["main 10 · MainThread"]
    assert main["type"] == "sampled" and main["unit"] == "seconds"
    assert len(main["samples"]) == len(main["weights"]) == 2
    assert main["endValue"] == pytest.approx(sum(main["weights"])) == pytest.approx(2.0)
    first = [doc["shared"]["frames"][i]["name"] for i in main["samples"][0]]
    assert first == ["main", "verify", "simplify"]  # outermost first, in time order
    assert all(0 <= i < len(names) for p in doc["profiles"] for s in p["samples"] for i in s)
    # by default only busy time, as in the report's flame graphs
    busy = {p["name"]: p for p in speedscope(synthetic_run())["profiles"]}
    assert busy["main 10 · MainThread"]["endValue"] == pytest.approx(1.0)
    assert busy["main 10 · helper"]["endValue"] == pytest.approx(0.8)


def test_collapsed_stacks_are_brendan_greggs_folded_format():
    text = collapsed(synthetic_run(), [[T0, T0 + S]])
    lines = text.splitlines()
    sympy = "/venv/lib/python3.11/site-packages/sympy/simplify/simplify.py"
    assert lines[0] == ("process main 10;thread MainThread;main (/home/u/train.py:10);"
                        f"verify (/home/u/reward.py:87);simplify ({sympy}:600) 20")  # fmt: skip
    for line in lines:
        stack, count = line.rsplit(" ", 1)
        assert int(count) > 0 and stack.count(";") >= 2
    assert lines[1].startswith("process main 10;thread helper;loop (") and lines[1].endswith(" 8")
    idle = collapsed(synthetic_run(), [[T0, T0 + S]], idle=True).splitlines()
    assert idle[1].endswith(" 20")


# ------------------------------------------------------------------------ analysis


def test_findings_about_idle_time_carry_their_stacks():
    result = simulate(SimConfig(gpus=2, steps=4, time_scale=0.3,
                                pathologies=[Pathology("reward_bound", 0.8)]))  # fmt: skip
    run = result.run
    reward = run.spans[run.spans["phase"] == "reward"]
    start, end = int(reward["start_ns"].min()), int(reward["end_ns"].max())
    frames, stacks, (verify_stack, idle_stack) = _frames_and_stacks(
        [[MAIN, VERIFY, SIMPLIFY], [MAIN, WAIT]])  # fmt: skip
    rows = []
    for s, e in zip(reward["start_ns"], reward["end_ns"]):
        rows.append(("h0", int(s), (e - s) / S, 1.0, 1, None, "MainThread", "main", verify_stack,
                     (e - s) / S, 20.0))  # fmt: skip
    rows.append(("h0", start, (end - start) / S, 1.0, 1, None, "loader", "main", idle_stack,
                 1.0, 20.0))  # fmt: skip
    run.stack_frames, run.stacks = frames, stacks
    run.stack_samples = pd.DataFrame(rows, columns=list(StackSample.__slots__))
    diagnosis = diagnose(run)
    finding = next(f for f in diagnosis.findings if f.kind == "reward_bound")
    assert finding.stacks is not None and finding.stacks.top[0].function == "verify"
    assert finding.to_dict()["stacks"]["top"][0]["calls"].startswith("simplify (")
    others = [
        f
        for f in diagnosis.findings
        if f.kind
        not in (
            "reward_bound",
            "host_bound",
            "dataloader_starvation",
            "reshard_idle",
            "periodic_stall",
            "idle_unattributed",
        )
    ]
    assert all(f.stacks is None and "stacks" not in f.to_dict() for f in others)


def _with_threads(run: Run, main_cpu: float, cuda_cpu: float) -> Run:
    """Thread readings for every trainer/main process sample: the main (Python) thread at
    ``main_cpu``, a CUDA driver thread at ``cuda_cpu``."""
    procs = run.procs[run.procs["role"].isin(["main", "trainer"])]
    rows = []
    for host, t, pid in zip(procs["host"], procs["t_ns"], procs["pid"]):
        rows.append((host, int(t), int(pid), int(pid), "python", main_cpu, 0.0, 0.5))
        rows.append((host, int(t), int(pid), int(pid) + 1, "cuda-EvtHandlr", cuda_cpu, 0.0, 0.5))
    run.threads = pd.DataFrame(rows, columns=list(ThreadSample.__slots__))
    return run


def _host_bound(run: Run):
    return host_bound.detect(AnalysisContext(run), Thresholds())


def _sim_host_bound() -> Run:
    return simulate(SimConfig(gpus=4, steps=3, time_scale=0.05, framework="trl", seed=3,
                              pathologies=[Pathology("host_bound", 0.8)])).run  # fmt: skip


def test_host_bound_is_judged_on_the_busiest_python_thread():
    base = _host_bound(_sim_host_bound())
    assert base is not None and base.evidence["cpu_measure"] == "process"
    # the process's core is a CUDA thread spinning: the Python thread is far from pinned
    assert _host_bound(_with_threads(_sim_host_bound(), 20.0, 99.0)) is None
    # the main thread pinned: host-bound, judged on it, the spinning thread named
    found = _host_bound(_with_threads(_sim_host_bound(), 98.0, 90.0))
    assert found is not None
    ev = found.evidence
    assert ev["cpu_measure"] == "busiest_python_thread"
    assert ev["python_thread_cpu_pct"] == pytest.approx(98.0)
    assert ev["python_thread"].startswith("python (pid ")
    spin = ev["spinning_threads"][0]
    assert spin["thread"] == "cuda-EvtHandlr" and spin["kind"] == "CUDA driver"
    assert "busiest Python thread" in found.summary
    assert np.isclose(found.gpu_seconds_lost, base.gpu_seconds_lost, rtol=0.2)


def test_the_idle_rate_goes_to_the_processes_that_matter_within_a_budget():
    sampler = collector.StackSampler(_Writer(), "h", list, pyspy="py-spy", rate_hz=2,
                                     idle_rate_hz=20, idle_budget_hz=50)  # fmt: skip
    assert [sampler.idle_rate_for(n) for n in (1, 2, 3, 5, 30)] == [20, 20, 16, 10, 2]
    assert collector.Target(1, "main", "python").wants_idle_rate
    assert collector.Target(2, "dataloader", "python", cpu_pct=80.0).wants_idle_rate
    assert not collector.Target(3, "dataloader", "python", cpu_pct=0.5).wants_idle_rate
    assert not collector.Target(4, "main", "torchrun", launcher=True).wants_idle_rate
    sampler.stop()


def test_processes_are_chosen_by_role_launchers_last():
    offered = [collector.Target(1, "main", "torchrun", launcher=True),
               *(collector.Target(10 + k, "trainer", "python", start_s=k) for k in range(8)),
               collector.Target(30, "dataloader", "python"),
               collector.Target(31, "other", "bash")]  # fmt: skip
    sampler = collector.StackSampler(_Writer(), "h", lambda: offered, pyspy="py-spy")
    chosen = [t.pid for t in sampler._choose()]
    assert chosen == [10, 11, 12, 13, 14, 15, 16, 17]
    sampler.max_processes = 20
    assert [t.pid for t in sampler._choose()][-2:] == [30, 1]  # no shell: not Python
    sampler.stop()


def test_ray_machinery_py_spy_and_the_sampler_itself_are_never_sampled():
    offered = [collector.Target(40, "other", "python", infra=True),  # dashboard agent
               collector.Target(41, "other", "py-spy"),  # a round of the node's own
               collector.Target(os.getpid(), "other", "ray::NodeSampler"),
               collector.Target(42, "other", "ray::RewardWorker")]  # fmt: skip
    sampler = collector.StackSampler(_Writer(), "h", lambda: offered, pyspy="py-spy")
    assert [t.pid for t in sampler._choose()] == [42]
    sampler.stop()


def test_a_ray_nodes_sampler_ships_its_workers_stacks_under_the_nodes_name(tmp_path):
    # the sampler gpuprof places on a Ray node other than the watcher's, run in this process
    # (the root of its tree): a worker under it is sampled once the driver's first pull says
    # the node is recorded, and its stacks ship with the node's name in the run
    import pyarrow as pa

    from gpuprof import columnar
    from gpuprof.integrations.ray_cluster.sampler import NodeSampler

    pyspy, why = collector.find_pyspy()
    if pyspy is None:
        pytest.skip(why)
    proc = subprocess.Popen([sys.executable, "-c", BUSY], stdout=subprocess.PIPE, text=True)
    node = NodeSampler("run", "s", stacks={"rate_hz": 20, "idle_rate_hz": 20})
    try:
        assert proc.stdout.readline().strip() == "ready"
        info = node.start("node7", 0.1, None, False, None)
        assert info["start_ns"] > 0 and node.stacks is None  # none before the first pull
        batches = [node.take()]
        assert node.stacks is not None
        deadline = time.monotonic() + 60
        while node.stacks.rounds == 0 and time.monotonic() < deadline:
            time.sleep(0.2)
        time.sleep(1.5)
        node._rename("node7b")  # two nodes of one name: the driver renames one
        batches.append(node.finish())
    finally:
        proc.kill()
        proc.wait()
    tables: dict[str, list] = {}
    for batch in batches:
        for table, (_, blob) in batch["chunks"].items():
            tables.setdefault(table, []).append(columnar.decode_chunks(table, [blob]))
    got = {t: pa.concat_tables(parts).to_pandas() for t, parts in tables.items()}
    samples, frames, stacks = got["stack_samples"], got["stack_frames"], got["stacks"]
    mine = samples[samples["pid"] == proc.pid]
    assert len(mine) and set(mine["host"]) == {"node7b"}
    assert (samples["pid"] != os.getpid()).all()  # never the sampler itself
    names = dict(zip(frames["frame_id"], frames["name"]))
    seen = {names[int(f)] for s in stacks["frames"] for f in s.split()}
    assert "spin_here" in seen
    assert len(set(frames["frame_id"])) == len(frames)  # interned: each frame shipped once
    assert (got["threads"]["host"] == "node7b").all()  # busy threads read too
    cost = got["events"][got["events"]["name"] == "stacks"]
    assert len(cost) == 1 and cost["host"].iloc[0] == "node7b"


# The speedscope file format (jlfwong/speedscope, src/lib/file-format-spec.ts) as a JSON
# schema, for the sampled profiles gpuprof writes.
SPEEDSCOPE_FILE_SCHEMA = {
    "type": "object",
    "required": ["$schema", "shared", "profiles"],
    "properties": {
        "$schema": {"const": "https://www.speedscope.app/file-format-schema.json"},
        "shared": {
            "type": "object",
            "required": ["frames"],
            "properties": {"frames": {"type": "array", "items": {
                "type": "object", "required": ["name"],
                "properties": {"name": {"type": "string"}, "file": {"type": "string"},
                               "line": {"type": "number"}, "col": {"type": "number"}},
            }}},
        },
        "profiles": {"type": "array", "items": {
            "type": "object",
            "required": ["type", "name", "unit", "startValue", "endValue", "samples", "weights"],
            "properties": {
                "type": {"const": "sampled"},
                "name": {"type": "string"},
                "unit": {"enum": ["none", "nanoseconds", "microseconds", "milliseconds",
                                  "seconds", "bytes"]},
                "startValue": {"type": "number"},
                "endValue": {"type": "number"},
                "samples": {"type": "array",
                            "items": {"type": "array", "items": {"type": "number"}}},
                "weights": {"type": "array", "items": {"type": "number"}},
            },
        }},
        "name": {"type": "string"},
        "activeProfileIndex": {"type": "number"},
        "exporter": {"type": "string"},
    },
}  # fmt: skip


def test_speedscope_document_validates_against_the_file_format():
    jsonschema = pytest.importorskip("jsonschema")
    doc = json.loads(json.dumps(speedscope(synthetic_run(), idle=True)))
    jsonschema.validate(doc, SPEEDSCOPE_FILE_SCHEMA)
    for profile in doc["profiles"]:
        assert len(profile["samples"]) == len(profile["weights"])
        assert profile["endValue"] >= profile["startValue"]
    assert doc["exporter"].startswith("gpuprof@")


def test_a_round_that_ended_before_it_was_stopped_still_counts_its_cpu(tmp_path):
    """The end of the watch interrupts every running py-spy; one that had just ended is
    reaped by ``wait4`` then, with its CPU time (the cost event's ``pyspy_cpu_s``), not by
    `Popen.send_signal`'s poll, which loses it."""
    import subprocess
    import sys
    import time

    import psutil

    sampler = collector.StackSampler(_Writer(), "h", list, pyspy="py-spy")
    burn = "import time\nt = time.process_time()\nwhile time.process_time() - t < 0.3: pass\n"
    proc = subprocess.Popen([sys.executable, "-c", burn])
    deadline = time.monotonic() + 30
    while psutil.Process(proc.pid).status() != psutil.STATUS_ZOMBIE:  # ended, not reaped
        assert time.monotonic() < deadline
        time.sleep(0.01)
    target = collector.Target(os.getpid(), "main", "python")
    out = tmp_path / "round.json"
    sampler._running[proc.pid] = collector._Round(target, 2, proc, str(out), str(tmp_path / "log"),
                                                  0, time.monotonic(), False)  # fmt: skip
    sampler._finish_all()
    assert proc.returncode == 0 and not sampler._running
    assert sampler.pyspy_cpu_s >= 0.25
    sampler.stop()
