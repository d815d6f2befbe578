"""What bounds the step: the cross-phase ratios and the decode roofline worked by hand, the
``bound`` section from one step line up, start-up kept out of the stalls, exposed NCCL time
from a trace's own kernels, and idle kept apart from busy losses in every headline."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest
from conftest import SHARED_FIXTURES, run_gpuprof

from gpuprof import api
from gpuprof.analyzers.diagnose import nothing_to_judge
from gpuprof.analyzers.findings import BUSY_LOSS_KINDS, Finding, Thresholds
from gpuprof.analyzers.hardware import GPU_TABLE
from gpuprof.analyzers.model_size import params_from_config
from gpuprof.analyzers.roofline import decode_roofline, token_ratios
from gpuprof.collectors.importers import verl_log
from gpuprof.collectors.importers.steplog import StepRecord, frames_from_steps
from gpuprof.model import Run, RunMeta
from gpuprof.reports.html import render_html
from gpuprof.reports.terminal import diagnosis_renderable, render_text

KINETO = SHARED_FIXTURES / "kineto"
needs_fixtures = pytest.mark.skipif(not KINETO.is_dir(), reason="../shared/fixtures absent")

QWEN_7B = {  # Qwen2.5-7B-Instruct's config.json (the fields the counts read)
    "model_type": "qwen2", "num_hidden_layers": 28, "hidden_size": 3584,
    "intermediate_size": 18944, "num_attention_heads": 28, "num_key_value_heads": 4,
    "vocab_size": 152064, "tie_word_embeddings": False,
}  # fmt: skip


def verl_run(phases: dict[str, float], steps: int = 3, **attrs: float) -> Run:
    """A verl run from step lines alone (no GPU samples): ``phases`` in verl's timer names."""
    records = [
        StepRecord(step=i, phases=list(phases.items()), step_s=sum(phases.values()),
                   attrs={"prompt_length/mean": 100.0, "response_length/mean": 300.0, **attrs})
        for i in range(1, steps + 1)
    ]  # fmt: skip
    frames = frames_from_steps(records, framework="verl", phase_map=verl_log.PHASES)
    run = Run(RunMeta(run_id="t", framework="verl"))
    run.spans, run.events = frames["spans"], frames["events"]
    return run


# --------------------------------------------------------------------------------------------
# Ratios and the roofline, by hand


def test_token_ratios_worked_by_hand():
    walls = pd.DataFrame(
        [("rollout", 1, 40.0), ("ref_logprob", 1, 4.0), ("old_logprob", 1, 5.0),
         ("update_actor", 1, 24.0), ("rollout", 2, 44.0), ("ref_logprob", 2, 4.0),
         ("old_logprob", 2, 5.0), ("update_actor", 2, 24.0)],
        columns=["phase", "step", "wall_s"],
    )  # fmt: skip
    steps = pd.DataFrame({"step": [1, 2], "prompt_mean": [100.0, 100.0],
                          "response_mean": [300.0, 300.0]})  # fmt: skip
    r = token_ratios(walls, steps, {"actor_rollout_ref.actor.ppo_epochs": 2})
    assert r.forward_phase == "ref_logprob"  # the faster forward pass is the yardstick
    assert r.update_per_epoch == pytest.approx(24.0 / 4.0 / 2)  # 2 epochs over the same tokens
    # per generated token over per forward token: (40 / 300) / (4 / 400) = 13.33; step 2: 14.67
    assert r.generation == pytest.approx((40 / 300 / (4 / 400) + 44 / 300 / (4 / 400)) / 2)
    assert r.epochs == 2 and r.steps == 2
    # without the lengths the update ratio stands (same tokens), generation does not
    r = token_ratios(walls, steps.iloc[0:0], {})
    assert r.update_per_epoch == pytest.approx(6.0) and r.generation is None
    # a forward pass of milliseconds is fixed per-call cost, not tokens: not a yardstick
    short = walls.assign(wall_s=walls["wall_s"] / 1000)
    assert token_ratios(short, steps, {}, min_forward_s=0.25) is None
    # no forward pass: nothing to compare with
    assert token_ratios(walls[~walls["phase"].str.endswith("logprob")], steps, {}) is None


