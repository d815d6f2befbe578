"""The command line's entry point (``gpuprof`` and ``python -m gpuprof``).

Every command, its options and its help live in the typer app of `gpuprof.commands`. The two
commands people wait for after a run, ``analyze`` and ``report``, are also parsed here without
typer when their arguments are plain — known options, each once, with values typer accepts:
typer 0.29 imports pydantic and builds a validator per parameter, and with rich that is about
a fifth of a second of a one-second ``analyze --json``. Anything else (``--help``, an unknown
or repeated option, a value typer would reject) goes to the typer app, which then gives the
same result or its own message. The command bodies below serve both paths.

Exit codes: the watched command's own code for ``watch``; 2 for bad input (a run that can't be
read, bad options); 3 for a whole-run diagnosis that would not fit in the memory free now
(``analyze``; `footprint`); 0 otherwise.
"""

from __future__ import annotations

import os
import re
import shutil
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any, NamedTuple

EXIT_BAD_INPUT = 2
EXIT_TOO_LARGE = 3


def _err(message: str) -> None:
    print(f"gpuprof: error: {message}", file=sys.stderr)


def _load_or_exit(
    run_dir: Path, workers: int | None = None, ray: str | None = None, steps: Any = None
):
    from gpuprof import api

    try:
        return api.load_for_analysis(run_dir, workers=workers, ray=ray, steps=steps)
    except api.RunError as exc:
        _err(str(exc))
        raise SystemExit(EXIT_BAD_INPUT) from None


def _window_or_exit(run_dir: Path, steps: str | None):
    """The stretch ``--steps`` selects (None without it); a run without it: one line, exit 2."""
    if steps is None:
        return None
    from gpuprof import api, step_window

    try:
        return step_window.resolve(run_dir, steps)
    except (api.RunError, ValueError) as exc:
        _err(str(exc))
        raise SystemExit(EXIT_BAD_INPUT) from None


def _diagnosis_workers(workers: int | None) -> int:
    """Processes the diagnosis may use: ``--workers``, else every core this process may run
    on (`loader.default_workers`, ``GPUPROF_WORKERS``)."""
    from gpuprof.loader import default_workers

    return workers if workers else default_workers()


def analyze_command(
    run_dir: Path,
    json_out: bool = False,
    top: int | None = None,
    gpu_hour_price: float | None = None,
    model_params: str | None = None,
    gpu: str | None = None,
    workers: int | None = None,
    ray: str | None = None,
    steps: str | None = None,
    by_steps: int | None = None,
    ignore_memory: bool = False,
    max_memory: int | None = None,
) -> None:
    """``gpuprof analyze``: the diagnosis as text, or as one JSON document (no rich);
    ``by_steps``: stretch by stretch (`by_steps`). A run diagnosed node by node whose whole
    diagnosis would hold more memory than is free now (`footprint`), or than ``max_memory``
    (bytes), is diagnosed within that, its nodes not in use written to disk (one line says
    so), or, where not even that fits, not at all: one line says so and what to do, exit 3
    (``ignore_memory``: diagnosed all the same, in memory)."""

    if by_steps is not None:
        _by_steps_command(run_dir, by_steps, json_out, top, gpu_hour_price, model_params, gpu,
                          workers, ray, steps)  # fmt: skip
        return
    window = _window_or_exit(run_dir, steps)
    options = {"gpu_hour_price": gpu_hour_price, "model_params": model_params, "gpu": gpu}
    memory = _Memory(ignore_memory, max_memory)
    run, series, workers, held = _read_or_exit(run_dir, workers, ray, window, memory)
    diagnosis = _diagnosis_or_exit(run_dir, run, series, workers, ray, window, options, memory,
                                   held)  # fmt: skip
    if json_out:
        from gpuprof.reports.fmt import render_json

        print(render_json(diagnosis.to_dict(top=top)))
    else:
        from rich.console import Console

        from gpuprof.reports.terminal import diagnosis_renderable

        Console().print(diagnosis_renderable(diagnosis, top=top))


