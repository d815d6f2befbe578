"""Efficiency figures: the peak-FLOPs table and its product-name matcher, model size from a
config / a name / the user, tokens/s and MFU per phase checked by hand, the cost of idle time,
verl's own logged MFU kept by the importer, and the ``update_bound`` detector (its MFU measure)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from conftest import SHARED_FIXTURES, run_gpuprof

from gpuprof import api, store
from gpuprof.analyzers.efficiency import efficiency_summary
from gpuprof.analyzers.findings import AnalysisContext, Thresholds
from gpuprof.analyzers.hardware import GPU_TABLE, match_gpu
from gpuprof.analyzers.model_size import params_from_config, params_from_name, parse_param_count
from gpuprof.analyzers.settings import EfficiencyOptions, attach_options
from gpuprof.analyzers.stalls.update_bound import detect as detect_update_bound
from gpuprof.collectors.importers import verl_log
from gpuprof.collectors.importers.steplog import StepRecord, frames_from_steps
from gpuprof.model import Run, RunMeta
from gpuprof.reports.html import render_html
from gpuprof.reports.terminal import diagnosis_renderable, efficiency_renderable, render_text

LOW_MFU, REACHABLE_MFU = Thresholds().low_mfu, Thresholds().reachable_mfu
VERL_DIR = SHARED_FIXTURES / "verl"
GH200 = VERL_DIR / "issue_excerpt_gh200_sglang.txt"
needs_fixtures = pytest.mark.skipif(not VERL_DIR.is_dir(), reason="../shared/fixtures absent")

# --------------------------------------------------------------------------------------------
# Peak table


@pytest.mark.parametrize(
    ("name", "model"),
    [
        ("NVIDIA H100 80GB HBM3", "H100 SXM"),
        ("NVIDIA H100 PCIe", "H100 PCIe"),
        ("NVIDIA H100 NVL", "H100 NVL"),
        ("NVIDIA H200", "H200 SXM"),
        ("NVIDIA H200 NVL", "H200 NVL"),
        ("NVIDIA GH200 480GB", "GH200"),
        ("NVIDIA H20", "H20"),
        ("NVIDIA H800", "H800 SXM"),
        ("NVIDIA H800 PCIe", "H800 PCIe"),
        ("NVIDIA A100-SXM4-80GB", "A100 SXM4 80GB"),
        ("NVIDIA A100-SXM4-40GB", "A100 SXM4 40GB"),
        ("NVIDIA A100-PCIE-40GB", "A100 PCIe 40GB"),
        ("NVIDIA A100 80GB PCIe", "A100 PCIe 80GB"),
        ("NVIDIA A100-PG509-200", "A100 SXM4 40GB"),  # Kineto fixture (HGX A100 40 GB board)
        ("NVIDIA A800-SXM4-80GB", "A800 SXM4"),
        ("NVIDIA A800 80GB PCIe", "A800 PCIe"),
        ("NVIDIA A10", "A10"),
        ("NVIDIA A10G", "A10G"),
        ("NVIDIA L4", "L4"),
        ("NVIDIA L40", "L40"),
        ("NVIDIA L40S", "L40S"),
        ("Tesla V100-SXM2-16GB", "V100 SXM2"),
        ("Tesla V100-SXM2-32GB", "V100 SXM2"),
        ("Tesla V100-PCIE-32GB", "V100 PCIe"),
        ("Tesla V100S-PCIE-32GB", "V100S PCIe"),
        ("Tesla T4", "T4"),
        ("NVIDIA GeForce RTX 4090", "RTX 4090"),
        ("NVIDIA GeForce RTX 3090", "RTX 3090"),
        ("NVIDIA RTX A6000", "RTX A6000"),
        ("NVIDIA B200", "B200"),
        ("NVIDIA GB200", "GB200"),
        ("AMD Instinct MI300X", "MI300X"),
        ("AMD Instinct MI250X", "MI250X"),
        ("AMD Instinct MI250", "MI250"),
    ],
)
def test_product_names_match_their_data_sheet_row(name, model):
    row = match_gpu(name)
    assert row is not None and row.model == model


@pytest.mark.parametrize(
    "name",
    [
        None,
        "",
        "NVIDIA GeForce RTX 4090 D",  # a cut-down 4090: fewer SMs
        "NVIDIA GeForce RTX 3090 Ti",
        "NVIDIA RTX 6000 Ada Generation",
        "NVIDIA GeForce RTX 2070",
        "Tesla V100-SXM3-32GB",
        "AMD Instinct MI250X/MI250",  # ROCm's name for either board
        "AMD Radeon Graphics",
        "Some Future Accelerator",
    ],
)
def test_unknown_or_ambiguous_names_have_no_peak(name):
    assert match_gpu(name) is None


def test_peaks_are_dense_data_sheet_figures():
    # NVIDIA prints "1,979 TFLOPS*" (with sparsity) for H100 SXM bf16: dense is half
    assert GPU_TABLE["H100 SXM"].flops("bf16") == pytest.approx(989.5e12)
    assert GPU_TABLE["H100 SXM"].flops("fp8") == pytest.approx(1979e12)
    assert GPU_TABLE["A100 SXM4 80GB"].flops("bf16") == pytest.approx(312e12)
    assert GPU_TABLE["A100 SXM4 80GB"].flops("fp8") is None  # Ampere has no FP8
    assert GPU_TABLE["A100 PCIe 40GB"].flops("tf32") == pytest.approx(156e12)
    # V100 / T4 have no bf16: the training dtype is fp16 mixed precision
    assert GPU_TABLE["V100 SXM2"].flops("bf16") is None
    assert GPU_TABLE["V100 SXM2"].training_dtype() == "fp16"
    assert GPU_TABLE["T4"].flops(GPU_TABLE["T4"].training_dtype()) == pytest.approx(65e12)
    # MI250X: 383 TFLOPS per package of two GCDs, each a device of its own
    assert GPU_TABLE["MI250X"].flops("bf16") == pytest.approx(383e12 / 2)
    for row in GPU_TABLE.values():
        assert row.source and row.training_dtype() is not None
        # tensor bf16 never below fp32 (a swapped column would show here)
        if row.bf16 and row.fp32:
            assert row.bf16 >= row.fp32


@needs_fixtures
@pytest.mark.parametrize(
    ("path", "model"),
    [
        ("nvidia_smi/rtx4090_inference.csv", "RTX 4090"),
        ("dcgm/v100_node_scrape_excerpt.txt", "V100 SXM2"),
        ("kineto/hta_alexnet_benchmark.json.gz", "A100 SXM4 40GB"),
    ],
)
def test_gpu_names_of_imported_real_files_match(tmp_path, path, model):
    run_dir = tmp_path / "run"
    api.import_files([SHARED_FIXTURES / path], run_dir)
    run = store.load_run(run_dir)
    assert run.meta.gpus
    efficiency = api.efficiency(run)
    assert efficiency["gpu"]["model"] == model
    assert efficiency["gpu"]["peak_flops_per_gpu"] == GPU_TABLE[model].flops(
        GPU_TABLE[model].training_dtype()
    )


# --------------------------------------------------------------------------------------------
# Model size

QWEN25_7B = {
    "architectures": ["Qwen2ForCausalLM"],
    "model_type": "qwen2",
    "hidden_size": 3584,
    "intermediate_size": 18944,
    "num_hidden_layers": 28,
    "num_attention_heads": 28,
    "num_key_value_heads": 4,
    "vocab_size": 152064,
    "tie_word_embeddings": False,
}
"""Qwen2.5-7B-Instruct's config.json (the fields the count reads)."""


