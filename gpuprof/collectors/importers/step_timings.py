"""Per-step timings however they are printed: the tolerant reader for every RL stack.

RL stacks print, log or dump how long each part of a training step took, each its own way:
``key: value`` runs (``step:3 - timing_s/gen:41.2 - …``), ``key=value`` pairs, JSON lines,
Python dict reprs (``perf 3: {'perf/rollout_time': 41.2, …}``), ``|``-separated timer lines
(``|E2E latency=12.3s |Generate time=5.6s |…``, ``time (ms) | train_batch: 812.3 | …``),
Markdown / TSV / CSV tables with a column per timer, ``{metric: {step: value}}`` dumps
(NeMo-RL), a step header followed by one timer per line (NeMo-RL's ``Timing:`` block), and
plain "rollout took 12.3s" messages. This module reads them all into `StepRecord`\\ s:

1. **Records** (`records_from_lines`, `records_from_json`): each printed record gives a step
   number (``step``, ``global_step``, ``iteration``, ``rollout_id``, a ``Step 3/100``
   header…) and its ``key → value`` pairs, with the unit the line or the value names.
2. **Keys** (`classify`): a timing-like key (under ``timing/``, ``timing_s/``, ``time/``,
   ``timeperf/``, ``perf/…_time``; or named ``…_time``, ``…_latency``, ``… took``…) is a
   duration unless it is a throughput, a count or a ratio filed beside them
   (``timing/…/tokens_per_sec``, ``timing_per_token_ms``, ``num_preempted``); an ever-growing
   ``elapsed`` is a clock, not a duration. Units come from the key (``_ms``, ``(ms)``) or the
   value (``12.3s``, ``812ms``); seconds otherwise.
3. **Nesting** (`step_record`): ``a/b`` is inside ``a`` (``a/total`` is ``a``'s own time), a
   group holding the step total is the step, and a stack's own nesting (`frameworks.stacks`)
   applies; a child's time is part of its parent's, never added to it (self time, as
   everywhere else). Timers the step total does not hold (validation, checkpointing after the
   step timer stopped) are laid out after the step.
4. **Phases**: the stack's vocabulary when the file names a stack, else the generic name
   rules (`gpuprof.phases.phase_from_name`); a name neither knows keeps its own name.

The named framework readers (verl, TRL, ms-swift, OpenRLHF, Megatron) keep their own parsers
and knowledge; this one reads what they do not, and a watched run's printed lines
(`spans_from_lines`).
"""

from __future__ import annotations

import functools
import itertools
import json
import math
import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd

from gpuprof.collectors.importers import Imported, ImportFormatError, open_text
from gpuprof.collectors.importers.steplog import (
    LOG_HOST,
    MAX_SECONDS,
    MAX_STEP,
    Skipped,
    StepRecord,
    clean_line,
    command_meta,
    console_lines,
    frames_from_steps,
    keep_gpu_name,
    launch_command,
    literal_dict,
)
from gpuprof.frameworks.stacks import Stack, recognise
from gpuprof.model import GpuSample, columns, empty_frame
from gpuprof.phases import CANONICAL_PHASES, phase_from_name

FORMAT = "step-timings"
WEAK = True
"""Any per-step timing: tried after every specific format has seen the whole file."""

# --------------------------------------------------------------------------------------------
# pieces of a printed record

_NUM = r"[-+]?(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][-+]?\d+)?|[-+]?(?:nan|NaN|inf|Infinity)"
_UNIT = (
    r"ms|msec|millis(?:econds?)?|milliseconds?|s|sec|secs|seconds?|min|mins|minutes?|h|hrs?|"
    r"hours?"
)
_WORD = r"[A-Za-z_][\w./@\-]*"
_PAIR = re.compile(
    rf"(?<![\w:./@\-])(?P<key>{_WORD}(?:[ ](?:{_WORD}|\((?:ms|s|sec|seconds)\))){{0,4}}?)\s*"
    rf"['\"]?\s*(?P<kunit>\((?:ms|s|sec|seconds)\))?\s*(?:=>\s*Latency\s*)?(?:[:=]|=>)\s*"
    rf"(?P<value>{_NUM})(?:\s*(?P<unit>{_UNIT}))?(?![\w.])"
)
"""``key: value``, ``key=value``, ``Key Name: 12.3s``, ``key (ms): 81``."""
_TOOK = re.compile(
    rf"(?P<key>{_WORD}(?:[ ]{_WORD}){{0,3}}?)\s+(?:took|completed in|finished in|done in|"
    rf"spent)\s+(?P<value>{_NUM})\s*(?P<unit>{_UNIT})(?![\w.])"
)
"""``rollout took 12.3s``, ``generation finished in 812 ms``: a custom timer's message."""
_IN = re.compile(
    rf"^\s*(?:[-*•]\s*)?(?P<key>[A-Za-z][\w ,./-]{{2,60}}?)\s+in\s+(?P<value>{_NUM})\s*"
    rf"(?P<unit>ms|s|sec|secs|seconds|min|mins|minutes)\b"
)
"""``Generated 2 candidates in 374.3s, rendering...``: a message that times what it names."""
_QUOTED = re.compile(
    rf"(?i)(?:finished|done|completed|ended|end|stop(?:ped)?)\b[:\s]*['\"`](?P<key>[^'\"`]{{1,80}})"
    rf"['\"`][,;:\s-]*(?:time[ _]cost|took|elapsed|time|duration|in)[:=\s]*(?P<value>{_NUM})\s*"
    rf"(?P<unit>{_UNIT})(?![\w.])"
)
"""``Finished: 'generate', time cost: 12.3s`` (SkyRL, marin): the quoted name is the timer."""
_ARROW = re.compile(r"^\s*(?P<name>[A-Za-z][\w\- ]*?)\s*=>\s*(?P<rest>.*)$")
"""``Generation => Latency: 3.1s, TFLOPs: …``: the name before ``=>`` heads each pair."""
_HEADER = re.compile(
    r"(?i)(?<![\w/])(?:global[ _]step|step|iteration|iter|rollout(?:[ _]id)?|update|episode)"
    r"\s*[#:]?\s*\[?(\d{1,12})\]?(?:\s*/\s*\d+)?(?![\w.])"
)
"""A step number a line names without a ``key: value`` (``Step 3/100``, ``[Iteration 3]``,
``Global step 3:``)."""
_STEP_KEYS = frozenset({
    "step", "global_step", "globalstep", "iteration", "iter", "rollout_id", "rollout",
    "train/global_step", "trainer/global_step", "_step", "steps", "step_id", "training_step",
    "train_step", "global_steps", "update", "episode", "current_steps", "current_step",
    "completed_steps", "num_steps", "policy_step", "rl_step",
})  # fmt: skip
"""Keys whose integer value numbers the step (a duration under one of them has a unit or a
fraction, and is read as a duration)."""
_LINE_MS = re.compile(r"time \(ms\)|\(ms\)\s*\||timing_ms\b|\bin ms\b")
"""A line whose values are all in milliseconds (DeepSpeed's ``time (ms) | …``)."""
_DIGIT = re.compile(r"\d")
_TIMER_LINE = re.compile(r"\btime \((ms|s)\)\s*\|")
"""DeepSpeed's ``time (ms) | name: value | …``: each figure after it is a timer."""
_LEVEL = re.compile(r"^(?:(?:INFO|DEBUG|WARNING|WARN|ERROR|TRACE|CRITICAL)\b[\s:]*)+", re.I)

