"""Alignment of GPU samples with phases: owners, innermost spans, GPU-second budgets."""

from __future__ import annotations

import dataclasses
import math
import time

import numpy as np
import pandas as pd
import pytest

from gpuprof.analyzers.breakdown import phase_breakdown, run_totals
from gpuprof.analyzers.labelling import gpu_phase_samples
from gpuprof.analyzers.ownership import gpu_owner
from gpuprof.analyzers.spans import NO_PHASE
from gpuprof.model import Event, GpuProcSample, GpuSample, ProcSample, Run, RunMeta, Span
from gpuprof.store import load_run, save_run

S = 1_000_000_000  # ns per second
T0 = 1_700_000_000 * S  # an epoch-sized origin: catches float64 precision loss


def frame(records: list) -> pd.DataFrame:
    return pd.DataFrame([dataclasses.asdict(r) for r in records])


def samples(host: str, gpu: int, utils: list[float | None], every_s: float = 1.0, **kw) -> list:
    return [
        GpuSample(host, gpu, f"GPU-{host}-{gpu}", T0 + int(i * every_s * S), util_gpu_pct=u, **kw)
        for i, u in enumerate(utils)
    ]


def span(phase: str, start_s: float, end_s: float, *, host="h", pid=100, tid=1, rank=None,
         local_rank=None, step=None) -> Span:  # fmt: skip
    return Span(host, pid, tid, rank, local_rank, phase, phase, step, 0,
                T0 + int(start_s * S), T0 + int(end_s * S))  # fmt: skip


def process_event(pid: int, *, host="h", rank=None, local_rank=None, cvd=None, ppid=1) -> Event:
    attrs = {"local_rank": local_rank, "cuda_visible_devices": cvd, "ppid": ppid}
    return Event(host, pid, rank, T0, "process", "start", attrs)


def make_run(gpu=(), spans=(), events=(), gpu_procs=(), procs=(), gpus_meta=None) -> Run:
    run = Run(meta=RunMeta(run_id="t", gpus=gpus_meta or []))
    if gpu:
        run.gpu = frame(list(gpu))
    if spans:
        run.spans = frame(list(spans))
    if events:
        run.events = frame(list(events))
    if gpu_procs:
        run.gpu_procs = frame(list(gpu_procs))
    if procs:
        run.procs = frame(list(procs))
    return run


def owners_of(run: Run) -> dict[tuple[str, int], tuple[float, str]]:
    o = gpu_owner(run)
    return {(h, g): (p, how) for h, g, p, how in zip(o.host, o.gpu, o.pid, o["how"])}


# -- innermost phase ---------------------------------------------------------------------------


def test_nested_spans_pick_the_innermost_and_step_only_fills_gaps():
    run = make_run(
        gpu=samples("h", 0, [50.0] * 12),
        spans=[
            span("step", 0, 10, step=1),
            span("rollout", 1, 6, step=1),
            span("reward", 3, 4, step=1),  # nested inside rollout
            span("update_actor", 7, 9, step=1),
        ],
    )
    s = gpu_phase_samples(run)
    assert list(s["phase"]) == [
        "step", "rollout", "rollout", "reward", "rollout", "rollout", "step",
        "update_actor", "update_actor", "step", NO_PHASE, NO_PHASE,
    ]  # fmt: skip
    assert list(s["step"].iloc[:10]) == [1.0] * 10
    assert s["step"].iloc[10:].isna().all()
    assert list(s["in_span"]) == [True] * 10 + [False] * 2


def test_step_number_comes_from_the_enclosing_step_span():
    run = make_run(
        gpu=samples("h", 0, [10.0] * 4),
        spans=[span("step", 0, 4, step=7), span("rollout", 1, 3)],  # rollout has no step
    )
    s = gpu_phase_samples(run)
    assert list(s["phase"]) == ["step", "rollout", "rollout", "step"]
    assert list(s["step"]) == [7.0] * 4


