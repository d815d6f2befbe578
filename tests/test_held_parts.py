"""A diagnosis held within a memory budget (`analyzers.held_parts`, ``analyze --max-memory``).

The run is diagnosed node by node; each process keeps the nodes it used last and writes the
others to disk, reading them back when next used. What must hold: the JSON document is the
one the run diagnosed in memory gives, to the byte, even when every part goes to disk after
every call; what a part holds comes back as it was (a frame two figures share is one frame,
a frame changed in place is written again); the files go when the diagnosis ends, and a dead
process's are cleared by the next; a disk that cannot take them stops the diagnosis with one
line, never a half answer nor a silent read of the whole run; and ``analyze`` holds a run
too large for the memory free within it, saying so in one line.
"""

from __future__ import annotations

import json
import mmap
import os
import shutil
import subprocess
import sys
import threading

import numpy as np
import pandas as pd
import pytest
import test_kept_series
from test_parts import _run, whole_document

from gpuprof import api, footprint, load_cache, loader, store
from gpuprof.analyzers import held_parts
from gpuprof.analyzers.diagnose import diagnose, diagnose_parts
from gpuprof.analyzers.findings import AnalysisContext
from gpuprof.analyzers.held_parts import HeldParts, SpillFailed, context_bytes
from gpuprof.analyzers.part_workers import WorkerParts
from gpuprof.cli import memory_size
from gpuprof.reports.fmt import render_json
from gpuprof.store import RunError

# the long run kept as `test_kept_series` keeps it (three nodes, merged, its form kept)
recorded = test_kept_series.recorded
long_budgets = test_kept_series.long_budgets
kept_forms = test_kept_series.kept_forms
kept = test_kept_series.kept
small_runs_in_parts = test_kept_series.small_runs_in_parts


@pytest.mark.parametrize("case", ["hosts", "bubbles", "offload", "straggler", "split"])
@pytest.mark.parametrize("workers", [1, 2])
def test_parts_written_out_after_every_call_give_the_document_held_in_memory(
    case, workers, tmp_path
):
    run = _run(case)
    want = render_json(whole_document(case))  # `diagnose(run, workers=1)`, made once
    got = diagnose(run, workers=workers, budget=1, spill_dir=str(tmp_path))
    assert render_json(got.to_dict()) == want
    assert list(tmp_path.iterdir()) == []  # every process removed its files


def test_every_part_but_the_one_in_use_goes_to_disk_and_comes_back(tmp_path):
    run = _run("bubbles")
    with WorkerParts(run, 1, budget=1, spill_dir=str(tmp_path)) as parts:
        assert parts.count == 3  # one part a node, all in this process
        diagnose_parts(parts)
        spills, restores = parts.spilled
        assert list(tmp_path.glob(f"{held_parts.PREFIX}{os.getpid()}-*"))  # written here
    # each call uses every part: all but one written out and read back each time
    assert spills > 100 and restores > 100
    assert list(tmp_path.iterdir()) == []


def _toy_parts(tmp_path, count=2, budget=1):
    run = _run("busy")
    return HeldParts(lambda i: AnalysisContext(run), count, budget=budget, spill_dir=tmp_path)


def _remember(ctx, name, value):
    ctx.__dict__[name] = value


def test_what_a_part_holds_comes_back_as_it_was(tmp_path):
    frame = pd.DataFrame({"a": np.arange(100_000), "b": np.ones(100_000)})
    with _toy_parts(tmp_path) as held:
        held.map(_remember, ("_frame", frame))
        held.map(_pair_up)  # one frame, two entries
        held.map(_remember, ("_memo", {"k": np.arange(50_000, dtype=np.float64)}))
        held.map(_claim_even)
        back = held.map(_held_figures)
        # each call starts with the part the last one ended with: one written out a call
        assert (held.spills, held.restores) == (5, 4)
    for frame_, pair, memo, claimed, found in back:
        pd.testing.assert_frame_equal(frame_, frame)
        assert pair[0] is frame_ and pair[1] == 7  # still one frame
        assert np.array_equal(memo["k"], np.arange(50_000, dtype=np.float64))
        assert claimed.sum() == (len(claimed) + 1) // 2
        assert found is held._found  # the run's findings, set again


