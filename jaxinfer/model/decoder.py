"""The decoder as pure functions over a params pytree (Llama, Mistral, Qwen2, Qwen3, Gemma 2, Gemma 3, Phi-3;
MoE: Mixtral, Qwen2-MoE, Qwen3-MoE, GPT-OSS; DeepSeek-V2 / V3, whose latent attention is ``jaxinfer.model.mla``).

``forward(params, kv_cache, batch, cfg, attn_fn, moe_fn=...)`` runs one ragged step: it embeds the flat
tokens, and per layer writes the new keys and values into the paged cache and attends over it, then returns
the logits of the tokens named by ``batch.logits_indices`` together with the updated cache. The layer loop
is unrolled in Python over a list of per-layer param dicts, so every weight and cache buffer is used in
place. The params layout is declared in ``jaxinfer.model.weights`` (on one GPU the query, key and value
weights are one, ``jaxinfer.model.fused_qkv``); every projection goes through
``jaxinfer.model.linear.linear``; an MoE layer's MLP is ``moe_fn`` (``jaxinfer.model.moe.moe_block`` by default).

The model knows nothing of devices: run under ``jit`` with sharded params and cache, and with ``attn_fn`` /
``moe_fn`` wrapped by ``jaxinfer.model.sharding_plan`` (``shard_map`` over the local heads / experts), it is the
tensor- and expert-parallel model. Each layer runs in a ``jax.named_scope`` ("layer3"), so compiled
collectives can be attributed to layers.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from jaxinfer.config.model import ModelConfig, rope_inv_freq
from jaxinfer.model.attention import soft_cap_scores
from jaxinfer.model.fused_qkv import qkv_projection
from jaxinfer.model.kv_cache import KVCache, write_kv
from jaxinfer.model.linear import linear
from jaxinfer.model.mla import mla_attention_block
from jaxinfer.model.moe import moe_block
from jaxinfer.model.step_batch import StepBatch


def rms_norm(x, weight, eps, offset: float = 0.0):
    """RMSNorm scaled by ``weight`` (Llama: ``weight * normed.astype(dtype)``), or by ``offset + weight`` in
    float32 before the cast (Gemma's ``1 + weight``)."""
    x32 = x.astype(jnp.float32)
    x32 = x32 * jax.lax.rsqrt(jnp.mean(x32 * x32, axis=-1, keepdims=True) + eps)
    if offset:
        return (x32 * (offset + weight.astype(jnp.float32))).astype(x.dtype)
    return weight * x32.astype(x.dtype)


def activation(name: str):
    """The MLP's gate activation: SiLU, or GELU with the tanh approximation (Gemma's gelu_pytorch_tanh)."""
    if name in ("silu", "swish"):
        return jax.nn.silu
    return lambda x: jax.nn.gelu(x, approximate=True)


def rope_cos_sin(cfg: ModelConfig, positions, local: bool = False):
    """cos, sin of shape [T, D] for HF's half-split rotary layout (``local``: Gemma 3's local-layer base)."""
    inv_freq = jnp.asarray(np.asarray(rope_inv_freq(cfg, local), dtype=np.float32))
    freqs = positions.astype(jnp.float32)[:, None] * inv_freq[None, :]
    emb = jnp.concatenate([freqs, freqs], axis=-1)
    scale = 1.0 if local else cfg.rope_attention_factor  # longrope's attention factor
    if scale != 1.0:
        return jnp.cos(emb) * scale, jnp.sin(emb) * scale
    return jnp.cos(emb), jnp.sin(emb)


def apply_rope(x_TNH, cos, sin):
    half = x_TNH.shape[-1] // 2
    x32 = x_TNH.astype(jnp.float32)
    rotated = jnp.concatenate([-x32[..., half:], x32[..., :half]], axis=-1)
    return (x32 * cos[:, None, :] + rotated * sin[:, None, :]).astype(x_TNH.dtype)


def attention_block(lp, x, cos, sin, layer_cache, batch: StepBatch, cfg: ModelConfig, attn_fn, layer: int = 0):
    num_tokens = x.shape[0]
    q, k, v = qkv_projection(lp, x, cfg.q_size, cfg.kv_size, linear)
    if cfg.attention_bias:
        q, k, v = q + lp["bq"], k + lp["bk"], v + lp["bv"]
    q = q.reshape(num_tokens, cfg.num_heads, cfg.head_dim)
    k = k.reshape(num_tokens, cfg.num_kv_heads, cfg.head_dim)
    v = v.reshape(num_tokens, cfg.num_kv_heads, cfg.head_dim)
    if cfg.qk_norm:
        q = rms_norm(q, lp["q_norm"], cfg.rms_norm_eps, cfg.norm_offset)
        k = rms_norm(k, lp["k_norm"], cfg.rms_norm_eps, cfg.norm_offset)
    q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
    k_cache = write_kv(layer_cache[0], k, batch.slot_mapping)
    v_cache = write_kv(layer_cache[1], v, batch.slot_mapping)
    extra = {}  # only what differs from the model-wide attention the backend was built for
    if cfg.layer_types:
        extra["sliding_window"] = cfg.layer_sliding_window(layer)
    if cfg.attn_logit_softcapping is not None:
        extra["soft_cap"] = cfg.attn_logit_softcapping
    if cfg.attention_sinks:
        extra["sinks"] = lp["sinks"]
    out = attn_fn(q, k_cache, v_cache, batch.block_tables, batch.cu_q_lens, batch.kv_lens, sm_scale=cfg.attention_scale,
                  **extra)
    out = linear(out.reshape(num_tokens, cfg.q_size), lp["wo"])
    if cfg.attention_out_bias:
        out = out + lp["bo"]
    return out, (k_cache, v_cache)


def mlp_block(lp, x, act=jax.nn.silu):
    return linear(act(linear(x, lp["w_gate"])) * linear(x, lp["w_up"]), lp["w_down"])


def forward(params, kv_cache: KVCache, batch: StepBatch, cfg: ModelConfig, attn_fn, moe_fn=moe_block,
            gather_logits=None):
    """One ragged step. Returns (logits [L, V] float32, new kv_cache).

    ``moe_fn(lp, x, valid, cfg) -> [T, H]`` computes an MoE layer's MLP (``valid``: the real, non-padding
    tokens); unused by dense models. ``gather_logits(logits) -> logits``: where the vocabulary is padded
    (``cfg.vocab_padding``), applied before the padding's columns are dropped (the sharded model's
    ``ShardingPlan.gather_logits``: gather the vocab-parallel logits first, then slice locally)."""
    with jax.named_scope("embed"):
        x = params["embed"][batch.token_ids]
        if cfg.embed_multiplier != 1.0:  # Gemma: sqrt(hidden), rounded to the embedding's dtype as HF does
            x = x * jnp.asarray(cfg.embed_multiplier, x.dtype)
    rope = {False: rope_cos_sin(cfg, batch.positions)}
    if cfg.rope_local_theta is not None:
        rope[True] = rope_cos_sin(cfg, batch.positions, local=True)
    valid = jnp.arange(x.shape[0]) < batch.cu_q_lens[-1]
    eps, offset, act = cfg.rms_norm_eps, cfg.norm_offset, activation(cfg.hidden_act)
    new_cache = []
    for i, (lp, layer_cache) in enumerate(zip(params["layers"], kv_cache)):
        with jax.named_scope(f"layer{i}"):
            cos, sin = rope[cfg.layer_uses_local_rope(i)]
            h = rms_norm(x, lp["attn_norm"], eps, offset)
            if cfg.is_mla:  # DeepSeek's latent attention over the compressed cache (jaxinfer.model.mla)
                attn_out, layer_cache = mla_attention_block(lp, h, cos, sin, layer_cache, batch, cfg, attn_fn,
                                                            rms_norm, apply_rope)
            else:
                attn_out, layer_cache = attention_block(lp, h, cos, sin, layer_cache, batch, cfg, attn_fn, i)
            if cfg.sandwich_norms:
                attn_out = rms_norm(attn_out, lp["post_attn_norm"], eps, offset)
            x = x + attn_out
            h = rms_norm(x, lp["mlp_norm"], eps, offset)
            mlp_out = moe_fn(lp, h, valid, cfg) if cfg.layer_is_moe(i) else mlp_block(lp, h, act)
            if cfg.sandwich_norms:
                mlp_out = rms_norm(mlp_out, lp["post_mlp_norm"], eps, offset)
            x = x + mlp_out
        new_cache.append(layer_cache)
    with jax.named_scope("lm_head"):
        x = rms_norm(x[batch.logits_indices], params["final_norm"], eps, offset)
        if "lm_head" in params:
            logits = linear(x, params["lm_head"], out_dtype=jnp.float32)
        else:  # tied: the embedding table transposed
            logits = jnp.dot(x, params["embed"].T, preferred_element_type=jnp.float32)
        logits = soft_cap_scores(logits, cfg.final_logit_softcapping)
        if cfg.vocab_padding:  # the rows a vocabulary-parallel split padded on: never sampled, never seen
            if gather_logits is not None:
                logits = gather_logits(logits)
            logits = logits[:, :cfg.vocab_size]
    return logits, new_cache
