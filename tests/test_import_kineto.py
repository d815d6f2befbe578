"""PyTorch-profiler (Kineto) trace import: real traces, hand-built traces, HTA, bad input."""

from __future__ import annotations

import collections
import gzip
import json
import re
from pathlib import Path

import numpy as np
import pytest
from conftest import SHARED_FIXTURES, run_gpuprof
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gpuprof.collectors.importers import Imported, ImportFormatError, detect, kineto
from gpuprof.collectors.importers.kineto_breakdown import temporal_breakdown
from gpuprof.phases import canonical_phase

KINETO_FIXTURES = SHARED_FIXTURES / "kineto"
FIXTURE_FILES = sorted(KINETO_FIXTURES.glob("*.json*")) if KINETO_FIXTURES.is_dir() else []
needs_fixtures = pytest.mark.skipif(not FIXTURE_FILES, reason="../shared/fixtures absent")

GPU_CATS = {"kernel", "gpu_memcpy", "gpu_memset", "Kernel", "Memcpy", "Memset"}
T0_US = 1_700_000_000_000_000  # a wall-clock instant in µs since the epoch


def write_trace(path: Path, events: list, **meta) -> Path:
    """A trace file as torch.profiler writes it (gzip when the name ends in .gz)."""
    doc = {"schemaVersion": 1, **meta, "traceEvents": events}
    raw = json.dumps(doc).encode()
    path.write_bytes(gzip.compress(raw) if path.name.endswith(".gz") else raw)
    return path


def ev(cat, name, ts, dur, pid=100, tid=100, **args):
    event = {"ph": "X", "cat": cat, "name": name, "pid": pid, "tid": tid, "ts": ts, "dur": dur}
    if args:
        event["args"] = args
    return event


def kernel(name, ts, dur, device=0, stream=7, cat="kernel", **args):
    return ev(cat, name, ts, dur, pid=device, tid=stream, device=device, stream=stream, **args)


def gpu_time(imported: Imported) -> dict[int, dict]:
    """The exact per-GPU figures the import keeps, by GPU index."""
    events = imported.frames["events"]
    rows = events[events["kind"] == "gpu_time"]
    return {int(a["gpu"]): a for a in rows["attrs"]}


# --------------------------------------------------------------------------------------------
# Real traces: figures checked against values computed straight from the JSON


def raw_events(path: Path) -> tuple[dict, list[dict]]:
    with gzip.open(path) if path.name.endswith(".gz") else path.open("rb") as fh:
        doc = json.load(fh)
    return doc, [e for e in doc["traceEvents"] if e.get("ph") == "X"]


def sweep_busy_us(starts: np.ndarray, ends: np.ndarray) -> float:
    """Length of the union of intervals by a sweep over +1/-1 boundary events (µs)."""
    times = np.concatenate([starts, ends])
    delta = np.concatenate([np.ones(len(starts)), -np.ones(len(ends))])
    order = np.lexsort((-delta, times))  # at equal times, open before close
    times, depth = times[order], np.cumsum(delta[order])
    return float(np.sum(np.diff(times)[depth[:-1] > 0]))


