"""Typed evidence: one dataclass per stall kind, produced by its detector and read by the knob
rules of the recommender.

Every class has the three fields every finding carries — ``intervals`` (``[[start_ns,
end_ns], …]``, the worst stretches, for "zoom to evidence"), ``gpus`` (``"host:index"``) and
``phases`` — plus ``basis``: what the figures were measured from (``"gpu_samples"``: NVML or
trace samples aligned with phase spans; ``"phase_timing"``: a framework's per-step phase times
alone, with no GPU samples). The other fields are that kind's figures, units in their names;
``None`` means "not measured".

An `Evidence` is also a read-only mapping of its field names, so renderers and the JSON output
treat it like the dict it serialises to (`to_dict`); a misspelt field is an ``AttributeError``
at the producer and a ``KeyError`` at a reader, never a silent fallback.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field, fields
from typing import Any, ClassVar

GPU_SAMPLES = "gpu_samples"
PHASE_TIMING = "phase_timing"


@dataclass(kw_only=True)
class Evidence(Mapping[str, Any]):
    """Fields every finding has; subclasses add their kind's figures."""

    kind: ClassVar[str] = ""
    intervals: list[list[int]] = field(default_factory=list)
    gpus: list[str] = field(default_factory=list)
    phases: list[str] = field(default_factory=list)
    basis: str = GPU_SAMPLES

    @classmethod
    def field_names(cls) -> tuple[str, ...]:
        return tuple(f.name for f in fields(cls))

    def __getitem__(self, key: str) -> Any:
        if key in self.field_names():
            return getattr(self, key)
        raise KeyError(key)

    def __iter__(self) -> Iterator[str]:
        return iter(self.field_names())

    def __len__(self) -> int:
        return len(self.field_names())

    def to_dict(self) -> dict[str, Any]:
        """The JSON-able dict of the ``gpuprof analyze --json`` document."""
        return {name: getattr(self, name) for name in self.field_names()}


@dataclass(kw_only=True)
class ReshardIdleEvidence(Evidence):
    kind: ClassVar[str] = "reshard_idle"
    reshard_gpu_s: float | None = None
    reshard_idle_gpu_s: float | None = None
    reshard_util_gpu_pct: float | None = None
    reshard_span_mean_s: float | None = None
    reshard_syncs: int | None = None
    reshard_share_of_step: float | None = None
    weight_bytes: float | None = None
    effective_bandwidth_bytes_s: float | None = None
    pcie_bytes_s: float | None = None
    nvlink_bytes_s: float | None = None
    link_burst: bool | None = None
    waiting_gpus_idle_gpu_s: float | None = None
    allowance_share: float | None = None
    crosses_nodes: bool | None = None


@dataclass(kw_only=True)
class PipelineBubbleEvidence(Evidence):
    kind: ClassVar[str] = "pipeline_bubble"
    bubble_idle_gpu_s: float | None = None
    serial_extra_gpu_s: float | None = None
    idle_gpus_frac_in_bubble: float | None = None
    bubble_time_share: float | None = None


@dataclass(kw_only=True)
class DataloaderStarvationEvidence(Evidence):
    kind: ClassVar[str] = "dataloader_starvation"
    dataload_idle_gpu_s: float | None = None
    dataload_share_of_step: float | None = None
    loader_cpu_pct: float | None = None
    main_cpu_pct: float | None = None
    dataloader_num_workers: int | None = None
    loader_saturated: bool | None = None
    loader_ops: int | None = None
    allowance_share: float | None = None


@dataclass(kw_only=True)
class RewardBoundEvidence(Evidence):
    kind: ClassVar[str] = "reward_bound"
    reward_gpu_s: float | None = None
    reward_idle_gpu_s: float | None = None
    reward_util_gpu_pct: float | None = None
    reward_share_of_step: float | None = None
    host_cpu_pct: float | None = None
    scorer_process_cpu_pct: float | None = None
    host_cpu_busy: bool | None = None
    scorer_pinned: bool | None = None
    waiting_gpus_idle_gpu_s: float | None = None
    allowance_share: float | None = None


