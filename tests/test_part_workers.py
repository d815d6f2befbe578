"""The diagnosis node by node in worker processes (`analyzers.part_workers`) is `diagnose`'s.

The workers are forked processes holding the parts; the calls and their figures cross pipes.
What must hold: the same JSON document as one process makes, options (``--gpu``,
``--model-params``) reaching every part, a detector's exception raised as it would be in one
process, and a worker that dies costing nothing but time (the run is diagnosed again in one
process).
"""

from __future__ import annotations

import os

import pytest
from test_parts import _run

from gpuprof import api
from gpuprof.analyzers import diagnose as diagnose_module
from gpuprof.analyzers.diagnose import diagnose
from gpuprof.analyzers.findings import AnalysisContext
from gpuprof.analyzers.part_workers import PartsLost, WorkerParts
from gpuprof.analyzers.parts import deal
from gpuprof.analyzers.stalls import STALLS
from gpuprof.reports.fmt import render_json


@pytest.fixture
def small_runs_in_parts(monkeypatch):
    """Every multi-node run goes to the workers, however small (the tests' runs are)."""
    monkeypatch.setattr(diagnose_module, "PARTS_MIN_SAMPLES", 1)
    monkeypatch.setattr(diagnose_module, "PARTS_MIN_SAMPLES_FEW", 1)
    monkeypatch.setattr(diagnose_module, "PARTS_MIN_WORKERS", 2)
    made = []
    real = WorkerParts.__init__

    def counting(self, *args, **kwargs):
        made.append(self)
        real(self, *args, **kwargs)

    monkeypatch.setattr(WorkerParts, "__init__", counting)
    return made


@pytest.mark.parametrize("case", ["busy", "bubbles", "phantom", "power"])
def test_the_diagnosis_in_workers_is_the_single_process_document(case, small_runs_in_parts):
    run = _run(case)
    want = render_json(diagnose(run, workers=1).to_dict())
    ctx = AnalysisContext(run)
    got = render_json(diagnose(run, context=ctx, workers=2).to_dict())
    assert len(small_runs_in_parts) == 1 and small_runs_in_parts[0].count > 1
    assert "samples" not in ctx.__dict__  # this process labelled no sample
    assert got == want
    assert all(not p.is_alive() for p in small_runs_in_parts[0]._procs)  # workers reaped


def test_few_workers_take_parts_only_for_larger_runs(small_runs_in_parts, monkeypatch):
    """On 2-3 workers the two lanes hold out longer against the parts: a run between the two
    thresholds goes to parts on 4 workers, not on 2 (and the document is the same)."""
    run = _run("busy")
    monkeypatch.setattr(diagnose_module, "PARTS_MIN_SAMPLES", len(run.gpu))
    monkeypatch.setattr(diagnose_module, "PARTS_MIN_SAMPLES_FEW", len(run.gpu) + 1)
    want = render_json(diagnose(run, workers=1).to_dict())
    assert render_json(diagnose(run, workers=2).to_dict()) == want
    assert not small_runs_in_parts
    assert render_json(diagnose(run, workers=4).to_dict()) == want
    assert len(small_runs_in_parts) == 1


def test_options_reach_every_part(small_runs_in_parts):
    """The user's GPU and model size (MFU, the roofline, the busy-time stalls) are the
    same in the workers as in one process."""
    run = _run("busy")
    options = {"gpu": "A100", "model_params": "3B", "gpu_hour_price": 2.5}
    want = api.analyze(run, workers=1, **options).to_dict()
    got = api.analyze(run, workers=2, **options).to_dict()
    assert small_runs_in_parts
    assert want["summary"]["efficiency"]["gpu"]["model"].startswith("A100")
    assert render_json(got) == render_json(want)


def _raises(ctx: AnalysisContext) -> None:
    raise ValueError(f"part of {ctx.run.gpu['host'].iloc[0]} cannot")


def _hosts(ctx: AnalysisContext) -> list[str]:
    return sorted(ctx.run.gpu["host"].astype(str).unique())


