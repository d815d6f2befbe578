"""Variants of framework logs as users have them: tolerant reading, strict reports.

Real public snippets in ``tests/fixtures_logs`` (origins in its README) and the labelled public
files of ``tests/labelled/public``: verl 0.7's one key per line with -1 counts under
``timing_s/``, Megatron iteration lines, DeepSpeed ``wall_clock_breakdown`` timers, tqdm step
bars, ms-swift's cumulative ``train_speed``, a ``log_history`` fragment, a Markdown phase table.
Figures are read off the raw text with regular expressions and compared with the import.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pandas as pd
import pytest
from conftest import run_gpuprof
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gpuprof.collectors.importers import (
    ImportFormatError,
    detect,
    megatron_log,
    phase_table,
    progress_log,
    trl_log,
    verl_log,
)
from gpuprof.importing import parse_file
from gpuprof.phases import phase_from_name

HERE = Path(__file__).resolve().parent
FIXTURES = HERE / "fixtures_logs"
PUBLIC = HERE / "labelled" / "public"


def _steps(spans: pd.DataFrame) -> pd.DataFrame:
    return spans[spans["phase"] == "step"].sort_values("start_ns")


def _seconds(frame: pd.DataFrame) -> list[float]:
    return ((frame["end_ns"] - frame["start_ns"]) / 1e9).round(4).tolist()


def _phase_s(spans: pd.DataFrame) -> dict[str, float]:
    inner = spans[spans["depth"] == 1]
    return (inner["end_ns"] - inner["start_ns"]).groupby(inner["name"]).sum().div(1e9).to_dict()


# --------------------------------------------------------------------------------------------
# verl


def test_verl_071_one_key_per_line_with_minus_one_counts_imports():
    path = FIXTURES / "verl071_one_key_per_line_step1.log"
    raw = path.read_text()
    values = dict(re.findall(r"- (timing_s/[\w/]+):(\S+)", raw))
    assert detect(path) is verl_log
    imported = verl_log.parse(path)
    spans = imported.frames["spans"]
    step = _steps(spans).iloc[0]
    assert _seconds(_steps(spans)) == [round(float(values["timing_s/step"]), 4)]
    phases = _phase_s(spans)
    for name in ("gen", "old_log_prob", "ref", "update_actor", "update_weights"):
        assert phases[name] == pytest.approx(float(values[f"timing_s/{name}"]), abs=1e-6)
    assert step["attrs"]["perf/mfu/actor"] == pytest.approx(0.3707644223640674)
    assert step["attrs"]["tokens"] == 4388173
    counts = [k for k, v in values.items() if "num_preempted" in k and float(v) < 0]
    note = next(n for n in imported.notes if "count filed under timing_s/" in n)
    assert note.startswith(f"{len(counts)} values skipped")


def test_unknown_verl_timers_become_phases_named_as_logged():
    path_text = (
        "(TaskRunner pid=7) step:3 - timing_s/get_batch_rollout_with_filtering:50.5 - "
        "timing_s/old_log_prob:4.0 - timing_s/update_actor:30.0 - timing_s/step:86.0 - "
        "perf/mfu/actor:0.31 - response_length/mean:512\n"
    )
    imported = _parse_text(path_text, "custom.log", verl_log)
    spans = imported.frames["spans"]
    inner = spans[spans["depth"] == 1].sort_values("start_ns")
    assert inner["name"].tolist() == [
        "get_batch_rollout_with_filtering",
        "old_log_prob",
        "update_actor",
    ]
    assert inner["phase"].tolist() == ["rollout", "old_logprob", "update_actor"]
    assert any("get_batch_rollout_with_filtering (rollout)" in n for n in imported.notes)


def test_unknown_verl_timer_that_would_exceed_the_step_is_kept_aside(tmp_path):
    text = "step:1 - timing_s/gen:60 - timing_s/my_generate_part:50 - timing_s/step:70\n"
    imported = _parse_text(text, "nested.log", verl_log)
    step = _steps(imported.frames["spans"]).iloc[0]
    assert step["attrs"]["sub_timing_s"]["my_generate_part"] == 50
    assert "my_generate_part" not in set(imported.frames["spans"]["name"])
    assert any("kept aside as nested" in n for n in imported.notes)


def test_values_that_make_no_sense_are_skipped_and_counted():
    text = (
        "step:1 - timing_s/gen:-1 - timing_s/ref:nan - timing_s/adv:fast - timing_s/update_actor:3"
        " - timing_s/step:5\nstep:2 - timing_s/gen:inf - timing_s/update_actor:2 - "
        "timing_s/step:1e12\n"
    )
    imported = _parse_text(text, "odd.log", verl_log)
    steps = _steps(imported.frames["spans"])
    assert steps["step"].tolist() == [1, 2]
    assert _seconds(steps) == [5.0, 2.0]  # step 2: no usable step total, its phases' sum
    notes = " | ".join(imported.notes)
    assert "2 values skipped: not a plausible duration (first: step 1 at line 1" in notes
    assert "2 values skipped: NaN or infinite" in notes
    assert "1 value skipped: not a number" in notes


def test_verl_lines_without_timing_keys_import_untimed_with_their_figures():
    imported = verl_log.parse(PUBLIC / "verl_issue2060_step0_step1.log")
    assert imported.frames["spans"].empty
    events = imported.frames["events"]
    assert events["name"].tolist() == ["0", "1"]
    step1 = events.iloc[1]["attrs"]
    assert step1["untimed"] is True and step1["perf/mfu/actor"] == pytest.approx(0.343)
    assert any("no timing keys" in n and "nothing to time" in n for n in imported.notes)


def test_verl_wrapped_metrics_only_line_is_rejoined():
    raw = (PUBLIC / "verl_issue1224_ppo_critic_step1049.log").read_text()
    joined = raw.replace("\n", "")
    imported = verl_log.parse(PUBLIC / "verl_issue1224_ppo_critic_step1049.log")
    attrs = imported.frames["events"].iloc[0]["attrs"]
    # "actor/ppo_kl:0.0" + "00" across a wrap, "c" + "ritic/score/max" across another
    assert attrs["actor/ppo_kl"] == 0.0
    assert attrs["critic/score/max"] == float(re.search(r"critic/score/max:([\d.]+)", joined)[1])
    assert attrs["perf/mfu/critic"] == pytest.approx(0.599)


def test_timing_fragments_with_an_annotation_after_the_number():
    imported = verl_log.parse(PUBLIC / "verl_issue6747_ascend_gen_bound.txt")
    spans = imported.frames["spans"]
    assert _seconds(_steps(spans)) == [43.64]
    assert _phase_s(spans) == {"gen": pytest.approx(31.27)}
    assert any("text after the number ignored" in n and "(72%)" in n for n in imported.notes)


def test_wandb_sparkline_summary_is_refused_with_one_clear_line():
    path = PUBLIC / "verl_agentr1_issue32_wandb_summary.log"
    with pytest.raises(ImportFormatError) as info:
        parse_file(path)
    message = str(info.value)
    assert message.startswith(f"{path}: a wandb run-history summary") and "\n" not in message


def test_wandb_summary_with_numbers_is_one_step(tmp_path):
    text = (
        "wandb: Run summary:\nwandb:          timing_s/gen 41.2\n"
        "wandb:         timing_s/step 60.5\nwandb:  timing_s/update_actor 15.1\n"
    )
    imported = _parse_text(text, "summary.log", verl_log)
    assert _seconds(_steps(imported.frames["spans"])) == [60.5]
    assert any("wandb run summary" in n for n in imported.notes)


# --------------------------------------------------------------------------------------------
# Megatron and DeepSpeed


def test_megatron_iteration_lines_give_step_times_throughput_and_memory():
    path = FIXTURES / "megatron_lm_issue756_mixtral_16xh100.log"
    raw = path.read_text()
    assert detect(path) is megatron_log
    imported = megatron_log.parse(path)
    steps = _steps(imported.frames["spans"])
    ms = [float(v) for v in re.findall(r"elapsed time per iteration \(ms\): ([\d.]+)", raw)]
    tflops = [float(v) for v in re.findall(r"\(TFLOP/s/GPU\): ([\d.]+)", raw)]
    assert steps["step"].tolist() == [2, 3, 4]
    assert _seconds(steps) == [round(v / 1000, 4) for v in ms]
    attrs = steps["attrs"].tolist()
    assert [a["perf/throughput_tflops_per_gpu"] for a in attrs] == tflops
    # the stamps place each iteration's end: 5 s apart
    ends = (steps["end_ns"].diff().dropna() / 1e9).tolist()
    assert ends == [pytest.approx(5.0), pytest.approx(5.0)]
    assert imported.meta["framework"] == "megatron"
    assert any("peak memory allocated 53.0 GB" in n for n in imported.notes)


def test_megatron_deepspeed_timers_become_the_iterations_phases():
    path = FIXTURES / "megatron_deepspeed_alcf_polaris.log"
    raw = path.read_text()
    imported = megatron_log.parse(path)
    spans = imported.frames["spans"]
    steps = _steps(spans)
    assert _seconds(steps) == [21.1338, 10.1543]
    global_timers = re.findall(
        r"\| fwd: ([\d.]+) \| bwd: [\d.]+ \| bwd_inner: ([\d.]+) \| bwd_allreduce: ([\d.]+) "
        r"\| step: ([\d.]+)",
        raw,
    )
    first = spans[(spans["depth"] == 1) & (spans["step"] == 1)].sort_values("start_ns")
    assert first["name"].tolist() == ["fwd", "bwd_inner", "bwd_allreduce", "optimizer_step"]
    assert first["phase"].tolist() == ["update_actor", "update_actor", "collective", "update_actor"]
    assert _seconds(first) == [round(float(v) / 1000, 4) for v in global_timers[0]]
    mem = steps.iloc[0]["attrs"]["perf/max_memory_allocated_gb"]
    assert mem == pytest.approx(22332.37255859375 / 1024)


def test_deepspeed_timers_between_tqdm_redraws_join_the_step_they_precede():
    path = FIXTURES / "accelerate_issue1589_deepspeed_timers_tqdm.log"
    assert detect(path) is progress_log
    imported = progress_log.parse(path)
    spans = imported.frames["spans"]
    steps = _steps(spans)
    assert steps["step"].tolist() == [10]  # 9/345 is where the paste starts
    assert _seconds(steps) == [round(1 / 5.40, 4)]
    inner = spans[spans["depth"] == 1].sort_values("start_ns")
    assert _seconds(inner) == [0.0275, 0.0513, 0.0225, 0.073]  # the global timers of line 6
    assert any("printed rate" in n for n in imported.notes)
    assert any("1 DeepSpeed timer lines without a step line" in n for n in imported.notes)


def test_deepspeed_timers_without_step_lines_are_steps_of_their_own():
    path = FIXTURES / "deepspeed_issue1436_timers_tqdm_sit.log"
    imported = progress_log.parse(path)
    steps = _steps(imported.frames["spans"])
    assert _seconds(steps) == [
        round((316.00 + 514.96 + 232.28 + 663.59) / 1000, 4),
        round((316.87 + 514.24 + 226.67 + 659.09) / 1000, 4),
    ]
    assert any("DeepSpeed timers only" in n for n in imported.notes)


def test_deepspeed_timers_inside_a_trl_log_are_phases_of_its_steps(tmp_path):
    text = (
        "[Rank 0] time (ms) | fwd_microstep: 900.5 | bwd_microstep: 1200.0 | "
        "bwd_inner_microstep: 1100.0 | bwd_allreduce_microstep: 100.0 | step_microstep: 50.0\n"
        "[Rank 0] time (ms) | fwd: 900.5 | bwd: 1200.0 | bwd_inner: 1100.0 | "
        "bwd_allreduce: 100.0 | step: 50.0\n"
        "{'loss': 0.01, 'grad_norm': 0.2, 'learning_rate': 1e-06, 'step_time': 379.99, "
        "'epoch': 0.01}\n"
        "  0%|          | 1/1000 [06:19<105:21:00, 379.99s/it]\n"
    )
    imported = _parse_text(text, "grpo.log", trl_log)
    spans = imported.frames["spans"]
    assert _seconds(_steps(spans)) == [379.99]
    assert _phase_s(spans) == pytest.approx(
        {"fwd": 0.9005, "bwd_inner": 1.1, "bwd_allreduce": 0.1, "optimizer_step": 0.05}
    )


# --------------------------------------------------------------------------------------------
# tqdm, ms-swift, TRL


def test_tqdm_bar_alone_gives_step_times_from_elapsed_differences():
    path = PUBLIC / "verl_data_qwen2_7b_fsdp2_grpo_8gpu_progress.log"
    raw = path.read_text()
    clocks = re.findall(r"(\d+)/105 \[([\d:]+)<", raw)

    def secs(clock: str) -> int:
        total = 0
        for part in clock.split(":"):
            total = total * 60 + int(part)
        return total

    elapsed = {int(n): secs(c) for n, c in clocks}
    imported = parse_file(path)
    assert imported.format == "progress-log" and imported.meta["framework"] == "verl"
    steps = _steps(imported.frames["spans"]).set_index("step")
    durations = (steps["end_ns"] - steps["start_ns"]) / 1e9
    assert durations[1] == elapsed[1]
    assert durations[20] == elapsed[20] - elapsed[19]  # the checkpoint step
    assert durations[20] > 10 * durations[19]
    assert any("elapsed time" in n for n in imported.notes)


def test_trl_console_paste_with_one_dict_takes_the_step_time_from_its_tqdm_line():
    imported = parse_file(PUBLIC / "trl_openr1_issue161_grpo_8xa100.log")
    assert imported.format == "trl-log"
    assert _seconds(_steps(imported.frames["spans"])) == [281.0]  # 1/1000 [04:41<…]


def test_swift_train_speed_is_read_as_a_running_average(tmp_path):
    imported = parse_file(PUBLIC / "swift_issue4146_dpo_train_speed.log")
    steps = _steps(imported.frames["spans"])
    assert _seconds(steps)[-1] == 96.0  # 1h 24m 14s - 1h 22m 38s
    assert any("running average since training began" in n for n in imported.notes)
    assert any("cut short" in n for n in imported.notes)
    # without elapsed_time the running average gives the elapsed time: step / speed
    rows = [
        {"loss": 0.2, "train_speed(iter/s)": 0.0125, "global_step/max_steps": "10/100"},
        {"loss": 0.1, "train_speed(iter/s)": 0.0120, "global_step/max_steps": "20/100"},
    ]
    path = tmp_path / "speed.log"
    path.write_text("".join(repr(r) + "\n" for r in rows))
    imported = trl_log.parse(path)
    durations = _seconds(_steps(imported.frames["spans"]))
    assert durations[:10] == [80.0] * 10
    assert durations[10:] == [pytest.approx((20 / 0.012 - 800) / 10)] * 10
    assert any("estimated from ms-swift's train_speed" in n for n in imported.notes)


def test_log_history_fragment_cut_at_both_ends_and_inside_a_number():
    imported = parse_file(PUBLIC / "swift_issue6295_grpo_log_history.txt")
    events = imported.frames["events"]
    assert events["name"].tolist() == ["19"]
    attrs = events.iloc[0]["attrs"]
    assert attrs["completions/min_length"] == 430.0  # "4" + "30.0" across the wrap
    assert any("cut at the start of the paste" in n for n in imported.notes)
    assert any("cut short or unreadable" in n for n in imported.notes)


def test_truncated_trainer_state_is_read_entry_by_entry(tmp_path):
    state = {
        "global_step": 3,
        "log_history": [
            {"loss": 0.3, "step_time": 10.0, "epoch": 0.1, "step": 1},
            {"loss": 0.2, "step_time": 12.0, "epoch": 0.2, "step": 2},
            {"loss": 0.1, "step_time": 11.0, "epoch": 0.3, "step": 3},
        ],
    }
    text = json.dumps(state, indent=2)
    path = tmp_path / "trainer_state.json"
    path.write_text(text[: text.rindex('"step": 3')])
    imported = parse_file(path)
    assert _seconds(_steps(imported.frames["spans"])) == [10.0, 12.0]
    assert any("cut short" in n for n in imported.notes)


def test_trl_ppo_dicts_without_timing_import_as_untimed_steps():
    imported = parse_file(PUBLIC / "trl_hongbomiao_pr37684_ppo_dicts.log")
    events = imported.frames["events"]
    assert len(events) == 2 and all(a["untimed"] for a in events["attrs"])
    assert events.iloc[0]["attrs"]["objective/kl"] == pytest.approx(10.507803916931152)
    assert any("1 line skipped: log dict cut short" in n for n in imported.notes)


# --------------------------------------------------------------------------------------------
# a Markdown table of phase times


def test_markdown_phase_table_is_one_step_of_its_rows():
    path = PUBLIC / "other_marin_issue8653_phase_shares.md"
    assert detect(path) is phase_table
    imported = phase_table.parse(path)
    spans = imported.frames["spans"]
    inner = spans[spans["depth"] == 1].sort_values("start_ns")
    assert inner["name"].tolist()[:2] == ["generate", "policy_train"]
    assert inner["phase"].tolist()[:2] == ["rollout", "update_actor"]
    assert _seconds(inner)[:3] == [5 * 3600 + 26 * 60, 2 * 3600 + 51 * 60, 36 * 60 + 37]
    names = dict(zip(inner["name"], inner["phase"]))
    assert names["save_checkpoints"] == "checkpoint" and names["sync_weights"] == "reshard"
    assert names["fwd_logprobs_values_reward"] == "fwd_logprobs_values_reward"  # ambiguous


@pytest.mark.parametrize(
    ("text", "seconds"),
    [("5h26m", 19560), ("36m37s", 2197), ("~22s", 22), ("1.5 s", 1.5), ("120 ms", 0.12),
     ("1:02:03", 3723), ("abc", None)],
)  # fmt: skip
def test_written_durations(text, seconds):
    assert phase_table.duration_text_s(text) == seconds


def test_phase_from_name_guesses_only_when_the_name_is_clear():
    assert phase_from_name("get_batch_rollout_with_filtering") == "rollout"
    assert phase_from_name("policy_train") == "update_actor"
    assert phase_from_name("bwd_allreduce") == "collective"
    assert phase_from_name("fwd_logprobs_values_reward") is None
    assert phase_from_name("misc") is None


# --------------------------------------------------------------------------------------------
# every real file imports (or gives one clear line), also through the CLI


REFUSED = {
    "verl_agentr1_issue32_wandb_summary.log": "sparklines, no numbers",
    # LLaMA-Factory's PPO prints losses and rewards, no time: nothing to judge
    "llamafactory_ppo_issue845_cmd_and_log_CUT.md": "nothing to judge",
    # medians and p95s of weight-sync parts: statistics over runs, not a run's steps
    "marin_issue8955_weight_sync_table.md": "format not recognised",
}
"""Real files that hold nothing to import, and the line that says so."""


@pytest.mark.parametrize(
    "path",
    sorted(p for p in FIXTURES.glob("*") if p.is_file() and p.suffix != ".md")
    + sorted(p for p in (FIXTURES / "stacks").glob("*") if p.name != "README.md")
    + sorted(p for p in PUBLIC.glob("*") if p.name not in ("cases.json", "README.md")),
    ids=lambda p: p.name,
)
def test_every_real_log_imports_or_says_why_in_one_line(path):
    if path.name in REFUSED:
        with pytest.raises(ImportFormatError, match=REFUSED[path.name]) as err:
            parse_file(path)
        assert "\n" not in str(err.value)
        return
    imported = parse_file(path)
    usable = [imported.frames.get(name) for name in ("spans", "events", "gpu")]
    assert any(frame is not None and len(frame) for frame in usable), path.name


def test_cli_imports_a_megatron_log_and_analyzes_it(tmp_path):
    out = tmp_path / "run"
    result = run_gpuprof("import", str(FIXTURES / "megatron_deepspeed_alcf_polaris.log"), "-o",
                         str(out))  # fmt: skip
    assert result.returncode == 0, result.stderr
    analyzed = run_gpuprof("analyze", str(out), "--json")
    assert analyzed.returncode == 0, analyzed.stderr
    assert "Traceback" not in analyzed.stderr


# --------------------------------------------------------------------------------------------
# fuzz: the new readers raise only ImportFormatError on mutated real snippets


def _parse_text(text: str, name: str, module):
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / name
        path.write_text(text, encoding="utf-8")
        return module.parse(path)


_SAMPLES = [
    (FIXTURES / "megatron_deepspeed_alcf_polaris.log").read_text()[-2500:],
    (FIXTURES / "accelerate_issue1589_deepspeed_timers_tqdm.log").read_text(),
    (FIXTURES / "verl071_one_key_per_line_step1.log").read_text()[-1500:],
    (PUBLIC / "other_marin_issue8653_phase_shares.md").read_text(),
    (PUBLIC / "swift_issue6295_grpo_log_history.txt").read_text(),
]
_PIECES = ["", ":", " | ", "|", "{", "}", '"', "\n", "\r", "nan", "-1", "1e999", "9" * 30,
           "iteration ", "/", "[", "<", "s/it]", "time (ms) |", "\x1b[2m", "step:"]  # fmt: skip


@st.composite
def _mutated(draw):
    text = draw(st.sampled_from(_SAMPLES))
    for _ in range(draw(st.integers(1, 6))):
        i = draw(st.integers(0, len(text)))
        op = draw(st.sampled_from(["delete", "insert", "cut"]))
        if op == "delete":
            text = text[:i] + text[i + draw(st.integers(1, 40)) :]
        elif op == "insert":
            text = text[:i] + draw(st.sampled_from(_PIECES)) + text[i:]
        else:
            text = text[:i]
    return text


@settings(
    max_examples=120, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(text=_mutated())
def test_fuzz_mutated_snippets_raise_only_import_errors(tmp_path, text):
    path = tmp_path / "mutated.log"
    path.write_text(text, encoding="utf-8", errors="surrogatepass")
    for module in (megatron_log, progress_log, phase_table, trl_log, verl_log):
        try:
            module.sniff(text[:65536], path)
            module.parse(path)
        except ImportFormatError as exc:
            assert "\n" not in str(exc)


def test_megatron_tflops_per_gpu_become_mfu_when_the_gpu_is_named(tmp_path):
    # Megatron-LM issue #756: Mixtral 8x7B on H100s at 127-138 TFLOP/s per GPU, "low"
    from gpuprof import api, store

    out = tmp_path / "run"
    api.import_files([PUBLIC / "megatron_lm_issue756_mixtral_16xh100.log"], out)
    run = store.load_run(out)
    plain = api.analyze(run).summary["efficiency"]["framework"]["metrics"]
    assert "perf/mfu/from_throughput" not in plain  # no GPU named: no peak to compare with
    named = api.analyze(run, gpu="NVIDIA H100 80GB HBM3").summary["efficiency"]["framework"]
    mfu = named["metrics"]["perf/mfu/from_throughput"]
    tflops = named["metrics"]["perf/throughput_tflops_per_gpu"]
    assert mfu["mean"] == pytest.approx(tflops["mean"] * 1e12 / 989.4e12, rel=0.01)
    assert 0.12 < mfu["min"] <= mfu["max"] < 0.15
    assert any(n.startswith("MFU 13.") for n in named["notes"])


def test_a_paste_wrapped_again_keeps_every_timing_key():
    # verl #7412's step line, wrapped at 347 columns: one piece is a lone "key:value -"
    from gpuprof.collectors.importers import verl_log

    original = (PUBLIC / "verl_issue7412_long_tail_agent_loop.log").read_text()
    pieces = []
    for line in original.split("\n"):
        pieces.extend(
            line[i : i + 347] for i in range(0, len(line), 347)
        ) if line else pieces.append(line)
    assert any(p.strip().endswith(":38.0 -") and " - " not in p.strip() for p in pieces)
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "wrapped.log"
        path.write_text("\n".join(pieces))
        spans = verl_log.parse(path).frames["spans"]
    assert {"rollout", "update_actor", "reshard", "step"} <= set(spans["phase"])
    step = spans[spans["phase"] == "step"].iloc[0]
    assert (step["end_ns"] - step["start_ns"]) / 1e9 == pytest.approx(1163.957, abs=1e-3)
