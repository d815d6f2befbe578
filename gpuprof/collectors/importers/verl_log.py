"""verl console logs: per-step phase times from ``step:N - timing_s/gen:74.0 - …`` lines.

verl's console logger prints one line per training step, ``step:K - key:value - key:value…``,
with the seconds each phase of the step took under ``timing_s/<name>`` (``timing/<name>`` before
verl 0.3) and the whole step under ``timing_s/step`` (absent from old logs: the phases' sum is
used). Lines may carry Ray's ``(TaskRunner pid=N)`` / ``(main_task pid=N)`` prefix and ANSI
colours, sit between tqdm bars, and be wrapped by a terminal or a copy-paste anywhere — even
inside a key. The launch command at the top (``python3 -m verl.trainer.main_ppo key=value…``)
gives the run's knobs.

The log has no wall-clock times, so `parse` gives unanchored spans (steps start at 0 and follow
one another). Under ``gpuprof watch`` every line is stamped when it arrived: `spans_from_lines`
anchors each step's end at its line's arrival.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pandas as pd

from gpuprof.collectors.importers import Imported, ImportFormatError, open_text, steplog
from gpuprof.collectors.importers.steplog import (
    LOG_HOST,
    MAX_SECONDS,
    StepRecord,
    clean_line,
    command_meta,
    console_lines,
    frames_from_steps,
    keep_gpu_name,
    seconds_at,
    step_at,
    to_float,
)
from gpuprof.frameworks.verl import LOG_LAUNCH as _LAUNCH
from gpuprof.frameworks.verl import LOG_PHASES as PHASES
from gpuprof.frameworks.verl import LOG_STEP_AT as _STEP_AT
from gpuprof.frameworks.verl import LOG_TIMING_KEY as _TIMING_KEY

FORMAT = "verl-log"


_ORDER = {name: i for i, name in enumerate(PHASES)}
_AFTER_STEP = ("testing", "save_checkpoint")
"""Phases ``RayPPOTrainer.fit`` times after ``timing_s/step`` has stopped (logs with a step
key); in old logs without one, the step is taken as everything its line times."""
_SEGMENT_SPLIT = re.compile(r"\s+-\s*|\s*-\s+")
"""verl's `` - `` between segments; a rejoined wrap may have lost one of its spaces (a value's
own minus, ``kl:-0.1``, follows a colon and never matches)."""
_CONTINUATION = re.compile(r"^\S*(?:\s+-\s+[^\s:]+:\S*)+\s*-?\s*$|^[^\s:]+:[^\s:]+\s*$")
_LOOSE_PAIR = re.compile(r"^\s*-\s+(timing(?:_s)?/[^\s:]+):\s*(\S+)\s*$")
_KEEP_METRICS = (
    "response_length/mean",
    "response_length/max",
    "response_length/clip_ratio",
    "prompt_length/mean",
    "perf/total_num_tokens",
    "perf/throughput",
)
"""Step figures kept on the step span's attrs, besides every ``perf/*`` key (verl's logged
MFU ``perf/mfu/actor``…, throughput, time per step, peak memory)."""


def sniff(head: str, path: Path) -> bool:
    """A verl console log: ``step:N - `` lines with ``timing_s/``/``timing/`` keys, a verl
    launch command, or ``- timing_s/key:value`` fragments."""
    if re.search(r"step:\d+\s+-\s", head) and re.search(r"timing(?:_s)?/\w+:\s*[-\d.]", head):
        return True
    if re.search(r"(?m)^\s*-\s+timing_s/\w+:\s*[\d.]", head):
        return True
    return bool(re.search(r"-m\s+verl\.trainer\.main_\w+\s", head))


def parse(path: Path) -> Imported:
    """The steps of a verl console log as unanchored spans; knobs from the launch command."""
    text = open_text(path)
    lines = console_lines(text)
    records = list(step_records(lines, path))
    if not records:
        raise ImportFormatError(f"{path}: no verl step lines with timing_s/ or timing/ keys")
    meta: dict[str, Any] = {"framework": "verl"}
    launch = launch_command(text)
    if launch is not None:
        meta.update(command_meta(launch, "verl"))
        knobs = meta["knobs"]
        _estimate_tokens(records, knobs)
    keep_gpu_name(meta, text)
    pids = {pid for _, _, pid in lines if pid is not None}
    imported = Imported(source=path, format=FORMAT, meta=meta, anchored=False)
    imported.frames = frames_from_steps(
        records, framework="verl", phase_map=PHASES, pid=min(pids) if pids else 0
    )
    if any(r.step_s is None for r in records):
        imported.notes.append(
            "the log has no step-total key (timing_s/step): each step lasts its phases' sum"
        )
    if launch is None:
        imported.notes.append("no verl launch command in the log: no knobs")
    if records[0].attrs.get("loose"):
        imported.notes.append("no step:N lines: the timing values found are taken as one step")
    return imported


def spans_from_lines(
    lines: list[tuple[int, str]], *, host: str = LOG_HOST, pid: int | None = None
) -> pd.DataFrame:
    """Spans of the verl step lines among a watched run's log lines ``(t_ns, text)`` — for a
    stored run, ``zip(run.logs["t_ns"], run.logs["line"])``.

    Each step ends when its (last) line arrived; its phases are laid out before that end.
    ``host`` names the spans' host (the run's, for a watched run); ``pid`` defaults to the
    first Ray prefix's pid, else 0. Lines that are no verl step lines are ignored; an empty
    frame when there are none.
    """
    numbered = []
    arrival: dict[int, int] = {}
    for index, (t_ns, raw) in enumerate(lines, start=1):
        for piece in str(raw).split("\r"):
            cleaned, line_pid = clean_line(piece)
            if cleaned.strip():
                numbered.append((index, cleaned, line_pid))
                arrival[index] = int(t_ns)
                pid = pid if pid is not None else line_pid
    try:
        records = [r for r in step_records(numbered, Path("<log>")) if not r.attrs.get("loose")]
    except ImportFormatError:
        return frames_from_steps([], framework="verl")["spans"]
    for record in records:
        record.end_ns = arrival.get(record.last_line or record.line)
    frames = frames_from_steps(records, framework="verl", phase_map=PHASES, host=host, pid=pid or 0)
    return frames["spans"]


def launch_command(text: str) -> list[str] | None:
    """argv of the verl launch command in a log (the last one before the first step line)."""
    return steplog.launch_command(text, _LAUNCH, _STEP_AT)


def step_records(lines: list[tuple[int, str, int | None]], path: Path) -> list[StepRecord]:
    """Step records from cleaned console lines, wrapped lines rejoined.

    A line holding ``step:N - `` opens a record; the lines right after it that consist of
    ``key:value`` segments (a wrap, possibly inside a key) continue it, joined without a
    separator since the break replaced nothing. Lines with the same step number and no
    timing keys (verl logs validation scores separately) add their figures to that step.
    Without any ``step:N`` line, ``- timing_s/key:value`` fragments one per line (as pasted
    in an issue) are taken as one step.
    """
    texts: list[tuple[int, int, str]] = []  # (first line, last line, joined text)
    open_record = False
    for number, text, _ in lines:
        if _STEP_AT.search(text):
            start = _STEP_AT.search(text)
            texts.append((number, number, text[start.start() :].strip()))
            open_record = True
        elif open_record and _CONTINUATION.match(text.strip()):
            first, _, joined = texts[-1]
            texts[-1] = (first, number, joined + text.strip())
        else:
            open_record = False
    records: list[StepRecord] = []
    by_step: dict[int, StepRecord] = {}
    pending: dict[int, dict[str, float]] = {}
    for first, last, joined in texts:
        step, pairs = _pairs(joined)
        step_at(step, f"{path}:{first}")
        record = record_from_pairs(step, pairs, path, first)
        if record is None:
            pending.setdefault(step, {}).update(_kept(pairs))
            if step in by_step:
                by_step[step].attrs.update(pending.pop(step))
            continue
        record.last_line = last
        record.attrs.update(pending.pop(step, {}))
        records.append(record)
        by_step[step] = record
    if records:
        return records
    loose: list[tuple[str, str]] = []
    first_line = None
    for number, text, _ in lines:
        match = _LOOSE_PAIR.match(text)
        if match:
            loose.append((match.group(1), match.group(2)))
            first_line = first_line or number
    if loose:
        record = record_from_pairs(1, loose, path, first_line)
        if record is not None:
            record.attrs["loose"] = True
            return [record]
    return []


def _pairs(text: str) -> tuple[int, list[tuple[str, str]]]:
    """The step number and the ``key:value`` segments of a step line."""
    match = re.match(r"\s*step:(\d+)", text)
    step = int(match.group(1)) if match else 0
    pairs = []
    for segment in _SEGMENT_SPLIT.split(text[match.end() if match else 0 :]):
        key, sep, value = segment.strip().partition(":")
        if sep and key:
            pairs.append((key, value.strip()))
    return step, pairs


def _kept(pairs: list[tuple[str, Any]]) -> dict[str, float]:
    out = {}
    for key, value in pairs:
        if key in _KEEP_METRICS or key.startswith(("test_score/", "val/", "val-core/", "perf/")):
            number = to_float(value)
            if number is not None:
                out[key] = number
    return out


_COUNT_KEY = re.compile(r"(^|/)(num_\w+|\w*_length|tool_calls)$")
"""Sub-timing names that count things (the agent loop's slowest request's ``num_preempted``,
``prompt_length``, ``response_length``; ``slowest/tool_calls`` is a count too)."""


def record_from_pairs(
    step: int, pairs: list[tuple[str, Any]], path: Path, line: int | None
) -> StepRecord | None:
    """The step record of one step line's pairs; None when it has no timing keys."""
    phases: list[tuple[str, float]] = []
    sub: dict[str, float] = {}
    step_s = None
    for key, value in pairs:
        match = _TIMING_KEY.match(key)
        if match is None:
            continue
        name = match.group(1)
        if name not in _ORDER and name != "step":
            # sub-timings: verl also files counts under timing_s/ (the agent loop's slowest
            # request: num_preempted -1, prompt_length, response_length); skip what is no
            # duration rather than reject the line
            seconds = to_float(value)
            if seconds is not None and 0 <= seconds <= MAX_SECONDS and not _COUNT_KEY.search(name):
                sub[name] = seconds
            continue
        seconds = seconds_at(value, f"{path}:{line}", key)
        if seconds is None:
            if value is None or value == "":
                continue  # the line was cut right after the key (a truncated copy)
            text = str(value)[:40]
            raise ImportFormatError(f"{path}:{line}: {key} value {text!r} is not a number")
        if name == "step":
            step_s = seconds
        else:
            phases.append((name, seconds))
    if not phases and step_s is None:
        return None
    phases.sort(key=lambda item: _ORDER[item[0]])
    after: list[tuple[str, float]] = []
    if step_s is not None:  # verl validates and saves after its step timer stops
        after = [p for p in phases if p[0] in _AFTER_STEP]
        phases = [p for p in phases if p[0] not in _AFTER_STEP]
    metrics = _kept(pairs)
    record = StepRecord(
        step=step, phases=phases, after=after, step_s=step_s, line=line, attrs=metrics
    )
    if sub:
        record.attrs["sub_timing_s"] = sub
    tokens = metrics.get("perf/total_num_tokens")
    if tokens is not None:
        record.tokens = tokens
        record.attrs["tokens_source"] = "perf/total_num_tokens"
    return record


def _estimate_tokens(records: list[StepRecord], knobs: dict[str, Any]) -> None:
    """Tokens of steps whose log lacks ``perf/total_num_tokens``: (mean prompt + mean response
    length) × prompts per step × responses per prompt, from the launch command's
    ``data.train_batch_size`` and ``actor_rollout_ref.rollout.n`` (verl's default n is 1)."""
    batch = to_float(knobs.get("data.train_batch_size"))
    n = to_float(knobs.get("actor_rollout_ref.rollout.n", 1))
    if batch is None or n is None:
        return
    for record in records:
        prompt = record.attrs.get("prompt_length/mean")
        response = record.attrs.get("response_length/mean")
        if record.tokens is None and prompt is not None and response is not None:
            record.tokens = (prompt + response) * batch * n
            record.attrs["tokens_source"] = (
                "(prompt_length/mean + response_length/mean) x data.train_batch_size"
                " x actor_rollout_ref.rollout.n"
            )
