"""What the CLI and library users call: `watch`, `load_run`, `summarize`."""

from __future__ import annotations

import contextlib
import os
import re
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

from gpuprof import __version__, hooks, launch, nodes, store
from gpuprof.collectors.child import ChildProcess, CommandNotFound
from gpuprof.loader import load_for_analysis
from gpuprof.model import Event, Run, RunMeta
from gpuprof.redact import redact_command, redact_text
from gpuprof.store import RunError, load_run, merge_runs

__all__ = [
    "RunError",
    "WatchOptions",
    "WatchResult",
    "analyze",
    "default_run_dir",
    "demo",
    "efficiency",
    "efficiency_options",
    "finish_log_to",
    "import_files",
    "load_for_analysis",
    "load_run",
    "merge_runs",
    "report",
    "watch",
]

MAX_LOG_LINES = 200_000
"""Output lines kept per run; later lines pass through but are counted, not stored."""


@dataclass
class WatchOptions:
    """How to watch: output directory, sampling interval (s), NVML on/off, quiet."""

    output: Path | None = None
    interval_s: float = 0.1
    host_interval_s: float | None = None
    """Host / process-tree sampling period; None: the longer of ``interval_s`` and 0.5 s."""
    nvml: bool = True
    quiet: bool = False
    live: bool = False
    """Draw a live status at the bottom of the terminal (stderr) while the command runs."""
    spool_dir: Path | None = None
    """Where to write while running when the run directory is on a network filesystem."""
    wait_nodes_s: float = 120.0
    """Multi-node launch: how long node rank 0 waits, after its command ended, for the other
    nodes' watchers to finish before printing the run's summary."""
    kill_after_s: float | None = 30.0
    """After a forwarded stop signal, SIGKILL the command's group this many seconds later (or
    on a second signal); None: never."""
    auto: bool = True
    """Zero-code capture: put gpuprof's bootstrap on the command's ``PYTHONPATH`` so TRL,
    ms-swift, verl, OpenRLHF and torch.distributed are instrumented as they are imported."""
    metrics_address: tuple[str, int] | None = None
    """Serve Prometheus metrics on this (host, port) while the command runs; None: don't."""
    log_to: tuple[str, ...] = ()
    """Experiment trackers (``wandb``, ``tensorboard``, ``mlflow``) to log gpuprof's figures to
    while the command runs (`gpuprof.reports.trackers`); `finish_log_to` adds the diagnosis."""
    log_interval_s: float = 10.0
    """Seconds between two points of the figures logged to ``log_to``."""
    log_timeout_s: float = 10.0
    """Longest wait, after the run, for the trackers' last upload."""
    stacks: bool = True
    """Sample the Python stacks of the watched processes with py-spy, when it is installed
    (`gpuprof.collectors.stacks`), and the CPU of their busy threads."""
    stack_rate_hz: int | None = None
    """Stack samples per second per process while the GPUs work (None: `stacks.RATE_HZ`)."""
    stack_idle_rate_hz: int | None = None
    """...and while most GPUs idle (None: `stacks.IDLE_RATE_HZ`)."""


@dataclass
class WatchResult:
    """The outcome: the command's exit code (128+N for signal N) and the run directory."""

    exit_code: int
    run_dir: Path
    notices: list[str] = field(default_factory=list)
    complete: bool = True
    """False when recording stopped before the command ended (disk full, directory removed)."""
    summarize: bool = True
    """False for a node of a multi-node launch other than node rank 0 (which summarizes)."""
    log_to: LogTo | None = None
    """The trackers of ``--log-to``, still open for the diagnosis and the report
    (`finish_log_to`); None without them."""


@dataclass
class LogTo:
    """What `finish_log_to` needs: the trackers' logger, the run file whose notices it adds
    to, the run's metadata, and whether to print."""

    logger: object
    run_file: Path
    meta: RunMeta
    quiet: bool = False


def default_run_dir(argv: list[str], now: float | None = None) -> Path:
    """``./gpuprof-runs/<YYYYmmdd-HHMMSS>-<name>``, the name taken from the script or module."""
    stamp = time.strftime("%Y%m%d-%H%M%S", time.localtime(now))
    return Path("gpuprof-runs") / f"{stamp}-{command_name(argv)}"


def command_name(argv: list[str]) -> str:
    """A short name for a command: the script's stem, the module's last part, or the program."""
    name = Path(argv[0]).name if argv else "run"
    for i, arg in enumerate(argv):
        if arg == "-m" and i + 1 < len(argv):
            name = argv[i + 1].rsplit(".", 1)[-1]
            break
        if arg.endswith(".py") and not arg.startswith("-"):
            name = Path(arg).stem
            break
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", name)[:40] or "run"


def _unique_dir(path: Path) -> Path:
    candidate, n = path, 1
    while candidate.exists() and any(candidate.iterdir()):
        n += 1
        candidate = path.with_name(f"{path.name}-{n}")
    return candidate


