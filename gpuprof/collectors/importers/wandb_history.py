"""A W&B run's history exported to a file: CSV, JSON / JSON lines or Parquet.

What the W&B API gives — ``run.history(samples=…)`` or ``run.history(stream="system")`` (a
pandas frame: saved with ``to_csv`` / ``to_json`` / ``to_parquet``), ``run.scan_history()``
(dicts: saved as JSON lines or a JSON array) — has one row per logged step with ``_step``,
``_timestamp`` (wall-clock seconds) and ``_runtime`` beside the logged keys, system metrics as
``system.gpu.N.gpu``… A chart's "Export CSV" in the W&B app writes ``Step`` and
``<run name> - <key>`` columns (with ``__MIN``/``__MAX`` beside them when the chart was
sampled): read too, without times (unanchored). No W&B library is needed: the file is read with
pandas. The keys are mapped by `tracker_keys`.
"""

from __future__ import annotations

import io
import re
from pathlib import Path

import numpy as np
import pandas as pd

from gpuprof.collectors.importers import Imported, ImportFormatError, open_text
from gpuprof.collectors.importers.tracker_keys import TrackerRun, number, to_imported

FORMAT = "wandb-history"

_KEY_HINT = re.compile(r"timing_s/|timing/|system\.gpu\.|profiling/Time taken")
_PANEL_COLUMN = re.compile(r"^(?P<run>.+?) - (?P<key>.+?)(?P<agg>__MIN|__MAX)?$")


def sniff(head: str, path: Path) -> bool:
    """A history export: W&B's ``_step`` with ``_timestamp``/``_runtime`` in the CSV header or
    the first JSON object, or a Parquet file whose columns have them; a chart export's
    ``Step`` header with ``<run> - <key>`` columns."""
    if path.suffix.lower() == ".parquet" or head.startswith("PAR1"):
        return _parquet_columns(path) is not None
    first = head.lstrip().split("\n", 1)[0]
    if first.startswith(("[", "{")):
        return '"_step"' in head[:4096] and ('"_timestamp"' in head or '"_runtime"' in head)
    columns = [c.strip().strip('"') for c in first.split(",")]
    if "_step" in columns and ("_timestamp" in columns or "_runtime" in columns):
        return True
    return (
        bool(columns)
        and columns[0] == "Step"
        and any(" - " in c for c in columns[1:])
        and bool(_KEY_HINT.search(first))
    )


def _parquet_columns(path: Path) -> list[str] | None:
    try:
        import pyarrow.parquet as pq

        names = pq.read_schema(path).names
    except Exception:
        return None
    return names if "_step" in names else None


def parse(path: Path) -> Imported:
    """Every numeric cell as a point: key = column, step = ``_step``, time = ``_timestamp``."""
    frame = _read(path)
    notes: list[str] = []
    if "_step" not in frame.columns and "Step" in frame.columns:
        frame, run_names = _panel(frame, path)
        notes.append(
            f"a W&B chart export (run {', '.join(run_names)}): no wall-clock times; "
            "the API's run.history() export keeps them"
        )
    if "_step" not in frame.columns:
        raise ImportFormatError(f"{path}: no _step column (not a W&B history export)")
    steps = pd.to_numeric(frame["_step"], errors="coerce").to_numpy(np.float64)
    if "_timestamp" in frame.columns:
        t_ns = pd.to_numeric(frame["_timestamp"], errors="coerce").to_numpy(np.float64) * 1e9
    else:
        t_ns = np.full(len(frame), np.nan)
    keys_out: list[np.ndarray] = []
    steps_out: list[np.ndarray] = []
    times_out: list[np.ndarray] = []
    values_out: list[np.ndarray] = []
    skipped: dict[str, int] = {}
    names: list[str] = []  # the key of each code in keys_out
    for column in frame.columns:
        name = str(column)
        if name.startswith("_") or name.startswith("Unnamed:") or name == "index":
            continue
        raw = frame[column]
        values = pd.to_numeric(raw, errors="coerce").to_numpy(np.float64)
        texts = raw.astype(str).str.strip().str.lower() if raw.dtype == object else None
        present = raw.notna().to_numpy()
        if texts is not None:
            # NaN written as text stays a value to count; anything else textual is no number
            nan_text = texts.isin(["nan", "inf", "-inf", "infinity"]).to_numpy()
            values = np.where(nan_text, [number(t) or np.nan for t in texts], values)
            bad = present & np.isnan(values) & ~nan_text
            if bad.any():
                skipped[name] = int(bad.sum())
            present = present & (~np.isnan(values) | nan_text)
        # a row where this key was not logged is empty (NaN in the frame), not a NaN value
        keep = present
        if not keep.any():
            continue
        keys_out.append(np.full(int(keep.sum()), len(names), dtype=np.int32))
        names.append(name)
        steps_out.append(steps[keep])
        times_out.append(t_ns[keep])
        values_out.append(values[keep])
    if not keys_out:
        raise ImportFormatError(f"{path}: a W&B history export with no logged values")
    points = pd.DataFrame(
        {
            # categorical: a million cells name a few hundred keys
            "key": pd.Categorical.from_codes(np.concatenate(keys_out), categories=names),
            "step": np.concatenate(steps_out),
            "t_ns": np.concatenate(times_out),
            "value": np.concatenate(values_out),
        }
    )
    run = TrackerRun(source=path, format=FORMAT, tracker="W&B", points=points, notes=notes,
                     skipped=skipped)  # fmt: skip
    return to_imported(run)


def _read(path: Path) -> pd.DataFrame:
    try:
        if path.suffix.lower() == ".parquet" or _parquet_columns(path) is not None:
            return pd.read_parquet(path)
        text = open_text(path)
        stripped = text.lstrip()
        if stripped.startswith("["):
            return pd.read_json(io.StringIO(text), orient="records")
        if stripped.startswith("{"):
            first = stripped.split("\n", 1)[0].strip()
            if first.endswith("}") and ('"_step"' in first):
                return pd.read_json(io.StringIO(text), lines=True)
            return pd.read_json(io.StringIO(text))  # pandas to_json's default (columns)
        return pd.read_csv(io.StringIO(text), low_memory=False)
    except ImportFormatError:
        raise
    except (ValueError, OSError) as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise ImportFormatError(f"{path}: unreadable W&B history export ({first})") from None


def _panel(frame: pd.DataFrame, path: Path) -> tuple[pd.DataFrame, list[str]]:
    """A chart export as a history frame: ``<run> - <key>`` columns renamed to ``<key>``, the
    ``__MIN``/``__MAX`` bands dropped, ``Step`` as ``_step``."""
    runs: set[str] = set()
    renamed = {"Step": "_step"}
    drop = []
    for column in frame.columns[1:]:
        match = _PANEL_COLUMN.match(str(column))
        if match is None:
            drop.append(column)
            continue
        runs.add(match.group("run"))
        if match.group("agg"):
            drop.append(column)
        else:
            renamed[column] = match.group("key")
    if len(runs) > 1:
        raise ImportFormatError(
            f"{path}: a W&B chart export of {len(runs)} runs ({', '.join(sorted(runs)[:3])}); "
            "export one run"
        )
    return frame.drop(columns=drop).rename(columns=renamed), sorted(runs)
