"""Adapters that map training frameworks' own timers and callbacks onto gpuprof phases.

One module per framework — `trl` (and any transformers ``Trainer``), `swift` (ms-swift),
`verl`, `openrlhf` — plus `collectives` (torch.distributed). Each has an explicit
``install()`` for code that imports gpuprof itself, and an ``on_import(module)`` that the
zero-code bootstrap (``bootstrap/sitecustomize.py``, put on the command's ``PYTHONPATH`` by
``gpuprof watch``) calls as the framework's modules are imported.
"""

from __future__ import annotations

from pathlib import Path


def bootstrap_dir() -> str:
    """The directory holding the bootstrap ``sitecustomize.py`` (for ``PYTHONPATH``)."""
    return str(Path(__file__).resolve().parent / "bootstrap")
