"""Plain logs of hand-written training loops: steps and phases from timestamped messages.

A hand-written RL loop logs what it is about to do, with a time stamp and nothing else::

    2025-03-01 12:00:01,123 INFO Generating rollouts...
    2025-03-01 12:00:09,870 INFO Computing rewards
    2025-03-01 12:00:10,002 INFO train step 3 loss=0.31

No phase or timing key: the times between messages are the phases. Each message is reduced to a
template (time stamp, level and logger name dropped, numbers replaced by ``#``), and the steps
come from one of two rules:

- **a repeating cycle** (no ``--phase``): the templates logged once per step, in the same order,
  at least `MIN_CYCLES` times (`find_cycle`). Each template of the cycle marks where a phase
  starts; the phase lasts until the next phase's message. Its canonical phase comes from its
  words (`gpuprof.phases.phase_from_name`: "Generating rollouts" → rollout, "Computing rewards"
  → reward, "train step" → update_actor); a template whose words name no phase keeps its first
  words as the phase name. Occasional messages between two steps whose words name a phase
  ("Evaluating…", "Saving checkpoint") start phases of their own, laid out after the step
  (`StepRecord.after`); any other message only continues the phase it falls in.
- **``--phase NAME=REGEX`` patterns** (`compile_patterns`), used instead of the cycle when given:
  each pattern (a Python regular expression searched in the message, without its time stamp,
  level and logger name) marks where the phase NAME starts; **the first pattern given starts
  each step** (so it names the step's first phase; ``step`` itself is no phase name). Lines that
  match no pattern start nothing. Phases that end a step and are evaluations or checkpoints are
  laid out after it.

Time stamps are read in the usual forms (`read_stamps`): ISO 8601 and Python logging's asctime
(``2025-03-01 12:00:01,123``, ``T``, ``.123``, a zone), in brackets or not; loguru's
``2025-03-01 12:00:01.123 | INFO |``; rich's ``[03/01/25 12:00:01]``; ``Sat Mar  1 12:00:01
2025`` (ctime); syslog's ``Mar 01 12:00:01``; vLLM's ``INFO 03-01 12:00:01``; glog's ``I0301
12:00:01.123456``; and a bare ``12:00:01``. A stamp with a date and year is wall-clock time (a
stamp without a zone is this machine's local time, noted) and the import is anchored; a stamp
without a year or without a date only orders and spaces the messages (midnight and the new
year are counted as the clock goes back): the import is then unanchored. A line without a
stamp continues the message before it (a traceback, a printed dict). Under ``gpuprof watch``
each line's arrival time is its stamp (`records_from_messages`).
"""

from __future__ import annotations

import calendar
import itertools
import re
import time
from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from gpuprof.collectors.importers import HEAD_BYTES, Imported, ImportFormatError, open_text
from gpuprof.collectors.importers.steplog import (
    MAX_SECONDS,
    MAX_STEP,
    Skipped,
    StepRecord,
    clean_line,
    console_lines,
    frames_from_steps,
    keep_gpu_name,
)
from gpuprof.phases import canonical_phase, phase_from_name

FORMAT = "plain-log"
WEAK = True
"""Tried only after every other importer has seen the whole file (`detect`): timestamped
messages are in most logs, and a more specific format reads them better."""

MIN_CYCLES = 3
"""Times a cycle of messages must repeat, unchanged, to be taken as the training step."""

LOG_FORMATS = frozenset(
    {"verl-log", "trl-log", "openrlhf-log", "megatron-log", "progress-log", "step-timings"}
)
"""Formats of console logs: with ``--phase`` patterns such a file is read by this module
instead (`gpuprof.importing.parse_file`); GPU metrics, traces and tracker runs are not."""

AFTER_PHASES = frozenset({"eval", "checkpoint"})
"""Canonical phases that, at the end of a step, are laid out after the step span (a loop's
evaluation or checkpoint every N steps is no part of the step's time)."""

BETWEEN_PHASES = frozenset({"eval", "checkpoint", "dataload", "reshard"})
"""Canonical phases an occasional message between two steps may start (a loop's evaluation,
checkpoint, new data shard or weight sync every N steps); any other message there only
continues the phase it falls in."""
_END_WORDS = re.compile(r"(?i)\b(?:done|finished|finish|complete|completed|ended|took|over)\b")
"""Words of a message that tells something ended (``Training finished``): it starts nothing."""

# --------------------------------------------------------------------------------------------
# time stamps

