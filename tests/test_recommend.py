"""The knob catalogue and the recommender: parsing, rules, ranking, versions, fallback, sim runs."""

from __future__ import annotations

import dataclasses

import pytest

from gpuprof.analyzers.evidence import (
    GenerationTailEvidence,
    MemoryHeadroomEvidence,
    PeriodicStallEvidence,
)
from gpuprof.analyzers.findings import STALL_KINDS, Finding
from gpuprof.analyzers.knobs import (
    CATALOGUE,
    FRAMEWORKS,
    NOT_THE_CAUSE,
    SUGGEST_RULES,
    KnobEntry,
    entries,
)
from gpuprof.analyzers.recommend import (
    Recommendation,
    coerce,
    detect_framework,
    parse_knobs,
    recommend,
    version_in,
    version_tuple,
)
from gpuprof.model import RunMeta
from gpuprof.sim import Pathology, SimConfig, simulate

VERL_CMD = [
    "python3",
    "-m",
    "verl.trainer.main_ppo",
    "algorithm.adv_estimator=grpo",
    "actor_rollout_ref.rollout.gpu_memory_utilization=0.4",
    "+actor_rollout_ref.rollout.checkpoint_engine.update_weights_bucket_megabytes=256",
    "++data.dataloader_num_workers=2",
    "actor_rollout_ref.actor.fsdp_config.param_offload=True",
    "actor_rollout_ref.actor.use_dynamic_bsz=False",
    "trainer.save_freq=10",
    "trainer.logger=['console','wandb']",
    "~trainer.test_freq",
]
TRL_CMD = [
    "accelerate",
    "launch",
    "--config_file",
    "recipes/accelerate_configs/zero3.yaml",
    "src/open_r1/grpo.py",
    "--use_vllm",
    "--vllm_mode=server",
    "--vllm_gpu_memory_utilization",
    "0.25",
    "--max_completion_length=8192",
    "--dataloader_num_workers",
    "0",
    "--save_steps",
    "100",
]
SWIFT_CMD = [
    "swift",
    "rlhf",
    "--rlhf_type",
    "grpo",
    "--use_vllm",
    "true",
    "--vllm_gpu_memory_utilization",
    "0.5",
    "--offload_model",
    "true",
    "--offload_optimizer=true",
    "--move_model_batches",
    "16",
    "--async_generate",
    "false",
]
OPENRLHF_OLD_CMD = [
    "python3",
    "-m",
    "openrlhf.cli.train_ppo_ray",
    "--vllm_num_engines",
    "4",
    "--vllm_gpu_memory_utilization",
    "0.5",
    "--colocate_all_models",
    "--adam_offload",
    "--packing_samples",
    "--save_steps",
    "-1",
]
OPENRLHF_NEW_CMD = [
    "python3",
    "-m",
    "openrlhf.cli.train_ppo_ray",
    "--vllm.num_engines",
    "4",
    "--vllm.gpu_memory_utilization",
    "0.6",
    "--train.colocate_all",
    "--ds.adam_offload",
]


def finding(kind: str, lost: float = 100.0, share: float = 0.2, conf: float = 0.8, **ev):
    return Finding(kind, lost, share, conf, f"{kind} stall", dict(ev))


def meta(command: list[str], framework: str | None = None, **knobs) -> RunMeta:
    return RunMeta(run_id="t", command=command, framework=framework, knobs=dict(knobs))


def by_knob(recs: list[Recommendation]) -> dict[str, Recommendation]:
    return {r.knob: r for r in recs}


# ------------------------------------------------------------------------------ parsing


