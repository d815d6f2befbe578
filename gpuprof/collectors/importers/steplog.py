"""Shared pieces of the framework-log importers: step records laid out as spans, launch commands
read as knobs, console noise removed, Python dict reprs read safely.

A framework log tells, per training step, how long each phase took (verl's ``timing_s/gen``,
OpenRLHF's ``timing/generation``…) but rarely when. `frames_from_steps` turns an ordered list of
`StepRecord` into ``spans`` and ``events`` frames: within a step the phases follow one another in
the framework's execution order from the step's start; without wall-clock times (``anchored``
False) the first step starts at 0 and each step starts where the previous one ended, so only
durations and order are real. With a known end time per step (the arrival time of the step's
log line under ``gpuprof watch``) the step ends there and its phases are placed before it.
"""

from __future__ import annotations

import ast
import math
import re
import shlex
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import pandas as pd

from gpuprof.collectors.importers import ANSI, ImportFormatError
from gpuprof.commandline import coerce, parse_knobs
from gpuprof.model import Event, Span, columns, empty_frame
from gpuprof.phases import canonical_phase
from gpuprof.redact import redact_command, redact_knobs

LOG_HOST = "(log)"
"""Host of spans read from a log that names none; the importer's caller may rename it."""

_ANSI = ANSI
_RAY_PREFIX = re.compile(r"^\s*\((?P<actor>[^()]*?)\s*pid=(?P<pid>\d+)(?:,\s*ip=[^)]*)?\)\s?")
_RAY_REPEAT = re.compile(r"\s*\[repeated \d+x across cluster\]\s*$")


@dataclass
class StepRecord:
    """What a log says about one training step.

    ``phases``: (framework's phase name, seconds) in execution order. ``step_s``: the whole
    step's duration when the log gives it (else the phases' sum is used). ``tokens``: tokens the
    step processed, for tokens/s. ``end_ns``: when the step ended (anchored logs only).
    ``line``/``last_line``: 1-based lines of the log the record came from (a wrapped record
    spans several). ``attrs``: other figures worth
    keeping on the step span (response lengths, sub-timings…).
    """

    step: int | None
    phases: list[tuple[str, float]] = field(default_factory=list)
    step_s: float | None = None
    tokens: float | None = None
    end_ns: int | None = None
    line: int | None = None
    last_line: int | None = None
    attrs: dict[str, Any] = field(default_factory=dict)
    whole_step: bool = True
    """False for phases between steps (an evaluation): no ``step`` span or event is made."""
    after: list[tuple[str, float]] = field(default_factory=list)
    """Phases the framework runs after its step timer stopped (verl's ``testing`` and
    ``save_checkpoint``): laid out after the step span, in order."""
    children: dict[str, list[tuple[str, float]]] = field(default_factory=dict)
    """Timers nested in a phase (NeMo-RL's ``prepare_for_generation/transfer_and_update_weights``
    inside ``prepare_for_generation``): parent's name → (name, seconds) in order, laid out
    from the parent's start one level deeper (a child may have children of its own). A
    child's time is part of its parent's, never added to it."""


def timed(record: StepRecord) -> bool:
    """Whether a record says how long anything took (a step time or a phase)."""
    return record.step_s is not None or bool(record.phases) or bool(record.after)


def clean_line(text: str) -> tuple[str, int | None]:
    """A console line without ANSI colour codes and Ray's ``(Actor pid=N)`` prefix.

    Returns the text and the pid the prefix named (None without a prefix).
    """
    text = _ANSI.sub("", text)
    pid = None
    match = _RAY_PREFIX.match(text)
    if match:
        pid = int(match.group("pid"))
        pid = pid if pid <= MAX_PID else None  # a mangled prefix: no process id to keep
        text = text[match.end() :]
    return _RAY_REPEAT.sub("", text).rstrip("\r\n"), pid


def console_lines(text: str) -> list[tuple[int, str, int | None]]:
    """(1-based line number, cleaned text, Ray pid) for every line of a console log.

    A carriage return starts a new logical line (tqdm redraws a bar with ``\\r``), numbered as
    the physical line it was written on.
    """
    out = []
    for number, physical in enumerate(text.split("\n"), start=1):
        for piece in physical.split("\r"):
            cleaned, pid = clean_line(piece)
            if cleaned.strip():
                out.append((number, cleaned, pid))
    return out


