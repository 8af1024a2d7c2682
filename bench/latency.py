"""``jaxinfer-bench latency``: decode speed across batch sizes, next to the memory-bandwidth floor.

For each batch size B: B requests with random prompts of ``--input-len`` tokens are prefilled, then every
decode step (one token per sequence) is timed end to end through ``LLMEngine.step`` (scheduling, packing,
the jitted step, sampling, host transfer). This runs twice per batch size, the first time right after the
engine starts (no warm-up: the shape plan was compiled in ``LLM(...)``) and again; TPOT is the median over
steps of the step's time per token it gave each sequence (one, or up to ``--num-scheduler-steps`` with
multi-step decoding), of each run; the floor is the bytes a decode
step must read (weights + KV) divided by the bandwidth measured in the same run; the ratio floor/TPOT is
the fraction of the memory bandwidth the engine achieves.
"""

from __future__ import annotations

import statistics
import time

import numpy as np

from bench import hardware, report
from bench.workload import random_prompts
from jaxinfer import LLM, SamplingParams


def run_batch(llm: LLM, batch_size: int, input_len: int, output_len: int, seed: int) -> dict:
    engine = llm.llm_engine
    vocab = engine.model_config.vocab_size
    rng = np.random.default_rng(seed)
    params = SamplingParams(temperature=0.0, max_tokens=output_len, ignore_eos=True)
    for i, prompt in enumerate(random_prompts(rng, batch_size, input_len, vocab)):
        engine.add_request(f"b{batch_size}-{seed}-{i}", prompt, params)
    t0 = time.perf_counter()
    while engine.stats()["num_waiting"] or any(s.num_output_tokens == 0 for s in engine.scheduler.running):
        engine.step()
    prefill_s = time.perf_counter() - t0
    per_token, steps = [], 0
    seen = {s.request_id: s.num_output_tokens for s in engine.scheduler.running}
    while engine.has_unfinished_requests():
        t = time.perf_counter()
        outputs = engine.step()
        seconds = time.perf_counter() - t
        counts = {o.request_id: len(o.outputs[0].token_ids) for o in outputs}
        tokens = max((n - seen.get(rid, 0) for rid, n in counts.items()), default=1)  # per sequence this step
        seen.update(counts)
        per_token.append(seconds / max(tokens, 1))
        steps += 1
    tpot = statistics.median(per_token)
    return {"batch_size": batch_size, "prefill_s": prefill_s, "tpot_s": tpot, "decode_steps": steps,
            "tok_per_s": batch_size / tpot}


def run(args) -> dict:
    llm = LLM(model=args.model, dtype=args.dtype, max_model_len=args.input_len + args.output_len + 16,
              max_num_seqs=max(args.batch_sizes), attention_backend=args.attention_backend,
              num_scheduler_steps=args.num_scheduler_steps)
    engine = llm.llm_engine
    cfg = engine.model_config
    start_s = engine.warm_up_report.seconds if engine.warm_up_report else None
    bw = hardware.measure_bandwidth()
    rows, results = [], []
    for b in args.batch_sizes:
        first = run_batch(llm, b, args.input_len, args.output_len, seed=1)  # the first use of this batch size
        r = run_batch(llm, b, args.input_len, args.output_len, seed=2)  # steady state
        mean_ctx = args.input_len + args.output_len / 2
        floor = hardware.decode_bytes_per_step(cfg, engine.dtype, b, mean_ctx) / bw.bytes_per_s
        r.update(floor_s=floor, bandwidth_fraction=floor / r["tpot_s"], first_pass_tpot_s=first["tpot_s"],
                 first_pass_prefill_s=first["prefill_s"])
        results.append(r)
        rows.append([b, first["tpot_s"] * 1e3, r["tpot_s"] * 1e3, r["tok_per_s"], floor * 1e3, r["bandwidth_fraction"]])
    compiles = engine.stats()["num_compilations_after_start"]
    report.print_table(
        f"decode latency — {engine.model_source} ({cfg.num_params / 1e6:.1f}M params, {np.dtype(engine.dtype).name}); "
        f"bandwidth {bw.bytes_per_s / 1e9:.1f} GB/s ({bw.probe}); engine start {start_s or 0:.1f} s; "
        f"compilations after start: {compiles}; num_scheduler_steps {args.num_scheduler_steps}",
        ["batch", "first TPOT ms", "TPOT ms", "tok/s", "floor ms", "floor/TPOT"], rows)
    payload = {"benchmark": "latency", "machine": hardware.machine_info(), "model": engine.model_source,
               "num_params": cfg.num_params, "dtype": np.dtype(engine.dtype).name, "input_len": args.input_len,
               "output_len": args.output_len, "bandwidth": bw.to_json(), "start_s": start_s,
               "compilations_after_start": compiles, "num_scheduler_steps": args.num_scheduler_steps,
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
    p.add_argument("--num-scheduler-steps", type=report.positive_int, default=1,
                   help="decode steps per engine step (LLM(num_scheduler_steps=...), multi-step decoding)")
    p.add_argument("--output", default=None, help="write the results as JSON here")
