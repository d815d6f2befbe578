"""`gpuprof watch` over a Ray driver records the whole cluster, with no code change.

A real Ray cluster on this machine (`ray.cluster_utils.Cluster`, shared by the module): a
head and two worker nodes, each raylet with its own environment — its node name
(``GPUPROF_HOST``), its own simulated GPUs (the simulated NVML library and a scenario) and,
for the workers, a clock that is off (``GPUPROF_SIM_CLOCK_SKEW_NS``, +250 ms and -400 ms).
The job is a plain Ray script (``ray.init(address=…)``, actors pinned on every node using
``gpuprof.phase``/``gpuprof.step`` and verl's ``marked_timer``) run under ``gpuprof watch``
on the head node; the run must hold every node's GPUs, every actor's spans on its node, the
nodes' clocks recovered, and a node that joins and is then lost mid-run.
"""

from __future__ import annotations

import contextlib
import functools
import importlib.util
import io
import json
import os
import socket
import sqlite3
import subprocess
import sys
import textwrap
import time
import types
import urllib.request
from pathlib import Path

import pytest
from conftest import ROOT, clean_env, gpuprof_cmd
from lazy_rfc3987 import first_on_path, lazy_imports
from simnvml import simnvml_env, write_scenario

from gpuprof import store
from gpuprof.collectors.stacks import find_pyspy
from gpuprof.integrations.ray_cluster import recorder as recorder_mod
from gpuprof.integrations.ray_cluster import runtime_env as renv
from gpuprof.integrations.ray_cluster import setup_hook
from gpuprof.integrations.ray_cluster.recorder import ClusterRecorder, estimate_offset
from gpuprof.integrations.ray_cluster.sampler import NodeSampler, SpoolTail

pytest_plugins = ["simnvml.fixtures"]
if importlib.util.find_spec("ray") is None:  # imported where used: collecting this module in
    # every worker of a parallel run does not start Ray's seconds of imports there
    pytest.skip("ray is not installed", allow_module_level=True)

MS = 1_000_000
PYSPY, _ = find_pyspy()
NODES = {
    # name: (GPU name, GPU count, utilization %, clock skew ns)
    "node0": ("NVIDIA H100 80GB HBM3", 2, 30, 0),
    "node1": ("NVIDIA A100-SXM4-80GB", 1, 60, 250 * MS),
    "node2": ("NVIDIA H200", 3, 85, -400 * MS),
}


@functools.cache
def _verl() -> bool:
    """Whether verl's timer imports here (asked once, by the test that needs it: importing verl
    takes seconds)."""
    return subprocess.run([sys.executable, "-c", "import verl.utils.profiler.performance"],
                          capture_output=True).returncode == 0  # fmt: skip


JOB = textwrap.dedent(
    """
    import json, os, sys, time
    import ray
    import gpuprof
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    def user_setup():  # the job's own setup hook: gpuprof's runs first, then this one
        os.environ["USER_HOOK_RAN"] = "yes"

    ray.init(
        address=os.environ["JOB_RAY_ADDRESS"],
        runtime_env={"env_vars": {"JOB_VAR": "kept"}, "worker_process_setup_hook": user_setup},
    )

    @ray.remote(num_cpus=0)
    class Worker:
        def node(self):
            keys = ("JOB_VAR", "USER_HOOK_RAN", "GPUPROF_DB", "GPUPROF_WATCHER_MACHINE",
                    "GPUPROF_SIM_CLOCK_SKEW_NS")
            return os.environ.get("GPUPROF_HOST"), {k: os.environ.get(k) for k in keys}

        def sync(self):
            with gpuprof.phase("sync"):
                time.sleep(0.005)

        def work(self, steps, verl):
            if verl:
                from verl.utils.profiler.performance import marked_timer
            for _ in range(steps):
                if verl:  # first: the last phase each actor finished is a rollout
                    timing = {}
                    with marked_timer("update_actor", timing):
                        time.sleep(0.01)
                with gpuprof.phase("rollout"):
                    time.sleep(0.03)
                gpuprof.step()
            return steps

        def until(self, path, limit_s):
            end = time.time() + limit_s
            while not os.path.exists(path) and time.time() < end:
                with gpuprof.phase("rollout"):
                    time.sleep(0.05)
                gpuprof.step()

    def on(node):
        return NodeAffinitySchedulingStrategy(node["NodeID"], soft=False)

    alive = [n for n in ray.nodes() if n["Alive"]]
    workers = [Worker.options(scheduling_strategy=on(n)).remote() for n in alive]
    names, seen = zip(*ray.get([w.node.remote() for w in workers]))
    print("job nodes:", sorted(names), flush=True)
    print("job env:", json.dumps(dict(zip(names, seen)), sort_keys=True), flush=True)
    verl_on = os.environ.get("JOB_VERL") == "1"
    stop = os.environ.get("JOB_STOP_FILE")
    if stop:
        ray.get([w.until.remote(stop, 60) for w in workers])
    else:
        ray.get([w.work.remote(10, verl_on and name == "node2") for w, name in zip(workers, names)])
        hold, end = os.environ.get("JOB_HOLD_FILE"), time.time() + 300
        while hold and not os.path.exists(hold) and time.time() < end:
            time.sleep(0.1)  # until the test has read the live metrics
    for _ in range(5):  # windows on the driver's clock that each actor's span must fall in
        for w in workers:
            with gpuprof.phase("sync_window"):
                ray.get(w.sync.remote())
    time.sleep(1.0)  # a few more samples and the spooled spans shipped
    sys.exit(int(os.environ.get("JOB_EXIT", "0")))
    """
)


# -- pure parts --------------------------------------------------------------------------------


def test_offset_from_the_tightest_round_trip():
    # node clock 250 ms ahead; the second round trip is the tightest (2 µs)
    readings = [(1_000, 250 * MS + 1_900, 5_000), (10_000, 250 * MS + 10_001, 10_002)]
    est = estimate_offset(readings)
    assert est.offset_ns == -250 * MS
    assert est.error_ns == 1 and est.rtt_ns == 2
    assert estimate_offset([]) is None


