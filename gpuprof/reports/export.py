"""``gpuprof export``: a run as a Perfetto/Chrome trace, Parquet files, or its Python stacks as a
speedscope file or folded stacks, written atomically.

Both writers produce their output under a temporary name next to the target and rename it into
place, so an interrupted or failed export never leaves a half-written file or directory.
"""

from __future__ import annotations

import contextlib
import os
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gpuprof.model import Run

FORMATS = ("perfetto", "parquet", "speedscope", "collapsed")
DEFAULT_NAMES = {"perfetto": "trace.json.gz", "parquet": "parquet",
                 "speedscope": "stacks.speedscope.json", "collapsed": "stacks.folded"}  # fmt: skip
STACK_FORMATS = ("speedscope", "collapsed")
"""Output name inside the run directory when no path is given."""


class ExportError(Exception):
    """An export that cannot be done (bad format, unusable output path); one line."""


@dataclass
class ExportResult:
    """Where the export went and what it did (``notes``: downsampling, dropped spans…)."""

    path: Path
    format: str
    counts: dict[str, int] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)


def default_path(run_dir: Path, fmt: str) -> Path:
    """``RUN_DIR/trace.json.gz``, ``RUN_DIR/parquet``, ``RUN_DIR/stacks.speedscope.json`` or
    ``RUN_DIR/stacks.folded`` (next to a run given as one file)."""
    base = run_dir if run_dir.is_dir() else run_dir.parent
    return base / DEFAULT_NAMES[fmt]


def export(
    run: Run,
    fmt: str,
    path: Path,
    *,
    diagnosis: Any | None = None,
    max_counter_events: int | None = None,
    intervals: list[list[int]] | None = None,
    idle: bool = False,
) -> ExportResult:
    """Export ``run`` as ``fmt`` (`FORMATS`) to ``path``.

    For ``perfetto``, ``diagnosis`` adds the findings track and ``max_counter_events`` caps
    the counters (None: the default cap, 0: no cap). For ``speedscope`` and ``collapsed``,
    ``intervals`` (``[[start_ns, end_ns], …]``, a finding's) keeps only the stacks inside
    them, and ``idle`` adds the time threads were blocked to the time they were busy.
    Raises `ExportError`.
    """
    if fmt not in FORMATS:
        raise ExportError(f"unknown format {fmt!r}; choose from {', '.join(FORMATS)}")
    path = Path(path)
    if not path.parent.is_dir():
        raise ExportError(f"{path.parent}: no such directory")
    if fmt == "perfetto":
        return _export_perfetto(run, path, diagnosis, max_counter_events)
    if fmt in STACK_FORMATS:
        return _export_stacks(run, fmt, path, intervals, idle)
    return _export_parquet(run, path)


def _export_stacks(run: Run, fmt: str, path: Path, intervals: list[list[int]] | None,
                   idle: bool) -> ExportResult:  # fmt: skip
    from gpuprof.reports.stacks import collapsed, speedscope, write_speedscope

    if path.is_dir():
        raise ExportError(f"{path}: is a directory; give a file name")
    if run.stack_samples.empty:
        raise ExportError(
            "the run has no Python stacks (py-spy was not installed or not allowed while it "
            "was watched, or it was recorded with --no-stacks)"
        )
    counts: dict[str, int] = {}

    def write(tmp: Path) -> None:
        with open(tmp, "w", encoding="utf-8") as handle:
            if fmt == "speedscope":
                document = speedscope(run, intervals, idle=idle)
                write_speedscope(document, handle)
                counts.update(profiles=len(document["profiles"]),
                              frames=len(document["shared"]["frames"]))  # fmt: skip
            else:
                text = collapsed(run, intervals, idle=idle)
                handle.write(text)
                counts.update(stacks=text.count("\n"))

    _atomic(path, write)
    return ExportResult(path, fmt, counts, [])


def _atomic(path: Path, write: Any, suffix: str = "") -> None:
    """``write(tmp)`` a temporary file beside ``path`` (ending in ``suffix``), then rename it
    into place; `ExportError` when it can't be written, and no temporary file left."""
    tmp = path.with_name(f".{path.name}.partial-{os.getpid()}{suffix}")
    try:
        write(tmp)
        os.replace(tmp, path)
    except OSError as exc:
        raise ExportError(f"{path}: cannot write ({exc.strerror or exc})") from None
    finally:
        with contextlib.suppress(OSError):
            tmp.unlink()


def _export_perfetto(
    run: Run, path: Path, diagnosis: Any | None, max_counter_events: int | None
) -> ExportResult:
    from gpuprof.reports.perfetto import MAX_COUNTER_EVENTS, build_trace, write_trace

    if path.is_dir():
        raise ExportError(f"{path}: is a directory; give a file name such as trace.json.gz")
    cap = MAX_COUNTER_EVENTS if max_counter_events is None else max_counter_events
    trace = build_trace(run, diagnosis, max_counter_events=cap)
    # the temporary name keeps the suffix, so write_trace compresses exactly as the target asks
    _atomic(path, lambda tmp: write_trace(trace, tmp), "".join(path.suffixes[-1:]))
    return ExportResult(path, "perfetto", trace.counts, list(trace.info["notes"]))


def _export_parquet(run: Run, path: Path) -> ExportResult:
    from gpuprof.reports.parquet import is_parquet_export, write_parquet_dir

    if path.exists() and not (path.is_dir() and (is_parquet_export(path) or _empty(path))):
        raise ExportError(f"{path}: exists and is not a gpuprof Parquet export; choose another -o")
    tmp = path.with_name(f".{path.name}.partial-{os.getpid()}")
    old = path.with_name(f".{path.name}.old-{os.getpid()}")
    try:
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir()
        counts = write_parquet_dir(run, tmp)
        if path.exists() and not _empty(path):
            os.replace(path, old)  # a previous export: swapped out, removed once the new one is in
        os.replace(tmp, path)
    except OSError as exc:
        raise ExportError(f"{path}: cannot write ({exc.strerror or exc})") from None
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
        shutil.rmtree(old, ignore_errors=True)
    return ExportResult(path, "parquet", counts, [])


def _empty(directory: Path) -> bool:
    return directory.is_dir() and not any(directory.iterdir())
