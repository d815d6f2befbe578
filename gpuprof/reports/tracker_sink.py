"""The process that writes gpuprof's figures into one experiment tracker for
``gpuprof watch --log-to`` (`gpuprof.reports.trackers` starts it): ``python -m
gpuprof.reports.tracker_sink wandb|tensorboard|mlflow``.

It reads one JSON object a line on stdin: ``{"op": "open", "spec": …}`` first (where to log,
`gpuprof.reports.trackers.target`), then ``log`` (live figures), ``final`` (the diagnosis's)
and ``attach`` (files) messages; at the end of its input it finishes the tracker's run and
replies ``{"done": "<where the figures went>"}``. On the first failure it replies
``{"error": "<why, one line>"}`` and exits. Those replies go to the stdout it was given; the
tracker libraries' own output (fd 1 and 2) goes to /dev/null, so nothing they print reaches the
training's terminal. It runs at the lowest priority there is (``SCHED_IDLE``, else ``nice
19``): it takes CPU time the training leaves, and so does the tracker's own service process
(W&B's ``wandb-core``), which inherits it.

Each ``log``/``final`` message: ``step`` (the training step, the x axis), ``t`` (Unix seconds),
``metrics`` (name → number, the names' units: ``_pct`` 0–100 %, ``_s`` seconds, ``_gpu_s``
GPU-seconds) and ``texts`` (name → text).
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import sys
import time
from pathlib import Path
from typing import Any, TextIO

INSTALL_HINT = "pip install 'gpuprof[trackers]'"
DISCOVER_TRIES = 30
"""Times (one per point) the training's own run is looked for to link to it."""
EXPERIMENT_WAIT_S = 60.0
"""Seconds of the watch (on its clock, from its start) during which a named MLflow experiment
that does not exist yet is left for the training to create, its live points kept; then gpuprof
creates it. In seconds, not points: a training that loads a model before it makes its
experiment takes as long whatever ``--log-interval`` is."""


class SinkError(Exception):
    """A failure worded for the user's one line."""


def _why(exc: BaseException) -> str:
    """One line for an exception from a tracker library (its first line, shortened)."""
    if isinstance(exc, SinkError):
        return str(exc)
    errors = getattr(exc, "errors", None)  # pydantic's ValidationError (W&B's settings)
    if callable(errors):
        with contextlib.suppress(Exception):
            first = errors()[0]
            where = ".".join(str(part) for part in first.get("loc") or ())
            return f"invalid setting {where}: {first['msg']}" if where else str(first["msg"])
    text = " ".join(str(exc).split("\n", 1)[0].split()) or type(exc).__name__
    # a request that failed below HTTP (requests' "Max retries exceeded … [Errno 111]
    # Connection refused"): the address and the system's reason
    cause = re.search(r"\[Errno -?\d+\] ([^'\")\]]+)", text)
    url = re.search(r"(https?://[^/\s]+)", text)
    if cause and url:
        return f"cannot reach {url.group(1)} ({cause.group(1).strip().lower()})"
    if "Read timed out" in text and url:
        return f"{url.group(1)} did not answer in time"
    return text if len(text) <= 240 else text[:237] + "…"


def _require(module: str, name: str) -> Any:
    import importlib

    try:
        return importlib.import_module(module)
    except ImportError:
        raise SinkError(f"the {name} package is not installed ({INSTALL_HINT})") from None


class Writer:
    """One tracker: `open`, then `log` / `final` / `attach`, then `close` → where it went."""

    def __init__(self, spec: dict[str, Any]) -> None:
        self.spec = spec

    def open(self) -> None:
        raise NotImplementedError

    def log(self, message: dict[str, Any]) -> None:
        raise NotImplementedError

    def final(self, message: dict[str, Any]) -> None:
        self.log(message)

    def attach(self, files: list[str]) -> None:
        raise NotImplementedError

    def close(self) -> str:
        raise NotImplementedError

    def abort(self) -> None:
        """Leave after a failure, as cleanly as the library allows."""


# ----- W&B


