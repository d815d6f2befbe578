"""The kept form of a long run made file by file (`keep_by_file`): the same tables, row for
row, as loading the run whole keeps, and the same stretches read from it."""

from __future__ import annotations

import json
import shutil
import sqlite3

import pandas as pd
import pytest

from gpuprof import api, clocks, keep_by_file, load_cache, loader, step_window, store
from gpuprof.model import RECORD_TYPES
from gpuprof.sim import Pathology, SimConfig, simulate

HOST_ROWS = {"host": 1000, "procs": 2000, "gpu_procs": 1000}


def _run(gpus: int, skew_ns: int = 0):
    config = SimConfig(gpus=gpus, gpus_per_host=8, steps=12, seed=3,
                       pathologies=[Pathology("reward_bound", 0.6)])  # fmt: skip
    run = simulate(config).run
    if skew_ns:  # the second node's clock off by skew_ns: aligned on the ranks' collectives
        tables = {t: getattr(run, t) for t in RECORD_TYPES}
        clocks.shift_node(tables, "node1", skew_ns)
        # a few thread ids missing on that node alone: an int column there, float in the run
        rows = run.spans.index[run.spans["host"] == "node1"][:3]
        run.spans["tid"] = run.spans["tid"].astype(float)
        run.spans.loc[rows, "tid"] = float("nan")
    return run


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """Two nodes whose clocks disagree, as SQLite files and compacted to Parquet side files
    (`watch` leaves a finished run so); one node, compacted (one file is taken as read)."""
    root = tmp_path_factory.mktemp("keep_by_file")
    out = {}
    for name, gpus, skew, compact in (("sqlite", 16, 37_000_000, False),
                                      ("parquet", 16, 37_000_000, True),
                                      ("one node", 8, 0, True)):  # fmt: skip
        path = root / name.replace(" ", "_")
        store.save_run(_run(gpus, skew), path)
        if compact:
            api.compact(path)
        out[name] = path
    # a node whose clock the driver measured 300 ms off (Ray's round trips), kept in its file
    path = root / "stored_clock"
    store.save_run(_run(16), path)
    clock = {"node": "node1", "offset_ns": 300_000_000, "error_ns": 1_000, "method": "ray-rtt",
             "reference": "node0"}  # fmt: skip
    conn = sqlite3.connect(store.host_file(path, "node1"))
    with conn:
        conn.execute("INSERT OR REPLACE INTO meta (key, value) VALUES ('clock', ?)",
                     (json.dumps(clock),))  # fmt: skip
    conn.close()
    out["stored clock"] = path
    return out


@pytest.fixture
def long_runs(monkeypatch):
    """Budgets small enough that the runs are merged, as a cluster-day is; kept forms on."""
    monkeypatch.delenv(load_cache.ENV_CACHE, raising=False)
    monkeypatch.setattr(loader, "MAX_HOST_ROWS", HOST_ROWS)
    monkeypatch.setattr(keep_by_file, "PART_ROWS", 1000)  # GPUs merged in several parts


def _copies(src, tmp_path):
    whole, by_file = tmp_path / "whole", tmp_path / "by_file"
    shutil.copytree(src, whole)
    shutil.copytree(src, by_file)
    return whole, by_file


@pytest.mark.parametrize("form", ["sqlite", "parquet", "one node", "stored clock"])
def test_the_kept_form_made_file_by_file_is_the_whole_loads(runs, form, tmp_path, long_runs,
                                                             monkeypatch):  # fmt: skip
    whole_dir, by_file_dir = _copies(runs[form], tmp_path)
    budget = store.count_rows(whole_dir, "gpu") // 10
    monkeypatch.setattr(loader, "MAX_GPU_SAMPLES", budget)
    whole = loader.load_for_analysis(whole_dir, budget, workers=2)  # keeps its form, made whole
    assert keep_by_file.build(by_file_dir, workers=2)
    assert not list(by_file_dir.glob(".gpuprof-loaded.tmp-*"))
    parts = sorted(p.name for p in (by_file_dir / load_cache.DIRNAME).glob("*.arrow"))
    assert {"gpu.00000.arrow", "gpu.00002.arrow"} <= set(parts)  # one per part of the GPUs
    assert [p.name for p in (by_file_dir / load_cache.DIRNAME).iterdir() if p.is_dir()] == []
    settings = {"max_gpu_samples": budget, "merge": None, "host_rows": HOST_ROWS}
    kept = load_cache.read(by_file_dir, load_cache.key(by_file_dir, settings))
    assert kept is not None
    for table in RECORD_TYPES:
        pd.testing.assert_frame_equal(getattr(kept, table), getattr(whole, table))
    assert kept.gpu.attrs["factor"] == whole.gpu.attrs["factor"] > 1
    assert kept.meta.to_dict() == whole.meta.to_dict()
    if form in ("sqlite", "parquet"):
        assert whole.meta.clocks["node1"]["method"] == "collectives"
    if form == "stored clock":
        assert whole.meta.clocks["node1"]["offset_ns"] == 300_000_000
    assert any(n.startswith("long run: ") for n in kept.meta.notices)
    assert load_cache.step_times(by_file_dir).equals(load_cache.step_times(whole_dir))
    # the load reads it as its own, and a stretch of steps reads the same from either
    again = loader.load_for_analysis(by_file_dir, budget)
    pd.testing.assert_frame_equal(again.spans, whole.spans)
    window = step_window.resolve(whole_dir, "3:7")
    a = loader.load_for_analysis(whole_dir, budget, steps=window)
    b = loader.load_for_analysis(by_file_dir, budget, steps=window)
    for table in RECORD_TYPES:
        pd.testing.assert_frame_equal(getattr(a, table), getattr(b, table))


