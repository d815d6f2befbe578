"""A long run's sampled series read node by node from its kept form (`load_cache.KeptSeries`).

`analyze` of a run whose merged form is kept reads the run without its series in this
process, and each worker of the diagnosis in parts reads its own nodes' (`part_workers`),
so that no process holds them all. What must hold: a node's rows read so are exactly the rows
`parts.cut` takes from the whole run (kept whole or file by file); the parts are cut as the
whole run is; the JSON document is the single process's, to the byte; a run diagnosed in one
process after all reads its series first; and a kept form made again meanwhile gives one line
and a non-zero exit, never a wrong answer.
"""

from __future__ import annotations

import dataclasses
import html
import json
import shutil

import pandas as pd
import pandas.testing as pdt
import pytest
from conftest import SHARED_FIXTURES

from gpuprof import api, keep_by_file, load_cache, loader, store
from gpuprof.analyzers import diagnose as diagnose_module
from gpuprof.analyzers.part_workers import WorkerParts
from gpuprof.analyzers.parts import cut, node_groups
from gpuprof.model import NODE_READ_TABLES, RECORD_TYPES
from gpuprof.reports.fmt import render_json
from gpuprof.sim import Pathology, SimConfig, simulate

HOST_ROWS = {"host": 1000, "procs": 2000, "gpu_procs": 1000}


@pytest.fixture(scope="module")
def recorded(tmp_path_factory):
    """Three nodes (8, 8 and 4 GPUs) with a straggler and slow reward scoring, as written;
    besides its step events, a framework's knobs (node0) and spans a full queue dropped
    (node1)."""
    cfg = SimConfig(gpus=20, gpus_per_host=8, steps=10, seed=7,
                    pathologies=[Pathology("reward_bound", 0.6),
                                 Pathology("imbalance", 0.6)])  # fmt: skip
    run = simulate(cfg).run
    t = int(run.meta.start_ns)
    other = pd.DataFrame([
        {"host": "node0", "pid": 10000, "rank": 0, "t_ns": t + 5, "kind": "knobs",
         "name": "verl", "attrs": {"knobs": {"actor_rollout_ref.rollout.n": 8}}},
        {"host": "node1", "pid": 10008, "rank": 8, "t_ns": t + 9, "kind": "dropped",
         "name": "spans", "attrs": {"spans": 5}},
    ])  # fmt: skip
    events = pd.concat([run.events, other], ignore_index=True)
    path = tmp_path_factory.mktemp("kept_series") / "run"
    store.save_run(dataclasses.replace(run, events=events), path)
    return path


def _long_budgets(recorded, monkeypatch) -> int:
    monkeypatch.delenv(load_cache.ENV_CACHE, raising=False)
    monkeypatch.setattr(loader, "MAX_HOST_ROWS", HOST_ROWS)
    monkeypatch.setattr(keep_by_file, "PART_ROWS", 1000)
    budget = store.count_rows(recorded, "gpu") // 10
    monkeypatch.setattr(loader, "MAX_GPU_SAMPLES", budget)
    return budget


@pytest.fixture
def long_budgets(recorded, monkeypatch):
    """Budgets small enough that the run is merged, as a long run is; kept forms on. Returns
    the GPU samples' budget."""
    return _long_budgets(recorded, monkeypatch)


