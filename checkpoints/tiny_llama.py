"""A tiny Llama decoder for training the embedded checkpoints, written to match HF LlamaForCausalLM.

This is training-script code, deliberately independent of the engine's model in ``jaxinfer``: it is the
model that produced the weights, so the engine can later be checked against HF on them. Parameters are a
flat dict keyed by the exact Hugging Face tensor names with HF's ``[out_features, in_features]`` layout,
so saving them is a plain ``safetensors`` write and loading them in transformers needs no renaming.

Numerics follow ``transformers.models.llama``: RMSNorm in float32 (``w * x * rsqrt(mean(x^2) + eps)``),
rotate-half RoPE with ``inv_freq = theta ** (-arange(0, d, 2) / d)``, grouped-query attention where query
head ``h`` reads kv head ``h // (num_heads // num_kv_heads)``, and ``down(silu(gate(x)) * up(x))``.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp


@dataclasses.dataclass(frozen=True)
class TinyLlamaConfig:
    """Shapes of one tiny Llama; field names follow HF's LlamaConfig where one exists."""

    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    max_position_embeddings: int = 1024
    rms_norm_eps: float = 1e-5
    rope_theta: float = 10000.0
    initializer_range: float = 0.02
    tie_word_embeddings: bool = True

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_attention_heads

    def hf_config(self, bos_token_id: int, eos_token_id: int) -> dict:
        """The ``config.json`` content transformers needs to rebuild this model as LlamaForCausalLM."""
        return {
            "architectures": ["LlamaForCausalLM"],
            "model_type": "llama",
            "vocab_size": self.vocab_size,
            "hidden_size": self.hidden_size,
            "intermediate_size": self.intermediate_size,
            "num_hidden_layers": self.num_hidden_layers,
            "num_attention_heads": self.num_attention_heads,
            "num_key_value_heads": self.num_key_value_heads,
            "head_dim": self.head_dim,
            "max_position_embeddings": self.max_position_embeddings,
            "rms_norm_eps": self.rms_norm_eps,
            "rope_theta": self.rope_theta,
            "rope_scaling": None,
            "hidden_act": "silu",
            "attention_bias": False,
            "attention_dropout": 0.0,
            "mlp_bias": False,
            "initializer_range": self.initializer_range,
            "tie_word_embeddings": self.tie_word_embeddings,
            "bos_token_id": bos_token_id,
            "eos_token_id": eos_token_id,
            "pad_token_id": eos_token_id,
            "torch_dtype": "float32",
            "use_cache": True,
        }


def param_shapes(cfg: TinyLlamaConfig) -> dict[str, tuple[int, ...]]:
    """Every weight by its HF name and HF shape (Linear weights are ``[out, in]``)."""
    d, f, hd = cfg.hidden_size, cfg.intermediate_size, cfg.head_dim
    q_out, kv_out = cfg.num_attention_heads * hd, cfg.num_key_value_heads * hd
    shapes = {"model.embed_tokens.weight": (cfg.vocab_size, d)}
    for i in range(cfg.num_hidden_layers):
        p = f"model.layers.{i}."
        shapes[p + "input_layernorm.weight"] = (d,)
        shapes[p + "self_attn.q_proj.weight"] = (q_out, d)
        shapes[p + "self_attn.k_proj.weight"] = (kv_out, d)
        shapes[p + "self_attn.v_proj.weight"] = (kv_out, d)
        shapes[p + "self_attn.o_proj.weight"] = (d, q_out)
        shapes[p + "post_attention_layernorm.weight"] = (d,)
        shapes[p + "mlp.gate_proj.weight"] = (f, d)
        shapes[p + "mlp.up_proj.weight"] = (f, d)
        shapes[p + "mlp.down_proj.weight"] = (d, f)
    shapes["model.norm.weight"] = (d,)
    if not cfg.tie_word_embeddings:
        shapes["lm_head.weight"] = (cfg.vocab_size, d)
    return shapes


def init_params(cfg: TinyLlamaConfig, key: jax.Array) -> dict[str, jax.Array]:
    """HF's initialisation: norms at one, every matrix normal(0, initializer_range)."""
    shapes = param_shapes(cfg)
    keys = jax.random.split(key, len(shapes))
    params = {}
    for k, (name, shape) in zip(keys, sorted(shapes.items())):
        if len(shape) == 1:
            params[name] = jnp.ones(shape, jnp.float32)
        else:
            params[name] = cfg.initializer_range * jax.random.normal(k, shape, jnp.float32)
    return params


def rms_norm(x_BTD: jax.Array, weight_D: jax.Array, eps: float) -> jax.Array:
    x32 = x_BTD.astype(jnp.float32)
    x32 = x32 * jax.lax.rsqrt(jnp.mean(x32 * x32, axis=-1, keepdims=True) + eps)
    return weight_D * x32.astype(x_BTD.dtype)


def rope_cos_sin(num_positions: int, head_dim: int, theta: float) -> tuple[jax.Array, jax.Array]:
    """``cos, sin`` of shape ``[T, head_dim]``, the half-dim frequencies repeated twice as HF does."""
    inv_freq = 1.0 / (theta ** (jnp.arange(0, head_dim, 2, dtype=jnp.float32) / head_dim))
    angles_TH = jnp.arange(num_positions, dtype=jnp.float32)[:, None] * inv_freq[None, :]
    angles_TD = jnp.concatenate([angles_TH, angles_TH], axis=-1)
    return jnp.cos(angles_TD), jnp.sin(angles_TD)


