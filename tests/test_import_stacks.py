"""The RL stacks without a reader of their own, read from real published files
(`tests/fixtures_logs/stacks/README.md`): each imports with its steps and phases, and its step
composition matches the lines themselves — nested timers inside their parents, never added
to them. Expected figures are read off the files here (their JSON, their printed numbers)
independently of the reader, or copied from the lines as printed."""

from __future__ import annotations

import gzip
import json
import random
import re
from pathlib import Path

import pandas as pd
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gpuprof.collectors.importers import ImportFormatError, detect, step_timings
from gpuprof.importing import parse_file

STACKS = Path(__file__).parent / "fixtures_logs" / "stacks"


def imported(name: str):
    return parse_file(STACKS / name)


def steps_of(part) -> pd.DataFrame:
    spans = part.frames["spans"]
    return spans[spans["phase"] == "step"].sort_values("step")


def seconds(part, step: int, name: str) -> float:
    """The length of the span ``name`` (the framework's timer name) in ``step``."""
    spans = part.frames["spans"]
    row = spans[(spans["step"] == step) & (spans["name"] == name)]
    assert len(row) == 1, (name, step, spans[spans["step"] == step][["name", "depth"]])
    return float((row["end_ns"] - row["start_ns"]).iloc[0]) / 1e9


def phase_of(part, name: str) -> str:
    spans = part.frames["spans"]
    return str(spans.loc[spans["name"] == name, "phase"].iloc[0])


def inside(part, step: int, child: str, parent: str) -> bool:
    spans = part.frames["spans"]
    in_step = spans[spans["step"] == step]
    c = in_step[in_step["name"] == child].iloc[0]
    p = in_step[in_step["name"] == parent].iloc[0]
    return p["start_ns"] <= c["start_ns"] and c["end_ns"] <= p["end_ns"] and c["depth"] > p["depth"]


def top_level_sum(part, step: int) -> float:
    spans = part.frames["spans"]
    top = spans[(spans["step"] == step) & (spans["depth"] == 1)]
    return float((top["end_ns"] - top["start_ns"]).sum()) / 1e9


# ----------------------------------------------------------------------------------- NeMo-RL


def test_nemo_rl_metric_dump_steps_phases_nesting_and_telemetry():
    name = "metrics_grpo_frozen_env_2steps.json"
    data = json.loads((STACKS / name).read_text())
    part = imported(name)
    assert part.format == "step-timings" and part.meta["framework"] == "nemo-rl"
    steps = steps_of(part)
    total = data["timing/train/total_step_time"]
    assert list(steps["step"]) == sorted(int(s) for s in total)
    for step in steps["step"]:
        key = str(step)
        assert seconds(part, step, "step") == pytest.approx(total[key], abs=1e-6)
        assert seconds(part, step, "generation") == pytest.approx(
            data["timing/train/generation"][key], abs=1e-6
        )
        outer = data["timing/train/prepare_for_generation/total"][key]
        assert seconds(part, step, "prepare_for_generation") == pytest.approx(outer, abs=1e-6)
        inner = "prepare_for_generation/transfer_and_update_weights"
        if key in data.get(f"timing/train/{inner}", {}):
            assert inside(part, step, inner, "prepare_for_generation")
        # children are inside their parents, so the step's top level fits in the step
        assert top_level_sum(part, step) <= total[key] * 1.001
    assert phase_of(part, "generation") == "rollout"
    assert phase_of(part, "policy_training") == "update_actor"
    assert phase_of(part, "prepare_for_generation") == "reshard"
    # timing/setup/* at step 0 is the run's set-up: no step of its own, the first step after it
    assert 0 not in set(steps["step"])
    setup = data["timing/setup/total_setup_time_s"]["0"]
    first = steps.iloc[0]
    assert first["start_ns"] == pytest.approx(setup * 1e9, rel=1e-6)
    # the Ray telemetry lands as GPU samples, on its own clock of elapsed seconds
    gpu = part.frames["gpu"]
    util = {k: v for k, v in data.items() if re.fullmatch(r"ray/node\.\d+\.gpu\.\d+\.util", k)}
    assert len(gpu) == len({(k.split(".")[3], x) for k, s in util.items() for x in s})
    g0 = data["ray/node.0.gpu.0.util"]
    rows = gpu[gpu["gpu"] == 0].sort_values("t_ns")
    assert list(rows["t_ns"] / 1e9) == pytest.approx(sorted(float(x) for x in g0))
    assert list(rows["util_gpu_pct"]) == pytest.approx([g0[x] for x in sorted(g0, key=float)])
    # throughputs and flags filed under timing/ are not phases
    names = set(part.frames["spans"]["name"])
    assert not any("tokens_per_sec" in n or "parallel_init" in n for n in names)