def test_parameter_count_from_a_config_worked_by_hand():
    size = params_from_config(QWEN25_7B)
    h, inter, layers, vocab = 3584, 18944, 28, 152064
    head_dim = h // 28
    q, kv = 28 * head_dim, 4 * head_dim
    attention = h * (q + 2 * kv) + q * h  # q, k, v and o projections
    mlp = 3 * h * inter  # gate, up, down
    lm_head = vocab * h
    assert attention == 29_360_128 and mlp == 203_685_888
    assert size.flops_params == layers * (attention + mlp) + lm_head == 7_070_285_824
    # with the input embedding: 7.62e9, Qwen's published 7.61B (biases and norms aside)
    assert size.params == pytest.approx(7.615e9, rel=1e-3)
    assert size.layers == 28 and size.attn_dim == 3584
    # without intermediate_size: 12·L·h² + V·h
    rough = params_from_config({"num_hidden_layers": 2, "hidden_size": 64, "vocab_size": 100})
    assert rough.flops_params == 12 * 2 * 64**2 + 100 * 64 and "12·L·h²" in rough.method
    assert params_from_config({"hidden_size": 64}) is None


def test_mixture_of_experts_config_counts_the_active_parameters():
    config = {
        "model_type": "qwen3_moe",
        "hidden_size": 2048,
        "intermediate_size": 6144,
        "moe_intermediate_size": 768,
        "num_hidden_layers": 48,
        "num_attention_heads": 32,
        "num_key_value_heads": 4,
        "head_dim": 128,
        "num_experts": 128,
        "num_experts_per_tok": 8,
        "vocab_size": 151936,
    }
    size = params_from_config(config)
    attention = 2048 * (4096 + 2 * 512) + 4096 * 2048
    expert = 3 * 2048 * 768
    router = 2048 * 128
    assert size.flops_params == 48 * (attention + 8 * expert + router) + 151936 * 2048
    # Qwen3-30B-A3B: 3.3B activated of 30.5B, as published (with the input embedding, which
    # is a lookup and no FLOPs)
    assert size.flops_params + 151936 * 2048 == pytest.approx(3.3e9, rel=0.03)
    assert size.params == pytest.approx(30.5e9, rel=0.02)


