"""``jaxinfer-bench serve``: online serving under Poisson arrivals, static vs continuous batching.

A workload is a list of requests, each with an arrival time (gaps drawn from a gamma distribution of shape
``--burstiness`` and mean ``1 / --rate``; shape 1 is a Poisson process), a prompt of random token ids and an
output length (fixed, or uniform over a range). One thread replays it against the wall clock: before every
``engine.step()`` it adds each request whose arrival time has passed, stamped with that arrival time in the
engine's clock (``time.monotonic``), so time spent queued behind a running step counts as latency, exactly as
in a server. When nothing runs or waits it sleeps until the next arrival. Decoding is greedy with
``ignore_eos``, so every request produces exactly its output length.

The same engine replays the same schedule ``--passes`` times (default 3), each pass with other prompt tokens
(so no pass hits what an earlier one left in the prefix cache): pass 1 is what a user meets right after
``LLM(...)`` returns, the last pass is the steady state; both are reported. The engine compiles its whole
shape plan at construction, so no pass should compile anything: the compilations during each pass and
the time spent in steps that compiled ("compile stall") are reported, so one would show.

``--url URL`` sends the same workload through an OpenAI-compatible HTTP server instead (any: jaxinfer, vLLM,
SGLang), ``--launch`` starts ``jaxinfer serve`` for it; both time requests on the client side
(``bench/serve_http.py``). ``--vs-vllm`` starts ``vllm serve``, then ``jaxinfer serve``, and prints them side
by side (``bench/vllm_serve.py``).

Reported per run: TTFT, TPOT (``(finish - first token) / (n_out - 1)``), ITL (gaps between a request's
consecutive tokens, as seen by the driver after each step) and end-to-end latency, each at P50/P90/P99;
output throughput over the makespan (first arrival to last finish); batch occupancy (sequences running in
each step) over time. ``--compare`` runs static and continuous batching on the identical schedule (fresh
engine each) and prints their ratios.

Default scenario (the seed experiment, 32 requests), chosen to represent it rather than to hit a number:
- output lengths uniform over 16..256 tokens: the variance of output lengths is what static batching pays
  for, since a static batch holds every slot until its longest request ends;
- prompts uniform over 32..256 tokens (chat-sized prompts, prefill a minor share of the work);
- ``--rate 4`` req/s, Poisson: the 32 requests arrive over ~8 s and offer 4 x 136 = ~540 output tok/s.
  On the 2-core CPU with the embedded ~6M-parameter model a decode step measured ~8 ms at 4 sequences,
  ~16 ms at 12 and ~24 ms at 32 (quiet machine), so a continuous batcher can serve that load at a batch
  of ~10-15 (loaded, not saturated), while a static batcher lets the queue grow behind each batch's
  longest request. On a machine shared with other jobs the same rate can saturate: compare
  ``output_throughput_tok_s`` with the offered load before reading the latencies;
- ``max_num_seqs=32`` (every request could share one batch, so static batching is not capped artificially)
  and the engine's default ``static_batch_timeout_s=0.5``: an idle static batcher waits at most 0.5 s to
  fill a batch; under load the queue is older than that whenever a batch ends, so it rarely matters.
"""

from __future__ import annotations

import bisect
import dataclasses
import gc
import math
import time
from typing import Callable

import numpy as np

from bench import hardware, report, serve_http, vllm_serve
from bench.workload import (DEFAULT_INPUT_LEN_RANGE, DEFAULT_OUTPUT_LEN_RANGE, TimedRequest, WorkloadSpec,
                            engine_kwargs, make_workload, percentiles, workload_spec)
from jaxinfer import LLM, SamplingParams
from jaxinfer.outputs import RequestOutput

MODES = ("static", "continuous")
_POLL_S = 0.001  # how long the driver sleeps while a static batch is still forming


def greedy_params(req: TimedRequest) -> SamplingParams:
    return SamplingParams(temperature=0.0, max_tokens=req.output_len, ignore_eos=True)


# -------------------------------------------------------------------------------------------- the driver
@dataclasses.dataclass(frozen=True)
class StepSample:
    time_s: float  # when the step returned, seconds after the start of the run
    num_running: int  # sequences in the batch of this step
    num_waiting: int  # requests queued when it returned (in the engine, or arrived during the step)
    duration_s: float  # wall time of engine.step()
    compiled: bool  # something compiled during the step (never, once the plan is compiled at start)


@dataclasses.dataclass
class Trace:
    start: float  # engine clock (time.monotonic) at offset 0 of the schedule
    outputs: dict[str, RequestOutput]  # final output of every request
    token_times: dict[str, list[float]]  # engine-clock time at which each output token was seen
    steps: list[StepSample]
    num_compilations_before: int
    num_compilations_after: int