def test_parse_hydra_overrides_with_prefixes_and_deletions():
    knobs = parse_knobs(VERL_CMD)
    assert knobs["actor_rollout_ref.rollout.gpu_memory_utilization"] == "0.4"
    key = "actor_rollout_ref.rollout.checkpoint_engine.update_weights_bucket_megabytes"
    assert knobs[key] == "256"  # "+" stripped
    assert knobs["data.dataloader_num_workers"] == "2"  # "++" stripped
    assert knobs["trainer.logger"] == "['console','wandb']"
    assert "trainer.test_freq" not in knobs  # "~" deletes, it sets nothing
    assert "m" not in knobs and "verl.trainer.main_ppo" not in knobs


def test_parse_flags_value_equals_and_switches():
    knobs = parse_knobs(TRL_CMD)
    assert knobs["use_vllm"] == "true"  # bare switch followed by another flag
    assert knobs["vllm_mode"] == "server"
    assert knobs["vllm_gpu_memory_utilization"] == "0.25"
    assert knobs["max_completion_length"] == "8192"
    assert knobs["config_file"] == "recipes/accelerate_configs/zero3.yaml"
    old = parse_knobs(OPENRLHF_OLD_CMD)
    assert old["colocate_all_models"] == "true" and old["adam_offload"] == "true"
    assert old["save_steps"] == "-1"  # a negative number is a value, not a flag
    new = parse_knobs(OPENRLHF_NEW_CMD)
    assert new["train.colocate_all"] == "true" and new["ds.adam_offload"] == "true"


def test_parse_shell_string_and_quotes():
    knobs = parse_knobs(["bash", "-c", "python -m verl.trainer.main_ppo data.x='a b' --flag=\"v\""])
    assert knobs["data.x"] == "a b" and knobs["flag"] == "v"


def test_coerce():
    assert coerce("True") is True and coerce("false") is False
    assert coerce("8") == 8 and coerce("0.3") == 0.3 and coerce("null") is None
    assert coerce("colocate") == "colocate" and coerce(5) == 5


@pytest.mark.parametrize(
    ("command", "framework"),
    [
        (VERL_CMD, "verl"),
        (TRL_CMD, "trl"),
        (["trl", "grpo", "--model_name_or_path", "x"], "trl"),
        (["python", "train.py", "--trainer", "GRPOTrainer"], "trl"),
        (SWIFT_CMD, "swift"),
        (["/usr/bin/swift", "rlhf", "--rlhf_type", "grpo"], "swift"),
        (OPENRLHF_OLD_CMD, "openrlhf"),
        (["torchrun", "--nproc_per_node=8", "train.py"], "pytorch"),
        ([], "pytorch"),
    ],
)
def test_detect_framework_from_command(command, framework):
    assert detect_framework(meta(command)) == framework


def test_detect_framework_prefers_meta_and_aliases():
    assert detect_framework(meta(VERL_CMD, framework="trl")) == "trl"
    assert detect_framework(meta([], framework="open-r1")) == "trl"
    assert detect_framework(meta([], framework="ms-swift")) == "swift"
    assert detect_framework(meta(VERL_CMD, framework="something-else")) == "verl"


# ------------------------------------------------------------------------------ catalogue


def test_catalogue_rows_are_well_formed():
    assert isinstance(CATALOGUE, tuple) and len(CATALOGUE) > 80
    for e in CATALOGUE:
        assert isinstance(e, KnobEntry)
        assert dataclasses.is_dataclass(e) and e.__dataclass_params__.frozen
        assert e.framework in FRAMEWORKS and e.kind in STALL_KINDS
        assert e.rule in SUGGEST_RULES
        assert 0.0 < e.gain <= 1.0
        assert not e.knob.startswith("-")
        e.rationale.format(knob="k", current="1", suggested="2", lost_gpu_s="3")
        if e.versions:
            assert version_in((1,), e.versions) in (True, False)