class _Memory(NamedTuple):
    """What the user said of the memory a diagnosis may hold: ``ignore`` (``--ignore-memory``:
    all it needs, in memory) and ``limit`` (``--max-memory``, bytes; None: what is free)."""

    ignore: bool = False
    limit: int | None = None
    hold: bool = True
    """Whether a diagnosis too large for the memory may be held within it (``report`` reads
    the whole run for its charts after: it may not)."""


class _Held(NamedTuple):
    """A diagnosis held within a budget (`diagnose`'s ``budget``, ``spill_dir``)."""

    budget: int
    spill_dir: str


def _read_or_exit(
    run_dir: Path, workers: int | None, ray: str | None, window: Any, memory: _Memory
) -> tuple[Any, Any, int | None, _Held | None]:
    """``(run, series, workers, held)`` of ``run_dir`` for a diagnosis on ``workers``: a long
    run read without its series (`loader.load_for_diagnosis`), ``series`` where they are,
    each worker of the diagnosis reading its own nodes'; else the run read whole and None.
    A run read so whose whole diagnosis would not fit in the memory free (or ``memory``'s
    limit) is diagnosed on fewer workers where those fit and none were asked for, else
    within the memory (``held``: its budget), else not at all (`_within_memory`, unless
    ``memory.ignore``); the workers to diagnose on come back. An unreadable run: one line,
    exit 2."""
    from gpuprof import api
    from gpuprof.analyzers.diagnose import parts_min_samples
    from gpuprof.loader import load_for_diagnosis

    cores = _diagnosis_workers(workers)
    try:
        run, series = load_for_diagnosis(run_dir, workers=workers, ray=ray, steps=window,
                                         defer_from=parts_min_samples(cores))  # fmt: skip
    except api.RunError as exc:
        _err(str(exc))
        raise SystemExit(EXIT_BAD_INPUT) from None
    held = None
    if series is not None and not memory.ignore:
        workers, held = _within_memory(run_dir, series, cores, workers is not None, memory)
    return run, series, workers, held


def _diagnosis_or_exit(
    run_dir: Path, run: Any, series: Any, workers: int | None, ray: str | None, window: Any,
    options: dict[str, Any], memory: _Memory, held: _Held | None = None,
) -> Any:  # fmt: skip
    """The diagnosis of ``run`` (`_read_or_exit`'s) on ``workers`` (within ``held``'s budget
    when given), with `analyze`'s figures ``options``. Series kept again or damaged since
    they were found: the run is read afresh as `_read_or_exit` reads it (the memory judged
    again), once."""
    from gpuprof import api
    from gpuprof.load_cache import SeriesUnreadable

    def diagnosed(run: Any, series: Any, workers: int | None, held: _Held | None) -> Any:
        within = held._asdict() if held is not None else {}
        return api.analyze(run, workers=_diagnosis_workers(workers), series=series, **within,
                           **options)  # fmt: skip

    try:
        try:
            return diagnosed(run, series, workers, held)
        except SeriesUnreadable:  # kept again, or damaged, since: the run read afresh
            series.discard()
            run, series, workers, held = _read_or_exit(run_dir, workers, ray, window, memory)
            return diagnosed(run, series, workers, held)
    except api.RunError as exc:
        _err(str(exc))
        raise SystemExit(EXIT_BAD_INPUT) from None


