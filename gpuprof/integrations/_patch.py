"""What every adapter shares: framework spans with context-aware phase names, safe patching
of functions and methods, rebinding of names other modules imported, and knob reading.

Adapters never let a failure reach the framework: `safely` turns an exception while
patching into one warning line on stderr and leaves the framework as it was.
"""

from __future__ import annotations

import functools
import sys
import threading
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from gpuprof import hooks
from gpuprof.phases import INHERIT, canonical_phase

_PATCHED = "__gpuprof_original__"
_warned: set[str] = set()


def warn(message: str) -> None:
    """One line on stderr, once per message (never raises)."""
    if message in _warned:
        return
    _warned.add(message)
    try:
        print(f"gpuprof: {message}", file=sys.stderr, flush=True)
    except Exception:
        pass


def safely(framework: str, action: Callable[[], Any]) -> bool:
    """Run a patching step; on any error warn once and report False (the framework then
    runs unpatched, or with the parts patched before the error)."""
    try:
        action()
        return True
    except Exception as exc:
        warn(f"could not instrument {framework} ({type(exc).__name__}: {exc}); it runs unprofiled")
        return False


class Tracker:
    """Framework spans of one adapter: names mapped to canonical phases, with context.

    ``mapping`` gives a framework name's canonical phase, or `INHERIT` for a name whose
    meaning is its caller's (a helper used by both the rollout and the update). A name
    neither in ``mapping`` nor known to `gpuprof.phases` also inherits the phase of the
    enclosing framework span (TRL times each reward function under its own name inside
    ``_calculate_rewards``); at the top level it is kept as it is.
    """

    def __init__(self, framework: str, mapping: Mapping[str, str]) -> None:
        self.framework = framework
        self.mapping = dict(mapping)
        self._local = threading.local()

    def _stack(self) -> list[tuple[str, str | None]]:
        stack = getattr(self._local, "stack", None)
        if stack is None:
            stack = self._local.stack = []
        return stack

    def current(self) -> str | None:
        """The canonical phase of the innermost open framework span (or hint) of this thread."""
        stack = self._stack()
        return stack[-1][1] if stack else None

    def inside(self, short: str) -> bool:
        """Whether a framework span named ``short`` is open in this thread."""
        return any(name == short for name, _ in self._stack())

    def canonical(self, short: str) -> str | None:
        """The canonical phase for a framework name (None: keep the name as its phase)."""
        mapped = self.mapping.get(short)
        if mapped is None:
            known = canonical_phase(short)
            if known != short:
                return known
            tail = short.rsplit(".", 1)[-1]
            known = self.mapping.get(tail) or canonical_phase(tail)
            if known not in (tail, INHERIT):
                return known
            mapped = INHERIT
        if mapped == INHERIT:
            return self.current()
        return mapped

    def span(self, name: str, short: str | None = None, **attrs: Any) -> _Span:
        """A context manager timing ``name`` (stored as is) as the phase ``short`` maps to."""
        return _Span(self, name, short if short is not None else name, attrs)

    def hint(self, canonical: str | None) -> _Hint:
        """Let framework spans opened inside (that inherit) take ``canonical``; records nothing."""
        return _Hint(self, canonical)


class _Span:
    __slots__ = ("_phase", "attrs", "name", "short", "tracker")

    def __init__(self, tracker: Tracker, name: str, short: str, attrs: dict[str, Any]) -> None:
        self.tracker, self.name, self.short, self.attrs = tracker, name, short, attrs
        self._phase = None

    def __enter__(self) -> _Span:
        try:
            canonical = self.tracker.canonical(self.short)
            self.tracker._stack().append((self.short, canonical))
            self._phase = hooks.framework_phase(self.name, canonical, **self.attrs)
            self._phase.__enter__()
        except Exception as exc:  # never into the framework
            hooks._disable(exc)
        return self

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> bool:
        phase, self._phase = self._phase, None
        if phase is not None:
            phase.__exit__(exc_type, exc, tb)
            stack = self.tracker._stack()
            if stack:
                stack.pop()
        return False


class _Hint:
    __slots__ = ("canonical", "tracker")

    def __init__(self, tracker: Tracker, canonical: str | None) -> None:
        self.tracker, self.canonical = tracker, canonical

    def __enter__(self) -> _Hint:
        # no hint: spans inside inherit what they would have inherited anyway
        self.tracker._stack().append(("", self.canonical or self.tracker.current()))
        return self

    def __exit__(self, *exc: Any) -> bool:
        stack = self.tracker._stack()
        if stack:
            stack.pop()
        return False