def test_overlapping_spans_of_two_threads_deepest_wins_and_coverage_is_kept():
    run = make_run(
        gpu=samples("h", 0, [0.0] * 10),
        spans=[
            span("rollout", 0, 8, tid=1),
            span("reward", 2, 4, tid=2),
            span("dataload", 3, 5, tid=2),  # overlaps reward on the same thread: bad nesting
            span("checkpoint", 1, 9, tid=3),
            span("eval", 2, 3, tid=3),  # depth 1 on thread 3
        ],
    )
    s = gpu_phase_samples(run)
    phases = list(s["phase"])
    assert phases[2] == "eval"  # the only depth-1 span at t=2 s
    assert phases[3] == "dataload"  # depth 1 (opened inside reward), latest start
    assert phases[4] == "dataload"
    assert phases[0] == "rollout"
    assert phases[1] in ("rollout", "checkpoint")  # both depth 0: either is a valid cover
    assert phases[8] == "checkpoint"  # rollout ended at 8: the longer-reaching span covers
    assert phases[9] == NO_PHASE


# -- owners --------------------------------------------------------------------------------------


def test_owner_rule_a_nvml_process_list_beats_local_rank():
    gpu = samples("h", 0, [1.0]) + samples("h", 1, [1.0])
    spans = [span("rollout", 0, 1, pid=10, rank=0, local_rank=0),
             span("rollout", 0, 1, pid=11, rank=1, local_rank=1)]  # fmt: skip
    gpu_procs = [
        GpuProcSample("h", T0, 1, 10, gpu_mem_bytes=40 << 30),  # rank 0 actually runs on GPU 1
        GpuProcSample("h", T0, 0, 11, gpu_mem_bytes=40 << 30),
        GpuProcSample("h", T0, 0, 10, gpu_mem_bytes=300 << 20),  # stray context on GPU 0
        GpuProcSample("h", T0, 1, 11, gpu_mem_bytes=0),  # listed without memory: ignored
    ]
    owners = owners_of(make_run(gpu=gpu, spans=spans, gpu_procs=gpu_procs))
    assert owners == {("h", 0): (11.0, "nvml"), ("h", 1): (10.0, "nvml")}


def test_owner_rule_a_follows_a_child_process_to_its_recording_parent():
    gpu = samples("h", 0, [1.0])
    spans = [span("rollout", 0, 1, pid=10)]
    gpu_procs = [GpuProcSample("h", T0, 0, 55, gpu_mem_bytes=1 << 30)]
    procs = [ProcSample("h", T0, 55, 54, "inference", "vllm"),
             ProcSample("h", T0, 54, 10, "other", "sh")]  # fmt: skip
    run = make_run(gpu=gpu, spans=spans, gpu_procs=gpu_procs, procs=procs)
    assert owners_of(run) == {("h", 0): (10.0, "nvml_ancestor")}


def test_owner_rule_b_local_rank_honours_cuda_visible_devices():
    gpu = [s for g in range(8) for s in samples("h", g, [1.0])]
    spans = [span("rollout", 0, 1, pid=20, rank=0), span("rollout", 0, 1, pid=21, rank=1)]
    events = [
        process_event(20, rank=0, local_rank=0, cvd="4,5,6,7"),
        process_event(21, rank=1, local_rank=1, cvd="4,5,6,7"),
    ]
    owners = owners_of(make_run(gpu=gpu, spans=spans, events=events))
    assert owners[("h", 4)] == (20.0, "local_rank")
    assert owners[("h", 5)] == (21.0, "local_rank")
    assert all(math.isnan(owners[("h", g)][0]) for g in (0, 1, 2, 3, 6, 7))
    assert owners[("h", 0)][1] == "none"


def test_owner_rule_b_accepts_uuids_in_cuda_visible_devices():
    gpu = [s for g in range(4) for s in samples("h", g, [1.0])]
    spans = [span("rollout", 0, 1, pid=20, rank=0, local_rank=0)]
    spans += [span("rollout", 0, 1, pid=21, rank=1, local_rank=0)]
    events = [process_event(20, rank=0, local_rank=0, cvd="GPU-h-3"),
              process_event(21, rank=1, local_rank=0, cvd="2")]  # fmt: skip
    owners = owners_of(make_run(gpu=gpu, spans=spans, events=events))
    assert owners[("h", 3)] == (20.0, "local_rank")
    assert owners[("h", 2)] == (21.0, "local_rank")


