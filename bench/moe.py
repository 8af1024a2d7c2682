"""``jaxinfer-bench moe``: an MoE model against its dense twin of equal total parameters, batch 1 to 32.

Pure-layer decode steps (``model.forward`` over the paged cache, jitted, cache donated; random weights with
the presets' shapes, default ``moe-240m``: Mixtral-shaped, 8 experts, top-2, and ``moe-240m-dense``: one MLP
as wide as the 8 experts). For each batch size B, B sequences at ``--context`` tokens decode one token
each, fresh random tokens every step; the step time is the median over ``--steps`` steps.

Columns, per model and batch: step time and tok/s; the distinct experts a step touches per layer (mean over
layers and steps, from the router's choices recorded by a separate, untimed pass over the same tokens);
the weight bytes a step must read (attention, routers and LM head in full, of the routed experts only those
touched; the dense twin reads everything) plus the KV cache; the floor (those bytes / the bandwidth measured
in the same run) and floor / time. The summary compares MoE over dense at each batch: measured speedup
against the ratio of bytes read (the goal: at batch 1 the speedup within 80% of the bytes ratio; as the batch
grows the experts touched approach all 8 and both fall towards 1x).

``--impl tiles|ragged_dot|auto`` picks the routed-expert formulation (``jaxinfer.model.moe``): on XLA:CPU
``ragged_dot`` reads every expert, which this bench shows as MoE costing what the dense twin costs.
``--layout`` keeps the experts stacked or gives each its own array (``moe.unstack_experts``; the default on a
CPU, where picking an expert out of the stacked array copies it).

A first table (``index_probe``) measures what selecting an expert by a traced index costs on this platform:
the gate/up/down gemvs of every expert of one layer, read (a) from separate arrays, (b) from the stacked
``[E, ...]`` arrays through ``dynamic_index_in_dim`` inside a ``lax.scan`` (what the "tiles" formulation
does). On XLA:CPU (b) compiles to a copy of each selected expert feeding the dot (a ``dynamic-slice`` fusion
in the HLO), so an active expert costs about three times its bytes; the ratio is the price of that copy.
"""

from __future__ import annotations

import functools
import statistics
import time

import jax
import jax.numpy as jnp
import numpy as np

from bench import hardware, report
from jaxinfer.config.presets import preset_config
from jaxinfer.model import moe
from jaxinfer.model.attention import get_attention_fn
from jaxinfer.model.decoder import forward
from jaxinfer.model.kv_cache import allocate_kv_cache
from jaxinfer.model.weights import init_random_params
from jaxinfer.runner.batch_packing import WorkItem, pack
from jaxinfer.runner.shape_plan import StepShape, bucket

BLOCK_SIZE = 16