def _notify(message: str, quiet: bool, stream: TextIO | None = None) -> None:
    if not quiet:
        print(f"gpuprof: {message}", file=stream or sys.stderr, flush=True)


class _LogSink:
    """Stores the child's output lines, up to `MAX_LOG_LINES`."""

    def __init__(self, writer: store.BufferedWriter, host: str) -> None:
        self.writer, self.host = writer, host
        self.stored = 0
        self.dropped = 0

    def __call__(self, t_ns: int, stream: str, line: str) -> None:
        if self.stored >= MAX_LOG_LINES:
            self.dropped += 1
            return
        self.stored += 1
        # the same rules as the command: a program that prints its arguments or a token
        # must not put it in the run
        self.writer.add("logs", (self.host, t_ns, stream, redact_text(line)))


def watch(argv: list[str], options: WatchOptions | None = None) -> WatchResult:
    """Run ``argv`` under the profiler and record it; return its exit code and the run dir.

    The command runs in its own process group with stdio passed through; signals are
    forwarded; hooks inside it record into the run found through ``GPUPROF_RUN_DIR``.
    Raises `RunError` when the run directory cannot be created.
    """
    from gpuprof.collectors.host import HostCollector
    from gpuprof.collectors.sampler import Sampler

    options = options or WatchOptions()
    place = launch.detect(argv)
    run_dir = Path(options.output or default_run_dir(argv)).absolute()
    if not (place.multi_node and options.output):  # the nodes of a launch share one directory
        run_dir = _unique_dir(run_dir)
    created = not run_dir.exists()
    try:
        run_dir.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise RunError(f"{run_dir}: cannot create run directory ({exc.strerror})") from None
    host = nodes.node_name()
    final_path = _node_file(run_dir, host, place)
    db_path = final_path
    if store.is_network_filesystem(run_dir):
        spool = Path(options.spool_dir or tempfile.gettempdir()) / "gpuprof-spool" / run_dir.name
        spool.mkdir(parents=True, exist_ok=True)
        db_path = _node_file(spool, host, place)

    notices: list[str] = []
    if db_path != final_path:
        message = (
            f"{run_dir} is on a network filesystem: recording to {db_path}, "
            "moved into the run directory when the run ends"
        )
        notices.append(message)
        _notify(message, options.quiet)

    stop_reason: list[str] = []

    def stopped(exc: BaseException) -> None:
        # one line at the time, and in the run's notices when they can still be written
        stop_reason.append(store.failure_reason(exc, db_path))
        message = (
            f"recording stopped at {time.strftime('%H:%M:%S')}: {stop_reason[0]}; "
            "the command goes on unrecorded"
        )
        notices.append(message)
        _notify(message, options.quiet)

    writer = store.BufferedWriter(db_path, on_error=stopped)
    meta = RunMeta(
        run_id=run_dir.name,
        command=redact_command(list(argv)),
        cwd=os.getcwd(),
        hosts=[host],
        start_ns=nodes.now_ns(),
        interval_s=options.interval_s,
        gpuprof_version=__version__,
        node_rank=place.node_rank,
        nnodes=place.nnodes,
    )
    if options.stacks:
        from gpuprof.collectors import stacks as stack_collector

        meta.stacks = {
            "rate_hz": options.stack_rate_hz or stack_collector.RATE_HZ,
            "idle_rate_hz": options.stack_idle_rate_hz or stack_collector.IDLE_RATE_HZ,
        }
    if place.samples:
        nvml = _open_nvml(host, options, meta, notices)
    else:  # one sampler per node: the node's first task reads its GPUs
        nvml = None
        notices.append(f"task {place.local_task} on {host}: the node's first task samples its GPUs")
    writer.set_meta("run", meta.to_dict())
    writer.flush()  # the run file exists from the start, so an early crash leaves a readable run

    status_dir = _status_dir()
    env = dict(os.environ)
    if status_dir is not None:
        env[hooks.ENV_STATUS_DIR] = str(status_dir)
    env[hooks.ENV_RUN_DIR] = str(run_dir)
    env[hooks.ENV_DB] = str(db_path)
    env[hooks.ENV_HOST] = host
    env[nodes.ENV_WATCHER_MACHINE] = nodes.machine()
    if options.auto:
        from gpuprof.integrations import bootstrap_dir

        # first on the path, the user's PYTHONPATH after it (the bootstrap chains to any
        # sitecustomize it shadows)
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [bootstrap_dir(), env.get("PYTHONPATH")]))
    sink = _LogSink(writer, host)
    child = ChildProcess(argv, env=env, on_line=sink, kill_after_s=options.kill_after_s)
    sampler = live = metrics = trackers = stacks = None
    try:
        pid = child.start()
    except CommandNotFound as exc:
        notices.append(str(exc))
        _notify(str(exc), False)
        exit_code = 127
    else:
        host_collector = HostCollector(host, pid, threads=options.stacks)
        sampler = Sampler(
            writer,
            host_collector,
            nvml,
            interval_s=options.interval_s,
            host_interval_s=options.host_interval_s,
        )
        sampler.start()
        stacks = _start_stacks(options, writer, host, host_collector, sampler, notices)
        live = _start_live(options, sampler, db_path, host, run_dir)
        metrics = _start_metrics(options, sampler, db_path, host, meta.gpus, notices,
                                 run_dir=run_dir, run_id=meta.run_id,
                                 other_nodes=not place.multi_node)  # fmt: skip
        trackers = _start_log_to(options, sampler, db_path, host, meta, notices, argv=argv,
                                 env=env, run_dir=run_dir, place=place)  # fmt: skip
        exit_code = child.wait()
    finally:
        if trackers is not None:
            trackers.stop_live()
        if metrics is not None:
            metrics.stop()
            notices.extend(metrics.errors)
        if live is not None:
            live.stop()
        if sampler is not None:
            sampler.stop()
            notices.extend(sampler.errors)
        if stacks is not None:
            stacks.stop()
            writer.add_records("events", [stacks.cost_event()])
        if nvml is not None:
            notices.extend(n for n in nvml.notices if n not in notices)
            with contextlib.suppress(Exception):
                nvml.close()

    returncode = child.returncode
    if child.killed:
        notices.append(
            f"the command did not stop within {options.kill_after_s:g} s of the stop signal "
            "(or a second one came): its process group was killed (SIGKILL)"
        )
    if child.leftover:
        shown = ", ".join(str(p) for p in child.leftover[:8])
        notices.append(
            f"{len(child.leftover)} process(es) of the command's group still running after it "
            f"exited (pid {shown}{'…' if len(child.leftover) > 8 else ''}): left running"
        )
    meta.end_ns = nodes.now_ns()
    meta.exit_code = exit_code
    meta.exit_signal = -returncode if returncode is not None and returncode < 0 else None
    if sink.dropped:
        notices.append(f"{sink.dropped} output lines beyond {MAX_LOG_LINES} were not stored")
    lost = _losses(status_dir)
    if lost.hooks_only and not writer.failed:
        notices.append(lost.line(None, meta.end_ns))
    log_to = None
    if trackers is not None:
        notices.extend(n for n in trackers.notices + trackers.live.errors if n not in notices)
        log_to = LogTo(trackers, final_path, meta, options.quiet)
    meta.notices = notices
    _merge_recorded_knobs(meta, run_dir, db_path)
    attrs = {"exit_code": exit_code, "signal": meta.exit_signal}
    exit_event = Event(host, child.pgid or 0, None, meta.end_ns, "exit", "child", attrs)
    writer.add_records("events", [exit_event])
    writer.set_meta("run", meta.to_dict())
    writer.close()
    if writer.failed:
        # never "run saved" for a run that was not: say what is left and keep the exit code
        reason = stop_reason[0] if stop_reason else "write error"
        line = lost.line(reason, meta.end_ns, writer.failed_at_ns)
        meta.notices = [n for n in notices if not n.startswith("recording stopped at")] + [line]
        meta.stopped = line
        # stored when the disk has room again (or the failure was the hooks' alone)
        kept = reason != "run directory removed" and store.write_meta_now(
            db_path, "run", meta.to_dict()
        )
        if kept and db_path != final_path:
            with contextlib.suppress(OSError):
                store.finalize_file(db_path, final_path)
        if kept:
            where = f"{run_dir} holds what was written before, and says so"
        elif writer.rows_written == 0 or reason == "run directory removed":
            where = "nothing of the run is kept"
            _remove_empty_run(db_path, run_dir if created else None)
        else:
            where = f"{run_dir} holds only what was written before"
        _notify(f"{line}: {where} (the command exited {exit_code})", options.quiet)
        return WatchResult(exit_code=exit_code, run_dir=run_dir, notices=notices, complete=False,
                           log_to=log_to)  # fmt: skip
    store.finalize_file(db_path, final_path)
    try:  # Parquet tables load 7-9x faster; the SQLite rows stay readable if this fails
        store.compact_run(final_path)
    except Exception as exc:
        _notify(f"samples left in SQLite (compaction failed: {exc})", options.quiet)
    _compact_cluster(run_dir, meta.run_id, host, options.quiet)
    if place.multi_node and (place.node_rank != 0 or not place.samples):
        # one summary per run: node rank 0's watcher prints it once the others are done
        _notify(
            f"node rank {place.node_rank} of {place.nnodes} ({host}) recorded into {run_dir}; "
            "node rank 0 prints the run's summary",
            options.quiet,
        )
        return WatchResult(exit_code=exit_code, run_dir=run_dir, notices=notices, summarize=False,
                           log_to=log_to)  # fmt: skip
    if place.multi_node:
        _wait_for_nodes(run_dir, place, options)
    return WatchResult(exit_code=exit_code, run_dir=run_dir, notices=notices, log_to=log_to)


