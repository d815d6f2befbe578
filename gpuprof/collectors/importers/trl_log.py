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

import json
import re
from pathlib import Path
from typing import Any

from gpuprof.collectors.importers import Imported, ImportFormatError, open_text
from gpuprof.collectors.importers.steplog import (
    MAX_STEP,
    StepRecord,
    console_lines,
    frames_from_steps,
    keep_gpu_name,
    literal_dict,
    seconds_at,
    to_float,
)

FORMAT = "trl-log"

_DICT_AT = re.compile(r"\{\s*'[^']+'\s*:")
_ELAPSED_PART = re.compile(r"(\d+(?:\.\d+)?)\s*([dhms])")
_UNIT_S = {"d": 86400, "h": 3600, "m": 60, "s": 1}
MAX_WINDOW = 100_000
"""Most optimizer steps one log entry may stand for (``logging_steps`` is far smaller)."""
_FINAL_KEYS = ("log_history", "last_model_checkpoint", "best_model_checkpoint")


def sniff(head: str, path: Path) -> bool:
    """Python dict reprs with Trainer keys (``'loss'``, ``'train_runtime'``, ``'epoch'``…),
    or a JSON object with ``log_history`` (``trainer_state.json``)."""
    stripped = head.lstrip()
    if stripped.startswith("{") and '"log_history"' in head:
        return True
    return bool(
        re.search(r"\{\s*'(?:loss|train_runtime|eval_loss|reward|learning_rate)'\s*:", head)
        and re.search(r"'(?:epoch|train_runtime|global_step/max_steps)'\s*:", head)
    )


def parse(path: Path) -> Imported:
    """Steps (and evaluations) of a Trainer console log or ``trainer_state.json``."""
    text = open_text(path)
    if text.lstrip().startswith("{") and '"log_history"' in text:
        entries, extra_notes = _state_entries(text, path)
        framework = "trl"
    else:
        entries = _console_entries(text, path)
        extra_notes = []
        framework = "swift" if any("global_step/max_steps" in e for _, e in entries) else "trl"
    imported = entries_to_imported(entries, path, FORMAT, framework)
    imported.notes[:0] = extra_notes
    keep_gpu_name(imported.meta, text)
    return imported


def _console_entries(text: str, path: Path) -> list[tuple[int, dict[str, Any]]]:
    entries = []
    for number, line, _ in console_lines(text):
        match = _DICT_AT.search(line)
        if match is None:
            continue
        body = line[match.start() :].strip()
        end = body.rfind("}")
        entry = literal_dict(body[: end + 1]) if end > 0 else None
        if entry is None:
            raise ImportFormatError(f"{path}:{number}: unreadable log dict")
        entries.append((number, entry))
    return entries


def _state_entries(text: str, path: Path) -> tuple[list[tuple[int, dict[str, Any]]], list[str]]:
    try:
        state = json.loads(text)
    except (ValueError, RecursionError) as exc:
        line = getattr(exc, "lineno", None)
        raise ImportFormatError(f"{path}:{line or 1}: not valid JSON") from None
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
    entries: list[tuple[int | None, dict[str, Any]]], path: Path, fmt: str, framework: str
) -> Imported:
    """Step records from Trainer log dicts, in logging order.

    A training dict closes a window of optimizer steps (its step minus the previous one, or one
    step when no step number is known); every step of the window lasts ``step_time`` when the
    dict gives it, else the window's ``elapsed_time`` span less any evaluation inside it, over
    its steps. ``elapsed_time`` (seconds since training began) places each window's end; without
    it, steps follow one another from 0. Evaluations become ``eval`` spans of ``eval_runtime``.
    """
    notes: list[str] = []
    train = [(n, e) for n, e in entries if _kind(e) == "train"]
    summary = next((e for _, e in entries if _kind(e) == "summary"), None)
    if not train and summary is None:
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
    for index, (number, entry) in enumerate(entries):
        where = f"{path}:{number}" if number is not None else f"{path}: log entry {index + 1}"
        kind = _kind(entry)
        if kind == "eval":
            runtime = seconds_at(entry.get("eval_runtime"), where, "eval_runtime")
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
            raise ImportFormatError(f"{where}: step jumps from {prev_step} to {step}")
        elapsed = elapsed_seconds(entry.get("elapsed_time"))
        if elapsed is not None:
            elapsed = seconds_at(elapsed, where, "elapsed_time")
        eval_s = sum(s for _, s in pending_eval)
        step_time = seconds_at(entry.get("step_time"), where, "step_time")
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
    if not timed:
        records = _mean_steps(summary, prev_step, notes, f"{path}: final log entry")
    notes.append(
        "Trainer logs carry no phase times (TRL's profiling timings go to W&B/MLflow only): "
        "steps only"
    )
    if summary is not None:
        runtime = to_float(summary.get("train_runtime"))
        if runtime is not None:
            notes.append(f"train_runtime = {runtime:g} s")
    imported = Imported(
        source=path, format=fmt, meta={"framework": framework}, anchored=False, notes=notes
    )
    imported.frames = frames_from_steps(records, framework=framework)
    return imported


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


def _attrs(entry: dict[str, Any], window: int) -> dict[str, Any]:
    attrs: dict[str, Any] = {"log_window_steps": window}
    for key in ("completions/mean_length", "completions/max_length", "memory(GiB)", "reward"):
        number = to_float(entry.get(key))
        if number is not None:
            attrs[key] = number
    return attrs


def _mean_steps(
    summary: dict[str, Any] | None, steps: int, notes: list[str], where: str
) -> list[StepRecord]:
    """Steps of the mean duration when only the final ``train_runtime`` times the run."""
    runtime = seconds_at(summary.get("train_runtime"), where, "train_runtime") if summary else None
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
