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
    MAX_STEP,
    Skipped,
    StepRecord,
    clean_line,
    command_meta,
    console_lines,
    duration_s,
    frames_from_steps,
    keep_gpu_name,
    refusal,
    timed,
    to_float,
)
from gpuprof.frameworks.verl import LOG_LAUNCH as _LAUNCH
from gpuprof.frameworks.verl import LOG_NESTED
from gpuprof.frameworks.verl import LOG_PHASES as PHASES
from gpuprof.frameworks.verl import LOG_STEP_AT as _STEP_AT
from gpuprof.frameworks.verl import LOG_TIMING_KEY as _TIMING_KEY
from gpuprof.phases import phase_from_name

FORMAT = "verl-log"
LATE = True
"""Step lines may start after thousands of lines of start-up chatter: `detect` streams the
whole file through `sniff`."""


_ORDER = {name: i for i, name in enumerate(PHASES)}
_AFTER_STEP = ("testing", "save_checkpoint")
"""Phases ``RayPPOTrainer.fit`` times after ``timing_s/step`` has stopped (logs with a step
key); in old logs without one, the step is taken as everything its line times."""
_SEGMENT_SPLIT = re.compile(r"\s+-\s*|\s*-\s+")
"""verl's `` - `` between segments; a rejoined wrap may have lost one of its spaces (a value's
own minus, ``kl:-0.1``, follows a colon and never matches)."""
_CONTINUATION = re.compile(r"^\S*(?:\s+-\s+[^\s:]+(?::\S*)?)+\s*-?\s*$|^[^\s:]+:[^\s:]+\s*-?\s*$")
"""A wrapped piece of a step line: the rest of a key or value, then `` - key:value``
segments (the last one possibly cut inside its key); or a lone ``key:value``, with the
`` -`` before the next segment where the wrap fell after it."""
_DASH_CONTINUATION = re.compile(r"^-\s+[^\s:]+:\S*(?:\s+-\s+[^\s:]+(?::\S*)?)*\s*-?\s*$")
"""A line of ``- key:value`` segments: verl 0.7's one key per line, or a wrap at a `` - ``."""
_STEP_BARE = re.compile(r"(?:^|\s)step:(\d+)\s*$")
_LOOSE_PAIR = re.compile(r"^\s*(?:-\s+)?(timing(?:_s)?/[^\s:]+):\s*(.*?)\s*$")
_WANDB_PAIR = re.compile(r"wandb:\s+(timing(?:_s)?/\S+)\s+([-+]?\d[\d.eE+-]*)\s*$")
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
    """A verl console log: ``step:N - key:value`` lines (or ``step:N`` followed by one
    ``- key:value`` per line), ``timing_s/key: value`` fragments with or without a leading
    dash, a wandb summary of ``timing_s/`` keys, or a verl launch command."""
    if re.search(r"step:\d+\s+-\s+[\w@./()-]+:\S", head):
        return True
    if re.search(r"step:\d+[ \t]*\r?\n\s*-\s+[\w@./()-]+:", head):
        return True
    if re.search(r"(?m)^\s*(?:-\s+)?timing_s/\w[\w/]*:\s*[\d.]", head):
        return True
    if re.search(r"wandb:\s+timing_s/\w", head):
        return True
    return bool(re.search(r"-m\s+verl\.trainer\.\w+\s", head))


