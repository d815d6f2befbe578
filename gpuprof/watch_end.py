"""The end of a watch: the run's summary, its diagnosis and its HTML report, made once, in a
process of their own.

The watcher's exit code is the watched command's. Whatever the end of a watch costs must not
change it: a run too large for the memory free is said to be so in one line instead of being
read (`footprint`, the rule ``analyze`` follows), and the summary, the diagnosis and the report
are made by a fresh interpreter (`make`), so that being killed for memory, or a bug, costs
them alone — never the code the watcher exits with, and the memory goes back when they are
done. A fresh interpreter rather than a fork: the watcher may still run threads (the metrics
endpoint, the trackers' follower) that hold locks a forked child would inherit held.

The run is read and diagnosed once for the summary, the headline and the report (they used
to read and diagnose it each), on every core: the command has ended.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

from gpuprof.cli import _err

__all__ = ["Made", "finish", "make"]

BY_STEPS = 24
"""The stretch length the lines name when a run is too large to diagnose whole here."""


class Made:
    """What the end of a watch made: ``report`` the report's path (None: none was written),
    ``document`` the diagnosis as `Diagnosis.to_dict` (None: no diagnosis)."""

    def __init__(self, report: Path | None = None, document: dict[str, Any] | None = None):
        self.report = report
        self.document = document


def make(run_dir: Path, *, quiet: bool, figures: dict[str, Any] | None = None) -> Made:
    """`finish` ``run_dir`` in a process of its own (its output on this process's stderr) and
    return what it made. Never raises: a failure or a kill of that process is one line."""
    run_dir = Path(run_dir)
    args = json.dumps({"run_dir": str(run_dir), "quiet": quiet, "figures": figures or {}})
    package_root = str(Path(__file__).resolve().parent.parent)
    code = (
        "import sys; sys.path.insert(0, sys.argv[1]); "
        "from gpuprof.watch_end import _main; _main(sys.argv[2])"
    )
    try:
        # a session of its own: Ctrl-C at the terminal reaches the watcher alone, which
        # stops this process and says so in one line (interrupted in its imports, it would
        # print a traceback)
        proc = subprocess.Popen(
            [sys.executable, "-c", code, package_root, args],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            start_new_session=True,
        )
    except OSError as exc:
        _err(f"the summary and report were not made ({exc}); the run is saved: "
             f"gpuprof analyze {run_dir}")  # fmt: skip
        return Made()
    try:
        out, _ = proc.communicate()
    except KeyboardInterrupt:  # the user gave up waiting: the watch's exit code stands
        proc.kill()
        proc.wait()
        _err(f"the summary and report were interrupted; the run is saved in {run_dir}")
        return Made()
    if proc.returncode != 0:
        _err(_failed(run_dir, proc.returncode))
        return Made()
    try:
        got = json.loads(out.decode().strip().splitlines()[-1])
        report = got.get("report")
        return Made(Path(report) if report else None, got.get("document"))
    except (ValueError, IndexError, AttributeError):
        _err(f"the summary and report of {run_dir} sent nothing back; the run is saved")
        return Made()


def _failed(run_dir: Path, returncode: int) -> str:
    if returncode < 0:
        try:
            name = signal.Signals(-returncode).name
        except ValueError:
            name = f"signal {-returncode}"
        why = f"their process was killed ({name}{', out of memory?' if name == 'SIGKILL' else ''})"
    else:
        why = f"their process failed (exit {returncode})"
    return (
        f"the summary and report were not made: {why}; the run is saved in {run_dir}: "
        f"gpuprof analyze {run_dir} --by-steps {BY_STEPS}"
    )


def _main(args_json: str) -> None:
    """The process of `make`: `finish`, then one JSON line on stdout for the watcher."""
    args = json.loads(args_json)
    try:
        made = finish(Path(args["run_dir"]), quiet=bool(args["quiet"]), figures=args["figures"])
    except KeyboardInterrupt:  # a SIGINT sent to this process alone: the watcher says so
        sys.exit(130)
    except Exception as exc:  # a bug here: one line, and the watcher goes on
        _err(f"the summary and report were not made ({type(exc).__name__}: {exc})")
        made = Made()
    sys.stdout.write(json.dumps({"report": str(made.report) if made.report else None,
                                 "document": made.document}) + "\n")  # fmt: skip
    sys.stdout.flush()


def finish(run_dir: Path, *, quiet: bool, figures: dict[str, Any] | None = None) -> Made:
    """The summary (unless ``quiet``), the diagnosis's headline and the report of the run in
    ``run_dir``, from one reading and one diagnosis of it on every core; the report's path and
    the diagnosis document. A run diagnosed in parts (long: its series read node by node, as
    ``analyze`` reads them) whose whole diagnosis would hold more memory than is free
    (`footprint`) gets one line saying how to diagnose it instead. Failures are one line each
    (`cli._err`); nothing raises but a bug."""
    from gpuprof import api, loader
    from gpuprof.analyzers.diagnose import parts_min_samples

    figures = figures or {}
    cores = loader.default_workers()
    # a stack without a patch still prints its timings: they become the run's phases
    from gpuprof import printed_timings

    printed_timings.ensure(run_dir)
    try:
        run, series = loader.load_for_diagnosis(run_dir, defer_from=parts_min_samples(cores))
    except api.RunError as exc:
        _err(str(exc))
        return Made()
    diagnosis = None
    if series is not None:
        # judged as ``analyze`` judges it: a run read whole has been read
        cores = _workers_that_fit(run_dir, series.rows, cores, quiet)
        if not cores:
            return Made()
        # a long run: diagnosed first in parts that read their own nodes' series, then read
        # whole for the summary and the report (both never held at once)
        diagnosis = _diagnose(run_dir, run, figures, cores, series=series)
        try:  # under the budget its kept form was made with: that form is what is read
            run = loader.load_for_analysis(run_dir, loader.MAX_GPU_SAMPLES)
        except api.RunError as exc:
            _err(str(exc))
            return Made(document=_document(diagnosis))
    if not quiet:
        _print_summary(run, run_dir)
    context = None
    if diagnosis is None:
        from gpuprof.analyzers.findings import AnalysisContext

        context = AnalysisContext(run)  # one alignment for the diagnosis and the report's steps
        diagnosis = _diagnose(run_dir, run, figures, cores, context=context)
    if not quiet and diagnosis is not None:
        _print_headline(run, run_dir, diagnosis)
    report = None
    if diagnosis is not None:
        report = _write_report(run_dir, run, diagnosis, context, quiet)
    elif not quiet:
        _err(f"report not written (no diagnosis); try: gpuprof report {run_dir}")
    return Made(report, _document(diagnosis))


def _workers_that_fit(run_dir: Path, rows: dict[str, int], workers: int, quiet: bool) -> int:
    """``workers`` when the whole diagnosis of the run read with ``rows`` fits in the memory
    free on that many processes, else the most fewer that fit (one line, unless ``quiet``),
    else 0 (one line naming the commands that diagnose it later)."""
    from gpuprof import footprint

    need = footprint.whole_diagnosis_bytes(rows, workers)
    free = footprint.available_bytes()
    if not free or need <= free:
        return workers
    fewer = footprint.workers_that_fit(rows, workers, free)
    if fewer:  # each worker holds copies of whole-run figures: fewer fit
        if not quiet:
            print(footprint.fewer_workers_line(run_dir, rows, fewer, workers, free),
                  file=sys.stderr)  # fmt: skip
        return fewer
    _err(
        f"the summary and report of {run_dir} are not made here: its whole diagnosis would "
        f"hold about {need / 1e9:.1f} GB ({rows.get('gpu', 0):,} merged GPU samples, "
        f"{rows.get('spans', 0):,} spans) and {free / 1e9:.1f} GB of memory are free. The run "
        f"is saved: gpuprof analyze {run_dir} holds its diagnosis within the memory free "
        f"(slower), gpuprof analyze {run_dir} --by-steps {BY_STEPS} (and gpuprof report "
        f"--by-steps {BY_STEPS}) diagnoses it stretch by stretch"
    )
    return 0


def _diagnose(run_dir: Path, run: Any, figures: dict[str, Any], workers: int, **kw: Any):
    """The run's diagnosis, or None (one line) when it fails: the run is saved."""
    from gpuprof import api

    try:
        return api.analyze(run, workers=workers, **figures, **kw)
    except Exception as exc:
        _err(f"diagnosis failed ({type(exc).__name__}: {exc}); try: gpuprof analyze {run_dir}")
        return None


def _document(diagnosis: Any) -> dict[str, Any] | None:
    if diagnosis is None:
        return None
    try:
        from gpuprof.reports.fmt import render_json

        return json.loads(render_json(diagnosis.to_dict()))
    except Exception:  # the trackers then log the live figures alone
        return None


def _print_summary(run: Any, run_dir: Path) -> None:
    from rich.console import Console

    from gpuprof.reports.summary import summary_renderable

    # crop=False: the last line is a path, kept whole past the terminal's width to be copied
    Console(stderr=True).print(summary_renderable(run, str(run_dir)), crop=False)


TOP = 3
"""Findings and recommendations printed at the end of ``watch`` (``analyze`` prints all)."""


def _print_headline(run: Any, run_dir: Path, diagnosis: Any) -> None:
    """The data basis, the step's bound, the efficiency figures and the top findings and
    recommendations, as ``analyze`` prints them (nothing without spans: the summary's notes say
    what is missing). A run without GPU samples is judged on its phase times, as ``analyze``
    judges it: its findings are printed here too."""
    if run.spans.empty:
        return
    from rich.console import Console, Group

    from gpuprof.reports.terminal import (
        basis_parts,
        bound_parts,
        efficiency_renderable,
        findings_renderable,
    )

    console = Console(stderr=True)
    summary = diagnosis.summary
    console.print(Group(*basis_parts(summary), *bound_parts(summary.get("bound"))))
    console.print(efficiency_renderable(summary.get("efficiency")))
    console.print(findings_renderable(diagnosis, top=TOP))
    more = max(0, len(diagnosis.findings) - TOP) + max(0, len(diagnosis.recommendations) - TOP)
    if more:
        console.print(f"({more} more findings and recommendations below the top {TOP})")
    # soft_wrap: a path must stay on one line to be copied
    console.print(f"full diagnosis: gpuprof analyze {run_dir}", soft_wrap=True)


def _write_report(
    run_dir: Path, run: Any, diagnosis: Any, context: Any, quiet: bool
) -> Path | None:
    """RUN_DIR/report.html; a failure is one line (the run itself is saved)."""
    from gpuprof import api

    try:
        path = api.report(run_dir, run=run, diagnosis=diagnosis, context=context)
    except Exception as exc:
        if not quiet:
            _err(f"report not written ({type(exc).__name__}: {exc}); try: gpuprof report {run_dir}")
        return None
    if not quiet:
        from rich.console import Console

        Console(stderr=True).print(f"report: {path}", soft_wrap=True)
    return path