def replay(engine, workload: list[TimedRequest], params_for: Callable[[TimedRequest], SamplingParams] = greedy_params) -> Trace:
    """Replay ``workload`` against the wall clock in this thread; return when every request finished."""
    pending = sorted(workload, key=lambda r: r.arrival_s)
    arrivals = [r.arrival_s for r in pending]
    token_times: dict[str, list[float]] = {r.request_id: [] for r in workload}
    outputs: dict[str, RequestOutput] = {}
    steps: list[StepSample] = []
    compilations_before = engine.stats()["num_compilations_after_start"]
    nxt = 0
    start = time.monotonic()
    while True:
        now = time.monotonic()
        while nxt < len(pending) and start + pending[nxt].arrival_s <= now:
            r = pending[nxt]
            engine.add_request(r.request_id, {"prompt_token_ids": list(r.prompt_token_ids)}, params_for(r),
                               arrival_time=start + r.arrival_s)
            nxt += 1
        next_arrival = start + pending[nxt].arrival_s if nxt < len(pending) else math.inf
        if not engine.has_unfinished_requests():
            if nxt == len(pending):
                break
            time.sleep(max(0.0, next_arrival - time.monotonic()))
            continue
        stats = engine.stats()
        t_step = time.monotonic()
        outs = engine.step()
        t = time.monotonic()
        steps_before, compiled_before = stats["num_steps"], stats["num_compilations_after_start"]
        stats = engine.stats()
        if stats["num_steps"] == steps_before:  # nothing scheduled: a static batch is still forming
            time.sleep(max(0.0, min(_POLL_S, next_arrival - t)))
            continue
        num_finished = 0
        for out in outs:
            times = token_times[out.request_id]
            times.extend([t] * (len(out.outputs[0].token_ids) - len(times)))
            if out.finished:
                outputs[out.request_id] = out
                num_finished += 1
        arrived_during_step = bisect.bisect_right(arrivals, t - start) - nxt
        steps.append(StepSample(t - start, stats["num_running"] + num_finished,
                                stats["num_waiting"] + arrived_during_step, t - t_step,
                                stats["num_compilations_after_start"] > compiled_before))
    return Trace(start, outputs, token_times, steps, compilations_before,
                 engine.stats()["num_compilations_after_start"])


# ------------------------------------------------------------------------------------------------ metrics
def summarize(trace: Trace, workload: list[TimedRequest]) -> dict:
    """Per-request records, latency percentiles, throughput and the occupancy timeline of one replay."""
    missing = [r.request_id for r in workload if r.request_id not in trace.outputs]
    if missing:
        raise RuntimeError(f"{len(missing)} requests did not finish: {missing[:5]}")
    requests, itl = [], []
    for r in workload:
        out = trace.outputs[r.request_id]
        m = out.metrics
        n_out = len(out.outputs[0].token_ids)
        requests.append({
            "request_id": r.request_id, "arrival_s": r.arrival_s, "input_len": len(r.prompt_token_ids),
            "output_len": n_out, "requested_output_len": r.output_len,
            "queue_s": m.first_scheduled_time - m.arrival_time,
            "ttft_s": m.first_token_time - m.arrival_time,
            "tpot_s": (m.finished_time - m.first_token_time) / (n_out - 1) if n_out > 1 else None,
            "e2e_s": m.finished_time - m.arrival_time,
            "num_cached_tokens": m.num_cached_tokens,
        })
        itl.extend(np.diff(trace.token_times[r.request_id]).tolist())
    last_finish = max(trace.outputs[r.request_id].metrics.finished_time for r in workload)
    makespan = last_finish - trace.start
    total_out = sum(q["output_len"] for q in requests)
    running = [s.num_running for s in trace.steps]
    return {
        "num_requests": len(workload),
        "total_input_tokens": sum(q["input_len"] for q in requests),
        "total_output_tokens": total_out,
        "makespan_s": makespan,
        "output_throughput_tok_s": total_out / makespan,
        "request_throughput_req_s": len(workload) / makespan,
        "ttft_s": percentiles(q["ttft_s"] for q in requests),
        "tpot_s": percentiles(q["tpot_s"] for q in requests if q["tpot_s"] is not None),
        "itl_s": percentiles(itl),
        "e2e_s": percentiles(q["e2e_s"] for q in requests),
        "queue_s": percentiles(q["queue_s"] for q in requests),
        "num_steps": len(trace.steps),
        "mean_batch_occupancy": float(np.mean(running)) if running else 0.0,
        "max_batch_occupancy": max(running, default=0),
        "num_compilations_during_run": trace.num_compilations_after - trace.num_compilations_before,
        "compile_stall_s": sum(s.duration_s for s in trace.steps if s.compiled),
        "occupancy": [dataclasses.asdict(s) for s in trace.steps],
        "requests": requests,
    }


