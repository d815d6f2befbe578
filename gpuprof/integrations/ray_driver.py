"""Ray: ``gpuprof watch -- python train.py`` covers every node of the Ray cluster the
driver starts or joins, with no code change.

The bootstrap wraps ``ray.init`` in the watched command's processes; only a process that
calls it (the job's driver) imports this adapter, whose `call` then

1. merges into the job's ``runtime_env`` (never replacing it) the run's identity and a
   ``worker_process_setup_hook`` that instruments every Ray worker on every node as the
   bootstrap instruments local processes (`gpuprof.integrations.ray_cluster.setup_hook`);
2. calls the real ``ray.init``;
3. starts a `ClusterRecorder`: a sampler actor on every other node (nodes that join later
   too), their rows and clock offsets into ``<run>/<node>.sqlite``, lost nodes recorded;
   stopped by ``ray.shutdown`` or at exit, before Ray disconnects.

gpuprof must be installed on every node (the same version), as the framework is: the sampler
actors and the workers' hooks run gpuprof there. A node without it runs the job unprofiled
and says so in one line. ``GPUPROF_RAY=0`` turns all of this off (the driver's own spans are
still recorded). Any failure is one line on stderr and ``ray.init`` behaves as without
gpuprof.
"""

from __future__ import annotations

import atexit
import json
import os
import secrets
import socket
import sqlite3
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gpuprof import nodes
from gpuprof.integrations._patch import is_patched, mark_wrapper, warn
from gpuprof.integrations.ray_cluster import runtime_env as renv
from gpuprof.integrations.ray_cluster import setup_hook

ENV_SWITCH = "GPUPROF_RAY"
"""``0``: leave ``ray.init`` alone (no other node is recorded)."""
DEFAULT_INTERVAL_S = 0.1

_recorder: Any = None


@dataclass
class _Plan:
    """What `call` decided before ``ray.init``: the arguments to pass and the run."""

    kwargs: dict[str, Any]
    run_dir: Path
    run_id: str
    session: str
    interval_s: float
    nvml: bool
    stacks: dict[str, Any] | None = None
    """The watcher's stack sampling (`RunMeta.stacks`), for the other nodes' samplers."""


def call(original: Any, args: tuple, kwargs: dict[str, Any]) -> Any:
    """``ray.init(*args, **kwargs)`` with the job's runtime_env extended and the cluster
    recorded once it is connected. Errors of ``ray.init`` itself are the caller's."""
    plan = None
    try:
        plan = _plan(kwargs)
    except Exception as exc:
        warn(f"could not prepare the Ray job ({type(exc).__name__}: {exc}); "
             "the cluster's other nodes are not recorded")  # fmt: skip
    if plan is None:
        return original(*args, **kwargs)
    try:
        result = original(*args, **plan.kwargs)
    except Exception as exc:
        if not _about_runtime_env(exc) or _initialized():
            raise
        warn(f"Ray refused gpuprof's additions to the job's runtime_env ({exc}); "
             "workers on other nodes are not instrumented")  # fmt: skip
        result = original(*args, **kwargs)  # as the caller wrote it: its errors are its own
    try:
        _start(plan)
    except Exception as exc:
        warn(f"could not record the Ray cluster ({type(exc).__name__}: {exc}); "
             "the cluster's other nodes are not recorded")  # fmt: skip
    return result


def _plan(kwargs: dict[str, Any]) -> _Plan | None:
    run_dir = os.environ.get(setup_hook.ENV_RUN_DIR)
    if not run_dir or os.environ.get(ENV_SWITCH, "1") == "0" or _initialized():
        return None
    import ray

    run_id, interval_s, nvml, stacks = _watcher_settings(Path(run_dir))
    session = secrets.token_hex(6)
    env_vars = renv.run_env_vars(run_dir, run_id, session, nodes.node_name())
    with_hook, why = _hook_support(ray)
    if why:
        warn(why)
    if not with_hook:
        # without the hook a worker on another node would write into a directory that only
        # exists here: the job's runtime_env stays as it is
        return _Plan(dict(kwargs), Path(run_dir), run_id, session, interval_s, nvml, stacks)
    base = kwargs.get("runtime_env")
    if base is None:
        job_config = kwargs.get("job_config")
        base = getattr(job_config, "runtime_env", None) or None
    merged, lines = renv.merge(base, env_vars, with_hook=True)
    for line in lines:
        warn(line)
    plan_kwargs = {**kwargs, "runtime_env": merged}
    return _Plan(plan_kwargs, Path(run_dir), run_id, session, interval_s, nvml, stacks)


def _hook_support(ray: Any) -> tuple[bool, str | None]:
    """Whether the job's workers can get gpuprof's setup hook; else the line saying why."""
    version = getattr(ray, "__version__", "?")
    try:
        from ray._private import ray_constants

        supported = hasattr(ray_constants, "WORKER_PROCESS_SETUP_HOOK_ENV_VAR")
    except Exception:
        supported = False
    if not supported or not renv.pickle_hook_by_value(ray):
        return False, (f"Ray {version} has no worker_process_setup_hook (Ray >= 2.9 needed): "
                       "spans of Ray workers on other nodes are not recorded")  # fmt: skip
    submitted = _submitted_runtime_env()
    if submitted.get(renv.SETUP_HOOK_KEY):
        return False, ("the submitted job's runtime_env has its own worker_process_setup_hook, "
                       "which Ray does not let a driver extend: Ray workers on other nodes "
                       "are not instrumented")  # fmt: skip
    return True, None