class KeptForms:
    """The run's kept forms (``how``: whole, or file by file), merged as a long run is, each
    made once (`made`), and `api.analyze`'s documents of the whole run (`document`), each
    made once: every test asking for them would make the same."""

    def __init__(self, recorded, tmp_path_factory) -> None:
        self.recorded, self.tmp_path_factory = recorded, tmp_path_factory
        self._made: dict = {}
        self._documents: dict = {}

    def made(self, how: str):
        """The run directory with its kept form, and the whole run as `load_for_analysis`
        loaded it when it kept its form (under `long_budgets`'s budgets)."""
        if how not in self._made:
            with pytest.MonkeyPatch.context() as mp:
                budget = _long_budgets(self.recorded, mp)
                run_dir = self.tmp_path_factory.mktemp("kept") / how
                shutil.copytree(self.recorded, run_dir)
                if how == "by file":
                    assert keep_by_file.build(run_dir, workers=2)
                whole = loader.load_for_analysis(run_dir, budget, workers=1)  # keeps its form
                assert (run_dir / load_cache.DIRNAME / "run.json").exists()
            self._made[how] = run_dir, whole
        return self._made[how]

    def document(self, how: str, **options) -> str:
        """``render_json(api.analyze(whole, workers=1, **options).to_dict())``."""
        key = (how, tuple(sorted(options.items())))
        if key not in self._documents:
            whole = self.made(how)[1]
            self._documents[key] = render_json(api.analyze(whole, workers=1, **options).to_dict())
        return self._documents[key]


@pytest.fixture(scope="module")
def kept_forms(recorded, tmp_path_factory):
    return KeptForms(recorded, tmp_path_factory)


class _Kept:
    def __init__(self, forms: KeptForms, tmp_path) -> None:
        self.forms, self.tmp_path = forms, tmp_path
        self.document = forms.document

    def __call__(self, how: str):
        made, whole = self.forms.made(how)
        run_dir = self.tmp_path / how
        shutil.copytree(made, run_dir)  # its kept form too: the files' times are copied
        tables = {t: getattr(whole, t).copy() for t in RECORD_TYPES}
        return run_dir, dataclasses.replace(whole, **tables)


@pytest.fixture
def kept(kept_forms, tmp_path, long_budgets):
    """Make the run's kept form (``how``: whole, or file by file), merged as a long run is;
    returns the run directory and the whole run as `load_for_analysis` loads it (both this
    test's own copies of those `kept_forms` made). ``kept.document(how, **options)``:
    ``render_json(api.analyze(whole, workers=1, **options).to_dict())``, made once."""
    return _Kept(kept_forms, tmp_path)


@pytest.fixture
def small_runs_in_parts(monkeypatch):
    """Every multi-node run goes to the workers, however small; the parts made are listed."""
    monkeypatch.setattr(diagnose_module, "PARTS_MIN_SAMPLES", 1)
    monkeypatch.setattr(diagnose_module, "PARTS_MIN_SAMPLES_FEW", 1)
    monkeypatch.setattr(diagnose_module, "PARTS_MIN_WORKERS", 2)
    made = []
    real = WorkerParts.__init__

    def counting(self, *args, **kwargs):
        made.append(kwargs.get("series"))
        real(self, *args, **kwargs)

    monkeypatch.setattr(WorkerParts, "__init__", counting)
    return made


@pytest.mark.parametrize("how", ["whole", "by file"])
def test_a_nodes_series_read_alone_are_the_rows_the_part_cuts(kept, how):
    run_dir, whole = kept(how)
    light, series = loader.load_for_diagnosis(run_dir, defer_from=1)
    assert series is not None and series.rows["gpu"] == len(whole.gpu)
    assert len(whole.spans) and series.rows["spans"] == len(whole.spans)
    # the sampled series, the spans and the step events are read by whoever holds the nodes;
    # the parent reads the other events
    assert set(NODE_READ_TABLES) == {"gpu", "procs", "gpu_procs", "host", "spans", "events"}
    steps = (whole.events["kind"] == "step").to_numpy(bool)
    assert steps.sum() > 100 and set(whole.events["kind"][~steps]) == {"knobs", "dropped"}
    pdt.assert_frame_equal(light.events, whole.events[~steps].reset_index(drop=True),
                           check_exact=True)  # fmt: skip
    for table in set(NODE_READ_TABLES) - {"events"}:  # no rows, the kept columns
        assert len(getattr(light, table)) == 0
        assert list(getattr(light, table).columns) == list(getattr(whole, table).columns)
    for table in set(RECORD_TYPES) - set(NODE_READ_TABLES):
        pdt.assert_frame_equal(getattr(light, table), getattr(whole, table), check_exact=True)
    assert light.meta.to_dict() == whole.meta.to_dict()
    hosts = sorted(whole.gpu["host"].unique())
    assert len(hosts) == 3
    for group in ([hosts[0]], hosts[1:], hosts, ["no such node"]):
        want = cut(whole, group)
        read = series.read(group)
        assert sorted(read) == sorted(NODE_READ_TABLES)
        for table, frame in read.items():
            pdt.assert_frame_equal(frame, getattr(want, table), check_exact=True)
            assert frame.attrs == getattr(want, table).attrs, table
    everything = series.read()
    for table in NODE_READ_TABLES:
        pdt.assert_frame_equal(everything[table], getattr(whole, table), check_exact=True)