def _pair_up(ctx):
    ctx.__dict__["_pair"] = (ctx.__dict__["_frame"], 7)


def _claim_even(ctx):
    ctx.claim(np.arange(len(ctx.samples)) % 2 == 0)


def _held_figures(ctx):
    d = ctx.__dict__
    return d["_frame"], d["_pair"], d["_memo"], ctx.claimed.copy(), ctx.found


def _add_column(ctx):
    ctx.__dict__["_frame"]["c"] = 3.0  # in place: the frame written before is stale


def test_a_frame_changed_in_place_is_written_again(tmp_path):
    with _toy_parts(tmp_path) as held:
        held.map(_remember, ("_frame", pd.DataFrame({"a": np.arange(100_000)})))
        held.map(lambda ctx: None)  # both written out once
        held.map(_add_column)
        got = held.map(lambda ctx: list(ctx.__dict__["_frame"].columns))
        got += held.map(lambda ctx: list(ctx.__dict__["_frame"].columns))
    assert got == [["a", "c"]] * 4


def _set_column(ctx):
    ctx.__dict__["_frame"]["a"] = -ctx.__dict__["_frame"]["a"]  # a column set anew


def test_a_column_set_anew_is_written_again(tmp_path):
    with _toy_parts(tmp_path) as held:
        held.map(_remember, ("_frame", pd.DataFrame({"a": np.arange(100_000), "b": 1.0})))
        held.map(lambda ctx: None)  # both written out once
        held.map(_set_column)
        got = held.map(lambda ctx: int(ctx.__dict__["_frame"]["a"].sum()))
        got += held.map(lambda ctx: int(ctx.__dict__["_frame"]["a"].sum()))
    assert got == [-sum(range(100_000))] * 4


def test_arrays_read_back_are_views_of_the_file_that_writes_do_not_change(tmp_path):
    items = held_parts._Items(tmp_path / "items")
    frame = pd.DataFrame({"a": np.arange(100_000), "t": pd.array(["x", "y"] * 50_000)})
    small = np.arange(100)

    def back(token):
        with open(items.path, "rb") as handle:
            return items.load(token, handle.fileno())

    pd.testing.assert_frame_equal(back(items.token(frame)), frame)
    assert _held_by(back(items.token(frame))) is mmap.mmap
    assert np.array_equal(back(items.token(small)), small)
    token = items.token(np.arange(100_000))
    values = back(token)
    assert values.flags.writeable and not values.flags.owndata  # a view, not a copy
    assert values.ctypes.data % held_parts.ALIGN == 0
    values[0] = -1  # a private map: the page is copied, the file is as written
    assert back(token)[0] == 0


def test_a_file_system_that_cannot_map_reads_the_parts_back_all_the_same(tmp_path, monkeypatch):
    def no_maps(*args, **kwargs):
        raise OSError(19, "No such device")

    monkeypatch.setattr(held_parts.mmap, "mmap", no_maps)
    frame = pd.DataFrame({"a": np.arange(100_000), "b": np.ones(100_000)})
    with _toy_parts(tmp_path) as held:
        held.map(_remember, ("_frame", frame))
        held.map(lambda ctx: None)
        back = held.map(lambda ctx: ctx.__dict__["_frame"])
        assert held.restores >= 2
    for got in back:
        pd.testing.assert_frame_equal(got, frame)
    assert {_held_by(got) for got in back} == {bytearray}  # read into memory, not mapped


def _held_by(frame):
    """The type of what holds the memory of ``frame``'s first block."""
    values = frame._mgr.blocks[0].values
    while isinstance(values, np.ndarray):
        values = values.base
    return type(values.obj) if isinstance(values, memoryview) else type(values)


def test_a_file_of_objects_cut_short_stops_the_parts(tmp_path):
    items = held_parts._Items(tmp_path / "items")
    token = items.token(np.arange(100_000))
    with open(items.path, "r+b") as handle:
        handle.truncate(1000)
    with open(items.path, "rb") as handle, pytest.raises((OSError, ValueError)):
        items.load(token, handle.fileno())


