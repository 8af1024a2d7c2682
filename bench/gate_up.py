"""``jaxinfer-bench gate-up``: the MLP's gate and up projections as two products (the engine) or one fused one.

Phi-3 checkpoints store ``gate_up_proj`` fused (``[2F, H]``, gate rows first); the loader splits it into the
engine's ``w_gate`` and ``w_up`` (``jaxinfer.model.weights``). This measures whether keeping it fused would be
faster: the first half of the MLP, ``act(x @ w_gate) * (x @ w_up)``, computed

* *split*: two ``linear`` calls, the weights as the engine places them on this device (K-major on a CPU,
  ``jaxinfer.model.linear.k_major_linear_weights``, which routes decode-sized float32 products to the C++
  matvec kernel), and
* *fused*: one ``linear`` over ``[w_gate | w_up]`` (the same placement), its output split in two,

at ``--rows`` tokens (decode batches and prefill chunks), on random weights of the preset's shapes (default
Phi-3-mini: H 3072, F 8192). Both results are compared (the products are the same dot products). Times are
steady state (``--repeats`` calls after one call that compiles, median and best), next to the first call; the
floor is reading both weights once at the machine's measured bandwidth (``bench.hardware.measure_bandwidth``)
or, where larger, the FLOPs at ``--peak-tflops`` if given; ratio = median / floor.
"""

from __future__ import annotations

import json
import statistics
import time

import jax
import jax.numpy as jnp
import numpy as np

from bench.hardware import machine_info, measure_bandwidth
from jaxinfer.config.presets import preset_config
from jaxinfer.model.linear import k_major_linear_weights, linear


def _place(w_gate, w_up):
    """(split weights, fused weight) as the engine places dense linear weights on this device."""
    params = {"layers": [{"w_gate": w_gate, "w_up": w_up}, {"w_gate": jnp.concatenate([w_gate, w_up], axis=1)}]}
    if jax.default_backend() == "cpu":
        params = k_major_linear_weights(params)
    split, fused = params["layers"]
    return (split["w_gate"], split["w_up"]), fused["w_gate"]


def _timed(fn, args, repeats: int) -> dict:
    start = time.perf_counter()
    first_out = jax.block_until_ready(fn(*args))
    first = time.perf_counter() - start
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        jax.block_until_ready(fn(*args))
        times.append(time.perf_counter() - start)
    return {"first_call_ms": first * 1e3, "median_ms": statistics.median(times) * 1e3, "best_ms": min(times) * 1e3,
            "out": first_out}


def measure(model: str, rows: list[int], dtype, repeats: int, peak_tflops: float | None) -> dict:
    cfg = preset_config(model)
    h, f = cfg.hidden_size, cfg.intermediate_size
    keys = jax.random.split(jax.random.key(0), 3)
    w_gate = (jax.random.normal(keys[0], (h, f), jnp.float32) * h ** -0.5).astype(dtype)
    w_up = (jax.random.normal(keys[1], (h, f), jnp.float32) * h ** -0.5).astype(dtype)
    (g, u), fused = _place(w_gate, w_up)
    del w_gate, w_up
    act = jax.nn.silu
    # On a CPU the engine computes in float32 over bfloat16 weights (jaxinfer.loading.model_source.activation_dtype)
    activation_dtype = jnp.float32 if jax.default_backend() == "cpu" else dtype

    @jax.jit
    def split_fn(x, g, u):
        return act(linear(x, g)) * linear(x, u)

    @jax.jit
    def fused_fn(x, w):
        y = linear(x, w)
        return act(y[..., :f]) * y[..., f:]

    bandwidth = measure_bandwidth()
    weight_bytes = 2 * h * f * jnp.dtype(dtype).itemsize
    out = []
    for m in rows:
        x = jax.random.normal(keys[2], (m, h), jnp.float32).astype(activation_dtype)
        split = _timed(split_fn, (x, g, u), repeats)
        fused_r = _timed(fused_fn, (x, fused), repeats)
        diff = float(np.max(np.abs(np.asarray(split.pop("out"), np.float32) - np.asarray(fused_r.pop("out"),
                                                                                         np.float32))))
        floor_s = weight_bytes / bandwidth.bytes_per_s
        if peak_tflops:
            floor_s = max(floor_s, 2 * m * h * 2 * f / (peak_tflops * 1e12))
        out.append({"rows": m, "split": split, "fused": fused_r, "max_abs_diff": diff, "floor_ms": floor_s * 1e3,
                    "split_ratio": split["median_ms"] / (floor_s * 1e3),
                    "fused_ratio": fused_r["median_ms"] / (floor_s * 1e3),
                    "fused_speedup": split["median_ms"] / fused_r["median_ms"]})
    return {"model": model, "hidden": h, "intermediate": f, "dtype": jnp.dtype(dtype).name,
            "weight_bytes": weight_bytes, "bandwidth": bandwidth.to_json(), "repeats": repeats,
            "device": jax.devices()[0].device_kind, "machine": machine_info(), "rows": out}


def add_arguments(p) -> None:
    p.add_argument("--model", default="phi-3-mini", help="a random:<preset> name's shapes (hidden, intermediate)")
    p.add_argument("--rows", type=int, nargs="+", default=[1, 8, 64, 256])
    p.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    p.add_argument("--repeats", type=int, default=20)
    p.add_argument("--peak-tflops", type=float, default=None, help="the device's peak for the compute floor")
    p.add_argument("--output", default=None)


def run(args) -> None:
    if min(args.rows) < 1 or args.repeats < 1:
        raise ValueError(f"--rows and --repeats must be positive, got rows {args.rows}, repeats {args.repeats}")
    result = measure(args.model, args.rows, jnp.dtype(args.dtype), args.repeats, args.peak_tflops)
    print(f"{result['model']} gate/up, H {result['hidden']} F {result['intermediate']}, {result['dtype']}, "
          f"{result['device']}; floor = {result['weight_bytes'] / 1e6:.0f} MB of weights at "
          f"{result['bandwidth']['gb_per_s']:.1f} GB/s; times: median of {result['repeats']} steady-state calls "
          "(first call, with its compile, in parentheses)")
    print(f"{'rows':>5} {'split ms':>18} {'fused ms':>18} {'floor ms':>9} {'split/floor':>11} {'fused/floor':>11} "
          f"{'split/fused':>11} {'max |diff|':>10}")
    for r in result["rows"]:
        s, f = r["split"], r["fused"]
        print(f"{r['rows']:>5} {s['median_ms']:>8.2f} ({s['first_call_ms']:>6.0f}) {f['median_ms']:>8.2f} "
              f"({f['first_call_ms']:>6.0f}) {r['floor_ms']:>9.2f} {r['split_ratio']:>11.2f} {r['fused_ratio']:>11.2f} "
              f"{r['fused_speedup']:>11.2f} {r['max_abs_diff']:>10.1e}")
    if args.output:
        with open(args.output, "w") as fh:
            json.dump(result, fh, indent=1)