def test_every_kind_covered_for_every_framework():
    pytorch_kinds = {e.kind for e in entries("pytorch")}
    assert pytorch_kinds == set(STALL_KINDS)  # the fallback covers everything
    for fw in FRAMEWORKS:
        for kind in STALL_KINDS:
            direct = entries(fw, kind)
            assert direct or entries("pytorch", kind), (fw, kind)
            # a periodic stall always carries its period (every-N settings need one)
            ev = {"every_n_steps": 10} if kind == "periodic_stall" else {}
            recs = recommend([finding(kind, **ev)], meta([], framework=fw))
            assert recs, (fw, kind)
            assert all(r.kind == kind for r in recs)
            assert all(r.fallback == (not direct) for r in recs), (fw, kind)


def test_design_examples_are_in_the_catalogue():
    names = {(e.framework, e.knob) for e in CATALOGUE}
    ar = "actor_rollout_ref"
    for knob in (
        f"{ar}.rollout.gpu_memory_utilization",
        f"{ar}.actor.use_dynamic_bsz",
        f"{ar}.actor.ppo_max_token_len_per_gpu",
        f"{ar}.rollout.max_num_batched_tokens",
        f"{ar}.actor.fsdp_config.param_offload",
        f"{ar}.actor.fsdp_config.optimizer_offload",
        f"{ar}.rollout.checkpoint_engine.update_weights_bucket_megabytes",
        "data.dataloader_num_workers",
        "trainer.save_freq",
        "trainer.test_freq",
        "reward_model.reward_manager",
    ):
        assert ("verl", knob) in names, knob
    for knob in (
        "vllm_mode",
        "vllm_gpu_memory_utilization",
        "steps_per_generation",
        "max_completion_length",
        "vllm_enable_sleep_mode",
        "ds3_gather_for_generation",
        "dataloader_num_workers",
        "save_steps",
        "eval_steps",
    ):
        assert ("trl", knob) in names, knob
    for knob in (
        "vllm_gpu_memory_utilization",
        "sleep_level",
        "offload_model",
        "offload_optimizer",
        "move_model_batches",
        "async_generate",
        "dataloader_num_workers",
    ):
        assert ("swift", knob) in names, knob
    for knob in (
        "train.colocate_all",
        "colocate_all_models",
        "vllm.gpu_memory_utilization",
        "vllm_gpu_memory_utilization",
        "train.dynamic_batch_enable",
        "ds.packing_samples",
        "packing_samples",
        "train.async_enable",
        "async_train",
    ):
        assert ("openrlhf", knob) in names, knob
    for knob in ("num_workers", "pin_memory", "torch.compile.mode"):
        assert ("pytorch", knob) in names, knob


def test_version_helpers():
    assert version_tuple("v0.10.2.post1") == (0, 10, 2)
    assert version_tuple("0.4.0") == (0, 4) == version_tuple("0.4")
    assert version_tuple("3.5.0rc1") == (3, 5)
    assert version_tuple("main") is None
    assert version_in((0, 10, 1), ">=0.6,<0.10.2")
    assert not version_in((0, 10, 2), ">=0.6,<0.10.2")
    assert version_in((0, 7), "<=0.7.0") and not version_in((0, 7), ">0.7.0")
    assert version_in((0, 7, 1), ">0.7.0")


# ------------------------------------------------------------------------------ rules


