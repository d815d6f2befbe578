"""``gpuprof watch --log-to wandb|tensorboard|mlflow``: gpuprof's figures in the experiment
tracker the training already logs to, next to its loss curve.

**What is logged** (names under ``gpuprof/``, units in the names):

every `DEFAULT_INTERVAL_S` seconds while the command runs, and once when it ends:

- ``gpuprof/gpu_util_pct``: NVML ``utilization.gpu`` ("a kernel was running", 0–100 %) over
  the time since the previous point, time-weighted over every GPU read;
  ``gpuprof/gpu_util_pct_by_gpu/gpu<i>`` per GPU (``…/<node>_gpu<i>`` on a run of several
  nodes);
- ``gpuprof/idle_gpu_s``: GPU-seconds with utilization below the idle threshold so far, and
  ``gpuprof/idle_gpu_s_by_phase/<phase>`` by the innermost phase covering them (``no_phase``
  outside every span; time moves from ``no_phase`` to a phase when the span covering it ends: a
  running estimate, as for ``watch --live``); ``gpuprof/sampled_gpu_s``: GPU-seconds read so
  far;
- ``gpuprof/step_time_s``: mean seconds per step over the last 20 steps of the lowest rank
  that marks steps, and ``gpuprof/steps``: the steps it has marked;
- ``gpuprof/top_finding/idle_gpu_s`` and ``gpuprof/top_finding/share_pct``: the phase in
  which the most GPU-time has gone idle so far (at least `Thresholds.min_share` of the
  GPU-time read), with the stall kind the analyzer charges it to as text
  (``gpuprof/top_finding``: ``reward_bound (reward)``);

once after the run, from the diagnosis (``gpuprof analyze``): ``gpuprof/diagnosis/…``, the
run's ``gpu_util_pct``, ``idle_gpu_s``, ``idle_gpu_s_by_phase/<phase>``,
``idle_gpu_s_by_cause/<kind>``, ``steps``, ``step_time_p50_s``, the
largest finding's ``top_finding/gpu_s_lost`` and ``top_finding/share_pct``, and as text the
top finding (kind and its line) and what bounds the step; then ``report.html`` and the
diagnosis JSON (``diagnosis.json`` in the run directory, what ``gpuprof analyze --json``
prints) are attached.

No name is the first part of another (MLflow's file store keeps a metric as a file named
after it). The x axis is the training step: each point is logged at ``gpuprof/steps`` (0
before the first step; a command that marks no steps logs everything at step 0), with its wall
time, so the figures line up with the loss curve by step or by time.

**Where** (`target`):

- W&B: with ``WANDB_RUN_ID`` in the environment and W&B online, into that run, as a second
  writer in W&B's shared mode (``mode="shared"``, ``x_primary=False``, ``x_label="gpuprof"``,
  ``x_update_finish_state=False``; the axis is ``gpuprof/steps`` through ``define_metric``, as
  shared mode ignores ``step``). Shared mode has no offline form: offline, or without a run id,
  a run of its own (``job_type="gpuprof"``) in the training's project, grouped with it:
  ``WANDB_RUN_GROUP``, else the training's run id (``WANDB_RUN_ID``), else gpuprof's run id;
  the training's run id, when the training's ``wandb/`` directory shows it, is put in the
  config (``training_run_id``). Project, entity and name come from ``WANDB_PROJECT`` /
  ``WANDB_ENTITY`` / ``WANDB_NAME`` or the command (verl ``trainer.project_name`` /
  ``trainer.experiment_name``, OpenRLHF ``--wandb_project`` …, HF ``--run_name``);
- MLflow: with ``MLFLOW_RUN_ID``, into that run (its status is left alone); else a run of its
  own in ``MLFLOW_EXPERIMENT_ID`` / ``MLFLOW_EXPERIMENT_NAME`` / verl's
  ``trainer.project_name``, nested under the training's run (``mlflow.parentRunId``) once a
  run of that experiment started since the watch began is found. A named experiment that
  does not exist yet is left to the training to create (a training's own get-or-create fails
  when another process creates it in between) for six live points, a minute at the default
  interval, the points kept meanwhile; then gpuprof creates it. The tracking URI is
  ``MLFLOW_TRACKING_URI`` (verl's own default ``sqlite:////tmp/mlruns.db`` for a verl command
  logging to MLflow);
- TensorBoard: a ``gpuprof`` subdirectory of the training's log directory (a run of its own
  beside the training's, its tags in a ``gpuprof`` section), the directory taken from
  ``TENSORBOARD_DIR`` (verl), ``TENSORBOARD_LOGGING_DIR`` (transformers), ``--logging_dir``
  (TRL, ms-swift), ``--logger.tensorboard_dir`` / ``--use_tensorboard`` (OpenRLHF, with its run
  name), verl's ``tensorboard_log/<project>/<experiment>``, or ``--output_dir``'s ``runs``;
  else ``RUN_DIR/tensorboard``. The end-of-run text summary goes there too, and report and
  diagnosis are copied next to the events.

**Never in the training's way.** The tracker's library is imported and called only in a child
process of the watcher (`gpuprof.reports.tracker_sink`, one per tracker, in a session of its
own, at the lowest CPU priority). The watcher's thread computes the figures from what the Prometheus
endpoint serves (`gpuprof.reports.live_run`) and hands them over through a bounded queue: when
the tracker is slow, points are dropped (and counted), never waited for. A tracker that is
missing, misconfigured, unreachable or raises gives one line, ``gpuprof: --log-to wandb: <why>;
going on without it``, also kept in the run's notices, and nothing more of it. At the end the
watcher waits at most ``timeout_s`` (`DEFAULT_TIMEOUT_S`) for the last upload, then stops the
process and says so. The command's exit code and signals are not touched.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import queue
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gpuprof.analyzers.findings import Thresholds
from gpuprof.commandline import parse_knobs
from gpuprof.reports.live import LiveState, Readings
from gpuprof.reports.live_run import LiveRun, RunFollower, stall_kind

TRACKERS = ("wandb", "tensorboard", "mlflow")
"""What ``--log-to`` takes."""
ENV_LOG_TO = "GPUPROF_LOG_TO"
"""``--log-to`` from the environment: ``wandb,mlflow`` (commas or spaces)."""
DEFAULT_INTERVAL_S = 10.0
"""Seconds between two points of the live figures."""
DEFAULT_TIMEOUT_S = 10.0
"""Longest wait, after the run, for the trackers' last upload (report and diagnosis)."""
QUEUE_SIZE = 16
"""Points waiting for a slow tracker; more are dropped."""
SINK_MODULE = "gpuprof.reports.tracker_sink"
NO_PHASE_NAME = "no_phase"
"""``gpuprof/idle_gpu_s_by_phase/<phase>`` for idle time outside every span."""
TEXT_LIMIT = 4000
"""Characters of one text value (MLflow tags hold 8000 at most, older servers 5000)."""