COMPACT_WORKERS = 8
"""The most files compacted at once (each a process holding one GPU's samples at a time)."""
COMPACT_SAY_AFTER_S = 2.0
"""A compaction of the Ray nodes' files lasting longer than this says so (the run is over but
the command has not returned yet)."""


def _compact_cluster(run_dir: Path, run_id: str, host: str, quiet: bool) -> None:
    """Compact the files a Ray driver in the command wrote for the cluster's other nodes (its
    recorder stores their rows as chunks; read uncompacted, 64 nodes' hour takes minutes to
    analyse), several files at once."""
    files = store.recorded_nodes(run_dir, run_id, host)
    if not files:
        return
    workers = min(len(files), os.cpu_count() or 1, COMPACT_WORKERS)
    line = f"compacting the samples of {len(files)} other Ray nodes…"
    say = threading.Timer(COMPACT_SAY_AFTER_S, _notify, (line, quiet))
    say.daemon = True
    say.start()
    try:
        store.compact_run(run_dir, files, workers=workers)
    except Exception as exc:
        _notify(f"the other Ray nodes' samples are left in SQLite (compaction failed: {exc}); "
                f"`gpuprof compact {run_dir}` tries again", quiet)  # fmt: skip
    finally:
        say.cancel()


def compact(run_dir: str | os.PathLike, workers: int | None = None) -> tuple[int, list[str]]:
    """Compact every file of a run directory (a run whose driver or watcher was killed before
    it could, or one still going): ``workers`` files at once (default: the cores, at most
    `COMPACT_WORKERS`). Returns the number of run files and the side files written."""
    files = store.run_files(run_dir)
    workers = workers or min(len(files), os.cpu_count() or 1, COMPACT_WORKERS)
    return len(files), store.compact_run(run_dir, files, workers=workers)