def test_owner_rule_c_rank_order_on_each_host():
    gpu = [s for h in ("a", "b") for g in range(2) for s in samples(h, g, [1.0])]
    spans = [span("rollout", 0, 1, host=h, pid=p, rank=r)
             for h, p, r in (("a", 5, 1), ("a", 6, 0), ("b", 7, 3), ("b", 8, 2))]  # fmt: skip
    owners = owners_of(make_run(gpu=gpu, spans=spans))
    assert owners == {
        ("a", 0): (6.0, "rank_order"), ("a", 1): (5.0, "rank_order"),
        ("b", 0): (8.0, "rank_order"), ("b", 1): (7.0, "rank_order"),
    }  # fmt: skip


def test_owner_rule_d_single_controller_drives_every_gpu_of_its_host():
    gpu = [s for g in range(4) for s in samples("h", g, [1.0])]
    spans = [span("rollout", 0, 10, pid=1), span("reward", 0, 1, pid=2)]  # both rank-less
    owners = owners_of(make_run(gpu=gpu, spans=spans))
    assert set(owners.values()) == {(1.0, "single_controller")}  # the longer-spanning one


def test_owner_rule_d_remote_controller_when_no_host_matches():
    gpu = samples("node1", 0, [1.0]) + samples("node1", 1, [1.0])
    spans = [span("rollout", 0, 1, host="head", pid=9)]
    o = gpu_owner(make_run(gpu=gpu, spans=spans))
    assert list(o["how"]) == ["single_controller_remote"] * 2
    assert list(o["owner_host"]) == ["head", "head"]
    s = gpu_phase_samples(make_run(gpu=gpu, spans=spans))
    assert list(s["phase"]) == ["rollout", "rollout"]


def test_gpus_listed_only_in_metadata_are_in_the_owner_table():
    run = make_run(gpus_meta=[{"host": "h", "index": 0, "uuid": "GPU-x"}])
    o = gpu_owner(run)
    assert list(o["how"]) == ["none"] and o["uuid"].iloc[0] == "GPU-x"


# -- two ranks, budgets --------------------------------------------------------------------------


def two_rank_run() -> Run:
    gpu = samples("h", 0, [100, 100, 0, 0, 50, 50]) + samples("h", 1, [0, 0, 100, 100, 50, 50])
    spans = [
        span("rollout", 0, 2, pid=10, rank=0, local_rank=0, step=0),
        span("reward", 2, 4, pid=10, rank=0, local_rank=0, step=0),
        span("update_actor", 0, 2, pid=11, rank=1, local_rank=1, step=0),
        span("rollout", 2, 4, pid=11, rank=1, local_rank=1, step=0),
    ]  # t=4,5 s: outside every span
    return make_run(gpu=gpu, spans=spans)


def test_two_ranks_on_two_gpus_get_their_own_phases():
    s = gpu_phase_samples(two_rank_run())
    g0, g1 = s[s.gpu == 0], s[s.gpu == 1]
    assert list(g0["phase"]) == ["rollout"] * 2 + ["reward"] * 2 + [NO_PHASE] * 2
    assert list(g1["phase"]) == ["update_actor"] * 2 + ["rollout"] * 2 + [NO_PHASE] * 2
    assert list(g0["rank"].unique()) == [0.0] and list(g1["rank"].unique()) == [1.0]
    assert (s["dt_s"] == 1.0).all()  # last sample: the median interval


