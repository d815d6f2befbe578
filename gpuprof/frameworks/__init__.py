"""One module per framework: the names its timers, profiling contexts and logs give phases,
its rows of the knob catalogue, and how the simulator spells its settings. The importers, the
integrations, the recommender and the simulator all read them from here, so a framework's
names live in one place.
"""

from __future__ import annotations

from types import ModuleType

from gpuprof.frameworks import openrlhf, pytorch, swift, trl, verl

MODULES: dict[str, ModuleType] = {
    "verl": verl,
    "trl": trl,
    "swift": swift,
    "openrlhf": openrlhf,
    "pytorch": pytorch,
}
FRAMEWORKS: tuple[str, ...] = tuple(MODULES)
"""Frameworks the catalogue covers; ``pytorch`` is also the fallback for the others."""


def framework_module(name: str) -> ModuleType:
    """The module of a framework (``KeyError`` for an unknown one)."""
    return MODULES[name]