def test_decode_roofline_worked_by_hand():
    model = params_from_config(QWEN_7B)
    h100 = GPU_TABLE["H100 SXM"]
    settings = {"actor_rollout_ref.rollout.tensor_model_parallel_size": 1,
                "actor_rollout_ref.rollout.gpu_memory_utilization": 0.5,
                "actor_rollout_ref.rollout.max_num_seqs": 1024,
                "data.train_batch_size": 128, "actor_rollout_ref.rollout.n": 8}  # fmt: skip
    d = decode_roofline(generated_tokens=1024 * 500, wall_s=40.0, gpus=8, gpu=h100, model=model,
                        settings=settings, prompt_mean=200, response_mean=500,
                        response_max=1024)  # fmt: skip
    assert model.kv_bytes_per_token == 2 * 28 * 2 * 4 * 128  # K and V, 28 layers, 4 KV heads
    # 1024 sequences over 8 engines: 128 each, under max_num_seqs and the KV cache
    kv_capacity = (80e9 * 0.5 - model.weight_bytes) / model.kv_bytes_per_token
    assert d.kv_capacity_tokens == pytest.approx(kv_capacity)
    assert kv_capacity / (200 + 1024) > 128
    assert d.concurrency == 128 and d.engines == 8
    per_token = model.weight_bytes / 128 + (200 + 250) * model.kv_bytes_per_token
    assert d.bytes_per_token == pytest.approx(per_token)
    memory_s = 1024 * 500 * per_token / (8 * 3.35e12)
    tail_s = 1024 * model.weight_bytes / 3.35e12  # the longest response's iterations
    assert d.min_s == pytest.approx(max(memory_s, tail_s))
    assert d.bandwidth_util == pytest.approx(1024 * 500 * per_token / (40.0 * 8 * 3.35e12))
    assert d.efficiency == pytest.approx(d.min_s / 40.0)
    assert d.assumptions == ()
    # a small memory share caps the running batch at what the KV cache holds
    small = dict(settings, **{"actor_rollout_ref.rollout.gpu_memory_utilization": 0.2})
    d2 = decode_roofline(generated_tokens=1024 * 500, wall_s=40.0, gpus=8, gpu=h100, model=model,
                         settings=small, prompt_mean=200, response_mean=500,
                         response_max=1024)  # fmt: skip
    assert d2.concurrency_source.startswith("the KV cache")
    assert d2.concurrency == pytest.approx((80e9 * 0.2 - model.weight_bytes) / d.kv_bytes_per_token
                                           / (200 + 1024))  # fmt: skip


# --------------------------------------------------------------------------------------------
# The bound from step lines


def test_a_step_without_a_dominant_phase_says_so_and_finds_nothing():
    run = verl_run({"gen": 30.0, "old_log_prob": 6.0, "ref": 5.0, "update_actor": 17.0,
                    "reward": 2.0, "save_checkpoint": 0.0})  # fmt: skip
    d = api.analyze(run)
    bound = d.summary["bound"]
    assert bound["basis"] == "phase_timing" and bound["bound"] == ["rollout"]
    assert bound["composition"][0]["phase"] == "rollout"
    assert bound["composition"][0]["share"] == pytest.approx(0.5)
    rollout = next(p for p in bound["phases"] if p["phase"] == "rollout")
    # (30 / 300) / (5 / 400) = 8: above the healthy 7.5, below the slow 15
    assert rollout["value"] == pytest.approx(8.0) and rollout["verdict"] == "borderline"
    update = next(p for p in bound["phases"] if p["phase"] == "update_actor")
    assert update["value"] == pytest.approx(17.0 / 5.0) and update["verdict"] == "healthy"
    assert "above the healthy range, not yet slow" in bound["verdict"]
    assert not d.findings

    run = verl_run({"gen": 15.0, "ref": 10.0, "update_actor": 15.0, "reward": 15.0})
    bound = api.analyze(run).summary["bound"]
    assert bound["bound"] == [] and bound["verdict"].startswith("no phase dominates the step")


def test_reward_wait_bounds_the_step_as_a_wait():
    run = verl_run({"gen": 10.0, "ref": 2.0, "update_actor": 6.0, "reward": 42.0})
    d = api.analyze(run)
    bound = d.summary["bound"]
    assert bound["bound"] == ["reward"]
    assert bound["composition"][0]["activity"] == "wait"
    assert "with the GPUs waiting" in bound["verdict"]
    assert {f.kind for f in d.findings} == {"reward_bound"}  # an idle loss, not a busy one


def test_impossible_framework_mfu_is_named_and_not_evidence():
    run = verl_run({"gen": 10.0, "ref": 2.0, "update_actor": 6.0}, **{"perf/mfu/actor": 1.4})
    bound = api.analyze(run).summary["bound"]
    update = next(p for p in bound["phases"] if p["phase"] == "update_actor")
    assert update["figures"]["framework_mfu_status"] == "impossible (above 100%)"
    assert any("impossible" in n for n in bound["notes"])


