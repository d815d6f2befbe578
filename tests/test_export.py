"""`gpuprof export`: the Perfetto/Chrome trace obeys the trace-event rules and carries the run's
facts; the Parquet export reads back as the run's frames; writes are atomic; bad input exits 2."""

from __future__ import annotations

import contextlib
import gzip
import io
import json
import math
from collections import Counter, defaultdict
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from conftest import run_gpuprof
from rich.console import Console

from gpuprof import store
from gpuprof.analyzers.diagnose import diagnose
from gpuprof.model import Run
from gpuprof.reports import perfetto
from gpuprof.reports.export import ExportError, export
from gpuprof.reports.parquet import read_parquet_run
from gpuprof.reports.progress import progress
from gpuprof.sim import Pathology, SimConfig, simulate


def _odd_spans(run: Run) -> pd.DataFrame:
    """Spans real runs produce besides neat nesting: a straddling span, a second thread, a
    zero-length span, and one that ends before it starts."""
    first = run.spans.iloc[0]
    t, pid = int(first["start_ns"]), int(first["pid"])
    base = {c: first[c] for c in run.spans.columns}

    def span(phase, start, end, tid=pid):
        return {**base, "phase": phase, "name": phase, "tid": tid, "start_ns": start,
                "end_ns": end, "attrs": {"tokens": 7}, "step": 0}  # fmt: skip

    rows = [
        span("async_reward", t + 5, t + int(2e12)),  # outlives the enclosing step: overlaps
        span("dataload", t + 10, t + 2_000_010, tid=pid + 1),
        span("mark_zero", t + 20, t + 20, tid=pid + 1),
        span("clock_trouble", t + 100, t + 50),  # 50 ns backwards: only int64 ns sees it
    ]
    return pd.DataFrame(rows, columns=run.spans.columns)


@pytest.fixture(scope="module")
def sim_run() -> Run:
    config = SimConfig(gpus=4, gpus_per_host=2, steps=3, time_scale=0.2,
                       pathologies=[Pathology("reward_bound", 0.7)])  # fmt: skip
    run = simulate(config).run
    spans = pd.concat([run.spans, _odd_spans(run)], ignore_index=True)
    run.spans = spans.sort_values("start_ns", kind="stable", ignore_index=True)
    # a GPU that never reports power and one missing utilization sample: missing, never 0
    run.gpu.loc[run.gpu["gpu"] == 1, "power_w"] = np.nan
    run.gpu.loc[run.gpu.index[5], "util_gpu_pct"] = np.nan
    return run


@pytest.fixture(scope="module")
def sim_diagnosis(sim_run):
    return diagnose(sim_run)


def _load(path: Path) -> dict:
    opener = gzip.open if path.name.endswith(".gz") else open
    with opener(path, "rt", encoding="utf-8") as f:
        return json.load(f)


def _ns(value: float) -> int:
    return round(value * 1000)


def check_trace_rules(doc: dict) -> None:
    """The trace-event format's rules that viewers depend on."""
    assert doc["displayTimeUnit"] == "ms"
    events = doc["traceEvents"]
    assert isinstance(events, list) and events
    named_processes, named_threads = set(), set()
    seen_timed = False
    last_ts = -math.inf
    for e in events:
        assert e["ph"] in {"X", "C", "i", "M"}, e
        assert isinstance(e["pid"], int) and not isinstance(e["pid"], bool)
        if e["ph"] == "M":
            assert not seen_timed, "metadata comes first"
            assert isinstance(e["args"], dict)
            if e["name"] == "process_name":
                named_processes.add(e["pid"])
            if e["name"] == "thread_name":
                assert isinstance(e["tid"], int)
                named_threads.add((e["pid"], e["tid"]))
            continue
        seen_timed = True
        assert isinstance(e["ts"], (int, float)) and e["ts"] >= 0
        assert e["ts"] >= last_ts, "events sorted by ts"
        last_ts = e["ts"]
        assert e["pid"] in named_processes
        if e["ph"] == "X":
            assert isinstance(e["dur"], (int, float)) and e["dur"] >= 0
            assert isinstance(e["tid"], int) and isinstance(e["name"], str)
            assert (e["pid"], e["tid"]) in named_threads
        elif e["ph"] == "C":
            assert isinstance(e["args"], dict) and e["args"]
            for value in e["args"].values():
                assert isinstance(value, (int, float)) and not isinstance(value, bool)
                assert math.isfinite(value)
        elif e["ph"] == "i":
            assert e["s"] in {"t", "p", "g"} and isinstance(e["tid"], int)
    # slices on one thread nest: each starts after, and ends before, the one it is inside
    by_track = defaultdict(list)
    for e in events:
        if e["ph"] == "X":
            by_track[(e["pid"], e["tid"])].append((_ns(e["ts"]), _ns(e["ts"]) + _ns(e["dur"])))
    for track, slices in by_track.items():
        stack: list[int] = []
        for start, end in slices:  # already in ts order, longer first at equal ts
            while stack and stack[-1] <= start:
                stack.pop()
            assert not stack or end <= stack[-1], f"slice straddles its parent on {track}"
            stack.append(end)