class Both:
    """Enter an outer and an inner context manager as one (the framework's own timer inside
    ours, so its value is what the framework always measured)."""

    __slots__ = ("inner", "outer")

    def __init__(self, outer: Any, inner: Any) -> None:
        self.outer, self.inner = outer, inner

    def __enter__(self) -> Any:
        self.outer.__enter__()
        try:
            return self.inner.__enter__()
        except BaseException:
            self.outer.__exit__(*sys.exc_info())
            raise

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> bool:
        try:
            suppressed = bool(self.inner.__exit__(exc_type, exc, tb))
        except BaseException:
            self.outer.__exit__(*sys.exc_info())
            raise
        if suppressed:
            self.outer.__exit__(None, None, None)
        else:
            self.outer.__exit__(exc_type, exc, tb)
        return suppressed


def original(fn: Any) -> Any:
    """The unpatched function behind a gpuprof wrapper (``fn`` itself when not wrapped)."""
    return getattr(fn, _PATCHED, fn)


def is_patched(fn: Any) -> bool:
    return hasattr(fn, _PATCHED)


def mark_wrapper(wrapper: Any, wrapped: Any) -> Any:
    """Tag ``wrapper`` as gpuprof's wrapper of ``wrapped`` (so patching twice is a no-op)."""
    try:
        functools.update_wrapper(wrapper, wrapped)
    except (AttributeError, TypeError):
        pass
    setattr(wrapper, _PATCHED, wrapped)
    return wrapper


def wrap_method(
    cls: type, attr: str, make: Callable[[Callable[..., Any]], Callable[..., Any]]
) -> bool:
    """Replace ``cls.attr`` (defined on ``cls`` itself) by ``make(original)``; False when
    ``cls`` has no such attribute of its own or it is already wrapped."""
    fn = cls.__dict__.get(attr)
    if fn is None or not callable(fn) or is_patched(fn):
        return False
    setattr(cls, attr, mark_wrapper(make(fn), fn))
    return True


def span_method(tracker: Tracker, cls: type, attr: str, short: str | None = None) -> bool:
    """Time every call of ``cls.attr`` as a framework span named ``Class.attr``."""
    label = f"{cls.__name__}.{attr}"
    key = short or attr

    def make(fn: Callable[..., Any]) -> Callable[..., Any]:
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            with tracker.span(label, key):
                return fn(*args, **kwargs)

        return wrapper

    return wrap_method(cls, attr, make)


def rebind(modules: Iterable[Any], replacements: Mapping[int, tuple[Any, Any]]) -> int:
    """Point module globals that hold an original function at its wrapper.

    ``replacements`` maps ``id(original)`` to ``(original, wrapper)``. A module that did
    ``from pkg.mod import marked_timer`` before (or after) the patch holds its own reference;
    this is what makes such names record too. Returns the number of names changed.
    """
    changed = 0
    for module in modules:
        try:
            namespace = vars(module)
        except TypeError:
            continue
        for key, value in list(namespace.items()):
            pair = replacements.get(id(value))
            if pair is not None and pair[0] is value:
                namespace[key] = pair[1]
                changed += 1
    return changed


def modules_under(prefix: str) -> list[Any]:
    """Loaded modules named ``prefix`` or ``prefix.*``."""
    dotted = prefix + "."
    return [
        m
        for name, m in list(sys.modules.items())
        if m is not None and (name == prefix or name.startswith(dotted))
    ]


# -- knobs -------------------------------------------------------------------------------------


def catalogue_knobs(framework: str) -> list[str]:
    """The knob names the recommender knows for ``framework`` (each once)."""
    from gpuprof.analyzers.knobs import CATALOGUE

    seen: dict[str, None] = {}
    for entry in CATALOGUE:
        if entry.framework == framework:
            seen.setdefault(entry.knob, None)
    return list(seen)


_MISSING = object()


def lookup(config: Any, dotted: str) -> Any:
    """``config.a.b.c`` / ``config["a"]["b"]["c"]`` for ``"a.b.c"`` (`_MISSING` when absent)."""
    node = config
    for part in dotted.split("."):
        if node is None:
            return _MISSING
        try:
            if isinstance(node, Mapping):
                node = node.get(part, _MISSING)
            else:
                getter = getattr(node, "get", None)
                value = getattr(node, part, _MISSING)
                if value is _MISSING and callable(getter) and not isinstance(node, type):
                    value = getter(part, _MISSING)  # OmegaConf DictConfig, argparse-like dicts
                node = value
        except Exception:
            return _MISSING
        if node is _MISSING:
            return _MISSING
    return node


def read_knobs(framework: str, *configs: Any) -> dict[str, Any]:
    """The catalogue's knobs of ``framework`` found in ``configs`` (first config that has a
    knob wins); only JSON scalars are kept (enums by their value)."""
    found: dict[str, Any] = {}
    for knob in catalogue_knobs(framework):
        for config in configs:
            value = lookup(config, knob)
            if value is _MISSING:
                continue
            value = getattr(value, "value", value)  # str/int enums (TRL's IntervalStrategy…)
            if value is None or isinstance(value, (bool, int, float, str)):
                found[knob] = value
                break
    return found


def version_of(distribution: str) -> str | None:
    """The installed version of a distribution (None when unknown)."""
    try:
        from importlib.metadata import version

        return version(distribution)
    except Exception:
        return None