@pytest.mark.parametrize(
    ("name", "flops_params", "params"),
    [
        ("Qwen/Qwen2.5-7B-Instruct", 7e9, 7e9),
        ("google/gemma-2-2b-it", 2e9, 2e9),
        ("Qwen/Qwen3-30B-A3B", 3e9, 30e9),
        ("/ckpt/Qwen2.5-1.5B/global_step_58", 1.5e9, 1.5e9),
        ("HuggingFaceTB/SmolLM2-135M", 135e6, 135e6),
        ("meta-llama/Llama-3.1-8B", 8e9, 8e9),
    ],
)
def test_model_sizes_from_names(name, flops_params, params):
    size = params_from_name(name)
    assert size.flops_params == pytest.approx(flops_params)
    assert size.params == pytest.approx(params)
    assert size.source == "model name"


@pytest.mark.parametrize(
    "name", ["sft_model_path/global_step_58", "gpt2", "mistralai/Mixtral-8x7B-v0.1", None]
)
def test_names_without_a_size_give_none(name):
    assert params_from_name(name) is None


def test_user_parameter_counts():
    assert parse_param_count("7e9") == 7e9
    assert parse_param_count("7B") == 7e9
    assert parse_param_count("1.5b") == 1.5e9
    assert parse_param_count("500M") == 500e6
    assert parse_param_count(7e9) == 7e9
    for bad in ("abc", "-1", "0", "7 billion", "", "nan"):
        with pytest.raises(ValueError):
            parse_param_count(bad)


def test_config_json_at_the_model_path_is_read(tmp_path):
    model_dir = tmp_path / "Qwen2.5-7B-Instruct"
    model_dir.mkdir()
    (model_dir / "config.json").write_text(json.dumps(QWEN25_7B))
    run = _run(update_s=10.0, knobs={"actor_rollout_ref.model.path": str(model_dir)})
    efficiency = api.efficiency(run)
    assert efficiency["model"]["source"].startswith("config.json")
    assert efficiency["model"]["flops_params"] == 7_070_285_824
    assert efficiency["model"]["attention_flops"] is True
    # a relative path is read against the run's working directory
    run.meta.knobs["actor_rollout_ref.model.path"] = model_dir.name
    run.meta.cwd = str(tmp_path)
    assert api.efficiency(run)["model"]["flops_params"] == 7_070_285_824
    # the user's count wins over the config
    assert api.efficiency(run, model_params="1B")["model"]["flops_params"] == 1e9
    # a path that is not here: the size in its name
    run.meta.knobs["actor_rollout_ref.model.path"] = "/nowhere/Qwen2.5-3B"
    assert api.efficiency(run)["model"]["source"] == "model name"
    assert api.efficiency(run)["model"]["flops_params"] == 3e9


