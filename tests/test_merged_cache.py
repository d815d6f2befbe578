"""A long run's merged form is kept beside it (`gpuprof.merged_cache`): read again, it is the
run as merged, table for table and to the byte of the diagnosis; anything that changes the
run or how it is merged misses; nothing is kept for a run still written, and a kept form
that does not read costs time, never a wrong answer."""

from __future__ import annotations

import json
import os
import time

import pandas.testing as pdt
import pytest
from conftest import SHARED_FIXTURES, clean_env, run_gpuprof

from gpuprof import api, loader, merged_cache, store
from gpuprof.model import RECORD_TYPES
from gpuprof.reports.fmt import render_json
from gpuprof.sim import Pathology, SimConfig, simulate


@pytest.fixture(autouse=True)
def cache_on(monkeypatch):
    monkeypatch.delenv(merged_cache.ENV_CACHE, raising=False)  # the tests' default turns it off


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
    kept_dir = long_run / merged_cache.DIRNAME
    assert (kept_dir / "run.json").exists()
    assert {p.name for p in kept_dir.iterdir()} == {"run.json"} | {
        f"{t}.arrow" for t in RECORD_TYPES
    }
    assert not list(long_run.glob(f"{merged_cache.DIRNAME}.*"))  # no temporary left

    # the second load reads what was kept, and never the run files' samples
    def no_reading(*args, **kwargs):
        raise AssertionError("the run files were read again")

    monkeypatch.setattr(loader, "_load_merged", no_reading)
    again = loader.load_for_analysis(long_run, budget, workers=1)
    _same(made, again)
    assert _doc(again) == _doc(made)
    # the document of a fresh merge, without anything kept, is the same too
    monkeypatch.undo()
    monkeypatch.setenv(merged_cache.ENV_CACHE, "0")
    assert _doc(loader.load_for_analysis(long_run, budget, workers=1)) == _doc(made)


