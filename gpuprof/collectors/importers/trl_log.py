"""TRL / transformers training logs: the log dicts a ``Trainer`` prints, and
``trainer_state.json``.

Every ``logging_steps`` optimizer steps a transformers ``Trainer`` (and TRL's trainers built on
it) prints the averaged metrics as a Python dict repr — ``{'loss': 0.01, 'grad_norm': 0.3,
'num_tokens': 51200.0, 'completions/mean_length': 87.5, 'rewards/acc/mean': 0.4, 'epoch':
0.1}`` — float or string values (a ``tqdm`` progress bar may share the line), an
``{'eval_loss': …, 'eval_runtime': 12.3, …}`` dict after each evaluation and a final
``{'train_runtime': 812.4, 'train_steps_per_second': 0.12, …}``. ``trainer_state.json``
(in every checkpoint directory) holds the same dicts under ``log_history``, each with its
``step``.

What such a log can give, and what it can't: TRL times its phases (generation, reward,
weight sync) with ``profiling_context``, but those figures go to W&B / MLflow / Trackio only, never
to these dicts — so **no phase times**. Step times exist when the dicts carry them: GRPO/RLOO's
``step_time`` (seconds per optimizer step, averaged over the logging window; TRL ≥ 0.26) or
ms-swift's ``elapsed_time`` (see `swift_log`); otherwise, when the final dict gives
``train_runtime`` and the step count is known, each step is given the mean step time (said in
the notes). ``num_tokens`` (tokens seen so far) gives tokens per step. A console log names no
step numbers: without ms-swift's ``global_step/max_steps`` each dict is taken as one step.
"""

from __future__ import annotations

import bisect
import json
import re
from pathlib import Path
from typing import Any

from gpuprof.collectors.importers import Imported, ImportFormatError, open_text
from gpuprof.collectors.importers.steplog import (
    DS_PHASES,
    MAX_STEP,
    Skipped,
    StepRecord,
    attach_timers,
    console_lines,
    deepspeed_timers,
    duration_s,
    frames_from_steps,
    keep_gpu_name,
    literal_dict,
    progress_updates,
    refusal,
    steps_from_progress,
    to_float,
)

FORMAT = "trl-log"
LATE = True
"""Step lines may start after thousands of lines of start-up chatter: `detect` streams the
whole file through `sniff`."""

_DICT_AT = re.compile(r"\{\s*'[^']+'\s*:")
_ELAPSED_PART = re.compile(r"(\d+(?:\.\d+)?)\s*([dhms])")
_UNIT_S = {"d": 86400, "h": 3600, "m": 60, "s": 1}
MAX_WINDOW = 100_000
"""Most optimizer steps one log entry may stand for (``logging_steps`` is far smaller)."""
_FINAL_KEYS = ("log_history", "last_model_checkpoint", "best_model_checkpoint")


def sniff(head: str, path: Path) -> bool:
    """Log dicts with Trainer keys (``'loss'``, ``'train_runtime'``, ``'epoch'``…; Python
    reprs or JSON, whole or a fragment of a ``log_history`` list), TRL PPO's
    (``'objective/kl'``, ``'episode'``), or a JSON object with ``log_history``
    (``trainer_state.json``)."""
    stripped = head.lstrip()
    if stripped.startswith("{") and '"log_history"' in head:
        return True
    return bool(
        re.search(
            r"\{\s*(['\"])(?:loss|train_runtime|eval_loss|reward|learning_rate|eps|"
            r"objective/\w+)\1\s*:",
            head,
        )
        and re.search(r"(['\"])(?:epoch|train_runtime|global_step/max_steps|episode)\1\s*:", head)
    )


def parse(path: Path) -> Imported:
    """Steps (and evaluations) of a Trainer console log or ``trainer_state.json``."""
    text = open_text(path)
    skipped = Skipped()
    extra_notes: list[str] = []
    entries: list[tuple[int | None, dict[str, Any]]] | None = None
    if text.lstrip().startswith("{") and '"log_history"' in text:
        entries, extra_notes = _state_entries(text, path)
    if entries is None:
        entries = _console_entries(text, skipped)
    framework = "swift" if any("global_step/max_steps" in e for _, e in entries) else "trl"
    lines = console_lines(text)
    progress = steps_from_progress(progress_updates(lines), extra_notes)
    timers = deepspeed_timers(lines, skipped)
    if not entries and not progress:
        raise ImportFormatError(refusal(path, skipped, "no readable Trainer log entries"))
    imported = entries_to_imported(entries, path, FORMAT, framework, progress=progress)
    if timers:
        timed_records = imported.meta.pop("_records")
        attach_timers(timed_records, timers, imported.notes)
        imported.frames = frames_from_steps(timed_records, framework=framework, phase_map=DS_PHASES)
    imported.meta.pop("_records", None)
    imported.notes[:0] = extra_notes
    imported.notes.extend(skipped.notes())
    keep_gpu_name(imported.meta, text)
    return imported