@needs_fixtures
@pytest.mark.parametrize("path", FIXTURE_FILES, ids=lambda p: p.name)
def test_real_trace_figures_match_the_json(path):
    assert detect(path) is kineto
    imported = kineto.parse(path)
    doc, events = raw_events(path)
    gpu_events = [e for e in events if e.get("cat") in GPU_CATS]
    t0 = min(e["ts"] for e in events)

    # GPU busy time and kernel count per device, from the JSON with numpy
    figures = gpu_time(imported)
    devices = collections.defaultdict(list)
    for e in gpu_events:
        devices[e["args"]["device"]].append(e)
    assert set(figures) == set(devices)
    samples = imported.frames["gpu"]
    for device, mine in devices.items():
        starts = np.array([e["ts"] - t0 for e in mine], dtype=np.float64)
        ends = starts + np.array([e["dur"] for e in mine], dtype=np.float64)
        expected_us = sweep_busy_us(starts, ends)
        got = figures[device]
        # ns rounding of each endpoint is the only difference: ≤ 1 ns per activity
        assert got["busy_ns"] / 1e3 == pytest.approx(expected_us, abs=len(mine) * 1e-3)
        assert got["kernels"] == sum(e["cat"] == "kernel" for e in mine)
        assert got["busy_ns"] + got["idle_ns"] == got["window_ns"]
        assert got["compute_ns"] + got["communication_ns"] + got["memory_ns"] == got["busy_ns"]
        nccl = [e for e in mine if "nccl" in e["name"].lower()]
        assert (got["communication_ns"] > 0) == bool(nccl)
        # the samples carry the same busy time (each stands for [t_ns, next sample))
        rows = samples[samples["gpu"] == device].sort_values("t_ns")
        t = rows["t_ns"].to_numpy(np.int64)
        width = np.diff(np.concatenate([t, [imported.meta["end_ns"]]]))
        busy_from_samples = float(np.sum(rows["util_gpu_pct"].to_numpy() / 100 * width))
        assert busy_from_samples == pytest.approx(got["busy_ns"], rel=1e-9, abs=1)
        assert rows["util_gpu_pct"].between(0, 100).all()

    # steps: one span and one event per distinct ProfilerStep#N on the CPU side
    step_numbers = {
        int(m.group(1))
        for e in events
        if e["cat"] in ("user_annotation", "cpu_op")
        and (m := re.match(r"ProfilerStep#(\d+)$", e["name"]))
    }
    spans = imported.frames.get("spans")
    if step_numbers:
        step_spans = spans[spans["phase"] == "step"]
        assert sorted(step_spans["step"]) == sorted(step_numbers)
        step_events = imported.frames["events"]
        step_events = step_events[step_events["kind"] == "step"]
        assert sorted(map(int, step_events["name"])) == sorted(step_numbers)

    # phase spans: every user annotation but steps, collectives and zero_grad, and every
    # blocking CUDA runtime call of 100 µs or more, by name
    expected = collections.Counter(
        e["name"]
        for e in events
        if (
            e["cat"] == "user_annotation"
            and not re.match(r"ProfilerStep#\d+$|nccl:|Optimizer\.zero_grad#", e["name"])
        )
        or (
            e["cat"] == "cuda_runtime"
            and e["name"] in kineto.RUNTIME_PHASES
            and e.get("dur", 0) * 1000 >= kineto.RUNTIME_MIN_NS
        )
    )
    got_names = collections.Counter()
    if spans is not None:
        got_names = collections.Counter(spans.loc[spans["phase"] != "step", "name"])
    assert got_names == expected
    if spans is not None:
        for name, phase in zip(spans["name"], spans["phase"]):
            if name.startswith("Optimizer.step#"):
                assert phase == "update_actor"
            if name == "## data_load ##":
                assert phase == "dataload"
        starts = spans["start_ns"].to_numpy()
        assert (spans["end_ns"].to_numpy() >= starts).all()

    # wall-clock placement: Kineto µs since the epoch, or relative to baseTimeNanoseconds
    assert imported.anchored
    base = doc.get("baseTimeNanoseconds", 0)
    assert imported.meta["start_ns"] == pytest.approx(base + t0 * 1000, abs=1000)


@needs_fixtures
def test_real_trace_details():
    ns = kineto.parse(KINETO_FIXTURES / "hta_ns_resolution_rank-0.pt.trace.json.gz")
    assert ns.meta["hosts"] == ["twshared39868.02.pnb3.facebook.com"]  # the trace's host_name
    assert ns.meta["gpus"][0]["name"] == "Tesla V100-SXM2-32GB"
    spans = ns.frames["spans"]
    # sub-microsecond times survive: fractional µs become ns, not rounded to whole µs
    assert (spans["start_ns"] % 1000 != 0).any()
    amd = kineto.parse(KINETO_FIXTURES / "hta_amd_mi250_minitoy.json.gz")
    assert list(gpu_time(amd)) == [2]  # the device the activities name, not the rank
    rank1 = kineto.parse(KINETO_FIXTURES / "hta_sampled_rank-1.json.gz")
    assert set(rank1.frames["spans"]["rank"]) == {1}
    assert set(rank1.frames["gpu"]["gpu"]) == {1}


