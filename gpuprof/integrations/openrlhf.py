"""OpenRLHF: its trainer methods as phases, its steps, its knobs.

OpenRLHF has no timer to hook: its PPO driver calls methods whose names are the phases
(``SamplesGenerator.generate_samples``, ``RemoteExperienceMaker.make_experience_batch``,
``BasePPOTrainer.ppo_train``, ``broadcast_to_vllm``…) and logs ``Global step N: {…timing/…}``
after each step. The methods in `METHODS` are wrapped where their class is defined; names
that exist only in some versions are skipped. The driver's ``train_step`` ends a step
(numbered by its ``global_step`` argument) and ``generate_samples`` starts one; the
trainer's ``args`` give the knob values. Ray actors (``PolicyModelActor.fit``, the reference,
critic and reward models' ``forward``) are patched in the worker processes they run in, which
inherit the bootstrap from ``gpuprof watch``. The ``Global step`` lines reach the run as the
watched command's output.

``make_experience`` in OpenRLHF 0.9 and later scores samples generated before (reward model,
reference and critic forward passes dispatched to Ray actors) and is kept as a phase of its
own; before 0.9 ``make_experience_list`` also generated and counts as rollout.
"""

from __future__ import annotations

import sys
from typing import Any

from gpuprof import hooks
from gpuprof.frameworks.openrlhf import METHODS
from gpuprof.integrations._patch import (
    Tracker,
    read_knobs,
    safely,
    span_method,
    version_of,
    wrap_method,
)

tracker = Tracker(
    "openrlhf",  # keyed by class and method: the actor's and the critic's ppo_train differ
    {f"{cls}.{method}": phase for rows in METHODS.values() for cls, method, phase in rows},
)


def _real_class(obj: Any) -> Any:
    """The Python class behind a ``@ray.remote`` actor class (the class itself otherwise)."""
    meta = getattr(obj, "__ray_metadata__", None)
    return getattr(meta, "modified_class", None) or obj


def _step_start(fn: Any) -> Any:
    # one wrapper for both jobs: starting the step before generation and the rollout span
    label = "SamplesGenerator.generate_samples"

    def generate_samples(*args: Any, **kwargs: Any) -> Any:
        hooks.begin_step()
        with tracker.span(label, label):
            return fn(*args, **kwargs)

    return generate_samples


def _step_end(fn: Any) -> Any:
    def train_step(self: Any, rollout_samples: Any, global_step: int, *a: Any, **k: Any) -> Any:
        result = fn(self, rollout_samples, global_step, *a, **k)
        attrs: dict[str, Any] = {}
        try:
            status = result[0] if isinstance(result, tuple) else None
            if isinstance(status, dict):
                attrs = {k: float(v) for k, v in status.items() if str(k).startswith("timing/")}
        except Exception:
            attrs = {}
        hooks.step(n=int(global_step), **attrs)
        return result

    return train_step


def _knobs_after_init(fn: Any) -> Any:
    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        fn(self, *args, **kwargs)
        args_ = getattr(self, "args", None)
        if args_ is not None and hooks.enabled():
            hooks.record_knobs("openrlhf", read_knobs("openrlhf", args_), version_of("openrlhf"))

    return __init__


def patch_module(module: Any) -> int:
    """Wrap the `METHODS` of ``module`` that exist; returns how many were wrapped."""
    count = 0
    for cls_name, method, _phase in METHODS.get(module.__name__, []):
        cls = _real_class(getattr(module, cls_name, None))
        if not isinstance(cls, type):
            continue
        if (cls_name, method) == ("SamplesGenerator", "generate_samples"):
            count += wrap_method(cls, method, _step_start)
        else:
            count += span_method(tracker, cls, method, f"{cls_name}.{method}")
    if module.__name__ == "openrlhf.trainer.ppo_trainer":
        # the base class where there is one (its subclasses call it), else PPOTrainer
        for name in ("BasePPOTrainer", "PPOTrainer"):
            cls = getattr(module, name, None)
            if isinstance(cls, type):
                wrap_method(cls, "train_step", _step_end)
                if wrap_method(cls, "__init__", _knobs_after_init):
                    break
    return count


def on_import(module: Any) -> None:
    """Bootstrap entry: patch ``module`` if it is one of `METHODS`' modules."""
    if module.__name__ in METHODS:
        safely("OpenRLHF", lambda: patch_module(module))


def install() -> int:
    """Patch the OpenRLHF modules already imported (the explicit API); returns the number
    of methods wrapped."""
    counts: list[int] = []
    for name in METHODS:
        module = sys.modules.get(name)
        if module is not None:
            safely("OpenRLHF", lambda m=module: counts.append(patch_module(m)))
    return sum(counts)
