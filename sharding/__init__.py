"""Tensor and expert parallelism through jax.sharding (knows nothing of the engine).

The pure-layer API the engine calls::

    mesh = sharding.make_mesh(tensor_parallel_size, expert_parallel_size)   # over jax.devices()
    plan = sharding.ShardingPlan.create(cfg, mesh)                          # ValueError if cfg cannot split so
    params = loader.load_hf_params(path, cfg, dtype, shardings=plan.load_shardings())
    params = plan.place_params(params)                                      # KV heads replicated if tp > kv heads
    kv_cache = plan.allocate_kv_cache(num_blocks, block_size, dtype)
    step = jax.jit(lambda p, c, b: model.forward(p, c, b, plan.cfg, plan.shard_attention(attn_fn),
                                                 moe_fn=plan.moe_fn()),
                   in_shardings=(plan.param_shardings(), plan.kv_cache_sharding, plan.batch_sharding),
                   out_shardings=(plan.logits_sharding, plan.kv_cache_sharding), donate_argnums=1)

Modules: ``mesh`` (the device mesh), ``rules`` (THE logical-axis -> mesh-axis table, validation), ``plan``
(shardings of params / KV cache / batch, placing params), ``ops`` (attention and MoE under ``shard_map``),
``hlo`` (counting the collectives of a compiled step).
"""

from sharding.hlo import collectives_by_scope, count_collectives
from sharding.mesh import ALL_DEVICES, EXPERT, TENSOR, make_mesh, parallel_sizes
from sharding.ops import shard_attention, shard_moe
from sharding.rules import LOGICAL_AXIS_RULES, partition_spec, validate


__all__ = [
    "ALL_DEVICES", "EXPERT", "TENSOR", "LOGICAL_AXIS_RULES", "collectives_by_scope", "count_collectives",
    "make_mesh", "parallel_sizes", "partition_spec", "shard_attention", "shard_moe", "validate",
]
