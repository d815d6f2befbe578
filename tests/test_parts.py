"""A run analysed node by node (`analyzers.parts`) gives the whole run's figures.

Each node's part must label its GPU samples exactly as the whole run labels them, and every
detector written against `Parts` must find, claim and describe the same as on the whole run
(floating-point sums may be added in another order: figures are compared to 1e-9).
"""

from __future__ import annotations

import copy
import dataclasses
import functools
import math

import numpy as np
import pandas as pd
import pytest
from conftest import SHARED_FIXTURES

from gpuprof import loader, store
from gpuprof.analyzers.diagnose import diagnose, diagnose_parts
from gpuprof.analyzers.findings import AnalysisContext, Thresholds
from gpuprof.analyzers.parts import (
    Parts,
    by_node,
    exact_sum,
    facts_of,
    median_of_counts,
    stretches,
    top_stretches,
    value_counts,
)
from gpuprof.analyzers.stalls import STALLS
from gpuprof.analyzers.stalls._startup import claim_startup
from gpuprof.reports.fmt import render_json
from gpuprof.sim import Pathology, SimConfig, simulate

IN_PARTS = tuple(s.kind for s in STALLS)
"""The detectors written against `Parts`: every one, in `STALLS` order."""

CASES = {
    # three hosts (8, 8, 4 GPUs), an unused GPU whose process is absent, a straggler
    "hosts": {
        "gpus": 20,
        "pathologies": [Pathology("unused_gpu", 0.5), Pathology("imbalance", 0.6)],
    },
    # two hosts, phantom GPUs (node1's only GPU has no process), a hang
    "phantom": {
        "gpus": 9,
        "algorithm": "ppo",
        "pathologies": [Pathology("phantom_util", 0.9), Pathology("idle_allocation", 0.5)],
    },
    # checkpoints every few steps, slow reward scoring, two hosts
    "periodic": {
        "gpus": 16,
        "pathologies": [Pathology("reward_bound", 0.7), Pathology("periodic_stall", 0.8)],
    },
    # idle in phases: weight sync, reward scoring, the tail of generation, on two hosts
    "phases": {
        "gpus": 16,
        "pathologies": [
            Pathology("reward_bound", 0.7),
            Pathology("reshard_idle", 0.6),
            Pathology("generation_tail", 0.7),
        ],
    },
    # bubbles of a split placement, slow input, idle no phase explains, four GPUs a host
    "bubbles": {
        "gpus": 12,
        "gpus_per_host": 4,
        "placement": "split",
        "framework": "trl",
        "pathologies": [
            Pathology("pipeline_bubble", 0.8),
            Pathology("dataloader_starvation", 0.6),
            Pathology("idle_unattributed", 0.6),
        ],
    },
    # offloaded optimizer, a GPU far hotter than its peers, memory left unused
    "offload": {
        "gpus": 16,
        "pathologies": [
            Pathology("offload_thrash", 0.7),
            Pathology("hot_gpu", 0.7),
            Pathology("memory_headroom", 0.6),
        ],
    },
    # collectives exposed in the update, clocks cut by a limit
    "comm": {
        "gpus": 16,
        "pathologies": [Pathology("comm_bound", 0.7), Pathology("throttling", 0.6)],
    },
    # a straggler rank on one of two hosts
    "straggler": {"gpus": 16, "pathologies": [Pathology("imbalance", 0.7)]},
    # A100s held at their power limit, launch-bound compute phases, four GPUs a host
    "power": {
        "gpus": 12,
        "gpus_per_host": 4,
        "gpu_name": "NVIDIA A100-SXM4-80GB",
        "pathologies": [Pathology("power_cap", 0.7), Pathology("host_bound", 0.7)],
    },
    # generation and the update slow for their tokens (the busy-time stalls), two hosts
    "busy": {
        "gpus": 16,
        "pathologies": [Pathology("rollout_bound", 0.8), Pathology("update_bound", 0.8)],
    },
    # rollout and training on GPUs of their own, three GPUs a host, a hang
    "split": {
        "gpus": 7,
        "gpus_per_host": 3,
        "placement": "split",
        "pathologies": [Pathology("idle_allocation", 0.7), Pathology("unused_gpu", 0.6)],
    },
}