@pytest.mark.parametrize("parts", [None, 2, 3, 5])
def test_the_parts_are_cut_as_the_whole_runs_are(kept, parts):
    run_dir, whole = kept("whole")
    light, series = loader.load_for_diagnosis(run_dir, defer_from=1)
    assert node_groups(light, parts, series=series) == node_groups(whole, parts)
    finite, counts, named = series.census()
    assert finite
    assert counts == whole.gpu["host"].astype(object).value_counts().to_dict()
    assert named == {str(h) for t in NODE_READ_TABLES for h in getattr(whole, t)["host"].unique()}


def test_a_run_without_utilisation_readings_is_not_cut(recorded, tmp_path, monkeypatch):
    """Phase times alone (a memory-only capture): one part, as the whole run says."""
    monkeypatch.delenv(load_cache.ENV_CACHE, raising=False)
    run = store.load_run(recorded)
    run.gpu["util_gpu_pct"] = float("nan")
    store.save_run(run, tmp_path / "no util")
    whole = loader.load_for_analysis(tmp_path / "no util")  # keeps its form
    light, series = loader.load_for_diagnosis(tmp_path / "no util", defer_from=1)
    assert series.census()[0] is False
    assert node_groups(light, 2, series=series) is None is node_groups(whole, 2)


@pytest.mark.parametrize("how", ["whole", "by file"])
def test_the_diagnosis_from_series_read_node_by_node_is_the_single_process_one(
    kept, how, small_runs_in_parts
):
    run_dir, _ = kept(how)
    want = kept.document(how, gpu="A100")  # `api.analyze(whole, workers=1, gpu="A100")`
    light, series = loader.load_for_diagnosis(run_dir, defer_from=1)
    got = api.analyze(light, workers=3, gpu="A100", series=series).to_dict()
    assert small_runs_in_parts == [series]  # in parts, each reading its own nodes
    assert len(light.gpu) == 0  # this process read none of the series
    assert render_json(got) == want


def test_in_one_process_after_all_the_series_are_read_first(kept, small_runs_in_parts):
    run_dir, _ = kept("whole")
    want = kept.document("whole")  # `api.analyze(whole, workers=1)`, made once
    light, series = loader.load_for_diagnosis(run_dir, defer_from=1)
    assert render_json(api.analyze(light, workers=1, series=series).to_dict()) == want
    assert not small_runs_in_parts  # one worker: no parts


def test_a_long_run_analysed_the_first_time_is_kept_file_by_file_then_read_so(
    recorded, tmp_path, long_budgets, small_runs_in_parts, monkeypatch
):
    """No process holds the whole run, not even the first time: its form is kept file by
    file (`keep_by_file`, in a child), then read without its series, as any later time."""
    from gpuprof import by_steps

    run_dir = tmp_path / "first"
    shutil.copytree(recorded, run_dir)
    # more spans than reading it whole may hold
    monkeypatch.setattr(by_steps, "MEMORY_BUDGET_BYTES", 1000 * by_steps.KEEP_SPAN_BYTES)
    assert store.count_rows(run_dir, "spans") > 1000
    monkeypatch.setenv(load_cache.ENV_CACHE, "0")
    want = render_json(api.analyze(loader.load_for_analysis(run_dir, long_budgets)).to_dict())
    monkeypatch.delenv(load_cache.ENV_CACHE)
    wholes = []
    real = loader.load_for_analysis
    monkeypatch.setattr(
        loader, "load_for_analysis", lambda *a, **k: wholes.append(a) or real(*a, **k)
    )
    light, series = loader.load_for_diagnosis(run_dir, workers=2, defer_from=1)
    assert series is not None and not wholes  # never loaded whole
    assert len(json.loads((run_dir / load_cache.DIRNAME / "run.json").read_text())
               ["tables"]["gpu"]["parts"]) > 1  # made file by file  # fmt: skip
    assert render_json(api.analyze(light, workers=2, series=series).to_dict()) == want
    assert small_runs_in_parts == [series]


