"""Each framework's vocabulary: its phase names, command line, and the knobs parsed from it.

Pathologies set generic settings (``gpu_memory_utilization`` 0.3, ``param_offload`` True…);
this module spells them with each framework's own flag names, so a simulated run's
``RunMeta.knobs`` looks like what the knob parser would read from a real command line.
"""

from __future__ import annotations

from typing import Any

from gpuprof.frameworks import MODULES

PHASE_NAMES: dict[str, dict[str, str]] = {
    name: mod.SIM_PHASE_NAMES for name, mod in MODULES.items() if hasattr(mod, "SIM_PHASE_NAMES")
}
"""Framework -> canonical phase -> the name its own timers/profiling contexts use."""

FLAGS: dict[str, dict[str, str]] = {}
"""Generic setting -> framework -> flag name as the framework spells it (absent: no such flag),
from each framework module's ``SIM_FLAGS``."""
for _name, _mod in MODULES.items():
    for _generic, _flag in _mod.SIM_FLAGS.items():
        FLAGS.setdefault(_generic, {})[_name] = _flag

_ENTRY: dict[str, list[str]] = {name: list(mod.SIM_ENTRY) for name, mod in MODULES.items()}


def _spelled(framework: str, generic: str, value: Any) -> Any:
    """The value as the framework's flag takes it (TRL/ms-swift ``vllm_mode`` is a word)."""
    if generic == "colocate" and framework in ("trl", "swift"):
        return "colocate" if value else "server"
    if generic == "micro_batch_size_per_gpu" and framework == "trl":
        # TRL has no micro-batch flag; a tiny micro batch shows as many accumulation steps
        return max(1, 16 // int(value))
    return value


def build_command(
    framework: str, settings: dict[str, Any], gpus: int, gpus_per_host: int, algorithm: str
) -> tuple[list[str], dict[str, Any]]:
    """The command line (argv) and the knobs parsed from it, keyed by the framework's flag names.

    ``settings`` maps generic names (keys of `FLAGS`) to values; settings the framework has
    no flag for are left out of both.
    """
    argv = list(_ENTRY[framework])
    knobs: dict[str, Any] = {}
    per_node = min(gpus, gpus_per_host)  # the launcher's processes per node
    if framework == "pytorch":
        argv.insert(1, f"--nproc_per_node={per_node}")
        argv += ["--model_name_or_path", "Qwen/Qwen2.5-3B-Instruct"]
        knobs["nproc_per_node"] = per_node
    elif framework == "trl":
        argv[2:2] = ["--num_processes", str(per_node)]
        knobs["num_processes"] = per_node
    if framework == "verl":
        adv = "grpo" if algorithm == "grpo" else "gae"
        argv.append(f"algorithm.adv_estimator={adv}")
        argv.append(f"trainer.n_gpus_per_node={per_node}")
        knobs["trainer.n_gpus_per_node"] = per_node
        argv.append(f"trainer.nnodes={-(-gpus // gpus_per_host)}")
        argv.append("actor_rollout_ref.model.path=Qwen/Qwen2.5-3B-Instruct")
        knobs["algorithm.adv_estimator"] = adv
    elif framework in ("trl", "swift"):
        argv += ["--model", "Qwen/Qwen2.5-3B-Instruct", "--use_vllm", "true"]
        knobs["use_vllm"] = True
    elif framework == "openrlhf":
        argv += ["--actor.pretrain", "Qwen/Qwen2.5-3B-Instruct"]
        argv += ["--vllm.num_engines", str(max(1, gpus // 2))]
        knobs["vllm.num_engines"] = max(1, gpus // 2)
    for generic, value in settings.items():
        flag = FLAGS.get(generic, {}).get(framework)
        if flag is None or value is None:
            continue
        value = _spelled(framework, generic, value)
        knobs[flag] = value
        if framework == "verl":
            argv.append(f"{flag}={value}")
        elif isinstance(value, bool) and framework == "openrlhf":
            if value:  # OpenRLHF booleans are store_true switches
                argv.append(f"--{flag}")
        else:
            text = str(value).lower() if isinstance(value, bool) else str(value)
            argv += [f"--{flag}", text]
    return argv, knobs
