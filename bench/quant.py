"""``jaxinfer-bench quant``: unquantized vs fp8 vs fp8_w8a16 vs int8 (and the fp8 KV cache), where they pay.

Each variant's params come from the engine's own path (``jaxinfer.quantization.options.apply``: fp8 KV scales
folded, linears quantized on load absmax per output channel, e4m3 weights held as int8 bytes on a CPU);
pure-layer steps (``model.forward`` over the paged cache, jitted, cache donated, fresh random tokens every
step) are timed at three shapes: a bandwidth-bound one (batch-1 decode) and compute-bound ones (batch-B
decode, a T-token prefill), the variants' timed steps interleaved round-robin. Columns per variant and
shape: the first call (compile + run) and the steady-state step (median), tokens/s, the weight bytes a step
reads (8-bit linears + their scales; embedding table excluded unless tied) plus the KV bytes, the floor
(those bytes / the bandwidth measured in the same run), floor / step, GFLOP/s (2 x the params read x
tokens), and the speedup over the unquantized model at that shape.

Quality (engine level, ``LLM(quantization=..., kv_cache_dtype=...)``): greedy agreement with the unquantized
engine over ``--agreement-tokens`` tokens of two prompts, on the embedded default model (trained, so its
greedy choices are not near-ties as a random model's are): tokens before the first divergence. KV blocks
that fit: what the engine's automatic pool sizing gives for ``--kv-budget-mb`` (fp8 K/V: 1 byte per element).

CPU anchor (optional): llama.cpp f32 and q8_0 at batch 1, same run, through ``jaxinfer-bench compare`` in its
own process (llama-cpp-python; skipped with the reason when it is not installed). It decodes an HF-written
random checkpoint of the ``llama-150m`` shapes, the default model here, so the TPOTs compare like for like.
``--formulations`` also records ``jaxinfer.cpu.quantized_matmul.time_formulations`` (the measurement behind the CPU
formulation the engine uses).
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

from bench import hardware, report
from bench.moe import BLOCK_SIZE, decode_batches
from jaxinfer.cpu import host_allocator
from jaxinfer.model.attention import get_attention_fn, resolve_attention_backend
from jaxinfer.model.decoder import forward
from jaxinfer.model.kv_cache import allocate_kv_cache, kv_cache_bytes_per_block
from jaxinfer.model.linear import k_major_linear_weights
from jaxinfer.model.step_batch import single_sequence_batch
from jaxinfer.quantization import options as quant_setup
from jaxinfer.quantization.quantized_weight import weight_bytes

VARIANTS = {
    "unquantized": quant_setup.QuantOptions(),
    "fp8": quant_setup.QuantOptions("fp8"),
    "fp8_w8a16": quant_setup.QuantOptions("fp8_w8a16"),
    "int8": quant_setup.QuantOptions("int8"),
    # the LM head too (what llama.cpp's q8_0 quantizes; `jaxinfer convert --quantization int8 --quantize-lm-head`)
    "int8_lm_head": quant_setup.QuantOptions("int8", include_lm_head=True),
    "kv_fp8": quant_setup.QuantOptions(None, "fp8"),
}


def load_dense(model: str, dtype):
    """(cfg, dense params, description): a preset name (random weights), "default", or an HF directory."""
    from jaxinfer.config.model import ModelConfig
    from jaxinfer.config.presets import PRESETS, preset_config
    from jaxinfer.loading.loader import load_hf_params
    from jaxinfer.loading.model_source import default_model_dir
    from jaxinfer.model.weights import init_random_params

    if model in PRESETS:
        cfg = preset_config(model)
        return cfg, init_random_params(cfg, jax.random.key(0), dtype), f"random:{model}"
    path = default_model_dir() if model == "default" else Path(model)
    cfg = ModelConfig.from_pretrained(path)
    return cfg, load_hf_params(path, cfg, dtype), str(path)


def step_shapes(args) -> list[dict]:
    return [{"shape": "decode-b1", "kind": "decode", "batch": 1, "tokens": 1},
            {"shape": f"decode-b{args.big_batch}", "kind": "decode", "batch": args.big_batch,
             "tokens": args.big_batch},
            {"shape": f"prefill-{args.prefill_len}", "kind": "prefill", "batch": 1, "tokens": args.prefill_len}]


def _prefill_batches(cfg, length: int, num_steps: int, seed: int):
    rng = np.random.default_rng(seed)
    blocks = list(range(1, 1 + -(-length // BLOCK_SIZE)))
    batches = [single_sequence_batch(rng.integers(cfg.vocab_size, size=length).tolist(), blocks, BLOCK_SIZE)
               for _ in range(num_steps)]
    return batches, 1 + len(blocks)


def read_bytes(cfg, params) -> int:
    """Weight bytes a step reads: every array but the embedding table (one row per token) unless tied."""
    embed = 0 if cfg.tie_word_embeddings else weight_bytes(params["embed"])
    return weight_bytes(params) - embed


def _shape_batches(cfg, shape, args):
    """(batches: first call + ``args.steps`` timed, cache blocks needed, mean context a step reads)."""
    if shape["kind"] == "decode":
        _, batches, num_blocks = decode_batches(cfg, shape["batch"], args.context, args.steps + 1, seed=1)
        return batches, num_blocks, args.context
    batches, num_blocks = _prefill_batches(cfg, shape["tokens"], args.steps + 1, seed=2)
    return batches, num_blocks, shape["tokens"] / 2


def bench_variants(names, cfg, dense, shapes, args, bandwidth: float) -> list[dict]:
    """Every variant at every shape. Per shape, each variant's first call (compile + run) comes first, then
    the timed steps run round-robin over the variants (a load change on a shared machine hits them all alike);
    the step time is each variant's median."""
    platform = jax.default_backend()
    backend = resolve_attention_backend("auto", platform)  # the engine's default: the C++ kernels on a CPU
    params = {n: quant_setup.apply(dense, cfg, VARIANTS[n], platform) for n in names}
    if platform == "cpu":  # the engine's CPU setup: dense linears K-major (jaxinfer.model.linear), freed memory kept
        params = {n: k_major_linear_weights(p) for n, p in params.items()}
        host_allocator.keep_freed_memory_in_heap()  # in the heap (jaxinfer.cpu.host_allocator), as LLMEngine does
    kv_dtypes = {n: quant_setup.kv_cache_dtype(VARIANTS[n], args.dtype, backend) for n in names}
    weights = {n: read_bytes(cfg, params[n]) for n in names}
    dense_params = cfg.num_params - (0 if cfg.tie_word_embeddings else cfg.vocab_size * cfg.hidden_size)
    rows = []
    for shape in shapes:
        batches, num_blocks, context = _shape_batches(cfg, shape, args)
        width = 1 if shape["kind"] == "decode" else None
        attn = get_attention_fn(backend, query_width=width, sliding_window=cfg.sliding_window)
        step = jax.jit(lambda p, c, b: forward(p, c, b, cfg, attn), donate_argnums=1)
        caches, first, times = {}, {}, {n: [] for n in names}
        for n in names:
            caches[n] = allocate_kv_cache(cfg, num_blocks, BLOCK_SIZE, kv_dtypes[n])
            t = time.perf_counter()
            logits, caches[n] = step(params[n], caches[n], batches[0])
            jax.block_until_ready(logits)
            first[n] = time.perf_counter() - t
        for batch in batches[1:]:
            for n in names:
                t = time.perf_counter()
                logits, caches[n] = step(params[n], caches[n], batch)
                jax.block_until_ready(logits)
                times[n].append(time.perf_counter() - t)
        del caches
        for n in names:
            step_s = statistics.median(times[n])
            kv = shape["batch"] * context * cfg.kv_cache_bytes_per_token(jnp.dtype(kv_dtypes[n]).itemsize)
            floor = (weights[n] + kv) / bandwidth
            rows.append({"method": n, "shape": shape["shape"], "batch_size": shape["batch"],
                         "tokens": shape["tokens"], "first_call_s": first[n], "step_s": step_s,
                         "step_times_s": times[n], "tok_per_s": shape["tokens"] / step_s,
                         "weight_bytes_read": weights[n], "kv_bytes_read": kv,
                         "kv_cache_dtype": jnp.dtype(kv_dtypes[n]).name, "floor_s": floor,
                         "floor_fraction": floor / step_s,
                         "gflop_per_s": 2 * dense_params * shape["tokens"] / step_s / 1e9})
    return sorted(rows, key=lambda r: names.index(r["method"]))