def test_runtime_env_is_merged_never_replaced(monkeypatch, tmp_path):
    import ray

    monkeypatch.setenv("GPUPROF_HOST", "head")
    calls = []

    def user_hook():
        calls.append("user")

    job = {
        "env_vars": {"NCCL_DEBUG": "WARN", "GPUPROF_HOST": "head", "GPUPROF_RUN_ID": "mine"},
        "pip": ["x"],
        "worker_process_setup_hook": user_hook,
    }
    ours = renv.run_env_vars("/runs/r1", "r1", "s1", "head")
    merged, lines = renv.merge(job, ours)
    assert lines == []
    assert merged["pip"] == ["x"]
    env = merged["env_vars"]
    assert env["NCCL_DEBUG"] == "WARN"
    assert env["GPUPROF_RUN_ID"] == "mine"  # the job's value wins
    assert env["GPUPROF_RUN_DIR"] == "/runs/r1"
    assert "GPUPROF_HOST" not in env  # copied from the driver: names the head only
    for name in setup_hook.NOT_PROPAGATED:
        assert name not in ours
    assert job["env_vars"]["GPUPROF_HOST"] == "head"  # the job's own dict is untouched
    hook = merged["worker_process_setup_hook"]
    monkeypatch.delenv("GPUPROF_RUN_DIR", raising=False)
    hook()  # gpuprof's set-up (nothing to do outside a run), then the job's hook
    assert calls == ["user"]
    # a string hook is chained too; the hook is pickled by value, so that a node without
    # gpuprof still runs the job's hook, and says so in one line instead of failing
    merged, _ = renv.merge({"worker_process_setup_hook": "builtins.print"}, ours)
    assert renv.pickle_hook_by_value(ray)
    blob = ray.cloudpickle.dumps(merged["worker_process_setup_hook"])
    env = clean_env(GPUPROF_RUN_DIR="/runs/r1", GPUPROF_HOST="worker1")
    env["PYTHONPATH"] = first_on_path(lazy_imports(tmp_path / "imports"), env["PYTHONPATH"])
    out = subprocess.run([sys.executable, "-c", NO_GPUPROF], input=blob, env=env,
                         capture_output=True, check=True)  # fmt: skip
    assert out.stdout == b"A\n\nB\n"
    assert out.stderr.decode().strip() == (
        "gpuprof: gpuprof is not installed on Ray node worker1: its workers are not profiled "
        "(install gpuprof on every node)"
    )


NO_GPUPROF = textwrap.dedent(
    """
    import sys
    import ray.cloudpickle as pickle

    class NoGpuprof:  # as on a node where gpuprof is not installed
        def find_spec(self, name, path=None, target=None):
            if name == "gpuprof" or name.startswith("gpuprof."):
                raise ModuleNotFoundError(name)

    sys.meta_path.insert(0, NoGpuprof())
    hook = pickle.loads(sys.stdin.buffer.read())
    print("A", flush=True)
    hook()
    print("B", flush=True)
    """
)


def test_watchers_metadata_leads_the_nodes_it_recorded(tmp_path):
    # the driver writes a document per other node (no command); whatever the node names,
    # the watcher's document leads and its node is the time reference
    from gpuprof.model import RunMeta

    watcher = RunMeta(run_id="r", command=["python", "job.py"], hosts=["zeta"], exit_code=0)
    node = RunMeta(run_id="r", hosts=["alpha"], gpus=[{"host": "alpha", "index": 0}],
                   notices=["node alpha lost at 10:00:00"], reference_node="zeta")  # fmt: skip
    meta = store.merge_meta([node.to_dict(), watcher.to_dict()], tmp_path)
    assert meta.command == ["python", "job.py"] and meta.exit_code == 0
    assert meta.hosts == ["alpha", "zeta"] and meta.reference_node == "zeta"
    assert meta.notices == ["node alpha lost at 10:00:00"]


SETUP_PROBE = textwrap.dedent(
    """
    import json, os, sys
    from gpuprof.integrations.ray_cluster.setup_hook import make_setup_hook
    make_setup_hook()()
    print(json.dumps({
        "run_dir": os.environ.get("GPUPROF_RUN_DIR"),
        "finder": any(getattr(f, "gpuprof_bootstrap", False) for f in sys.meta_path),
        "pythonpath": os.environ.get("PYTHONPATH", ""),
        "host": os.environ.get("GPUPROF_HOST"),
    }))
    """
)


@pytest.mark.parametrize("node", ["head", "worker1"])
def test_setup_hook_spools_away_from_the_watchers_node(tmp_path, node):
    import socket

    env = clean_env(GPUPROF_HOST=node, GPUPROF_SPOOL_DIR=str(tmp_path / "spool"),
                    **renv.run_env_vars(str(tmp_path / "run"), "r1", "s1", "head"))  # fmt: skip
    env["GPUPROF_RAY_REFERENCE_MACHINE"] = socket.gethostname()
    out = subprocess.run([sys.executable, "-c", SETUP_PROBE], env=env, capture_output=True,
                         text=True, check=True)  # fmt: skip
    seen = json.loads(out.stdout)
    assert seen["finder"]
    assert "bootstrap" in seen["pythonpath"].split(os.pathsep)[0]
    if node == "head":
        assert seen["run_dir"] == str(tmp_path / "run")
    else:
        assert seen["run_dir"] == str(tmp_path / "spool" / "gpuprof-spool" / "r1-s1" / "worker1")


def test_spool_tail_reads_new_rows_once(tmp_path):
    probe = textwrap.dedent(
        """
        import gpuprof
        with gpuprof.phase("rollout", tokens=7):
            pass
        gpuprof.step()
        gpuprof.shutdown()
        """
    )
    env = clean_env(GPUPROF_RUN_DIR=str(tmp_path), GPUPROF_HOST="worker1")
    subprocess.run([sys.executable, "-c", probe], env=env, check=True)
    tail = SpoolTail(tmp_path, "worker1-renamed")
    rows = tail.poll()
    spans = rows["spans"]
    assert {r[6] for r in spans} == {"rollout", "step"}  # the name column
    assert {r[0] for r in spans} == {"worker1-renamed"}
    assert any(r[-1] == {"tokens": 7} for r in spans)
    assert {r[4] for r in rows["events"]} >= {"process", "step"}
    assert tail.poll() == {"spans": [], "events": []}
    assert tail.remove_finished() == 1 and not list(tmp_path.glob("*.sqlite"))


class _ActorDied(Exception):
    pass


class _Ref:
    def __init__(self, value=None, error=None, ready=True):
        self.value, self.error, self.ready = value, error, ready