@dataclass(kw_only=True)
class GenerationTailEvidence(Evidence):
    kind: ClassVar[str] = "generation_tail"
    tail_to_head_util_ratio: float | None = None
    tail_steps: int | None = None
    steps: int | None = None
    tail_idle_gpu_s: float | None = None
    response_length_max_tokens: float | None = None
    response_length_mean_tokens: float | None = None
    response_length_max_to_mean: float | None = None
    response_clip_ratio: float | None = None
    generation_worker_s_min: float | None = None
    generation_worker_s_max: float | None = None
    rollout_share_of_step: float | None = None


@dataclass(kw_only=True)
class MemoryHeadroomEvidence(Evidence):
    kind: ClassVar[str] = "memory_headroom"
    mem_peak_frac: float | None = None
    mem_peak_bytes: int | None = None
    mem_total_bytes: int | None = None
    mem_target_frac: float | None = None
    phase_gpu_s: float | None = None
    model: str | None = None
    knobs: dict[str, Any] | None = None

    @property
    def headroom_frac(self) -> float | None:
        """Unused memory share at the peak (0–1): ``1 - mem_peak_frac``."""
        return None if self.mem_peak_frac is None else max(0.0, 1.0 - self.mem_peak_frac)


@dataclass(kw_only=True)
class OffloadThrashEvidence(Evidence):
    kind: ClassVar[str] = "offload_thrash"
    pcie_bytes_s_per_direction: float | None = None
    pcie_link_bytes_s: float | None = None
    pcie_link: str | None = None
    pcie_heavy_share_of_update: float | None = None
    update_gpu_s: float | None = None
    util_gpu_pct: float | None = None
    sm_active_pct: float | None = None
    knobs: dict[str, Any] | None = None


@dataclass(kw_only=True)
class CommBoundEvidence(Evidence):
    kind: ClassVar[str] = "comm_bound"
    collective_share_of_update: float | None = None
    collective_s_per_owner_mean: float | None = None
    update_s_per_owner_mean: float | None = None
    nvlink_bytes_s_per_direction: float | None = None
    sm_active_pct_in_collectives: float | None = None
    util_gpu_pct_in_collectives: float | None = None
    inter_node_collective_s: float | None = None
    inter_node_bandwidth_bytes_s: float | None = None
    intra_node_collective_s: float | None = None
    intra_node_bandwidth_bytes_s: float | None = None
    exposed_comm_gpu_s: float | None = None
    overlapped_comm_gpu_s: float | None = None
    comm_share_of_busy: float | None = None
    exposed_share_of_busy: float | None = None
    source: str | None = None


@dataclass(kw_only=True)
class HostBoundEvidence(Evidence):
    kind: ClassVar[str] = "host_bound"
    util_gpu_pct: float | None = None
    process_cpu_pct_of_core: float | None = None
    pinned_share_of_compute: float | None = None
    rank_process_pinned_share: float | None = None
    sm_active_pct: float | None = None
    sync_ops: int | None = None
    sync_s: float | None = None
    alloc_s: float | None = None
    cpu_measure: str | None = None
    """``busiest_python_thread`` (the run recorded per-thread CPU) or ``process`` (summed
    over the process's threads, which CUDA/NCCL spin-wait inflates)."""
    python_thread: str | None = None
    """The busiest Python thread in the intervals: ``name (pid P, thread T)``."""
    python_thread_cpu_pct: float | None = None
    spinning_threads: list[dict[str, Any]] | None = None
    """Other threads of the processes above half a core there: ``thread`` (comm), ``pid``,
    ``tid``, ``kind`` (CUDA driver, NCCL, OpenMP…, or None), ``cpu_pct``."""


@dataclass(kw_only=True)
class ImbalanceEvidence(Evidence):
    kind: ClassVar[str] = "imbalance"
    straggler_rank: int | None = None
    straggler_pid: int | None = None
    straggler_host: str | None = None
    slowdown_frac_median: float | None = None
    delay_s_total: float | None = None
    phase_steps_flagged: int | None = None
    barrier_spans: int | None = None
    util_gpu_pct_spread: float | None = None
    mem_peak_bytes_spread: float | None = None
    low_gpus: list[str] | None = None
    low_util_gpu_pct: float | None = None
    peer_util_gpu_pct: float | None = None
    measure: str | None = None


