"""The injectable pathologies: how each one changes a healthy step plan.

A `Plan` is the healthy job (phase durations, per-phase metric levels, CPU levels, settings);
each pathology edits it at severity ``s`` so the evidence DESIGN.md names appears, and says
what it costs through ``Plan.extra`` (seconds added to a phase, and which share of them is
lost GPU time) or through the structural fields (straggler, throttle, bubble, gap, periodic)
that `gpuprof.sim.cluster` turns into lost GPU-seconds while it lays out the timeline.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from gpuprof.sim.config import FRAMEWORKS, Pathology, SimConfig

COMPUTE_PHASES = (
    "rollout",
    "old_logprob",
    "ref_logprob",
    "values",
    "update_actor",
    "update_critic",
)
TRAIN_COMPUTE = ("old_logprob", "ref_logprob", "values", "update_actor", "update_critic")
TAIL_DECAY = 4.0
"""Exponential decay rate of rollout utilisation over the tail (per unit of tail length)."""


@dataclass
class Level:
    """Metric levels of a GPU while its rank is in one phase.

    ``util`` in % (NVML utilization.gpu), ``sm_ratio`` = SM activity / util, ``mem_frac`` of
    total memory, PCIe/NVLink in bytes/s per direction, ``power_w`` in watts. Over the last
    ``tail_frac`` of a span, util decays exponentially to ``tail_floor`` × util.
    """

    util: float
    sm_ratio: float
    mem_frac: float
    pcie_bps: float
    nvlink_bps: float
    power_w: float
    tail_frac: float = 0.0
    tail_floor: float = 1.0


def healthy_levels(tp: int) -> dict[str, Level]:
    """Per-phase levels of a well-tuned colocated job on H100-class GPUs."""
    nvl_tp = 40e9 if tp > 1 else 0.0  # tensor-parallel all-reduce traffic during generation
    return {
        "dataload": Level(0.0, 0.0, 0.40, 0.3e9, 0.0, 90.0),
        # healthy generation still thins out a little at the end (a short, shallow tail)
        "rollout": Level(93.0, 0.62, 0.89, 0.5e9, nvl_tp, 520.0, 0.08, 0.55),
        "reward": Level(0.0, 0.0, 0.40, 0.1e9, 0.0, 90.0),
        "old_logprob": Level(97.0, 0.75, 0.60, 0.5e9, 60e9, 600.0),
        "ref_logprob": Level(97.0, 0.75, 0.60, 0.5e9, 60e9, 600.0),
        "values": Level(97.0, 0.75, 0.60, 0.5e9, 60e9, 600.0),
        "advantage": Level(3.0, 0.3, 0.45, 0.1e9, 0.0, 100.0),
        "update_actor": Level(98.0, 0.80, 0.80, 1.0e9, 120e9, 650.0),
        "update_critic": Level(98.0, 0.80, 0.80, 1.0e9, 120e9, 650.0),
        # weight sync: compute idle, a burst of bytes over PCIe/NVLink
        "reshard": Level(8.0, 0.15, 0.85, 20e9, 200e9, 180.0),
        "checkpoint": Level(1.0, 0.1, 0.80, 12e9, 0.0, 110.0),
        "eval": Level(85.0, 0.55, 0.85, 0.5e9, nvl_tp, 480.0),
    }


@dataclass
class Extra:
    """Seconds a pathology adds to a phase each step; ``lost`` is the share of them wasted."""

    kind: str
    seconds: float
    lost: float = 1.0


@dataclass
class Plan:
    """The job to lay out: durations (s), levels, CPU levels, settings and injected stalls."""

    dur: dict[str, float]
    levels: dict[str, Level]
    settings: dict[str, Any]
    extra: dict[str, list[Extra]] = field(default_factory=dict)
    host_cpu: dict[str, float] = field(default_factory=dict)
    """Phase -> system CPU % of the host (0–100 over all cores); default 6."""
    proc_cpu: dict[str, dict[str, float]] = field(default_factory=dict)
    """Role -> phase -> % of one core; ``*`` is the default phase."""
    straggler: tuple[int, float] | None = None
    """(rank, slow-down factor of its compute phases)."""
    throttle: tuple[np.ndarray, float] | None = None
    """(throttled GPU indices, SM clock ratio)."""
    throttle_bits: int = 0
    throttle_temp_c: float = 0.0
    bubble: float = 0.0
    """Split placement: share of the rollout the trainer waits for before starting (0 = async)."""
    gap_s: float = 0.0
    """Idle seconds per step outside every phase span (after reward)."""
    periodic: tuple[int, float, float] | None = None
    """(every N steps, checkpoint seconds, eval seconds)."""
    collective_frac: float = 0.08
    """Share of each update span spent in NCCL collective child spans."""
    response_len: tuple[float, float] = (900.0, 1400.0)
    """(mean, max) response length in tokens."""
    clip_ratio: float = 0.01
    unused: list[int] = field(default_factory=list)
    """GPUs given to the job that it never runs work on (the last ones of the job)."""
    phantom: list[int] = field(default_factory=list)
    """GPUs stuck busy (100 %, no memory, no process) that the job therefore can't use."""
    hot: tuple[int, float, float, int] | None = None
    """(GPU index, SM clock ratio, °C above its peers, clock-event bits) of a badly cooled GPU."""
    power_cap: tuple[float, float, float] | None = None
    """(power limit W, the board's default W, SM clock ratio at the cap) on every GPU."""
    hang: tuple[int, float] | None = None
    """(step, seconds): every GPU idles with nothing running after that step's weight sync."""
    scope: dict[str, tuple[list[str], list[int] | None]] = field(default_factory=dict)
    """Kind -> (affected phases, affected GPUs or None for all)."""

    def add_extra(self, phase: str, kind: str, seconds: float, lost: float = 1.0) -> None:
        self.extra.setdefault(phase, []).append(Extra(kind, seconds, lost))