def test_arrays_of_text_come_back_as_they_were(tmp_path):
    items = held_parts._Items(tmp_path / "items")
    texts = np.array(["node-a", "node-b", "node-a"] * 1000, dtype=object)
    frame = pd.DataFrame({"host": texts, "gpu": np.arange(3000)}).astype({"host": object})
    with_none = pd.DataFrame({"host": [*texts[:-1], None]}, dtype=object)
    mixed = pd.DataFrame({"host": [*texts[:-1], None], "attrs": [{"k": 1}] * 3000}, dtype=object)
    block = texts.reshape(3, 1000)
    for obj in (frame, with_none, mixed, block, texts[::2]):
        token = items.token(obj)
        with open(items.path, "rb") as handle:
            back = items.load(token, handle.fileno())
        if isinstance(obj, pd.DataFrame):
            pd.testing.assert_frame_equal(back, obj)
            assert list(back.dtypes) == list(obj.dtypes)
            assert obj is frame or back["host"].iloc[-1] is None  # None is no text
        else:
            assert back.shape == obj.shape and back.dtype == object
            assert back.tolist() == obj.tolist()


def test_a_budget_keeps_the_parts_that_fit_in_memory(tmp_path):
    run = _run("busy")
    one = context_bytes(AnalysisContext(run))
    assert one > 0
    with HeldParts(lambda i: AnalysisContext(run), 4, budget=10**12, spill_dir=tmp_path) as held:
        held.map(lambda ctx: len(ctx.samples))
        held.map(lambda ctx: len(ctx.samples))
        assert held.spills == 0  # all fit
    with HeldParts(lambda i: AnalysisContext(run), 4, budget=None, spill_dir=tmp_path) as held:
        held.map(lambda ctx: len(ctx.samples))
        assert held.spills == 0 and held.budget is None  # no limit
    assert list(tmp_path.iterdir()) == []


def test_a_spill_directory_that_cannot_be_written_stops_the_diagnosis(tmp_path):
    run = _run("hosts")
    blocked = tmp_path / "a file"
    blocked.write_text("not a directory")
    with pytest.raises(RunError, match=r"the diagnosis within 0\.0 GB stopped"):
        diagnose(run, workers=1, budget=1, spill_dir=str(blocked))
    with _toy_parts(blocked) as held, pytest.raises(SpillFailed):
        held.map(lambda ctx: None)


def _unpicklable(ctx):
    ctx.__dict__["_lock"] = threading.Lock()  # TypeError when pickled, not PicklingError


def test_a_figure_that_does_not_pickle_stops_the_parts_rather_than_losing_one(tmp_path):
    """A part that cannot be written out is gone from memory: made again it would have lost
    its claims, so the parts stop instead."""
    with _toy_parts(tmp_path) as held, pytest.raises(SpillFailed, match="cannot pickle"):
        held.map(_unpicklable)


def test_a_part_removed_from_disk_stops_the_parts(tmp_path):
    with _toy_parts(tmp_path) as held:
        held.map(_claim_even)  # part 0 written out
        for path in tmp_path.rglob("part-0.pkl"):
            path.unlink()
        with pytest.raises(SpillFailed, match="does not read back"):
            held.map(_claim_even)


def test_a_worker_that_cannot_write_its_parts_out_says_why_without_a_traceback(tmp_path, capfd):
    run = _run("hosts")  # three nodes: one in this process, two in the worker
    blocked = tmp_path / "a file"
    blocked.write_text("not a directory")
    spilled = []
    real = held_parts.HeldParts._spill

    def spill(self, i):
        spilled.append(os.getpid())
        real(self, i)

    held_parts.HeldParts._spill = spill
    try:
        with pytest.raises(RunError, match="a part could not be written out"):
            diagnose(run, workers=2, budget=1, spill_dir=str(blocked))
    finally:
        held_parts.HeldParts._spill = real
    assert spilled == []  # not in this process: its one node never went to disk
    assert "Traceback" not in capfd.readouterr().err


def test_the_directories_of_dead_processes_are_cleared(tmp_path):
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True, check=True)  # fmt: skip
    gone = tmp_path / f"{held_parts.PREFIX}{dead.stdout.strip()}-abcd"
    mine = tmp_path / f"{held_parts.PREFIX}{os.getpid()}-abcd"
    other = tmp_path / "gpuprof-spill-notes"
    for d in (gone, mine, other):
        d.mkdir()
        (d / "part-0.pkl").write_bytes(b"x")
    held_parts.clear_stale(tmp_path)
    assert not gone.exists() and mine.exists() and other.exists()