def to_float(value: Any) -> float | None:
    """A log value as a finite float, or None (``'nan'``, ``'12%'``, text, booleans)."""
    if isinstance(value, bool) or value is None:
        return None
    if isinstance(value, int | float):
        out = float(value)
    else:
        try:
            out = float(str(value).strip())
        except ValueError:
            return None
    return out if math.isfinite(out) else None


MAX_PID = 2**31 - 1
"""Largest process id taken as real (Linux's pid_max is at most 2**22; the store keeps
64-bit integers)."""
MAX_SECONDS = 366 * 86400
"""Longest duration or elapsed time a log entry may give (a year); more is a corrupt value."""
MAX_STEP = 10**12
"""Largest step number taken as real."""


def seconds_at(value: Any, where: str, what: str) -> float | None:
    """``value`` as seconds: None when it is no number (or NaN); `ImportFormatError` naming
    ``where`` (``path:line``) when negative or longer than `MAX_SECONDS`."""
    seconds = to_float(value)
    if seconds is None:
        if isinstance(value, str | int | float) and str(value).strip().lower() in ("inf", "-inf"):
            raise ImportFormatError(f"{where}: {what} is infinite")
        return None
    if seconds < 0 or seconds > MAX_SECONDS:
        raise ImportFormatError(f"{where}: {what} = {seconds:g} s is not a plausible duration")
    return seconds


def step_at(value: int, where: str) -> int:
    """A step number, or `ImportFormatError` naming ``where`` when above `MAX_STEP`."""
    if value > MAX_STEP:
        raise ImportFormatError(f"{where}: step {str(value)[:20]} is not a plausible step number")
    return value


_GPU_NAME = re.compile(
    r"\b(?:NVIDIA\s+(?:GeForce\s+)?|AMD\s+Instinct\s+|Tesla\s+)"
    r"((?:GH|GB|[ABHLTV])\d{1,4}[A-Za-z]*(?:[- ](?:SXM\d?|PCIe|NVL|HBM\d[a-z]?|\d+GB|\d+ ?GB))*"
    r"|RTX\s+(?:A\d{4}|\d{4})|MI\d{3}X?)"
)
"""A GPU product name as drivers and runtimes print it (``NVIDIA H100 80GB HBM3``,
``NVIDIA A100-SXM4-80GB``, ``Tesla V100-SXM2-32GB``, ``AMD Instinct MI300X``)."""


def gpu_name_in(text: str) -> str | None:
    """The first GPU product name in a log (vLLM, torch, nvidia-smi output pasted into it),
    as printed; None when the log names none. Matching it to a data sheet is the analyzers'
    job."""
    match = _GPU_NAME.search(text)
    return match.group(0).strip() if match else None


def keep_gpu_name(meta: dict[str, Any], text: str) -> None:
    """Store the GPU product name a console log prints (`gpu_name_in`) as the ``gpu_name``
    knob, so that MFU and the decode roofline get their data sheet when the run has no GPU
    inventory; a name already in the knobs (from the command) wins."""
    named = gpu_name_in(text)
    if named:
        meta.setdefault("knobs", {}).setdefault("gpu_name", named)


def split_command(text: str) -> list[str]:
    """A shell command line as argv (quotes removed); plain whitespace split if unbalanced."""
    try:
        return shlex.split(text)
    except ValueError:
        return text.split()


def command_knobs(argv: list[str]) -> dict[str, Any]:
    """Settings on a launch command (`gpuprof.commandline.parse_knobs`), values coerced to
    bool, int, float or None where they read as one."""
    return redact_knobs({key: coerce(value) for key, value in parse_knobs(argv).items()})


def launch_command(text: str, program: re.Pattern[str], stop: re.Pattern[str]) -> list[str] | None:
    """argv of the last line matching ``program`` before the first line matching ``stop``
    (the first step line), backslash-continued lines joined, a ``+ `` (``set -x``) or ``$ ``
    prompt prefix removed; None when there is none."""
    found = None
    physical = text.split("\n")
    i = 0
    while i < len(physical):
        line, _ = clean_line(physical[i])
        i += 1
        if stop.search(line):
            break
        if not program.search(line):
            continue
        while line.rstrip().endswith("\\") and i < len(physical):
            line = line.rstrip()[:-1] + " " + clean_line(physical[i])[0]
            i += 1
        line = re.sub(r"^\s*(?:\+\s+|\$\s+)", "", line)
        found = split_command(line.strip())
    return found