def healthy_plan(config: SimConfig) -> Plan:
    """The healthy job for a config: durations scaled by ``time_scale``, tuned settings."""
    dur = {k: v * config.time_scale for k, v in config.phase_s.items()}
    tp = 2 if config.gpus >= 2 else 1
    settings: dict[str, Any] = {
        "gpu_memory_utilization": 0.85,
        "tensor_parallel_size": tp,
        "train_batch_size": 256 if config.framework == "verl" else 8,
        "num_generations": 8,
        "max_response_length": 4096,
        # the frameworks' defaults: verl loads with 8 workers, transformers-based trainers
        # (TRL, ms-swift) and OpenRLHF with none; prompts are cheap to load either way
        "dataloader_num_workers": 8 if config.framework == "verl" else 0,
        "param_offload": False,
        "optimizer_offload": False,
        "update_weights_bucket_megabytes": 2048,
        "ds3_gather_for_generation": True,
        "use_dynamic_bsz": True,
        "micro_batch_size_per_gpu": 8,
        "reward_manager": "batch",
        "save_freq": -1,
        "test_freq": -1,
        "colocate": config.effective_placement == "colocated",
        "async_generate": config.effective_placement == "split",
        "fsdp_size": min(config.gpus, config.gpus_per_host),
    }
    return Plan(
        dur=dur,
        levels=healthy_levels(tp),
        settings=settings,
        host_cpu={"*": 6.0, "reward": 12.0, "dataload": 8.0},
        proc_cpu={
            "main": {"*": 15.0, "reward": 40.0, "dataload": 20.0},
            # CUDA spin-wait, NCCL and intra-op threads keep a trainer at a core or more
            "trainer": {"*": 100.0, **dict.fromkeys(COMPUTE_PHASES, 115.0)},
            "inference": {"*": 5.0, "rollout": 60.0},
            "dataloader": {"*": 2.0, "dataload": 25.0},
        },
    )


# --------------------------------------------------------------------------------------------
# One function per stall kind: edit the plan at severity s in [0, 1].

ApplyFn = Callable[[Plan, float, SimConfig, np.random.Generator], None]


def _reshard_idle(plan: Plan, s: float, cfg: SimConfig, rng: np.random.Generator) -> None:
    # tiny weight-sync buckets: many small transfers, GPUs idle in between
    plan.add_extra("reshard", "reshard_idle", s * 0.35 * plan.dur["rollout"])
    plan.settings["update_weights_bucket_megabytes"] = round(2048 - 1984 * s)
    plan.settings["ds3_gather_for_generation"] = s < 0.3
    plan.levels["reshard"].util = 8.0 - 5.0 * s
    plan.scope["reshard_idle"] = (["reshard"], None)