def _run(case: str, seed: int = 5):
    cfg = SimConfig(steps=6, time_scale=0.2, seed=seed, **CASES[case])
    return simulate(cfg).run


@functools.cache
def _whole_diagnosis(case: str) -> dict:
    return diagnose(_run(case)).to_dict()


def whole_document(case: str) -> dict:
    """`diagnose`'s document of ``case``'s run (`_run`) in one process, as the reference the
    parts are held to: made once per process (each parametrisation asking for it, here and
    in `test_held_parts`, would make the same), a copy each time."""
    return copy.deepcopy(_whole_diagnosis(case))


@pytest.fixture(scope="module")
def merged_runs(tmp_path_factory):
    """``merged_runs(case)``: ``case``'s run written, then loaded with 5 samples merged (of
    unequal length, as a long run is analysed); written and loaded once per module. Read
    only: neither `diagnose` nor the detectors change the run they are given."""
    runs = {}

    def get(case: str):
        if case not in runs:
            path = tmp_path_factory.mktemp(f"merged-{case}") / "run"
            store.save_run(_run(case), path)
            runs[case] = loader.load_for_analysis(path, merge=5)
        return runs[case]

    return get


@pytest.fixture(scope="module")
def three_captures(tmp_path_factory):
    """Three public nvidia-smi captures (an RTX 4090 serving inference, a custom-header log,
    one with repeated headers) imported as one run of three hosts and loaded (in UTC), once
    per module; read only."""
    from gpuprof.importing import import_files

    smi = SHARED_FIXTURES / "nvidia_smi"
    names = ("rtx4090_inference.csv", "epoch_custom_header.csv", "repeated_header.csv")
    out = tmp_path_factory.mktemp("captures") / "run"
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("TZ", "UTC")
        import_files([smi / n for n in names], out)
        return loader.load_for_analysis(out)


def _comparable(frame: pd.DataFrame) -> pd.DataFrame:
    """Sample rows as plain values (categoricals as text), without the row numbers, which
    count rows of the table the samples came from."""
    out = frame.drop(columns=["row"]).reset_index(drop=True)
    for name in out.columns:
        if isinstance(out[name].dtype, pd.CategoricalDtype):
            out[name] = out[name].astype(object)
    return out


def _close(a, b, path="") -> None:
    """``a`` equals ``b``, floats to 1e-9 relative (dicts, lists, numbers, text)."""
    if isinstance(a, dict):
        assert isinstance(b, dict) and sorted(a) == sorted(b), path
        for key in a:
            _close(a[key], b[key], f"{path}.{key}")
    elif isinstance(a, list | tuple):
        assert isinstance(b, list | tuple) and len(a) == len(b), path
        for i, (x, y) in enumerate(zip(a, b)):
            _close(x, y, f"{path}[{i}]")
    elif isinstance(a, float) and not isinstance(b, bool):
        assert isinstance(b, int | float), path
        assert (math.isnan(a) and math.isnan(b)) or math.isclose(a, b, rel_tol=1e-9), (
            path, a, b)  # fmt: skip
    else:
        assert a == b, (path, a, b)


@pytest.mark.parametrize("case", sorted(CASES))
def test_each_node_labels_its_samples_as_the_whole_run(case):
    run = _run(case)
    pieces = by_node(run)
    assert len(pieces) == len({str(h) for h in run.gpu["host"]}) > 1
    whole = AnalysisContext(run)
    contexts = [AnalysisContext(p) for p in pieces]
    joined = pd.concat([_comparable(c.samples) for c in contexts], ignore_index=True)
    pd.testing.assert_frame_equal(joined, _comparable(whole.samples))
    owners = pd.concat([c.owners for c in contexts], ignore_index=True)
    key = ["host", "gpu"]

    def plain(frame: pd.DataFrame) -> pd.DataFrame:  # a missing owner as NaN, None or NA
        frame = frame.sort_values(key, ignore_index=True).astype(object)
        return frame.where(frame.notna(), np.nan)

    pd.testing.assert_frame_equal(plain(owners), plain(whole.owners))
    mine, theirs = facts_of(contexts), facts_of([whole])
    pd.testing.assert_frame_equal(mine.steps, theirs.steps)
    assert (mine.duration_s, mine.first_span_ns, mine.t_min_ns, mine.t_max_ns) == (
        theirs.duration_s, theirs.first_span_ns, theirs.t_min_ns, theirs.t_max_ns)  # fmt: skip
    assert mine.gpu_s == pytest.approx(theirs.gpu_s, rel=1e-12)