def test_a_long_run_with_few_spans_analysed_the_first_time_is_loaded_whole(
    recorded, tmp_path, long_budgets, monkeypatch
):
    """Its whole kept form reads faster every later time than one made file by file."""
    run_dir = tmp_path / "few spans"
    shutil.copytree(recorded, run_dir)
    built = []
    monkeypatch.setattr(keep_by_file, "build", lambda *a: built.append(a))
    run, series = loader.load_for_diagnosis(run_dir, workers=2, defer_from=1)
    assert series is None and not built and len(run.gpu) < store.count_rows(run_dir, "gpu")
    kept = json.loads((run_dir / load_cache.DIRNAME / "run.json").read_text())
    assert "parts" not in kept["tables"]["gpu"]  # made whole
    assert loader.load_for_diagnosis(run_dir, workers=2, defer_from=1)[1] is not None


def test_a_short_run_analysed_the_first_time_is_loaded_whole(recorded, tmp_path, monkeypatch):
    monkeypatch.delenv(load_cache.ENV_CACHE, raising=False)
    run_dir = tmp_path / "short"
    shutil.copytree(recorded, run_dir)
    built = []
    monkeypatch.setattr(keep_by_file, "build", lambda *a: built.append(a))
    run, series = loader.load_for_diagnosis(run_dir, workers=2, defer_from=1)
    assert series is None and not built  # under the budget: read whole, as recorded
    assert len(run.gpu) == store.count_rows(run_dir, "gpu")
    # kept as it was loaded: the next time, its series are read by the workers
    assert loader.load_for_diagnosis(run_dir, workers=2, defer_from=1)[1] is not None


def test_a_run_under_the_threshold_is_read_whole(kept):
    run_dir, whole = kept("whole")
    run, series = loader.load_for_diagnosis(run_dir, defer_from=len(whole.gpu) + 1)
    assert series is None
    pdt.assert_frame_equal(run.gpu, whole.gpu)
    run, series = loader.load_for_diagnosis(run_dir, defer_from=None)
    assert series is None and len(run.gpu) == len(whole.gpu)


def test_a_kept_form_made_again_meanwhile_is_told(kept, small_runs_in_parts):
    run_dir, whole = kept("whole")
    light, series = loader.load_for_diagnosis(run_dir, defer_from=1)
    _, unread = loader.load_for_diagnosis(run_dir, defer_from=1)
    census = series.census()  # read once, kept
    made = load_cache.key(run_dir, loader.kept_settings(loader.MAX_GPU_SAMPLES, None))
    assert load_cache.write(run_dir, made, whole)  # another load kept it again: a new writing
    for read in (lambda: series.read(["node0"]), series.read, unread.census):
        with pytest.raises(load_cache.SeriesUnreadable, match="changed, or does not read"):
            read()
    assert series.census() == census
    with pytest.raises(load_cache.SeriesUnreadable, match="changed, or does not read"):
        api.analyze(light, workers=2, series=unread)
    assert not small_runs_in_parts  # found before any part was made
    # the parts cut before it changed: no worker reads its part, nor then this process
    with pytest.raises(load_cache.SeriesUnreadable, match="changed, or does not read"):
        api.analyze(light, workers=2, series=series)
    assert small_runs_in_parts == [series]


