"""A stretch of a run's steps, read and diagnosed alone: ``analyze RUN --steps A:B``.

A long run (a cluster-day) can be looked at a stretch of steps at a time, and one stretch is
read without the rest: from the run's kept form (`load_cache`), only the batches that reach
into it; from the run files, each file's rows outside it dropped as the file is read. Memory
follows the stretch's length, not the run's. ``A:B`` selects step numbers as a Python slice
does (``B`` excluded; either side may be left out); a negative number counts from the end of
the recorded steps, so ``-100:`` is the last hundred and ``:-1`` all but the last. The
stretch's time runs
from the earliest start of its first step's spans to the latest end of its last step's, over
every rank (`gpuprof.step()` or a framework adapter records them).

Within that time: samples, events and log lines are kept; spans that overlap it are kept
clipped to it, except those of a step outside the stretch (a rank finishing the step before,
a moment late). The run then reads as one that started at the stretch's start and ended at its
end, and every analyzer works on it as it is.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from gpuprof import clocks, load_cache, store
from gpuprof.model import INTERNED_TABLES, RECORD_TYPES, Run, span_depths
from gpuprof.store import RunError

READ_MARGIN_NS = 60 * 10**9
"""Kept on either side of the stretch while files are read: each file's rows are on its
node's clock until the run's nodes are aligned, which can move them (by much less than this
on any cluster whose clocks are kept); the exact cut is made once they are aligned."""

_SLICE = re.compile(r"\s*(-?\d+)?\s*:\s*(-?\d+)?\s*")


@dataclass(frozen=True)
class StepWindow:
    """The stretch of steps ``first``..``last`` (both recorded step numbers, inclusive) and
    its time, ``start_ns``..``end_ns`` (epoch ns, on the run's clock); ``steps`` recorded
    steps in it, of ``run_steps`` in the run, numbered ``run_first``..``run_last``."""

    first: int
    last: int
    start_ns: int
    end_ns: int
    steps: int
    run_steps: int
    run_first: int
    run_last: int
    run_start_ns: int
    run_end_ns: int

    @property
    def fraction(self) -> float:
        """The stretch's share of the time the run's steps took (0–1)."""
        whole = self.run_end_ns - self.run_start_ns
        return 1.0 if whole <= 0 else min(1.0, (self.end_ns - self.start_ns) / whole)

    def label(self) -> str:
        """``steps 5–9`` (``step 5`` for one)."""
        if self.first == self.last:
            return f"step {self.first}"
        return f"steps {self.first}–{self.last}"

    def describe(self) -> str:
        """The run's notice of the stretch: which steps, of how many, how long."""
        seconds = (self.end_ns - self.start_ns) / 1e9
        return (
            f"{self.label()} alone ({self.steps} of the {self.run_steps} recorded steps, "
            f"{self.run_first}–{self.run_last}; {seconds:,.1f} s)"
        )

    def summary(self) -> dict[str, Any]:
        """What `RunMeta.steps` keeps of it (JSON values)."""
        return {
            "first": self.first, "last": self.last, "steps": self.steps,
            "run_steps": self.run_steps, "run_first": self.run_first, "run_last": self.run_last,
        }  # fmt: skip


def parse(text: str) -> tuple[int | None, int | None]:
    """``"A:B"`` as its two bounds (None where left out); ValueError for anything else."""
    match = _SLICE.fullmatch(text or "")
    if match is None:
        raise ValueError(
            f"--steps {text!r}: expected A:B, A: or :B (step numbers; negative counts from "
            "the last recorded step)"
        )
    first, end = (None if group is None else int(group) for group in match.groups())
    return first, end


def resolve(run_dir: str | Path, text: str) -> StepWindow:
    """The stretch ``text`` (`parse`) selects in the run at ``run_dir``, from its step spans
    (read one file at a time). Raises `ValueError` for a malformed ``text`` and `RunError`
    (one line) for a run without recorded steps or a stretch with none of them."""
    lo, hi = parse(text)
    steps = _recorded_steps(run_dir, "--steps")
    numbers = steps.index.to_numpy()
    lo_n = _bound(numbers, lo, numbers[0])
    hi_n = _bound(numbers, hi, numbers[-1] + 1)
    chosen = steps[(numbers >= lo_n) & (numbers < hi_n)]
    if chosen.empty:
        raise RunError(
            f"{run_dir}: --steps {text.strip()} selects no recorded step (the run's steps are "
            f"{numbers[0]}–{numbers[-1]}, {len(numbers)} of them)"
        )
    return StepWindow(
        first=int(chosen.index[0]),
        last=int(chosen.index[-1]),
        start_ns=int(chosen["start_ns"].min()),
        end_ns=int(chosen["end_ns"].max()),
        steps=len(chosen),
        run_steps=len(steps),
        run_first=int(numbers[0]),
        run_last=int(numbers[-1]),
        run_start_ns=int(steps["start_ns"].min()),
        run_end_ns=int(steps["end_ns"].max()),
    )


def consecutive(run_dir: str | Path, per: int) -> list[StepWindow]:
    """The run's recorded steps as consecutive stretches of ``per`` steps each (the last may
    hold fewer), in order: each the `StepWindow` that `resolve` gives for its ``A:B``, from
    one reading of the step times. Raises `RunError` (one line) for a run without recorded
    steps, `ValueError` for ``per`` < 1."""
    if per < 1:
        raise ValueError(f"--by-steps {per}: expected a number of steps, 1 or more")
    steps = _recorded_steps(run_dir, "--by-steps")
    numbers = steps.index.to_numpy()
    first_ns, last_ns = steps["start_ns"].to_numpy(), steps["end_ns"].to_numpy()
    run = {
        "run_steps": len(steps), "run_first": int(numbers[0]), "run_last": int(numbers[-1]),
        "run_start_ns": int(first_ns.min()), "run_end_ns": int(last_ns.max()),
    }  # fmt: skip
    out = []
    for at in range(0, len(numbers), per):
        chosen = slice(at, at + per)
        out.append(
            StepWindow(
                first=int(numbers[chosen][0]),
                last=int(numbers[chosen][-1]),
                start_ns=int(first_ns[chosen].min()),
                end_ns=int(last_ns[chosen].max()),
                steps=len(numbers[chosen]),
                **run,
            )
        )
    return out


def _recorded_steps(run_dir: str | Path, option: str) -> pd.DataFrame:
    """`_step_times`, or `RunError` (one line naming ``option``) for a run without steps."""
    steps = _step_times(run_dir)
    if steps.empty:
        raise RunError(
            f"{run_dir}: {option} needs the steps a run recorded (gpuprof.step() or a "
            "framework adapter); this run has none"
        )
    return steps


def _bound(numbers: np.ndarray, value: int | None, default: int) -> int:
    """A slice bound as a step number: negative ones count back from the recorded steps' end
    (``-k`` is the k-th last recorded step, the first one when there are fewer)."""
    if value is None:
        return int(default)
    if value >= 0:
        return value
    return int(numbers[max(0, len(numbers) + value)])


def step_times(spans: pd.DataFrame) -> pd.DataFrame:
    """Each recorded step number's earliest span start and latest span end in ``spans`` (over
    every rank; index: step number, ascending; columns ``start_ns``, ``end_ns``)."""
    valid = (
        (spans["phase"] == "step")
        & spans["step"].notna()
        & (spans["step"] >= 0)
        & (spans["end_ns"] >= spans["start_ns"])
    )
    steps = spans.loc[valid, ["step", "start_ns", "end_ns"]]
    frame = pd.DataFrame({
        "step": steps["step"].to_numpy(np.int64),
        "start_ns": steps["start_ns"].to_numpy(np.int64),
        "end_ns": steps["end_ns"].to_numpy(np.int64),
    })  # fmt: skip
    return frame.groupby("step").agg(start_ns=("start_ns", "min"), end_ns=("end_ns", "max"))


def _step_times(run_dir: str | Path) -> pd.DataFrame:
    """`step_times` of the whole run: from the kept form's record of them when it stands
    for the run's files as they are, else from the step spans of every file (read one at a
    time, each put on the run's clock as far as its own file says)."""
    kept = load_cache.step_times(run_dir)
    if kept is not None:
        return kept
    skip = tuple(table for table in RECORD_TYPES if table != "spans")
    parts = []
    for path in store.run_files(Path(run_dir)):
        meta, frames = store.read_file(path, skip)
        steps = step_times(frames["spans"])
        if steps.empty:
            continue
        stored = clocks.stored_offset(path.name.split(".")[0], meta.get("clock"))
        parts.append(steps + (stored.offset_ns if stored is not None else 0))
    if not parts:
        return pd.DataFrame(
            {"start_ns": [], "end_ns": []}, index=pd.Index([], dtype=np.int64, name="step")
        )
    frame = pd.concat(parts)
    return frame.groupby(level=0).agg(start_ns=("start_ns", "min"), end_ns=("end_ns", "max"))


@dataclass(frozen=True)
class ReadFilter:
    """A `store.load_run` ``reduce`` that keeps what lies within ``start_ns``..``end_ns``, as
    each file's table is read (picklable: the loader's worker processes apply it too)."""

    start_ns: int
    end_ns: int
    categorical = False
    """Read each file as a plain load does (strings as strings, in time order): what is kept
    is what a whole-run load would have."""

    def __call__(self, table: str, frame: pd.DataFrame) -> pd.DataFrame:
        return _within(table, frame, self.start_ns, self.end_ns, None)


def read_filter(window: StepWindow) -> ReadFilter:
    """What to keep of each file as it is read: ``window`` give or take `READ_MARGIN_NS`
    (the exact cut is `cut`'s, once the nodes' clocks are aligned)."""
    return ReadFilter(window.start_ns - READ_MARGIN_NS, window.end_ns + READ_MARGIN_NS)


def cut(run: Run, window: StepWindow) -> Run:
    """``run`` (loaded with `read_filter`, on the run's clock) cut to ``window`` exactly: the
    run's start and end become the stretch's, and a notice says which stretch it is. A GPU
    whose owner recorded the stretch's steps keeps the samples of its owner's own steps
    (ranks start and end a step at slightly different times: what a GPU did before its
    owner's first step of the stretch belongs to the step before, outside it)."""
    for table in RECORD_TYPES:
        frame = getattr(run, table)
        if len(frame):
            setattr(run, table, _within(table, frame, window.start_ns, window.end_ns, window))
    if len(run.gpu) and len(run.spans):
        run.gpu = _owners_steps(run)
    run.meta.start_ns, run.meta.end_ns = window.start_ns, window.end_ns
    run.meta.steps = window.summary()
    run.meta.notices = [*run.meta.notices, window.describe()]
    return run


def _within(
    table: str, frame: pd.DataFrame, start: int, end: int, window: StepWindow | None
) -> pd.DataFrame:
    """The rows of ``table`` within ``[start, end)``: by ``t_ns`` (events up to ``end``
    included: a step's event is stamped at its end), spans by overlap and clipped to it
    (and, with ``window``, not of a step outside it)."""
    if table in INTERNED_TABLES or frame.empty:
        return frame
    if table == "spans":
        begin = frame["start_ns"].to_numpy(np.int64)
        finish = frame["end_ns"].to_numpy(np.int64)
        keep = (begin < end) & (finish > start)
        if window is not None:
            step = frame["step"].to_numpy(np.float64)
            keep &= np.isnan(step) | (step < 0) | ((step >= window.first) & (step <= window.last))
        out = frame[keep].reset_index(drop=True)
        if window is not None and len(out):
            out["start_ns"] = np.maximum(out["start_ns"].to_numpy(np.int64), start)
            out["end_ns"] = np.minimum(out["end_ns"].to_numpy(np.int64), end)
            out["depth"] = span_depths(out)  # nesting among what is kept
        return out
    if "t_ns" not in frame:
        return frame
    t = frame["t_ns"].to_numpy(np.int64)
    if table != "events":
        keep = (t >= start) & (t < end)
    elif window is None:
        keep = (t >= start) & (t <= end)
    else:  # a step's event is stamped at its end: the one ending at the start is the step before
        number = _step_numbers(frame)
        other_step = (frame["kind"] == "step").to_numpy() & (
            (number < window.first) | (number > window.last)
        )
        keep = (t >= start) & (t <= end) & ~other_step
    if keep.all():
        return frame
    return frame[keep].reset_index(drop=True)


def _step_numbers(events: pd.DataFrame) -> np.ndarray:
    """The step number of each event (NaN when it names none): the name, as the hooks write
    it, else the ``step`` attribute (simulated runs and imported logs)."""
    number = pd.to_numeric(events["name"], errors="coerce").to_numpy(np.float64, copy=True)
    missing = np.isnan(number)
    if missing.any():
        attrs = events["attrs"].to_numpy()[missing]
        number[missing] = pd.to_numeric(
            pd.Series([a.get("step") if isinstance(a, dict) else None for a in attrs]),
            errors="coerce",
        ).to_numpy(np.float64)
    return number


def _owners_steps(run: Run) -> pd.DataFrame:
    """``run.gpu`` less the samples outside their owner's steps (the run's spans are the
    stretch's); a GPU without an owner, or whose owner recorded no step, keeps its own."""
    from gpuprof.analyzers.ownership import gpu_owner

    spans = run.spans
    steps = spans[(spans["phase"] == "step") & (spans["end_ns"] > spans["start_ns"])]
    if steps.empty:
        return run.gpu
    own = steps.groupby(["host", "pid"], sort=False).agg(
        first_ns=("start_ns", "min"), last_ns=("end_ns", "max")
    )
    owners = gpu_owner(run).dropna(subset=["pid"])
    owners = owners.assign(pid=owners["pid"].astype(np.int64)).join(
        own, on=["owner_host", "pid"], how="inner"
    )
    if owners.empty:
        return run.gpu
    gpu = run.gpu
    keys = pd.MultiIndex.from_arrays([gpu["host"].astype(object), gpu["gpu"].astype(np.int64)])
    where = owners.set_index(["host", "gpu"])[["first_ns", "last_ns"]]
    # in int64 throughout: epoch ns lose their last digits in a float
    first = where["first_ns"].reindex(keys, fill_value=np.iinfo(np.int64).min).to_numpy(np.int64)
    last = where["last_ns"].reindex(keys, fill_value=np.iinfo(np.int64).max).to_numpy(np.int64)
    t = gpu["t_ns"].to_numpy(np.int64)
    keep = (t >= first) & (t < last)
    return gpu if keep.all() else gpu[keep].reset_index(drop=True)