# ----------------------------------------------------------------------------------------------- running
def measure(llm: LLM, build_workload: Callable[[int, str], list[TimedRequest]], passes: int,
            params_for: Callable[[TimedRequest], SamplingParams] = greedy_params) -> dict:
    """Replay the workload ``passes`` times on ``llm``'s engine and summarize each pass.

    ``build_workload(token_variant, id_prefix)`` must give the same schedule and lengths for every variant
    and different tokens (so nothing a pass computes is in the prefix cache from an earlier one): the last
    pass replays variant 0 with ids "req-*", earlier pass k variant k + 1. Returns the last pass's summary
    (the steady state) with ``first_pass``, the first pass's summary without its per-request records (what a
    user meets right after start).
    """
    engine = llm.llm_engine
    summaries = []
    for k in range(passes):
        stats_before = engine.stats()
        last = k == passes - 1
        workload = build_workload(0, "req") if last else build_workload(k + 1, f"pass{k}")
        summary = summarize(replay(engine, workload, params_for), workload)
        stats_after = engine.stats()
        summary["stats_during_run"] = {key: v - stats_before[key] for key, v in stats_after.items()
                                       if isinstance(v, (int, float)) and not isinstance(v, bool) and key not in
                                       ("free_blocks", "total_blocks", "num_running", "num_waiting")}
        summaries.append(summary)
    steady = summaries[-1]
    first = {key: v for key, v in summaries[0].items() if key not in ("requests", "occupancy")}
    steady["first_pass"] = first
    steady["passes"] = [{"e2e_p50_s": r["e2e_s"]["p50"], "ttft_p50_s": r["ttft_s"]["p50"],
                         "output_throughput_tok_s": r["output_throughput_tok_s"],
                         "num_compilations_during_run": r["num_compilations_during_run"]} for r in summaries]
    steady["num_compilations_after_start"] = engine.stats()["num_compilations_after_start"]
    return steady


def _ms(x: float) -> float:
    return x * 1e3


def _print_runs(runs: dict, spec: WorkloadSpec, args, model_info: dict) -> None:
    rows = []
    for mode, steady in runs.items():
        for label, r in (("first pass", steady["first_pass"]), (f"pass {len(steady['passes'])}", steady)):
            rows.append([mode, label, _ms(r["e2e_s"]["p50"]), _ms(r["e2e_s"]["p90"]), _ms(r["e2e_s"]["p99"]),
                         _ms(r["ttft_s"]["p50"]), _ms(r["ttft_s"]["p99"]), _ms(r["tpot_s"]["p50"]),
                         _ms(r["itl_s"]["p50"]), _ms(r["itl_s"]["p99"]), r["output_throughput_tok_s"],
                         r["makespan_s"], r["mean_batch_occupancy"], r["num_compilations_during_run"],
                         r["compile_stall_s"]])
    report.print_table(
        f"serving — {model_info['model']} ({model_info['num_params'] / 1e6:.1f}M params, {model_info['dtype']}); "
        f"{spec.num_requests} requests at {spec.rate} req/s (burstiness {spec.burstiness}), input "
        f"{spec.input_len_range[0]}..{spec.input_len_range[1]}, output {spec.output_len_range[0]}.."
        f"{spec.output_len_range[1]} tokens (offered {spec.offered_output_tok_s:.0f} out tok/s), max_num_seqs "
        f"{args.max_num_seqs}",
        ["batching", "pass", "E2E P50 ms", "E2E P90 ms", "E2E P99 ms", "TTFT P50 ms", "TTFT P99 ms", "TPOT P50 ms",
         "ITL P50 ms", "ITL P99 ms", "out tok/s", "makespan s", "mean batch", "compiles", "compile stall s"],
        rows)


def compare_ratios(static: dict, continuous: dict) -> dict:
    """The seed experiment's ratios: latency static/continuous (higher = continuous better), throughput
    continuous/static."""
    return {
        "e2e_p50_static_over_continuous": static["e2e_s"]["p50"] / continuous["e2e_s"]["p50"],
        "e2e_p90_static_over_continuous": static["e2e_s"]["p90"] / continuous["e2e_s"]["p90"],
        "e2e_p99_static_over_continuous": static["e2e_s"]["p99"] / continuous["e2e_s"]["p99"],
        "ttft_p50_static_over_continuous": static["ttft_s"]["p50"] / continuous["ttft_s"]["p50"],
        "throughput_continuous_over_static": continuous["output_throughput_tok_s"] / static["output_throughput_tok_s"],
    }


