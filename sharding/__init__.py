"""Tensor and expert parallelism through jax.sharding (knows nothing of the engine: imports no ``jaxinfer``).

It works on declarations it is handed: the logical axes of each array (a tuple of names per param leaf),
head counts and split sizes as plain ints, and functions to run per device::

    mesh = sharding.make_mesh(tensor_parallel_size, expert_parallel_size)       # over jax.devices()
    sharding.validate(tp, ep, num_heads=28, num_kv_heads=4, dims=[("vocab_size", 152064, "vocab")])
    shardings = sharding.tree_shardings(mesh, logical_axes_of_each_param)       # NamedSharding per leaf
    attn = sharding.shard_attention(attn_fn, mesh)                              # per-device heads, no collective
    moe = sharding.shard_moe(block_fn, mesh, param_axes, experts_per_device)    # local experts + one psum
    sharding.collectives_by_scope(step.lower(...).compile().as_text())          # {"layer0": {"all-reduce": 2}, ...}

The engine's model laid over a mesh (its config, weights declaration, MoE block, KV cache) is
``jaxinfer.model.sharding_plan.ShardingPlan``, built on these.

Modules: ``mesh`` (the device mesh), ``rules`` (THE logical-axis -> mesh-axis table, validation),
``ops`` (attention and MoE under ``shard_map``), ``hlo`` (counting the collectives of a compiled step).
"""

from sharding.hlo import collectives_by_scope, count_collectives
from sharding.mesh import ALL_DEVICES, EXPERT, TENSOR, make_mesh, parallel_sizes
from sharding.ops import shard_attention, shard_moe
from sharding.rules import LOGICAL_AXIS_RULES, named_sharding, partition_spec, tree_shardings, validate

__all__ = [
    "ALL_DEVICES", "EXPERT", "TENSOR", "LOGICAL_AXIS_RULES", "collectives_by_scope", "count_collectives",
    "make_mesh", "named_sharding", "parallel_sizes", "partition_spec", "shard_attention", "shard_moe",
    "tree_shardings", "validate",
]
