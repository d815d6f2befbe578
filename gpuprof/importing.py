"""`gpuprof import`: turn files users already have into one run directory.

Each file's format is detected (`gpuprof.collectors.importers.detect`), the file is parsed into an
`Imported` part, and the parts are merged into one `Run` (GPU samples from one file, phases from
another):

- frames are concatenated table by table;
- metadata is united: framework and knobs from whichever file has them (the first, when
  several do), hosts and GPUs from all, start/end from the parts anchored in wall-clock time;
- host names: when every file describes one machine and at most one file names its host, the
  files are taken as one machine under that name (the GPU log's stand-in name otherwise), so a
  framework log's phases land on the GPUs of the nvidia-smi log imported with it — unless two
  files hold samples of the same GPU index, which means they came from different machines;
- parts without wall-clock times (``anchored`` False: a console log's spans start at 0) are
  shifted to start where the anchored parts' data starts, with a note that this alignment is
  approximate; with nothing anchored they stay at 0, also noted.

The run is written into a temporary directory beside the output and renamed into place, so a
failure at any point leaves nothing behind.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import shutil
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from gpuprof import __version__, store
from gpuprof.collectors.importers import (
    Imported,
    ImportFormatError,
    detect,
    detect_dir,
    detect_uri,
    nvidia_smi,
    plain_log,
)
from gpuprof.model import RECORD_TYPES, Run, RunMeta, column_kinds, columns, empty_frame

TIME_COLUMNS: dict[str, tuple[str, ...]] = {
    "spans": ("start_ns", "end_ns", "gpu_start_ns", "gpu_end_ns"),
}
"""Integer-ns time columns of each table (``t_ns`` for the tables not listed)."""

Advance = Callable[..., None]
"""``advance(n)``: ``n`` more bytes of input done (a progress bar's callback)."""


def _time_columns(table: str) -> tuple[str, ...]:
    return TIME_COLUMNS.get(table, ("t_ns",))


def parse_file(
    path: Path,
    fields: str | Sequence[str] | None = None,
    phases: Mapping[str, str] | None = None,
) -> Imported:
    """Detect a file's format and parse it; `ImportFormatError` (one line) when it can't be.

    ``path`` may also be a tracker run's directory (`detect_dir`) or a tracker URI that names
    no file, such as MLflow's ``runs:/<run id>`` (`detect_uri`). ``fields``: the columns of a
    header-less nvidia-smi capture (``--fields``); a file no format recognises is then read
    as one.

    ``phases`` (``--phase``: phase name → Python regex, the first starting each step): every
    text log among the files — one no format recognises, or a framework console log
    (`plain_log.LOG_FORMATS`: verl, TRL, OpenRLHF, Megatron, tqdm/DeepSpeed, step timings),
    even one that format would read — is read by `plain_log.parse` with these patterns (which
    refuses a file that is no text log); GPU metrics, traces and tracker runs are read as
    usual.
    """
    if not path.exists():
        module = detect_uri(str(path))
        if module is None:
            raise ImportFormatError(f"{path}: no such file")
    elif path.is_dir():
        module = detect_dir(path)
    elif not path.is_file():
        raise ImportFormatError(f"{path}: not a file")
    else:
        try:
            module = detect(path)
        except ImportFormatError:
            if fields is None and not phases:
                raise
            module = nvidia_smi if fields is not None else plain_log
        if phases and module.FORMAT in plain_log.LOG_FORMATS:
            module = plain_log  # --phase names the phases: the patterns read the log
    try:
        if phases and module is plain_log:
            return plain_log.parse(path, phases=phases)
        if fields is not None and module is nvidia_smi:
            return nvidia_smi.parse(path, fields=fields)
        return module.parse(path)
    except ImportFormatError:
        raise
    except Exception as exc:  # an importer bug must still end in one line naming the file
        raise ImportFormatError(
            f"{path}: cannot import as {module.FORMAT} ({type(exc).__name__}: {exc})"
        ) from None


def _frame_hosts(part: Imported) -> set[str]:
    hosts: set[str] = set()
    for frame in part.frames.values():
        if len(frame) and "host" in frame:
            hosts.update(str(h) for h in frame["host"].dropna().unique())
    hosts.update(str(g["host"]) for g in part.meta.get("gpus", []) if g.get("host") is not None)
    return hosts


def _gpu_indices(part: Imported) -> set[int]:
    """GPU indices a part has samples of or lists in its inventory."""
    found = {int(g["index"]) for g in part.meta.get("gpus", []) if g.get("index") is not None}
    gpu = part.frames.get("gpu")
    if gpu is not None and len(gpu):
        found.update(int(g) for g in gpu["gpu"].dropna().unique())
    return found


def _one_host(parts: list[Imported]) -> tuple[str, list[str]] | None:
    """The single host all parts are taken as, and the stand-in names it replaces; None when
    the parts describe several machines (see the module doc)."""
    per_part = [_frame_hosts(p) for p in parts]
    if any(len(h) > 1 for h in per_part):
        return None
    told = {h for p in parts for h in p.meta.get("hosts", [])}
    if len(told) > 1:
        return None
    seen_gpus: set[int] = set()
    for part in parts:
        gpus = _gpu_indices(part)
        if gpus & seen_gpus:
            return None
        seen_gpus |= gpus
    hosts = [next(iter(h)) for h in per_part if h]
    if len(set(hosts)) <= 1:
        return None
    if told:
        target = next(iter(told))
    else:
        with_gpus = [next(iter(h)) for p, h in zip(parts, per_part) if h and _gpu_indices(p)]
        target = (with_gpus or hosts)[0]
    return target, sorted(set(hosts) - {target})


def _rename_host(part: Imported, target: str) -> None:
    for name, frame in part.frames.items():
        if len(frame) and "host" in frame:
            frame = frame.copy()
            frame["host"] = target
            part.frames[name] = frame
    for gpu in part.meta.get("gpus", []):
        gpu["host"] = target


def _data_range(part: Imported) -> tuple[int, int] | None:
    """(first, last) instant of a part's data in ns, from its frames (else its meta)."""
    lows, highs = [], []
    for table, frame in part.frames.items():
        for col in _time_columns(table):
            if col in frame and len(frame):
                values = pd.to_numeric(frame[col], errors="coerce").dropna()
                if len(values):
                    lows.append(int(values.min()))
                    highs.append(int(values.max()))
    if not lows:
        start, end = part.meta.get("start_ns"), part.meta.get("end_ns")
        if start is None:
            return None
        return int(start), int(end if end is not None else start)
    return min(lows), max(highs)


def _shift(part: Imported, by_ns: int) -> None:
    """Move every time of an unanchored part by ``by_ns``."""
    for table, frame in list(part.frames.items()):
        cols = [c for c in _time_columns(table) if c in frame]
        if not cols or not len(frame):
            continue
        frame = frame.copy()
        for col in cols:
            values = frame[col]
            if pd.api.types.is_integer_dtype(values.dtype):
                frame[col] = values + by_ns
            else:  # nullable times (gpu_start_ns): keep the gaps, keep integers exact
                frame[col] = pd.array(values, dtype="Int64") + by_ns
        part.frames[table] = frame
    for key in ("start_ns", "end_ns"):
        if part.meta.get(key) is not None:
            part.meta[key] = int(part.meta[key]) + by_ns


def _conform(table: str, frame: pd.DataFrame) -> pd.DataFrame:
    """A part's frame with exactly the table's columns, in order, with the model's dtypes."""
    record = RECORD_TYPES[table]
    kinds = column_kinds(record)
    out = {}
    for name in columns(record):
        col = frame[name] if name in frame else pd.Series([None] * len(frame), index=frame.index)
        kind = kinds[name]
        if kind == "json":
            out[name] = col.map(lambda v: v if isinstance(v, dict) else {})
        elif kind == "int":
            if pd.api.types.is_integer_dtype(col.dtype) and not col.isna().any():
                out[name] = col.astype(np.int64)
            else:
                out[name] = pd.array(pd.to_numeric(col, errors="coerce"), dtype="Int64")
        elif kind == "float":
            out[name] = pd.to_numeric(col, errors="coerce").astype(np.float64)
        elif kind == "bool":
            out[name] = col.fillna(False).astype(bool)
        else:
            out[name] = col.astype(object).where(col.notna(), None)
    return pd.DataFrame(out).reset_index(drop=True)


def merge(parts: Sequence[Imported], run_id: str, command: list[str]) -> Run:
    """One `Run` from the parts of several files (see the module doc for the rules)."""
    parts = list(parts)
    notices: list[str] = []
    for part in parts:
        notices.extend(f"{part.source.name}: {note}" for note in part.notes)

    one = _one_host(parts)
    if one is not None:
        target, renamed = one
        for part in parts:
            _rename_host(part, target)
        notices.append(
            f"all files taken as one machine, {target!r} (stand-in names {', '.join(renamed)})"
        )

    anchored = [p for p in parts if p.anchored and _data_range(p) is not None]
    ranges = [r for r in map(_data_range, anchored) if r is not None]
    anchor = min(r[0] for r in ranges) if ranges else None
    for part in parts:
        if part.anchored:
            continue
        if anchor is None:
            notices.append(
                f"{part.source.name}: no wall-clock times and nothing else anchors them: "
                "times count from the start of the file"
            )
            continue
        first = _data_range(part)
        if first is not None:
            _shift(part, anchor - first[0])
        notices.append(
            f"{part.source.name}: no wall-clock times: placed to start with the other files' "
            "data (approximate alignment)"
        )

    meta = RunMeta(
        run_id=run_id,
        command=command,
        cwd=os.getcwd(),
        gpuprof_version=__version__,
        notices=notices,
    )
    hosts: set[str] = set()
    gpus: dict[tuple[str, int], dict[str, Any]] = {}
    intervals = []
    for part in parts:
        pm = part.meta
        if pm.get("framework") and meta.framework is None:
            meta.framework = pm["framework"]
        elif pm.get("framework") and pm["framework"] != meta.framework:
            notices.append(
                f"{part.source.name}: framework {pm['framework']} ignored ({meta.framework} "
                "came first)"
            )
        for key, value in (pm.get("knobs") or {}).items():
            meta.knobs.setdefault(key, value)
        for gpu in pm.get("gpus", []):
            if gpu.get("index") is None:
                continue
            key = (str(gpu.get("host")), int(gpu["index"]))
            gpus.setdefault(key, {}).update({k: v for k, v in gpu.items() if v is not None})
        hosts |= _frame_hosts(part) | set(pm.get("hosts", []))
        if pm.get("interval_s"):
            intervals.append(float(pm["interval_s"]))
        for key in ("driver_version", "nvml_version", "cuda_driver_version"):
            if pm.get(key) is not None and getattr(meta, key) is None:
                setattr(meta, key, pm[key])
    meta.hosts = sorted(hosts)
    meta.gpus = [gpus[k] for k in sorted(gpus)]
    meta.interval_s = min(intervals) if intervals else None
    spans = (r for r in map(_data_range, anchored or parts) if r is not None)
    bounds = list(spans)
    if bounds:
        meta.start_ns = min(b[0] for b in bounds)
        meta.end_ns = max(b[1] for b in bounds)

    tables: dict[str, pd.DataFrame] = {}
    for table in RECORD_TYPES:
        frames = [
            _conform(table, p.frames[table])
            for p in parts
            if table in p.frames and len(p.frames[table])
        ]
        if not frames:
            tables[table] = empty_frame(RECORD_TYPES[table])
            continue
        frame = frames[0] if len(frames) == 1 else pd.concat(frames, ignore_index=True)
        key = "start_ns" if table == "spans" else "t_ns"
        tables[table] = frame.sort_values(key, kind="stable", ignore_index=True)
    return Run(meta=meta, **tables)


def import_files(
    paths: Sequence[str | os.PathLike],
    output: str | os.PathLike,
    *,
    advance: Advance | None = None,
    fields: str | Sequence[str] | None = None,
    phases: Mapping[str, str] | None = None,
) -> Path:
    """Import ``paths`` into the new run directory ``output``; return its path.

    ``advance(n)`` is called with each file's size in bytes once it is parsed (for a progress
    bar). ``fields`` names the columns of header-less nvidia-smi captures among them
    (``"timestamp,index,utilization.gpu"``; see `nvidia_smi.parse`). ``phases``: ``--phase``
    patterns (phase name → Python regex searched in each message; the first starts each
    step): the text logs among the files are read by `plain_log.parse` with them, whatever
    format they would be detected as (see `parse_file`). Raises
    `ImportFormatError` — one line naming the file, and the line where known — for no files,
    an unknown format, a file with nothing usable, or an output that exists and is not empty;
    nothing is written then.
    """
    files = [Path(p) for p in paths]
    if not files:
        raise ImportFormatError("no files to import")
    out = Path(output)
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise ImportFormatError(f"{out}: already exists and is not empty; choose a new -o")
    parts = []
    seen = set()
    for path in files:
        key = path.resolve() if path.exists() else path
        if key in seen:
            continue
        seen.add(key)
        parts.append(parse_file(path, fields, phases))
        if advance is not None:
            with contextlib.suppress(OSError):
                advance(path.stat().st_size)
    names = [p.name for p in files]
    run = merge(parts, run_id=out.name, command=["gpuprof", "import", *names])
    return _write(run, out)


def _write(run: Run, out: Path) -> Path:
    """Save the run in a temporary directory beside ``out`` and rename it into place."""
    parent = out.absolute().parent
    try:
        parent.mkdir(parents=True, exist_ok=True)
        # mkdir, not mkdtemp: the run directory gets the usual permissions (umask), not 0700
        tmp = parent / f".{out.name}.importing-{os.getpid()}-{secrets.token_hex(4)}"
        tmp.mkdir()
    except OSError as exc:
        raise ImportFormatError(f"{out}: cannot create ({exc.strerror or exc})") from None
    try:
        store.save_run(run, tmp)
        os.replace(tmp, out)
    except OSError as exc:
        shutil.rmtree(tmp, ignore_errors=True)
        raise ImportFormatError(f"{out}: cannot write ({exc.strerror or exc})") from None
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return out
