"""The two model pieces that run per device under ``jax.shard_map`` instead of being auto-partitioned.

* ``shard_attention(attn_fn, mesh)``: the given ragged paged attention (XLA path or the Pallas kernel) on
  each device's own query heads and KV cache shard; block tables and lengths are replicated. No
  communication: heads are independent. ``check_vma=False`` because a ``pallas_call`` inside
  ``shard_map`` fails the varying-manual-axes check (FACTS.md).
* ``shard_moe(mesh, cfg)``: the MoE block with tokens replicated, each device computing its local experts
  (its slice of the expert axis, and of each expert's FFN) plus its slice of the shared expert, then one
  ``psum`` over the mesh. Works on every platform (``ragged_all_to_all`` does not exist on XLA:CPU).

Everything else (embedding, projections, norms, the dense MLP, the LM head) is plain ``jit`` over sharded
arrays on an Auto mesh: XLA's partitioner inserts the Megatron all-reduces.
"""

from __future__ import annotations

import functools

import jax
from jax.sharding import Mesh, PartitionSpec

from jaxinfer.config.model import ModelConfig
from jaxinfer.model import moe, weights
from sharding.mesh import ALL_DEVICES, EXPERT
from sharding.rules import HEADS_ACTIVATION_AXES, KV_CACHE_AXES, partition_spec

MOE_KEYS = ("router", "expert_w_gate", "expert_w_up", "expert_w_down",
            "shared_w_gate", "shared_w_up", "shared_w_down", "shared_gate")


def shard_attention(attn_fn, mesh: Mesh):
    """``attn_fn`` (``fn(q, k_cache, v_cache, block_tables, cu_q_lens, kv_lens, sm_scale=...)``) per device."""
    if mesh.size == 1:
        return attn_fn
    heads, cache, rep = partition_spec(HEADS_ACTIVATION_AXES), partition_spec(KV_CACHE_AXES), PartitionSpec()

    def sharded(q, k_cache, v_cache, block_tables, cu_q_lens, kv_lens, *, sm_scale):
        local = jax.shard_map(functools.partial(attn_fn, sm_scale=sm_scale), mesh=mesh,
                              in_specs=(heads, cache, cache, rep, rep, rep), out_specs=heads, check_vma=False)
        return local(q, k_cache, v_cache, block_tables, cu_q_lens, kv_lens)

    return sharded


def shard_moe(mesh: Mesh, cfg: ModelConfig, impl: str = "auto"):
    """A ``moe_fn(lp, x, valid, cfg)`` for ``model.forward``: local experts + one psum (see module doc)."""
    if mesh.size == 1:  # nothing to split: no shard_map, no (trivial) all-reduce
        return functools.partial(moe.moe_block, impl=impl)
    layer_specs = weights.param_specs(cfg)["layers"][0]
    keys = tuple(k for k in MOE_KEYS if k in layer_specs)
    param_specs = {k: partition_spec(layer_specs[k].logical_axes) for k in keys}
    num_local = cfg.num_experts // mesh.shape[EXPERT]
    rep = PartitionSpec()

    def local(lp, x, valid):
        offset = jax.lax.axis_index(EXPERT) * num_local
        partial = moe.moe_block(lp, x, valid, cfg, expert_offset=offset, impl=impl)
        return jax.lax.psum(partial, ALL_DEVICES)

    def moe_fn(lp, x, valid, cfg_):
        sub = {k: lp[k] for k in keys}
        return jax.shard_map(local, mesh=mesh, in_specs=(param_specs, rep, rep), out_specs=rep,
                             check_vma=False)(sub, x, valid)

    return moe_fn
