"""The two kinds of block that run per device under ``jax.shard_map`` instead of being auto-partitioned.

* ``shard_attention(attn_fn, mesh)``: the given ragged paged attention (XLA path or the Pallas kernel) on
  each device's own query heads and KV cache shard; block tables and lengths are replicated. No
  communication: heads are independent. ``check_vma=False`` because a ``pallas_call`` inside
  ``shard_map`` fails the varying-manual-axes check.
* ``shard_moe(block_fn, mesh, param_axes, experts_per_device)``: a mixture-of-experts block with tokens
  replicated, each device computing its local experts (its slice of the expert axis, and of each expert's
  FFN) plus its slice of any dense part (a shared expert), then one ``psum`` over the mesh. The caller hands
  in the block (told which global expert its first local one is) and the logical axes of the params it
  reads. Works on every platform (``ragged_all_to_all`` does not exist on XLA:CPU).

Everything else (embedding, projections, norms, the dense MLP, the LM head) is plain ``jit`` over sharded
arrays on an Auto mesh: XLA's partitioner inserts the Megatron all-reduces.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping

import jax
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from sharding.mesh import ALL_DEVICES, EXPERT, TENSOR
from sharding.rules import HEADS_ACTIVATION_AXES, KV_CACHE_AXES, partition_spec


def shard_attention(attn_fn, mesh: Mesh, cache_axes=KV_CACHE_AXES):
    """``attn_fn`` (``fn(q, k_cache, v_cache, block_tables, cu_q_lens, kv_lens, sm_scale=...)``) per device.
    ``cache_axes``: the caches' logical axes (split by KV head; all None: replicated, as MLA's latent cache). A
    ``sinks`` option ([Hq], GPT-OSS) is split with the query heads; the other options are static. ``v_cache=None``
    (latent rows, MLA) passes through as None."""
    if mesh.size == 1:
        return attn_fn
    heads, cache, rep = partition_spec(HEADS_ACTIVATION_AXES), partition_spec(cache_axes), PartitionSpec()
    head_vector = partition_spec(HEADS_ACTIVATION_AXES[1:2])

    def sharded(q, k_cache, v_cache, block_tables, cu_q_lens, kv_lens, *, sm_scale, sinks=None, **layer_options):
        fn = functools.partial(attn_fn, sm_scale=sm_scale, **layer_options)
        if v_cache is None:  # latent rows (MLA): one cache, no V array to place
            fn = lambda q, k, *a, f=fn: f(q, k, None, *a)  # noqa: E731
            args, specs = (q, k_cache, block_tables, cu_q_lens, kv_lens), (heads, cache, rep, rep, rep)
        else:
            args, specs = (q, k_cache, v_cache, block_tables, cu_q_lens, kv_lens), (heads, cache, cache, rep, rep, rep)
        if sinks is not None:
            fn = lambda *a, f=fn: f(*a[:-1], sinks=a[-1])  # noqa: E731
            args, specs = (*args, sinks), (*specs, head_vector)
        return jax.shard_map(fn, mesh=mesh, in_specs=specs, out_specs=heads, check_vma=False)(*args)

    return sharded


def replicate(mesh: Mesh):
    """``fn(x)``: ``x`` constrained to be whole on every device (the sampled rows' logits, gathered from the
    vocab-parallel LM head before the model drops a padded vocabulary's columns: one all-gather, where slicing
    the sharded logits would first shuffle them between devices)."""
    whole = NamedSharding(mesh, PartitionSpec())
    return lambda x: jax.lax.with_sharding_constraint(x, whole)


def shard_moe(block_fn: Callable, mesh: Mesh, param_axes: Mapping[str, tuple], experts_per_device: int):
    """``fn(params, x, valid)``: ``block_fn`` on each device's shards, summed over the mesh (see module doc).

    ``block_fn(params, x, valid, expert_offset, tensor_rank)`` returns one device's partial output: ``params``
    holds that device's shards of the arrays named in ``param_axes`` (key -> logical axes of that array), of
    which the experts are the global ones ``expert_offset .. expert_offset + experts_per_device - 1``;
    ``tensor_rank`` is the device's index along the tensor axis (which splits those experts' FFN: a term every
    such device would compute whole, an expert's output bias, is added by rank 0 only). ``params`` given
    to ``fn`` may hold more keys; only ``param_axes``' go in. ``x`` and ``valid`` are replicated, and so is
    the result."""
    keys = tuple(param_axes)
    if mesh.size == 1:  # nothing to split: no shard_map, no (trivial) all-reduce
        return lambda params, x, valid: block_fn({k: params[k] for k in keys}, x, valid, expert_offset=0,
                                                 tensor_rank=0)
    specs = {k: partition_spec(param_axes[k]) for k in keys}
    rep = PartitionSpec()

    def local(params, x, valid):
        offset = jax.lax.axis_index(EXPERT) * experts_per_device
        rank = jax.lax.axis_index(TENSOR)
        return jax.lax.psum(block_fn(params, x, valid, expert_offset=offset, tensor_rank=rank), ALL_DEVICES)

    def sharded(params, x, valid):
        sub = {k: params[k] for k in keys}
        return jax.shard_map(local, mesh=mesh, in_specs=(specs, rep, rep), out_specs=rep,
                             check_vma=False)(sub, x, valid)

    return sharded
