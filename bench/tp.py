"""``jaxinfer-bench tp``: tensor parallelism per TP size: the collectives of a decode step and their bytes
(from the compiled HLO), weight bytes per device, measured step time where real devices exist, and a
predicted speedup from a stated model.

For each TP size N the sharded decode step of ``--model`` (default ``random:qwen2.5-7b`` shapes, bf16, batch
``--batch``, ``--context`` tokens of context) is lowered with abstract params (``ShapeDtypeStruct`` with the
plan's shardings: nothing is materialised) and compiled over N devices: the default backend's when it has N,
else N CPU devices (simulated: this module asks for ``max(--tp-sizes)`` CPU devices before jax starts). The
partitioner inserts the same collectives on every platform; XLA:CPU promotes bf16 all-reduces to f32, so bytes
are reported as elements x the model's dtype (what a GPU sends).

Predicted speedup (a model, labelled as such in the output; every figure overridable):

    t(N) = R(N) / bandwidth + A(N) x (latency + 2 (N - 1) / N x bytes(N) / link)

R(N) the weight and KV bytes each device reads per step (weights from the shardings: the embedding table
counts one row per token, the LM head in full; of an MoE model's routed experts at most batch x top-k, see
``bytes_read_per_device``; KV split by head), A(N) the all-reduces per step and bytes(N)
what each carries (from the HLO; a ring all-reduce moves 2 (N - 1) / N of it per device). Two bandwidths:
this machine's device memory bandwidth, measured in the same run, and ``--accelerator-gbps`` (default
4800 GB/s, an H200's HBM3e). ``--link-latency-us`` (default 10) and ``--link-gbps`` (default 450, NVLink 4
one direction) are stated, not measured. Quoted next to it: the seed's measured 1.55x / 2.16x and gpt-fast's
1.61x / 2.42x at TP 2 / 4.

Step times are measured only where the default backend has N real accelerator devices (random weights).
"""

from __future__ import annotations

import collections
import statistics
import time

import jax
import jax.numpy as jnp

from bench import hardware, report

REFERENCE_SPEEDUPS = {"seed": {2: 1.55, 4: 2.16}, "gpt-fast": {2: 1.61, 4: 2.42}}
BLOCK_SIZE = 16


def _devices_for(n: int):
    """N devices of the default backend if it has them, else N CPU devices (None if neither)."""
    if jax.device_count() >= n:
        return jax.devices()[:n]
    cpus = jax.devices("cpu")
    return cpus[:n] if len(cpus) >= n else None


