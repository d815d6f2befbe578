"""Importers: files users already have (nvidia-smi logs, DCGM scrapes, PyTorch-profiler traces,
framework logs) turned into parts of a `Run`.

Each importer is a module of this package with three names:

- ``FORMAT``: a short name (``"nvidia-smi-csv"``, ``"kineto"``, ``"verl-log"``…);
- ``sniff(head: str, path: Path) -> bool``: whether a file whose first 64 KiB of text (decoded
  by `read_head`) is ``head`` is in this format — cheap, and never raises;
- ``parse(path: Path) -> Imported``: the whole file; raises `ImportFormatError` with one line
  naming the file (and the line where known) for malformed input, and nothing else.

An importer whose input can be a directory (an experiment tracker's run: ``wandb/run-*/``,
an ``mlruns/`` tree, a TensorBoard log directory) also has ``sniff_dir(path: Path) -> bool``;
one whose input can be a tracker URI that names no file (MLflow's ``runs:/<run id>``) has
``sniff_uri(text: str) -> bool``. Its ``parse`` then takes that directory or URI as ``path``.

`IMPORTERS` lists the modules in the order `detect` tries them (specific formats first). The
`gpuprof import` command (``api.import_files``) detects each file's format, parses it and merges
the parts into one run directory.
"""

from __future__ import annotations

import codecs
import gzip
import importlib
import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any

import pandas as pd

ANSI = re.compile(r"\x1b\[[0-9;?]*[ -/]*[@-~]|\x1b[@-_]")
"""A terminal's colour and cursor codes, as Ray, rich and tqdm print them."""

HEAD_BYTES = 64 * 1024

IMPORTERS: tuple[str, ...] = (
    # experiment trackers: sniffed by file name / directory layout, so they go first
    "wandb_run",
    "mlflow_run",
    "tensorboard_events",
    "wandb_history",
    "kineto",
    "dcgm",
    "nvidia_smi_dmon",
    "smi_display",
    "nvidia_smi",
    "openrlhf_log",
    "megatron_log",
    "verl_jsonl",
    "swift_log",
    "verl_log",
    "trl_log",
    "phase_table",
    "step_timings",
    "progress_log",
    "plain_log",
)
"""Module names (within this package) in detection order; each importer adds itself here.

A module may set ``LATE = True``: its records can start anywhere in a file (a framework's
step lines after thousands of lines of start-up chatter), so when no importer recognises the
first `HEAD_BYTES`, `detect` streams the rest of the file through its ``sniff``. A module
with ``WEAK = True`` reads what more specific formats also hold (any per-step timing, a tqdm
bar, timestamped messages): it is tried only after every other one has seen the whole file.
"""

STREAM_CHUNK_BYTES = 4 * 1024 * 1024
"""Bytes of a file past its head that `detect` hands the sniffers at a time (each chunk
starts with the last `HEAD_BYTES` of the one before, so a record cut by a chunk's end is
whole in the next)."""


class ImportFormatError(Exception):
    """A file that can't be imported; the message is one line: ``path[:line]: reason``."""


@dataclass
class Imported:
    """What one file contributed to a run.

    ``frames``: table name (``gpu``, ``host``, ``procs``, ``gpu_procs``, ``spans``, ``events``,
    ``logs``) → frame whose columns are the matching record's fields (`gpuprof.model`); missing
    values NaN/None. ``meta``: `RunMeta` fields the file tells (``framework``, ``knobs``,
    ``command``, ``hosts``, ``gpus``, ``start_ns``, ``end_ns``…). ``anchored``: False when the
    file has no wall-clock times (a console log without timestamps: its spans start at 0 and
    only their durations and order are real). ``notes``: facts worth telling the user.
    """

    source: Path
    format: str
    frames: dict[str, pd.DataFrame] = field(default_factory=dict)
    meta: dict[str, Any] = field(default_factory=dict)
    anchored: bool = True
    notes: list[str] = field(default_factory=list)


def open_text(path: Path) -> str:
    """The whole file as text: gzip undone, UTF-8/UTF-16 (with BOM) decoded, errors replaced.

    Raises `ImportFormatError` when the file can't be read.
    """
    try:
        raw = path.read_bytes()
        if raw[:2] == b"\x1f\x8b":
            raw = gzip.decompress(raw)
    except (OSError, EOFError, gzip.BadGzipFile) as exc:
        raise ImportFormatError(f"{path}: cannot read ({exc})") from None
    return _decode(raw)