def test_stretches_of_parts_join_where_they_touch():
    """Stretches of two parts that overlap or touch are one stretch weighing both; the
    heaviest come first, listed in time order."""
    t = np.array([0, 10, 100, 200], dtype=np.int64) * 10**9
    dt = np.full(4, 10.0)
    one = stretches(t[:2], dt[:2], np.array([True, True]), np.array([1.0, 1.0]))
    two = stretches(t[2:], dt[2:], np.array([True, True]), np.array([5.0, 0.5]))
    assert [list(x) for x in one[:2]] == [[0], [20 * 10**9 + 1]]
    across = stretches(np.array([20 * 10**9]), np.array([5.0]), np.array([True]),
                       np.array([3.0]))  # fmt: skip
    got = top_stretches([one, two, across], n=2)
    assert got == [[0, 25 * 10**9 + 1], [100 * 10**9, 110 * 10**9 + 1]]
    assert top_stretches([]) == []


@pytest.mark.parametrize("case", sorted(CASES))
def test_totals_and_phase_breakdowns_node_by_node_equal_the_whole_run(case):
    run = _run(case)
    whole = AnalysisContext(run)
    parts = Parts.by_node(run)
    _close(parts.lead.totals, whole.totals)
    for name in ("by_phase", "by_phase_step"):
        mine, theirs = getattr(parts.lead, name), getattr(whole, name)
        assert list(mine.columns) == list(theirs.columns)
        _close(mine.astype(object).to_dict("records"), theirs.astype(object).to_dict("records"))


def _diagnosed(parts: Parts, th: Thresholds) -> tuple[dict | None, list]:
    """Start-up, then every detector written against `Parts` in `diagnose`'s order."""
    startup = claim_startup(parts)
    found = []
    for stall in STALLS:
        if stall.kind not in IN_PARTS:
            continue
        finding = stall.detect(parts, th)
        if finding is not None and finding.share >= th.min_share:
            found.append(finding)
            parts.found.append(finding)
    return startup, found


@pytest.mark.parametrize("merge", [1, 5])
@pytest.mark.parametrize("case", sorted(CASES))
def test_findings_node_by_node_equal_the_whole_run(case, merge, merged_runs):
    th = Thresholds()
    # merged: samples of unequal length, as a long run is analysed
    run = _run(case) if merge == 1 else merged_runs(case)
    whole = Parts.of(AnalysisContext(run))
    parts = Parts.by_node(run)
    startup_w, found_w = _diagnosed(whole, th)
    startup_p, found_p = _diagnosed(parts, th)
    if merge == 1:  # the case shows what it is for
        wanted = {p.kind for p in CASES[case]["pathologies"]} & set(IN_PARTS)
        assert wanted <= {f.kind for f in found_w}, [f.kind for f in found_w]
    _close(startup_p, startup_w)
    _close([f.to_dict() for f in found_p], [f.to_dict() for f in found_w])
    claimed = np.concatenate([c.claimed for c in parts.contexts])
    assert (claimed == whole.lead.claimed).all()


def test_real_nvidia_smi_captures_of_three_hosts_node_by_node(three_captures, monkeypatch):
    """Three public nvidia-smi captures imported as one run of three hosts (an RTX 4090
    serving inference, a custom-header log, one with repeated headers): what every detector
    finds node by node is what it finds on the whole run."""
    monkeypatch.setenv("TZ", "UTC")
    run = three_captures
    pieces = by_node(run)
    assert len(pieces) == 3
    th = Thresholds()
    whole = Parts.of(AnalysisContext(run))
    parts = Parts([AnalysisContext(p) for p in pieces], whole=run)
    startup_w, found_w = _diagnosed(whole, th)
    startup_p, found_p = _diagnosed(parts, th)
    _close(startup_p, startup_w)
    _close([f.to_dict() for f in found_p], [f.to_dict() for f in found_w])
    _close(parts.lead.totals, whole.lead.totals)


