"""DeepSeek-V2 / V3 configs: multi-head latent attention (MLA) and the DeepSeek mixture of experts.

``from_deepseek_dict(d, family)`` returns the ``ModelConfig`` keyword arguments of an HF ``DeepseekV2Config`` /
``DeepseekV3Config`` dict (``ModelConfig.from_hf_dict`` calls it); the rest are what the config needs that is
DeepSeek's alone: the softmax scale, the parameter count and the way back to an HF dict.

How the fields map (HF name -> ours):

* attention: ``kv_lora_rank``, ``q_lora_rank`` (None: one ``q_proj``), ``qk_nope_head_dim``,
  ``qk_rope_head_dim``, ``v_head_dim``; ``head_dim`` is the RoPE width (as HF sets it), ``num_kv_heads`` 1:
  every query head reads the one latent row a token caches, ``kv_lora_rank + qk_rope_head_dim`` wide.
  ``rope_interleave`` (V3's flag; V2 always): the rotary dimensions come in (even, odd) pairs.
* MoE: ``n_routed_experts`` -> ``num_experts``, ``n_shared_experts`` -> ``num_shared_experts`` (one ungated MLP
  of ``n_shared_experts * moe_intermediate_size``), ``first_k_dense_replace`` (that many dense layers first),
  ``topk_method``: V2's "greedy" / "group_limited_greedy" (softmax scores, groups ranked by their best expert),
  V3's "noaux_tc" (sigmoid scores, ``e_score_correction_bias`` added for the choice only, groups ranked by their
  two best), ``n_group`` / ``topk_group``, ``routed_scaling_factor``; ``norm_topk_prob`` is V3's only (HF's V2
  router never renormalises).
"""

from __future__ import annotations

from typing import Any

from jaxinfer.config.rope import parse_rope_scaling, yarn_mscale

DEEPSEEK_FAMILIES = ("deepseek_v2", "deepseek_v3")
TOPK_METHODS = ("greedy", "group_limited_greedy", "noaux_tc")


def from_deepseek_dict(d: dict[str, Any], family: str) -> dict[str, Any]:
    """``ModelConfig`` keyword arguments of a DeepSeek-V2 / V3 config dict (refusing what is not implemented)."""
    if d.get("attention_bias") or d.get("mlp_bias"):
        raise NotImplementedError(f"{family}: attention_bias / mlp_bias = True is not supported")
    if int(d.get("moe_layer_freq", 1)) != 1:
        raise NotImplementedError(f"{family}: moe_layer_freq={d['moe_layer_freq']} (dense layers between MoE layers) "
                                  "is not supported; HF builds an MoE block in every layer past first_k_dense_replace")
    rope = d.get("rope_parameters") or {}
    scaling = d.get("rope_scaling") or (rope if rope.get("rope_type", "default") != "default" else None)
    hidden, heads = int(d["hidden_size"]), int(d["num_attention_heads"])
    num_layers = int(d["num_hidden_layers"])
    if family == "deepseek_v3":
        topk_method = "noaux_tc"
        experts = d.get("n_routed_experts", d.get("num_local_experts", 256))
        n_group, topk_group = d.get("n_group", 8), d.get("topk_group", 4)
        norm_topk = bool(d.get("norm_topk_prob", True))
        interleave = bool(d.get("rope_interleave", True))
        first_dense = d.get("first_k_dense_replace", 3)
    else:
        topk_method = d.get("topk_method") or "greedy"
        experts = d.get("n_routed_experts", d.get("num_experts", 64))
        n_group, topk_group = d.get("n_group"), d.get("topk_group")
        norm_topk, interleave = False, True
        first_dense = d.get("first_k_dense_replace", 0)
    if topk_method not in TOPK_METHODS or (family == "deepseek_v2" and topk_method == "noaux_tc"):
        raise NotImplementedError(f"{family}: topk_method={topk_method!r} is not supported ({TOPK_METHODS[:2]})")
    if d.get("scoring_func", "sigmoid" if family == "deepseek_v3" else "softmax") != (
            "sigmoid" if family == "deepseek_v3" else "softmax"):
        raise NotImplementedError(f"{family}: scoring_func={d.get('scoring_func')!r} is not what HF runs")
    grouped = topk_method != "greedy"
    n_group = int(n_group or 1) if grouped else 1
    topk_group = int(topk_group or 1) if grouped else 1
    experts = int(experts)
    if grouped and (experts % n_group or not 1 <= topk_group <= n_group):
        raise ValueError(f"{family}: {experts} experts in n_group={n_group} groups, topk_group={topk_group}")
    first_dense = min(int(first_dense or 0), num_layers)
    q_lora = d.get("q_lora_rank")
    return dict(
        architecture=family, vocab_size=int(d["vocab_size"]), hidden_size=hidden,
        intermediate_size=int(d["intermediate_size"]), num_layers=num_layers, num_heads=heads, num_kv_heads=1,
        head_dim=int(d["qk_rope_head_dim"]), rms_norm_eps=float(d.get("rms_norm_eps", 1e-6)),
        rope_theta=float(d.get("rope_theta", rope.get("rope_theta", 10000.0))),
        rope_scaling=parse_rope_scaling(scaling, d.get("max_position_embeddings")),
        max_position_embeddings=int(d.get("max_position_embeddings", 2048)),
        tie_word_embeddings=bool(d.get("tie_word_embeddings", False)), hidden_act=d.get("hidden_act", "silu"),
        bos_token_id=d.get("bos_token_id"), eos_token_ids=_eos(d),
        num_experts=experts if first_dense < num_layers else 0,
        num_experts_per_tok=int(d["num_experts_per_tok"]) if first_dense < num_layers else 0,
        moe_intermediate_size=int(d["moe_intermediate_size"]), norm_topk_prob=norm_topk,
        kv_lora_rank=int(d["kv_lora_rank"]), q_lora_rank=None if q_lora is None else int(q_lora),
        qk_nope_head_dim=int(d["qk_nope_head_dim"]), qk_rope_head_dim=int(d["qk_rope_head_dim"]),
        v_head_dim=int(d["v_head_dim"]), rope_interleave=interleave, first_k_dense_replace=first_dense,
        topk_method=topk_method, n_group=n_group, topk_group=topk_group,
        routed_scaling_factor=float(d.get("routed_scaling_factor", 1.0)),
        num_shared_experts=int(d.get("n_shared_experts") or 0),
    )