def _submitted_runtime_env() -> dict[str, Any]:
    """The runtime_env ``ray job submit`` gave this driver (Ray merges the driver's with it)."""
    try:
        text = os.environ.get("RAY_JOB_CONFIG_JSON_ENV_VAR")
        value = json.loads(text).get("runtime_env") if text else None
    except (ValueError, AttributeError):
        return {}
    return value if isinstance(value, dict) else {}


def _watcher_settings(run_dir: Path) -> tuple[str, float, bool, dict[str, Any] | None]:
    """The run's id, the watcher's sampling interval (s), whether it reads NVML and how it
    samples Python stacks (`RunMeta.stacks`), from the watcher's metadata (written before it
    started the command); defaults without it (stacks at the default rates)."""
    run_id, interval_s, nvml, stacks = run_dir.name, DEFAULT_INTERVAL_S, True, {}
    db = os.environ.get("GPUPROF_DB")
    if not db or not nodes.on_watcher_machine():
        return run_id, interval_s, nvml, stacks
    try:
        conn = sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=5.0)
        try:
            row = conn.execute("SELECT value FROM meta WHERE key = 'run'").fetchone()
        finally:
            conn.close()
        meta = json.loads(row[0]) if row else {}
    except (sqlite3.Error, ValueError, TypeError):
        return run_id, interval_s, nvml, stacks
    if isinstance(meta.get("run_id"), str) and meta["run_id"]:
        run_id = meta["run_id"]
    value = meta.get("interval_s")
    if isinstance(value, (int, float)) and not isinstance(value, bool) and value > 0:
        interval_s = float(value)
    notices = meta.get("notices") or []
    nvml = not any("--no-nvml" in str(n) for n in notices)
    stacks = meta.get("stacks") if isinstance(meta.get("stacks"), dict) else None
    return run_id, interval_s, nvml, stacks


def _start(plan: _Plan) -> None:
    global _recorder
    import ray

    from gpuprof.integrations.ray_cluster.recorder import ClusterRecorder

    if _recorder is not None:
        _recorder.finish()  # a second ray.init after a shutdown: a fresh recorder
    recorder = ClusterRecorder(ray, plan.run_dir, plan.run_id, plan.session, nodes.node_name(),
                               socket.gethostname(), interval_s=plan.interval_s,
                               nvml=plan.nvml, stacks=plan.stacks,
                               own_node_id=_started_node(ray))  # fmt: skip
    if not recorder.start():
        return
    _recorder = recorder
    # before Ray's own exit handler (registered earlier, so run later) disconnects
    atexit.register(recorder.finish)
    _patch_shutdown(ray)


def _started_node(ray: Any) -> str | None:
    """The id of the Ray node this driver started (``ray.init()`` with no cluster to join),
    else None."""
    try:
        node = getattr(ray._private.worker, "_global_node", None)
        if node is not None and getattr(node, "ray_init_cluster", False):
            return ray.get_runtime_context().get_node_id()
    except Exception:
        pass
    return None


def _patch_shutdown(ray: Any) -> None:
    """``ray.shutdown`` first takes the samplers' last rows (the driver may go on after it)."""
    original = getattr(ray, "shutdown", None)
    if original is None or is_patched(original):
        return

    def shutdown(*args: Any, **kwargs: Any) -> Any:
        recorder = _recorder
        if recorder is not None:
            recorder.finish()  # never raises
        return original(*args, **kwargs)

    ray.shutdown = mark_wrapper(shutdown, original)


def _initialized() -> bool:
    ray = sys.modules.get("ray")
    try:
        return bool(ray is not None and ray.is_initialized())
    except Exception:
        return False


def _about_runtime_env(exc: BaseException) -> bool:
    """Whether ``ray.init`` failed over the runtime_env (then it is retried as the caller
    wrote it), rather than for a reason of its own (no cluster at that address…)."""
    text = f"{type(exc).__name__} {exc}".lower()
    return any(word in text for word in ("runtime_env", "runtime env", "setup hook",
                                         "setup_hook", "runtimeenv"))  # fmt: skip


def install() -> bool:
    """Wrap ``ray.init`` in this process (for code that imports gpuprof itself rather than
    running under the bootstrap); True when it is wrapped."""
    ray = sys.modules.get("ray")
    if ray is None:
        try:
            import ray
        except ImportError:
            return False
    on_import(ray)
    return is_patched(getattr(ray, "init", None))


def on_import(module: Any) -> None:
    """Wrap ``module.init`` (the ``ray`` package) so that it goes through `call`."""
    original = getattr(module, "init", None)
    if original is None or is_patched(original):
        return

    def init(*args: Any, **kwargs: Any) -> Any:
        return call(original, args, kwargs)

    module.init = mark_wrapper(init, original)
