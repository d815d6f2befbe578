"""ms-swift's ``logging.jsonl``: the Trainer's log dicts as JSON lines.

ms-swift's progress callback appends every log dict to ``<output_dir>/logging.jsonl`` after adding
``global_step/max_steps`` (``"5/100"``), ``percentage``, ``elapsed_time`` (``"1m 39s"``, seconds
since training began, whole seconds), ``remaining_time``, ``memory(GiB)`` and a running speed
(``train_speed(iter/s)`` in ms-swift 2.x/3.x, ``train_speed(s/it)`` from 3.12 / 4.x: averages
since the start, not per window). GRPO dicts add ``reward``, ``rewards/<func>/mean``,
``completions/mean_length``, ``kl``…; GRPO's phase timings (``profiling/Time taken: …``) go to
W&B / SwanLab only, so the file gives step times, not phase times. At the end ms-swift appends
one summary object (``last_model_checkpoint``, ``log_history``…), which is skipped.

Step times come from ``elapsed_time`` differences (less the evaluations logged in between),
spread evenly over the window's steps. ``args.json`` next to the file (ms-swift writes it to
the same output directory) supplies the run's knobs when present.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from gpuprof.collectors.importers import Imported, ImportFormatError, open_text
from gpuprof.collectors.importers.trl_log import entries_to_imported

FORMAT = "swift-jsonl"
LATE = True
"""Step lines may start after thousands of lines of start-up chatter: `detect` streams the
whole file through `sniff`."""


def sniff(head: str, path: Path) -> bool:
    """JSON lines with ms-swift's ``global_step/max_steps`` key."""
    first = next((line.strip() for line in head.splitlines() if line.strip()), "")
    return first.startswith("{") and '"global_step/max_steps"' in head


def parse(path: Path) -> Imported:
    """Steps and evaluations of a ``logging.jsonl``; knobs from a sibling ``args.json``."""
    text = open_text(path)
    lines = text.split("\n")
    last_content = max((i for i, line in enumerate(lines) if line.strip()), default=-1)
    entries: list[tuple[int | None, dict[str, Any]]] = []
    cut = None
    bad: list[int] = []
    for index, raw in enumerate(lines):
        if not raw.strip():
            continue
        try:
            obj = json.loads(raw)
        except (ValueError, RecursionError):
            obj = None
            if index == last_content:
                cut = index + 1
                continue
        if not isinstance(obj, dict):
            bad.append(index + 1)
            continue
        entries.append((index + 1, obj))
    if bad and not entries:
        raise ImportFormatError(f"{path}:{bad[0]}: not a JSON object (nor any other line)")
    imported = entries_to_imported(entries, path, FORMAT, "swift")
    if bad:
        imported.notes.append(f"{len(bad)} lines skipped: not a JSON object (first: line {bad[0]})")
    if cut is not None:
        imported.notes.append(f"line {cut} is cut short (the run was still writing): skipped")
    knobs = _args_json(path.parent / "args.json")
    if knobs:
        imported.meta["knobs"] = knobs
        imported.notes.append("knobs read from args.json next to the log")
    return imported


def _args_json(path: Path) -> dict[str, Any]:
    """ms-swift's saved arguments (scalar values only); {} when absent or unreadable."""
    try:
        data = json.loads(path.read_text(encoding="utf-8", errors="replace"))
    except (OSError, ValueError, RecursionError):
        return {}
    if not isinstance(data, dict):
        return {}
    return {
        str(k): v for k, v in data.items() if v is None or isinstance(v, bool | int | float | str)
    }
