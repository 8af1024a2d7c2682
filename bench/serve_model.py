"""``jaxinfer-bench serve-model``: what static vs continuous batching can gain on this machine, by model.

The ``serve`` experiment's latency ratio depends on the workload and on how a step's time grows with the
batch: continuous batching wins big when adding sequences to a step is nearly free (a GPU decoding a small
batch is memory-bound) and little when every sequence adds its own cost (a CPU). This tool separates the
two. It measures the engine's step time here over a grid of decode and prefill steps and fits

    step_s = a + b * sequences + c * (context tokens of the decoding sequences) + p * prefill tokens
             + r * (query x key pairs of the prefill chunks)

by least squares, then replays the ``serve`` workload (same arguments, same schedule and lengths) through
the engine's real ``Scheduler`` and ``BlockManager`` on a simulated clock, each step advancing it by the
model's time, for static and continuous batching. It does so under the fitted model and under two
hypothetical ones: attention free (``c = r = 0``) and batching free (``a + b``: every step, whatever it
holds, costs a batch-1 decode step; the idealised memory-bound device). The simulation leaves out what the model does not
capture (host overheads between steps, compilations, a shared machine), so it is a model, not a
measurement; its use is to say whether a latency ratio is within reach of an engine with a given cost
profile before tuning anything. Prefix caching is off, as in ``serve``.
"""

from __future__ import annotations

import math
import time

import numpy as np
import scipy.optimize

from bench import hardware, report, serve
from bench.workload import WorkloadSpec, make_workload, random_prompts, workload_spec
from jaxinfer import LLM, SamplingParams
from jaxinfer.core.block_manager import BlockManager
from jaxinfer.core.scheduler import Scheduler, SchedulerConfig
from jaxinfer.core.sequence import Sequence

FIT_BATCHES = (1, 4, 16, 32)
FIT_PROMPT_LENS = (32, 288)
FIT_DECODE_STEPS = 8


# ------------------------------------------------------------------------------------------- measuring
def _step_sample(engine) -> tuple[int, int, int, int, float] | None:
    """Run one engine step; (sequences, context of the decoding sequences, prefill tokens, prefill query x
    key pairs, seconds), read from how far each sequence's computed tokens advanced (no preemption happens
    in the fitting runs)."""
    seqs = engine.scheduler.running + engine.scheduler.waiting
    before = {s.seq_id: (s.num_computed_tokens, s.num_tokens) for s in seqs}
    t = time.perf_counter()
    engine.step()
    seconds = time.perf_counter() - t
    n = prefill = context = pairs = 0
    for s in seqs:
        done, total = before[s.seq_id]
        new = s.num_computed_tokens - done
        if new <= 0:
            continue
        n += 1
        if done == total - 1:  # a decode: one token at position total - 1, attending to total keys
            context += total
        else:
            prefill += new
            pairs += new * (done + (new + 1) / 2)  # query i of the chunk sees done + i + 1 keys
    return (n, context, prefill, pairs, seconds) if n else None


def measure_steps(llm: LLM, seed: int) -> list[tuple[int, int, int, int, float]]:
    """Step samples over the grid (each configuration run twice, the first pass compiling)."""
    engine = llm.llm_engine
    vocab = engine.model_config.vocab_size
    rng = np.random.default_rng(seed)
    samples = []
    for n in FIT_BATCHES:
        for length in FIT_PROMPT_LENS:
            for timed in (False, True):
                params = SamplingParams(temperature=0.0, max_tokens=FIT_DECODE_STEPS + 1, ignore_eos=True)
                for i, prompt in enumerate(random_prompts(rng, n, length, vocab)):
                    engine.add_request(f"fit-{n}-{length}-{timed}-{i}", prompt, params)
                while engine.has_unfinished_requests():
                    sample = _step_sample(engine)
                    if timed and sample is not None:
                        samples.append(sample)
    return samples


def fit_cost(samples) -> dict:
    """Non-negative least squares for ``a, b, c, p, r`` (seconds per step, per sequence, per decode context
    token, per prefill token, per prefill query x key pair), weighing each step by 1 / its time so that the
    fast decode steps count as much as the slow prefill ones (a relative-error fit)."""
    x = np.array([[1.0, *sample[:4]] for sample in samples])
    y = np.array([sample[4] for sample in samples])
    coef, _ = scipy.optimize.nnls(x / y[:, None], np.ones_like(y))
    rel = np.abs(x @ coef - y) / y
    return {"a_s": coef[0], "b_s_per_seq": coef[1], "c_s_per_context_token": coef[2],
            "p_s_per_prefill_token": coef[3], "r_s_per_prefill_pair": coef[4],
            "median_relative_error": float(np.median(rel)), "num_samples": len(samples)}


