"""Following a run while it is recorded (`gpuprof.run_tail`) and serving what it reads:
the node's own files, the files a Ray driver records for other nodes (Arrow chunks), nothing of
another run, each row once; and the metrics endpoint's collector labelling another node's rows
with that node, its clock offset applied, its gauges dropped once it is lost or silent."""

from __future__ import annotations

import dataclasses
import io
import json
import sqlite3
from pathlib import Path

import numpy as np
import pytest
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.registry import CollectorRegistry

from gpuprof import columnar, store
from gpuprof.model import Event, GpuSample, HostSample, RunMeta, Span
from gpuprof.reports import prometheus
from gpuprof.reports.live import BIN_NS, LiveState
from gpuprof.reports.prometheus import GpuprofCollector
from gpuprof.run_tail import NodeRows, RunTail

S = 1_000_000_000
GIB = 2**30


def _span(host: str, pid: int, phase: str, start_s: float, end_s: float, rank=None) -> Span:
    return Span(host, pid, 1, rank, None, phase, phase, None, 0, int(start_s * S), int(end_s * S))


def _step(host: str, pid: int, t_s: float, rank=None) -> Event:
    return Event(host, pid, rank, int(t_s * S), "step", "step")


def _rows(records) -> list[tuple]:
    return [dataclasses.astuple(r) for r in records]


def _write(path: Path, **tables) -> None:
    """Rows into a run file as hooks and watchers write them (one transaction)."""
    conn = store.connect(path)
    try:
        store.insert_rows(conn, {t: _rows(rs) for t, rs in tables.items()})
    finally:
        conn.close()


def _chunks(path: Path, **tables) -> None:
    """Rows into a run file as a Ray driver stores a node's pull: one Arrow chunk per table."""
    conn = store.connect(path)
    try:
        chunks = [(t, len(rs), columnar.encode_chunk(t, _rows(rs))) for t, rs in tables.items()]
        store.insert_rows(conn, {}, chunks)
    finally:
        conn.close()


def _document(path: Path, key: str, value: dict) -> None:
    conn = store.connect(path)
    try:
        store.write_meta(conn, key, value)
    finally:
        conn.close()


def _gpus(host: str, t_s: float, utils: list[float]) -> list[GpuSample]:
    return [GpuSample(host, i, f"GPU-{host}-{i}", int(t_s * S), util_gpu_pct=u,
                      mem_used_bytes=(i + 1) * GIB, power_w=100.0 + i)
            for i, u in enumerate(utils)]  # fmt: skip


@pytest.fixture
def run_dir(tmp_path) -> Path:
    """A run being recorded by the watcher of node ``n0`` (run id ``run``)."""
    run = tmp_path / "run"
    run.mkdir()
    _write(run / "n0.sqlite", spans=[_span("n0", 10, "rollout", 0, 1)],
           events=[_step("n0", 10, 1.0)])  # fmt: skip
    # a Ray worker of the head node, started by a raylet that predates the watch
    _write(run / "n0.4242.sqlite", spans=[_span("n0", 4242, "update_actor", 1, 2, rank=0)],
           events=[_step("n0", 4242, 2.0, rank=0), _step("n0", 4242, 0.5, rank=0)])  # fmt: skip
    # what the driver records for node n1 (several dots in its name)
    n1 = run / "n1.rack.2.sqlite"
    meta = RunMeta(run_id="run", hosts=["n1.rack.2"], reference_node="n0",
                   gpus=[{"index": i, "uuid": f"GPU-n1-{i}", "name": "NVIDIA H200"}
                         for i in range(2)])  # fmt: skip
    meta.nodes["n1.rack.2"] = {"state": "recorded", "asked_ns": 1, "from_ns": 2,
                               "notice": "node n1.rack.2 recorded",
                               "address": "10.0.0.12"}  # fmt: skip
    _document(n1, "run", meta.to_dict())
    _document(n1, "clock", {"node": "n1.rack.2", "offset_ns": -250_000_000, "error_ns": 10,
                            "method": "ray-rtt", "reference": "n0"})  # fmt: skip
    _chunks(n1, gpu=_gpus("n1.rack.2", 0.0, [80, 5]) + _gpus("n1.rack.2", 0.1, [90, 5]),
            host=[HostSample("n1.rack.2", int(0.1 * S), cpu_pct=40.0, mem_used_bytes=GIB)],
            spans=[_span("n1.rack.2", 7, "reward", 0, 0.1, rank=1)],
            events=[_step("n1.rack.2", 7, 0.1, rank=1),
                    Event("n1.rack.2", 7, 1, 1, "mark", "x")])  # fmt: skip
    # another run's file left in the directory, and a file that is not a run file at all
    other = run / "n9.sqlite"
    _document(other, "run", RunMeta(run_id="older", hosts=["n9"], reference_node="n0").to_dict())
    _chunks(other, spans=[_span("n9", 1, "rollout", 0, 1)])
    (run / "junk.sqlite").write_bytes(b"not a database" * 100)
    return run