def _within_memory(
    run_dir: Path, series: Any, workers: int, asked: bool, memory: _Memory
) -> tuple[int, _Held | None]:
    """``(workers, None)`` when the whole diagnosis of the run whose series are ``series`` on
    that many processes fits in ``limit`` bytes, or else in the memory free now
    (`footprint`); else, when the free memory judges and the workers were not ``asked``
    for (all cores by default), the most fewer that fit, said in one line; else the
    processes and budget of a diagnosis held within ``limit`` (or most of the memory
    free), its nodes not in use written to disk, said in one line (where ``memory.hold``);
    else one line naming the ways out and exit 3."""
    from gpuprof import footprint
    from gpuprof.analyzers import held_parts

    rows = series.rows
    need = footprint.whole_diagnosis_bytes(rows, workers)
    free = footprint.available_bytes()
    limit = memory.limit
    if limit is None:
        if not free or need <= free:
            return workers, None
        fewer = footprint.workers_that_fit(rows, workers, free)
        if fewer and not asked:  # each worker holds copies of whole-run figures: fewer fit
            print(footprint.fewer_workers_line(run_dir, rows, fewer, workers, free),
                  file=sys.stderr)  # fmt: skip
            return fewer, None
        if fewer:  # memory grows with the workers: fewer may fit
            fits = footprint.whole_diagnosis_bytes(rows, fewer)
            _err(
                f"{run_dir}: its whole diagnosis would hold about {need / 1e9:.1f} GB "
                f"({rows.get('gpu', 0):,} merged GPU samples, {rows.get('spans', 0):,} spans, "
                f"{workers} workers) and {free / 1e9:.1f} GB of memory are free: diagnose it "
                f"on fewer workers (--workers {fewer}: about {fits / 1e9:.1f} GB), "
                + ("within the memory free (analyze --max-memory), " if memory.hold else "")
                + "or stretch by stretch (--by-steps 24)"
            )
            raise SystemExit(EXIT_TOO_LARGE)
        limit = int(free * FREE_SHARE)
        why = (f"its whole diagnosis would hold about {need / 1e9:.1f} GB and "
               f"{free / 1e9:.1f} GB of memory are free")  # fmt: skip
    elif need <= limit:
        return workers, None
    else:
        why = f"its whole diagnosis would hold about {need / 1e9:.1f} GB"
    if not memory.hold:  # the report's charts read the whole run: as much again
        _err(
            f"{run_dir}: {why}: too large to report here; its diagnosis is made within the "
            f"memory (gpuprof analyze {run_dir}), its report stretch by stretch (gpuprof "
            f"report {run_dir} --by-steps 24), or here all the same (--ignore-memory)"
        )
        raise SystemExit(EXIT_TOO_LARGE)
    _, counts, _ = series.census()
    largest = max(counts.values()) / max(1, sum(counts.values())) if counts else 1.0
    got = footprint.within(rows, limit, workers, largest)
    if got is None:
        each = footprint.held_process_bytes(rows)
        how = (
            "a run of one node is diagnosed whole"
            if len(counts) <= 1
            else f"node by node, the process that combines the nodes' figures holds about "
            f"{each / 1e9:.1f} GB for the whole run besides its largest node"
        )
        _err(
            f"{run_dir}: {why} ({rows.get('gpu', 0):,} merged GPU samples, "
            f"{rows.get('spans', 0):,} spans), and it cannot be held within "
            f"{limit / 1e9:.1f} GB: {how}. Diagnose it stretch by stretch (--by-steps 24: "
            "one stretch per worker), one stretch of it (--steps A:B), or with more memory "
            "(--max-memory, --ignore-memory)"
        )
        raise SystemExit(EXIT_TOO_LARGE)
    root = held_parts.spill_root(run_dir)
    room = _disk_free(root)
    if room is not None and room < need:
        _err(
            f"{run_dir}: {why}; held within {limit / 1e9:.1f} GB, the nodes not in use are "
            f"written to disk, about {need / 1e9:.1f} GB, and {root} has "
            f"{room / 1e9:.1f} GB free: set {held_parts.ENV_SPILL_DIR} to a directory with "
            "room, or diagnose it stretch by stretch (--by-steps 24)"
        )
        raise SystemExit(EXIT_TOO_LARGE)
    print(
        f"gpuprof: {run_dir}: {why}: diagnosed within {limit / 1e9:.1f} GB on "
        f"{got.processes} process{'es' if got.processes > 1 else ''}, node by node, the "
        f"nodes not in use written to {root} meanwhile (slower; the same diagnosis)",
        file=sys.stderr,
    )
    return got.processes, _Held(got.budget, str(root))


