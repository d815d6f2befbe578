"""gpuprof's zero-code bootstrap: ``gpuprof watch`` puts this directory first on the
child's ``PYTHONPATH``, so every Python process of the watched command (torchrun's workers
and local Ray workers included: they inherit the environment) runs it at start-up.

It imports nothing but the standard library and installs one import hook. A framework is
patched only when its own module is imported (`HOOKS`), right after that module has run and
before anything else sees it; for every other import the hook costs one dict lookup.
``torch.distributed`` is special: its collectives are wrapped only once the process calls
``init_process_group``, so a process that merely imports torch pays nothing. ``ray`` is
special in the same way: ``ray.init`` is wrapped, and only a driver that calls it loads the
``ray_driver`` adapter (which carries the run to every node of the cluster); Ray's worker
processes import ray too, and pay nothing. Any failure
prints one line on stderr and leaves the framework unpatched. Afterwards the next
``sitecustomize`` on the path (the one this file shadows) runs as it would have.

Set ``GPUPROF_AUTO=0`` to turn it off in a process that still has it on its path.
"""

import os
import sys

HOOKS = {
    "trl.extras.profiling": "trl",
    "transformers.trainer": "trl",
    "verl.utils.profiler.performance": "verl",
    "verl.utils.debug.performance": "verl",
    "verl.trainer.ppo.ray_trainer": "verl",
    "swift.rlhf_trainers.utils": "swift",
    "swift.trainers.rlhf_trainer.utils": "swift",
    "openrlhf.trainer.ppo_utils.samples_generator": "openrlhf",
    "openrlhf.trainer.ppo_utils.experience_maker": "openrlhf",
    "openrlhf.trainer.ppo_trainer": "openrlhf",
    "openrlhf.trainer.ray.ppo_actor": "openrlhf",
    "openrlhf.trainer.ray.ppo_critic": "openrlhf",
    "openrlhf.trainer.ray.launcher": "openrlhf",
}
"""Module → the ``gpuprof.integrations`` adapter whose ``on_import(module)`` patches it."""

DEFERRED = {"ray": ("init", "ray_driver")}
"""Module → (its function to wrap, the adapter whose ``call(original, args, kwargs)`` runs
in its place the first time it is called). The adapter is imported only then."""

PREFIXES = {"trl": "trl", "verl": "verl", "swift": "swift"}
"""Packages whose every module goes to its adapter once that adapter is loaded (to rebind
names imported from a patched module, and to patch classes where they are defined)."""

_LOADED = {}  # adapter name -> its module (or None when it failed to load)
_HERE = os.path.dirname(os.path.abspath(__file__))


def _warn(what, exc):
    try:
        sys.stderr.write(
            f"gpuprof: could not instrument {what} ({type(exc).__name__}: {exc}); "
            "it runs unprofiled\n"
        )
    except Exception:
        pass


def _adapter(name):
    if name not in _LOADED:
        _LOADED[name] = None
        try:
            import importlib

            _LOADED[name] = importlib.import_module("gpuprof.integrations." + name)
        except Exception as exc:
            _warn(name, exc)
    return _LOADED[name]


def _after_import(fullname, module):
    if fullname == "torch.distributed":
        _defer_collectives(module)
        return
    if fullname in DEFERRED:
        _defer_call(module, *DEFERRED[fullname])
        return
    name = HOOKS.get(fullname)
    if name is None:
        name = PREFIXES.get(fullname.partition(".")[0])
        if name is None or name not in _LOADED:
            return  # nothing of this package patched yet: nothing to rebind
    adapter = _adapter(name)
    if adapter is not None:
        try:
            adapter.on_import(module)
        except Exception as exc:
            _warn(name, exc)


def _defer_collectives(dist):
    init = getattr(dist, "init_process_group", None)
    if init is None or hasattr(init, "__gpuprof_original__"):
        return

    def init_process_group(*args, **kwargs):
        result = init(*args, **kwargs)
        dist.init_process_group = init
        collectives = _adapter("collectives")
        if collectives is not None:
            try:
                collectives.install(dist)
            except Exception as exc:
                _warn("torch.distributed", exc)
        return result

    init_process_group.__gpuprof_original__ = init
    init_process_group.__wrapped__ = init
    init_process_group.__doc__ = init.__doc__
    dist.init_process_group = init_process_group


