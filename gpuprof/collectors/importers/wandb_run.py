"""A Weights & Biases run on disk: ``wandb/run-<date>-<id>/`` (synced) or
``wandb/offline-run-<date>-<id>/`` (``WANDB_MODE=offline``), or its ``run-<id>.wandb`` file.

Everything a run logged is in its ``.wandb`` transaction log: ``history`` records (one per
``wandb.log`` commit: the logged keys plus ``_step`` and ``_timestamp``, the wall-clock second it
was logged), ``stats`` records (the system monitor's samples, ``gpu.N.gpu`` & co., each with its
timestamp), the ``run`` record (config, host) and ``environment`` records (GPU inventory). The file
is read with wandb's own reader — never parsed here:

- wandb ≥ 0.31 ships its reader in the ``wandb-core`` binary: ``wandb-core leet inspect --json``
  prints one JSON object per record (what ``wandb leet inspect --json`` shows);
- older wandb releases read it in Python, ``wandb.sdk.internal.datastore.DataStore`` with the
  ``wandb_internal_pb2.Record`` protobuf.

verl logs ``wandb.log(metrics, step=global_step)``, so ``_step`` is the training step and
``_timestamp`` the step's end; TRL's profiled calls are logged as they return. The keys are
mapped by `tracker_keys`.
"""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import orjson

from gpuprof.collectors.importers import Imported, ImportFormatError
from gpuprof.collectors.importers.tracker_keys import (
    TrackerRun,
    number,
    points_frame,
    require,
    to_imported,
)

FORMAT = "wandb-run"

MAGIC = b":W&B"
"""First bytes of a ``.wandb`` transaction log."""
INSPECT_TIMEOUT_S = 600
"""Longest wait for ``wandb-core leet inspect`` (it reads ~10⁵ records a second)."""


def sniff(head: str, path: Path) -> bool:
    """A ``.wandb`` transaction log: the name ends in ``.wandb`` and the file starts ``:W&B``."""
    return path.suffix == ".wandb" and head.startswith(MAGIC.decode())


def sniff_dir(path: Path) -> bool:
    """A W&B run directory (holding a ``run-*.wandb``) or a ``wandb/`` directory of runs."""
    return _run_file(path, strict=False) is not None


def _run_file(path: Path, *, strict: bool) -> Path | None:
    """The ``.wandb`` file of a run directory, or of the only run in a ``wandb/`` directory.

    With ``strict``, `ImportFormatError` for a directory of several runs (naming the latest).
    """
    own = sorted(path.glob("run-*.wandb"))
    if len(own) == 1:
        return own[0]
    if len(own) > 1:
        if strict:
            raise ImportFormatError(f"{path}: {len(own)} .wandb files; import one of them")
        return own[0]
    runs = sorted(
        (f for f in path.glob("*run-*/run-*.wandb") if not f.parent.is_symlink()),
        key=lambda f: f.parent.name.split("-", 1)[-1],
    )
    if len(runs) == 1:
        return runs[0]
    if runs and strict:
        raise ImportFormatError(
            f"{path}: holds {len(runs)} W&B runs; import one of them (the latest is "
            f"{runs[-1].parent})"
        )
    return runs[-1] if runs else None


def parse(path: Path) -> Imported:
    """The run's history, system metrics, config and GPU inventory (see the module doc)."""
    file = _run_file(path, strict=True) if path.is_dir() else path
    if file is None:
        raise ImportFormatError(f"{path}: no run-*.wandb file in this directory")
    # found, not imported: the reader is a binary of the package (importing wandb takes ~1 s)
    package = Path(require("wandb", path, "a W&B run", load=False).origin).parent
    keys: list[str] = []
    steps: list[float] = []
    times: list[float] = []
    values: list[float] = []
    skipped: dict[str, int] = {}
    config: dict[str, Any] = {}
    host = None
    gpus: list[dict[str, Any]] = []
    history = 0
    for kind, body in _records(file, package):
        if kind == "history":
            item = _flat(body.get("item") or {})
            step = number(item.get("_step"))
            if step is None:
                step = number((body.get("step") or {}).get("num"))
            stamp = number(item.get("_timestamp"))
            t_ns = stamp * 1e9 if stamp is not None else np.nan
            history += 1
            for key, raw in item.items():
                if key.startswith("_"):
                    continue
                value = number(raw)
                if value is None:
                    skipped[key] = skipped.get(key, 0) + 1
                    continue
                keys.append(key)
                steps.append(step if step is not None else np.nan)
                times.append(t_ns)
                values.append(value)
        elif kind == "stats":
            t_ns = _rfc3339_ns(body.get("timestamp"))
            for key, raw in _flat(body.get("item") or {}).items():
                value = number(raw)
                if value is not None and t_ns is not None:
                    keys.append(f"system.{key}")
                    steps.append(np.nan)
                    times.append(t_ns)
                    values.append(value)
        elif kind in ("run", "config"):
            update = (body.get("config") or {}).get("update") or {}
            config.update(update if isinstance(update, dict) else {})
            host = body.get("host") or host
        elif kind == "environment":
            host = body.get("host") or host
            if body.get("gpu_nvidia"):
                gpus = _inventory(body["gpu_nvidia"])
    if not gpus:
        gpus, host = _metadata_file(file, gpus, host)
    if history == 0 and not keys:
        raise ImportFormatError(f"{file}: a W&B run with no logged values")
    run = TrackerRun(
        source=path,
        format=FORMAT,
        tracker="W&B",
        points=points_frame(keys, steps, times, values),
        config=config,
        host=host,
        gpus=gpus,
        skipped=skipped,
    )
    return to_imported(run)


