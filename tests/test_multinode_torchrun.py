"""Multi-node torchrun on one machine: two watchers, two node ranks, one run.

Each "node" is a `gpuprof watch` over `torchrun --nnodes 2 --node-rank N` with its own name
(``GPUPROF_HOST``), its own simulated GPUs and, for node 1, a clock 300 ms ahead
(``GPUPROF_SIM_CLOCK_SKEW_NS``) that the run must take back out using the ranks' collectives.
The training is real torch.distributed (gloo) instrumented with no code change.
"""

from __future__ import annotations

import re
import socket
import subprocess
import sys
import textwrap

import numpy as np
import pytest
from conftest import clean_env, gpuprof_cmd, run_gpuprof
from simnvml import simnvml_env, write_scenario

from gpuprof import launch, store
from gpuprof.api import analyze

pytest_plugins = ["simnvml.fixtures"]
torch = pytest.importorskip("torch")

SKEW_NS = 300_000_000
FLOAT_NS = 1_000
"""Tolerance of the clock estimate's arithmetic: it reads epoch ns as float64 (256 ns apart)."""

TRAIN = textwrap.dedent(
    """
    import os, time, torch, torch.distributed as dist, gpuprof
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    here = os.path.dirname(os.path.abspath(__file__))
    t = torch.ones(1000)


    def work(name, step, seconds, factor):
        # node 1 is the slower one by construction, not by the scheduler's grace: its phase
        # lasts at least `factor` times rank 0's, as rank 0 timed it from outside its span
        # (so no shorter than the span)
        mark = os.path.join(here, f"{name}-{step}")
        if rank == 0:
            before = time.monotonic()
            with gpuprof.phase(name):
                time.sleep(seconds)
            with open(mark + ".part", "w") as f:
                f.write(repr(time.monotonic() - before))
            os.rename(mark + ".part", mark)
            return
        with gpuprof.phase(name):
            began = time.monotonic()
            while not os.path.exists(mark):
                time.sleep(0.001)
            with open(mark) as f:
                took = float(f.read())
            while (left := factor * took - (time.monotonic() - began)) > 0:
                time.sleep(left)


    for step in range(12):
        work("rollout", step, 0.02, 2)
        dist.all_reduce(t)
        work("update_actor", step, 0.01, 1)
        dist.barrier()
        gpuprof.step()
    dist.destroy_process_group()
    """
)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _node_env(simnvml_lib, tmp_path, rank: int, util: float) -> dict[str, str]:
    gpus = [{"series": {"util_gpu_pct": util}} for _ in range(2)]
    scenario = write_scenario(tmp_path / f"node{rank}.txt", {"gpus": gpus})
    env = clean_env(GPUPROF_HOST=f"node{rank}")
    env.update(simnvml_env(simnvml_lib, scenario))
    if rank == 1:
        env["GPUPROF_SIM_CLOCK_SKEW_NS"] = str(SKEW_NS)
    return env


def _launch_nodes(simnvml_lib, tmp_path, outputs: list) -> list[subprocess.Popen]:
    script = tmp_path / "train.py"
    script.write_text(TRAIN)
    port = _free_port()
    procs = []
    for rank, output in enumerate(outputs):
        cmd = gpuprof_cmd(
            "watch", "--interval", "0.05", "-o", str(output), "--",
            sys.executable, "-m", "torch.distributed.run", "--nnodes", "2", "--node-rank",
            str(rank), "--nproc-per-node", "1", "--master-addr", "127.0.0.1",
            "--master-port", str(port), str(script),
        )  # fmt: skip
        env = _node_env(simnvml_lib, tmp_path, rank, util=30 if rank == 0 else 80)
        procs.append(subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE,
                                      stderr=subprocess.PIPE, text=True))  # fmt: skip
    return procs


