"""`gpuprof demo`, `analyze` and `compare` end to end, and analysis of bad or thin runs."""

from __future__ import annotations

import json

import numpy as np
import pytest
from conftest import run_gpuprof

from gpuprof import store
from gpuprof.analyzers.diagnose import diagnose
from gpuprof.model import Run, RunMeta
from gpuprof.sim import Pathology, SimConfig, simulate

DEFAULT_KINDS = {"reward_bound", "reshard_idle", "memory_headroom"}


@pytest.fixture(scope="module")
def demo_runs(tmp_path_factory):
    base = tmp_path_factory.mktemp("demo")
    out = {}
    for scenario in ("default", "healthy"):
        result = run_gpuprof("demo", "-o", str(base / scenario), "--scenario", scenario,
                             "--duration", "300")  # fmt: skip
        assert result.returncode == 0, result.stderr
        out[scenario] = (base / scenario, result.stdout)
    return out


def test_demo_writes_a_run_and_prints_its_diagnosis(demo_runs):
    run_dir, stdout = demo_runs["default"]
    run = store.load_run(run_dir)
    assert run.gpu["gpu"].nunique() == 8 and len(run.spans)
    for kind in DEFAULT_KINDS:
        assert kind in stdout
    assert "actor_rollout_ref.rollout.gpu_memory_utilization" in stdout
    assert f"run saved to {run_dir}" in stdout


def test_analyze_json_is_the_documented_document(demo_runs):
    run_dir, _ = demo_runs["default"]
    result = run_gpuprof("analyze", str(run_dir), "--json")
    assert result.returncode == 0, result.stderr
    doc = json.loads(result.stdout)
    assert doc["schema_version"] == 2
    findings = doc["findings"]
    lost = [f["gpu_seconds_lost"] for f in findings]
    assert lost == sorted(lost, reverse=True)
    assert {f["kind"] for f in findings[:3]} >= DEFAULT_KINDS
    for f in findings:
        assert set(f) >= {"kind", "gpu_seconds_lost", "share", "confidence", "evidence"}
        assert 0 <= f["share"] <= 1 and 0 <= f["confidence"] <= 1
    recs = doc["recommendations"]
    assert recs
    for r in recs:
        assert set(r) >= {"kind", "framework", "knob", "current", "suggested",
                          "expected_gain_share", "rationale"}  # fmt: skip
    memory = [r for r in recs if r["knob"] == "actor_rollout_ref.rollout.gpu_memory_utilization"]
    assert memory and float(memory[0]["current"]) < float(memory[0]["suggested"])
    top1 = run_gpuprof("analyze", str(run_dir), "--json", "--top", "1")
    assert len(json.loads(top1.stdout)["findings"]) == 1


def test_healthy_demo_has_no_findings(demo_runs):
    run_dir, stdout = demo_runs["healthy"]
    doc = json.loads(run_gpuprof("analyze", str(run_dir), "--json").stdout)
    assert doc["findings"] == []
    assert "No stall above the noise threshold" in stdout


def test_compare_shows_the_change(demo_runs):
    before, _ = demo_runs["default"]
    after, _ = demo_runs["healthy"]
    result = run_gpuprof("compare", str(before), str(after), "--json")
    assert result.returncode == 0, result.stderr
    rows = {r["metric"]: r for r in json.loads(result.stdout)["rows"]}
    assert rows["lost: reward_bound"]["after"] == 0 and rows["lost: reward_bound"]["better"]
    assert rows["mean GPU utilization"]["delta"] > 0
    assert rows["step time p50"]["after"] < rows["step time p50"]["before"]
    text = run_gpuprof("compare", str(before), str(after))
    assert "mean GPU utilization" in text.stdout and "better" in text.stdout


@pytest.mark.parametrize(
    "args",
    [["demo", "--scenario", "no-such"], ["demo", "--gpus", "0"], ["analyze", "/no/such/run"],
     ["compare", "/no/such/a", "/no/such/b"]],
)  # fmt: skip
def test_bad_input_is_one_line_and_exit_2(args, tmp_path):
    result = run_gpuprof(*args, cwd=tmp_path)
    assert result.returncode == 2
    assert len(result.stderr.strip().splitlines()) == 1, result.stderr
    assert "Traceback" not in result.stderr


def _thin_runs():
    full = simulate(SimConfig(gpus=2, steps=3, time_scale=0.05, seed=3)).run
    empty = Run(meta=RunMeta(run_id="empty"))
    no_gpu = Run(meta=RunMeta(run_id="cpu"), spans=full.spans, host=full.host, procs=full.procs)
    no_spans = simulate(SimConfig(gpus=2, steps=3, time_scale=0.05, seed=3)).run
    no_spans.spans = no_spans.spans.iloc[0:0]
    backwards = simulate(SimConfig(gpus=2, steps=3, time_scale=0.05, seed=3)).run
    backwards.spans.loc[backwards.spans.index[:5], "end_ns"] = backwards.spans["start_ns"] - 10
    all_nan = simulate(SimConfig(gpus=2, steps=3, time_scale=0.05, seed=3)).run
    for col in ("util_gpu_pct", "sm_active_pct", "mem_used_bytes", "power_w", "sm_clock_mhz"):
        all_nan.gpu[col] = np.nan
    skewed = simulate(SimConfig(gpus=16, gpus_per_host=8, steps=3, time_scale=0.05, seed=3)).run
    on_node1 = skewed.gpu["host"] == skewed.gpu["host"].max()
    skewed.gpu.loc[on_node1, "t_ns"] += 30_000_000_000
    return {"empty": empty, "no_gpu": no_gpu, "no_spans": no_spans, "backwards": backwards,
            "all_nan": all_nan, "skewed": skewed}  # fmt: skip