def _node_file(run_dir: Path, node: str, place: launch.Launch) -> Path:
    """The file this watcher writes: ``<node>.sqlite``, ``<node>.task<k>.sqlite`` for the
    other tasks of a node under srun (one writer of the node's samples per file)."""
    if place.local_task:
        return run_dir / f"{node}.task{place.local_task}.sqlite"
    return store.host_file(run_dir, node)


def _wait_for_nodes(run_dir: Path, place: launch.Launch, options: WatchOptions) -> None:
    """Node rank 0, its own command done: wait (at most ``wait_nodes_s``) until every node's
    watcher has finished its file, then return. Files of no other node in the directory
    mean the nodes don't share it: say how to merge instead of waiting."""
    expected = set(range(place.nnodes or 1))
    deadline = time.monotonic() + options.wait_nodes_s
    said = False
    while True:
        ranks = store.node_ranks(run_dir)
        if ranks.keys() <= {0}:
            _notify(
                f"no other node's file in {run_dir} (not a shared directory?): this summary is "
                f"node rank 0's; join the nodes' runs with gpuprof merge RUN_0 RUN_1 … -o RUN",
                options.quiet,
            )
            return
        done = {rank for rank, ended in ranks.items() if ended}
        if expected <= done:
            return
        if time.monotonic() >= deadline:
            missing = ", ".join(str(r) for r in sorted(expected - done))
            _notify(f"node rank(s) {missing} not finished after {options.wait_nodes_s:g} s: "
                    "the summary covers what is recorded so far", options.quiet)  # fmt: skip
            return
        if not said:
            _notify(f"waiting for {len(expected - done)} node(s) to finish…", options.quiet)
            said = True
        time.sleep(0.5)


def _remove_empty_run(db_path: Path, run_dir: Path | None) -> None:
    """Leave nothing half-written: the empty run file a full disk left at the start, and the
    run directory when this run created it and nothing else is in it."""
    for suffix in ("", "-wal", "-shm", "-journal"):
        with contextlib.suppress(OSError):
            os.unlink(f"{db_path}{suffix}")
    if run_dir is not None:
        with contextlib.suppress(OSError):
            run_dir.rmdir()


def _status_dir() -> Path | None:
    """A fresh directory in memory (/dev/shm, else the temp dir) where processes whose
    recording failed say what they lost; None when none can be made."""
    shm = "/dev/shm"
    base = shm if os.path.isdir(shm) and os.access(shm, os.W_OK) else None
    try:
        return Path(tempfile.mkdtemp(prefix="gpuprof-status-", dir=base))
    except OSError:
        return None


@dataclass
class _Losses:
    """What the command's processes said about records they could not write."""

    steps_seen: int | None = None
    steps_written: int | None = None
    hooks_reason: str | None = None
    hooks_failed_at_ns: int | None = None
    processes: int = 0

    @property
    def hooks_only(self) -> bool:
        return self.processes > 0

    def line(self, reason: str | None, end_ns: int | None, failed_at_ns: int | None = None) -> str:
        """``recording stopped at 00:12:31: disk full; 15 of 30 steps recorded; the last
        41 s unrecorded``: when, why and how much of the command's work is missing."""
        at_ns = failed_at_ns or self.hooks_failed_at_ns
        if failed_at_ns and self.hooks_failed_at_ns:
            at_ns = min(failed_at_ns, self.hooks_failed_at_ns)
        when = time.strftime("%H:%M:%S", time.localtime(at_ns / 1e9)) if at_ns else "?"
        who = "" if reason else f" in {self.processes} process(es) of the command"
        parts = [f"recording stopped{who} at {when}: {reason or self.hooks_reason}"]
        if self.steps_seen:
            parts.append(f"{self.steps_written} of {self.steps_seen} steps recorded")
        if at_ns and end_ns and end_ns > at_ns:
            parts.append(f"the last {(end_ns - at_ns) / 1e9:.0f} s unrecorded")
        return "; ".join(parts)