def _pipeline_bubble(plan: Plan, s: float, cfg: SimConfig, rng: np.random.Generator) -> None:
    # split placement run synchronously: the trainer waits for a share s of each rollout
    plan.bubble = s
    plan.settings["colocate"] = False
    plan.settings["async_generate"] = s < 0.5
    plan.scope["pipeline_bubble"] = (["rollout", *TRAIN_COMPUTE], None)


def _dataloader_starvation(plan: Plan, s: float, cfg: SimConfig, rng: np.random.Generator) -> None:
    plan.add_extra("dataload", "dataloader_starvation", s * 0.3 * plan.dur["rollout"])
    plan.settings["dataloader_num_workers"] = 0 if s >= 0.5 else 1
    plan.proc_cpu["dataloader"]["dataload"] = 100.0  # the one loading process is saturated
    plan.proc_cpu["main"]["dataload"] = 100.0 if s >= 0.5 else 60.0
    plan.host_cpu["dataload"] = 10.0
    plan.scope["dataloader_starvation"] = (["dataload"], None)


def _reward_bound(plan: Plan, s: float, cfg: SimConfig, rng: np.random.Generator) -> None:
    # rule checks / sandboxes on the CPU while every GPU waits
    plan.add_extra("reward", "reward_bound", s * 0.6 * plan.dur["rollout"])
    plan.host_cpu["reward"] = 15.0 + 80.0 * s
    plan.proc_cpu["main"]["reward"] = 100.0
    plan.settings["reward_manager"] = "naive"
    plan.scope["reward_bound"] = (["reward"], None)


def tail_mean(floor: float, decay: float = TAIL_DECAY) -> float:
    """Mean of the tail's utilisation profile, as a share of the full level (0–1)."""
    return floor + (1.0 - floor) * (1.0 - np.exp(-decay)) / decay


def _generation_tail(plan: Plan, s: float, cfg: SimConfig, rng: np.random.Generator) -> None:
    rollout = plan.dur["rollout"]
    tail_s = s * 0.6 * rollout
    level = plan.levels["rollout"]
    level.tail_frac = max(level.tail_frac, tail_s / (rollout + tail_s))
    level.tail_floor = 0.03  # a few sequences left: a few % utilisation
    plan.add_extra("rollout", "generation_tail", tail_s, lost=1.0 - tail_mean(level.tail_floor))
    mean = plan.response_len[0]
    plan.settings["max_response_length"] = 16384 if s >= 0.2 else 8192
    plan.response_len = (mean, min(mean * (1.5 + 12.0 * s), plan.settings["max_response_length"]))
    plan.clip_ratio = 0.01 + 0.2 * s
    plan.scope["generation_tail"] = (["rollout"], None)


def _memory_headroom(plan: Plan, s: float, cfg: SimConfig, rng: np.random.Generator) -> None:
    # small KV cache: fewer sequences in flight, so generation takes longer
    gmu = round(0.85 - 0.55 * s, 2)
    plan.settings["gpu_memory_utilization"] = gmu
    plan.settings["micro_batch_size_per_gpu"] = 8 if s < 0.5 else 2
    plan.add_extra("rollout", "memory_headroom", s * 0.5 * plan.dur["rollout"])
    lv = plan.levels
    lv["rollout"].mem_frac = gmu + 0.04
    lv["rollout"].util *= 1.0 - 0.25 * s
    lv["eval"].mem_frac = gmu + 0.04
    for phase in TRAIN_COMPUTE:
        lv[phase].mem_frac -= 0.4 * s
    lv["reshard"].mem_frac = max(gmu + 0.04, lv["update_actor"].mem_frac)
    plan.scope["memory_headroom"] = (["rollout", "update_actor"], None)