def test_trace_follows_the_trace_event_rules(sim_run, sim_diagnosis, tmp_path):
    result = export(sim_run, "perfetto", tmp_path / "t.json.gz", diagnosis=sim_diagnosis)
    with open(result.path, "rb") as f:
        assert f.read(2) == b"\x1f\x8b"  # gzip, since the name ends in .gz
    doc = _load(result.path)
    check_trace_rules(doc)
    names = {(e["pid"], e["tid"], e["name"]): e["args"]["name"] for e in doc["traceEvents"]
             if e["ph"] == "M" and e["name"] in ("thread_name", "process_name")}  # fmt: skip
    assert {names[(1, 0, "process_name")], names[(2, 0, "process_name")]} == {"node0", "node1"}
    assert "rank 1 (pid 10001)" in names.values()
    assert perfetto.FINDINGS_PROCESS in names.values()
    assert not list(tmp_path.glob(".*partial*"))


def test_every_valid_span_is_one_slice_and_overlaps_get_their_own_track(sim_run, tmp_path):
    doc = _load(export(sim_run, "perfetto", tmp_path / "t.json").path)
    slices = [e for e in doc["traceEvents"] if e["ph"] == "X" and e["cat"] == "phase"]
    ends_first = sim_run.spans["end_ns"].astype("int64") < sim_run.spans["start_ns"].astype("int64")
    assert ends_first.sum() == 1
    valid = sim_run.spans[~ends_first]
    assert len(slices) == len(valid) == len(sim_run.spans) - 1
    assert Counter(e["name"] for e in slices) == Counter(valid["phase"])
    assert "clock_trouble" not in {e["name"] for e in slices}
    assert doc["otherData"]["spans_dropped"] == 1 and doc["otherData"]["notes"]
    # durations are the spans', to the ns
    t0 = doc["otherData"]["start_ns"]
    want = sorted(zip(valid["start_ns"] - t0, valid["end_ns"] - valid["start_ns"]))
    got = sorted((_ns(e["ts"]), _ns(e["dur"])) for e in slices)
    assert got == [(int(a), int(b)) for a, b in want]
    thread_names = {e["args"]["name"] for e in doc["traceEvents"] if e["name"] == "thread_name"}
    assert "rank 0 (pid 10000) thread 10000 overlap 1" in thread_names
    assert "rank 0 (pid 10000) thread 10001" in thread_names
    (straddler,) = [e for e in slices if e["name"] == "async_reward"]
    assert straddler["args"]["attr.tokens"] == 7 and straddler["args"]["step"] == 0


