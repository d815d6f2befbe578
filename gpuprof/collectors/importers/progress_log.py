"""Any training console log with a tqdm step bar or DeepSpeed ``wall_clock_breakdown`` timers.

Most training loops draw a tqdm bar per optimizer step (verl's ``Training Progress``, the
transformers ``Trainer`` bar TRL and ms-swift show), and DeepSpeed with
``"wall_clock_breakdown": true`` prints per step ``time (ms) | fwd: … | bwd: … | bwd_inner: …
| bwd_allreduce: … | step: …`` (``fwd_microstep``… per micro-step; ``forward``/``backward``
in older releases). A console log that holds nothing else a more specific importer reads
still gives:

- step times from the bar (`steplog.steps_from_progress`: elapsed-time differences for steps
  of 10 s or more, else the printed rate — the notes say which);
- forward, backward, gradient-allreduce and optimizer phases from the timers, laid out within
  the step that follows them (`steplog.attach_timers`); with timers and no bar, each timer
  line is a step lasting the sum of its parts.

No wall clock: the result is unanchored. The framework is named when the log says it (verl's
``Training Progress`` bar behind a Ray ``TaskRunner`` prefix).
"""

from __future__ import annotations

import re
from pathlib import Path

from gpuprof.collectors.importers import Imported, ImportFormatError, open_text
from gpuprof.collectors.importers.steplog import (
    DS_PHASES,
    Skipped,
    StepRecord,
    TimerLine,
    attach_timers,
    console_lines,
    deepspeed_timers,
    frames_from_steps,
    keep_gpu_name,
    progress_updates,
    steps_from_progress,
)

FORMAT = "progress-log"
WEAK = True
"""A tqdm bar is in most consoles: tried after every specific format."""

_VERL = re.compile(r"Training Progress:|\((?:TaskRunner|main_task) pid=\d+")


def sniff(head: str, path: Path) -> bool:
    """A tqdm step bar redrawn at least twice (or once at ``1/N``), or a DeepSpeed timer line."""
    if re.search(r"time \(ms\)\s*\|\s*(?:fwd|forward)(?:_microstep)?\s*:", head):
        return True
    if re.search(r"(?m)^\s*(?:fwd|forward)(?:_microstep)?\s*:\s*[\d.]+\s*\|\s*(?:bwd|backward)",
                 head):  # fmt: skip
        return True
    lines = console_lines(head)
    updates = progress_updates(lines)
    return len(updates) >= 2 or any(u.n == 1 for u in updates)


def parse(path: Path) -> Imported:
    """Steps from the tqdm bar, phases from DeepSpeed timers; refused with one line when the
    log has neither a step bar nor timers."""
    text = open_text(path)
    lines = console_lines(text)
    notes: list[str] = []
    skipped = Skipped()
    records = steps_from_progress(progress_updates(lines), notes)
    timers = deepspeed_timers(lines, skipped)
    if records:
        attach_timers(records, timers, notes)
    elif timers:
        records = steps_from_timers(timers, notes)
    if not records:
        raise ImportFormatError(
            f"{path}: no step times: no tqdm step bar past its first redraw and no DeepSpeed "
            "wall_clock_breakdown timers"
        )
    framework = "verl" if _VERL.search(text) else None
    meta = {"framework": framework} if framework else {}
    keep_gpu_name(meta, text)
    notes.extend(skipped.notes())
    imported = Imported(source=path, format=FORMAT, meta=meta, anchored=False, notes=notes)
    imported.frames = frames_from_steps(
        records, framework=framework or ("deepspeed" if timers else "tqdm"), phase_map=DS_PHASES
    )
    if not timers:
        notes.append("a progress bar gives step times only: no phases")
    return imported


def steps_from_timers(timers: list[TimerLine], notes: list[str]) -> list[StepRecord]:
    """One step per DeepSpeed timer line (the global ones when logged, else each micro-step),
    lasting the sum of its timed parts."""
    use_micro = all(t.micro for t in timers)
    chosen = [t for t in timers if t.micro == use_micro]
    notes.append(
        "DeepSpeed timers only (no step bar): each "
        + ("micro-step" if use_micro else "step")
        + " lasts the sum of its forward, backward, allreduce and optimizer times; time outside "
        "the engine (generation, data loading) is not in the log"
    )
    return [
        StepRecord(step=i + 1, phases=list(t.phases), line=t.line) for i, t in enumerate(chosen)
    ]