def parse(path: Path) -> Imported:
    """The steps of a verl console log as unanchored spans; knobs from the launch command.

    Values that make no sense (-1 s, NaN, text, a count filed under ``timing_s/``) are
    skipped and counted in the notes; step lines without any timing key still give their
    steps and figures (MFU, lengths), untimed. Refused only when nothing is left.
    """
    text = open_text(path)
    lines = console_lines(text)
    skipped = Skipped()
    records = step_records(lines, path, skipped)
    if not records:
        raise ImportFormatError(_nothing_found(path, text, skipped))
    meta: dict[str, Any] = {"framework": "verl"}
    launch = launch_command(text)
    if launch is not None:
        meta.update(command_meta(launch, "verl"))
        knobs = meta["knobs"]
        _estimate_tokens(records, knobs)
    keep_gpu_name(meta, text)
    pids = {pid for _, _, pid in lines if pid is not None}
    loose_note = records[0].attrs.pop("loose_note", None)
    imported = Imported(source=path, format=FORMAT, meta=meta, anchored=False)
    imported.frames = frames_from_steps(
        records, framework="verl", phase_map=phase_map(records), pid=min(pids) if pids else 0
    )
    notes = imported.notes
    untimed = [r for r in records if not timed(r)]
    if len(untimed) == len(records):
        notes.append(
            f"no timing keys (timing_s/ or timing/) in any step line: {len(records)} steps "
            "imported with their figures and no durations (nothing to time)"
        )
    elif untimed:
        notes.append(f"{len(untimed)} step lines without timing keys: kept untimed")
    if any(r.step_s is None and timed(r) for r in records):
        notes.append(
            "the log has no step-total key (timing_s/step): each step lasts its phases' sum"
        )
    extra = sorted({n for r in records for n, _ in r.phases + r.after if n not in PHASES})
    if extra:
        guessed = phase_map(records)
        named = ", ".join(f"{n} ({guessed.get(n, 'its own name')})" for n in extra)
        notes.append(f"timers verl does not name, laid out as phases of their own: {named}")
    if launch is None:
        notes.append("no verl launch command in the log: no knobs")
    if loose_note:
        notes.append(loose_note)
    notes.extend(skipped.notes())
    return imported


def _nothing_found(path: Path, text: str, skipped: Skipped) -> str:
    """The one line saying why a verl-looking file gave no step."""
    if re.search(r"wandb:\s+timing_s/\S+\s+[\u2581-\u2588]", text):
        return (
            f"{path}: a wandb run-history summary (sparklines, no numbers): nothing to import; "
            "the step:N lines of the console log or the run's history export hold the values"
        )
    if skipped:
        return refusal(path, skipped, "no usable step: every timing value was skipped")
    return f"{path}: no verl step lines (step:N - key:value) and no timing_s/ or timing/ values"


def phase_map(records: list[StepRecord]) -> dict[str, str]:
    """verl's phase map plus a canonical phase for each timer verl does not name, where the
    name says it (`gpuprof.phases.phase_from_name`)."""
    out = dict(PHASES)
    for record in records:
        for name, _ in record.phases + record.after:
            if name not in out:
                guess = phase_from_name(name)
                if guess is not None:
                    out[name] = guess
    return out


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


WRAP_MIN_WIDTH = 40
"""Pieces at least this long, repeated at the same length, are a fixed-width wrap."""


def _wrap_piece(stripped: str, widths: list[int]) -> bool:
    """A piece of one token (``-``, ``/total_num_t``, ``:0.0365``) continues the step line
    only after pieces cut at one fixed width: the last piece before it is as long as an
    earlier one. A lone word after a line of any other length starts a line of its own."""
    token = re.sub(r"^-\s+|\s+-$", "", stripped)  # "8.0 -", "- perf/total_num_t"
    if not token or any(c.isspace() for c in token) or len(widths) < 2:
        return False
    return widths[-1] >= WRAP_MIN_WIDTH and widths[-1] in widths[:-1]