def decode_step(plan, batch_size: int, context: int, dtype):
    """(jitted sharded decode step, abstract args) for ``batch_size`` sequences at ``context`` tokens."""
    from jaxinfer.model.attention import get_attention_fn
    from jaxinfer.model.decoder import forward
    from jaxinfer.runner.batch_packing import abstract_batch
    from jaxinfer.runner.shape_plan import StepShape, bucket

    blocks = -(-(context + 1) // BLOCK_SIZE)
    shape = StepShape(num_tokens=bucket(batch_size), num_seqs=bucket(batch_size), num_logits=bucket(batch_size),
                      query_width=1)
    batch = abstract_batch(shape, bucket(blocks), sharding=plan.batch_sharding)
    attn = get_attention_fn(hardware.pure_layer_attention_backend(), query_width=1,
                            sliding_window=plan.cfg.sliding_window)
    step = jax.jit(lambda p, c, b: forward(p, c, b, plan.cfg, plan.shard_attention(attn), moe_fn=plan.moe_fn(),
                                            gather_logits=plan.gather_logits),
                   out_shardings=(plan.logits_sharding, plan.kv_cache_sharding), donate_argnums=1)
    cache = plan.abstract_kv_cache(1 + bucket(batch_size) * bucket(blocks), BLOCK_SIZE, dtype)
    return step, (plan.abstract_params(dtype), cache, batch)


def bytes_read_per_device(plan, batch_size: int, context: int, dtype) -> int:
    """Weight and KV bytes the busiest device reads in a decode step. An MoE model reads, of its routed
    experts, at most ``batch x top-k`` distinct ones; under expert parallelism the busiest device is taken to
    hold all of them (as many as it has), each split over the devices of its expert group."""
    cfg, n, itemsize = plan.cfg, plan.tensor_parallel_size, jnp.dtype(dtype).itemsize
    weights = plan.weight_bytes_per_device(dtype)
    if not cfg.tie_word_embeddings:  # the embedding table: one row per token, not the whole table
        weights -= cfg.vocab_size * cfg.hidden_size * itemsize // n
    if cfg.is_moe:
        ep = plan.expert_parallel_size
        expert_bytes = cfg.num_layers * cfg.expert_params * itemsize // (n // ep)  # one expert, its share
        touched = min(cfg.num_experts // ep, batch_size * cfg.num_experts_per_tok)
        weights += (touched - cfg.num_experts // ep) * expert_bytes
    kv = batch_size * context * cfg.kv_cache_bytes_per_token(itemsize) // (1 if cfg.is_mla else n)  # MLA: replicated
    return weights + kv


def predicted_time(read_bytes: float, all_reduces: int, ar_bytes: float, n: int, bandwidth: float,
                   latency_s: float, link: float) -> float:
    comm = 0.0 if n == 1 else all_reduces * (latency_s + 2 * (n - 1) / n * ar_bytes / link)
    return read_bytes / bandwidth + comm


def measure_step(plan, batch_size: int, context: int, dtype, steps: int) -> float:
    """Median step time of the real sharded step with random weights (real devices only)."""
    from jaxinfer.model.weights import init_random_params
    from jaxinfer.runner.batch_packing import WorkItem, pack
    from jaxinfer.runner.shape_plan import StepShape, bucket

    step, (abstract_params, abstract_cache, _) = decode_step(plan, batch_size, context, dtype)
    params = plan.place_params(init_random_params(plan.source_cfg, jax.random.key(0), dtype))
    cache = plan.allocate_kv_cache(abstract_cache[0][0].shape[0], BLOCK_SIZE, dtype)
    per_seq = -(-(context + 1) // BLOCK_SIZE)
    items = [WorkItem(list(range(1 + i * per_seq, 1 + (i + 1) * per_seq)), context, [1], 1) for i in range(batch_size)]
    s = bucket(batch_size)
    batch, _ = pack(items, BLOCK_SIZE, StepShape(s, s, s, 1), bucket(per_seq))
    times = []
    for i in range(steps + 2):
        t = time.perf_counter()
        logits, cache = step(params, cache, batch)
        jax.block_until_ready(logits)
        if i >= 2:
            times.append(time.perf_counter() - t)
    return statistics.median(times)


def run(args) -> dict:
    import sharding
    from jaxinfer.config.presets import preset_config
    from jaxinfer.model.sharding_plan import ShardingPlan

    try:  # simulated CPU devices for the sizes the default backend lacks (only before jax starts)
        jax.config.update("jax_num_cpu_devices", max(args.tp_sizes))
    except RuntimeError:
        pass
    dtype = jnp.dtype(args.dtype)
    cfg = preset_config(args.model.removeprefix("random:"))
    on_accelerator = jax.default_backend() != "cpu"
    bw = hardware.measure_bandwidth()
    latency, link, accel = args.link_latency_us * 1e-6, args.link_gbps * 1e9, args.accelerator_gbps * 1e9
    results, rows = [], []
    base = {}
    for n in args.tp_sizes:
        devices = _devices_for(n)
        if devices is None:
            print(f"TP={n}: skipped, only {jax.device_count()} {jax.default_backend()} and "
                  f"{len(jax.devices('cpu'))} CPU devices")
            continue
        try:
            plan = ShardingPlan.create(cfg, sharding.make_mesh(n, n if args.expert_parallel else 1, devices))
        except ValueError as e:
            print(f"TP={n}: skipped: {e}")
            continue
        step, abstract_args = decode_step(plan, args.batch, args.context, dtype)
        found = sharding.hlo.collectives(step.lower(*abstract_args).compile().as_text())
        all_reduces = [c for c in found if c.kind == "all-reduce"]
        ar_bytes = max((c.elements for c in all_reduces), default=0) * dtype.itemsize
        read = bytes_read_per_device(plan, args.batch, args.context, dtype)
        measured = None
        if on_accelerator and devices[0].platform != "cpu" and not args.no_measure:
            measured = measure_step(plan, args.batch, args.context, dtype, args.steps)
        times = {"measured_bw": predicted_time(read, len(all_reduces), ar_bytes, n, bw.bytes_per_s, latency, link),
                 "accelerator": predicted_time(read, len(all_reduces), ar_bytes, n, accel, latency, link)}
        if n == 1:
            base = dict(times, measured=measured)
        r = {"tp": n, "devices": devices[0].platform, "collectives": dict(collections.Counter(c.kind for c in found)),
             "all_reduces": len(all_reduces), "all_reduce_bytes": ar_bytes,
             "weight_bytes_per_device": plan.weight_bytes_per_device(dtype), "bytes_read_per_device": read,
             "predicted_s": times, "measured_s": measured,
             "predicted_speedup": {k: base[k] / v for k, v in times.items()} if base else None,
             "measured_speedup": base["measured"] / measured if base.get("measured") and measured else None}
        results.append(r)
        ref = " / ".join(f"{k} {v[n]}x" for k, v in REFERENCE_SPEEDUPS.items() if n in v) or "-"
        rows.append([n, ", ".join(f"{k} {v}" for k, v in r["collectives"].items()) or "none",
                     ar_bytes / 1e3, r["weight_bytes_per_device"] / 1e9,
                     "-" if measured is None else measured * 1e3,
                     *(["-", "-"] if not base else [r["predicted_speedup"]["measured_bw"], r["predicted_speedup"]["accelerator"]]),
                     "-" if r["measured_speedup"] is None else r["measured_speedup"], ref])
    report.print_table(
        f"tensor parallelism{' + expert parallelism' if args.expert_parallel else ''} — {args.model} ({dtype.name}), "
        f"decode batch {args.batch}, context {args.context}. "
        f"PREDICTED speedup = t(1)/t(N), t(N) = bytes read per device / bandwidth + all-reduces x (latency "
        f"{args.link_latency_us:g} us + 2(N-1)/N x bytes / {args.link_gbps:g} GB/s) (stated link figures); "
        f"bandwidth: measured {bw.bytes_per_s / 1e9:.1f} GB/s ({jax.default_backend()}) or stated "
        f"{args.accelerator_gbps:g} GB/s",
        ["TP", "collectives / step", "KB per all-reduce", "weights GB / device", "measured ms",
         "pred. speedup (measured bw)", f"pred. speedup ({args.accelerator_gbps:g} GB/s)", "measured speedup",
         "reference"], rows)
    payload = {"benchmark": "tp", "machine": hardware.machine_info(), "model": args.model, "dtype": dtype.name,
               "expert_parallel": args.expert_parallel,
               "batch": args.batch, "context": args.context, "bandwidth": bw.to_json(),
               "model_of_prediction": {"link_latency_us": args.link_latency_us, "link_gbps": args.link_gbps,
                                       "accelerator_gbps": args.accelerator_gbps},
               "reference_speedups": REFERENCE_SPEEDUPS, "results": results}
    report.write_json(args.output, payload)
    return payload


def add_arguments(p) -> None:
    p.add_argument("--model", default="random:qwen2.5-7b", help="random:<preset> (shapes only)")
    p.add_argument("--tp-sizes", type=int, nargs="+", default=[1, 2, 4, 8])
    p.add_argument("--expert-parallel", action="store_true", help="MoE: experts spread over the TP devices")
    p.add_argument("--dtype", default="bfloat16")
    p.add_argument("--batch", type=report.positive_int, default=1)
    p.add_argument("--context", type=int, default=512)
    p.add_argument("--steps", type=report.positive_int, default=20, help="timed steps (real devices only)")
    p.add_argument("--no-measure", action="store_true", help="skip step timing even on real devices")
    p.add_argument("--link-latency-us", type=float, default=10.0, help="stated per-all-reduce latency")
    p.add_argument("--link-gbps", type=float, default=450.0, help="stated link bandwidth, GB/s one direction")
    p.add_argument("--accelerator-gbps", type=float, default=4800.0, help="stated device memory bandwidth")
    p.add_argument("--output", default=None, help="write the results as JSON here")