def command_meta(argv: list[str], framework: str) -> dict[str, Any]:
    """``meta`` entries for a launch command: framework, redacted command, knobs."""
    return {"framework": framework, "command": redact_command(argv), "knobs": command_knobs(argv)}


def literal_dict(text: str) -> dict[str, Any] | None:
    """A Python dict repr (``{'loss': 0.1, 'x': 'y'}``) as a dict, never evaluating code.

    ``nan``/``inf`` and objects (``tensor(0.5)``) that `ast.literal_eval` refuses are read
    pair by pair: numbers as floats, anything else as text. None when ``text`` is no dict.
    """
    text = text.strip()
    if not (text.startswith("{") and text.endswith("}")):
        return None
    try:
        value = ast.literal_eval(text)
    except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
        value = None
    if isinstance(value, dict):
        return {str(k): v for k, v in value.items()}
    pairs = _PAIR.findall(text)
    if not pairs:
        return None
    out: dict[str, Any] = {}
    for key_sq, key_dq, raw in pairs:
        raw = raw.strip()
        if len(raw) >= 2 and raw[0] == raw[-1] and raw[0] in "'\"":
            out[key_sq or key_dq] = raw[1:-1]
            continue
        number = re.fullmatch(r"(?:tensor\()?\s*([^\s(),]+)\)?", raw)
        value = to_float(number.group(1)) if number else None
        out[key_sq or key_dq] = value if value is not None else raw
    return out


_PAIR = re.compile(
    r"""(?:'([^'\\]*)'|"([^"\\]*)")\s*:\s*('(?:[^'\\]|\\.)*'|"(?:[^"\\]|\\.)*"|[^,{}]+)"""
)


def _typed(record_type: type, rows: list[tuple]) -> pd.DataFrame:
    empty = empty_frame(record_type)
    if not rows:
        return empty
    frame = pd.DataFrame(rows, columns=columns(record_type))
    return frame.astype(empty.dtypes.to_dict())


def frames_from_steps(
    records: Iterable[StepRecord],
    *,
    framework: str,
    phase_map: dict[str, str] | None = None,
    host: str = LOG_HOST,
    pid: int = 0,
) -> dict[str, pd.DataFrame]:
    """``spans`` and ``events`` frames for step records, in the order given.

    Phase spans (depth 1) follow one another from the step's start; the ``step`` span (depth 0)
    lasts the logged step time, or the phases' sum when the log gives none; ``after`` phases
    follow the step span. A record with an
    ``end_ns`` ends there; otherwise it starts where the previous record's step and phases
    ended (the first at 0). Each step also gets a ``step`` event at its end carrying its
    tokens. ``phase_map`` maps the framework's names to canonical phases (`canonical_phase`
    for names it lacks). Zero-length phases are skipped. A record with no duration at all
    (`timed` False: a step line without timing keys) gives only its ``step`` event, marked
    ``untimed``, with the record's figures.
    """
    phase_map = phase_map or {}
    spans: list[tuple] = []
    events: list[tuple] = []
    cursor = 0
    for number, record in enumerate(records):
        step = record.step if record.step is not None else number
        if record.whole_step and not timed(record):
            # a step the log names without any duration: its figures (MFU, lengths…) are kept
            # on a step event; a zero-length span would read as a 0 s step
            attrs = {"untimed": True, **record.attrs}
            if record.tokens is not None:
                attrs["tokens"] = record.tokens
            if record.line is not None:
                attrs["log_line"] = record.line
            events.append((host, pid, None, cursor, "step", str(step), attrs))
            continue
        phase_ns = [(name, round(seconds * 1e9)) for name, seconds in record.phases]
        after_ns = [(name, round(seconds * 1e9)) for name, seconds in record.after]
        inner_ns = sum(ns for _, ns in phase_ns)
        step_ns = round(record.step_s * 1e9) if record.step_s is not None else inner_ns
        length = max(step_ns, inner_ns) + sum(ns for _, ns in after_ns)
        start = cursor if record.end_ns is None else record.end_ns - length
        cursor = start + length
        laid = []
        t = start
        for name, ns in phase_ns:
            laid.append((name, t, ns))
            t += ns
        t = start + max(step_ns, inner_ns)
        for name, ns in after_ns:
            laid.append((name, t, ns))
            t += ns
        for name, t, ns in laid:
            if ns > 0:
                _lay_phase(spans, record, name, t, ns, 1, step, framework, phase_map, host, pid)
        if not record.whole_step:
            continue
        attrs = {"framework": framework, "source": "log", **record.attrs}
        if record.tokens is not None:
            attrs["tokens"] = record.tokens
        if record.line is not None:
            attrs["log_line"] = record.line
        spans.append((host, pid, 0, None, None, "step", "step", step, 0, start, start + step_ns,
                      None, None, attrs))  # fmt: skip
        event_attrs = {"tokens": record.tokens} if record.tokens is not None else {}
        events.append((host, pid, None, start + step_ns, "step", str(step), event_attrs))
    return {"spans": _typed(Span, spans), "events": _typed(Event, events)}


