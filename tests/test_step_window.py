"""`--steps A:B`: a stretch of a run's steps read and diagnosed alone, with the whole run's
figures for those steps."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest
from conftest import SHARED_FIXTURES, run_gpuprof

from gpuprof import api, step_window, store
from gpuprof.analyzers.breakdown import phase_breakdown
from gpuprof.loader import load_for_analysis
from gpuprof.sim import SimConfig, simulate

FIGURES = ["gpu_s", "busy_gpu_s", "idle_gpu_s", "wall_s", "samples"]


@pytest.fixture(scope="module")
def two_nodes(tmp_path_factory):
    """12 steps of 16 GPUs on two nodes, one file each; the second copy compacted into
    Parquet side files as `watch` leaves a finished run; then 8 GPUs on one node, compacted
    (one file: its frames are not put together with another's)."""
    root = tmp_path_factory.mktemp("steps")
    run = simulate(SimConfig(gpus=16, steps=12, seed=3)).run
    sqlite_dir, parquet_dir, one_node = root / "sqlite", root / "parquet", root / "one"
    store.save_run(run, sqlite_dir)
    store.save_run(run, parquet_dir)
    store.save_run(simulate(SimConfig(gpus=8, steps=12, seed=4)).run, one_node)
    for compacted in (parquet_dir, one_node):
        api.compact(compacted)
        assert list(compacted.glob("*.gpu.parquet"))
    return sqlite_dir, parquet_dir, one_node


def _by_step(run) -> pd.DataFrame:
    return phase_breakdown(run, by=("step", "phase")).set_index(["step", "phase"])[FIGURES]


@pytest.mark.parametrize("form", ["sqlite", "parquet", "one file"])
def test_a_stretch_has_the_whole_runs_figures_for_its_steps(two_nodes, form):
    run_dir = two_nodes[["sqlite", "parquet", "one file"].index(form)]
    whole = load_for_analysis(run_dir, max_gpu_samples=None)
    part = load_for_analysis(run_dir, max_gpu_samples=None, steps="4:8")
    for table in ("gpu", "spans", "procs", "events", "host"):  # read as a whole run is
        pd.testing.assert_series_equal(getattr(part, table).dtypes, getattr(whole, table).dtypes)
    steps = sorted(part.spans["step"].unique())
    assert steps == [4, 5, 6, 7]
    expected = _by_step(whole)
    expected = expected[expected.index.get_level_values("step").isin(steps)]
    pd.testing.assert_frame_equal(_by_step(part), expected, check_exact=False, rtol=1e-9)
    # the run reads as one that ran the stretch alone
    window = step_window.resolve(run_dir, "4:8")
    assert (part.meta.start_ns, part.meta.end_ns) == (window.start_ns, window.end_ns)
    for table in ("gpu", "procs", "host"):
        t = getattr(part, table)["t_ns"]
        assert len(t) and t.min() >= window.start_ns and t.max() < window.end_ns
    assert len(part.gpu) < 0.5 * len(whole.gpu)
    assert part.meta.notices[-1].startswith("steps 4–7 alone (4 of the 12 recorded steps")
    step_events = part.events[part.events["kind"] == "step"]
    assert sorted(set(step_window._step_numbers(step_events))) == steps


def test_the_bounds_read_as_a_python_slice_of_step_numbers(two_nodes):
    run_dir = two_nodes[0]
    cases = {"-3:": (9, 11, 3), ":2": (0, 1, 2), "10:": (10, 11, 2), ":-10": (0, 1, 2),
             ":": (0, 11, 12), "-100:": (0, 11, 12)}  # fmt: skip
    for text, (first, last, n) in cases.items():
        window = step_window.resolve(run_dir, text)
        assert (window.first, window.last, window.steps, window.run_steps) == (first, last, n, 12)


def test_a_stretch_merged_on_workers_keeps_its_gpu_time(two_nodes):
    """Past the sample budget the stretch is merged within phases by the loader's worker
    processes (the read filter travels to them): the GPU-time per step and phase stays."""
    run_dir = two_nodes[1]
    exact = load_for_analysis(run_dir, max_gpu_samples=None, steps="2:6")
    merged = load_for_analysis(run_dir, max_gpu_samples=4_000, steps="2:6", workers=2)
    assert len(merged.gpu) < 0.5 * len(exact.gpu)
    assert merged.gpu["t_ns"].min() >= exact.meta.start_ns
    assert merged.gpu["t_ns"].max() < exact.meta.end_ns
    a, b = _by_step(exact), _by_step(merged)
    assert list(a.index) == list(b.index)
    np.testing.assert_allclose(b["gpu_s"], a["gpu_s"], rtol=0.05, atol=1.0)


def test_the_whole_run_is_still_kept_and_read_as_before(two_nodes, tmp_path, monkeypatch):
    import shutil

    from gpuprof import load_cache

    monkeypatch.delenv(load_cache.ENV_CACHE, raising=False)  # the tests' default turns it off
    run_dir = tmp_path / "run"
    shutil.copytree(two_nodes[1], run_dir)
    whole = load_for_analysis(run_dir)
    kept = (run_dir / load_cache.DIRNAME / "run.json").read_text()
    load_for_analysis(run_dir, steps="0:3")  # reads the kept form, leaves it as it was
    assert (run_dir / load_cache.DIRNAME / "run.json").read_text() == kept
    again = load_for_analysis(run_dir)
    pd.testing.assert_frame_equal(whole.gpu, again.gpu)
    pd.testing.assert_frame_equal(whole.spans, again.spans)
    assert not any("alone" in n for n in again.meta.notices)


def _gpuprof(*args):
    return run_gpuprof(*args, timeout=300)


def test_the_command_line_says_what_is_wrong_in_one_line(two_nodes, tmp_path):
    run_dir = two_nodes[0]
    for args in (["--steps", "40:50"], ["--steps=7:2"]):  # the plain path
        out = _gpuprof("analyze", run_dir, *args)
        assert out.returncode == 2
        assert out.stderr.strip().splitlines() == [
            f"gpuprof: error: {run_dir}: --steps {args[-1].split('=')[-1]} selects no recorded "
            "step (the run's steps are 0–11, 12 of them)"
        ]
    out = _gpuprof("analyze", run_dir, "--steps", "seven")  # typer's message for a bad value
    assert out.returncode == 2 and "expected A:B" in out.stderr and "Traceback" not in out.stderr
    # a run that recorded GPU samples but no steps
    bare = simulate(SimConfig(gpus=2, steps=3, seed=1)).run
    bare.spans = bare.spans.iloc[0:0]
    bare.events = bare.events.iloc[0:0]
    store.save_run(bare, tmp_path / "bare")
    out = _gpuprof("analyze", tmp_path / "bare", "--steps", "0:1")
    assert out.returncode == 2
    assert "--steps needs the steps a run recorded" in out.stderr
    assert len(out.stderr.strip().splitlines()) == 1


def test_analyze_and_report_of_a_stretch(two_nodes, tmp_path):
    run_dir = tmp_path / "run"
    store.save_run(simulate(SimConfig(gpus=8, steps=6, seed=2)).run, run_dir)
    out = _gpuprof("analyze", run_dir, "--steps", "-2:", "--json")
    assert out.returncode == 0, out.stderr
    document = json.loads(out.stdout)
    assert any(n.startswith("steps 4–5 alone") for n in document["notes"])
    assert document["summary"]["stretch"] == {
        "first": 4, "last": 5, "steps": 2, "run_steps": 6, "run_first": 0, "run_last": 5
    }  # fmt: skip
    out = _gpuprof("analyze", run_dir, "--steps", "3:4")  # the text's second line says so
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines()[1:3].count(
        "step 3 of 0–5 alone (1 of the 6 recorded steps; --steps)"
    ) == 1  # fmt: skip
    out = _gpuprof("report", run_dir, "--steps", "1:3")
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == str(run_dir / "report-steps-1-2.html")
    page = (run_dir / "report-steps-1-2.html").read_text()
    assert "<strong>steps 1–2 of 0–5 alone (2 of the 6 recorded steps; --steps)</strong>" in page
    assert not (run_dir / "report.html").exists()


def test_a_run_with_very_many_spans_says_how_to_read_less(two_nodes, monkeypatch):
    from gpuprof import loader

    monkeypatch.setattr(loader, "MANY_SPANS", 100)
    whole = load_for_analysis(two_nodes[0], max_gpu_samples=None)
    hint = [n for n in whole.meta.notices if "spans held in memory" in n]
    assert len(hint) == 1 and hint[0].startswith(f"{len(whole.spans):,} spans")
    assert "--by-steps N the whole run N steps at a time" in hint[0]
    part = load_for_analysis(two_nodes[0], max_gpu_samples=None, steps="0:2")
    assert not any("spans held in memory" in n for n in part.meta.notices)


def test_each_gpu_keeps_the_samples_of_its_owners_own_steps(tmp_path):
    """Ranks cross a step boundary at slightly different times: a GPU whose rank starts the
    stretch's first step a second late keeps nothing of that second (its rank was still in
    the step before), the other GPUs keep theirs from the stretch's start."""
    from gpuprof.analyzers.ownership import gpu_owner

    run = simulate(SimConfig(gpus=8, steps=8, seed=5)).run
    owners = gpu_owner(run).dropna(subset=["pid"])
    late, other = owners.iloc[1], owners.iloc[2]
    spans = run.spans
    mine = (spans["phase"] == "step") & (spans["pid"] == late["pid"])
    lag = 10**9
    spans.loc[mine & (spans["step"] >= 1), "start_ns"] += lag  # its boundaries a second late
    spans.loc[mine & (spans["step"] < spans["step"].max()), "end_ns"] += lag
    store.save_run(run, tmp_path / "run")
    window = step_window.resolve(tmp_path / "run", "3:6")
    part = load_for_analysis(tmp_path / "run", max_gpu_samples=None, steps=window)

    def first_sample(row):
        gpu = part.gpu[(part.gpu["host"] == row["host"]) & (part.gpu["gpu"] == row["gpu"])]
        return int(gpu["t_ns"].min())

    interval = int(run.meta.interval_s * 1e9)
    assert window.start_ns <= first_sample(other) < window.start_ns + interval
    assert window.start_ns + lag <= first_sample(late) < window.start_ns + lag + interval
    assert set(part.spans["step"]) == {3, 4, 5}


@pytest.mark.parametrize("batch_rows", [50, 262_144])
def test_a_stretch_reads_the_same_from_the_kept_form(two_nodes, tmp_path, monkeypatch, batch_rows):
    """After a whole-run load has kept its form, a stretch is read from the kept batches
    that reach into it; what it gets is what reading the files gives."""
    import shutil

    from gpuprof import load_cache

    monkeypatch.delenv(load_cache.ENV_CACHE, raising=False)  # the tests' default turns it off
    monkeypatch.setattr(load_cache, "BATCH_ROWS", batch_rows)  # many batches: most skipped
    run_dir = tmp_path / "run"
    shutil.copytree(two_nodes[1], run_dir)
    load_for_analysis(run_dir)  # keeps the whole run's form
    assert (run_dir / load_cache.DIRNAME / "run.json").exists()
    decoded = []
    real_batches = load_cache._batches
    monkeypatch.setattr(load_cache, "_batches", lambda r, spec, span, *hosts: decoded.append(
        sum(1 for f, last in spec.get("times", []) if f is not None and last >= span[0]
            and f <= span[1])) or real_batches(r, spec, span, *hosts))  # fmt: skip
    kept = load_for_analysis(run_dir, steps="5:7")
    assert decoded  # read from the kept form
    monkeypatch.setenv(load_cache.ENV_CACHE, "0")
    files = load_for_analysis(run_dir, steps="5:7")
    for table in ("gpu", "spans", "procs", "events", "host", "gpu_procs"):
        pd.testing.assert_frame_equal(getattr(kept, table), getattr(files, table))
    assert kept.meta.notices[-1] == files.meta.notices[-1]
    if batch_rows == 50:  # the gpu table (read first): a few of its batches decoded
        kept_tables = json.loads((run_dir / load_cache.DIRNAME / "run.json").read_text())
        assert 0 < decoded[0] < len(kept_tables["tables"]["gpu"]["times"]) / 3


def test_a_stretchs_notes_say_whose_counts_they_give(two_nodes, tmp_path, monkeypatch):
    """Merging notes of a stretch: the whole run's counts when it was read from the whole
    run's kept form, estimates of its own when it was read from the files."""
    import shutil

    from gpuprof import load_cache

    monkeypatch.delenv(load_cache.ENV_CACHE, raising=False)
    run_dir = tmp_path / "run"
    shutil.copytree(two_nodes[1], run_dir)
    whole = load_for_analysis(run_dir, max_gpu_samples=5_000)
    merged = [n for n in whole.meta.notices if n.startswith("long run: ")]
    assert len(merged) == 1
    kept = load_for_analysis(run_dir, max_gpu_samples=5_000, steps="2:4")
    assert f"the whole run: {merged[0]}" in kept.meta.notices
    monkeypatch.setenv(load_cache.ENV_CACHE, "0")
    files = load_for_analysis(run_dir, max_gpu_samples=2_000, steps="2:4")
    assert any(n.startswith("long run: about ") for n in files.meta.notices)


def test_the_kept_form_records_the_step_times_while_it_stands_for_the_files(
    two_nodes, tmp_path, monkeypatch
):
    """A stretch of a kept run is found without reading every file's spans: the kept form
    records each step's times; once a run file changes, the files are read again."""
    import os
    import shutil

    from gpuprof import load_cache

    monkeypatch.delenv(load_cache.ENV_CACHE, raising=False)
    run_dir = tmp_path / "run"
    shutil.copytree(two_nodes[2], run_dir)  # one node: the files' clock is the run's
    assert load_cache.step_times(run_dir) is None  # nothing kept yet
    from_files = step_window._step_times(run_dir)
    whole = load_for_analysis(run_dir)
    kept = load_cache.step_times(run_dir)
    pd.testing.assert_frame_equal(kept, step_window.step_times(whole.spans))
    pd.testing.assert_frame_equal(kept, from_files, check_dtype=False)
    assert step_window.resolve(run_dir, "3:5") == step_window.resolve(two_nodes[2], "3:5")
    sqlite = next(run_dir.glob("*.sqlite"))
    os.utime(sqlite, ns=(sqlite.stat().st_atime_ns, sqlite.stat().st_mtime_ns + 10**9))
    assert load_cache.step_times(run_dir) is None  # the run changed: its files say


def test_a_stretch_of_a_real_verl_log(tmp_path):
    """A run the project did not make: verl's console log of a 2-GPU PPO run (106 steps of
    phase timings, no GPU samples), imported; a stretch holds exactly those steps' spans."""
    log = SHARED_FIXTURES / "verl" / "gemma2b_ppo_2gpu_old_format.log"
    run_dir = tmp_path / "verl"
    assert run_gpuprof("import", str(log), "-o", str(run_dir)).returncode == 0
    whole = load_for_analysis(run_dir)
    part = load_for_analysis(run_dir, steps="10:20")
    columns = ["phase", "step", "start_ns", "end_ns"]

    def rows(spans):
        return spans[columns].sort_values(columns).reset_index(drop=True)

    expected = whole.spans[whole.spans["step"].between(10, 19)]
    pd.testing.assert_frame_equal(rows(part.spans), rows(expected))
    out = _gpuprof("analyze", run_dir, "--steps", "10:20", "--json")
    assert out.returncode == 0, out.stderr
    summary = json.loads(out.stdout)["summary"]
    assert summary["stretch"] == {
        "first": 10, "last": 19, "steps": 10, "run_steps": 106, "run_first": 0, "run_last": 105
    }  # fmt: skip
    assert summary["data_basis"]["phase_timing"]["steps"] == 10