class _FakeActor:
    """A `NodeSampler` run in this process, with the identity and faults a test gives it."""

    def __init__(self, fake, node_id, *args):
        self.sampler = NodeSampler(*args)
        self.setup = fake.setups[node_id]
        self.killed = False

    def __getattr__(self, method):
        def remote(*args):
            if self.setup.get("dead") and method != "hello":
                return _Ref(error=_ActorDied("The actor died unexpectedly"))
            if self.setup.get("silent") and method == "finish":
                return _Ref(ready=False)  # no answer: a node cut off, not yet known dead
            if method == "hello":
                if self.setup.get("unplaceable"):
                    return _Ref(ready=False)
                return _Ref(self.setup["hello"])
            return _Ref(getattr(self.sampler, method)(*args))

        return types.SimpleNamespace(remote=remote)


class _FakeRay:
    """Just what `ClusterRecorder` calls, over in-process samplers."""

    __version__ = "2.60.0"
    exceptions = types.SimpleNamespace(RayActorError=_ActorDied, ActorUnavailableError=KeyError)

    def __init__(self, setups):
        self.setups = setups
        self.alive = dict.fromkeys(setups, True)
        self.actors = {}
        self.list_gets = 0

    def nodes(self):
        return [{"NodeID": i, "Alive": a, "NodeManagerAddress": "10.0.0.1"}
                for i, a in self.alive.items()]  # fmt: skip

    def remote(self, cls):
        fake = self

        class Handle:
            def options(self, scheduling_strategy, **_):
                node_id = scheduling_strategy.node_id

                def make(*args):
                    fake.actors[node_id] = actor = _FakeActor(fake, node_id, *args)
                    return actor

                return types.SimpleNamespace(remote=make)

        return Handle()

    def wait(self, refs, num_returns=1, timeout=None):
        return [r for r in refs if r.ready], [r for r in refs if not r.ready]

    def get(self, ref, timeout=None):
        if isinstance(ref, list):  # as Ray's: every value, or the first error
            self.list_gets += 1
            return [self.get(r) for r in ref]
        if ref.error is not None:
            raise ref.error
        return ref.value

    def kill(self, actor):
        actor.killed = True

    def is_initialized(self):
        return True


def test_recorder_places_skips_dedupes_times_out_and_loses_nodes(tmp_path, monkeypatch):
    import socket

    monkeypatch.setenv("GPUPROF_RAY_PLACE_TIMEOUT_S", "0.3")
    monkeypatch.setattr(recorder_mod, "MEMBERSHIP_S", 0.0)
    me = socket.gethostname()

    def hello(name, machine=me, own=True):
        return {"node": name, "machine": machine, "own_name": own, "pid": 1}

    fake = _FakeRay({
        "a" * 56: {"hello": hello("head")},  # the watcher's node: sampled by the watcher
        "b" * 56: {"hello": hello("w1", machine="m1")},
        "c" * 56: {"unplaceable": True},
        "d" * 56: {"hello": hello("w1", machine="m2")},  # a second node called w1
        "e" * 56: {"hello": hello(me, own=False)},  # the head again, without GPUPROF_HOST
    })  # fmt: skip
    lines = io.StringIO()
    rec = ClusterRecorder(fake, tmp_path, "r1", "s1", "head", me, interval_s=0.05, nvml=False,
                          stream=lines)  # fmt: skip
    assert rec.prepare()
    for _ in range(4):
        rec.tick()
        time.sleep(0.15)
    states = {node_id[0]: node.state for node_id, node in rec.nodes.items()}
    assert states == {"a": "watcher", "b": "active", "c": "failed", "d": "active",
                      "e": "watcher"}  # fmt: skip
    assert fake.actors["a" * 56].killed and fake.actors["c" * 56].killed
    assert fake.list_gets >= 1  # the nodes' replies read in one call
    for name in ("w1", "w1-dddddddd"):  # committed right after the pull, not by a timer
        conn = sqlite3.connect(tmp_path / f"{name}.sqlite")
        assert conn.execute("SELECT count(*) FROM chunks").fetchone()[0] > 0
        conn.close()
    fake.setups["b" * 56]["dead"] = True  # its sampler dies: its reply fails the joint read
    fake.alive["d" * 56] = False  # Ray marks the node dead
    rec.tick()
    rec.finish()
    said = lines.getvalue()
    assert (
        "gpuprof: node 10.0.0.1 (cccccccc) never recorded: its sampler was not placed "
        "within 0.3 s" in said
    )
    assert "two nodes are called w1: the one at 10.0.0.1 is recorded as w1-dddddddd" in said
    assert "gpuprof: node w1 lost at" in said and "(its sampler died: " in said
    assert "gpuprof: node w1-dddddddd lost at" in said and "(Ray marked the node dead)" in said
    run = store.load_run(tmp_path)
    assert sorted(run.meta.hosts) == ["w1", "w1-dddddddd"]
    assert set(run.host["host"]) == {"w1", "w1-dddddddd"}
    # every node the cluster had is accounted for: recorded then lost (when, why, from
    # when), or never recorded (why), in the run's notices and its node list
    states = {n: (s["state"], s.get("why")) for n, s in run.meta.nodes.items()}
    assert states == {
        "w1": ("lost", states["w1"][1]),
        "w1-dddddddd": ("lost", "Ray marked the node dead"),
        "10.0.0.1 (cccccccc)": ("never_recorded", "its sampler was not placed within 0.3 s"),
    }
    assert states["w1"][1].startswith("its sampler died: ")
    for name in ("w1", "w1-dddddddd"):
        status = run.meta.nodes[name]
        assert status["asked_ns"] <= status["from_ns"] <= status["lost_ns"]
        assert status["notice"] in run.meta.notices
        assert status["notice"].startswith(f"node {name} lost at ")
        assert ", recorded from " in status["notice"]
    assert (
        "node 10.0.0.1 (cccccccc) never recorded: its sampler was not placed within 0.3 s"
        in run.meta.notices
    )
    lost = run.events[run.events["kind"] == "node_lost"]
    assert sorted(lost["host"]) == ["w1", "w1-dddddddd"]
    for name in ("w1", "w1-dddddddd"):
        # the driver stored what was shipped as it came: Arrow chunks, no row inserted one by one
        conn = sqlite3.connect(tmp_path / f"{name}.sqlite")
        assert conn.execute("SELECT count(*) FROM host").fetchone()[0] == 0
        assert conn.execute("SELECT count(*) FROM chunks WHERE tbl = 'host'").fetchone()[0] > 0
        conn.close()
        meta = _file_meta(tmp_path / f"{name}.sqlite")
        assert meta["clock"]["method"] == "ray-rtt" and abs(meta["clock"]["offset_ns"]) < 5 * MS
        assert any(n.startswith(f"node {name} lost at") for n in meta["run"]["notices"])
        assert meta["run"]["end_ns"] is not None