@dataclass(kw_only=True)
class ThrottlingEvidence(Evidence):
    kind: ClassVar[str] = "throttling"
    clock_event_reasons: list[str] = field(default_factory=list)
    clock_event_reasons_mask: int | None = None
    sm_clock_mhz_throttled: float | None = None
    sm_clock_mhz_max: float | None = None
    throttled_share_of_busy: float | None = None
    temp_c_throttled: float | None = None
    power_w_throttled: float | None = None


@dataclass(kw_only=True)
class PhantomUtilEvidence(Evidence):
    """``phantom_util``: GPUs reading busy with no memory in use and no process on them — a
    stuck context or engine, not work. ``memory_measured`` False: the log had no memory-used
    column and the memory-activity reading (dmon ``mem``) stood in for it;
    ``processes_seen`` None: the run has no per-process GPU data."""

    kind: ClassVar[str] = "phantom_util"
    phantom_gpu_s: float | None = None
    longest_stretch_s: float | None = None
    util_gpu_pct_mean: float | None = None
    util_mem_pct_mean: float | None = None
    mem_used_bytes_max: float | None = None
    memory_measured: bool | None = None
    power_w_mean: float | None = None
    power_limit_w: float | None = None
    sm_clock_mhz_mean: float | None = None
    processes_seen: bool | None = None
    working_gpus: int | None = None


@dataclass(kw_only=True)
class HotGpuEvidence(Evidence):
    """``hot_gpu``: a GPU far hotter than its peers of the same host at comparable load;
    ``sm_clock_mhz_*`` and the lost GPU-seconds are measured where clocks were sampled."""

    kind: ClassVar[str] = "hot_gpu"
    temp_c: float | None = None
    peer_temp_c: float | None = None
    temp_c_above_peers: float | None = None
    util_gpu_pct: float | None = None
    peer_util_gpu_pct: float | None = None
    sm_clock_mhz: float | None = None
    peer_sm_clock_mhz: float | None = None
    thermal_reasons_share: float | None = None
    peers: int | None = None


@dataclass(kw_only=True)
class PowerCapEvidence(Evidence):
    """``power_cap``: busy GPUs held at their power limit. ``lowered_limit`` True when the
    limit is below the board's default (``nvidia-smi -pl`` was used); ``loss_measure``
    ``"clock"`` (SM clock against the highest seen) or ``"power_ratio"`` (no clocks: the cube
    root of limit / default, see `Thresholds.power_cap_frac`)."""

    kind: ClassVar[str] = "power_cap"
    power_w_mean: float | None = None
    power_limit_w: float | None = None
    power_default_limit_w: float | None = None
    lowered_limit: bool | None = None
    capped_share_of_busy: float | None = None
    sm_clock_mhz_capped: float | None = None
    sm_clock_mhz_max: float | None = None
    power_cap_reason_share: float | None = None
    loss_measure: str | None = None


@dataclass(kw_only=True)
class PeriodicStallEvidence(Evidence):
    kind: ClassVar[str] = "periodic_stall"
    every_n_steps: float | None = None
    occurrences: int | None = None
    steps_total: int | None = None
    stall_steps: list[int] = field(default_factory=list)
    idle_gpu_s: float | None = None
    idle_gpu_s_per_occurrence: float | None = None
    seconds_per_occurrence: float | None = None
    normal_step_s: float | None = None
    normal_step_idle_gpu_s: float | None = None
    waiting_gpus_idle_gpu_s: float | None = None
    util_gpu_pct: float | None = None


@dataclass(kw_only=True)
class IdleUnattributedEvidence(Evidence):
    kind: ClassVar[str] = "idle_unattributed"
    idle_gpu_s: float | None = None
    idle_in_step_gpu_s: float | None = None
    idle_outside_spans_gpu_s: float | None = None
    run_idle_share: float | None = None
    spans_recorded: bool | None = None