# --------------------------------------------------------------------------------------------
# Tokens/s and MFU per phase, by hand

STEP = {"gen": 20.0, "old_log_prob": 4.0, "update_actor": 10.0}


def _run(
    update_s: float,
    *,
    gpus: int = 8,
    gpu_name: str | None = "NVIDIA A100-SXM4-80GB",
    knobs: dict | None = None,
    steps: int = 2,
) -> Run:
    """A verl-like run from phase timings: per step rollout 20 s, old log-prob 4 s, update
    ``update_s``; 1 M tokens per step (prompt 200 + response 800 on average)."""
    records = []
    for step in range(1, steps + 1):
        phases = [("gen", 20.0), ("old_log_prob", 4.0), ("update_actor", update_s)]
        records.append(
            StepRecord(
                step=step,
                phases=phases,
                step_s=sum(s for _, s in phases) + 6.0,
                tokens=1_000_000.0,
                attrs={"prompt_length/mean": 200.0, "response_length/mean": 800.0},
            )
        )
    frames = frames_from_steps(records, framework="verl", phase_map=verl_log.PHASES)
    meta = RunMeta(
        run_id="hand",
        framework="verl",
        knobs={"actor_rollout_ref.actor.ppo_epochs": 2, **(knobs or {})},
        gpus=[{"host": "h", "index": i, "name": gpu_name} for i in range(gpus)] if gpu_name else [],
    )
    run = Run(meta)
    run.spans, run.events = frames["spans"], frames["events"]
    return run


def _phase(efficiency: dict, name: str) -> dict:
    return next(p for p in efficiency["phases"] if p["phase"] == name)


def test_tokens_per_second_and_mfu_per_phase_worked_by_hand():
    run = _run(update_s=10.0)
    efficiency = api.efficiency(run, model_params="1e9")
    peak, n, gpus = 312e12, 1e9, 8
    # rollout: generated = 1 M × 800 / (200 + 800) per step, 2 steps over 2 × 20 s
    rollout = _phase(efficiency, "rollout")
    assert rollout["tokens"] == pytest.approx(1_600_000)
    assert rollout["tokens_per_s"] == pytest.approx(1_600_000 / 40)
    assert rollout["tokens_per_s_per_gpu"] == pytest.approx(1_600_000 / 40 / gpus)
    assert rollout["flops_per_token"] == pytest.approx(2 * n)
    assert rollout["mfu"] == pytest.approx(40_000 * 2 * n / (peak * gpus))  # 3.2%
    # old log-prob: a forward over prompt + response
    old = _phase(efficiency, "old_logprob")
    assert old["tokens_per_s"] == pytest.approx(2_000_000 / 8)
    assert old["mfu"] == pytest.approx(250_000 * 2 * n / (peak * gpus))
    # update: prompt + response × ppo_epochs=2, forward + backward
    update = _phase(efficiency, "update_actor")
    assert update["tokens"] == pytest.approx(4_000_000)
    assert update["tokens_per_s"] == pytest.approx(4_000_000 / 20)
    assert update["flops_per_token"] == pytest.approx(6 * n)
    assert update["mfu"] == pytest.approx(200_000 * 6 * n / (peak * gpus))  # 48%
    # whole run: every phase's model FLOPs over peak × GPU-seconds of the steps
    flops = 1_600_000 * 2 * n + 2_000_000 * 2 * n + 4_000_000 * 6 * n
    wall = 2 * (20 + 4 + 10 + 6)
    assert efficiency["run"]["achieved_flops"] == pytest.approx(flops)
    assert efficiency["run"]["mfu"] == pytest.approx(flops / (peak * gpus * wall))
    assert efficiency["run"]["tokens_per_s"] == pytest.approx(2_000_000 / wall)
    assert efficiency["gpu"]["model"] == "A100 SXM4 80GB"
    json.dumps(efficiency)  # JSON-able as it is