def _quantized_checkpoint(model: str | None, opts, out_dir: str) -> str:
    """``model`` (an HF directory, None: the embedded default) quantized with ``opts`` into ``out_dir``."""
    from jaxinfer.config.model import ModelConfig
    from jaxinfer.loading.loader import load_hf_params
    from jaxinfer.loading.model_source import default_model_dir
    from jaxinfer.loading.quantized_orbax import save_quantized_params

    src = str(default_model_dir()) if model is None else model
    cfg = ModelConfig.from_pretrained(src)
    params = quant_setup.apply(load_hf_params(src, cfg, jnp.float32), cfg, opts, platform="any")
    return str(save_quantized_params(params, out_dir + "/ckpt", cfg, copy_files_from=src))


def greedy_agreement(model: str | None, tokens: int, names) -> dict:
    """Per variant: tokens equal to the unquantized engine's before the first divergence (2 prompts)."""
    from jaxinfer import LLM, SamplingParams

    rng = np.random.default_rng(0)
    engine = dict(compilation="lazy", max_model_len=tokens + 64, max_num_seqs=2, max_num_batched_tokens=128)
    llm_dense = LLM(model=model, **engine)
    vocab = llm_dense.llm_engine.model_config.vocab_size
    prompts = [{"prompt_token_ids": rng.integers(vocab, size=n).tolist()} for n in (12, 40)]
    params = SamplingParams(temperature=0.0, max_tokens=tokens, ignore_eos=True)

    def run(llm):
        return [o.outputs[0].token_ids for o in llm.generate(prompts, params, use_tqdm=False)]

    ref = run(llm_dense)
    del llm_dense
    out = {"unquantized": {"identical_prefix": 2 * tokens, "of": 2 * tokens}}
    for name in names:
        if name == "unquantized":
            continue
        opts = VARIANTS[name]
        if opts.include_lm_head:  # not an LLM option: a checkpoint written as `jaxinfer convert` writes it
            with tempfile.TemporaryDirectory() as tmp:
                got = run(LLM(model=_quantized_checkpoint(model, opts, tmp), **engine))
        else:
            got = run(LLM(model=model, quantization=opts.quantization, kv_cache_dtype=opts.kv_cache_dtype, **engine))
        prefix = 0
        for a, b in zip(got, ref):
            n = 0
            while n < len(a) and a[n] == b[n]:
                n += 1
            prefix += n
        out[name] = {"identical_prefix": prefix, "of": 2 * tokens}
    return out