@dataclass(kw_only=True)
class UnusedGpuEvidence(Evidence):
    kind: ClassVar[str] = "unused_gpu"
    util_gpu_pct_max: float | None = None
    mem_used_bytes_max: float | None = None
    unused_gpu_s: float | None = None
    used_gpus: int | None = None


@dataclass(kw_only=True)
class IdleAllocationEvidence(Evidence):
    kind: ClassVar[str] = "idle_allocation"
    idle_stretch_s_longest: float | None = None
    idle_stretches: int | None = None
    mem_held_bytes: float | None = None
    idle_gpu_s: float | None = None
    whole_run: bool | None = None


@dataclass(kw_only=True)
class UpdateBoundEvidence(Evidence):
    """``update_bound``: an update slow for the tokens it trains (``phase``). The actor's: its
    model FLOPs utilisation (``measure="mfu"``, or ``"framework_mfu"`` by the framework's own
    count), or with no GPU known its seconds per token per epoch over a forward pass's of the
    same steps (``measure="forward_ratio"``). The critic's: its efficiency over the actor's on
    the same tokens (``critic_actor_ratio``), by the framework's MFU of each
    (``measure="critic_actor_mfu"``) or, when the critic trains the actor's model, by their
    seconds per epoch (``"critic_actor_time"``)."""

    kind: ClassVar[str] = "update_bound"
    measure: str = "mfu"
    phase: str = "update_actor"
    update_share_of_step: float | None = None
    update_gpu_s: float | None = None
    mfu: float | None = None
    threshold_mfu: float | None = None
    reachable_mfu: float | None = None
    forward_ratio: float | None = None
    forward_phase: str | None = None
    healthy_forward_ratio: float | None = None
    ppo_epochs: float | None = None
    tokens_per_s: float | None = None
    flops_per_token: float | None = None
    peak_flops_per_gpu: float | None = None
    gpu_model: str | None = None
    model_params: float | None = None
    model_total_params: float | None = None
    model_params_source: str | None = None
    framework_mfu: float | None = None
    actor_framework_mfu: float | None = None
    critic_actor_ratio: float | None = None
    healthy_critic_actor_ratio: float | None = None
    causes: list[dict[str, Any]] = field(default_factory=list)
    knobs: dict[str, Any] | None = None


@dataclass(kw_only=True)
class RolloutBoundEvidence(Evidence):
    """``rollout_bound``: generation slow for the tokens it makes — against the decode roofline
    (``measure="decode_roofline"``: the GPUs' memory bandwidth at the engine's concurrency), or
    with no GPU known its seconds per generated token over a forward pass's seconds per token
    (``measure="forward_ratio"``)."""

    kind: ClassVar[str] = "rollout_bound"
    measure: str = "forward_ratio"
    rollout_share_of_step: float | None = None
    rollout_gpu_s: float | None = None
    forward_ratio: float | None = None
    forward_phase: str | None = None
    healthy_forward_ratio: float | None = None
    decode_efficiency: float | None = None
    reachable_decode_efficiency: float | None = None
    bandwidth_util: float | None = None
    concurrency: float | None = None
    concurrency_source: str | None = None
    tokens_per_s_per_gpu: float | None = None
    response_length_mean_tokens: float | None = None
    mem_peak_frac: float | None = None
    gpu_model: str | None = None
    causes: list[dict[str, Any]] = field(default_factory=list)
    knobs: dict[str, Any] | None = None


EVIDENCE: dict[str, type[Evidence]] = {
    cls.kind: cls
    for cls in (
        ReshardIdleEvidence,
        PipelineBubbleEvidence,
        DataloaderStarvationEvidence,
        RewardBoundEvidence,
        GenerationTailEvidence,
        MemoryHeadroomEvidence,
        OffloadThrashEvidence,
        CommBoundEvidence,
        HostBoundEvidence,
        ImbalanceEvidence,
        ThrottlingEvidence,
        PhantomUtilEvidence,
        HotGpuEvidence,
        PowerCapEvidence,
        PeriodicStallEvidence,
        IdleUnattributedEvidence,
        UnusedGpuEvidence,
        IdleAllocationEvidence,
        RolloutBoundEvidence,
        UpdateBoundEvidence,
    )
}
"""Stall kind → its evidence class."""
