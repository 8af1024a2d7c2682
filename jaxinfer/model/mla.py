"""Multi-head latent attention (DeepSeek-V2 / V3) over the compressed paged cache, with absorbed weights.

What a token caches, per layer, is ONE row of ``kv_lora_rank + qk_rope_head_dim`` numbers: the RMS-normed
latent ``c_kv`` (``kv_a_proj_with_mqa``'s first ``kv_lora_rank`` outputs through ``kv_a_layernorm``) followed by
the rotated decoupled key ``k_pe`` shared by all heads. The layer's cache is a 1-tuple ``(latent,)`` of shape
``[num_blocks, block_size, 1, kv_lora_rank + qk_rope_head_dim]`` (``jaxinfer.model.kv_cache``), where a plain
model caches K and V of ``2 * num_kv_heads * head_dim`` per token.

HF expands the latent into per-head keys and values (``kv_b_proj``) before attending. Here the up-projections
are absorbed instead, in every step (prefill, chunked prefill, decode alike), so the full K/V never exist:
with ``W_UK[h]`` [R, dn] and ``W_UV[h]`` [R, dv] the slices of ``kv_b_proj`` for head h,

    score(h, t, s) = q_nope[t, h] . (c_kv[s] @ W_UK[h]) + q_pe[t, h] . k_pe[s]
                   = [q_nope[t, h] @ W_UK[h]^T, q_pe[t, h]] . [c_kv[s], k_pe[s]]
    out(h, t)      = sum_s p(h, t, s) c_kv[s] @ W_UV[h]

so the attention is multi-query attention with one KV head over *latent rows*: the keys are the cached rows,
the values their first ``kv_lora_rank`` lanes. Every backend takes that as ``v_cache=None, value_dim=R``: the
Pallas kernel reads each row once for both dots and splits ``q . k`` into 512 + 64 lanes (no padding of 576 to
1024); the XLA loops and the C++ CPU kernels weight the whole row and drop the rope lanes after. The output,
``sum_s p c_kv[s]`` per head, is what ``W_UV`` takes to the head's value. The softmax scale is HF's
(``(dn + dr) ** -0.5``, YaRN's ``mscale_all_dim`` squared on top: ``ModelConfig.attention_scale``).

RoPE: DeepSeek rotates (even, odd) pairs (V2 always, V3 with ``rope_interleave``). Gathering the evens then the
odds turns that into the half-split rotation the decoder's ``apply_rope`` computes, on q_pe and k_pe alike, which
leaves every q_pe . k_pe as HF has it (V3's interleaved output is exactly this order; V2's differs from it by
the same permutation of q's and k's dimensions).

Under tensor parallelism the query heads (``wq`` / ``wq_b``, ``wkv_b``, ``wo``) are split and the latent
projection and the cache are replicated: each device attends its own heads over the whole latent cache.
"""

from __future__ import annotations

import jax.numpy as jnp

from jaxinfer.config.model import ModelConfig
from jaxinfer.model.kv_cache import write_kv
from jaxinfer.model.linear import linear
from jaxinfer.model.step_batch import StepBatch


def deinterleave(x):
    """[..., d] with (even, odd) rotary pairs -> [..., d] evens first, then odds."""
    return jnp.concatenate([x[..., 0::2], x[..., 1::2]], axis=-1)


def mla_queries_and_latent(lp, x, cos, sin, cfg: ModelConfig, rms_norm, apply_rope):
    """(q_nope [T, Hq, dn], q_pe [T, Hq, dr] rotated, latent row [T, 1, R + dr]) of the normed input x [T, H]."""
    num_tokens, dn, dr, r = x.shape[0], cfg.qk_nope_head_dim, cfg.qk_rope_head_dim, cfg.kv_lora_rank
    if "wq" in lp:
        q = linear(x, lp["wq"])
    else:
        q = linear(rms_norm(linear(x, lp["wq_a"]), lp["q_a_norm"], cfg.rms_norm_eps), lp["wq_b"])
    q = q.reshape(num_tokens, cfg.num_heads, dn + dr)
    q_nope, q_pe = q[..., :dn], q[..., dn:]
    kv = linear(x, lp["wkv_a"])
    c_kv = rms_norm(kv[:, :r], lp["kv_a_norm"], cfg.rms_norm_eps)
    k_pe = kv[:, None, r:]
    if cfg.rope_interleave:
        q_pe, k_pe = deinterleave(q_pe), deinterleave(k_pe)
    q_pe, k_pe = apply_rope(q_pe, cos, sin), apply_rope(k_pe, cos, sin)
    return q_nope, q_pe, jnp.concatenate([c_kv[:, None, :], k_pe.astype(c_kv.dtype)], axis=-1)


def mla_attention_block(lp, x, cos, sin, layer_cache, batch: StepBatch, cfg: ModelConfig, attn_fn, rms_norm,
                        apply_rope):
    """One MLA layer's attention: (output [T, H], new layer cache ``(latent,)``). ``rms_norm`` and ``apply_rope``
    are the decoder's (``jaxinfer.model.decoder``, which imports this module, hands them in)."""
    num_tokens, dn, r = x.shape[0], cfg.qk_nope_head_dim, cfg.kv_lora_rank
    q_nope, q_pe, latent = mla_queries_and_latent(lp, x, cos, sin, cfg, rms_norm, apply_rope)
    cache = write_kv(layer_cache[0], latent, batch.slot_mapping)
    w_kv_b = lp["wkv_b"].reshape(r, cfg.num_heads, dn + cfg.v_head_dim)
    q_latent = jnp.einsum("thn,rhn->thr", q_nope, w_kv_b[..., :dn])  # W_UK absorbed into the query
    q_abs = jnp.concatenate([q_latent, q_pe.astype(q_latent.dtype)], axis=-1)
    out = attn_fn(q_abs, cache, None, batch.block_tables, batch.cu_q_lens, batch.kv_lens,
                  sm_scale=cfg.attention_scale, value_dim=r)  # the values: the rows' latent part
    values = jnp.einsum("thr,rhv->thv", out.astype(q_latent.dtype), w_kv_b[..., dn:])  # W_UV absorbed
    return linear(values.reshape(num_tokens, cfg.num_heads * cfg.v_head_dim), lp["wo"]), (cache,)