def _check_run(run):
    assert run.meta.hosts == ["node0", "node1"]
    assert run.meta.reference_node == "node0"
    # every node's GPUs, from its own scenario
    util = run.gpu.groupby("host")["util_gpu_pct"].median().to_dict()
    assert util == {"node0": 30.0, "node1": 80.0}
    assert sorted(run.gpu.groupby("host")["gpu"].nunique().to_dict().items()) == [
        ("node0", 2),
        ("node1", 2),
    ]
    # node 1's clock was 300 ms ahead: found from the collectives. A blocking collective ends on
    # no rank before every rank has begun it, so each call bounds the offset; the estimate is
    # the middle of where the bounds meet and its error half that width
    # (`clocks.estimate_from_collectives`). A rank the scheduler holds back only widens a
    # call's window, never moves the truth out of it, so nothing here bounds a duration.
    clock = run.meta.clocks["node1"]
    assert clock["method"] == "collectives" and clock["calls"] == 24, clock
    calls = run.spans[run.spans["phase"] == "collective"].sort_values("start_ns")
    by_node = {host: group for host, group in calls.groupby("host")}
    assert len(by_node["node0"]) == len(by_node["node1"]) == 24
    assert list(by_node["node0"]["name"]) == list(by_node["node1"]["name"])
    start0, end0 = (by_node["node0"][c].to_numpy(np.int64) for c in ("start_ns", "end_ns"))
    start1, end1 = (by_node["node1"][c].to_numpy(np.int64) for c in ("start_ns", "end_ns"))
    # after alignment every call on one node ends no earlier than its match began on the
    # other (the bounds met: the offset is the middle, not the fallback of bounds that miss
    # each other), and the stated error is half the room left; the estimate reads epoch ns as
    # float64, good to 256 ns
    low, high = np.max(start1 - end0), np.min(end1 - start0)
    assert low <= FLOAT_NS and high >= -FLOAT_NS, (low, high, clock)
    assert abs(clock["error_ns"] - (high - low) / 2) <= FLOAT_NS, (low, high, clock)
    # so it is no wider than half the narrowest call's two durations
    assert 0 <= clock["error_ns"] <= np.min((end0 - start0) + (end1 - start1)) / 2 + FLOAT_NS
    # and the true skew lies within it, up to how well each rank put its monotonic stamps on
    # its node's clock (one pair of clock readings when its hooks start: well under 0.5 ms,
    # unless the rank is preempted between the two)
    assert abs(clock["offset_ns"] + SKEW_NS) <= clock["error_ns"] + 0.5e6, clock
    # the barriers, on the aligned clock: each ends on one node no earlier than it began on the
    # other (how far apart they end is the scheduler's: a rank held back after a barrier
    # returns records its end later)
    barriers = calls[calls["name"] == "barrier"]
    ends = {h: g["end_ns"].to_numpy(np.int64) for h, g in barriers.groupby("host")}
    starts = {h: g["start_ns"].to_numpy(np.int64) for h, g in barriers.groupby("host")}
    assert len(ends["node0"]) == len(ends["node1"]) == 12
    assert (ends["node0"] >= starts["node1"] - FLOAT_NS).all()
    assert (ends["node1"] >= starts["node0"] - FLOAT_NS).all()
    # and the spans carry their node and rank
    # the diagnosis knows the nodes: node 1's rollouts, twice rank 0's, make it the straggler
    # node (its updates last no less than rank 0's, so rank 0 is never the one behind), and
    # its collectives are inter-node traffic
    nodes = analyze(run).summary["nodes"]
    assert [n["node"] for n in nodes["nodes"]] == ["node0", "node1"]
    assert nodes["straggler_node"]["node"] == "node1"
    links = {link["link"]: link for link in nodes["links"]}
    assert links["inter-node"]["calls"] == 2 * 24 and links["inter-node"]["bytes"] == 2 * 12 * 4000
    assert nodes["alignment"]["worst_error_ns"] == clock["error_ns"]
    rollouts = run.spans[run.spans["phase"] == "rollout"]
    assert sorted(rollouts.groupby(["host", "rank"]).size().items()) == [
        (("node0", 0), 12),
        (("node1", 1), 12),
    ]


def test_two_watchers_two_node_ranks_one_run_directory(simnvml_lib, tmp_path):
    run_dir = tmp_path / "run"
    procs = _launch_nodes(simnvml_lib, tmp_path, [run_dir, run_dir])
    outs = [p.communicate(timeout=240) for p in procs]
    for proc, (_, err) in zip(procs, outs):
        assert proc.returncode == 0, err
    err0, err1 = outs[0][1], outs[1][1]
    # the summary is printed once, by node rank 0, and covers both nodes
    assert "node rank 1 of 2 (node1) recorded into" in err1
    assert "run saved to" not in err1 and "report:" not in err1
    assert "run saved to" in err0 and "report:" in err0
    assert "node1:0" in err0 and "node0:0" in err0, err0
    assert sorted(p.name for p in run_dir.glob("*.sqlite")) == ["node0.sqlite", "node1.sqlite"]
    _check_run(store.load_run(run_dir))


