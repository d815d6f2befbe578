"""The knob record and the rationale templates the framework modules share."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class KnobEntry:
    """One catalogue row: a knob of one framework that addresses one stall kind.

    ``default`` is the framework's default value, or ``"@other_knob"`` when the default is
    another knob's value (TRL ``steps_per_generation`` defaults to
    ``gradient_accumulation_steps``). ``gain`` is 0–1. ``rationale`` is a `str.format`
    template over ``knob``, ``current``, ``suggested`` and ``lost_gpu_s``. ``phase``: the
    phase the knob tunes when its kind covers several (``update_bound`` of the actor or of the
    critic); the row does not apply to a finding whose evidence names other phases only
    (None: any).
    """

    framework: str
    kind: str
    setting: str
    knob: str
    versions: str
    rule: str
    arg: Any
    default: Any
    gain: float
    rationale: str
    phase: str | None = None


_K = KnobEntry
_AR = "actor_rollout_ref"
_GMU = (
    "{knob}={current}: the inference engine reserves only that share of GPU memory for weights "
    "and KV cache, so fewer sequences run at once and generation takes longer; {suggested} "
    "uses the unused memory (watch for OOM in the update phase)."
)
_WORKERS = (
    "{knob}={current}: the main process loads and collates batches itself while the GPUs wait; "
    "{suggested} worker processes prefetch the next batches in parallel."
)
_SAVE = (
    "{knob}={current}: checkpoints stop every GPU for a while; saving every {suggested} steps "
    "cuts that stall by most of its {lost_gpu_s} GPU-seconds."
)
_EVAL = (
    "{knob}={current}: validation runs stall training; every {suggested} steps costs a "
    "fraction of it."
)
_LEN = (
    "{knob}={current}: a few very long responses keep the engine running with most sequences "
    "done; a cap of {suggested} tokens cuts the tail (check the clip ratio stays low)."
)
_OFFLOAD = (
    "{knob}={current}: state is copied over PCIe every step and the GPUs wait on the copies; "
    "{suggested} keeps it on the GPU when memory allows."
)
_DYN = (
    "{knob}={current}: fixed-count micro-batches of uneven lengths leave GPUs waiting for the "
    "slowest rank; {suggested} packs micro-batches by token budget."
)
_SYNC_LESS = (
    "{knob}={current}: weights move to the inference engine once per generation round; "
    "{suggested} generates for more optimizer steps per sync, so GPUs idle in syncs less often."
)

_GEN_GMU = (
    "{knob}={current}: the engine keeps weights and KV cache in that share of GPU memory, so "
    "few sequences decode at once and each iteration reads all weights for few tokens; "
    "{suggested} fits a larger running batch (watch the update phase for OOM)."
)
_GEN_EAGER = (
    "{knob}={current}: every decode iteration launches its kernels from Python; {suggested} "
    "captures CUDA graphs, which small decode batches need most."
)
_GEN_TP = (
    "{knob}={current}: each engine splits the model over several GPUs and all-reduces every "
    "layer; {suggested} runs more, smaller engines when the model and its KV cache fit."
)
_GEN_SEQS = (
    "{knob}={current}: the engine decodes at most that many sequences at once; {suggested} "
    "shares each weight read over more tokens when memory allows."
)
_GEN_VLLM = (
    "{knob}={current}: completions come from the model's own generate(), one padded batch at "
    "a time; {suggested} generates with vLLM's paged KV cache and continuous batching."
)
_GEN_PREFIX = (
    "{knob}={current}: each prompt is sampled several times and every sample prefills the "
    "prompt again; {suggested} prefills it once and the other samples reuse its KV cache."
)
_UPD_EXPERTS = (
    "{knob}={current}: every GPU holds all experts of this mixture-of-experts model and runs "
    "each expert's few tokens as thin matrix multiplies; {suggested} spreads the experts over "
    "GPUs so each runs fewer, fuller ones (tokens reach them by all-to-all)."
)
_UPD_MICRO = (
    "{knob}={current}: micro-batches that small leave the matrix multiplies thin; "
    "{suggested} does more model FLOPs per kernel (lower it again on OOM)."
)
_UPD_OFFLOAD = (
    "{knob}={current}: the update waits on copies over PCIe every step; {suggested} keeps the "
    "state on the GPU when memory allows."
)
_UPD_RECOMPUTE = (
    "{knob}={current}: the backward recomputes every layer's forward (about a third more work "
    "that is not model FLOPs); {suggested} keeps the activations when memory allows."
)
_UNUSED = (
    "{knob}={current}: some GPUs given to the job never ran work; {suggested} puts every GPU "
    "of the node to work (or ask the scheduler / CUDA_VISIBLE_DEVICES for fewer GPUs)."
)