# --------------------------------------------------------------------------------------------
# what a key is

_PREFIX = re.compile(
    r"^(?:[\w\-]+/)?(?:timing_s|timing_ms|timings?|times?|timers?|timeperf|perf|profil\w*)/",
    re.I,
)
"""Timing prefixes (``timing/``, ``timing_s/``, ``time/``, ``timeperf/``, ``perf/``…), after
an optional namespace (``train/timing/…``)."""
_TIMING_PREFIX = re.compile(r"^(?:[\w\-]+/)?(?:timing_s|timing_ms|timings?|times?|timers?|"
                            r"timeperf)/", re.I)  # fmt: skip
_TIME_WORD = re.compile(
    r"(?:^|[_\s/\-])(?:time|times|timing|latency|duration|elapsed|took|secs?|seconds|ms|wall)"
    r"(?:$|[_\s/\-])",
    re.I,
)
_NOT_DURATION_WORDS = frozenset({
    "per", "ratio", "ratios", "percent", "pct", "count", "counts", "num", "n", "throughput",
    "tflops", "flops", "mfu", "tps", "qps", "speed", "rate", "rates", "util", "utilization",
    "bandwidth", "bw", "gb", "mb", "gib", "mib", "mem", "memory", "timestamp", "eta",
    "remaining", "lr", "since", "at", "tokens", "token", "samples", "seqs", "it", "tok",
    "preempted", "fraction", "share", "len", "length", "size", "frac", "left", "estimate",
    "enabled", "flag", "steps", "mean", "median", "max", "min", "std", "avg", "p50", "p90",
    "p95", "p99", "longest", "slowest", "fastest", "shortest", "stats",
})  # fmt: skip
"""Words that make a timing-like key a throughput, a count, a ratio or a clock reading
(``timing/…/tokens_per_sec``, ``timing_per_token_ms``, ``num_preempted``, ``mfu``)."""
_PER_STEP = re.compile(r"(?:^|_)time_per_(?:step|iter|iteration|batch)$")
"""verl's ``perf/time_per_step``: the whole step's duration despite its ``per``."""


def _not_duration(name: str) -> bool:
    if _PER_STEP.search(name):
        return False
    if "%" in name or name.endswith(("/s", "/sec", "/it")):
        return True
    words = set(re.split(r"[/_\s\-.()]+", name))
    return bool(words & _NOT_DURATION_WORDS)


_SUFFIX = re.compile(
    r"(?i)(?:[_\s\-]+(?:time|timing|latency|duration|elapsed|took|secs?|seconds|ms|in_s|"
    r"in_ms|s)|[_\s]*\((?:ms|s|sec|seconds)\))+$"
)
_CLOCKS = frozenset({
    "elapsed", "elapsed_time", "time_elapsed", "total_elapsed", "wall_time", "walltime",
    "_runtime", "runtime", "time", "_timestamp", "timestamp", "elapsed_seconds", "wall_clock",
    "clock", "total_time_elapsed", "cumulative_time",
})  # fmt: skip
_GENERIC_TOTALS = frozenset({
    "step", "total", "total_step", "step_total", "e2e", "end_to_end", "end-to-end",
    "iteration", "iter", "whole_step", "per_step", "train_step_total", "batch",
})  # fmt: skip
_SCALE = {"ms": 1e-3, "msec": 1e-3, "min": 60.0, "mins": 60.0, "h": 3600.0, "hr": 3600.0,
          "hrs": 3600.0}  # fmt: skip


def _unit_scale(unit: str | None) -> float:
    """Seconds per unit of a printed unit (``ms``, ``min``…); 1 for seconds and none."""
    if not unit:
        return 1.0
    u = unit.lower().strip("() ")
    if u.startswith("milli"):
        return 1e-3
    if u.startswith("minute"):
        return 60.0
    if u.startswith("hour"):
        return 3600.0
    return _SCALE.get(u, 1.0)


@dataclass(frozen=True)
class Key:
    """What a key is: ``kind`` ``duration``, ``clock`` (elapsed seconds since the start),
    ``step`` (the step number) or ``other``; ``name`` the timer's name (prefix, unit and
    ``_time``/``latency`` words removed; ``/`` keeps its nesting); ``scale`` seconds per
    unit of its values."""

    kind: str
    name: str
    scale: float = 1.0


@functools.lru_cache(maxsize=1 << 16)
def normalise(key: str) -> str:
    """A key as compared: lower case, spaces and dashes within words as ``_``, no level word
    (``INFO``) or bullet in front."""
    key = _LEVEL.sub("", key.strip().lstrip("•*·-–>|[ \t").rstrip(":,;|] \t"))
    return re.sub(r"\s+", "_", key.strip()).lower()


@functools.lru_cache(maxsize=1 << 16)
def classify(key: str, unit: str | None = None, line_ms: bool = False) -> Key:
    """What ``key`` (as printed) holds; ``unit`` the value's printed unit, ``line_ms`` whether
    the line says its values are milliseconds.

    A duration needs a timing prefix, a time word in its name (``_time``, ``latency``,
    ``took``…) or a unit on its value, and no throughput/count/ratio word
    (``tokens_per_sec``, ``num_``, ``mfu``…).
    """
    norm = normalise(key)
    if norm in _STEP_KEYS and unit is None:
        return Key("step", norm)
    if norm in _CLOCKS or norm.endswith(("/elapsed", "/_runtime", "/elapsed_time")):
        return Key("clock", norm, _unit_scale(unit))
    timing_prefix = bool(_TIMING_PREFIX.match(norm))
    stripped = _PREFIX.sub("", norm)
    if _not_duration(stripped) or _not_duration(norm.split("/")[0]):
        return Key("other", norm)
    worded = bool(_TIME_WORD.search(stripped.replace("/", "_")))
    if not (timing_prefix or worded or unit):
        return Key("other", norm)
    scale = _unit_scale(unit)
    if unit is None:
        if line_ms or re.search(r"(?:^|[_/(])(?:ms|msec|millis\w*)(?:$|[_)/])", norm):
            scale = 1e-3
        elif re.search(r"(?:^|[_/(])(?:mins?|minutes)(?:$|[_)/])", norm):
            scale = 60.0
    name = "/".join(_strip_words(part) for part in stripped.split("/"))
    name = name.strip("/_") or "step"
    return Key("duration", name, scale)


def _strip_words(part: str) -> str:
    out = _SUFFIX.sub("", part)
    out = re.sub(r"^(?:time|timing|t)_", "", out)
    return out.strip("_") or part


# --------------------------------------------------------------------------------------------
# printed records