def test_nemo_rl_validation_and_checkpointing_stay_inside_the_step():
    name = "metrics_grpo_nanov3_30BA3B_2n8g_10steps.json"
    data = json.loads((STACKS / name).read_text())
    part = imported(name)
    assert len(steps_of(part)) == 10
    assert seconds(part, 10, "step") == pytest.approx(
        data["timing/train/total_step_time"]["10"], abs=1e-6
    )
    validation = data["timing/validation/total_validation_time"]["10"]
    assert seconds(part, 10, "validation") == pytest.approx(validation, abs=1e-6)
    assert phase_of(part, "validation") == "eval"
    assert phase_of(part, "checkpointing") == "checkpoint"
    # inside total_step_time, as NeMo-RL times them: nothing laid out after the step
    spans = part.frames["spans"]
    step10 = spans[spans["step"] == 10]
    assert step10["end_ns"].max() == steps_of(part).iloc[-1]["end_ns"]


def test_nemo_rl_older_outer_key_without_total():
    part = imported("metrics_distillation_older_format.json")
    inner = "prepare_for_generation/transfer_and_update_weights"
    for step in steps_of(part)["step"]:
        assert inside(part, step, inner, "prepare_for_generation")


def test_nemo_rl_console_timing_block():
    part = imported("console_gemma3_1b_g4_grpo_one_step_L124-158.txt")
    assert part.meta["framework"] == "nemo-rl"
    (step,) = steps_of(part)["step"]
    text = (STACKS / "console_gemma3_1b_g4_grpo_one_step_L124-158.txt").read_text()
    printed = dict(re.findall(r"•\s*([\w/ ]+?):\s*([\d.]+)s", text))
    assert seconds(part, step, "step") == pytest.approx(float(printed["Total step time"]))
    for timer in ("generation", "policy_training", "policy_and_reference_logprobs"):
        assert seconds(part, step, timer) == pytest.approx(float(printed[timer]))
    assert seconds(part, step, "prepare_for_generation") == pytest.approx(
        float(printed["prepare_for_generation/total"])
    )
    inner = "prepare_for_generation/transfer_and_update_weights"
    assert inside(part, step, inner, "prepare_for_generation")
    # printed largest first; laid out in the order NeMo-RL runs them
    spans = part.frames["spans"]
    top = spans[spans["depth"] == 1].sort_values("start_ns")["name"].tolist()
    assert (
        top.index("prepare_for_generation") < top.index("generation") < top.index("policy_training")
    )


def test_nemo_rl_console_run_log_and_old_and_async_blocks():
    part = imported("console_gemma3_27b_grpo_steps4-10_rl_loop_logs.txt")
    assert list(steps_of(part)["step"]) == list(range(4, 11))
    text = (STACKS / "console_gemma3_27b_grpo_steps4-10_rl_loop_logs.txt").read_text()
    totals = [float(v) for v in re.findall(r"Total step time:\s*([\d.]+)s", text)]
    assert list(steps_of(part)["end_ns"] - steps_of(part)["start_ns"]) == pytest.approx(
        [t * 1e9 for t in totals]
    )
    old = imported("console_gpu_recipes_llama3.1-8b_old_format_L170-198.txt")
    assert len(steps_of(old)) == 1 and phase_of(old, "generation") == "rollout"
    asynchronous = imported("console_pr1052_async_grpo_transcribed.txt")
    assert phase_of(asynchronous, "exposed_generation") == "rollout"
    assert phase_of(asynchronous, "weight_sync") == "reshard"


# ------------------------------------------------------------------------------------- slime