def test_attention_flops_are_added_with_the_model_shape():
    run = _run(update_s=10.0)
    ctx = attach_options(AnalysisContext(run), EfficiencyOptions(model_config=QWEN25_7B))
    efficiency = efficiency_summary(ctx)
    n, layers, attn = 7_070_285_824, 28, 3584
    rollout = _phase(efficiency, "rollout")
    # a decoded token attends to the prompt and half the response on average
    assert rollout["flops_per_token"] == pytest.approx(2 * n + 4 * layers * attn * (200 + 400))
    update = _phase(efficiency, "update_actor")
    assert update["flops_per_token"] == pytest.approx(6 * n + 3 * 4 * layers * attn * 1000 / 2)
    assert not any("attention" in note for note in efficiency["notes"])


def test_imported_verl_log_gives_tokens_per_second_per_phase(tmp_path):
    """A verl console log with its launch command, imported through the CLI: tokens/s per
    phase match a computation from the log's own figures."""
    launch = (
        "+ python3 -m verl.trainer.main_ppo data.train_batch_size=64 "
        "actor_rollout_ref.rollout.n=4 actor_rollout_ref.model.path=Qwen/Qwen2.5-0.5B-Instruct "
        "trainer.n_gpus_per_node=2 trainer.nnodes=1"
    )
    steps = [
        # (gen s, ref s, update s, step s, prompt mean, response mean)
        (30.0, 3.0, 12.0, 47.0, 120.0, 380.0),
        (34.0, 3.5, 13.0, 52.0, 110.0, 420.0),
        (28.0, 2.5, 11.0, 43.0, 130.0, 350.0),
    ]
    lines = [launch]
    for i, (gen, ref, upd, total, prompt, response) in enumerate(steps, 1):
        lines.append(
            f"(TaskRunner pid=77) step:{i} - actor/pg_loss:-0.01 - perf/mfu/actor:0.21 - "
            f"perf/throughput:{500 + i}.0 - response_length/mean:{response} - "
            f"prompt_length/mean:{prompt} - timing_s/gen:{gen} - timing_s/ref:{ref} - "
            f"timing_s/update_actor:{upd} - timing_s/step:{total}"
        )
    log = tmp_path / "verl.log"
    log.write_text("\n".join(lines) + "\n")
    run_dir = tmp_path / "run"
    result = run_gpuprof("import", str(log), "-o", str(run_dir))
    assert result.returncode == 0, result.stderr
    run = store.load_run(run_dir)
    efficiency = api.efficiency(run)

    responses = 64 * 4
    generated = sum(responses * s[5] for s in steps)
    batch = sum(responses * (s[4] + s[5]) for s in steps)
    rollout = _phase(efficiency, "rollout")
    assert rollout["tokens_per_s"] == pytest.approx(generated / sum(s[0] for s in steps))
    assert rollout["tokens_per_s_per_gpu"] == pytest.approx(rollout["tokens_per_s"] / 2)
    ref = _phase(efficiency, "ref_logprob")
    assert ref["tokens_per_s"] == pytest.approx(batch / sum(s[1] for s in steps))
    update = _phase(efficiency, "update_actor")
    assert update["tokens_per_s"] == pytest.approx(batch / sum(s[2] for s in steps))
    assert efficiency["run"]["tokens_per_s"] == pytest.approx(batch / sum(s[3] for s in steps))
    # the model's size from its name; no GPU named: MFU not available, said why
    assert efficiency["model"]["flops_params"] == 0.5e9
    assert update["flops_per_token"] == pytest.approx(6 * 0.5e9)
    assert update["mfu"] is None
    assert any("MFU not available" in note for note in efficiency["notes"])
    # verl's own figures are kept beside gpuprof's
    assert update["framework_mfu"][0]["key"] == "perf/mfu/actor"
    assert update["framework_mfu"][0]["mean"] == pytest.approx(0.21)
    assert efficiency["framework"]["metrics"]["perf/throughput"]["mean"] == pytest.approx(502)


