"""The command line: parse, call `gpuprof.api`, print, map known errors to exit codes.

Exit codes: the watched command's own code for ``watch``; 2 for bad input (a run that can't be
read, bad options); 0 otherwise.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console

from gpuprof import api

app = typer.Typer(
    name="gpuprof",
    help="GPU utilization profiler and bottleneck diagnoser for RL post-training of LLMs.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
EXIT_BAD_INPUT = 2


def _err(message: str) -> None:
    print(f"gpuprof: error: {message}", file=sys.stderr)


@app.command(
    context_settings={"allow_interspersed_args": False},
    help="Run a training command under the profiler: gpuprof watch [OPTIONS] -- CMD...",
)
def watch(
    command: Annotated[list[str], typer.Argument(help="The command to run, after --.")],
    output: Annotated[
        Path | None,
        typer.Option(
            "-o", "--output", help="Run directory [default: ./gpuprof-runs/<time>-<name>]."
        ),
    ] = None,
    interval: Annotated[
        float, typer.Option("--interval", help="Sampling interval in seconds.", min=0.01, max=60)
    ] = 0.1,
    host_interval: Annotated[
        float | None,
        typer.Option(
            "--host-interval",
            help="Host and process sampling interval in seconds [default: max(interval, 0.5)].",
            min=0.01,
            max=60,
        ),
    ] = None,
    no_nvml: Annotated[
        bool, typer.Option("--no-nvml", help="Don't sample GPUs through NVML.")
    ] = False,
    quiet: Annotated[
        bool, typer.Option("--quiet", "-q", help="Print nothing of gpuprof's own.")
    ] = False,
) -> None:
    if not command:
        _err("no command given: gpuprof watch [OPTIONS] -- CMD...")
        raise typer.Exit(EXIT_BAD_INPUT)
    options = api.WatchOptions(
        output=output,
        interval_s=interval,
        host_interval_s=host_interval,
        nvml=not no_nvml,
        quiet=quiet,
    )
    try:
        result = api.watch(command, options)
    except api.RunError as exc:
        _err(str(exc))
        raise typer.Exit(EXIT_BAD_INPUT) from None
    if not quiet:
        _print_summary(result.run_dir)
    raise typer.Exit(result.exit_code)


def _print_summary(run_dir: Path) -> None:
    from gpuprof.reports.summary import summary_renderable

    try:
        run = api.load_run(run_dir)
    except api.RunError as exc:
        _err(str(exc))
        return
    console = Console(stderr=True)
    console.print(summary_renderable(run, str(run_dir)))


@app.command(help="Print the summary of a recorded run.")
def summary(run_dir: Annotated[Path, typer.Argument(help="A run directory.")]) -> None:
    from gpuprof.reports.summary import summary_renderable

    try:
        run = api.load_run(run_dir)
    except api.RunError as exc:
        _err(str(exc))
        raise typer.Exit(EXIT_BAD_INPUT) from None
    Console().print(summary_renderable(run, str(run_dir)))


def main() -> None:
    """Console-script entry point."""
    try:
        app()
    except KeyboardInterrupt:  # Ctrl-C outside a watched command: no traceback
        print("gpuprof: interrupted", file=sys.stderr)
        raise SystemExit(130) from None


if __name__ == "__main__":
    main()
