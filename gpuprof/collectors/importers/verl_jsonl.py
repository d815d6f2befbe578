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
    frames_from_steps,
    seconds_at,
    step_at,
    to_float,
)
from gpuprof.collectors.importers.verl_log import PHASES, record_from_pairs

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
    for index, raw in enumerate(lines):
        number = index + 1
        if not raw.strip():
            continue
        try:
            obj = json.loads(raw)
        except (ValueError, RecursionError):
            if index == last_content:
                notes.append(f"line {number} is cut short (the run was still writing): skipped")
                continue
            raise ImportFormatError(f"{path}:{number}: not a JSON object") from None
        if not isinstance(obj, dict):
            raise ImportFormatError(f"{path}:{number}: not a JSON object")
        data = obj.get("data", obj)
        if not isinstance(data, dict):
            raise ImportFormatError(f"{path}:{number}: 'data' is not an object")
        step = to_float(obj.get("step", data.get("step")))
        if step is None or step != int(step):
            raise ImportFormatError(f"{path}:{number}: no integer 'step'")
        step_at(int(step), f"{path}:{number}")
        pairs: list[tuple[str, Any]] = [(str(k), v) for k, v in data.items()]
        record = record_from_pairs(int(step), pairs, path, number)
        if record is None:
            continue  # validation-only or metrics-only entries
        elapsed = seconds_at(obj.get("elapsed_seconds"), f"{path}:{number}", "elapsed_seconds")
        if elapsed is not None:
            record.end_ns = round(elapsed * 1e9)
        records.append(record)
    if not records:
        raise ImportFormatError(f"{path}: no verl step entries with timing_s/ or timing/ keys")
    imported = Imported(source=path, format=FORMAT, meta={"framework": "verl"}, anchored=False)
    imported.frames = frames_from_steps(records, framework="verl", phase_map=PHASES)
    imported.notes.extend(notes)
    if any(r.end_ns is None for r in records):
        imported.notes.append("no elapsed_seconds: steps are laid end to end from 0")
    return imported