def test_nodes_lost_as_the_job_ends_are_lost_not_finished(tmp_path, monkeypatch):
    # a node lost seconds before the end, which the pulls during the run did not see: known
    # dead to Ray by the end, dying at the last call, or silent to it; each record ends at
    # the node's last reply and the run says so (issue 18: no node finished silently)
    import socket

    monkeypatch.setattr(recorder_mod, "MEMBERSHIP_S", 0.0)
    me = socket.gethostname()

    def hello(name):
        return {"node": name, "machine": f"m-{name}", "own_name": True, "pid": 1}

    ids = {name: name[-1] * 56 for name in ("wb", "wc", "wd", "we")}
    fake = _FakeRay({ids[name]: {"hello": hello(name)} for name in ids})
    lines = io.StringIO()
    rec = ClusterRecorder(fake, tmp_path, "r1", "s1", "head", me, interval_s=0.05, nvml=False,
                          stream=lines)  # fmt: skip
    assert rec.prepare()
    for _ in range(4):
        rec.tick()
        time.sleep(0.15)
    assert {n.name: n.state for n in rec.nodes.values()} == dict.fromkeys(ids, "active")
    heard = {n.name: n.heard_ns for n in rec.nodes.values()}
    time.sleep(0.2)  # the losses, after the last pull
    fake.alive[ids["wb"]] = False  # Ray knows by the end
    fake.setups[ids["wc"]]["dead"] = True  # its last call fails, and the take before it
    wc = next(n for n in rec.nodes.values() if n.name == "wc")
    wc.pending = _Ref(error=_ActorDied("The actor died unexpectedly"))
    fake.setups[ids["wd"]]["silent"] = True  # its last call never returns
    rec.finish()
    said = lines.getvalue()
    assert "gpuprof: node wb lost at" in said and "(Ray marked the node dead)" in said
    assert "gpuprof: node wc lost at" in said and "(its sampler died: " in said
    assert "gpuprof: node wd lost at" in said
    assert "(its sampler did not answer within 10 s when the job ended)" in said
    assert said.count("its record ends at its last reply") == 3
    assert "never recorded" not in said  # lost once, not lost then "never recorded"
    run = store.load_run(tmp_path)
    states = {n: s["state"] for n, s in run.meta.nodes.items()}
    assert states == {"wb": "lost", "wc": "lost", "wd": "lost", "we": "recorded"}
    lost = run.events[run.events["kind"] == "node_lost"]
    assert sorted(lost["host"]) == ["wb", "wc", "wd"]
    for name in ("wb", "wc", "wd"):
        # lost when last heard from (the last pull), not when the end found out
        assert run.meta.nodes[name]["lost_ns"] == heard[name]
        assert _file_meta(tmp_path / f"{name}.sqlite")["run"]["end_ns"] == heard[name]
    assert _file_meta(tmp_path / "we.sqlite")["run"]["end_ns"] > max(heard.values())


def test_the_end_is_bounded_when_ray_stops_answering(tmp_path, monkeypatch):
    # Ray's node table (which takes no timeout) hanging as the job ends, then the recorder's
    # own thread stuck in a call to Ray: the job still ends, in bounded time, with what was
    # recorded
    import socket
    import threading

    monkeypatch.setattr(recorder_mod, "MEMBERSHIP_S", 0.0)
    monkeypatch.setattr(recorder_mod, "NODE_TABLE_WAIT_S", 0.2)
    monkeypatch.setattr(recorder_mod, "FINISH_WAIT_S", 0.5)
    monkeypatch.setattr(recorder_mod, "FINISH_LOCK_WAIT_S", 0.5)
    hang = threading.Event()

    class Hanging(_FakeRay):
        def nodes(self):
            if hang.is_set():
                threading.Event().wait()  # never answers
            return super().nodes()

    hello = {"node": "w1", "machine": "m1", "own_name": True, "pid": 1}
    for stuck_thread in (False, True):
        hang.clear()
        run_dir = tmp_path / str(stuck_thread)
        run_dir.mkdir()
        fake = Hanging({"b" * 56: {"hello": hello}})
        lines = io.StringIO()
        rec = ClusterRecorder(fake, run_dir, "r1", "s1", "head", socket.gethostname(),
                              interval_s=0.05, nvml=False, stream=lines)  # fmt: skip
        assert rec.prepare()
        for _ in range(3):
            rec.tick()
            time.sleep(0.1)
        hang.set()
        t0 = time.monotonic()
        for _ in range(3):  # the end's reads of the table give up on it
            assert rec._node_table() is None
        assert time.monotonic() - t0 < 2.0
        readers = [t for t in threading.enumerate() if t.name == "gpuprof-ray-nodes"]
        assert len(readers) <= 2  # one stuck reader per recorder, not one per read
        if stuck_thread:  # a tick that never returns holds the lock
            threading.Thread(target=rec._lock.acquire, daemon=True).start()
            time.sleep(0.1)
        t0 = time.monotonic()
        ending = threading.Thread(target=rec.finish, daemon=True)  # a hang fails, not hangs
        ending.start()
        ending.join(10.0)
        assert not ending.is_alive(), "the end hung"
        assert time.monotonic() - t0 < 3.0
        said = lines.getvalue()
        run = store.load_run(run_dir)
        assert (run.host["host"] == "w1").any()  # what was recorded is kept
        if stuck_thread:
            assert "the Ray nodes' last samples were not taken (the recorder's thread" in said
        else:
            assert run.meta.nodes["w1"]["state"] == "recorded"
            assert "not taken" not in said


def test_pull_period_grows_past_32_nodes_to_hold_the_drivers_calls():
    period = recorder_mod.pull_period_s
    assert [period(n) for n in (0, 2, 32, 64, 96)] == [1.0, 1.0, 1.0, 2.0, 3.0]
    assert period(1000) == recorder_mod.MAX_PULL_S


def test_too_old_ray_is_one_line_and_the_job_runs_as_written(monkeypatch, tmp_path, capsys):
    from gpuprof.integrations import ray_driver

    old = types.SimpleNamespace(__version__="2.3.0")  # no cloudpickle.register_pickle_by_value
    supported, why = ray_driver._hook_support(old)
    assert not supported and why.startswith("Ray 2.3.0 has no worker_process_setup_hook")
    monkeypatch.setitem(sys.modules, "ray.util.scheduling_strategies", None)
    lines = io.StringIO()
    rec = ClusterRecorder(old, tmp_path, "r1", "s1", "head", "m", stream=lines)
    assert not rec.start()
    assert lines.getvalue().startswith("gpuprof: Ray 2.3.0 has no NodeAffinitySchedulingStrategy")