def test_analyze_reads_the_run_afresh_when_its_kept_series_do_not_read(
    kept, small_runs_in_parts, capsys
):
    """A damaged series file (or a kept form made again while the parts were made) costs
    time, never a wrong answer or a failed command: the run is read afresh, as any load
    does with a kept form that does not read."""
    from gpuprof.cli import analyze_command

    run_dir, _ = kept("whole")
    want = kept.document("whole")  # `api.analyze(whole, workers=1)`, made once
    (run_dir / load_cache.DIRNAME / "gpu.arrow").write_bytes(b"not arrow")
    analyze_command(run_dir, json_out=True, workers=2)
    assert capsys.readouterr().out.strip() == want.strip()
    assert small_runs_in_parts == [None]  # the census did not read: parts of the run read afresh
    # and the kept form is whole again
    assert loader.load_for_diagnosis(run_dir, defer_from=1)[1].census()[0]


def test_a_long_runs_kept_form_damaged_once_found_is_read_afresh_under_the_memory_rule(
    kept, small_runs_in_parts, capsys, monkeypatch
):
    """A long run's kept form damaged (or made again) between its finding and the reading of
    its series is read afresh as the first time reads a long run (kept file by file, its
    series read by the workers), and the memory its diagnosis needs is judged again: the run
    is never read whole behind the rule's back."""
    from gpuprof import footprint
    from gpuprof.cli import analyze_command

    run_dir, _ = kept("whole")
    want = kept.document("whole")  # `api.analyze(whole, workers=1)`, made once
    monkeypatch.setattr(loader, "_first_of_long", lambda *a: True)  # read as a long run is
    real_load, loads = loader.load_for_diagnosis, []

    def damaged_once_found(*args, **kwargs):
        got = real_load(*args, **kwargs)
        loads.append(got[1])
        if len(loads) % 2:  # the first of each command's two readings
            for table in (run_dir / load_cache.DIRNAME).glob("gpu*.arrow"):  # whole or by file
                table.write_bytes(b"not arrow")
        return got

    monkeypatch.setattr(loader, "load_for_diagnosis", damaged_once_found)
    asked = []
    monkeypatch.setattr(footprint, "available_bytes", lambda: asked.append(1) or 10**15)
    analyze_command(run_dir, json_out=True, workers=2)
    assert capsys.readouterr().out.strip() == want.strip()
    assert len(loads) == 2 and all(series is not None for series in loads)
    assert len(asked) == 2  # judged when found, and again when read afresh
    assert small_runs_in_parts == [loads[1]]  # the damage was found before a part was made
    # and now too large for the memory free when read afresh: one line, exit 3
    monkeypatch.setattr(footprint, "available_bytes",
                        lambda: asked.append(1) or (10**15 if len(asked) == 3 else 1))  # fmt: skip
    with pytest.raises(SystemExit) as stopped:
        analyze_command(run_dir, json_out=True, workers=2)
    assert stopped.value.code == 3
    said = capsys.readouterr()
    assert said.out == "" and said.err.count("\n") == 1 and "--by-steps" in said.err
    assert len(loads) == 4 and len(asked) == 4 and len(small_runs_in_parts) == 1


def test_analyze_reads_the_series_node_by_node_with_the_same_document(
    kept, small_runs_in_parts, capsys
):
    from gpuprof.cli import analyze_command

    run_dir, _ = kept("whole")
    want = kept.document("whole")  # `api.analyze(whole, workers=1)`, made once
    analyze_command(run_dir, json_out=True, workers=2)
    assert len(small_runs_in_parts) == 1 and small_runs_in_parts[0] is not None
    assert capsys.readouterr().out.strip() == want.strip()
    analyze_command(run_dir, json_out=True, workers=1)  # one process: the run read whole
    assert len(small_runs_in_parts) == 1
    assert capsys.readouterr().out.strip() == want.strip()