def _losses(status_dir: Path | None) -> _Losses:
    """Read and remove the status directory the hooks left their losses in."""
    import json
    import shutil

    lost = _Losses()
    if status_dir is None:
        return lost
    try:
        for path in status_dir.glob("*.json"):
            with contextlib.suppress(OSError, ValueError, TypeError, AttributeError):
                status = json.loads(path.read_text())
                seen, written = int(status["steps_seen"]), int(status["steps_written"])
                at = status.get("failed_at_ns")
                lost.processes += 1
                # steps are counted per rank: the run's figure is the furthest rank's
                lost.steps_seen = max(lost.steps_seen or 0, seen)
                lost.steps_written = max(lost.steps_written or 0, written)
                lost.hooks_reason = lost.hooks_reason or str(status.get("reason") or "")
                if isinstance(at, int):
                    lost.hooks_failed_at_ns = min(lost.hooks_failed_at_ns or at, at)
    finally:
        shutil.rmtree(status_dir, ignore_errors=True)
    return lost


def _merge_recorded_knobs(meta: RunMeta, run_dir: Path, db_path: Path) -> None:
    """Knob values the framework adapters recorded in the command's processes → ``meta``."""
    from gpuprof.integrations.recorded import merge_into_meta

    paths = {db_path, *run_dir.glob("*.sqlite")}
    try:
        merge_into_meta(meta, sorted(paths))
    except Exception as exc:  # the run is still good without them
        meta.notices.append(f"recorded knobs not read: {exc}")


def _start_live(options: WatchOptions, sampler, db_path: Path, node: str, run_dir: Path):
    """The live status view when asked for and stderr is a terminal (else one line, no view)."""
    if not options.live:
        return None
    from gpuprof.reports.live import LiveView, live_supported

    if not live_supported(sys.stderr):
        _notify("--live needs a terminal on stderr: going on without the live view", False)
        return None
    live = LiveView(sampler.latest, db_path, sys.stderr, node=node, run_dir=run_dir)
    live.start()
    return live


def _start_metrics(options: WatchOptions, sampler, db_path: Path, node, gpus, notices, *,
                   run_dir: Path, run_id: str, other_nodes: bool):  # fmt: skip
    """The Prometheus endpoint when asked for; an address it cannot bind: one line, and the
    watch goes on without it. It serves the whole run this machine records: the node's files
    and, unless the run directory is shared by the watchers of a multi-node launch, the files
    a Ray driver records for the cluster's other nodes."""
    if options.metrics_address is None:
        return None
    from gpuprof.reports.prometheus import MetricsExporter

    exporter = MetricsExporter(sampler.latest, db_path, node=node, gpus=gpus,
                               address=options.metrics_address, run_dir=run_dir,
                               run_id=run_id, other_nodes=other_nodes)  # fmt: skip
    try:
        exporter.start()
    except OSError as exc:
        notices.append(exporter.bind_failure(exc))
        _notify(notices[-1], False)
        return None
    _notify(f"Prometheus metrics at {exporter.url}", options.quiet)
    return exporter


def _start_log_to(options: WatchOptions, sampler, db_path: Path, node: str, meta: RunMeta,
                  notices: list[str], *, argv: list[str], env: dict[str, str], run_dir: Path,
                  place: launch.Launch):  # fmt: skip
    """The trackers' logger when ``--log-to`` asks for one. In a multi-node launch only node
    rank 0's watcher logs (the trackers' runs are the training's, one per job)."""
    if not options.log_to:
        return None
    if place.multi_node and (place.node_rank != 0 or not place.samples):
        notices.append(f"--log-to: node rank {place.node_rank} leaves the trackers to node rank 0")
        return None
    from gpuprof.reports.trackers import TrackerLogger

    logger = TrackerLogger(options.log_to, sampler.latest, db_path, node=node, argv=argv,
                           run_dir=run_dir, run_id=meta.run_id, env=env, gpus=meta.gpus,
                           other_nodes=not place.multi_node, interval_s=options.log_interval_s,
                           timeout_s=options.log_timeout_s,
                           on_notice=lambda line: _notify(line, options.quiet))  # fmt: skip
    logger.start()
    return logger