def test_the_spill_root_is_named_or_the_runs_directory(tmp_path, monkeypatch):
    monkeypatch.delenv(held_parts.ENV_SPILL_DIR, raising=False)
    assert held_parts.spill_root(tmp_path) == tmp_path
    monkeypatch.setenv(held_parts.ENV_SPILL_DIR, str(tmp_path / "elsewhere"))
    assert held_parts.spill_root(tmp_path) == tmp_path / "elsewhere"


@pytest.mark.parametrize(
    "text, size",
    [("2G", 2 * 10**9), ("1.5GB", 1_500_000_000), ("800m", 800 * 10**6), ("4096", 4096),
     (" 1t ", 10**12), (".5G", 500_000_000)],
)  # fmt: skip
def test_memory_sizes(text, size):
    assert memory_size(text) == size


@pytest.mark.parametrize("text", ["", "2X", "-1G", "0", "G", "1.2.3G", "2 GiB"])
def test_what_is_no_memory_size(text):
    with pytest.raises(ValueError):
        memory_size(text)


def test_within_a_limit_the_processes_that_fit_and_their_parts_budget(monkeypatch):
    rows = {"gpu": 10_000_000, "spans": 10_000_000}
    first, worker = footprint.held_process_bytes(rows), footprint.held_worker_bytes(rows)
    assert first == footprint.HELD_BASE_BYTES + footprint.HELD_ROW_BYTES * 20_000_000
    assert worker == footprint.HELD_WORKER_BASE_BYTES + footprint.HELD_WORKER_ROW_BYTES * 20_000_000
    assert footprint.held_bytes(rows, 1) == first
    assert footprint.held_bytes(rows, 4) == first + 3 * worker
    assert footprint.within(rows, 10**11, 8, 0.1) == footprint.Within(
        8, int(10**11 * footprint.HELD_SHARE) - first - 7 * worker
    )  # a share of the limit kept for what the calls hold at once
    monkeypatch.setattr(footprint, "HELD_SHARE", 1.0)
    node = footprint.part_bytes(1_000_000, 1_000_000)  # a tenth of the run
    got = footprint.within(rows, first + 3 * worker + 4 * node, 8, 0.1)
    assert got == footprint.Within(4, 4 * node)
    assert footprint.within(rows, first + 3 * worker + 4 * node - 1, 8, 0.1).processes == 3
    assert footprint.within(rows, first + node, 8, 0.1) == footprint.Within(1, node)
    assert footprint.within(rows, first + node - 1, 8, 0.1) is None


def test_analyze_holds_a_run_within_max_memory_with_the_same_document(
    kept, small_runs_in_parts, capsys, monkeypatch
):
    from gpuprof.cli import analyze_command

    monkeypatch.delenv(held_parts.ENV_SPILL_DIR, raising=False)
    run_dir, whole = kept("by file")
    want = kept.document("by file")  # `api.analyze(whole, workers=1)`, made once
    rows = {"gpu": len(whole.gpu), "spans": len(whole.spans)}
    written = []
    real_spill = HeldParts._spill
    monkeypatch.setattr(HeldParts, "_spill",
                        lambda self, i: written.append(i) or real_spill(self, i))  # fmt: skip
    # room for one process and about a node's part: the other nodes go to disk
    node = footprint.part_bytes(rows["gpu"], rows["spans"]) // 2
    held = footprint.held_process_bytes(rows) + node
    limit = int(held / footprint.HELD_SHARE) + 1
    analyze_command(run_dir, json_out=True, workers=2, max_memory=limit)
    said = capsys.readouterr()
    assert said.out.strip() == want.strip()
    assert said.err.count("\n") == 1 and f"diagnosed within {limit / 1e9:.1f} GB on 1 " in said.err
    assert f"written to {run_dir} meanwhile" in said.err
    assert written and small_runs_in_parts  # held node by node, parts written out
    assert not list(run_dir.glob(f"{held_parts.PREFIX}*"))  # and removed
    # a limit the whole diagnosis fits in: held in memory, nothing said
    analyze_command(run_dir, json_out=True, workers=2, max_memory=10**15)
    said = capsys.readouterr()
    assert said.out.strip() == want.strip() and said.err == ""
    # not even one process and one node: one line, exit 3
    with pytest.raises(SystemExit) as stopped:
        analyze_command(run_dir, json_out=True, workers=2, max_memory=10**6)
    assert stopped.value.code == 3
    said = capsys.readouterr()
    assert said.out == "" and said.err.count("\n") == 1
    assert "cannot be held within 0.0 GB: node by node" in said.err and "--by-steps" in said.err
    assert "the process that combines the nodes' figures holds about" in said.err