def _console_entries(text: str, skipped: Skipped) -> list[tuple[int, dict[str, Any]]]:
    """Log dicts of a console log: Python reprs one per line, or JSON objects (a pasted
    ``log_history`` fragment, wrapped anywhere — even inside a number). A dict cut short or
    unreadable is skipped and counted."""
    entries = []
    for number, line, _ in console_lines(text):
        match = _DICT_AT.search(line)
        if match is None:
            continue
        body = line[match.start() :].strip()
        end = body.rfind("}")
        entry = literal_dict(body[: end + 1]) if end > 0 else None
        if entry is None:
            skipped.add("line", "log dict cut short or unreadable", f"line {number}", number)
            continue
        entries.append((number, entry))
    if entries:
        return entries
    return _json_entries(text, skipped)


_JSON_AT = re.compile(r'\{\s*"')


def _json_entries(text: str, skipped: Skipped) -> list[tuple[int, dict[str, Any]]]:
    """JSON log dicts anywhere in ``text``: lines joined without their breaks (JSON needs no
    line breaks, and a paste may break a number in two), each ``{"…`` decoded where it can
    be; a record cut at either end of the paste is skipped and counted."""
    starts = [0]
    for line in text.split("\n"):
        starts.append(starts[-1] + len(line.rstrip("\r")))
    joined = "".join(line.rstrip("\r") for line in text.split("\n"))
    decoder = json.JSONDecoder()
    entries = []
    position = 0
    head = joined.find("{")
    if head > 0 and re.search(r'"\s*:\s*\S', joined[:head]):  # the tail of a JSON record
        skipped.add("record", "cut at the start of the paste", f"{joined[:30]!r}…")
    while True:
        match = _JSON_AT.search(joined, position)
        if match is None:
            break
        number = bisect.bisect_right(starts, match.start())
        try:
            obj, end = decoder.raw_decode(joined, match.start())
        except (ValueError, RecursionError):
            skipped.add("record", "JSON log dict cut short or unreadable", f"line {number}", number)
            position = match.end()
            continue
        if isinstance(obj, dict):
            entries.append((number, {str(k): v for k, v in obj.items()}))
        position = end
    return entries


def _state_entries(
    text: str, path: Path
) -> tuple[list[tuple[int | None, dict[str, Any]]] | None, list[str]]:
    """``log_history`` of a ``trainer_state.json``; (None, []) when the file is no valid JSON
    (a copy cut short): its entries are then read one by one (`_json_entries`)."""
    try:
        state = json.loads(text)
    except (ValueError, RecursionError):
        return None, []
    history = state.get("log_history") if isinstance(state, dict) else None
    if not isinstance(history, list):
        raise ImportFormatError(f"{path}: 'log_history' is not a list")
    if not all(isinstance(e, dict) for e in history):
        raise ImportFormatError(f"{path}: a 'log_history' entry is not an object")
    notes = []
    if isinstance(state.get("logging_steps"), int):
        notes.append(f"logging_steps = {state['logging_steps']}")
    return [(None, e) for e in history], notes


def elapsed_seconds(value: Any) -> float | None:
    """ms-swift's ``elapsed_time`` (``'1h 2m 3s'``, ``'34s'``) in seconds; None if unreadable."""
    if isinstance(value, int | float) and not isinstance(value, bool):
        return to_float(value)
    if not isinstance(value, str):
        return None
    parts = _ELAPSED_PART.findall(value)
    if not parts or _ELAPSED_PART.sub("", value).strip():
        return None
    return sum(float(n) * _UNIT_S[unit] for n, unit in parts)


def _step_of(entry: dict[str, Any]) -> int | None:
    step = to_float(entry.get("step"))
    if step is None:
        text = entry.get("global_step/max_steps")
        if isinstance(text, str) and "/" in text:
            step = to_float(text.split("/", 1)[0])
    ok = step is not None and step == int(step) and 0 <= step <= MAX_STEP
    return int(step) if ok else None


