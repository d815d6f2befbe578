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

from gpuprof.collectors.importers import ImportFormatError
from gpuprof.commandline import coerce, parse_knobs
from gpuprof.model import Event, Span, columns, empty_frame
from gpuprof.phases import canonical_phase
from gpuprof.redact import redact_command, redact_knobs

LOG_HOST = "(log)"
"""Host of spans read from a log that names none; the importer's caller may rename it."""

_ANSI = re.compile(r"\x1b\[[0-9;?]*[ -/]*[@-~]|\x1b[@-_]")
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
    for names it lacks). Zero-length phases are skipped.
    """
    phase_map = phase_map or {}
    spans: list[tuple] = []
    events: list[tuple] = []
    cursor = 0
    for number, record in enumerate(records):
        step = record.step if record.step is not None else number
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
                attrs = {"framework": framework, "source": "log"}
                phase = phase_map.get(name) or canonical_phase(name)
                spans.append((host, pid, 0, None, None, phase, name, step, 1, t, t + ns,
                              None, None, attrs))  # fmt: skip
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