def test_busy_and_idle_gpu_seconds_match_hand_computation():
    run = two_rank_run()
    totals = run_totals(run)
    assert totals["gpu_s"] == pytest.approx(12.0)
    assert totals["busy_gpu_s"] == pytest.approx(1 + 1 + 0.5 + 0.5 + 1 + 1 + 0.5 + 0.5)
    assert totals["idle_gpu_s"] == pytest.approx(6.0)
    assert totals["idle_outside_spans_gpu_s"] == pytest.approx(2.0)  # 4 samples × 50 % idle
    assert totals["idle_in_spans_gpu_s"] == pytest.approx(4.0)
    assert totals["util_gpu_pct"] == pytest.approx(50.0)
    assert totals["busy_measure"] == "util_gpu_pct" and totals["sm_active_pct"] is None
    assert totals["owners"] == {"local_rank": 2} and totals["spans_dropped"] == 0

    table = phase_breakdown(run).set_index("phase")
    assert list(table.index) == ["rollout", "reward", "update_actor", NO_PHASE]
    assert table.loc["rollout", "gpu_s"] == pytest.approx(4.0)
    assert table.loc["rollout", "busy_gpu_s"] == pytest.approx(4.0)
    assert table.loc["rollout", "wall_s"] == pytest.approx(2.0)  # per rank
    assert table.loc["rollout", "ranks"] == 2
    assert table.loc["reward", "idle_gpu_s"] == pytest.approx(2.0)
    assert table.loc["reward", "util_gpu_pct"] == pytest.approx(0.0)
    assert table.loc[NO_PHASE, "wall_s"] == pytest.approx(2.0)
    assert table.loc[NO_PHASE, "ranks"] == 2
    assert table["share"].sum() == pytest.approx(1.0)

    per_gpu = phase_breakdown(run, by=("phase", "host", "gpu"))
    row = per_gpu[(per_gpu.phase == "rollout") & (per_gpu.gpu == 1)].iloc[0]
    assert row["busy_gpu_s"] == pytest.approx(2.0) and row["wall_s"] == pytest.approx(2.0)
    per_step = phase_breakdown(run, by=("phase", "step"))
    assert per_step[per_step.phase == "rollout"]["step"].tolist() == [0.0]
    assert per_step[per_step.phase == NO_PHASE]["step"].isna().all()


def test_breakdown_time_weights_and_link_bytes():
    gpu = [
        GpuSample("h", 0, "u", T0, util_gpu_pct=100, sm_active_pct=40, pcie_tx_bytes_s=1e9,
                  mem_used_bytes=5),
        GpuSample("h", 0, "u", T0 + 3 * S, util_gpu_pct=0, sm_active_pct=None,
                  pcie_tx_bytes_s=2e9, pcie_rx_bytes_s=1e9, mem_used_bytes=7),
        GpuSample("h", 0, "u", T0 + 4 * S, util_gpu_pct=None, mem_used_bytes=6),
    ]  # fmt: skip
    run = make_run(gpu=gpu, spans=[span("reshard", 0, 10)])
    row = phase_breakdown(run).iloc[0]
    # dt: 3 s, 1 s, and the last sample gets the median of (3, 1) = 2 s
    assert row["gpu_s"] == pytest.approx(6.0)
    assert row["util_gpu_pct"] == pytest.approx(75.0)  # (100·3 + 0·1) / 4
    assert row["unknown_gpu_s"] == pytest.approx(2.0)
    assert row["sm_active_pct"] == pytest.approx(40.0)
    assert row["mem_peak_bytes"] == 7
    assert row["pcie_bytes"] == pytest.approx(1e9 * 3 + 3e9 * 1)
    assert math.isnan(row["nvlink_bytes"])
    assert row["wall_s"] == pytest.approx(10.0)
    totals = run_totals(run)
    assert totals["sm_active_pct"] == pytest.approx(40.0)
    assert totals["sm_busy_gpu_s"] == pytest.approx(1.2)
    assert totals["sm_active_coverage"] == pytest.approx(0.5)


def test_controller_wall_time_counts_once_for_all_its_gpus():
    gpu = [s for g in range(4) for s in samples("h", g, [100.0] * 4)]
    run = make_run(gpu=gpu, spans=[span("rollout", 0, 3)])
    table = phase_breakdown(run).set_index("phase")
    assert table.loc["rollout", "wall_s"] == pytest.approx(3.0)
    assert table.loc["rollout", "gpu_s"] == pytest.approx(12.0)
    assert table.loc["rollout", "ranks"] == 1 and table.loc["rollout", "gpus"] == 4


# -- robustness ----------------------------------------------------------------------------------


def test_empty_run_never_raises():
    run = Run(meta=RunMeta(run_id="empty"))
    assert gpu_owner(run).empty
    assert gpu_phase_samples(run).empty
    assert phase_breakdown(run).empty
    assert list(phase_breakdown(run, by=("phase", "gpu")).columns[:2]) == ["phase", "gpu"]
    totals = run_totals(run)
    assert totals["gpu_s"] == 0.0 and totals["util_gpu_pct"] is None