def _lay_phase(
    spans: list[tuple], record: StepRecord, name: str, t: int, ns: int, depth: int, step: int,
    framework: str, phase_map: dict[str, str], host: str, pid: int,
) -> None:  # fmt: skip
    """One phase span at ``depth`` and, one level deeper, its children (`StepRecord.children`)
    from its start, cut at its end: a child never outlasts its parent."""
    attrs = {"framework": framework, "source": "log"}
    phase = phase_map.get(name) or canonical_phase(name)
    spans.append((host, pid, 0, None, None, phase, name, step, depth, t, t + ns,
                  None, None, attrs))  # fmt: skip
    if depth > 8:  # a cycle in a malformed tree: no deeper
        return
    cursor, end = t, t + ns
    for child, seconds in record.children.get(name, ()):
        child_ns = min(round(seconds * 1e9), end - cursor)
        if child_ns <= 0 or child == name:
            continue
        _lay_phase(spans, record, child, cursor, child_ns, depth + 1, step, framework,
                   phase_map, host, pid)  # fmt: skip
        cursor += child_ns


# --------------------------------------------------------------------------------------------
# tolerant reading: a value that makes no sense is skipped and counted, never a reason to refuse


@dataclass
class Skipped:
    """What a tolerant reader left out, counted by reason, so that one note per reason tells
    the user how much was skipped and where the first one was.

    ``kind`` is what was skipped (``value``, ``line``, ``record``); ``reason`` says why
    (``not a plausible duration``); the first example of each (``line 12: timing_s/x = -1``)
    is kept for the note and for the one-line error when nothing usable is left.
    """

    counts: dict[tuple[str, str], int] = field(default_factory=dict)
    examples: dict[tuple[str, str], str] = field(default_factory=dict)
    first_line: int | None = None
    """1-based line of the first thing skipped, where known (for ``path:line`` errors)."""

    def add(self, kind: str, reason: str, example: str, line: int | None = None) -> None:
        """Count one skipped ``kind`` for ``reason``; ``example`` names it (line, key, value)."""
        key = (kind, reason)
        self.counts[key] = self.counts.get(key, 0) + 1
        self.examples.setdefault(key, example[:120])
        if self.first_line is None and line is not None:
            self.first_line = line

    def __bool__(self) -> bool:
        return bool(self.counts)

    def notes(self) -> list[str]:
        """One note per reason: ``3 values skipped: not a plausible duration (first: …)``."""
        out = []
        for (kind, reason), n in self.counts.items():
            plural = kind if n == 1 else f"{kind}s"
            out.append(f"{n} {plural} skipped: {reason} (first: {self.examples[(kind, reason)]})")
        return out

    def first(self) -> str | None:
        """``reason (example)`` of the first thing skipped, for a one-line error."""
        for key in self.counts:
            if key[0] != "annotation":
                return f"{key[1]} ({self.examples[key]})"
        return None


_ANNOTATED = re.compile(
    r"^\s*([-+]?(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][-+]?\d+)?)\s*"
    r"(?:s\b|sec\b|\(.*\)|\[.*\]|%|,)?\s*$"
)


def number_in(value: Any) -> tuple[float | None, bool]:
    """A log value as a float (NaN and infinities included, for the caller to judge) and
    whether an annotation after the number was dropped (``31.27   (72%)``, ``4.2 s``).

    (None, False) for anything that is no number: text, booleans, None.
    """
    if isinstance(value, bool) or value is None:
        return None, False
    if isinstance(value, int | float):
        return float(value), False
    text = str(value).strip()
    try:
        return float(text), False
    except ValueError:
        pass
    match = _ANNOTATED.match(text)
    if match is None:
        return None, False
    return float(match.group(1)), True


