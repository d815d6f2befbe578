"""ms-swift: the ``profiling_context`` of its GRPO / GKD trainers.

ms-swift times its RL trainers' phases with ``profiling_context(trainer, name)`` and
``@profiling_decorator`` from ``swift.rlhf_trainers.utils`` (ms-swift 4; ``swift.trainers.
rlhf_trainer.utils`` in ms-swift 3). The decorator looks ``profiling_context`` up in its module
at each call; trainer modules that did ``from …utils import profiling_context`` hold their own
reference, which is rebound here and, under ``gpuprof watch``, in every ``swift`` module
imported later. Its trainers are transformers ``Trainer`` subclasses, so step boundaries, the
update and the knob values (``vllm_gpu_memory_utilization``, ``sleep_level``…) come from
`gpuprof.integrations.trl.GpuprofCallback`, attached with framework ``swift``.
"""

from __future__ import annotations

import contextlib
import sys
from typing import Any

from gpuprof.frameworks.swift import PROFILING_PHASES as SWIFT_PHASES
from gpuprof.integrations._patch import (
    Both,
    Tracker,
    mark_wrapper,
    modules_under,
    rebind,
    safely,
)

UTILS_MODULES = ("swift.rlhf_trainers.utils", "swift.trainers.rlhf_trainer.utils")
TRAINER_MODULES = ("swift.rlhf_trainers.grpo_trainer", "swift.trainers.rlhf_trainer.grpo_trainer")

tracker = Tracker("swift", SWIFT_PHASES)
_replacements: dict[int, tuple[Any, Any]] = {}


def patch_utils(module: Any) -> bool:
    """Wrap ``module.profiling_context``; False when it has none or it is wrapped already."""
    fn = vars(module).get("profiling_context")
    if fn is None or not callable(fn) or hasattr(fn, "__gpuprof_original__"):
        return False

    def profiling_context(trainer: Any, name: str, *args: Any, **kwargs: Any) -> Any:
        label = f"{type(trainer).__name__}.{name}" if trainer is not None else str(name)
        return Both(tracker.span(label, str(name)), fn(trainer, name, *args, **kwargs))

    wrapper = mark_wrapper(profiling_context, fn)
    module.profiling_context = wrapper
    _replacements[id(fn)] = (fn, wrapper)
    return True


def _patch_trainer(module: Any) -> None:
    from gpuprof.integrations.trl import patch_logprob_passes

    patch_logprob_passes(module, tracker)


def on_import(module: Any) -> None:
    """Bootstrap entry: called for every ``swift`` module as it is imported."""
    if module.__name__ in UTILS_MODULES:
        safely("ms-swift", lambda: patch_utils(module))
    if module.__name__ in TRAINER_MODULES:
        safely("ms-swift", lambda: _patch_trainer(module))
    if _replacements:
        with contextlib.suppress(Exception):
            rebind([module], _replacements)


def install() -> bool:
    """Patch the ms-swift modules already imported (the explicit API); True when one
    ``profiling_context`` is now recorded."""
    for name in UTILS_MODULES:
        module = sys.modules.get(name)
        if module is not None:
            safely("ms-swift", lambda m=module: patch_utils(m))
    for name in TRAINER_MODULES:
        module = sys.modules.get(name)
        if module is not None:
            safely("ms-swift", lambda m=module: _patch_trainer(m))
    safely("ms-swift", lambda: rebind(modules_under("swift"), _replacements))
    return bool(_replacements)
