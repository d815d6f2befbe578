"""torch.distributed collectives as spans: op, bytes, group size, duration.

Each call of a collective in `OPS` through the ``torch.distributed`` namespace
(``dist.all_reduce(t)``) is one span of phase ``collective`` named after the op, with attrs
``op``, ``bytes`` (the message size as nccl-tests counts it: the tensor for all-reduce /
broadcast / reduce / gather / scatter / send / recv, the whole gathered output for
all-gather, the whole input for reduce-scatter and all-to-all), ``group_size`` (ranks in the
group) and ``async`` when ``async_op=True`` (then the span is the launch only). The span's
wall time is the call's; for tensors on a GPU, CUDA events recorded around the call on the
current stream give its GPU-side start and end too (`gpuprof.hooks.enable_cuda_events`),
without synchronising. Calls made inside torch.distributed itself (``all_gather_object``
uses ``all_gather``) are not counted twice: only the public namespace is wrapped.

Importing this module costs nothing measurable: gpuprof's hooks (and their store) are
imported once the process group is initialised, not when torch is imported.
"""

from __future__ import annotations

import inspect
import sys
from collections.abc import Callable
from typing import Any

OPS: dict[str, tuple[str, str]] = {
    "all_reduce": ("tensor", "one"),
    "all_reduce_coalesced": ("tensors", "sum"),
    "broadcast": ("tensor", "one"),
    "reduce": ("tensor", "one"),
    "all_gather": ("tensor_list", "sum"),
    "all_gather_into_tensor": ("output_tensor", "one"),
    "reduce_scatter": ("input_list", "sum"),
    "reduce_scatter_tensor": ("input", "one"),
    "all_to_all": ("input_tensor_list", "sum"),
    "all_to_all_single": ("input", "one"),
    "gather": ("tensor", "one"),
    "scatter": ("tensor", "one"),
    "send": ("tensor", "one"),
    "recv": ("tensor", "one"),
    "barrier": ("", "none"),
}
"""Op → (the argument whose size is the message, ``one`` tensor / ``sum`` of a list / ``none``)."""

_hooks: Any = None


def _load_hooks() -> Any:
    global _hooks
    if _hooks is None:
        from gpuprof import hooks

        _hooks = hooks
    return _hooks


def _nbytes(value: Any, how: str) -> int | None:
    if how == "none":
        return 0
    if how == "sum":
        return sum(t.numel() * t.element_size() for t in value)
    return value.numel() * value.element_size()


def _first_tensor(value: Any, how: str) -> Any:
    if how == "sum":
        return value[0] if len(value) else None
    return value if how == "one" else None


def wrap(op: str, fn: Callable[..., Any], dist: Any) -> Callable[..., Any]:
    """``fn`` recording each call as a ``collective`` span (a no-op outside a run)."""
    param, how = OPS[op]
    signature = inspect.signature(fn)

    def collective(*args: Any, **kwargs: Any) -> Any:
        hooks = _hooks or _load_hooks()
        if not hooks.enabled():
            return fn(*args, **kwargs)
        attrs: dict[str, Any] = {"op": op}
        try:
            bound = signature.bind(*args, **kwargs)
            value = bound.arguments.get(param) if param else None
            if value is not None or how == "none":
                attrs["bytes"] = _nbytes(value, how)
            group = bound.arguments.get("group")
            attrs["group_size"] = int(dist.get_world_size(group))
            if bound.arguments.get("async_op"):
                attrs["async"] = True
            tensor = _first_tensor(value, how) if value is not None else None
            if tensor is not None and getattr(tensor, "is_cuda", False):
                hooks.enable_cuda_events()
        except Exception:
            pass  # a call torch will reject anyway, or an argument we can't size
        with hooks.framework_phase(op, "collective", **attrs):
            return fn(*args, **kwargs)

    collective.__gpuprof_original__ = fn  # type: ignore[attr-defined]
    try:
        collective.__wrapped__ = fn  # type: ignore[attr-defined]
        collective.__name__ = fn.__name__
        collective.__qualname__ = fn.__qualname__
        collective.__doc__ = fn.__doc__
        collective.__module__ = fn.__module__
    except (AttributeError, TypeError):
        pass
    return collective


def _wrap_init(fn: Callable[..., Any]) -> Callable[..., Any]:
    def init_process_group(*args: Any, **kwargs: Any) -> Any:
        result = fn(*args, **kwargs)
        try:  # pay gpuprof's own import here, not inside the first collective
            _load_hooks().enabled()
        except Exception:
            pass
        return result

    init_process_group.__gpuprof_original__ = fn  # type: ignore[attr-defined]
    init_process_group.__wrapped__ = fn  # type: ignore[attr-defined]
    init_process_group.__doc__ = fn.__doc__
    return init_process_group


def install(dist: Any = None) -> list[str]:
    """Wrap the collectives of ``torch.distributed`` (imported when not given); returns the
    ops wrapped now. Idempotent."""
    if dist is None:
        import torch.distributed as dist
    if not dist.is_available():
        return []
    done = []
    for op in OPS:
        fn = getattr(dist, op, None)
        if fn is None or hasattr(fn, "__gpuprof_original__"):
            continue
        setattr(dist, op, wrap(op, fn, dist))
        done.append(op)
    init = getattr(dist, "init_process_group", None)
    if init is not None and not hasattr(init, "__gpuprof_original__"):
        dist.init_process_group = _wrap_init(init)
    return done


def uninstall(dist: Any = None) -> None:
    """Put the original functions back."""
    dist = dist or sys.modules.get("torch.distributed")
    if dist is None:
        return
    for name in (*OPS, "init_process_group"):
        fn = getattr(dist, name, None)
        original = getattr(fn, "__gpuprof_original__", None)
        if original is not None:
            setattr(dist, name, original)


def on_import(module: Any) -> None:
    """Bootstrap entry: ``torch.distributed`` was just imported."""
    from gpuprof.integrations._patch import safely

    safely("torch.distributed", lambda: install(module))
