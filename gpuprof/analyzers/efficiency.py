"""Efficiency figures: tokens/s and model FLOPs utilisation (MFU) per phase, the cost of idle
GPU time, and the framework's own logged MFU / throughput beside them.

Pure: no I/O. A model's ``config.json`` is read by the caller (`gpuprof.api`) and handed in
through `EfficiencyOptions`; `attach_options` puts those options on an `AnalysisContext` so
that `efficiency_summary` (called by `diagnose.summarize`) and the ``low_mfu`` stall see them.

Definitions (units in the names):

- **peak FLOP/s**: the vendor data sheet's dense (no structured sparsity) tensor throughput of
  one GPU at the training dtype (bf16; fp16 on GPUs without bf16), `PEAK_TABLE`;
- **model FLOPs per token**: ``2·N`` for a forward pass (a generated token in rollout, a token
  of the reference / old log-prob / value passes) and ``6·N`` for forward + backward (a trained
  token of update_actor / update_critic), ``N`` the parameters a token passes through (for a
  mixture of experts, the active ones), plus the attention score FLOPs when the model's
  config gives its layers and attention width and the run gives the sequence lengths
  (forward: ``4·layers·attn_dim`` per token of context; causal training: half the sequence);
- **MFU** = achieved model FLOP/s / (peak FLOP/s × GPUs in the phase), 0–1. Recomputation
  (gradient checkpointing) and padding are not model FLOPs: they lower MFU, as they should;
- **tokens/s**: rollout — generated (response) tokens over rollout wall time; log-prob and
  value passes — prompt + response tokens over the phase's wall time; update — trained
  tokens (prompt + response, × PPO epochs) over the update's wall time.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd

from gpuprof.analyzers.findings import AnalysisContext, Finding
from gpuprof.commandline import coerce, parse_knobs
from gpuprof.intervals import covered_ns

__all__ = [
    "PEAK_TABLE",
    "EfficiencyOptions",
    "GpuPeak",
    "ModelSize",
    "attach_options",
    "efficiency_summary",
    "match_gpu",
    "model_size",
    "params_from_config",
    "params_from_name",
    "parse_param_count",
    "run_settings",
]

# --------------------------------------------------------------------------------------------
# Peak dense FLOP/s per GPU


@dataclass(frozen=True)
class GpuPeak:
    """Dense peak throughput of one GPU (one device as the driver lists it), in FLOP/s per
    dtype; None where the GPU has no such tensor path or the data sheet gives no figure."""

    model: str
    bf16: float | None
    fp16: float | None
    tf32: float | None
    fp32: float | None
    fp8: float | None
    source: str

    def flops(self, dtype: str) -> float | None:
        """Peak FLOP/s at ``dtype`` (``bf16``, ``fp16``, ``tf32``, ``fp32``, ``fp8``)."""
        return getattr(self, dtype, None)

    def training_dtype(self) -> str | None:
        """bf16 where the GPU has it, else fp16 (V100, T4 train in fp16 mixed precision)."""
        for dtype in ("bf16", "fp16"):
            if self.flops(dtype):
                return dtype
        return None


def _row(model: str, bf16, fp16, tf32, fp32, fp8, source: str) -> GpuPeak:
    scale = 1e12  # the table below is in TFLOP/s
    values = [None if v is None else float(v) * scale for v in (bf16, fp16, tf32, fp32, fp8)]
    return GpuPeak(model, *values, source=source)


# Dense figures. NVIDIA data sheets print tensor figures "with sparsity" (marked *) for
# Ampere and later; the dense figure is half of it. TFLOP/s, boost clock.
PEAK_TABLE: dict[str, GpuPeak] = {
    # NVIDIA H100 Tensor Core GPU data sheet (H100 SXM column): BF16/FP16 1,979*, TF32 989*,
    # FP8 3,958*, FP32 67.
    "H100 SXM": _row("H100 SXM", 989.5, 989.5, 494.5, 67, 1979, "NVIDIA H100 data sheet, SXM"),
    # same data sheet, H100 PCIe column: BF16/FP16 1,513*, TF32 756*, FP8 3,026*, FP32 51.
    "H100 PCIe": _row("H100 PCIe", 756.5, 756.5, 378, 51, 1513, "NVIDIA H100 data sheet, PCIe"),
    # same data sheet, H100 NVL column (per GPU): BF16/FP16 1,671*, TF32 835*, FP8 3,341*,
    # FP32 60.
    "H100 NVL": _row("H100 NVL", 835.5, 835.5, 417.5, 60, 1670.5, "NVIDIA H100 data sheet, NVL"),
    # NVIDIA H200 Tensor Core GPU data sheet, H200 SXM column: same tensor figures as H100 SXM.
    "H200 SXM": _row("H200 SXM", 989.5, 989.5, 494.5, 67, 1979, "NVIDIA H200 data sheet, SXM"),
    # same data sheet, H200 NVL column: BF16/FP16 1,671*, TF32 835*, FP8 3,341*, FP32 60.
    "H200 NVL": _row("H200 NVL", 835.5, 835.5, 417.5, 60, 1670.5, "NVIDIA H200 data sheet, NVL"),
    # NVIDIA GH200 Grace Hopper Superchip data sheet (the Hopper GPU): BF16 1,979*, TF32 989*,
    # FP8 3,958*, FP32 67.
    "GH200": _row("GH200", 989.5, 989.5, 494.5, 67, 1979, "NVIDIA GH200 data sheet"),
    # NVIDIA H800 SXM5 / PCIe product briefs: the H100's tensor throughput (FP64 and NVLink
    # reduced).
    "H800 SXM": _row("H800 SXM", 989.5, 989.5, 494.5, 67, 1979, "NVIDIA H800 SXM5 product brief"),
    "H800 PCIe": _row("H800 PCIe", 756.5, 756.5, 378, 51, 1513, "NVIDIA H800 PCIe product brief"),
    # NVIDIA HGX H20 product brief: BF16/FP16 148, TF32 74, FP8 296, FP32 44 (dense).
    "H20": _row("H20", 148, 148, 74, 44, 296, "NVIDIA HGX H20 product brief"),
    # NVIDIA A100 Tensor Core GPU data sheet: BF16/FP16 312 (624*), TF32 156 (312*), FP32 19.5;
    # the same for the 40 GB and 80 GB, SXM4 and PCIe boards. No FP8.
    "A100 SXM4 40GB": _row("A100 SXM4 40GB", 312, 312, 156, 19.5, None, "NVIDIA A100 data sheet"),
    "A100 SXM4 80GB": _row("A100 SXM4 80GB", 312, 312, 156, 19.5, None, "NVIDIA A100 data sheet"),
    "A100 PCIe 40GB": _row("A100 PCIe 40GB", 312, 312, 156, 19.5, None, "NVIDIA A100 data sheet"),
    "A100 PCIe 80GB": _row("A100 PCIe 80GB", 312, 312, 156, 19.5, None, "NVIDIA A100 data sheet"),
    # NVIDIA A800 40GB/80GB product briefs: the A100's tensor throughput (NVLink reduced).
    "A800 SXM4": _row("A800 SXM4", 312, 312, 156, 19.5, None, "NVIDIA A800 product brief"),
    "A800 PCIe": _row("A800 PCIe", 312, 312, 156, 19.5, None, "NVIDIA A800 product brief"),
    # NVIDIA A10 Tensor Core GPU data sheet: BF16/FP16 125 (250*), TF32 62.5 (125*), FP32 31.2.
    "A10": _row("A10", 125, 125, 62.5, 31.2, None, "NVIDIA A10 data sheet"),
    # A10G (AWS EC2 G5 only; NVIDIA publishes no data sheet): AWS's figures as tabulated by
    # Baseten, "NVIDIA A10 vs A10G for ML model inference": FP16/BF16 tensor 70, FP32 35
    # (80 SMs at 1.71 GHz, GA102 tensor rate with FP32 accumulate).
    "A10G": _row("A10G", 70, 70, 35, 35, None, "AWS G5 / Baseten A10 vs A10G"),
    # NVIDIA A40 data sheet: BF16 149.7 (299.4*), TF32 74.8 (149.6*), FP32 37.4.
    "A40": _row("A40", 149.7, 149.7, 74.8, 37.4, None, "NVIDIA A40 data sheet"),
    # NVIDIA L4 Tensor Core GPU data sheet: BF16/FP16 242*, TF32 120*, FP8 485*, FP32 30.3.
    "L4": _row("L4", 121, 121, 60, 30.3, 242.5, "NVIDIA L4 data sheet"),
    # NVIDIA L40 data sheet: BF16/FP16 181.05 (362.1*), TF32 90.5 (181*), FP8 362 (724*),
    # FP32 90.5.
    "L40": _row("L40", 181.05, 181.05, 90.5, 90.5, 362, "NVIDIA L40 data sheet"),
    # NVIDIA L40S data sheet: BF16/FP16 362.05 (733*), TF32 183 (366*), FP8 733 (1,466*),
    # FP32 91.6.
    "L40S": _row("L40S", 362.05, 362.05, 183, 91.6, 733, "NVIDIA L40S data sheet"),
    # NVIDIA V100 Tensor Core GPU data sheet: tensor (FP16) 125 SXM2 / 112 PCIe / 130 V100S;
    # FP32 15.7 / 14 / 16.4. No BF16, TF32 or FP8.
    "V100 SXM2": _row("V100 SXM2", None, 125, None, 15.7, None, "NVIDIA V100 data sheet, SXM2"),
    "V100 PCIe": _row("V100 PCIe", None, 112, None, 14, None, "NVIDIA V100 data sheet, PCIe"),
    "V100S PCIe": _row("V100S PCIe", None, 130, None, 16.4, None, "NVIDIA V100S data sheet"),
    # NVIDIA T4 data sheet: mixed precision (FP16/FP32) 65, FP32 8.1.
    "T4": _row("T4", None, 65, None, 8.1, None, "NVIDIA T4 data sheet"),
    # NVIDIA Ada Lovelace architecture whitepaper, GeForce RTX 4090: FP16/BF16 tensor with FP32
    # accumulate 165.2 (330.4*), TF32 82.6 (165.2*), FP8 with FP32 accumulate 330.3 (660.6*),
    # FP32 82.6.
    "RTX 4090": _row("RTX 4090", 165.2, 165.2, 82.6, 82.6, 330.3, "NVIDIA Ada whitepaper"),
    # NVIDIA Ampere GA102 whitepaper, GeForce RTX 3090: FP16/BF16 tensor with FP32 accumulate
    # 71 (142*), TF32 35.6 (71*), FP32 35.6.
    "RTX 3090": _row("RTX 3090", 71, 71, 35.6, 35.6, None, "NVIDIA GA102 whitepaper"),
    # NVIDIA RTX A6000 data sheet: tensor 309.7* (FP16/BF16 dense 154.8), TF32 77.4, FP32 38.7.
    "RTX A6000": _row("RTX A6000", 154.8, 154.8, 77.4, 38.7, None, "NVIDIA RTX A6000 data sheet"),
    # NVIDIA HGX B200 data sheet, per GPU: FP16/BF16 4.5 PF*, TF32 2.2 PF*, FP8 9 PF*; no FP32
    # figure.
    "B200": _row("B200", 2250, 2250, 1100, None, 4500, "NVIDIA HGX B200 data sheet"),
    # NVIDIA GB200 NVL72 data sheet, rack figures / 72 GPUs: FP16/BF16 360 PF*, TF32 180 PF*,
    # FP8 720 PF*; no FP32 figure.
    "GB200": _row("GB200", 2500, 2500, 1250, None, 5000, "NVIDIA GB200 NVL72 data sheet / 72"),
    # AMD Instinct MI250X / MI250 data sheets (no sparsity figures): FP16/BF16 383 / 362.1,
    # FP32 matrix 95.7 / 90.5 per package. The package is two GCDs that the driver lists as two
    # devices: per device, half. No TF32 or FP8.
    "MI250X": _row("MI250X", 191.5, 191.5, None, 47.85, None, "AMD MI250X data sheet / 2 GCDs"),
    "MI250": _row("MI250", 181.05, 181.05, None, 45.25, None, "AMD MI250 data sheet / 2 GCDs"),
    # AMD Instinct MI300X data sheet (dense): FP16/BF16 1,307.4, TF32 653.7, FP8 2,614.9,
    # FP32 163.4.
    "MI300X": _row("MI300X", 1307.4, 1307.4, 653.7, 163.4, 2614.9, "AMD MI300X data sheet"),
}
"""Dense peak per GPU model (see the comment above each row for its data sheet)."""

_NAME_NOISE = re.compile(r"\b(NVIDIA|TESLA|GEFORCE|AMD|INSTINCT|QUADRO|GRAPHICS)\b")

_MATCHERS: tuple[tuple[re.Pattern[str], str | None], ...] = tuple(
    (re.compile(pattern), key)
    for pattern, key in (
        (r"\bGH200\b", "GH200"),
        (r"\bGB200\b", "GB200"),
        (r"\bB200\b", "B200"),
        (r"\bH200\b.*\bNVL\b", "H200 NVL"),
        (r"\bH200\b", "H200 SXM"),
        (r"\bH100\b.*\bNVL\b", "H100 NVL"),
        (r"\bH100\b.*\b(PCIE|HBM2E)\b", "H100 PCIe"),
        (r"\bH100\b", "H100 SXM"),
        (r"\bH800\b.*\bPCIE\b", "H800 PCIe"),
        (r"\bH800\b", "H800 SXM"),
        (r"\bH20\b", "H20"),
        (r"\bA100\b.*\bPCIE\b.*\b80 ?GB\b|\bA100\b.*\b80 ?GB\b.*\bPCIE\b", "A100 PCIe 80GB"),
        (r"\bA100\b.*\bPCIE\b", "A100 PCIe 40GB"),
        (r"\bA100\b.*\b80 ?GB\b", "A100 SXM4 80GB"),
        (r"\bA100\b", "A100 SXM4 40GB"),
        (r"\bA800\b.*\bPCIE\b", "A800 PCIe"),
        (r"\bA800\b", "A800 SXM4"),
        (r"\bA10G\b", "A10G"),
        (r"\bA10\b", "A10"),
        (r"\bA40\b", "A40"),
        (r"\bL40S\b", "L40S"),
        (r"\bL40\b", "L40"),
        (r"\bL4\b", "L4"),
        (r"\bV100S\b", "V100S PCIe"),
        (r"\bV100\b.*\bSXM2\b", "V100 SXM2"),
        (r"\bV100\b.*\bPCIE\b", "V100 PCIe"),
        (r"\bV100\b", None),  # SXM3 / DGXS boards: clocks differ, no data-sheet row here
        (r"^T4\b", "T4"),
        (r"^RTX 4090$", "RTX 4090"),
        (r"^RTX 3090$", "RTX 3090"),
        (r"^RTX A6000$", "RTX A6000"),
        (r"\bMI250X\b.*\bMI250\b", None),  # "MI250X/MI250": ROCm's name for either board
        (r"\bMI250X\b", "MI250X"),
        (r"\bMI250\b", "MI250"),
        (r"\bMI300X\b", "MI300X"),
    )
)
"""Product-name patterns (on `_normalise_name`), most specific first; a ``None`` key stops the
search: the name is known to be ambiguous."""


def _normalise_name(name: str) -> str:
    text = re.sub(r"[-_/(),]+", " ", str(name).upper())
    text = _NAME_NOISE.sub(" ", text)
    return re.sub(r"\s+", " ", text).strip()


def match_gpu(name: str | None) -> GpuPeak | None:
    """The `PEAK_TABLE` row of an NVML / nvidia-smi / ROCm product name (``"NVIDIA H100 80GB
    HBM3"`` → H100 SXM, ``"Tesla V100-SXM2-16GB"`` → V100 SXM2); None when the name is unknown
    or ambiguous (figures that need a peak then read "not available")."""
    if not name:
        return None
    text = _normalise_name(name)
    for pattern, key in _MATCHERS:
        if pattern.search(text):
            return PEAK_TABLE[key] if key is not None else None
    return None


# --------------------------------------------------------------------------------------------
# Model size


@dataclass(frozen=True)
class ModelSize:
    """Parameters of the trained model.

    ``params``: total parameters (None when only the active count is known);
    ``flops_params``: the parameters one token passes through (all of a dense model, the active
    ones of a mixture of experts; the input embedding, a lookup, is left out when the config
    says how big it is) — the ``N`` of ``2N`` / ``6N`` FLOPs per token. ``layers`` and
    ``attn_dim`` (heads × head dim) give the attention FLOPs when known. ``source`` says where
    the figure came from, ``method`` how it was computed.
    """

    flops_params: float
    params: float | None
    source: str
    method: str
    layers: int | None = None
    attn_dim: int | None = None
    name: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return {
            "params": self.params,
            "flops_params": self.flops_params,
            "source": self.source,
            "method": self.method,
            "name": self.name,
            "attention_flops": bool(self.layers and self.attn_dim),
        }


_SUFFIX = {"": 1.0, "K": 1e3, "M": 1e6, "B": 1e9, "G": 1e9, "T": 1e12}


def parse_param_count(text: str | float | int) -> float:
    """A parameter count as typed by a user: ``7e9``, ``7000000000``, ``7B``, ``1.5b``,
    ``500M``. Raises `ValueError` for anything else or a count that is not positive."""
    if isinstance(text, (int, float)) and not isinstance(text, bool):
        value = float(text)
    else:
        match = re.fullmatch(r"\s*(\d+(?:\.\d*)?(?:[eE][+-]?\d+)?)\s*([kKmMbBgGtT]?)\s*", str(text))
        if match is None:
            raise ValueError(f"not a parameter count: {text!r} (e.g. 7e9 or 7B)")
        value = float(match.group(1)) * _SUFFIX[match.group(2).upper()]
    if not math.isfinite(value) or value <= 0:
        raise ValueError(f"not a parameter count: {text!r} (must be positive)")
    return value


_SIZE_TOKEN = re.compile(r"^(\d+(?:\.\d+)?)([MBT])$", re.IGNORECASE)
_ACTIVE_TOKEN = re.compile(r"^A(\d+(?:\.\d+)?)([MBT])$", re.IGNORECASE)
_EXPERTS_TOKEN = re.compile(r"^\d+X\d+(?:\.\d+)?[MBT]$", re.IGNORECASE)


def params_from_name(name: str | None) -> ModelSize | None:
    """The size written in a model's name or path: ``Qwen2.5-7B-Instruct`` → 7e9,
    ``gemma-2-2b-it`` → 2e9, ``Qwen3-30B-A3B`` → 3e9 active (30e9 total). Path components
    are tried from the last; None when no component names a size, or when it names experts
    without an active count (``Mixtral-8x7B``: the FLOPs per token are not in the name)."""
    if not name:
        return None
    for part in reversed([p for p in re.split(r"[/\\]+", str(name)) if p]):
        tokens = re.split(r"[-_\s:]+", part)
        if any(_EXPERTS_TOKEN.match(t) for t in tokens):
            return None
        total = active = None
        for token in tokens:
            size = _SIZE_TOKEN.match(token)
            if size and total is None:
                total = float(size.group(1)) * _SUFFIX[size.group(2).upper()]
            act = _ACTIVE_TOKEN.match(token)
            if act and active is None:
                active = float(act.group(1)) * _SUFFIX[act.group(2).upper()]
        if total is None and active is None:
            continue
        if active is not None:
            method = (
                f"mixture of experts: the active {_fmt_params(active)} of the name "
                f"{part!r} count for FLOPs"
                + (f" (total {_fmt_params(total)})" if total is not None else "")
            )
            return ModelSize(active, total, "model name", method, name=str(name))
        method = f"size written in the name {part!r} (nominal: embeddings included)"
        return ModelSize(total, total, "model name", method, name=str(name))
    return None


_NON_GATED_TYPES = frozenset(
    {"gpt2", "gpt_neox", "gptj", "opt", "bloom", "falcon", "phi", "gpt_bigcode", "starcoder2"}
)
"""Model types whose MLP is two matrices (up, down); the others (Llama, Qwen, Mistral,
Gemma, Phi-3, DeepSeek…) use a gated MLP of three (gate, up, down)."""


def _cfg_int(config: Mapping[str, Any], *names: str) -> int | None:
    for name in names:
        value = config.get(name)
        if isinstance(value, (int, float)) and not isinstance(value, bool) and value > 0:
            return int(value)
    return None


def params_from_config(config: Mapping[str, Any], source: str = "config.json") -> ModelSize | None:
    """Parameters from a Hugging Face ``config.json`` (as a dict).

    With ``num_hidden_layers``, ``hidden_size``, ``vocab_size`` and ``intermediate_size``
    (and heads / key-value heads / head dim when present): per layer the attention projections
    ``h·(q + 2·kv) + q·h`` and the MLP (``3·h·I`` gated, ``2·h·I`` otherwise; for a mixture of
    experts the routed experts per token plus shared experts and the router), plus the LM
    head ``V·h``; DeepSeek's low-rank attention (MLA) by its ranks. Without
    ``intermediate_size``: ``12·L·h² + V·h``. None when layers, hidden size or vocabulary are
    missing. ``params`` adds the input embedding (unless tied).
    """
    if isinstance(config.get("text_config"), Mapping):  # vision-language: the language model
        inner = dict(config["text_config"])
        inner.setdefault("model_type", config.get("model_type"))
        config = inner
    layers = _cfg_int(config, "num_hidden_layers", "n_layer", "num_layers")
    hidden = _cfg_int(config, "hidden_size", "n_embd", "d_model")
    vocab = _cfg_int(config, "vocab_size", "padded_vocab_size")
    if not (layers and hidden and vocab):
        return None
    tied = bool(config.get("tie_word_embeddings", False))
    inter = _cfg_int(config, "intermediate_size", "n_inner", "ffn_hidden_size")
    heads = _cfg_int(config, "num_attention_heads", "n_head")
    head_dim = _cfg_int(config, "head_dim") or (hidden // heads if heads else None)
    lm_head = vocab * hidden
    embed = 0 if tied else vocab * hidden
    if inter is None:
        per_layer = 12 * hidden * hidden
        flops_params = layers * per_layer + lm_head
        method = (
            f"12·L·h² + V·h with L={layers}, h={hidden}, V={vocab} "
            "(config.json has no intermediate_size)"
        )
        return ModelSize(
            float(flops_params), float(flops_params + embed), source, method, layers,
            heads * head_dim if heads and head_dim else hidden,
        )  # fmt: skip
    kv_heads = _cfg_int(config, "num_key_value_heads", "num_kv_heads") or heads
    q_dim = heads * head_dim if heads and head_dim else hidden
    kv_dim = kv_heads * head_dim if kv_heads and head_dim else hidden
    attn_dim = q_dim
    if config.get("kv_lora_rank"):  # DeepSeek-V2/V3 multi-head latent attention
        nope = _cfg_int(config, "qk_nope_head_dim") or 0
        rope = _cfg_int(config, "qk_rope_head_dim") or 0
        v_head = _cfg_int(config, "v_head_dim") or head_dim or 0
        q_lora = _cfg_int(config, "q_lora_rank")
        kv_lora = int(config["kv_lora_rank"])
        qk = (heads or 0) * (nope + rope)
        attn = (hidden * q_lora + q_lora * qk) if q_lora else hidden * qk
        attn += hidden * (kv_lora + rope) + kv_lora * (heads or 0) * (nope + v_head)
        attn += (heads or 0) * v_head * hidden
        attn_dim = qk or q_dim
    else:
        attn = hidden * (q_dim + 2 * kv_dim) + q_dim * hidden
    gated = str(config.get("model_type") or "").lower() not in _NON_GATED_TYPES
    mats = 3 if gated else 2
    dense_mlp = mats * hidden * inter
    experts = _cfg_int(config, "num_experts", "num_local_experts", "n_routed_experts")
    per_token = _cfg_int(config, "num_experts_per_tok", "moe_topk", "num_experts_per_token")
    if experts and per_token and experts > 1:
        moe_inter = _cfg_int(config, "moe_intermediate_size") or inter
        expert = mats * hidden * moe_inter
        shared = 0
        if _cfg_int(config, "shared_expert_intermediate_size"):
            shared = mats * hidden * int(config["shared_expert_intermediate_size"])
        elif _cfg_int(config, "n_shared_experts"):
            shared = int(config["n_shared_experts"]) * expert
        router = hidden * experts
        dense_layers = min(layers, _cfg_int(config, "first_k_dense_replace") or 0)
        moe_layers = layers - dense_layers
        active = (
            dense_layers * (attn + dense_mlp)
            + moe_layers * (attn + per_token * expert + shared + router)
            + lm_head
        )
        total = (
            dense_layers * (attn + dense_mlp)
            + moe_layers * (attn + experts * expert + shared + router)
            + lm_head
            + embed
        )
        method = (
            f"config.json: {layers} layers, hidden {hidden}, {experts} experts of which "
            f"{per_token} per token (active parameters count for FLOPs), vocabulary {vocab}"
        )
        return ModelSize(float(active), float(total), source, method, layers, attn_dim)
    flops_params = layers * (attn + dense_mlp) + lm_head
    method = (
        f"config.json: {layers} layers × (attention {attn:,} + {'gated ' if gated else ''}MLP "
        f"{dense_mlp:,}) + LM head {lm_head:,} (input embedding left out: a lookup)"
    )
    return ModelSize(
        float(flops_params), float(flops_params + embed), source, method, layers, attn_dim
    )


def _fmt_params(value: float | None) -> str:
    if value is None:
        return "?"
    for scale, unit in ((1e12, "T"), (1e9, "B"), (1e6, "M")):
        if value >= scale:
            return f"{value / scale:.3g}{unit}"
    return f"{value:.0f}"


MODEL_PATH_KNOBS: tuple[str, ...] = (
    "actor_rollout_ref.model.path",  # verl
    "actor.model_name_or_path",  # OpenRLHF >= 0.10.2
    "pretrain",  # OpenRLHF < 0.10.2
    "model_name_or_path",  # TRL / transformers scripts (ModelConfig)
    "model",  # ms-swift, TRL CLI
    "model_id_or_path",  # ms-swift 2.x
    "model.model_name_or_path",
)
"""Knobs that name the trained (actor) model, in the order they are looked for."""

CRITIC_PATH_KNOBS: tuple[str, ...] = (
    "critic.model.path",  # verl
    "critic.model_name_or_path",  # OpenRLHF >= 0.10.2
    "critic_pretrain",  # OpenRLHF < 0.10.2
)


def run_settings(meta: Any) -> dict[str, Any]:
    """The run's settings: the parsed command line, then recorded knobs (which win)."""
    values: dict[str, Any] = {}
    for key, value in parse_knobs(list(meta.command or [])).items():
        values[str(key).replace("-", "_")] = coerce(value)
    for key, value in (meta.knobs or {}).items():
        values[str(key).replace("-", "_")] = coerce(value)
    return values


def model_path(
    settings: Mapping[str, Any], knobs: tuple[str, ...] = MODEL_PATH_KNOBS
) -> tuple[str | None, str | None]:
    """``(knob, value)`` of the first model-path knob set in ``settings``; (None, None)."""
    for knob in knobs:
        value = settings.get(knob.replace("-", "_"))
        if isinstance(value, str) and value.strip():
            return knob, value.strip()
    return None, None


@dataclass(frozen=True)
class EfficiencyOptions:
    """What the user or the caller adds: ``gpu_hour_price`` (the user's currency per
    GPU-hour), ``model_params`` (an explicit parameter count), ``model_config`` (the parsed
    ``config.json`` found at the model path, read by the caller) and where it was read."""

    gpu_hour_price: float | None = None
    model_params: float | None = None
    model_config: Mapping[str, Any] | None = None
    model_config_path: str | None = None


def attach_options(ctx: AnalysisContext, options: EfficiencyOptions | None) -> AnalysisContext:
    """Give ``ctx`` the efficiency options its summary and the ``low_mfu`` stall read; returns
    it."""
    ctx.__dict__["_efficiency_options"] = options or EfficiencyOptions()
    ctx.__dict__.pop("_efficiency", None)
    return ctx


def options_of(ctx: AnalysisContext) -> EfficiencyOptions:
    """The options attached to ``ctx`` (defaults when none were)."""
    return ctx.__dict__.get("_efficiency_options") or EfficiencyOptions()


def model_size(
    options: EfficiencyOptions, settings: Mapping[str, Any]
) -> tuple[ModelSize | None, str | None]:
    """The actor model's size and, when there is none, why: the explicit
    ``options.model_params`` first, then ``options.model_config``, then the size in the name
    at the model-path knob."""
    if options.model_params:
        return (
            ModelSize(
                float(options.model_params), float(options.model_params), "--model-params",
                "given by the user (FLOPs use it as the active parameter count)",
            ),
            None,
        )  # fmt: skip
    knob, path = model_path(settings)
    if options.model_config:
        where = options.model_config_path or "config.json"
        size = params_from_config(options.model_config, source=f"config.json ({where})")
        if size is not None:
            return ModelSize(**{**size.__dict__, "name": path}), None
    size = params_from_name(path)
    if size is not None:
        method = f"{size.method}, from {knob}"
        return ModelSize(**{**size.__dict__, "method": method}), None
    if path is None:
        return None, "no model path among the run's settings: pass --model-params"
    return None, f"no size in the model name {path!r} ({knob}): pass --model-params"


# --------------------------------------------------------------------------------------------
# Tokens and wall time per phase

FORWARD_FACTOR = 2.0
"""Model FLOPs per parameter per token of a forward pass (one multiply-add per weight)."""
TRAIN_FACTOR = 6.0
"""Forward + backward: the backward pass costs twice the forward."""

PHASE_WORK: dict[str, tuple[str, float]] = {
    "rollout": ("generated", FORWARD_FACTOR),
    "ref_logprob": ("forward", FORWARD_FACTOR),
    "old_logprob": ("forward", FORWARD_FACTOR),
    "values": ("forward", FORWARD_FACTOR),
    "update_actor": ("trained", TRAIN_FACTOR),
    "update_critic": ("trained", TRAIN_FACTOR),
}
"""Per phase: which tokens it processes and its FLOPs per parameter per token."""

CRITIC_PHASES = ("values", "update_critic")

_RESPONSE_KEYS = ("response_length/mean", "response_length_mean", "rollout/response_length_mean")
_PROMPT_KEYS = ("prompt_length/mean", "prompt_length_mean")

FRAMEWORK_MFU_PHASE: dict[str, str] = {
    "perf/mfu/actor": "update_actor",
    "perf/mfu/critic": "update_critic",
    "perf/mfu/actor_infer": "old_logprob",
    "perf/mfu/ref": "ref_logprob",
}
"""verl's logged MFU keys → the phase they time."""

VERL_MFU_NOTE = (
    "verl's perf/mfu/* is a fraction (1.0 = 100%) of verl's own per-GPU peak table (bf16 "
    "dense, matched by a substring of the device name; verl/utils/flops_counter.py): the "
    "estimated FLOPs of the worker call (6 × parameters × tokens plus attention, over the PPO "
    "epochs; actor_infer, the old-log-prob forward, a third of that) over the call's time, "
    "divided by that peak and by the world size. It times the worker's compute only, so it "
    "reads higher than gpuprof's MFU, which counts the phase's wall time. 0 means verl did not "
    "know the GPU (its peak is then infinite) or the model type."
)
VERL_MFU_ABOVE_ONE = (
    "a logged perf/mfu above 1 is impossible as a fraction of the real peak: verl's table gave "
    "this GPU too low a peak (verl 0.3 and earlier matched 'NVIDIA GH200 480GB' to its H20 "
    "row, 148 TFLOP/s, by the substring 'H20'; the GH200's dense bf16 peak is 989.5)"
)


def _num(value: Any) -> float | None:
    if isinstance(value, bool) or value is None:
        return None
    try:
        number = float(value)
    except (TypeError, ValueError):
        return None
    return number if math.isfinite(number) else None


def _first(attrs: Mapping[str, Any], keys: tuple[str, ...]) -> float | None:
    for key in keys:
        value = _num(attrs.get(key))
        if value is not None:
            return value
    return None


def _step_rows(spans: pd.DataFrame, settings: Mapping[str, Any]) -> pd.DataFrame:
    """One row per step span: step, process, and the step's token counts.

    ``batch_tokens``: prompt + response tokens of the step's batch (the step's ``tokens``,
    unless its source says it counts responses only); ``generated``: response tokens
    (``generated_tokens`` when recorded, else ``tokens`` × response / (prompt + response)
    mean lengths, else response mean × ``data.train_batch_size`` × ``rollout.n``, else
    ``tokens`` when they count responses only); ``trained``: ``trained_tokens`` when recorded,
    else the batch tokens × PPO epochs (verl ``ppo_epochs``, TRL ``num_iterations``).
    """
    cols = ["step", "owner", "batch_tokens", "generated", "trained", "prompt_mean",
            "response_mean"]  # fmt: skip
    steps = spans[spans["phase"] == "step"] if len(spans) else spans
    if steps.empty:
        return pd.DataFrame(columns=cols)
    epochs = _num(settings.get("actor_rollout_ref.actor.ppo_epochs"))
    if epochs is None:
        epochs = _num(settings.get("num_iterations"))
    epochs = epochs if epochs and epochs > 0 else 1.0
    batch = _num(settings.get("data.train_batch_size"))
    n = _num(settings.get("actor_rollout_ref.rollout.n", 1)) or 1.0
    rows = []
    for host, pid, step, attrs in zip(steps["host"], steps["pid"], steps["step"], steps["attrs"]):
        if step is None or step is pd.NA or (isinstance(step, float) and math.isnan(step)):
            continue
        attrs = attrs if isinstance(attrs, Mapping) else {}
        tokens = _num(attrs.get("tokens"))
        response = _first(attrs, _RESPONSE_KEYS)
        prompt = _first(attrs, _PROMPT_KEYS)
        responses_only = str(attrs.get("tokens_source", "")).startswith("rollout/response_length")
        batch_tokens = None if responses_only else tokens
        generated = _num(attrs.get("generated_tokens"))
        if generated is None and responses_only:
            generated = tokens
        if generated is None and response is not None and prompt is not None:
            if batch_tokens is not None and prompt + response > 0:
                generated = batch_tokens * response / (prompt + response)
            elif batch is not None:
                generated = response * batch * n
        if batch_tokens is None and generated is not None and response and prompt is not None:
            batch_tokens = generated * (prompt + response) / response
        trained = _num(attrs.get("trained_tokens"))
        if trained is None and batch_tokens is not None:
            trained = batch_tokens * epochs
        rows.append((int(step), f"{host}:{pid}", batch_tokens, generated, trained, prompt,
                     response))  # fmt: skip
    return pd.DataFrame(rows, columns=cols)


def _phase_walls(spans: pd.DataFrame) -> pd.DataFrame:
    """Per (phase, step): wall seconds the phase took (union of its spans per process, mean
    over the processes that ran it), processes, and tokens the phase's own outermost spans
    recorded (summed over processes; NaN when none did). Vectorised: a day-long run has
    millions of spans."""
    cols = ["phase", "step", "wall_s", "processes", "span_tokens"]
    work = spans[spans["phase"].isin(PHASE_WORK)] if len(spans) else spans
    work = work[work["step"].notna()] if len(work) else work
    if work.empty:
        return pd.DataFrame(columns=cols)
    keys = ["phase", "step", "host", "pid"]
    frame = pd.DataFrame(
        {
            "phase": work["phase"].astype(object).to_numpy(),
            "step": work["step"].astype("int64").to_numpy(),
            "host": work["host"].astype(object).to_numpy(),
            "pid": pd.to_numeric(work["pid"]).astype("int64").to_numpy(),
            "s": work["start_ns"].astype("int64").to_numpy(),
            "e": work["end_ns"].astype("int64").to_numpy(),
            "depth": pd.to_numeric(work["depth"], errors="coerce").fillna(0).to_numpy(),
            "tokens": [
                _num(a.get("tokens")) if isinstance(a, Mapping) else None for a in work["attrs"]
            ],
        }
    )
    frame["tokens"] = pd.to_numeric(frame["tokens"], errors="coerce")
    frame["g"] = frame.groupby(keys, sort=False).ngroup()
    frame = frame.sort_values(["g", "s"], kind="stable").reset_index(drop=True)
    # union of each group's intervals: a new block starts past the reach of those before it
    reach = frame.groupby("g")["e"].cummax()
    before = reach.groupby(frame["g"]).shift()
    block = (before.isna() | (frame["s"] > before)).cumsum()
    merged = frame.groupby(block).agg(g=("g", "first"), s=("s", "min"), e=("e", "max"))
    covered_s = (merged["e"] - merged["s"]).groupby(merged["g"]).sum() / 1e9
    outer = frame["depth"] == frame.groupby("g")["depth"].transform("min")
    tokens = frame["tokens"].where(outer).groupby(frame["g"]).sum(min_count=1)
    per_proc = frame.groupby("g")[["phase", "step"]].first()
    per_proc["wall_s"] = covered_s
    per_proc["tokens"] = tokens
    out = per_proc.groupby(["phase", "step"], sort=True).agg(
        wall_s=("wall_s", "mean"),
        processes=("wall_s", "size"),
        span_tokens=("tokens", lambda s: s.sum(min_count=1)),
    )
    return out.reset_index()[cols]


# --------------------------------------------------------------------------------------------
# The figures


@dataclass
class _Figures:
    """Everything `efficiency_summary` reports, kept for the ``low_mfu`` stall."""

    gpu: dict[str, Any]
    peak: float | None
    model: dict[str, Any] | None
    phases: list[dict[str, Any]]
    run: dict[str, Any]
    framework: dict[str, Any]
    notes: list[str] = field(default_factory=list)
    seq_mean: float | None = None
    attention_counted: bool = False


def _gpu_name(ctx: AnalysisContext) -> tuple[str | None, list[str]]:
    names = [str(g.get("name")) for g in ctx.run.meta.gpus or [] if g.get("name")]
    if not names:
        return None, []
    counts = pd.Series(names).value_counts()
    return str(counts.index[0]), sorted(set(names))


def _run_gpus(ctx: AnalysisContext, settings: Mapping[str, Any]) -> tuple[int | None, str]:
    run = ctx.run
    if len(run.gpu):
        return int(run.gpu[["host", "gpu"]].drop_duplicates().shape[0]), "GPU samples"
    if run.meta.gpus:
        return len(run.meta.gpus), "GPU inventory"
    per_node = _num(settings.get("trainer.n_gpus_per_node"))
    nodes = _num(settings.get("trainer.nnodes", 1)) or 1.0
    if per_node:
        return int(per_node * nodes), "trainer.n_gpus_per_node × trainer.nnodes"
    return None, "unknown"


def _phase_gpus(ctx: AnalysisContext) -> dict[str, int]:
    run = ctx.run
    if not (len(run.gpu) and len(run.spans)):
        return {}
    table = ctx.by_phase
    if "gpus" not in table:
        return {}
    return {str(p): int(g) for p, g in zip(table["phase"], table["gpus"]) if g == g and g > 0}


def _framework_metrics(spans: pd.DataFrame, framework: str | None) -> dict[str, Any]:
    steps = spans[spans["phase"] == "step"] if len(spans) else spans
    values: dict[str, list[float]] = {}
    for attrs in steps["attrs"] if len(steps) else []:
        if not isinstance(attrs, Mapping):
            continue
        for key, value in attrs.items():
            number = _num(value)
            if str(key).startswith("perf/") and number is not None:
                values.setdefault(str(key), []).append(number)
    metrics = {
        key: {
            "mean": float(np.mean(v)),
            "min": float(np.min(v)),
            "max": float(np.max(v)),
            "steps": len(v),
        }
        for key, v in sorted(values.items())
    }
    notes, warnings = [], []
    if any(k.startswith("perf/mfu/") for k in metrics):
        notes.append(VERL_MFU_NOTE)
        if any(m["max"] > 1.0 for k, m in metrics.items() if k.startswith("perf/mfu/")):
            warnings.append(VERL_MFU_ABOVE_ONE)
    if "perf/throughput" in metrics:
        notes.append(
            "verl's perf/throughput: prompt + response tokens of the step over (step time × "
            "GPUs), in tokens/s per GPU"
        )
    return {"name": framework, "metrics": metrics, "notes": notes, "warnings": warnings}


def _compute(ctx: AnalysisContext) -> _Figures:
    cached = ctx.__dict__.get("_efficiency")
    if cached is not None:
        return cached
    options = options_of(ctx)
    run = ctx.run
    settings = run_settings(run.meta)
    notes: list[str] = []

    name, names = _gpu_name(ctx)
    peak_row = match_gpu(name)
    dtype = peak_row.training_dtype() if peak_row else None
    peak = peak_row.flops(dtype) if peak_row and dtype else None
    gpu = {
        "name": name,
        "model": peak_row.model if peak_row else None,
        "dtype": dtype,
        "peak_flops_per_gpu": peak,
        "source": peak_row.source if peak_row else None,
    }
    if len(names) > 1:
        notes.append(f"mixed GPU models ({', '.join(names)}): peak of the most common, {name}")
    if name is None:
        notes.append("MFU not available: the run does not name its GPUs")
    elif peak is None:
        notes.append(f"MFU not available: no peak FLOP/s known for {name!r}")

    size, why = model_size(options, settings)
    critic_size = size
    if size is None:
        notes.append(f"model FLOPs not available: {why}")
    else:
        _, critic_path = model_path(settings, CRITIC_PATH_KNOBS)
        critic_named = params_from_name(critic_path)
        if critic_named is not None and options.model_params is None:
            critic_size = critic_named

    spans = _valid_spans(run.spans)
    steps = _step_rows(spans, settings)
    walls = _phase_walls(spans)
    per_step = (
        steps.groupby("step").agg(
            batch_tokens=("batch_tokens", lambda s: s.sum(min_count=1)),
            generated=("generated", lambda s: s.sum(min_count=1)),
            trained=("trained", lambda s: s.sum(min_count=1)),
            prompt_mean=("prompt_mean", "mean"),
            response_mean=("response_mean", "mean"),
        )
        if len(steps)
        else pd.DataFrame(
            columns=["batch_tokens", "generated", "trained", "prompt_mean", "response_mean"]
        )
    )
    prompt_mean = _num(per_step["prompt_mean"].mean()) if len(per_step) else None
    response_mean = _num(per_step["response_mean"].mean()) if len(per_step) else None
    seq_mean = (
        prompt_mean + response_mean
        if prompt_mean is not None and response_mean is not None
        else None
    )

    run_gpus, gpus_from = _run_gpus(ctx, settings)
    phase_gpus = _phase_gpus(ctx)
    phases: list[dict[str, Any]] = []
    attention_counted = False
    total_flops = 0.0
    for phase, (kind, factor) in PHASE_WORK.items():
        rows = walls[walls["phase"] == phase] if len(walls) else walls
        if rows.empty:
            continue
        column = {"generated": "generated", "forward": "batch_tokens", "trained": "trained"}[kind]
        tokens_by_step = rows["span_tokens"].to_numpy(float)
        from_steps = (
            per_step[column].reindex(rows["step"].to_numpy()).to_numpy(float)
            if len(per_step)
            else np.full(len(rows), np.nan)
        )
        source = "phase spans' tokens" if np.isfinite(tokens_by_step).any() else "step tokens"
        tokens = np.where(np.isfinite(tokens_by_step), tokens_by_step, from_steps)
        wall = rows["wall_s"].to_numpy(float)
        ok = np.isfinite(tokens) & (wall > 0)
        entry: dict[str, Any] = {
            "phase": phase,
            "token_kind": kind,
            "wall_s": float(wall.sum()),
            "steps": len(rows),
            "steps_with_tokens": int(ok.sum()),
            "tokens": float(tokens[ok].sum()) if ok.any() else None,
            "tokens_source": source if ok.any() else None,
            "tokens_per_s": None,
            "gpus": phase_gpus.get(phase, run_gpus),
            "tokens_per_s_per_gpu": None,
            "flops_per_token": None,
            "achieved_flops_per_s": None,
            "mfu": None,
        }
        if not ok.any():
            phases.append(entry)
            continue
        wall_ok = float(wall[ok].sum())
        entry["tokens_per_s"] = entry["tokens"] / wall_ok
        if entry["gpus"]:
            entry["tokens_per_s_per_gpu"] = entry["tokens_per_s"] / entry["gpus"]
        model = critic_size if phase in CRITIC_PHASES else size
        if model is not None:
            per_token = factor * model.flops_params
            attention = _attention_flops(phase, model, prompt_mean, response_mean)
            if attention is not None:
                per_token += attention
                attention_counted = True
            entry["flops_per_token"] = per_token
            flops = per_token * entry["tokens"]
            total_flops += flops
            entry["achieved_flops_per_s"] = flops / wall_ok
            if peak and entry["gpus"]:
                entry["mfu"] = entry["achieved_flops_per_s"] / (peak * entry["gpus"])
        phases.append(entry)

    total_gpu_s = ctx.total_gpu_s if len(run.gpu) else 0.0
    gpu_s_source = "GPU samples"
    if total_gpu_s <= 0:
        duration = _steps_wall_s(spans)
        total_gpu_s = duration * run_gpus if duration and run_gpus else 0.0
        gpu_s_source = f"steps' wall time × {run_gpus} GPUs ({gpus_from})" if total_gpu_s else ""
    batch_total = _num(per_step["batch_tokens"].sum(min_count=1)) if len(per_step) else None
    steps_wall = _steps_wall_s(spans)
    run_fig: dict[str, Any] = {
        "gpus": run_gpus,
        "gpus_source": gpus_from,
        "gpu_s": total_gpu_s or None,
        "gpu_s_source": gpu_s_source or None,
        "tokens": batch_total,
        "tokens_per_s": batch_total / steps_wall if batch_total and steps_wall else None,
        "tokens_per_s_per_gpu": None,
        "achieved_flops": total_flops if total_flops > 0 else None,
        "mfu": None,
    }
    if run_fig["tokens_per_s"] and run_gpus:
        run_fig["tokens_per_s_per_gpu"] = run_fig["tokens_per_s"] / run_gpus
    if total_flops > 0 and peak and total_gpu_s > 0:
        run_fig["mfu"] = total_flops / (peak * total_gpu_s)
    above = [p["phase"] for p in phases if p["mfu"] is not None and p["mfu"] > 1.0]
    if above:
        notes.append(
            f"MFU above 100% in {', '.join(above)}: the model size or the token counts are "
            "too high for this run (check --model-params and the step's tokens)"
        )
    if size is not None and not attention_counted and any(p["flops_per_token"] for p in phases):
        notes.append(
            "attention FLOPs not counted (no config.json with the model's shape, or no "
            "sequence lengths): MFU is a lower bound"
        )
    figures = _Figures(
        gpu=gpu,
        peak=peak,
        model=size.to_dict() if size is not None else None,
        phases=phases,
        run=run_fig,
        framework=_framework_metrics(spans, run.meta.framework),
        notes=notes,
        seq_mean=seq_mean,
        attention_counted=attention_counted,
    )
    ctx.__dict__["_efficiency"] = figures
    return figures


def _valid_spans(spans: pd.DataFrame) -> pd.DataFrame:
    """Spans with a host, a pid, a start and an end not before it (attrs kept)."""
    if spans.empty:
        return spans
    start = pd.to_numeric(spans["start_ns"], errors="coerce")
    end = pd.to_numeric(spans["end_ns"], errors="coerce")
    ok = start.notna() & end.notna() & (end >= start) & spans["host"].notna()
    ok &= pd.to_numeric(spans["pid"], errors="coerce").notna()
    return spans[ok.to_numpy(dtype=bool)]


def _steps_wall_s(spans: pd.DataFrame) -> float | None:
    """Wall seconds of the run's steps (union of step spans per process, mean over
    processes); None without step spans."""
    steps = spans[spans["phase"] == "step"] if len(spans) else spans
    if steps.empty:
        return None
    walls = [
        covered_ns(g["start_ns"].to_numpy(np.int64), g["end_ns"].to_numpy(np.int64)) / 1e9
        for _, g in steps.groupby(["host", "pid"], sort=False)
    ]
    value = float(np.mean(walls))
    return value if value > 0 else None


def _attention_flops(
    phase: str, model: ModelSize, prompt: float | None, response: float | None
) -> float | None:
    """Attention score FLOPs per token of ``phase`` (QKᵀ and AV: 4 FLOPs per layer per
    attention channel per token of context); None without the model's shape or the mean
    prompt / response lengths. Mean lengths make it a lower bound (Σs² ≥ (Σs)²/n)."""
    if not (model.layers and model.attn_dim) or prompt is None or response is None:
        return None
    per_context = 4.0 * model.layers * model.attn_dim
    if phase == "rollout":  # a decoded token attends to the prompt and the response so far
        return per_context * (prompt + response / 2.0)
    forward = per_context * (prompt + response) / 2.0  # causal: half the sequence on average
    return forward * (3.0 if PHASE_WORK[phase][1] == TRAIN_FACTOR else 1.0)


def _cost(
    ctx: AnalysisContext, fig: _Figures, findings: list[Finding], price: float | None
) -> dict[str, Any]:
    idle = _num(ctx.totals.get("idle_gpu_s")) if len(ctx.run.gpu) else None
    total = float(fig.run.get("gpu_s") or 0.0)

    def money(gpu_s: float | None) -> float | None:
        return None if price is None or gpu_s is None else gpu_s / 3600.0 * price

    return {
        "gpu_hour_price": price,
        "gpu_hours": total / 3600.0 if total > 0 else None,
        "gpu_hours_source": fig.run.get("gpu_s_source") if total > 0 else None,
        "run_cost": money(total) if total > 0 else None,
        "idle_gpu_hours": idle / 3600.0 if idle is not None else None,
        "idle_cost": money(idle),
        "findings": [
            {
                "kind": f.kind,
                "gpu_seconds_lost": float(f.gpu_seconds_lost),
                "gpu_hours_lost": float(f.gpu_seconds_lost) / 3600.0,
                "cost": money(float(f.gpu_seconds_lost)),
            }
            for f in findings
        ],
    }


def efficiency_summary(
    ctx: AnalysisContext, findings: list[Finding] | None = None
) -> dict[str, Any]:
    """The ``efficiency`` entry of the diagnosis summary (docs/ANALYZE_JSON.md), JSON-able.

    ``gpu``: the GPU model matched in `PEAK_TABLE` and its peak FLOP/s; ``model``: where the
    parameter count came from; ``phases``: per phase with model work (rollout, log-prob and
    value passes, updates) its tokens, wall s, tokens/s (and per GPU), FLOPs per token,
    achieved FLOP/s and MFU (0–1); ``run``: tokens/s over the steps and whole-run MFU (the
    phases' model FLOPs over peak × the run's GPU-seconds); ``framework``: the framework's own
    ``perf/*`` figures (verl's MFU and throughput) with what they mean; ``cost``: idle
    GPU-hours and, with a price, their cost and each finding's; ``notes``: why a figure is not
    available. Options come from `attach_options`.
    """
    try:
        fig = _compute(ctx)
    except Exception as exc:  # efficiency figures must never take the diagnosis down
        return {"notes": [f"efficiency figures failed: {type(exc).__name__}: {exc}"]}
    price = options_of(ctx).gpu_hour_price
    phases = []
    for entry in fig.phases:
        logged = [
            {"key": key, **fig.framework["metrics"][key]}
            for key, phase in FRAMEWORK_MFU_PHASE.items()
            if phase == entry["phase"] and key in fig.framework["metrics"]
        ]
        phases.append({**entry, "framework_mfu": logged or None})
    return {
        "gpu": fig.gpu,
        "model": fig.model,
        "phases": phases,
        "run": fig.run,
        "framework": fig.framework,
        "cost": _cost(ctx, fig, list(findings or []), price),
        "notes": list(fig.notes),
    }