@dataclass
class Printed:
    """One printed record: its lines, the step it names (None: none), its pairs
    ``(key, value, unit)`` in order, and whether its values are in milliseconds."""

    first: int
    last: int
    step: int | None
    pairs: list[tuple[str, Any, str | None]] = field(default_factory=list)
    line_ms: bool = False
    label: str | None = None
    """What the record is when no step names it (a pasted table's column header)."""
    closed: bool = False
    """A record without a step that already holds its step total: it takes no more lines."""
    phased: bool = False
    """Whether the record holds a timer that is not the step total."""


def _number(text: str) -> float | None:
    try:
        value = float(text)
    except ValueError:
        return None
    return value


def _cell_pairs(text: str) -> list[tuple[str, Any, str | None]]:
    """The pairs of a table row of alternating names and numbers (``| timeperf/rollout |
    1.09e+02 | timeperf/save | 1.5e-01 |``: AReaL's stats tables put several side by
    side); [] for any other row."""
    # a prefix before the first column mark (a container's timestamp) is no cell
    text = text[text.index("|") :] if "|" in text else text
    cells = [c.strip() for c in text.strip().strip("|").split("|")]
    if len(cells) < 2 or len(cells) % 2:
        return []
    pairs = []
    for name, cell in zip(cells[::2], cells[1::2], strict=True):
        if not name and not cell:
            continue
        found = _cell_number(cell) if _HEAD_CELL.fullmatch(name) else None
        if found is None:
            return []
        pairs.append((name, found[0], found[1]))
    return pairs


def line_pairs(
    text: str, header: re.Pattern[str] | None = None
) -> tuple[int | None, list[tuple[str, Any, str | None]], bool]:
    """The step a console line names, its ``(key, value, unit)`` pairs, and whether its values
    are in milliseconds (``time (ms) | …``). A dict repr or JSON object in the line is read
    whole (its nested keys joined with ``/``). ``header``: a stack's own step header
    (slime's ``perf 3:``), its number in group 1."""
    if not _DIGIT.search(text):  # no number, no pair and no step: most chatter
        return None, [], False
    head_match = header.search(text) if header is not None else None
    line_ms = bool(_LINE_MS.search(text))
    pairs: list[tuple[str, Any, str | None]] = []
    brace = text.find("{")
    if brace >= 0 and text.rstrip().endswith("}"):
        found = _object(text[brace:])
        if found is not None:
            pairs = [(k, v, None) for k, v in _flatten(found)]
            text = text[:brace]
    arrow = _ARROW.match(text)
    if arrow is not None:
        name = arrow.group("name").strip()
        for match in _PAIR.finditer(arrow.group("rest")):
            key = f"{name} {match.group('key')}"
            pairs.append((key, match.group("value"), match.group("unit")))
        text = ""
    for match in _QUOTED.finditer(text):
        pairs.append((match.group("key"), match.group("value"), match.group("unit")))
        text = text[: match.start()] + " " * (match.end() - match.start()) + text[match.end() :]
    if text.count("|") >= 3 and not pairs:
        pairs = _cell_pairs(text)
        if pairs:
            text = ""
    timers = _TIMER_LINE.search(text)
    for match in _PAIR.finditer(text):
        unit = match.group("unit") or (match.group("kunit") or "").strip("()") or None
        if unit is None and timers is not None and match.start() >= timers.end():
            unit = timers.group(1)  # every figure after ``time (ms) |`` is a timer in ms
        pairs.append((match.group("key"), match.group("value"), unit))
    for match in _TOOK.finditer(text):
        pairs.append((match.group("key"), match.group("value"), match.group("unit")))
    if not pairs and (found := _IN.match(text)) is not None:
        pairs.append((found.group("key"), found.group("value"), found.group("unit")))
    step = None
    for key, value, unit in pairs:
        if normalise(key) in _STEP_KEYS and unit is None:
            number = _number(str(value)) if not isinstance(value, int | float) else value
            if number is not None and float(number).is_integer() and 0 <= number <= MAX_STEP:
                step = int(number)
                break
    if step is None:
        head = head_match or _HEADER.search(text)
        if head is not None and int(head.group(1)) <= MAX_STEP:
            step = int(head.group(1))
    return step, pairs, line_ms


def _object(text: str) -> dict[str, Any] | None:
    try:
        value = json.loads(text)
    except (ValueError, RecursionError):
        value = literal_dict(text)
    return value if isinstance(value, dict) else None


def _flatten(obj: dict[str, Any], prefix: str = "") -> Iterator[tuple[str, Any]]:
    for key, value in obj.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict):
            yield from _flatten(value, f"{name}/")
        else:
            yield name, value


def _cells(text: str) -> list[str] | None:
    """The cells of a table row (``|``, tab or comma separated), outer pipes dropped."""
    stripped = text.strip()
    if "|" in stripped:
        cells = [c.strip() for c in stripped.strip("|").split("|")]
    elif "\t" in stripped:
        cells = [c.strip() for c in stripped.split("\t")]
    elif "," in stripped:
        cells = [c.strip() for c in stripped.split(",")]
    else:
        return None
    return cells if len(cells) >= 2 else None


def _table_header(cells: list[str]) -> bool:
    """A header row: names only (no number), one of them a step or a timing-like column."""
    if any(_number(c) is not None for c in cells) or not all(cells):
        return False
    kinds = {classify(c).kind for c in cells}
    return "duration" in kinds and all(_HEAD_CELL.fullmatch(c) for c in cells)


_HEAD_CELL = re.compile(r"[A-Za-z_#(`*][\w ./()#%\[\]`*-]{0,60}")
"""A column name: words, ``/``, a unit in brackets; no ``:`` or ``=`` (a pair, not a name)."""