def test_a_run_without_utilisation_is_its_own_only_part():
    """Without a utilisation reading the detectors read the framework's phase times, which
    need every node's spans: such a run, like a run of one node, is not cut."""
    run = _run("phases")
    assert len(by_node(run)) == 2
    blind = dataclasses.replace(run, gpu=run.gpu.assign(util_gpu_pct=np.nan))
    assert by_node(blind) == [blind]


def test_a_node_that_sampled_nothing_is_a_part_and_changes_nothing():
    """A node listed in the inventory whose GPUs sent no sample (a lost node) is a part of
    its own: what the detectors find node by node is still the whole run's."""
    run = _run("phases")
    first = run.gpu["host"].iloc[0]
    run = dataclasses.replace(run, gpu=run.gpu[run.gpu["host"] == first].reset_index(drop=True))
    pieces = by_node(run)
    assert len(pieces) == 2 and not len(pieces[1].gpu)
    th = Thresholds()
    whole = Parts.of(AnalysisContext(run))
    parts = Parts([AnalysisContext(p) for p in pieces], whole=run)
    startup_w, found_w = _diagnosed(whole, th)
    startup_p, found_p = _diagnosed(parts, th)
    assert found_w
    _close(startup_p, startup_w)
    _close([f.to_dict() for f in found_p], [f.to_dict() for f in found_w])


def test_a_hang_counts_only_while_every_node_is_quiet():
    """While one node's GPUs work, another node's quiet GPUs are not an idle allocation:
    the stretches are found over every node's samples, so node by node they shrink as they
    do on the whole run."""
    run = _run("split")
    th = Thresholds()
    _, found = _diagnosed(Parts.of(AnalysisContext(run)), th)
    hang = next(f for f in found if f.kind == "idle_allocation")
    start, end = max(hang.evidence["intervals"], key=lambda iv: iv[1] - iv[0])
    # the last node of the hang works through the first half of its longest stretch
    last = hang.evidence["gpus"][-1].rpartition(":")[0]
    assert last != hang.evidence["gpus"][0].rpartition(":")[0]
    t = run.gpu["t_ns"].to_numpy(np.int64)
    busy = (run.gpu["host"].astype(str).to_numpy() == last) & (t >= start)
    busy &= t < start + (end - start) // 2
    util = np.where(busy, 100.0, run.gpu["util_gpu_pct"].to_numpy(np.float64))
    run = dataclasses.replace(run, gpu=run.gpu.assign(util_gpu_pct=util))
    whole = Parts.of(AnalysisContext(run))
    parts = Parts.by_node(run)
    startup_w, found_w = _diagnosed(whole, th)
    startup_p, found_p = _diagnosed(parts, th)
    shrunk = next(f for f in found_w if f.kind == "idle_allocation")
    longest = max(b - a for a, b in shrunk.evidence["intervals"])
    assert longest < end - start
    _close(startup_p, startup_w)
    _close([f.to_dict() for f in found_p], [f.to_dict() for f in found_w])


@pytest.mark.parametrize("seed", range(20))
def test_the_median_of_parts_counts_is_numpys(seed):
    """The run's sampling period (and the phantom tolerance) is the median of every part's
    intervals, found from each part's value counts: it is `np.nanmedian` of all of them,
    the mean of the two middle values of an even count included."""
    rng = np.random.default_rng(seed)
    for _ in range(100):
        pool = np.r_[rng.random(4), 0.1, np.nan]
        values = rng.choice(pool, int(rng.integers(1, 40)))
        pieces = np.array_split(values, int(rng.integers(1, 5)))
        got = median_of_counts([value_counts(p) for p in pieces])
        want = np.nanmedian(values) if np.isfinite(values).any() else np.nan
        assert (np.isnan(got) and np.isnan(want)) or got == want


def _diagnoses(run, groups: int | None = None, whole: dict | None = None) -> tuple[dict, dict]:
    """The whole `diagnose` document of ``run`` (``whole`` when made already) and the one made
    node by node (in ``groups`` parts of consecutive nodes)."""
    whole = diagnose(run).to_dict() if whole is None else whole
    parts = Parts.by_node(run, groups)
    assert len(parts.contexts) > 1 and not len(parts.whole.run.gpu)  # no sample at the lead
    assert not [n for n in whole["notes"] if "failed" in n], whole["notes"]
    return diagnose_parts(parts).to_dict(), whole