def entries_to_imported(
    entries: list[tuple[int | None, dict[str, Any]]],
    path: Path,
    fmt: str,
    framework: str,
    progress: list[StepRecord] | None = None,
) -> Imported:
    """Step records from Trainer log dicts, in logging order.

    A training dict closes a window of optimizer steps (its step minus the previous one, or one
    step when no step number is known); every step of the window lasts ``step_time`` when the
    dict gives it, else the window's ``elapsed_time`` span less any evaluation inside it, over
    its steps. ``elapsed_time`` (seconds since training began) places each window's end; without
    it, ms-swift's ``train_speed`` (a running average since the start: elapsed = step / speed)
    stands in; without either, steps follow one another from 0. Evaluations become ``eval``
    spans of ``eval_runtime``. When no dict times its steps, ``progress`` (step records from a
    tqdm bar) does; with nothing at all, each entry is an untimed step with its figures.
    Values that are no duration are skipped and counted. ``meta["_records"]`` holds the step
    records for a caller that adds phases.
    """
    notes: list[str] = []
    skipped = Skipped()
    train = [(n, e) for n, e in entries if _kind(e) == "train"]
    summary = next((e for _, e in entries if _kind(e) == "summary"), None)
    if not train and summary is None and not progress:
        raise ImportFormatError(f"{path}: no training log entries")
    records: list[StepRecord] = []
    prev_step = 0
    prev_elapsed = 0.0
    prev_tokens = 0.0
    pending_eval: list[tuple[int | None, float]] = []
    numbered = all(_step_of(e) is not None for _, e in train)
    if train and not numbered:
        notes.append("the log names no step numbers: each log entry is taken as one step")
    timed = False
    speed_elapsed = False
    first_window = 0
    untimed: list[StepRecord] = []
    for index, (number, entry) in enumerate(entries):
        where = f"{path}:{number}" if number is not None else f"{path}: log entry {index + 1}"
        kind = _kind(entry)
        if kind == "eval":
            runtime = _seconds(entry, "eval_runtime", where, number, skipped)
            if runtime is not None:
                pending_eval.append((number, runtime))
            continue
        if kind != "train":
            continue
        step = _step_of(entry) if numbered else prev_step + 1
        if step is None or step <= prev_step:
            notes.append(f"entry {index + 1}: step {step} does not follow {prev_step}: skipped")
            continue
        n = step - prev_step
        if n > MAX_WINDOW:
            skipped.add("record", "step number jumps too far", f"{where}: step {step}", number)
            continue
        if prev_step == 0 and n > 1 and numbered and len(train) > 1:
            first_window = n
        elapsed = elapsed_seconds(entry.get("elapsed_time"))
        if elapsed is not None:
            elapsed = duration_s(elapsed, "elapsed_time", where, skipped, number)
        if elapsed is None:
            elapsed = _elapsed_from_speed(entry, step, where, number, skipped)
            speed_elapsed = speed_elapsed or elapsed is not None
        eval_s = sum(s for _, s in pending_eval)
        step_time = _seconds(entry, "step_time", where, number, skipped)
        per_step = None
        if step_time is not None:
            per_step = step_time
        elif elapsed is not None and elapsed >= prev_elapsed:
            per_step = max(0.0, elapsed - prev_elapsed - eval_s) / n
        tokens_seen = to_float(entry.get("num_tokens"))
        tokens = None
        if tokens_seen is not None and tokens_seen >= prev_tokens:
            tokens = (tokens_seen - prev_tokens) / n
            prev_tokens = tokens_seen
        for eval_line, seconds in pending_eval:
            end = round(prev_elapsed * 1e9) + round(seconds * 1e9) if elapsed is not None else None
            records.append(
                StepRecord(step=prev_step, phases=[("evaluate", seconds)], end_ns=end,
                           line=eval_line, whole_step=False)
            )  # fmt: skip
        pending_eval = []
        if per_step is None:
            untimed.append(StepRecord(step=step, line=number, tokens=tokens,
                                      attrs=_attrs(entry, n, every=True)))  # fmt: skip
        if per_step is not None:
            timed = True
            for k in range(n):
                end_ns = None
                if elapsed is not None:
                    end_ns = round((elapsed - (n - 1 - k) * per_step) * 1e9)
                record = StepRecord(
                    step=prev_step + k + 1, step_s=per_step, tokens=tokens, end_ns=end_ns,
                    line=number, attrs=_attrs(entry, n),
                )  # fmt: skip
                records.append(record)
        prev_step = step
        if elapsed is not None:
            prev_elapsed = elapsed
    if not timed and progress:
        records = progress
    elif not timed:
        records = _mean_steps(summary, prev_step, notes, "final log entry", skipped)
        if not records:
            records = untimed
            if untimed:
                notes.append(f"{len(untimed)} log entries imported as untimed steps")
    if first_window and first_window > 2 * max(1, prev_step - first_window) / max(
        1, len(train) - 1
    ):
        notes.append(
            f"the first entry (step {first_window}) stands for steps 1-{first_window}: they get "
            "the mean step time since training began (the log starts mid-run)"
        )
    if speed_elapsed:
        notes.append(_SPEED_NOTE)
    elif any("train_speed(iter/s)" in e or "train_speed(s/it)" in e for _, e in train):
        notes.append(
            "train_speed is ms-swift's running average since training began, not a per-step "
            "figure: step times come from elapsed_time differences"
        )
    notes.append(
        "Trainer logs carry no phase times (TRL's profiling timings go to W&B/MLflow only): "
        "steps only"
    )
    notes.extend(skipped.notes())
    if summary is not None:
        runtime = to_float(summary.get("train_runtime"))
        if runtime is not None:
            notes.append(f"train_runtime = {runtime:g} s")
    imported = Imported(
        source=path, format=fmt, meta={"framework": framework}, anchored=False, notes=notes
    )
    imported.frames = frames_from_steps(records, framework=framework)
    imported.meta["_records"] = records
    return imported