@needs_fixtures
def test_cli_imports_two_ranks_and_analyzes(tmp_path):
    files = [str(KINETO_FIXTURES / f"hta_sampled_rank-{r}.json.gz") for r in (0, 1)]
    out = tmp_path / "run"
    done = run_gpuprof("import", *files, "-o", str(out))
    assert done.returncode == 0, done.stderr
    done = run_gpuprof("analyze", str(out), "--json")
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    assert json.dumps(report)  # a diagnosis came out of the imported run
    from gpuprof.store import load_run

    run = load_run(out)
    assert sorted(run.gpu["gpu"].unique()) == [0, 1]
    assert len(run.gpu["host"].unique()) == 1  # both ranks on one host
    assert set(run.spans.loc[run.spans["phase"] == "step", "step"]) == {551, 552}


# --------------------------------------------------------------------------------------------
# HolisticTraceAnalysis agrees on the temporal breakdown


@needs_fixtures
@pytest.mark.parametrize(
    "names",
    [
        ["hta_sampled_rank-0.json.gz", "hta_sampled_rank-1.json.gz"],
        ["hta_ns_resolution_rank-0.pt.trace.json.gz"],
        ["hta_amd_mi250_minitoy.json.gz"],
        ["hta_alexnet_benchmark.json.gz"],
    ],
    ids=lambda n: n[0].split(".")[0],
)
def test_breakdown_agrees_with_hta(names, tmp_path):
    pytest.importorskip("hta")
    from hta.trace_analysis import TraceAnalysis

    for name in names:
        (tmp_path / name).symlink_to(KINETO_FIXTURES / name)
    theirs = TraceAnalysis(trace_dir=str(tmp_path)).get_temporal_breakdown(visualize=False)
    ours = temporal_breakdown([KINETO_FIXTURES / n for n in names])
    assert list(ours["rank"]) == list(theirs["rank"])
    for column, hta_column in [
        ("idle_pct", "idle_time_pctg"),
        ("compute_pct", "compute_time_pctg"),
        ("non_compute_pct", "non_compute_time_pctg"),
    ]:
        diff = np.abs(ours[column].to_numpy() - theirs[hta_column].to_numpy())
        assert (diff < 1.0).all(), (column, ours[column].tolist(), theirs[hta_column].tolist())


def test_breakdown_by_hand(tmp_path):
    # compute 0-100 µs, NCCL 50-250 µs, memcpy 240-300 µs, gap, compute 400-500 µs
    events = [
        ev("user_annotation", "ProfilerStep#1", T0_US - 10, 350),
        ev("user_annotation", "ProfilerStep#2", T0_US + 350, 200),
        ev("cuda_runtime", "cudaLaunchKernel", T0_US, 5, correlation=1),
        ev("cuda_runtime", "cudaLaunchKernel", T0_US + 1, 5, correlation=2),
        ev("cuda_runtime", "cudaMemcpyAsync", T0_US + 2, 5, correlation=3),
        ev("cuda_runtime", "cudaLaunchKernel", T0_US + 390, 5, correlation=4),
        kernel("gemm", T0_US, 100, correlation=1),
        kernel("ncclDevKernel_AllReduce_Sum_f32_RING_LL", T0_US + 50, 200, stream=9,
               correlation=2),
        kernel("Memcpy DtoD", T0_US + 240, 60, cat="gpu_memcpy", stream=11, correlation=3),
        kernel("gemm", T0_US + 400, 100, correlation=4),
    ]  # fmt: skip
    path = write_trace(tmp_path / "t.json", events, distributedInfo={"rank": 5})
    whole = temporal_breakdown(path, include_last_step=True).iloc[0]
    assert whole["rank"] == 5
    assert whole["span_ns"] == 500_000
    assert whole["compute_ns"] == 200_000
    assert whole["communication_ns"] == 150_000
    assert whole["memory_ns"] == 50_000
    assert whole["idle_ns"] == 100_000
    assert whole["idle_pct"] == pytest.approx(20.0)
    # like HTA: by default the last ProfilerStep's launches are left out
    cut = temporal_breakdown(path).iloc[0]
    assert cut["span_ns"] == 300_000 and cut["idle_ns"] == 0 and cut["activities"] == 3
    # the import keeps everything in the profiled window
    figures = gpu_time(kineto.parse(path))[0]
    assert figures["busy_ns"] == 400_000
    assert figures["communication_ns"] == 150_000