@pytest.mark.parametrize(("merge", "groups"), [(1, None), (5, None), (1, 2)])
@pytest.mark.parametrize("case", sorted(CASES))
def test_the_diagnosis_node_by_node_is_the_whole_runs(case, merge, groups, merged_runs):
    """`diagnose_parts` of a run cut into nodes gives `diagnose`'s document: findings,
    recommendations, the summary (per-node figures, efficiency, bound, data basis) and the
    notes — the whole run's view at the lead holds no GPU sample."""
    if merge > 1:
        got, want = _diagnoses(merged_runs(case), groups)
    else:  # the document of the run in one process: one for every way of cutting it
        got, want = _diagnoses(_run(case), groups, whole=whole_document(case))
    if case == "busy":  # the busy-time stalls read the run as a whole
        assert "rollout_bound" in {f["kind"] for f in want["findings"]}
        verdicts = {p["phase"]: p["verdict"] for p in want["summary"]["bound"]["phases"]}
        assert verdicts["update_actor"] == "slow"
    assert want["summary"]["nodes"] is not None
    _close(got, want)
    assert render_json(got) == render_json(want)  # the same document, to the byte


def test_the_notes_on_spans_node_by_node_are_the_whole_runs():
    """The whole run's view holds no span: how many spans end before they start, and whether
    there are any, come from the parts (`parts.Facts`), so the notes say what one process
    says. A span without a host is in no part, and counts nowhere."""
    run = _run("busy")
    spans = run.spans.copy()
    rows = np.flatnonzero((spans["host"] == "node1").to_numpy())[:4]
    spans.loc[rows, "end_ns"] = spans.loc[rows, "start_ns"] - 1_000
    spans["host"] = spans["host"].astype(object)
    spans.loc[rows[3], "host"] = None
    # a step without a host, in a phase of its own, with figures of its own: read nowhere
    lost = spans[spans["phase"] == "step"].iloc[:1].assign(host=None)
    lost["attrs"] = [{"response_length/mean": 9e9, "custom/figure": 1.0}]
    spans = pd.concat([spans, lost, lost.assign(phase="lost_phase")], ignore_index=True)
    got, want = _diagnoses(dataclasses.replace(run, spans=spans))
    assert "3 spans end before they start and were ignored" in want["notes"]
    assert render_json(got) == render_json(want)


def test_untimed_step_events_node_by_node_are_the_whole_runs():
    """Step events a log gave figures for but no duration (``untimed``), on both nodes and
    interleaved in time: the framework's figures and the data basis's counters come from each
    part's events, and read what one process reads."""
    run = _run("busy")
    rows = []
    for i in range(40):
        host = f"node{i % 2}"
        attrs = {"untimed": True, "perf/mfu/actor": 0.1 + i / 7, "perf/custom": i * 1.1}
        rows.append({"host": host, "pid": 1, "rank": 0, "t_ns": run.meta.start_ns + i,
                     "kind": "step", "name": str(i), "attrs": attrs})  # fmt: skip
    events = pd.concat([run.events, pd.DataFrame(rows)], ignore_index=True)
    got, want = _diagnoses(dataclasses.replace(run, events=events))
    metrics = want["summary"]["efficiency"]["framework"]["metrics"]
    assert metrics["perf/mfu/actor"]["steps"] == 40
    assert "perf/custom" in want["summary"]["data_basis"]["framework_counters"]
    assert render_json(got) == render_json(want)


