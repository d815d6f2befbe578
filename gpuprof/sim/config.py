"""What to simulate: cluster shape, framework, phase durations and injected pathologies."""

from __future__ import annotations

from dataclasses import dataclass, field

FRAMEWORKS: tuple[str, ...] = ("verl", "trl", "swift", "openrlhf", "pytorch")
PLACEMENTS: tuple[str, ...] = ("colocated", "split")
MAX_GPUS = 4096
"""The largest simulated cluster: 512 nodes of 8 GPUs (`simulate_to` holds one GPU at a time)."""
DEFAULT_START_NS = 1_767_225_600_000_000_000
"""2026-01-01T00:00:00Z: a fixed epoch so a seed always gives byte-identical output."""

DEFAULT_PHASE_S: dict[str, float] = {
    "dataload": 0.3,
    "rollout": 20.0,
    "reward": 1.0,
    "old_logprob": 3.0,
    "ref_logprob": 3.0,
    "values": 3.0,
    "advantage": 0.2,
    "update_actor": 10.0,
    "update_critic": 8.0,
    "reshard": 1.0,
}
"""Healthy wall time of each phase of one step, in seconds (before `SimConfig.time_scale`)."""


@dataclass(frozen=True)
class Pathology:
    """One injected stall: ``kind`` is a stall kind of DESIGN.md, ``severity`` in [0, 1].

    Severity scales the GPU-time the stall costs roughly linearly; near 0 it is a near miss.
    """

    kind: str
    severity: float = 0.5

    def __post_init__(self) -> None:
        if not 0.0 <= self.severity <= 1.0:
            raise ValueError(f"severity must be in [0, 1], got {self.severity}")


@dataclass
class SimConfig:
    """A simulated RL post-training job.

    Durations are seconds; ``noise`` is the relative standard deviation applied to phase
    durations and to sampled metrics. ``time_scale`` multiplies every duration (healthy and
    injected), so tests can simulate the same job shape in less wall time.
    """

    gpus: int = 8
    gpus_per_host: int = 8
    framework: str = "verl"
    placement: str = "colocated"
    algorithm: str = "grpo"
    """``grpo`` (no critic) or ``ppo`` (adds the ``values`` and ``update_critic`` phases)."""
    steps: int = 10
    interval_s: float = 0.1
    """GPU sample period, seconds."""
    host_interval_s: float = 0.5
    """Host, process and GPU-process sample period, seconds."""
    phase_s: dict[str, float] = field(default_factory=lambda: dict(DEFAULT_PHASE_S))
    time_scale: float = 1.0
    pathologies: list[Pathology] = field(default_factory=list)
    noise: float = 0.05
    seed: int = 0
    start_ns: int = DEFAULT_START_NS
    gpu_name: str = "NVIDIA H100 80GB HBM3"
    """H100/H200/B200 names have GPM (``sm_active_pct`` etc.); others (A100…) get NaN there."""
    rollout_fraction: float = 0.5
    """Share of GPUs doing generation under ``split`` placement."""

    def __post_init__(self) -> None:
        if not 1 <= self.gpus <= MAX_GPUS:
            raise ValueError(f"gpus must be in 1..{MAX_GPUS}, got {self.gpus}")
        if self.gpus_per_host < 1:
            raise ValueError("gpus_per_host must be >= 1")
        if self.framework not in FRAMEWORKS:
            raise ValueError(f"framework must be one of {FRAMEWORKS}, got {self.framework!r}")
        if self.placement not in PLACEMENTS:
            raise ValueError(f"placement must be one of {PLACEMENTS}, got {self.placement!r}")
        if self.algorithm not in ("grpo", "ppo"):
            raise ValueError(f"algorithm must be 'grpo' or 'ppo', got {self.algorithm!r}")
        if self.steps < 1:
            raise ValueError("steps must be >= 1")
        self.pathologies = [
            p if isinstance(p, Pathology) else Pathology(*p) for p in self.pathologies
        ]
        if self.effective_placement == "split" and self.gpus < 2:
            raise ValueError("split placement (and pipeline_bubble) needs at least 2 GPUs")

    @property
    def hosts(self) -> list[str]:
        """Host names, ``node0``…, one per ``gpus_per_host`` GPUs."""
        n = -(-self.gpus // self.gpus_per_host)
        return [f"node{i}" for i in range(n)]

    @property
    def has_gpm(self) -> bool:
        """Whether the simulated GPU model reports GPM metrics (Hopper and newer)."""
        return any(tag in self.gpu_name for tag in ("H100", "H200", "H800", "H20", "B200", "GB200"))

    @property
    def effective_placement(self) -> str:
        """``split`` when asked for or when ``pipeline_bubble`` is injected (it needs two sets)."""
        if self.placement == "split" or self.severity("pipeline_bubble") is not None:
            return "split"
        return "colocated"

    @property
    def n_rollout_gpus(self) -> int:
        """GPUs dedicated to generation (the first ones) under split placement, else 0."""
        if self.effective_placement != "split":
            return 0
        return min(self.gpus - 1, max(1, round(self.gpus * self.rollout_fraction)))

    def severity(self, kind: str) -> float | None:
        """The severity of an injected pathology, or None when it is not injected."""
        for p in self.pathologies:
            if p.kind == kind:
                return p.severity
        return None