def test_a_whole_diagnosis_too_large_for_the_memory_free_is_held_within_it(
    kept, small_runs_in_parts, capsys, monkeypatch
):
    """Before the parts are made, `analyze` estimates the memory the whole diagnosis will
    hold (`footprint`): more than is free, it holds the diagnosis within it (node by node,
    `held_parts`) and says so in one line; where not even that fits, one line names the
    ways out and exit 3, nothing diagnosed and nothing on stdout; ``--ignore-memory``
    diagnoses all the same, and memory that cannot be told judges nothing."""
    from gpuprof import footprint
    from gpuprof.cli import analyze_command, plain_call

    run_dir, whole = kept("whole")
    want = kept.document("whole")  # `api.analyze(whole, workers=1)`, made once
    rows = {"gpu": len(whole.gpu), "spans": len(whole.spans)}
    need = footprint.whole_diagnosis_bytes(rows, 2)
    per_process = footprint.BASE_BYTES + 16 * (rows["gpu"] + rows["spans"])
    assert need == 650 * rows["gpu"] + 460 * rows["spans"] + 2 * per_process
    monkeypatch.setattr(footprint, "available_bytes", lambda: need - 1)
    # a process held within a limit needs ~0.3 GB, more than all of this small run: as
    # for a large run, where holding it is what fits
    held_base = footprint.HELD_BASE_BYTES
    monkeypatch.setattr(footprint, "HELD_BASE_BYTES", 10**7)
    monkeypatch.setattr(footprint, "HELD_WORKER_BASE_BYTES", 10**7)
    analyze_command(run_dir, json_out=True, workers=2)  # held within the memory free
    said = capsys.readouterr()
    assert said.out.strip() == want.strip() and said.err.count("\n") == 1
    assert f"would hold about {need / 1e9:.1f} GB and {(need - 1) / 1e9:.1f} GB" in said.err
    assert f"diagnosed within {int((need - 1) * 0.8) / 1e9:.1f} GB on 2 processes," in said.err
    assert len(small_runs_in_parts) == 1
    # not even one process with its nodes: one line, exit 3
    monkeypatch.setattr(footprint, "HELD_BASE_BYTES", held_base)
    with pytest.raises(SystemExit) as stopped:
        analyze_command(run_dir, json_out=True, workers=2)
    assert stopped.value.code == 3
    said = capsys.readouterr()
    assert said.out == "" and said.err.count("\n") == 1
    assert f"({rows['gpu']:,} merged GPU samples" in said.err
    assert "--by-steps" in said.err and "--ignore-memory" in said.err
    assert len(small_runs_in_parts) == 1  # no part made
    body, kwargs = plain_call(["analyze", str(run_dir), "--json", "--ignore-memory"])
    body(**kwargs, workers=2)
    assert capsys.readouterr().out.strip() == want.strip()
    monkeypatch.setattr(footprint, "available_bytes", lambda: need)  # it fits
    analyze_command(run_dir, json_out=True, workers=2)
    assert capsys.readouterr().out.strip() == want.strip()
    monkeypatch.setattr(footprint, "available_bytes", lambda: 0)  # unknown
    analyze_command(run_dir, json_out=True, workers=2)
    assert capsys.readouterr().out.strip() == want.strip()
    assert len(small_runs_in_parts) == 4
    # each worker holds its own copies of whole-run figures: on fewer, it may fit
    monkeypatch.setattr(footprint, "available_bytes", lambda: need)
    with pytest.raises(SystemExit) as stopped:
        analyze_command(run_dir, json_out=True, workers=4)
    assert stopped.value.code == 3
    said = capsys.readouterr().err
    assert f"4 workers) and {need / 1e9:.1f} GB of memory are free" in said
    assert f"on fewer workers (--workers 2: about {need / 1e9:.1f} GB)" in said
    assert footprint.workers_that_fit(rows, 4, need - 1) == 0  # not even two
    # not asked for (all the cores, here four): diagnosed on the fewer that fit, said so
    monkeypatch.setenv("GPUPROF_WORKERS", "4")
    analyze_command(run_dir, json_out=True)
    said = capsys.readouterr()
    assert said.out.strip() == want.strip()
    gb = f"{need / 1e9:.1f} GB"
    assert said.err == (f"gpuprof: {run_dir} is diagnosed on 2 workers, not 4: about {gb}, "
                        f"and {gb} of memory are free\n")  # fmt: skip