def _flat(item: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """History/stats items with nested plain dicts as dotted keys (W&B shows them so); media
    (dicts with ``_type``) stay as they are, to be counted as no numbers."""
    out: dict[str, Any] = {}
    for key, value in item.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict) and "_type" not in value:
            out.update(_flat(value, f"{name}."))
        else:
            out[name] = value
    return out


def _rfc3339_ns(text: Any) -> float | None:
    """``2026-11-25T14:06:41.742495030Z`` as ns since the epoch; None when unreadable."""
    if not isinstance(text, str) or not text:
        return None
    try:
        return float(np.datetime64(text.rstrip("Z"), "ns").astype(np.int64))
    except ValueError:
        return None


def _inventory(entries: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """GPU inventory from W&B's ``gpu_nvidia`` list (in device order)."""
    gpus = []
    for index, entry in enumerate(entries):
        if not isinstance(entry, dict):
            continue
        total = number(entry.get("memory_total") or entry.get("memoryTotal"))
        if total is None and isinstance(entry.get("memory_total"), str):
            total = float(entry["memory_total"]) if entry["memory_total"].isdigit() else None
        gpus.append(
            {
                "index": index,
                "name": entry.get("name"),
                "uuid": entry.get("uuid"),
                "pci_bus_id": entry.get("pci_bus_id"),
                "mem_total_bytes": int(total) if total else None,
            }
        )
    return gpus


def _metadata_file(
    file: Path, gpus: list[dict[str, Any]], host: str | None
) -> tuple[list[dict[str, Any]], str | None]:
    """Inventory and host from ``files/wandb-metadata.json`` (synced runs of older wandb write
    them there rather than in the log)."""
    meta_path = file.parent / "files" / "wandb-metadata.json"
    try:
        meta = json.loads(meta_path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return gpus, host
    if isinstance(meta, dict):
        if isinstance(meta.get("gpu_nvidia"), list):
            gpus = _inventory(meta["gpu_nvidia"])
        host = host or meta.get("host")
    return gpus, host


def _records(file: Path, package: Path) -> Iterator[tuple[str, dict[str, Any]]]:
    """(record type, its body) for every record of a ``.wandb`` file, by wandb's own reader
    (``package``: where wandb is installed)."""
    if (package / "sdk" / "internal" / "datastore.py").is_file():  # wandb < 0.31
        from wandb.sdk.internal import datastore

        yield from _records_datastore(file, datastore)
    else:
        yield from _records_core(file, package)


def _records_core(file: Path, package: Path) -> Iterator[tuple[str, dict[str, Any]]]:
    core = package / "bin" / "wandb-core"
    if not core.is_file():  # a build that keeps it elsewhere: ask wandb
        from wandb.util import get_core_path

        try:
            core = Path(get_core_path())
        except Exception as exc:  # WandbCoreNotAvailableError: a wheel without its binary
            raise ImportFormatError(
                f"{file}: wandb's reader (wandb-core) is missing: {exc}"
            ) from None
    # the run file names the run; the directory argument is required but not read then
    command = [str(core), "leet", "inspect", "--json", "--no-observability",
               "--run-file", str(file), str(file.parent.parent)]  # fmt: skip
    env = {k: v for k, v in os.environ.items() if not k.startswith("WANDB_")}
    try:
        done = subprocess.run(
            command, capture_output=True, timeout=INSPECT_TIMEOUT_S, env=env, check=False
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise ImportFormatError(f"{file}: wandb-core could not read it ({exc})") from None
    if done.returncode != 0:
        why = done.stderr.decode(errors="replace").strip().splitlines()
        reason = why[-1] if why else f"exit status {done.returncode}"
        raise ImportFormatError(f"{file}: wandb-core could not read it ({reason[:200]})")
    for line in done.stdout.splitlines():
        if not line.strip():
            continue
        try:
            record = orjson.loads(line)
        except orjson.JSONDecodeError:
            continue
        kind = record.get("type")
        if isinstance(kind, str) and isinstance(record.get(kind), dict):
            yield kind, record[kind]


def _records_datastore(file: Path, datastore: Any) -> Iterator[tuple[str, dict[str, Any]]]:
    """The same bodies as `_records_core` gives, from wandb's Python reader."""
    from wandb.proto import wandb_internal_pb2

    store = datastore.DataStore()
    try:
        store.open_for_scan(str(file))
    except Exception as exc:
        raise ImportFormatError(f"{file}: wandb could not open it ({exc})") from None
    while True:
        try:
            data = store.scan_data()
        except Exception:  # a run cut short: what was read so far stands
            break
        if data is None:
            break
        record = wandb_internal_pb2.Record()
        record.ParseFromString(data)
        kind = record.WhichOneof("record_type")
        if kind == "history":
            item = {_item_key(i): _json(i.value_json) for i in record.history.item}
            yield "history", {"item": item, "step": {"num": record.history.step.num}}
        elif kind == "stats":
            item = {i.key: _json(i.value_json) for i in record.stats.item}
            stamp = record.stats.timestamp.ToDatetime().isoformat() + "Z"
            yield "stats", {"item": item, "timestamp": stamp}
        elif kind in ("run", "config"):
            body = record.run if kind == "run" else record.config
            update = {_item_key(i): _json(i.value_json) for i in body.config.update}
            host = getattr(body, "host", None) if kind == "run" else None
            yield kind, {"config": {"update": update}, "host": host}
        elif kind == "environment":
            from google.protobuf.json_format import MessageToDict

            yield kind, MessageToDict(record.environment, preserving_proto_field_name=True)


def _item_key(item: Any) -> str:
    return item.key or "/".join(item.nested_key)


def _json(text: str) -> Any:
    try:
        return json.loads(text)
    except ValueError:
        return None