def decode_batches(cfg, batch_size: int, context: int, num_steps: int, seed: int):
    """``num_steps`` decode StepBatches of ``batch_size`` sequences at position ``context``, random tokens."""
    rng = np.random.default_rng(seed)
    per_seq = -(-(context + 1) // BLOCK_SIZE)
    blocks = [list(range(1 + i * per_seq, 1 + (i + 1) * per_seq)) for i in range(batch_size)]
    batches = []
    for _ in range(num_steps):
        items = [WorkItem(b, context, [int(rng.integers(cfg.vocab_size))], 1) for b in blocks]
        s = bucket(batch_size)
        shape = StepShape(s, s, s, 1)
        batches.append(pack(items, BLOCK_SIZE, shape, per_seq)[0])
    return shape, batches, 1 + batch_size * per_seq


def experts_touched(cfg, params, cache, shape, batches, impl: str) -> float:
    """Mean distinct experts per layer per step, from the router's choices (a separate, untimed pass)."""
    counts = []

    def recording_moe(lp, x, valid, cfg_):
        _, ids = moe.route(x, lp["router"], cfg_, valid)
        jax.debug.callback(lambda i, v: counts.append(len(np.unique(np.asarray(i)[np.asarray(v)]))), ids, valid)
        return moe.moe_block(lp, x, valid, cfg_, impl=impl)

    attn = get_attention_fn(hardware.pure_layer_attention_backend(), query_width=1,
                            sliding_window=cfg.sliding_window)
    step = jax.jit(lambda p, c, b: forward(p, c, b, cfg, attn, moe_fn=recording_moe), donate_argnums=1)
    for batch in batches:
        logits, cache = step(params, cache, batch)
        jax.block_until_ready(logits)
    jax.effects_barrier()
    return float(np.mean(counts)), cache


def weight_bytes_read(cfg, itemsize: int, experts_per_layer: float) -> float:
    """Weights a decode step reads: all but the embedding table (one row per token) and the experts no token
    was routed to. Tied embeddings are read in full as the LM head."""
    weights = cfg.num_params - (0 if cfg.tie_word_embeddings else cfg.vocab_size * cfg.hidden_size)
    if cfg.is_moe:
        weights -= cfg.num_layers * (cfg.num_experts - experts_per_layer) * cfg.expert_params
    return weights * itemsize


def use_unstacked(layout: str, impl: str) -> bool:
    """``--layout auto``: one buffer per expert on a CPU (see ``moe.unstack_experts``), stacked elsewhere."""
    if layout == "auto":
        return jax.default_backend() == "cpu" and impl != moe.RAGGED_DOT
    return layout == "unstacked"


def bench_model(name: str, batch_sizes, context: int, num_steps: int, impl: str, dtype, bandwidth: float,
                unstacked: bool = False) -> list:
    cfg = preset_config(name)
    params = init_random_params(cfg, jax.random.key(0), dtype)
    if cfg.is_moe and unstacked:
        params = moe.unstack_experts(params)
    itemsize = jnp.dtype(dtype).itemsize
    attn = get_attention_fn(hardware.pure_layer_attention_backend(), query_width=1,
                            sliding_window=cfg.sliding_window)
    rows = []
    for b in batch_sizes:
        shape, batches, num_blocks = decode_batches(cfg, b, context, num_steps + 2, seed=b)
        cache = allocate_kv_cache(cfg, num_blocks, BLOCK_SIZE, dtype)
        touched = float(cfg.num_experts)
        if cfg.is_moe:
            touched, cache = experts_touched(cfg, params, cache, shape, batches, impl)
        step = jax.jit(lambda p, c, bt: forward(p, c, bt, cfg, attn, moe_fn=functools.partial(moe.moe_block, impl=impl)),
                       donate_argnums=1)
        times = []
        for i, batch in enumerate(batches):
            t = time.perf_counter()
            logits, cache = step(params, cache, batch)
            jax.block_until_ready(logits)
            if i >= 2:  # the first two steps compile and warm up
                times.append(time.perf_counter() - t)
        step_s = statistics.median(times)
        weights = weight_bytes_read(cfg, itemsize, touched)
        kv = b * context * cfg.kv_cache_bytes_per_token(itemsize)
        floor = (weights + kv) / bandwidth
        rows.append({"model": name, "batch_size": b, "step_s": step_s, "tok_per_s": b / step_s,
                     "experts_per_layer": touched if cfg.is_moe else None, "weight_bytes_read": weights,
                     "kv_bytes_read": kv, "floor_s": floor, "floor_fraction": floor / step_s,
                     "num_params": cfg.num_params, "num_active_params": cfg.num_active_params})
        del cache
    del params
    return rows


def _median_time(fn, *args, repeats: int = 10) -> float:
    jax.block_until_ready(fn(*args))
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        jax.block_until_ready(fn(*args))
        times.append(time.perf_counter() - t)
    return statistics.median(times)


def index_probe(name: str, dtype) -> dict:
    """GB/s reading one layer's experts (gate, up, down gemvs): separate arrays vs a traced index."""
    cfg = preset_config(name)
    e, h, f = cfg.num_experts, cfg.hidden_size, cfg.moe_intermediate_size
    key = jax.random.key(0)
    stacked = [jax.random.normal(jax.random.fold_in(key, i), shape, dtype) * 0.02
               for i, shape in enumerate(((e, h, f), (e, h, f), (e, f, h)))]
    separate = [[w[i] + 0 for w in stacked] for i in range(e)]
    x = jnp.ones((1, h), dtype)
    ffn = lambda x, g, u, d: (jax.nn.silu(x @ g) * (x @ u)) @ d  # noqa: E731

    def by_index(x, ws, ids):
        def body(_, i):
            return None, ffn(x, *(jax.lax.dynamic_index_in_dim(w, i, keepdims=False) for w in ws))
        return jax.lax.scan(body, None, ids)[1]

    nbytes = sum(w.size for w in stacked) * jnp.dtype(dtype).itemsize
    separate_s = _median_time(jax.jit(lambda x, ws: [ffn(x, *w) for w in ws]), x, separate)
    index_s = _median_time(jax.jit(by_index), x, stacked, jnp.arange(e))
    return {"expert_bytes": nbytes // e, "separate_gb_s": nbytes / separate_s / 1e9,
            "dynamic_index_gb_s": nbytes / index_s / 1e9, "slowdown": index_s / separate_s}


def run(args) -> dict:
    dtype = jnp.dtype(args.dtype)
    bw = hardware.measure_bandwidth()
    probe = index_probe(args.model, dtype)
    report.print_table(
        f"reading {args.model}'s experts of one layer at batch 1 ({jax.default_backend()}): separate arrays vs "
        "a traced index into the stacked arrays (the 'tiles' formulation)",
        ["MB per expert", "separate GB/s", "dynamic index GB/s", "slowdown"],
        [[probe["expert_bytes"] / 1e6, probe["separate_gb_s"], probe["dynamic_index_gb_s"], probe["slowdown"]]])
    results = []
    unstacked = use_unstacked(args.layout, args.impl)
    for name in (args.model, args.dense_model):
        results += bench_model(name, args.batch_sizes, args.context, args.steps, args.impl, dtype, bw.bytes_per_s,
                               unstacked)
    rows = [[r["model"], r["batch_size"], r["step_s"] * 1e3, r["tok_per_s"],
             "-" if r["experts_per_layer"] is None else r["experts_per_layer"], r["weight_bytes_read"] / 1e6,
             r["floor_s"] * 1e3, r["floor_fraction"]] for r in results]
    report.print_table(
        f"MoE vs dense twin — decode, context {args.context}, {dtype.name}, impl {args.impl}, "
        f"experts {'unstacked' if unstacked else 'stacked'}, "
        f"{jax.default_backend()}; bandwidth {bw.bytes_per_s / 1e9:.1f} GB/s ({bw.probe})",
        ["model", "batch", "step ms", "tok/s", "experts/layer", "weights MB/step", "floor ms", "floor/step"], rows)
    by = {(r["model"], r["batch_size"]): r for r in results}
    summary = []
    for b in args.batch_sizes:
        m, d = by[(args.model, b)], by[(args.dense_model, b)]
        speedup = d["step_s"] / m["step_s"]
        bytes_ratio = (d["weight_bytes_read"] + d["kv_bytes_read"]) / (m["weight_bytes_read"] + m["kv_bytes_read"])
        summary.append({"batch_size": b, "speedup": speedup, "bytes_ratio": bytes_ratio,
                        "speedup_over_bytes_ratio": speedup / bytes_ratio, "experts_per_layer": m["experts_per_layer"]})
    report.print_table(
        f"{args.model} over {args.dense_model}: measured speedup vs the ratio of bytes read "
        "(goal at batch 1: speedup / bytes ratio >= 0.8)",
        ["batch", "experts/layer", "speedup", "bytes ratio", "speedup / bytes ratio"],
        [[s["batch_size"], s["experts_per_layer"], s["speedup"], s["bytes_ratio"], s["speedup_over_bytes_ratio"]]
         for s in summary])
    payload = {"benchmark": "moe", "machine": hardware.machine_info(), "model": args.model,
               "dense_model": args.dense_model, "dtype": dtype.name, "context": args.context, "impl": args.impl,
               "experts_unstacked": unstacked,
               "bandwidth": bw.to_json(), "index_probe": probe, "results": results, "summary": summary}
    report.write_json(args.output, payload)
    return payload


def add_arguments(p) -> None:
    p.add_argument("--model", default="moe-240m", help="MoE preset")
    p.add_argument("--dense-model", default="moe-240m-dense", help="dense preset with the same total parameters")
    p.add_argument("--batch-sizes", type=int, nargs="+", default=[1, 2, 4, 8, 16, 32])
    p.add_argument("--context", type=int, default=64, help="tokens already in each sequence's KV cache")
    p.add_argument("--steps", type=report.positive_int, default=20, help="timed decode steps per batch size")
    p.add_argument("--impl", choices=moe.IMPLS, default="auto", help="routed-expert formulation (jaxinfer.model.moe)")
    p.add_argument("--layout", choices=("auto", "stacked", "unstacked"), default="auto",
                   help="expert weights stacked [E, ...] or one array each (auto: one each on a CPU)")
    p.add_argument("--dtype", default="float32")
    p.add_argument("--output", default=None, help="write the results as JSON here")