def test_slime_trainer_perf_dict_nests_in_train_wait_and_train():
    part = imported("slime_actor_perf_dict_zh_doc.txt")
    assert part.meta["framework"] == "slime"
    (step,) = steps_of(part)["step"]
    text = (STACKS / "slime_actor_perf_dict_zh_doc.txt").read_text()
    value = {k: float(v) for k, v in re.findall(r"'perf/(\w+)_time':\s*([\d.]+)", text)}
    assert seconds(part, step, "step") == pytest.approx(value["step"])
    assert value["step"] == pytest.approx(value["train_wait"] + value["train"])
    assert top_level_sum(part, step) == pytest.approx(value["step"], rel=1e-9)
    for child in ("sleep", "update_weights", "wake_up", "data_preprocess"):
        assert inside(part, step, f"train_wait/{child}", "train_wait")
    for child in ("log_probs", "actor_train"):
        assert inside(part, step, f"train/{child}", "train")
    assert phase_of(part, "train_wait") == "rollout"
    assert phase_of(part, "train_wait/update_weights") == "reshard"
    assert phase_of(part, "train/actor_train") == "update_actor"
    names = set(part.frames["spans"]["name"])
    assert not any("tflops" in n or "tok_per_s" in n or "ratio" in n for n in names)


def test_slime_rollout_manager_lines_and_the_old_total_key():
    part = imported("slime_issue1837_rolloutmanager_perf0.log")
    assert seconds(part, 0, "rollout") == pytest.approx(371.1796889305115)
    assert set(part.frames["spans"]["name"]) == {"rollout", "step"}  # throughputs left out
    tau2 = imported("slime_tau2_monitor_perf0_rollout0.log")
    assert seconds(tau2, 0, "rollout") == pytest.approx(262.3797221183777)
    assert not any("non_generation" in n for n in tau2.frames["spans"]["name"])  # statistics
    legacy = imported("slime_issue385_legacy_total_train_time.txt")
    (step,) = steps_of(legacy)["step"]
    assert seconds(legacy, step, "step") == pytest.approx(287.2645092010498)
    assert seconds(legacy, step, "rollout") == pytest.approx(245.61117100715637)


# ------------------------------------------------------------------------------------- AReaL


@pytest.mark.parametrize(
    ("name", "steps", "sums", "rollout"),
    [
        ("areal_commit9b752a4_moonlight_moe_r3_lines756-1009_steps1-2.log", [1, 2],
         {1: 392.643, 2: 269.948}, 109.39),
        ("areal_pr656_logs_1xA100_fastest_completed_lines93-410_steps1-4.log", [1, 2, 3, 4],
         {2: 8.289}, 8.9122),
    ],
)  # fmt: skip
def test_areal_stats_tables(name, steps, sums, rollout):
    part = imported(name)
    assert part.meta["framework"] == "areal"
    assert list(steps_of(part)["step"]) == steps
    for step, total in sums.items():
        # no step total in AReaL: the step is its timers one after another
        assert seconds(part, step, "step") == pytest.approx(total, abs=2e-3)
    assert seconds(part, 1, "rollout") == pytest.approx(rollout, rel=1e-3)
    spans = part.frames["spans"]
    first = spans[(spans["step"] == 1) & (spans["depth"] == 1)].sort_values("start_ns")
    assert first["name"].iloc[0] == "rollout"  # laid out in loop order, not the table's
    assert phase_of(part, "recompute_logp") == "old_logprob"
    assert phase_of(part, "update_weights") == "reshard"
    assert not any("/" in n for n in spans["name"])  # losses and counts are not phases


# -------------------------------------------------------------------------------------- ROLL


def test_roll_table_of_its_timers():
    part = imported("roll_mooncake_report_step_level_means.md")
    assert part.meta["framework"] == "roll"
    assert len(steps_of(part)) == 2
    assert seconds(part, 1, "step_generate") == pytest.approx(96.713005)
    assert seconds(part, 2, "step_train") == pytest.approx(647.777688)
    assert phase_of(part, "ref_log_probs_values") == "ref_logprob"
    attrs = steps_of(part)["attrs"].tolist()
    assert [a["column"] for a in attrs] == ["ray_optimized", "mooncake_generic"]