_UNSAFE = re.compile(r"[^A-Za-z0-9_.\- ]+")


def parse_log_to(values: Iterable[str] | None) -> list[str]:
    """``["wandb,mlflow", "tensorboard"]`` → ``["wandb", "mlflow", "tensorboard"]`` (each
    once, in order; case and spaces ignored). Raises `ValueError` naming an unknown tracker."""
    out: list[str] = []
    for value in values or ():
        for name in re.split(r"[,\s]+", str(value).strip().lower()):
            if not name:
                continue
            name = {"tb": "tensorboard", "w&b": "wandb"}.get(name, name)
            if name not in TRACKERS:
                raise ValueError(f"unknown tracker {name!r}; choose from {', '.join(TRACKERS)}")
            if name not in out:
                out.append(name)
    return out


def metric_name(*parts: str) -> str:
    """``gpuprof/<part>/<part>…``, each part with what any of the trackers refuses in a name
    (MLflow takes letters, digits, ``_ - . /`` and spaces; ``/`` separates the parts) replaced
    by ``_``."""
    clean = [_UNSAFE.sub("_", str(p)).strip(" ").replace("..", "_") or "_" for p in parts]
    return "/".join(["gpuprof", *clean])


@dataclass
class Figures:
    """One point for the trackers: ``metrics`` (name → number, units in the name) and
    ``texts`` (name → text) at training step ``step`` and wall time ``t_s`` (Unix s)."""

    step: int
    t_s: float
    metrics: dict[str, float] = field(default_factory=dict)
    texts: dict[str, str] = field(default_factory=dict)

    def message(self, op: str) -> dict[str, Any]:
        metrics = {k: float(v) for k, v in self.metrics.items() if _finite(v)}
        texts = {k: str(v)[:TEXT_LIMIT] for k, v in self.texts.items()}
        return {"op": op, "step": self.step, "t": self.t_s, "metrics": metrics, "texts": texts}