def finish_log_to(
    result: WatchResult,
    report_path: Path | None = None,
    *,
    document: dict[str, Any] | None = None,
) -> list[str]:
    """After `watch` (and its summary and report, `watch_end`): hand the trackers of
    ``--log-to`` the diagnosis's figures and attach ``report_path`` and the diagnosis JSON
    (``document``, `Diagnosis.to_dict`, written to ``RUN_DIR/diagnosis.json``), waiting at
    most ``log_timeout_s`` for them. A run cut short, not summarized here, or left without a
    diagnosis (too large for the memory free, or a failure: `watch_end` said why) sends the
    last live figures alone. Prints one line per tracker saying where its figures went,
    stores notices that came up meanwhile in the run, and returns those lines. Never raises:
    the command's exit code is what matters."""
    handle = result.log_to
    if handle is None:
        return []
    logger = handle.logger
    files: list[Path] = []
    if not (result.complete and result.summarize):
        document = None
    elif document is None:
        logger.notices.append("--log-to: the diagnosis is not logged (none was made at the end "
                              "of the watch)")  # fmt: skip
    else:
        try:
            from gpuprof.reports.terminal import render_json

            path = Path(result.run_dir) / "diagnosis.json"
            path.write_text(render_json(document) + "\n", encoding="utf-8")
            files = [p for p in (report_path, path) if p is not None]
        except Exception as exc:  # the live figures are logged already
            line = f"--log-to: the diagnosis is not logged ({type(exc).__name__}: {exc})"
            logger.notices.append(line)
            _notify(line, handle.quiet)
            document = None
    try:
        lines = logger.finish(document, files)
    except Exception as exc:
        lines = []
        logger.notices.append(f"--log-to: {type(exc).__name__}: {exc}")
    for line in lines:
        _notify(line, handle.quiet)
    late = [n for n in logger.notices if n not in handle.meta.notices]
    if late:
        handle.meta.notices = [*handle.meta.notices, *late]
        store.write_meta_now(handle.run_file, "run", handle.meta.to_dict())
    return lines


def _start_stacks(options: WatchOptions, writer, host: str, host_collector, sampler,
                  notices: list[str]):  # fmt: skip
    """The Python stack sampler, when asked for and py-spy is there; else one notice line
    (printed and kept in the run's notices) and None: the watch goes on without stacks."""
    if not options.stacks:
        notices.append("Python stacks turned off (--no-stacks)")
        return None
    from gpuprof.collectors import stacks as stack_collector

    pyspy, why = stack_collector.find_pyspy()
    if pyspy is None:
        message = f"Python stacks: {why}: the run goes on without stacks"
        notices.append(message)
        _notify(message, options.quiet)
        return None

    def gpu_idle() -> bool | None:
        latest = sampler.latest()
        return stack_collector.gpus_idle(latest[1]) if latest else None

    def said(line: str) -> None:
        notices.append(line)
        _notify(line, options.quiet)

    sampler_ = stack_collector.StackSampler(
        writer,
        host,
        host_collector.stack_targets,
        gpu_idle,
        pyspy=pyspy,
        rate_hz=options.stack_rate_hz or stack_collector.RATE_HZ,
        idle_rate_hz=options.stack_idle_rate_hz or stack_collector.IDLE_RATE_HZ,
        notify=said,
    )
    sampler_.start()
    return sampler_


def _open_nvml(host: str, options: WatchOptions, meta: RunMeta, notices: list[str]):
    if not options.nvml:
        notices.append("NVML sampling turned off (--no-nvml)")
        return None
    from gpuprof.collectors.nvml import NvmlCollector

    nvml = NvmlCollector(host)
    if not nvml.open():
        message = nvml.notice or "NVML not available: profiling host only"
        notices.append(message)
        _notify(message, options.quiet)
        return None
    meta.gpus = nvml.inventory()
    versions = nvml.versions()
    meta.driver_version = versions.get("driver_version")
    meta.nvml_version = versions.get("nvml_version")
    meta.cuda_driver_version = versions.get("cuda_driver_version")
    return nvml


DEMO_SCENARIOS: dict[str, list[tuple[str, float]]] = {
    "default": [("reward_bound", 0.7), ("reshard_idle", 0.6), ("memory_headroom", 0.6)],
    "healthy": [],
}
"""Named demo scenarios; every stall kind is also a scenario of its own (severity 0.8)."""


def demo_scenarios() -> list[str]:
    """The names ``gpuprof demo --scenario`` accepts."""
    from gpuprof.sim import STALL_KINDS  # the kinds the simulator can inject

    return [*DEMO_SCENARIOS, *STALL_KINDS]