def test_a_node_without_bubbles_still_bounds_the_steps_of_the_job():
    """Split placement, generation slow and bubbles on one node only: each step's busiest
    GPU and its GPU count are the whole job's, so the node without a bubble counts in the
    bubbles' loss as in one process (node by node it was once left out, and the loss of
    the other node's bubbles then crossed the threshold: a finding one process never made)."""
    cfg = SimConfig(
        gpus=16, gpus_per_host=8, framework="swift", placement="split", steps=8,
        time_scale=0.2969177174150182, noise=0.07400701582810754, seed=901155168,
        pathologies=[Pathology("rollout_bound", 0.7846472393185382),
                     Pathology("pipeline_bubble", 0.6528831012635254)],
        phase_s={"dataload": 0.3, "rollout": 20.0, "reward": 1.0, "old_logprob": 3.0,
                 "ref_logprob": 3.0, "values": 3.0, "advantage": 0.2, "update_actor": 10.0,
                 "update_critic": 8.0, "reshard": 1.0},
    )  # fmt: skip
    run = simulate(cfg).run
    got, want = _diagnoses(run)
    assert [f["kind"] for f in want["findings"]] == ["rollout_bound"]
    assert render_json(got) == render_json(want)


@pytest.mark.parametrize("groups", [None, 2])
def test_a_node_with_spans_and_no_gpu_is_in_a_part(groups):
    """A node that recorded spans but no GPU sample and no GPU in the inventory (a CPU-only
    head running the driver, whose steps time the run): its spans are in a part, so the
    document node by node is still the whole run's."""
    run = _run("busy")
    steps = run.spans[run.spans["phase"] == "step"]
    driver = steps.assign(host="head", pid=steps["pid"] + 100_000)
    run = dataclasses.replace(run, spans=pd.concat([run.spans, driver], ignore_index=True))
    got, want = _diagnoses(run, groups)
    assert "head" in {n["node"] for n in want["summary"]["nodes"]["nodes"]}
    assert render_json(got) == render_json(want)


def test_the_diagnosis_of_three_real_captures_node_by_node(three_captures, monkeypatch):
    """Three public nvidia-smi captures imported as one run of three hosts: the whole
    diagnosis node by node is the single-process one (the sampling interval, the notes,
    the per-node figures over three sampling cadences)."""
    monkeypatch.setenv("TZ", "UTC")
    got, want = _diagnoses(three_captures)
    assert want["summary"]["data_basis"]["gpu_samples"]["gpus"] == 3
    assert len(want["summary"]["nodes"]["nodes"]) == 3
    _close(got, want)
    assert render_json(got) == render_json(want)


@pytest.mark.parametrize("seed", range(5))
def test_an_exact_sum_is_fsums_however_the_values_are_divided(seed):
    """`exact_sum` of any division of the values adds up to `math.fsum` of all of them,
    to the bit: wide exponents, negative values, subnormals, NaN and infinities (as 0)."""
    rng = np.random.default_rng(seed)
    for _ in range(60):
        n = int(rng.integers(0, 2000))
        values = rng.standard_normal(n) * 10.0 ** rng.integers(-300, 300, n)
        if n:
            values[rng.integers(0, n, 3)] = rng.choice([np.nan, np.inf, -np.inf, 5e-324], 3)
        want = math.fsum(v for v in values if np.isfinite(v))
        cuts = np.sort(rng.integers(0, n + 1, int(rng.integers(0, 4))))
        pieces = np.split(values, cuts)
        assert float(sum(exact_sum(p) for p in pieces)) == want
        assert float(exact_sum(values)) == want


@pytest.mark.parametrize("case", ["bubbles", "comm", "straggler"])
@pytest.mark.parametrize("hostless", [False, True])
def test_runs_missing_spans_node_by_node_are_the_whole_runs(case, hostless):
    """Spans dropped at random (a full queue, a rank that died) or left without a host: the
    per-(step, GPU) sums of the bubbles and of throttling are each GPU's own rows summed in
    order (`breakdown.keyed_sums`), which pandas' group-by sums are not (the same rows sum
    to another last bit inside the larger frame of one process), and a collective without a
    host is on no node, in one process as in parts (`nodes.collectives`)."""
    run = _run(case)
    rng = np.random.default_rng(1)
    spans = run.spans.copy()
    spans["host"] = spans["host"].astype(object)
    picked = np.flatnonzero(rng.random(len(spans)) < 0.05)
    if hostless:
        spans.loc[picked, "host"] = None
    else:
        spans = spans.drop(index=picked).reset_index(drop=True)
    got, want = _diagnoses(dataclasses.replace(run, spans=spans))
    assert render_json(got) == render_json(want)


