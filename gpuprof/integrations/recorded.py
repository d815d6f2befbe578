"""Knob values adapters recorded (``knobs`` events) → the run's ``RunMeta``.

Adapters call `gpuprof.hooks.record_knobs` in the training processes; ``gpuprof watch``
calls `merge_into_meta` when the command has ended, so the recommender finds the values in
``RunMeta.knobs`` (they override what the command line said: a config file or a default the
framework filled in is what the run really used).
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from gpuprof.model import Run, RunMeta
from gpuprof.redact import redact_knobs


def read_knob_events(paths: Iterable[Path]) -> list[tuple[int, str, dict[str, Any]]]:
    """``(t_ns, framework, attrs)`` of every ``knobs`` event in the given run files, oldest
    first. Files that can't be read are skipped (the run's own loader reports them)."""
    events: list[tuple[int, str, dict[str, Any]]] = []
    for path in paths:
        try:
            conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True, timeout=5.0)
        except sqlite3.Error:
            continue
        try:
            rows = conn.execute(
                "SELECT t_ns, name, attrs FROM events WHERE kind = 'knobs'"
            ).fetchall()
        except sqlite3.Error:
            rows = []
        finally:
            conn.close()
        for t_ns, name, attrs in rows:
            try:
                parsed = json.loads(attrs) if attrs else {}
            except ValueError:
                continue
            if isinstance(parsed, dict):
                events.append((int(t_ns or 0), str(name or ""), parsed))
    events.sort(key=lambda e: e[0])
    return events


def merge_into_meta(meta: RunMeta, paths: Iterable[Path]) -> bool:
    """Copy recorded knobs (later records win) and the framework into ``meta``; True when
    anything was recorded. A framework already set on ``meta`` is kept."""
    return _merge(meta, read_knob_events(paths))


def merge_run_events(run: Run) -> bool:
    """The same for a loaded run whose ``knobs`` events are in ``run.events`` (a run written
    by processes that called ``gpuprof.init`` themselves, with no watcher to merge them)."""
    events = run.events
    if events is None or not len(events):
        return False
    rows = events[events["kind"] == "knobs"]
    found = [
        (int(t), str(name or ""), attrs)
        for t, name, attrs in zip(rows["t_ns"], rows["name"], rows["attrs"])
        if isinstance(attrs, dict)
    ]
    return _merge(run.meta, sorted(found, key=lambda e: e[0]))


def _merge(meta: RunMeta, events: list[tuple[int, str, dict[str, Any]]]) -> bool:
    if not events:
        return False
    knobs = dict(meta.knobs or {})
    framework = None
    version = None
    for _, name, attrs in events:
        values = attrs.get("knobs")
        if isinstance(values, dict):
            knobs.update(redact_knobs({str(k): v for k, v in values.items()}))
        framework = name or framework
        version = attrs.get("version") or version
    meta.knobs = knobs
    if framework and not meta.framework:
        meta.framework = framework
    if framework and version:
        meta.knobs.setdefault(f"{framework}.__version__", version)
    return True
