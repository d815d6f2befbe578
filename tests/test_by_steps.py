"""`analyze --by-steps N`: a run diagnosed N steps at a time, each stretch exactly as
`--steps A:B` diagnoses it, put side by side and summed."""

from __future__ import annotations

import json

import pytest
from conftest import SHARED_FIXTURES, run_gpuprof
from lazy_rfc3987 import defer_here

from gpuprof import api, by_steps, cli, load_cache, step_window, store
from gpuprof.analyzers.over_steps import combine
from gpuprof.reports.fmt import render_json
from gpuprof.reports.terminal import by_steps_renderable, render_text
from gpuprof.sim import Pathology, SimConfig, simulate


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    """11 steps of 8 GPUs on two nodes (two run files), bound by rewards and resharding."""
    path = tmp_path_factory.mktemp("by_steps") / "run"
    config = SimConfig(
        gpus=8,
        gpus_per_host=4,
        steps=11,
        seed=5,
        pathologies=[Pathology("reward_bound", 0.8), Pathology("reshard_idle", 0.6)],
    )
    run = simulate(config).run
    store.save_run(run, path)
    assert len(store.run_files(path)) == 2
    return path


def _json(document) -> dict:
    return json.loads(render_json(document))


def _steps_json(run_dir, text: str, capsys) -> dict:
    """``analyze RUN --steps text --json``, in this process."""
    capsys.readouterr()
    cli.analyze_command(run_dir, json_out=True, steps=text)
    return json.loads(capsys.readouterr().out)


def test_each_stretch_is_diagnosed_as_steps_a_b_diagnoses_it(run_dir, capsys):
    doc = _json(by_steps.diagnose(run_dir, 4, workers=2))
    assert doc["by_steps"] == {
        "steps_per_stretch": 4, "stretches": 3, "run_steps": 11, "run_first": 0, "run_last": 10
    }  # fmt: skip
    assert [(s["first"], s["last"], s["steps"]) for s in doc["stretches"]] == [
        (0, 3, 4), (4, 7, 4), (8, 10, 3)
    ]  # fmt: skip
    for stretch in doc["stretches"]:
        alone = _steps_json(run_dir, f"{stretch['first']}:{stretch['last'] + 1}", capsys)
        assert stretch["diagnosis"] == alone
    # the sums are the stretches' own figures added up
    rows = doc["stretches"]
    assert doc["summary"]["gpu_hours"] == pytest.approx(sum(r["gpu_hours"] for r in rows))
    assert doc["summary"]["steps"] == 11
    assert doc["kinds"], "the simulated run has stalls"
    for kind in doc["kinds"]:
        per = [sum(f["gpu_seconds_lost"] for f in r["findings"] if f["kind"] == kind["kind"])
               for r in rows]  # fmt: skip
        assert kind["per_stretch_gpu_s"] == pytest.approx(per, abs=1e-3)
        assert kind["gpu_seconds_lost"] == pytest.approx(sum(per), abs=1e-3)
        assert kind["stretches_found"] == sum(v > 0 for v in per)
    idle = sum(r["diagnosis"]["summary"]["idle_gpu_s"] for r in rows)
    assert doc["summary"]["idle_gpu_s"] == pytest.approx(idle)
    phase_gpu_s = {p["phase"]: p["gpu_s"] for p in doc["summary"]["phases"]}
    for phase, value in phase_gpu_s.items():
        parts = [p["gpu_s"] for r in rows for p in r["diagnosis"]["summary"]["phases"]
                 if p["phase"] == phase]  # fmt: skip
        assert value == pytest.approx(sum(parts))


def test_the_document_does_not_depend_on_the_workers(run_dir):
    assert _json(by_steps.diagnose(run_dir, 3, workers=1)) == _json(
        by_steps.diagnose(run_dir, 3, workers=2)
    )


def test_stretches_as_ray_tasks_give_the_same_document(run_dir, monkeypatch, tmp_path):
    defer_here(tmp_path, monkeypatch)  # Ray's processes start seconds sooner
    ray = pytest.importorskip("ray")
    monkeypatch.setenv("RAY_USAGE_STATS_ENABLED", "0")
    tasks = _json(by_steps.diagnose(run_dir, 4, ray="local"))
    assert not ray.is_initialized()  # the Ray it started is shut down
    assert tasks == _json(by_steps.diagnose(run_dir, 4, workers=1))


def test_a_run_not_kept_yet_is_kept_first_and_stretches_read_from_it(
    run_dir, tmp_path, monkeypatch, capsys
):
    monkeypatch.delenv(load_cache.ENV_CACHE, raising=False)
    copy = tmp_path / "run"
    store.save_run(store.load_run(run_dir), copy)
    assert load_cache.step_times(copy) is None
    doc = _json(by_steps.diagnose(copy, 5, workers=2))
    assert load_cache.step_times(copy) is not None  # read whole once, in a child process
    assert [s["first"] for s in doc["stretches"]] == [0, 5, 10]
    for stretch in doc["stretches"]:
        alone = _steps_json(copy, f"{stretch['first']}:{stretch['last'] + 1}", capsys)
        assert stretch["diagnosis"] == alone


