"""Cross-node figures: per node, per link type, the straggler node, idle nodes while others work."""

from __future__ import annotations

import dataclasses

import pandas as pd
import pytest

from gpuprof.analyzers.diagnose import diagnose
from gpuprof.analyzers.findings import AnalysisContext, Thresholds
from gpuprof.analyzers.nodes import node_summary
from gpuprof.model import GpuSample, Run, RunMeta, Span

T0 = 1_700_000_000_000_000_000


def _gpu_rows(node: str, gpus: int, util) -> list[dict]:
    """10 Hz samples for 20 s; ``util(t_s)`` the utilisation at time t."""
    return [
        dataclasses.asdict(GpuSample(node, g, f"{node}-{g}", T0 + i * 100_000_000, util(i / 10)))
        for g in range(gpus)
        for i in range(200)
    ]


def _run(spans: list[Span] = (), clocks: dict | None = None) -> Run:
    works = lambda t: 95.0  # noqa: E731
    waits = lambda t: 0.0 if t < 10 else 95.0  # noqa: E731
    gpu = pd.DataFrame(_gpu_rows("nodeA", 4, works) + _gpu_rows("nodeB", 4, waits))
    frame = pd.DataFrame([dataclasses.asdict(s) for s in spans]) if spans else None
    meta = RunMeta(run_id="r", hosts=["nodeA", "nodeB"], clocks=clocks or {},
                   reference_node="nodeA")  # fmt: skip
    run = Run(meta=meta, gpu=gpu)
    if frame is not None:
        frame["depth"] = 0
        run.spans = frame
    return run


def test_a_node_idle_while_another_works_is_counted():
    summary = node_summary(AnalysisContext(_run()), Thresholds())
    by_node = {n["node"]: n for n in summary["nodes"]}
    assert by_node["nodeA"]["gpus"] == by_node["nodeB"]["gpus"] == 4
    assert by_node["nodeA"]["idle_while_others_busy_gpu_s"] == 0
    # nodeB's 4 GPUs sat idle for the first 10 s while nodeA's worked: ~40 GPU-s
    assert 38 <= by_node["nodeB"]["idle_while_others_busy_gpu_s"] <= 41
    assert summary["alignment"] is None  # nothing says the clocks were aligned


def _span(node, rank, phase, step, start_s, dur_s, **attrs) -> Span:
    start = T0 + int(start_s * 1e9)
    return Span(node, 100 + rank, 1, rank, rank % 4, phase, phase, step, 0, start,
                start + int(dur_s * 1e9), attrs=attrs)  # fmt: skip


def test_straggler_node_links_and_cross_node_weight_sync():
    spans = []
    for step in range(6):
        t = step * 3.0
        for node, ranks, dur in (("nodeA", (0, 1), 1.0), ("nodeB", (2, 3), 1.6)):
            for rank in ranks:
                spans.append(_span(node, rank, "update_actor", step, t, dur))
                # a world all-reduce (crosses nodes) and a 2-rank one inside each node
                spans.append(_span(node, rank, "collective", step, t + 1.7, 0.2, op="all_reduce",
                                   bytes=400_000_000, group_size=4))  # fmt: skip
                spans.append(_span(node, rank, "collective", step, t + 2.0, 0.1, op="all_reduce",
                                   bytes=400_000_000, group_size=2))  # fmt: skip
                spans.append(_span(node, rank, "reshard", step, t + 1.65, 0.3))
    clocks = {
        "nodeA": {"offset_ns": 0, "error_ns": 0, "method": "reference"},
        "nodeB": {"offset_ns": -3_000_000, "error_ns": 200_000, "method": "collectives"},
    }
    summary = node_summary(AnalysisContext(_run(spans, clocks)), Thresholds())
    straggler = summary["straggler_node"]
    assert straggler["node"] == "nodeB" and straggler["phase_steps"] == 6
    assert abs(straggler["delay_s"] - 6 * 0.6) < 1e-6
    assert abs(straggler["gpu_s"] - 6 * 0.6 * 4) < 1e-6  # nodeA's 4 GPUs wait for it
    links = {link["link"]: link for link in summary["links"]}
    assert links["inter-node"]["calls"] == 24 and links["intra-node"]["calls"] == 24
    assert abs(links["inter-node"]["bandwidth_bytes_s"] - 2e9) < 1
    assert abs(links["intra-node"]["bandwidth_bytes_s"] - 4e9) < 1
    assert summary["weight_sync_crosses_nodes"] is True
    assert summary["alignment"]["worst_error_ns"] == 200_000
    node_b = next(n for n in summary["nodes"] if n["node"] == "nodeB")
    assert node_b["ranks"] == [2, 3] and node_b["clock"]["offset_ns"] == -3_000_000


