"""Framework-log importers: verl console and JSONL logs, TRL / transformers logs, ms-swift's
logging.jsonl and OpenRLHF's ``Global step`` lines.

Real verl logs from ``../shared/fixtures/verl`` are checked against figures this test reads off
the raw text another way (regular expressions); the TRL / ms-swift / OpenRLHF samples below
follow those frameworks' real output formats (the callbacks and logger lines that write them).
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pandas as pd
import pytest
from conftest import SHARED_FIXTURES, run_gpuprof
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gpuprof.collectors.importers import (
    ImportFormatError,
    detect,
    openrlhf_log,
    swift_log,
    trl_log,
    verl_jsonl,
    verl_log,
)
from gpuprof.phases import canonical_phase

VERL_DIR = SHARED_FIXTURES / "verl"
GEMMA = VERL_DIR / "gemma2b_ppo_2gpu_old_format.log"
GH200 = VERL_DIR / "issue_excerpt_gh200_sglang.txt"
H100 = VERL_DIR / "issue_excerpt_16xh100.txt"
needs_fixtures = pytest.mark.skipif(not VERL_DIR.is_dir(), reason="../shared/fixtures absent")
MODULES = (verl_log, verl_jsonl, trl_log, swift_log, openrlhf_log)


def _durations(spans: pd.DataFrame) -> pd.Series:
    return (spans["end_ns"] - spans["start_ns"]).astype("int64") / 1e9


def _phase_totals(spans: pd.DataFrame) -> dict[str, float]:
    frame = spans.assign(dur=_durations(spans))
    return frame.groupby("phase")["dur"].sum().to_dict()


def _assert_sequential(spans: pd.DataFrame) -> None:
    """Within every step the phase spans follow one another without overlap, inside time >= 0
    order, and the steps follow one another."""
    phases = spans[spans["depth"] == 1].sort_values("start_ns")
    assert (phases["end_ns"].to_numpy()[:-1] <= phases["start_ns"].to_numpy()[1:]).all()
    steps = spans[spans["phase"] == "step"].sort_values("start_ns")
    assert (steps["end_ns"].to_numpy()[:-1] <= steps["start_ns"].to_numpy()[1:]).all()
    for step, group in phases.groupby("step"):
        whole = steps[steps["step"] == step].iloc[0]
        assert group["start_ns"].min() == whole["start_ns"]


# --------------------------------------------------------------------------------------------
# verl console logs (real files)

VERL_CANONICAL = {
    "gen": "rollout",
    "ref": "ref_logprob",
    "values": "values",
    "adv": "advantage",
    "update_critic": "update_critic",
    "update_actor": "update_actor",
    "testing": "eval",
    "old_log_prob": "old_logprob",
    "reward": "reward",
}


@needs_fixtures
@pytest.mark.parametrize("path", sorted(VERL_DIR.glob("*")), ids=lambda p: p.name)
def test_every_verl_fixture_is_detected_and_imports(path):
    module = detect(path)
    assert module.FORMAT == "verl-log"
    imported = module.parse(path)
    spans = imported.frames["spans"]
    assert imported.anchored is False
    assert imported.meta["framework"] == "verl"
    assert (spans["phase"] == "step").sum() >= 1
    assert (spans["end_ns"] >= spans["start_ns"]).all()
    assert spans["start_ns"].min() == 0
    _assert_sequential(spans)


@needs_fixtures
def test_old_verl_log_steps_phase_totals_and_knobs_match_the_raw_text():
    raw = GEMMA.read_text(encoding="utf-8", errors="replace")
    imported = verl_log.parse(GEMMA)
    spans = imported.frames["spans"]

    # steps: every line with step:N and timing/ keys (the validation line of step 0 has none)
    step_lines = [line for line in raw.splitlines() if re.search(r"step:\d+ - .*timing/", line)]
    numbers = [int(re.search(r"step:(\d+) - ", line).group(1)) for line in step_lines]
    steps = spans[spans["phase"] == "step"]
    assert len(steps) == len(step_lines) == 106
    assert steps["step"].tolist() == numbers

    # per-phase totals equal the raw values summed per key (milliseconds are in the log)
    totals = _phase_totals(spans)
    for key, phase in VERL_CANONICAL.items():
        values = [float(v) for v in re.findall(rf"timing/{key}:([-\d.]+)", raw)]
        if values:
            assert totals[phase] == pytest.approx(sum(values), abs=1e-6), key
    assert totals["eval"] == pytest.approx(
        sum(float(v) for v in re.findall(r"timing/testing:([\d.]+)", raw))
    )
    # no timing/step in old logs: each step lasts the sum of its line's timings
    for line, (_, step) in zip(step_lines, steps.iterrows()):
        expected = sum(float(v) for v in re.findall(r"timing/\w+:([\d.]+)", line))
        assert (step["end_ns"] - step["start_ns"]) / 1e9 == pytest.approx(expected, abs=1e-6)
    assert any("timing_s/step" in note for note in imported.notes)

    # the Ray prefix names the driver process
    assert set(spans["pid"]) == {int(re.search(r"\(main_task pid=(\d+)\)", raw).group(1))}

    # knobs: every key=value override of the python3 launch line, values typed
    launch = next(line for line in raw.splitlines() if "-m verl.trainer.main_ppo" in line)
    pairs = dict(re.findall(r"(?:^|\s)'?([a-z_]+(?:\.\w+)+)=([^\s']*)", launch))
    knobs = imported.meta["knobs"]
    assert set(pairs) == set(knobs)
    assert knobs["actor_rollout_ref.rollout.gpu_memory_utilization"] == pytest.approx(
        float(pairs["actor_rollout_ref.rollout.gpu_memory_utilization"])
    )
    assert knobs["actor_rollout_ref.rollout.tensor_model_parallel_size"] == 2
    assert knobs["actor_rollout_ref.actor.fsdp_config.param_offload"] is False
    assert knobs["trainer.logger"] == "[console,wandb]"
    assert imported.meta["command"][:3] == ["python3", "-m", "verl.trainer.main_ppo"]

    # tokens: (prompt + response mean length) x train_batch_size (n defaults to 1)
    first = step_lines[0]
    prompt = float(re.search(r"prompt_length/mean:([\d.]+)", first).group(1))
    response = float(re.search(r"response_length/mean:([\d.]+)", first).group(1))
    batch = int(pairs["data.train_batch_size"])
    assert steps.iloc[0]["attrs"]["tokens"] == pytest.approx((prompt + response) * batch)
    events = imported.frames["events"]
    assert len(events) == 106 and (events["kind"] == "step").all()

    # the validation-before-training line (step 0, no timings) adds its score to step 0
    score = float(re.search(r"step:0 - test_score/openai/gsm8k:([\d.]+)", raw).group(1))
    assert steps.iloc[0]["attrs"]["test_score/openai/gsm8k"] == pytest.approx(score)


@needs_fixtures
def test_verl_line_wrapped_inside_a_key_is_rejoined():
    raw = GH200.read_text(encoding="utf-8")
    joined = raw.replace("\n", "")
    imported = verl_log.parse(GH200)
    spans = imported.frames["spans"]
    step = spans[spans["phase"] == "step"].iloc[0]
    assert step["step"] == int(re.search(r"step:(\d+)", raw).group(1))
    clip = float(re.search(r"response_length/clip_ratio:([\d.]+)", joined).group(1))
    assert step["attrs"]["response_length/clip_ratio"] == pytest.approx(clip)
    assert (step["end_ns"] - step["start_ns"]) / 1e9 == pytest.approx(
        float(re.search(r"timing_s/step:([\d.]+)", joined).group(1))
    )
    totals = _phase_totals(spans)
    for key, phase in VERL_CANONICAL.items():
        found = re.search(rf"timing_s/{key}:([\d.]+)", joined)
        if found:
            assert totals[phase] == pytest.approx(float(found.group(1))), key
    # phases in verl's order: gen, old_log_prob, ref, adv, update_actor
    order = spans[spans["depth"] == 1].sort_values("start_ns")["name"].tolist()
    assert order == ["gen", "old_log_prob", "ref", "adv", "update_actor"]
    assert set(spans["pid"]) == {16292}


@needs_fixtures
def test_verl_issue_fragments_become_one_step_with_sub_timings_kept_aside():
    raw = H100.read_text(encoding="utf-8")
    values = {k: float(v) for k, v in re.findall(r"timing_s/([\w/]+):([\d.]+)", raw)}
    imported = verl_log.parse(H100)
    spans = imported.frames["spans"]
    step = spans[spans["phase"] == "step"].iloc[0]
    assert (step["end_ns"] - step["start_ns"]) / 1e9 == pytest.approx(values["step"])
    totals = _phase_totals(spans)
    assert totals["rollout"] == pytest.approx(values["gen"])
    assert totals["update_actor"] == pytest.approx(values["update_actor"])
    assert totals["reward"] == pytest.approx(values["reward"])
    # generate_sequences runs inside gen: kept on the step, not laid out as a phase
    assert step["attrs"]["sub_timing_s"]["generate_sequences"] == pytest.approx(
        values["generate_sequences"]
    )
    assert "generate_sequences" not in set(spans["name"])
    assert any("one step" in note for note in imported.notes)


@needs_fixtures
def test_verl_knob_names_are_the_ones_the_recommender_reads():
    from gpuprof.analyzers.findings import Finding
    from gpuprof.analyzers.knobs import CATALOGUE
    from gpuprof.analyzers.recommend import detect_framework, parse_knobs, recommend
    from gpuprof.model import RunMeta

    imported = verl_log.parse(GEMMA)
    meta = RunMeta(run_id="x", **{k: imported.meta[k] for k in ("framework", "knobs")})
    assert detect_framework(meta) == "verl"
    # the recommender's own command-line parser reads the same names from the stored command
    assert set(parse_knobs(imported.meta["command"])) == set(imported.meta["knobs"])
    catalogue = {e.knob for e in CATALOGUE if e.framework == "verl"}
    assert "actor_rollout_ref.rollout.gpu_memory_utilization" in catalogue
    assert catalogue & set(imported.meta["knobs"])
    finding = Finding("memory_headroom", 100.0, 0.2, 0.9, "memory unused", {"headroom_frac": 0.5})
    recs = recommend([finding], meta)
    rec = next(r for r in recs if r.knob == "actor_rollout_ref.rollout.gpu_memory_utilization")
    assert rec.current == pytest.approx(0.4)
    assert rec.suggested > 0.4


@needs_fixtures
def test_imported_verl_log_analyzes_with_recommendations_at_current_values(tmp_path):
    """End to end: import the log into a run directory, add GPU samples that leave most memory
    unused, and analyze: the recommendation for the rollout memory fraction reads 0.4."""
    import numpy as np

    from gpuprof import api, store

    run_dir = tmp_path / "run"
    if hasattr(api, "import_files"):
        api.import_files([GEMMA], run_dir)
        run = store.load_run(run_dir)
    else:  # the import command is not there yet: save the Run built from the import
        from gpuprof.model import Run, RunMeta

        imported = verl_log.parse(GEMMA)
        run = Run(RunMeta(run_id="verl", **{k: imported.meta[k] for k in ("framework", "knobs")}))
        run.spans, run.events = imported.frames["spans"], imported.frames["events"]
        store.save_run(run, run_dir)
        run = store.load_run(run_dir)
    assert run.meta.knobs["actor_rollout_ref.rollout.gpu_memory_utilization"] == 0.4
    spans = run.spans
    host = spans["host"].iloc[0]
    t0, t1 = int(spans["start_ns"].min()), int(spans["end_ns"].max())
    times = np.arange(t0, t1, 5_000_000_000, dtype=np.int64)
    rollout = spans[spans["phase"] == "rollout"]
    in_rollout = np.zeros(len(times), dtype=bool)
    for s, e in zip(rollout["start_ns"], rollout["end_ns"]):
        in_rollout |= (times >= s) & (times < e)
    total = 80 * 2**30
    frames = []
    for gpu in (0, 1):
        frames.append(
            pd.DataFrame(
                {
                    "host": host,
                    "gpu": gpu,
                    "uuid": f"GPU-{gpu}",
                    "t_ns": times,
                    "util_gpu_pct": np.where(in_rollout, 35.0, 90.0),
                    "mem_used_bytes": np.full(len(times), int(0.3 * total)),
                    "mem_total_bytes": total,
                }
            )
        )
    gpu = pd.concat(frames, ignore_index=True)
    run.gpu = pd.concat([run.gpu.iloc[0:0], gpu], ignore_index=True).astype(run.gpu.dtypes)
    run.meta.gpus = [{"host": host, "index": g, "uuid": f"GPU-{g}"} for g in (0, 1)]
    diagnosis = api.analyze(run)
    knob = "actor_rollout_ref.rollout.gpu_memory_utilization"
    recs = [r for r in diagnosis.recommendations if r.knob == knob]
    assert recs, [f.kind for f in diagnosis.findings]
    assert recs[0].current == pytest.approx(0.4)


# --------------------------------------------------------------------------------------------
# verl under `gpuprof watch`: anchored by arrival times


def test_verl_spans_from_watched_lines_end_when_each_step_line_arrived():
    t = 1_700_000_000 * 10**9
    lines = [
        (t, "\x1b[36m(TaskRunner pid=77)\x1b[0m Training Progress:   0%|          | 0/2"),
        (t + 10**9, "(TaskRunner pid=77) step:1 - actor/pg_loss:0.1 - timing_s/gen:4.0 - "
                    "timing_s/reward:0.5 - timing_s/update_actor:2.0 - timing_s/step:7.0"),
        (t + 9 * 10**9, "(TaskRunner pid=77) step:2 - timing_s/gen:3.0 - response_length/cl"),
        (t + 9 * 10**9 + 5_000_000, "ip_ratio:0.1 - timing_s/update_actor:1.5 - timing_s/step:5.0"),
        (t + 10 * 10**9, "(WorkerDict pid=80) some unrelated output"),
    ]  # fmt: skip
    spans = verl_log.spans_from_lines(lines)
    steps = spans[spans["phase"] == "step"].set_index("step")
    assert steps.loc[1, "end_ns"] == t + 10**9
    assert steps.loc[1, "start_ns"] == t + 10**9 - 7 * 10**9
    assert steps.loc[2, "end_ns"] == t + 9 * 10**9 + 5_000_000  # the wrapped line's arrival
    assert steps.loc[2, "attrs"]["response_length/clip_ratio"] == pytest.approx(0.1)
    gen1 = spans[(spans["step"] == 1) & (spans["name"] == "gen")].iloc[0]
    assert gen1["start_ns"] == steps.loc[1, "start_ns"]
    assert gen1["end_ns"] - gen1["start_ns"] == 4 * 10**9
    reward = spans[(spans["step"] == 1) & (spans["phase"] == "reward")].iloc[0]
    assert reward["start_ns"] == gen1["end_ns"]
    assert set(spans["pid"]) == {77}
    assert set(spans["host"]) == {"(log)"}
    assert set(verl_log.spans_from_lines(lines, host="node-1")["host"]) == {"node-1"}
    assert verl_log.spans_from_lines([(t, "nothing here")]).empty


# --------------------------------------------------------------------------------------------
# verl JSONL file logger


def _verl_jsonl(tmp_path: Path, elapsed: bool = True) -> Path:
    rows = []
    for step in (1, 2, 3):
        data = {
            "timing_s/gen": 60.0 + step,
            "timing_s/reward": 5.0,
            "timing_s/old_log_prob": 8.0,
            "timing_s/ref": 7.0,
            "timing_s/adv": 0.5,
            "timing_s/update_actor": 18.0,
            "timing_s/update_weights": 2.0,
            "timing_s/step": 101.0 + step,
            "timing_per_token_ms/gen": 0.01,
            "perf/total_num_tokens": 100_000 * step,
            "response_length/mean": 300.0,
            "actor/pg_loss": -0.01,
        }
        row = {"step": step, "data": data}
        if elapsed:
            row["elapsed_seconds"] = 110.0 * step
        rows.append(row)
    rows.insert(0, {"step": 0, "data": {"val-core/gsm8k/acc/mean@1": 0.51}})
    path = tmp_path / "experiment.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    return path


def test_verl_jsonl_steps_phases_tokens_and_elapsed(tmp_path):
    path = _verl_jsonl(tmp_path)
    assert detect(path).FORMAT == "verl-jsonl"
    imported = verl_jsonl.parse(path)
    spans = imported.frames["spans"]
    steps = spans[spans["phase"] == "step"].set_index("step")
    assert list(steps.index) == [1, 2, 3]
    assert (steps["end_ns"] - steps["start_ns"]).tolist() == [102 * 10**9, 103 * 10**9, 104 * 10**9]
    assert steps["end_ns"].tolist() == [110 * 10**9, 220 * 10**9, 330 * 10**9]
    assert [a["tokens"] for a in steps["attrs"]] == [100_000, 200_000, 300_000]
    totals = _phase_totals(spans)
    assert totals["rollout"] == pytest.approx(61 + 62 + 63)
    assert totals["reshard"] == pytest.approx(6.0)
    names = spans[(spans["step"] == 1) & (spans["depth"] == 1)].sort_values("start_ns")["name"]
    assert names.tolist() == [
        "gen", "reward", "old_log_prob", "ref", "adv", "update_actor", "update_weights"
    ]  # fmt: skip
    flat = tmp_path / "flat.jsonl"
    flat.write_text(json.dumps({"step": 4, "timing_s/gen": 1.5, "timing_s/step": 2.0}) + "\n")
    assert len(verl_jsonl.parse(flat).frames["spans"]) == 2


def test_verl_validation_and_checkpoint_follow_the_step_timer(tmp_path):
    """verl times testing and save_checkpoint after its step timer stopped: with a step key
    they come after the step span (and after its untimed rest), in that order."""
    path = tmp_path / "console.log"
    path.write_text(
        "(TaskRunner pid=9) step:10 - timing_s/gen:5.0 - timing_s/update_actor:3.0 - "
        "timing_s/step:10.0 - timing_s/testing:4.0 - timing_s/save_checkpoint:2.0\n"
        "(TaskRunner pid=9) step:11 - timing_s/gen:5.0 - timing_s/step:6.0\n"
    )
    spans = verl_log.parse(path).frames["spans"].set_index("name")
    step10 = spans[(spans["phase"] == "step") & (spans["step"] == 10)].iloc[0]
    assert step10["end_ns"] == 10 * 10**9
    assert (spans.loc["testing", "start_ns"], spans.loc["testing", "end_ns"]) == (
        10 * 10**9,
        14 * 10**9,
    )
    assert spans.loc["save_checkpoint", "end_ns"] == 16 * 10**9
    step11 = spans[(spans["phase"] == "step") & (spans["step"] == 11)].iloc[0]
    assert step11["start_ns"] == 16 * 10**9


def test_verl_jsonl_without_elapsed_is_laid_end_to_end(tmp_path):
    spans = verl_jsonl.parse(_verl_jsonl(tmp_path, elapsed=False)).frames["spans"]
    steps = spans[spans["phase"] == "step"].sort_values("start_ns")
    assert steps["start_ns"].tolist() == [0, 102 * 10**9, 205 * 10**9]


# --------------------------------------------------------------------------------------------
# TRL / transformers

TRL_CONSOLE = """\
***** Running training *****
  0%|          | 0/6 [00:00<?, ?it/s]
{'loss': 0.0, 'grad_norm': 0.52, 'learning_rate': 1e-06, 'num_tokens': 2048.0, \
'completions/mean_length': 96.0, 'completions/max_length': 128.0, 'completions/clipped_ratio': \
0.25, 'rewards/accuracy_reward/mean': 0.375, 'reward': 0.375, 'reward_std': 0.41, 'kl': 0.0, \
'entropy': 0.62, 'clip_ratio/region_mean': 0.0, 'step_time': 12.5, 'epoch': 0.33}
 33%|███▎      | 2/6 [00:25<00:50, 12.5s/it]\r 50%|█████     | 3/6 [00:37<00:37, 12.5s/it]
{'loss': '0.0012', 'grad_norm': '0.48', 'learning_rate': '1e-06', 'num_tokens': '4352.0', \
'completions/mean_length': '104.0', 'reward': '0.5', 'kl': nan, 'step_time': '11.0', \
'epoch': '0.67'}
{'eval_loss': 0.01, 'eval_runtime': 3.25, 'eval_samples_per_second': 9.8, 'epoch': 0.67}
{'loss': 0.0009, 'num_tokens': 6400.0, 'step_time': 13.0, 'epoch': 1.0}
{'train_runtime': 80.1, 'train_samples_per_second': 0.6, 'train_steps_per_second': 0.075, \
'train_loss': 0.0007, 'epoch': 1.0}
"""


def test_trl_console_log_gives_steps_tokens_and_evaluations(tmp_path):
    path = tmp_path / "train.log"
    path.write_text(TRL_CONSOLE)
    assert detect(path).FORMAT == "trl-log"
    imported = trl_log.parse(path)
    spans = imported.frames["spans"]
    steps = spans[spans["phase"] == "step"].sort_values("start_ns")
    assert _durations(steps).tolist() == [12.5, 11.0, 13.0]
    assert [a["tokens"] for a in steps["attrs"]] == [2048.0, 4352.0 - 2048.0, 6400.0 - 4352.0]
    evals = spans[spans["phase"] == "eval"]
    assert _durations(evals).tolist() == [3.25]
    # the evaluation ran between the second and the third log
    assert evals.iloc[0]["start_ns"] == steps.iloc[1]["end_ns"]
    assert imported.meta["framework"] == "trl"
    assert any("no phase times" in n for n in imported.notes)
    assert any("no step numbers" in n for n in imported.notes)


def test_trl_trainer_state_spreads_each_window_over_its_steps(tmp_path):
    state = {
        "global_step": 6,
        "max_steps": 6,
        "logging_steps": 2,
        "log_history": [
            {"step": 2, "loss": 0.0, "num_tokens": 4096.0, "step_time": 12.0, "epoch": 0.33},
            {"step": 4, "loss": 0.0, "num_tokens": 8192.0, "step_time": 10.0, "epoch": 0.67},
            {"step": 4, "eval_loss": 0.02, "eval_runtime": 2.0, "epoch": 0.67},
            {"step": 6, "loss": 0.0, "num_tokens": 12288.0, "step_time": 11.0, "epoch": 1.0},
            {"step": 6, "train_runtime": 70.0, "train_steps_per_second": 0.086, "epoch": 1.0},
        ],
    }
    path = tmp_path / "trainer_state.json"
    path.write_text(json.dumps(state, indent=2))
    assert detect(path).FORMAT == "trl-log"
    spans = trl_log.parse(path).frames["spans"]
    steps = spans[spans["phase"] == "step"].sort_values("start_ns")
    assert steps["step"].tolist() == [1, 2, 3, 4, 5, 6]
    assert _durations(steps).tolist() == [12.0, 12.0, 10.0, 10.0, 11.0, 11.0]
    assert [a["tokens"] for a in steps["attrs"]] == [2048.0] * 6


def test_trl_log_without_step_times_uses_the_mean_and_says_so(tmp_path):
    path = tmp_path / "plain.log"
    path.write_text(
        "{'loss': 0.5, 'learning_rate': 1e-05, 'epoch': 0.5}\n"
        "{'loss': 0.4, 'learning_rate': 1e-05, 'epoch': 1.0}\n"
        "{'train_runtime': 30.0, 'train_samples_per_second': 2.0, "
        "'train_steps_per_second': 0.2, 'train_loss': 0.45, 'epoch': 1.0}\n"
    )
    imported = trl_log.parse(path)
    steps = imported.frames["spans"]
    steps = steps[steps["phase"] == "step"]
    assert _durations(steps).tolist() == [15.0, 15.0]
    assert any("mean" in n for n in imported.notes)


# --------------------------------------------------------------------------------------------
# ms-swift


def _swift_rows() -> list[dict]:
    common = {
        "learning_rate": 1e-06,
        "train_speed(iter/s)": 0.021,
        "completions/mean_length": 512.3,
    }
    return [
        {"loss": 0.01, "grad_norm": 0.3, "memory(GiB)": 31.2, "reward": 0.42, "epoch": 0.25,
         "global_step/max_steps": "5/20", "percentage": "25.00%", "elapsed_time": "3m 58s",
         "remaining_time": "11m 52s", **common},
        {"loss": 0.02, "grad_norm": 0.2, "memory(GiB)": 31.5, "reward": 0.47, "epoch": 0.5,
         "global_step/max_steps": "10/20", "percentage": "50.00%", "elapsed_time": "7m 50s",
         "remaining_time": "7m 50s", **common},
        {"eval_loss": 0.3, "eval_runtime": 20.5, "eval_samples_per_second": 4.9, "epoch": 0.5,
         "global_step/max_steps": "10/20", "percentage": "50.00%", "elapsed_time": "8m 11s",
         "remaining_time": "8m 11s"},
        {"loss": 0.01, "grad_norm": 0.2, "memory(GiB)": 31.5, "reward": 0.5, "epoch": 0.75,
         "global_step/max_steps": "15/20", "percentage": "75.00%", "elapsed_time": "12m 30s",
         "remaining_time": "4m 10s", **common},
        {"train_runtime": 1000.2, "train_samples_per_second": 0.3, "train_steps_per_second": 0.02,
         "total_flos": 0.0, "train_loss": 0.013, "epoch": 1.0, "global_step/max_steps": "20/20",
         "percentage": "100.00%", "elapsed_time": "16m 40s", "remaining_time": "0s"},
        {"last_model_checkpoint": "/out/checkpoint-20", "best_model_checkpoint": None,
         "best_metric": None, "global_step": 20, "log_history": [], "memory": 31.5},
    ]  # fmt: skip


def test_swift_logging_jsonl_steps_from_elapsed_time_and_knobs_from_args(tmp_path):
    path = tmp_path / "logging.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in _swift_rows()) + "\n")
    (tmp_path / "args.json").write_text(
        json.dumps({"vllm_gpu_memory_utilization": 0.5, "sleep_level": 1, "tags": ["a"]})
    )
    assert detect(path).FORMAT == "swift-jsonl"
    imported = swift_log.parse(path)
    assert imported.meta["framework"] == "swift"
    assert imported.meta["knobs"] == {"vllm_gpu_memory_utilization": 0.5, "sleep_level": 1}
    spans = imported.frames["spans"]
    steps = spans[spans["phase"] == "step"].set_index("step").sort_index()
    assert list(steps.index) == list(range(1, 16))
    d = _durations(steps.reset_index())
    assert d[:5].tolist() == pytest.approx([238 / 5] * 5)
    assert d[5:10].tolist() == pytest.approx([(470 - 238) / 5] * 5)
    # the window after the evaluation loses the evaluation's time
    assert d[10:15].tolist() == pytest.approx([(750 - 470 - 20.5) / 5] * 5)
    assert steps.loc[5, "end_ns"] == 238 * 10**9 and steps.loc[15, "end_ns"] == 750 * 10**9
    evals = spans[spans["phase"] == "eval"]
    assert _durations(evals).tolist() == [20.5]
    assert evals.iloc[0]["start_ns"] == 470 * 10**9
    assert steps.loc[1, "attrs"]["memory(GiB)"] == 31.2


def test_swift_console_dicts_read_as_trainer_logs_with_their_step_numbers(tmp_path):
    path = tmp_path / "swift_console.log"
    rows = _swift_rows()[:4]
    path.write_text("Train:  25%|██▌       | 5/20 [03:58<11:52]\n" + "\n".join(map(repr, rows)))
    assert detect(path).FORMAT == "trl-log"
    imported = trl_log.parse(path)
    assert imported.meta["framework"] == "swift"
    steps = imported.frames["spans"]
    steps = steps[steps["phase"] == "step"]
    assert sorted(steps["step"]) == list(range(1, 16))
    assert steps["end_ns"].max() == 750 * 10**9


def test_swift_elapsed_time_formats():
    assert trl_log.elapsed_seconds("34s") == 34
    assert trl_log.elapsed_seconds("1m 39s") == 99
    assert trl_log.elapsed_seconds("2h 0m 1s") == 7201
    assert trl_log.elapsed_seconds("1d 1h 1m 1s") == 90061
    assert trl_log.elapsed_seconds("soon") is None


# --------------------------------------------------------------------------------------------
# OpenRLHF

OPENRLHF_NEW = """\
+ python3 -m openrlhf.cli.train_ppo_ray --ref.num_nodes 1 --actor.num_gpus_per_node 8 \\
   --vllm.num_engines 4 --vllm.gpu_memory_utilization 0.5 --train.colocate_all \\
   --rollout.batch_size 128 --train.dynamic_batch_enable