def step_records(
    lines: list[tuple[int, str, int | None]], path: Path, skipped: Skipped | None = None
) -> list[StepRecord]:
    """Step records from cleaned console lines, wrapped lines rejoined.

    A line holding ``step:N - `` (or ending in ``step:N``, verl 0.7's one key per line)
    opens a record; the lines right after it that consist of ``key:value`` segments continue
    it: a wrap (possibly inside a key) is joined without a separator since the break replaced
    nothing, a ``- key:value`` line with a space. Lines of one step number are merged: the one
    with timing keys is the step, the others (verl logs validation scores separately) add
    their figures. Without any ``step:N`` line with timing keys, ``timing_s/key: value``
    fragments (one per line, as pasted in an issue, or a wandb run summary) are taken as one
    step. ``skipped`` counts the values left out.
    """
    skipped = skipped if skipped is not None else Skipped()
    texts: list[tuple[int, int, str]] = []  # (first line, last line, joined text)
    open_record = False
    widths: list[int] = []  # lengths of the open record's pieces
    for number, text, _ in lines:
        at = _STEP_AT.search(text)
        bare = _STEP_BARE.search(text) if at is None else None
        stripped = text.strip()
        if at is not None:
            texts.append((number, number, text[at.start() :].strip()))
            open_record, widths = True, [len(text)]
        elif bare is not None:
            texts.append((number, number, f"step:{bare.group(1)}"))
            open_record, widths = True, [len(text)]
        elif open_record and _DASH_CONTINUATION.match(stripped):
            first, _, joined = texts[-1]
            texts[-1] = (first, number, f"{joined} {stripped}")
            widths.append(len(text))
        elif open_record and (_CONTINUATION.match(stripped) or _wrap_piece(stripped, widths)):
            first, _, joined = texts[-1]
            texts[-1] = (first, number, joined + stripped)
            widths.append(len(text))
        else:
            open_record = False
    records: list[StepRecord] = []
    by_step: dict[int, int] = {}  # step -> index in records
    for first, last, joined in texts:
        step, pairs = _pairs(joined)
        if step > MAX_STEP:
            skipped.add("line", "not a plausible step number", f"line {first}: step {step:.3g}",
                        first)  # fmt: skip
            continue
        record = record_from_pairs(step, pairs, path, first, skipped)
        record.last_line = last
        index = by_step.get(step)
        if index is None:
            by_step[step] = len(records)
            records.append(record)
            continue
        kept = records[index]
        if timed(kept) and timed(record):  # the same step logged twice: keep both
            records.append(record)
        elif timed(record):  # the timed line is the step; the other one's figures join it
            record.attrs = {**_kept(list(kept.attrs.items())), **record.attrs}
            records[index] = record
        elif timed(kept):
            kept.attrs.update(_kept(list(record.attrs.items())))
        else:
            kept.attrs.update(record.attrs)
    if any(timed(r) for r in records):
        return records
    loose = _loose_record(lines, path, skipped)
    if loose is not None:
        return [loose]
    return [r for r in records if r.attrs]


def _loose_record(
    lines: list[tuple[int, str, int | None]], path: Path, skipped: Skipped
) -> StepRecord | None:
    """One step from ``timing_s/key: value`` fragments outside any step line."""
    loose: list[tuple[str, str]] = []
    first_line = None
    summary = False
    for number, text, _ in lines:
        match = _LOOSE_PAIR.match(text) or _WANDB_PAIR.search(text)
        if match:
            summary = summary or match.re is _WANDB_PAIR
            loose.append((match.group(1), match.group(2)))
            first_line = first_line or number
    if not loose:
        return None
    record = record_from_pairs(1, loose, path, first_line, skipped)
    if not timed(record):
        return None
    record.attrs["loose"] = True
    record.attrs["loose_note"] = (
        "a wandb run summary: the last logged value of each timing key, taken as one step"
        if summary
        else "no step:N lines: the timing values found are taken as one step"
    )
    return record


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


def _kept(pairs: list[tuple[str, Any]], every: bool = False) -> dict[str, float]:
    """The figures of a step line worth keeping (`_KEEP_METRICS`, ``perf/``, validation
    scores), or with ``every`` all numeric ones (a step line without timing keys has nothing
    else to give)."""
    out = {}
    for key, value in pairs:
        if every and (key == "step" or _TIMING_KEY.match(key)):
            continue  # a timing value that was skipped is no figure either
        keep = every or key in _KEEP_METRICS
        if keep or key.startswith(("test_score/", "val/", "val-core/", "perf/")):
            number = to_float(value)
            if number is not None:
                out[key] = number
        if len(out) >= _MAX_FIGURES:
            break
    return out


