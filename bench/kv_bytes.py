"""``jaxinfer-bench kv-bytes``: KV-cache bytes per token of model presets, measured on allocated caches.

For each ``--models`` preset the engine's paged cache is allocated (``jaxinfer.model.kv_cache.allocate_kv_cache``,
``--blocks`` blocks of 16 tokens, ``--dtype``) and its arrays' bytes divided by the token slots. For a multi-head
latent attention model (DeepSeek) that is the latent row per token and layer (``kv_lora_rank + qk_rope_head_dim``);
beside it, what the same model costs when its keys and values are cached expanded per head, as a plain
multi-head / GQA cache holds them (``num_heads x (qk_nope + qk_rope + v_head_dim)`` per layer), computed, not
allocated. Other presets (GQA) show their K and V cache for reference. Nothing runs but the allocation.
"""

from __future__ import annotations

import json

import jax
import jax.numpy as jnp

from jaxinfer.config.presets import preset_config
from jaxinfer.model.kv_cache import allocate_kv_cache

BLOCK_SIZE = 16


def measure(name: str, num_blocks: int, dtype) -> dict:
    cfg = preset_config(name)
    cache = allocate_kv_cache(cfg, num_blocks, BLOCK_SIZE, dtype)
    allocated = sum(a.nbytes for a in jax.tree.leaves(cache))
    del cache
    itemsize = jnp.dtype(dtype).itemsize
    row = {"model": name, "layers": cfg.num_layers, "arrays_per_layer": cfg.kv_cache_arrays,
           "bytes_per_token": allocated // (num_blocks * BLOCK_SIZE),
           "declared_bytes_per_token": cfg.kv_cache_bytes_per_token(itemsize)}
    if cfg.is_mla:
        per_layer = cfg.num_heads * (cfg.qk_nope_head_dim + cfg.qk_rope_head_dim + cfg.v_head_dim)
        row["expanded_kv_bytes_per_token"] = cfg.num_layers * per_layer * itemsize
        row["ratio"] = round(row["expanded_kv_bytes_per_token"] / row["bytes_per_token"], 2)
    return row


def add_arguments(p) -> None:
    p.add_argument("--models", nargs="+", default=["deepseek-v2-lite", "deepseek-v3", "llama-3-8b", "qwen2.5-7b"])
    p.add_argument("--dtype", default="bfloat16")
    p.add_argument("--blocks", type=int, default=4, help="blocks of 16 tokens to allocate per model")


def run(args) -> None:
    rows = [measure(m, args.blocks, jnp.dtype(args.dtype)) for m in args.models]
    for r in rows:
        extra = (f"   expanded K/V {r['expanded_kv_bytes_per_token']:>9,} B  ({r['ratio']}x)"
                 if "ratio" in r else "")
        print(f"{r['model']:<18} {r['layers']:>3} layers x {r['arrays_per_layer']} arrays: "
              f"{r['bytes_per_token']:>9,} B/token{extra}")
    print(json.dumps({"dtype": args.dtype, "block_size": BLOCK_SIZE, "rows": rows}))