def _finite(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


Window = dict[tuple[str, int], tuple[float, float]]
"""(node, GPU) → (seconds read, busy seconds) at the previous point."""


def live_figures(live: LiveRun, before: Window | None = None) -> tuple[Figures, Window]:
    """The live figures of ``live`` (see the module doc) and the window for the next call:
    utilization is over the time since ``before`` (since the start without it)."""
    with live.lock:
        states: list[tuple[str, LiveState]] = live.states()
        window: Window = {}
        for node, state in states:
            for gpu, read in state.read_gpu_s.items():
                window[(node, gpu)] = (read, state.busy_gpu_s.get(gpu, 0.0))
        idle: dict[str, float] = {}
        sampled = 0.0
        for _, state in states:
            sampled += state.gpu_s
            for phase, seconds in state.idle_by_phase().items():
                name = NO_PHASE_NAME if phase is None else str(phase)
                idle[name] = idle.get(name, 0.0) + seconds
        ranks = [r for _, state in states for r in state.ranks.values() if r.steps]
        lead = min(ranks, key=lambda r: (r.rank is None, r.rank or 0, r.pid), default=None)
        step_s = live.state.step_time_s(lead) if lead is not None else None
        steps = lead.step_count if lead is not None else 0
    metrics: dict[str, float] = {}
    several = len({node for node, _ in window}) > 1
    read_sum = busy_sum = 0.0
    for (node, gpu), (read, busy) in sorted(window.items(), key=lambda kv: live.gpu_order(kv[0])):
        read0, busy0 = (before or {}).get((node, gpu), (0.0, 0.0))
        if read - read0 <= 0:
            continue
        read_sum += read - read0
        busy_sum += busy - busy0
        where = f"{node}_gpu{gpu}" if several else f"gpu{gpu}"
        metrics[metric_name("gpu_util_pct_by_gpu", where)] = 100.0 * (busy - busy0) / (read - read0)
    if read_sum > 0:
        metrics[metric_name("gpu_util_pct")] = 100.0 * busy_sum / read_sum
    if sampled > 0:
        metrics[metric_name("sampled_gpu_s")] = sampled
        metrics[metric_name("idle_gpu_s")] = sum(idle.values())
        for phase, seconds in sorted(idle.items()):
            metrics[metric_name("idle_gpu_s_by_phase", phase)] = seconds
    if step_s is not None:
        metrics[metric_name("step_time_s")] = step_s
    metrics[metric_name("steps")] = float(steps)
    texts: dict[str, str] = {}
    named = {k: v for k, v in idle.items() if k != NO_PHASE_NAME}
    if named and sampled > 0:
        phase, lost = max(named.items(), key=lambda kv: kv[1])
        share = lost / sampled
        if share >= Thresholds().min_share:
            metrics[metric_name("top_finding", "idle_gpu_s")] = lost
            metrics[metric_name("top_finding", "share_pct")] = 100.0 * share
            texts[metric_name("top_finding")] = (
                f"{stall_kind(phase)} ({phase}): {lost:.1f} GPU-s idle, "
                f"{100 * share:.0f}% of the GPU-time so far"
            )
    return Figures(steps, time.time(), metrics, texts), window


def diagnosis_figures(document: Mapping[str, Any], step: int) -> Figures:
    """The end-of-run figures from a diagnosis (``Diagnosis.to_dict()``, the document of
    ``gpuprof analyze --json``) at training step ``step``."""
    summary = document.get("summary") or {}
    metrics: dict[str, float] = {}
    texts: dict[str, str] = {}

    def put(value: Any, *name: str) -> None:
        if _finite(value):
            metrics[metric_name("diagnosis", *name)] = float(value)

    put(summary.get("mean_util_gpu_pct"), "gpu_util_pct")
    put(summary.get("mean_sm_active_pct"), "sm_active_pct")
    put(summary.get("idle_gpu_s"), "idle_gpu_s")
    put(summary.get("gpu_hours"), "gpu_hours")
    put(summary.get("steps"), "steps")
    put(summary.get("step_time_p50_s"), "step_time_p50_s")
    put(summary.get("tokens_per_s"), "tokens_per_s")
    for row in summary.get("phases") or []:
        if isinstance(row, Mapping) and row.get("phase"):
            put(row.get("idle_gpu_s"), "idle_gpu_s_by_phase", str(row["phase"]))
    for cause, seconds in (summary.get("idle_gpu_s_by_cause") or {}).items():
        put(seconds, "idle_gpu_s_by_cause", str(cause))
    findings = [f for f in document.get("findings") or [] if isinstance(f, Mapping)]
    if findings:
        top = findings[0]
        put(top.get("gpu_seconds_lost"), "top_finding", "gpu_s_lost")
        share = top.get("share")
        put(100.0 * share if _finite(share) else None, "top_finding", "share_pct")
        line = str(top.get("summary") or "").strip()
        texts[metric_name("diagnosis", "top_finding")] = (
            f"{top.get('kind')}: {line}" if line else str(top.get("kind"))
        )
    else:
        texts[metric_name("diagnosis", "top_finding")] = "none above the noise threshold"
    bound = summary.get("bound") or {}
    verdict = bound.get("verdict") or bound.get("nothing_to_judge")
    if verdict:
        texts[metric_name("diagnosis", "bound")] = str(verdict)
    return Figures(step, time.time(), metrics, texts)


# ----- where the figures go


def _first(*values: str | None) -> str | None:
    return next((v for v in values if v not in (None, "")), None)


def _verl_logs_to(knobs: Mapping[str, str], tracker: str) -> bool:
    """Whether a verl command logs to ``tracker`` (``trainer.logger=['console','mlflow']``)."""
    return tracker in knobs.get("trainer.logger", "")


def target(kind: str, argv: Sequence[str], env: Mapping[str, str], cwd: str,
           run_dir: Path) -> dict[str, Any]:  # fmt: skip
    """Where ``kind``'s figures go for a command ``argv`` run with ``env`` in ``cwd``, as far
    as the environment and the command tell (see the module doc); the tracker's process
    settles the rest. A plain dictionary: it is handed to that process as JSON."""
    knobs = parse_knobs(list(argv))
    if kind == "wandb":
        mode = (env.get("WANDB_MODE") or "").strip().lower() or None
        run_id = _first(env.get("WANDB_RUN_ID"))
        return {
            "mode": mode,
            "run_id": run_id,
            "shared": bool(run_id) and mode in (None, "online", "run", "shared"),
            "project": _first(env.get("WANDB_PROJECT"), knobs.get("trainer.project_name"),
                              knobs.get("wandb_project"), knobs.get("logger.wandb.project")),
            "entity": _first(env.get("WANDB_ENTITY"), knobs.get("wandb_org"),
                             knobs.get("logger.wandb.org")),
            "group": _first(env.get("WANDB_RUN_GROUP"), knobs.get("wandb_group"),
                            knobs.get("logger.wandb.group")),
            "name": _first(env.get("WANDB_NAME"), knobs.get("trainer.experiment_name"),
                           knobs.get("wandb_run_name"), knobs.get("logger.wandb.run_name"),
                           knobs.get("run_name")),
            "dir": str(Path(cwd, env.get("WANDB_DIR") or ".").resolve()),
        }  # fmt: skip
    if kind == "mlflow":
        uri = env.get("MLFLOW_TRACKING_URI")
        if not uri and _verl_logs_to(knobs, "mlflow"):
            uri = "sqlite:////tmp/mlruns.db"  # verl's own default
        return {
            "tracking_uri": uri or None,
            "run_id": _first(env.get("MLFLOW_RUN_ID")),
            "experiment_id": _first(env.get("MLFLOW_EXPERIMENT_ID")),
            "experiment_name": _first(env.get("MLFLOW_EXPERIMENT_NAME"),
                                      knobs.get("trainer.project_name")),
            "run_name": _first(env.get("MLFLOW_RUN_NAME"), knobs.get("trainer.experiment_name"),
                               knobs.get("run_name")),
        }  # fmt: skip
    if kind == "tensorboard":
        log_dir, source = _tensorboard_dir(knobs, env)
        if log_dir is None:
            path, source = Path(run_dir) / "tensorboard", "the run directory"
        else:
            path = Path(cwd, os.path.expanduser(log_dir)) / "gpuprof"
        return {"dir": str(path.resolve()), "source": source}
    raise ValueError(f"unknown tracker {kind!r}")


def _tensorboard_dir(knobs: Mapping[str, str], env: Mapping[str, str]) -> tuple[str | None, str]:
    """The training's TensorBoard log directory and where it was read, as the frameworks
    choose it; (None, "") when nothing names one."""
    for var in ("TENSORBOARD_DIR", "TENSORBOARD_LOGGING_DIR"):
        if env.get(var):
            return env[var], var
    if knobs.get("logging_dir"):
        return knobs["logging_dir"], "--logging_dir"
    run_name = _first(knobs.get("logger.wandb.run_name"), knobs.get("wandb_run_name"))
    for knob in ("logger.tensorboard_dir", "use_tensorboard"):
        base = knobs.get(knob)
        if base and base.lower() not in ("true", "false"):
            return (os.path.join(base, run_name) if run_name else base), f"--{knob}"
    if _verl_logs_to(knobs, "tensorboard"):
        project = knobs.get("trainer.project_name")
        experiment = knobs.get("trainer.experiment_name")
        if project and experiment:
            return os.path.join("tensorboard_log", project, experiment), "verl's trainer names"
    if knobs.get("output_dir"):
        return os.path.join(knobs["output_dir"], "runs"), "--output_dir"
    return None, ""


# ----- the watcher's side


class Sink:
    """One tracker's process: figures go to it through a bounded queue and a writer thread,
    its replies (one JSON object a line) come back through a reader thread."""

    def __init__(self, kind: str, spec: dict[str, Any], on_notice: Callable[[str], None]) -> None:
        self.kind = kind
        self.spec = spec
        self.on_notice = on_notice
        self.queue: queue.Queue[dict[str, Any] | None] = queue.Queue(QUEUE_SIZE)
        self.proc: subprocess.Popen | None = None
        self.sent = 0
        self.dropped = 0
        self.failed = False
        self.where: str | None = None
        """Where the figures went, once the tracker's process said so."""
        self.done = threading.Event()
        """Set when the process has said it is done (or failed, or ended)."""
        self._threads: list[threading.Thread] = []

    def notice(self, why: str) -> None:
        """The one line this tracker may give."""
        if not self.failed:
            self.failed = True
            self.on_notice(f"--log-to {self.kind}: {why}; going on without it")

    def start(self) -> None:
        import gpuprof

        env = dict(os.environ)
        package_root = str(Path(gpuprof.__file__).resolve().parent.parent)
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [package_root, env.get("PYTHONPATH")]))
        try:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", SINK_MODULE, self.kind],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=subprocess.DEVNULL,
                env=env,
                start_new_session=True,  # no terminal signal reaches it
                text=True,
                bufsize=1,
            )
        except OSError as exc:
            self.notice(f"cannot start its process ({exc.strerror or exc})")
            self.done.set()
            return
        self.queue.put_nowait({"op": "open", "spec": self.spec})
        for target_, name in ((self._write, "writer"), (self._read, "reader")):
            thread = threading.Thread(target=target_, name=f"gpuprof-{self.kind}-{name}",
                                      daemon=True)  # fmt: skip
            thread.start()
            self._threads.append(thread)

    def send(self, message: dict[str, Any]) -> None:
        """Queue ``message``, or drop it when the tracker is behind; never waits."""
        if self.failed or self.proc is None:
            return
        try:
            self.queue.put_nowait(message)
            self.sent += 1
        except queue.Full:
            self.dropped += 1

    def close(self, messages: Sequence[dict[str, Any]], deadline: float) -> None:
        """Queue the last ``messages`` (waiting for room until ``deadline``), then end the
        process's input: it uploads them and exits."""
        if self.proc is None or not self._threads or not self._threads[0].is_alive():
            return  # the writer is gone (the process ended): it closed the input itself
        for message in [*messages, None]:
            if self.failed and message is not None:
                continue
            with contextlib.suppress(queue.Full):
                self.queue.put(message, timeout=max(0.0, deadline - time.monotonic()))

    def wait(self, deadline: float, timeout_s: float) -> None:
        """Wait until ``deadline`` for the process to end; past it, stop it and say so."""
        if self.proc is None:
            return
        try:
            self.proc.wait(timeout=max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            self.notice(f"the end-of-run upload did not finish within {timeout_s:g} s")
            self.kill()
            return
        self.done.wait(timeout=6.0)  # the reader's last line, or its notice of a crash

    def kill(self) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        with contextlib.suppress(OSError):
            os.killpg(self.proc.pid, signal.SIGKILL)
        with contextlib.suppress(Exception):
            self.proc.wait(timeout=5.0)

    def _write(self) -> None:
        stdin = self.proc.stdin
        try:
            while True:
                message = self.queue.get()
                if message is None:
                    break
                stdin.write(json.dumps(message, allow_nan=False) + "\n")
                stdin.flush()
        except (OSError, ValueError):  # the process is gone: the reader says why
            pass
        finally:
            with contextlib.suppress(OSError, ValueError):
                stdin.close()

    def _read(self) -> None:
        try:
            for line in self.proc.stdout:
                try:
                    reply = json.loads(line)
                except ValueError:
                    continue
                if not isinstance(reply, dict):
                    continue
                if "error" in reply:
                    self.notice(str(reply["error"]))
                elif "done" in reply:
                    self.where = str(reply["done"])
        except (OSError, ValueError):
            pass
        finally:
            if self.where is None and not self.failed:  # it ended without a word: a crash
                self.notice(f"its process ended unexpectedly ({self._exit_status()})")
            self.done.set()

    def _exit_status(self) -> str:
        try:
            code = self.proc.wait(timeout=5.0)
        except subprocess.TimeoutExpired:
            return "its output closed"
        return f"killed by signal {-code}" if code < 0 else f"exit status {code}"


class TrackerLogger:
    """Logs the live figures of a watched run to the trackers ``kinds`` (see the module doc).

    ``readings`` is ``Sampler.latest``; ``db_path``, ``node``, ``gpus``, ``run_dir``, ``run_id``
    and ``other_nodes`` are as for the Prometheus endpoint; ``argv`` and ``env`` the command
    and the environment it runs with; ``interval_s`` the seconds between points, ``timeout_s``
    the longest wait for the end-of-run upload. ``on_notice`` receives each tracker's one line
    when it fails. `start`, `stop_live` when the command ends, `finish` after the diagnosis.
    """

    def __init__(
        self,
        kinds: Sequence[str],
        readings: Callable[[], Readings | None],
        db_path: Path | str,
        *,
        node: str,
        argv: Sequence[str],
        run_dir: Path,
        run_id: str,
        env: Mapping[str, str] | None = None,
        gpus: Sequence[dict[str, Any]] = (),
        other_nodes: bool = True,
        interval_s: float = DEFAULT_INTERVAL_S,
        timeout_s: float = DEFAULT_TIMEOUT_S,
        on_notice: Callable[[str], None] | None = None,
    ) -> None:
        self.kinds = list(kinds)
        self.run_dir = Path(run_dir)
        self.interval_s = interval_s
        self.timeout_s = timeout_s
        self.notices: list[str] = []
        self._on_notice = on_notice
        self._lock = threading.Lock()
        env = dict(os.environ if env is None else env)
        common = {"gpuprof_run_dir": str(self.run_dir), "gpuprof_run_id": run_id,
                  "start_s": time.time()}  # fmt: skip
        self.sinks = [Sink(kind, {**common, **target(kind, argv, env, os.getcwd(), self.run_dir)},
                           self._notice) for kind in self.kinds]  # fmt: skip
        self.live = LiveRun(LiveState(), node, readings=readings, gpus=gpus)
        self.follower = RunFollower(self.live, db_path, run_dir=run_dir, run_id=run_id,
                                    other_nodes=other_nodes, what="--log-to",
                                    name="gpuprof-log-to", on_tick=self._tick)  # fmt: skip
        self._window: Window | None = None
        self._next_point = time.monotonic() + interval_s
        self.last_step = 0

    def _notice(self, line: str) -> None:
        with self._lock:
            self.notices.append(line)
        if self._on_notice is not None:
            self._on_notice(line)

    def start(self) -> None:
        for sink in self.sinks:
            sink.start()
        self.follower.start()

    def _tick(self) -> None:
        if time.monotonic() < self._next_point:
            return
        self._next_point = time.monotonic() + self.interval_s
        self._point()

    def _point(self) -> None:
        figures, self._window = live_figures(self.live, self._window)
        self.last_step = figures.step
        message = figures.message("log")
        for sink in self.sinks:
            sink.send(message)

    def stop_live(self) -> None:
        """The command ended: stop following the run and send its last live point."""
        self.follower.stop()
        try:
            self._point()
        except Exception as exc:  # the trackers go without it
            self.live.error(f"--log-to: {exc!r}")

    def finish(self, diagnosis: Mapping[str, Any] | None, files: Sequence[Path]) -> list[str]:
        """Send the diagnosis's figures and attach ``files``, wait at most ``timeout_s`` for
        the trackers to take them, and return one line per tracker saying where its figures
        went (the failures were said as notices)."""
        messages: list[dict[str, Any]] = []
        if diagnosis is not None:
            messages.append(diagnosis_figures(diagnosis, self.last_step).message("final"))
        present = [str(f) for f in files if Path(f).is_file()]
        if present:
            messages.append({"op": "attach", "files": present})
        deadline = time.monotonic() + self.timeout_s
        try:
            for sink in self.sinks:
                sink.close(messages, deadline)
            for sink in self.sinks:
                sink.wait(deadline, self.timeout_s)
        except KeyboardInterrupt:  # Ctrl-C: the user stopped the wait, not the watch
            for sink in self.sinks:
                if sink.proc is not None and sink.proc.poll() is None:
                    sink.notice("the end-of-run upload was interrupted (Ctrl-C)")
                    sink.kill()
        lines = []
        for sink in self.sinks:
            if sink.dropped and not sink.failed:
                self._notice(f"--log-to {sink.kind}: the tracker fell behind: {sink.dropped} "
                             f"of {sink.sent + sink.dropped} points were dropped")  # fmt: skip
            if sink.where and not sink.failed:
                lines.append(f"--log-to {sink.kind}: {sink.where}")
        return lines