def _defer_call(module, attr, adapter_name):
    """Wrap ``module.attr`` so that calling it goes through the adapter's ``call`` (the
    adapter is imported at the first call; if it cannot be, the original runs as it is)."""
    original = getattr(module, attr, None)
    if original is None or hasattr(original, "__gpuprof_original__"):
        return

    def wrapper(*args, **kwargs):
        adapter = _adapter(adapter_name)
        call = getattr(adapter, "call", None)
        if call is None:
            return original(*args, **kwargs)
        return call(original, args, kwargs)

    for name in ("__name__", "__qualname__", "__doc__", "__module__"):
        try:
            setattr(wrapper, name, getattr(original, name))
        except Exception:
            pass
    wrapper.__gpuprof_original__ = original
    wrapper.__wrapped__ = original
    setattr(module, attr, wrapper)


class _Loader:
    """Runs the real loader, then the adapter; restores the real loader on the module."""

    def __init__(self, loader, fullname):
        self._loader = loader
        self._fullname = fullname

    def __getattr__(self, name):
        return getattr(self._loader, name)

    def create_module(self, spec):
        create = getattr(self._loader, "create_module", None)
        return create(spec) if create is not None else None

    def exec_module(self, module):
        spec = getattr(module, "__spec__", None)
        if spec is not None and spec.loader is self:
            spec.loader = self._loader
        if getattr(module, "__loader__", None) is self:
            module.__loader__ = self._loader
        self._loader.exec_module(module)
        _after_import(self._fullname, module)


class _Finder:
    """A meta-path finder that only wraps the loaders of the modules gpuprof patches."""

    gpuprof_bootstrap = True
    """Marks gpuprof's finder whichever copy of this file installed it (the Ray worker setup
    hook loads this file under another module name)."""

    def __init__(self):
        self._busy = set()

    def find_spec(self, fullname, path=None, target=None):
        if (
            fullname not in HOOKS
            and fullname != "torch.distributed"
            and fullname not in DEFERRED
            and fullname.partition(".")[0] not in PREFIXES
        ):
            return None
        if fullname in self._busy:
            return None
        self._busy.add(fullname)
        try:
            for finder in sys.meta_path:
                if finder is self:
                    continue
                find = getattr(finder, "find_spec", None)
                if find is None:
                    continue
                spec = find(fullname, path, target)
                if spec is not None:
                    break
            else:
                return None
        except Exception:
            return None
        finally:
            self._busy.discard(fullname)
        loader = getattr(spec, "loader", None)
        if loader is None or not hasattr(loader, "exec_module"):
            return spec
        spec.loader = _Loader(loader, fullname)
        return spec


def _chain():
    """Run the ``sitecustomize`` this one shadows (the rest of the path's), if any."""
    import importlib.machinery
    import importlib.util

    ours = sys.modules.get("sitecustomize")
    rest = [p for p in sys.path if os.path.abspath(p or os.curdir) != _HERE]
    try:
        spec = importlib.machinery.PathFinder.find_spec("sitecustomize", rest)
    except Exception:
        spec = None
    if spec is None or spec.loader is None:
        return
    module = importlib.util.module_from_spec(spec)
    sys.modules["sitecustomize"] = module
    try:
        spec.loader.exec_module(module)
    except Exception as exc:
        sys.modules["sitecustomize"] = ours
        sys.stderr.write(f"Error in sitecustomize; {type(exc).__name__}: {exc}\n")


def _install():
    if os.environ.get("GPUPROF_AUTO", "1") == "0" or not os.environ.get("GPUPROF_RUN_DIR"):
        return
    if not any(getattr(f, "gpuprof_bootstrap", False) for f in sys.meta_path):
        sys.meta_path.insert(0, _Finder())
    dist = sys.modules.get("torch.distributed")
    if dist is not None:  # imported before us (not in a fresh interpreter): patch now
        _defer_collectives(dist)


try:
    _install()
except Exception as _exc:  # never stop the user's program from starting
    _warn("the import hook", _exc)
if __name__ == "sitecustomize":  # not when a Ray worker's setup hook loads this file by path
    _chain()