FREE_SHARE = 0.8
"""Share of the memory free a diagnosis too large for it is held within (the rest for what
else runs meanwhile, and the estimate's error)."""


def _disk_free(path: Path) -> int | None:
    try:
        return int(shutil.disk_usage(path).free)
    except OSError:  # unknown: nothing is judged by it
        return None


def _by_steps_or_exit(
    run_dir: Path, per: int, gpu_hour_price: float | None, model_params: str | None,
    gpu: str | None, workers: int | None, ray: str | None, steps: str | None,
) -> dict[str, Any]:  # fmt: skip
    """The stretch-by-stretch document (`by_steps.diagnose`); bad input: one line, exit 2."""
    from gpuprof import api, by_steps

    if steps is not None:
        _err("--by-steps cuts the whole run into stretches: --steps does not go with it")
        raise SystemExit(EXIT_BAD_INPUT)
    try:
        return by_steps.diagnose(
            run_dir, per, workers=workers, gpu_hour_price=gpu_hour_price,
            model_params=model_params, gpu=gpu, ray=ray,
        )  # fmt: skip
    except (api.RunError, ValueError) as exc:
        _err(str(exc))
        raise SystemExit(EXIT_BAD_INPUT) from None


def _by_steps_command(
    run_dir: Path, per: int, json_out: bool, top: int | None, *figures: Any
) -> None:  # fmt: skip
    from gpuprof import by_steps

    doc = _by_steps_or_exit(run_dir, per, *figures)
    if json_out:
        from gpuprof.reports.fmt import render_json

        print(render_json(by_steps.trimmed(doc, top)))
    else:
        from rich.console import Console

        from gpuprof.reports.terminal import by_steps_renderable

        Console().print(by_steps_renderable(doc, top=top))


def report_command(
    run_dir: Path,
    output: Path | None = None,
    gpu_hour_price: float | None = None,
    model_params: str | None = None,
    gpu: str | None = None,
    workers: int | None = None,
    ray: str | None = None,
    steps: str | None = None,
    by_steps: int | None = None,
    ignore_memory: bool = False,
) -> None:
    """``gpuprof report``: write the HTML report and print its path (a stretch of steps:
    ``report-steps-A-B.html`` by default, beside the whole run's; stretch by stretch:
    ``report-by-steps-N.html``). A long run is diagnosed as ``analyze`` diagnoses it (its
    series node by node; too large for the memory free: one line, exit 3), then read whole
    for the charts."""
    from gpuprof import api

    if by_steps is not None:
        doc = _by_steps_or_exit(run_dir, by_steps, gpu_hour_price, model_params, gpu, workers,
                                ray, steps)  # fmt: skip
        from gpuprof.reports.html_by_steps import write_by_steps_html

        try:
            path = write_by_steps_html(doc, output or run_dir / f"report-by-steps-{by_steps}.html")
        except OSError as exc:
            _err(f"cannot write the report: {exc}")
            raise SystemExit(EXIT_BAD_INPUT) from None
        print(path)
        return
    window = _window_or_exit(run_dir, steps)
    options = {"gpu_hour_price": gpu_hour_price, "model_params": model_params, "gpu": gpu}
    memory = _Memory(ignore_memory, hold=False)
    run, series, workers, held = _read_or_exit(run_dir, workers, ray, window, memory)
    diagnosis = None
    if series is not None:
        # a long run diagnosed as `analyze` diagnoses it, then read whole for the charts:
        # the diagnosis in parts and the whole run are never held at once
        diagnosis = _diagnosis_or_exit(run_dir, run, series, workers, ray, window, options,
                                       memory, held)  # fmt: skip
        del run, series
        from gpuprof import loader

        try:  # under the budget its kept form was made with: that form is what is read
            run = loader.load_for_analysis(run_dir, loader.MAX_GPU_SAMPLES, workers=workers)
        except api.RunError as exc:
            _err(str(exc))
            raise SystemExit(EXIT_BAD_INPUT) from None
    if output is None and window is not None:
        output = Path(run_dir) / f"report-steps-{window.first}-{window.last}.html"
    try:
        # a run read whole is diagnosed there, its alignment shared with the per-step table
        path = api.report(run_dir, output, run=run, diagnosis=diagnosis,
                          workers=_diagnosis_workers(workers), **options)  # fmt: skip
    except api.RunError as exc:
        _err(str(exc))
        raise SystemExit(EXIT_BAD_INPUT) from None
    print(path)