def test_single_node_runs_have_no_node_section():
    run = _run()
    run.gpu = run.gpu[run.gpu["host"] == "nodeA"]
    run.meta.hosts = ["nodeA"]
    assert node_summary(AnalysisContext(run), Thresholds()) is None
    assert diagnose(run).summary["nodes"] is None


def test_the_terminal_diagnosis_shows_the_nodes():
    from gpuprof.reports.terminal import diagnosis_renderable, render_text

    text = render_text(diagnosis_renderable(diagnose(_run())), width=140)
    assert "Nodes" in text and "nodeA" in text and "nodeB" in text


def test_the_html_report_lists_the_nodes_escaped():
    from gpuprof.reports.html import render_html

    run = _run()
    evil = "<script>alert(1)</script>"
    run.gpu["host"] = run.gpu["host"].replace("nodeB", evil)
    run.meta.hosts = ["nodeA", evil]
    page = render_html(run)
    assert "<h2>Nodes</h2>" in page and "idle while another node worked" in page
    assert evil not in page and "&lt;script&gt;alert(1)&lt;/script&gt;" in page
    assert "Node clocks not aligned" in page
    single = _run()
    single.gpu = single.gpu[single.gpu["host"] == "nodeA"]
    single.meta.hosts = ["nodeA"]
    assert "<h2>Nodes</h2>" not in render_html(single)


def _detect(run: Run, kind: str):
    """``kind``'s detector, after the detectors before it (as `diagnose` runs them)."""
    from gpuprof.analyzers.stalls import DETECTORS

    ctx = AnalysisContext(run)
    for name, detect in DETECTORS.items():
        found = detect(ctx, Thresholds())
        if name == kind:
            return found
        if found is not None:
            ctx.found.append(found)
    raise KeyError(kind)


def _two_node_sim(kind: str):
    from gpuprof.sim import Pathology, SimConfig, simulate

    cfg = SimConfig(gpus=16, steps=3, time_scale=0.05, pathologies=[Pathology(kind, 0.8)], seed=3)
    run = simulate(cfg).run
    assert sorted(run.spans["host"].unique()) == ["node0", "node1"]
    return run


def test_comm_bound_says_how_much_crosses_nodes_and_at_what_bandwidth():
    run = _two_node_sim("comm_bound")
    spans = run.spans.copy()
    coll = (spans["name"] == "nccl:reduce_scatter").to_numpy()
    # the world's reduce-scatters cross nodes (16 ranks, 8 per node): 2 GB each
    spans["attrs"] = [
        {**(a or {}), "group_size": 16, "bytes": 2_000_000_000} if c else a
        for a, c in zip(spans["attrs"], coll)
    ]
    run.spans = spans
    finding = _detect(run, "comm_bound")
    assert finding is not None
    ev = finding.evidence
    assert ev.inter_node_collective_s > 0 and ev.intra_node_collective_s is None
    seconds = (spans.loc[coll, "end_ns"] - spans.loc[coll, "start_ns"]).sum() / 1e9
    assert ev.inter_node_bandwidth_bytes_s == pytest.approx(2e9 * coll.sum() / seconds, rel=0.01)
    assert "100% of it between nodes at" in finding.summary
    # the same collectives inside a node (a group of 8): none of it crosses nodes
    spans["attrs"] = [{**a, "group_size": 8} if c else a for a, c in zip(spans["attrs"], coll)]
    finding = _detect(run, "comm_bound")
    assert finding.evidence.inter_node_collective_s is None
    assert "none of it crosses nodes" in finding.summary


def test_reshard_idle_says_when_the_weights_cross_nodes():
    run = _two_node_sim("reshard_idle")
    finding = _detect(run, "reshard_idle")
    assert finding is not None and finding.evidence.crosses_nodes is False
    assert "cross nodes" not in finding.summary
    # a world broadcast inside every weight sync: the weights go from one node to the other
    reshard = run.spans[run.spans["phase"] == "reshard"]
    world = {"op": "broadcast", "group_size": 16, "bytes": 1e9}
    short = reshard["start_ns"] + (reshard["end_ns"] - reshard["start_ns"]) // 50
    bcast = reshard.assign(phase="collective", name="nccl:broadcast", depth=2, end_ns=short,
                           attrs=[world] * len(reshard))  # fmt: skip
    run.spans = pd.concat([run.spans, bcast], ignore_index=True)
    finding = _detect(run, "reshard_idle")
    assert finding.evidence.crosses_nodes is True
    assert "the weights cross nodes" in finding.summary


def test_nodes_are_listed_in_natural_order():
    run = _run()
    names = {"nodeA": "node10", "nodeB": "node2"}
    run.gpu["host"] = run.gpu["host"].map(names)
    run.meta.hosts = ["node10", "node2"]
    summary = node_summary(AnalysisContext(run), Thresholds())
    assert [n["node"] for n in summary["nodes"]] == ["node2", "node10"]