def read_head(path: Path) -> str:
    """The first `HEAD_BYTES` of a file as text (gzip undone), for `sniff`; "" when unreadable."""
    try:
        with path.open("rb") as fh:
            raw = fh.read(2)
            fh.seek(0)
            if raw == b"\x1f\x8b":
                with gzip.open(fh) as gz:
                    raw = gz.read(HEAD_BYTES)
            else:
                raw = fh.read(HEAD_BYTES)
    except (OSError, EOFError, gzip.BadGzipFile):
        return ""
    return _decode(raw)


def _decode(raw: bytes) -> str:
    if raw.startswith(codecs.BOM_UTF8):
        return raw[3:].decode("utf-8", errors="replace")
    if raw.startswith((codecs.BOM_UTF16_LE, codecs.BOM_UTF16_BE)):
        return raw.decode("utf-16", errors="replace")
    return raw.decode("utf-8", errors="replace")


def modules() -> list[ModuleType]:
    """The importer modules, in detection order."""
    return [importlib.import_module(f"{__name__}.{name}") for name in IMPORTERS]


def detect(path: Path) -> ModuleType:
    """The importer for ``path``; raises `ImportFormatError` when no importer recognises it.

    Format detection looks as far as it takes: the head first, with every importer but the
    weak ones; then the rest of the file, streamed, with the importers whose records may start
    late (``LATE``); then the weak ones (``WEAK``) on the head and on the rest.
    """
    # a coloured terminal capture is the same format as a plain one
    head = ANSI.sub("", read_head(path))
    every = modules()
    strong = [m for m in every if not getattr(m, "WEAK", False)]
    weak = [m for m in every if getattr(m, "WEAK", False)]
    late = [m for m in strong if getattr(m, "LATE", False)]
    found = _first_sniffing(strong, head, path)
    if found is None and late:
        found = next((m for chunk in _rest(path) if (m := _first_sniffing(late, chunk, path))),
                     None)  # fmt: skip
    if found is None:
        found = _first_sniffing(weak, head, path)
    if found is None:
        found = next((m for chunk in _rest(path) if (m := _first_sniffing(weak, chunk, path))),
                     None)  # fmt: skip
    if found is None:
        raise ImportFormatError(f"{path}: format not recognised")
    return found


def _first_sniffing(candidates: list[ModuleType], text: str, path: Path) -> ModuleType | None:
    for module in candidates:
        try:
            if module.sniff(text, path):
                return module
        except Exception:  # a sniffer must never break detection of the others
            continue
    return None


def _rest(path: Path) -> Iterator[str]:
    """The file past its first `HEAD_BYTES`, as text chunks of `STREAM_CHUNK_BYTES` (gzip
    undone, ANSI codes removed), each beginning with the end of the one before; nothing when
    the file is no longer than its head or can't be read."""
    decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
    try:
        with path.open("rb") as raw:
            zipped = raw.read(2) == b"\x1f\x8b"
            raw.seek(0)
            fh = gzip.GzipFile(fileobj=raw) if zipped else raw
            head = fh.read(HEAD_BYTES)
            if len(head) < HEAD_BYTES:
                return
            tail = ANSI.sub("", decoder.decode(head))[-HEAD_BYTES:]
            while chunk := fh.read(STREAM_CHUNK_BYTES):
                text = ANSI.sub("", decoder.decode(chunk))
                yield tail + text
                tail = text[-HEAD_BYTES:]
    except (OSError, EOFError, gzip.BadGzipFile):
        return


def detect_dir(path: Path) -> ModuleType:
    """The importer for the directory ``path`` (a tracker's run); `ImportFormatError` when no
    importer recognises it."""
    for module in modules():
        sniff_dir = getattr(module, "sniff_dir", None)
        if sniff_dir is None:
            continue
        try:
            if sniff_dir(path):
                return module
        except Exception:  # a sniffer must never break detection of the others
            continue
    raise ImportFormatError(
        f"{path}: a directory with no W&B run, MLflow run or TensorBoard event files in it"
    )


def detect_uri(text: str) -> ModuleType | None:
    """The importer for a tracker URI that names no file (``runs:/<id>``); None for none."""
    for module in modules():
        sniff_uri = getattr(module, "sniff_uri", None)
        try:
            if sniff_uri is not None and sniff_uri(text):
                return module
        except Exception:
            continue
    return None