def test_a_run_read_whole_is_not_judged_by_the_estimate(kept, capsys, monkeypatch):
    """A run below the parts' threshold is read whole, as every small run is: the estimate,
    made for the diagnosis in parts, does not stop it."""
    from gpuprof import footprint
    from gpuprof.cli import analyze_command

    run_dir, _ = kept("whole")
    monkeypatch.setattr(footprint, "available_bytes", lambda: 1)
    analyze_command(run_dir, json_out=True, workers=2)
    assert json.loads(capsys.readouterr().out)["summary"]["gpus"] > 0


REAL = sorted(p for p in SHARED_FIXTURES.rglob("*") if p.is_file() and p.name != "README.md")
TOGETHER = ("rtx4090_inference.csv", "repeated_header.csv", "epoch_custom_header.csv",
            "v100_node_scrape_excerpt.txt")  # fmt: skip
"""Real files of four GPUs' samples imported as one run: four hosts, real dtypes and gaps."""


@pytest.mark.skipif(not REAL, reason="no shared fixtures")
@pytest.mark.parametrize(
    "paths", [[p] for p in REAL] + [[p for p in REAL if p.name in TOGETHER]],
    ids=[p.name for p in REAL] + ["four files as one run"],
)  # fmt: skip
def test_real_third_party_files_read_without_their_series_give_the_same(
    paths, tmp_path, monkeypatch, small_runs_in_parts
):
    """Files users have (nvidia-smi, DCGM, profiler traces, verl logs), kept as any finished
    run is: read without their series, each host's series read alone are its rows of the whole
    run, the parts are cut as the whole run's are, and the document is the same, in one
    process and (several hosts) in parts that read their own."""
    monkeypatch.delenv(load_cache.ENV_CACHE, raising=False)
    try:
        run_dir = api.import_files(paths, tmp_path / "run")
    except Exception as exc:  # a file the importer refuses has nothing to keep
        pytest.skip(f"not importable alone: {exc}")
    whole = loader.load_for_analysis(run_dir, workers=1)
    light, series = loader.load_for_diagnosis(run_dir, defer_from=1)
    if series is None:  # not kept (unfinished), or no GPU sample to read apart
        assert whole.meta.end_ns is None or not len(whole.gpu)
        pytest.skip("not kept, or no GPU sample")
    for table, frame in series.read().items():
        pdt.assert_frame_equal(frame, getattr(whole, table), check_exact=True)
    hosts = {str(h) for t in NODE_READ_TABLES for h in getattr(whole, t)["host"].dropna()}
    assert len(hosts) == (4 if len(paths) > 1 else 1)
    for host in hosts:
        want = cut(whole, [host])
        for table, frame in series.read([host]).items():
            pdt.assert_frame_equal(frame, getattr(want, table), check_exact=True)
    for parts in (None, 2):
        assert node_groups(light, parts, series=series) == node_groups(whole, parts)
    want = render_json(api.analyze(whole, workers=1).to_dict())
    assert render_json(api.analyze(light, workers=1, series=series).to_dict()) == want
    if len(hosts) > 1:
        # the nodes' samples are uneven (90, 1, 224, 2 619): still two parts
        assert len(node_groups(light, 2, series=series)) == 2
        assert render_json(api.analyze(light, workers=2, series=series).to_dict()) == want
        assert small_runs_in_parts == [series]