def refusal(path: Any, skipped: Skipped, why: str) -> str:
    """The one-line error for a file of which nothing usable is left: ``path[:line]: why``,
    with the first thing skipped and the line it was on when known."""
    first = skipped.first()
    place = f"{path}:{skipped.first_line}" if skipped.first_line is not None else f"{path}"
    return f"{place}: {why}" + (f"; skipped: {first}" if first else "")


def duration_s(
    value: Any, key: str, where: str, skipped: Skipped, line: int | None = None
) -> float | None:
    """``value`` as seconds, or None with the reason counted in ``skipped``.

    Skipped (never raised): no value at all (a copy cut right after the key), text, NaN or
    infinite values, negative durations (verl files counts such as ``num_preempted`` -1 under
    ``timing_s/``) and durations over `MAX_SECONDS`. ``where`` names the place (``line 12``).
    """
    if value is None or (isinstance(value, str) and not value.strip()):
        skipped.add("value", "no value (the line was cut after the key)", f"{where}: {key}", line)
        return None
    number, annotated = number_in(value)
    shown = f"{where}: {key} = {str(value).strip()[:30]}"
    if number is None:
        skipped.add("value", "not a number", shown, line)
        return None
    if not math.isfinite(number):
        skipped.add("value", "NaN or infinite", shown, line)
        return None
    if number < 0 or number > MAX_SECONDS:
        skipped.add("value", "not a plausible duration", shown, line)
        return None
    if annotated:
        skipped.add("annotation", "text after the number ignored", shown)
    return number


# --------------------------------------------------------------------------------------------
# tqdm progress bars: step times from the elapsed time (or the rate) a bar prints


_TQDM = re.compile(
    r"(?<![\w/.])(\d+)/(\d+)\s*\[\s*(\d+(?::\d{1,2}){1,2})\s*<\s*\**\s*(?:\?|\d+(?::\d{1,2}){0,2})"
    r"\s*,\s*\**\s*(\?|\d+(?:\.\d+)?)\s*(s/it|it/s)"
)
_NOT_STEP_BAR = re.compile(
    r"(?i)loading|shards|\bmap\b|filter|tokeniz|download|processed prompts|adding requests|"
    r"capturing|compil|eval|valid|test|saving|upload|fetching"
)
"""Descriptions of tqdm bars that count something else than training steps (checkpoint
shards, dataset maps, vLLM's per-request generation bars, evaluation)."""
TQDM_MIN_ELAPSED_STEP_S = 10.0
"""Mean step time above which step times come from differences of the printed elapsed time
(whole seconds: under 10% error); below it from the printed rate, which tqdm smooths."""


@dataclass
class Progress:
    """One redraw of a tqdm bar: ``n`` of ``total`` done after ``elapsed_s`` seconds, and the
    printed rate in seconds per iteration (None for ``?``)."""

    line: int
    n: int
    total: int
    elapsed_s: float
    s_per_it: float | None
    desc: str = ""


def _clock_s(text: str) -> float:
    seconds = 0.0
    for part in text.split(":"):
        seconds = seconds * 60 + int(part)
    return seconds


def progress_updates(lines: Iterable[tuple[int, str, int | None]]) -> list[Progress]:
    """Every tqdm redraw (``12/500 [00:10<06:45, 1.20it/s]``, ``1/105 [03:02<5:16:30,
    182.60s/it]``) among cleaned console lines, in order; a line may hold several (``\\r``).
    Bars that count something else (`_NOT_STEP_BAR`: checkpoint shards, vLLM's prompts,
    evaluation) are left out."""
    out = []
    for number, text, _ in lines:
        for match in _TQDM.finditer(text):
            n, total = int(match.group(1)), int(match.group(2))
            if n > MAX_STEP or total > MAX_STEP:
                continue
            rate = match.group(4)
            s_per_it = None
            if rate != "?":
                value = float(rate)
                if match.group(5) == "it/s":
                    s_per_it = 1.0 / value if value > 0 else None
                else:
                    s_per_it = value
            before = text[: match.start()]
            desc = re.sub(r"\s*\d+%\|[^|]*\|?\s*$", "", before.split("\r")[-1]).strip()
            if _NOT_STEP_BAR.search(desc):
                continue
            out.append(Progress(number, n, total, _clock_s(match.group(3)), s_per_it, desc))
    return out