def records_from_lines(
    lines: Iterable[tuple[int, str]], stack: Stack | None = None
) -> list[Printed]:
    """Printed records among console lines ``(line number, cleaned text)``.

    A line naming a step and a timing pair is a record of its own; a line naming a step and
    no timing pair (a step header, or a step line of losses only) opens a block that the
    following lines without a step fill until the next line naming a step (``stack``: its
    own step header is one too); table rows under
    a header of timer names are records; lines with timing pairs and no step outside any
    block are records numbered in order, a new one where a timer repeats.
    """
    out: list[Printed] = []
    block: Printed | None = None
    table: list[str] | None = None
    table_gap = 0
    lines = [(n, _QUOTE.sub("", t.translate(_BOX))) for n, t in lines if not _RULE.match(t)]
    skip_to = -1
    started: list[str] = []  # timers a ``Started: 'x'`` line opened, outermost first
    totals = _totals(stack)
    for index, (number, text) in enumerate(lines):
        if index < skip_to:
            continue
        cells = _cells(text) if ("|" in text or "\t" in text or "," in text) else None
        if cells is not None and table is None:
            columns, end = _transposed(lines, index, cells)
            if columns:
                out.extend(columns)
                skip_to, block = end, None
                continue
        if cells is not None and _table_header(cells):
            table, block = cells, None
            continue
        if table is not None and cells is not None:
            if all(re.fullmatch(r":?-{2,}:?", c) for c in cells if c):
                continue
            labelled = classify(table[0]).kind == "other" and not _cell_number(cells[0])
            values = cells[1:] if labelled else cells
            if len(cells) == len(table) and all(_cell_number(c) is not None for c in values if c):
                out.append(_table_row(number, table, cells, labelled))
                table_gap = 0
                continue
        if table is not None and text.strip() and table_gap < 2:
            table_gap += 1  # maybe a stray line another process printed inside the table
        else:
            table, table_gap = None, 0
        opened = _STARTED.search(text) if "'" in text or '"' in text or "`" in text else None
        if opened is not None:
            started.append(opened.group("key"))
            continue
        step, pairs, line_ms = line_pairs(text, stack.step_header if stack else None)
        if started and pairs:
            pairs = _nest_finished(pairs, started)
        timing = [p for p in pairs if classify(p[0], p[2], line_ms).kind == "duration"]
        if step is not None:
            record = Printed(number, number, step, pairs, line_ms)
            last = out[-1] if out else None
            if (
                last is not None and last.step is None and last.last >= number - 3
                and not _repeats(last, timing)
            ):  # fmt: skip
                # timers printed just before the step line that closes them (DeepSpeed's
                # ``time (ms) | …`` before ``steps: 30 … iter time (s): …``)
                record.pairs = last.pairs + pairs
                record.first = last.first
                record.line_ms = record.line_ms or last.line_ms
                out[-1] = record
            else:
                out.append(record)
            block = record if not timing else None
            continue
        if not pairs:
            continue
        if block is not None:
            if timing and _repeats(block, timing):
                block = None
            else:
                block.pairs.extend(pairs)
                block.last = number
                block.line_ms = block.line_ms or line_ms
                continue
        last = out[-1] if out else None
        if not timing:
            if last is not None and last.step is None and last.last >= number - 3:
                last.last = number  # other figures of the same record (a dict's throughputs)
            continue
        # timers without a step fill one record until a timer repeats or the step's total
        # ends it, however many other lines (progress bars, blank lines) come between
        if (
            last is not None and last.step is None and not last.closed
            and not _repeats(last, timing)
        ):  # fmt: skip
            last.pairs.extend(pairs)
            last.last = number
        else:
            last = Printed(number, number, None, pairs, line_ms)
            out.append(last)
        # a step's total printed after its phases ends the record (SkyRL's ``Finished:
        # 'step'``): the next timer belongs to the next step; printed first (NeMo-RL's
        # ``Total step time``), it opens the record
        names = [(classify(k, u, line_ms).name, "/" in k) for k, _, u in timing]
        last.phased = last.phased or any(n not in totals for n, _ in names)
        last.closed = last.phased and any(n in totals for n, nested in names if not nested)
    return out


_STARTED = re.compile(
    r"(?i)\b(?:started|starting|start|begin(?:ning)?|entering)\b[:\s]*['\"`](?P<key>[^'\"`]{1,80})"
    r"['\"`]\s*\.{0,3}\s*$"
)
"""``Started: 'generate'`` (SkyRL, marin): opens a timer its ``Finished: …`` line closes."""


def _nest_finished(
    pairs: list[tuple[str, Any, str | None]], started: list[str]
) -> list[tuple[str, Any, str | None]]:
    """A ``Finished: 'x'`` timer inside the timers still open around it, as ``outer/x``; x
    (and anything opened after it and never finished) is closed."""
    out = []
    for key, value, unit in pairs:
        if key in started:
            at = len(started) - 1 - started[::-1].index(key)
            key = "/".join([*started[:at], key])
            del started[at:]
        out.append((key, value, unit))
    return out


_BOX = str.maketrans({"│": "|", "┃": "|", "║": "|"})
"""Box-drawing column marks (``tabulate``'s ``fancy_grid``) read as ``|``."""
_RULE = re.compile(r"^\s*[╒╞╘├└┌╔╠╚+|─━═┼┬┴╪╤╧\-:\s]*[─━═\-]{3,}[╕╡╛┤┘┐╗╣╝+|─━═┼┬┴╪╤╧\-:\s]*$")
"""A table's border or separator line (``╒════╤═══╕``, ``+----+``)."""
_MAX_TABLE_ROWS = 200
"""Rows of a table with a row per timer read at most (a pasted table is short)."""
_QUOTE = re.compile(r"^\s*(?:>\s?)+")
"""A quoted reply's ``> > `` in front of a pasted line."""
_NOT_RUN_COLUMN = re.compile(r"(?i)^(?:gap|diff\w*|delta|change|speed-?up|improvement|ratio|"
                             r"share|%|pct|percent)\b")  # fmt: skip


def _transposed(
    lines: list[tuple[int, str]], index: int, header: list[str]
) -> tuple[list[Printed], int]:
    """A pasted table with a row per timer and a column per run (``| | run A | run B |``, then
    ``| E2E time (s) | 855.09 | About 538 |``…): one record per column, and the index of the
    line after the table; ([], index) when the lines at ``index`` are no such table."""
    if not all(_HEAD_CELL.fullmatch(c) for c in header if c):
        return [], index
    rows: list[tuple[int, str, list[str]]] = []
    j = index + 1
    while j < len(lines) and len(rows) < _MAX_TABLE_ROWS:
        number, text = lines[j]
        cells = _cells(text)
        if cells is None:
            break
        if all(re.fullmatch(r":?-{2,}:?", c) for c in cells if c):
            j += 1
            continue
        values = cells[1:]
        if (
            len(cells) not in (len(header), len(header) + 1)
            or not _HEAD_CELL.fullmatch(cells[0])
            or not all(_cell_number(c) is not None for c in values if c)
        ):
            break
        j += 1
        rows.append((number, cells[0], values))
    timers = [r for r in rows if classify(r[1]).kind == "duration"]
    if len(rows) < 2 or not timers:
        return [], index
    width = len(rows[0][2])
    names = header if len(header) == width else header[1:]
    records = []
    for col, name in enumerate(names):
        if _NOT_RUN_COLUMN.match(name.strip()):
            continue
        pairs = []
        for _, key, values in rows:
            found = _cell_number(values[col]) if col < len(values) else None
            if found is not None:
                pairs.append((key, found[0], found[1]))
        if pairs:
            record = Printed(rows[0][0], rows[-1][0], None, pairs, label=name.strip() or None)
            records.append(record)
    return records, j


def _repeats(record: Printed, timing: list[tuple[str, Any, str | None]]) -> bool:
    """Whether a line's timers are already in ``record`` (then it starts the next one)."""
    have = {
        normalise(k) for k, _, u in record.pairs
        if classify(k, u, record.line_ms).kind == "duration"
    }  # fmt: skip
    return any(normalise(k) in have for k, _, _ in timing)


_CELL = re.compile(
    rf"(?i)\s*(?:about|approx\.?|ca\.?|~|≈)?\s*({_NUM})\s*({_UNIT})?\s*(?:\(.*\))?\s*"
)


