"""Megatron-LM / Megatron-DeepSpeed / Megatron-SWIFT console logs: ``iteration N/M | …`` lines.

Megatron's ``training_log`` prints every ``--log-interval`` iterations one line of
`` | ``-separated ``name: value`` fields::

     [2024-04-06 02:55:45] iteration        2/     100 | consumed samples:          256 |
     elapsed time per iteration (ms): 5630.1 | throughput per GPU (TFLOP/s/GPU): 231.9 |
     learning rate: 4.000000E-07 | global batch size:   128 | lm loss: 2.021530E+00 | …

``elapsed time per iteration (ms)`` is the mean over the iterations since the previous line, so
each of them gets that duration. ``throughput per GPU (TFLOP/s/GPU)`` (``TFLOPs:`` in
Megatron-DeepSpeed) is the model FLOPs each GPU achieved — against the GPU's peak it is the MFU
— and is kept on the step as ``perf/throughput_tflops_per_gpu``; tokens per GPU per second
(``tgs``) likewise. ``[Rank r] (after N iterations) memory (MB) | allocated: … | max
allocated: …`` lines give the peak memory, kept on that iteration's step. Megatron-DeepSpeed
prints DeepSpeed's ``wall_clock_breakdown`` timers before each iteration line: they become its
forward / backward / allreduce / optimizer phases (`steplog.attach_timers`). ms-swift's Megatron
backend (``megatron sft`` / ``megatron rlhf``) prints the same lines.

The optional ``[YYYY-MM-DD HH:MM:SS]`` stamp has no time zone: step ends are placed by the
stamps relative to the first, and the import stays unanchored.
"""

from __future__ import annotations

import re
from datetime import datetime
from pathlib import Path
from typing import Any

from gpuprof.collectors.importers import Imported, ImportFormatError, open_text
from gpuprof.collectors.importers.steplog import (
    DS_PHASES,
    MAX_STEP,
    Skipped,
    StepRecord,
    attach_timers,
    console_lines,
    deepspeed_timers,
    duration_s,
    frames_from_steps,
    keep_gpu_name,
    to_float,
)

FORMAT = "megatron-log"
LATE = True
"""Step lines may start after thousands of lines of start-up chatter: `detect` streams the
whole file through `sniff`."""

_ITERATION = re.compile(r"\biteration\s+(\d+)\s*/\s*(\d+)\s*\|(.*)$")
_STAMP = re.compile(r"\[(\d{4}-\d\d-\d\d[ T]\d\d:\d\d:\d\d)\]\s*iteration\b")
_MEMORY = re.compile(r"\[Rank (\d+)\] \(after (\d+) iterations\) memory \(MB\)\s*\|(.*)$")
_FIELD = re.compile(r"^\s*([^:|]+?)\s*:\s*(\S+)\s*$")
_FIGURES: dict[str, str] = {
    "throughput per GPU (TFLOP/s/GPU)": "perf/throughput_tflops_per_gpu",
    "TFLOPs": "perf/throughput_tflops_per_gpu",
    "tokens per gpu per second(tgs)": "perf/tokens_per_gpu_per_s",
    "samples per second": "perf/samples_per_s",
    "global batch size": "global_batch_size",
    "lm loss": "lm_loss",
    "loss": "loss",
    "grad norm": "grad_norm",
    "actual seqlen": "seq_length",
    "number of skipped iterations": "skipped_iterations",
    "number of nan iterations": "nan_iterations",
}
"""Megatron's field names → the name kept on the step span (``perf/…`` ones are listed with the
framework's own figures)."""
_SWIFT = re.compile(r"\bmegatron\s+(?:sft|pt|rlhf)\b|swift\.megatron|--rlhf_type\b")


def sniff(head: str, path: Path) -> bool:
    """Megatron ``iteration N/M | … elapsed time per iteration (ms): …`` lines."""
    return bool(re.search(r"iteration\s+\d+\s*/\s*\d+\s*\|.*elapsed time per iteration", head))