def steps_from_progress(updates: list[Progress], notes: list[str]) -> list[StepRecord]:
    """Step records from the redraws of the main tqdm bar (the one with most distinct counts; other
    bars — checkpoint loading, evaluation — are left out, noted).

    With steps of 10 s or more (`TQDM_MIN_ELAPSED_STEP_S`) a step lasts the difference of
    elapsed times between two redraws over the steps done in between, and ends at its
    redraw's elapsed time; shorter steps take the printed rate (s/it, tqdm's moving average).
    The first redraw starts the count: step 1 when it shows ``1/N`` (its elapsed time is step
    1's duration), otherwise the steps before it are unknown. A bar whose count goes back
    (a new epoch's bar) starts over. The note says which reading was used.
    """
    if not updates:
        return []
    # the step bar is the one with the most distinct counts (a finished sub-task bar printed
    # again and again is still one count), the longest on a tie
    seen: dict[int, set[int]] = {}
    for u in updates:
        seen.setdefault(u.total, set()).add(u.n)
    counts = {t: len(ns) for t, ns in seen.items()}
    total = max(counts, key=lambda t: (counts[t], t))
    main = [u for u in updates if u.total == total]
    if len(counts) > 1:
        others = len(updates) - len(main)
        notes.append(f"{others} progress updates of other tqdm bars left out (not the step bar)")
    windows: list[tuple[Progress, int, float]] = []  # (redraw, steps done since last, seconds)
    prev: Progress | None = None
    for u in main:
        if prev is None or u.n < prev.n or u.elapsed_s < prev.elapsed_s:
            if u.n == 1:
                windows.append((u, 1, u.elapsed_s))
            prev = u
            continue
        if u.n > prev.n:
            windows.append((u, u.n - prev.n, u.elapsed_s - prev.elapsed_s))
            prev = u
    if not windows:
        return []
    steps = sum(k for _, k, _ in windows)
    mean = sum(s for _, _, s in windows) / steps
    by_elapsed = mean >= TQDM_MIN_ELAPSED_STEP_S
    records = []
    for u, k, seconds in windows:
        per_step = seconds / k if by_elapsed else u.s_per_it
        if per_step is None:
            continue
        for j in range(k):
            end_ns = None
            if by_elapsed:
                end_ns = round((u.elapsed_s - (k - 1 - j) * per_step) * 1e9)
            records.append(
                StepRecord(step=u.n - k + 1 + j, step_s=per_step, end_ns=end_ns, line=u.line,
                           attrs={"duration": "tqdm"})
            )  # fmt: skip
    if by_elapsed:
        notes.append(
            f"step times from the tqdm bar ({total} steps): differences of its elapsed time "
            "between redraws (whole seconds), spread over the steps done in between"
        )
    else:
        notes.append(
            f"step times from the tqdm bar ({total} steps): its printed rate (s/it, a moving "
            "average over recent steps; the elapsed time is too coarse for steps under "
            f"{TQDM_MIN_ELAPSED_STEP_S:g} s)"
        )
    return records


# --------------------------------------------------------------------------------------------
# DeepSpeed wall_clock_breakdown timers: ``time (ms) | fwd: … | bwd: … | step: …``


_DS_TIME = re.compile(r"time \(ms\)\s*\|(.*)$")
_DS_BARE = re.compile(
    r"^\s*((?:fwd|forward)(?:_microstep)?\s*:\s*[-+\d.eE]+\s*\|\s*(?:bwd|backward).*)$"
)
"""Older DeepSpeed releases (and users' pastes) print the timers without ``time (ms) |``:
``forward: 294.88 | backward: 17065.34 | backward_inner: … | step: …``, still in ms."""
_DS_PAIR = re.compile(r"([A-Za-z][\w \-]*?)\s*:\s*([-+\d.eE]+|nan|inf)")
DS_LAYOUT: tuple[tuple[tuple[str, ...], str, str], ...] = (
    (("fwd", "forward"), "fwd", "update_actor"),
    (("bwd_inner", "backward_inner", "backward_backward"), "bwd_inner", "update_actor"),
    (("bwd_allreduce", "backward_allreduce"), "bwd_allreduce", "collective"),
    (("step", "optimizer"), "optimizer_step", "update_actor"),
)
"""DeepSpeed's global timers (and GPT-NeoX's spellings) in the order a step runs them → the
phase name they get (the optimizer's ``step`` is renamed: ``step`` is the whole step) and its
canonical phase. ``bwd`` (= ``bwd_inner`` + ``bwd_allreduce``) stands in for ``bwd_inner``
when the split is not logged."""
DS_PHASES: dict[str, str] = {name: phase for _, name, phase in DS_LAYOUT}
"""Phase name → canonical phase, for `frames_from_steps`."""


