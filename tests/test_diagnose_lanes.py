"""Two groups of detectors run at once in two processes (`analyzers.lanes`) give the diagnosis
one process gives, to the byte, and a child that fails costs nothing but time."""

from __future__ import annotations

import inspect
import os

import numpy as np
import pytest
from conftest import SHARED_FIXTURES

from gpuprof import api
from gpuprof.analyzers import diagnose as diagnose_module
from gpuprof.analyzers import lanes
from gpuprof.analyzers.findings import AnalysisContext, Thresholds
from gpuprof.analyzers.stalls import SIDE_BY_SIDE, STALLS
from gpuprof.reports.fmt import render_json
from gpuprof.sim import Pathology, SimConfig, simulate

pytestmark = pytest.mark.skipif(not hasattr(os, "fork"), reason="lanes need fork")

# every kind a group of the lanes detects, and the two after them that read their findings
KINDS = ["reshard_idle", "generation_tail", "dataloader_starvation", "pipeline_bubble",
         "offload_thrash", "comm_bound", "host_bound", "imbalance", "throttling",
         "memory_headroom", "rollout_bound"]  # fmt: skip


def _doc(run, workers: int) -> str:
    return render_json(api.analyze(run, workers=workers).to_dict())


@pytest.fixture
def always_fork(monkeypatch):
    monkeypatch.setattr(diagnose_module, "SIDE_BY_SIDE_MIN_SAMPLES", 0)


@pytest.mark.parametrize("seed", range(6))
def test_two_processes_diagnose_what_one_does(seed, always_fork, monkeypatch):
    rng = np.random.default_rng(seed)
    kinds = rng.choice(KINDS, size=2, replace=False)
    run = simulate(
        SimConfig(
            gpus=int(rng.choice([4, 8, 16])),
            steps=8,
            time_scale=0.1,
            seed=seed,
            framework=str(rng.choice(["verl", "trl", "openrlhf"])),
            pathologies=[Pathology(str(k), float(rng.uniform(0.5, 0.9))) for k in kinds],
        )
    ).run
    started = []
    real_start = lanes.start
    monkeypatch.setattr(lanes, "start", lambda fn: started.append(1) or real_start(fn))
    assert _doc(run, 2) == _doc(run, 1)
    assert started == [1]  # the second lane did run


def test_a_child_that_dies_or_sends_nothing_costs_only_time(always_fork, monkeypatch):
    run = simulate(
        SimConfig(gpus=8, steps=8, time_scale=0.1, seed=4,
                  pathologies=[Pathology("reshard_idle", 0.8), Pathology("host_bound", 0.8)])
    ).run  # fmt: skip
    want = _doc(run, 1)
    real_start = lanes.start

    def dies(fn):
        return real_start(lambda: os._exit(3))

    def garbage(fn):
        return real_start(lambda: lambda: None)  # a value pickle refuses

    def no_fork(fn):
        return None

    for broken in (dies, garbage, no_fork):
        monkeypatch.setattr(lanes, "start", broken)
        assert _doc(run, 2) == want, broken.__name__


def test_the_groups_are_consecutive_claim_nothing_and_read_no_other_finding():
    kinds = [s.kind for s in STALLS]
    one, two = SIDE_BY_SIDE
    at = kinds.index(one[0])
    assert kinds[at : at + len(one) + len(two)] == [*one, *two]
    # no detector of the groups claims GPU-time or reads findings, but throttling, which
    # reads those of power_cap and hot_gpu, in its own group
    for stall in STALLS[at : at + len(one) + len(two)]:
        source = inspect.getsource(inspect.getmodule(stall.detect))
        assert "ctx.claim(" not in source, stall.kind
        if stall.kind == "throttling":
            assert kinds.index("power_cap") > at + len(one)
            assert kinds.index("hot_gpu") > at + len(one)
            continue
        assert "ctx.found" not in source and "explained_in" not in source, stall.kind
    run = simulate(SimConfig(gpus=8, steps=6, time_scale=0.1, seed=2)).run
    ctx = AnalysisContext(run)
    before = ctx.claimed.copy()
    for stall in STALLS[at : at + len(one) + len(two)]:
        stall.detect(ctx, Thresholds())
    assert (ctx.claimed == before).all()


def test_small_runs_stay_in_one_process(monkeypatch):
    run = simulate(SimConfig(gpus=4, steps=4, time_scale=0.1, seed=1)).run
    assert len(run.gpu) < diagnose_module.SIDE_BY_SIDE_MIN_SAMPLES
    monkeypatch.setattr(lanes, "start", lambda fn: pytest.fail("forked for a small run"))
    api.analyze(run, workers=2)


REAL = sorted(p for p in SHARED_FIXTURES.rglob("*") if p.is_file() and p.name != "README.md")


@pytest.mark.skipif(not REAL, reason="no shared fixtures")
@pytest.mark.parametrize("path", REAL, ids=lambda p: p.name)
def test_real_third_party_files_diagnose_the_same_in_two_lanes(path, tmp_path, always_fork):
    """Files users have (nvidia-smi, DCGM, profiler traces, verl logs), not the simulator's:
    forced into two lanes whatever their size, the document is one process's."""
    try:
        run_dir = api.import_files([path], tmp_path / "run")
    except Exception as exc:  # a file the importer refuses has nothing to diagnose here
        pytest.skip(f"not importable alone: {exc}")
    run = api.load_for_analysis(run_dir)
    assert _doc(run, 2) == _doc(run, 1)