def llamacpp_rows(args) -> list[dict]:
    """llama.cpp f32 / q8_0 at batch 1 through ``jaxinfer-bench compare`` in its own process, or the reason
    they are missing."""
    from bench.llamacpp import unavailable_reason

    reason = unavailable_reason()
    if reason is None and jax.default_backend() != "cpu":
        reason = f"llama.cpp is the CPU baseline; this run is on {jax.default_backend()}"
    if reason is None and args.model != "llama-150m":
        reason = "llama.cpp rows run the llama-150m shapes only (the default --model)"
    if reason is None and not args.llamacpp:
        reason = "skipped (--no-llamacpp)"
    if reason is not None:
        return [{"method": f"llama.cpp-{t}", "shape": "decode-b1", "status": "skipped", "reason": reason}
                for t in ("f32", "q8_0")]
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "compare.json"
        cmd = [sys.executable, "-m", "bench.cli", "compare", "--baselines", "llama.cpp-f32", "llama.cpp-q8_0",
               "--batch-sizes", "1", "--output-len", str(args.agreement_tokens), "--repeats", "2",
               "--output", str(out)]
        proc = subprocess.run(cmd, env={**os.environ})
        if proc.returncode != 0 or not out.is_file():
            return [{"method": "llama.cpp", "shape": "decode-b1", "status": "failed",
                     "reason": f"`{' '.join(cmd[2:])}` exited with {proc.returncode}"}]
        payload = json.loads(out.read_text())
    rows = []
    for r in payload["rows"]:
        rows.append({"method": r["runner"], "shape": "decode-b1", "status": r["status"], "reason": r.get("reason"),
                     "step_s": r.get("tpot_s"), "floor_fraction": r.get("floor_over_tpot"),
                     "weight_bytes_read": (r.get("machine", {}).get("runner", {}).get("decode_bytes") or {}).get(
                         "weights"), "greedy_identical_prefix_vs_jaxinfer": r.get("greedy_mean_identical_prefix"),
                     "source": "jaxinfer-bench compare (same process plan: each runner in its own process)"})
    return rows