def test_what_changes_the_run_or_the_merge_misses(long_run):
    budget = _budget(long_run)
    first = loader.load_for_analysis(long_run, budget, workers=1)
    kept = json.loads((long_run / merged_cache.DIRNAME / "run.json").read_text())
    settings = kept["key"]["settings"]
    assert merged_cache.key(long_run, settings) == kept["key"]
    # other merge settings: another key (and the kept form is replaced by the new one)
    other = loader.load_for_analysis(long_run, budget // 2, workers=1)
    assert len(other.gpu) < len(first.gpu)
    kept2 = json.loads((long_run / merged_cache.DIRNAME / "run.json").read_text())
    assert kept2["key"]["settings"]["max_gpu_samples"] == budget // 2
    # a run file rewritten (same size, a new time): the key no longer matches
    victim = sorted(long_run.glob("*.sqlite"))[0]
    stamp = victim.stat().st_mtime_ns + 1_000_000_000
    os.utime(victim, ns=(stamp, stamp))
    assert merged_cache.key(long_run, kept2["key"]["settings"]) != kept2["key"]
    assert merged_cache.read(long_run, merged_cache.key(long_run, kept2["key"]["settings"])) is None
    # a file added to the run (a node's file merged in later) misses too
    assert merged_cache.key(long_run, settings)["files"] != kept["key"]["files"]


def test_a_run_still_written_is_not_kept(long_run, monkeypatch):
    # no end time: the watcher has not finished it (or was killed): nothing kept
    real_load = store.load_run

    def unfinished(*args, **kwargs):
        run = real_load(*args, **kwargs)
        run.meta.end_ns = None
        return run

    monkeypatch.setattr(store, "load_run", unfinished)
    loader.load_for_analysis(long_run, _budget(long_run), workers=1)
    assert not (long_run / merged_cache.DIRNAME).exists()
    monkeypatch.undo()
    # a write-ahead log with rows in it: the run is being written; no key at all
    wal = sorted(long_run.glob("*.sqlite"))[0].with_name("x.sqlite-wal")
    wal.write_bytes(b"\0" * 32)
    assert merged_cache.key(long_run, {}) is None
    loader.load_for_analysis(long_run, _budget(long_run), workers=1)
    assert not (long_run / merged_cache.DIRNAME).exists()
    wal.write_bytes(b"")  # emptied (folded in): the run may be kept again
    assert merged_cache.key(long_run, {}) is not None


def test_turned_off_neither_reads_nor_writes(long_run, monkeypatch):
    monkeypatch.setenv(merged_cache.ENV_CACHE, "0")
    loader.load_for_analysis(long_run, _budget(long_run), workers=1)
    assert not (long_run / merged_cache.DIRNAME).exists()


def test_a_kept_form_that_does_not_read_is_made_again(long_run):
    budget = _budget(long_run)
    made = loader.load_for_analysis(long_run, budget, workers=1)
    arrow = long_run / merged_cache.DIRNAME / "spans.arrow"
    arrow.write_bytes(arrow.read_bytes()[:100])  # cut short (a copy that stopped)
    again = loader.load_for_analysis(long_run, budget, workers=1)
    _same(made, again)
    assert arrow.stat().st_size > 100  # written again, whole
    (long_run / merged_cache.DIRNAME / "run.json").write_text("{not json")
    _same(made, loader.load_for_analysis(long_run, budget, workers=1))


def test_a_directory_that_cannot_be_written_costs_time_only(long_run, monkeypatch):
    # as root, a read-only directory still takes files: the refusal is made at the boundary
    real_mkdir = type(long_run).mkdir

    def refuse(self, *args, **kwargs):
        if self.name.startswith(merged_cache.DIRNAME):
            raise PermissionError(13, "Permission denied", str(self))
        return real_mkdir(self, *args, **kwargs)

    monkeypatch.setattr(type(long_run), "mkdir", refuse)
    budget = _budget(long_run)
    run = loader.load_for_analysis(long_run, budget, workers=1)
    assert any("merged within each phase" in n for n in run.meta.notices)
    assert not [p for p in long_run.iterdir() if p.name.startswith(merged_cache.DIRNAME)]


def test_a_small_run_keeps_nothing(long_run):
    loader.load_for_analysis(long_run, workers=1)  # within the budget: read as recorded
    assert not (long_run / merged_cache.DIRNAME).exists()


def test_a_kept_form_of_another_run_is_not_taken(long_run, tmp_path):
    # a kept form copied from elsewhere (a run directory assembled by hand): its key names
    # other files, so this run is merged from its own
    budget = _budget(long_run)
    loader.load_for_analysis(long_run, budget, workers=1)
    cfg = SimConfig(gpus=8, steps=8, seed=12)
    other = tmp_path / "other"
    store.save_run(simulate(cfg).run, other)
    (long_run / merged_cache.DIRNAME).rename(other / merged_cache.DIRNAME)
    mine = loader.load_for_analysis(other, budget, workers=1)
    os.environ[merged_cache.ENV_CACHE] = "0"
    try:
        fresh = loader.load_for_analysis(other, budget, workers=1)
    finally:
        del os.environ[merged_cache.ENV_CACHE]
    _same(mine, fresh)


def test_the_cli_keeps_nothing_beside_a_run_it_reads_as_recorded(long_run):
    # most runs are within the budget: `analyze` leaves their directory as it was
    before = sorted(p.name for p in long_run.iterdir())
    done = run_gpuprof("analyze", str(long_run), "--json", env=clean_env())
    assert done.returncode == 0, done.stderr
    assert sorted(p.name for p in long_run.iterdir()) == before


REAL = sorted(p for p in SHARED_FIXTURES.rglob("*") if p.is_file() and p.name != "README.md")


@pytest.mark.skipif(not REAL, reason="no shared fixtures")
@pytest.mark.parametrize("path", REAL, ids=lambda p: p.name)
def test_real_third_party_files_merged_and_kept_read_back_the_same(path, tmp_path):
    """Files users have (nvidia-smi, DCGM, profiler traces, verl logs), merged by 2 and kept:
    the kept form is the merged run and gives its document."""
    try:
        run_dir = api.import_files([path], tmp_path / "run")
    except Exception as exc:  # a file the importer refuses has nothing to keep
        pytest.skip(f"not importable alone: {exc}")
    made = loader.load_for_analysis(run_dir, merge=2, workers=1)
    if made.meta.end_ns is None:
        assert not (run_dir / merged_cache.DIRNAME).exists()
        pytest.skip("no end time: an unfinished run is not kept")
    assert (run_dir / merged_cache.DIRNAME / "run.json").exists()
    time.sleep(0.01)
    again = loader.load_for_analysis(run_dir, merge=2, workers=1)
    _same(made, again)
    if len(made.spans) or len(made.gpu):
        assert _doc(again) == _doc(made)