_WANDB_RUN_DIR = re.compile(r"^(?:offline-)?run-\d{8}_\d{6}-([A-Za-z0-9]+)$")
_WANDB_ENV_OF_TRAINING = ("WANDB_RUN_ID", "WANDB_RESUME", "WANDB_RUN_GROUP", "WANDB_JOB_TYPE",
                          "WANDB_NAME", "WANDB_NOTES", "WANDB_TAGS", "WANDB_SWEEP_ID",
                          "WANDB_SWEEP_PARAM_PATH", "WANDB_RUN_STEP")  # fmt: skip
"""What the training's own ``wandb.init`` reads from the environment and gpuprof's own run
must not take over (it would resume the training's run, or join its sweep)."""


def training_wandb_run(wandb_dir: str | os.PathLike, since_s: float, *, not_id: str | None = None
                       ) -> str | None:  # fmt: skip
    """The id of the newest W&B run in ``wandb_dir/wandb`` started at or after ``since_s``
    (Unix s; from its directory's time) other than ``not_id``; None when there is none."""
    base = Path(wandb_dir) / "wandb"
    found = []
    with contextlib.suppress(OSError):
        for entry in base.iterdir():
            match = _WANDB_RUN_DIR.match(entry.name)
            if not match or match.group(1) == not_id or entry.is_symlink():
                continue
            with contextlib.suppress(OSError):
                started = entry.stat().st_mtime
                if started >= since_s - 1.0:
                    found.append((entry.name.split("-")[-2], match.group(1)))
    return max(found)[1] if found else None


def wandb_settings(shared: bool) -> dict[str, Any]:
    """The ``wandb.Settings`` of gpuprof's W&B writer: no console capture, no system monitor,
    no code, git or machine metadata (the training's run has them); with ``shared``, a second
    writer of the training's run in W&B's shared mode that neither saves the run's own files
    nor decides its final state."""
    settings: dict[str, Any] = {"console": "off", "silent": True, "x_disable_stats": True,
                                "x_disable_meta": True, "x_disable_machine_info": True,
                                "save_code": False, "disable_git": True}  # fmt: skip
    if shared:
        settings.update(mode="shared", x_primary=False, x_label="gpuprof",
                        x_update_finish_state=False)  # fmt: skip
    return settings


class WandbWriter(Writer):
    """A W&B run: the training's own in shared mode, or one grouped with it (the module doc
    of `gpuprof.reports.trackers`)."""

    def open(self) -> None:
        spec = self.spec
        if spec.get("mode") == "disabled":
            raise SinkError("W&B is disabled here (WANDB_MODE=disabled)")
        wandb = _require("wandb", "wandb")
        self.wandb = wandb
        self.training_id = spec.get("run_id")
        self.tries = 0
        settings = wandb.Settings(**wandb_settings(bool(spec.get("shared"))))
        if spec.get("shared"):
            self.run = wandb.init(id=spec["run_id"], project=spec.get("project"),
                                  entity=spec.get("entity"), settings=settings)  # fmt: skip
        else:
            for name in _WANDB_ENV_OF_TRAINING:
                os.environ.pop(name, None)
            training = self.training_id or training_wandb_run(spec["dir"], spec["start_s"])
            self.training_id = training
            group = spec.get("group") or training or spec["gpuprof_run_id"]
            name = f"{spec.get('name') or training or spec['gpuprof_run_id']}-gpuprof"
            config = {"gpuprof_run_dir": spec["gpuprof_run_dir"], "training_run_id": training}
            self.run = wandb.init(project=spec.get("project"), entity=spec.get("entity"),
                                  group=group, job_type="gpuprof", name=name, config=config,
                                  dir=spec["dir"], settings=settings)  # fmt: skip
        self.run.define_metric("gpuprof/steps")
        self.run.define_metric("gpuprof/*", step_metric="gpuprof/steps")

    def _link(self) -> None:
        """The training's run id, once its directory shows it (grouped runs only)."""
        if self.training_id or self.spec.get("shared") or self.tries >= DISCOVER_TRIES:
            return
        self.tries += 1
        found = training_wandb_run(self.spec["dir"], self.spec["start_s"], not_id=self.run.id)
        if found:
            self.training_id = found
            self.run.config.update({"training_run_id": found}, allow_val_change=True)

    def log(self, message: dict[str, Any]) -> None:
        self._link()
        self.run.log({**message["metrics"], "gpuprof/steps": message["step"]})
        for key, text in message["texts"].items():
            self.run.summary[key] = text

    def final(self, message: dict[str, Any]) -> None:
        self.log(message)
        self.run.summary.update(message["metrics"])

    def attach(self, files: list[str]) -> None:
        wandb = self.wandb
        name = re.sub(r"[^A-Za-z0-9_.-]+", "_", f"gpuprof-{self.spec['gpuprof_run_id']}")
        about = "gpuprof's report and diagnosis of the run"
        artifact = wandb.Artifact(name, type="gpuprof-report", description=about)
        for path in files:
            artifact.add_file(path)
        self.run.log_artifact(artifact)
        for path in files:  # also among the run's files
            self.run.save(path, base_path=os.path.dirname(path), policy="now")

    def close(self) -> str:
        run = self.run
        run_id, project = run.id, run.project
        offline = bool(getattr(run.settings, "_offline", False))
        directory = Path(run.dir).parent
        url = None if offline else getattr(run, "url", None)
        run.finish()
        if self.spec.get("shared"):
            where = f"into the training's run {run_id} (W&B shared mode)"
            return f"{where}: {url}" if url else where
        linked = f", grouped with run {self.training_id}" if self.training_id else ""
        where = f"run {run_id} in project {project}{linked}"
        if offline:
            return f"{where} (offline: wandb sync {directory})"
        return f"{where}: {url}" if url else where

    def abort(self) -> None:
        run = getattr(self, "run", None)
        if run is not None:
            with contextlib.suppress(Exception):
                run.finish(exit_code=1)


