"""Typed evidence: each detector's real finding, fed to every catalogue rule of its kind."""

from __future__ import annotations

import pytest

from gpuprof.analyzers.diagnose import diagnose
from gpuprof.analyzers.evidence import EVIDENCE, Evidence
from gpuprof.analyzers.knobs import CATALOGUE, EVIDENCE_READS, SUGGEST_RULES
from gpuprof.analyzers.stalls import STALLS
from gpuprof.sim import STALL_KINDS, Pathology, SimConfig, simulate


@pytest.fixture(scope="module")
def found() -> dict:
    """Each simulated stall kind's own finding, from a run with only that stall."""
    out = {}
    for kind in STALL_KINDS:
        cfg = SimConfig(gpus=8, steps=6, time_scale=0.1, pathologies=[Pathology(kind, 0.8)], seed=3)
        if kind == "pipeline_bubble":
            cfg = SimConfig(**{**cfg.__dict__, "placement": "split"})
        findings = {f.kind: f for f in diagnose(simulate(cfg).run).findings}
        out[kind] = findings.get(kind)
    return out


def test_every_kind_has_an_evidence_class_and_a_stall():
    assert set(EVIDENCE) == {s.kind for s in STALLS}
    for stall in STALLS:
        assert stall.evidence is EVIDENCE[stall.kind] and stall.claims


@pytest.mark.parametrize("kind", STALL_KINDS)
def test_detector_evidence_drives_every_rule_of_its_kind(kind, found):
    finding = found[kind]
    assert finding is not None, f"the simulator's {kind} was not found"
    evidence = finding.evidence
    assert type(evidence) is EVIDENCE[kind]
    assert finding.to_dict()["evidence"] == evidence.to_dict()  # JSON is the typed fields
    rows = [e for e in CATALOGUE if e.kind == kind]
    assert rows, f"no catalogue row for {kind}"
    empty = EVIDENCE[kind]()
    for entry in rows:
        rule = SUGGEST_RULES[entry.rule]
        rule(entry.default, entry.arg, evidence, {"gpus_per_host": 8})  # never raises
        field = EVIDENCE_READS.get(entry.rule)
        if field is None:
            continue  # the rule does not read evidence
        assert getattr(evidence, field) is not None, (entry.knob, field)
        # the evidence-driven branch: the suggestion changes with the measured figure
        base = 0.3 if entry.rule == "memory_fraction" else None  # a low setting, or unknown
        with_ev = rule(base, entry.arg, evidence, {})
        assert with_ev is not None and with_ev != rule(base, entry.arg, empty, {}), entry.knob


def test_a_rule_reading_a_field_its_kind_lacks_fails_loudly():
    class Other(Evidence):
        pass

    with pytest.raises(AttributeError):
        SUGGEST_RULES["cap_length"](None, 4, Other(), {})


def test_summary_keeps_idle_apart_from_busy_losses():
    """Idle time by cause holds idle kinds only (it sums to the run's idle time with
    ``other_idle``); memory headroom and throttling are busy-but-slow losses."""
    from gpuprof.analyzers.findings import BUSY_LOSS_KINDS

    cfg = SimConfig(gpus=8, steps=6, time_scale=0.1, seed=5,
                    pathologies=[Pathology("reward_bound", 0.7), Pathology("memory_headroom", 0.7),
                                 Pathology("throttling", 0.7)])  # fmt: skip
    d = diagnose(simulate(cfg).run)
    kinds = {f.kind for f in d.findings}
    assert {"reward_bound", "memory_headroom", "throttling"} <= kinds
    idle, busy = d.summary["idle_gpu_s_by_cause"], d.summary["busy_loss_gpu_s_by_cause"]
    assert "reward_bound" in idle and not set(idle) & BUSY_LOSS_KINDS
    assert {"memory_headroom", "throttling"} <= set(busy) <= BUSY_LOSS_KINDS
    assert sum(idle.values()) == pytest.approx(d.summary["idle_gpu_s"], rel=1e-3)


def test_every_threshold_names_its_source():
    """Thresholds are one documented table: each field's docstring says where its value
    comes from (measured, vendor or seed), so a simulator-only number is visible as one."""
    import ast
    import inspect

    from gpuprof.analyzers import findings

    tree = ast.parse(inspect.getsource(findings.Thresholds))
    body = tree.body[0].body
    fields = {}
    for i, node in enumerate(body):
        if isinstance(node, ast.AnnAssign):
            doc = body[i + 1] if i + 1 < len(body) else None
            text = doc.value.value if isinstance(doc, ast.Expr) else ""
            fields[node.target.id] = " ".join(text.split())
    assert len(fields) >= 30
    for name, doc in fields.items():
        assert "Source: " in doc, name
        source = doc.split("Source: ", 1)[1]
        assert source.startswith(("measured", "vendor", "seed")), name
