"""Loading long runs at a bounded size: merged samples keep per-phase GPU-time and findings."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from lazy_rfc3987 import defer_here

from gpuprof import store
from gpuprof.analyzers import resample
from gpuprof.analyzers.breakdown import phase_breakdown
from gpuprof.analyzers.diagnose import diagnose
from gpuprof.loader import load_for_analysis
from gpuprof.sim import Pathology, SimConfig, simulate


def _gpu_frame(t_ns: np.ndarray, util: np.ndarray, mem: np.ndarray | None = None) -> pd.DataFrame:
    n = len(t_ns)
    return pd.DataFrame(
        {
            "host": ["h"] * n,
            "gpu": np.zeros(n, np.int64),
            "uuid": ["GPU-x"] * n,
            "t_ns": t_ns.astype(np.int64),
            "util_gpu_pct": util,
            "mem_used_bytes": mem if mem is not None else np.full(n, np.nan),
            "clock_event_reasons": np.where(np.arange(n) % 7 == 3, 4.0, 0.0),
        }
    )


@settings(max_examples=60, deadline=None)
@given(
    n=st.integers(2, 400),
    factor=st.integers(2, 40),
    cuts=st.lists(st.integers(0, 40_000_000_000), max_size=12),
    seed=st.integers(0, 10_000),
)
def test_merged_samples_keep_busy_time_within_every_span_segment(n, factor, cuts, seed):
    rng = np.random.default_rng(seed)
    t = np.cumsum(rng.integers(90_000_000, 110_000_000, n))
    util = rng.uniform(0, 100, n)  # (a NaN reading takes its bucket's mean: not tested here)
    bounds = np.unique(np.array(cuts, dtype=np.int64))
    frame = _gpu_frame(t, util, rng.uniform(1e9, 8e10, n))
    out = resample.reduce_gpu(frame, bounds, factor)

    assert len(out) <= n / factor + len(bounds) + 1  # ceil(L/f) per segment, bounds+1 segments
    assert out["t_ns"].is_monotonic_increasing and out["t_ns"].iloc[0] == t[0]
    # no merged sample straddles a boundary: its inputs all share one segment
    seg_in = np.searchsorted(bounds, t, side="right")
    owner = np.searchsorted(out["t_ns"].to_numpy(), t, side="right") - 1
    for k in np.unique(owner):
        assert len(set(seg_in[owner == k])) == 1
    # busy GPU-seconds per segment are preserved (sample i stands for [t_i, t_i+1))
    dt_in = np.diff(t) / 1e9
    dt_out = np.diff(out["t_ns"].to_numpy()) / 1e9
    u_out = out["util_gpu_pct"].to_numpy()[:-1] / 100
    # the last output row absorbs the last input's interval: compare all but the final row
    last_start = out["t_ns"].iloc[-1]
    busy_in = np.sum(((util / 100)[:-1] * dt_in)[t[:-1] < last_start])
    assert np.sum(u_out * dt_out) == pytest.approx(busy_in, rel=1e-9, abs=1e-9)
    # peaks and flags survive merging
    assert np.nanmax(out["mem_used_bytes"]) == pytest.approx(np.nanmax(frame["mem_used_bytes"]))
    flagged = (frame["clock_event_reasons"] > 0).to_numpy()
    assert (out["clock_event_reasons"] > 0).sum() == len(np.unique(owner[flagged]))


def test_a_sampling_gap_is_never_merged_over():
    t = np.r_[np.arange(10) * 100_000_000, 60_000_000_000 + np.arange(10) * 100_000_000]
    out = resample.reduce_gpu(_gpu_frame(t, np.full(20, 50.0)), None, 50)
    assert out["t_ns"].tolist() == [0, 60_000_000_000]


def test_host_and_process_samples_merge_by_time_bucket():
    t = np.arange(0, 10_000_000_000, 500_000_000)  # 20 samples at 2 Hz
    procs = pd.DataFrame(
        {"host": "h", "t_ns": np.r_[t, t], "pid": np.r_[np.ones(20), np.full(20, 2)].astype(int),
         "ppid": 1, "role": "trainer", "name": "python", "cpu_pct": np.r_[np.full(20, 100.0),
         np.arange(20.0)], "rss_bytes": np.r_[np.arange(20.0), np.zeros(20)],
         "io_read_bytes_s": 0.0, "io_write_bytes_s": 0.0, "num_threads": 4}
    )  # fmt: skip
    out = resample.reduce_table("procs", procs, 2_000_000_000)
    assert len(out) == 10 and list(out.columns) == list(procs.columns)
    one = out[out["pid"] == 1].sort_values("t_ns")
    assert one["cpu_pct"].tolist() == [100.0] * 5 and one["rss_bytes"].max() == 19.0
    two = out[out["pid"] == 2].sort_values("t_ns")
    assert two["cpu_pct"].tolist() == [1.5, 5.5, 9.5, 13.5, 17.5]
    assert resample.reduce_table("spans", procs, 1).equals(procs)  # other tables untouched


@pytest.fixture(scope="module")
def long_run(tmp_path_factory):
    cfg = SimConfig(
        gpus=16, steps=12, seed=3,
        pathologies=[Pathology("reward_bound", 0.6), Pathology("reshard_idle", 0.5)],
    )  # fmt: skip
    run_dir = tmp_path_factory.mktemp("long") / "run"
    store.save_run(simulate(cfg).run, run_dir)
    return run_dir


def test_a_long_run_is_analysed_at_bounded_size_with_the_same_verdict(long_run):
    full = load_for_analysis(long_run, None)
    small = load_for_analysis(long_run, len(full.gpu) // 12)
    assert len(small.gpu) < len(full.gpu) / 5
    assert len(small.procs) == len(full.procs)  # within its own budget: as recorded
    assert "merged within each phase" in small.meta.notices[-1]

    by_full = phase_breakdown(full, by=("phase",)).set_index("phase")
    by_small = phase_breakdown(small, by=("phase",)).set_index("phase")
    total = by_full["gpu_s"].sum()
    for phase in by_full.index:  # idle GPU-seconds per phase within 0.5% of the run's GPU-time
        assert abs(by_full.at[phase, "idle_gpu_s"] - by_small.at[phase, "idle_gpu_s"]) < (
            0.005 * total
        ), phase

    d_full, d_small = diagnose(full), diagnose(small)
    assert [f.kind for f in d_small.findings] == [f.kind for f in d_full.findings]
    for a, b in zip(d_full.findings, d_small.findings):
        assert b.share == pytest.approx(a.share, abs=0.01)
    assert [r.knob for r in d_small.recommendations] == [r.knob for r in d_full.recommendations]


def test_a_small_run_loads_exactly_as_recorded(long_run):
    run = load_for_analysis(long_run)
    assert len(run.gpu) == store.count_rows(long_run, "gpu")
    assert not any("merged" in n for n in run.meta.notices)


def test_process_samples_beyond_their_budget_merge_into_buckets(long_run, monkeypatch):
    from gpuprof import loader

    full = store.load_run(long_run)
    monkeypatch.setitem(loader.MAX_HOST_ROWS, "procs", len(full.procs) // 8)
    run = load_for_analysis(long_run)
    assert len(run.gpu) == len(full.gpu)  # GPU samples are within their budget
    assert len(run.procs) <= len(full.procs) / 6
    assert any("procs samples merged into" in n for n in run.meta.notices)
    # CPU seconds are kept: mean CPU per process over the run barely moves
    before = full.procs.groupby("pid")["cpu_pct"].mean()
    after = run.procs.groupby("pid")["cpu_pct"].mean()
    assert np.allclose(before.sort_index(), after.sort_index(), rtol=0.05, atol=1.0)


def test_merged_samples_of_a_node_are_put_on_the_runs_clock(tmp_path):
    # a node whose clock the driver measured 300 ms off: its GPU samples are shifted onto
    # the run's clock whether they are loaded as recorded or merged for a long run
    import json
    import sqlite3

    cfg = SimConfig(gpus=16, steps=4, seed=5)
    run = simulate(cfg).run
    hosts = sorted(run.gpu["host"].unique())
    assert len(hosts) == 2
    run_dir = tmp_path / "run"
    store.save_run(run, run_dir)
    node = hosts[1]
    clock = {"node": node, "offset_ns": 300_000_000, "error_ns": 1_000, "method": "ray-rtt",
             "reference": hosts[0]}  # fmt: skip
    conn = sqlite3.connect(store.host_file(run_dir, node))
    with conn:
        conn.execute("INSERT OR REPLACE INTO meta (key, value) VALUES ('clock', ?)",
                     (json.dumps(clock),))  # fmt: skip
    conn.close()
    full = load_for_analysis(run_dir, None)
    merged = load_for_analysis(run_dir, merge=4)
    assert full.meta.clocks[node]["offset_ns"] == 300_000_000
    recorded = run.gpu[run.gpu["host"] == node]["t_ns"]
    shifted = full.gpu[full.gpu["host"] == node]["t_ns"]
    assert shifted.min() == recorded.min() + 300_000_000
    mine = merged.gpu[merged.gpu["host"] == node]["t_ns"]
    assert len(mine) < len(shifted) / 2
    assert mine.min() == shifted.min() and set(mine) <= set(shifted)
    other = merged.gpu[merged.gpu["host"] == hosts[0]]["t_ns"]
    assert other.min() == run.gpu[run.gpu["host"] == hosts[0]]["t_ns"].min()


def test_a_long_run_read_on_several_processes_is_the_same_row_for_row(long_run, monkeypatch):
    # the partitions (files, then GPUs round-robin) read by forked workers and put back in
    # order: every table and the diagnosis identical to one process reading it all
    import pandas.testing as pdt

    from gpuprof import loader

    full = store.load_run(long_run)
    monkeypatch.setitem(loader.MAX_HOST_ROWS, "procs", len(full.procs) // 8)
    budget = len(full.gpu) // 12
    one = load_for_analysis(long_run, budget, workers=1)
    three = load_for_analysis(long_run, budget, workers=3)
    assert len(one.gpu) < len(full.gpu) / 5 and len(one.procs) < len(full.procs) / 4
    for table in ("gpu", "host", "procs", "gpu_procs", "spans", "events"):
        pdt.assert_frame_equal(getattr(one, table), getattr(three, table))
    assert one.meta.to_dict() == three.meta.to_dict()
    assert diagnose(one).to_dict() == diagnose(three).to_dict()


def test_the_gpu_parts_cover_the_stream_once_in_its_order(long_run):
    whole = [frame for frame in store.iter_gpu_samples(long_run)]
    parts = [item for part in range(3) for item in store.iter_gpu_parts(long_run, False, part, 3)]
    assert len(parts) == len(whole) == 16
    ordered = [frame for _, frame in sorted(parts, key=lambda item: item[0])]
    for a, b in zip(whole, ordered):
        pd.testing.assert_frame_equal(a, b)
    sizes = [sum(1 for _ in store.iter_gpu_parts(long_run, False, k, 3)) for k in range(3)]
    assert sorted(sizes) == [5, 5, 6]  # round-robin over the GPUs


def test_a_long_run_read_by_ray_tasks_is_the_same_row_for_row(long_run, monkeypatch, tmp_path):
    # `--ray`: the same partitions as tasks of a Ray cluster (here a local Ray of its own)
    defer_here(tmp_path, monkeypatch)  # Ray's processes start seconds sooner
    ray = pytest.importorskip("ray")
    import pandas.testing as pdt

    monkeypatch.setenv("RAY_USAGE_STATS_ENABLED", "0")
    budget = len(store.load_run(long_run).gpu) // 12
    one = load_for_analysis(long_run, budget, workers=1)
    tasks = load_for_analysis(long_run, budget, ray="local")
    assert not ray.is_initialized()  # the Ray it started is shut down
    for table in ("gpu", "host", "procs", "gpu_procs", "spans", "events"):
        pdt.assert_frame_equal(getattr(one, table), getattr(tasks, table))
    assert one.meta.to_dict() == tasks.meta.to_dict()


def test_ray_that_cannot_be_used_is_one_line(long_run):
    pytest.importorskip("ray")
    from gpuprof.errors import RunError

    with pytest.raises(RunError, match=r"^--ray 127\.0\.0\.1:1: cannot use the Ray cluster"):
        load_for_analysis(long_run, 1000, ray="127.0.0.1:1")