@dataclass
class TimerLine:
    """One ``time (ms) | …`` line of DeepSpeed's ``wall_clock_breakdown``: ``micro`` for the
    per-micro-step timers (``fwd_microstep``…), phases in seconds in step order."""

    line: int
    micro: bool
    phases: list[tuple[str, float]]


def deepspeed_timers(
    lines: Iterable[tuple[int, str, int | None]], skipped: Skipped
) -> list[TimerLine]:
    """The forward / backward / allreduce / optimizer timer lines among console lines (the
    ZeRO optimizer's own ``optimizer_allgather``… lines time parts of the step: left out).
    Values in ms become seconds; an implausible value is skipped (counted in ``skipped``)."""
    out = []
    for number, text, _ in lines:
        match = _DS_TIME.search(text) or _DS_BARE.match(text)
        if match is None:
            continue
        values: dict[str, str] = {}
        for key, raw in _DS_PAIR.findall(match.group(1)):
            values[re.sub(r"[\s\-]+", "_", key.strip().lower())] = raw
        micro = any(k.endswith("_microstep") for k in values)
        if micro:
            values = {k[: -len("_microstep")]: v for k, v in values.items()}
        phases = []
        for names, phase, _ in DS_LAYOUT:
            key = next((n for n in names if n in values), None)
            if key is None and phase == "bwd_inner":
                key = next((n for n in ("bwd", "backward") if n in values), None)
            if key is None:
                continue
            ms = duration_s(values[key], key, f"line {number}", skipped)
            if ms is not None:
                phases.append((phase, ms / 1000.0))
        if phases:
            out.append(TimerLine(number, micro, phases))
    return out


def attach_timers(records: list[StepRecord], timers: list[TimerLine], notes: list[str]) -> None:
    """Give step records the DeepSpeed timer phases logged before them.

    The timer lines between one step line (or redraw) and the next belong to the steps that
    line closes, in order (the last ones when there are more lines than steps); the global
    timers are used when logged, else the micro-step timers, summed per step. Records without
    a ``line`` get none. Timer lines left over are counted in a note.
    """
    if not timers or not records:
        return
    use_micro = not any(not t.micro for t in timers)
    timers = [t for t in timers if t.micro == use_micro]
    groups: dict[int, list[StepRecord]] = {}
    for record in records:
        if record.line is not None:
            groups.setdefault(record.line, []).append(record)
    left = 0
    start = -1
    t = 0
    for line in sorted(groups):
        window = []
        while t < len(timers) and timers[t].line <= line:
            if timers[t].line > start:
                window.append(timers[t])
            t += 1
        start = line
        steps = groups[line]
        if use_micro and window:  # micro-steps of one window add up to its steps' update
            summed: dict[str, float] = {}
            for timer in window:
                for name, seconds in timer.phases:
                    summed[name] = summed.get(name, 0.0) + seconds / len(steps)
            window = [TimerLine(window[-1].line, True, list(summed.items()))] * len(steps)
        left += max(0, len(window) - len(steps))
        # more timer lines than steps: the ones right before the step line are its own
        for record, timer in zip(steps, window[-len(steps) :]):
            record.phases = list(timer.phases)
    left += len(timers) - t
    if left:
        notes.append(f"{left} DeepSpeed timer lines without a step line after them: left out")
    kind = "per-micro-step timers summed per step" if use_micro else "per-step timers"
    notes.append(
        f"DeepSpeed wall_clock_breakdown ({kind}) gives forward, backward, gradient allreduce "
        "and optimizer phases; the rest of each step (generation, data loading…) is not timed"
    )
