"""What the loader made of a finished run (merged when long) is kept beside it
(`gpuprof.load_cache`): read again, it is the run as loaded, table for table and to the byte
of the diagnosis; anything that changes the run or how it is loaded misses; nothing is kept
for a run still written, and a kept form that does not read costs time, never a wrong
answer."""

from __future__ import annotations

import json
import os

import pandas as pd
import pandas.testing as pdt
import pytest
from conftest import SHARED_FIXTURES, clean_env, run_gpuprof

from gpuprof import api, load_cache, loader, store
from gpuprof.model import RECORD_TYPES
from gpuprof.reports.fmt import render_json
from gpuprof.sim import Pathology, SimConfig, simulate


@pytest.fixture(autouse=True)
def cache_on(monkeypatch):
    monkeypatch.delenv(load_cache.ENV_CACHE, raising=False)  # the tests' default turns it off


@pytest.fixture
def long_run(tmp_path):
    cfg = SimConfig(
        gpus=8, steps=8, seed=11,
        pathologies=[Pathology("reward_bound", 0.5), Pathology("dataloader_starvation", 0.4)],
    )  # fmt: skip
    run_dir = tmp_path / "run"
    store.save_run(simulate(cfg).run, run_dir)
    return run_dir


def _budget(run_dir) -> int:
    return store.count_rows(run_dir, "gpu") // 10


def _same(a, b) -> None:
    for table in RECORD_TYPES:
        pdt.assert_frame_equal(getattr(a, table), getattr(b, table), check_exact=True)
        assert getattr(a, table).attrs == getattr(b, table).attrs, table
    assert a.meta.to_dict() == b.meta.to_dict()


def _doc(run) -> str:
    return render_json(api.analyze(run, workers=1).to_dict())


def test_a_merged_run_is_kept_and_read_back_as_it_was_merged(long_run, monkeypatch):
    budget = _budget(long_run)
    made = loader.load_for_analysis(long_run, budget, workers=1)
    assert any("merged within each phase" in n for n in made.meta.notices)
    kept_dir = long_run / load_cache.DIRNAME
    assert (kept_dir / "run.json").exists()
    assert {p.name for p in kept_dir.iterdir()} == {"run.json"} | {
        f"{t}.arrow" for t in RECORD_TYPES
    }
    assert not list(long_run.glob(f"{load_cache.DIRNAME}.*"))  # no temporary left

    # the second load reads what was kept, and never the run files' samples
    def no_reading(*args, **kwargs):
        raise AssertionError("the run files were read again")

    monkeypatch.setattr(loader, "_load_merged", no_reading)
    again = loader.load_for_analysis(long_run, budget, workers=1)
    _same(made, again)
    assert _doc(again) == _doc(made)
    # the document of a fresh merge, without anything kept, is the same too
    monkeypatch.undo()
    monkeypatch.setenv(load_cache.ENV_CACHE, "0")
    assert _doc(loader.load_for_analysis(long_run, budget, workers=1)) == _doc(made)


