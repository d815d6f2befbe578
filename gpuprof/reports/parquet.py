"""A run as a directory of Parquet files, for pandas, Polars, DuckDB or Spark.

Layout::

    <dir>/meta.json          {"format": "gpuprof-parquet", "version": 1, "run": RunMeta,
                              "tables": {name: {"file", "rows", "json_columns"}}}
    <dir>/<frame>.parquet    one per non-empty frame: gpu, host, procs, gpu_procs, spans,
                             events, logs — the `Run` frames' columns, in order

Types: the frames' own dtypes (int64, float64 with NaN for missing, bool, strings) except the
dict columns (``attrs``), stored as JSON text; `read_parquet_run` turns them back into dicts.
Readers that bypass it get strings for ``attrs`` and nullable strings for text columns.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

from gpuprof.model import RECORD_TYPES, Run, RunMeta, column_kinds, empty_frame
from gpuprof.reports.fmt import json_safe
from gpuprof.reports.progress import progress

FORMAT = "gpuprof-parquet"
VERSION = 1
COMPRESSION = "zstd"


def json_columns(table: str) -> list[str]:
    """The dict-valued columns of a frame (stored as JSON text)."""
    return [c for c, kind in column_kinds(RECORD_TYPES[table]).items() if kind == "json"]


def write_parquet_dir(run: Run, directory: Path) -> dict[str, int]:
    """Write one Parquet file per non-empty frame plus ``meta.json`` into ``directory``
    (which must exist); returns rows written per table."""
    tables: dict[str, dict[str, Any]] = {}
    nonempty = [t for t in RECORD_TYPES if len(getattr(run, t))]
    with progress("writing parquet", len(nonempty)) as advance:
        for table in nonempty:
            frame = getattr(run, table).copy()
            jsons = json_columns(table)
            for column in jsons:
                frame[column] = [
                    json.dumps(json_safe(v or {}), separators=(",", ":")) for v in frame[column]
                ]
            arrow = pa.Table.from_pandas(frame, preserve_index=False)
            pq.write_table(arrow, directory / f"{table}.parquet", compression=COMPRESSION)
            tables[table] = {"file": f"{table}.parquet", "rows": len(frame),
                             "json_columns": jsons}  # fmt: skip
            advance()
    document = {"format": FORMAT, "version": VERSION, "run": json_safe(run.meta.to_dict()),
                "tables": tables}  # fmt: skip
    (directory / "meta.json").write_text(json.dumps(document, indent=2) + "\n", encoding="utf-8")
    return {t: info["rows"] for t, info in tables.items()}


def is_parquet_export(directory: Path) -> bool:
    """True when ``directory`` holds a gpuprof Parquet export (its meta.json says so)."""
    try:
        document = json.loads((directory / "meta.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    return isinstance(document, dict) and document.get("format") == FORMAT


def read_parquet_run(directory: Path) -> Run:
    """A `Run` back from a Parquet export (missing frames are empty; ``attrs`` are dicts)."""
    document = json.loads((Path(directory) / "meta.json").read_text(encoding="utf-8"))
    frames = {}
    for table, record_type in RECORD_TYPES.items():
        info = document.get("tables", {}).get(table)
        if not info:
            frames[table] = empty_frame(record_type)
            continue
        frame = pd.read_parquet(Path(directory) / info["file"])
        for column in info.get("json_columns", []):
            frame[column] = [json.loads(v) if v else {} for v in frame[column]]
        frames[table] = frame
    return Run(meta=RunMeta.from_dict(document.get("run", {})), **frames)
