"""The job's ``runtime_env`` with gpuprof's additions merged in, never replacing the job's.

- ``env_vars``: the job's variables stay as they are; gpuprof adds the run's directory, id
  and reference node (`run_env_vars`) where the job did not set them. Variables that name
  the watcher's own node, file or clock (`setup_hook.NOT_PROPAGATED`) are never added, and
  are taken out when the job copied them from the driver's environment
  (``env_vars=dict(os.environ)``): on another node they would be wrong.
- ``worker_process_setup_hook``: gpuprof's hook, which runs the job's own hook (a callable
  or a ``"module.function"`` string) after its own set-up (`setup_hook.make_setup_hook`).
- every other field (``pip``, ``working_dir``, ``py_modules``, ``container``…) is untouched.
"""

from __future__ import annotations

import os
import socket
import sys
from collections.abc import Mapping
from typing import Any

from gpuprof.integrations.ray_cluster import setup_hook

SETUP_HOOK_KEY = "worker_process_setup_hook"
RAY_HOOK_ENV = "__RAY_WORKER_PROCESS_SETUP_HOOK_ENV_VAR"
"""Ray's own variable for an already exported setup hook (reserved by Ray)."""


def run_env_vars(run_dir: str, run_id: str, session: str, reference: str) -> dict[str, str]:
    """What every worker of the job needs to know about the run."""
    return {
        setup_hook.ENV_RUN_DIR: run_dir,
        setup_hook.ENV_RUN_ID: run_id,
        setup_hook.ENV_SESSION: session,
        setup_hook.ENV_REFERENCE: reference,
        setup_hook.ENV_REFERENCE_MACHINE: socket.gethostname(),
    }


def merge(runtime_env: Mapping[str, Any] | None, env_vars: Mapping[str, str], *,
          with_hook: bool = True) -> tuple[dict[str, Any], list[str]]:  # fmt: skip
    """``runtime_env`` (the job's, may be None) with gpuprof's ``env_vars`` and setup hook
    merged in; and lines saying what could not be added. The job's mapping is not modified."""
    merged = dict(runtime_env or {})
    lines: list[str] = []
    job_vars = dict(merged.get("env_vars") or {})
    for name in setup_hook.NOT_PROPAGATED:
        if name in job_vars and job_vars[name] == os.environ.get(name):
            del job_vars[name]  # copied from this driver's environment: names this node only
    for name, value in env_vars.items():
        job_vars.setdefault(name, value)
    merged["env_vars"] = job_vars
    if not with_hook:
        return merged, lines
    if RAY_HOOK_ENV in job_vars:
        lines.append("the job's runtime_env already carries an exported setup hook: Ray "
                     "workers are not instrumented")  # fmt: skip
        return merged, lines
    user_hook = merged.get(SETUP_HOOK_KEY)
    if getattr(user_hook, "__gpuprof_hook__", False):
        return merged, lines  # ours already (ray.init called again with the merged env)
    merged[SETUP_HOOK_KEY] = setup_hook.make_setup_hook(user_hook)
    return merged, lines


def pickle_hook_by_value(ray: Any) -> bool:
    """Make Ray's cloudpickle send the setup hook's code itself rather than a reference to
    gpuprof (a node without gpuprof could not load a reference, and Ray kills a worker whose
    setup hook fails). False when this Ray's cloudpickle cannot."""
    register = getattr(getattr(ray, "cloudpickle", None), "register_pickle_by_value", None)
    if register is None:
        return False
    try:
        register(sys.modules[setup_hook.__name__])
    except Exception:
        return False
    return True