def test_rule_values():
    mf = SUGGEST_RULES["memory_fraction"]
    assert mf(0.3, 0.9, MemoryHeadroomEvidence(mem_peak_frac=0.5), {}) == 0.7  # 0.3 + 0.5 × 0.8
    assert mf(0.3, 0.9, MemoryHeadroomEvidence(mem_peak_frac=0.1), {}) == 0.9  # capped
    assert mf(0.3, 0.9, MemoryHeadroomEvidence(mem_peak_frac=0.35), {}) == 0.82
    assert mf(0.3, 0.9, {}, {}) == 0.78  # headroom = what is left below 0.9
    assert mf(0.95, 0.9, {}, {}) == 0.95  # never lowered
    assert SUGGEST_RULES["workers"](0, 4, {}, {}) == 4
    assert SUGGEST_RULES["workers"](1, 4, {}, {}) == 4
    assert SUGGEST_RULES["workers"](6, 4, {}, {}) == 12
    assert SUGGEST_RULES["multiply"](512, 4, {}, {}) == 2048
    assert SUGGEST_RULES["multiply"](None, 4, {}, {}) is None
    assert SUGGEST_RULES["divide"](16, 4, {}, {}) == 4
    assert SUGGEST_RULES["divide"](2, 4, {}, {}) == 1
    assert SUGGEST_RULES["less_often"](5, 4, {}, {}) == 20
    assert SUGGEST_RULES["less_often"](-1, 4, {}, {}) is None  # already never
    cap = SUGGEST_RULES["cap_length"]
    tail = GenerationTailEvidence(response_length_mean_tokens=700)
    assert cap(16384, 4, tail, {}) == 4096
    assert cap(2048, 4, tail, {}) == 2048
    assert cap(8192, 4, {}, {}) == 4096
    # nine in ten responses cut at the cap: the cap is what they reach, not a tail to cut
    capped = GenerationTailEvidence(response_length_mean_tokens=1890, response_clip_ratio=0.9)
    assert cap(2048, 4, capped, {}) is NOT_THE_CAUSE


def test_explicit_never_is_not_changed():
    cmd = [*VERL_CMD, "trainer.test_freq=-1"]
    recs = by_knob(recommend([finding("periodic_stall")], meta(cmd)))
    assert "trainer.test_freq" not in recs and recs["trainer.save_freq"].suggested == 40
    assert SUGGEST_RULES["gpus_per_host"](-1, 8, {}, {"gpus_per_host": 4}) == 4
    assert SUGGEST_RULES["set"](True, False, {}, {}) is False


def test_suggestions_follow_rules_on_verl_command():
    findings = [
        finding("memory_headroom", headroom_frac=0.5),
        finding("dataloader_starvation"),
        finding("reshard_idle"),
        finding("offload_thrash"),
        finding("periodic_stall"),
    ]
    recs = by_knob(recommend(findings, meta(VERL_CMD)))
    ar = "actor_rollout_ref"
    gmu = recs[f"{ar}.rollout.gpu_memory_utilization"]
    assert gmu.current == 0.4 and gmu.suggested == 0.8 and gmu.framework == "verl"
    assert recs["data.dataloader_num_workers"].current == 2
    assert recs["data.dataloader_num_workers"].suggested == 4
    bucket = recs[f"{ar}.rollout.checkpoint_engine.update_weights_bucket_megabytes"]
    assert (bucket.current, bucket.suggested) == (256, 1024)
    offload = recs[f"{ar}.actor.fsdp_config.param_offload"]
    assert (offload.current, offload.suggested) == (True, False)
    # optimizer_offload is not on the command line: unknown, suggested from the default
    opt = recs[f"{ar}.actor.fsdp_config.optimizer_offload"]
    assert opt.current is None and opt.suggested is False and opt.default is False
    assert (recs["trainer.save_freq"].current, recs["trainer.save_freq"].suggested) == (10, 40)
    # test_freq is not on the command line, defaults to -1 and the finding shows no period:
    # no value to suggest, and no sentence to make of it
    assert "trainer.test_freq" not in recs
    # ... with the period the run shows (a config file set it): that is the current value
    seen = finding("periodic_stall", every_n_steps=10, phases=["eval"])
    recs = by_knob(recommend([seen], meta([], framework="verl")))
    test = recs["trainer.test_freq"]
    assert (test.current, test.suggested) == ("10 (observed period)", 40)
    assert "10 (observed period)" in test.rationale and "every every" not in test.rationale
    assert "trainer.save_freq" not in recs  # validations, not checkpoints
    assert SUGGEST_RULES["less_often"](None, 4, PeriodicStallEvidence(every_n_steps=5), {}) == 20
    assert SUGGEST_RULES["less_often"](-1, 4, PeriodicStallEvidence(every_n_steps=5), {}) is None
    # gains: share × factor, GPU-seconds × factor
    assert gmu.expected_gain_share == pytest.approx(0.2 * 0.6)
    assert gmu.expected_gain_gpu_s == pytest.approx(100.0 * 0.6)
    assert "0.4" in gmu.rationale and "0.8" in gmu.rationale