@needs_fixtures
def test_gh200_fixture_keeps_verls_logged_mfu(tmp_path):
    run_dir = tmp_path / "run"
    result = run_gpuprof("import", str(GH200), "-o", str(run_dir))
    assert result.returncode == 0, result.stderr
    run = store.load_run(run_dir)
    step = run.spans[run.spans["phase"] == "step"]["attrs"].iloc[0]
    assert step["perf/mfu/actor"] == pytest.approx(1.018)
    assert step["perf/max_memory_allocated_gb"] == pytest.approx(25.921)
    assert step["perf/max_memory_reserved_gb"] == pytest.approx(61.611)

    analyzed = run_gpuprof("analyze", str(run_dir), "--json", "--model-params", "7B")
    assert analyzed.returncode == 0, analyzed.stderr
    efficiency = json.loads(analyzed.stdout)["summary"]["efficiency"]
    logged = efficiency["framework"]["metrics"]["perf/mfu/actor"]
    assert logged["mean"] == pytest.approx(1.018) and logged["steps"] == 1
    update = _phase(efficiency, "update_actor")
    assert update["framework_mfu"][0]["mean"] == pytest.approx(1.018)
    # above 1: verl's peak table was wrong for this GPU, and the output says so
    assert any("GH200" in w for w in efficiency["framework"]["warnings"])
    text = run_gpuprof("analyze", str(run_dir))
    assert text.returncode == 0, text.stderr
    assert "102% (actor)" in text.stdout and "verl logged" in text.stdout


# --------------------------------------------------------------------------------------------
# Cost of idle time


def _sim_run():
    from gpuprof.sim import Pathology, SimConfig, simulate

    return simulate(SimConfig(gpus=4, steps=4, pathologies=[Pathology("reward_bound", 0.7)])).run


def test_idle_cost_is_idle_gpu_hours_times_the_price(tmp_path):
    run = _sim_run()
    diagnosis = api.analyze(run, gpu_hour_price=2.75)
    summary = diagnosis.summary
    cost = summary["efficiency"]["cost"]
    assert summary["idle_gpu_s"] > 0
    assert cost["idle_gpu_hours"] == pytest.approx(summary["idle_gpu_s"] / 3600)
    assert cost["idle_cost"] == pytest.approx(summary["idle_gpu_s"] / 3600 * 2.75)
    assert cost["run_cost"] == pytest.approx(summary["gpu_hours"] * 2.75)
    assert [f["kind"] for f in cost["findings"]] == [f.kind for f in diagnosis.findings]
    for priced, finding in zip(cost["findings"], diagnosis.findings):
        assert priced["cost"] == pytest.approx(finding.gpu_seconds_lost / 3600 * 2.75)
    # without a price: the hours, no money
    unpriced = api.analyze(run).summary["efficiency"]["cost"]
    assert unpriced["idle_gpu_hours"] == pytest.approx(cost["idle_gpu_hours"])
    assert unpriced["idle_cost"] is None and unpriced["findings"][0]["cost"] is None

    # through the CLI: JSON, the terminal, the summary and the report
    run_dir = tmp_path / "run"
    store.save_run(run, run_dir)
    result = run_gpuprof("analyze", str(run_dir), "--json", "--gpu-hour-price", "2.75")
    assert result.returncode == 0, result.stderr
    doc = json.loads(result.stdout)
    idle_s = doc["summary"]["idle_gpu_s"]
    assert doc["summary"]["efficiency"]["cost"]["idle_cost"] == pytest.approx(idle_s / 3600 * 2.75)
    text = run_gpuprof("analyze", str(run_dir), "--gpu-hour-price", "2.75").stdout
    assert f"idle {idle_s / 3600:.2f} GPU-h = {idle_s / 3600 * 2.75:,.2f}" in text
    summary_text = run_gpuprof("summary", str(run_dir), "--gpu-hour-price", "2.75").stdout
    assert "at 2.75 per GPU-hour" in summary_text
    report = run_gpuprof("report", str(run_dir), "--gpu-hour-price", "2.75")
    assert report.returncode == 0, report.stderr
    page = (run_dir / "report.html").read_text()
    assert "cost of idle time" in page and f"{idle_s / 3600 * 2.75:,.2f}" in page
    assert "<h2>Efficiency</h2>" in page


