"""A run's Python stacks for the tools people already use: speedscope and folded stacks.

- `speedscope`: a speedscope file (https://www.speedscope.app/file-format-schema.json): one
  ``sampled`` profile per Python thread (``role pid · thread``), unit seconds, its samples in
  time order (one per window and stack, weighted by the seconds the thread spent there), the
  frames shared; open it at https://www.speedscope.app or with ``speedscope FILE``.
- `collapsed`: Brendan Gregg's folded format, one line per distinct stack,
  ``process;thread;outermost;…;innermost COUNT`` with COUNT the py-spy samples (seconds ×
  rate), as ``flamegraph.pl``, inferno and speedscope read it.

Both take the time Python threads were busy (running or ready to run, as in the analysis and
the report's flame graphs; py-spy's own default leaves idle threads out likewise), or with
``idle`` every sampled thread-second, blocked ones too; all of it or only what lies inside
given intervals (a finding's). gpuprof's own threads are left out, as in the analysis.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

import numpy as np

from gpuprof import __version__
from gpuprof.analyzers.stacks import StackIndex
from gpuprof.model import Run

SPEEDSCOPE_SCHEMA = "https://www.speedscope.app/file-format-schema.json"


def _frame_text(index: StackIndex, f: int) -> str:
    line = index.lines[f]
    where = index.files[f] if index.files[f] else "?"
    text = f"{index.names[f]} ({where}{'' if line is None else f':{line}'})"
    return text.replace(";", ":").replace("\n", " ")


def _rows(index: StackIndex, intervals: Sequence[Sequence[int]] | None,
          idle: bool) -> np.ndarray:  # fmt: skip
    """Per sample row, its busy (with ``idle``: sampled) seconds inside ``intervals`` (all
    of them: None)."""
    busy, blocked = index.weights(intervals)
    return busy + blocked if idle else busy


def speedscope(run: Run, intervals: Sequence[Sequence[int]] | None = None,
               name: str | None = None, idle: bool = False) -> dict[str, Any]:  # fmt: skip
    """The speedscope document of ``run``'s stacks (inside ``intervals`` when given)."""
    index = StackIndex(run)
    weight = _rows(index, intervals, idle)
    frames: list[dict[str, Any]] = []
    frame_at: dict[int, int] = {}
    profiles = []
    keep = np.flatnonzero(weight > 0)
    if len(keep):
        who = [f"{r} {int(p)}" if np.isfinite(p) else str(r)
               for r, p in zip(index.role[keep], index.pid[keep])]  # fmt: skip
        threads = index.thread[keep]
        order = np.lexsort((index.t0[keep], threads, np.array(who, dtype=object)))
        current: tuple[str, str] | None = None
        profile: dict[str, Any] = {}
        for k in order:
            row = keep[k]
            key = (who[k], str(threads[k]))
            if key != current:
                current = key
                profile = {"type": "sampled", "name": f"{key[0]} · {key[1]}",
                           "unit": "seconds", "startValue": 0, "endValue": 0.0,
                           "samples": [], "weights": []}  # fmt: skip
                profiles.append(profile)
            stack = []
            for f in index.paths[index.stack[row]]:
                if f not in frame_at:
                    frame_at[f] = len(frames)
                    entry: dict[str, Any] = {"name": str(index.names[f])}
                    if index.files[f]:
                        entry["file"] = str(index.files[f])
                    if index.lines[f] is not None:
                        entry["line"] = index.lines[f]
                    frames.append(entry)
                stack.append(frame_at[f])
            profile["samples"].append(stack)
            profile["weights"].append(round(float(weight[row]), 6))
        for profile in profiles:
            profile["endValue"] = round(sum(profile["weights"]), 6)
    return {
        "$schema": SPEEDSCOPE_SCHEMA,
        "shared": {"frames": frames},
        "profiles": profiles,
        "name": name or run.meta.run_id,
        "activeProfileIndex": 0,
        "exporter": f"gpuprof@{__version__}",
    }


def collapsed(run: Run, intervals: Sequence[Sequence[int]] | None = None,
              idle: bool = False) -> str:  # fmt: skip
    """The folded stacks of ``run`` (inside ``intervals`` when given), one line per distinct
    (process, thread, stack), heaviest first."""
    index = StackIndex(run)
    weight = _rows(index, intervals, idle)
    counts: dict[tuple[str, str, int], float] = {}
    rate = np.where(np.isfinite(index.rate) & (index.rate > 0), index.rate, 1.0)
    for row in np.flatnonzero(weight > 0):
        p = index.pid[row]
        who = f"{index.role[row]} {int(p)}" if np.isfinite(p) else str(index.role[row])
        key = (who, str(index.thread[row]), int(index.stack[row]))
        counts[key] = counts.get(key, 0.0) + float(weight[row] * rate[row])
    lines = []
    for (who, thread, k), n in sorted(counts.items(), key=lambda kv: -kv[1]):
        samples = round(n)
        if samples <= 0:
            continue
        frames = [f"process {who}", f"thread {thread}".replace(";", ":")]
        frames += [_frame_text(index, f) for f in index.paths[k]]
        lines.append(";".join(frames) + f" {samples}")
    return "\n".join(lines) + ("\n" if lines else "")


def write_speedscope(document: dict[str, Any], handle: Any) -> None:
    json.dump(document, handle, separators=(",", ":"))