def test_counters_carry_the_samples_and_leave_gaps_out(sim_run, tmp_path):
    doc = _load(export(sim_run, "perfetto", tmp_path / "t.json", max_counter_events=0).path)
    t0 = doc["otherData"]["start_ns"]
    assert doc["otherData"]["counter_downsample"] == 1
    pid_of = {e["args"]["name"]: e["pid"] for e in doc["traceEvents"]
              if e["name"] == "process_name"}  # fmt: skip
    counters = defaultdict(dict)
    for e in doc["traceEvents"]:
        if e["ph"] == "C":
            for key, value in e["args"].items():
                counters[(e["pid"], e["name"], key)][_ns(e["ts"])] = value
    gpu = sim_run.gpu
    for (host, index), part in gpu.groupby(["host", "gpu"]):
        pid = pid_of[host]
        for label, column in (("utilization %", "util_gpu_pct"), ("memory used bytes",
                              "mem_used_bytes"), ("PCIe bytes/s", "pcie_rx_bytes_s"),
                              ("power W", "power_w"), ("NVLink bytes/s", "nvlink_tx_bytes_s"),
                              ("utilization %", "sm_active_pct")):  # fmt: skip
            series = counters.get((pid, f"GPU {index} {label}", column), {})
            present = part[part[column].notna()]
            want = dict(zip((present["t_ns"] - t0).astype(int), present[column].astype(float)))
            assert series == want, (host, index, column)
    assert not any(key[1].startswith("GPU 1 power") for key in counters)  # never reported
    host_cpu = counters[(pid_of["node0"], "host CPU %", "cpu_pct")]
    assert len(host_cpu) == sim_run.host.query("host == 'node0'")["cpu_pct"].notna().sum()


def test_big_runs_average_counters_under_the_cap_and_say_so(sim_run, tmp_path):
    cap = 300
    result = export(sim_run, "perfetto", tmp_path / "t.json", max_counter_events=cap)
    doc = _load(result.path)
    counter_events = [e for e in doc["traceEvents"] if e["ph"] == "C"]
    factor = doc["otherData"]["counter_downsample"]
    assert factor > 1 and len(counter_events) <= cap
    assert any(f"averaged over {factor}" in note for note in result.notes)
    # averaging keeps each series' mean (buckets are equal but for the last)
    pid = 1
    util = [e["args"]["util_gpu_pct"] for e in counter_events
            if e["pid"] == pid and e["name"] == "GPU 0 utilization %"]  # fmt: skip
    samples = sim_run.gpu.query("host == 'node0' and gpu == 0")["util_gpu_pct"].dropna()
    assert len(util) == math.ceil(len(samples) / factor) or len(util) == math.ceil(
        sim_run.gpu.query("host == 'node0' and gpu == 0").shape[0] / factor
    )
    assert np.mean(util[:-1]) == pytest.approx(samples.iloc[: factor * (len(util) - 1)].mean(),
                                               rel=0.02)  # fmt: skip


def test_findings_are_slices_on_their_own_track(sim_run, sim_diagnosis, tmp_path):
    doc = _load(export(sim_run, "perfetto", tmp_path / "t.json", diagnosis=sim_diagnosis).path)
    findings_pid = next(e["pid"] for e in doc["traceEvents"]
                        if e["name"] == "process_name"
                        and e["args"]["name"] == perfetto.FINDINGS_PROCESS)  # fmt: skip
    marks = [e for e in doc["traceEvents"] if e["pid"] == findings_pid and e["ph"] != "M"]
    kinds = {f.kind for f in sim_diagnosis.findings}
    assert "reward_bound" in kinds and {e["name"] for e in marks} == kinds
    reward = [e for e in marks if e["name"] == "reward_bound"]
    assert all(e["ph"] == "X" for e in reward)
    assert reward[0]["args"]["gpu_seconds_lost"] > 0 and reward[0]["args"]["summary"]


def test_parquet_reads_back_as_the_runs_frames(sim_run, tmp_path):
    result = export(sim_run, "parquet", tmp_path / "pq")
    meta = json.loads((result.path / "meta.json").read_text())
    assert meta["run"]["run_id"] == sim_run.meta.run_id
    files = {p.name for p in result.path.glob("*.parquet")}
    nonempty = {t for t in ("gpu", "host", "procs", "gpu_procs", "spans", "events", "logs")
                if len(getattr(sim_run, t))}  # fmt: skip
    assert files == {f"{t}.parquet" for t in nonempty} and "logs" not in nonempty
    for table in nonempty:
        back = pd.read_parquet(result.path / f"{table}.parquet")  # plain pandas, no helper
        want = getattr(sim_run, table).reset_index(drop=True)
        assert list(back.columns) == list(want.columns)
        if "attrs" in want:
            assert [json.loads(v) for v in back["attrs"]] == list(want["attrs"])
            back, want = back.drop(columns="attrs"), want.drop(columns="attrs")
        # documented: text columns may come back as pandas strings rather than objects
        pd.testing.assert_frame_equal(back, want, check_dtype=False)
        assert (back.select_dtypes("number").dtypes == want.select_dtypes("number").dtypes).all()
    run = read_parquet_run(result.path)
    assert list(run.spans["attrs"]) == list(sim_run.spans["attrs"])
    assert run.logs.empty