def test_the_end_of_a_watch_diagnoses_a_long_run_in_parts_then_reports_it(
    kept, small_runs_in_parts, capsys, monkeypatch
):
    """The end of a watch reads a long run as ``analyze`` does (each worker its own nodes'
    series), then whole for the summary and the report: the same document; too large for
    the memory free, one line naming the stretch-by-stretch commands, and nothing made."""
    from gpuprof import footprint, watch_end

    run_dir, whole = kept("whole")
    want = json.loads(kept.document("whole"))  # `api.analyze(whole, workers=1)`, made once
    monkeypatch.setenv("GPUPROF_WORKERS", "2")
    made = watch_end.finish(run_dir, quiet=False)
    assert len(small_runs_in_parts) == 1 and small_runs_in_parts[0] is not None
    assert made.document == want
    assert made.report == run_dir / "report.html" and made.report.exists()
    err = capsys.readouterr().err
    assert "run saved to" in err and "full diagnosis:" in err and "gpuprof: error" not in err
    made.report.unlink()
    rows = {"gpu": len(whole.gpu), "spans": len(whole.spans)}
    monkeypatch.setattr(footprint, "available_bytes",
                        lambda: footprint.whole_diagnosis_bytes(rows, 2) - 1)  # fmt: skip
    made = watch_end.finish(run_dir, quiet=False)
    assert made.report is None and made.document is None
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "are not made here" in err[0]
    assert f"gpuprof analyze {run_dir} --by-steps 24" in err[0]
    assert f"gpuprof analyze {run_dir} holds its diagnosis within the memory free" in err[0]
    assert not (run_dir / "report.html").exists() and len(small_runs_in_parts) == 1
    # four cores, memory for two: diagnosed on two, said in one line, the same document
    monkeypatch.setenv("GPUPROF_WORKERS", "4")
    monkeypatch.setattr(footprint, "available_bytes",
                        lambda: footprint.whole_diagnosis_bytes(rows, 2))  # fmt: skip
    made = watch_end.finish(run_dir, quiet=False)
    assert made.document == want and made.report.exists()
    assert "is diagnosed on 2 workers, not 4" in capsys.readouterr().err
    made.report.unlink()
    assert watch_end.finish(run_dir, quiet=True).document == want  # --quiet: not a word
    assert capsys.readouterr().err == ""


def test_report_diagnoses_a_long_run_as_analyze_does_and_says_when_it_will_not_fit(
    kept, small_runs_in_parts, capsys, monkeypatch
):
    """``report`` of a long run: its diagnosis in parts that read their own series (the one
    ``analyze`` prints), then the run read whole for the charts; too large for the memory
    free: one line and exit 3, no report; ``--ignore-memory``: made all the same."""
    from test_report_html import report_data

    from gpuprof import footprint
    from gpuprof.cli import plain_call, report_command

    run_dir, whole = kept("whole")
    want = json.loads(kept.document("whole"))  # `api.analyze(whole, workers=1)`, made once
    report_command(run_dir, workers=2)
    assert capsys.readouterr().out.strip() == str(run_dir / "report.html")
    assert len(small_runs_in_parts) == 1 and small_runs_in_parts[0] is not None
    page = (run_dir / "report.html").read_text()
    assert want["findings"] and all(html.escape(f["summary"]) in page for f in want["findings"])
    assert report_data(page)["figures"]["gp-steps"]["data"]  # the charts of the whole run
    (run_dir / "report.html").unlink()
    rows = {"gpu": len(whole.gpu), "spans": len(whole.spans)}
    monkeypatch.setattr(footprint, "available_bytes",
                        lambda: footprint.whole_diagnosis_bytes(rows, 2) - 1)  # fmt: skip
    with pytest.raises(SystemExit) as stopped:
        report_command(run_dir, workers=2)
    assert stopped.value.code == 3
    said = capsys.readouterr()
    assert said.out == "" and said.err.count("\n") == 1 and "--by-steps" in said.err
    assert not (run_dir / "report.html").exists() and len(small_runs_in_parts) == 1
    # more workers asked for than fit: the line names fewer, not analyze's --max-memory
    monkeypatch.setattr(footprint, "available_bytes",
                        lambda: footprint.whole_diagnosis_bytes(rows, 2))  # fmt: skip
    with pytest.raises(SystemExit) as stopped:
        report_command(run_dir, workers=4)
    said = capsys.readouterr()
    assert stopped.value.code == 3 and said.err.count("\n") == 1
    assert "--workers 2" in said.err and "--max-memory" not in said.err
    body, kwargs = plain_call(["report", str(run_dir), "--ignore-memory"])
    body(**kwargs, workers=2)
    assert (run_dir / "report.html").exists() and len(small_runs_in_parts) == 2
