"""The mixture-of-experts MLP block (Mixtral, Qwen2-MoE, Qwen3-MoE): router, top-k, grouped experts.

``moe_block(lp, x, valid, cfg)`` replaces the dense MLP of a layer. The router runs in float32 (softmax
over all experts, top-k, renormalised to sum 1 when ``cfg.norm_topk_prob``); every (token, chosen expert)
pair is then computed by its expert only, never a dense loop over all experts:

* ``"tiles"``: the pairs are sorted by expert and laid out in row tiles of ``M`` rows, each tile owned by
  one expert (an expert's rows padded to a whole number of tiles, as in megablox); a ``lax.scan`` over the
  tiles indexes the tile's expert weights with ``dynamic_index_in_dim`` and runs ``[M, H] @ [H, F]``. Unused
  tiles are skipped by ``lax.cond``, so a step reads the weights of the experts it routes to and no
  others: at batch 1 with top-2, two experts per layer. ``M`` grows with the pairs per expert (1 at batch 1,
  i.e. matrix-vector products; up to 128 for long prefills), bounding the padding to < M rows per expert.
  XLA:CPU copies an expert picked from the stacked array by a traced index before the dot (about 3x its
  bytes, measured by ``bench/moe.py``); ``unstack_experts`` gives every expert its own buffer, which the
  tiles then pick with ``lax.switch`` and read in place (one-device CPU runs).
* ``"ragged_dot"``: the sorted pairs go through ``jax.lax.ragged_dot`` (one grouped GEMM per projection).

Which one runs is a static choice (``choose_impl``) from the platform and the step's token count, made
explicit here because it decides the bytes a decode step reads:

* CPU: always ``"tiles"``. XLA:CPU expands ``ragged_dot`` into work over every expert for every row (it
  read all 8 experts at 2 routed tokens and ran slower than a dense loop over them),
  so it would make MoE cost as much as its dense twin. ``bench/moe.py --impl`` measures both.
* GPU: ``"tiles"`` while there are at most as many (token, expert) pairs as experts (decode at small
  batch: a few matrix-vector products that read only the routed experts), ``"ragged_dot"`` above that
  (XLA's grouped GEMM; a real kernel). The GPU threshold is not measured yet: run ``bench/moe.py`` on the
  GPU machine and adjust ``choose_impl``.

GPT-OSS adds a bias to the router's logits and takes the softmax over the chosen k only; its experts carry
biases and use a clamped SwiGLU (``gated_activation``): both formulations take the biases per pair.

Padding tokens (``valid`` false) are routed nowhere, so they neither cost an expert nor touch one.

Expert parallelism: under ``shard_map`` a device holds ``E_local`` of the experts (leading axis of the
stacked weights) starting at ``expert_offset``; pairs routed elsewhere are dropped locally and the caller
sums the partial outputs over devices (tokens replicated + local experts + psum: works on every platform).
Tensor parallelism inside the experts (their FFN axis split) needs nothing here: each device's partial
down-projection output is summed by the same psum. The shared expert (Qwen2-MoE) is added to the partial
sum on its own FFN shard, so a layer's MoE block costs one all-reduce in all.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp

from jaxinfer.config.model import ModelConfig
from jaxinfer.model.deepseek_moe import route_deepseek
from jaxinfer.model.linear import linear

TILES = "tiles"
RAGGED_DOT = "ragged_dot"
IMPLS = ("auto", TILES, RAGGED_DOT)
MAX_TILE_ROWS = 128
# a layer's stacked routed-expert arrays (the biases: GPT-OSS), in the order _expert_ffn takes them
EXPERT_KEYS = ("expert_w_gate", "expert_w_up", "expert_w_down", "expert_b_gate", "expert_b_up", "expert_b_down")


def choose_impl(num_pairs: int, num_local_experts: int, platform: str) -> str:
    """The routed-expert formulation for a step of ``num_pairs`` (token, expert) pairs (see the module doc)."""
    if platform == "cpu":
        return TILES
    return TILES if num_pairs <= num_local_experts else RAGGED_DOT


def tile_rows(num_pairs: int, num_local_experts: int) -> int:
    """Rows per tile: the power of two at most the mean pairs per expert, within [1, MAX_TILE_ROWS]."""
    mean = max(1, num_pairs // max(1, num_local_experts))
    return min(MAX_TILE_ROWS, 1 << (mean.bit_length() - 1))


def route(x, router_w, cfg: ModelConfig, valid, router_bias=None):
    """Top-k routing in float32: (weights [T, k] float32, expert ids [T, k] int32); padding rows weigh 0.
    The router's logits are accumulated and returned in float32 from the operands as they are (bf16 products
    are exact in float32, so widening x first changes nothing but the GEMM XLA emits: on sm_90 its untuned
    float32 tiling spilled registers, found by ``jaxinfer-bench gpu-compile``). ``router_bias`` [E]: added to
    the logits (GPT-OSS). ``cfg.router_topk_softmax``: the top-k of the logits, then a softmax over those k
    (GPT-OSS); else the top-k of the softmax over all experts (renormalised with ``cfg.norm_topk_prob``)."""
    logits = linear(x, router_w, out_dtype=jnp.float32)
    if router_bias is not None:
        logits = logits + router_bias.astype(jnp.float32)
    if cfg.router_topk_softmax:
        top, ids = jax.lax.top_k(logits, cfg.num_experts_per_tok)
        weights = jax.nn.softmax(top, axis=-1)
    else:
        weights, ids = jax.lax.top_k(jax.nn.softmax(logits, axis=-1), cfg.num_experts_per_tok)
        if cfg.norm_topk_prob:
            weights = weights / weights.sum(axis=-1, keepdims=True)
    return jnp.where(valid[:, None], weights, 0.0), ids.astype(jnp.int32)


def gated_activation(cfg: ModelConfig):
    """``glu(gate, up)`` of the experts: SwiGLU ``silu(gate) * up``, or GPT-OSS's clamped one (``swiglu_limit``)."""
    if cfg.swiglu_limit is None:
        return swiglu
    limit, alpha = cfg.swiglu_limit, cfg.swiglu_alpha

    def clamped_swiglu(gate, up):
        gate = jnp.minimum(gate, limit)
        up = jnp.clip(up, -limit, limit)
        return (up + 1) * (gate * jax.nn.sigmoid(gate * alpha))

    return clamped_swiglu