# ----- MLflow


def _is_file_store(uri: str | None) -> bool:
    return uri is not None and ("://" not in uri or uri.startswith("file:"))


class MlflowWriter(Writer):
    """An MLflow run: the training's (``MLFLOW_RUN_ID``) or one nested under it, through
    `MlflowClient` (no active run of MLflow's fluent API)."""

    def open(self) -> None:
        spec = self.spec
        # a tracking server that does not answer costs seconds, not minutes of retries
        os.environ.setdefault("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "1")
        os.environ.setdefault("MLFLOW_HTTP_REQUEST_TIMEOUT", "10")
        uri = spec.get("tracking_uri")
        if _is_file_store(uri):
            os.environ["MLFLOW_ALLOW_FILE_STORE"] = "true"  # maintenance mode in MLflow 3
        _require("mlflow", "mlflow")
        from mlflow.entities import Metric, RunTag
        from mlflow.tracking import MlflowClient

        self.Metric, self.RunTag = Metric, RunTag
        self.client = client = MlflowClient(tracking_uri=uri)
        self.uri = uri or "MLflow's default tracking URI"
        self.tries = 0
        self.parent = None
        self.run_id, self.own, self.waiting = None, True, []
        if spec.get("run_id"):
            run = client.get_run(spec["run_id"])
            self.run_id, self.own = run.info.run_id, False
            self.experiment_id = run.info.experiment_id
        else:
            self._start_own(create=False)

    def _start_own(self, create: bool) -> None:
        """gpuprof's own run, once its experiment exists. A named experiment that does not
        exist yet is left for the training to create (its own get-or-create would fail if
        gpuprof made it in between) for `EXPERIMENT_WAIT_S` of the watch, then made here."""
        spec, client = self.spec, self.client
        experiment = self._experiment(create)
        if experiment is None:
            return
        self.experiment_id = experiment
        tags = {"gpuprof.run_dir": spec["gpuprof_run_dir"], "gpuprof.role": "profiler"}
        name = f"{spec.get('run_name') or spec['gpuprof_run_id']}-gpuprof"
        run = client.create_run(self.experiment_id, run_name=name, tags=tags)
        self.run_id, self.own = run.info.run_id, True
        self._link()
        waiting, self.waiting = self.waiting, []
        for message in waiting:
            self._log(message)

    def _experiment(self, create: bool) -> str | None:
        """The experiment's id; None when it does not exist (yet) and ``create`` is off."""
        spec, client = self.spec, self.client
        if spec.get("experiment_id"):
            return str(spec["experiment_id"])
        name = spec.get("experiment_name")
        if not name:
            return "0"  # the default experiment, as MLflow's own runs without one
        found = client.get_experiment_by_name(name)
        if found is not None:
            return found.experiment_id
        if not create:
            return None
        try:
            return client.create_experiment(name)
        except Exception:  # the training created it meanwhile
            found = client.get_experiment_by_name(name)
            if found is None:
                raise
            return found.experiment_id

    def _ready(self, force: bool = False, t: float | None = None) -> bool:
        """Whether gpuprof's run exists (made now if its experiment does); ``t`` is the time
        (s since the epoch) of the point at hand."""
        if self.run_id is None:
            waited = t is not None and t - float(self.spec["start_s"]) >= EXPERIMENT_WAIT_S
            self._start_own(create=force or waited)
        return self.run_id is not None

    def _link(self) -> None:
        """Nest this run under the training's: the newest run of the experiment started since
        the watch began (other than gpuprof's own)."""
        if not self.own or self.parent or self.tries >= DISCOVER_TRIES:
            return
        self.tries += 1
        since_ms = int(self.spec["start_s"] * 1000) - 1000
        runs = self.client.search_runs(
            [self.experiment_id],
            filter_string=f"attributes.start_time >= {since_ms}",
            order_by=["attributes.start_time DESC"],
            max_results=10,
        )
        for run in runs:
            if run.info.run_id != self.run_id and "gpuprof.role" not in run.data.tags:
                self.parent = run.info.run_id
                self.client.set_tag(self.run_id, "mlflow.parentRunId", self.parent)
                self.client.set_tag(self.run_id, "gpuprof.training_run_id", self.parent)
                return

    def log(self, message: dict[str, Any]) -> None:
        if not self._ready(t=float(message["t"])):
            self.waiting.append(message)
            return
        self._log(message)

    def _log(self, message: dict[str, Any]) -> None:
        self._link()
        stamp = int(message["t"] * 1000)
        step = int(message["step"])
        metrics = [self.Metric(k, v, stamp, step) for k, v in message["metrics"].items()]
        tags = [self.RunTag(k, v) for k, v in message["texts"].items()]
        for start in range(0, max(len(metrics), 1), 1000):  # MLflow takes 1000 a batch
            self.client.log_batch(self.run_id, metrics=metrics[start : start + 1000],
                                  tags=tags if start == 0 else [])  # fmt: skip

    def final(self, message: dict[str, Any]) -> None:
        self._ready(force=True)
        self.log(message)

    def attach(self, files: list[str]) -> None:
        self._ready(force=True)
        for path in files:
            self.client.log_artifact(self.run_id, path, artifact_path="gpuprof")

    def close(self) -> str:
        self._ready(force=True)
        if self.own:
            self.client.set_terminated(self.run_id, "FINISHED")
            nested = f" under the training's run {self.parent}" if self.parent else ""
            return f"run {self.run_id}{nested} at {self.uri}"
        return f"into the training's run {self.run_id} at {self.uri}"

    def abort(self) -> None:
        if getattr(self, "own", False) and getattr(self, "run_id", None):
            with contextlib.suppress(Exception):
                self.client.set_terminated(self.run_id, "FAILED")


# ----- TensorBoard


class TensorBoardWriter(Writer):
    """Event files of its own in a ``gpuprof`` directory, written with TensorBoard's own event
    writer (scalars as ``simple_value``, texts through the text plugin)."""

    def open(self) -> None:
        _require("tensorboard", "tensorboard")
        from tensorboard.compat.proto import event_pb2, summary_pb2
        from tensorboard.plugins.text.summary_v2 import text_pb
        from tensorboard.summary.writer.event_file_writer import EventFileWriter

        self.event_pb2, self.summary_pb2, self.text_pb = event_pb2, summary_pb2, text_pb
        self.dir = Path(self.spec["dir"])
        try:
            self.dir.mkdir(parents=True, exist_ok=True)
            probe = self.dir / ".gpuprof-write-test"
            probe.write_bytes(b"")
            probe.unlink()
        except OSError as exc:
            reason = str(exc.strerror or exc)
            raise SinkError(f"cannot write {self.dir} ({reason[:1].lower()}{reason[1:]})") from None
        self.writer = EventFileWriter(str(self.dir), flush_secs=5, filename_suffix=".gpuprof")
        self.last_step = 0

    def _summary(self, message: dict[str, Any]):
        values = [self.summary_pb2.Summary.Value(tag=k, simple_value=v)
                  for k, v in message["metrics"].items()]  # fmt: skip
        summary = self.summary_pb2.Summary(value=values)
        for key, text in message["texts"].items():
            summary.value.extend(self.text_pb(key, text).value)
        return summary

    def log(self, message: dict[str, Any]) -> None:
        self.last_step = int(message["step"])
        event = self.event_pb2.Event(wall_time=message["t"], step=self.last_step,
                                     summary=self._summary(message))  # fmt: skip
        self.writer.add_event(event)

    def final(self, message: dict[str, Any]) -> None:
        self.log(message)
        self.writer.flush()

    def attach(self, files: list[str]) -> None:
        names = []
        for path in files:
            shutil.copyfile(path, self.dir / Path(path).name)
            names.append(Path(path).name)
        listing = "\n".join(f"- `{self.dir / n}`" for n in names)
        text = f"gpuprof's report and diagnosis of this run, next to these events:\n\n{listing}"
        self.log({"step": self.last_step, "t": time.time(), "metrics": {},
                  "texts": {"gpuprof/files": text}})  # fmt: skip

    def close(self) -> str:
        self.writer.close()
        return str(self.dir)

    def abort(self) -> None:
        writer = getattr(self, "writer", None)
        if writer is not None:
            with contextlib.suppress(Exception):
                writer.close()


WRITERS: dict[str, type[Writer]] = {
    "wandb": WandbWriter,
    "mlflow": MlflowWriter,
    "tensorboard": TensorBoardWriter,
}


def _detach_output() -> TextIO:
    """The replies' stream (the stdout this process was given); fd 1 and 2, and Python's
    ``sys.stdout`` / ``sys.stderr``, go to /dev/null."""
    replies = os.fdopen(os.dup(1), "w", buffering=1, encoding="utf-8")
    null = os.open(os.devnull, os.O_WRONLY)
    os.dup2(null, 1)
    os.dup2(null, 2)
    os.close(null)
    sys.stdout = sys.stderr = open(os.devnull, "w")  # noqa: SIM115 (for the process's life)
    return replies


def run(kind: str, messages: TextIO, replies: TextIO) -> int:
    """Read ``messages`` until their end, write to the tracker ``kind``, reply (module doc)."""

    def reply(**fields: str) -> None:
        with contextlib.suppress(OSError, ValueError):
            replies.write(json.dumps(fields) + "\n")
            replies.flush()

    writer: Writer | None = None
    try:
        for line in messages:
            message = json.loads(line)
            op = message.get("op")
            if op == "open":
                writer = WRITERS[kind](message["spec"])
                writer.open()
            elif writer is None:
                raise SinkError("no open message first")
            elif op == "log":
                writer.log(message)
            elif op == "final":
                writer.final(message)
            elif op == "attach":
                writer.attach(message["files"])
        if writer is None:
            return 0
        reply(done=writer.close())
    except BaseException as exc:  # one line for anything, even an exit from a library
        reply(error=_why(exc))
        if writer is not None:
            writer.abort()
        return 1
    return 0


def lowest_priority() -> None:
    """This process (and what it starts) runs only on CPU time nothing else wants: Linux's
    ``SCHED_IDLE`` where it is allowed, else the highest nice value."""
    with contextlib.suppress(OSError, AttributeError):
        os.nice(19)
    with contextlib.suppress(OSError, AttributeError):
        os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))


def main() -> int:
    kind = sys.argv[1] if len(sys.argv) > 1 else ""
    replies = _detach_output()
    lowest_priority()
    if kind not in WRITERS:
        replies.write(json.dumps({"error": f"unknown tracker {kind!r}"}) + "\n")
        return 2
    return run(kind, sys.stdin, replies)


if __name__ == "__main__":
    # leave without waiting for the libraries' own exit handlers once the replies are out
    code = main()
    sys.exit(code)