def summarize(rows: list[dict]) -> list[dict]:
    """Speedup of each variant over the unquantized model at each shape (what phase1 quotes)."""
    base = {r["shape"]: r for r in rows if r["method"] == "unquantized"}
    out = []
    for r in rows:
        if r["method"] == "unquantized" or r["shape"] not in base:
            continue
        b = base[r["shape"]]
        out.append({"method": r["method"], "shape": r["shape"], "speedup": b["step_s"] / r["step_s"],
                    "bytes_ratio": (b["weight_bytes_read"] + b["kv_bytes_read"]) /
                                   (r["weight_bytes_read"] + r["kv_bytes_read"]),
                    "step_ms": r["step_s"] * 1e3, "unquantized_step_ms": b["step_s"] * 1e3})
    return out


def run(args) -> dict:
    _apply_defaults(args)
    load_at_start = os.getloadavg()[0]
    if load_at_start > 0.5 * (os.cpu_count() or 1):
        print(f"[quant] warning: load average {load_at_start:.1f} on {os.cpu_count()} cores: timings are suspect")
    dtype = jnp.dtype(args.dtype)
    args.dtype = dtype
    names = [n for n in VARIANTS if n in args.methods or n == "unquantized"]
    bw = hardware.measure_bandwidth()
    cfg, dense, source = load_dense(args.model, dtype)
    shapes = step_shapes(args)
    rows = bench_variants(names, cfg, dense, shapes, args, bw.bytes_per_s)
    del dense
    summary = summarize(rows)
    agreement = greedy_agreement(None if args.agreement_model == "default" else args.agreement_model,
                                 args.agreement_tokens, names)
    budget = args.kv_budget_mb << 20
    kv_blocks = {n: budget // kv_cache_bytes_per_block(cfg, BLOCK_SIZE, quant_setup.kv_cache_dtype(VARIANTS[n], dtype))
                 for n in names}
    llamacpp = llamacpp_rows(args) if jax.default_backend() == "cpu" else []
    formulations = None
    if args.formulations:
        from jaxinfer.cpu.quantized_matmul import time_formulations

        # a chain larger than the last-level cache (a matrix alone may sit in it and flatter float32)
        formulations = time_formulations(rows=(1, 16, 64, 512), layers=4, repeats=3)
    load_at_end = os.getloadavg()[0]
    by = {(s["method"], s["shape"]): s for s in summary}
    report.print_table(
        f"quantization — {source} ({cfg.num_params / 1e6:.0f}M params, {dtype.name}), context {args.context}, "
        f"{jax.default_backend()}; bandwidth {bw.bytes_per_s / 1e9:.1f} GB/s ({bw.probe}); load {load_at_start:.1f}"
        f" -> {load_at_end:.1f}",
        ["method", "shape", "first call ms", "step ms", "tok/s", "weights MB", "floor ms", "floor/step", "GFLOP/s",
         "speedup", "greedy agree", "KV blocks"],
        [[r["method"], r["shape"], r["first_call_s"] * 1e3, r["step_s"] * 1e3, r["tok_per_s"],
          r["weight_bytes_read"] / 1e6, r["floor_s"] * 1e3, r["floor_fraction"], r["gflop_per_s"],
          by.get((r["method"], r["shape"]), {}).get("speedup", 1.0),
          f"{agreement[r['method']]['identical_prefix']}/{agreement[r['method']]['of']}", kv_blocks[r["method"]]]
         for r in rows]
        + [[r["method"], r["shape"], "-", (r.get("step_s") or float("nan")) * 1e3, "-",
            (r.get("weight_bytes_read") or 0) / 1e6, "-", r.get("floor_fraction") or "-", "-", "-",
            r.get("greedy_identical_prefix_vs_jaxinfer") or "-", r.get("reason") or r["status"]] for r in llamacpp])
    if formulations:
        report.print_table("CPU formulations of a chain of the 134M Llama's products (jaxinfer.cpu.quantized_matmul.time_formulations)",
                           ["formulation", "rows", "ms", "weights MB", "GB/s"],
                           [[f["formulation"], f["m"], f["ms"], f["weight_mb"], f["gb_per_s"]] for f in formulations])
    payload = {"benchmark": "quant", "machine": {**hardware.machine_info(), "load_average_at_start": load_at_start,
                                                 "load_average_at_end": load_at_end},
               "model": source, "dtype": dtype.name, "context": args.context, "bandwidth": bw.to_json(),
               "results": rows, "summary": summary, "greedy_agreement": agreement,
               "agreement_model": args.agreement_model, "kv_budget_mb": args.kv_budget_mb, "kv_blocks": kv_blocks,
               "llamacpp": llamacpp, "cpu_formulations": formulations,
               "command": "jaxinfer-bench quant " + " ".join(sys.argv[2:])}
    report.write_json(args.output, payload)
    return payload