def _offload_thrash(plan: Plan, s: float, cfg: SimConfig, rng: np.random.Generator) -> None:
    plan.settings["param_offload"] = True
    plan.settings["optimizer_offload"] = s >= 0.4
    for phase in ("update_actor", "update_critic"):
        plan.add_extra(phase, "offload_thrash", s * 1.0 * plan.dur[phase])
        lv = plan.levels[phase]
        lv.pcie_bps = 6e9 + 18e9 * s  # toward the ~25 GB/s a PCIe Gen4 x16 link carries
        lv.sm_ratio = 0.8 - 0.6 * s
        lv.util = 98.0 - 45.0 * s  # host<->device copies are not kernels
        lv.mem_frac -= 0.3 * s
    plan.scope["offload_thrash"] = (["update_actor", "update_critic"], None)


def _comm_bound(plan: Plan, s: float, cfg: SimConfig, rng: np.random.Generator) -> None:
    for phase in ("update_actor", "update_critic"):
        base = plan.dur[phase]
        plan.add_extra(phase, "comm_bound", s * 0.8 * base)
        lv = plan.levels[phase]
        lv.nvlink_bps = 120e9 + 300e9 * s  # toward the 450 GB/s per direction of NVLink 4
        lv.pcie_bps = 1e9 + (20e9 * s if cfg.gpus > cfg.gpus_per_host else 0.0)  # a 200 Gb/s NIC
        lv.sm_ratio = 0.8 - 0.6 * s
    plan.collective_frac = 0.08 + 0.6 * s
    plan.settings["fsdp_size"] = -1 if s >= 0.3 else plan.settings["fsdp_size"]
    plan.scope["comm_bound"] = (["update_actor", "update_critic"], None)


def _host_bound(plan: Plan, s: float, cfg: SimConfig, rng: np.random.Generator) -> None:
    # tiny micro-batches: the Python thread launching kernels is the bottleneck
    factor = 1.0 + 0.8 * s
    for phase in TRAIN_COMPUTE:
        plan.add_extra(phase, "host_bound", plan.dur[phase] * (factor - 1.0))
        plan.levels[phase].util /= factor
        plan.levels[phase].sm_ratio *= 0.7
        plan.proc_cpu["trainer"][phase] = 55.0 + 44.0 * min(1.0, 2.0 * s)
    plan.proc_cpu["main"].update(dict.fromkeys(TRAIN_COMPUTE, 99.0))
    plan.settings["micro_batch_size_per_gpu"] = 1
    plan.settings["use_dynamic_bsz"] = False
    plan.scope["host_bound"] = (list(TRAIN_COMPUTE), None)


def _imbalance(plan: Plan, s: float, cfg: SimConfig, rng: np.random.Generator) -> None:
    # under split placement the straggler is a trainer rank (the rollout GPUs come first)
    rank = int(rng.integers(cfg.n_rollout_gpus, cfg.gpus)) if cfg.gpus > 1 else 0
    plan.straggler = (rank, 1.0 + 0.6 * s)
    plan.settings["use_dynamic_bsz"] = False
    plan.scope["imbalance"] = (list(COMPUTE_PHASES), [rank])


def _throttling(plan: Plan, s: float, cfg: SimConfig, rng: np.random.Generator) -> None:
    n_hosts = len(cfg.hosts)
    if n_hosts > 1:  # one hot node
        h = int(rng.integers(n_hosts))
        gpus = np.arange(h * cfg.gpus_per_host, min(cfg.gpus, (h + 1) * cfg.gpus_per_host))
    else:
        gpus = np.arange(cfg.gpus)
    plan.throttle = (gpus, 1.0 - 0.35 * s)
    # SW power cap, plus SW thermal (mild) or HW thermal slowdown (severe)
    plan.throttle_bits = 0x4 | (0x40 if s >= 0.5 else 0x20)
    plan.throttle_temp_c = 12.0 + 18.0 * s
    plan.scope["throttling"] = (list(COMPUTE_PHASES), gpus.tolist())