_LEVELS = r"(?:DEBUG|INFO|WARNING|WARN|ERROR|CRITICAL|FATAL|NOTICE|TRACE|SUCCESS)"
_PREFIX = r"^\s*(?:(?:(?i:" + _LEVELS + r")|\[[^\]\n]{1,30}\]|\([^)\n]{1,30}\))[\s:|\-]*)?[\[(]?\s*"
"""What may come before a stamp: a level word (vLLM's ``INFO 03-01 …``), one bracketed tag
(``[rank0]:``, ``(pid=12)``), the stamp's own bracket."""
_HMS = r"(?P<H>\d{1,2}):(?P<M>\d\d):(?P<S>\d\d)(?:[.,](?P<f>\d{1,9}))?"
_MONTHS = ("Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec")
_MON = r"(?P<b>" + "|".join(_MONTHS) + r")[a-z]*\.?"
_FORMS = (
    # ISO 8601 / asctime / loguru: 2025-03-01 12:00:01,123 (also 2025/03/01, T, a zone)
    r"(?P<Y>\d{4})[-/.](?P<m>\d\d)[-/.](?P<d>\d\d)(?:T|\s+)" + _HMS
    + r"(?:\s?(?P<z>Z|UTC|GMT|[+-]\d\d:?\d\d)(?![\w:]))?",
    # rich's [%x %X]: 03/01/25 12:00:01
    r"(?P<m>\d\d)/(?P<d>\d\d)/(?P<Y>\d\d(?:\d\d)?)\s+" + _HMS,
    # ctime (Sat Mar  1 12:00:01 2025), date(1) (… UTC 2025), syslog (Mar 01 12:00:01)
    r"(?:(?:Mon|Tue|Wed|Thu|Fri|Sat|Sun)[a-z]*,?\s+)?" + _MON + r"\s+(?P<d>\d{1,2}),?\s+" + _HMS
    + r"(?:\s+(?P<z>[A-Z]{3,4}))?(?:\s+(?P<Y>\d{4})(?!\d))?",
    # glog: I0301 12:00:01.123456
    r"[IWEF](?P<m>\d\d)(?P<d>\d\d)\s+" + _HMS,
    # vLLM / OpenRLHF: INFO 03-01 12:00:01
    r"(?P<m>\d\d)-(?P<d>\d\d)\s+" + _HMS,
    # a bare time of day: 12:00:01 (not an elapsed 1:02:03:04 or a ratio 12:00:01/30)
    _HMS + r"(?![\d:/])",
)  # fmt: skip
_STAMPS = tuple(re.compile(_PREFIX + form) for form in _FORMS)
"""One compiled pattern per form of stamp (each line tries the file's most common form first)."""
_FIELDS = ("Y", "m", "b", "d", "H", "M", "S", "f", "z")
_NAMES = tuple(tuple(g for g in _FIELDS if g in rx.groupindex) for rx in _STAMPS)
"""The fields each form has, in `_FIELDS` order."""

FULL, NO_YEAR, TIME_ONLY = 0, 1, 2
"""Kinds of stamps: date with year; month and day only; time of day only."""
_DAY_NS = 86_400 * 10**9
_SAMPLE_LINES = 2000
"""Lines whose stamps decide the order in which the forms are tried."""


@dataclass
class Stamps:
    """Time stamps read from lines: ``t_ns`` (ns; since the epoch when ``anchored``, else since
    the first stamp) and ``ok`` (the line had a stamp of the file's kind) per line; ``end``: the
    offset in each line where its stamp ended; ``notes``: the assumptions made."""

    t_ns: np.ndarray
    ok: np.ndarray
    end: list[int]
    anchored: bool
    notes: list[str] = field(default_factory=list)


