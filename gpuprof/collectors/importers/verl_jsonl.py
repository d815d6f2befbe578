"""verl's JSONL file logger (``trainer.logger=[…,file]``): one JSON object per step.

verl's ``FileLogger`` appends ``{"step": N, "data": {"timing_s/gen": …, …}}`` per step to
``$VERL_FILE_LOGGER_PATH`` (default ``<root>/<project>/<experiment>.jsonl``); newer versions add
``"elapsed_seconds"`` (monotonic seconds since the logger started, when the step was logged).
Flat objects (``{"step": N, "timing_s/gen": …}``, as some wrappers write) are read too. The
timing keys mean what they mean on the console (see `verl_log`). ``elapsed_seconds`` places each
step's end on a time axis that starts when the logger did — still no wall clock, so the result is
unanchored.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from gpuprof.collectors.importers import Imported, ImportFormatError, open_text
from gpuprof.collectors.importers.steplog import (
    MAX_STEP,
    Skipped,
    StepRecord,
    duration_s,
    frames_from_steps,
    refusal,
    timed,
    to_float,
)
from gpuprof.collectors.importers.verl_log import phase_map, record_from_pairs

FORMAT = "verl-jsonl"


def sniff(head: str, path: Path) -> bool:
    """JSON lines (objects with ``step``) of which one of the first 50 has ``timing_s/`` or
    ``timing/`` keys (at the top or under ``data``)."""
    for line in head.splitlines()[:50]:
        line = line.strip()
        if not line:
            continue
        if not line.startswith("{") or '"step"' not in line:
            return False
        if re.search(r'"timing(?:_s)?/[^"]+"\s*:', line):
            return True
    return False


def parse(path: Path) -> Imported:
    """Every logged step with timing keys as unanchored spans (``elapsed_seconds`` when given
    sets where each step ends)."""
    text = open_text(path)
    records = []
    lines = text.split("\n")
    last_content = max((i for i, line in enumerate(lines) if line.strip()), default=-1)
    notes = []
    untimed: list[StepRecord] = []
    skipped = Skipped()
    for index, raw in enumerate(lines):
        number = index + 1
        if not raw.strip():
            continue
        try:
            obj = json.loads(raw)
        except (ValueError, RecursionError):
            if index == last_content:
                notes.append(f"line {number} is cut short (the run was still writing): skipped")
            else:
                skipped.add("line", "not a JSON object", f"line {number}: {raw[:40]!r}", number)
            continue
        data = obj.get("data", obj) if isinstance(obj, dict) else None
        step = to_float(obj.get("step", data.get("step"))) if isinstance(data, dict) else None
        if step is None or step != int(step) or not 0 <= step <= MAX_STEP:
            skipped.add("line", "no step object with an integer 'step' and a 'data' object",
                        f"line {number}: {raw[:40]!r}", number)  # fmt: skip
            continue
        pairs: list[tuple[str, Any]] = [(str(k), v) for k, v in data.items()]
        record = record_from_pairs(int(step), pairs, path, number, skipped)
        if not timed(record):
            untimed.append(record)  # validation-only or metrics-only entries
            continue
        elapsed = obj.get("elapsed_seconds")
        if elapsed is not None:
            elapsed = duration_s(elapsed, "elapsed_seconds", f"line {number}", skipped, number)
        if elapsed is not None:
            record.end_ns = round(elapsed * 1e9)
        records.append(record)
    untimed = [r for r in untimed if r.attrs]
    if not records and untimed:
        records = untimed
        notes.append(
            f"no timing keys (timing_s/ or timing/) in any entry: {len(records)} steps imported "
            "with their figures and no durations (nothing to time)"
        )
    if not records:
        raise ImportFormatError(
            refusal(path, skipped, "no verl step entries with timing_s/ or timing/ keys")
        )
    imported = Imported(source=path, format=FORMAT, meta={"framework": "verl"}, anchored=False)
    imported.frames = frames_from_steps(records, framework="verl", phase_map=phase_map(records))
    imported.notes.extend(notes)
    imported.notes.extend(skipped.notes())
    if any(r.end_ns is None for r in records if timed(r)):
        imported.notes.append("no elapsed_seconds: steps are laid end to end from 0")
    return imported
