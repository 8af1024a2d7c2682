"""``jaxinfer-bench prefix``: many requests sharing one long document, prefix caching off vs on.

Workload (the seed experiment): ``--num-requests`` requests (default 32), each a ``--doc-len``-token document
(default 500 random token ids, the same for every request) followed by a distinct question of 10..20 random
tokens, asking for ``--output-len`` tokens (default 16, greedy, ``ignore_eos``). All arrive at once unless
``--rate`` is given (Poisson). The same schedule runs on two fresh engines, ``enable_prefix_caching=False``
then ``True``; each engine replays it ``--passes`` times, each pass with another document (so every pass
starts with a cold cache for its own document): the first pass is what a user meets right after start,
the last one the steady state.

Reported: TTFT P50/P90/P99, end-to-end P50, output and total throughput, and the prefix-cache counters
of the timed run (``prefix_cache_hit_tokens`` / ``prefix_cache_query_tokens`` from ``engine.stats()``);
then the ratios off/on. With caching on, the first request computes the document; the rest reuse its full
blocks and compute only the last partial block plus their question (a full-prompt hit still recomputes
the last token).
"""

from __future__ import annotations

import dataclasses
import gc
import math

import numpy as np

from bench import hardware, report, serve
from bench.workload import TimedRequest, arrival_offsets, engine_kwargs
from jaxinfer import LLM


@dataclasses.dataclass(frozen=True)
class PrefixSpec:
    num_requests: int
    doc_len: int
    question_len_range: tuple[int, int]  # inclusive
    output_len: int
    rate: float  # requests per second; inf = all at once
    burstiness: float
    seed: int

    def __post_init__(self):
        if self.num_requests < 1 or self.doc_len < 1 or self.output_len < 1:
            raise ValueError("num_requests, doc_len and output_len must be >= 1")
        lo, hi = self.question_len_range
        if not 1 <= lo <= hi:
            raise ValueError(f"question_len_range must satisfy 1 <= low <= high, got {(lo, hi)}")
        if not self.rate > 0 or not self.burstiness > 0:
            raise ValueError("rate and burstiness must be > 0")

    @property
    def max_len(self) -> int:
        return self.doc_len + self.question_len_range[1] + self.output_len


def make_prefix_workload(spec: PrefixSpec, vocab_size: int, token_variant: int = 0,
                         id_prefix: str = "req") -> list[TimedRequest]:
    """One shared document per ``token_variant``, a distinct question per request; the schedule and the
    lengths depend only on ``spec``."""
    rng = np.random.default_rng([spec.seed, 2])
    arrivals = arrival_offsets(spec.num_requests, spec.rate, spec.burstiness, rng)
    q_lens = rng.integers(spec.question_len_range[0], spec.question_len_range[1] + 1, size=spec.num_requests)
    tok_rng = np.random.default_rng([spec.seed, 3, token_variant])
    doc = tok_rng.integers(0, vocab_size, size=spec.doc_len).tolist()
    return [
        TimedRequest(f"{id_prefix}-{i}", float(arrivals[i]),
                     tuple(doc + tok_rng.integers(0, vocab_size, size=int(q_lens[i])).tolist()), spec.output_len)
        for i in range(spec.num_requests)
    ]


def _label(caching: bool) -> str:
    return "caching on" if caching else "caching off"


def _ms(x: float) -> float:
    return x * 1e3


def _with_cache_figures(summary: dict) -> dict:
    during = summary["stats_during_run"]
    hit, query = during["prefix_cache_hit_tokens"], during["prefix_cache_query_tokens"]
    return {**summary, "prefix_cache_hit_tokens": hit, "prefix_cache_query_tokens": query,
            "prefix_cache_hit_rate": hit / query if query else 0.0,
            "total_throughput_tok_s": (summary["total_input_tokens"] + summary["total_output_tokens"])
            / summary["makespan_s"]}


def _ratios(off: dict, on: dict) -> dict:
    return {
        "ttft_p50_off_over_on": off["ttft_s"]["p50"] / on["ttft_s"]["p50"],
        "ttft_p90_off_over_on": off["ttft_s"]["p90"] / on["ttft_s"]["p90"],
        "e2e_p50_off_over_on": off["e2e_s"]["p50"] / on["e2e_s"]["p50"],
        "output_throughput_on_over_off": on["output_throughput_tok_s"] / off["output_throughput_tok_s"],
    }