def swiglu(gate, up):
    return jax.nn.silu(gate) * up


def _expert_ffn(x, w_gate, w_up, w_down, glu=swiglu, b_gate=None, b_up=None, b_down=None):
    gate, up = linear(x, w_gate), linear(x, w_up)
    if b_gate is not None:
        gate, up = gate + b_gate, up + b_up
    out = linear(glu(gate, up), w_down)
    return out if b_down is None else out + b_down


def num_experts_of(w) -> int:
    """Experts held in a stacked ``[E, ...]`` array or an ``unstack_experts`` tuple."""
    return len(w) if isinstance(w, (list, tuple)) else w.shape[0]


def unstack_experts(params):
    """The params with each layer's stacked expert arrays split into tuples of per-expert arrays.

    For one-device CPU runs: XLA:CPU materialises a copy of an expert picked from a stacked array by a traced
    index (the HLO shows a dynamic-slice fusion feeding the dot), so an active expert costs about three times
    its bytes; with one buffer per expert the "tiles" formulation picks it with ``lax.switch`` and reads it in
    place (``bench/moe.py`` measures both). Not for sharded params: expert parallelism needs the stacked axis.
    """
    layers = []
    for lp in params["layers"]:
        lp = dict(lp)
        for k in EXPERT_KEYS:
            if k in lp and not isinstance(lp[k], (list, tuple)):
                lp[k] = tuple(lp[k][i] for i in range(lp[k].shape[0]))
        layers.append(lp)
    return {**params, "layers": layers}


