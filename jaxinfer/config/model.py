"""Frozen model configuration, parsed from a Hugging Face ``config.json``.

One dataclass describes every supported decoder (Llama, Mistral, Qwen2, Qwen3, and the mixture-of-experts
Mixtral, Qwen2-MoE, Qwen3-MoE; DeepSeek-V2 / V3's latent attention, parsed by ``jaxinfer.config.deepseek``):
the differences between them are flags and sizes (q/k/v bias, q/k RMSNorm, tied embeddings, number of
experts, a shared expert) rather than subclasses. The config is hashable so it can be a static argument of
jitted functions.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

from jaxinfer.config.deepseek import DEEPSEEK_FAMILIES, deepseek_num_params, deepseek_to_hf, from_deepseek_dict, \
    mla_attention_scale
from jaxinfer.config.rope import RopeScaling, parse_rope_scaling, rope_inv_freq  # noqa: F401 (re-exported)

# HF `architectures[0]` -> our family name. Anything else is refused by name.
SUPPORTED_ARCHITECTURES = {
    "LlamaForCausalLM": "llama",
    "MistralForCausalLM": "mistral",
    "Qwen2ForCausalLM": "qwen2",
    "Qwen3ForCausalLM": "qwen3",
    "MixtralForCausalLM": "mixtral",
    "Qwen2MoeForCausalLM": "qwen2_moe",
    "Qwen3MoeForCausalLM": "qwen3_moe",
    "Gemma2ForCausalLM": "gemma2",
    "Gemma3ForCausalLM": "gemma3_text",
    "Phi3ForCausalLM": "phi3",
    "GptOssForCausalLM": "gpt_oss",
    "DeepseekV2ForCausalLM": "deepseek_v2",
    "DeepseekV3ForCausalLM": "deepseek_v3",
}
MOE_FAMILIES = ("mixtral", "qwen2_moe", "qwen3_moe", "gpt_oss")
GEMMA_FAMILIES = ("gemma2", "gemma3_text")
SLIDING, FULL = "sliding_attention", "full_attention"  # HF's layer_types
ACTIVATIONS = ("silu", "swish", "gelu_pytorch_tanh", "gelu_tanh")  # the last two: GELU, tanh approximation

@dataclasses.dataclass(frozen=True)
class ModelConfig:
    """Shapes and numerics of one decoder-only transformer."""

    architecture: str  # a value of SUPPORTED_ARCHITECTURES
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rms_norm_eps: float = 1e-6
    rope_theta: float = 10000.0
    rope_scaling: RopeScaling | None = None
    max_position_embeddings: int = 2048
    tie_word_embeddings: bool = False
    attention_bias: bool = False  # q/k/v projections carry a bias (Qwen2)
    qk_norm: bool = False  # per-head RMSNorm on q and k before RoPE (Qwen3)
    sliding_window: int | None = None  # None: full attention
    # per layer SLIDING or FULL (Gemma 2/3 interleave them); () = every layer as ``sliding_window`` says
    layer_types: tuple[str, ...] = ()
    hidden_act: str = "silu"
    bos_token_id: int | None = None
    eos_token_ids: tuple[int, ...] = ()
    # Mixture of experts (every layer's MLP is an MoE block when num_experts > 0; 0 = a dense model).
    num_experts: int = 0
    num_experts_per_tok: int = 0  # top-k
    moe_intermediate_size: int = 0  # each expert's FFN width
    norm_topk_prob: bool = False  # renormalise the top-k router probabilities to sum to 1
    shared_expert_intermediate_size: int = 0  # Qwen2-MoE: an always-on expert behind a sigmoid gate; 0 = none
    # Rows appended to the embedding and LM head so that a vocabulary-parallel split is even (set by the
    # sharding plan, never read from a checkpoint): their logits are dropped before anything samples them.
    vocab_padding: int = 0
    # Gemma 2 / 3: RMSNorm scales by (norm_offset + weight); embeddings times embed_multiplier (sqrt(hidden));
    # "sandwich" norms after attention and around the MLP; scores scaled by query_pre_attn_scalar ** -0.5;
    # tanh soft-capping of the attention scores and of the final logits; a RoPE base of its own for the
    # sliding-window layers (Gemma 3: 10k local, ``rope_theta`` global).
    norm_offset: float = 0.0
    embed_multiplier: float = 1.0
    sandwich_norms: bool = False
    query_pre_attn_scalar: float | None = None  # None: head_dim
    attn_logit_softcapping: float | None = None
    final_logit_softcapping: float | None = None
    rope_local_theta: float | None = None
    # GPT-OSS: a learned per-head logit in every attention softmax's denominator (``sinks``), a bias on o_proj;
    # a router with a bias whose softmax runs over the chosen top-k logits only; experts with biases and the
    # clamped SwiGLU ``(clip(up, -l, l) + 1) * g * sigmoid(alpha * g)``, ``g = min(gate, l)``.
    attention_sinks: bool = False
    attention_out_bias: bool = False
    router_bias: bool = False
    router_topk_softmax: bool = False
    expert_bias: bool = False
    swiglu_limit: float | None = None  # None: the plain SwiGLU silu(gate) * up
    swiglu_alpha: float = 1.702
    # DeepSeek-V2 / V3 (``jaxinfer.config.deepseek``): multi-head latent attention when kv_lora_rank > 0 (then
    # num_kv_heads is 1 and head_dim the RoPE width); the first ``first_k_dense_replace`` layers are dense;
    # routing by ``topk_method`` over ``n_group`` groups; ``num_shared_experts`` ungated shared experts.
    kv_lora_rank: int = 0
    q_lora_rank: int | None = None
    qk_nope_head_dim: int = 0
    qk_rope_head_dim: int = 0
    v_head_dim: int = 0
    rope_interleave: bool = False
    first_k_dense_replace: int = 0
    topk_method: str = ""  # "" (softmax top-k, moe.route) or a DeepSeek method (jaxinfer.model.deepseek_moe)
    n_group: int = 1
    topk_group: int = 1
    routed_scaling_factor: float = 1.0
    num_shared_experts: int = 0

    def __post_init__(self):
        if self.num_heads % self.num_kv_heads:
            raise ValueError(
                f"num_attention_heads ({self.num_heads}) must be a multiple of "
                f"num_key_value_heads ({self.num_kv_heads})"
            )
        if self.hidden_act not in ACTIVATIONS:
            raise NotImplementedError(f"hidden_act={self.hidden_act!r} is not supported ({ACTIVATIONS})")
        if self.layer_types and (len(self.layer_types) != self.num_layers
                                 or set(self.layer_types) - {SLIDING, FULL}):
            raise ValueError(f"layer_types must name {SLIDING!r} or {FULL!r} for each of the {self.num_layers} "
                             f"layers, got {self.layer_types}")
        if self.num_experts:
            if not 1 <= self.num_experts_per_tok <= self.num_experts:
                raise ValueError(
                    f"num_experts_per_tok={self.num_experts_per_tok} must be in [1, num_experts={self.num_experts}]"
                )
            if self.moe_intermediate_size < 1:
                raise ValueError(f"moe_intermediate_size must be positive, got {self.moe_intermediate_size}")
        elif self.num_experts_per_tok or self.shared_expert_intermediate_size:
            raise ValueError("num_experts_per_tok / shared_expert_intermediate_size need num_experts > 0")

    def layer_sliding_window(self, layer: int) -> int | None:
        """The sliding window of layer ``layer`` (None: it attends to the whole context)."""
        if self.layer_types and self.layer_types[layer] == FULL:
            return None
        return self.sliding_window

    def layer_uses_local_rope(self, layer: int) -> bool:
        """Whether layer ``layer`` rotates by the local RoPE base (Gemma 3's sliding-window layers)."""
        return self.rope_local_theta is not None and self.layer_sliding_window(layer) is not None

    @property
    def rope_attention_factor(self) -> float:
        """What cos and sin are multiplied by (longrope's attention factor; 1 otherwise)."""
        return self.rope_scaling.attention_factor if self.rope_scaling is not None else 1.0

    @property
    def max_supported_model_len(self) -> int:
        """The longest context this implementation computes as the checkpoint defines it: longrope's long factors
        (past ``original_max_position_embeddings``) are not implemented."""
        s = self.rope_scaling
        if s is not None and s.rope_type == "longrope":
            return min(self.max_position_embeddings, s.original_max_position_embeddings)
        return self.max_position_embeddings

    @property
    def is_mla(self) -> bool:
        """Multi-head latent attention (DeepSeek): the cache holds one latent row per token and layer."""
        return self.kv_lora_rank > 0

    def layer_is_moe(self, layer: int) -> bool:
        """Whether layer ``layer``'s MLP is the MoE block (DeepSeek: not the first ``first_k_dense_replace``)."""
        return self.is_moe and layer >= self.first_k_dense_replace

    @property
    def kv_cache_arrays(self) -> int:
        """Cache arrays per layer: K and V, or MLA's one latent array."""
        return 1 if self.is_mla else 2

    @property
    def kv_cache_head_dim(self) -> int:
        """Width of one cached head: head_dim, or MLA's latent row (kv_lora_rank + qk_rope_head_dim)."""
        return self.kv_lora_rank + self.qk_rope_head_dim if self.is_mla else self.head_dim

    def kv_cache_bytes_per_token(self, itemsize: int) -> int:
        """Bytes of cache one token takes over all layers."""
        return self.kv_cache_arrays * self.num_layers * self.num_kv_heads * self.kv_cache_head_dim * itemsize

    @property
    def attention_scale(self) -> float:
        """What the attention scores are multiplied by: 1/sqrt(head_dim), or 1/sqrt(query_pre_attn_scalar)."""
        if self.is_mla:
            return mla_attention_scale(self)
        return (self.query_pre_attn_scalar or self.head_dim) ** -0.5

    @property
    def padded_vocab_size(self) -> int:
        """Rows of the embedding table and columns of the LM head (``vocab_size`` unless padded for TP)."""
        return self.vocab_size + self.vocab_padding

    @property
    def is_moe(self) -> bool:
        return self.num_experts > 0

    @property
    def q_size(self) -> int:
        return self.num_heads * self.head_dim

    @property
    def kv_size(self) -> int:
        return self.num_kv_heads * self.head_dim

    @property
    def expert_params(self) -> int:
        """Parameters of one routed expert in one layer (gate, up and down projections); 0 if dense."""
        if not self.is_moe:
            return 0
        biases = (2 * self.moe_intermediate_size + self.hidden_size) if self.expert_bias else 0
        return 3 * self.hidden_size * self.moe_intermediate_size + biases

    @property
    def num_params(self) -> int:
        """Parameter count (embedding counted once when tied; every expert of an MoE model)."""
        if self.architecture in DEEPSEEK_FAMILIES:
            return deepseek_num_params(self)
        h = self.hidden_size
        attn = h * self.q_size + 2 * h * self.kv_size + self.q_size * h
        if self.attention_bias:
            attn += self.q_size + 2 * self.kv_size
        attn += h * self.attention_out_bias + self.num_heads * self.attention_sinks
        if self.qk_norm:
            attn += 2 * self.head_dim
        if self.is_moe:
            mlp = (h + self.router_bias) * self.num_experts + self.num_experts * self.expert_params  # router + experts
            if self.shared_expert_intermediate_size:
                mlp += 3 * h * self.shared_expert_intermediate_size + h  # shared expert + its sigmoid gate
        else:
            mlp = 3 * h * self.intermediate_size
        per_layer = attn + mlp + (4 if self.sandwich_norms else 2) * h
        head = 0 if self.tie_word_embeddings else self.vocab_size * h
        return self.vocab_size * h + self.num_layers * per_layer + h + head

    @property
    def num_active_params(self) -> int:
        """Parameters one token uses: ``num_params`` less the experts it is not routed to (equal for dense)."""
        moe_layers = sum(self.layer_is_moe(i) for i in range(self.num_layers))
        unused = moe_layers * (self.num_experts - self.num_experts_per_tok) * self.expert_params
        return self.num_params - unused

    @classmethod
    def from_hf_dict(cls, d: dict[str, Any]) -> "ModelConfig":
        """Build from the dict of an HF ``config.json``; refuse what we cannot honour."""
        archs = d.get("architectures") or []
        arch_name = archs[0] if archs else None
        if arch_name is None:
            arch_name = {v: k for k, v in SUPPORTED_ARCHITECTURES.items()}.get(d.get("model_type", ""))
        if arch_name not in SUPPORTED_ARCHITECTURES:
            raise NotImplementedError(
                f"architecture {arch_name or d.get('model_type')!r} is not supported; "
                f"supported: {sorted(SUPPORTED_ARCHITECTURES)}"
            )
        family = SUPPORTED_ARCHITECTURES[arch_name]
        if family in GEMMA_FAMILIES:
            return cls._from_gemma_dict(d, family)
        if family in DEEPSEEK_FAMILIES:
            return cls(**from_deepseek_dict(d, family))
        num_heads = int(d["num_attention_heads"])
        hidden = int(d["hidden_size"])
        head_dim = d.get("head_dim") or hidden // num_heads
        rope_params = d.get("rope_parameters") or {}
        rope_theta = d.get("rope_theta", rope_params.get("rope_theta", 10000.0))
        scaling = d.get("rope_scaling") or (rope_params if rope_params.get("rope_type") else None)
        if scaling and "original_max_position_embeddings" in d:  # Phi-3 keeps it beside the scaling dict
            scaling = {"original_max_position_embeddings": d["original_max_position_embeddings"], **scaling}
        rope_scaling = parse_rope_scaling(scaling, d.get("max_position_embeddings"))
        if float(rope_params.get("partial_rotary_factor", d.get("partial_rotary_factor", 1.0))) != 1.0:
            raise NotImplementedError(f"{family}: partial rotary embeddings (partial_rotary_factor="
                                      f"{rope_params.get('partial_rotary_factor', d.get('partial_rotary_factor'))}, "
                                      "e.g. Phi-4-mini) are not supported")
        window = _parse_sliding_window(d, family)
        eos_ids = _eos_token_ids(d)
        if family == "qwen2_moe":
            attention_bias = bool(d.get("qkv_bias", True))
        elif family == "gpt_oss":
            attention_bias = bool(d.get("attention_bias", True))
        else:
            attention_bias = family == "qwen2" or bool(d.get("attention_bias", False))
        return cls(
            architecture=family,
            vocab_size=int(d["vocab_size"]),
            hidden_size=hidden,
            intermediate_size=int(d["intermediate_size"]),
            num_layers=int(d["num_hidden_layers"]),
            num_heads=num_heads,
            num_kv_heads=int(d.get("num_key_value_heads") or num_heads),
            head_dim=int(head_dim),
            rms_norm_eps=float(d.get("rms_norm_eps", 1e-6)),
            rope_theta=float(rope_theta),
            rope_scaling=rope_scaling,
            max_position_embeddings=int(d.get("max_position_embeddings", 2048)),
            tie_word_embeddings=bool(d.get("tie_word_embeddings", False)),
            attention_bias=attention_bias,
            qk_norm=family in ("qwen3", "qwen3_moe"),
            sliding_window=window,
            hidden_act=d.get("hidden_act", "silu"),
            bos_token_id=d.get("bos_token_id"),
            eos_token_ids=eos_ids,
            **_parse_moe(d, family),
            **(_parse_gpt_oss(d) if family == "gpt_oss" else {}),
        )

    @classmethod
    def _from_gemma_dict(cls, d: dict[str, Any], family: str) -> "ModelConfig":
        """Gemma 2 / Gemma 3 (text): tied embeddings, interleaved local and global layers."""
        num_layers = int(d["num_hidden_layers"])
        layer_types = d.get("layer_types")
        if layer_types is None:  # older configs: Gemma 2 alternates, Gemma 3 has 5 local per global
            pattern = 2 if family == "gemma2" else int(d.get("sliding_window_pattern", 6))
            layer_types = [SLIDING if (i + 1) % pattern else FULL for i in range(num_layers)]
        rope = d.get("rope_parameters") or {}
        local_theta = None
        if family == "gemma3_text":
            if FULL in rope or SLIDING in rope:
                local = rope.get(SLIDING) or {}
                if local.get("rope_type", "default") != "default":
                    raise NotImplementedError(f"gemma3: RoPE scaling on the local layers ({local}) is not supported")
                local_theta = float(local.get("rope_theta", d.get("rope_local_base_freq", 10000.0)))
                rope = rope.get(FULL) or {}
            else:
                local_theta = float(d.get("rope_local_base_freq", 10000.0))
        rope_theta = float(d.get("rope_theta", rope.get("rope_theta", 10000.0 if family == "gemma2" else 1e6)))
        scaling = d.get("rope_scaling") or (rope if rope.get("rope_type") else None)
        if d.get("use_bidirectional_attention"):
            raise NotImplementedError(f"{family} with use_bidirectional_attention=True (an encoder) is not supported")
        num_heads, hidden = int(d["num_attention_heads"]), int(d["hidden_size"])
        window = d.get("sliding_window")
        softcap = lambda key: None if d.get(key) is None else float(d[key])
        return cls(
            architecture=family, vocab_size=int(d["vocab_size"]), hidden_size=hidden,
            intermediate_size=int(d["intermediate_size"]), num_layers=num_layers, num_heads=num_heads,
            num_kv_heads=int(d.get("num_key_value_heads") or num_heads),
            head_dim=int(d.get("head_dim") or hidden // num_heads), rms_norm_eps=float(d.get("rms_norm_eps", 1e-6)),
            rope_theta=rope_theta, rope_scaling=parse_rope_scaling(scaling),
            max_position_embeddings=int(d.get("max_position_embeddings", 8192)),
            tie_word_embeddings=bool(d.get("tie_word_embeddings", True)),
            attention_bias=bool(d.get("attention_bias", False)), qk_norm=family == "gemma3_text",
            sliding_window=None if window is None else int(window),
            layer_types=tuple(layer_types) if window is not None else (),
            hidden_act=d.get("hidden_activation") or d.get("hidden_act") or "gelu_pytorch_tanh",
            bos_token_id=d.get("bos_token_id"),
            eos_token_ids=_eos_token_ids(d),
            norm_offset=1.0, embed_multiplier=hidden**0.5, sandwich_norms=True,
            query_pre_attn_scalar=float(d.get("query_pre_attn_scalar", 256)),
            attn_logit_softcapping=softcap("attn_logit_softcapping"),
            final_logit_softcapping=softcap("final_logit_softcapping"), rope_local_theta=local_theta,
        )

    @classmethod
    def from_pretrained(cls, model_dir: str | Path) -> "ModelConfig":
        path = Path(model_dir) / "config.json"
        if not path.is_file():
            raise FileNotFoundError(f"{path} not found: a model directory needs an HF config.json")
        return cls.from_hf_dict(json.loads(path.read_text()))

    def to_hf_dict(self) -> dict[str, Any]:
        """The inverse of ``from_hf_dict`` (enough for HF transformers to rebuild the model)."""
        arch = {v: k for k, v in SUPPORTED_ARCHITECTURES.items()}[self.architecture]
        d: dict[str, Any] = {
            "architectures": [arch],
            "model_type": self.architecture,
            "vocab_size": self.vocab_size,
            "hidden_size": self.hidden_size,
            "intermediate_size": self.intermediate_size,
            "num_hidden_layers": self.num_layers,
            "num_attention_heads": self.num_heads,
            "num_key_value_heads": self.num_kv_heads,
            "head_dim": self.head_dim,
            "rms_norm_eps": self.rms_norm_eps,
            "rope_theta": self.rope_theta,
            "max_position_embeddings": self.max_position_embeddings,
            "tie_word_embeddings": self.tie_word_embeddings,
            "hidden_act": self.hidden_act,
            "bos_token_id": self.bos_token_id,
            "eos_token_id": list(self.eos_token_ids) if len(self.eos_token_ids) != 1 else self.eos_token_ids[0],
        }
        if self.architecture in DEEPSEEK_FAMILIES:
            return deepseek_to_hf(self, d)
        if self.architecture in ("llama", "qwen3_moe"):
            d["attention_bias"] = self.attention_bias
        if self.architecture in ("mixtral", "gpt_oss"):
            d["num_local_experts"] = self.num_experts
            d["num_experts_per_tok"] = self.num_experts_per_tok
            d["intermediate_size"] = self.moe_intermediate_size
        elif self.is_moe:
            d.update(num_experts=self.num_experts, num_experts_per_tok=self.num_experts_per_tok,
                     moe_intermediate_size=self.moe_intermediate_size, norm_topk_prob=self.norm_topk_prob,
                     decoder_sparse_step=1, mlp_only_layers=[])
            if self.architecture == "qwen2_moe":
                d["shared_expert_intermediate_size"] = self.shared_expert_intermediate_size
                d["qkv_bias"] = self.attention_bias
        if self.architecture in GEMMA_FAMILIES:
            d.pop("hidden_act")
            d.update(hidden_activation=self.hidden_act, query_pre_attn_scalar=self.query_pre_attn_scalar,
                     attn_logit_softcapping=self.attn_logit_softcapping,
                     final_logit_softcapping=self.final_logit_softcapping, attention_bias=self.attention_bias,
                     sliding_window=self.sliding_window, layer_types=list(self.layer_types) or None)
            if self.architecture == "gemma3_text":
                full = {"rope_type": "default", "rope_theta": self.rope_theta}
                if self.rope_scaling is not None:
                    full.update(self.rope_scaling.to_hf())
                d.pop("rope_theta")
                d["rope_parameters"] = {FULL: full, SLIDING: {"rope_type": "default",
                                                              "rope_theta": self.rope_local_theta}}
                return d
        if self.architecture == "gpt_oss":
            d.update(attention_bias=self.attention_bias, swiglu_limit=self.swiglu_limit, swiglu_alpha=self.swiglu_alpha,
                     sliding_window=self.sliding_window, layer_types=list(self.layer_types) or None)
            d["rope_parameters"] = {"rope_type": "default", "rope_theta": d.pop("rope_theta")}
            if self.rope_scaling is not None:
                d["rope_parameters"].update(self.rope_scaling.to_hf())
            return d
        if self.rope_scaling is not None:
            d["rope_scaling"] = self.rope_scaling.to_hf()
        if self.sliding_window is not None and self.architecture not in GEMMA_FAMILIES:
            d["sliding_window"] = self.sliding_window
            d["use_sliding_window"] = True
            d["max_window_layers"] = 0
        return d


def _eos_token_ids(d: dict[str, Any]) -> tuple[int, ...]:
    """``eos_token_id`` of a config dict (one id, a list, or absent) as a tuple."""
    eos = d.get("eos_token_id")
    return tuple(eos) if isinstance(eos, list) else (() if eos is None else (int(eos),))


def _parse_moe(d: dict[str, Any], family: str) -> dict[str, Any]:
    """The MoE fields of a config dict (hub and transformers-5 spellings); refuses layouts we cannot run."""
    if family not in MOE_FAMILIES:
        return {}
    # Mixtral and Qwen3-MoE checkpoints written by transformers 5 say num_local_experts; the hub's say num_experts.
    num_experts = d.get("num_local_experts", d.get("num_experts"))
    if num_experts is None:
        raise ValueError(f"a {family} config needs num_experts (or num_local_experts)")
    if family == "gpt_oss":  # every expert is intermediate_size wide; softmax over the top-k logits
        return dict(num_experts=int(num_experts), num_experts_per_tok=int(d.get("num_experts_per_tok", 4)),
                    moe_intermediate_size=int(d["intermediate_size"]))
    if family == "mixtral":  # every expert is intermediate_size wide; top-k weights always renormalised
        return dict(num_experts=int(num_experts), num_experts_per_tok=int(d.get("num_experts_per_tok", 2)),
                    moe_intermediate_size=int(d["intermediate_size"]), norm_topk_prob=True)
    if int(d.get("decoder_sparse_step", 1)) != 1 or d.get("mlp_only_layers"):
        raise NotImplementedError(
            f"{family}: dense MLP layers between MoE layers (decoder_sparse_step="
            f"{d.get('decoder_sparse_step', 1)}, mlp_only_layers={d.get('mlp_only_layers')}) are not supported; "
            "only checkpoints whose every layer is an MoE block"
        )
    shared = int(d.get("shared_expert_intermediate_size") or 0) if family == "qwen2_moe" else 0
    if family == "qwen2_moe" and shared == 0:
        raise NotImplementedError("qwen2_moe without a shared expert (shared_expert_intermediate_size=0)")
    return dict(num_experts=int(num_experts), num_experts_per_tok=int(d["num_experts_per_tok"]),
                moe_intermediate_size=int(d["moe_intermediate_size"]),
                norm_topk_prob=bool(d.get("norm_topk_prob", False)), shared_expert_intermediate_size=shared)


def _parse_gpt_oss(d: dict[str, Any]) -> dict[str, Any]:
    """GPT-OSS's fields beyond the common ones (its MoE sizes are ``_parse_moe``'s)."""
    qcfg = d.get("quantization_config") or {}
    if qcfg.get("quant_method") == "mxfp4":
        raise NotImplementedError(
            "gpt_oss: MXFP4 checkpoints (quantization_config.quant_method='mxfp4', e.g. openai/gpt-oss-20b as "
            "published) are not loaded; dequantize to bf16 first: transformers' AutoModelForCausalLM.from_pretrained("
            "path, quantization_config=Mxfp4Config(dequantize=True)).save_pretrained(out) (or use a bf16 checkpoint)")
    num_layers, window = int(d["num_hidden_layers"]), d.get("sliding_window")
    layer_types = d.get("layer_types") or [SLIDING if (i + 1) % 2 else FULL for i in range(num_layers)]
    return dict(attention_sinks=True, attention_out_bias=bool(d.get("attention_bias", True)), router_bias=True,
                router_topk_softmax=True, expert_bias=True, swiglu_limit=float(d.get("swiglu_limit", 7.0)),
                swiglu_alpha=float(d.get("swiglu_alpha", 1.702)),
                layer_types=tuple(layer_types) if window is not None else ())


def _parse_sliding_window(d: dict[str, Any], family: str) -> int | None:
    window = d.get("sliding_window")
    if family in ("qwen2_moe", "qwen3_moe"):
        if d.get("use_sliding_window", False):
            raise NotImplementedError(f"{family} with use_sliding_window=True is not supported")
        return None
    if window is None:
        return None
    if family in ("qwen2", "qwen3"):
        # HF Qwen: only layers i >= max_window_layers slide (and only with use_sliding_window).
        if not d.get("use_sliding_window", False):
            return None
        first_sliding = int(d.get("max_window_layers", 28))
        if first_sliding >= int(d["num_hidden_layers"]):
            return None
        if first_sliding > 0:
            raise NotImplementedError(
                f"sliding window on only layers >= max_window_layers={first_sliding} is not supported "
                "(only all layers or none)"
            )
    return int(window)