def test_knob_already_at_suggestion_is_skipped():
    cmd = [*VERL_CMD, "actor_rollout_ref.actor.fsdp_config.param_offload=False"]
    recs = by_knob(recommend([finding("offload_thrash")], meta(cmd)))
    assert "actor_rollout_ref.actor.fsdp_config.param_offload" not in recs


def test_meta_knobs_override_command():
    m = meta(VERL_CMD, **{"actor_rollout_ref.rollout.gpu_memory_utilization": 0.5})
    rec = by_knob(recommend([finding("memory_headroom")], m))
    assert rec["actor_rollout_ref.rollout.gpu_memory_utilization"].current == 0.5


def test_trl_swift_openrlhf_current_values():
    trl = by_knob(
        recommend(
            [finding("memory_headroom"), finding("pipeline_bubble"), finding("generation_tail")],
            meta(TRL_CMD),
        )
    )
    assert trl["vllm_gpu_memory_utilization"].current == 0.25
    assert trl["vllm_mode"].current == "server" and trl["vllm_mode"].suggested == "colocate"
    assert trl["max_completion_length"].current == 8192
    assert trl["max_completion_length"].suggested == 4096
    swift = by_knob(
        recommend([finding("offload_thrash"), finding("reshard_idle")], meta(SWIFT_CMD))
    )
    assert swift["offload_model"].current is True and swift["offload_model"].suggested is False
    assert swift["offload_optimizer"].current is True
    assert (swift["move_model_batches"].current, swift["move_model_batches"].suggested) == (16, 4)
    orl = by_knob(recommend([finding("offload_thrash")], meta(OPENRLHF_OLD_CMD)))
    assert orl["adam_offload"].current is True and orl["adam_offload"].suggested is False


# ------------------------------------------------------------------------------ ranking


def test_ranked_by_gain_times_confidence():
    findings = [
        finding("memory_headroom", lost=100.0, share=0.2, conf=0.3),
        finding("dataloader_starvation", lost=60.0, share=0.12, conf=0.9),
        finding("periodic_stall", lost=500.0, share=0.5, conf=0.1),
    ]
    recs = recommend(findings, meta(VERL_CMD))
    scores = [r.expected_gain_gpu_s * r.confidence for r in recs]
    assert scores == sorted(scores, reverse=True)
    # dataloader: 60 × 0.7 × 0.9 = 37.8 beats memory: 100 × 0.6 × 0.3 = 18 and save: 25
    assert recs[0].knob == "data.dataloader_num_workers"
    assert recs[0].score == pytest.approx(37.8)
    d = recs[0].to_dict()
    assert set(d) >= {
        "kind",
        "framework",
        "knob",
        "current",
        "suggested",
        "expected_gain_share",
        "expected_gain_gpu_s",
        "confidence",
        "rationale",
    }
    assert 0.0 <= d["expected_gain_share"] <= 1.0


def test_gain_share_is_bounded():
    recs = recommend([finding("memory_headroom", share=1.0)], meta(VERL_CMD))
    assert all(0.0 <= r.expected_gain_share <= 1.0 for r in recs)


# ------------------------------------------------------------------------------ versions


def test_version_picks_openrlhf_spelling():
    f = [finding("memory_headroom"), finding("pipeline_bubble")]
    old = {r.knob for r in recommend(f, meta([], framework="openrlhf"), framework_version="0.9.5")}
    assert {"vllm_gpu_memory_utilization", "colocate_all_models", "async_train"} <= old
    assert not any(k.startswith(("vllm.", "train.")) for k in old)
    new = {r.knob for r in recommend(f, meta([], framework="openrlhf"), framework_version="0.11")}
    assert {"vllm.gpu_memory_utilization", "train.colocate_all", "train.async_enable"} <= new
    assert "colocate_all_models" not in new and "vllm_gpu_memory_utilization" not in new