def test_low_framework_mfu_is_update_bound_without_a_gpu():
    """A verl log with perf/mfu/actor ≈ 0.07 and no GPU named: the framework's own MFU is the
    evidence (it counts the update's compute alone, so a low one is low)."""
    run = verl_run({"gen": 10.0, "ref": 2.0, "update_actor": 6.0}, steps=20,
                   **{"perf/mfu/actor": 0.07})  # fmt: skip
    d = api.analyze(run)
    assert [f.kind for f in d.findings] == ["update_bound"]
    f = d.findings[0]
    assert f.evidence.measure == "framework_mfu"
    assert f.evidence.framework_mfu == pytest.approx(0.07)
    # 20 steps × 6 s of update (GPU count unknown: per GPU) × (1 - 0.07 / 0.30)
    assert f.gpu_seconds_lost == pytest.approx(20 * 6.0 * (1 - 0.07 / 0.30))
    assert "7.0% MFU by verl's own count" in f.summary
    # a framework MFU of 0 means "not computed": no evidence either way
    run = verl_run({"gen": 10.0, "ref": 2.0, "update_actor": 6.0}, **{"perf/mfu/actor": 0.0})
    assert not api.analyze(run).findings


def test_nothing_to_judge_is_said_not_no_stall():
    run = Run(RunMeta(run_id="empty"))
    d = api.analyze(run)
    assert d.summary["bound"]["verdict"] is None and d.summary["bound"]["nothing_to_judge"]
    assert nothing_to_judge(d)
    text = render_text(diagnosis_renderable(d), width=100)
    assert "nothing to judge" in text and "No stall" not in text


# --------------------------------------------------------------------------------------------
# Traces: start-up, exposed communication


def imported(tmp_path: Path, *names: str) -> dict:
    run_dir = tmp_path / "run"
    proc = run_gpuprof("import", *(str(KINETO / n) for n in names), "-o", str(run_dir))
    assert proc.returncode == 0, proc.stderr
    proc = run_gpuprof("analyze", str(run_dir), "--json")
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


@needs_fixtures
def test_healthy_cnn_trace_start_up_is_not_a_stall(tmp_path):
    """HTA's single-GPU CNN trace: ~99% busy in its steady steps; the 95 ms before the first
    ProfilerStep (no kernel yet) and the 100 ms after the last are start-up and wind-down."""
    doc = imported(tmp_path, "hta_ns_resolution_rank-0.pt.trace.json.gz")
    assert doc["findings"] == []
    startup = doc["summary"]["startup"]
    assert 0.09 < startup["seconds"] < 0.1 and startup["wind_down_s"] > 0.09
    assert doc["summary"]["idle_gpu_s_by_cause"]["startup"] == pytest.approx(startup["idle_gpu_s"])


@needs_fixtures
def test_multi_rank_trace_exposed_nccl_is_comm_bound(tmp_path):
    """Two ranks of HTA's DLRM job: NCCL kernels are ~69% of the GPUs' busy time and ~57% run
    with no compute kernel beside them (exposed); communication, not launch overhead."""
    doc = imported(tmp_path, "hta_sampled_rank-0.json.gz", "hta_sampled_rank-1.json.gz")
    assert {f["kind"] for f in doc["findings"]} == {"comm_bound"}
    ev = doc["findings"][0]["evidence"]
    assert ev["source"] == "trace_kernels"
    exposed = (0.336983 + 0.303523) / (0.547656 + 0.580050)
    assert ev["exposed_share_of_busy"] == pytest.approx(exposed, abs=1e-3)
    assert ev["overlapped_comm_gpu_s"] > 0 and ev["comm_share_of_busy"] > exposed
    assert doc["findings"][0]["gpu_seconds_lost"] == pytest.approx(
        0.640506 - 0.1 * (0.547656 + 0.580050), rel=1e-3
    )


# --------------------------------------------------------------------------------------------
# Headlines keep idle and busy apart


def test_report_headline_keeps_busy_losses_out_of_idle_causes():
    run = verl_run({"gen": 10.0, "ref": 2.0, "update_actor": 6.0, "reward": 42.0})
    d = api.analyze(run)
    busy = Finding("memory_headroom", 30.0, 0.1, 0.7, "memory left unused", {})
    d.findings.append(busy)
    page = render_html(run, d)
    idle_line = next(line for line in page.split("<p") if "Where the idle time went" in line)
    busy_line = next(line for line in page.split("<p") if "What slowed the busy time" in line)
    assert "reward_bound" in idle_line and "memory_headroom" not in idle_line
    assert "memory_headroom" in busy_line
    assert "What bounds the step: reward bounds the step" in page
    assert {"rollout_bound", "update_bound", "memory_headroom"} <= BUSY_LOSS_KINDS
    assert Thresholds().gen_forward_ratio_slow > Thresholds().gen_forward_ratio_healthy