(PPOTrainer pid=4242) INFO 03-19 10:00:00 ppo_trainer.py:224] Sample: ['question', 1.0]
(PPOTrainer pid=4242) INFO 03-19 10:02:37 ppo_trainer.py:547] ✨ Global step 1: \
{'policy_loss': 0.012, 'actor_lr': 1e-06, 'kl': 0.0, 'timing/make_experience': 18.2, \
'timing/ppo_train': 40.5, 'timing/broadcast': 3.1, 'rollout/reward_mean': 0.31, \
'rollout/response_length_mean': 812.5, 'rollout/num_samples': 512.0, \
'timing/generation': 95.0, 'timing/step_total': 156.8}
Episode [1/1]:   1%|          | 1/100 [02:37<4:19:03, 157.00s/it]
(PPOTrainer pid=4242) INFO 03-19 10:05:20 ppo_trainer.py:547] ✨ Global step 2: \
{'policy_loss': 0.010, 'timing/make_experience': 17.0, 'timing/ppo_train': 41.0, \
'timing/broadcast': 3.0, 'rollout/response_length_mean': 790.0, 'rollout/num_samples': 512.0, \
'timing/generation': 92.0, 'timing/step_total': 153.0}
"""

OPENRLHF_OLD = """\
INFO 05-19 10:00:00 ppo_trainer.py:520] ✨ Global step 1: {'policy_loss': 0.01, \
'reward': 0.3, 'return': 0.2, 'response_length': 700.0, 'total_length': 900.0, 'kl': 0.0}
INFO 05-19 10:02:30 ppo_trainer.py:520] ✨ Global step 2: {'policy_loss': 0.01, \
'reward': 0.3, 'return': 0.2, 'response_length': 710.0, 'total_length': 910.0, 'kl': 0.0}
INFO 05-19 10:05:10 ppo_trainer.py:520] ✨ Global step 3: {'policy_loss': 0.02, \
'reward': 0.4, 'return': 0.3, 'response_length': 720.0, 'total_length': 920.0, 'kl': 0.0}
"""


def test_openrlhf_timing_keys_become_phases_in_step_order(tmp_path):
    path = tmp_path / "openrlhf.log"
    path.write_text(OPENRLHF_NEW, encoding="utf-8")
    assert detect(path).FORMAT == "openrlhf-log"
    imported = openrlhf_log.parse(path)
    assert imported.meta["framework"] == "openrlhf"
    knobs = imported.meta["knobs"]
    from gpuprof.analyzers.knobs import CATALOGUE

    catalogue = {e.knob.lstrip("-") for e in CATALOGUE if e.framework == "openrlhf"}
    assert {"vllm.gpu_memory_utilization", "train.colocate_all"} <= catalogue
    assert knobs["vllm.gpu_memory_utilization"] == 0.5
    assert knobs["train.colocate_all"] is True
    assert knobs["vllm.num_engines"] == 4
    spans = imported.frames["spans"]
    assert set(spans["pid"]) == {4242}
    first = spans[(spans["step"] == 1) & (spans["depth"] == 1)].sort_values("start_ns")
    assert first["name"].tolist() == ["generation", "make_experience", "ppo_train", "broadcast"]
    assert first["phase"].tolist() == ["rollout", "make_experience", "update_actor", "reshard"]
    assert _durations(first).tolist() == [95.0, 18.2, 40.5, 3.1]
    steps = spans[spans["phase"] == "step"].set_index("step")
    assert steps.loc[1, "end_ns"] == 0 and steps.loc[2, "end_ns"] == 163 * 10**9
    assert (steps.loc[2, "end_ns"] - steps.loc[2, "start_ns"]) / 1e9 == 153.0
    assert steps.loc[1, "attrs"]["tokens"] == pytest.approx(812.5 * 512)


def test_openrlhf_old_lines_time_steps_by_their_log_times(tmp_path):
    path = tmp_path / "old.log"
    path.write_text(OPENRLHF_OLD, encoding="utf-8")
    imported = openrlhf_log.parse(path)
    steps = imported.frames["spans"]
    assert (steps["phase"] == "step").all()
    assert steps["step"].tolist() == [2, 3]
    assert _durations(steps).tolist() == [150.0, 160.0]
    assert any("intervals between" in n for n in imported.notes)


# --------------------------------------------------------------------------------------------
# phases, malformed input, fuzzing


def test_framework_names_map_to_canonical_phases():
    assert canonical_phase("gen_max") == "rollout"
    assert canonical_phase("broadcast") == "reshard"
    assert canonical_phase("ppo_train") == "update_actor"
    assert canonical_phase("update_weights") == "reshard"
    assert canonical_phase("testing") == "eval"
    assert canonical_phase("evaluate") == "eval"


@pytest.mark.parametrize(
    ("name", "text", "line"),
    [
        # nothing usable left once the values that make no sense are skipped
        ("bad_value.log", "step:1 - timing_s/gen:fast\n", 1),
        ("negative.log", "step:1 - timing_s/gen:-3.0\nstep:2 - timing_s/gen:nan\n", 1),
        ("bad.jsonl", '{"step": 1, "data": {"timing_s/gen": -1}}\nnot json\n{"step": 2}\n', 1),
        ("bad_swift.jsonl", '{"global_step/max_steps": "1/2",\n[1, 2]\n', 1),
        ("bad_openrlhf.log", "Global step 1: {'timing/generation': 'soon'}\n", 1),
    ],
)  # fmt: skip
def test_malformed_input_names_the_file_and_line(tmp_path, name, text, line):
    path = tmp_path / name
    path.write_text(text)
    module = detect(path)
    with pytest.raises(ImportFormatError) as info:
        module.parse(path)
    message = str(info.value)
    assert message.startswith(f"{path}:{line}: ")
    assert "\n" not in message


def test_files_without_steps_are_refused_with_one_line(tmp_path):
    for module, text in [
        (verl_log, "step:1 - nothing to read here\n"),
        (verl_jsonl, '{"step": 1, "data": {}}\n'),
        (openrlhf_log, "nothing\n"),
        (trl_log, "{'foo': 1}\n"),
    ]:
        path = tmp_path / f"{module.FORMAT}.txt"
        path.write_text(text)
        with pytest.raises(ImportFormatError, match=re.escape(str(path))):
            module.parse(path)


def test_cli_import_of_a_malformed_log_exits_2_with_one_line(tmp_path):
    probe = run_gpuprof("import", "--help")
    if probe.returncode != 0:
        pytest.skip("the import command is not there yet")
    bad = tmp_path / "bad.log"
    bad.write_text("(TaskRunner pid=1) step:1 - timing_s/gen:abc - timing_s/step:-2\n")
    out = tmp_path / "run"
    result = run_gpuprof("import", str(bad), "-o", str(out))
    assert result.returncode == 2
    assert len(result.stderr.strip().splitlines()) == 1
    assert f"{bad}:1:" in result.stderr and "Traceback" not in result.stderr
    assert not out.exists()


SAMPLES = {
    "verl": "(TaskRunner pid=5) step:1 - timing_s/gen:2.5 - timing_s/ref:0.5 - "
    "response_length/mean:10 - timing_s/step:3.5\nstep:2 - timing/gen:1 - timing/adv:0.1\n",
    "verl_jsonl": '{"step": 1, "elapsed_seconds": 5.0, "data": {"timing_s/gen": 2.0, '
    '"timing_s/step": 3.0}}\n{"step": 2, "timing_s/gen": 1.0}\n',
    "trl": TRL_CONSOLE,
    "swift": "\n".join(json.dumps(r) for r in _swift_rows()[:4]) + "\n",
    "openrlhf": OPENRLHF_OLD
    + "INFO 05-19 10:07:00 x.py:1] Global step 4: {'timing/generation': 3.0, "
    "'timing/step_total': 4.0}\n",
}


def _only_import_errors(module, path: Path) -> None:
    try:
        module.sniff(path.read_text(errors="replace")[:65536], path)
        module.parse(path)
    except ImportFormatError as exc:
        assert "\n" not in str(exc)


@settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(text=st.text(max_size=400))
def test_fuzz_arbitrary_text_raises_only_import_errors(tmp_path, text):
    path = tmp_path / "fuzz.txt"
    path.write_text(text, encoding="utf-8", errors="surrogatepass")
    for module in MODULES:
        _only_import_errors(module, path)
    verl_log.spans_from_lines([(i, line) for i, line in enumerate(text.split("\n"))])


_PIECES = ["", ":", " - ", "{", "}", "'", '"', "\n", "nan", "-1", "1e999", "1e300", "step:",
           "timing_s/", "\x1b[2m", "\r", "9" * 30]  # fmt: skip


@st.composite
def _mutated(draw):
    name = draw(st.sampled_from(sorted(SAMPLES)))
    text = SAMPLES[name]
    for _ in range(draw(st.integers(1, 6))):
        i = draw(st.integers(0, len(text)))
        op = draw(st.sampled_from(["delete", "insert", "replace", "cut"]))
        piece = draw(st.sampled_from(_PIECES))
        if op == "delete":
            text = text[:i] + text[i + draw(st.integers(1, 12)) :]
        elif op == "insert":
            text = text[:i] + piece + text[i:]
        elif op == "replace":
            text = text[:i] + piece + text[i + len(piece) :]
        else:
            text = text[:i]
    return text


@settings(
    max_examples=250, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(text=_mutated())
def test_fuzz_mutated_logs_raise_only_import_errors(tmp_path, text):
    path = tmp_path / "mutated.log"
    path.write_text(text, encoding="utf-8", errors="surrogatepass")
    for module in MODULES:
        _only_import_errors(module, path)
    verl_log.spans_from_lines([(i * 10**9, line) for i, line in enumerate(text.split("\n"))])


@pytest.mark.parametrize(
    ("name", "text", "parser", "printed"),
    [
        ("trl.log", "INFO vLLM: Device name: NVIDIA H100 80GB HBM3\n" + TRL_CONSOLE, trl_log,
         "NVIDIA H100 80GB HBM3"),
        ("openrlhf.log", "GPU 0: NVIDIA A100-SXM4-80GB (UUID: GPU-1)\n" + OPENRLHF_NEW,
         openrlhf_log, "NVIDIA A100-SXM4-80GB"),
    ],
)  # fmt: skip
def test_gpu_product_name_printed_in_trl_and_openrlhf_logs_is_kept(
    tmp_path, name, text, parser, printed
):
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    assert parser.parse(path).meta["knobs"]["gpu_name"] == printed
    path.write_text(text.replace(printed, "a GPU"), encoding="utf-8")
    assert "gpu_name" not in parser.parse(path).meta.get("knobs", {})