def test_init_is_retried_as_written_when_ray_refuses_the_additions(monkeypatch, tmp_path, capsys):
    from gpuprof.integrations import ray_driver

    monkeypatch.setenv("GPUPROF_RUN_DIR", str(tmp_path))
    started = []
    monkeypatch.setattr(ray_driver, "_start", started.append)
    calls = []

    def refuses(*args, **kwargs):
        calls.append(kwargs)
        if "runtime_env" in kwargs:
            raise ValueError("Failed to merge the Job's runtime env because of a conflict")
        return "context"

    assert ray_driver.call(refuses, (), {"num_cpus": 1}) == "context"
    assert calls[0]["runtime_env"]["env_vars"]["GPUPROF_RUN_DIR"] == str(tmp_path)
    assert calls[1] == {"num_cpus": 1} and len(started) == 1
    assert "Ray refused gpuprof's additions" in capsys.readouterr().err

    def no_cluster(*args, **kwargs):  # ray.init's own error: the caller's, not retried
        calls.append(kwargs)
        raise ConnectionError("could not reach 10.0.0.9:6379")

    del calls[:]
    with pytest.raises(ConnectionError):
        ray_driver.call(no_cluster, (), {"address": "10.0.0.9:6379"})
    assert len(calls) == 1
    monkeypatch.setenv("GPUPROF_RAY", "0")  # turned off: ray.init untouched
    assert ray_driver.call(lambda **kw: kw, (), {"num_cpus": 1}) == {"num_cpus": 1}


LOCAL_JOB = textwrap.dedent(
    """
    import os, time
    import ray
    import gpuprof

    ray.init(num_cpus=1, include_dashboard=False)  # a single-node cluster of its own

    @ray.remote
    class Actor:
        def work(self):
            for _ in range(5):
                with gpuprof.phase("rollout"):
                    time.sleep(0.02)
                gpuprof.step()
            return os.environ.get("GPUPROF_HOST")

    print("actor on", ray.get(Actor.remote().work.remote()), flush=True)
    """
)


def test_local_ray_init_stays_on_the_watchers_node(tmp_path):
    # the usual single-machine verl run: ray.init() starts Ray inside the watched command;
    # the one node is the watcher's, so no sampler stays and nothing is spooled
    script = tmp_path / "local.py"
    script.write_text(LOCAL_JOB)
    run_dir = tmp_path / "run"
    # RAY_ADDRESS=local: a Ray of its own even while another cluster on this machine (another
    # test run's) has left its address in /tmp/ray/ray_current_cluster, which ray.init() joins
    # RAY_raylet_start_wait_time_s: Ray's own bound on its raylet registering, which a loaded
    # 2-core machine (this module's cluster beside it) can exceed at the default
    env = clean_env(GPUPROF_HOST="solo", GPUPROF_SPOOL_DIR=str(tmp_path / "spool"),
                    RAY_USAGE_STATS_ENABLED="0", RAY_ADDRESS="local",
                    RAY_raylet_start_wait_time_s="180")  # fmt: skip
    env["PYTHONPATH"] = first_on_path(lazy_imports(tmp_path / "imports"), env["PYTHONPATH"])
    cmd = gpuprof_cmd("watch", "--no-nvml", "-o", str(run_dir), "--", sys.executable, str(script))
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert "actor on solo" in proc.stdout
    assert "gpuprof: " not in proc.stderr, proc.stderr
    run = store.load_run(run_dir)
    assert run.meta.hosts == ["solo"]
    rollouts = run.spans[run.spans["phase"] == "rollout"]
    assert len(rollouts) == 5 and set(rollouts["host"]) == {"solo"}
    assert not (tmp_path / "spool").exists()


# -- a real cluster ----------------------------------------------------------------------------


def _node_env(simnvml_lib: Path, scenarios: Path, name: str) -> dict[str, str]:
    path = first_on_path(str(scenarios / "imports"), str(ROOT))  # see `cluster`
    env = {"GPUPROF_HOST": name, "PYTHONPATH": path, "GPUPROF_SPOOL_DIR": str(scenarios / "spool")}
    if name in NODES:
        gpu, count, util, skew = NODES[name]
        gpus = [{"name": gpu, "series": {"util_gpu_pct": util}} for _ in range(count)]
        path = write_scenario(scenarios / f"{name}.txt", {"gpus": gpus})
        env.update(simnvml_env(simnvml_lib, path, base={}))
        env["GPUPROF_SIM_CLOCK_SKEW_NS"] = str(skew)
    return env


BUSY_CORES = "TEST_BUSY_CORES"
"""Set to N to run this module with N other processes spinning on the CPU the whole time (a
loaded machine: ``TEST_BUSY_CORES=2 python -m pytest tests/test_ray_cluster.py``)."""


@pytest.fixture(scope="module", autouse=True)
def busy_cores():
    """``TEST_BUSY_CORES`` processes burning a core each while the module's tests run."""
    try:
        count = int(os.environ.get(BUSY_CORES) or 0)
    except ValueError:
        count = 0
    burners = [subprocess.Popen([sys.executable, "-c", "while True: pass"])
               for _ in range(count)]  # fmt: skip
    try:
        yield count
    finally:
        for burner in burners:
            burner.kill()
            burner.wait()


@pytest.fixture(scope="module")
def cluster(simnvml_lib, tmp_path_factory):
    cluster_utils = pytest.importorskip("ray.cluster_utils")
    scenarios = tmp_path_factory.mktemp("scenarios")
    imports = lazy_imports(scenarios / "imports")  # the nodes' environments name it
    with pytest.MonkeyPatch.context() as mp:
        for name in list(os.environ):  # the raylets inherit this process's environment
            if name.startswith("GPUPROF_") or name == "RAY_ADDRESS":
                mp.delenv(name)
        mp.setenv("RAY_USAGE_STATS_ENABLED", "0")
        mp.setenv("PYTHONPATH", first_on_path(imports, os.environ.get("PYTHONPATH")))
        c = cluster_utils.Cluster(
            initialize_head=True,
            head_node_args={
                "num_cpus": 1,
                "include_dashboard": False,  # gpuprof must not need it
                # its agent on a free port: Ray's default (52365) is the default of every other
                # Ray on this machine too (a test in another worker: a bind retried for seconds)
                "dashboard_agent_listen_port": 0,
                "env_vars": _node_env(simnvml_lib, scenarios, "node0"),
                "_system_config": {
                    "health_check_period_ms": 1000,
                    "health_check_failure_threshold": 3,
                },
            },
        )
        try:
            for name in ("node1", "node2"):
                c.add_node(num_cpus=1, env_vars=_node_env(simnvml_lib, scenarios, name))
            c.wait_for_nodes()
            c.scenarios = scenarios
            yield c
        finally:
            c.shutdown()