def _cell_number(cell: str) -> tuple[str, str | None] | None:
    """A table cell's number and unit (``12.3``, ``12.3 s``, ``About 538``, ``0.5 (4%)``)."""
    match = _CELL.fullmatch(cell)
    return (match.group(1), match.group(2)) if match else None


def _table_row(number: int, header: list[str], cells: list[str], labelled: bool = False) -> Printed:
    """A row of a table with a column per timer; ``labelled``: its first cell names the row
    (a run, a backend) rather than holding a number."""
    pairs: list[tuple[str, Any, str | None]] = []
    step = None
    label = cells[0] if labelled else None
    if labelled:
        header, cells = header[1:], cells[1:]
    for name, cell in zip(header, cells, strict=False):
        found = _cell_number(cell)
        if found is None:
            continue
        value, unit = found
        if normalise(name) in _STEP_KEYS and unit is None:
            if _plausible_step(float(value)):
                step = int(float(value))
            continue
        pairs.append((name, value, unit))
    return Printed(number, number, step, pairs, label=label)


# --------------------------------------------------------------------------------------------
# whole-file JSON: a metric dump, a list of records, JSON lines


def records_from_json(value: Any) -> tuple[list[Printed], dict[str, dict[float, float]]]:
    """Printed records of a whole-file JSON document, and the series keyed by something else
    than steps (NeMo-RL's ``ray/node.N.gpu.M.*`` telemetry by elapsed seconds).

    ``{metric: {step: value}}`` (a metric dump) becomes one record per step; a list of
    objects (or ``{"log_history": [...]}``) one record per object.
    """
    if isinstance(value, dict) and isinstance(value.get("log_history"), list):
        value = value["log_history"]
    if isinstance(value, list):
        out = []
        for i, item in enumerate(value):
            if isinstance(item, dict):
                pairs = [(k, v, None) for k, v in _flatten(item)]
                out.append(_with_step(Printed(i + 1, i + 1, None, pairs)))
        return out, {}
    if not isinstance(value, dict):
        return [], {}
    series = {k: v for k, v in value.items() if isinstance(v, dict) and v}
    if not series or len(series) < len(value) / 2:
        return [_with_step(Printed(1, 1, None, [(k, v, None) for k, v in _flatten(value)]))], {}
    telemetry: dict[str, dict[float, float]] = {}
    by_step: dict[int, Printed] = {}
    for metric, points in series.items():
        if _TELEMETRY.match(metric):
            telemetry[metric] = {
                float(x): y for x, y in points.items() if _number(str(x)) is not None
            }
            continue
        if metric.startswith("ray/"):  # on the telemetry's clock (seconds), not steps
            continue
        for x, y in points.items():
            number = _number(str(x))
            if number is None or not number.is_integer() or not 0 <= number <= MAX_STEP:
                continue
            step = int(number)
            record = by_step.setdefault(step, Printed(1, 1, step))
            record.pairs.append((metric, y, None))
    return [by_step[s] for s in sorted(by_step)], telemetry


def _plausible_step(number: float) -> bool:
    return math.isfinite(number) and float(number).is_integer() and 0 <= number <= MAX_STEP


def _with_step(record: Printed) -> Printed:
    for key, value, _ in record.pairs:
        number = value if isinstance(value, int | float) and not isinstance(value, bool) else None
        if normalise(key) in _STEP_KEYS and number is not None and _plausible_step(number):
            record.step = int(number)
            break
    return record


_TELEMETRY = re.compile(r"^(?:ray/)?node\.(\d+)\.gpu\.(\d+)\.(util|mem_gb|memory_gb|mem)$")


def gpu_frame(telemetry: dict[str, dict[float, float]], start_ns: int = 0) -> pd.DataFrame:
    """GPU samples of NeMo-RL's Ray telemetry (``ray/node.N.gpu.M.util`` in percent,
    ``….mem_gb`` in GB) on its own clock: elapsed seconds from the run's start."""
    rows: dict[tuple[int, int, float], dict[str, Any]] = {}
    for metric, points in telemetry.items():
        match = _TELEMETRY.match(metric)
        if match is None:
            continue
        node, gpu, what = int(match.group(1)), int(match.group(2)), match.group(3)
        for x, y in points.items():
            value = y if isinstance(y, int | float) and not isinstance(y, bool) else None
            if value is None or not math.isfinite(value) or not 0 <= x <= MAX_SECONDS:
                continue
            row = rows.setdefault((node, gpu, x), {})
            if what == "util":  # Ray's ray_node_gpus_utilization, in percent
                row["util_gpu_pct"] = float(value)
            else:
                row["mem_used_bytes"] = int(value * 1e9)
    if not rows:
        return empty_frame(GpuSample)
    data = []
    for (node, gpu, x), row in sorted(rows.items()):
        sample = GpuSample(host=f"node{node}", gpu=gpu, uuid=None, t_ns=start_ns + round(x * 1e9))
        for k, v in row.items():
            setattr(sample, k, v)
        data.append(tuple(getattr(sample, c) for c in columns(GpuSample)))
    frame = pd.DataFrame(data, columns=columns(GpuSample))
    return frame.astype(empty_frame(GpuSample).dtypes.to_dict())


# --------------------------------------------------------------------------------------------
# a printed record as a step


@dataclass
class _Node:
    name: str
    seconds: float | None = None
    children: dict[str, _Node] = field(default_factory=dict)

    def total(self) -> float:
        if self.seconds is not None:
            return self.seconds
        return sum(c.total() for c in self.children.values())


def step_record(
    printed: Printed, stack: Stack | None, skipped: Skipped, clocks: dict[int, float]
) -> StepRecord:
    """The `StepRecord` of a printed record: its durations as a tree of nested timers, the
    step total, the phases after the step. ``clocks``: elapsed seconds by record index (an
    ever-growing clock key), filled here for the caller to judge."""
    root = _Node("")
    total: float | None = None
    attrs: dict[str, Any] = {}
    totals = _totals(stack)
    ignore = stack.ignore if stack else frozenset()
    for key, value, unit in printed.pairs:
        kind = classify(key, unit, printed.line_ms)
        if kind.kind == "other":
            number = value if isinstance(value, int | float) else _number(str(value))
            if number is not None and not isinstance(number, bool) and math.isfinite(number):
                attrs.setdefault(normalise(key), float(number))
            continue
        if kind.kind == "step":
            continue
        seconds = _seconds(value, kind.scale, key, printed, skipped)
        if seconds is None:
            continue
        if kind.kind == "clock":
            clocks[printed.first] = seconds
            continue
        parts = kind.name.split("/")
        if parts[-1] in ignore or kind.name in ignore:
            continue
        if len(parts) == 1 and parts[0] in totals:
            total = seconds
            continue
        _insert(root, parts, seconds)
    root, promoted = _step_group(root, totals)
    if promoted is not None and total is None:
        total = promoted
    if root.seconds is not None and total is None:
        total = root.seconds
    if total == 0 and root.children:  # a step timer read after it was reset (DeeperSpeed)
        skipped.add("value", "a step total of 0 s beside timed phases",
                    f"line {printed.first}", printed.first)  # fmt: skip
        total = None
    if "step" in root.children:  # a timer named "step" that is no total: an optimizer's step
        node = root.children.pop("step")
        node.name = "optimizer_step"
        root.children["optimizer_step"] = node
    _apply_parents(root, stack)
    record = StepRecord(step=printed.step, line=printed.first, last_line=printed.last)
    record.step_s = total
    record.attrs = {k: v for k, v in list(attrs.items())[:40]}
    if printed.label:
        record.attrs["column"] = printed.label[:80]
    after_names = stack.after if stack else frozenset()
    for child in _ordered(root, stack):
        _emit(record, child, prefix="")
    _move_after(record, total, after_names)
    return record