@pytest.mark.parametrize("name", ["empty", "no_gpu", "no_spans", "backwards", "all_nan", "skewed"])
def test_thin_or_odd_runs_still_get_a_diagnosis_with_notes(name):
    run = _thin_runs()[name]
    diagnosis = diagnose(run)
    doc = diagnosis.to_dict()
    assert set(doc) >= {"summary", "findings", "recommendations", "notes"}
    expected_note = {
        "empty": "no GPU samples",
        "no_gpu": "no GPU samples",
        "no_spans": "no phase spans",
        "backwards": "end before they start",
        "all_nan": "never available",
        "skewed": "skewed",
    }[name]
    assert any(expected_note in n for n in diagnosis.notes), diagnosis.notes
    assert not any("analysis failed" in n for n in diagnosis.notes), diagnosis.notes


def test_analyze_a_host_only_run_from_watch(tmp_path):
    run_dir = tmp_path / "run"
    code = "import gpuprof\nwith gpuprof.phase('rollout'): pass"
    assert run_gpuprof("watch", "--no-nvml", "-q", "-o", str(run_dir), "--", "python3", "-c",
                       code).returncode == 0  # fmt: skip
    result = run_gpuprof("analyze", str(run_dir))
    assert result.returncode == 0, result.stderr
    assert "no GPU samples" in result.stdout


def test_thresholds_are_one_config_that_steers_the_detectors():
    from gpuprof.analyzers.findings import Thresholds

    run = simulate(
        SimConfig(gpus=4, steps=4, time_scale=0.1, seed=5,
                  pathologies=[Pathology("reward_bound", 0.8), Pathology("comm_bound", 0.8)])
    ).run  # fmt: skip
    default = {f.kind: f.gpu_seconds_lost for f in diagnose(run).findings}
    assert {"reward_bound", "comm_bound"} <= set(default)
    generous = Thresholds(reward_allowance_share=0.2, collective_min_frac=0.9)
    tuned = {f.kind: f.gpu_seconds_lost for f in diagnose(run, generous).findings}
    assert "comm_bound" not in tuned
    assert tuned.get("reward_bound", 0.0) < default["reward_bound"]
    assert diagnose(run, Thresholds(min_share=0.99)).findings == []


def test_summary_and_analyze_report_the_same_tokens_per_second(demo_runs):
    from gpuprof.analyzers.basic import run_summary, step_times, tokens_per_s
    from gpuprof.analyzers.diagnose import diagnose
    from gpuprof.loader import load_for_analysis

    run = load_for_analysis(demo_runs["default"][0])
    steps = step_times(run)
    assert steps["tokens"].notna().any()
    expected = steps["tokens"].sum() / (
        steps["duration_s"].sum() / steps[["host", "pid"]].drop_duplicates().shape[0]
    )
    assert tokens_per_s(steps) == pytest.approx(expected)
    assert run_summary(run)["tokens_per_s"] == pytest.approx(expected)
    assert diagnose(run).summary["tokens_per_s"] == pytest.approx(expected)


@pytest.mark.parametrize("command", [["analyze", "{run}", "--json"], ["summary", "{run}"]])
def test_gpuprof_profile_writes_the_commands_profile(demo_runs, tmp_path, command):
    """GPUPROF_PROFILE=FILE profiles the command, on the fast path that ends the process
    without teardown (analyze) as on typer's (summary): the same output, plus one line on
    stderr naming the profile, which holds the analyzers' functions."""
    import pstats

    from conftest import clean_env

    run_dir, _ = demo_runs["default"]
    args = [a.format(run=run_dir) for a in command]
    plain = run_gpuprof(*args)
    path = tmp_path / "analyze.prof"
    profiled = run_gpuprof(*args, env=clean_env(GPUPROF_PROFILE=str(path)))
    assert profiled.returncode == plain.returncode == 0, profiled.stderr
    assert profiled.stdout == plain.stdout
    assert profiled.stderr.splitlines()[-1] == (
        f"gpuprof: profile written to {path} (python -m pstats {path})")  # fmt: skip
    files = {file for file, _, _ in pstats.Stats(str(path)).stats}
    assert any("gpuprof/analyzers/" in file for file in files)


def test_a_profile_that_cannot_be_written_is_one_line(demo_runs, tmp_path):
    from conftest import clean_env

    run_dir, _ = demo_runs["default"]
    path = tmp_path / "no-such-dir" / "p.prof"
    result = run_gpuprof(
        "analyze", str(run_dir), "--json", env=clean_env(GPUPROF_PROFILE=str(path))
    )
    assert result.returncode == 0 and json.loads(result.stdout)
    assert result.stderr.strip() == (
        f"gpuprof: error: GPUPROF_PROFILE: the profile could not be written to {path}: "
        "No such file or directory")  # fmt: skip