def test_roll_step_total_logged_a_step_late():
    lines = [
        "step 0: {'time/step_total': 0.0, 'time/step_generate': 10.0, 'time/step_train': 5.0}",
        "step 1: {'time/step_total': 16.0, 'time/step_generate': 11.0, 'time/step_train': 5.0}",
        "step 2: {'time/step_total': 17.0, 'time/step_generate': 9.0, 'time/step_train': 5.0}",
    ]
    read = step_timings.read_text("\n".join(lines))
    assert read.stack is not None and read.stack.name == "roll"
    assert [r.step_s for r in read.records] == [16.0, 17.0, None]


# ---------------------------------------------------------------------- DeepSpeed-Chat / DS


def test_deepspeed_chat_step3_log():
    part = imported("dschat_step3_official_opt1.3b_lines1-120.log")
    assert part.meta["framework"] == "deepspeed-chat"
    assert "--actor_zero_stage" in " ".join(part.meta["command"])
    text = (STACKS / "dschat_step3_official_opt1.3b_lines1-120.log").read_text()
    e2e = [float(v) for v in re.findall(r"E2E latency=([\d.]+)s", text)]
    gen = [float(v) for v in re.findall(r"Generate time=([\d.]+)s", text)]
    steps = steps_of(part)
    assert list(steps["step"]) == list(range(len(e2e)))
    assert list((steps["end_ns"] - steps["start_ns"]) / 1e9) == pytest.approx(e2e)
    assert [seconds(part, s, "generate") for s in steps["step"]] == pytest.approx(gen)
    assert phase_of(part, "generate") == "rollout" and phase_of(part, "training") == "update_actor"
    # Others is the step's untimed rest, not a phase
    assert "others" not in set(part.frames["spans"]["name"])


@pytest.mark.parametrize(
    "name",
    ["openrlhf_issue327_desc_pipe_table_CUT.md", "openrlhf_issue327_comment_tab_table_CUT.txt"],
)
def test_deepspeed_chat_figures_pasted_as_a_table_a_column_per_run(name):
    part = imported(name)
    steps = steps_of(part)
    assert [a["column"] for a in steps["attrs"]] == [
        "Optimized DSChat in OpenRLHF paper", "DSChat in my experiments",
    ]  # fmt: skip  # the "gap" column is a difference, not a run
    assert seconds(part, 1, "step") == pytest.approx(855.09)
    assert seconds(part, 1, "generation") == pytest.approx(590.157)
    assert seconds(part, 2, "step") == pytest.approx(538)  # "About 538"


def test_deeperspeed_pipeline_timers_before_their_step_line():
    part = imported("deeperspeed_pipe_timers_gptneox_mosaic_README.md")
    assert part.meta["framework"] == "deepspeed-pipeline"
    assert list(steps_of(part)["step"]) == [30]
    assert seconds(part, 30, "step") == pytest.approx(0.283)  # iter time (s)
    assert seconds(part, 30, "forward") == pytest.approx(0.51908)
    assert inside(part, 30, "comms/reduce_grads", "comms")
    assert inside(part, 30, "backward/backward_inner", "backward")
    assert inside(part, 30, "optimizer_step/step_step", "optimizer_step")
    # DeeperSpeed reads train_batch after resetting it (0.00): the step line's time stands
    assert any("more than the step total" in n for n in part.notes)


# ---------------------------------------------------------------- LLaMA-Factory, SkyRL, marin


def test_llamafactory_ppo_log_without_timing_is_nothing_to_judge():
    with pytest.raises(ImportFormatError, match="nothing to judge") as err:
        imported("llamafactory_ppo_issue845_cmd_and_log_CUT.md")
    assert "\n" not in str(err.value)


def test_llamafactory_trainer_log_steps_from_its_elapsed_clock():
    part = imported("llamafactory_trainer_log_pt_issue774.jsonl")
    steps = steps_of(part)
    # 5:13:22 → 5:14:24 over steps 3200 → 3210: 6.2 s a step, ending on the clock
    assert steps.iloc[0]["step"] == 3201
    assert (steps.iloc[0]["end_ns"] - steps.iloc[0]["start_ns"]) / 1e9 == pytest.approx(6.2)
    assert steps.iloc[9]["end_ns"] / 1e9 == pytest.approx(5 * 3600 + 14 * 60 + 24)