def test_a_short_or_unfinished_run_is_not_made_so(runs, tmp_path, long_runs, monkeypatch):
    _, by_file_dir = _copies(runs["sqlite"], tmp_path)
    assert not keep_by_file.build(by_file_dir)  # under the budget: it loads whole, cheaply
    assert not (by_file_dir / load_cache.DIRNAME).exists()
    running = _run(16)
    running.meta.end_ns = None  # still being written, or its watcher was killed
    store.save_run(running, tmp_path / "running")
    monkeypatch.setattr(loader, "MAX_GPU_SAMPLES", len(running.gpu) // 10)
    assert not keep_by_file.build(tmp_path / "running", workers=2)
    assert [p.name for p in (tmp_path / "running").iterdir() if p.name.startswith(".")] == []


def test_nothing_half_made_stays_when_the_parts_disagree(runs, tmp_path, long_runs, monkeypatch):
    _, by_file_dir = _copies(runs["parquet"], tmp_path)
    monkeypatch.setattr(loader, "MAX_GPU_SAMPLES", store.count_rows(by_file_dir, "gpu") // 10)

    def disagree(table, parts):
        raise ValueError(f"{table}.x: the parts disagree on the column")

    monkeypatch.setattr(load_cache, "_joined", disagree)
    assert not keep_by_file.build(by_file_dir, workers=2)
    assert [p.name for p in by_file_dir.iterdir() if p.name.startswith(".")] == []


def test_a_stretch_of_a_long_run_not_kept_yet_keeps_it_file_by_file(runs, tmp_path, long_runs,
                                                                      monkeypatch):  # fmt: skip
    """``--steps`` on a long run read for the first time: its form is kept file by file,
    then the stretch is read from it, as it would be from the files (one node: a stretch
    read from the files of several aligns their clocks on its own collectives)."""
    _, run_dir = _copies(runs["one node"], tmp_path)
    budget = store.count_rows(run_dir, "gpu") // 10
    monkeypatch.setattr(loader, "MAX_GPU_SAMPLES", budget)
    kept = loader.load_for_analysis(run_dir, budget, steps="3:7")
    assert (run_dir / load_cache.DIRNAME / "gpu.00000.arrow").exists()
    assert any(n.startswith("the whole run: long run: ") for n in kept.meta.notices)
    monkeypatch.setenv(load_cache.ENV_CACHE, "0")
    files = loader.load_for_analysis(run_dir, budget, steps="3:7")
    for table in ("spans", "events"):
        pd.testing.assert_frame_equal(getattr(kept, table), getattr(files, table))
    # samples: merged as the whole run was, against the stretch's own estimate
    for read in (kept, files):
        assert sorted(set(read.gpu["gpu"])) == list(range(8))
        assert abs(read.gpu["t_ns"].min() - files.gpu["t_ns"].min()) < 10**9
        assert abs(read.gpu["t_ns"].max() - files.gpu["t_ns"].max()) < 10**10


def test_a_damaged_run_file_is_one_line_and_leaves_nothing(runs, tmp_path, long_runs,
                                                           monkeypatch):  # fmt: skip
    _, run_dir = _copies(runs["sqlite"], tmp_path)
    monkeypatch.setattr(loader, "MAX_GPU_SAMPLES", store.count_rows(run_dir, "gpu") // 10)
    read = loader._read_reduced

    def damaged(path, skip, reducer):  # found only once the file is read
        if "node1" in path.name:
            raise store.RunError(f"{path}: damaged or not a gpuprof run file")
        return read(path, skip, reducer)

    monkeypatch.setattr(loader, "_read_reduced", damaged)
    with pytest.raises(store.RunError, match="node1"):
        keep_by_file.build(run_dir, workers=2)
    assert [p.name for p in run_dir.iterdir() if p.name.startswith(".gpuprof")] == []