def run(args) -> dict:
    if args.vs_vllm:  # vllm serve and jaxinfer serve, one after the other, under the same workload
        return vllm_serve.run(args)
    if args.url or args.launch:  # the same workload through an OpenAI-compatible HTTP server
        return serve_http.run(args)
    spec = workload_spec(args)
    modes = MODES if args.compare else (args.batching,)
    runs, model_info = {}, {}
    for mode in modes:
        llm = LLM(model=args.model, **engine_kwargs(args, spec, batching=mode,
                                                    static_batch_timeout_s=args.static_batch_timeout))
        engine = llm.llm_engine
        model_info = {"model": engine.model_source, "num_params": engine.model_config.num_params,
                      "dtype": np.dtype(engine.dtype).name}
        vocab = engine.model_config.vocab_size
        runs[mode] = {"batching": mode, "start_s": engine.warm_up_report.seconds if engine.warm_up_report else None,
                      **measure(llm, lambda variant, prefix: make_workload(spec, vocab, variant, prefix), args.passes)}
        del llm, engine
        gc.collect()
    _print_runs(runs, spec, args, model_info)
    ratios = None
    if args.compare:
        ratios = compare_ratios(runs["static"], runs["continuous"])
        ratios["first_pass"] = compare_ratios(runs["static"]["first_pass"], runs["continuous"]["first_pass"])
        report.print_table(
            "static / continuous (seed, vLLM A100: P50 6.36->2.41 s = 2.64x, throughput 717->705 tok/s = 0.98x; "
            "target P50 >= 2.6x at throughput within 5%)",
            ["pass", "E2E P50 static/cont", "E2E P90 static/cont", "E2E P99 static/cont", "TTFT P50 static/cont",
             "throughput cont/static"],
            [["first", *ratios["first_pass"].values()],
             ["steady", *[v for k, v in ratios.items() if k != "first_pass"]]])
    plots = {}
    if args.plot:
        from bench import plots as plots_lib

        plots = plots_lib.serving_plots(runs, args.plot, prefix="serve")
    payload = {"benchmark": "serve", "machine": hardware.machine_info(), **model_info,
               "workload": {**dataclasses.asdict(spec), "offered_output_tok_s": spec.offered_output_tok_s},
               "engine": {"max_num_seqs": args.max_num_seqs, "max_num_batched_tokens": args.max_num_batched_tokens,
                          "static_batch_timeout_s": args.static_batch_timeout, "max_model_len": spec.max_len},
               "passes": args.passes, "runs": runs, "ratios": ratios, "plots": plots}
    report.write_json(args.output, payload)
    return payload


def add_common_arguments(p) -> None:
    """Arguments shared by ``serve`` and ``prefix``."""
    p.add_argument("--model", default=None, help="model dir / random:<preset>; default: the embedded model")
    p.add_argument("--dtype", default="auto")
    p.add_argument("--num-requests", type=int, default=32)
    p.add_argument("--max-num-seqs", type=int, default=32)
    p.add_argument("--max-num-batched-tokens", type=int, default=2048)
    p.add_argument("--max-model-len", type=int, default=None,
                   help="engine max_model_len (default: what the workload needs); equal settings across benches "
                        "share compiled executables through the on-disk cache")
    p.add_argument("--burstiness", type=float, default=1.0, help="gamma shape of the arrival gaps; 1.0 = Poisson")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--passes", type=report.positive_int, default=3,
                   help="replay the schedule (other prompt tokens each time) N times on the same engine; the first "
                        "and the last pass are reported (first use after start vs steady state)")
    p.add_argument("--plot", default=None, metavar="DIR", help="write PNG plots into DIR")
    p.add_argument("--output", default=None, help="write the results as JSON here")


def add_arguments(p) -> None:
    add_common_arguments(p)
    p.add_argument("--rate", type=float, default=4.0, help="mean arrival rate, requests/s (inf = all at once)")
    inp = p.add_mutually_exclusive_group()
    inp.add_argument("--input-len", type=int, default=None, help="fixed prompt length")
    inp.add_argument("--input-len-range", type=int, nargs=2, metavar=("LO", "HI"), default=None,
                     help=f"uniform prompt length (default {DEFAULT_INPUT_LEN_RANGE[0]} {DEFAULT_INPUT_LEN_RANGE[1]})")
    out = p.add_mutually_exclusive_group()
    out.add_argument("--output-len", type=int, default=None, help="fixed output length")
    out.add_argument("--output-len-range", type=int, nargs=2, metavar=("LO", "HI"), default=None,
                     help=f"uniform output length (default {DEFAULT_OUTPUT_LEN_RANGE[0]} {DEFAULT_OUTPUT_LEN_RANGE[1]})")
    p.add_argument("--batching", choices=MODES, default="continuous")
    p.add_argument("--compare", action="store_true", help="run static and continuous on the same schedule")
    p.add_argument("--static-batch-timeout", type=float, default=0.5,
                   help="static batching: longest wait to fill a batch when the engine is idle (s)")
    serve_http.add_arguments(p)
    vllm_serve.add_arguments(p.add_argument_group("vllm serve beside jaxinfer serve"))