# -- the plain-argument path ------------------------------------------------------------------

# the spellings read the same by int()/float() and by typer (other spellings go to typer)
_COUNT = re.compile(r"[1-9][0-9]{0,8}")
_DECIMAL = re.compile(r"(0|[1-9][0-9]{0,14})(\.[0-9]{1,15})?")


def _count(value: str) -> int:  # --top: an int >= 1
    if not _COUNT.fullmatch(value):
        raise ValueError(value)
    return int(value)


def _price(value: str) -> float:  # --gpu-hour-price: a float >= 0
    if not _DECIMAL.fullmatch(value):
        raise ValueError(value)
    return float(value)


def _address(value: str) -> str:  # --ray: a Ray address, ``auto`` or ``local``
    if not value.strip():
        raise ValueError(value)
    return value


def _steps(value: str) -> str:  # --steps: A:B
    from gpuprof.step_window import parse

    parse(value)  # raises ValueError: typer then says why
    return value


_SIZE = re.compile(r"(\d+(?:\.\d*)?|\.\d+)\s*([kmgt]?)b?", re.IGNORECASE)
_UNITS = {"": 1, "k": 10**3, "m": 10**6, "g": 10**9, "t": 10**12}


def memory_size(value: str) -> int:
    """``--max-memory``: bytes of ``2G``, ``1.5GB``, ``800M``, ``2000000000`` (decimal
    units, as the lines that state memory print them); ValueError for anything else."""
    got = _SIZE.fullmatch(value.strip())
    if got is None:
        raise ValueError(f"{value!r} is no memory size (2G, 1500M)")
    size = int(float(got.group(1)) * _UNITS[got.group(2).lower()])
    if size <= 0:
        raise ValueError(f"{value!r} is no memory size (2G, 1500M)")
    return size


def _path(value: str) -> Path:
    if not value:
        raise ValueError(value)
    return Path(value)


def _model_params(value: str) -> str:
    from gpuprof.analyzers.model_size import parse_param_count

    parse_param_count(value)  # raises ValueError: typer then says why
    return value


def _gpu(value: str) -> str:
    from gpuprof.analyzers.hardware import match_gpu

    if match_gpu(value) is None:
        raise ValueError(value)
    return value


_FIGURES: dict[str, tuple[str, Callable[[str], Any]]] = {
    "--gpu-hour-price": ("gpu_hour_price", _price),
    "--model-params": ("model_params", _model_params),
    "--gpu": ("gpu", _gpu),
    "--workers": ("workers", _count),
    "--ray": ("ray", _address),
    "--steps": ("steps", _steps),
}
_Options = dict[str, tuple[str, Callable[[str], Any] | None]]
_PLAIN: dict[str, tuple[Callable[..., None], _Options]] = {
    "analyze": (analyze_command, {"--json": ("json_out", None), "--top": ("top", _count),
                                  "--by-steps": ("by_steps", _count),
                                  "--ignore-memory": ("ignore_memory", None),
                                  "--max-memory": ("max_memory", memory_size), **_FIGURES}),
    "report": (report_command, {"-o": ("output", _path), "--output": ("output", _path),
                                "--by-steps": ("by_steps", _count),
                                "--ignore-memory": ("ignore_memory", None), **_FIGURES}),
}  # fmt: skip
"""Command → its body and its options (name → keyword, value parser; None: a flag)."""