def test_re_export_replaces_and_foreign_paths_are_refused(sim_run, tmp_path):
    target = tmp_path / "pq"
    export(sim_run, "parquet", target)
    (target / "stale.parquet").write_bytes(b"old")
    export(sim_run, "parquet", target)
    assert not (target / "stale.parquet").exists()
    foreign = tmp_path / "mine"
    foreign.mkdir()
    (foreign / "notes.txt").write_text("keep me")
    with pytest.raises(ExportError, match="not a gpuprof Parquet export"):
        export(sim_run, "parquet", foreign)
    assert (foreign / "notes.txt").read_text() == "keep me"
    with pytest.raises(ExportError, match="no such directory"):
        export(sim_run, "perfetto", tmp_path / "missing" / "t.json")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["mine", "pq"]


def test_a_failed_write_leaves_nothing_behind(sim_run, tmp_path, monkeypatch):
    target = tmp_path / "t.json.gz"
    target.write_bytes(b"previous export")

    @contextlib.contextmanager
    def disk_fills_halfway(name, total, **kwargs):
        chunks = []

        def advance(n=1):
            chunks.append(n)
            if name == "writing trace" and len(chunks) == 2:
                raise OSError(28, "No space left on device")

        yield advance

    monkeypatch.setattr(perfetto, "_CHUNK", 50)
    monkeypatch.setattr(perfetto, "progress", disk_fills_halfway)
    with pytest.raises(ExportError, match="No space left"):
        export(sim_run, "perfetto", target)
    assert target.read_bytes() == b"previous export"
    assert [p.name for p in tmp_path.iterdir()] == ["t.json.gz"]


def test_cli_exports_and_rejects_bad_input_in_one_line(tmp_path):
    run_dir = tmp_path / "run"
    config = SimConfig(gpus=2, steps=3, time_scale=0.1)
    store.save_run(simulate(config).run, run_dir)
    ok = run_gpuprof("export", str(run_dir), "--format", "perfetto", "--max-counter-events", "50")
    assert ok.returncode == 0, ok.stderr
    assert "averaged over" in ok.stderr and f"wrote {run_dir / 'trace.json.gz'}" in ok.stderr
    check_trace_rules(_load(run_dir / "trace.json.gz"))
    ok = run_gpuprof("export", str(run_dir), "-f", "parquet", "-o", str(tmp_path / "pq"))
    assert ok.returncode == 0 and (tmp_path / "pq" / "gpu.parquet").exists()
    for args in (
        ("export", str(tmp_path / "nowhere")),
        ("export", str(run_dir), "--format", "csv"),
        ("export", str(run_dir), "-o", str(tmp_path / "no" / "such" / "t.json")),
    ):
        bad = run_gpuprof(*args)
        assert bad.returncode == 2, (args, bad.stderr)
        assert len(bad.stderr.strip().splitlines()) == 1 and "Traceback" not in bad.stderr
        assert bad.stderr.startswith("gpuprof: error: ")


def test_progress_draws_only_on_a_terminal():
    terminal = Console(file=io.StringIO(), force_terminal=True, width=80)
    with progress("writing trace", 4, console=terminal) as advance:
        for _ in range(4):
            advance()
    assert "writing trace" in terminal.file.getvalue()
    piped = Console(file=io.StringIO(), force_terminal=False, width=80)
    with progress("writing trace", 4, console=piped) as advance:
        advance(4)
    assert piped.file.getvalue() == ""