def test_a_long_run_is_kept_file_by_file_first(run_dir, tmp_path, monkeypatch):
    from gpuprof import loader

    monkeypatch.delenv(load_cache.ENV_CACHE, raising=False)
    copy = tmp_path / "run"
    store.save_run(store.load_run(run_dir), copy)
    budget = store.count_rows(copy, "gpu") // 10  # merged, as a long run is
    monkeypatch.setattr(loader, "MAX_GPU_SAMPLES", budget)
    doc = _json(by_steps.diagnose(copy, 4, workers=2))
    assert (copy / load_cache.DIRNAME / "gpu.00001.arrow").exists()  # kept in parts
    assert any(n.startswith("the whole run: long run: ") for n in doc["notes"])
    alone = loader.load_for_analysis(copy, budget, steps=step_window.resolve(copy, "8:11"))
    assert _json(api.analyze(alone).to_dict()) == doc["stretches"][-1]["diagnosis"]
    assert alone.gpu.attrs["factor"] > 1


def test_consecutive_windows_are_those_of_their_slices(run_dir):
    windows = step_window.consecutive(run_dir, 5)
    assert [(w.first, w.last) for w in windows] == [(0, 4), (5, 9), (10, 10)]
    for w in windows:
        assert w == step_window.resolve(run_dir, f"{w.first}:{w.last + 1}")
    with pytest.raises(ValueError):
        step_window.consecutive(run_dir, 0)


def test_combine_merges_recommendations_and_notes():
    def doc(first, last, findings, recs, notes):
        return {
            "schema_version": 2,
            "summary": {"run_id": "r", "gpus": 2, "steps": last - first + 1, "basis": "gpu_samples",
                        "gpu_hours": 1.0, "duration_s": 1800.0, "mean_util_gpu_pct": 40.0,
                        "idle_gpu_s": 100.0, "idle_gpu_s_by_cause": {"reward_bound": 10.0},
                        "phases": [],
                        "stretch": {"first": first, "last": last, "steps": last - first + 1,
                                    "run_steps": 20, "run_first": 0, "run_last": 19}},
            "findings": [{"kind": k, "gpu_seconds_lost": v, "share": v / 3600}
                         for k, v in findings],
            "recommendations": recs,
            "notes": notes,
        }  # fmt: skip

    def rec(gain, suggested):
        return {"kind": "reward_bound", "framework": "verl", "knob": "k", "current": 1,
                "suggested": suggested, "expected_gain_gpu_s": gain, "confidence": 0.9}  # fmt: skip

    out = combine(
        [
            doc(0, 9, [("reward_bound", 30.0)], [rec(20.0, 2)], ["shared", "steps 0–9 alone (…)"]),
            doc(10, 19, [("reward_bound", 90.0), ("imbalance", 5.0)], [rec(60.0, 4)],
                ["shared", "only here"]),
        ],
        10,
    )  # fmt: skip
    assert [k["kind"] for k in out["kinds"]] == ["reward_bound", "imbalance"]
    assert out["kinds"][0]["per_stretch_gpu_s"] == [30.0, 90.0]
    assert out["kinds"][0]["share"] == pytest.approx(120.0 / 7200.0, abs=1e-5)
    assert (out["kinds"][1]["first_step"], out["kinds"][1]["stretches_found"]) == (10, 1)
    [r] = out["recommendations"]
    assert (r["suggested"], r["expected_gain_gpu_s"], r["stretches_given"]) == (4, 80.0, 2)
    assert r["values_from_steps"] == [10, 19]
    assert out["notes"] == ["shared", "steps 10–19: only here"]
    assert out["summary"]["idle_gpu_s_by_cause"] == {"reward_bound": 20.0}
    text = render_text(by_steps_renderable(out))
    assert "in 2 stretches of 10" in text and "1/2" in text and "reward_bound" in text


def _gpuprof(*args):
    return run_gpuprof(*args, timeout=300)


