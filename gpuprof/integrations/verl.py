"""verl: ``marked_timer`` / ``simple_timer`` spans, step boundaries and config knobs.

verl times every phase of its PPO/GRPO loop (inside the Ray ``TaskRunner``) with
``with marked_timer("gen", timing_raw): …`` — ``gen``, ``reward``, ``old_log_prob``, ``ref``,
``values``, ``adv``, ``update_actor``, ``update_weights``, ``testing``, ``save_checkpoint``, and
``step`` around them all. The timers live in ``verl.utils.profiler.performance`` (newer),
``verl.utils.profiler.nvtx_profile`` / ``mstx_profile`` (picked on GPU / NPU machines) and
``verl.utils.debug.performance`` (older); trainers import them by name (``from
verl.utils.debug import marked_timer``), so besides replacing them where they are defined,
every already-imported ``verl`` module's reference is rebound, and the bootstrap rebinds
modules imported later (`on_import`).

The ``step`` timer becomes the step boundary (``gpuprof.begin_step`` / ``gpuprof.step`` with
the trainer's ``global_steps`` when it can be read) instead of a span. Knob values come from
the trainer's config (``RayPPOTrainer.__init__``), which also holds what a YAML file set.
What verl prints (``step:N - timing_s/gen:…``) reaches the run as output lines of the
watched command.
"""

from __future__ import annotations

import contextlib
import inspect
import sys
from typing import Any

from gpuprof import hooks
from gpuprof.frameworks.verl import TIMER_PHASES as VERL_PHASES
from gpuprof.integrations._patch import (
    Both,
    Tracker,
    mark_wrapper,
    modules_under,
    read_knobs,
    rebind,
    safely,
    version_of,
    wrap_method,
)

TIMER_NAMES = ("marked_timer", "simple_timer", "_timer")
TIMER_MODULES = (
    "verl.utils.profiler.performance",
    "verl.utils.profiler.nvtx_profile",
    "verl.utils.profiler.mstx_profile",
    "verl.utils.debug.performance",
    "verl.trainer.ppo.ray_trainer",  # verl <= 0.3 defined _timer here
)

tracker = Tracker("verl", VERL_PHASES)
_replacements: dict[int, tuple[Any, Any]] = {}
_trainer_steps: list[Any] = []  # the trainer whose global_steps numbers the steps


class _StepBoundary:
    """verl's ``step`` timer: the step's start and end, numbered by ``global_steps``."""

    __slots__ = ()

    def __enter__(self) -> _StepBoundary:
        hooks.begin_step()
        return self

    def __exit__(self, *exc: Any) -> bool:
        n = None
        if _trainer_steps:
            value = getattr(_trainer_steps[-1], "global_steps", None)
            n = value if isinstance(value, int) else None
        hooks.step(n=n)
        return False


def _wrap_timer(fn: Any) -> Any:
    def timer(name: Any, *args: Any, **kwargs: Any) -> Any:
        text = str(name)  # verl passes Role enums too (str(Role.RefPolicy) == "ref")
        outer = _StepBoundary() if text == "step" else tracker.span(text)
        return Both(outer, fn(name, *args, **kwargs))

    return mark_wrapper(timer, fn)


def patch_timers(module: Any) -> int:
    """Wrap the timers ``module`` defines; returns how many."""
    count = 0
    for attr in TIMER_NAMES:
        fn = vars(module).get(attr)
        if fn is None or not callable(fn) or getattr(fn, "__module__", None) != module.__name__:
            continue
        if hasattr(fn, "__gpuprof_original__") or inspect.isgeneratorfunction(fn):
            continue  # a bare generator (verl's inner ``_timer``) is used with ``yield from``
        wrapper = _wrap_timer(fn)
        setattr(module, attr, wrapper)
        _replacements[id(fn)] = (fn, wrapper)
        count += 1
    return count


def _patch_trainer(module: Any) -> None:
    cls = getattr(module, "RayPPOTrainer", None)
    if cls is None:
        return

    def make(init: Any) -> Any:
        def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
            init(self, *args, **kwargs)
            _trainer_steps[:] = [self]
            config = getattr(self, "config", None)
            if config is not None and hooks.enabled():
                hooks.record_knobs("verl", read_knobs("verl", config), version_of("verl"))

        return __init__

    wrap_method(cls, "__init__", make)


def on_import(module: Any) -> None:
    """Bootstrap entry: called for every ``verl`` module as it is imported."""
    name = module.__name__
    if name in TIMER_MODULES:
        safely("verl", lambda: patch_timers(module))
    if name == "verl.trainer.ppo.ray_trainer":
        safely("verl", lambda: _patch_trainer(module))
    if _replacements:
        with contextlib.suppress(Exception):
            rebind([module], _replacements)


def install() -> int:
    """Patch the verl modules already imported (the explicit API); returns the number of
    timers now recorded."""
    for name in TIMER_MODULES:
        module = sys.modules.get(name)
        if module is not None:
            safely("verl", lambda m=module: patch_timers(m))
    trainer = sys.modules.get("verl.trainer.ppo.ray_trainer")
    if trainer is not None:
        safely("verl", lambda: _patch_trainer(trainer))
    safely("verl", lambda: rebind(modules_under("verl"), _replacements))
    return len(_replacements)
