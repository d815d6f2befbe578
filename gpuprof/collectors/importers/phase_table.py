"""A table of per-phase times pasted as Markdown (an issue, a W&B report, a README).

People summarise an RL run's step as a table — ``| phase | mean | share |`` with rows such as
``| `generate` | 5h26m | 60.4% |`` — when they ask why it is slow. Such a table has no steps,
but it does say how a step splits into phases, which is what the step-composition findings
need. The table becomes one step whose phases are the rows, in the table's order, each lasting
its time (``5h26m``, ``36m37s``, ``~22s``, ``1.5 s``, ``120 ms``, ``1:02:03``); the step lasts
their sum, or a ``total``/``step`` row when there is one. Phase names are kept as written
(backticks and counts such as ``(n=3)`` removed) and mapped to a canonical phase where the
name says so (`gpuprof.phases.phase_from_name`). The result is unanchored.
"""

from __future__ import annotations

import re
from pathlib import Path

from gpuprof.collectors.importers import Imported, ImportFormatError, open_text
from gpuprof.collectors.importers.steplog import (
    MAX_SECONDS,
    Skipped,
    StepRecord,
    frames_from_steps,
)
from gpuprof.phases import phase_from_name

FORMAT = "phase-table"

_NAME_HEADERS = ("phase", "timer", "stage", "section", "step part")
_TIME_HEADERS = ("mean", "avg", "average", "time", "duration", "wall", "seconds", "median")
_SEPARATOR = re.compile(r"^\s*\|?\s*:?-{3,}:?\s*(?:\|\s*:?-{3,}:?\s*)*\|?\s*$")
_PART = re.compile(r"(\d+(?:\.\d+)?)\s*(ms|h|m(?!s)|s|d)")
_CLOCK = re.compile(r"^(\d+):(\d\d)(?::(\d\d))?(?:\.\d+)?$")
_UNIT_S = {"d": 86400.0, "h": 3600.0, "m": 60.0, "s": 1.0, "ms": 0.001}


def sniff(head: str, path: Path) -> bool:
    """A Markdown table whose header names a phase column."""
    rows = [line for line in head.splitlines() if line.strip().startswith("|")]
    for i, row in enumerate(rows[:-1]):
        cells = _cells(row)
        if _SEPARATOR.match(rows[i + 1]) and _column(cells, _NAME_HEADERS) is not None:
            return _column(cells, _TIME_HEADERS) is not None
    return False


def parse(path: Path) -> Imported:
    """The first phase table of the file as one step of its rows."""
    text = open_text(path)
    lines = text.splitlines()
    skipped = Skipped()
    for i, line in enumerate(lines[:-1]):
        cells = _cells(line)
        name_col = _column(cells, _NAME_HEADERS)
        time_col = _column(cells, _TIME_HEADERS)
        if name_col is None or time_col is None or not _SEPARATOR.match(lines[i + 1]):
            continue
        record = _table(lines, i + 2, name_col, time_col, skipped)
        if record is None:
            break
        names = [n for n, _ in record.phases]
        phase_map = {n: p for n in names if (p := phase_from_name(n)) is not None}
        notes = [
            f"a table of per-phase times ({cells[time_col]}): taken as one step of "
            f"{len(names)} phases in the table's order; no step count, no wall-clock times",
            *skipped.notes(),
        ]
        imported = Imported(source=path, format=FORMAT, anchored=False, notes=notes)
        imported.frames = frames_from_steps([record], framework="table", phase_map=phase_map)
        return imported
    first = skipped.first()
    why = f": {first}" if first else ""
    raise ImportFormatError(f"{path}: no phase table with times{why}")


def _table(
    lines: list[str], start: int, name_col: int, time_col: int, skipped: Skipped
) -> StepRecord | None:
    phases: list[tuple[str, float]] = []
    total = None
    for number in range(start, len(lines)):
        row = lines[number]
        if not row.strip().startswith("|"):
            break
        cells = _cells(row)
        if len(cells) <= max(name_col, time_col):
            skipped.add("row", "fewer cells than the header", f"line {number + 1}")
            continue
        name = _name(cells[name_col])
        seconds = duration_text_s(cells[time_col])
        if not name or seconds is None:
            skipped.add("row", "no phase name or no readable time",
                        f"line {number + 1}: {cells[time_col][:30]!r}")  # fmt: skip
            continue
        if name.lower() in ("total", "step", "whole step"):
            total = seconds
        else:
            phases.append((name, seconds))
    if not phases:
        return None
    return StepRecord(step=1, phases=phases, step_s=total, line=start + 1,
                      attrs={"duration": "table"})  # fmt: skip


def duration_text_s(text: str) -> float | None:
    """A written duration in seconds: ``5h26m``, ``36m37s``, ``~22s``, ``1.5 s``, ``120 ms``,
    ``1:02:03``, a bare number (seconds); None when unreadable or implausible."""
    text = text.strip().strip("*~≈ ").lower()
    clock = _CLOCK.match(text)
    if clock:
        parts = [int(g) for g in clock.groups() if g is not None]
        seconds = 0.0
        for part in parts:
            seconds = seconds * 60 + part
    else:
        parts = _PART.findall(text)
        if parts and not _PART.sub("", text).strip():
            seconds = sum(float(n) * _UNIT_S[u] for n, u in parts)
        else:
            try:
                seconds = float(text)
            except ValueError:
                return None
    return seconds if 0 <= seconds <= MAX_SECONDS else None


def _cells(row: str) -> list[str]:
    row = row.strip()
    if row.startswith("|"):
        row = row[1:]
    if row.endswith("|"):
        row = row[:-1]
    return [c.strip() for c in row.split("|")]


def _column(cells: list[str], names: tuple[str, ...]) -> int | None:
    for i, cell in enumerate(cells):
        words = re.sub(r"[`*_()]", " ", cell.lower()).split()
        if any(name in " ".join(words) for name in names):
            return i
    return None


def _name(cell: str) -> str:
    """A phase name as written, without Markdown code marks and trailing counts ``(n=3)``."""
    name = re.sub(r"\(n\s*=\s*\d+\)", "", cell).replace("`", "").strip()
    return name