FINISH_START_S = "60"
"""How long the tests' jobs wait at their end for samplers still starting (the default, 5 s,
is for a real node): three raylets, their Ray workers and the job's share two cores here,
where a worker process takes seconds to start, more so with the cores kept busy."""


def _watch(cluster, simnvml_lib, tmp_path, *options: str,
           **job_env) -> tuple[subprocess.Popen, Path]:  # fmt: skip
    script = tmp_path / "job.py"
    script.write_text(JOB)
    run_dir = tmp_path / "run"
    job_env.setdefault("GPUPROF_RAY_FINISH_START_S", FINISH_START_S)
    job_env.setdefault("JOB_VERL", "0")  # "1": node2's actor times its work with verl's timer
    env = clean_env(JOB_RAY_ADDRESS=cluster.address, **job_env)
    env.update(_node_env(simnvml_lib, cluster.scenarios, "node0"))
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")])
    cmd = gpuprof_cmd("watch", "--interval", "0.1", *options, "-o", str(run_dir), "--",
                      sys.executable, str(script))  # fmt: skip
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)  # fmt: skip
    return proc, run_dir


def _finish(proc: subprocess.Popen, timeout: float = 300) -> tuple[int, str, str]:
    # a bound for a job that hangs, not a wait: a loaded 2-core machine takes minutes
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        where = _stacks_of_tree(proc.pid)  # where it hangs, before the evidence is killed
        proc.kill()
        out, err = proc.communicate()
        pytest.fail(f"the watched job did not finish:\n{out}\n{err}\n{where}")
    return proc.returncode, out, err


def _stacks_of_tree(pid: int) -> str:
    """py-spy's dump of a process, its children's and the Ray workers' Python stacks (for a
    hang's report)."""
    if PYSPY is None:
        return "(py-spy not found: no stacks)"
    import psutil

    try:
        tree = [psutil.Process(pid), *psutil.Process(pid).children(recursive=True)]
    except psutil.Error:
        return "(the process is gone)"
    # and the cluster's Ray workers (the job's actors, the samplers), children of raylets
    for p in psutil.process_iter(["cmdline"]):
        cmdline = p.info["cmdline"] or []
        if cmdline and cmdline[0].startswith("ray::") and p not in tree:
            tree.append(p)
    dumps = []
    for p in tree:
        try:
            done = subprocess.run([PYSPY, "dump", "--pid", str(p.pid)], capture_output=True,
                                  text=True, timeout=60)  # fmt: skip
            dumps.append(f"--- {p.pid}:\n{done.stdout}{done.stderr}")
        except Exception as exc:  # gone, or py-spy itself stuck: the report goes on
            dumps.append(f"--- {p.pid}: {exc!r}")
    return "\n".join(dumps)


def _file_meta(path: Path) -> dict:
    conn = sqlite3.connect(path)
    try:
        return {k: json.loads(v) for k, v in conn.execute("SELECT key, value FROM meta")}
    finally:
        conn.close()


def _node_state(path: Path, name: str) -> str | None:
    """How the driver last accounted for node ``name`` in its file (None: not yet, or the
    file is being written)."""
    try:
        return _file_meta(path)["run"]["nodes"][name]["state"]
    except Exception:
        return None


def _scrape(port: int) -> dict[str, list[tuple[dict, float]]]:
    """Sample name → [(labels, value)] of the endpoint's exposition."""
    from prometheus_client.parser import text_string_to_metric_families

    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2) as response:
        text = response.read().decode()
    out: dict[str, list[tuple[dict, float]]] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            out.setdefault(sample.name, []).append((dict(sample.labels), sample.value))
    return out


def _metrics_ready(got: dict) -> bool:
    """Whether a scrape holds every node: its GPUs, its actors' steps and its host."""
    nodes = set(NODES)
    stepped = {s["node"] for s, v in got.get("gpuprof_steps_total", []) if v >= 5}
    sampled = {s["node"] for s, _ in got.get("gpuprof_gpu_utilization_ratio", [])}
    # a node's host CPU figure comes with its second host reading (CPU use is a difference
    # of two), which a loaded machine may ship a pull after its first GPU readings
    hosted = {s["node"] for s, _ in got.get("gpuprof_host_cpu_utilization_ratio", [])}
    return (stepped >= nodes and sampled >= nodes and hosted >= nodes
            and "gpuprof_idle_gpu_seconds" in got)  # fmt: skip


@pytest.fixture(scope="module")
def cluster_run(cluster, simnvml_lib, tmp_path_factory):
    """The job run once under ``gpuprof watch --metrics-port`` for the two tests that read
    it (a watched job over three nodes takes a minute of CPU on two cores): its actors work
    (10 steps each, node2's timed by verl's timer where verl imports), then the job holds
    while the endpoint is scraped until it serves every node (`_metrics_ready`) and every
    actor's work done (its 10 steps: no actor is between two phases), then times its calls
    to each actor (the clock windows) and ends. Read-only for the tests."""
    tmp = tmp_path_factory.mktemp("cluster_run")
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    hold = tmp / "metrics-read"
    proc, run_dir = _watch(cluster, simnvml_lib, tmp, "--metrics-port", str(port),
                           JOB_HOLD_FILE=str(hold), JOB_VERL="1" if _verl() else "0")  # fmt: skip
    got: dict = {}

    def held(got: dict) -> bool:
        done = {s["node"] for s, v in got.get("gpuprof_steps_total", []) if v >= 10}
        return _metrics_ready(got) and done >= set(NODES)

    try:
        deadline = time.monotonic() + 180
        while time.monotonic() < deadline and not held(got) and proc.poll() is None:
            with contextlib.suppress(OSError):
                got = _scrape(port)
            time.sleep(0.5)
    finally:
        hold.touch()
        code, out, err = _finish(proc)
    return types.SimpleNamespace(code=code, out=out, err=err, run_dir=run_dir, metrics=got)