# --------------------------------------------------------------------------------------------
# Hand-built traces: categories, units, clocks, ranks, phases


def test_old_categories_and_plain_json(tmp_path):
    events = [
        ev("Operator", "ProfilerStep#7", T0_US, 1000),
        ev("Runtime", "cudaLaunchKernel", T0_US + 10, 5),
        {**kernel("k", T0_US + 20, 100, cat="Kernel"), "tid": "stream 7"},
        kernel("Memcpy HtoD (Pageable -> Device)", T0_US + 200, 50, cat="Memcpy"),
        kernel("Memset (Device)", T0_US + 300, 10, cat="Memset"),
    ]
    imported = kineto.parse(write_trace(tmp_path / "old.pt.trace.json", events))
    figures = gpu_time(imported)[0]
    assert figures["busy_ns"] == 160_000
    assert (figures["kernels"], figures["memcpys"], figures["memsets"]) == (1, 1, 1)
    assert figures["memory_ns"] == 60_000 and figures["compute_ns"] == 100_000
    spans = imported.frames["spans"]
    assert list(spans["phase"]) == ["step"] and list(spans["step"]) == [7]


def test_nanosecond_base_time_and_gz(tmp_path):
    base = 1_735_632_360_000_000_000
    events = [
        ev("user_annotation", "rollout", 4_203_669_603_187.439, 9_288.291),
        kernel("k", 4_203_669_603_200.001, 0.5),
    ]
    path = write_trace(
        tmp_path / "r.json.gz", events, displayTimeUnit="ms", baseTimeNanoseconds=base
    )
    imported = kineto.parse(path)
    assert imported.anchored
    span = imported.frames["spans"].iloc[0]
    assert span["start_ns"] == base + 4_203_669_603_187_439
    assert span["end_ns"] - span["start_ns"] == 9_288_291
    assert span["phase"] == "rollout"
    assert gpu_time(imported)[0]["busy_ns"] == 500


def test_unknown_clock_is_not_anchored(tmp_path):
    events = [ev("user_annotation", "generate", 5_000, 100), kernel("k", 5_010, 20)]
    imported = kineto.parse(write_trace(tmp_path / "t.json", events))
    assert not imported.anchored
    assert imported.meta["start_ns"] == 0
    assert imported.frames["spans"]["start_ns"].min() == 0


def test_cpu_only_trace_still_yields_phases(tmp_path):
    events = [
        ev("user_annotation", "ProfilerStep#0", T0_US, 10_000),
        ev("user_annotation", "generate", T0_US + 100, 5_000),
        ev("user_annotation", "compute_reward", T0_US + 5_200, 1_000),
        ev("user_annotation", "## update_actor ##", T0_US + 6_300, 2_000),
        ev("user_annotation", "Optimizer.step#AdamW.step", T0_US + 7_000, 900),
        ev("user_annotation", "Optimizer.zero_grad#AdamW.zero_grad", T0_US + 8_000, 10),
        ev("user_annotation", "nccl:all_reduce", T0_US + 7_500, 10),
        ev("cpu_op", "enumerate(DataLoader)#_MultiProcessingDataLoaderIter.__next__",
           T0_US + 20, 60),
        ev("cpu_op", "aten::mm", T0_US + 200, 10),
        ev("user_annotation", "my_custom_range", T0_US + 12_000, 10),
    ]  # fmt: skip
    imported = kineto.parse(write_trace(tmp_path / "cpu_rank3.json", events))
    assert "gpu" not in imported.frames
    spans = imported.frames["spans"].sort_values("start_ns")
    assert list(spans["phase"]) == [
        "step", "dataload", "rollout", "reward", "update_actor", "update_actor",
        "my_custom_range",
    ]  # fmt: skip
    # numbered by the ProfilerStep they start in; nested ones deeper
    assert list(spans["step"].astype("float").fillna(-1)) == [0, 0, 0, 0, 0, 0, -1]
    assert list(spans["depth"])[:6] == [0, 1, 1, 1, 1, 2]
    assert set(spans["rank"]) == {3}  # from the file name: no distributedInfo
    assert "hosts" not in imported.meta  # a stand-in name, not a known host
    assert any("no GPU activity" in n for n in imported.notes)


