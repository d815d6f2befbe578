"""A watched run's own printed timings as phases, for any stack that prints them.

``gpuprof watch`` stores every line the command writes with the time it arrived (the ``logs``
table). Most RL stacks print how long each part of a step took (verl's ``step:N - timing_s/…``,
NeMo-RL's ``Timing:`` block, slime's ``perf N: {…}``, DeepSpeed-Chat's ``|E2E latency=…``).
When the run has no phase spans of its own — a stack gpuprof has no patch for, or a patch that
found nothing — `apply` reads those lines with the importers' readers (verl's own reader for
verl lines, the tolerant `step_timings` reader for the rest) and writes the steps and phases
they describe into the run, on the watcher's clock: each step ends when its (last) line
arrived, its phases are laid out before that end in the order printed. A loop that prints no
timer but a repeating cycle of messages (``Generating rollouts…``, ``Computing rewards``,
``train step 3``) gets its phases from the messages' arrival times (`plain_log`). GPU samples
then meet phases with no code change.

Where the run already has phase spans (a patch, the user's hooks), the printed timings are
not added — they would count the same time twice — but checked against the spans: the step
times and each phase both time, matched by step number; the notice says how well they agree.

What `apply` writes is one more run file, ``<host>.printed.sqlite`` per host, when it adds
phases, and ``printed_timings.json`` beside the run files in every case: the notices reading
gave, and the sign that the lines were read (the next load skips the work). The end of
a watch applies it; loading a finished run for analysis does too (`ensure`), for runs watched
with ``--no-report`` or whose watch end was cut short.
"""

from __future__ import annotations

import json
import math
import os
from pathlib import Path
from typing import Any

import pandas as pd

from gpuprof import store
from gpuprof.model import RECORD_TYPES

SOURCE = "printed"
"""``attrs["source"]`` of spans made from printed lines."""
AGREE_WITHIN = 0.10
"""Median relative difference of step times (and of each phase both time) below which the
printed timings and the run's spans are said to agree."""
_FILE_SUFFIX = ".printed"


def derive(logs: pd.DataFrame, procs: pd.DataFrame | None = None) -> tuple[pd.DataFrame, list[str]]:
    """Spans of the printed per-step timings among a run's ``logs`` (host, t_ns, line), one
    host at a time, and the notes saying what was read; an empty frame when no line times a
    step. A host's spans belong to its watched command (``procs`` role ``main``), so that
    the GPUs its process tree drives take their phases."""
    from gpuprof.collectors.importers import step_timings, verl_log

    frames, notes = [], []
    if logs is None or logs.empty:
        return pd.DataFrame(), notes
    for host, rows in logs.sort_values("t_ns", kind="stable").groupby("host", sort=True):
        lines = list(zip(rows["t_ns"].astype("int64"), rows["line"].astype(str), strict=True))
        pid = _main_pid(procs, str(host))
        spans = verl_log.spans_from_lines(lines, host=str(host), pid=pid)
        how = "verl step lines"
        details: list[str] = []
        if spans.empty:
            spans, read_notes, stack = step_timings.spans_from_lines(lines, host=str(host),
                                                                    pid=pid)  # fmt: skip
            how = f"{stack} per-step timings" if stack else "per-step timings"
            details = [n for n in read_notes if "skipped" in n or "left out" in n]
        if spans.empty:
            spans, details = _message_cycle(lines, str(host), pid)
            how = "a repeating cycle of its messages, timed by their arrival"
        if spans.empty:
            continue
        spans = spans.copy()
        spans["attrs"] = [{**a, "source": SOURCE} for a in spans["attrs"]]
        steps = int((spans["phase"] == "step").sum())
        phases = sorted(set(spans.loc[spans["phase"] != "step", "phase"]))
        notes.append(
            f"{host}: phases from the command's printed timings ({how}): {steps} steps, "
            f"{', '.join(phases) or 'no phase'}; each step ends when its line was printed"
        )
        notes.extend(f"{host}: {n}" for n in details[:3])
        frames.append(spans)
    if not frames:
        return pd.DataFrame(), notes
    return pd.concat(frames, ignore_index=True), notes


def _message_cycle(
    lines: list[tuple[int, str]], host: str, pid: int
) -> tuple[pd.DataFrame, list[str]]:
    """Spans of a hand-written loop that prints messages and no timer (``Generating
    rollouts…``, ``train step 3 loss=…``): its repeating cycle of messages, each phase from
    one message's arrival to the next's (`plain_log.records_from_messages`)."""
    from gpuprof.collectors.importers import plain_log
    from gpuprof.collectors.importers.steplog import frames_from_steps

    notes: list[str] = []
    records = plain_log.records_from_messages(list(lines), None, notes)
    if not records:
        return pd.DataFrame(), []
    frames = frames_from_steps(records, framework="printed", phase_map=plain_log.phase_map(records),
                               host=host, pid=pid)  # fmt: skip
    return frames["spans"], notes[:2]


def _main_pid(procs: pd.DataFrame | None, host: str) -> int:
    if procs is None or procs.empty or "role" not in procs:
        return 0
    main = procs[(procs["host"] == host) & (procs["role"] == "main")]
    return int(main["pid"].iloc[0]) if len(main) else 0