@pytest.mark.parametrize(
    "args", [["--gpu-hour-price", "-1"], ["--model-params", "seven"], ["--model-params", "0"]]
)
def test_bad_efficiency_options_are_exit_2(tmp_path, args):
    run_dir = tmp_path / "run"
    store.save_run(_run(update_s=10.0), run_dir)
    result = run_gpuprof("analyze", str(run_dir), *args)
    assert result.returncode == 2
    assert "Traceback" not in result.stderr


# --------------------------------------------------------------------------------------------
# update_bound by MFU


def _update_bound_ctx(update_s: float, knobs: dict | None = None) -> AnalysisContext:
    run = _run(update_s=update_s, knobs=knobs)
    return attach_options(AnalysisContext(run), EfficiencyOptions(model_params=1e9))


def test_update_bound_mfu_fires_on_a_slow_update_with_its_causes_and_the_gain():
    knobs = {
        "actor_rollout_ref.actor.fsdp_config.param_offload": True,
        "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu": 1,
        "actor_rollout_ref.actor.use_dynamic_bsz": False,
    }
    ctx = _update_bound_ctx(update_s=150.0, knobs=knobs)
    finding = detect_update_bound(ctx, Thresholds())
    assert finding is not None and finding.kind == "update_bound"
    peak, gpus = 312e12, 8
    mfu = 4_000_000 * 6e9 / (2 * 150.0) / (peak * gpus)
    assert mfu < LOW_MFU
    ev = finding.evidence
    assert ev["mfu"] == pytest.approx(mfu, rel=1e-4)
    update_gpu_s = 2 * 150.0 * gpus
    assert ev["update_gpu_s"] == pytest.approx(update_gpu_s)
    assert finding.gpu_seconds_lost == pytest.approx(update_gpu_s * (1 - mfu / REACHABLE_MFU))
    total_gpu_s = 2 * (20 + 4 + 150 + 6) * gpus
    assert finding.share == pytest.approx(finding.gpu_seconds_lost / total_gpu_s)
    knobs_found = {c["knob"] for c in ev["causes"]}
    assert knobs_found == set(knobs)
    assert "param_offload=True" in finding.summary
    assert 0 < finding.confidence <= 1
    assert ev.to_dict()["phases"] == ["update_actor"]
    json.dumps(finding.to_dict())


def test_update_bound_mfu_is_silent_on_a_fast_update_and_without_a_peak():
    ctx = _update_bound_ctx(update_s=10.0)  # 48% MFU
    assert _phase(efficiency_summary(ctx), "update_actor")["mfu"] > REACHABLE_MFU
    assert detect_update_bound(ctx, Thresholds()) is None
    # a slow update on a GPU without a known peak, or without the model's size: no MFU, so
    # the finding rests on the update's time against the forward pass of the same steps
    # (150 s over 2 PPO epochs against 4 s: 18.75× per epoch), hedged
    run = _run(update_s=150.0, gpu_name="Some Future Accelerator")
    for ctx in (
        attach_options(AnalysisContext(run), EfficiencyOptions(model_params=1e9)),
        attach_options(AnalysisContext(_run(update_s=150.0)), EfficiencyOptions()),
    ):
        finding = detect_update_bound(ctx, Thresholds())
        assert finding is not None and finding.evidence.measure == "forward_ratio"
        assert finding.evidence.mfu is None
        assert finding.evidence.forward_ratio == pytest.approx(150.0 / 4.0 / 2, rel=1e-3)
        assert finding.confidence < 0.6


def test_update_bound_mfu_defers_to_a_high_logged_mfu():
    run = _run(update_s=150.0)
    steps = run.spans["phase"] == "step"
    run.spans.loc[steps, "attrs"] = [
        {**a, "perf/mfu/actor": 0.42} for a in run.spans.loc[steps, "attrs"]
    ]
    ctx = attach_options(AnalysisContext(run), EfficiencyOptions(model_params=1e9))
    assert detect_update_bound(ctx, Thresholds()) is None


# --------------------------------------------------------------------------------------------
# Unknown GPU, rendering