def test_version_picks_verl_bucket_key_and_drops_new_knobs():
    f = [finding("reshard_idle"), finding("dataloader_starvation")]
    old = {r.knob for r in recommend(f, meta([], framework="verl"), framework_version="0.5.0")}
    assert "actor_rollout_ref.rollout.update_weights_bucket_megabytes" in old
    ancient = recommend(f, meta([], framework="verl"), framework_version="0.4.1")
    kinds = {(r.kind, r.fallback) for r in ancient}
    # no bucket key and no dataloader workers before 0.5: plain-PyTorch advice instead
    assert ("reshard_idle", True) in kinds and ("dataloader_starvation", True) in kinds
    new = {r.knob for r in recommend(f, meta([], framework="verl"), framework_version="0.8.0")}
    assert "actor_rollout_ref.rollout.checkpoint_engine.update_weights_bucket_megabytes" in new


def test_unknown_version_prefers_the_spelling_on_the_command_line():
    f = [finding("memory_headroom"), finding("offload_thrash")]
    knobs = {r.knob: r for r in recommend(f, meta(OPENRLHF_OLD_CMD))}
    assert knobs["vllm_gpu_memory_utilization"].current == 0.5
    assert "vllm.gpu_memory_utilization" not in knobs and "adam_offload" in knobs
    knobs = {r.knob: r for r in recommend(f, meta(OPENRLHF_NEW_CMD))}
    assert knobs["vllm.gpu_memory_utilization"].current == 0.6
    assert "vllm_gpu_memory_utilization" not in knobs
    # nothing on the command line: the newest spelling
    knobs = {r.knob for r in recommend(f, meta([], framework="openrlhf"))}
    assert "vllm.gpu_memory_utilization" in knobs and "ds.adam_offload" in knobs


def test_trl_version_filter():
    f = [finding("memory_headroom")]
    old = {r.knob for r in recommend(f, meta(TRL_CMD), framework_version="0.19.0")}
    assert "vllm_enable_sleep_mode" not in old and "vllm_gpu_memory_utilization" in old
    new = {r.knob for r in recommend(f, meta(TRL_CMD), framework_version="0.23.0")}
    assert "vllm_enable_sleep_mode" in new


# ------------------------------------------------------------------------------ fallback


def test_unknown_framework_falls_back_to_pytorch():
    m = meta(["python", "my_rl_loop.py", "--num_workers", "2"])
    recs = by_knob(recommend([finding("dataloader_starvation")], m))
    assert recs["num_workers"].framework == "pytorch" and recs["num_workers"].current == 2
    assert recs["num_workers"].suggested == 4 and not recs["num_workers"].fallback


def test_kind_without_framework_knob_falls_back():
    recs = recommend([finding("throttling")], meta(VERL_CMD))
    assert recs and all(r.framework == "pytorch" and r.fallback for r in recs)


def test_no_findings_no_recommendations():
    assert recommend([], meta(VERL_CMD)) == []


# ------------------------------------------------------------------------------ sim runs


def _sim(framework: str, kind: str, severity: float = 1.0):
    cfg = SimConfig(
        gpus=4,
        framework=framework,
        steps=4,
        time_scale=0.05,
        pathologies=[Pathology(kind, severity)],
    )
    result = simulate(cfg)
    findings = [Finding(t.kind, t.gpu_seconds, t.share, 0.8, t.kind, {}) for t in result.truth]
    return result.run.meta, findings


def _on_command(m: RunMeta) -> dict:
    return {k.replace("-", "_"): coerce(v) for k, v in parse_knobs(m.command).items()}