def apply_rope(x_BTND: jax.Array, cos_TD: jax.Array, sin_TD: jax.Array) -> jax.Array:
    half = x_BTND.shape[-1] // 2
    rotated = jnp.concatenate([-x_BTND[..., half:], x_BTND[..., :half]], axis=-1)
    return x_BTND * cos_TD[None, :, None, :] + rotated * sin_TD[None, :, None, :]


def _linear(x: jax.Array, weight_OI: jax.Array) -> jax.Array:
    """``x @ W.T`` as one 2-D matmul (XLA:CPU runs that faster than a batched einsum)."""
    out = x.reshape(-1, x.shape[-1]) @ weight_OI.T
    return out.reshape(*x.shape[:-1], weight_OI.shape[0])


def _attention(params: dict, prefix: str, cfg: TinyLlamaConfig, h_BTD, cos_TD, sin_TD):
    """Causal GQA self-attention; returns the output and the probabilities ``[B, heads, T, T]``."""
    b, t, _ = h_BTD.shape
    n_kv, hd = cfg.num_key_value_heads, cfg.head_dim
    group = cfg.num_attention_heads // n_kv
    q_BTND = _linear(h_BTD, params[prefix + "q_proj.weight"]).reshape(b, t, cfg.num_attention_heads, hd)
    k_BTKD = _linear(h_BTD, params[prefix + "k_proj.weight"]).reshape(b, t, n_kv, hd)
    v_BTKD = _linear(h_BTD, params[prefix + "v_proj.weight"]).reshape(b, t, n_kv, hd)
    q_BTND = apply_rope(q_BTND, cos_TD, sin_TD)
    k_BTKD = apply_rope(k_BTKD, cos_TD, sin_TD)
    # Lay queries out as [B, kv_head, group * T, D] (query head h = kv * group + g) so each kv head's
    # queries form one batched matmul against its keys.
    q_BKQD = q_BTND.reshape(b, t, n_kv, group, hd).transpose(0, 2, 3, 1, 4).reshape(b, n_kv, group * t, hd)
    k_BKSD = k_BTKD.transpose(0, 2, 1, 3)
    v_BKSD = v_BTKD.transpose(0, 2, 1, 3)
    scores_BKQS = jnp.einsum("bkqd,bksd->bkqs", q_BKQD, k_BKSD) * (hd**-0.5)
    query_pos_Q = jnp.tile(jnp.arange(t), group)
    causal_QS = query_pos_Q[:, None] >= jnp.arange(t)[None, :]
    scores_BKQS = jnp.where(causal_QS, scores_BKQS, jnp.finfo(scores_BKQS.dtype).min)
    probs_BKQS = jax.nn.softmax(scores_BKQS.astype(jnp.float32), axis=-1).astype(h_BTD.dtype)
    out_BKQD = jnp.einsum("bkqs,bksd->bkqd", probs_BKQS, v_BKSD)
    out_BTND = out_BKQD.reshape(b, n_kv, group, t, hd).transpose(0, 3, 1, 2, 4)
    out_BTD = _linear(out_BTND.reshape(b, t, cfg.num_attention_heads * hd), params[prefix + "o_proj.weight"])
    return out_BTD, probs_BKQS.reshape(b, cfg.num_attention_heads, t, t)


def _mlp(params: dict, prefix: str, h_BTD: jax.Array) -> jax.Array:
    gate = jax.nn.silu(_linear(h_BTD, params[prefix + "gate_proj.weight"]))
    up = _linear(h_BTD, params[prefix + "up_proj.weight"])
    return _linear(gate * up, params[prefix + "down_proj.weight"])


def forward_with_attention(
    params: dict, cfg: TinyLlamaConfig, tokens_BT: jax.Array, heads: tuple[tuple[int, int], ...]
) -> tuple[jax.Array, list[jax.Array]]:
    """Logits ``[B, T, vocab]`` and the attention probabilities ``[B, T, T]`` of each ``(layer, head)``."""
    x_BTD = params["model.embed_tokens.weight"][tokens_BT]
    cos_TD, sin_TD = rope_cos_sin(tokens_BT.shape[1], cfg.head_dim, cfg.rope_theta)
    probs_by_layer = {}
    for i in range(cfg.num_hidden_layers):
        p = f"model.layers.{i}."
        h_BTD = rms_norm(x_BTD, params[p + "input_layernorm.weight"], cfg.rms_norm_eps)
        attn_BTD, probs_BHTS = _attention(params, p + "self_attn.", cfg, h_BTD, cos_TD, sin_TD)
        probs_by_layer[i] = probs_BHTS
        x_BTD = x_BTD + attn_BTD
        h_BTD = rms_norm(x_BTD, params[p + "post_attention_layernorm.weight"], cfg.rms_norm_eps)
        x_BTD = x_BTD + _mlp(params, p + "mlp.", h_BTD)
    x_BTD = rms_norm(x_BTD, params["model.norm.weight"], cfg.rms_norm_eps)
    head = params["model.embed_tokens.weight" if cfg.tie_word_embeddings else "lm_head.weight"]
    return _linear(x_BTD, head), [probs_by_layer[layer][:, h] for layer, h in heads]


def forward(params: dict, cfg: TinyLlamaConfig, tokens_BT: jax.Array) -> jax.Array:
    """Logits ``[B, T, vocab]`` for token ids ``[B, T]`` at positions ``0..T-1`` (no cache)."""
    return forward_with_attention(params, cfg, tokens_BT, heads=())[0]