def test_whole_cluster_recorded_with_aligned_clocks(cluster_run):
    code, out, err = cluster_run.code, cluster_run.out, cluster_run.err
    run_dir = cluster_run.run_dir
    assert code == 0, err
    assert "Traceback" not in err, err
    assert "job nodes: ['node0', 'node1', 'node2']" in out
    # the job's runtime_env kept, its setup hook chained; nothing naming the watcher's node,
    # file or clock reached the workers (each node's own skew is its raylet's)
    seen = json.loads(out.split("job env: ", 1)[1].splitlines()[0])
    for name, (_, _, _, skew) in NODES.items():
        assert seen[name] == {"JOB_VAR": "kept", "USER_HOOK_RAN": "yes", "GPUPROF_DB": None,
                              "GPUPROF_WATCHER_MACHINE": None,
                              "GPUPROF_SIM_CLOCK_SKEW_NS": str(skew)}  # fmt: skip
    run = store.load_run(run_dir)

    # every node's GPUs, from its own scenario
    assert {"node0", "node1", "node2"} <= set(run.meta.hosts)
    inventory = {}
    for gpu in run.meta.gpus:
        inventory.setdefault(gpu["host"], []).append(gpu["name"])
    for name, (gpu, count, util, _) in NODES.items():
        assert inventory[name] == [gpu] * count, inventory
        samples = run.gpu[run.gpu["host"] == name]
        assert samples["gpu"].nunique() == count
        assert samples["util_gpu_pct"].median() == util
    hosts = run.host.groupby("host").size()
    assert hosts.get("node1", 0) > 0 and hosts.get("node2", 0) > 0

    # every actor's spans, on its node
    spans = run.spans
    rollouts = spans[spans["phase"] == "rollout"].groupby("host").size().to_dict()
    assert rollouts == {"node0": 10, "node1": 10, "node2": 10}, rollouts
    steps = spans[spans["name"] == "step"].groupby("host").size().to_dict()
    assert steps == {"node0": 10, "node1": 10, "node2": 10}
    if _verl():  # verl's timer in an actor on another node, instrumented by the setup hook
        timed = spans[(spans["name"] == "update_actor") & (spans["host"] == "node2")]
        assert len(timed) == 10

    # the injected skews, recovered from round trips and stored with each node's file: within
    # the error each estimate states (half its tightest round trip), which is a few ms at most
    # even with both cores busy (round trips go on until one is tight, within a budget)
    errors = []
    for name in ("node1", "node2"):
        clock = _file_meta(run_dir / f"{name}.sqlite")["clock"]
        assert clock["method"] == "ray-rtt" and clock["reference"] == "node0"
        assert clock["node"] == name
        skew = NODES[name][3]
        assert 0 <= clock["error_ns"] < 25 * MS, clock
        assert abs(clock["offset_ns"] + skew) <= clock["error_ns"] + MS // 2, clock
        assert run.meta.clocks[name]["offset_ns"] == clock["offset_ns"]
        errors.append(clock["error_ns"])
    # after alignment every actor's span lies inside the driver's window around its call
    windows = spans[spans["phase"] == "sync_window"].sort_values("start_ns")
    synced = spans[spans["phase"] == "sync"].sort_values("start_ns")
    assert len(windows) == len(synced) == 15
    slack = 5 * MS + max(errors)
    for (_, window), (_, inner) in zip(windows.iterrows(), synced.iterrows()):
        assert window["start_ns"] - slack <= inner["start_ns"]
        assert inner["end_ns"] <= window["end_ns"] + slack, (window, inner)

    # every node accounted for, in the run's notices and in the watch's summary
    assert set(run.meta.nodes) == {"node1", "node2"}
    for name in ("node1", "node2"):
        status = run.meta.nodes[name]
        assert status["state"] == "recorded"
        assert status["asked_ns"] < status["from_ns"]
        assert status["notice"].startswith(f"node {name} recorded from ")
        assert status["notice"] in run.meta.notices
        assert f"  {name}: recorded from " in err
    assert "nodes: 3 of 3 recorded" in err
    assert "  node0: recorded from the start (the watcher's node)" in err
    assert "never recorded" not in err

    # the other nodes' files are written by the driver alone: one file per node, no spool
    names = sorted(p.name for p in run_dir.glob("node[12]*.sqlite"))
    assert names == ["node1.sqlite", "node2.sqlite"]
    # ... and compacted by the watcher once the job ended, as its own: nothing left in SQLite
    for name in names:
        conn = sqlite3.connect(run_dir / name)
        assert conn.execute("SELECT count(*) FROM chunks").fetchone() == (0,)
        assert conn.execute("SELECT count(*) FROM gpu").fetchone() == (0,)
        conn.close()
        assert (run_dir / name.replace(".sqlite", ".gpu.parquet")).exists()


def test_a_node_whose_sampler_starts_too_late_is_named(cluster, simnvml_lib, tmp_path):
    # a node whose sampler takes longer to start than the job lasts (slow imports, a slow
    # NVML): the run says which node, that its sampler was still starting when the job
    # ended and how long it had, in the notices, the watch's summary and analyze's nodes
    env = _node_env(simnvml_lib, cluster.scenarios, "node4")
    env["GPUPROF_SIM_SAMPLER_DELAY_S"] = "300"
    slow = cluster.add_node(num_cpus=1, env_vars=env)
    try:
        cluster.wait_for_nodes()
        proc, run_dir = _watch(cluster, simnvml_lib, tmp_path, GPUPROF_RAY_FINISH_START_S="1")
        code, out, err = _finish(proc)
    finally:
        cluster.remove_node(slow)
    assert code == 0, err
    assert "Traceback" not in err, err
    assert "'node4'" in out  # the job itself ran there
    run = store.load_run(run_dir)
    assert "node4" not in run.meta.hosts
    assert not (run.gpu["host"] == "node4").any()
    status = run.meta.nodes["node4"]
    assert status["state"] == "never_recorded" and status["from_ns"] is None
    why = status["why"]
    assert why.startswith("its sampler was still being started when the job ended (")
    had = float(why.split("(", 1)[1].split(" s after it was asked for)")[0])
    job_s = (run.meta.end_ns - run.meta.start_ns) / 1e9
    assert 1.0 <= had <= job_s + 5, (why, job_s)
    notice = f"node node4 never recorded: {why}"
    assert notice in run.meta.notices
    assert f"gpuprof: {notice}" in err  # one line at the time
    said = " ".join(err.split())  # the summary wraps at the width of a terminal
    assert f" node4: never recorded: {why}" in said  # and the watch's summary
    assert "nodes: 3 of 4 recorded; 1 lost or never recorded" in said
    analyzed = subprocess.run(gpuprof_cmd("analyze", str(run_dir), "--json"), env=clean_env(),
                              capture_output=True, text=True, timeout=120)  # fmt: skip
    assert analyzed.returncode == 0, analyzed.stderr
    rows = {n["node"]: n for n in json.loads(analyzed.stdout)["summary"]["nodes"]["nodes"]}
    assert rows["node4"]["recorded"]["state"] == "never_recorded"
    assert rows["node4"]["gpus"] == 0
    assert rows["node0"]["recorded"]["watcher"]