@pytest.mark.parametrize(
    ("framework", "kind", "knob", "current"),
    [
        ("verl", "memory_headroom", "actor_rollout_ref.rollout.gpu_memory_utilization", 0.3),
        ("trl", "memory_headroom", "vllm_gpu_memory_utilization", 0.3),
        ("swift", "memory_headroom", "vllm_gpu_memory_utilization", 0.3),
        ("openrlhf", "memory_headroom", "vllm.gpu_memory_utilization", 0.3),
        ("verl", "dataloader_starvation", "data.dataloader_num_workers", 0),
        ("trl", "dataloader_starvation", "dataloader_num_workers", 0),
        ("swift", "dataloader_starvation", "dataloader_num_workers", 0),
        ("pytorch", "dataloader_starvation", "num_workers", 0),
        ("verl", "offload_thrash", "actor_rollout_ref.actor.fsdp_config.param_offload", True),
        ("swift", "offload_thrash", "offload_model", True),
        ("openrlhf", "offload_thrash", "ds.adam_offload", True),
        (
            "verl",
            "reshard_idle",
            "actor_rollout_ref.rollout.checkpoint_engine.update_weights_bucket_megabytes",
            64,
        ),
        ("trl", "reshard_idle", "ds3_gather_for_generation", False),
        ("verl", "periodic_stall", "trainer.save_freq", 2),
        ("trl", "periodic_stall", "save_steps", 2),
        ("openrlhf", "periodic_stall", "ckpt.save_steps", 2),
        ("verl", "host_bound", "actor_rollout_ref.actor.use_dynamic_bsz", False),
        ("openrlhf", "host_bound", "train.micro_batch_size", 1),
        ("trl", "pipeline_bubble", "vllm_mode", "server"),
        ("swift", "pipeline_bubble", "async_generate", False),
    ],
)
def test_sim_runs_name_knobs_on_their_command_line(framework, kind, knob, current):
    m, findings = _sim(framework, kind)
    assert detect_framework(RunMeta(run_id="x", command=m.command)) == framework
    recs = [r for r in recommend(findings, m) if r.kind == kind]
    assert recs, (framework, kind)
    named = by_knob(recs)
    assert knob in named, (knob, list(named))
    assert knob.replace("-", "_") in _on_command(m)  # the knob really is on the command line
    assert named[knob].current == current
    assert named[knob].suggested != current
    assert named[knob].framework == framework and not named[knob].fallback


def test_sim_verl_memory_headroom_top_recommendation():
    m, findings = _sim("verl", "memory_headroom")
    recs = recommend(findings, m)
    top = recs[0]
    assert top.knob == "actor_rollout_ref.rollout.gpu_memory_utilization"
    assert top.current == 0.3 and top.suggested == pytest.approx(0.78)
    assert top.expected_gain_gpu_s == pytest.approx(findings[0].gpu_seconds_lost * 0.6)


@pytest.mark.parametrize("framework", ["verl", "trl", "swift", "openrlhf", "pytorch"])
def test_sim_every_kind_gets_advice(framework):
    for kind in STALL_KINDS:
        m, findings = _sim(framework, kind, 0.6)
        recs = recommend(findings, m)
        assert {r.kind for r in recs} == {f.kind for f in findings}, (framework, kind)
        for r in recs:
            assert 0.0 <= r.expected_gain_share <= 1.0 and r.expected_gain_gpu_s >= 0.0


def test_environment_assignments_before_the_program_are_not_knobs():
    knobs = parse_knobs(
        ["CUDA_VISIBLE_DEVICES=0,1", "HF_HOME=/x", "python3", "-m", "verl.trainer.main_ppo",
         "trainer.n_gpus_per_node=2", "data.train_batch_size=256"]
    )  # fmt: skip
    assert knobs == {"trainer.n_gpus_per_node": "2", "data.train_batch_size": "256"}
    assert parse_knobs(["a.b=1"]) == {"a.b": "1"}  # a Hydra override is no shell variable


# ------------------------------------------------------------------ busy-time knobs with conditions

