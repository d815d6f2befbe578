"""Plain logs of hand-written training loops (`plain_log`): steps and phases from timestamped
messages alone — a repeating cycle of messages, or ``--phase NAME=REGEX`` patterns.

The main case is real: a small GRPO-shaped loop written here logs with Python's `logging` and
sleeps a known time in each phase; its log must import to those steps and those durations.
The rest are hand-written logs of the shapes loops print (evaluation every N steps, time-only
stamps across midnight, the common stamp and logger formats), refusals that say what to do,
the ``--phase`` option through the command line, and a fuzz of cut and garbled lines.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
import time
from pathlib import Path

import numpy as np
import pytest
from conftest import run_gpuprof
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gpuprof import store
from gpuprof.collectors.importers import Imported, ImportFormatError, plain_log, read_head
from gpuprof.importing import parse_file

FIXTURES = Path(__file__).parent / "fixtures_logs"
S = 1_000_000_000

# --------------------------------------------------------------------------------------------
# a real loop, logged with `logging`

LOOP = textwrap.dedent(
    """
    import logging, random, sys, time

    logging.basicConfig(
        filename=sys.argv[1],
        format="%(asctime)s - %(name)s - %(levelname)s - %(message)s",
        level=logging.INFO,
    )
    log = logging.getLogger("grpo")
    log.info("Loading policy and reference models")
    time.sleep(0.05)
    for step in range(1, 7):
        log.info("Generating rollouts for %d prompts x %d samples", 8, 4)
        time.sleep(0.20)
        log.info("Computing rewards")
        time.sleep(0.06)
        log.info("train step %d loss=%.4f kl=%.4f", step, random.random(), random.random())
        time.sleep(0.12)
        if step % 3 == 0:
            log.info("Evaluating on %d held-out prompts", 16)
            time.sleep(0.10)
            log.info("eval reward=%.3f", random.random())
            log.info("Saving checkpoint to ckpt/step_%d", step)
            time.sleep(0.04)
    log.info("Training finished")
    """
)
SLEEPS = {"rollout": 0.20, "reward": 0.06, "update_actor": 0.12}


@pytest.fixture(scope="module")
def loop_log(tmp_path_factory) -> Path:
    """The log of `LOOP`, run once."""
    tmp = tmp_path_factory.mktemp("loop")
    script, log = tmp / "loop.py", tmp / "train.log"
    script.write_text(LOOP)
    subprocess.run([sys.executable, str(script), str(log)], check=True, timeout=60)
    return log


def spans_of(imported: Imported):
    spans = imported.frames["spans"]
    return spans.assign(seconds=(spans["end_ns"] - spans["start_ns"]) / S)


def test_real_loop_gives_its_steps_and_phase_times(loop_log):
    assert plain_log.sniff(read_head(loop_log), loop_log)
    imported = plain_log.parse(loop_log)
    assert imported.format == "plain-log" and imported.anchored
    spans = spans_of(imported)
    steps = spans[spans["phase"] == "step"]
    assert steps["step"].tolist() == [1, 2, 3, 4, 5, 6]
    for phase, slept in SLEEPS.items():
        seconds = spans.loc[spans["phase"] == phase, "seconds"]
        assert len(seconds) == 6
        # a phase lasts from its message to the next: the sleep, plus logging's own time
        assert np.median(seconds) == pytest.approx(slept, abs=0.03), phase
        assert seconds.min() >= slept - 0.002
    # the step is its three phases; evaluation and checkpoint follow the steps they follow
    assert np.median(steps["seconds"]) == pytest.approx(sum(SLEEPS.values()), abs=0.06)
    evals = spans[spans["phase"] == "eval"]
    assert evals["step"].tolist() == [3, 6]
    assert evals["seconds"].to_numpy() == pytest.approx([0.10, 0.10], abs=0.03)
    checkpoints = spans[spans["phase"] == "checkpoint"]
    assert checkpoints["step"].tolist() == [3, 6]
    for step in (3, 6):
        step_end = steps.loc[steps["step"] == step, "end_ns"].item()
        assert evals.loc[evals["step"] == step, "start_ns"].item() == step_end
    note = imported.notes[0]
    assert note.startswith("steps and phases from a repeating cycle of 3 messages")
    assert "→ rollout" in note and "→ reward" in note and "→ update_actor" in note
    assert "6 steps" in note
    assert any("'Evaluating on # held-out prompts' (eval, 2×)" in n for n in imported.notes)


def test_real_loop_times_are_wall_clock(loop_log):
    """Python logging's asctime has no zone: read as this machine's local time, noted."""
    imported = plain_log.parse(loop_log)
    first = int(imported.frames["spans"]["start_ns"].min())
    assert abs(first - time.time_ns()) < 600 * S
    assert any("no time zone" in n for n in imported.notes)


def test_real_loop_through_the_command_line(loop_log, tmp_path):
    out = tmp_path / "run"
    result = run_gpuprof(
        "import", str(loop_log), "-o", str(out),
        "--phase", "rollout=^Generating", "--phase", "reward=^Computing rewards",
        "--phase", "update_actor=^train step", "--phase", "eval=^Evaluating",
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert "steps and phases from --phase patterns: rollout='^Generating'" in result.stderr
    run = store.load_run(out)
    spans = run.spans
    assert sorted(spans.loc[spans["phase"] == "step", "step"].tolist()) == [1, 2, 3, 4, 5, 6]
    assert set(spans["phase"]) == {"step", "rollout", "reward", "update_actor", "eval"}
    rollout = spans.loc[spans["phase"] == "rollout", ["start_ns", "end_ns"]].diff(axis=1)
    assert np.median(rollout["end_ns"] / S) == pytest.approx(0.20, abs=0.03)


# --------------------------------------------------------------------------------------------
# hand-written logs


def write(tmp_path: Path, text: str, name: str = "train.log") -> Path:
    path = tmp_path / name
    path.write_text(textwrap.dedent(text).lstrip("\n"))
    return path


def cycle_log(steps: int, stamp, *, eval_every: int = 0) -> str:
    """A log of ``steps`` steps (rollout 8 s, reward 1 s, update 2 s), ``stamp(seconds)`` the
    text of each line's stamp; an evaluation (3 s) and a checkpoint (1 s) every
    ``eval_every`` steps."""
    lines, t = [f"{stamp(0)} INFO Loading model"], 5
    for step in range(1, steps + 1):
        for message, seconds in (
            (f"[{step}/{steps}] Generating rollouts...", 8),
            ("Computing rewards", 1),
            (f"train step {step} loss=0.{step:02d}", 2),
        ):
            lines.append(f"{stamp(t)} INFO {message}")
            t += seconds
        if eval_every and step % eval_every == 0:
            lines.append(f"{stamp(t)} INFO Evaluating...")
            lines.append(f"{stamp(t + 3)} INFO Saving checkpoint")
            t += 4
    lines.append(f"{stamp(t)} INFO Done")
    return "\n".join(lines) + "\n"


def iso(seconds: float) -> str:
    t = np.datetime64("2025-03-01T12:00:00") + np.timedelta64(int(seconds * 1000), "ms")
    return str(t).replace("T", " ").replace(".", ",") + "+00:00"


def test_eval_and_save_every_n_steps_are_phases_after_their_step(tmp_path):
    log = write(tmp_path, cycle_log(9, iso, eval_every=3))
    imported = plain_log.parse(log)
    spans = spans_of(imported)
    steps = spans[spans["phase"] == "step"]
    assert steps["step"].tolist() == list(range(1, 10))
    assert steps["seconds"].tolist() == [11.0] * 9  # evaluation is not in the step's time
    assert spans.loc[spans["phase"] == "eval", "step"].tolist() == [3, 6, 9]
    assert spans.loc[spans["phase"] == "eval", "seconds"].tolist() == [3.0] * 3
    assert spans.loc[spans["phase"] == "checkpoint", "seconds"].tolist() == [1.0] * 3
    # anchored to the stamps, which carry a zone (UTC): the first phase starts at 12:00:05
    assert int(spans["start_ns"].min()) == int(
        np.datetime64("2025-03-01T12:00:05", "ns").view("i8")
    )
    assert not any("time zone" in n for n in imported.notes)
    # the step numbers come from the messages ([3/9], step 3)
    assert spans.loc[spans["phase"] == "rollout", "name"].iloc[0] == "Generating rollouts"


def test_time_only_stamps_across_midnight(tmp_path):
    def clock(seconds: float) -> str:
        t = (23 * 3600 + 59 * 60 + 40 + seconds) % 86400
        return f"{int(t // 3600):02d}:{int(t % 3600 // 60):02d}:{int(t % 60):02d}"

    log = write(tmp_path, cycle_log(5, clock))
    imported = plain_log.parse(log)
    assert not imported.anchored
    spans = spans_of(imported)
    assert spans.loc[spans["phase"] == "step", "seconds"].tolist() == [11.0] * 5
    assert spans.loc[spans["phase"] == "rollout", "seconds"].tolist() == [8.0] * 5
    assert int(spans["start_ns"].min()) == 5 * S  # from the first stamp (Loading model)
    assert any("midnight" in n for n in imported.notes)


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ("2025-03-01 12:00:01,123 INFO Generating rollouts...", "Generating rollouts..."),
        ("2025-03-01T12:00:01.123Z Generating rollouts", "Generating rollouts"),
        ("[2025-03-01 12:00:01] Generating rollouts", "Generating rollouts"),
        ("2025-03-01 12:00:01,123 - __main__ - INFO - Generating", "Generating"),
        ("2025-03-01 12:00:01,123 INFO:root:Generating", "Generating"),
        ("2025-03-01 12:00:01.123 | INFO     | __main__:main:12 - Generating", "Generating"),
        ("[03/01/25 12:00:01] INFO     Generating rollouts     loop.py:42", "Generating rollouts"),
        ("Sat Mar  1 12:00:01 2025 Generating", "Generating"),
        ("Mar 01 12:00:01 node1 python[123]: Generating", "Generating"),
        ("INFO 03-01 12:00:01 llm_engine.py:123] Generating", "Generating"),
        ("I0301 12:00:01.123456 12345 loop.py:42] Generating", "Generating"),
        ("[12:00:01] Generating", "Generating"),
        ("[rank0]: 2025-03-01 12:00:01,123 [INFO] Generating", "Generating"),
    ],
)
def test_stamp_and_logger_forms(line, message):
    msgs = plain_log.messages_from_lines([(1, None, line)])
    assert msgs.text == [message]


def test_stamps_to_ns():
    stamps = plain_log.read_stamps(
        ["2025-03-01T12:00:01.5+01:00 a", "2025-03-01 11:00:02Z b", "no stamp", "2025-02-29 1:0:0"]
    )
    base = int(np.datetime64("2025-03-01T11:00:01", "ns").view("i8"))
    assert stamps.anchored and stamps.ok.tolist() == [True, True, False, False]
    assert stamps.t_ns[:2].tolist() == [base + S // 2, base + S]


def test_step_numbers_from_messages_else_counted(tmp_path):
    lines = []
    for k, step in enumerate((101, 102, 103, 104)):  # a resumed run
        lines += [
            f"12:00:{10 * k:02d} Iteration {step}: sampling",
            f"12:00:{10 * k + 5:02d} Update",
        ]
    lines.append("12:00:50 bye")
    imported = plain_log.parse(write(tmp_path, "\n".join(lines)))
    spans = imported.frames["spans"]
    assert spans.loc[spans["phase"] == "step", "step"].tolist() == [101, 102, 103, 104]
    unnumbered = [line.replace("Iteration 1", "Sampling batch") for line in lines]
    imported = plain_log.parse(write(tmp_path, "\n".join(unnumbered), "b.log"))
    spans = imported.frames["spans"]
    assert spans.loc[spans["phase"] == "step", "step"].tolist() == [1, 2, 3, 4]


def test_unknown_messages_keep_their_words_as_phase_names(tmp_path):
    lines = []
    for k in range(4):
        lines += [f"12:00:{10 * k:02d} Frobnicating widgets", f"12:00:{10 * k + 4:02d} Polishing"]
    lines.append("12:00:50 the end")
    spans = plain_log.parse(write(tmp_path, "\n".join(lines))).frames["spans"]
    assert set(spans["phase"]) == {"step", "Frobnicating widgets", "Polishing"}


def test_log_cut_inside_a_step_leaves_it_out(tmp_path):
    text = cycle_log(5, iso)
    cut = text[: text.index("train step 5")].rsplit("\n", 1)[0] + "\n"
    imported = plain_log.parse(write(tmp_path, cut))
    spans = imported.frames["spans"]
    assert spans.loc[spans["phase"] == "step", "step"].tolist() == [1, 2, 3, 4]
    assert any("ends inside step 5" in n for n in imported.notes)


def test_no_cycle_is_refused_with_a_hint_to_phase(tmp_path):
    log = write(
        tmp_path,
        """
        2025-03-01 12:00:00 Loading model
        2025-03-01 12:00:05 Generating rollouts
        2025-03-01 12:00:09 Computing rewards
        2025-03-01 12:00:10 Something else
        2025-03-01 12:00:12 Generating rollouts
        2025-03-01 12:00:20 Done
        """,
    )
    assert not plain_log.sniff(read_head(log), log)
    with pytest.raises(ImportFormatError) as info:
        plain_log.parse(log)
    message = str(info.value)
    assert "\n" not in message and message.startswith(str(log))
    assert "--phase NAME=REGEX" in message


def test_no_stamps_is_nothing_to_time(tmp_path):
    log = write(tmp_path, "Generating rollouts\nComputing rewards\ntrain step 1\n" * 5)
    with pytest.raises(ImportFormatError, match=r"no time stamps on its lines.*nothing to time"):
        plain_log.parse(log)
    empty = write(tmp_path, "", "empty.log")
    with pytest.raises(ImportFormatError, match=r"empty: no messages, nothing to time"):
        plain_log.parse(empty)


def test_real_loop_log_without_stamps_is_refused(tmp_path):
    """A real hand-written GRPO loop's log (public, see fixtures_logs/stacks/README.md): a
    cycle of messages per step, but no time stamps — nothing for this reader to time, neither
    as a cycle nor with patterns; never claimed by it (its custom timer is `step_timings`')."""
    log = FIXTURES / "stacks" / "verlB_widgetanchor_grpo_log_custom_timer_no_timestamps.txt"
    assert not plain_log.sniff(read_head(log), log)
    with pytest.raises(ImportFormatError, match="no time stamps on its lines"):
        plain_log.parse(log)
    with pytest.raises(ImportFormatError, match="no time stamps on its lines"):
        plain_log.parse(log, phases={"rollout": "generating", "reward": "^Rewards"})


@pytest.mark.parametrize(
    "text",
    [
        # nvidia-smi CSV: stamped rows, two GPUs alternating
        "timestamp, index, name, utilization.gpu [%]\n"
        + "".join(
            f"2024/05/01 12:00:{t:02d}.000, {g}, NVIDIA {n}, {u} %\n"
            for t in range(30)
            for g, n, u in ((0, "A100", 90), (1, "H100", 5))
        ),
        # JSON lines with times
        "".join(
            f'{{"time": "2025-03-01 12:00:{t:02d}", "msg": "Generating rollouts"}}\n'
            for t in range(30)
        ),
        # verl step lines (no stamps)
        "".join(f"step:{s} - timing_s/gen:1.0 - timing_s/update_actor:2.0\n" for s in range(10)),
        # a worker's warning at each start: it repeats, but it is no step
        "".join(
            f"2025-11-26T16:26:{t:02d}.76Z /usr/lib/torch/cuda/__init__.py:63: FutureWarning: x\n"
            f"2025-11-26T16:26:{t:02d}.77Z   import pynvml  # type: ignore[import]\n"
            for t in range(0, 40, 5)
        ),
    ],
)
def test_sniff_leaves_other_formats_alone(tmp_path, text):
    log = write(tmp_path, text)
    assert not plain_log.sniff(read_head(log), log)


# --------------------------------------------------------------------------------------------
# --phase patterns


def test_patterns_name_the_phases_and_the_first_starts_steps(tmp_path):
    log = write(tmp_path, cycle_log(4, iso, eval_every=2))
    imported = plain_log.parse(
        log, phases={"gen": "Generating", "update_actor": "^train", "eval": "^Evaluating"}
    )
    spans = spans_of(imported)
    assert spans.loc[spans["phase"] == "step", "step"].tolist() == [1, 2, 3, 4]
    gen = spans[spans["name"] == "gen"]
    assert set(gen["phase"]) == {"rollout"} and gen["seconds"].tolist() == [9.0] * 4
    assert spans.loc[spans["phase"] == "update_actor", "seconds"].tolist() == [2.0] * 4
    # an evaluation ending a step is laid out after it (the checkpoint line matches nothing)
    assert spans.loc[spans["phase"] == "eval", "seconds"].tolist() == [4.0, 4.0]
    assert spans.loc[spans["phase"] == "step", "seconds"].tolist() == [11.0] * 4
    assert imported.notes[0].startswith(
        "steps and phases from --phase patterns: gen='Generating', update_actor='^train', "
        "eval='^Evaluating'"
    )


def test_patterns_that_match_nothing_say_so(tmp_path):
    log = write(tmp_path, cycle_log(3, iso))
    with pytest.raises(
        ImportFormatError, match=r"no timestamped message matches --phase x='\^Nope'"
    ):
        plain_log.parse(log, phases={"x": "^Nope", "y": "train"})


@pytest.mark.parametrize(
    ("specs", "expected"),
    [
        (["rollout=("], "--phase rollout=(: bad regular expression"),
        (["rollout"], "--phase rollout: expected NAME=REGEX"),
        (["=^Gen"], "no phase name before '='"),
        (["rollout="], "no regular expression after '='"),
        (["step=^Step"], "'step' is the whole step"),
        (["a=x", "a=y"], "--phase a: given twice"),
    ],
)
def test_phase_options_refuse_bad_specs(specs, expected):
    with pytest.raises(ImportFormatError, match=expected.replace("(", r"\(").replace("^", r"\^")):
        plain_log.phase_options(specs)


def test_phase_options_keep_order_and_regexes():
    assert plain_log.phase_options(["rollout=^Gen=x", "reward=(?i)reward"]) == {
        "rollout": "^Gen=x",
        "reward": "(?i)reward",
    }


@pytest.mark.parametrize(
    "spec", ["rollout=(", "rollout", "step=x"], ids=["bad-regex", "no-equals", "step"]
)
def test_bad_phase_option_is_one_line_and_exit_2(tmp_path, spec):
    log = write(tmp_path, cycle_log(3, iso))
    out = tmp_path / "out"
    result = run_gpuprof("import", str(log), "-o", str(out), "--phase", spec)
    assert result.returncode == 2, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("gpuprof: error: --phase")
    assert "Traceback" not in result.stderr
    assert not out.exists()


def test_no_cycle_through_the_command_line_is_one_line(tmp_path):
    log = write(tmp_path, "2025-03-01 12:00:00 hello\n2025-03-01 12:00:01 world\n")
    out = tmp_path / "out"
    result = run_gpuprof("import", str(log), "-o", str(out), "--phase", "rollout=^Gen")
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "no timestamped message matches --phase rollout" in lines[0]
    assert not out.exists()


def test_patterns_read_a_log_another_format_would_claim(tmp_path):
    """With --phase a framework's console log is read by the patterns; a GPU log beside it is
    still read as one."""
    lines = []
    for step in range(1, 5):
        t = 10 * step
        lines += [
            f"2025-03-01 12:00:{t:02d}Z generating",
            f"2025-03-01 12:00:{t + 6:02d}Z step:{step} - timing_s/gen:6.0 - timing_s/step:6.0",
        ]
    lines.append("2025-03-01 12:00:55Z end")
    log = write(tmp_path, "\n".join(lines))
    assert parse_file(log).format == "verl-log"
    part = parse_file(log, phases={"rollout": "generating", "update_actor": "step:"})
    assert part.format == "plain-log"
    spans = spans_of(part)
    assert spans.loc[spans["phase"] == "rollout", "seconds"].tolist() == [6.0] * 4
    smi = write(
        tmp_path,
        "timestamp, index, utilization.gpu [%]\n"
        + "".join(f"2025/03/01 12:00:{t:02d}.000, 0, 50 %\n" for t in range(60)),
        "smi.csv",
    )
    assert parse_file(smi, phases={"rollout": "generating"}).format == "nvidia-smi-csv"


def test_records_from_watched_lines():
    """A watched run's lines carry their arrival time; a line without one is placed by a
    wall-clock stamp in its text, else continues the message before it."""
    t0 = 1_740_830_400 * S  # 2025-03-01 12:00:00 UTC
    lines: list[tuple[int | None, str]] = []
    t = t0
    for step in range(1, 5):
        for message, seconds in (("Generating rollouts", 3), ("Computing rewards", 1)):
            lines.append((t, message))
            t += seconds * S
        lines.append((None, f"train step {step}"))  # no arrival time, no stamp
        lines.append((None, f"2025-03-01 12:00:{(t - t0) // S:02d}Z optimizer update"))
        t += 2 * S
    lines.append((t, "Training finished"))
    notes: list[str] = []
    records = plain_log.records_from_messages(lines, None, notes)
    assert [r.step for r in records] == [1, 2, 3, 4]
    assert [r.phases for r in records] == [
        [("Generating rollouts", 3.0), ("Computing rewards", 1.0), ("optimizer update", 2.0)]
    ] * 4
    assert records[0].end_ns == t0 + 6 * S
    assert "repeating cycle of 3 messages" in notes[0]
    assert any("4 lines without a time stamp" in n for n in notes)
    empty: list[str] = []
    assert plain_log.records_from_messages([(t0, "hello")], None, empty) == []
    assert "--phase NAME=REGEX" in empty[-1]
    patterned: list[str] = []
    records = plain_log.records_from_messages(lines, {"rollout": "^Gen"}, patterned)
    assert records[0].phases == [("rollout", 6.0)]


# --------------------------------------------------------------------------------------------
# robustness


def test_a_hundred_thousand_lines_read_quickly(tmp_path):
    lines = []
    t = np.datetime64("2025-03-01T23:00:00", "ms")
    for step in range(1, 10_001):
        for message, ms in (("Generating rollouts", 800), ("Computing rewards", 100),
                            (f"train step {step} loss=0.5", 200)):  # fmt: skip
            stamp = str(t).replace("T", " ").replace(".", ",")
            lines.append(f"{stamp} - grpo - INFO - {message}")
            lines += [f"{stamp} - grpo - DEBUG - micro batch {k} done" for k in range(2)]
            t += np.timedelta64(ms, "ms")
    lines.append(f"{str(t).replace('T', ' ').replace('.', ',')} - grpo - INFO - Done")
    log = write(tmp_path, "\n".join(lines) + "\n")
    started = time.perf_counter()
    imported = plain_log.parse(log)
    elapsed = time.perf_counter() - started
    spans = spans_of(imported)
    assert (spans["phase"] == "step").sum() == 10_000
    assert spans.loc[spans["phase"] == "reward", "seconds"].unique().tolist() == [0.1]
    assert elapsed < 30, f"{elapsed:.1f} s for {len(lines)} lines"


_BASE = cycle_log(6, iso, eval_every=2).splitlines()


@st.composite
def mangled(draw) -> str:
    """The base log with lines cut, dropped, doubled, swapped or replaced by garbage."""
    lines = list(_BASE)
    for _ in range(draw(st.integers(1, 8))):
        i = draw(st.integers(0, len(lines) - 1))
        action = draw(st.sampled_from(["cut", "drop", "double", "swap", "garbage", "stamp"]))
        if action == "cut":
            lines[i] = lines[i][: draw(st.integers(0, len(lines[i])))]
        elif action == "drop" and len(lines) > 1:
            del lines[i]
        elif action == "double":
            lines.insert(i, lines[i])
        elif action == "swap":
            j = draw(st.integers(0, len(lines) - 1))
            lines[i], lines[j] = lines[j], lines[i]
        elif action == "garbage":
            lines[i] = draw(st.text(max_size=60))
        else:
            lines[i] = draw(st.sampled_from(["2025-13-45 99:99:99 x", "99:61:00 y", "[", "]\x00"]))
    return "\n".join(lines)


@settings(
    max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(text=mangled())
def test_mangled_logs_import_or_refuse_in_one_line(tmp_path, text):
    log = tmp_path / "mangled.log"
    log.write_text(text, encoding="utf-8", errors="surrogateescape")
    plain_log.sniff(read_head(log), log)
    for phases in (None, {"rollout": "Generating", "update_actor": "train"}):
        try:
            imported = plain_log.parse(log, phases=phases)
        except ImportFormatError as exc:
            assert "\n" not in str(exc)
            continue
        spans = imported.frames["spans"]
        assert (spans["end_ns"] >= spans["start_ns"]).all()


@settings(max_examples=100, deadline=None)
@given(
    lines=st.lists(
        st.tuples(st.one_of(st.none(), st.integers(0, 2**62)), st.text(max_size=40)), max_size=40
    )
)
def test_watched_lines_never_raise(lines):
    notes: list[str] = []
    records = plain_log.records_from_messages(lines, None, notes)
    assert all(r.end_ns is not None for r in records)