def test_unknown_gpu_reads_not_available_and_renders():
    name = "<img src=x onerror=alert(1)> Future GPU"
    run = _run(update_s=10.0, gpu_name=name)
    diagnosis = api.analyze(run, model_params="1B", gpu_hour_price=1.0)
    efficiency = diagnosis.summary["efficiency"]
    assert efficiency["gpu"]["model"] is None and efficiency["gpu"]["peak_flops_per_gpu"] is None
    assert all(p["mfu"] is None for p in efficiency["phases"])
    assert efficiency["run"]["mfu"] is None
    assert any("not available" in note and "Future GPU" in note for note in efficiency["notes"])
    # tokens/s do not need the peak
    assert _phase(efficiency, "update_actor")["tokens_per_s"] == pytest.approx(200_000)
    text = render_text(diagnosis_renderable(diagnosis), width=80)
    assert "n/a" in text and "200k" in text
    page = render_html(run, diagnosis)
    assert "<img src=x" not in page and "&lt;img src=x onerror=alert(1)&gt;" in page


@pytest.mark.parametrize("width", [80, 60, 48])
def test_efficiency_lines_fit_the_terminal(width):
    from rich.cells import cell_len

    run = _run(update_s=10.0)
    run.spans.loc[run.spans["phase"] == "step", "attrs"] = [
        {**a, "perf/mfu/actor": 0.35, "perf/throughput": 1234.0}
        for a in run.spans.loc[run.spans["phase"] == "step", "attrs"]
    ]
    figures = api.efficiency(run, model_params="1B", gpu_hour_price=2.0)
    text = render_text(efficiency_renderable(figures), width=width)
    assert all(cell_len(line) <= width for line in text.splitlines())
    for phase in ("rollout", "old_logprob", "update_actor"):
        assert phase in text
    assert "48%" in text and "35%" in text  # gpuprof's update MFU beside verl's logged one


def test_a_run_without_steps_or_spans_has_no_efficiency_figures_and_no_error():
    run = Run(RunMeta(run_id="empty"))
    efficiency = api.efficiency(run, model_params="7B", gpu_hour_price=3.0)
    assert efficiency["phases"] == []
    assert efficiency["run"]["mfu"] is None
    assert render_text(efficiency_renderable(efficiency)).strip() == ""


def test_gpu_samples_set_the_gpus_of_a_phase():
    """With GPU samples, a phase's MFU divides by the GPUs that ran it (here 2 of 4)."""
    run = _run(update_s=10.0, gpus=4, gpu_name="NVIDIA H100 80GB HBM3")
    spans = run.spans
    t0, t1 = int(spans["start_ns"].min()), int(spans["end_ns"].max())
    times = np.arange(t0, t1, 500_000_000, dtype=np.int64)
    host = spans["host"].iloc[0]
    columns = {"util_gpu_pct": 90.0, "mem_used_bytes": 2**34, "mem_total_bytes": 2**36}
    rows = [
        pd.DataFrame({"host": host, "gpu": gpu, "uuid": f"GPU-{gpu}", "t_ns": times, **columns})
        for gpu in range(2)
    ]
    samples = pd.concat(rows, ignore_index=True)
    run.gpu = pd.concat([run.gpu.iloc[0:0], samples], ignore_index=True).astype(run.gpu.dtypes)
    efficiency = api.efficiency(run, model_params="1e9")
    update = _phase(efficiency, "update_actor")
    assert update["gpus"] == 2
    assert update["mfu"] == pytest.approx(200_000 * 6e9 / (989.5e12 * 2))
    assert efficiency["run"]["gpu_s_source"] == "GPU samples"
    assert math.isfinite(efficiency["run"]["mfu"])


def test_docs_name_every_efficiency_key():
    doc = (Path(__file__).resolve().parent.parent / "docs" / "ANALYZE_JSON.md").read_text()
    efficiency = api.efficiency(_run(update_s=10.0), model_params="1B", gpu_hour_price=1.0)
    keys = set(efficiency) | set(efficiency["run"]) | set(efficiency["cost"])
    keys |= set(efficiency["phases"][0]) | set(efficiency["gpu"]) | set(efficiency["model"])
    missing = sorted(k for k in keys if f"`{k}`" not in doc)
    assert not missing, missing