def test_skyrl_started_finished_timers_nest():
    part = imported("skyrl_phase_timers_yottalabs_doc_excerpt.log")
    assert part.meta["framework"] == "skyrl"
    first = int(steps_of(part)["step"].iloc[0])
    assert seconds(part, first, "step") == pytest.approx(1331.13)
    assert seconds(part, first, "fwd_logprobs_values_reward") == pytest.approx(377.36)
    assert inside(part, first, "train_critic_and_policy/policy_train", "train_critic_and_policy")
    assert phase_of(part, "sync_weights") == "reshard"


def test_a_table_of_statistics_is_not_a_run():
    with pytest.raises(ImportFormatError) as err:
        imported("marin_issue8955_weight_sync_table.md")
    assert "\n" not in str(err.value)


# ------------------------------------------------------------- verl after long start-up chatter


@pytest.mark.parametrize(
    ("name", "step", "timer", "value"),
    [
        ("verlA_gui_cursor_verl_demo_ANSI_CR_customtimer.log.gz", 1,
         "get_batch_rollout_with_filtering", 313.908),
        ("verlA_logicrl_wandb_output_step1_at_446KiB.log.gz", 1, "gen", 25.312),
        ("verlA_econ_grpo_train_ANSI_npfloat64_nested_gen_timers.log.gz", 1, "gen", 51.746),
    ],
)  # fmt: skip
def test_verl_logs_whose_first_step_comes_late(name, step, timer, value):
    raw = gzip.decompress((STACKS / name).read_bytes())
    assert raw.find(b"step:1 ") > 64 * 1024 or b"\x1b[" in raw
    assert detect(STACKS / name).FORMAT == "verl-log"
    part = imported(name)
    assert seconds(part, step, timer) == pytest.approx(value, abs=1e-3)


def test_a_hand_written_loops_custom_timer():
    part = imported("verlB_widgetanchor_grpo_log_custom_timer_no_timestamps.txt")
    steps = steps_of(part)
    assert steps["step"].iloc[0] == 1 and len(steps) >= 300
    assert seconds(part, 1, "generated_2_candidates") == pytest.approx(374.3)
    assert seconds(part, 2, "generated_2_candidates") == pytest.approx(156.9)
    assert phase_of(part, "generated_2_candidates") == "rollout"


# --------------------------------------------------------------------- the reader on its own


@pytest.mark.parametrize(
    ("text", "want"),
    [
        # key=value with units in the value, a throughput beside them
        ("iteration 3: gen_time=1.5s train_time=2500ms tokens_per_sec=300",
         {3: {"gen": 1.5, "train": 2.5}}),
        # a CSV a user's script wrote
        ("step,gen_time,train_time\n1,10.5,20.1\n2,11.5,21.1",
         {1: {"gen": 10.5}, 2: {"gen": 11.5}}),
        # JSON lines with nested timers and a total
        ('{"step": 7, "timing": {"rollout": 4.0, "rollout/decode": 3.0, "total": 6.0}}',
         {7: {"rollout": 4.0, "rollout/decode": 3.0, "step": 6.0}}),
        # "took" messages, no step: a new step where a timer repeats
        ("rollout took 12.3s\nreward took 1.3 s\nrollout took 12.0s",
         {1: {"rollout": 12.3, "reward": 1.3}, 2: {"rollout": 12.0}}),
        # a DeepSpeed-style ms timer line after a step header
        ("Step 5/10\ntime (ms) | fwd_pass: 120.0 | opt: 30.0",
         {5: {"fwd_pass": 0.12, "opt": 0.03}}),
    ],
)  # fmt: skip
def test_the_reader_on_common_shapes(text, want):
    read = step_timings.read_text(text)
    got = {}
    for record in read.records:
        entry = dict(record.phases)
        for kids in record.children.values():
            entry.update(kids)
        if record.step_s is not None:
            entry["step"] = record.step_s
        got[record.step] = entry
    for step, timers in want.items():
        for timer, value in timers.items():
            assert got[step][timer] == pytest.approx(value), (step, timer, got)


