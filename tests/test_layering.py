"""Dependencies point one way: collectors → model ← analyzers ← reports (DESIGN.md)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parent.parent / "gpuprof"
FORBIDDEN = {
    # the simulator is ground truth for tests and the demo: analysis must not lean on it
    "analyzers": {"pynvml", "psutil", "torch", "sqlite3", "gpuprof.collectors", "gpuprof.store",
                  "gpuprof.reports", "gpuprof.hooks", "gpuprof.api", "gpuprof.cli", "gpuprof.sim"},
    "reports": {"pynvml", "psutil", "torch", "sqlite3", "gpuprof.collectors", "gpuprof.hooks",
                "gpuprof.sim"},
    "model.py": {"pynvml", "psutil", "torch", "sqlite3", "gpuprof"},
    # one module per framework: data the importer, integration, recommender and simulator share
    "frameworks": {"pynvml", "psutil", "torch", "sqlite3", "gpuprof.collectors", "gpuprof.store",
                   "gpuprof.analyzers", "gpuprof.reports", "gpuprof.integrations", "gpuprof.sim",
                   "gpuprof.hooks", "gpuprof.api", "gpuprof.cli"},
}  # fmt: skip


def imported_modules(path: Path) -> set[str]:
    names = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
    return names


def _violations(path: Path, forbidden: set[str]) -> list[str]:
    return sorted(
        name
        for name in imported_modules(path)
        if any(name == f or name.startswith(f + ".") for f in forbidden)
        and not (path.name == "model.py" and name.startswith("gpuprof.model"))
    )


@pytest.mark.parametrize("part", sorted(FORBIDDEN))
def test_layer_imports_nothing_it_must_not(part):
    target = PACKAGE / part
    files = sorted(target.rglob("*.py")) if target.is_dir() else [target]
    assert files
    bad = {str(f.relative_to(PACKAGE)): v for f in files if (v := _violations(f, FORBIDDEN[part]))}
    assert bad == {}
