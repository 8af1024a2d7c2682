"""``jaxinfer-bench latency``: decode speed across batch sizes, next to the memory-bandwidth floor.

For each batch size B: B requests with random prompts of ``--input-len`` tokens are prefilled, then every
decode step (one token per sequence) is timed end to end through ``LLMEngine.step`` (scheduling, packing,
the jitted step, sampling, host transfer). TPOT is the median step time; the floor is the bytes a decode
step must read (weights + KV) divided by the bandwidth measured in the same run; the ratio floor/TPOT is
the fraction of the memory bandwidth the engine achieves.
"""

from __future__ import annotations

import statistics
import time

import numpy as np

from bench import hardware, report
from jaxinfer import LLM, SamplingParams


def run_batch(llm: LLM, batch_size: int, input_len: int, output_len: int, seed: int) -> dict:
    engine = llm.llm_engine
    vocab = engine.model_config.vocab_size
    rng = np.random.default_rng(seed)
    params = SamplingParams(temperature=0.0, max_tokens=output_len, ignore_eos=True)
    for i in range(batch_size):
        ids = rng.integers(0, vocab, size=input_len).tolist()
        engine.add_request(f"b{batch_size}-{seed}-{i}", {"prompt_token_ids": ids}, params)
    t0 = time.perf_counter()
    while engine.stats()["num_waiting"] or any(s.num_output_tokens == 0 for s in engine.scheduler.running):
        engine.step()
    prefill_s = time.perf_counter() - t0
    step_times = []
    while engine.has_unfinished_requests():
        t = time.perf_counter()
        engine.step()
        step_times.append(time.perf_counter() - t)
    tpot = statistics.median(step_times)
    return {"batch_size": batch_size, "prefill_s": prefill_s, "tpot_s": tpot, "decode_steps": len(step_times),
            "tok_per_s": batch_size / tpot}


def run(args) -> dict:
    llm = LLM(model=args.model, dtype=args.dtype, max_model_len=args.input_len + args.output_len + 16,
              max_num_seqs=max(args.batch_sizes), attention_backend=args.attention_backend)
    engine = llm.llm_engine
    cfg = engine.model_config
    for b in args.batch_sizes:  # warm-up: compile every shape the measurement will use
        run_batch(llm, b, args.input_len, min(args.output_len, 40), seed=1)
        engine.wait_for_compilations()
    compilations = engine.stats()["num_compilations"]
    bw = hardware.measure_bandwidth()
    rows, results = [], []
    for b in args.batch_sizes:
        r = run_batch(llm, b, args.input_len, args.output_len, seed=2)
        mean_ctx = args.input_len + args.output_len / 2
        floor = hardware.decode_bytes_per_step(cfg, engine.dtype, b, mean_ctx) / bw.bytes_per_s
        r.update(floor_s=floor, bandwidth_fraction=floor / r["tpot_s"])
        results.append(r)
        rows.append([b, r["tpot_s"] * 1e3, r["tok_per_s"], floor * 1e3, r["bandwidth_fraction"]])
    recompiles = engine.stats()["num_compilations"] - compilations
    report.print_table(
        f"decode latency — {engine.model_source} ({cfg.num_params / 1e6:.1f}M params, {np.dtype(engine.dtype).name}); "
        f"bandwidth {bw.bytes_per_s / 1e9:.1f} GB/s ({bw.probe}); recompiles after warm-up: {recompiles}",
        ["batch", "TPOT ms", "tok/s", "floor ms", "floor/TPOT"], rows)
    payload = {"benchmark": "latency", "machine": hardware.machine_info(), "model": engine.model_source,
               "num_params": cfg.num_params, "dtype": np.dtype(engine.dtype).name, "input_len": args.input_len,
               "output_len": args.output_len, "bandwidth": bw.to_json(), "recompiles_after_warmup": recompiles,
               "results": results}
    report.write_json(args.output, payload)
    return payload


def add_arguments(p) -> None:
    p.add_argument("--model", default=None, help="model dir / random:<preset>; default: the embedded model")
    p.add_argument("--dtype", default="auto")
    p.add_argument("--batch-sizes", type=int, nargs="+", default=[1, 4, 16])
    p.add_argument("--input-len", type=int, default=32)
    p.add_argument("--output-len", type=int, default=64)
    p.add_argument("--attention-backend", default="auto")
    p.add_argument("--output", default=None, help="write the results as JSON here")
