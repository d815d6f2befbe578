"""The analyzers' contract: stall kinds, the `Finding` record, thresholds, the shared context.

Every detector is a pure function ``detect(ctx, th) -> Finding | None`` over a precomputed
`AnalysisContext` (so the costly GPU × phase alignment is done once per run). A finding says
how many GPU-seconds the stall cost, what share of the run's GPU-time that is, how sure the
detector is, and the evidence it rests on.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

import numpy as np
import pandas as pd

from gpuprof.model import Run

STALL_KINDS: tuple[str, ...] = (
    "reshard_idle",
    "pipeline_bubble",
    "dataloader_starvation",
    "reward_bound",
    "generation_tail",
    "memory_headroom",
    "offload_thrash",
    "comm_bound",
    "host_bound",
    "imbalance",
    "throttling",
    "periodic_stall",
    "idle_unattributed",
    "unused_gpu",
    "idle_allocation",
    "rollout_bound",
    "update_bound",
    "phantom_util",
    "hot_gpu",
    "power_cap",
)
"""The stable ``kind`` of every finding (DESIGN.md, "Stall taxonomy")."""

BUSY_LOSS_KINDS: frozenset[str] = frozenset(
    {"memory_headroom", "throttling", "host_bound", "comm_bound", "rollout_bound", "update_bound",
     "phantom_util", "hot_gpu", "power_cap"}
)  # fmt: skip
"""Kinds whose loss is time the GPUs were busy but slow (too little memory used, reduced
clocks from a power cap, heat or another limit, launch-bound kernels, exposed collectives,
generation or an update slow for its tokens) or read busy without working (a stuck GPU's
phantom utilization) rather than idle time; `summarize` and every headline keep them apart
from idle time by cause."""

STEP_INDEPENDENT_KINDS: frozenset[str] = frozenset(
    {"unused_gpu", "idle_allocation", "throttling", "phantom_util", "hot_gpu", "power_cap"}
)
"""Kinds judged on GPU samples alone, whatever the number of steps (a GPU never used, minutes
with nothing running, reduced clocks, a stuck, hot or power-capped GPU): a run with few steps
does not weaken them."""


@dataclass
class Finding:
    """One diagnosed stall.

    ``gpu_seconds_lost``: GPU-seconds the stall cost (idle or wasted GPU time that would be
    recovered if it were fixed). ``share``: that over the run's total GPU-seconds (0–1).
    ``confidence``: 0–1. ``evidence``: JSON-able facts — ``intervals`` (list of
    ``[start_ns, end_ns]``), ``gpus`` (list of ``"host:index"``), ``phases``, and named
    figures with units in their keys.
    """

    kind: str
    gpu_seconds_lost: float
    share: float
    confidence: float
    summary: str
    evidence: Mapping[str, Any] = field(default_factory=dict)
    stacks: Any = None
    """For kinds about idle or host time, the Python code that ran in the evidence's
    intervals (`gpuprof.analyzers.stacks.StackSummary`), when the run sampled stacks."""

    def to_dict(self) -> dict[str, Any]:
        out = {
            "kind": self.kind,
            "gpu_seconds_lost": round(float(self.gpu_seconds_lost), 3),
            "share": round(float(self.share), 5),
            "confidence": round(float(self.confidence), 3),
            "summary": self.summary,
            "evidence": self.evidence.to_dict()
            if hasattr(self.evidence, "to_dict")
            else dict(self.evidence),
        }
        if self.stacks is not None:
            out["stacks"] = self.stacks.to_dict()
        return out


@dataclass(frozen=True)
class Thresholds:
    """Every decision threshold and loss-model constant of the detectors, in one place (units
    in the names).

    Each says where its value comes from: ``measured`` (a figure read off a real run or public
    file, named), ``vendor`` (a data sheet or a framework's documented default), or ``seed`` (a
    judgement not yet checked against real runs; ``seed (simulator)`` where only the project's
    simulator supports it — the first to revisit when a real run disagrees).
    `tests/test_evidence.py` checks that every field names its source.
    """

    min_share: float = 0.02
    """A finding below this share of total GPU-time is noise and is not reported.
    Source: seed (a change worth making wins back at least 2% of the GPU bill)."""
    few_steps: int = 2
    """A run with at most this many steps can't tell a pattern from a one-off: its step-based
    findings are capped at `few_steps_max_confidence` and say why. Source: seed (no spread
    or period can be estimated from one or two samples; the first step of a run also holds
    start-up, as the public verl logs of 1–2 steps show)."""
    few_readings: int = 10
    """With fewer GPU readings than this per GPU (a pasted nvidia-smi table, one gpustat
    line), no finding is not a clean bill of health: the diagnosis says the readings are too
    few to rule a stall out. Source: seed (ten readings at nvidia-smi's usual 1 s cadence
    are ten seconds of a run)."""
    few_steps_max_confidence: float = 0.5
    """The highest confidence a step-based finding of a run with `few_steps` steps or fewer
    carries. Source: seed (even odds: the step may be typical or not)."""
    idle_util_pct: float = 10.0
    """A GPU sample below this utilisation counts as idle. Source: measured — idle GPUs read
    0–1% in the public nvidia-smi logs (rtx4090_inference.csv between batches)."""
    busy_util_pct: float = 50.0
    """A GPU sample at or above this utilisation counts as working. Source: seed."""
    host_cpu_busy_pct: float = 60.0
    """Host CPU (all cores) above this during a phase marks it CPU-heavy. Source: seed."""
    process_core_pinned_pct: float = 85.0
    """A process above this percent of one core is pinned. Source: measured — the GRPO
    example's scorer thread reads 98–101% of a core while it scores (tests/test_labelled_runs).
    Trainer processes read 100% or more from CUDA spin-wait and NCCL threads alone, so this is
    evidence of a CPU-bound step only together with low GPU utilisation."""
    memory_headroom_frac: float = 0.25
    """Peak memory below (1 - this) of total during rollout/update leaves headroom. Source:
    vendor — vLLM reserves ``gpu_memory_utilization`` = 0.9 of the GPU by default, so a peak
    under 75% leaves a sizeable KV cache unused."""
    mem_target_frac: float = 0.9
    """Memory share a well-tuned rollout/update reaches (the memory-headroom loss model's
    target). Source: vendor — vLLM's default ``gpu_memory_utilization``."""
    mem_update_factor: float = 0.25
    """Update phases gain less from memory than generation (compute-bound): this share of the
    rollout's gain model. Source: seed."""
    tail_util_drop_frac: float = 0.5
    """Rollout utilisation in its last part below this fraction of its first part, or the
    fastest generation worker under this fraction of the slowest: a tail. Source: seed."""
    tail_head_frac: float = 1.0 / 3.0
    """A rollout's steady level is read over its first third. Source: seed."""
    tail_end_frac: float = 0.1
    """A rollout's tail is its last tenth. Source: seed."""
    long_response_ratio: float = 3.0
    """Response length max / mean at or above this: a long tail of responses. Source: measured
    — the 16×H100 verl excerpt logs max 30000 / mean 11018 (2.7) for a run its user called
    long-tailed; the GH200 excerpt's healthy step 1024 / 325 (3.2) sits at the line."""
    phase_idle_min_frac: float = 0.5
    """A reward / weight-sync / loading phase whose GPUs are busy more than half of it (a
    reward model on the GPUs, a sync overlapped with compute) is not an idle stall. Source:
    seed."""
    link_burst_ratio: float = 2.0
    """Link traffic during weight sync above this many times the rest of the run's is a
    transfer burst. Source: seed."""
    pcie_heavy_bytes_s: float = 8e9
    """PCIe traffic above this (per GPU, per direction) is heavy. Source: vendor — a third of
    a PCIe Gen4 x16 link's ~25 GB/s usable per direction (the least an A100/H100 host has)."""
    imbalance_busy_gap_frac: float = 0.5
    """A GPU whose busy measure in a phase is below this fraction of its peers' median (peers
    busy) does less work than they do. Source: seed — data-parallel ranks of one phase run
    within ~10% of each other; half is far outside that noise."""
    imbalance_spread_frac: float = 0.15
    """A rank's phase time above the median rank's by this fraction makes it a straggler.
    Source: seed."""
    periodic_spike_ratio: float = 1.8
    """Without a named checkpoint/eval phase, steps at least this many times the median step,
    recurring at one period, are periodic stalls. Source: measured — a verl log's every-10th
    step with save_checkpoint + testing: ~26 s on an ~11 s median (2.4×)."""
    periodic_min_ratio: float = 3.0
    """A periodic phase (checkpoint/eval) at least this many times a normal step's idle is a
    spike (raises confidence only). Source: seed."""
    reward_allowance_share: float = 0.035
    """Idle GPU-time a healthy job spends scoring rewards (share of the run's GPU-time); only
    idle beyond it counts as lost. Source: measured — reward is 0.4% of the step in the
    16×H100 verl excerpt and 0% in the GH200 one; 3.5% leaves room for rule-based scorers."""
    reshard_allowance_share: float = 0.035
    """The same for weight sync (reshard). Source: seed."""
    dataload_allowance_share: float = 0.015
    """The same for data loading. Source: seed."""
    no_span_idle_share: float = 0.25
    """With no spans at all, idle is reported as unattributed only above this run-wide share.
    Source: seed."""
    clock_drop_frac: float = 0.9
    """Without clock-event reasons, an SM clock below this fraction of the max seen throttles.
    Source: vendor — H100 SXM boosts to 1980 MHz and holds ≥ 1755 MHz (0.89) under sustained
    load within its power limit."""
    low_compute_util_pct: float = 92.0
    """Update utilisation below this, with heavy PCIe, reads as offload traffic. Source: seed
    (simulator)."""
    low_compute_sm_pct: float = 40.0
    """The same with GPM SM activity, where utilisation is missing. Source: seed (simulator)."""
    host_bound_util_ref: float = 0.95
    """A launch-bound compute phase loses ``this - util`` (util as 0–1) of its time. Source:
    seed — a compute-bound training step keeps NVML utilisation at 95–100%."""
    host_bound_util_max: float = 0.85
    """Only compute phases (per GPU and step) below this utilisation (0–1) can be launch-bound:
    process CPU at a core or more is normal for a trainer (CUDA spin-wait, NCCL threads), so
    the GPU side must show the shortfall. Source: seed — launch-bound steps in PyTorch's
    CUDA-graphs and torch.compile write-ups run at 40–80% utilisation."""
    collective_healthy_frac: float = 0.1
    """Share of update time a well-overlapped job spends in collectives. Source: seed."""
    collective_min_frac: float = 0.2
    """Collectives above this share of update time make a run comm-bound. Source: seed."""
    unused_util_pct: float = 1.0
    """A GPU whose busy measure never exceeds this over the whole run was never used. Source:
    measured — NVML reads 0% on a GPU without work (public nvidia-smi logs)."""
    unused_mem_bytes: float = 2**30
    """...and whose memory stays at or below this. Source: vendor — a CUDA context alone
    holds a few hundred MiB (PyTorch on Ampere/Hopper: ~300–600 MiB); more is data."""
    unused_min_s: float = 5.0
    """Sampled time a GPU needs before it can be called unused (a few seconds of start-up
    before the first kernel are not a run). Source: seed."""
    idle_allocation_min_s: float = 300.0
    """A stretch with every GPU idle and nothing running, at least this long, is an idle
    allocation (a hang, a wait on storage or a service); shorter gaps are unattributed idle.
    Source: seed (PyTorch's NCCL watchdog gives up on a hung collective after 10 min by
    default; half of that is already a hang, not a pause)."""
    low_mfu: float = 0.15
    """Update-phase MFU below this makes the update ``update_bound``. Source: vendor/published —
    dense LLM training reaches 30–50% MFU (PaLM, Chowdhery et al. 2022, Table 3: 30.2% MT-NLG, 32.5%
    Gopher, 46.2% PaLM; Megatron-LM 52% of A100 peak, Narayanan et al. 2021); RL updates run on
    shorter, ragged batches, so half the low end."""
    reachable_mfu: float = 0.30
    """The MFU a tuned FSDP update reaches: ``update_bound`` wins back the update's GPU-seconds ×
    (1 − MFU / this). Source: vendor/published — the low end of the range above."""
    mfu_long_sequence_tokens: float = 8192
    """Without attention FLOPs (no config.json), a mean sequence longer than this can hide
    enough attention work to double a small model's FLOPs: the MFU test stays silent. Source:
    seed (attention is 12·L·h·s FLOPs per token against 2N: comparable for s ≈ 8k at 7B)."""
    bound_dominant_share: float = 0.5
    """A phase taking at least this share of the step bounds it. Source: seed (more than half
    the step: halving any other phase wins less than a quarter of it)."""
    bound_relative_ratio: float = 2.0
    """Below `bound_dominant_share`, a phase still bounds the step when it takes at least this
    many times the share of every other part of it (the next phase, and the step time no
    phase covers) and at least `bound_relative_min_share`. Source: measured — public logs in
    tests/labelled/public/cases.json: steps with a phase the run's own figures single out
    read 2.9× (verl PPO, update_critic 47 % against 16 %, the case of issue 41), 3.5× (a verl
    critic-warm-up step, 72 / 20 %), 3.9× (verl deepseek-7B PPO on 8 GPUs, gen 60 / 16 %) and
    1.9× (marin's phase shares, rollout 60 / 32 %, over half anyway); balanced steps read
    1.04× (verl deepseek-7B Megatron PPO, 27 / 26 %), 1.15× (the gemma-2b PPO fixture,
    31 / 27 %), 1.16× (verl Qwen-0.5B PPO, 29 / 25 %), 1.15× (verl #7412, 47 / 41 %) and 1.33×
    (a SmolLM GRPO run, 44 / 33 %). Twice the next lies between the two groups."""
    bound_relative_min_share: float = 1 / 3
    """The least share of the step a phase needs to bound it by `bound_relative_ratio`: a
    third of the step, so that a step of many small phases is not said to be bound by the
    largest of them. Source: seed."""
    bound_pair_share: float = 0.6
    """Without one dominant phase, the two largest bound the step together when they take at
    least this share, each at least `bound_member_share`. Source: seed."""
    bound_member_share: float = 0.25
    """The least share of the step a phase has to be named among those that bound it.
    Source: seed."""
    ratio_min_forward_s: float = 0.25
    """The cross-phase ratios leave out steps whose forward pass took less than this: a pass
    of milliseconds is fixed per-call costs, not tokens. Source: measured — TRL's GRPOTrainer
    on a tiny model on CPU (tests/test_trl_e2e.py) runs its reference pass in ~5 ms and its
    update, optimizer step included, at 14× that; real RL forward passes take seconds (3.4 s
    and 414 s in the verl issue excerpts, 11 s in the gemma-2b log). A quarter second is 50×
    the tiny run's pass and below any real one."""
    update_forward_ratio_healthy: float = 3.4
    """Update seconds per token per PPO epoch over a forward pass's (reference / old
    log-prob) of the same step, in a healthy run. Source: measured — verl's logged
    timing_per_token_ms update_actor / ref in public logs: 2.86 (verl docs, agent-loop
    example), 3.25 and 3.34 (two public Qwen GRPO runs), 3.39 (the gemma-2b PPO fixture);
    6N / 2N FLOPs give 3."""
    update_forward_ratio_slow: float = 6.8
    """An update per epoch at or above this many forward passes is slow for its tokens
    (``update_bound``). Source: seed — twice the healthy ratio; the 16×H100 GSPO run of verl
    issue #3727, whose user called the update extremely slow, reads 40.5."""
    critic_actor_healthy: float = 0.75
    """The critic update's efficiency over the actor's on the same tokens, in a healthy run:
    verl's own ``perf/mfu/critic`` over ``perf/mfu/actor`` (each counts its own model's
    FLOPs), else — when the critic trains the actor's model — the actor's update seconds per
    epoch over the critic's. Source: measured — public verl PPO logs: MFU 1.20 (verl #1224,
    0.599 / 0.499) and 1.20 (deepseek-7B PPO on 8 AMD MI300, 0.177 / 0.147); seconds 1.18
    (the gemma-2b PPO fixture), 1.30 (Qwen-0.5B PPO, verl-data), 1.23 (deepseek-7B PPO on
    MI300) and 0.79 (deepseek-7B PPO with Megatron on 4 GPUs, the lowest healthy run). A
    critic trains the same tokens through a model of the same shape with a one-wide head in
    place of the vocabulary: it costs about as much as the actor. verl counts both updates'
    FLOPs from each model's own config, the critic's with the vocabulary projection it does
    not run (verl/utils/flops_counter.py: ~7 % of a 7B model's FLOPs, ~22 % of a 0.5B's), so
    the critic's MFU reads a little high beside the actor's: a gap below this is real."""
    critic_actor_slow: float = 0.5
    """At or below this (half the actor's efficiency) the critic update is slow for its
    tokens (``update_bound`` on ``update_critic``). Source: measured — the critic-bound verl
    PPO run of issue 41 (Qwen2-7B, 8 GPUs: perf/mfu/critic 0.085 against the actor's 0.25,
    0.34; update_critic 47 % of the step) and seed (a third below the lowest healthy run)."""
    gen_forward_ratio_healthy: float = 7.5
    """Rollout seconds per generated token over a forward pass's seconds per token in a
    healthy run (decode is memory-bound, a forward pass compute-bound). Source: measured —
    2.5 (verl docs, agent-loop example), 6.3 (the gemma-2b PPO fixture, 2 GPUs, TP 2), 6.3 and
    7.4 (two public Qwen GRPO runs' timing_per_token_ms)."""
    gen_forward_ratio_slow: float = 15.0
    """Generation at or above this many forward tokens per generated token is slow for its
    tokens (``rollout_bound``). Source: seed — twice the healthy ratio; the GH200 SGLang run
    of verl issue #1208, reported "slower than expected", reads 28.5."""
    decode_efficiency_low: float = 0.05
    """Generation taking more than 1/this times the least time the decode roofline allows
    for its tokens is slow (``rollout_bound``), when no forward pass of the same steps gives
    the (calibrated) ratio. Source: measured (published) — one decode stream reaches 27% of
    the memory-bandwidth floor on an H100 and 81% on an L4 (three 7–8B GQA models, 2k–16k
    context; arXiv, May 2026) and ~77% on an A100 40GB (Llama-3.1-8B, vLLM, concurrency 1;
    docs/CALIBRATION_SOURCES.md §2); a rollout adds prefill and its longest response's
    tail, so only 5× below the lowest published figure is called slow."""
    decode_efficiency_reachable: float = 0.25
    """Share of the decode roofline a tuned rollout reaches; ``rollout_bound`` by the roofline
    wins back the rollout's GPU-seconds × (1 − efficiency / this). Source: measured — the lowest
    published single-stream figure above (H100, 27%), rounded down: what even an untuned
    decode batch reaches on the fastest GPUs."""
    phantom_util_pct: float = 90.0
    """A GPU at or above this utilization with no memory in use reads busy without working
    (``phantom_util``). Source: measured — stuck GPUs read a steady 100 % (14 of 32 GPUs of
    four nodes after killed training pods, tests/fixtures_public/phantom_*; a GPU after an Xid
    43 reset likewise)."""
    phantom_mem_bytes: float = 128 * 2**20
    """...with at most this much memory used. Source: measured and vendor — the stuck GPUs
    read 0–1 MiB, an empty GPU 0–4 MiB, while any process running a kernel holds a CUDA
    context of a few hundred MiB (PyTorch on Ampere/Hopper: ~300–600 MiB, see
    ``unused_mem_bytes``)."""
    phantom_mem_util_pct: float = 1.0
    """Where memory used is not logged (default ``dmon``), memory activity at most this
    stands in for it (weaker: the finding's confidence is lower). Source: measured — dmon
    reads ``sm 100, mem 0`` on the stuck GPU of the public capture; a real kernel at 100 %
    reads or writes device memory."""
    phantom_power_frac: float = 0.35
    """A stuck GPU sits in P0 at high clocks but draws little: above this share of its power
    limit a GPU is doing real work and is never called phantom. Source: measured — stuck
    GPUs drew 104–127 W (idle ones 3–23 W, working ones ~170 W and more) on boards of
    400–700 W limits, i.e. under 30 % of the limit."""
    hot_gpu_delta_c: float = 15.0
    """A GPU this many °C above the median of its peers (same host, comparable load) runs hot
    (``hot_gpu``). Source: seed — GPUs of one node at equal load sit within ~5–10 °C of each
    other (their place in the airflow); the public report that motivated this read 20 °C."""
    hot_gpu_util_gap_pct: float = 15.0
    """Peers count as at comparable load when their mean utilization is within this many
    points of the GPU's. Source: seed."""
    power_cap_frac: float = 0.97
    """Power draw at or above this share of the power limit is at the cap (``power_cap``).
    Source: vendor — NVML's SW power cap holds the average draw at the limit
    (``clocks_event_reasons.sw_power_cap``: "SW Power Scaling algorithm is reducing the
    clocks below requested clocks because the GPU is consuming too much power"); the 1 s
    average a log reads wanders a few per cent around it. Without clocks, a lowered limit
    costs ``1 - (limit / default) ** (1/3)`` of the time — seed: dynamic power grows about
    with the cube of the clock when voltage follows frequency."""
    power_cap_share: float = 0.5
    """A GPU at the cap for at least this share of its busy time is held by it. Source: seed
    (most of the work, not a spike)."""
    clock_skew_note_s: float = 2.0
    """Hosts whose records start further apart than this are noted as possibly skewed.
    Source: seed."""