def test_an_exception_in_a_part_is_raised_here_and_the_workers_go_on():
    run = _run("hosts")
    with WorkerParts(run, 2) as parts:
        with pytest.raises(ValueError, match="cannot"):
            parts.map(_raises)
        assert [h for got in parts.map(_hosts) for h in got] == ["node0", "node1", "node2"]


_PARENT = os.getpid()


def _die_in_a_worker(ctx: AnalysisContext) -> int:
    if os.getpid() != _PARENT:
        os._exit(3)  # a worker killed mid-diagnosis (the kernel's OOM killer, a signal)
    return 0


class _Dying:
    kind = "dying"

    @staticmethod
    def detect(ctx, th):
        from gpuprof.analyzers.parts import Parts

        parts = ctx if isinstance(ctx, Parts) else Parts.of(ctx)
        parts.map(_die_in_a_worker)
        return None


def test_a_worker_that_dies_costs_only_time(small_runs_in_parts, monkeypatch):
    """A worker gone mid-diagnosis ends the parts (`PartsLost`, which no detector's guard
    catches) and the run is diagnosed in this process: the same document."""
    run = _run("periodic")
    want = render_json(diagnose(run, workers=1).to_dict())
    monkeypatch.setattr(diagnose_module, "STALLS", (_Dying(), *STALLS))
    got = render_json(diagnose(run, workers=2).to_dict())
    assert small_runs_in_parts and small_runs_in_parts[0]._closed
    assert got == want
    with pytest.raises(PartsLost):
        small_runs_in_parts[0].map(_hosts)


def test_nodes_are_dealt_in_consecutive_groups_of_about_equal_samples():
    assert deal([10, 10, 10, 10], 2) == [[0, 1], [2, 3]]
    assert deal([100, 1, 1, 1, 1], 2) == [[0], [1, 2, 3, 4]]
    assert deal([5, 5], 8) == [[0], [1]]
    assert deal([0, 0, 0], 1) == [[0, 1, 2]]
    # a heavy node last: the cut falls before it (once, all of them fell after it: one group)
    assert deal([90, 1, 224, 2619], 2) == [[0, 1, 2], [3]]
    assert deal([90, 1, 224, 2619], 4) == [[0, 1, 2], [3]]
    assert deal([2619, 90, 1, 224], 2) == [[0], [1, 2, 3]]
    assert deal([1, 50, 1], 2) == [[0, 1], [2]]
    groups = deal([7] * 32, 16)
    assert [i for g in groups for i in g] == list(range(32)) and len(groups) == 16


def _found_kinds(ctx: AnalysisContext) -> list[str]:
    return [f.kind for f in ctx.found]


def test_each_part_sees_the_findings_so_far():
    """A part's figures may depend on what earlier detectors found (what they explain is
    not counted again): the workers' parts see the run's findings as this process has them."""
    from gpuprof.analyzers.diagnose import diagnose as whole

    run = _run("hosts")
    finding = whole(run).findings[0]
    with WorkerParts(run, 2) as parts:
        assert parts.count == 2 and parts.map(_found_kinds) == [[], []]
        parts.found.append(finding)
        assert parts.map(_found_kinds) == [[finding.kind]] * 2


def _die_or_send_much(ctx: AnalysisContext) -> bytes:
    host = str(ctx.run.gpu["host"].iloc[0])
    if os.getpid() != _PARENT and host == "node1":
        os._exit(3)
    return b"x" * (20 << 20)  # far more than a pipe holds: its sender blocks until read


def test_the_parts_end_promptly_when_a_worker_dies_while_another_sends():
    """A worker gone ends the parts while another is still sending a reply no one will
    read: closing the pipes first lets that worker end at once, instead of after the five
    seconds it would be given before being killed."""
    import time

    run = _run("hosts")
    parts = WorkerParts(run, 3)
    assert parts.count == 3
    start = time.monotonic()
    with pytest.raises(PartsLost):
        parts.map(_die_or_send_much)
    assert time.monotonic() - start < 4.0
    assert all(not p.is_alive() for p in parts._procs)