# ------------------------------------------------------------------------------------------ simulating
def simulate(workload, cost, *, batching: str, max_num_seqs: int, max_num_batched_tokens: int, max_len: int,
             static_batch_timeout_s: float) -> dict:
    """Replay ``workload`` through the real scheduler on a simulated clock; E2E P50 and throughput."""
    clock = [0.0]
    config = SchedulerConfig(max_num_seqs=max_num_seqs, max_num_batched_tokens=max_num_batched_tokens,
                             max_model_len=max_len, batching=batching, static_batch_timeout_s=static_batch_timeout_s)
    blocks_needed = sum(-(-(len(r.prompt_token_ids) + r.output_len) // 16) for r in workload) + 2
    scheduler = Scheduler(config, BlockManager(blocks_needed, 16, enable_prefix_caching=False), clock=lambda: clock[0])
    pending = sorted(workload, key=lambda r: r.arrival_s)
    finish: dict[str, float] = {}
    nxt = 0
    while len(finish) < len(workload):
        while nxt < len(pending) and pending[nxt].arrival_s <= clock[0]:
            r = pending[nxt]
            params = SamplingParams(temperature=0.0, max_tokens=r.output_len, ignore_eos=True)
            scheduler.add(Sequence(nxt, r.request_id, 0, list(r.prompt_token_ids), params, 0, r.arrival_s))
            nxt += 1
        plan = scheduler.schedule()
        if plan.is_empty:  # idle, or a static batch still forming: jump to the next event
            wake = pending[nxt].arrival_s if nxt < len(pending) else math.inf
            if scheduler.waiting:
                wake = min(wake, min(s.arrival_time for s in scheduler.waiting) + static_batch_timeout_s)
            clock[0] = max(wake, clock[0] + 1e-6)
            continue
        decodes = [s for s in plan.scheduled if s.num_new_tokens == 1 and s.samples]
        prefill = sum(s.num_new_tokens for s in plan.scheduled) - len(decodes)
        context = sum(s.seq.num_tokens for s in decodes)
        pairs = sum(s.num_new_tokens * (s.seq.num_computed_tokens + (s.num_new_tokens + 1) / 2)
                    for s in plan.scheduled if not (s.num_new_tokens == 1 and s.samples))
        clock[0] += cost(len(plan.scheduled), context, prefill, pairs)
        for s in plan.scheduled:
            seq = s.seq
            computed = seq.num_computed_tokens + s.num_new_tokens
            if s.samples:
                seq.token_ids.append(0)
            scheduler.commit_computed(seq, computed)
            if seq.num_output_tokens >= seq.params.max_tokens:
                scheduler.remove(seq)
                finish[seq.request_id] = clock[0]
    e2e = [finish[r.request_id] - r.arrival_s for r in workload]
    return {"e2e_p50_s": float(np.percentile(e2e, 50)),
            "output_throughput_tok_s": sum(r.output_len for r in workload) / max(finish.values())}


def run(args) -> dict:
    spec = workload_spec(args)
    llm = LLM(model=args.model, dtype=args.dtype, max_model_len=max(spec.max_len, max(FIT_PROMPT_LENS) + 64),
              max_num_seqs=max(args.max_num_seqs, max(FIT_BATCHES)), max_num_batched_tokens=args.max_num_batched_tokens,
              enable_prefix_caching=False, seed=args.seed)
    fit = fit_cost(measure_steps(llm, args.seed))
    a, b, c, p, r = (fit[k] for k in ("a_s", "b_s_per_seq", "c_s_per_context_token", "p_s_per_prefill_token",
                                      "r_s_per_prefill_pair"))
    models = {
        "fitted": lambda n, ctx, pre, pairs: a + b * n + c * ctx + p * pre + r * pairs,
        "attention free (c=r=0)": lambda n, ctx, pre, pairs: a + b * n + p * pre,
        "batching free (a+b)": lambda n, ctx, pre, pairs: a + b,
    }
    rows, results = [], []
    for rate in args.rates:
        workload = make_workload(WorkloadSpec(spec.num_requests, rate, spec.burstiness, spec.input_len_range,
                                              spec.output_len_range, spec.seed), llm.llm_engine.model_config.vocab_size)
        for name, cost in models.items():
            sim = {mode: simulate(workload, cost, batching=mode, max_num_seqs=args.max_num_seqs,
                                  max_num_batched_tokens=args.max_num_batched_tokens, max_len=spec.max_len,
                                  static_batch_timeout_s=args.static_batch_timeout) for mode in serve.MODES}
            ratio = sim["static"]["e2e_p50_s"] / sim["continuous"]["e2e_p50_s"]
            thr = sim["continuous"]["output_throughput_tok_s"] / sim["static"]["output_throughput_tok_s"]
            results.append({"rate": rate, "cost_model": name, **{m: sim[m] for m in serve.MODES},
                            "e2e_p50_static_over_continuous": ratio, "throughput_continuous_over_static": thr})
            rows.append([rate, name, sim["static"]["e2e_p50_s"] * 1e3, sim["continuous"]["e2e_p50_s"] * 1e3, ratio, thr])
    print(f"fitted step time: {a * 1e3:.2f} ms + {b * 1e3:.3f} ms/seq + {c * 1e6:.3f} us/decode context token + "
          f"{p * 1e3:.3f} ms/prefill token + {r * 1e9:.2f} ns/prefill query-key pair (median relative error "
          f"{fit['median_relative_error']:.2f}, {fit['num_samples']} steps)")
    report.print_table(
        f"modelled serving (real scheduler, simulated clock): {spec.num_requests} requests, input "
        f"{spec.input_len_range[0]}..{spec.input_len_range[1]}, output {spec.output_len_range[0]}..{spec.output_len_range[1]}, "
        f"max_num_seqs {args.max_num_seqs} (target: P50 static/continuous >= 2.6x)",
        ["rate", "step-cost model", "static E2E P50 ms", "cont E2E P50 ms", "P50 static/cont", "throughput cont/static"],
        rows)
    payload = {"benchmark": "serve-model", "machine": hardware.machine_info(), "fit": fit,
               "workload": {"num_requests": spec.num_requests, "burstiness": spec.burstiness,
                            "input_len_range": spec.input_len_range, "output_len_range": spec.output_len_range,
                            "seed": spec.seed, "max_num_seqs": args.max_num_seqs,
                            "max_num_batched_tokens": args.max_num_batched_tokens,
                            "static_batch_timeout_s": args.static_batch_timeout},
               "results": results}
    report.write_json(args.output, payload)
    return payload


def add_arguments(p) -> None:
    serve.add_arguments(p)
    p.add_argument("--rates", type=report.positive_float, nargs="+", default=[2.0, 4.0, 8.0, 16.0], help="arrival rates to model (used instead of --rate)")
