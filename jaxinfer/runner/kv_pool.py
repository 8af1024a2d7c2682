"""How many KV cache blocks an engine allocates: ``num_kv_blocks``, or what the memory budget holds.

The budget is ``kv_cache_memory_bytes`` if set; else 2 GiB on the CPU, and on a GPU 90% of the device
memory left after the weights (the device with the least room decides). The pool never exceeds what
``max_num_seqs`` sequences of ``max_model_len`` tokens can use, and must hold at least one such sequence.
"""

from __future__ import annotations

import jax

from jaxinfer.model.kv_cache import kv_cache_bytes_per_block

DEFAULT_CPU_KV_BYTES = 2 << 30


def num_kv_blocks(config, model_config, *, max_model_len: int, kv_dtype, platform: str, mesh=None,
                  sharding_plan=None) -> int:
    """Blocks of the pool (block 0, the null block, included) for an ``EngineConfig``; a ValueError when the
    pool cannot hold one request of ``max_model_len`` tokens."""
    c = config
    per_block = kv_cache_bytes_per_block(model_config, c.block_size, kv_dtype)
    if sharding_plan is not None:  # each device holds its KV heads of every block
        per_block = sharding_plan.kv_cache_bytes_per_block_per_device(c.block_size, kv_dtype)
    blocks_per_seq = -(-max_model_len // c.block_size)
    if c.num_kv_blocks is not None:
        num = c.num_kv_blocks
    else:
        budget = c.kv_cache_memory_bytes
        if budget is None:
            budget = DEFAULT_CPU_KV_BYTES if platform != "gpu" else _free_device_bytes(mesh)
        wanted = c.max_num_seqs * blocks_per_seq + 1
        num = max(min(wanted, budget // per_block), 2)
    if num - 1 < blocks_per_seq:
        raise ValueError(
            f"the KV pool ({num - 1} usable blocks of {c.block_size} tokens) cannot hold one request of "
            f"max_model_len={max_model_len} tokens ({blocks_per_seq} blocks): raise num_kv_blocks / "
            "kv_cache_memory_bytes or lower max_model_len"
        )
    return num


def _free_device_bytes(mesh) -> int:
    """90% of the memory limit minus what is in use, on this process's device with the least room."""
    devices = list(mesh.devices.flat) if mesh is not None else jax.devices()[:1]
    return min(int(0.9 * st.get("bytes_limit", 0)) - st.get("bytes_in_use", 0)
               for st in ((d.memory_stats() or {}) for d in devices if d.process_index == jax.process_index()))