# --------------------------------------------------------------------------------------------
# --gpu


@needs_fixtures
def test_gpu_option_names_the_gpu_of_a_log(tmp_path):
    run_dir = tmp_path / "run"
    log = SHARED_FIXTURES / "verl" / "issue_excerpt_gh200_sglang.txt"
    assert run_gpuprof("import", str(log), "-o", str(run_dir)).returncode == 0
    proc = run_gpuprof("analyze", str(run_dir), "--json", "--gpu", "NVIDIA GH200 480GB")
    assert proc.returncode == 0, proc.stderr
    gpu = json.loads(proc.stdout)["summary"]["efficiency"]["gpu"]
    assert gpu["model"] == "GH200" and gpu["peak_flops_per_gpu"] == pytest.approx(989.5e12)
    proc = run_gpuprof("analyze", str(run_dir), "--gpu", "Quantum Abacus 9000")
    assert proc.returncode == 2 and "unknown GPU model" in proc.stderr
    assert "Traceback" not in proc.stderr


ONE_LINE = (
    "(TaskRunner pid=51234) step:7 - response_length/mean:1890.2 - response_length/max:2048.0 - "
    "response_length/clip_ratio:0.897 - prompt_length/mean:180.4 - "
    "timing_s/agent_loop/generate_sequences/min:92.4 - "
    "timing_s/agent_loop/generate_sequences/max:371.9 - "
    "timing_s/agent_loop/generate_sequences/mean:203.1 - "
    "timing_s/agent_loop/slowest/num_preempted:-1 - timing_s/agent_loop/slowest/prompt_length:150"
    " - timing_s/gen:380.2 - timing_s/reward:2.1 - timing_s/old_log_prob:31.0 - timing_s/ref:29.8"
    " - timing_s/adv:0.3 - timing_s/update_actor:96.5 - timing_s/step:540.1\n"
)


def test_one_agent_loop_line_names_the_tail_and_the_cap(tmp_path):
    """One verl step line: per-request generation 92-372 s (4×), nine in ten responses at the
    2048-token cap, a count (num_preempted -1) filed under timing_s/. The line imports (the
    counts are skipped), the tail is named from it, and no shorter cap is suggested: the cap
    is what the responses reach, not a tail to cut."""
    log = tmp_path / "step.log"
    log.write_text(ONE_LINE)
    run_dir = tmp_path / "run"
    assert run_gpuprof("import", str(log), "-o", str(run_dir)).returncode == 0
    doc = json.loads(run_gpuprof("analyze", str(run_dir), "--json").stdout)
    assert {f["kind"] for f in doc["findings"]} == {"generation_tail"}
    ev = doc["findings"][0]["evidence"]
    assert ev["generation_worker_s_min"] == pytest.approx(92.4)
    assert ev["generation_worker_s_max"] == pytest.approx(371.9)
    assert ev["response_clip_ratio"] == pytest.approx(0.897)
    assert "data.max_response_length" not in {r["knob"] for r in doc["recommendations"]}
    bound = doc["summary"]["bound"]
    rollout = next(p for p in bound["phases"] if p["phase"] == "rollout")
    # (380.2 / 1890.2) / (29.8 / 2070.6) = 14.0: above healthy (7.5), below slow (15)
    assert rollout["verdict"] == "borderline"
    assert rollout["value"] == pytest.approx(380.2 / 1890.2 / (29.8 / 2070.6), rel=1e-3)
    assert "above the healthy range, not yet slow" in bound["verdict"]


@needs_fixtures
def test_a_log_that_names_its_gpu_gets_the_data_sheet(tmp_path):
    """A verl log with a line naming the device (as vLLM or nvidia-smi print it): the GPU
    model comes from the log, no --gpu needed."""
    log = tmp_path / "gh200.log"
    text = (SHARED_FIXTURES / "verl" / "issue_excerpt_gh200_sglang.txt").read_text()
    log.write_text("INFO worker: device 0 is NVIDIA GH200 480GB\n" + text)
    run_dir = tmp_path / "run"
    assert run_gpuprof("import", str(log), "-o", str(run_dir)).returncode == 0
    doc = json.loads(run_gpuprof("analyze", str(run_dir), "--json").stdout)
    assert doc["summary"]["efficiency"]["gpu"]["model"] == "GH200"
