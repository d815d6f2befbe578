"""Every diagnosis says what it is judged on, and never calls a run healthy when its data
could not have shown a stall (no timing, one or two steps, phase times without GPU samples)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from conftest import SHARED_FIXTURES, run_gpuprof

from gpuprof import api, store
from gpuprof.analyzers.diagnose import few_steps_hedged, no_finding_sentence
from gpuprof.analyzers.findings import Finding, Thresholds
from gpuprof.reports.html import render_html
from gpuprof.sim import SimConfig, simulate

PUBLIC = Path(__file__).parent / "labelled" / "public"
HEALTHY_LINE = "No stall above the noise threshold was found."


def _imported(tmp_path, path: Path):
    run_dir = tmp_path / "run"
    api.import_files([path], run_dir)
    return run_dir, store.load_run(run_dir)


def test_log_without_any_timing_says_nothing_to_attribute(tmp_path):
    # a TRL paste of metrics dicts: rewards and losses, no step_time, no train_runtime
    run_dir, run = _imported(tmp_path, PUBLIC / "trl_uir1_issue20_grpo_dict.log")
    diagnosis = api.analyze(run)
    basis = diagnosis.summary["data_basis"]
    assert basis["gpu_samples"] is None and basis["phase_timing"] is None
    assert basis["line"].startswith("Judged on: nothing")
    out = run_gpuprof("analyze", str(run_dir))
    assert out.returncode == 0
    assert "nothing to attribute" in out.stdout
    assert "No stall" not in out.stdout


def test_one_step_line_is_not_called_healthy_and_names_its_counters(tmp_path):
    # one verl step line (issue #7412): phase times and verl's own counters, one step
    run_dir, run = _imported(tmp_path, PUBLIC / "verl_issue7412_long_tail_agent_loop.log")
    diagnosis = api.analyze(run)
    basis = diagnosis.summary["data_basis"]
    assert basis["phase_timing"]["steps"] == 1 and basis["gpu_samples"] is None
    assert {"rollout", "old_logprob", "ref_logprob"} <= set(basis["phase_timing"]["phases"])
    assert "perf/mfu/actor" in basis["framework_counters"]
    assert "phase timing (1 step," in basis["line"] and "framework counters" in basis["line"]
    doc = json.loads(run_gpuprof("analyze", str(run_dir), "--json").stdout)
    assert doc["summary"]["data_basis"]["line"] == basis["line"]
    if not diagnosis.findings:
        sentence, good = no_finding_sentence(diagnosis)
        assert not good and "too few to rule one out" in sentence
        text = run_gpuprof("analyze", str(run_dir)).stdout
        assert HEALTHY_LINE not in text and "too few to rule one out" in text


@pytest.mark.skipif(not SHARED_FIXTURES.exists(), reason="shared fixtures not present")
def test_findings_of_a_single_step_carry_low_confidence_and_say_why(tmp_path):
    # verl issue #1208: one step line, generation 77% of the step → rollout_bound
    _, run = _imported(tmp_path, SHARED_FIXTURES / "verl" / "issue_excerpt_gh200_sglang.txt")
    diagnosis = api.analyze(run)
    th = Thresholds()
    assert diagnosis.findings
    for f in diagnosis.findings:
        assert f.confidence <= th.few_steps_max_confidence
        assert "only 1 step, which can't tell a pattern from a one-off" in f.summary


def test_few_steps_hedging_spares_sample_based_kinds_and_runs_with_enough_steps():
    th = Thresholds()
    found = [
        Finding("reward_bound", 100.0, 0.2, 0.9, "GPUs idle in reward"),
        Finding("unused_gpu", 100.0, 0.2, 0.9, "GPU 3 never used"),
    ]
    two = {"phase_timing": {"steps": 2, "phases": ["reward"]}}
    hedged = {f.kind: f for f in few_steps_hedged(found, two, th)}
    assert hedged["reward_bound"].confidence == th.few_steps_max_confidence
    assert "only 2 steps" in hedged["reward_bound"].summary
    assert hedged["unused_gpu"].confidence == 0.9 and "step" not in hedged["unused_gpu"].summary
    three = {"phase_timing": {"steps": 3, "phases": ["reward"]}}
    assert few_steps_hedged(found, three, th) == found
    assert few_steps_hedged(found, {"phase_timing": None}, th) == found


def test_gpu_sampled_run_states_its_samples_and_a_healthy_one_says_so():
    run = simulate(SimConfig(steps=6, time_scale=0.2, seed=3)).run
    diagnosis = api.analyze(run)
    gpu = diagnosis.summary["data_basis"]["gpu_samples"]
    assert gpu["gpus"] == 8 and gpu["samples"] == len(run.gpu)
    assert gpu["interval_s"] == pytest.approx(0.1, rel=0.2)
    line = diagnosis.summary["data_basis"]["line"]
    assert line.startswith("Judged on: GPU samples (8 GPUs,") and "phase timing (" in line
    html = render_html(run, diagnosis)
    assert "Judged on: GPU samples" in html
    if not diagnosis.findings:
        assert no_finding_sentence(diagnosis) == (HEALTHY_LINE, True)


def test_untimed_steps_keep_the_frameworks_own_figures(tmp_path):
    # verl issue #2060: step lines with perf/mfu/actor and no timing key at all
    _, run = _imported(tmp_path, PUBLIC / "verl_issue2060_step0_step1.log")
    diagnosis = api.analyze(run)
    basis = diagnosis.summary["data_basis"]
    assert (
        basis["phase_timing"] is None
        and basis["framework_counters"][0] == "perf/cpu_memory_used_gb"
    )
    assert "perf/mfu/actor" in basis["framework_counters"]
    assert "nothing to attribute (only framework counters: perf/" in basis["line"]
    framework = diagnosis.summary["efficiency"]["framework"]["metrics"]
    assert framework["perf/mfu/actor"]["mean"] == pytest.approx(0.343)