def test_spans_without_gpu_samples_and_samples_without_spans():
    only_spans = make_run(spans=[span("rollout", 0, 1)])
    assert gpu_phase_samples(only_spans).empty and run_totals(only_spans)["gpus"] == 0
    only_gpu = make_run(gpu=samples("h", 0, [20.0, 40.0]))
    s = gpu_phase_samples(only_gpu)
    assert list(s["phase"]) == [NO_PHASE] * 2 and s["rank"].isna().all()
    assert run_totals(only_gpu)["idle_outside_spans_gpu_s"] == pytest.approx(1.4)


def test_bad_spans_are_dropped_and_counted_nan_metrics_stay_nan():
    spans = [span("rollout", 0, 5), span("reward", 3, 1)]  # reward ends before it starts
    run = make_run(gpu=samples("h", 0, [None, 50.0, float("nan"), 10.0]), spans=spans)
    s = gpu_phase_samples(run)
    assert s.attrs["spans_dropped"] == 1
    assert list(s["phase"]) == ["rollout"] * 4
    assert s["busy_frac"].isna().sum() == 2
    totals = run_totals(run)
    assert totals["spans_dropped"] == 1
    assert totals["unknown_gpu_s"] == pytest.approx(2.0)
    assert totals["busy_gpu_s"] == pytest.approx(0.6)
    assert totals["util_gpu_pct"] == pytest.approx(30.0)
    all_nan = make_run(gpu=samples("h", 0, [None, None]))
    assert run_totals(all_nan)["busy_gpu_s"] is None


def test_unowned_gpu_gets_no_phase():
    gpu = samples("h", 0, [10.0]) + samples("h", 1, [10.0])
    spans = [span("rollout", 0, 1, pid=10, rank=0, local_rank=0),
             span("rollout", 0, 1, pid=11, rank=1, local_rank=0)]  # fmt: skip
    # both claim GPU 0 through local_rank; rank order hands GPU 1 to the second
    run = make_run(gpu=gpu, spans=spans, events=[process_event(11, rank=1, cvd="")])
    owners = owners_of(run)
    assert owners[("h", 0)] == (10.0, "local_rank")
    assert owners[("h", 1)] == (11.0, "rank_order")
    lone = make_run(gpu=gpu, spans=[span("rollout", 0, 1, pid=10, rank=0, local_rank=0),
                                    span("rollout", 0, 1, pid=12, rank=1, local_rank=0)],
                    gpus_meta=[{"host": "h", "index": 2}])  # fmt: skip
    s = gpu_phase_samples(lone)
    assert set(s["phase"]) == {"rollout"}
    o = gpu_owner(lone)
    assert o.set_index("gpu").loc[2, "how"] == "none"


def test_bad_by_key_is_a_programming_error():
    with pytest.raises(ValueError):
        phase_breakdown(two_rank_run(), by=("colour",))


def test_store_round_trip_gives_the_same_alignment(tmp_path):
    run = two_rank_run()
    save_run(run, tmp_path / "run")
    loaded = load_run(tmp_path / "run")
    a = gpu_phase_samples(run)
    b = gpu_phase_samples(loaded)
    assert list(a["phase"]) == list(b["phase"])
    assert run_totals(loaded)["busy_gpu_s"] == pytest.approx(run_totals(run)["busy_gpu_s"])


# -- scale ---------------------------------------------------------------------------------------