def run(args) -> dict:
    spec = PrefixSpec(args.num_requests, args.doc_len, tuple(args.question_len_range), args.output_len,
                      args.rate, args.burstiness, args.seed)
    runs, model_info = {}, {}
    for caching in (False, True):
        llm = LLM(model=args.model, **engine_kwargs(args, spec, enable_prefix_caching=caching))
        engine = llm.llm_engine
        vocab = engine.model_config.vocab_size
        model_info = {"model": engine.model_source, "num_params": engine.model_config.num_params,
                      "dtype": np.dtype(engine.dtype).name}
        summary = serve.measure(llm, lambda variant, prefix: make_prefix_workload(spec, vocab, variant, prefix),
                                args.passes)
        summary["first_pass"] = _with_cache_figures(summary["first_pass"])
        runs[_label(caching)] = {"enable_prefix_caching": caching, **_with_cache_figures(summary)}
        del llm, engine
        gc.collect()

    rows = []
    for label, steady in runs.items():
        for pass_label, r in (("first", steady["first_pass"]), ("steady", steady)):
            rows.append([label, pass_label, _ms(r["ttft_s"]["p50"]), _ms(r["ttft_s"]["p90"]), _ms(r["ttft_s"]["p99"]),
                         _ms(r["e2e_s"]["p50"]), r["output_throughput_tok_s"], r["total_throughput_tok_s"],
                         f"{r['prefix_cache_hit_tokens']}/{r['prefix_cache_query_tokens']}", r["prefix_cache_hit_rate"],
                         r["num_compilations_during_run"], r["compile_stall_s"]])
    arrivals = "all at once" if math.isinf(spec.rate) else f"{spec.rate} req/s"
    report.print_table(
        f"prefix caching — {model_info['model']} ({model_info['num_params'] / 1e6:.1f}M params, "
        f"{model_info['dtype']}); {spec.num_requests} requests ({arrivals}) sharing a {spec.doc_len}-token document "
        f"+ {spec.question_len_range[0]}..{spec.question_len_range[1]}-token question, {spec.output_len} output tokens",
        ["prefix cache", "pass", "TTFT P50 ms", "TTFT P90 ms", "TTFT P99 ms", "E2E P50 ms", "out tok/s", "total tok/s",
         "hit/query tokens", "hit rate", "compiles", "compile stall s"], rows)
    off, on = runs[_label(False)], runs[_label(True)]
    ratios = _ratios(off, on)
    ratios["first_pass"] = _ratios(off["first_pass"], on["first_pass"])
    report.print_table(
        "caching off / on (seed, vLLM A100: TTFT P50 829->156 ms = 5.3x, throughput 835->1,412 tok/s = 1.69x; "
        "target TTFT >= 5x, throughput >= 1.5x)",
        ["pass", "TTFT P50 off/on", "TTFT P90 off/on", "E2E P50 off/on", "throughput on/off"],
        [[name, r["ttft_p50_off_over_on"], r["ttft_p90_off_over_on"], r["e2e_p50_off_over_on"],
          r["output_throughput_on_over_off"]] for name, r in (("first", ratios["first_pass"]), ("steady", ratios))])
    plots = {}
    if args.plot:
        from bench import plots as plots_lib

        plots = plots_lib.serving_plots(runs, args.plot, prefix="prefix")
    payload = {"benchmark": "prefix", "machine": hardware.machine_info(), **model_info,
               "workload": dataclasses.asdict(spec),
               "engine": {"max_num_seqs": args.max_num_seqs, "max_num_batched_tokens": args.max_num_batched_tokens,
                          "max_model_len": spec.max_len},
               "passes": args.passes, "runs": runs, "ratios": ratios, "plots": plots}
    report.write_json(args.output, payload)
    return payload


def add_arguments(p) -> None:
    serve.add_common_arguments(p)
    p.add_argument("--rate", type=float, default=math.inf, help="arrival rate, requests/s (default: all at once)")
    p.add_argument("--doc-len", type=int, default=500, help="tokens of the shared document")
    p.add_argument("--question-len-range", type=int, nargs=2, metavar=("LO", "HI"), default=(10, 20))
    p.add_argument("--output-len", type=int, default=16)