def test_what_changes_the_run_or_the_merge_misses(long_run):
    budget = _budget(long_run)
    first = loader.load_for_analysis(long_run, budget, workers=1)
    kept = json.loads((long_run / load_cache.DIRNAME / "run.json").read_text())
    settings = kept["key"]["settings"]
    assert load_cache.key(long_run, settings) == kept["key"]
    # other merge settings: another key (and the kept form is replaced by the new one)
    other = loader.load_for_analysis(long_run, budget // 2, workers=1)
    assert len(other.gpu) < len(first.gpu)
    kept2 = json.loads((long_run / load_cache.DIRNAME / "run.json").read_text())
    assert kept2["key"]["settings"]["max_gpu_samples"] == budget // 2
    # a run file rewritten (same size, a new time): the key no longer matches
    victim = sorted(long_run.glob("*.sqlite"))[0]
    stamp = victim.stat().st_mtime_ns + 1_000_000_000
    os.utime(victim, ns=(stamp, stamp))
    assert load_cache.key(long_run, kept2["key"]["settings"]) != kept2["key"]
    assert load_cache.read(long_run, load_cache.key(long_run, kept2["key"]["settings"])) is None
    # a file added to the run (a node's file merged in later) misses too
    assert load_cache.key(long_run, settings)["files"] != kept["key"]["files"]


def test_a_run_still_written_is_not_kept(long_run, monkeypatch):
    # no end time: the watcher has not finished it (or was killed): nothing kept
    real_load = store.load_run

    def unfinished(*args, **kwargs):
        run = real_load(*args, **kwargs)
        run.meta.end_ns = None
        return run

    monkeypatch.setattr(store, "load_run", unfinished)
    loader.load_for_analysis(long_run, _budget(long_run), workers=1)
    assert not (long_run / load_cache.DIRNAME).exists()
    monkeypatch.undo()
    # a write-ahead log with rows in it: the run is being written; no key at all
    wal = sorted(long_run.glob("*.sqlite"))[0].with_name("x.sqlite-wal")
    wal.write_bytes(b"\0" * 32)
    assert load_cache.key(long_run, {}) is None
    loader.load_for_analysis(long_run, _budget(long_run), workers=1)
    assert not (long_run / load_cache.DIRNAME).exists()
    wal.write_bytes(b"")  # emptied (folded in): the run may be kept again
    assert load_cache.key(long_run, {}) is not None


def test_turned_off_neither_reads_nor_writes(long_run, monkeypatch):
    monkeypatch.setenv(load_cache.ENV_CACHE, "0")
    loader.load_for_analysis(long_run, _budget(long_run), workers=1)
    assert not (long_run / load_cache.DIRNAME).exists()


def test_a_kept_form_that_does_not_read_is_made_again(long_run):
    budget = _budget(long_run)
    made = loader.load_for_analysis(long_run, budget, workers=1)
    arrow = long_run / load_cache.DIRNAME / "spans.arrow"
    arrow.write_bytes(arrow.read_bytes()[:100])  # cut short (a copy that stopped)
    again = loader.load_for_analysis(long_run, budget, workers=1)
    _same(made, again)
    assert arrow.stat().st_size > 100  # written again, whole
    (long_run / load_cache.DIRNAME / "run.json").write_text("{not json")
    _same(made, loader.load_for_analysis(long_run, budget, workers=1))


def test_files_of_two_writings_are_never_read_as_one(long_run):
    # two loads under different settings keeping at once: one swaps the directory while the
    # other reads it. A table from the other writing (same columns, other rows) is refused
    budget = _budget(long_run)
    loader.load_for_analysis(long_run, budget, workers=1)
    kept_dir = long_run / load_cache.DIRNAME
    first = kept_dir.rename(long_run / "first")
    loader.load_for_analysis(long_run, budget // 2, workers=1)
    second_key = json.loads((kept_dir / "run.json").read_text())["key"]
    (kept_dir / "gpu.arrow").replace(long_run / "gpu-second.arrow")
    (first / "gpu.arrow").rename(kept_dir / "gpu.arrow")  # the other writing's table
    assert load_cache.read(long_run, second_key) is None


def test_a_directory_that_cannot_be_written_costs_time_only(long_run, monkeypatch):
    # as root, a read-only directory still takes files: the refusal is made at the boundary
    real_mkdir = type(long_run).mkdir

    def refuse(self, *args, **kwargs):
        if self.name.startswith(load_cache.DIRNAME):
            raise PermissionError(13, "Permission denied", str(self))
        return real_mkdir(self, *args, **kwargs)

    monkeypatch.setattr(type(long_run), "mkdir", refuse)
    budget = _budget(long_run)
    run = loader.load_for_analysis(long_run, budget, workers=1)
    assert any("merged within each phase" in n for n in run.meta.notices)
    assert not [p for p in long_run.iterdir() if p.name.startswith(load_cache.DIRNAME)]


def test_a_run_read_as_recorded_is_kept_too(long_run, monkeypatch):
    # within the budgets nothing is merged, but reading the files (decoding, types, clocks,
    # order, span depths) is still most of a small run's load: it is kept the same way
    made = loader.load_for_analysis(long_run, workers=1)
    assert not any("merged" in n for n in made.meta.notices)
    assert (long_run / load_cache.DIRNAME / "run.json").exists()

    def no_reading(*args, **kwargs):
        raise AssertionError("the run files were read again")

    monkeypatch.setattr(store, "load_run", no_reading)
    _same(made, loader.load_for_analysis(long_run, workers=1))


def test_every_table_and_column_kind_reads_back_as_it_was(tmp_path):
    # the simulator leaves the stack, thread and log tables empty: rows of every column kind
    # (gaps as None and as NaN, JSON, booleans) are added to each of them
    from gpuprof.model import column_kinds

    run = simulate(SimConfig(gpus=2, steps=3, seed=2)).run
    values = {"int": [1, 2, 3], "float": [1.5, float("nan"), -2.0], "str": ["a", None, "b"],
              "bool": [True, False, True], "json": [{"k": 1}, {}, {"k": [1, "x"]}]}  # fmt: skip
    for table, record in RECORD_TYPES.items():
        frame = getattr(run, table)
        if len(frame):
            continue
        kinds = column_kinds(record)
        rows = {name: values[kinds[name]] for name in frame.columns}
        for key in ("host",):
            if key in rows:
                rows[key] = ["node0"] * 3
        for key in ("t_ns", "start_ns", "end_ns"):
            if key in rows:
                rows[key] = [run.meta.start_ns + i for i in range(3)]
        setattr(run, table, pd.DataFrame(rows))
    run_dir = tmp_path / "run"
    store.save_run(run, run_dir)
    made = loader.load_for_analysis(run_dir, workers=1)
    assert all(len(getattr(made, t)) for t in RECORD_TYPES)
    again = load_cache.read(run_dir, load_cache.key(run_dir, _settings(run_dir)))
    assert again is not None
    _same(made, again)


def _settings(run_dir) -> dict:
    kept = json.loads((run_dir / load_cache.DIRNAME / "run.json").read_text())
    return kept["key"]["settings"]


def test_a_kept_form_of_another_run_is_not_taken(long_run, tmp_path):
    # a kept form copied from elsewhere (a run directory assembled by hand): its key names
    # other files, so this run is merged from its own
    budget = _budget(long_run)
    loader.load_for_analysis(long_run, budget, workers=1)
    cfg = SimConfig(gpus=8, steps=8, seed=12)
    other = tmp_path / "other"
    store.save_run(simulate(cfg).run, other)
    (long_run / load_cache.DIRNAME).rename(other / load_cache.DIRNAME)
    mine = loader.load_for_analysis(other, budget, workers=1)
    os.environ[load_cache.ENV_CACHE] = "0"
    try:
        fresh = loader.load_for_analysis(other, budget, workers=1)
    finally:
        del os.environ[load_cache.ENV_CACHE]
    _same(mine, fresh)


def test_the_cli_gives_the_same_document_from_the_kept_form(long_run):
    # the command a user runs after `watch`: the first `analyze` keeps what it read, the
    # next reads that; the JSON is the same, and the same with keeping turned off
    first = run_gpuprof("analyze", str(long_run), "--json", env=clean_env())
    assert first.returncode == 0, first.stderr
    assert (long_run / load_cache.DIRNAME / "run.json").exists()
    again = run_gpuprof("analyze", str(long_run), "--json", env=clean_env())
    off = run_gpuprof("analyze", str(long_run), "--json",
                      env=clean_env(GPUPROF_LOAD_CACHE="0"))  # fmt: skip
    assert again.returncode == 0 and off.returncode == 0, again.stderr + off.stderr
    assert first.stdout == again.stdout == off.stdout


REAL = sorted(p for p in SHARED_FIXTURES.rglob("*") if p.is_file() and p.name != "README.md")


@pytest.mark.skipif(not REAL, reason="no shared fixtures")
@pytest.mark.parametrize("merge", [None, 2], ids=["as-recorded", "merged"])
@pytest.mark.parametrize("path", REAL, ids=lambda p: p.name)
def test_real_third_party_files_kept_read_back_the_same(path, merge, tmp_path):
    """Files users have (nvidia-smi, DCGM, profiler traces, verl logs), read as recorded or
    merged by 2, and kept: the kept form is the run as loaded and gives its document."""
    try:
        run_dir = api.import_files([path], tmp_path / "run")
    except Exception as exc:  # a file the importer refuses has nothing to keep
        pytest.skip(f"not importable alone: {exc}")
    made = loader.load_for_analysis(run_dir, merge=merge, workers=1)
    if made.meta.end_ns is None:
        assert not (run_dir / load_cache.DIRNAME).exists()
        pytest.skip("no end time: an unfinished run is not kept")
    assert (run_dir / load_cache.DIRNAME / "run.json").exists()
    again = loader.load_for_analysis(run_dir, merge=merge, workers=1)
    _same(made, again)
    if len(made.spans) or len(made.gpu):
        assert _doc(again) == _doc(made)