_MAX_FIGURES = 200
"""Most figures kept per step line (a verl line has ~100)."""


_COUNT_KEY = re.compile(r"(^|/)(num_\w+|\w*_length|tool_calls|turns)(/(min|max|mean))?$")
"""Sub-timing names that count things (the agent loop's ``num_preempted/min`` -1, the slowest
request's ``prompt_length`` / ``response_length``; ``slowest/tool_calls`` is a count too)."""
_EXCEED = 1.05
"""How far the phases may add up beyond ``timing_s/step`` before timers verl does not name are
taken as nested in a known phase rather than laid out beside it."""


def record_from_pairs(
    step: int,
    pairs: list[tuple[str, Any]],
    path: Path,
    line: int | None,
    skipped: Skipped | None = None,
) -> StepRecord:
    """The step record of one step line's pairs (untimed when it has no usable timing key).

    Known phases (`PHASES`) and ``step`` are laid out; sub-timers (names with ``/``, and
    `LOG_NESTED`) are kept under ``sub_timing_s``; any other top-level timer is a phase of its
    own, unless with it the phases would exceed ``timing_s/step`` (then it is nested: kept
    aside, counted). Values that are no duration are skipped and counted in ``skipped``.
    """
    skipped = skipped if skipped is not None else Skipped()
    where = f"step {step} at line {line}" if line is not None else f"step {step}"
    phases: list[tuple[str, float]] = []
    extra: list[tuple[str, float]] = []
    sub: dict[str, float] = {}
    step_s = None
    for key, value in pairs:
        match = _TIMING_KEY.match(key)
        if match is None:
            continue
        name = match.group(1)
        if "/" in name or name in LOG_NESTED:
            if _COUNT_KEY.search(name):
                number = to_float(value)
                if number is not None and number < 0:  # a count of -1: "not measured"
                    skipped.add("value", "a count filed under timing_s/, not a duration",
                                f"{where}: {key} = {value}", line)  # fmt: skip
                continue
            seconds = duration_s(value, key, where, skipped, line)
            if seconds is not None:
                sub[name] = seconds
            continue
        seconds = duration_s(value, key, where, skipped, line)
        if seconds is None:
            continue
        if name == "step":
            step_s = seconds
        elif name in _ORDER:
            phases.append((name, seconds))
        else:
            extra.append((name, seconds))
    if extra and step_s is not None:
        inner = sum(s for n, s in phases if n not in _AFTER_STEP)
        if inner + sum(s for _, s in extra) > _EXCEED * step_s + 1e-3:
            for name, seconds in extra:
                sub[name] = seconds
                skipped.add("timer", "kept aside as nested: with it the phases would exceed "
                            "timing_s/step", f"{where}: timing_s/{name} = {seconds:g}")  # fmt: skip
            extra = []
    phases.extend(extra)
    phases.sort(key=_order_key)
    after: list[tuple[str, float]] = []
    if step_s is not None:  # verl validates and saves after its step timer stops
        after = [p for p in phases if p[0] in _AFTER_STEP]
        phases = [p for p in phases if p[0] not in _AFTER_STEP]
    metrics = _kept(pairs, every=not (phases or after or step_s is not None))
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


def _order_key(item: tuple[str, float]) -> float:
    """Where a phase runs in verl's step: its place in `PHASES`, or for a timer verl does not
    name, the place of the first known phase with the same canonical phase (else before the
    validation and checkpoint that close a step)."""
    name = item[0]
    if name in _ORDER:
        return _ORDER[name]
    guess = phase_from_name(name)
    for known, phase in PHASES.items():
        if phase == guess:
            return _ORDER[known] - 0.5
    return _ORDER["testing"] - 0.5


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
