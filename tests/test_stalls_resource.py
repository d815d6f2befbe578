"""Resource-stall detectors (gpuprof.analyzers.stalls_resource) against the simulator."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from gpuprof.analyzers.findings import STALL_KINDS, AnalysisContext, Finding, Thresholds
from gpuprof.analyzers.stalls import DETECTORS, STALLS
from gpuprof.model import Run, RunMeta
from gpuprof.sim import Pathology, SimConfig, simulate

TH = Thresholds()


def _run_all(run: Run) -> dict[str, Finding | None]:
    """Every detector in `diagnose`'s order, each seeing the findings before it (ctx.found)."""
    ctx = AnalysisContext(run)
    out = {}
    for kind, detect in DETECTORS.items():
        out[kind] = detect(ctx, TH)
        if out[kind] is not None:
            ctx.found.append(out[kind])
    return out


def _sim(kind: str | None, severity: float = 0.8, gpus: int = 8, **kw):
    pathologies = [Pathology(kind, severity)] if kind else []
    cfg = SimConfig(gpus=gpus, steps=3, time_scale=0.05, pathologies=pathologies, seed=3, **kw)
    return simulate(cfg)


def test_detectors_cover_known_kinds() -> None:
    assert tuple(DETECTORS) == tuple(s.kind for s in STALLS)
    assert set(DETECTORS) == set(STALL_KINDS)


@pytest.mark.parametrize(
    ("kind", "gpus", "framework"),
    [
        ("memory_headroom", 8, "verl"),
        ("offload_thrash", 8, "swift"),
        ("comm_bound", 16, "verl"),
        ("host_bound", 4, "trl"),
        ("imbalance", 8, "openrlhf"),
        ("throttling", 16, "verl"),
    ],
)
def test_finds_injected_stall(kind: str, gpus: int, framework: str) -> None:
    result = _sim(kind, 0.8, gpus=gpus, framework=framework)
    truth = next(t for t in result.truth if t.kind == kind)
    found = _run_all(result.run)
    finding = found[kind]
    assert finding is not None, kind
    assert finding.kind == kind
    assert 0.5 * truth.gpu_seconds <= finding.gpu_seconds_lost <= 2.0 * truth.gpu_seconds
    assert finding.share >= TH.min_share and 0 < finding.confidence <= 1
    assert finding.evidence["intervals"] and finding.evidence["gpus"]
    assert finding.evidence["phases"]
    assert finding.summary
    finding.to_dict()  # JSON-able figures
    # no other resource detector claims this scenario
    assert [k for k, f in found.items() if f is not None] == [kind]


def test_throttled_gpus_and_reasons() -> None:
    result = _sim("throttling", 0.8, gpus=16)
    finding = _run_all(result.run)["throttling"]
    truth = next(t for t in result.truth if t.kind == "throttling")
    assert finding is not None
    assert sorted(finding.evidence["gpus"]) == sorted(f"node{g // 8}:{g % 8}" for g in truth.gpus)
    assert "sw_power_cap" in finding.evidence["clock_event_reasons"]


def test_imbalance_names_the_straggler() -> None:
    result = _sim("imbalance", 0.9, gpus=8)
    finding = _run_all(result.run)["imbalance"]
    truth = next(t for t in result.truth if t.kind == "imbalance")
    assert finding is not None
    assert finding.evidence["straggler_rank"] == truth.gpus[0]


@pytest.mark.parametrize(
    "kind",
    ["memory_headroom", "offload_thrash", "comm_bound", "host_bound", "imbalance", "throttling"],
)
def test_near_miss_not_reported(kind: str) -> None:
    result = _sim(kind, 0.04, gpus=8)
    assert _run_all(result.run)[kind] is None


@pytest.mark.parametrize(
    ("gpus", "framework", "algorithm"),
    [
        (1, "pytorch", "grpo"),
        (2, "trl", "ppo"),
        (8, "verl", "grpo"),
        (32, "openrlhf", "grpo"),
        (4, "swift", "ppo"),
    ],
)
def test_healthy_runs_have_no_finding(gpus: int, framework: str, algorithm: str) -> None:
    result = _sim(None, gpus=gpus, framework=framework, algorithm=algorithm)
    assert all(f is None for f in _run_all(result.run).values())


def test_without_gpm_still_finds_throttling_and_imbalance() -> None:
    for kind in ("throttling", "imbalance", "offload_thrash"):
        result = _sim(kind, 0.8, gpus=4, gpu_name="NVIDIA A100-SXM4-80GB")
        assert _run_all(result.run)[kind] is not None, kind


def test_empty_and_degenerate_runs_give_none() -> None:
    assert all(f is None for f in _run_all(Run(meta=RunMeta(run_id="x"))).values())
    base = _sim("throttling", 0.8, gpus=4).run
    no_gpu = Run(meta=base.meta, spans=base.spans, procs=base.procs)
    assert all(f is None for f in _run_all(no_gpu).values())
    no_spans = Run(meta=base.meta, gpu=base.gpu, host=base.host, procs=base.procs)
    out = _run_all(no_spans)  # throttling needs no spans; the span-based kinds give None
    assert out["imbalance"] is None and out["comm_bound"] is None
    nan_gpu = base.gpu.copy()
    for col in nan_gpu.columns:
        if col not in ("host", "gpu", "uuid", "t_ns"):
            nan_gpu[col] = np.nan
    nan_run = Run(meta=base.meta, gpu=nan_gpu, spans=base.spans, procs=base.procs)
    out = _run_all(nan_run)
    assert all(out[k] is None for k in out if k != "imbalance")  # spans alone show imbalance
    nan_procs = base.procs.assign(cpu_pct=np.nan)
    assert _run_all(Run(meta=base.meta, gpu=base.gpu, procs=nan_procs))["host_bound"] is None


def test_junk_columns_do_not_raise() -> None:
    base = _sim("comm_bound", 0.8, gpus=2).run
    spans = base.spans.copy()
    spans.loc[0, "end_ns"] = spans.loc[0, "start_ns"] - 5  # ends before it starts
    spans["rank"] = np.nan
    spans["attrs"] = [None] * len(spans)
    gpu = base.gpu.copy()
    gpu["clock_event_reasons"] = pd.Series([None] * len(gpu), dtype=object)
    procs = base.procs.drop(columns=["role"])
    _run_all(Run(meta=base.meta, gpu=gpu, spans=spans, procs=procs))


def test_offload_loss_uses_each_gpus_own_pcie_link():
    """The copy-time model divides by the GPU's own link: the same traffic costs twice the
    time on a Gen4 x8 link as on Gen4 x16; without an inventory entry Gen4 x16 is assumed."""
    res = _sim("offload_thrash", 0.9)
    run = res.run
    base = _run_all(run)["offload_thrash"]
    assert base.evidence.pcie_link == "Gen4 x16"
    assert base.evidence.pcie_link_bytes_s == pytest.approx(16 * 1.969e9)
    for g in run.meta.gpus:
        g["pcie_link_width_max"] = 8
    narrow = _run_all(run)["offload_thrash"]
    assert narrow.evidence.pcie_link == "Gen4 x8"
    assert narrow.gpu_seconds_lost > base.gpu_seconds_lost
    for g in run.meta.gpus:
        g.pop("pcie_link_gen_max"), g.pop("pcie_link_width_max")
    assumed = _run_all(run)["offload_thrash"]
    assert assumed.evidence.pcie_link == "Gen4 x16 (assumed)"
    assert assumed.gpu_seconds_lost == pytest.approx(base.gpu_seconds_lost)