@dataclass
class AnalysisContext:
    """A run plus the alignment computed once and shared by every detector."""

    run: Run

    @cached_property
    def _valid_spans(self) -> tuple[pd.DataFrame, int]:
        from gpuprof.analyzers.spans import valid_spans

        return valid_spans(self.run)

    @cached_property
    def spans(self) -> pd.DataFrame:
        """`spans.valid_spans` of the run (spans that end after they start)."""
        return self._valid_spans[0]

    @cached_property
    def host_codes(self) -> tuple[np.ndarray, pd.Index] | None:
        """`labelling.gpu_host_codes` of the run (None without GPU samples): the owners and
        the samples share them."""
        from gpuprof.analyzers.labelling import gpu_host_codes

        gpu = self.run.gpu
        return gpu_host_codes(self.run) if gpu is not None and "host" in gpu else None

    @cached_property
    def owners(self) -> pd.DataFrame:
        """`ownership.gpu_owner` of the run: which process drives each GPU."""
        from gpuprof.analyzers.ownership import _gpu_owner

        codes = self.host_codes
        return _gpu_owner(self.run, self.spans, None if codes is None else codes[0])

    @cached_property
    def samples(self) -> pd.DataFrame:
        """`labelling.gpu_phase_samples`: one row per GPU sample with its owner's phase."""
        from gpuprof.analyzers.labelling import gpu_phase_samples

        return gpu_phase_samples(
            self.run, spans=self.spans, owners=self.owners, host_codes=self.host_codes,
            spans_dropped=self._valid_spans[1],
        )  # fmt: skip

    @cached_property
    def totals(self) -> dict[str, Any]:
        """`breakdown.run_totals` of the run."""
        from gpuprof.analyzers.breakdown import run_totals

        return run_totals(self.run, samples=self.samples, spans=self.spans, owners=self.owners)

    @cached_property
    def owner_wall(self) -> pd.DataFrame:
        """`breakdown._owner_wall`: each owner's seconds per (phase, step), from its spans
        (the breakdowns by phase and by phase and step share it)."""
        from gpuprof.analyzers.breakdown import _owner_wall

        return _owner_wall(self.spans, self.owners)

    @cached_property
    def by_phase(self) -> pd.DataFrame:
        from gpuprof.analyzers.breakdown import phase_breakdown

        return phase_breakdown(
            self.run, ("phase",), self.samples, spans=self.spans, owners=self.owners,
            owner_wall=self.owner_wall,
        )  # fmt: skip

    @cached_property
    def by_phase_step(self) -> pd.DataFrame:
        from gpuprof.analyzers.breakdown import phase_breakdown

        return phase_breakdown(
            self.run, ("phase", "step"), self.samples, spans=self.spans, owners=self.owners,
            owner_wall=self.owner_wall,
        )  # fmt: skip

    @cached_property
    def recorded_gpus(self) -> tuple[int, list[Any]] | None:
        """``(distinct (host, gpu) pairs, distinct hosts in order of first appearance)`` of
        ``run.gpu``, read off `samples` when they hold every row of ``run.gpu`` exactly once
        (rows sorted by GPU, hosts as codes: no pass over a column of host strings); None
        when they don't (a sample without host, GPU or time; several owners of a GPU)."""
        gpu, s = self.run.gpu, self.samples
        if gpu is None or not len(gpu) or len(s) != len(gpu):
            return None
        rows = s["row"].to_numpy(np.int64)
        if not (np.bincount(rows, minlength=len(gpu)) == 1).all():
            return None
        host = s["host"]
        if not isinstance(host.dtype, pd.CategoricalDtype):
            return None
        codes = host.cat.codes.to_numpy(np.int64)
        number = s["gpu"].to_numpy(np.int64)
        dc, dn = np.diff(codes), np.diff(number)
        if not ((dc > 0) | ((dc == 0) & (dn >= 0))).all():
            return None  # not in (host, gpu) order: the pairs aren't runs
        pairs = int(((dc != 0) | (dn != 0)).sum()) + 1
        first_row = pd.Series(rows, copy=False).groupby(codes, sort=True).min()
        names = np.asarray(host.cat.categories, dtype=object)[first_row.index.to_numpy()]
        return pairs, list(names[np.argsort(first_row.to_numpy(), kind="stable")])

    @property
    def claimed(self) -> np.ndarray:
        """Per row of `samples`: claimed by a stall applied earlier (a GPU the job never used,
        an idle allocation), so later detectors leave it alone. All False until a claim."""
        mask = self.__dict__.get("_claimed")
        if mask is None or len(mask) != len(self.samples):
            mask = np.zeros(len(self.samples), dtype=bool)
            self.__dict__["_claimed"] = mask
        return mask

    @property
    def found(self) -> list[Finding]:
        """The findings of the stalls applied so far, in `diagnose`'s order (a later stall
        that measures a whole phase subtracts what these already explain there)."""
        return self.__dict__.setdefault("_found", [])

    def claim(self, mask: np.ndarray) -> None:
        """Mark rows of `samples` as explained by the stall applied now (see `claimed`)."""
        self.__dict__["_claimed"] = self.claimed | np.asarray(mask, dtype=bool)

    @property
    def unclaimed_samples(self) -> pd.DataFrame:
        """`samples` less the rows already claimed (the frame itself when nothing is)."""
        mask = self.claimed
        if not mask.any():
            return self.samples
        key = int(mask.sum())
        cached = self.__dict__.get("_unclaimed")
        if cached is None or cached[0] != key:
            cached = (key, self.samples[~mask])
            self.__dict__["_unclaimed"] = cached
        return cached[1]

    @property
    def facts(self) -> Any:
        """The run-wide `parts.Facts` when this context is one part of a run analysed part by
        part (`parts.Parts`); None for a whole run not yet seen as parts."""
        return self.__dict__.get("_facts")

    @property
    def total_gpu_s(self) -> float:
        """Total GPU-seconds of the run (sum of sample durations over all GPUs; of every part
        when this context is one part of a run)."""
        facts = self.facts
        if facts is not None:
            return float(facts.gpu_s)
        value = self.totals.get("gpu_s") or 0.0
        return float(value) if value == value else 0.0

    def share(self, gpu_seconds: float) -> float:
        """``gpu_seconds`` as a share (0–1) of the run's GPU-time."""
        total = self.total_gpu_s
        return float(min(1.0, max(0.0, gpu_seconds / total))) if total > 0 else 0.0