def test_the_nodes_files_and_the_drivers_files_are_read_once(run_dir):
    tail = RunTail(run_dir / "n0.sqlite", "n0", run_dir=run_dir, run_id="run")
    got = tail.poll()
    assert sorted(got) == ["n0", "n1.rack.2"]
    own = got["n0"]
    assert sorted(own.spans) == [(10, None, "rollout", 0, S), (4242, 0, "update_actor", S, 2 * S)]
    assert own.steps == [(4242, 0, S // 2), (10, None, S), (4242, 0, 2 * S)]  # in time order
    assert own.gpu is None and own.lost_ns is None
    n1 = got["n1.rack.2"]
    assert n1.gpu.column("util_gpu_pct").to_pylist() == [80, 5, 90, 5]
    assert n1.host.column("cpu_pct").to_pylist() == [40.0]
    assert not n1.spans  # chunks' spans stay columns
    spans = n1.span_table.select(["pid", "rank", "phase", "start_ns", "end_ns"]).to_pylist()
    assert spans == [{"pid": 7, "rank": 1, "phase": "reward", "start_ns": 0, "end_ns": S // 10}]
    assert n1.steps == [(7, 1, S // 10)]  # marks are not steps
    assert [(g["host"], g["index"], g["name"]) for g in tail.inventory()] == [
        ("n1.rack.2", 0, "NVIDIA H200"), ("n1.rack.2", 1, "NVIDIA H200")]  # fmt: skip
    assert tail.offsets() == {"n1.rack.2": -250_000_000}
    assert tail.addresses() == {"n1.rack.2": "10.0.0.12"}  # its IP in Ray's node table

    # nothing new: nothing returned; then only what was added
    assert not any(tail.poll().values())
    _chunks(run_dir / "n1.rack.2.sqlite", gpu=_gpus("n1.rack.2", 0.2, [70, 0]))
    _write(run_dir / "n0.4242.sqlite", events=[_step("n0", 4242, 3.0, rank=0)])
    got = tail.poll()
    assert got["n0"].steps == [(4242, 0, 3 * S)] and not got["n0"].spans
    assert got["n1.rack.2"].gpu.column("util_gpu_pct").to_pylist() == [70, 0]
    tail.close()


def test_files_that_appear_later_are_found_and_a_damaged_chunk_costs_itself(run_dir, monkeypatch):
    monkeypatch.setattr("gpuprof.run_tail.SCAN_S", 0.0)
    tail = RunTail(run_dir / "n0.sqlite", "n0", run_dir=run_dir, run_id="run")
    tail.poll()
    # a worker that starts later, a node that joins later, a node the driver records as lost
    _write(run_dir / "n0.77.sqlite", spans=[_span("n0", 77, "reshard", 5, 6)])
    n3 = run_dir / "n3.sqlite"
    _document(n3, "run", RunMeta(run_id="run", hosts=["n3"], reference_node="n0").to_dict())
    _chunks(n3, gpu=_gpus("n3", 1.0, [50]))
    conn = store.connect(n3)
    store.insert_rows(conn, {}, [("gpu", 1, b"GPC1" + b"\0" * 40)])  # damaged on the way
    conn.close()
    _chunks(n3, gpu=_gpus("n3", 1.1, [60]))
    _write(n3, events=[Event("n3", 0, None, int(1.2 * S), "node_lost", "n3")])
    got = tail.poll()
    assert got["n0"].spans == [(77, None, "reshard", 5 * S, 6 * S)]
    assert got["n3"].gpu.column("util_gpu_pct").to_pylist() == [50, 60]
    assert got["n3"].lost_ns == int(1.2 * S)
    assert tail.recorded[n3].tail.damaged == 1
    tail.close()


def test_a_launch_watcher_reads_only_its_own_node(run_dir):
    # torchrun/Slurm: other machines write the shared run directory; their WAL index is not
    # this machine's to read
    tail = RunTail(run_dir / "n0.sqlite", "n0", run_dir=run_dir, run_id="run", other_nodes=False)
    got = tail.poll()
    assert sorted(got) == ["n0"] and len(got["n0"].spans) == 2
    assert tail.inventory() == [] and tail.recorded == {}
    tail.close()


def test_an_unreadable_own_file_is_tried_again(tmp_path):
    tail = RunTail(tmp_path / "absent.sqlite", "n0")
    assert not tail.poll()["n0"]
    _write(tmp_path / "absent.sqlite", spans=[_span("n0", 1, "rollout", 0, 1)])
    assert len(tail.poll()["n0"].spans) == 1
    tail.close()


# ----- idle accounting from a node's samples


def test_samples_read_from_a_file_are_charged_per_gpu_and_bin():
    state = LiveState(idle_util_pct=10)
    t = np.arange(0, 4 * S, S // 10, dtype=np.int64)  # 10 Hz for 4 s
    # two GPUs, interleaved out of order: GPU 1 idle throughout, GPU 0 busy
    times = np.concatenate([t, t])
    gpu = np.array([0] * len(t) + [1] * len(t))
    util = np.array([90.0] * len(t) + [0.0] * len(t))
    shuffle = np.random.default_rng(0).permutation(len(times))
    state.add_gpu_samples(times[shuffle], gpu[shuffle], util[shuffle])
    assert state.gpu_s == pytest.approx(2 * 3.9)
    assert len(state._t) == 4 * S // BIN_NS  # 16 entries for 80 samples
    state.add_spans([(5, 0, "reward", S, 3 * S)])
    idle = state.idle_by_phase()
    assert idle["reward"] == pytest.approx(2.0, abs=0.11)
    assert sum(idle.values()) == pytest.approx(3.9)
    # the next pull continues each GPU from its last sample; a NaN reading counts for nothing
    state.add_gpu_samples(np.array([4 * S, 4 * S]), np.array([0, 1]), np.array([np.nan, 0.0]))
    assert state.gpu_s == pytest.approx(2 * 3.9 + 0.1)


# ----- the collector: another node's rows, labelled with it


def _exposition(collector: GpuprofCollector) -> dict[str, list[tuple[dict, float]]]:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(collector)
    out: dict[str, list[tuple[dict, float]]] = {}
    for family in text_string_to_metric_families(generate_latest(registry).decode()):
        for s in family.samples:
            out.setdefault(s.name, []).append((dict(s.labels), s.value))
    return out


def _n1_rows(run_dir: Path) -> NodeRows:
    tail = RunTail(run_dir / "n0.sqlite", "n0", run_dir=run_dir, run_id="run")
    rows = tail.poll()["n1.rack.2"]
    tail.close()
    return rows


def test_another_nodes_rows_are_served_with_its_node_and_the_watchers_clock(run_dir):
    collector = GpuprofCollector(LiveState(idle_util_pct=10), "n0", node_ip="10.0.0.10")
    collector.take((S, _gpus("n0", 1.0, [30]), HostSample("n0", S, cpu_pct=10.0)))
    collector.take_rows("n1.rack.2", _n1_rows(run_dir))
    collector.set_others([{"host": "n1.rack.2", "index": 0, "uuid": "GPU-n1-0",
                           "name": "NVIDIA H200"}], {"n1.rack.2": -250_000_000},
                         {"n1.rack.2": "10.0.0.12"})  # fmt: skip
    got = _exposition(collector)
    util = {(s["node"], s["gpu"], s["uuid"]): v for s, v in got["gpuprof_gpu_utilization_ratio"]}
    assert util == {("n0", "0", "GPU-n0-0"): 0.3, ("n1.rack.2", "0", "GPU-n1.rack.2-0"): 0.9,
                    ("n1.rack.2", "1", "GPU-n1.rack.2-1"): 0.05}  # fmt: skip
    # each node's GPUs under Ray's names: the node's IP, the GPU's index
    ray = {(s["ip"], s["GpuIndex"], s["Hostname"]) for s, _ in got["gpuprof_gpu_power_watts"]}
    assert ray == {("10.0.0.10", "0", "n0"), ("10.0.0.12", "0", "n1.rack.2"),
                   ("10.0.0.12", "1", "n1.rack.2")}  # fmt: skip
    hosts = {s["node"]: s["ip"] for s, _ in got["gpuprof_host_cpu_utilization_ratio"]}
    assert hosts == {"n0": "10.0.0.10", "n1.rack.2": "10.0.0.12"}
    power = {(s["node"], s["gpu"]): v for s, v in got["gpuprof_gpu_power_watts"]}
    assert power[("n1.rack.2", "1")] == 101.0
    info = [(s["node"], s["gpu"], s["model_name"]) for s, _ in got["gpuprof_gpu_info"]]
    assert ("n1.rack.2", "0", "NVIDIA H200") in info and ("n1.rack.2", "1", "") in info
    cpu = {s["node"]: v for s, v in got["gpuprof_host_cpu_utilization_ratio"]}
    assert cpu == {"n0": 0.1, "n1.rack.2": 0.4}
    # the node's process: its phase ended at 0.1 s on its clock, 250 ms behind the watcher's
    ((labels, ended),) = got["gpuprof_rank_phase_end_timestamp_seconds"]
    assert labels == {"node": "n1.rack.2", "rank": "1", "pid": "7"}
    assert ended == pytest.approx(0.1 - 0.25)
    assert got["gpuprof_steps_total"] == [(labels, 1.0)]
    # its idle accounting is its own: GPU 1 idle for the 0.1 s between its samples, in reward
    sampled = {s["node"]: v for s, v in got["gpuprof_sampled_gpu_seconds_total"]}
    assert sampled == {"n1.rack.2": pytest.approx(0.2)}  # n0 has one reading: no time yet
    idle = {(s["node"], s["phase"]): v for s, v in got["gpuprof_idle_gpu_seconds"]}
    assert idle == {("n1.rack.2", "reward"): pytest.approx(0.1)}
    top = got["gpuprof_top_finding_idle_gpu_seconds"]
    assert top == [({"node": "n1.rack.2", "kind": "reward_bound", "phase": "reward"},
                    pytest.approx(0.1))]  # fmt: skip


def test_a_lost_or_silent_node_leaves_the_gauges(run_dir, monkeypatch):
    collector = GpuprofCollector(LiveState(), "n0")
    collector.take_rows("n1.rack.2", _n1_rows(run_dir))
    assert {s["node"] for s, _ in _exposition(collector)["gpuprof_gpu_utilization_ratio"]} == {
        "n1.rack.2"}  # fmt: skip
    monkeypatch.setattr(prometheus, "NODE_STALE_S", 0.0)  # no samples since: silent
    got = _exposition(collector)
    assert "gpuprof_gpu_utilization_ratio" not in got
    assert "gpuprof_host_cpu_utilization_ratio" not in got
    assert got["gpuprof_steps_total"]  # what it did is kept
    monkeypatch.setattr(prometheus, "NODE_STALE_S", 60.0)
    assert "gpuprof_gpu_utilization_ratio" in _exposition(collector)
    collector.take_rows("n1.rack.2", NodeRows(lost_ns=2 * S))  # the driver recorded it lost
    assert "gpuprof_gpu_utilization_ratio" not in _exposition(collector)


def test_follower_reads_a_file_a_writer_holds_open(tmp_path):
    # the driver's writer keeps its connection (WAL) open between commits
    path = tmp_path / "n1.sqlite"
    writer = store.BufferedWriter(path)
    writer.add_chunk("gpu", 1, columnar.encode_chunk("gpu", _rows(_gpus("n1", 0, [20]))))
    writer.set_meta("run", RunMeta(run_id="r", hosts=["n1"], reference_node="n0").to_dict())
    writer.flush()
    tail = RunTail(tmp_path / "n0.sqlite", "n0", run_dir=tmp_path, run_id="r")
    try:
        assert tail.poll()["n1"].gpu.num_rows == 1
        writer.add_chunk("gpu", 1, columnar.encode_chunk("gpu", _rows(_gpus("n1", 1, [30]))))
        writer.flush()
        assert tail.poll()["n1"].gpu.column("util_gpu_pct").to_pylist() == [30]
    finally:
        tail.close()
        writer.close()
    assert sqlite3.connect(path).execute("SELECT count(*) FROM chunks").fetchone() == (2,)


def test_the_driver_records_each_nodes_address_in_rays_node_table(tmp_path):
    from gpuprof.integrations.ray_cluster import recorder

    rec = recorder.ClusterRecorder(object(), tmp_path, "run", "s", "n0", "m0",
                                   stream=io.StringIO())  # fmt: skip
    node = recorder._Node("c" * 56, "10.0.0.12")
    rec._never(node, "its sampler was not placed within 60 s")
    (path,) = tmp_path.glob("*.sqlite")
    conn = sqlite3.connect(path)
    (doc,) = conn.execute("SELECT value FROM meta WHERE key = 'run'").fetchone()
    conn.close()
    status = json.loads(doc)["nodes"]["10.0.0.12 (cccccccc)"]
    assert status["address"] == "10.0.0.12" and status["state"] == "never_recorded"


def test_a_scrape_never_serves_a_nodes_readings_before_its_gpus_and_clock(run_dir):
    # the follower's round takes the files' rows node by node; a scrape may come between any
    # two of its steps (the HTTP server's threads), as one did in a cluster test
    from gpuprof.reports.live_run import RunFollower

    seen: list[dict] = []

    class Scraped(GpuprofCollector):
        def take_rows(self, node: str, rows: NodeRows) -> None:
            super().take_rows(node, rows)
            seen.append(_exposition(self))

    collector = Scraped(LiveState(), "n0")
    follower = RunFollower(collector, run_dir / "n0.sqlite", run_dir=run_dir, run_id="run",
                           what="metrics endpoint", name="test-follower")  # fmt: skip
    try:
        follower._round(force=True)
    finally:
        follower.tail.close()
    served = [got for got in seen if "gpuprof_gpu_utilization_ratio" in got]
    assert served  # n1's readings were served once its rows were taken
    for got in served:
        models = {s["gpu"]: s["model_name"] for s, _ in got["gpuprof_gpu_info"]}
        assert models == {"0": "NVIDIA H200", "1": "NVIDIA H200"}
    # n1's phase end on the watcher's clock: its offset known when the end was served
    ends = {s["node"]: t for s, t in served[-1]["gpuprof_rank_phase_end_timestamp_seconds"]}
    assert ends["n1.rack.2"] == pytest.approx(0.1 - 0.25)