def _eos(d: dict[str, Any]) -> tuple[int, ...]:
    eos = d.get("eos_token_id")
    return tuple(eos) if isinstance(eos, list) else (() if eos is None else (int(eos),))


def mla_attention_scale(cfg) -> float:
    """HF's ``yarn_apply_mscale``: ``(nope + rope) ** -0.5``, times ``mscale(factor, mscale_all_dim) ** 2`` under
    YaRN with ``mscale_all_dim`` (DeepSeek scales every dimension's scores, not only the rotary ones)."""
    scale = (cfg.qk_nope_head_dim + cfg.qk_rope_head_dim) ** -0.5
    s = cfg.rope_scaling
    if s is not None and s.mscale_all_dim:
        m = yarn_mscale(s.factor, s.mscale_all_dim)
        scale *= m * m
    return scale


def deepseek_num_params(cfg) -> int:
    """Parameters of an HF DeepSeek-V2 / V3 model of ``cfg`` (every routed expert; the V3 correction bias is a
    buffer, not a parameter, as HF counts)."""
    h, heads = cfg.hidden_size, cfg.num_heads
    qk = cfg.qk_nope_head_dim + cfg.qk_rope_head_dim
    if cfg.q_lora_rank is None:
        attn = h * heads * qk
    else:
        attn = h * cfg.q_lora_rank + cfg.q_lora_rank + cfg.q_lora_rank * heads * qk
    attn += h * (cfg.kv_lora_rank + cfg.qk_rope_head_dim) + cfg.kv_lora_rank
    attn += cfg.kv_lora_rank * heads * (cfg.qk_nope_head_dim + cfg.v_head_dim) + heads * cfg.v_head_dim * h
    dense = 3 * h * cfg.intermediate_size
    moe = h * cfg.num_experts + cfg.num_experts * cfg.expert_params
    moe += 3 * h * cfg.num_shared_experts * cfg.moe_intermediate_size
    moe_layers = cfg.num_layers - cfg.first_k_dense_replace if cfg.is_moe else 0
    layers = cfg.num_layers * (attn + 2 * h) + (cfg.num_layers - moe_layers) * dense + moe_layers * moe
    head = 0 if cfg.tie_word_embeddings else cfg.vocab_size * h
    return cfg.vocab_size * h + layers + h + head


def deepseek_to_hf(cfg, d: dict[str, Any]) -> dict[str, Any]:
    """The HF config dict of a DeepSeek ``cfg`` (``d``: the generic part ``ModelConfig.to_hf_dict`` built)."""
    d = {k: v for k, v in d.items() if k not in ("head_dim", "rope_theta", "rope_scaling")}
    rope = {"rope_type": "default", "rope_theta": cfg.rope_theta}
    if cfg.rope_scaling is not None:
        rope.update(cfg.rope_scaling.to_hf())
    d.update(num_key_value_heads=cfg.num_heads, rope_parameters=rope, kv_lora_rank=cfg.kv_lora_rank,
             q_lora_rank=cfg.q_lora_rank, qk_nope_head_dim=cfg.qk_nope_head_dim,
             qk_rope_head_dim=cfg.qk_rope_head_dim, v_head_dim=cfg.v_head_dim,
             first_k_dense_replace=cfg.first_k_dense_replace, n_routed_experts=cfg.num_experts or 1,
             num_experts_per_tok=cfg.num_experts_per_tok or 1, moe_intermediate_size=cfg.moe_intermediate_size,
             n_shared_experts=cfg.num_shared_experts, routed_scaling_factor=cfg.routed_scaling_factor,
             n_group=cfg.n_group, topk_group=cfg.topk_group, norm_topk_prob=cfg.norm_topk_prob)
    if cfg.architecture == "deepseek_v3":
        d["rope_interleave"] = cfg.rope_interleave
    else:
        d["topk_method"] = cfg.topk_method
    return d