def test_a_disk_without_room_for_the_parts_is_told(kept, small_runs_in_parts, capsys, monkeypatch):
    from gpuprof import cli

    run_dir, whole = kept("whole")
    rows = {"gpu": len(whole.gpu), "spans": len(whole.spans)}
    monkeypatch.setattr(footprint, "HELD_BASE_BYTES", 10**8)  # held takes less than whole
    held = footprint.held_process_bytes(rows) + footprint.part_bytes(rows["gpu"], rows["spans"])
    limit = int(held / footprint.HELD_SHARE) + 1
    assert limit < footprint.whole_diagnosis_bytes(rows, 2)
    monkeypatch.setattr(cli, "_disk_free", lambda path: 1)
    with pytest.raises(SystemExit) as stopped:
        cli.analyze_command(run_dir, json_out=True, workers=2, max_memory=limit)
    assert stopped.value.code == 3
    said = capsys.readouterr()
    assert said.out == "" and said.err.count("\n") == 1
    assert held_parts.ENV_SPILL_DIR in said.err


def test_a_run_of_one_node_too_large_for_the_limit_is_told_so(
    tmp_path, small_runs_in_parts, capsys, monkeypatch
):
    from gpuprof.cli import analyze_command
    from gpuprof.sim import SimConfig, simulate

    run_dir = tmp_path / "one node"
    store.save_run(simulate(SimConfig(gpus=4, steps=4, seed=3)).run, run_dir)
    monkeypatch.delenv(load_cache.ENV_CACHE, raising=False)
    loader.load_for_analysis(run_dir, loader.MAX_GPU_SAMPLES, workers=1)  # its form kept
    with pytest.raises(SystemExit) as stopped:
        analyze_command(run_dir, json_out=True, workers=2, max_memory=10**6)
    assert stopped.value.code == 3
    said = capsys.readouterr()
    assert said.out == "" and said.err.count("\n") == 1
    # not "node by node": a run of one node is never cut
    assert "cannot be held within 0.0 GB: a run of one node is diagnosed whole" in said.err
    assert "node by node" not in said.err and "--by-steps 24" in said.err


@pytest.mark.parametrize("case", ["straggler", "split", "bubbles"])
def test_stragglers_judged_a_stretch_of_steps_at_a_time_are_judged_as_at_once(
    case, monkeypatch, tmp_path
):
    """A cluster-day's rank-steps are too many to hold at once: the straggler figures are
    made a stretch of steps at a time (`imbalance.RANK_STEPS_PER_PASS`). Every phase-step
    lies in one stretch, so the document is the one of one pass, in one process, in parts
    and held within a budget."""
    from gpuprof.analyzers.stalls import imbalance

    run = _run(case)
    want = render_json(whole_document(case))  # `diagnose(run, workers=1)`, made once
    assert '"kind": "imbalance"' in want or case != "straggler"
    windows = []
    real = imbalance._step_windows
    monkeypatch.setattr(imbalance, "_step_windows",
                        lambda p: windows.append(real(p)) or windows[-1])  # fmt: skip
    monkeypatch.setattr(imbalance, "RANK_STEPS_PER_PASS", 40)
    assert render_json(diagnose(run, workers=1).to_dict()) == want
    assert min(len(w) for w in windows) > 3  # judged in stretches
    got = diagnose(run, workers=2, budget=1, spill_dir=str(tmp_path))
    assert render_json(got.to_dict()) == want