def test_the_command_line(run_dir, tmp_path):
    out = _gpuprof("analyze", run_dir, "--by-steps", "6", "--json", "--top", "1")
    assert out.returncode == 0, out.stderr
    doc = json.loads(out.stdout)
    assert doc["by_steps"]["stretches"] == 2 and len(doc["kinds"]) <= 1
    assert all(len(s["diagnosis"]["findings"]) <= 1 for s in doc["stretches"])
    out = _gpuprof("analyze", run_dir, "--by-steps", "6")
    assert out.returncode == 0, out.stderr
    assert "steps 0–10 (11 recorded) in 2 stretches of 6" in out.stdout.replace("\n", " ")
    for args, why in (
        (["--by-steps", "3", "--steps", "0:4"], "--steps does not go with it"),
        (["--by-steps", "3", "--ray", "127.0.0.1:1"], "--ray 127.0.0.1:1: cannot use the Ray"),
        (["--by-steps", "0"], "--by-steps"),  # typer's message for a bad value
    ):
        out = _gpuprof("analyze", run_dir, *args)
        assert out.returncode == 2 and why in out.stderr and "Traceback" not in out.stderr
    bare = simulate(SimConfig(gpus=2, steps=3, seed=1)).run
    bare.spans = bare.spans.iloc[0:0]
    bare.events = bare.events.iloc[0:0]
    store.save_run(bare, tmp_path / "bare")
    out = _gpuprof("analyze", tmp_path / "bare", "--by-steps", "2")
    assert out.returncode == 2
    assert out.stderr.strip().splitlines() == [
        f"gpuprof: error: {tmp_path / 'bare'}: --by-steps needs the steps a run recorded "
        "(gpuprof.step() or a framework adapter); this run has none"
    ]


def test_a_real_verl_log_stretch_by_stretch(tmp_path, capsys):
    """verl's console log of a 2-GPU PPO run (106 steps of phase timings, no GPU samples),
    imported: 25 steps at a time, each stretch as `--steps` diagnoses it."""
    log = SHARED_FIXTURES / "verl" / "gemma2b_ppo_2gpu_old_format.log"
    run_dir = tmp_path / "verl"
    assert run_gpuprof("import", str(log), "-o", str(run_dir)).returncode == 0
    doc = _json(by_steps.diagnose(run_dir, 25, workers=2))
    assert [(s["first"], s["last"]) for s in doc["stretches"]] == [
        (0, 24), (25, 49), (50, 74), (75, 99), (100, 105)
    ]  # fmt: skip
    assert doc["summary"]["basis"] == "phase_timing" and doc["summary"]["steps"] == 106
    last = doc["stretches"][-1]
    assert last["diagnosis"] == _steps_json(run_dir, "100:106", capsys)
    wall = {p["phase"]: p["wall_s"] for p in doc["summary"]["phases"]}
    assert wall and all(v > 0 for v in wall.values())


def test_memory_decides_how_many_stretches_at_once_and_whether_to_read_whole(
    run_dir, tmp_path, monkeypatch
):
    monkeypatch.setenv("GPUPROF_WORKERS", "2")
    both = _json(by_steps.diagnose(run_dir, 4))
    monkeypatch.setattr(by_steps, "MEMORY_BUDGET_BYTES", by_steps.stretch_bytes(8, 4) + 1)
    one = _json(by_steps.diagnose(run_dir, 4))
    assert one["notes"][:-1] == both["notes"]
    assert one["notes"][-1].startswith("stretches diagnosed 1 at a time (of 2 cores), ~")
    assert one["stretches"] == both["stretches"]
    assert _json(by_steps.diagnose(run_dir, 4, workers=2))["notes"] == both["notes"]  # as told
    # too large to read whole here: every stretch reads the run files, and the notes say so
    monkeypatch.delenv(load_cache.ENV_CACHE, raising=False)
    monkeypatch.setattr(by_steps, "available_bytes", lambda: 0)
    monkeypatch.setattr(by_steps, "KEEP_SPAN_BYTES", by_steps.MEMORY_BUDGET_BYTES)
    copy = tmp_path / "run"
    store.save_run(store.load_run(run_dir), copy)
    files = _json(by_steps.diagnose(copy, 4, workers=2))
    assert load_cache.step_times(copy) is None
    assert any(n.startswith("no form of the run could be kept first (") for n in files["notes"])
    assert files["stretches"] == both["stretches"]


def test_real_profiler_traces_with_too_few_steps_say_so(tmp_path):
    """Two ranks' PyTorch-profiler traces (HTA's sample, two steps): one stretch, and no
    "no stall" where two steps cannot rule one out."""
    traces = [SHARED_FIXTURES / "kineto" / f"hta_sampled_rank-{r}.json.gz" for r in (0, 1)]
    run_dir = tmp_path / "kineto"
    assert run_gpuprof("import", *map(str, traces), "-o", str(run_dir)).returncode == 0
    doc = _json(by_steps.diagnose(run_dir, 2, workers=1))
    assert doc["by_steps"]["stretches"] == 1 and doc["kinds"] == []
    [row] = doc["stretches"]
    assert row["no_finding"].startswith("No stall above the noise threshold in 2 steps — too few")
    assert not any("alone (" in n for n in doc["notes"])
    out = _gpuprof("analyze", run_dir, "--by-steps", "2")
    assert out.returncode == 0, out.stderr
    text = " ".join(out.stdout.split())
    assert "in 1 stretch of 2," in text and "No finding in any stretch: No stall" in text
