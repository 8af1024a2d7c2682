"""``jaxinfer-bench paged``: what PagedAttention buys — bigger batches from the same KV memory.

Two measurements, the seed's PagedAttention row:

1. **Batch sweep.** B requests (B = 1, 2, 4, ..., 32) of ``--input-len`` prompt tokens and ``--output-len``
   greedy tokens arrive together on one engine (its shape plan compiled at start); reported per B: output
   throughput (tokens / wall time of the whole batch) and the mean request latency. Decoding reads every
   weight once per step whatever the batch, so throughput should grow almost with B while latency barely
   moves (the seed, vLLM on an A100: 80 -> 2,408 tok/s from batch 1 to 32 at 1.25 -> 1.33 s).
2. **KV memory.** For a workload of requests with varied prompt and output lengths run to completion, the
   KV memory the paged cache holds at each step (blocks of the running sequences) against the tokens it
   actually stores, and against what a contiguous cache must reserve for the same sequences (every request
   its full ``max_model_len``, as engines before vLLM did). Waste = 1 - stored tokens / reserved token
   slots, averaged over the steps (the seed: 60-80% with contiguous preallocation, < 4% paged).
"""

from __future__ import annotations

import statistics
import time

import numpy as np

from bench import hardware, report
from bench.workload import random_prompts
from jaxinfer import LLM, SamplingParams


def batch_sweep(llm: LLM, batch_sizes, input_len: int, output_len: int, seed: int = 0) -> list[dict]:
    engine = llm.llm_engine
    vocab = engine.model_config.vocab_size
    params = SamplingParams(temperature=0.0, max_tokens=output_len, ignore_eos=True)
    rows = []
    for b in batch_sizes:
        rng = np.random.default_rng([seed, b])
        prompts = random_prompts(rng, b, input_len, vocab)
        t = time.perf_counter()
        outs = llm.generate(prompts, params, use_tqdm=False)
        wall = time.perf_counter() - t
        latencies = [o.metrics.finished_time - o.metrics.arrival_time for o in outs]
        rows.append({"batch_size": b, "wall_s": wall, "output_tok_per_s": b * output_len / wall,
                     "mean_latency_s": statistics.mean(latencies), "max_latency_s": max(latencies)})
    return rows


def kv_memory(llm: LLM, num_requests: int, input_range, output_range, seed: int = 0) -> dict:
    """Paged vs contiguous KV memory over one run of varied requests (token slots, summed over steps)."""
    engine = llm.llm_engine
    bs, max_len = engine.config.block_size, engine.max_model_len
    rng = np.random.default_rng(seed)
    vocab = engine.model_config.vocab_size
    for i in range(num_requests):
        n_in = int(rng.integers(input_range[0], input_range[1] + 1))
        n_out = int(rng.integers(output_range[0], output_range[1] + 1))
        engine.add_request(f"kv-{seed}-{i}", {"prompt_token_ids": rng.integers(0, vocab, size=n_in).tolist()},
                           SamplingParams(temperature=0.0, max_tokens=n_out, ignore_eos=True))
    stored = paged = contiguous = steps = 0
    while engine.has_unfinished_requests():
        engine.step()
        running = engine.scheduler.running
        if not running:
            continue
        steps += 1
        stored += sum(s.num_computed_tokens for s in running)
        paged += sum(len(s.block_ids) for s in running) * bs
        contiguous += len(running) * max_len
    return {"steps": steps, "stored_token_slots": stored, "paged_token_slots": paged,
            "contiguous_token_slots": contiguous, "paged_waste": 1 - stored / paged if paged else 0.0,
            "contiguous_waste": 1 - stored / contiguous if contiguous else 0.0,
            "block_size": bs, "max_model_len": max_len}


def run(args) -> dict:
    max_len = max(args.input_len + args.output_len, args.kv_input_range[1] + args.kv_output_range[1]) + 16
    llm = LLM(model=args.model, dtype=args.dtype, max_model_len=max(max_len, args.max_model_len or 0),
              max_num_seqs=max(args.max_num_seqs or 0, *args.batch_sizes), enable_prefix_caching=False)
    engine = llm.llm_engine
    cfg = engine.model_config
    bw = hardware.measure_bandwidth()
    sweep = batch_sweep(llm, args.batch_sizes, args.input_len, args.output_len)
    rows = []
    for r in sweep:
        floor = hardware.decode_bytes_per_step(cfg, engine.dtype, r["batch_size"],
                                               args.input_len + args.output_len / 2) / bw.bytes_per_s
        r["decode_floor_s"] = floor
        r["latency_floor_s"] = floor * args.output_len
        rows.append([r["batch_size"], r["output_tok_per_s"], r["mean_latency_s"], r["latency_floor_s"],
                     r["output_tok_per_s"] / sweep[0]["output_tok_per_s"]])
    report.print_table(
        f"paged attention: batch sweep — {engine.model_source} ({cfg.num_params / 1e6:.1f}M params), "
        f"{args.input_len} prompt + {args.output_len} output tokens (seed, vLLM A100 7B: 80 -> 2,408 tok/s, "
        "latency 1.25 -> 1.33 s from batch 1 to 32)",
        ["batch", "out tok/s", "mean latency s", "latency floor s", "throughput vs batch 1"], rows)
    memory = kv_memory(llm, args.kv_requests, args.kv_input_range, args.kv_output_range)
    report.print_table(
        f"paged attention: KV memory — {args.kv_requests} requests, prompts {args.kv_input_range[0]}.."
        f"{args.kv_input_range[1]}, outputs {args.kv_output_range[0]}..{args.kv_output_range[1]}, max_model_len "
        f"{memory['max_model_len']}, blocks of {memory['block_size']} (seed: 60-80% wasted contiguous, < 4% paged)",
        ["layout", "token slots held (sum over steps)", "waste"],
        [["contiguous (max_model_len each)", memory["contiguous_token_slots"], memory["contiguous_waste"]],
         ["paged", memory["paged_token_slots"], memory["paged_waste"]]])
    payload = {"benchmark": "paged", "machine": hardware.machine_info(), "model": engine.model_source,
               "num_params": cfg.num_params, "bandwidth": bw.to_json(), "sweep": sweep, "kv_memory": memory,
               "compilations_after_start": engine.stats()["num_compilations_after_start"]}
    report.write_json(args.output, payload)
    return payload


def add_arguments(p) -> None:
    p.add_argument("--model", default=None, help="model dir / random:<preset>; default: the embedded model")
    p.add_argument("--dtype", default="auto")
    p.add_argument("--batch-sizes", type=report.positive_int, nargs="+", default=[1, 2, 4, 8, 16, 32])
    p.add_argument("--input-len", type=report.positive_int, default=64)
    p.add_argument("--output-len", type=report.positive_int, default=128)
    p.add_argument("--kv-requests", type=report.positive_int, default=64)
    p.add_argument("--kv-input-range", type=report.positive_int, nargs=2, default=[16, 256])
    p.add_argument("--kv-output-range", type=report.positive_int, nargs=2, default=[16, 256])
    p.add_argument("--max-model-len", type=int, default=None, help="engine setting (default: what the requests need)")
    p.add_argument("--max-num-seqs", type=int, default=None, help="engine setting (default: the largest batch)")
    p.add_argument("--output", default=None, help="write the results as JSON here")