def compare(printed: pd.DataFrame, spans: pd.DataFrame) -> str | None:
    """One line on how the printed timings agree with the run's own spans: the median
    relative difference of step times over the steps both number, and of each phase both
    time; None when they share no step."""
    own = spans[
        spans["attrs"].map(lambda a: not (isinstance(a, dict) and a.get("source") == SOURCE))
    ]
    mine, theirs = _per_step(printed), _per_step(own)
    both = sorted(set(mine) & set(theirs))
    if not both:
        return None
    diffs: dict[str, list[float]] = {}
    for step in both:
        for phase, seconds in mine[step].items():
            other = theirs[step].get(phase)
            if other is not None and max(seconds, other) > 0:
                diffs.setdefault(phase, []).append(abs(seconds - other) / max(seconds, other))
    if not diffs:
        return None
    medians = {p: float(pd.Series(d).median()) for p, d in diffs.items()}
    worst = max(medians, key=lambda p: medians[p])
    step_diff = medians.get("step")
    agree = medians[worst] <= AGREE_WITHIN
    parts = [f"{p} {100 * m:.0f}%" for p, m in sorted(medians.items())]
    verdict = "agree" if agree else f"disagree (most in {worst})"
    step_part = f"step time within {100 * step_diff:.0f}%, " if step_diff is not None else ""
    return (
        f"the command's printed timings and the phases recorded in the run {verdict} over "
        f"{len(both)} steps: {step_part}median differences {', '.join(parts)}"
    )


def _per_step(spans: pd.DataFrame) -> dict[int, dict[str, float]]:
    """Step number → phase → seconds (the phase's spans in that step added up; ``step``: the
    step span)."""
    out: dict[int, dict[str, float]] = {}
    if spans.empty:
        return out
    frame = spans.dropna(subset=["step"])
    seconds = (frame["end_ns"] - frame["start_ns"]) / 1e9
    for (step, phase), total in seconds.groupby([frame["step"], frame["phase"]]).sum().items():
        if math.isfinite(total):
            out.setdefault(int(step), {})[str(phase)] = float(total)
    return out


MARKER = "printed_timings.json"
"""The file in a run directory saying its printed lines were read, with the notices that
reading gave (``{"notes": [...]}``): written once, so that the next load skips the work."""


def apply(run_dir: str | Path) -> list[str]:
    """Read a finished watched run's printed timings (see the module's docstring) and write
    them into ``run_dir`` when it has no phase spans, else check them against its spans;
    the notes saying what was done ([] when no printed line times a step). Never raises: a
    failure is one note, and the run is left as it was."""
    run_dir = Path(run_dir)
    try:
        if (run_dir / MARKER).exists():
            return []  # done already (a second watch end, an analyze after a crash)
        keep = {"logs", "spans", "procs"}
        run = store.load_run(run_dir, skip=set(RECORD_TYPES) - keep)
        printed, notes = derive(run.logs, run.procs)
        if printed.empty:
            notes = []
        elif len(run.spans):
            # the run's own phases stand; the printed ones say how far they agree (nothing to
            # say when no step is numbered alike: a trainer's loss dicts)
            line = compare(printed, run.spans)
            notes = [line] if line else []
        else:
            for host, frame in printed.groupby("host", sort=True):
                store.write_host_file(run_dir, f"{host}{_FILE_SUFFIX}", [("spans", frame)])
        _write_marker(run_dir, notes)
        return notes
    except Exception as exc:  # the run stays readable as recorded: say so and go on
        return [f"the command's printed timings were not read ({type(exc).__name__}: {exc})"]


def ensure(run_dir: str | Path) -> None:
    """`apply` to a finished watched run that has output lines and was not read for printed
    timings yet (a run watched with ``--no-report``, or whose watch end was cut short): what
    loading a run for analysis does first. Cheap when done already; never raises."""
    path = Path(run_dir)
    try:
        if not path.is_dir() or (path / MARKER).exists():
            return
        if store.count_rows(path, "logs") == 0:
            return
        metas = [store.file_meta(f, timeout_s=1.0) or {} for f in store.run_files(path)]
        watchers = [m for m in metas if m.get("command")]
        if not watchers or any(m.get("end_ns") is None for m in watchers):
            return  # a watcher still running (or none): its lines may not be all there
    except Exception:
        return
    apply(path)


def notes(run_dir: str | Path) -> list[str]:
    """The notices reading a run's printed timings gave ([] when not read or none)."""
    try:
        document = json.loads((Path(run_dir) / MARKER).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return []
    found = document.get("notes") if isinstance(document, dict) else None
    return [str(n) for n in found] if isinstance(found, list) else []


def add_notes(run: Any, run_dir: str | Path) -> None:
    """Add the printed-timings notices of ``run_dir`` to a loaded run's notices, once."""
    for note in notes(run_dir):
        if note not in run.meta.notices:
            run.meta.notices.append(note)


def _write_marker(run_dir: Path, found: list[str]) -> None:
    tmp = run_dir / f".{MARKER}.{os.getpid()}"
    tmp.write_text(json.dumps({"notes": found}), encoding="utf-8")
    os.replace(tmp, run_dir / MARKER)