def _sorted_pairs(ids, weights, valid, expert_offset, num_local):
    """Flatten (token, choice) pairs, map them to local expert ids (``num_local`` = not on this device or a
    padding token) and sort them by expert: (expert [P], weight [P], token [P], per-expert counts [E_local])."""
    k = ids.shape[1]
    local = ids.reshape(-1) - expert_offset
    keep = (local >= 0) & (local < num_local) & jnp.repeat(valid, k)
    expert = jnp.where(keep, local, num_local)
    order = jnp.argsort(expert, stable=True)
    counts = jnp.zeros(num_local + 1, jnp.int32).at[expert].add(1)[:num_local]
    return expert[order], weights.reshape(-1)[order], (order // k).astype(jnp.int32), counts


def _routed_tiles(x, expert, token, counts, experts, glu):
    """The sorted pairs through row tiles owned by one expert each (see the module doc): [P, H] outputs.
    ``experts``: the ``_expert_ffn`` arrays (w_gate, w_up, w_down, and the biases or None), stacked or tuples."""
    num_pairs, num_local = expert.shape[0], num_experts_of(experts[0])
    rows = tile_rows(num_pairs, num_local)
    num_tiles = -(-num_pairs // rows) + min(num_pairs, num_local)  # every expert's rows pad to < 1 extra tile
    tiles_per_expert = (counts + rows - 1) // rows
    tile_end = jnp.cumsum(tiles_per_expert)
    group_start = jnp.cumsum(counts) - counts  # first sorted pair of each expert
    e = jnp.minimum(expert, num_local - 1)
    rank = jnp.arange(num_pairs) - group_start[e]
    dest = jnp.where(expert < num_local, (tile_end[e] - tiles_per_expert[e]) * rows + rank, num_tiles * rows)
    padded = jnp.zeros((num_tiles * rows, x.shape[1]), x.dtype).at[dest].set(x[token], mode="drop")
    tile_expert = jnp.searchsorted(tile_end, jnp.arange(num_tiles), side="right")  # num_local: unused tile
    skip = lambda xt: jnp.zeros((rows, x.shape[1]), x.dtype)  # noqa: E731
    if isinstance(experts[0], (list, tuple)):  # one array per expert: a switch, each branch reads its own buffer
        per_expert = [[None if w is None else w[i] for w in experts] for i in range(num_local)]
        branches = [functools.partial(lambda xt, ws: _expert_ffn(xt, *ws[:3], glu, *ws[3:]).astype(x.dtype), ws=ws)
                    for ws in per_expert]
        run_tile = lambda owner, xt: jax.lax.switch(owner, branches + [skip], xt)  # noqa: E731
    else:  # stacked: index the owner's slice (XLA:CPU copies it; see unstack_experts)
        def run_tile(owner, xt):
            ws = [None if w is None else jax.lax.dynamic_index_in_dim(w, owner, keepdims=False) for w in experts]
            ffn = lambda xt: _expert_ffn(xt, *ws[:3], glu, *ws[3:]).astype(x.dtype)  # noqa: E731
            return jax.lax.cond(owner < num_local, ffn, skip, xt)

    def tile(_, t):
        return None, run_tile(tile_expert[t], jax.lax.dynamic_slice_in_dim(padded, t * rows, rows))

    _, out = jax.lax.scan(tile, None, jnp.arange(num_tiles))
    out = out.reshape(num_tiles * rows, x.shape[1])
    return out[jnp.minimum(dest, num_tiles * rows - 1)]


def _routed_ragged_dot(x, expert, token, counts, experts, glu):
    """The sorted pairs through ``jax.lax.ragged_dot`` (pairs past the local groups come back as zeros; their
    biases are those of the last local expert, and the caller drops those pairs)."""
    w_gate, w_up, w_down, b_gate, b_up, b_down = experts
    xs = x[token]
    gate, up = jax.lax.ragged_dot(xs, w_gate, counts), jax.lax.ragged_dot(xs, w_up, counts)
    e = jnp.minimum(expert, w_gate.shape[0] - 1)
    if b_gate is not None:
        gate, up = gate + b_gate[e], up + b_up[e]
    out = jax.lax.ragged_dot(glu(gate, up).astype(xs.dtype), w_down, counts)
    return out if b_down is None else out + b_down[e]


def routed_experts(x, weights, ids, valid, w_gate, w_up, w_down, *, expert_offset=0, impl: str = "auto",
                   glu=swiglu, biases=(None, None, None)):
    """Sum over each token's chosen experts (those among the local ``w_*[E_local, ...]``) of weight x FFN.
    ``biases``: the local experts' (b_gate, b_up [E_local, Fe], b_down [E_local, H]) or Nones; ``glu(gate, up)``
    the gated activation (``gated_activation``)."""
    num_local = num_experts_of(w_gate)
    if impl == "auto":
        impl = TILES if isinstance(w_gate, (list, tuple)) else choose_impl(ids.size, num_local, jax.default_backend())
    if impl not in (TILES, RAGGED_DOT):
        raise ValueError(f"moe impl must be one of {IMPLS}, got {impl!r}")
    if impl == RAGGED_DOT and isinstance(w_gate, (list, tuple)):
        raise ValueError("the ragged_dot formulation needs stacked expert weights (not unstack_experts)")
    expert, weight, token, counts = _sorted_pairs(ids, weights, valid, expert_offset, num_local)
    compute = _routed_tiles if impl == TILES else _routed_ragged_dot
    out = compute(x, expert, token, counts, (w_gate, w_up, w_down, *biases), glu).astype(jnp.float32)
    out = jnp.where((expert < num_local)[:, None], out * weight[:, None], 0.0)
    return jnp.zeros((x.shape[0], x.shape[1]), jnp.float32).at[token].add(out)


def shared_expert(lp, x):
    """Qwen2-MoE's always-on expert, scaled by a sigmoid gate of the token: [T, H] float32."""
    gate = jax.nn.sigmoid(linear(x, lp["shared_gate"], out_dtype=jnp.float32))
    return gate * _expert_ffn(x, lp["shared_w_gate"], lp["shared_w_up"], lp["shared_w_down"]).astype(jnp.float32)


def moe_block(lp, x, valid, cfg: ModelConfig, *, expert_offset=0, impl: str = "auto", tensor_rank=0):
    """The MoE MLP of one layer: x [T, H] -> [T, H]; ``valid`` [T] marks real (non-padding) tokens.

    Under expert or tensor parallelism (see ``ShardingPlan.moe_fn`` in ``jaxinfer.model.sharding_plan``)
    ``lp`` holds this device's shards and the result is this device's partial sum; ``tensor_rank`` is the
    device's place among those that split the same experts' FFN: only rank 0 adds the experts' down-projection
    bias, so the sum over devices holds it once."""
    if cfg.topk_method:  # DeepSeek: group-limited / sigmoid routing (jaxinfer.model.deepseek_moe)
        weights, ids = route_deepseek(x, lp, cfg, valid)
    else:
        weights, ids = route(x, lp["router"], cfg, valid, lp.get("router_bias"))
    biases = (None, None, None)
    if cfg.expert_bias:
        b_down = lp["expert_b_down"]
        if not isinstance(tensor_rank, int) or tensor_rank:
            keep = jnp.asarray(tensor_rank) == 0
            b_down = (tuple(jnp.where(keep, b, 0) for b in b_down) if isinstance(b_down, (list, tuple))
                      else jnp.where(keep, b_down, 0))
        biases = (lp["expert_b_gate"], lp["expert_b_up"], b_down)
    out = routed_experts(x, weights, ids, valid, lp["expert_w_gate"], lp["expert_w_up"], lp["expert_w_down"],
                         expert_offset=expert_offset, impl=impl, glu=gated_activation(cfg), biases=biases)
    if "shared_gate" in lp:
        out = out + shared_expert(lp, x)
    elif "shared_w_gate" in lp:  # DeepSeek's shared experts: no gate
        out = out + _expert_ffn(x, lp["shared_w_gate"], lp["shared_w_up"], lp["shared_w_down"]).astype(jnp.float32)
    return out.astype(x.dtype)
