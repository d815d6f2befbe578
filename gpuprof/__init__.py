"""gpuprof: where do my GPU-seconds go in RL post-training, why, and which knob do I turn.

The in-process API is re-exported here::

    import gpuprof

    with gpuprof.phase("rollout"):
        ...
    gpuprof.step(tokens=n_tokens)
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from gpuprof.hooks import enabled, flush, init, mark, phase, shutdown, step

__version__ = "0.1.0"

__all__ = ["__version__", "enabled", "flush", "init", "mark", "phase", "shutdown", "step"]

_HOOKS = frozenset(__all__) - {"__version__"}


def __getattr__(name: str) -> Any:
    # The hooks (and the store behind them, with pandas and pyarrow) load at the first use of
    # `gpuprof.phase` & co., not at `import gpuprof`: a process that imports only a part of
    # gpuprof (the sampler gpuprof places on each Ray node) starts without them.
    if name in _HOOKS:
        value = getattr(importlib.import_module("gpuprof.hooks"), name)
        globals()[name] = value
        return value
    if name == "hooks":
        return importlib.import_module("gpuprof.hooks")
    raise AttributeError(f"module 'gpuprof' has no attribute {name!r}")