def parse(path: Path) -> Imported:
    """Every iteration line as steps (a logging window of k iterations as k steps of its mean
    time), DeepSpeed timers as phases, memory lines as peak memory on their iteration."""
    text = open_text(path)
    lines = console_lines(text)
    skipped = Skipped()
    notes: list[str] = []
    records: list[StepRecord] = []
    memory: dict[int, dict[str, float]] = {}
    first_stamp: datetime | None = None
    prev_iteration: int | None = None
    windows = False
    for number, line, _ in lines:
        mem = _MEMORY.search(line)
        if mem:
            _memory_figures(int(mem.group(2)), mem.group(3), memory)
            continue
        match = _ITERATION.search(line)
        if match is None:
            continue
        iteration = int(match.group(1))
        fields = _fields(match.group(3))
        key = "elapsed time per iteration (ms)"
        step_ms = duration_s(fields.get(key), key, f"line {number}", skipped)
        if iteration > MAX_STEP or step_ms is None:
            skipped.add("line", "iteration line without a usable iteration time", f"line {number}")
            continue
        # a window of iterations since the previous line (--log-interval), capped
        later = prev_iteration is not None and iteration > prev_iteration
        k = iteration - prev_iteration if later else 1
        k = min(k, 10_000)
        windows = windows or k > 1
        prev_iteration = iteration
        end_s = None
        stamp = _STAMP.search(line)
        if stamp:
            when = _when(stamp.group(1))
            if when is not None:
                first_stamp = first_stamp or when
                end_s = (when - first_stamp).total_seconds()
        attrs = {name: value for key, name in _FIGURES.items()
                 if (value := to_float(fields.get(key))) is not None}  # fmt: skip
        per_step = step_ms / 1000.0
        for j in range(k):
            end_ns = None
            if end_s is not None and end_s >= 0:
                end_ns = round((end_s - (k - 1 - j) * per_step) * 1e9)
            records.append(
                StepRecord(step=iteration - k + 1 + j, step_s=per_step, end_ns=end_ns,
                           line=number, attrs=dict(attrs))
            )  # fmt: skip
    if not records:
        first = skipped.first()
        why = f": {first}" if first else ""
        raise ImportFormatError(f"{path}: no Megatron iteration line with an iteration time{why}")
    timers = deepspeed_timers(lines, skipped)
    attach_timers(records, timers, notes)
    by_step = {r.step: r for r in records}
    for iteration, figures in memory.items():
        if iteration in by_step:
            by_step[iteration].attrs.update(figures)
    if memory:
        peak = max(f.get("perf/max_memory_allocated_gb", 0.0) for f in memory.values())
        notes.append(f"peak memory allocated {peak:.1f} GB (Megatron's memory report, all ranks)")
    if windows:
        notes.append(
            "iteration lines every few iterations (--log-interval): each iteration of a window "
            "gets the window's mean time"
        )
    if not timers:
        notes.append("Megatron logs give iteration times only: no phases")
    if any(r.end_ns is None for r in records):
        for record in records:
            record.end_ns = None  # mixed stamped and unstamped lines: lay steps end to end
    framework = "swift" if _SWIFT.search(text) else "megatron"
    meta: dict[str, Any] = {"framework": framework}
    keep_gpu_name(meta, text)
    notes.extend(skipped.notes())
    imported = Imported(source=path, format=FORMAT, meta=meta, anchored=False, notes=notes)
    imported.frames = frames_from_steps(records, framework=framework, phase_map=DS_PHASES)
    return imported


def _fields(text: str) -> dict[str, str]:
    """``name: value`` fields of an iteration line (a cut last field is dropped)."""
    out = {}
    for part in text.split("|"):
        match = _FIELD.match(part)
        if match:
            out[match.group(1).strip()] = match.group(2)
    return out


def _memory_figures(iteration: int, text: str, memory: dict[int, dict[str, float]]) -> None:
    """The peak of ``max allocated`` / ``max reserved`` (MB) over the ranks reporting after
    ``iteration``, in GB as verl names them."""
    fields = _fields(text)
    figures = memory.setdefault(iteration, {})
    for key, name in (("max allocated", "perf/max_memory_allocated_gb"),
                      ("max reserved", "perf/max_memory_reserved_gb")):  # fmt: skip
        mb = to_float(fields.get(key))
        if mb is not None and mb >= 0:
            figures[name] = max(figures.get(name, 0.0), mb / 1024.0)


def _when(text: str) -> datetime | None:
    try:
        return datetime.fromisoformat(text)
    except ValueError:
        return None