def _ordered(root: _Node, stack: Stack | None) -> list[_Node]:
    """The step's top-level timers in the order the stack runs them (as printed when it names
    no order, or for timers it does not list)."""
    nodes = list(root.children.values())
    if stack is None or not stack.order:
        return nodes
    rank = {name: i for i, name in enumerate(stack.order)}
    return sorted(nodes, key=lambda n: rank.get(n.name, len(rank)))


def _totals(stack: Stack | None) -> frozenset[str]:
    """Timer names that are the whole step: the stack's, and the generic ones it does not
    use for a phase (DeepSpeed's pipeline ``step`` is its optimizer step)."""
    if stack is None:
        return _GENERIC_TOTALS
    return stack.totals | (_GENERIC_TOTALS - set(stack.phases))


_HMS = re.compile(r"^(\d+):([0-5]?\d)(?::([0-5]?\d))?(\.\d+)?$")


def _hms(text: str) -> float | None:
    """``5:13:22`` / ``13:22`` / ``1:02:03.5`` as seconds (None for anything else)."""
    match = _HMS.match(text.strip())
    if match is None:
        return None
    parts = [int(g) for g in match.groups()[:3] if g is not None]
    seconds = 0.0
    for part in parts:
        seconds = seconds * 60 + part
    return seconds + float(match.group(4) or 0)


def _seconds(value: Any, scale: float, key: str, printed: Printed, skipped: Skipped):
    number = value if isinstance(value, int | float) else _number(str(value).strip())
    if number is None and isinstance(value, str) and (clock := _hms(value)) is not None:
        number, scale = clock, 1.0
    where = f"line {printed.first}: {key}"
    if number is None or isinstance(number, bool):
        skipped.add("value", "not a number", f"{where} = {str(value)[:30]}", printed.first)
        return None
    if not math.isfinite(number):
        skipped.add("value", "NaN or infinite", f"{where} = {value}", printed.first)
        return None
    seconds = float(number) * scale
    if seconds < 0 or seconds > MAX_SECONDS:
        skipped.add("value", "not a plausible duration", f"{where} = {value}", printed.first)
        return None
    return seconds


def _insert(root: _Node, parts: list[str], seconds: float) -> None:
    node = root
    for part in parts[:-1]:
        node = node.children.setdefault(part, _Node(part))
    leaf = parts[-1]
    own = leaf == "total" or (leaf.startswith("total_") and leaf[6:] == node.name)
    if own and node is not root:
        node.seconds = seconds
        return
    child = node.children.setdefault(leaf, _Node(leaf))
    child.seconds = seconds


def _step_group(root: _Node, totals: frozenset[str]) -> tuple[_Node, float | None]:
    """The node whose children are the step's phases, and the step total it gives: a timer
    named as the step that holds others (SkyRL's ``step`` around its phases), or a group
    holding the step total (NeMo-RL's ``train`` with ``total_step_time``), stands for the
    step; other top-level timers stay beside its phases."""
    for name, child in list(root.children.items()):
        if name in totals and child.children:
            del root.children[name]
            merged = _Node("", child.seconds, {**child.children, **root.children})
            return merged, child.seconds
    for name, child in list(root.children.items()):
        held = [n for n in child.children if n in totals]
        if held and child.children:
            step = child.children.pop(held[0])
            child.seconds = step.seconds
            del root.children[name]
            merged = _Node("", child.seconds, {**child.children, **root.children})
            return merged, None
    return root, None


def _apply_parents(root: _Node, stack: Stack | None) -> None:
    """Move top-level timers under the timer the stack says they run in (wherever in the tree
    that one is): DeepSpeed's ``backward_inner`` inside ``backward``, NeMo-RL's
    ``get_logprobs/*`` inside ``policy_and_reference_logprobs``."""
    if stack is None:
        return
    for child_name, parent_name in stack.parents.items():
        child = root.children.get(child_name)
        parent = _find(root, parent_name)
        if child is None or parent is None or child is parent or _find(child, parent_name):
            continue
        del root.children[child_name]
        parent.children.setdefault(child_name, child)


def _find(node: _Node, name: str) -> _Node | None:
    for child in node.children.values():
        if child.name == name:
            return child
        found = _find(child, name)
        if found is not None:
            return found
    return None


def _emit(record: StepRecord, node: _Node, prefix: str, parent: str | None = None) -> None:
    name = f"{prefix}{node.name}"
    seconds = node.total()
    if parent is None:
        record.phases.append((name, seconds))
    else:
        record.children.setdefault(parent, []).append((name, seconds))
    for child in node.children.values():
        _emit(record, child, f"{name}/", name)


def _move_after(record: StepRecord, total: float | None, after: frozenset[str]) -> None:
    """Phases the step total does not hold: those the stack runs after its step timer (or any
    evaluation / checkpoint) go after the step, last first, while the rest exceed it."""
    if total is None:
        return
    inner = sum(s for _, s in record.phases)
    if inner <= total * 1.01 + 1e-6:
        return
    movable = [
        (name, s) for name, s in record.phases
        if name in after or phase_from_name(name) in ("eval", "checkpoint")
    ]  # fmt: skip
    for name, seconds in reversed(movable):
        if inner <= total * 1.01 + 1e-6:
            break
        record.phases.remove((name, seconds))
        record.after.insert(0, (name, seconds))
        inner -= seconds


# --------------------------------------------------------------------------------------------
# the whole file


@dataclass
class Read:
    """What the reader found in one text: records, the stack it names, the GPU telemetry
    series, notes and the values skipped."""

    records: list[StepRecord]
    stack: Stack | None
    telemetry: dict[str, dict[float, float]]
    notes: list[str]
    skipped: Skipped
    clock: bool = False


def read_text(text: str, lines: list[tuple[int, str]] | None = None) -> Read:
    """Step records of any text holding per-step timings (see the module's docstring)."""
    skipped = Skipped()
    notes: list[str] = []
    stripped = text.lstrip()
    printed: list[Printed] = []
    telemetry: dict[str, dict[float, float]] = {}
    stack = recognise(text[: 64 << 20])
    if stripped[:1] in "{[" and lines is None:
        try:
            document = json.loads(stripped)
        except (ValueError, RecursionError):
            document = None
        if document is not None:
            printed, telemetry = records_from_json(document)
    if not printed and not telemetry:
        if lines is None:
            lines = [(n, t) for n, t, _ in console_lines(text)]
        printed = records_from_lines(lines, stack)
    records, clock = _records(printed, stack, skipped, notes)
    return Read(records, stack, telemetry, notes, skipped, clock)