def _periodic_stall(plan: Plan, s: float, cfg: SimConfig, rng: np.random.Generator) -> None:
    every = max(1, min(5, cfg.steps // 2))
    rollout = plan.dur["rollout"]
    plan.periodic = (every, s * 0.6 * rollout, s * 0.3 * rollout)
    plan.settings["save_freq"] = every
    plan.settings["test_freq"] = every
    plan.scope["periodic_stall"] = (["checkpoint", "eval"], None)


def _idle_unattributed(plan: Plan, s: float, cfg: SimConfig, rng: np.random.Generator) -> None:
    # e.g. metric logging / host-side bookkeeping nobody wrapped in a phase
    plan.gap_s = s * 0.3 * plan.dur["rollout"]
    plan.scope["idle_unattributed"] = ([], None)


def _unused_gpu(plan: Plan, s: float, cfg: SimConfig, rng: np.random.Generator) -> None:
    # e.g. torchrun --nproc_per_node one short of the GPUs the scheduler handed out
    n = 1 if s < 0.7 or cfg.gpus < 4 else 2
    plan.unused = list(range(cfg.gpus - n, cfg.gpus))
    plan.scope["unused_gpu"] = ([], plan.unused)


def _phantom_util(plan: Plan, s: float, cfg: SimConfig, rng: np.random.Generator) -> None:
    # e.g. GPUs left stuck at 100 % by an earlier job killed mid-collective: the scheduler
    # hands them out, the launcher skips them (they read busy), they do nothing
    n = 1 if s < 0.7 or cfg.gpus < 4 else 2
    plan.phantom = list(range(cfg.gpus - n, cfg.gpus))
    plan.scope["phantom_util"] = ([], plan.phantom)


def _hot_gpu(plan: Plan, s: float, cfg: SimConfig, rng: np.random.Generator) -> None:
    # e.g. a failing fan: one GPU at 15–30 °C above its peers, thermally slowed, and the
    # data-parallel job waits for it every step
    gpu = int(rng.integers(cfg.gpus)) if cfg.gpus > 1 else 0
    bits = 0x40 if s >= 0.5 else 0x20  # HW thermal (severe) or SW thermal slowdown
    plan.hot = (gpu, 1.0 - 0.35 * s, 15.0 + 15.0 * s, bits)
    plan.scope["hot_gpu"] = (list(COMPUTE_PHASES), [gpu])


def _power_cap(plan: Plan, s: float, cfg: SimConfig, rng: np.random.Generator) -> None:
    # e.g. `nvidia-smi -pl` lowered to fit a rack's power budget: every GPU held at it during
    # compute, the SW power cap cutting the clocks
    default = 700.0
    limit = default * (1.0 - 0.45 * s)
    plan.power_cap = (limit, default, 1.0 - 0.3 * s)
    plan.scope["power_cap"] = (list(COMPUTE_PHASES), None)


def _idle_allocation(plan: Plan, s: float, cfg: SimConfig, rng: np.random.Generator) -> None:
    # e.g. a collective that hangs until a timeout, or a wait on storage: minutes, whatever
    # the step length (25 min at full severity; below s = 0.2 shorter than the 5 min that
    # make an idle allocation, a near miss)
    plan.hang = (min(1, cfg.steps - 1), 1500.0 * s)
    plan.scope["idle_allocation"] = ([], None)


def _update_bound(plan: Plan, s: float, cfg: SimConfig, rng: np.random.Generator) -> None:
    # thin, padded micro-batches: kernels keep running (util stays high) but each does little
    # model work, so the same trained tokens take 1.5x (a near miss: MFU ~29%) to 7x as long
    plan.add_extra("update_actor", "update_bound", (0.5 + 5.5 * s) * plan.dur["update_actor"])
    plan.settings["use_dynamic_bsz"] = False
    plan.settings["micro_batch_size_per_gpu"] = 1
    lv = plan.levels["update_actor"]
    lv.sm_ratio = 0.8 - 0.5 * s
    plan.scope["update_bound"] = (["update_actor"], None)


def _rollout_bound(plan: Plan, s: float, cfg: SimConfig, rng: np.random.Generator) -> None:
    # a small KV cache (the engine given 30% of memory) caps the running batch: the engine
    # stays busy but each decode iteration reads the weights for few sequences, so the same
    # generated tokens take 1.2x (a near miss) to 5x as long
    plan.add_extra("rollout", "rollout_bound", (0.2 + 3.8 * s) * plan.dur["rollout"])
    plan.settings["gpu_memory_utilization"] = 0.3
    plan.scope["rollout_bound"] = (["rollout"], None)


def _healthy(plan: Plan, s: float, cfg: SimConfig, rng: np.random.Generator) -> None:
    """No stall: the healthy plan as it is."""


PATHOLOGIES: dict[str, ApplyFn] = {
    "healthy": _healthy,
    "reshard_idle": _reshard_idle,
    "pipeline_bubble": _pipeline_bubble,
    "dataloader_starvation": _dataloader_starvation,
    "reward_bound": _reward_bound,
    "generation_tail": _generation_tail,
    "memory_headroom": _memory_headroom,
    "offload_thrash": _offload_thrash,
    "comm_bound": _comm_bound,
    "host_bound": _host_bound,
    "imbalance": _imbalance,
    "throttling": _throttling,
    "periodic_stall": _periodic_stall,
    "idle_unattributed": _idle_unattributed,
    "unused_gpu": _unused_gpu,
    "idle_allocation": _idle_allocation,
    "rollout_bound": _rollout_bound,
    "update_bound": _update_bound,
    "phantom_util": _phantom_util,
    "hot_gpu": _hot_gpu,
    "power_cap": _power_cap,
}
"""Stall kind -> function editing a `Plan` at a severity. ``healthy`` injects nothing."""

STALL_KINDS: tuple[str, ...] = tuple(k for k in PATHOLOGIES if k != "healthy")


def build_plan(config: SimConfig, rng: np.random.Generator) -> Plan:
    """The healthy plan with every pathology of the config applied, in the config's order."""
    plan = healthy_plan(config)
    for p in config.pathologies:
        if p.kind not in PATHOLOGIES:
            raise ValueError(f"unknown pathology {p.kind!r}; known: {sorted(PATHOLOGIES)}")
        PATHOLOGIES[p.kind](plan, p.severity, config, rng)
    return plan


_MULTI_GPU = ("pipeline_bubble", "imbalance", "unused_gpu", "phantom_util", "hot_gpu")


def random_config(
    rng: np.random.Generator,
    kinds: Sequence[str] | None = None,
    *,
    max_pathologies: int = 3,
    gpus: Sequence[int] = (1, 2, 4, 8, 16, 32),
    steps: tuple[int, int] = (4, 12),
    severity: tuple[float, float] = (0.2, 1.0),
    time_scale: tuple[float, float] = (0.05, 0.3),
    healthy_share: float = 0.1,
) -> SimConfig:
    """A randomised scenario for the diagnosis-accuracy benchmark.

    Draws 0 (with probability ``healthy_share``) to ``max_pathologies`` distinct kinds from
    ``kinds`` (default: every stall kind) with severities uniform in ``severity``, a framework,
    a GPU count from ``gpus``, a step count and a time scale (shorter runs stay fast).
    """
    pool = list(kinds) if kinds is not None else list(STALL_KINDS)
    pool = [k for k in pool if k != "healthy"]
    n_gpus = int(rng.choice(list(gpus)))
    if n_gpus < 2:  # these need more than one GPU to exist
        pool = [k for k in pool if k not in _MULTI_GPU] or pool
    n = 0 if not pool or rng.random() < healthy_share else int(rng.integers(1, max_pathologies + 1))
    chosen = list(rng.choice(pool, size=min(n, len(pool)), replace=False)) if n else []
    if n_gpus < 2 and any(k in _MULTI_GPU for k in chosen):
        n_gpus = 2
    if {"unused_gpu", "phantom_util"} & set(chosen) and len(chosen) > 1 and n_gpus < 4:
        n_gpus = 4  # a bubble or a straggler needs two GPUs besides the unused one
    pathologies = [Pathology(str(k), float(rng.uniform(*severity))) for k in chosen]
    placement = "split" if "pipeline_bubble" in chosen else "colocated"
    return SimConfig(
        gpus=n_gpus,
        framework=str(rng.choice(list(FRAMEWORKS))),
        placement=placement,
        algorithm="ppo" if rng.random() < 0.2 else "grpo",
        steps=int(rng.integers(steps[0], steps[1] + 1)),
        time_scale=float(rng.uniform(*time_scale)),
        pathologies=pathologies,
        seed=int(rng.integers(2**31)),
    )