def test_device_ids_and_rank_fallback(tmp_path):
    # activities naming their device land there; without any device id, rank r is GPU r
    named = [kernel("k", T0_US, 10, device=1)]
    imported = kineto.parse(write_trace(tmp_path / "a.json", named, distributedInfo={"rank": 0}))
    assert set(imported.frames["gpu"]["gpu"]) == {1}
    anonymous = [{"ph": "X", "cat": "kernel", "name": "k", "pid": "GPU", "tid": "s", "ts": T0_US,
                  "dur": 10}]  # fmt: skip
    imported = kineto.parse(
        write_trace(tmp_path / "b.json", anonymous, distributedInfo={"rank": 6})
    )
    assert set(imported.frames["gpu"]["gpu"]) == {6}


def test_samples_are_busy_share_of_each_bin(tmp_path):
    events = [
        ev("Trace", "PyTorch Profiler (0)", T0_US, 300_000, pid="Spans", tid="PyTorch Profiler"),
        kernel("a", T0_US + 10_000, 50_000),  # 50 ms in the first 100 ms bin
        kernel("b", T0_US + 30_000, 10_000, stream=9),  # overlaps a: no extra busy time
        kernel("c", T0_US + 190_000, 20_000),  # 10 ms in bin 2, 10 ms in bin 3
    ]
    gpu = kineto.parse(write_trace(tmp_path / "t.json", events)).frames["gpu"]
    # a 300 ms trace gets 1 ms bins, each sample stamped at its bin's start
    assert list(gpu["t_ns"] - T0_US * 1000) == [i * 1_000_000 for i in range(300)]
    busy_ms = set(np.flatnonzero(gpu["util_gpu_pct"].round(9) == 100.0))
    assert busy_ms == set(range(10, 60)) | set(range(190, 210))
    assert gpu["util_gpu_pct"].drop(list(busy_ms)).eq(0).all()


def test_gpu_memory_from_profile_memory_records(tmp_path):
    def memory(ts, reserved, device=0, device_type=1):
        return {"ph": "i", "cat": "cpu_instant_event", "s": "t", "name": "[memory]", "pid": 1,
                "tid": 1, "ts": ts, "args": {"Total Reserved": reserved, "Total Allocated": 1,
                "Device Type": device_type, "Device Id": device}}  # fmt: skip

    events = [
        ev("Trace", "PyTorch Profiler (0)", T0_US, 300_000, pid="Spans", tid="PyTorch Profiler"),
        kernel("a", T0_US + 10_000, 1_000),
        memory(T0_US + 20_000, 4 << 30),  # bin 1 peaks at 6 GiB, ends at 2 GiB
        memory(T0_US + 30_000, 6 << 30),
        memory(T0_US + 40_000, 2 << 30),
        memory(T0_US + 250_000, 3 << 30),  # bin 3: 2 GiB carried in, then 3 GiB
        memory(T0_US + 50_000, 9 << 30, device_type=0),  # host memory: not a GPU's
        memory(T0_US + 60_000, 1 << 30, device=1),  # a GPU with memory but no activity
    ]
    gpu = kineto.parse(write_trace(tmp_path / "m.json", events)).frames["gpu"]
    # 1 ms bins (a 300 ms trace): the peak reserved while each bin lasts, carried between records
    zero = gpu[gpu["gpu"] == 0].reset_index(drop=True)
    one = gpu[gpu["gpu"] == 1].reset_index(drop=True)
    assert len(zero) == len(one) == 300
    mem = zero["mem_used_bytes"]
    assert mem[:20].isna().all()  # before the first record
    assert [mem[25], mem[35], mem[45], mem[249], mem[260]] == [
        4 << 30, 6 << 30, 2 << 30, 2 << 30, 3 << 30,
    ]  # fmt: skip
    assert zero["util_gpu_pct"][10] == 100.0 and zero["util_gpu_pct"].drop(10).eq(0).all()
    assert one["mem_used_bytes"][:60].isna().all() and (one["mem_used_bytes"][60:] == 1 << 30).all()
    assert one["util_gpu_pct"].eq(0.0).all()  # activity was recorded: none on GPU 1