def plain_call(argv: list[str]) -> tuple[Callable[..., None], dict[str, Any]] | None:
    """The command body and its keyword arguments when ``argv`` is a plain ``analyze`` or
    ``report`` (one run directory, known options each given once, values typer accepts);
    None for anything the typer app must see."""
    if not argv or argv[0] not in _PLAIN:
        return None
    body, options = _PLAIN[argv[0]]
    kwargs: dict[str, Any] = {}
    positional: list[str] = []
    args = iter(argv[1:])
    for arg in args:
        if arg == "--":
            positional.extend(args)
            break
        if not arg.startswith("-") or arg == "-":
            positional.append(arg)
            continue
        name, eq, value = arg.partition("=") if arg.startswith("--") else (arg, "", "")
        if name not in options:
            return None
        key, parse = options[name]
        if key in kwargs:
            return None  # repeated: typer's rules decide
        if parse is None:
            if eq:
                return None
            kwargs[key] = True
            continue
        if not eq:
            value = next(args, None)
            if value is None or value.startswith("-"):
                return None
        try:
            kwargs[key] = parse(value)
        except ValueError:
            return None
    if len(positional) != 1:
        return None
    try:
        kwargs["run_dir"] = _path(positional[0])
    except ValueError:
        return None
    return body, kwargs


PROFILE_ENV = "GPUPROF_PROFILE"
"""``GPUPROF_PROFILE=FILE gpuprof COMMAND ...`` profiles the command (cProfile, the main
thread, from argument parsing to the end) and writes the statistics to FILE when it ends
(``python -m pstats FILE``, snakeviz). ``python -m cProfile`` cannot: `_exit` ends the process
without the interpreter's teardown, where cProfile would write."""

_PROFILING: list[tuple[Any, str]] = []
"""The profiler running for `PROFILE_ENV` and the file it goes to (at most one)."""


def _start_profile() -> None:
    path = os.environ.get(PROFILE_ENV)
    if not path:
        return
    import cProfile

    profiler = cProfile.Profile()
    _PROFILING.append((profiler, path))
    profiler.enable()


def _write_profile() -> None:
    """Stop the profiler of `PROFILE_ENV` and write its statistics, said in one line."""
    if not _PROFILING:
        return
    profiler, path = _PROFILING.pop()
    profiler.disable()
    try:
        profiler.dump_stats(path)
    except OSError as exc:
        _err(f"{PROFILE_ENV}: the profile could not be written to {path}: {exc.strerror}")
        return
    print(f"gpuprof: profile written to {path} (python -m pstats {path})", file=sys.stderr)


def main() -> None:
    """Console-script entry point: runs the command and ends the process."""
    _start_profile()
    try:
        call = plain_call(sys.argv[1:])
        if call is not None:
            body, kwargs = call
            body(**kwargs)
            _exit(0)
            return
        from gpuprof.commands import app

        app()
    except KeyboardInterrupt:  # Ctrl-C outside a watched command: no traceback
        print("gpuprof: interrupted", file=sys.stderr)
        raise SystemExit(130) from None
    finally:
        _write_profile()


def _exit(code: int) -> None:
    """End the process now, output flushed, without tearing the interpreter down: freeing a
    run's frames and pandas' modules object by object costs a user waiting for ``analyze``
    about a tenth of a second, and the OS reclaims the memory at once anyway. When a flush
    fails (a closed pipe), the normal exit reports it instead."""
    _write_profile()
    try:
        sys.stdout.flush()
        sys.stderr.flush()
    except (OSError, ValueError):
        return
    os._exit(code)


def __getattr__(name: str) -> Any:
    # the typer app and its helpers (``from gpuprof.cli import app``) load on first use
    if name.startswith("__"):
        raise AttributeError(name)
    from gpuprof import commands

    return getattr(commands, name)


if __name__ == "__main__":
    main()
