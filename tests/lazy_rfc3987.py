"""rfc3987_syntax with its grammar built at its first use instead of at import, for the tests'
Ray processes.

Ray imports jsonschema, which imports rfc3987_syntax where it is installed (here, for Jupyter's
sake), which compiles a grammar at import: 1-3 s of CPU in each of Ray's Python processes
(driver, agents, workers), most of the cost of starting Ray and its workers on two cores, and
enough for Ray's fixed 30 s wait for a raylet to run out on a loaded machine. The package
written here, put first on a process's path, loads the installed one's modules at the first
use of its grammar (never, in these processes): same behaviour, same module.
"""

from __future__ import annotations

import os
import textwrap
from pathlib import Path

import pytest

PACKAGE = textwrap.dedent(
    '''
    """rfc3987_syntax with its grammar built at its first use instead of at import."""
    import os, sys

    __path__.extend(p for p in (os.path.join(e or ".", "rfc3987_syntax") for e in sys.path)
                    if os.path.isfile(os.path.join(p, "syntax_helpers.py")))
    if len(__path__) == 1:
        raise ImportError("rfc3987_syntax is not installed")

    def is_valid_syntax(term, value):
        from .syntax_helpers import is_valid_syntax

        return is_valid_syntax(term, value)

    def __getattr__(name):
        from . import syntax_helpers

        return getattr(syntax_helpers, name)
    '''
)


def lazy_imports(directory: Path | str) -> str:
    """``directory`` with the deferring package in it: a directory to put first on the
    ``PYTHONPATH`` of the processes that import Ray."""
    package = Path(directory) / "rfc3987_syntax"
    package.mkdir(parents=True, exist_ok=True)
    (package / "__init__.py").write_text(PACKAGE)
    return str(directory)


def first_on_path(directory: str, path: str | None) -> str:
    """``directory`` ahead of ``path`` (a ``PYTHONPATH``; none: ``directory`` alone)."""
    return os.pathsep.join(filter(None, [directory, path]))


def defer_here(directory: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The deferring package first on this process's path and on the ``PYTHONPATH`` of what it
    starts (a local Ray's raylet and workers inherit it), for one test."""
    found = lazy_imports(directory)
    monkeypatch.setenv("PYTHONPATH", first_on_path(found, os.environ.get("PYTHONPATH")))
    monkeypatch.syspath_prepend(found)