def test_real_torch_profiler_trace_on_cpu(tmp_path):
    """A trace torch.profiler writes here (CPU only): phases, DataLoader, steps, host."""
    torch = pytest.importorskip("torch")
    from torch.profiler import (
        ProfilerActivity,
        profile,
        record_function,
        schedule,
        tensorboard_trace_handler,
    )
    from torch.utils.data import DataLoader, TensorDataset

    loader = DataLoader(TensorDataset(torch.randn(64, 8)), batch_size=8)
    model = torch.nn.Linear(8, 8)
    optimizer = torch.optim.AdamW(model.parameters())
    with profile(
        activities=[ProfilerActivity.CPU],
        schedule=schedule(wait=1, warmup=1, active=4, repeat=1),
        profile_memory=True,
        on_trace_ready=tensorboard_trace_handler(str(tmp_path)),
    ) as prof:
        for (x,) in loader:
            with record_function("generate"):
                y = model(x)
            with record_function("compute_reward"):
                reward = y.sum()
            with record_function("update_actor"):
                reward.backward()
                optimizer.step()
                optimizer.zero_grad()
            prof.step()
    (path,) = tmp_path.glob("*.pt.trace.json")
    assert detect(path) is kineto
    imported = kineto.parse(path)
    assert imported.anchored and "gpu" not in imported.frames
    assert imported.meta["hosts"] == [path.name.rsplit("_", 1)[0]]
    spans = imported.frames["spans"]
    steps = sorted(spans.loc[spans["phase"] == "step", "step"])
    assert len(steps) == 4 and steps == list(range(steps[0], steps[0] + 4))
    for phase in ("rollout", "reward", "update_actor", "dataload"):
        mine = spans[spans["phase"] == phase]
        assert len(mine) >= 4, phase
        assert set(mine["step"].dropna()) <= set(steps)
    # the wall clock: within a minute of now
    import time

    assert abs(spans["start_ns"].min() - time.time_ns()) < 60e9


def test_host_from_handler_file_name(tmp_path):
    path = tmp_path / "node7_12345.1700000000000.pt.trace.json"
    imported = kineto.parse(write_trace(path, [kernel("k", T0_US, 1)]))
    assert imported.meta["hosts"] == ["node7"]
    assert set(imported.frames["gpu"]["host"]) == {"node7"}


def test_phase_names():
    assert kineto.phase_name("## forward ##") == "forward"
    assert kineto.phase_name("Optimizer.step#SGD.step") == "optimizer.step"
    for name, phase in [
        ("optimizer.step", "update_actor"),
        ("optimizer", "update_actor"),
        ("update_actor", "update_actor"),
        ("compute_reward", "reward"),
        ("data_load", "dataload"),
        ("rollout", "rollout"),
        ("generate", "rollout"),
    ]:
        assert canonical_phase(name) == phase


def test_sniff(tmp_path):
    trace = write_trace(tmp_path / "t.json", [kernel("k", T0_US, 1)])
    assert detect(trace) is kineto
    other = tmp_path / "other.json"
    other.write_text(json.dumps({"traceEvents": [{"ph": "X", "cat": "phase", "name": "x"}]}))
    assert not kineto.sniff(other.read_text(), other)


# --------------------------------------------------------------------------------------------
# Bad input: one line naming the file; fuzzed for anything else escaping


def assert_clean_error(path: Path, excinfo) -> None:
    message = str(excinfo.value)
    assert str(path) in message and "\n" not in message


@pytest.mark.parametrize(
    "content",
    [
        b"",
        b"not json at all",
        b'{"traceEvents": [',
        b"[1, 2, 3]",
        b'{"traceEvents": 5}',
        b'"just a string"',
        b"\x1f\x8b\x08\x00garbage",
    ],
)
def test_malformed_files(tmp_path, content):
    path = tmp_path / "bad.json"
    path.write_bytes(content)
    with pytest.raises(ImportFormatError) as excinfo:
        imported = kineto.parse(path)
        assert not imported.frames  # a list of numbers is a trace without events
        raise ImportFormatError(f"{path}: no events")
    assert_clean_error(path, excinfo)