def demo(
    output: Path | None = None,
    *,
    scenario: str = "default",
    gpus: int = 8,
    duration_s: float = 600.0,
    framework: str = "verl",
    seed: int = 0,
) -> tuple[Path, Run]:
    """Simulate a GRPO run with known pathologies, write it as a run directory, return the
    directory and the run loaded from it (`load_for_analysis`: merged within phases when it
    is long).

    Raises `ValueError` for an unknown scenario or an impossible size.
    """
    from gpuprof.sim import MAX_GPUS, STALL_KINDS, Pathology, SimConfig, simulate_to
    from gpuprof.sim.config import DEFAULT_PHASE_S

    if scenario in DEMO_SCENARIOS:
        pathologies = [Pathology(k, s) for k, s in DEMO_SCENARIOS[scenario]]
    elif scenario in STALL_KINDS:
        pathologies = [Pathology(scenario, 0.8)]
    else:
        raise ValueError(
            f"unknown scenario {scenario!r}; choose from {', '.join(demo_scenarios())}"
        )
    if not 1 <= gpus <= MAX_GPUS:
        raise ValueError(f"--gpus must be between 1 and {MAX_GPUS}, got {gpus}")
    if duration_s <= 0:
        raise ValueError(f"--duration must be positive, got {duration_s}")
    grpo_step_s = sum(v for k, v in DEFAULT_PHASE_S.items() if k not in ("values", "update_critic"))
    steps = max(3, round(duration_s / grpo_step_s))
    time_scale = duration_s / (steps * grpo_step_s)
    config = SimConfig(
        gpus=gpus,
        framework=framework,
        steps=steps,
        time_scale=time_scale,
        pathologies=pathologies,
        seed=seed,
    )
    run_dir = _unique_dir(Path(output or Path("gpuprof-runs") / f"demo-{scenario}")).absolute()
    # written host by host as it is made, then loaded as `analyze` loads a run: a day of a
    # large cluster never sits in memory whole
    simulate_to(config, run_dir, run_id=f"demo-{scenario}")
    return run_dir, load_for_analysis(run_dir)


def import_files(
    paths: list[str | os.PathLike],
    output: str | os.PathLike,
    *,
    fields: str | list[str] | None = None,
    phases: dict[str, str] | None = None,
) -> Path:
    """Import nvidia-smi / dmon / DCGM / profiler / framework-log files into one new run
    directory ``output`` and return it (see `gpuprof.importing`). ``fields`` names the
    columns of header-less nvidia-smi captures (``"timestamp,index,utilization.gpu"``).
    ``phases`` (``--phase``): phase name → Python regex searched in each logged message, in
    order, the first starting each step; when given, every text log among the files is read
    by `gpuprof.collectors.importers.plain_log` with these patterns, whatever format it would
    be detected as (GPU metrics, traces and tracker runs are read as usual).

    Raises `ImportFormatError` (one line naming the file, and the line where known) for bad
    input; nothing is written then. Draws a progress bar on a terminal.
    """
    from gpuprof.importing import import_files as run_import
    from gpuprof.reports.progress import progress

    total = 0
    for path in paths:
        with contextlib.suppress(OSError):
            total += Path(path).stat().st_size
    with progress("importing", total=total or None) as advance:
        return run_import(paths, output, advance=advance, fields=fields, phases=phases)


def analyze(
    run: Run,
    thresholds=None,
    *,
    gpu_hour_price: float | None = None,
    model_params: str | float | None = None,
    gpu: str | None = None,
    context=None,
    workers: int = 1,
    series=None,
    budget: int | None = None,
    spill_dir: str | None = None,
):
    """The diagnosis of a loaded run (`gpuprof.analyzers.diagnose.Diagnosis`).

    ``gpu_hour_price`` (the user's currency per GPU-hour) prices idle time and findings;
    ``model_params`` (``7e9``, ``"7B"``) sets the model size for MFU (else the model's
    config.json or name, see `efficiency_options`); ``gpu`` names the GPU model (``H100``)
    when the run does not, or names it wrongly. ``context``: an `AnalysisContext` of
    ``run`` to reuse. ``workers`` > 1: part of the detectors run in a forked child at the
    same time (`diagnose`'s ``workers``; the same diagnosis). ``series``: where the sampled
    series of a run read without them are (`loader.load_for_diagnosis`). Raises
    `ValueError` for a ``model_params`` that is no count, `RunError` for series that no
    longer read. ``budget``: bytes a run of several nodes may hold in memory, all processes
    together (the parts used longest ago written to disk meanwhile, into ``spill_dir``:
    `diagnose`'s; the same diagnosis, slower).
    """
    from gpuprof.analyzers.diagnose import diagnose
    from gpuprof.analyzers.findings import AnalysisContext
    from gpuprof.analyzers.settings import attach_options

    options = efficiency_options(
        run, gpu_hour_price=gpu_hour_price, model_params=model_params, gpu=gpu
    )
    ctx = context if context is not None and context.run is run else AnalysisContext(run)
    attach_options(ctx, options)
    return diagnose(run, thresholds, context=ctx, workers=workers, series=series, budget=budget,
                    spill_dir=spill_dir)  # fmt: skip


