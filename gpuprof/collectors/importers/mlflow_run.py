"""An MLflow run: a file-store run directory (``mlruns/<experiment id>/<run id>/``), an
``mlruns/`` tree or experiment directory holding one run, or ``runs:/<run id>`` on the tracking
server or database that ``MLFLOW_TRACKING_URI`` names.

The run is read with MLflow's client (``MlflowClient.get_run`` and ``get_metric_history``),
never by reading its files here. Every metric value has its step and the wall-clock millisecond
it was logged, so steps are anchored. Params (verl: the flattened config; TRL and ms-swift: the
training arguments) become knobs. ``log_system_metrics=True`` runs also hold
``system/gpu_N_…`` series (averaged over each logging window, every 10 s by default), which
become GPU samples. The keys are mapped by `tracker_keys`.

MLflow 3 keeps the file store in maintenance mode and refuses it unless
``MLFLOW_ALLOW_FILE_STORE`` is set; reading an existing run sets it for the duration of the read.
"""

from __future__ import annotations

import contextlib
import os
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from gpuprof.collectors.importers import Imported, ImportFormatError
from gpuprof.collectors.importers.tracker_keys import (
    TrackerRun,
    points_frame,
    require,
    to_imported,
)

FORMAT = "mlflow-run"

_RUN_URI = re.compile(r"^runs:/([0-9A-Za-z_-]+)/?$")


def sniff(head: str, path: Path) -> bool:
    """No single file is an MLflow run (see `sniff_dir`, `sniff_uri`)."""
    return False


def sniff_uri(text: str) -> bool:
    """``runs:/<run id>``: a run of the tracking URI in the environment."""
    return _RUN_URI.match(text) is not None


def sniff_dir(path: Path) -> bool:
    """A file-store run directory, or a directory above such runs (experiment, ``mlruns``)."""
    return _is_run_dir(path) or bool(_runs_below(path))


def _is_run_dir(path: Path) -> bool:
    return (path / "meta.yaml").is_file() and (path / "metrics").is_dir()


def _runs_below(path: Path) -> list[Path]:
    """Run directories of an experiment directory or an ``mlruns`` tree (not its trash)."""
    found = [p for p in path.glob("*") if _is_run_dir(p)]
    if not found and not (path / "meta.yaml").is_file():
        found = [p for p in path.glob("*/*") if p.parent.name != ".trash" and _is_run_dir(p)]
    return sorted(found)


def parse(path: Path) -> Imported:
    """Every metric value of the run as a point; params as config (see the module doc)."""
    require("mlflow", path, "an MLflow run")
    text = str(path)
    match = _RUN_URI.match(text)
    if match:
        run_id, tracking_uri = match.group(1), None
    else:
        run_dir = path if _is_run_dir(path) else None
        if run_dir is None:
            runs = _runs_below(path)
            if len(runs) != 1:
                raise ImportFormatError(
                    f"{path}: holds {len(runs)} MLflow runs; import one run directory "
                    f"(e.g. {runs[-1]})"
                    if runs
                    else f"{path}: no MLflow run in this directory"
                )
            run_dir = runs[0]
        run_id = run_dir.name
        tracking_uri = run_dir.resolve().parent.parent.as_uri()
    with _file_store_allowed():
        from mlflow.exceptions import MlflowException
        from mlflow.tracking import MlflowClient

        try:
            client = MlflowClient(tracking_uri=tracking_uri)
            run = client.get_run(run_id)
            keys: list[str] = []
            steps: list[float] = []
            times: list[float] = []
            values: list[float] = []
            for key in sorted(run.data.metrics):
                for metric in _history(client, run_id, key):
                    keys.append(key)
                    steps.append(float(metric.step))
                    times.append(float(metric.timestamp) * 1e6)
                    values.append(float(metric.value))
        except MlflowException as exc:
            first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            raise ImportFormatError(f"{path}: MLflow could not read the run ({first})") from None
    if not keys:
        raise ImportFormatError(f"{path}: an MLflow run with no metrics")
    config: dict[str, Any] = dict(run.data.params)
    tracker_run = TrackerRun(
        source=path,
        format=FORMAT,
        tracker="MLflow",
        points=points_frame(keys, steps, times, values),
        config=config,
    )
    return to_imported(tracker_run)


def _history(client: Any, run_id: str, key: str) -> Iterator[Any]:
    yield from client.get_metric_history(run_id, key)


@contextlib.contextmanager
def _file_store_allowed() -> Iterator[None]:
    """``MLFLOW_ALLOW_FILE_STORE=true`` while reading, as it was afterwards."""
    name = "MLFLOW_ALLOW_FILE_STORE"
    before = os.environ.get(name)
    os.environ[name] = "true"
    try:
        yield
    finally:
        if before is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = before
