"""pytest fixtures for the simulated NVML library.

Use them from a test module (``from simnvml.fixtures import simnvml_build, simnvml_lib,
simnvml``) or from a conftest (``pytest_plugins = ["simnvml.fixtures"]``). Builds are cached in
pytest's cache directory by source hash, so each variant compiles once, not once per run.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest

from . import (
    SCENARIO_ENV,
    build_library,
    call_count,
    unavailable_reason,
    use_in_process,
    write_scenario,
)


@pytest.fixture(scope="session")
def simnvml_build(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Callable[..., Path]:
    """``build(without=()) -> Path`` of a cached ``libnvidia-ml.so.1``; skips without gcc/nvml.h.

    Builds go to pytest's cache directory (kept between runs) or, with the cache plugin
    disabled, to this session's temporary directory.
    """
    reason = unavailable_reason()
    if reason:
        pytest.skip(reason)
    cache = getattr(request.config, "cache", None)
    if cache is not None:
        cache_dir = Path(cache.mkdir("simnvml"))
    else:
        cache_dir = tmp_path_factory.mktemp("simnvml")

    def build(without: tuple[str, ...] = ()) -> Path:
        return build_library(cache_dir, without=without)

    return build


@pytest.fixture(scope="session")
def simnvml_lib(simnvml_build: Callable[..., Path]) -> Path:
    """The full simulated library (every function the collectors use)."""
    return simnvml_build()


class SimNvml:
    """The simulated library loaded into this process's pynvml, with a scenario to switch."""

    def __init__(self, library: Path, tmp_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
        self.library = library
        self._tmp_dir = tmp_dir
        self._monkeypatch = monkeypatch
        self._count = 0

    def use(self, scenario: Mapping[str, Any]) -> Path:
        """Write ``scenario`` and point the library at it; it is read at the next nvmlInit."""
        self._count += 1
        path = write_scenario(self._tmp_dir / f"scenario-{self._count}.txt", scenario)
        self._monkeypatch.setenv(SCENARIO_ENV, str(path))
        return path

    def calls(self, function: str) -> int:
        """How often the NVML ``function`` was called since the last nvmlInit."""
        return call_count(self.library, function)


@pytest.fixture
def simnvml(
    simnvml_lib: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[SimNvml]:
    """pynvml in this process uses the simulated library for the duration of the test."""
    with use_in_process(simnvml_lib):
        yield SimNvml(simnvml_lib, tmp_path, monkeypatch)
