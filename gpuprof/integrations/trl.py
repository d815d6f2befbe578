"""TRL (and any transformers `Trainer`): profiling-context timings, step boundaries, knobs.

Two parts:

* TRL times its phases with ``trl.extras.profiling``: ``profiling_context(trainer, name)``
  and ``@profiling_decorator`` both build a ``ProfilingContext`` named
  ``"<TrainerClass>.<name>"``. Patching that class's ``__enter__``/``__exit__`` records every
  one of them (including contexts handed to vLLM generation as ``profiler=``), whichever
  module imported the helpers. Names map to canonical phases through `TRL_PHASES`;
  ``_get_per_token_logps_and_entropies`` is the old-policy, the reference or the update's
  log-prob pass depending on its caller and model, which a wrapper of the trainer method
  works out (`_logps_phase`).
* `GpuprofCallback`, a transformers ``TrainerCallback``: a ``training_step`` span per
  optimizer step (forward, backward and, in GRPO, the generation it triggers), the
  optimizer step, step boundaries (``gpuprof.step`` with the trainer's global step) and the
  run's knob values from the trainer's arguments. Add it yourself
  (``trainer.add_callback(GpuprofCallback())``) or let ``gpuprof watch`` add it to every
  ``Trainer`` it sees constructed.
"""

from __future__ import annotations

import sys
from typing import Any

from gpuprof import hooks
from gpuprof.frameworks.trl import PROFILING_PHASES as TRL_PHASES
from gpuprof.integrations._patch import (
    Tracker,
    modules_under,
    read_knobs,
    safely,
    span_method,
    version_of,
    wrap_method,
)

tracker = Tracker("trl", TRL_PHASES)

try:  # the callback base class when transformers is installed; a plain object otherwise
    from transformers import TrainerCallback as _CallbackBase
except Exception:  # pragma: no cover - transformers missing or broken
    _CallbackBase = object  # type: ignore[assignment,misc]


def _short(name: str) -> str:
    """``"GRPOTrainer.vLLM.generate"`` → ``"vLLM.generate"`` (names without a class stay)."""
    head, sep, tail = name.partition(".")
    return tail if sep and head[:1].isupper() else name


def framework_of(trainer: Any) -> str | None:
    """``trl`` / ``swift`` from the trainer class's package; None for a plain Trainer."""
    for cls in type(trainer).__mro__:
        root = (cls.__module__ or "").partition(".")[0]
        if root == "trl":
            return "trl"
        if root == "swift":
            return "swift"
    return None