def test_truncated_trace_names_the_line(tmp_path):
    events = [kernel("k", T0_US + i, 1) for i in range(50)]
    raw = json.dumps({"schemaVersion": 1, "traceEvents": events}, indent=1).encode()
    path = tmp_path / "cut.json"
    path.write_bytes(raw[: len(raw) // 2])
    with pytest.raises(ImportFormatError, match=r"cut\.json:\d+: truncated JSON") as excinfo:
        kineto.parse(path)
    assert_clean_error(path, excinfo)


def _valid_events() -> list[dict]:
    return [
        ev("user_annotation", "ProfilerStep#1", T0_US, 500),
        ev("user_annotation", "generate", T0_US + 10, 100),
        ev("cuda_runtime", "cudaLaunchKernel", T0_US + 20, 5, correlation=1),
        kernel("gemm", T0_US + 30, 50, correlation=1),
        kernel("ncclKernel_AllReduce", T0_US + 60, 50, correlation=2),
        kernel("Memcpy DtoH", T0_US + 120, 5, cat="gpu_memcpy", correlation=3),
        ev("user_annotation", "ProfilerStep#2", T0_US + 600, 100),
    ]


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=12),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=6), inner,
                                                                max_size=4),
    max_leaves=12,
)  # fmt: skip
field_values = st.one_of(
    json_values,
    st.sampled_from(["X", "i", "kernel", "gpu_memcpy", "cpu_op", "user_annotation",
                     "ProfilerStep#3", "Kernel", "nccl", "stream 7"]),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.floats(min_value=-1e20, max_value=1e20),
)  # fmt: skip
FUZZ = settings(
    max_examples=80,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)


def _parse_or_clean_error(path: Path) -> None:
    try:
        imported = kineto.parse(path)
    except ImportFormatError as exc:
        assert str(path) in str(exc) and "\n" not in str(exc)
        return
    assert isinstance(imported, Imported)
    temporal_breakdown(path)  # the breakdown reads the same trace without failing


@FUZZ
@given(doc=json_values)
def test_fuzz_any_json_document(tmp_path, doc):
    path = tmp_path / "fuzz.json"
    path.write_text(json.dumps(doc))
    _parse_or_clean_error(path)


@FUZZ
@given(
    edits=st.lists(
        st.tuples(st.integers(0, 6), st.sampled_from(
            ["ph", "cat", "name", "pid", "tid", "ts", "dur", "args", "args.device",
             "args.stream", "args.correlation", "drop", "replace"]), field_values),
        min_size=1, max_size=6),
    meta=st.dictionaries(
        st.sampled_from(["baseTimeNanoseconds", "distributedInfo", "deviceProperties",
                         "host_name", "displayTimeUnit"]), field_values, max_size=3),
)  # fmt: skip
def test_fuzz_mutated_trace(tmp_path, edits, meta):
    events = _valid_events()
    for index, key, value in edits:
        if not events:
            break
        at = index % len(events)
        event = events[at]
        if key == "drop":
            del events[at]
        elif key == "replace":
            events[at] = value
        elif not isinstance(event, dict):
            continue
        elif key.startswith("args."):
            if isinstance(event.get("args"), dict):
                event["args"][key[5:]] = value
        else:
            event[key] = value
    path = write_trace(tmp_path / "mut.json", events, **meta)
    _parse_or_clean_error(path)


@FUZZ
@given(cut=st.floats(0, 1), gz=st.booleans())
def test_fuzz_truncated_file(tmp_path, cut, gz):
    raw = json.dumps({"schemaVersion": 1, "traceEvents": _valid_events()}).encode()
    if gz:
        raw = gzip.compress(raw)
    path = tmp_path / ("t.json.gz" if gz else "t.json")
    path.write_bytes(raw[: int(len(raw) * cut)])
    _parse_or_clean_error(path)