def read_stamps(texts: list[str]) -> Stamps:
    """The time stamp at the start of each text (see the module doc for the forms).

    The kind most lines carry (a full date, no year, time only) wins; lines of another kind, an
    impossible date or none count as unstamped. Per line, one compiled match (the file's
    commonest form first); the conversion to ns is vectorised.
    """
    n = len(texts)
    end = [0] * n
    order = _form_order(texts[:_SAMPLE_LINES])
    rows: list[list[tuple[int, tuple[str | None, ...]]]] = [[] for _ in _STAMPS]
    for i, text in enumerate(texts):
        for k in order:
            match = _STAMPS[k].match(text)
            if match is not None:
                rows[k].append((i, match.group(*_NAMES[k])))
                end[i] = match.end()
                break
    fields = np.zeros((n, 9), dtype=np.int64)  # kind, Y, m, d, H, M, S, frac ns, zone s
    found = np.zeros(n, dtype=bool)
    zoned = np.zeros(n, dtype=bool)
    for k, form_rows in enumerate(rows):
        if form_rows:
            _fill(k, form_rows, fields, found, zoned)
    if not found.any():
        return Stamps(np.zeros(n, dtype=np.int64), found, end, False)
    kind = int(np.bincount(fields[found, 0], minlength=3).argmax())
    ok = found & (fields[:, 0] == kind) & _valid(fields)
    t_ns = np.zeros(n, dtype=np.int64)
    if not ok.any():
        return Stamps(t_ns, ok, end, False)
    f = fields[ok]
    seconds = f[:, 4] * 3600 + f[:, 5] * 60 + f[:, 6]
    notes: list[str] = []
    if kind == FULL:
        days = _days_from_civil(f[:, 1], f[:, 2], f[:, 3])
        naive = ~zoned[ok]
        offset = f[:, 8].copy()
        if naive.any():
            local = _local_offset_s(f[naive][0])
            offset[naive] = local
            notes.append(
                f"time stamps have no time zone: read as this machine's local time "
                f"(UTC{local / 3600:+g} h); set TZ to the logging machine's zone if it differs"
            )
        t_ns[ok] = ((days * 86_400 + seconds - offset) * 10**9) + f[:, 7]
        return Stamps(t_ns, ok, end, True, notes)
    if kind == NO_YEAR:
        # 2000 is a leap year: 02-29 reads; a month going back is the new year
        days = _days_from_civil(np.full(len(f), 2000), f[:, 2], f[:, 3])
        days = days + 365 * np.cumsum(np.r_[0, np.diff(days) < -182])
        elapsed = (days * 86_400 + seconds) * 10**9 + f[:, 7]
        notes.append("time stamps without a year: times count from the first stamped line")
    else:
        elapsed = seconds * 10**9 + f[:, 7]
        # the clock going back by more than half a day is midnight passing
        elapsed = elapsed + _DAY_NS * np.cumsum(np.r_[0, np.diff(elapsed) < -_DAY_NS // 2])
        notes.append(
            "time stamps without a date: times count from the first stamped line (a clock "
            "going back by more than 12 h is taken as midnight passing)"
        )
    t_ns[ok] = elapsed - elapsed[0]
    return Stamps(t_ns, ok, end, False, notes)


def _form_order(sample: list[str]) -> list[int]:
    """The stamp forms, the one most lines of ``sample`` carry first."""
    seen = Counter(
        next((k for k, rx in enumerate(_STAMPS) if rx.match(text)), None) for text in sample
    )
    return sorted(range(len(_STAMPS)), key=lambda k: (-seen[k], k))


def _ints(values: tuple[str | None, ...]) -> np.ndarray:
    """Digit strings (None: 0) as int64."""
    return np.fromiter((int(v) if v else 0 for v in values), np.int64, len(values))


def _fill(
    form: int,
    rows: list[tuple[int, tuple[str | None, ...]]],
    fields: np.ndarray,
    found: np.ndarray,
    zoned: np.ndarray,
) -> None:
    """Write the stamps of one form (rows of (line index, `_FIELDS` texts)) into ``fields``
    (kind, Y, m, d, H, M, S, frac ns, zone s per line), ``found`` and ``zoned``."""
    idx = np.array([i for i, _ in rows], dtype=np.int64)
    absent = (None,) * len(rows)
    cols = dict.fromkeys(_FIELDS, absent) | dict(zip(_NAMES[form], zip(*(r for _, r in rows))))
    years = cols["Y"]
    year = _ints(years)
    if form == 1:  # rich's two-digit year
        year = np.where(year < 100, year + 2000, year)
    kind = np.full(len(rows), TIME_ONLY if form == 5 else FULL if form <= 2 else NO_YEAR)
    if form == 2:
        kind = np.where([y is None for y in years], NO_YEAR, FULL)
    if form == 2:
        month = np.array([_MONTHS.index(b[:3]) + 1 for b in cols["b"]], dtype=np.int64)
    else:
        month = _ints(cols["m"])
    fractions = tuple((v or "0").ljust(9, "0")[:9] for v in cols["f"])
    zones = [_zone_s(z) for z in cols["z"]]
    fields[idx, 0] = kind
    fields[idx, 1] = year
    fields[idx, 2] = month
    fields[idx, 3] = _ints(cols["d"])
    fields[idx, 4] = _ints(cols["H"])
    fields[idx, 5] = _ints(cols["M"])
    fields[idx, 6] = _ints(cols["S"])
    fields[idx, 7] = _ints(fractions)
    fields[idx, 8] = [z or 0 for z in zones]
    zoned[idx] = [z is not None for z in zones]
    found[idx] = True


def _zone_s(text: str | None) -> int | None:
    """A zone's UTC offset in seconds; None for none (or a zone name other than UTC)."""
    if not text:
        return None
    if text in ("Z", "UTC", "GMT"):
        return 0
    if text[0] not in "+-":
        return None
    digits = text[1:].replace(":", "")
    sign = -1 if text[0] == "-" else 1
    return sign * (int(digits[:2]) * 3600 + int(digits[2:]) * 60)


def _valid(fields: np.ndarray) -> np.ndarray:
    """Rows whose date and time exist (a garbled ``2025-13-45`` does not)."""
    kind, year, month, day = fields[:, 0], fields[:, 1], fields[:, 2], fields[:, 3]
    leap = (year % 4 == 0) & ((year % 100 != 0) | (year % 400 == 0)) | (kind != FULL)
    month_days = np.array([31, 28, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31])[
        np.clip(month - 1, 0, 11)
    ] + ((month == 2) & leap)
    dated = (month >= 1) & (month <= 12) & (day >= 1) & (day <= month_days)
    timed = (fields[:, 4] <= 23) & (fields[:, 5] <= 59) & (fields[:, 6] <= 60)
    plausible = (kind != FULL) | ((year >= 1970) & (year <= 2200))
    return (dated | (kind == TIME_ONLY)) & timed & plausible


def _days_from_civil(y: np.ndarray, m: np.ndarray, d: np.ndarray) -> np.ndarray:
    """Days since 1970-01-01 of proleptic Gregorian dates (H. Hinnant's algorithm)."""
    y = y - (m <= 2)
    era = np.floor_divide(y, 400)
    yoe = y - era * 400
    doy = (153 * (m + np.where(m > 2, -3, 9)) + 2) // 5 + d - 1
    doe = yoe * 365 + yoe // 4 - yoe // 100 + doy
    return era * 146_097 + doe - 719_468


def _local_offset_s(row: np.ndarray) -> int:
    """This machine's UTC offset (s) at a naive local time (one offset for the whole file)."""
    fields = (int(row[1]), int(row[2]), int(row[3]), int(row[4]), int(row[5]), int(row[6]),
              0, 0, -1)  # fmt: skip
    try:
        return int(calendar.timegm(fields) - time.mktime(fields))
    except (OverflowError, ValueError):
        return 0


# --------------------------------------------------------------------------------------------
# messages and their templates

_AFTER_STAMP = re.compile(r"^[\s\])|,\-:]*")
_LEVEL = re.compile(r"^\[?(?i:" + _LEVELS + r")\]?(?=$|[\s:|\]\-])(?P<colon>:(?!\s))?[\s:|\-]*")
_NAMED_LEVEL = re.compile(
    r"^(?:[\w.<>\[\]-]{1,60}\s*(?:\s-\s|\||:)\s*){1,2}\[?(?i:" + _LEVELS + r")\]?"
    r"(?=$|[\s:|\]\-])[\s:|\-]*"
)
"""``name - LEVEL - msg``, ``name | LEVEL | msg``: a logger name before the level."""
_LOGGER = re.compile(
    r"^(?:\[?[\w./-]+\.py:\d+\]\s*"  # vLLM / OpenRLHF: file.py:12]
    r"|[\w.<>-]+:[\w.<>-]+:\d+\s+-\s+"  # loguru: module:function:12 -
    r"|\[[\w.<>:-]{1,60}\]\s*"  # [logger]
    r"|(?:root|__main__|[\w<>-]+(?:\.[\w<>-]+)+|\w*_\w*)\s*(?:\s-\s|\||:)\s*)"  # name: / name -
)
_SOURCE = re.compile(
    r"^(?:\d+\s+\[?[\w./-]+\.(?:py|cc|cpp|c|h):\d+\]\s*"  # glog: thread id, file.py:12]
    r"|\S+\s+[\w./-]+\[\d+\]:\s+)"  # syslog: host program[pid]:
)
"""Where a line came from, printed before the message by glog and syslog."""
_DEFAULT_NAME = re.compile(r"^[^\s:]+:")
"""basicConfig's ``LEVEL:name:message``: after ``LEVEL:``, the name up to the next colon."""
_TRAILING_PATH = re.compile(r"\s{2,}[\w.-]+\.py:\d+\s*$")
"""rich's RichHandler prints the source file at the right edge."""
_NUMBER = re.compile(r"(?<![A-Za-z])[-+]?\d+(?:[.,:]\d+)*(?:[eE][-+]?\d+)?")
_SPACES = re.compile(r"\s+")
TEMPLATE_CHARS = 120
"""Templates longer than this are cut (a message's long tail is rarely what repeats)."""


def message_of(rest: str, leveled: bool = False) -> str:
    """A log line's message: ``rest`` (the line after its stamp) without the level, the logger
    name and separators; ``leveled`` when the level came before the stamp (vLLM's ``INFO
    03-01 12:00:01 file.py:12] msg``)."""
    text = _AFTER_STAMP.sub("", rest, count=1)
    level = _LEVEL.match(text)
    if level is not None:
        leveled = True
        default_format = level.group("colon") is not None
        text = text[level.end() :]
        if default_format:
            text = _DEFAULT_NAME.sub("", text, count=1)
    else:
        named = _NAMED_LEVEL.match(text)
        if named is not None:
            leveled = True
            text = text[named.end() :]
    text = (_LOGGER if leveled else _SOURCE).sub("", text, count=1)
    return _TRAILING_PATH.sub("", text).strip()


def template_of(message: str) -> str:
    """A message with every number replaced by ``#`` and spaces collapsed: the same for each
    step's instance of a message (``train step 3 loss=0.31`` → ``train step # loss=#``)."""
    return _SPACES.sub(" ", _NUMBER.sub("#", message)).strip()[:TEMPLATE_CHARS]


_CUT = re.compile(r"\s*(?:[^\s=]+\s*=|:\s*[#\-+]|\(#).*$")
"""Where a message's details start: ``key=value``, ``: 12``, ``(12 prompts)``."""
_STEP_WORDS = frozenset({"step", "steps", "iter", "iteration", "iterations", "epoch", "batch",
                         "it", "global", "round"})  # fmt: skip
"""Words that count steps, not say what a phase does."""
_STEMS = {"saving": "save", "loading": "load", "syncing": "sync", "updating": "update",
          "reference": "ref", "rewarding": "reward", "scoring": "score",
          "generating": "generate", "training": "train"}  # fmt: skip
"""Words of messages spelt as `phase_from_name`'s rules know them."""
_WORD = re.compile(r"[A-Za-z][A-Za-z_]*")


def phase_name(template: str) -> tuple[str, str | None]:
    """(the phase's name: a template's leading words, before its figures; the canonical phase
    those words name, or None). ``Generating rollouts...`` → (``Generating rollouts``,
    ``rollout``); ``train step # loss=#`` → (``train step``, ``update_actor``)."""
    head = _CUT.sub("", template)
    words = _WORD.findall(head) or _WORD.findall(template)
    name = " ".join(words[:4]) or template[:40] or "(message)"
    meaning = [_STEMS.get(w.lower(), w.lower()) for w in words[:6]]
    meaning = [w for w in meaning if w not in _STEP_WORDS]
    if not meaning:
        return name, None
    phase = phase_from_name("_".join(meaning))
    return name, phase if phase not in (None, "step") else None


_STEP_NUMBER = re.compile(
    r"(?i)(?<![A-Za-z])(?:global_?)?(?:step|iteration|iter)\s*[:=#]?\s*(\d{1,12})(?!\.\d)"
    r"|^\s*\[\s*(\d{1,12})\s*/\s*\d{1,12}\s*\]"
)
"""A step number a message names: ``step 3``, ``Iteration 3/100``, ``global_step=3``, a
leading ``[3/100]``."""


def step_number(message: str) -> int | None:
    """The step number a message names, or None."""
    match = _STEP_NUMBER.search(message)
    if match is None:
        return None
    value = int(match.group(1) or match.group(2))
    return value if value <= MAX_STEP else None


# --------------------------------------------------------------------------------------------
# the messages of a log


@dataclass
class Messages:
    """A log's timestamped messages, in order: ``t_ns`` (ns), the 1-based ``line`` each came
    from, its ``text`` (stamp, level and logger name dropped) and ``template`` id (into
    ``templates``); ``unstamped``: lines taken as continuations of the message before them."""

    t_ns: np.ndarray
    line: list[int]
    text: list[str]
    template: np.ndarray
    templates: list[str]
    anchored: bool
    unstamped: int = 0
    notes: list[str] = field(default_factory=list)


def messages_from_lines(numbered: list[tuple[int, int | None, str]]) -> Messages:
    """The messages among cleaned lines ``(line number, t_ns or None, text)``.

    A line with a time (a watched run's arrival time, ns since the epoch) is a message at that
    time; a line without one is at the stamp its text carries — when some lines have times,
    only a wall-clock stamp (with a date and year) is taken, so that both count from the same
    epoch. A line with neither continues the message before it.
    """
    texts = [text for _, _, text in numbered]
    stamps = read_stamps(texts)
    given = np.array([t is not None for _, t, _ in numbered], dtype=bool)
    if given.any():
        times = np.array([t if t is not None else 0 for _, t, _ in numbered], dtype=np.int64)
        use = given | (stamps.ok & stamps.anchored)
        t_ns = np.where(given, times, stamps.t_ns)[use]
        anchored = True
        notes = stamps.notes if (use & ~given).any() else []
    else:
        use, t_ns = stamps.ok, stamps.t_ns[stamps.ok]
        anchored, notes = stamps.anchored, stamps.notes
    keep = [int(i) for i in np.flatnonzero(use)]
    rests = [texts[i][stamps.end[i] :] if stamps.ok[i] else texts[i] for i in keep]
    leveled = [_LEVEL.match(texts[i].lstrip("[( ")) is not None for i in keep]
    text = [message_of(rest, lv) for rest, lv in zip(rests, leveled)]
    codes: dict[str, int] = {}
    ids = np.array([codes.setdefault(template_of(m), len(codes)) for m in text], dtype=np.int64)
    return Messages(
        t_ns=t_ns,
        line=[numbered[i][0] for i in keep],
        text=text,
        template=ids,
        templates=list(codes),
        anchored=anchored,
        unstamped=len(numbered) - len(keep),
        notes=notes,
    )


# --------------------------------------------------------------------------------------------
# the cycle of a training step


@dataclass
class Cycle:
    """A step's messages: template ids in the order each step logs them; ``good``: steps that
    logged exactly these; ``steps``: every step that began with the first."""

    order: tuple[int, ...]
    good: int
    steps: int


def _runs(template: np.ndarray) -> np.ndarray:
    """Indices of the messages that start a run of the same template (a message repeated in a
    row — a per-batch line, the same line from several ranks — is one occurrence)."""
    if not len(template):
        return np.zeros(0, dtype=np.int64)
    return np.flatnonzero(np.r_[True, template[1:] != template[:-1]])


_NOISE = re.compile(
    r"Traceback \(most recent call last\)|\b[A-Z]\w*(?:Warning|Error|Exception)\b"
    r"|^(?:Warning|Error|Exception)\b|^File \""
)
"""Warnings, errors and tracebacks: a worker printing the same warning at each start repeats
too, but that is no step."""


def _wordy(template: str) -> bool:
    """A template that may mark a phase: it says something (a word of 3 letters or more, not
    a row of figures) and is no warning, error or traceback."""
    return re.search(r"[A-Za-z]{3}", template) is not None and _NOISE.search(template) is None


def find_cycle(seq: list[int], templates: list[str]) -> Cycle | None:
    """The cycle of templates one training step logs, in a sequence of template ids (one per
    run of equal messages), or None when none repeats `MIN_CYCLES` times.

    Candidates are the sets of templates logged about equally often (within 10%); a set's
    cycle is the most common order its templates follow from one occurrence of its first
    template to the next, and it must hold at least two templates and make at least half of
    those spans. Of several, the cycle whose messages name the most distinct phases (other than
    evaluation and checkpoints) wins; then the longer; then the rarer (the outer loop: the step,
    not its micro-batches).
    """
    counts = Counter(t for t in seq if _wordy(templates[t]))
    best: tuple[tuple, Cycle] | None = None
    tried: set[frozenset[int]] = set()
    for c in sorted({n for n in counts.values() if n >= MIN_CYCLES}, reverse=True):
        group = frozenset(t for t, n in counts.items() if 0.9 * c - 1 <= n <= c)
        if len(group) < 2 or group in tried:
            continue
        tried.add(group)
        cycle = _fit(seq, group)
        if cycle is None:
            continue
        phases = {phase_name(templates[t])[1] for t in cycle.order}
        steady = phases - AFTER_PHASES - {None}
        if phases <= AFTER_PHASES:
            continue  # an evaluation every N steps repeats too, but it is no step
        key = (len(steady), len(cycle.order), -c)
        if best is None or key > best[0]:
            best = (key, cycle)
    return best[1] if best else None


def _fit(seq: list[int], group: frozenset[int]) -> Cycle | None:
    """The cycle of ``group``'s templates in ``seq`` (see `find_cycle`), or None."""
    members = [t for t in seq if t in group]
    start = members[0]
    spans: list[tuple[int, ...]] = []
    current: list[int] = []
    for t in members:
        if t == start and current:
            spans.append(tuple(current))
            current = []
        current.append(t)
    spans.append(tuple(current))
    shapes = Counter(s for s in spans if len(s) >= 2 and len(set(s)) == len(s))
    if not shapes:
        return None
    order, good = shapes.most_common(1)[0]
    if good < MIN_CYCLES or good < 0.5 * len(spans):
        return None
    return Cycle(order=order, good=good, steps=len(spans))


# --------------------------------------------------------------------------------------------
# marks: where phases start, laid out as step records


@dataclass
class Mark:
    """A message where a phase starts: its index among the messages, the phase's name, whether
    it starts a step, and whether it is laid out after the step when it ends one."""

    at: int
    name: str
    starts_step: bool = False
    after: bool = False
    key: str = ""
    """Phases of equal keys in a row are one (the canonical phase for a cycle's messages:
    ``Evaluating…`` then ``eval acc=0.5`` is one evaluation); the name when empty."""


def _cycle_marks(msgs: Messages, cycle: Cycle, notes: list[str]) -> list[Mark]:
    """Marks of a cycle's messages and of the occasional phase-naming messages between steps."""
    runs = _runs(msgs.template)
    names = {t: phase_name(msgs.templates[t]) for t in set(msgs.template.tolist())}
    members = set(cycle.order)
    counts = Counter(msgs.template[runs].tolist())
    marks: list[Mark] = []
    pending: list[Mark] = []  # messages after a step's last cycle message, before the next step
    extras: Counter[int] = Counter()
    seen: list[int] = []
    for at in runs.tolist():
        t = int(msgs.template[at])
        if t in members:
            if t == cycle.order[0]:
                marks.extend(pending)
                seen = []
            elif not marks:
                continue  # before the first step
            pending = []
            seen.append(t)
            name, phase = names[t]
            marks.append(Mark(at, name, starts_step=t == cycle.order[0], key=phase or name))
            continue
        name, phase = names[t]
        # an occasional message naming a phase, once the step's messages are all logged
        if (
            marks
            and phase in BETWEEN_PHASES
            and counts[t] < 0.5 * cycle.good
            and _complete(seen, cycle)
            and not _END_WORDS.search(msgs.templates[t])
        ):
            pending.append(Mark(at, name, after=True, key=phase))
            extras[t] += 1
    marks.extend(pending)
    if extras:
        listed = ", ".join(
            f"'{msgs.templates[t]}' ({names[t][1]}, {n}×)" for t, n in extras.most_common(6)
        )
        notes.append(
            f"occasional messages between steps laid out as phases after their step: {listed}"
        )
    return marks


def _complete(seen: list[int], cycle: Cycle) -> bool:
    """Whether a step has logged its cycle's last message."""
    return bool(seen) and seen[-1] == cycle.order[-1]


def _pattern_marks(msgs: Messages, patterns: list[tuple[str, re.Pattern[str]]]) -> list[Mark]:
    """Marks of the messages the ``--phase`` patterns match (the first matching pattern wins;
    a phase matched again right after itself goes on; the first pattern starts a step)."""
    marks: list[Mark] = []
    for at, text in enumerate(msgs.text):
        which = next((k for k, (_, rx) in enumerate(patterns) if rx.search(text)), None)
        if which is None:
            continue
        name = patterns[which][0]
        if which and marks and marks[-1].name == name:
            continue
        if not marks and which:
            continue  # before the first step
        phase = phase_from_name(name) or canonical_phase(name)
        marks.append(Mark(at, name, starts_step=which == 0, after=phase in AFTER_PHASES))
    return marks


def records_from_marks(
    msgs: Messages, marks: list[Mark], skipped: Skipped, notes: list[str], complete: Cycle | None
) -> list[StepRecord]:
    """Step records from phase marks: each phase lasts from its message to the next mark; the
    last phase of the log lasts until the next message the loop does not log inside its steps
    (``Training finished``), and its step is left out when there is none. Consecutive phases of
    the same `Mark.key` are one. With a ``complete`` cycle, a last step that did not log all of it
    (the log ends inside it) is left out; steps that logged another order are kept, noted."""
    starts = [k for k, m in enumerate(marks) if m.starts_step]
    if not starts:
        return []
    groups = [marks[a:b] for a, b in zip(starts, [*starts[1:], len(marks)])]
    inner = _inner_templates(msgs, marks, starts)
    numbers = _step_numbers(msgs, groups)
    records: list[StepRecord] = []
    irregular = 0
    for g, group in enumerate(groups):
        last = g == len(groups) - 1
        if complete is not None:
            shape = tuple(int(msgs.template[m.at]) for m in group if not m.after)
            if shape != complete.order:
                if last:
                    notes.append(f"the log ends inside step {numbers[g]}: left out")
                    continue
                irregular += 1
        if not last:
            end_ns = int(msgs.t_ns[groups[g + 1][0].at])
        else:
            tail = _tail_end(msgs, group[-1].at, inner)
            if tail is None:
                notes.append(
                    f"nothing was logged after the last step's last phase ({group[-1].name}): "
                    f"its end is unknown, step {numbers[g]} left out"
                )
                continue
            end_ns = tail
        record = _record(msgs, group, end_ns, numbers[g], skipped)
        if record is not None:
            records.append(record)
    if irregular:
        notes.append(
            f"{irregular} steps did not log the cycle's messages in its order (one missing or "
            "repeated): laid out from the messages they logged"
        )
    return records


def _inner_templates(msgs: Messages, marks: list[Mark], starts: list[int]) -> set[int]:
    """Templates of messages logged inside steps without starting a phase (they do not end
    the log's last phase)."""
    if len(starts) < 2:
        return set()
    first, last = marks[starts[0]].at, marks[starts[-1]].at
    marked = {m.at for m in marks}
    return {int(msgs.template[i]) for i in range(first, last) if i not in marked}


def _tail_end(msgs: Messages, after: int, inner: set[int]) -> int | None:
    """When the log's last phase ended: the next message after index ``after`` that the loop
    does not log inside its steps; None when there is none."""
    for i in range(after + 1, len(msgs.text)):
        if int(msgs.template[i]) not in inner and msgs.template[i] != msgs.template[after]:
            return int(msgs.t_ns[i])
    return None


def _step_numbers(msgs: Messages, groups: list[list[Mark]]) -> list[int]:
    """Each step's number: the one its messages name (the first message position that names
    one, rising, in nine steps of ten), else counting from 1."""
    width = max((len(g) for g in groups), default=0)
    for k in range(width):
        found = [step_number(msgs.text[g[k].at]) if k < len(g) else None for g in groups]
        named = [n for n in found if n is not None]
        rising = all(b > a for a, b in itertools.pairwise(named))
        if named and len(named) >= 0.9 * len(groups) and rising:
            out: list[int] = []
            for n in found:
                out.append(n if n is not None else (out[-1] + 1 if out else 1))
            return out
    return list(range(1, len(groups) + 1))


def _record(
    msgs: Messages, group: list[Mark], end_ns: int, step: int, skipped: Skipped
) -> StepRecord | None:
    """One step's record: its phases (trailing ``after`` marks laid out after the step)."""
    bounds = [int(msgs.t_ns[m.at]) for m in group] + [end_ns]
    pieces: list[tuple[str, int, bool, str]] = []  # name, ns, after, key
    for mark, a, b in zip(group, bounds, bounds[1:]):
        key = mark.key or mark.name
        if pieces and pieces[-1][3] == key and pieces[-1][2] == mark.after:
            pieces[-1] = (pieces[-1][0], pieces[-1][1] + b - a, mark.after, key)
        else:
            pieces.append((mark.name, b - a, mark.after, key))
    where = f"line {msgs.line[group[0].at]}"
    if any(p[1] < 0 for p in pieces):
        skipped.add("step", "its time stamps go backwards", where, msgs.line[group[0].at])
        return None
    if any(p[1] > MAX_SECONDS * 10**9 for p in pieces):
        skipped.add("step", "a phase longer than a year", where, msgs.line[group[0].at])
        return None
    n_after = 0
    while n_after < len(pieces) - 1 and pieces[-1 - n_after][2]:
        n_after += 1
    split = len(pieces) - n_after
    return StepRecord(
        step=step,
        phases=[(p[0], p[1] / 1e9) for p in pieces[:split]],
        after=[(p[0], p[1] / 1e9) for p in pieces[split:]],
        end_ns=end_ns,
        line=msgs.line[group[0].at],
        last_line=msgs.line[group[-1].at],
    )


# --------------------------------------------------------------------------------------------
# --phase patterns


def compile_patterns(patterns: Mapping[str, str]) -> list[tuple[str, re.Pattern[str]]]:
    """``--phase`` patterns (name → Python regular expression), compiled, in the order given;
    `ImportFormatError` with one line for a bad one."""
    out = []
    for name, regex in patterns.items():
        if not name or not name.strip():
            raise ImportFormatError(f"--phase ={regex}: no phase name before '='")
        if name.strip() == "step":
            raise ImportFormatError(
                f"--phase step={regex}: 'step' is the whole step, not a phase; the first "
                "--phase given starts each step"
            )
        if not regex:
            raise ImportFormatError(f"--phase {name}=: no regular expression after '='")
        try:
            out.append((name.strip(), re.compile(regex)))
        except re.error as exc:
            raise ImportFormatError(
                f"--phase {name}={regex}: bad regular expression ({exc})"
            ) from None
    if not out:
        raise ImportFormatError("--phase: no patterns given")
    return out


def phase_options(specs: Iterable[str]) -> dict[str, str]:
    """``--phase NAME=REGEX`` options as a name → regex dict, in order, checked by
    `compile_patterns`; `ImportFormatError` (one line) for a spec without ``=``, a name given
    twice or a bad regular expression."""
    out: dict[str, str] = {}
    for spec in specs:
        name, sep, regex = spec.partition("=")
        if not sep:
            raise ImportFormatError(f"--phase {spec}: expected NAME=REGEX (e.g. rollout='^Gen')")
        name = name.strip()
        if name in out:
            raise ImportFormatError(f"--phase {name}: given twice")
        out[name] = regex
    compile_patterns(out)
    return out


def _describe(patterns: list[tuple[str, re.Pattern[str]]]) -> str:
    return ", ".join(f"{name}={rx.pattern!r}" for name, rx in patterns)


# --------------------------------------------------------------------------------------------
# the steps of a log


@dataclass
class Found:
    """What `steps_of` made of a log's messages: the records, or the one reason there are
    none (``why``), and notes."""

    records: list[StepRecord]
    anchored: bool
    why: str | None = None
    notes: list[str] = field(default_factory=list)


NO_CYCLE = (
    "no cycle of timestamped messages repeats {n} times, so steps and phases can't be told "
    "apart; name where each phase starts with --phase NAME=REGEX (e.g. --phase "
    "rollout='^Generating' --phase update_actor='^Train')"
)


def steps_of(
    numbered: list[tuple[int, int | None, str]], patterns: Mapping[str, str] | None
) -> Found:
    """Step records of cleaned lines ``(line number, t_ns or None, text)``: from the
    ``patterns`` when given, else from the repeating cycle (see the module doc)."""
    compiled = compile_patterns(patterns) if patterns else None
    msgs = messages_from_lines(numbered)
    notes = list(msgs.notes)
    if not len(msgs.t_ns):
        why = (
            "no time stamps on its lines (2025-03-01 12:00:01, [12:00:01], Mar 01 12:00:01…): "
            "nothing to time"
            if numbered
            else "no messages: nothing to time"
        )
        return Found([], False, why, notes)
    skipped = Skipped()
    if compiled is not None:
        marks = _pattern_marks(msgs, compiled)
        if not any(m.starts_step for m in marks):
            name, rx = compiled[0]
            why = (
                f"no timestamped message matches --phase {name}={rx.pattern!r} (the first "
                "pattern, which starts each step)"
            )
            return Found([], msgs.anchored, why, notes)
        found_notes: list[str] = []
        records = records_from_marks(msgs, marks, skipped, found_notes, None)
        how = (
            f"steps and phases from --phase patterns: {_describe(compiled)} (each step starts "
            f"at a message matching the first), {len(records)} steps"
        )
    else:
        seq = msgs.template[_runs(msgs.template)].tolist()
        cycle = find_cycle(seq, msgs.templates)
        if cycle is None:
            return Found([], msgs.anchored, NO_CYCLE.format(n=MIN_CYCLES), notes)
        found_notes = []
        marks = _cycle_marks(msgs, cycle, found_notes)
        records = records_from_marks(msgs, marks, skipped, found_notes, cycle)
        listed = ", ".join(_shown(msgs.templates[t]) for t in cycle.order)
        how = (
            f"steps and phases from a repeating cycle of {len(cycle.order)} messages ({listed}), "
            f"{len(records)} steps; each message starts a phase that lasts until the next"
        )
    notes = [how, *notes, *found_notes]
    if msgs.unstamped:
        lines = "line" if msgs.unstamped == 1 else "lines"
        notes.append(
            f"{msgs.unstamped} {lines} without a time stamp taken as the continuation of the "
            "message before them"
        )
    notes.extend(skipped.notes())
    if not records:
        why = "no step could be timed: " + (skipped.first() or "each lacks the end of its phases")
        return Found([], msgs.anchored, why, notes)
    return Found(records, msgs.anchored, None, notes)


def _shown(template: str) -> str:
    """A template as a note shows it, with the phase its words name."""
    name, phase = phase_name(template)
    return f"'{template[:60]}' → {phase or name}"


def records_from_messages(
    lines: list[tuple[int | None, str]], patterns: dict[str, str] | None, notes: list[str]
) -> list[StepRecord]:
    """Step records of a watched run's log lines ``(t_ns or None, text)`` — the arrival time in
    ns since the epoch, or None to read the stamp from the text.

    ``patterns``: ``--phase`` name → regex (the first starts each step), or None for the
    repeating cycle. Notes (how the steps were found, what was skipped, or why there are none)
    are appended to ``notes``; [] when nothing could be timed. `ImportFormatError` only for a
    bad pattern.
    """
    numbered = []
    for index, (t_ns, raw) in enumerate(lines, start=1):
        for piece in str(raw).split("\r"):
            cleaned, _ = clean_line(piece)
            if cleaned.strip():
                numbered.append((index, None if t_ns is None else int(t_ns), cleaned))
    found = steps_of(numbered, patterns)
    notes.extend(found.notes)
    if found.why:
        notes.append(found.why)
    return found.records


# --------------------------------------------------------------------------------------------
# the importer


def text_log(head: str) -> bool:
    """Whether a file's first text is a text log (not binary, not JSON), so that ``--phase``
    patterns may read it."""
    if not head.strip() or "\x00" in head:
        return False
    if head.count("\ufffd") > 0.01 * len(head):
        return False
    return re.match(r"\s*(?:\{|\[\s*[{\[\"])", head) is None


SNIFF_CHARS = 4 * HEAD_BYTES
"""Characters of the text handed to `sniff` that it reads: a file's head, or the start of each
chunk of the rest (a loop's messages run to the end of its log, so every chunk past the
start-up begins with them)."""


def sniff(head: str, path: Path) -> bool:
    """A text log whose timestamped messages repeat a cycle of two or more at least
    `MIN_CYCLES` times, one of which names a phase (rollout, reward, update…) — and not a
    table (nvidia-smi output, CSV) or JSON. Reads the first `SNIFF_CHARS` of ``head``."""
    head = head[:SNIFF_CHARS]
    if not text_log(head) or "NVIDIA-SMI" in head or "|====" in head:
        return False
    lines = console_lines(head)
    if not head.endswith("\n") and lines:
        lines = lines[:-1]  # the head may end inside a line
    if len(lines) < 2 * MIN_CYCLES:
        return False
    msgs = messages_from_lines([(n, None, text) for n, text, _ in lines])
    if len(msgs.text) < 0.5 * len(lines) or len(msgs.text) < 2 * MIN_CYCLES:
        return False
    if sum(m.count(",") >= 3 for m in msgs.text) > 0.5 * len(msgs.text):
        return False  # rows of a table with a time column
    seq = msgs.template[_runs(msgs.template)].tolist()
    cycle = find_cycle(seq, msgs.templates)
    if cycle is None:
        return False
    # a step's messages say what it does: a cycle naming no phase is read only when asked
    named = {phase_name(msgs.templates[t])[1] for t in cycle.order}
    return bool(named - AFTER_PHASES - {None})


def parse(path: Path, phases: Mapping[str, str] | None = None) -> Imported:
    """A plain training log's steps and phases (see the module doc); ``phases``: ``--phase``
    name → regex, used instead of the repeating cycle.

    `ImportFormatError` (one line naming the file) for a file that is no text log, has no
    timestamped message, or shows no cycle and was given no patterns (the line suggests
    ``--phase NAME=REGEX``).
    """
    text = open_text(path)
    if not text.strip():
        raise ImportFormatError(f"{path}: empty: no messages, nothing to time")
    if not text_log(text[:HEAD_BYTES]):
        raise ImportFormatError(
            f"{path}: not a text log (binary or JSON): nothing to read messages from"
        )
    lines = console_lines(text)
    found = steps_of([(n, None, line) for n, line, _ in lines], phases)
    if found.why:
        raise ImportFormatError(f"{path}: {found.why}")
    meta: dict = {}
    keep_gpu_name(meta, text)
    imported = Imported(
        source=path, format=FORMAT, meta=meta, anchored=found.anchored, notes=found.notes
    )
    imported.frames = frames_from_steps(
        found.records, framework="log", phase_map=phase_map(found.records)
    )
    return imported


def phase_map(records: Iterable[StepRecord]) -> dict[str, str]:
    """The canonical phase of each phase name in step records made here (`phase_name`'s rules,
    which `frames_from_steps` needs for names such as ``Generating rollouts``); a name that
    names no phase maps to itself."""
    out: dict[str, str] = {}
    for record in records:
        for name, _ in record.phases + record.after:
            if name not in out:
                out[name] = phase_name(name)[1] or canonical_phase(name)
    return out