class GpuprofCallback(_CallbackBase):  # type: ignore[misc,valid-type]
    """Step boundaries, the update and the optimizer step of a transformers ``Trainer``.

    ``framework`` names whose knobs to read from the trainer's arguments (``"trl"``,
    ``"swift"``; None: guessed from the trainer when it is known, else no knobs). Costs a
    few microseconds per optimizer step; does nothing outside a gpuprof run.
    """

    _owner: tuple[GpuprofCallback, Any] | None = None
    """The instance recording a training run, with that run's ``TrainerState``: a second one
    on the same trainer (added by hand where ``gpuprof watch`` already added one) stays silent
    instead of doubling spans; a new trainer's state takes over (even after a crashed run)."""

    def __init__(self, framework: str | None = "trl") -> None:
        self.framework = framework
        self._step_span: Any = None
        self._opt_span: Any = None
        self._tokens_seen = 0

    def _mine(self, state: Any) -> bool:
        owner = GpuprofCallback._owner
        if owner is None or owner[1] is not state:
            GpuprofCallback._owner = owner = (self, state)
        return owner[0] is self

    def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if not self._mine(state):
            return
        framework = self.framework
        if framework:
            dist = {"trl": "trl", "swift": "ms-swift"}.get(framework, framework)
            hooks.record_knobs(framework, read_knobs(framework, args), version_of(dist))

    def on_step_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if not self._mine(state):
            return
        hooks.begin_step()
        self._close_step()
        self._step_span = tracker.span("training_step")
        self._step_span.__enter__()

    def on_pre_optimizer_step(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if not self._mine(state):
            return
        self._opt_span = tracker.span("optimizer_step")
        self._opt_span.__enter__()

    def on_optimizer_step(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if not self._mine(state):
            return
        span, self._opt_span = self._opt_span, None
        if span is not None:
            span.__exit__(None, None, None)

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if not self._mine(state):
            return
        self._close_step()
        seen = int(getattr(state, "num_input_tokens_seen", 0) or 0)
        tokens = seen - self._tokens_seen if seen > self._tokens_seen else None
        self._tokens_seen = seen
        hooks.step(n=max(0, int(state.global_step) - 1), tokens=tokens)

    def on_train_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if not self._mine(state):
            return
        self._close_step()
        GpuprofCallback._owner = None
        hooks.flush()

    def _close_step(self) -> None:
        span, self._step_span = self._step_span, None
        if span is not None:
            span.__exit__(None, None, None)


# -- zero-code patches (called by the bootstrap when the module is imported) -------------------


def _patch_profiling(module: Any) -> None:
    cls = getattr(module, "ProfilingContext", None)
    if cls is None:
        # TRL before ProfilingContext: profiling_context was a generator context manager
        _patch_profiling_function(module)
        return

    def make_enter(enter: Any) -> Any:
        def __enter__(self: Any) -> Any:
            name = str(getattr(self, "name", "profiling"))
            span = tracker.span(name, _short(name))
            span.__enter__()
            self.__dict__["_gpuprof_span"] = span
            return enter(self)

        return __enter__

    def make_exit(exit_: Any) -> Any:
        def __exit__(self: Any, exc_type: Any, exc: Any, tb: Any) -> Any:
            try:
                return exit_(self, exc_type, exc, tb)
            finally:
                span = self.__dict__.pop("_gpuprof_span", None)
                if span is not None:
                    span.__exit__(exc_type, exc, tb)

        return __exit__

    wrap_method(cls, "__enter__", make_enter)
    wrap_method(cls, "__exit__", make_exit)


def _patch_profiling_function(module: Any) -> None:
    from gpuprof.integrations._patch import Both, mark_wrapper, rebind

    fn = getattr(module, "profiling_context", None)
    if fn is None or hasattr(fn, "__gpuprof_original__"):
        return

    def profiling_context(trainer: Any, name: str, *args: Any, **kwargs: Any) -> Any:
        label = f"{type(trainer).__name__}.{name}"
        return Both(tracker.span(label, str(name)), fn(trainer, name, *args, **kwargs))

    wrapper = mark_wrapper(profiling_context, fn)
    module.profiling_context = wrapper
    rebind(modules_under("trl"), {id(fn): (fn, wrapper)})


def _logps_phase(tracker: Tracker, trainer: Any, model: Any) -> str | None:
    """Which log-prob pass a ``_get_per_token_logps_and_entropies`` call is."""
    if tracker.inside("compute_loss"):
        return None  # the policy's own forward inside compute_loss: part of the update
    ref = getattr(trainer, "ref_model", None)
    if ref is not None and model is ref:
        return "ref_logprob"
    try:  # a PEFT model scoring with its "ref" adapter (TRL's use_adapter(..., "ref"))
        inner = getattr(model, "module", model)
        if getattr(inner, "active_adapter", None) == "ref":
            return "ref_logprob"
    except Exception:
        pass
    return "old_logprob"


def patch_logprob_passes(module: Any, tracker: Tracker) -> int:
    """Let the trainer classes ``module`` defines tell old-policy from reference log-prob
    passes (TRL and ms-swift share the method and its ``(self, model, …)`` signature)."""
    count = 0
    for value in list(vars(module).values()):
        if not isinstance(value, type) or value.__module__ != module.__name__:
            continue
        for attr in ("_get_per_token_logps_and_entropies", "_get_per_token_logps"):

            def make(fn: Any) -> Any:
                def wrapper(self: Any, model: Any, *args: Any, **kwargs: Any) -> Any:
                    with tracker.hint(_logps_phase(tracker, self, model)):
                        return fn(self, model, *args, **kwargs)

                return wrapper

            count += wrap_method(value, attr, make)
    return count


def _patch_transformers_trainer(module: Any) -> None:
    cls = module.Trainer

    def make_init(init: Any) -> Any:
        def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
            init(self, *args, **kwargs)
            if hooks.enabled():
                safely("transformers.Trainer", lambda: _attach(self))

        return __init__

    wrap_method(cls, "__init__", make_init)
    span_method(tracker, cls, "evaluate", "eval")
    span_method(tracker, cls, "_save_checkpoint", "checkpoint")


def _attach(trainer: Any) -> None:
    callbacks = getattr(getattr(trainer, "callback_handler", None), "callbacks", [])
    if not any(isinstance(cb, GpuprofCallback) for cb in callbacks):
        trainer.add_callback(GpuprofCallback(framework_of(trainer)))


def on_import(module: Any) -> None:
    """Bootstrap entry: patch what ``module`` (just imported) defines."""
    name = module.__name__
    if name == "trl.extras.profiling":
        safely("trl", lambda: _patch_profiling(module))
    elif name.startswith("trl.trainer.") or name.startswith("trl.experimental."):
        safely("trl", lambda: patch_logprob_passes(module, tracker))
    elif name == "transformers.trainer":
        safely("transformers", lambda: _patch_transformers_trainer(module))


def install() -> bool:
    """Patch the TRL / transformers modules already imported (the explicit API; under
    ``gpuprof watch`` the bootstrap does this as they are imported). True when TRL's
    profiling context is now recorded."""
    for name in ("trl.extras.profiling", "transformers.trainer"):
        module = sys.modules.get(name)
        if module is not None:
            on_import(module)
    for module in modules_under("trl"):
        if module.__name__.startswith(("trl.trainer.", "trl.experimental.")):
            on_import(module)
    module = sys.modules.get("trl.extras.profiling")
    cls = getattr(module, "ProfilingContext", None) if module else None
    return cls is not None and hasattr(cls.__dict__.get("__enter__"), "__gpuprof_original__")