def add_arguments(p) -> None:
    p.add_argument("--quick", action="store_true",
                   help="small and fast: the embedded default model, batch 1 and 8, a 64-token prefill, 3 steps")
    p.add_argument("--model", default=None,
                   help="a preset (random weights), 'default' (embedded model) or an HF dir; default llama-150m "
                        "('default' with --quick)")
    p.add_argument("--methods", nargs="+", default=list(VARIANTS), choices=list(VARIANTS))
    p.add_argument("--dtype", default=None, help="default: float32 on a CPU, bfloat16 on a GPU")
    p.add_argument("--context", type=report.positive_int, default=None, help="tokens in each decode sequence's cache")
    p.add_argument("--big-batch", type=report.positive_int, default=None, help="the compute-bound decode batch (64)")
    p.add_argument("--prefill-len", type=report.positive_int, default=None, help="the compute-bound prefill (512)")
    p.add_argument("--steps", type=report.positive_int, default=None, help="timed steps per shape (10)")
    p.add_argument("--agreement-model", default="default", help="model of the greedy agreement runs")
    p.add_argument("--agreement-tokens", type=report.positive_int, default=None, help="greedy tokens per prompt (64)")
    p.add_argument("--kv-budget-mb", type=report.positive_int, default=1024, help="KV memory for the blocks column")
    p.add_argument("--no-llamacpp", dest="llamacpp", action="store_false", help="skip the llama.cpp rows")
    p.add_argument("--formulations", action="store_true", help="also time the CPU 8-bit gemv formulations")
    p.add_argument("--output", default=None, help="write the results as JSON here")


def _apply_defaults(args) -> None:
    quick = args.quick
    defaults = {"model": "default" if quick else "llama-150m", "context": 32 if quick else 128,
                "big_batch": 8 if quick else 64, "prefill_len": 64 if quick else 512, "steps": 3 if quick else 10,
                "agreement_tokens": 16 if quick else 64,
                "dtype": "float32" if jax.default_backend() == "cpu" else "bfloat16"}
    for k, v in defaults.items():
        if getattr(args, k) is None:
            setattr(args, k, v)
