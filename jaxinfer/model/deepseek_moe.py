"""DeepSeek-V2 / V3's router: group-limited top-k, V3's sigmoid scores and correction bias.

``jaxinfer.model.moe.moe_block`` routes with ``route_deepseek`` for a config with a ``topk_method``, then runs
the routed experts as for every MoE family (``moe.routed_experts``: tiles / ragged_dot, expert parallelism by
``expert_offset``) and adds DeepSeek's shared experts (``num_shared_experts`` of them, one MLP
``n * moe_intermediate_size`` wide) with weight 1: no gate, unlike Qwen2-MoE's. The router runs in float32, as HF
keeps ``gate.weight`` (and V3's ``e_score_correction_bias``) in float32:

* "greedy" (V2): softmax over all experts, the top-k;
* "group_limited_greedy" (V2): the experts are ``n_group`` consecutive groups; a group's score is its best
  expert's; only the best ``topk_group`` groups' experts may be chosen (the others' scores set to 0);
* "noaux_tc" (V3): sigmoid scores; the choice uses score + ``e_score_correction_bias`` (the bias never weighs
  an output), a group's score the sum of its two best biased scores, the other groups' experts set to -inf;
  the weights are the unbiased scores of the chosen experts, renormalised when ``norm_topk_prob``
  (denominator + 1e-20, as HF).

The weights are then multiplied by ``routed_scaling_factor``. HF's V2 router ignores ``norm_topk_prob``, and so
does this one.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from jaxinfer.config.model import ModelConfig
from jaxinfer.model.linear import linear


def _keep_best_groups(group_scores, cfg: ModelConfig):
    """[T, E] bool: the experts of each token's best ``topk_group`` groups (group_scores [T, G])."""
    _, best = jax.lax.top_k(group_scores, cfg.topk_group)
    keep = jnp.zeros(group_scores.shape, bool).at[jnp.arange(group_scores.shape[0])[:, None], best].set(True)
    return jnp.repeat(keep, cfg.num_experts // cfg.n_group, axis=1)


def route_deepseek(x, lp, cfg: ModelConfig, valid):
    """(weights [T, k] float32, expert ids [T, k] int32) by ``cfg.topk_method``; padding rows weigh 0."""
    logits = linear(x, lp["router"], out_dtype=jnp.float32)
    num_tokens, k = logits.shape[0], cfg.num_experts_per_tok
    grouped = (num_tokens, cfg.n_group, cfg.num_experts // cfg.n_group)
    if cfg.topk_method == "noaux_tc":
        scores = jax.nn.sigmoid(logits)
        choice = scores + lp["router_bias"].astype(jnp.float32)
        top2 = jax.lax.top_k(choice.reshape(grouped), 2)[0].sum(-1)
        choice = jnp.where(_keep_best_groups(top2, cfg), choice, -jnp.inf)
        _, ids = jax.lax.top_k(choice, k)
        weights = jnp.take_along_axis(scores, ids, axis=1)
        if cfg.norm_topk_prob:
            weights = weights / (weights.sum(-1, keepdims=True) + 1e-20)
    else:
        scores = jax.nn.softmax(logits, axis=-1)
        if cfg.topk_method == "group_limited_greedy":
            scores = jnp.where(_keep_best_groups(scores.reshape(grouped).max(-1), cfg), scores, 0.0)
        weights, ids = jax.lax.top_k(scores, k)
    weights = weights * cfg.routed_scaling_factor
    return jnp.where(valid[:, None], weights, 0.0), ids.astype(jnp.int32)