_SPEED_NOTE = (
    "no elapsed_time: elapsed time estimated from ms-swift's train_speed, a running average "
    "since training began (elapsed = step / speed), so each window's steps get its mean"
)


def _seconds(
    entry: dict[str, Any], key: str, where: str, line: int | None, skipped: Skipped
) -> float | None:
    """``entry[key]`` as seconds when present; None (counted when it makes no sense)."""
    if key not in entry:
        return None
    return duration_s(entry[key], key, where, skipped, line)


def _elapsed_from_speed(
    entry: dict[str, Any], step: int, where: str, line: int | None, skipped: Skipped
) -> float | None:
    """Seconds since training began from ms-swift's running ``train_speed`` (iterations per
    second, or seconds per iteration from 3.12), which averages over all steps so far."""
    speed = to_float(entry.get("train_speed(iter/s)"))
    if speed is not None:
        return duration_s(step / speed if speed > 0 else -1.0, "train_speed(iter/s)", where,
                          skipped, line)  # fmt: skip
    per_it = to_float(entry.get("train_speed(s/it)"))
    if per_it is not None:
        return duration_s(step * per_it, "train_speed(s/it)", where, skipped, line)
    return None


def _kind(entry: dict[str, Any]) -> str:
    if any(k in entry for k in _FINAL_KEYS):
        return "final"
    if "train_runtime" in entry:
        return "summary"
    if any(str(k).startswith("eval_") for k in entry):
        return "eval"
    if "loss" in entry or "epoch" in entry or "global_step/max_steps" in entry:
        return "train"
    return "other"


def _attrs(entry: dict[str, Any], window: int, every: bool = False) -> dict[str, Any]:
    """Figures kept on a step: lengths, memory and reward, or with ``every`` all numeric ones
    (an untimed step has nothing else to give)."""
    attrs: dict[str, Any] = {"log_window_steps": window}
    keys = list(entry) if every else list(_KEPT)
    for key in keys[:200]:
        number = to_float(entry.get(key))
        if number is not None:
            attrs[str(key)] = number
    return attrs


_KEPT = ("completions/mean_length", "completions/max_length", "memory(GiB)", "reward")


def _mean_steps(
    summary: dict[str, Any] | None, steps: int, notes: list[str], where: str, skipped: Skipped
) -> list[StepRecord]:
    """Steps of the mean duration when only the final ``train_runtime`` times the run."""
    runtime = _seconds(summary, "train_runtime", where, None, skipped) if summary else None
    per_s = to_float(summary.get("train_steps_per_second")) if summary else None
    if runtime is not None and runtime > 0 and not steps and per_s:
        steps = round(min(runtime * per_s, MAX_WINDOW + 1.0))
    if runtime is None or runtime <= 0 or steps <= 0 or steps > MAX_WINDOW:
        notes.append("no step times in the log (no step_time, elapsed_time or train_runtime)")
        return []
    notes.append(
        f"no per-step times: each of the {steps} steps is given the mean "
        f"train_runtime / steps = {runtime / steps:.3g} s"
    )
    return [
        StepRecord(step=k + 1, step_s=runtime / steps, attrs={"duration": "mean"})
        for k in range(steps)
    ]
