"""The typer app: every command, its options and its help.

Parse, call `gpuprof.api`, print, map known errors to exit codes (see `gpuprof.cli`, the entry
point, which runs plain ``analyze`` and ``report`` invocations without loading this module).
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console

from gpuprof import api, cli
from gpuprof.cli import EXIT_BAD_INPUT, _err, _load_or_exit, analyze_command, report_command

app = typer.Typer(
    name="gpuprof",
    help="GPU utilization profiler and bottleneck diagnoser for RL post-training of LLMs.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)


def _checked(check: Callable[[str], Any]) -> Callable[[str | None], str | None]:
    """A typer callback that passes an option's value on as given once ``check`` (the plain
    path's parser, `gpuprof.cli`) accepts it; its ValueError is typer's bad-parameter
    message."""

    def callback(value: str | None) -> str | None:
        if value is None:
            return None
        try:
            check(value)
        except ValueError as exc:
            raise typer.BadParameter(str(exc)) from None
        return value

    return callback


_model_params = _checked(cli._model_params)


def _memory_size(value: str) -> int:
    try:
        return cli.memory_size(value)
    except ValueError as exc:  # typer's bad-parameter message, without "Value error"
        raise typer.BadParameter(str(exc)) from None


IgnoreMemory = Annotated[
    bool,
    typer.Option(
        "--ignore-memory",
        help="Diagnose the whole run in memory even where it looks too large for the memory "
        "free now (without it: held within the memory free, nodes not in use written to "
        "disk; where even that does not fit, one line says how much it needs, and exit 3).",
    ),
]

MaxMemory = Annotated[
    int | None,
    typer.Option(
        "--max-memory",
        parser=_memory_size,
        metavar="SIZE",
        help="Hold the diagnosis of a long run within SIZE (2G, 1500M: all its processes "
        "together): node by node, the nodes not in use written to disk (GPUPROF_SPILL_DIR, "
        "else the run's directory). Slower; the same diagnosis. Without it, a run too large "
        "for the memory free is held within most of it.",
    ),
]


GpuHourPrice = Annotated[
    float | None,
    typer.Option(
        "--gpu-hour-price",
        min=0,
        help="What one GPU-hour costs, in your currency: prices the idle time and each "
        "finding's lost GPU-time.",
    ),
]


def _gpu_name(value: str | None) -> str | None:
    if value is None:
        return None
    from gpuprof.analyzers.hardware import GPU_TABLE, match_gpu

    if match_gpu(value) is None:
        known = ", ".join(GPU_TABLE)
        raise typer.BadParameter(f"unknown GPU model {value!r}; known: {known}")
    return value


Workers = Annotated[
    int | None,
    typer.Option(
        "--workers",
        min=1,
        help="Processes that read a long run and diagnose a large one (default: every core; "
        "GPUPROF_WORKERS; 1: this process alone). The diagnosis does not depend on it.",
    ),
]
RayAddress = Annotated[
    str | None,
    typer.Option(
        "--ray",
        help="Read a long run with the tasks of this Ray cluster (auto: the one this machine "
        "is in; local: a Ray of its own) instead of local processes. Its nodes must see the "
        "run directory at the same path.",
    ),
]
Steps = Annotated[
    str | None,
    typer.Option(
        "--steps",
        callback=_checked(cli._steps),
        help="Only this stretch of the run's steps, read and diagnosed alone: A:B as a Python "
        "slice of step numbers (-100: the last hundred). Memory and time follow its length.",
    ),
]
BySteps = Annotated[
    int | None,
    typer.Option(
        "--by-steps",
        min=1,
        help="Diagnose the run N steps at a time, each stretch alone and several at once "
        "(--workers), and show the stretches side by side with their sums: where each stall "
        "grew or went, in memory that follows one stretch.",
    ),
]
GpuName = Annotated[
    str | None,
    typer.Option(
        "--gpu",
        callback=_gpu_name,
        help="The GPU model (H100, A100 80GB, GH200, MI300X…) for MFU and the decode roofline "
        "when the run does not name it (a framework log) or names it wrongly.",
    ),
]
ModelParams = Annotated[
    str | None,
    typer.Option(
        "--model-params",
        callback=_model_params,
        help="Parameters of the trained model (7e9, 7B, 500M) for MFU; default: the "
        "config.json at the model path, else the size in the model's name.",
    ),
]


@app.command(
    context_settings={"allow_interspersed_args": False},
    help="Run a training command under the profiler: gpuprof watch [OPTIONS] -- CMD...",
)
def watch(
    command: Annotated[list[str], typer.Argument(help="The command to run, after --.")],
    output: Annotated[
        Path | None,
        typer.Option(
            "-o", "--output", help="Run directory (default: ./gpuprof-runs/<time>-<name>)."
        ),
    ] = None,
    interval: Annotated[
        float, typer.Option("--interval", help="Sampling interval in seconds.", min=0.01, max=60)
    ] = 0.1,
    host_interval: Annotated[
        float | None,
        typer.Option(
            "--host-interval",
            help="Host and process sampling interval in seconds (default: max(interval, 0.5)).",
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
    live: Annotated[
        bool,
        typer.Option(
            "--live",
            help="Show GPU bars, phases per rank, step rate and the idlest phase at the "
            "bottom of the terminal while the command runs (needs a terminal on stderr).",
        ),
    ] = False,
    no_auto: Annotated[
        bool,
        typer.Option(
            "--no-auto",
            help="Don't instrument TRL, ms-swift, verl, OpenRLHF and torch.distributed "
            "in the command's Python processes (zero-code phase capture).",
        ),
    ] = False,
    kill_after: Annotated[
        float,
        typer.Option(
            "--kill-after",
            help="Seconds after a forwarded SIGTERM/SIGINT before the command's process group "
            "is killed (SIGKILL; at once on a second signal); 0: never.",
            min=0,
        ),
    ] = 30.0,
    metrics_port: Annotated[
        int | None,
        typer.Option(
            "--metrics-port",
            help="Serve Prometheus metrics (GPU readings, phase and steps per rank, idle "
            "GPU-time by phase) at http://127.0.0.1:PORT/metrics while the command runs "
            "(0: a free port). Nothing listens without it.",
            min=0,
            max=65535,
        ),
    ] = None,
    metrics_address: Annotated[
        str | None,
        typer.Option(
            "--metrics-address",
            help="Address the --metrics-port endpoint listens on (default 127.0.0.1; "
            "0.0.0.0: every interface).",
        ),
    ] = None,
    log_to: Annotated[
        list[str] | None,
        typer.Option(
            "--log-to",
            envvar="GPUPROF_LOG_TO",
            help="Log GPU utilization (mean and per GPU), idle GPU-seconds by phase, step time "
            "and the top finding so far to an experiment tracker while the command runs, and "
            "the diagnosis, report.html and diagnosis.json at the end: wandb, tensorboard or "
            "mlflow (repeat it or give a comma list). Into the training's run where the "
            "environment names it (WANDB_RUN_ID online, MLFLOW_RUN_ID), else a run grouped "
            "with it; TensorBoard: a gpuprof directory in the training's log dir. A tracker "
            "that fails is one line; the command is never held up.",
        ),
    ] = None,
    log_interval: Annotated[
        float,
        typer.Option(
            "--log-interval",
            envvar="GPUPROF_LOG_INTERVAL",
            help="Seconds between two points logged by --log-to.",
            min=0.5,
        ),
    ] = 10.0,
    log_timeout: Annotated[
        float,
        typer.Option(
            "--log-timeout",
            envvar="GPUPROF_LOG_TIMEOUT",
            help="Seconds --log-to waits, after the command, for the trackers' last upload "
            "before going on without it.",
            min=0,
        ),
    ] = 10.0,
    wait_nodes: Annotated[
        float,
        typer.Option(
            "--wait-nodes",
            help="Multi-node launch: seconds node rank 0 waits, once its command ended, for "
            "the other nodes' watchers before printing the run's summary.",
            min=0,
        ),
    ] = 120.0,
    no_stacks: Annotated[
        bool,
        typer.Option(
            "--no-stacks",
            help="Don't sample the Python stacks of the command's processes (py-spy) nor the "
            "CPU of their threads.",
        ),
    ] = False,
    stacks_rate: Annotated[
        int | None,
        typer.Option(
            "--stacks-rate",
            help="Python stack samples per second per process while the GPUs work (default: 2).",
            min=1,
            max=1000,
        ),
    ] = None,
    stacks_idle_rate: Annotated[
        int | None,
        typer.Option(
            "--stacks-idle-rate",
            help="...and while most GPUs idle (default: 20).",
            min=1,
            max=1000,
        ),
    ] = None,
    no_report: Annotated[
        bool,
        typer.Option(
            "--no-report",
            help="Don't diagnose the run nor write report.html when the command ends (a "
            "long run's take minutes, holding the job): gpuprof analyze / report RUN later.",
        ),
    ] = False,
    gpu_hour_price: GpuHourPrice = None,
    model_params: ModelParams = None,
    gpu: GpuName = None,
) -> None:
    if not command:
        _err("no command given: gpuprof watch [OPTIONS] -- CMD...")
        raise typer.Exit(EXIT_BAD_INPUT)
    if metrics_address is not None and metrics_port is None:
        _err("--metrics-address needs --metrics-port")
        raise typer.Exit(EXIT_BAD_INPUT)
    metrics_address = metrics_address or "127.0.0.1"
    trackers: list[str] = []
    if log_to:
        from gpuprof.reports.trackers import parse_log_to

        try:
            trackers = parse_log_to(log_to)
        except ValueError as exc:
            _err(f"--log-to: {exc}")
            raise typer.Exit(EXIT_BAD_INPUT) from None
    options = api.WatchOptions(
        output=output,
        interval_s=interval,
        host_interval_s=host_interval,
        nvml=not no_nvml,
        quiet=quiet,
        live=live,
        auto=not no_auto,
        kill_after_s=kill_after or None,
        wait_nodes_s=wait_nodes,
        metrics_address=None if metrics_port is None else (metrics_address, metrics_port),
        log_to=tuple(trackers),
        log_interval_s=log_interval,
        log_timeout_s=log_timeout,
        stacks=not no_stacks,
        stack_rate_hz=stacks_rate,
        stack_idle_rate_hz=stacks_idle_rate,
    )
    try:
        result = api.watch(command, options)
    except api.RunError as exc:
        _err(str(exc))
        raise typer.Exit(EXIT_BAD_INPUT) from None
    figures = {"gpu_hour_price": gpu_hour_price, "model_params": model_params, "gpu": gpu}
    try:
        if not result.complete or not result.summarize:  # a cut run, or not node rank 0
            api.finish_log_to(result)
            raise typer.Exit(result.exit_code)
        if no_report:
            if not quiet:
                print(f"gpuprof: the run is saved in {result.run_dir} (--no-report): "
                      f"gpuprof analyze {result.run_dir}", file=sys.stderr)  # fmt: skip
            api.finish_log_to(result)
            raise typer.Exit(result.exit_code)
        from gpuprof import watch_end

        made = watch_end.make(result.run_dir, quiet=quiet, figures=figures)
        api.finish_log_to(result, made.report, document=made.document)
    except KeyboardInterrupt:  # Ctrl-C once the command ended: its exit code stands
        _err(f"interrupted after the command ended; the run is saved in {result.run_dir}")
    raise typer.Exit(result.exit_code)


@app.command(help="Print the summary of a recorded run.")
def summary(
    run_dir: Annotated[Path, typer.Argument(help="A run directory.")],
    gpu_hour_price: GpuHourPrice = None,
    model_params: ModelParams = None,
    gpu: GpuName = None,
) -> None:
    from gpuprof.reports.summary import summary_renderable
    from gpuprof.reports.terminal import efficiency_renderable

    run = _load_or_exit(run_dir)
    console = Console()
    console.print(summary_renderable(run, str(run_dir)), crop=False)  # the path stays whole
    figures = api.efficiency(run, gpu_hour_price=gpu_hour_price, model_params=model_params, gpu=gpu)
    console.print(efficiency_renderable(figures))


@app.command(help="Diagnose a run: stalls, GPU-time they cost, and the knobs to turn.")
def analyze(
    run_dir: Annotated[Path, typer.Argument(help="A run directory.")],
    json_out: Annotated[bool, typer.Option("--json", help="Print one JSON document.")] = False,
    top: Annotated[
        int | None, typer.Option("--top", min=1, help="Show only the N largest findings.")
    ] = None,
    gpu_hour_price: GpuHourPrice = None,
    model_params: ModelParams = None,
    gpu: GpuName = None,
    workers: Workers = None,
    ray: RayAddress = None,
    steps: Steps = None,
    by_steps: BySteps = None,
    ignore_memory: IgnoreMemory = False,
    max_memory: MaxMemory = None,
) -> None:
    analyze_command(
        run_dir, json_out, top, gpu_hour_price, model_params, gpu, workers, ray, steps, by_steps,
        ignore_memory, max_memory,
    )  # fmt: skip


@app.command(help="Compare two runs: before/after table of utilization, step time, phases.")
def compare(
    before: Annotated[Path, typer.Argument(help="The run before the change.")],
    after: Annotated[Path, typer.Argument(help="The run after the change.")],
    json_out: Annotated[bool, typer.Option("--json", help="Print one JSON document.")] = False,
) -> None:
    from gpuprof.analyzers.compare import compare as compare_runs
    from gpuprof.reports.terminal import compare_renderable, render_json

    runs = [_load_or_exit(before), _load_or_exit(after)]
    diagnoses = [api.analyze(r) for r in runs]
    table = compare_runs(*diagnoses)
    if json_out:
        document = {
            "before": runs[0].meta.run_id,
            "after": runs[1].meta.run_id,
            "rows": table.astype(object).where(table.notna(), None).to_dict("records"),
        }
        print(render_json(document))
    else:
        Console().print(compare_renderable(table, runs[0].meta.run_id, runs[1].meta.run_id))


@app.command(help="Join run directories recorded separately on each node into one run.")
def merge(
    runs: Annotated[list[Path], typer.Argument(help="The nodes' run directories.")],
    output: Annotated[Path, typer.Option("-o", "--output", help="The merged run directory.")],
) -> None:
    try:
        written = api.merge_runs(runs, output)
        run = api.load_run(output)
    except api.RunError as exc:
        _err(str(exc))
        raise typer.Exit(EXIT_BAD_INPUT) from None
    clocks = ", ".join(
        f"{node} {c['offset_ns'] / 1e6:+.1f} ms (±{(c['error_ns'] or 0) / 1e6:.1f})"
        for node, c in run.meta.clocks.items()
        if c.get("method") != "reference"
    )
    hosts = ", ".join(run.meta.hosts)
    line = f"{output}: {len(written)} files from {len(runs)} runs, nodes {hosts}"
    print(line + (f"; clock offsets {clocks}" if clocks else ""))


@app.command(
    help="Move a run's samples into Parquet side files, which load several times "
    "faster (watch does it when a run ends; this is for a run cut short or going on)."
)
def compact(
    run_dir: Annotated[Path, typer.Argument(help="A run directory.")],
    jobs: Annotated[
        int | None, typer.Option("-j", "--jobs", min=1, help="Files compacted at once.")
    ] = None,
) -> None:
    started = time.monotonic()
    try:
        files, written = api.compact(run_dir, jobs)
    except api.RunError as exc:
        _err(str(exc))
        raise typer.Exit(EXIT_BAD_INPUT) from None
    print(f"{run_dir}: {files} run files, {len(written)} tables moved into Parquet side files "
          f"in {time.monotonic() - started:.1f} s")  # fmt: skip


@app.command(help="Write the self-contained HTML report of a run (works offline).")
def report(
    run_dir: Annotated[Path, typer.Argument(help="A run directory.")],
    output: Annotated[
        Path | None,
        typer.Option("-o", "--output", help="HTML file to write (default: RUN_DIR/report.html)."),
    ] = None,
    gpu_hour_price: GpuHourPrice = None,
    model_params: ModelParams = None,
    gpu: GpuName = None,
    workers: Workers = None,
    ray: RayAddress = None,
    steps: Steps = None,
    by_steps: BySteps = None,
    ignore_memory: IgnoreMemory = False,
) -> None:
    report_command(
        run_dir, output, gpu_hour_price, model_params, gpu, workers, ray, steps, by_steps,
        ignore_memory,
    )  # fmt: skip


@app.command(
    help="Print the Grafana dashboard for `watch --metrics-port` (JSON to import into Grafana: "
    "gpuprof dashboard > gpuprof.json)."
)
def dashboard() -> None:
    from gpuprof.reports.dashboards import grafana_json

    sys.stdout.write(grafana_json())


@app.command(help="Simulate an 8-GPU GRPO run with known pathologies and diagnose it.")
def demo(
    output: Annotated[
        Path | None, typer.Option("-o", "--output", help="Run directory to write.")
    ] = None,
    scenario: Annotated[
        str, typer.Option("--scenario", help="default, healthy, or a stall kind.")
    ] = "default",
    gpus: Annotated[int, typer.Option("--gpus", help="Simulated GPUs (1-4096).")] = 8,
    duration: Annotated[
        float, typer.Option("--duration", help="Simulated run length in seconds.")
    ] = 600.0,
) -> None:
    from gpuprof.reports.terminal import diagnosis_renderable

    try:
        run_dir, run = api.demo(output, scenario=scenario, gpus=gpus, duration_s=duration)
    except ValueError as exc:
        _err(str(exc))
        raise typer.Exit(EXIT_BAD_INPUT) from None
    except api.RunError as exc:
        _err(str(exc))
        raise typer.Exit(EXIT_BAD_INPUT) from None
    console = Console()
    diagnosis = api.analyze(run)
    console.print(diagnosis_renderable(diagnosis))
    console.print(f"run saved to {run_dir}", soft_wrap=True)
    try:
        path = api.report(run_dir, run=run, diagnosis=diagnosis)
    except Exception as exc:  # the run is saved; say so and keep going
        _err(f"report not written ({type(exc).__name__}: {exc}); try: gpuprof report {run_dir}")
    else:
        console.print(f"report: {path}", soft_wrap=True)


@app.command(
    "import",
    help="Import nvidia-smi CSV/dmon logs, DCGM exporter scrapes, PyTorch-profiler traces and "
    "framework logs into one run directory (then analyze, report or compare it).",
)
def import_(
    files: Annotated[
        list[Path] | None, typer.Argument(help="Files to import (formats are detected).")
    ] = None,
    output: Annotated[
        Path | None,
        typer.Option("-o", "--output", help="Run directory to create (must not exist)."),
    ] = None,
    fields: Annotated[
        str | None,
        typer.Option(
            "--fields",
            help="Columns of a header-less nvidia-smi CSV, in order: the --query-gpu list "
            "(e.g. timestamp,index,utilization.gpu,memory.used).",
        ),
    ] = None,
    phase: Annotated[
        list[str] | None,
        typer.Option(
            "--phase",
            metavar="NAME=REGEX",
            help="Where a phase starts in a plain training log: a Python regex searched in each "
            "timestamped message (repeatable; the first given starts each step, and a phase "
            "lasts until the next match), e.g. --phase rollout='^Generating' --phase "
            "update_actor='^Train'. Text logs are then read with these patterns instead of "
            "their detected format.",
        ),
    ] = None,
) -> None:
    from gpuprof.collectors.importers import ImportFormatError
    from gpuprof.collectors.importers.plain_log import phase_options

    if not files:
        _err("no files given: gpuprof import FILE... -o RUN_DIR")
        raise typer.Exit(EXIT_BAD_INPUT)
    if output is None:
        _err("no run directory given: gpuprof import FILE... -o RUN_DIR")
        raise typer.Exit(EXIT_BAD_INPUT)
    try:
        phases = phase_options(phase) if phase else None
        run_dir = api.import_files(files, output, fields=fields, phases=phases)
    except (ImportFormatError, api.RunError) as exc:
        _err(str(exc))
        raise typer.Exit(EXIT_BAD_INPUT) from None
    run = _load_or_exit(run_dir)
    for notice in run.meta.notices:
        print(f"gpuprof: {notice}", file=sys.stderr)
    counts = f"{len(run.gpu)} GPU samples, {len(run.spans)} spans, {len(run.events)} events"
    print(f"gpuprof: imported {len(files)} file(s): {counts}", file=sys.stderr)
    print(run_dir)


@app.command(
    help="Export a run: a Perfetto/Chrome trace (JSON), Parquet files, or its Python stacks "
    "(speedscope, or folded stacks for flamegraph.pl)."
)
def export(
    run_dir: Annotated[Path, typer.Argument(help="A run directory.")],
    fmt: Annotated[
        str,
        typer.Option("--format", "-f", help="perfetto, parquet, speedscope or collapsed."),
    ] = "perfetto",
    output: Annotated[
        Path | None,
        typer.Option(
            "-o",
            "--output",
            help="Trace file (gzip if it ends in .gz), Parquet directory, or stacks file "
            "(default: RUN_DIR/trace.json.gz, RUN_DIR/parquet, RUN_DIR/stacks.speedscope.json "
            "or RUN_DIR/stacks.folded).",
        ),
    ] = None,
    finding: Annotated[
        str | None,
        typer.Option(
            "--finding",
            help="speedscope/collapsed: only the stacks inside this finding's intervals (its "
            "kind, e.g. reward_bound).",
        ),
    ] = None,
    idle: Annotated[
        bool,
        typer.Option(
            "--idle",
            help="speedscope/collapsed: the time Python threads were blocked too, not only "
            "the time they were busy.",
        ),
    ] = False,
    max_counter_events: Annotated[
        int | None,
        typer.Option(
            "--max-counter-events",
            min=0,
            help="perfetto: average GPU counters to stay under this many events "
            "(default: 1000000; 0: keep every sample).",
        ),
    ] = None,
    findings: Annotated[
        bool, typer.Option(help="perfetto: add the diagnosis's findings as a track.")
    ] = True,
) -> None:
    from gpuprof.reports.export import FORMATS, STACK_FORMATS, ExportError, default_path
    from gpuprof.reports.export import export as export_run

    if fmt not in FORMATS:
        _err(f"unknown format {fmt!r}; choose from {', '.join(FORMATS)}")
        raise typer.Exit(EXIT_BAD_INPUT)
    if (finding is not None or idle) and fmt not in STACK_FORMATS:
        _err("--finding and --idle go with --format speedscope or collapsed")
        raise typer.Exit(EXIT_BAD_INPUT)
    run = _load_or_exit(run_dir)
    intervals = _finding_intervals(run, finding) if finding is not None else None
    diagnosis = None
    if fmt == "perfetto" and findings and not run.gpu.empty:
        try:
            diagnosis = api.analyze(run)
        except Exception as exc:  # the trace is still worth having without the findings
            _err(f"findings left out: diagnosis failed ({type(exc).__name__}: {exc})")
    path = output or default_path(run_dir, fmt)
    try:
        result = export_run(
            run,
            fmt,
            path,
            diagnosis=diagnosis,
            max_counter_events=max_counter_events,
            intervals=intervals,
            idle=idle,
        )
    except ExportError as exc:
        _err(str(exc))
        raise typer.Exit(EXIT_BAD_INPUT) from None
    counts = ", ".join(f"{n} {k}" for k, n in result.counts.items())
    for note in result.notes:
        print(f"gpuprof: {note}", file=sys.stderr)
    print(f"gpuprof: wrote {result.path} ({counts})", file=sys.stderr)


def _finding_intervals(run, kind: str) -> list[list[int]]:
    """The evidence intervals of the run's finding of ``kind``; exit 2 when it has none."""
    from gpuprof.analyzers.findings import STALL_KINDS

    if kind not in STALL_KINDS:
        _err(f"unknown finding kind {kind!r}; choose from {', '.join(STALL_KINDS)}")
        raise typer.Exit(EXIT_BAD_INPUT)
    diagnosis = api.analyze(run)
    for f in diagnosis.findings:
        if f.kind == kind and f.evidence.get("intervals"):
            return [list(map(int, pair)) for pair in f.evidence["intervals"]]
    found = ", ".join(f.kind for f in diagnosis.findings) or "none"
    _err(f"the run has no {kind} finding with intervals (its findings: {found})")
    raise typer.Exit(EXIT_BAD_INPUT)