_PREFIX = "actor_rollout_ref.rollout.enable_prefix_caching"
_EP = "actor_rollout_ref.actor.megatron.expert_model_parallel_size"


@pytest.mark.parametrize(
    ("n", "advised"),
    [("actor_rollout_ref.rollout.n=8", True), ("actor_rollout_ref.rollout.n=1", False),
     (None, False)],
)  # fmt: skip
def test_prefix_caching_is_advised_only_when_prompts_are_sampled_several_times(n, advised):
    cmd = [*VERL_CMD, f"{_PREFIX}=False"] + ([n] if n else [])
    recs = by_knob(recommend([finding("rollout_bound")], meta(cmd)))
    assert (_PREFIX in recs) is advised
    if advised:
        assert recs[_PREFIX].current is False and recs[_PREFIX].suggested is True
        assert "prefills it once" in recs[_PREFIX].rationale
    # OpenRLHF spells it its own way and defaults to off
    ocmd = [*OPENRLHF_NEW_CMD, "--rollout.n_samples_per_prompt", "8" if advised else "1"]
    orecs = by_knob(recommend([finding("rollout_bound")], meta(ocmd)))
    assert ("vllm.enable_prefix_caching" in orecs) is advised


@pytest.mark.parametrize(
    ("command", "active", "total", "gpus", "suggested"),
    [
        # Qwen3-30B-A3B on verl's Megatron config: spread the experts over the node
        (["--config-name=ppo_megatron_trainer"], 3.3e9, 30.5e9, 8, 8),
        ([f"{_EP}=1", "actor_rollout_ref.actor.strategy=megatron"], 3.3e9, 30.5e9, 4, 4),
        (["--config-name=ppo_megatron_trainer", f"{_EP}=4"], 3.3e9, 30.5e9, 8, None),  # set
        (["--config-name=ppo_megatron_trainer"], 7.6e9, 7.6e9, 8, None),  # dense model
        ([], 3.3e9, 30.5e9, 8, None),  # FSDP: no expert parallelism to set
        (["--config-name=ppo_megatron_trainer"], None, None, 8, None),  # model unknown
    ],
)
def test_expert_parallelism_only_for_a_mixture_of_experts_under_megatron(
    command, active, total, gpus, suggested
):
    run = meta([*VERL_CMD, *command])
    run.gpus = [{"host": "h", "index": i} for i in range(gpus)]
    ev = {"model_params": active, "model_total_params": total, "measure": "mfu"}
    recs = by_knob(recommend([finding("update_bound", **ev)], run))
    if suggested is None:
        assert _EP not in recs
    else:
        assert recs[_EP].suggested == suggested
        assert "experts" in recs[_EP].rationale


@pytest.mark.parametrize("command", [["python", "train.py"], TRL_CMD])
def test_logging_advice_needs_idle_time_inside_steps(command):
    # "log less often" explains idle time between the phases of a step; a run with no phase
    # spans at all (a 0.2 s snapshot, a script without hooks) or idle only before the first
    # step gives no basis for it (seen on a real H100: 2 readings got "log_every → 10")
    from gpuprof.analyzers.evidence import IdleUnattributedEvidence

    def advice(**evidence):
        finding = Finding(kind="idle_unattributed", gpu_seconds_lost=100.0, share=0.4,
                          confidence=0.7, summary="idle",
                          evidence=IdleUnattributedEvidence(**evidence))  # fmt: skip
        return [r.knob for r in recommend([finding], RunMeta(run_id="r", command=command))]

    assert advice(spans_recorded=False, idle_in_step_gpu_s=0.0) == []
    assert advice(spans_recorded=True, idle_in_step_gpu_s=0.0) == []
    knobs = advice(spans_recorded=True, idle_in_step_gpu_s=60.0)
    assert knobs and all("log" in k for k in knobs), knobs
    assert advice() == knobs  # evidence that does not say: the advice as before