def test_separate_run_directories_are_merged(simnvml_lib, tmp_path):
    outputs = [tmp_path / "run_a", tmp_path / "run_b"]
    procs = _launch_nodes(simnvml_lib, tmp_path, outputs)
    outs = [p.communicate(timeout=240) for p in procs]
    for proc, (_, err) in zip(procs, outs):
        assert proc.returncode == 0, err
    assert "not a shared directory?" in outs[0][1]
    merged = tmp_path / "merged"
    result = run_gpuprof("merge", str(outputs[0]), str(outputs[1]), "-o", str(merged))
    assert result.returncode == 0, result.stderr
    assert "nodes node0, node1" in result.stdout
    # the offset printed is the one stored, to its printed rounding (`_check_run` holds the
    # stored one against the true skew)
    found = re.search(r"clock offsets node1 ([-+][0-9.]+) ms \(±([0-9.]+)\)", result.stdout)
    run = store.load_run(merged)
    clock = run.meta.clocks["node1"]
    assert found, result.stdout
    assert found.groups() == (f"{clock['offset_ns'] / 1e6:+.1f}", f"{clock['error_ns'] / 1e6:.1f}")
    _check_run(run)
    # the same two runs again: the names collide, nothing is written
    again = run_gpuprof("merge", str(outputs[0]), str(merged), "-o", str(tmp_path / "m2"))
    assert again.returncode == 2 and "both hold node0.sqlite" in again.stderr
    assert not (tmp_path / "m2").exists()


def test_launch_is_read_from_torchrun_slurm_and_overrides():
    torchrun = ["torchrun", "--nnodes=4", "--node_rank", "2", "train.py"]
    assert launch.detect(torchrun, {}) == launch.Launch(2, 4, 0, "torchrun --node-rank")
    module = [sys.executable, "-m", "torch.distributed.run", "--nnodes", "1:8", "--node-rank",
              "0", "x.py"]  # fmt: skip
    assert launch.detect(module, {}).nnodes == 8
    slurm = {"SLURM_NODEID": "3", "SLURM_NNODES": "4", "SLURM_LOCALID": "1"}
    place = launch.detect(["python", "train.py"], slurm)
    assert (place.node_rank, place.nnodes, place.samples) == (3, 4, False)
    # torchrun under srun without --node-rank takes Slurm's node id
    assert launch.detect(["torchrun", "--nnodes", "4", "t.py"], slurm).node_rank == 3
    assert launch.detect(["python", "t.py"], {"GPUPROF_NODE_RANK": "1", "GPUPROF_NNODES": "2"}) \
        == launch.Launch(1, 2, 0, "GPUPROF_NODE_RANK")  # fmt: skip
    assert not launch.detect(["python", "train.py", "--nnodes", "2"], {}).multi_node


TASK = textwrap.dedent(
    """
    import os, time, gpuprof
    for step in range(5):
        with gpuprof.phase("rollout"):
            time.sleep(0.05)
        gpuprof.step()
    """
)


def test_srun_with_two_tasks_per_node_samples_each_node_once(simnvml_lib, tmp_path):
    """`srun --ntasks-per-node=2 gpuprof watch -o RUN -- python task.py` on 2 nodes: four
    watchers, one sampler per node, one summary (node 0's first task's)."""
    run_dir = tmp_path / "run"
    procs = []
    for node in range(2):
        for task in range(2):
            env = _node_env(simnvml_lib, tmp_path, node, util=30 if node == 0 else 80)
            env.update(SLURM_NODEID=str(node), SLURM_NNODES="2", SLURM_LOCALID=str(task),
                       SLURM_PROCID=str(2 * node + task))  # fmt: skip
            cmd = gpuprof_cmd("watch", "--interval", "0.05", "-o", str(run_dir), "--",
                              sys.executable, "-c", TASK)  # fmt: skip
            procs.append(subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL,
                                          stderr=subprocess.PIPE, text=True))  # fmt: skip
    errs = [p.communicate(timeout=120)[1] for p in procs]
    assert [p.returncode for p in procs] == [0, 0, 0, 0], errs
    assert sum("run saved to" in e for e in errs) == 1 and "run saved to" in errs[0]
    files = sorted(p.name for p in run_dir.glob("*.sqlite"))
    assert files == ["node0.sqlite", "node0.task1.sqlite", "node1.sqlite", "node1.task1.sqlite"]
    run = store.load_run(run_dir)
    # each node's 2 GPUs sampled once (by its first task), not twice
    per_gpu = run.gpu.groupby(["host", "gpu"]).size()
    assert len(per_gpu) == 4
    assert (run.gpu.groupby(["host", "gpu", "t_ns"]).size() == 1).all()
    ranks = run.spans[run.spans["phase"] == "rollout"].groupby("host")["rank"].unique()
    assert sorted(ranks["node0"]) == [0, 1] and sorted(ranks["node1"]) == [2, 3]
