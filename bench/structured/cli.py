"""``jaxinfer-bench structured``: structured outputs on the embedded default model, CPU or GPU.

1. validity (``bench.structured.validity``): the 26 schemas of ``bench.structured.schemas`` through
   ``jaxinfer serve`` and the openai SDK, ``response_format`` json_schema, at temperature 0 and 1, batch 1 and
   16; every output parsed and validated with ``jsonschema``;
2. cost, jump-forward and start-up (``bench.structured.engine_costs``), in process: TPOT constrained / free on
   the same prompts and lengths (batch 1 and 16; target <= 1.10), the host's mask time per token, jump-forward's
   end-to-end speedup on the schema with long fixed parts (target >= 1.3x, output identical) and on the whole
   suite, and ``LLM(...)`` start-up cold and warm with and without the masked token choosers.

The grammar backend's own per-token mask cost over tokenizers and schema sizes is ``jaxinfer-bench
structured-masks`` (``bench.structured.mask_cost``). A table on stdout, everything as JSON under ``--output``.
"""

from __future__ import annotations

import argparse
import json
import platform
import tempfile
import time
from pathlib import Path

PARTS = ("validity", "cost", "jump-forward", "startup")
ENGINE = dict(max_num_seqs=16, max_model_len=1024, max_num_batched_tokens=512)


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--parts", nargs="+", choices=PARTS, default=list(PARTS))
    p.add_argument("--repeats", type=int, default=3, help="alternated repetitions of the cost and jump-forward runs")
    p.add_argument("--max-tokens", type=int, default=700, help="max_tokens of each constrained request")
    p.add_argument("--output", default=None, help="write the results as JSON here")


def run(args: argparse.Namespace) -> dict:
    from bench.structured import engine_costs
    from bench.structured.schemas import SCHEMAS

    result: dict = {"machine": platform.processor() or platform.machine(), "engine": ENGINE,
                    "date": time.strftime("%Y-%m-%d %H:%M")}
    if "validity" in args.parts:
        result["validity"] = _validity(args)
        for row in result["validity"]:
            print(f"validity T={row['temperature']} batch {row['batch']:>2}: {row['valid_of_all']}/{row['requests']} "
                  f"valid ({row['finished']} finished, {row['valid_of_finished']} of them valid, "
                  f"{row['cut_by_length']} cut by max_tokens) in {row['seconds']} s")
    if {"cost", "jump-forward"} & set(args.parts):
        from jaxinfer import LLM

        t0 = time.perf_counter()
        llm = LLM(**ENGINE)
        result["engine_start_s"] = round(time.perf_counter() - t0, 2)
        if "cost" in args.parts:
            result["cost"] = [engine_costs.measure_cost(llm, b, args.repeats, args.max_tokens) for b in (1, 16)]
            for row in result["cost"]:
                print(f"cost batch {row['batch']:>2}: TPOT constrained {row['tpot_constrained_ms']} ms / free "
                      f"{row['tpot_free_ms']} ms = {row['ratio']} (median {row['ratio_median']}, first call "
                      f"{row['ratio_first_call']}; target <= 1.10); masks {row['mask_us_per_token']} us per token")
        if "cost" in args.parts:
            result["overlap"] = engine_costs.measure_overlap(llm, args.repeats, args.max_tokens)
            row = result["overlap"]
            print(f"masks in the device's shadow: {row['speedup_median']}x end to end at batch 16 (overlapped "
                  f"{row['seconds_overlapped']} s, after the step {row['seconds_after_step']} s)")
        if "jump-forward" in args.parts:
            fixed = [s for s in SCHEMAS if s[0] == "long_fixed_parts"]
            result["jump_forward"] = {
                "long_fixed_parts": engine_costs.measure_jump_forward(llm, fixed * 4, args.repeats, args.max_tokens),
                "suite": engine_costs.measure_jump_forward(llm, list(SCHEMAS[:16]), args.repeats, args.max_tokens)}
            for name, row in result["jump_forward"].items():
                print(f"jump-forward {name}: {row['speedup_median']}x end to end (off {row['seconds_off']} s, on "
                      f"{row['seconds_on']} s), {row['forced_tokens']} of {row['output_tokens']} tokens forced "
                      f"({row['forced_share']}), identical: {row['identical']}")
        del llm
    if "startup" in args.parts:
        result["startup"] = engine_costs.measure_startup(ENGINE)
        print("startup (s):", result["startup"])
    if args.output:
        Path(args.output).parent.mkdir(parents=True, exist_ok=True)
        Path(args.output).write_text(json.dumps(result, indent=1))
    return result


def _validity(args) -> list[dict]:
    import openai

    from bench.clients import server
    from bench.structured.validity import run_validity

    serve_args = ["--max-num-seqs", str(ENGINE["max_num_seqs"]), "--max-model-len", str(ENGINE["max_model_len"]),
                  "--max-num-batched-tokens", str(ENGINE["max_num_batched_tokens"])]
    log = Path(tempfile.mkdtemp(prefix="jaxinfer-structured-")) / "serve.log"
    served = server.start(serve_args, log)
    try:
        client = openai.OpenAI(base_url=served.url + "/v1", api_key="x", max_retries=0, timeout=600)
        return run_validity(client, served.model, max_tokens=args.max_tokens)
    finally:
        served.stop()