def _records(
    printed: list[Printed], stack: Stack | None, skipped: Skipped, notes: list[str]
) -> tuple[list[StepRecord], bool]:
    """Step records of printed records: lines of one step merged, records with no timing
    left out when others have it, steps numbered in order where none is named, ends placed
    on an ever-growing elapsed clock."""
    merged: list[Printed] = []
    by_step: dict[int, Printed] = {}
    for record in printed:
        if record.step is not None and record.step in by_step:
            into = by_step[record.step]
            into.pairs.extend(record.pairs)
            into.last = max(into.last, record.last)
            into.line_ms = into.line_ms or record.line_ms
            continue
        if record.step is not None:
            by_step[record.step] = record
        merged.append(record)
    clocks: dict[int, float] = {}
    out = [step_record(p, stack, skipped, clocks) for p in merged]
    if stack is not None and stack.total_lags:
        _unlag_totals(out, notes)
    lead = _set_up(out, notes)
    timed = [r for r in out if r.phases or r.step_s is not None]
    if not timed:
        records = _from_clock(merged, clocks, notes) if clocks else []
        return records, bool(records)
    if len(timed) < len(out):
        stepless = [r for r in out if not (r.phases or r.step_s is not None)]
        notes.append(f"{len(stepless)} records without any timing left out")
    out = timed
    named = any(r.step is not None for r in out)
    if named:
        unnamed = [r for r in out if r.step is None]
        if unnamed:
            notes.append(
                f"{len(unnamed)} timing records outside any numbered step left out "
                "(start-up or between steps)"
            )
        out = [r for r in out if r.step is not None]
    else:
        for i, record in enumerate(out, start=1):
            record.step = i
    clock = _place_on_clock(out, clocks)
    if lead and out and not clock:
        first = out[0]
        length = max(first.step_s or 0.0, sum(s for _, s in first.phases))
        first.end_ns = round((lead + length + sum(s for _, s in first.after)) * 1e9)
    return out, clock


_SET_UP = frozenset({"setup", "init", "set_up", "initialization"})


def _unlag_totals(records: list[StepRecord], notes: list[str]) -> None:
    """Give each step the total the next record carries (a stack that logs a step's total with
    the step after it); the last step keeps none (its phases' sum)."""
    totals = [r.step_s for r in records]
    for i, record in enumerate(records):
        record.step_s = totals[i + 1] if i + 1 < len(totals) and totals[i + 1] else None
    if any(t for t in totals):
        notes.append("each step's total taken from the next step's record (logged a step late)")


def _set_up(records: list[StepRecord], notes: list[str]) -> float:
    """Remove the records that time only the run's set-up (NeMo-RL's ``timing/setup/*`` at
    step 0) and return its length in seconds: the first step starts after it."""
    lead = 0.0
    for record in list(records):
        names = {n.split("/", 1)[0] for n, _ in record.phases}
        if names and names <= _SET_UP:
            lead += sum(s for _, s in record.phases)
            records.remove(record)
    if lead:
        notes.append(f"set-up before the first step: {lead:.1f} s (the first step starts after it)")
    return lead


def _from_clock(
    printed: list[Printed], clocks: dict[int, float], notes: list[str]
) -> list[StepRecord]:
    """Step times from an elapsed clock alone (LLaMA-Factory's ``trainer_log.jsonl``:
    ``current_steps`` and ``elapsed_time`` every ``logging_steps``): the clock's advance
    between two records over the steps between them, each step ending on the clock. The
    steps before the first record are unknown. [] when the clock ever goes back."""
    points = [(p.step, clocks[p.first]) for p in printed if p.first in clocks]
    if len(points) < 2:
        return []
    out: list[StepRecord] = []
    for (step_a, t_a), (step_b, t_b) in itertools.pairwise(points):
        steps = (step_b - step_a) if step_a is not None and step_b is not None else 1
        if t_b < t_a or steps <= 0:
            return []
        per = (t_b - t_a) / steps
        for k in range(steps):
            number = (step_a + k + 1) if step_a is not None else None
            end_ns = round((t_a + (k + 1) * per) * 1e9)
            out.append(StepRecord(step=number, step_s=per, end_ns=end_ns,
                                  attrs={"duration": "clock"}))  # fmt: skip
    if any(r.step is None for r in out):
        for i, record in enumerate(out, start=1):
            record.step = i
    notes.append(
        "step times from the records' elapsed clock: its advance between two records over "
        "the steps between them (no phase is timed; the steps before the first record are "
        "unknown)"
    )
    return out


def _place_on_clock(records: list[StepRecord], clocks: dict[int, float]) -> bool:
    """End each step at its elapsed clock when the clock only grows (a cumulative time, not a
    duration); whether it did."""
    values = [clocks.get(r.line) for r in records]
    if len(records) < 2 or any(v is None for v in values):
        return False
    if any(b < a for a, b in itertools.pairwise(values)) or values[-1] == values[0]:
        return False
    for record, seconds in zip(records, values):
        record.end_ns = round(seconds * 1e9)
    return True


def phase_map(records: list[StepRecord], stack: Stack | None) -> dict[str, str]:
    """Canonical phase of each timer name: the stack's word for it, else the generic name
    rules; a nested timer inside an evaluation or checkpoint is part of it."""
    out: dict[str, str] = {}
    for record in records:
        names = [n for n, _ in record.phases + record.after]
        names += [n for kids in record.children.values() for n, _ in kids]
        for name in names:
            if name in out:
                continue
            leaf = name.rsplit("/", 1)[-1]
            phase = _phase_of(leaf, stack)
            parent = name.rsplit("/", 1)[0] if "/" in name else None
            if parent is not None:
                parent_phase = out.get(parent) or _phase_of(parent.rsplit("/", 1)[-1], stack)
                # a part of an evaluation is evaluation; a part no name explains is its parent's
                if parent_phase in ("eval", "checkpoint") or phase is None:
                    phase = parent_phase
            if phase is not None:
                out[name] = phase
    return out


def _phase_of(name: str, stack: Stack | None) -> str | None:
    if stack is not None and name in stack.phases:
        return stack.phases[name]
    if name in CANONICAL_PHASES:
        return name
    return phase_from_name(name)


# --------------------------------------------------------------------------------------------
# the importer