def efficiency(
    run: Run,
    *,
    gpu_hour_price: float | None = None,
    model_params: str | float | None = None,
    gpu: str | None = None,
) -> dict:
    """The efficiency figures of a run without the rest of the diagnosis (tokens/s and MFU
    per phase, framework-logged MFU, idle cost): the ``efficiency`` entry of
    docs/ANALYZE_JSON.md with no per-finding costs."""
    from gpuprof.analyzers.efficiency import efficiency_summary
    from gpuprof.analyzers.findings import AnalysisContext
    from gpuprof.analyzers.settings import attach_options

    options = efficiency_options(
        run, gpu_hour_price=gpu_hour_price, model_params=model_params, gpu=gpu
    )
    return efficiency_summary(attach_options(AnalysisContext(run), options), [])


MAX_CONFIG_BYTES = 4 * 2**20
"""A model's config.json larger than this is not read (real ones are a few KiB)."""


def efficiency_options(
    run: Run,
    *,
    gpu_hour_price: float | None = None,
    model_params: str | float | None = None,
    gpu: str | None = None,
):
    """`EfficiencyOptions` for ``run``: the price and parameter count as given, and the
    Hugging Face ``config.json`` at the run's model-path knob when that path exists on this
    machine (as written, relative to the run's working directory, or in the Hugging Face hub
    cache for an ``org/name`` id). Raises `ValueError` for a ``model_params`` that is no
    count or a negative price."""
    from gpuprof.analyzers.model_size import model_path, parse_param_count
    from gpuprof.analyzers.settings import EfficiencyOptions, run_settings

    params = parse_param_count(model_params) if model_params not in (None, "") else None
    if gpu_hour_price is not None and not gpu_hour_price >= 0:
        raise ValueError(f"--gpu-hour-price must be 0 or more, got {gpu_hour_price}")
    config = where = None
    if params is None:
        _, path = model_path(run_settings(run.meta))
        if path:
            config, where = _read_model_config(path, run.meta.cwd)
    return EfficiencyOptions(
        gpu_hour_price=gpu_hour_price,
        model_params=params,
        gpu_name=gpu.strip() if gpu and gpu.strip() else None,
        model_config=config,
        model_config_path=where,
    )


def _read_model_config(path: str, cwd: str | None) -> tuple[dict | None, str | None]:
    """The parsed config.json for a model path, and where it was read; (None, None) when
    there is none here or it can't be read."""
    import glob
    import json

    candidates = []
    base = Path(os.path.expanduser(path))
    candidates.append(base)
    if not base.is_absolute() and cwd:
        candidates.append(Path(cwd) / base)
    parts = path.strip("/").split("/")
    if len(parts) == 2 and not path.startswith((".", "/", "~")):
        hub = os.environ.get("HF_HUB_CACHE") or os.path.join(
            os.environ.get("HF_HOME") or os.path.expanduser("~/.cache/huggingface"), "hub"
        )
        pattern = os.path.join(hub, f"models--{parts[0]}--{parts[1]}", "snapshots", "*")
        snapshots = sorted(glob.glob(pattern), key=os.path.getmtime, reverse=True)
        candidates.extend(Path(s) for s in snapshots)
    for candidate in candidates:
        file = candidate if candidate.name == "config.json" else candidate / "config.json"
        try:
            if not file.is_file() or file.stat().st_size > MAX_CONFIG_BYTES:
                continue
            data = json.loads(file.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            continue
        if isinstance(data, dict):
            return data, str(file)
    return None, None


def report(
    run_dir: Path,
    output: Path | None = None,
    *,
    run: Run | None = None,
    diagnosis=None,
    gpu_hour_price: float | None = None,
    model_params: str | float | None = None,
    gpu: str | None = None,
    workers: int = 1,
    context=None,
) -> Path:
    """Write the self-contained HTML report of a run; return its path.

    ``output`` defaults to ``RUN_DIR/report.html``. ``run`` / ``diagnosis`` skip loading and
    diagnosing again when the caller has them (``context``: the `AnalysisContext` of ``run``
    the diagnosis was made with, whose alignment the per-step table reuses);
    ``gpu_hour_price``, ``model_params``, ``gpu`` and ``workers`` are `analyze`'s. The file
    is written to a temporary name and renamed, so a failure leaves no partial report. Raises
    `RunError` when the run can't be read or the report can't be written.
    """
    from gpuprof.reports.html import write_html

    run_dir = Path(run_dir)
    if run is None:
        run = load_for_analysis(run_dir)
    path = Path(output) if output is not None else run_dir / "report.html"
    extra = {}
    if diagnosis is None:
        from gpuprof.analyzers.findings import AnalysisContext

        ctx = AnalysisContext(run)  # one alignment for the diagnosis and the per-step table
        diagnosis = analyze(
            run,
            gpu_hour_price=gpu_hour_price,
            model_params=model_params,
            gpu=gpu,
            context=ctx,
            workers=workers,
        )
        if len(run.spans) and len(run.gpu):
            extra["phase_steps"] = ctx.by_phase_step
    elif context is not None and context.run is run and len(run.spans) and len(run.gpu):
        extra["phase_steps"] = context.by_phase_step
    try:
        return write_html(run, path, diagnosis, **extra)
    except OSError as exc:
        raise RunError(f"{path}: cannot write the report ({exc.strerror or exc})") from None