def test_scale_8_gpus_one_hour_at_10_hz():
    n_gpu, hz, seconds = 8, 10, 3600
    n = seconds * hz
    t = T0 + np.arange(n, dtype=np.int64) * (S // hz)
    rng = np.random.default_rng(0)
    gpu = pd.DataFrame(
        {
            "host": "h",
            "gpu": np.repeat(np.arange(n_gpu), n),
            "uuid": None,
            "t_ns": np.tile(t, n_gpu),
            "util_gpu_pct": rng.uniform(0, 100, n * n_gpu),
            "mem_used_bytes": rng.integers(0, 80 << 30, n * n_gpu).astype(float),
            "pcie_tx_bytes_s": rng.uniform(0, 1e9, n * n_gpu),
        }
    )
    rows = []
    phases = ["rollout", "reward", "old_logprob", "update_actor"]
    step_s = 40  # 90 steps × 8 ranks × (1 step + 4 phases) ≈ 3 600 spans
    for rank in range(n_gpu):
        for k in range(seconds // step_s):
            base = k * step_s
            rows.append(span("step", base, base + step_s - 1, pid=1000 + rank, rank=rank,
                             local_rank=rank, step=k))  # fmt: skip
            for j, ph in enumerate(phases):
                rows.append(span(ph, base + j * 9, base + j * 9 + 8, pid=1000 + rank,
                                 rank=rank, local_rank=rank, step=k))  # fmt: skip
    run = Run(meta=RunMeta(run_id="scale"), gpu=gpu, spans=frame(rows))
    start = time.perf_counter()
    s = gpu_phase_samples(run)
    table = phase_breakdown(run, samples=s)
    totals = run_totals(run, samples=s)
    elapsed = time.perf_counter() - start
    print(f"\nalign {len(s)} samples × {len(rows)} spans: {elapsed:.2f} s")
    assert len(s) == n * n_gpu
    assert totals["gpu_s"] == pytest.approx(n_gpu * seconds, rel=1e-6)
    assert table.set_index("phase").loc["rollout", "wall_s"] == pytest.approx(90 * 8)
    assert elapsed < 10.0


@pytest.mark.parametrize(
    "by",
    [
        ("phase",),
        ("step",),
        ("rank",),
        ("pid",),
        ("host", "gpu"),
        ("phase", "step"),
        ("phase", "host", "gpu"),
        ("phase", "rank", "step"),
    ],
)
def test_every_grouping_works_with_unowned_gpus_and_nan_metrics(by):
    run = two_rank_run()
    run.gpu = pd.concat([run.gpu, frame(samples("h", 7, [None, None]))], ignore_index=True)
    table = phase_breakdown(run, by=by)
    assert list(table.columns[: len(by)]) == list(by)
    assert table["gpu_s"].sum() == pytest.approx(14.0)
    assert table["samples"].sum() == 14
    if "gpu" in by:
        unowned = table[table["gpu"] == 7].iloc[0]
        assert unowned["ranks"] == 0 and math.isnan(unowned["busy_gpu_s"])
        assert unowned["unknown_gpu_s"] == pytest.approx(2.0)


def test_lone_sample_uses_the_run_interval():
    run = make_run(gpu=samples("h", 0, [40.0]))
    run.meta.interval_s = 0.5
    s = gpu_phase_samples(run)
    assert list(s["dt_s"]) == [0.5]
    assert run_totals(run)["busy_gpu_s"] == pytest.approx(0.2)


def test_thousands_of_overlapping_async_spans_on_one_thread_stay_fast():
    # an event loop with 2 000 generate requests in flight: depths up to ~2 000
    n = 2000
    spans = [span("rollout", i * 0.01, 30 + i * 0.01, tid=1) for i in range(n)]
    run = make_run(gpu=samples("h", 0, [90.0] * 400, every_s=0.1), spans=spans)
    start = time.perf_counter()
    s = gpu_phase_samples(run)
    elapsed = time.perf_counter() - start
    assert set(s["phase"]) == {"rollout"}
    assert elapsed < 5.0


def test_controllers_are_told_apart_by_host_when_pids_collide():
    gpu = samples("a", 0, [1.0]) + samples("b", 0, [1.0]) + samples("c", 0, [1.0])
    spans = [span("rollout", 0, 5, host="a", pid=1), span("reward", 0, 1, host="b", pid=1)]
    o = gpu_owner(make_run(gpu=gpu, spans=spans)).set_index("host")
    assert o.loc["a", "how"] == "single_controller" and o.loc["b", "owner_host"] == "b"
    assert o.loc["c", "how"] == "single_controller_remote" and o.loc["c", "owner_host"] == "a"


def test_a_span_ending_nanoseconds_before_its_start_is_dropped():
    bad = span("reward", 3, 3)
    bad.end_ns = bad.start_ns - 50  # 50 ns: invisible to float64 at epoch magnitudes
    run = make_run(gpu=samples("h", 0, [50.0, 50.0]), spans=[span("rollout", 0, 1), bad])
    assert gpu_phase_samples(run).attrs["spans_dropped"] == 1
