"""What runs first in every Ray worker process of a watched job, on every node.

``gpuprof watch`` cannot put its bootstrap on the ``PYTHONPATH`` of workers that raylets on
other machines start, so the driver adds a ``worker_process_setup_hook`` to the job's
``runtime_env`` (`make_setup_hook`). Ray runs it in each worker before any task or actor:

- on the watcher's own node the worker's hooks write into the run directory as they would
  under the watcher (``<run>/<node>.<pid>.sqlite``);
- on any other node (no shared filesystem is assumed, and SQLite's WAL must not span
  machines) ``GPUPROF_RUN_DIR`` is pointed at a node-local spool directory
  (`spool_dir`), which the node's sampler actor tails and ships to the driver;
- the zero-code instrumentation is installed as the bootstrap installs it (the bootstrap
  file of the gpuprof installed on that node, loaded by path), and put on the
  ``PYTHONPATH`` of the worker's own child processes (vLLM engines, DataLoader workers);
- a ``worker_process_setup_hook`` the job set itself runs afterwards, unchanged: its errors
  are its own and reach Ray as they would have.

This module imports nothing but the standard library, and the hook is pickled *by value*
(`make_setup_hook` registers this module with Ray's cloudpickle): a node where gpuprof is not
installed still runs the job's own hook, and the worker prints one line instead of failing
(a failing setup hook makes Ray kill the worker). gpuprof itself is imported only by
processes that use it.
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import socket
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

ENV_RUN_DIR = "GPUPROF_RUN_DIR"
ENV_RUN_ID = "GPUPROF_RUN_ID"
"""The run's id (the run directory's name), the same on every node."""
ENV_SESSION = "GPUPROF_RAY_SESSION"
"""A token the driver draws at each ``ray.init``: keeps apart the spools of two runs that
share an id (``-o run`` used twice)."""
ENV_REFERENCE = "GPUPROF_RAY_REFERENCE_NODE"
"""The watcher's node name: its clock is the run's time axis, its files are local."""
ENV_REFERENCE_MACHINE = "GPUPROF_RAY_REFERENCE_MACHINE"
"""The real host name of the watcher's machine (where the run directory is)."""
ENV_SPOOL = "GPUPROF_SPOOL_DIR"
"""Optional, per node: where spool directories go (default: the temporary directory)."""
ENV_NODE = "GPUPROF_HOST"
ENV_AUTO = "GPUPROF_AUTO"

NOT_PROPAGATED = ("GPUPROF_HOST", "GPUPROF_DB", "GPUPROF_WATCHER_MACHINE",
                  "GPUPROF_SIM_CLOCK_SKEW_NS", "GPUPROF_STATUS_DIR")  # fmt: skip
"""Variables that describe the watcher's own node, file, status directory or clock: never
sent to other nodes through the job's ``runtime_env``."""

_said: set[str] = set()


def _line(message: str) -> None:
    """One line on stderr (Ray forwards a worker's stderr to the driver), once per process."""
    if message in _said:
        return
    _said.add(message)
    try:
        print(f"gpuprof: {message}", file=sys.stderr, flush=True)
    except Exception:
        pass


def node_name() -> str:
    """This node's name in the run (as `gpuprof.nodes.node_name`, without importing it)."""
    return os.environ.get(ENV_NODE) or socket.gethostname()


def spool_root() -> Path:
    """Where this node keeps spool directories: ``<GPUPROF_SPOOL_DIR or tmp>/gpuprof-spool``."""
    return Path(os.environ.get(ENV_SPOOL) or tempfile.gettempdir()) / "gpuprof-spool"


def spool_dir(run_id: str, session: str, node: str) -> Path:
    """The node-local directory where a node's worker hooks write until shipped:
    ``<spool root>/<run id>-<session>/<node>``."""
    safe = "".join(c if c.isalnum() or c in "-_." else "_" for c in run_id) or "run"
    return spool_root() / f"{safe}-{session}" / node


def is_reference(node: str, machine: str, own_name: bool, reference: str | None,
                 reference_machine: str | None) -> bool:  # fmt: skip
    """Whether a node is the watcher's: on the watcher's machine, and either called by the
    watcher's node name or without a name of its own (``own_name``: ``GPUPROF_HOST`` set
    there). Several simulated nodes on one machine differ by ``GPUPROF_HOST``."""
    if not reference or machine != reference_machine:
        return False
    return not own_name or node == reference