def test_node_joining_without_nvml_then_lost(cluster, simnvml_lib, tmp_path):
    stop = tmp_path / "stop"
    proc, run_dir = _watch(cluster, simnvml_lib, tmp_path, JOB_STOP_FILE=str(stop),
                           JOB_EXIT="3")  # fmt: skip
    try:
        deadline = time.monotonic() + 120  # bounds on polls, not waits: a loaded machine
        while not (run_dir / "node2.sqlite").exists() and time.monotonic() < deadline:
            time.sleep(0.5)
        # a node joins mid-run (autoscaling); its raylet has no NVML library
        joined = cluster.add_node(num_cpus=1, env_vars=_node_env(simnvml_lib, cluster.scenarios,
                                                                 "node3"))  # fmt: skip
        node3 = run_dir / "node3.sqlite"
        while time.monotonic() < deadline + 90:
            if node3.exists() and _count(node3, "host") >= 3:
                break
            time.sleep(0.5)
        assert _count(node3, "host") >= 3, "the joining node was not sampled"
        cluster.remove_node(joined)  # lost mid-run
        # the run goes on past the loss: the driver finding it (seconds on a loaded machine)
        # is waited for, so that there is a "went on" to check below
        while time.monotonic() < deadline + 180 and _node_state(node3, "node3") != "lost":
            time.sleep(0.5)
        time.sleep(2)
        stop.touch()
        code, _, err = _finish(proc)
    finally:
        stop.touch()
        if proc.poll() is None:
            proc.kill()
    assert code == 3, err  # the command's own exit code
    assert "gpuprof: node node3 lost at" in err, err
    assert "node3: NVML not available" in err
    run = store.load_run(run_dir)
    assert "node3" in run.meta.hosts
    assert any(n.startswith("node node3 lost at") for n in run.meta.notices)
    assert any("node3: NVML not available" in n for n in run.meta.notices)
    lost = run.events[(run.events["kind"] == "node_lost") & (run.events["host"] == "node3")]
    assert len(lost) == 1
    assert (run.host["host"] == "node3").sum() >= 3  # recorded before the loss: kept
    assert not (run.gpu["host"] == "node3").any()
    # the rest went on: node1 sampled after node3 was lost
    t_lost = lost["t_ns"].iloc[0]
    assert (run.gpu[run.gpu["host"] == "node1"]["t_ns"] > t_lost + 1e9).any()
    # the Python stacks of each node's Ray workers, sampled there by py-spy (as the watcher
    # samples its own node) and put on the run's clock: the actors' loop, `Worker.until`
    if PYSPY is not None:
        frames = dict(zip(run.stack_frames["frame_id"], run.stack_frames["name"]))
        stacks = {sid: {frames.get(int(f)) for f in text.split()}
                  for sid, text in zip(run.stacks["stack_id"], run.stacks["frames"])}  # fmt: skip
        for name in ("node1", "node2"):
            mine = run.stack_samples[run.stack_samples["host"] == name]
            looping = mine[[("Worker.until" in stacks.get(s, ())) for s in mine["stack_id"]]]
            assert len(looping), (name, len(mine))
            assert looping["t_ns"].between(run.meta.start_ns, run.meta.end_ns).all()
            # processes of the node's Ray tree, read by its host collector too
            assert set(mine["pid"]) <= set(run.procs[run.procs["host"] == name]["pid"])


def test_the_metrics_endpoint_serves_every_node_of_the_cluster(cluster_run):
    # the watcher's node and the nodes the driver records: GPUs, phases and steps of actors on
    # every node (the head's actors write files of their own: its raylet predates the watch),
    # scraped while the job ran (`cluster_run`)
    got, code, err = cluster_run.metrics, cluster_run.code, cluster_run.err
    run_dir = cluster_run.run_dir
    nodes = set(NODES)
    served = sorted((k, v) for k, v in got.items() if "gpu_util" in k or "steps" in k)
    assert _metrics_ready(got), (served, err[-3000:])  # read while the job ran (it held)
    assert code == 0, err
    for name, (gpu, count, util, _) in NODES.items():
        utils = [v for s, v in got["gpuprof_gpu_utilization_ratio"] if s["node"] == name]
        assert utils == [util / 100] * count, (name, utils)
        models = [s["model_name"] for s, _ in got["gpuprof_gpu_info"] if s["node"] == name]
        assert models == [gpu] * count
    phases = {(s["node"], s["phase"]) for s, _ in got["gpuprof_rank_phase_info"]}
    assert {(name, "rollout") for name in NODES} <= phases
    # phase ends put on the watcher's clock: each served end is the end of one of that
    # process's spans as the finished run aligns them (the nodes' clocks are 250 and 400 ms
    # off the watcher's; the live offset and the stored one agree to well under 50 ms)
    run = store.load_run(run_dir)
    ends = run.spans.assign(end_s=run.spans["end_ns"] / 1e9)
    for labels, t in got["gpuprof_rank_phase_end_timestamp_seconds"]:
        mine = ends[(ends["host"] == labels["node"]) & (ends["pid"] == int(labels["pid"]))]
        assert len(mine), labels
        assert (mine["end_s"] - t).abs().min() < 0.05, (labels, t)
    sampled = {s["node"] for s, v in got["gpuprof_sampled_gpu_seconds_total"] if v > 0}
    assert sampled == nodes
    hosts = {s["node"] for s, _ in got["gpuprof_host_cpu_utilization_ratio"]}
    assert hosts == nodes


def _count(path: Path, table: str) -> int:
    if not path.exists():
        return 0
    try:
        conn = sqlite3.connect(path, timeout=5)
        try:
            rows = conn.execute(f"SELECT count(*) FROM {table}").fetchone()[0]
            # what the samplers ship arrives as Arrow chunks (one row of `chunks` per pull)
            shipped = conn.execute("SELECT sum(n) FROM chunks WHERE tbl = ?", (table,))
            return rows + (shipped.fetchone()[0] or 0)
        finally:
            conn.close()
    except sqlite3.Error:
        return 0