@pytest.mark.parametrize(
    ("key", "kind", "name"),
    [
        ("timing_s/gen", "duration", "gen"),
        ("timing/train/policy_training", "duration", "train/policy_training"),
        ("timing/train/valid_tokens_per_sec_per_gpu", "other", None),
        ("timing_per_token_ms/gen", "other", None),
        ("timing_s/agent_loop/num_preempted/max", "other", None),
        ("perf/rollout_time", "duration", "rollout"),
        ("perf/actor_train_tflops", "other", None),
        ("perf/wait_time_ratio", "other", None),
        ("perf/time_per_step", "duration", "per_step"),
        ("E2E latency", "duration", "e2e"),
        ("Generation time (s)", "duration", "generation"),
        ("elapsed_time", "clock", None),
        ("global_step", "step", None),
        ("time/step_generate", "duration", "step_generate"),
        ("timing/setup/parallel_init_enabled", "other", None),
    ],
)
def test_what_a_key_holds(key, kind, name):
    got = step_timings.classify(key)
    assert got.kind == kind
    if name is not None:
        assert got.name == name


def test_units_from_key_line_and_value():
    assert step_timings.classify("gen_time_ms").scale == pytest.approx(1e-3)
    assert step_timings.classify("gen_time", "ms").scale == pytest.approx(1e-3)
    assert step_timings.classify("gen_time", "min").scale == 60.0
    assert step_timings.classify("gen", None, line_ms=True).kind == "other"
    assert step_timings.classify("timing/gen", None, line_ms=True).scale == pytest.approx(1e-3)


# --------------------------------------------------------------------- fuzz: never a traceback

TEXT_STACKS = [
    "console_gemma3_1b_g4_grpo_one_step_L124-158.txt",
    "slime_actor_perf_dict_zh_doc.txt",
    "slime_issue1837_rolloutmanager_perf0.log",
    "areal_pr656_logs_1xA100_fastest_completed_lines93-410_steps1-4.log",
    "dschat_step3_official_opt1.3b_lines1-120.log",
    "deeperspeed_pipe_timers_gptneox_mosaic_README.md",
    "skyrl_phase_timers_yottalabs_doc_excerpt.log",
    "openrlhf_issue327_desc_pipe_table_CUT.md",
    "llamafactory_trainer_log_pt_issue774.jsonl",
    "slime_pr1102_actor_perf_steps2_5_OCR_garbled.log",
    "metrics_grpo_frozen_env_2steps.json",
]


def _mangle(text: str, rng: random.Random) -> str:
    lines = text.split("\n")
    for _ in range(rng.randint(1, 6)):
        if not lines:
            break
        i = rng.randrange(len(lines))
        how = rng.randrange(6)
        if how == 0:
            lines[i] = lines[i][: rng.randint(0, len(lines[i]))]  # cut
        elif how == 1:
            del lines[i]
        elif how == 2:
            lines.insert(i, lines[rng.randrange(len(lines))])  # a line twice
        elif how == 3:
            lines[i] = re.sub(r"\d", lambda _: rng.choice("0123456789-.eE"), lines[i])
        elif how == 4:
            lines[i] = "\x1b[31m" + lines[i] + "\r" + "nan inf -1 1e400"
        else:
            lines[i] = lines[i].replace(":", "=", 1).replace("|", "\t")
    return "\n".join(lines)


@settings(max_examples=80, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])  # fmt: skip
@given(st.sampled_from(TEXT_STACKS), st.integers(0, 2**16))
def test_mangled_stack_files_import_or_say_why_in_one_line(tmp_path, name, seed):
    text = (STACKS / name).read_text(encoding="utf-8")
    path = tmp_path / name
    path.write_text(_mangle(text, random.Random(seed)), encoding="utf-8")
    try:
        part = parse_file(path)
    except ImportFormatError as exc:
        assert "\n" not in str(exc) and str(exc).startswith(str(path)), str(exc)
        return
    spans = part.frames.get("spans")
    if spans is not None and len(spans):
        assert (spans["end_ns"] >= spans["start_ns"]).all()
        assert spans["step"].notna().all()