def on_reference_node() -> bool:
    """Whether this process runs on the watcher's node (see `is_reference`)."""
    env = os.environ
    return is_reference(node_name(), socket.gethostname(), bool(env.get(ENV_NODE)),
                        env.get(ENV_REFERENCE), env.get(ENV_REFERENCE_MACHINE))  # fmt: skip


def setup_worker() -> None:
    """Point this worker's hooks at the run (directly or through the spool) and install the
    zero-code instrumentation. Never raises: a failure is one line and the worker goes on
    unprofiled."""
    try:
        _setup()
    except Exception as exc:
        _line(f"Ray worker setup failed on {node_name()} ({type(exc).__name__}: {exc}); "
              "this worker runs unprofiled")  # fmt: skip


def _setup() -> None:
    run_dir = os.environ.get(ENV_RUN_DIR)
    if not run_dir:
        return
    try:  # locates the package without importing it
        spec = importlib.util.find_spec("gpuprof")
    except (ImportError, ValueError):
        spec = None
    if spec is None or not spec.submodule_search_locations:
        os.environ.pop(ENV_RUN_DIR, None)
        _line(f"gpuprof is not installed on Ray node {node_name()}: its workers are not "
              "profiled (install gpuprof on every node)")  # fmt: skip
        return
    if on_reference_node():
        reference = os.environ[ENV_REFERENCE]
        if not os.environ.get(ENV_NODE) and socket.gethostname() != reference:
            # the watcher was given a node name this raylet does not know: rows must agree
            os.environ[ENV_NODE] = reference
    else:
        run_id = os.environ.get(ENV_RUN_ID) or Path(run_dir).name
        spool = spool_dir(run_id, os.environ.get(ENV_SESSION) or "0", node_name())
        spool.mkdir(parents=True, exist_ok=True)
        os.environ[ENV_RUN_DIR] = str(spool)
        hooks = sys.modules.get("gpuprof.hooks")
        if hooks is not None and getattr(hooks, "_checked", False):
            hooks.init(spool)  # gpuprof was used before this hook ran: re-point it
    if os.environ.get(ENV_AUTO, "1") != "0":
        _install_bootstrap(Path(spec.submodule_search_locations[0]))


def _install_bootstrap(package_dir: Path) -> None:
    """Load the bootstrap of the gpuprof installed here (its import hook patches frameworks
    as they are imported) and put it on the ``PYTHONPATH`` of this worker's children."""
    boot = package_dir / "integrations" / "bootstrap"
    path = os.environ.get("PYTHONPATH", "")
    if str(boot) not in path.split(os.pathsep):
        os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(boot), path]))
    if any(getattr(f, "gpuprof_bootstrap", False) for f in sys.meta_path):
        return  # this process started with the bootstrap already (a local cluster)
    spec = importlib.util.spec_from_file_location("_gpuprof_bootstrap", boot / "sitecustomize.py")
    if spec is None or spec.loader is None:
        raise ImportError(f"no bootstrap at {boot}")
    module = importlib.util.module_from_spec(spec)
    sys.modules["_gpuprof_bootstrap"] = module
    spec.loader.exec_module(module)


def call_hook(hook: Any) -> Any:
    """Run a ``worker_process_setup_hook`` as Ray would: a callable, or ``"module.function"``."""
    if isinstance(hook, str):
        module, _, attr = hook.rpartition(".")
        return getattr(importlib.import_module(module), attr)()
    return hook()


def make_setup_hook(user_hook: Any = None) -> Callable[[], None]:
    """The job's ``worker_process_setup_hook``: gpuprof's set-up, then ``user_hook`` (the
    hook the job set, a callable or a ``"module.function"`` string, or None)."""

    def gpuprof_worker_setup() -> None:
        setup_worker()
        if user_hook is not None:
            call_hook(user_hook)  # the job's own hook: its errors are its own

    gpuprof_worker_setup.__gpuprof_hook__ = True  # type: ignore[attr-defined]
    return gpuprof_worker_setup