@pytest.mark.parametrize("case", ["straggler", "hosts", "comm"])
def test_the_stragglers_of_stretches_are_those_of_one_pass_in_its_order(case, monkeypatch):
    """Row for row and in the same order (the sums over them are taken in that order)."""
    from gpuprof.analyzers.findings import Thresholds
    from gpuprof.analyzers.parts import Parts
    from gpuprof.analyzers.stalls import imbalance

    run = _run(case)
    th = Thresholds(imbalance_spread_frac=0.01)  # many stragglers, in every stretch
    parts = Parts.by_node(run)
    assert parts.count >= 2
    want = imbalance._straggler_rows(parts, th, set())
    monkeypatch.setattr(imbalance, "RANK_STEPS_PER_PASS", 40)
    parts = Parts.by_node(run)
    assert len(imbalance._step_windows(parts)) > 3
    got = imbalance._straggler_rows(parts, th, set())
    assert len(want[0]) > 20
    pd.testing.assert_frame_equal(got[0], want[0], check_exact=True)
    pd.testing.assert_frame_equal(got[1], want[1], check_exact=True)
    # every rank-step of every part kept: the order of one pass, not stretch by stretch
    monkeypatch.setattr(imbalance, "_slowest", lambda per, th: per)
    got = imbalance._straggler_rows(parts, th, set())
    monkeypatch.setattr(imbalance, "RANK_STEPS_PER_PASS", 10**9)
    want = imbalance._straggler_rows(Parts.by_node(run), th, set())
    assert set(want[0]["host"]) == set(run.gpu["host"])
    pd.testing.assert_frame_equal(got[0], want[0], check_exact=True)


def test_a_nodes_read_opens_only_the_kept_files_that_hold_it(kept, monkeypatch):
    """A kept form made file by file names each file's hosts: one node's series are read
    from its files alone (the same rows, `test_kept_series`), not filtered out of all."""
    import pyarrow as pa

    run_dir, whole = kept("by file")
    _, series = loader.load_for_diagnosis(run_dir, defer_from=1)
    spans = json.loads((run_dir / load_cache.DIRNAME / "run.json").read_text())["tables"]["spans"]
    assert len(spans["parts"]) == 3 and all(len(p["hosts"]) == 1 for p in spans["parts"])
    opened = []
    real = pa.memory_map
    monkeypatch.setattr(pa, "memory_map", lambda path, *a: opened.append(path) or real(path, *a))
    host = spans["parts"][1]["hosts"][0]
    got = series.read([host])
    assert [p for p in opened if "/spans." in p] == [str(run_dir / load_cache.DIRNAME /
                                                        spans["parts"][1]["file"])]  # fmt: skip
    assert len(got["spans"]) == int((whole.spans["host"] == host).sum()) > 0
    opened.clear()
    series.read()
    assert len([p for p in opened if "/spans." in p]) == 3


@pytest.fixture(scope="module")
def four_hosts(tmp_path_factory):
    """Public nvidia-smi and DCGM files imported as one run of four hosts and kept (read
    whole once, its form kept as any finished run's), with the document of the run read
    whole; made once per module, the run directory copied by each test."""
    paths = [p for p in test_kept_series.REAL if p.name in test_kept_series.TOGETHER]
    assert len(paths) == 4
    with pytest.MonkeyPatch.context() as mp:
        mp.delenv(load_cache.ENV_CACHE, raising=False)
        run_dir = api.import_files(paths, tmp_path_factory.mktemp("four_hosts") / "run")
        want = render_json(api.analyze(loader.load_for_analysis(run_dir, workers=1)).to_dict())
    return run_dir, want


@pytest.mark.skipif(not test_kept_series.REAL, reason="no shared fixtures")
@pytest.mark.parametrize("workers", [1, 2])
def test_real_files_of_four_hosts_written_out_after_every_call_give_the_same(
    workers, four_hosts, tmp_path, monkeypatch
):
    """Public nvidia-smi and DCGM files imported as one run of four hosts, kept, then held
    within a budget that writes every part out after every call: the document of the run
    read whole."""
    monkeypatch.delenv(load_cache.ENV_CACHE, raising=False)
    made, want = four_hosts
    run_dir = tmp_path / "run"
    shutil.copytree(made, run_dir)  # its kept form too: the files' times are copied
    light, series = loader.load_for_diagnosis(run_dir, defer_from=1)
    assert series is not None
    spill = tmp_path / "spill"
    spill.mkdir()
    got = api.analyze(light, workers=workers, series=series, budget=1, spill_dir=str(spill))
    assert render_json(got.to_dict()) == want
    assert list(spill.iterdir()) == []