_PHASE_S = {"dataload": 0.3, "rollout": 20.0, "reward": 1.0, "old_logprob": 3.0,
            "ref_logprob": 3.0, "values": 3.0, "advantage": 0.2, "update_actor": 10.0,
            "update_critic": 8.0, "reshard": 1.0}  # fmt: skip


@pytest.mark.parametrize(
    ("framework", "kind", "severity", "scale", "noise", "seed", "steps", "number"),
    [
        # a collective outside its process's update spans: the matched update span's times
        # were float64 in one process (other hosts' rows unmatched) and exact node by node
        ("swift", "comm_bound", 0.6208177988943002, 0.2954856732816766, 0.09428142805925069,
         190987833, 6, 27),
        # the idle of GPUs only waiting on the dataload, summed per part then added
        ("openrlhf", "dataloader_starvation", 0.5702942473034174, 0.22382552652295462,
         0.1104424758656195, 492099464, 8, 62),
    ],
)  # fmt: skip
def test_scenarios_with_spans_dropped_node_by_node_are_the_whole_runs(
    framework, kind, severity, scale, noise, seed, steps, number
):
    """Two scenarios `check_parts_scenarios.py --drop-spans 0.05` found differing (5 % of the
    spans dropped at random, as a full queue drops them), now the same document."""
    cfg = SimConfig(gpus=16, gpus_per_host=8, framework=framework, steps=steps,
                    time_scale=scale, noise=noise, seed=seed, phase_s=_PHASE_S,
                    pathologies=[Pathology(kind, severity)])  # fmt: skip
    run = simulate(cfg).run
    rng = np.random.default_rng(number)  # the script's draws for its scenario ``number``
    rng.random(len(run.spans))  # (the spans it would leave without a host: none)
    keep = rng.random(len(run.spans)) >= 0.05
    run = dataclasses.replace(run, spans=run.spans[keep].reset_index(drop=True))
    got, want = _diagnoses(run)
    assert kind in {f["kind"] for f in want["findings"]}
    assert render_json(got) == render_json(want)


def test_spans_without_a_host_leave_a_split_placement_split():
    """A rollout span and an update span without a host are on no node: the rollout's and
    the update's nodes stay disjoint, and weight sync crosses nodes in one process as node
    by node (the host-less spans once put one node, None, in both sets)."""
    cfg = SimConfig(gpus=16, gpus_per_host=8, framework="openrlhf", placement="split",
                    algorithm="ppo", steps=6, time_scale=0.2, seed=667934971, phase_s=_PHASE_S,
                    pathologies=[Pathology("pipeline_bubble", 0.6)])  # fmt: skip
    run = simulate(cfg).run
    spans = run.spans.copy()
    spans["host"] = spans["host"].astype(object)
    for phase in ("rollout", "update_actor"):
        spans.loc[np.flatnonzero((spans["phase"] == phase).to_numpy())[:1], "host"] = None
    got, want = _diagnoses(dataclasses.replace(run, spans=spans))
    assert want["summary"]["nodes"]["weight_sync_crosses_nodes"] is True
    assert render_json(got) == render_json(want)


def test_the_hot_gpus_stretches_keep_their_nanoseconds_node_by_node():
    """A part without a hot GPU has no throttled stretch: its empty table of stretches keeps
    integer times, so the stretches of the part that has one, joined with it, are not turned
    to float64 (rounded to 256 ns at epoch nanoseconds, as one process never rounds them)."""
    cfg = SimConfig(gpus=32, gpus_per_host=8, framework="verl", steps=6, time_scale=0.11128,
                    noise=0.04201, seed=5411422, phase_s=_PHASE_S,
                    pathologies=[Pathology("hot_gpu", 0.4389),
                                 Pathology("imbalance", 0.8891)])  # fmt: skip
    run = simulate(cfg).run
    # a real clock's nanoseconds (the simulator's samples fall on multiples of 256 ns)
    run = dataclasses.replace(run, gpu=run.gpu.assign(t_ns=run.gpu["t_ns"] + 37))
    got, want = _diagnoses(run, 2)
    hot = [f for f in want["findings"] if f["kind"] == "hot_gpu"]
    assert hot and any(a % 256 or b % 256 for a, b in hot[0]["evidence"]["intervals"])
    assert render_json(got) == render_json(want)
