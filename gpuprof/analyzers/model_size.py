"""The trained model's size: parameters (total and active), layers and attention width for the
attention FLOPs, and the KV-cache bytes per token; from ``--model-params``, the model's
``config.json`` or the size written in its name.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from gpuprof.analyzers.settings import EfficiencyOptions

__all__ = [
    "CRITIC_PATH_KNOBS",
    "MODEL_PATH_KNOBS",
    "ModelSize",
    "model_path",
    "model_size",
    "params_from_config",
    "params_from_name",
    "parse_param_count",
]


@dataclass(frozen=True)
class ModelSize:
    """Parameters of the trained model.

    ``params``: total parameters (None when only the active count is known);
    ``flops_params``: the parameters one token passes through (all of a dense model, the active
    ones of a mixture of experts; the input embedding, a lookup, is left out when the config
    says how big it is) — the ``N`` of ``2N`` / ``6N`` FLOPs per token. ``layers`` and
    ``attn_dim`` (heads × head dim) give the attention FLOPs when known;
    ``kv_bytes_per_token``: the KV cache one token of context holds over all layers at 2 bytes
    a value (from config.json only). ``source`` says where the figure came from, ``method``
    how it was computed.
    """

    flops_params: float
    params: float | None
    source: str
    method: str
    layers: int | None = None
    attn_dim: int | None = None
    name: str | None = None
    kv_bytes_per_token: float | None = None

    @property
    def weight_bytes(self) -> float:
        """Bytes of the weights at 2 bytes a parameter (bf16/fp16; all experts of a mixture)."""
        return 2.0 * (self.params or self.flops_params)

    def to_dict(self) -> dict[str, Any]:
        return {
            "params": self.params,
            "flops_params": self.flops_params,
            "source": self.source,
            "method": self.method,
            "name": self.name,
            "attention_flops": bool(self.layers and self.attn_dim),
            "kv_bytes_per_token": self.kv_bytes_per_token,
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
        kv_bytes = 2.0 * layers * (kv_lora + rope)  # the latent and the rope key, cached once
    else:
        attn = hidden * (q_dim + 2 * kv_dim) + q_dim * hidden
        kv_bytes = 2.0 * layers * 2 * kv_dim  # a key and a value per layer
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
        return ModelSize(
            float(active),
            float(total),
            source,
            method,
            layers,
            attn_dim,
            kv_bytes_per_token=kv_bytes,
        )
    flops_params = layers * (attn + dense_mlp) + lm_head
    method = (
        f"config.json: {layers} layers × (attention {attn:,} + {'gated ' if gated else ''}MLP "
        f"{dense_mlp:,}) + LM head {lm_head:,} (input embedding left out: a lookup)"
    )
    return ModelSize(
        float(flops_params), float(flops_params + embed), source, method, layers, attn_dim,
        kv_bytes_per_token=kv_bytes,
    )  # fmt: skip


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


def model_path(
    settings: Mapping[str, Any], knobs: tuple[str, ...] = MODEL_PATH_KNOBS
) -> tuple[str | None, str | None]:
    """``(knob, value)`` of the first model-path knob set in ``settings``; (None, None)."""
    for knob in knobs:
        value = settings.get(knob.replace("-", "_"))
        if isinstance(value, str) and value.strip():
            return knob, value.strip()
    return None, None


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