def sniff(head: str, path: Path) -> bool:
    """Text with per-step timings (a record naming a timing-like key with a number, and a step
    or a second such record), records on an elapsed clock, or the output of a stack this
    module knows (`frameworks.stacks`; ``parse`` then says when it times nothing): the
    fallback for every stack without a reader of its own. DeepSpeed's engine timers alone
    (``fwd``/``bwd``/``step``) are left to ``progress_log``, which places them in the steps
    of the tqdm bar around them."""
    if not head.strip() or "\x00" in head[:4096]:
        return False
    stack = recognise(head)
    stripped = head.lstrip()
    if stripped[:1] == "{" and re.search(r'"(?:ray/|timing/|timeperf/|time/)[^"]+"\s*:\s*\{', head):
        return True  # a metric dump ``{metric: {step: value}}``, maybe cut by the head
    lines = [(n, t) for n, t, _ in console_lines(head)][:20000]
    records = records_from_lines(lines, stack)
    timed, clocked = [], 0
    for record in records:
        kinds = {classify(k, u, record.line_ms) for k, _, u in record.pairs}
        if any(k.kind == "duration" for k in kinds):
            timed.append({k.name for k in kinds if k.kind == "duration"})
        clocked += record.step is not None and any(k.kind == "clock" for k in kinds)
    timed = [names for names in timed if not names <= _DS_ENGINE]
    if len(timed) >= 2 or (timed and any(r.step is not None for r in records)):
        return True
    return clocked >= 2 or stack is not None


_DS_ENGINE = frozenset({
    "fwd", "bwd", "bwd_inner", "bwd_allreduce", "forward", "backward", "backward_inner",
    "backward_allreduce", "step", "fwd_microstep", "bwd_microstep", "bwd_inner_microstep",
    "bwd_allreduce_microstep", "step_microstep", "forward_microstep", "backward_microstep",
    "backward_inner_microstep", "backward_allreduce_microstep", "optimizer_step",
    "optimizer_allgather", "optimizer_gradients", "backward_backward",
})  # fmt: skip
"""DeepSpeed engine timer names (``time (ms) | fwd: … | bwd: …``): ``progress_log``'s."""


def parse(path: Path) -> Imported:
    """The steps and phases of a file of per-step timings (unanchored: durations and order
    are real, not wall-clock times, unless the records carry an elapsed clock — then each step
    ends at it); knobs from a launch command the file holds; GPU samples from NeMo-RL's
    telemetry series. Refused with one line when nothing in it times a step."""
    text = open_text(path)
    read = read_text(text)
    if not read.records and not read.telemetry:
        from gpuprof.collectors.importers import plain_log

        # no timer at all: the messages' own times may still tell the steps
        if plain_log.sniff(text[: 1 << 20], path):
            return plain_log.parse(path)
        raise ImportFormatError(_nothing(path, read))
    framework = read.stack.name if read.stack else "unknown"
    meta: dict[str, Any] = {"framework": framework}
    if read.stack is not None and read.stack.launch is not None and read.records:
        first = read.records[0].line or 0
        stop = _NEVER if first <= 1 else _line_marker(text, first)
        argv = launch_command(text, read.stack.launch, stop)
        if argv is not None:
            meta.update(command_meta(argv, framework))
    keep_gpu_name(meta, text)
    imported = Imported(source=path, format=FORMAT, meta=meta, anchored=False)
    gpu = gpu_frame(read.telemetry) if read.telemetry else None
    # the driver that times the steps runs on the first node of the telemetry (Ray's head)
    host = str(gpu["host"].iloc[0]) if gpu is not None and len(gpu) else LOG_HOST
    imported.frames = frames_from_steps(
        read.records, framework=framework, phase_map=phase_map(read.records, read.stack),
        host=host,
    )  # fmt: skip
    if gpu is not None:
        imported.frames["gpu"] = gpu
    imported.notes.extend(describe(read))
    return imported


def _line_marker(text: str, line: int) -> re.Pattern[str]:
    """A pattern matching the text of 1-based ``line`` (the first step's), for
    `launch_command`'s stop."""
    lines = text.split("\n")
    target = lines[line - 1] if 0 < line <= len(lines) else ""
    target = clean_line(target)[0].strip()
    return re.compile(re.escape(target)) if target else _NEVER


_NEVER = re.compile(r"(?!)")


def describe(read: Read) -> list[str]:
    """The notes of a read: what was read as what, nested timers, phases after the step."""
    notes = []
    records = read.records
    who = f"{read.stack.name} " if read.stack else ""
    if records:
        names = []
        for record in records:
            for name, _ in record.phases + record.after:
                if name not in names:
                    names.append(name)
        nested = sorted({n for r in records for kids in r.children.values() for n, _ in kids})
        if names:
            more = f" (+{len(names) - 12} more)" if len(names) > 12 else ""
            notes.append(
                f"{len(records)} steps of {who}per-step timings: {', '.join(names[:12])}{more}"
            )
        else:
            notes.append(f"{len(records)} steps of {who}step times, no phase timed")
        over = [r for r in records if r.step_s and sum(s for _, s in r.phases) > r.step_s * 1.1]
        if over:
            r = over[0]
            notes.append(
                f"in {len(over)} steps the timed phases add up to more than the step total "
                f"(step {r.step}: {sum(s for _, s in r.phases):.3g} s of a {r.step_s:.3g} s "
                "step): laid out past it, as timed"
            )
        if nested:
            notes.append("nested timers laid out inside their parents (not added to them): "
                         + ", ".join(nested[:8]))  # fmt: skip
        if any(r.after for r in records):
            after = sorted({n for r in records for n, _ in r.after})
            notes.append("timed outside the step total, laid out after it: " + ", ".join(after))
        if not any(r.step_s is not None for r in records):
            notes.append("no step-total timer: each step lasts its phases' sum")
        if read.clock:
            notes.append("steps end at the records' elapsed clock")
    if read.telemetry:
        notes.append(
            f"{len(read.telemetry)} GPU telemetry series on their own clock (elapsed seconds)"
        )
    notes.extend(read.notes)
    notes.extend(read.skipped.notes())
    return notes


def _nothing(path: Path, read: Read) -> str:
    if read.skipped:
        first = read.skipped.first()
        return f"{path}: no usable step timing; skipped: {first}"
    who = f"a {read.stack.name} log, but " if read.stack is not None else ""
    return (
        f"{path}: nothing to judge: {who}no per-step timing in it (no timer, no elapsed "
        "clock beside step numbers)"
    )


def spans_from_lines(
    lines: list[tuple[int, str]], *, host: str = LOG_HOST, pid: int = 0
) -> tuple[pd.DataFrame, list[str], str | None]:
    """Spans of the per-step timings among a watched run's output lines ``(t_ns, text)``, each
    step ending when its (last) line arrived; the notes; the stack named (None: none).

    An empty frame when the lines time no step."""
    numbered = []
    arrival: dict[int, int] = {}
    for index, (t_ns, raw) in enumerate(lines, start=1):
        for piece in str(raw).split("\r"):
            cleaned, _ = clean_line(piece)
            if cleaned.strip():
                numbered.append((index, cleaned))
                arrival[index] = int(t_ns)
    text = "\n".join(t for _, t in numbered)
    read = read_text(text, numbered)
    for record in read.records:
        record.end_ns = arrival.get(record.last_line or record.line or 0)
    records = [r for r in read.records if r.end_ns is not None]
    framework = read.stack.name if read.stack else "printed"
    frames = frames_from_steps(
        records, framework=framework, phase_map=phase_map(records, read.stack), host=host,
        pid=pid,
    )  # fmt: skip
    return frames["spans"], describe(read), read.stack.name if read.stack else None
