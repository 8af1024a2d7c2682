"""``jaxinfer-bench startup``: what a user waits for — starting the engine, then the first ``generate``.

Each measurement runs in a fresh Python process (nothing warm in memory): the process imports jaxinfer,
constructs ``LLM(...)`` (which compiles, or loads from the on-disk cache, every executable of the shape plan
and runs each once), then calls ``generate`` five times per batch size (1 and 16) and prompt length,
``--output-len`` greedy tokens each. Prompt lengths (``--prompt-lens``): ``short`` (a few tokens, under one
KV block, the same every call) and lengths in tokens (default 400): each call's prompts start with a
different first line (a different first token without a tokenizer), so the prefix cache plays no part and
every call prefills the whole prompt, as a user's new requests would. Reported per configuration (no
speculation, n-gram speculation): the start time (import + ``LLM``) with an empty compilation cache ("cold")
and again with the cache that run left behind ("warm"), how many executables were compiled or loaded, the
first call against the fifth (and the first call's mean TTFT against the fifth's), and the compilations
after start (must be 0).

Targets (this CPU, embedded model): cold start <= 30 s, warm start <= 5 s, first call within 1.3x of the 5th.
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
import time

from bench import report  # imports no JAX: the measuring process times its own imports

CODE = ("def fibonacci(n):\n    if n < 2:\n        return n\n    return fibonacci(n - 1) + fibonacci(n - 2)\n\n\n"
        "class Stack:\n    def __init__(self):\n        self.items = []\n\n    def push(self, item):\n"
        "        self.items.append(item)\n\n    def pop(self):\n        return self.items.pop()\n\n\n")
PROMPTS = ["def fibonacci(n):", "import os\n", "class Stack:", "for i in range(", "# Copyright",
           "def main():", "return self.", "if __name__ =="]
CONFIGS = {
    "plain": None,
    "ngram": {"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_max": 4, "prompt_lookup_min": 2},
}


def child(args: dict) -> dict:
    """One process's measurement (run with ``--child``). The start time counts from the moment the parent
    launched the process (interpreter start-up and every import included) to ``LLM(...)`` returning."""
    t0 = time.perf_counter()
    from jaxinfer import LLM, SamplingParams

    t_import = time.perf_counter() - t0
    llm = LLM(model=args["model"], speculative_config=args["speculative_config"],
              compilation_cache_dir=args["cache_dir"], **args["engine"])
    t_start = time.time() - args["launched_at"]
    engine = llm.llm_engine
    params = SamplingParams(temperature=0.0, max_tokens=args["output_len"], ignore_eos=True)
    calls, ttft = {}, {}
    for batch in args["batch_sizes"]:
        for prompt_len in args["prompt_lens"]:
            seconds, first_token = [], []
            for call in range(args["calls"]):
                prompts = [{"prompt_token_ids": ids} for ids in _prompt_ids(engine, batch, prompt_len, call)]
                t = time.perf_counter()
                outs = llm.generate(prompts, params, use_tqdm=False)
                seconds.append(time.perf_counter() - t)
                first_token.append(sum(o.metrics.time_to_first_token for o in outs) / len(outs))
            calls[case_name(batch, prompt_len)], ttft[case_name(batch, prompt_len)] = seconds, first_token
    r = engine.warm_up_report
    return {"import_s": t_import, "start_s": t_start, "warm_up_s": r.seconds, "first_runs_s": r.first_run_seconds,
            "executables": r.num_executables, "from_cache": r.num_from_cache, "calls_s": calls,
            "mean_ttft_s": ttft, "compilations_after_start": engine.stats()["num_compilations_after_start"]}


def case_name(batch: int, prompt_len: str | int) -> str:
    return f"b{batch}" if prompt_len == "short" else f"b{batch}p{prompt_len}"


def _prompt_ids(engine, batch: int, prompt_len: str | int, call: int) -> list[list[int]]:
    """``short``: prompts under one KV block (a repeated call finds nothing in the prefix cache), the same every
    call. A length: ``prompt_len`` tokens of code after a first line that names the call and the request, so
    no two prompts of the run share a KV block. Text through the tokenizer when the model has one, else ids."""
    vocab = engine.model_config.vocab_size
    if prompt_len == "short":
        if engine.tokenizer is not None:
            return [engine.tokenizer.encode(PROMPTS[i % len(PROMPTS)]) for i in range(batch)]
        return [[(7 * i + j) % vocab for j in range(1, 6)] for i in range(batch)]
    out = []
    for i in range(batch):
        if engine.tokenizer is None:
            first = 1 + (call * batch + i) % (vocab - 1)
            out.append([first] + [(13 * j + 5) % vocab for j in range(prompt_len - 1)])
            continue
        text = f"# call {call}, request {i}: a first line no other prompt has\n"
        ids = engine.tokenizer.encode(text + CODE)
        while len(ids) < prompt_len:
            ids += engine.tokenizer.encode(CODE)
        out.append(ids[:prompt_len])
    return out


def _run_child(model, spec, cache_dir: str, args) -> dict:
    engine = {"max_num_seqs": args.max_num_seqs, "max_num_batched_tokens": args.max_num_batched_tokens,
              "dtype": args.dtype}
    payload = json.dumps({"model": model, "speculative_config": spec, "cache_dir": cache_dir, "engine": engine,
                          "output_len": args.output_len, "calls": args.calls, "batch_sizes": args.batch_sizes,
                          "prompt_lens": args.prompt_lens, "launched_at": time.time()})
    proc = subprocess.run([sys.executable, "-m", "bench.startup", "--child", payload], capture_output=True,
                          text=True)
    if proc.returncode != 0:
        raise RuntimeError(f"the measuring process failed:\n{proc.stderr[-4000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def run(args) -> dict:
    from bench import hardware

    results, rows = [], []
    for name in args.configs:
        with tempfile.TemporaryDirectory(prefix="jaxinfer-startup-") as cache_dir:
            for cache in ("cold", "warm"):  # the warm run finds what the cold one stored
                r = _run_child(args.model, CONFIGS[name], cache_dir, args)
                r.update(config=name, cache=cache)
                row = [name, cache, r["start_s"], r["import_s"], r["warm_up_s"], r["executables"], r["from_cache"]]
                for case, seconds in r["calls_s"].items():
                    r[f"{case}_first_over_last"] = seconds[0] / seconds[-1]
                    first_ttft, last_ttft = r["mean_ttft_s"][case][0], r["mean_ttft_s"][case][-1]
                    r[f"{case}_ttft_first_over_last"] = first_ttft / last_ttft
                    row += [seconds[0] * 1e3, seconds[-1] * 1e3, seconds[0] / seconds[-1], first_ttft / last_ttft]
                results.append(r)
                rows.append(row + [r["compilations_after_start"]])
    cases = [case_name(b, p) for b in args.batch_sizes for p in args.prompt_lens]
    calls = [h for c in cases for h in (f"{c} first ms", f"{c} call {args.calls} ms", f"{c} ratio", f"{c} TTFT ratio")]
    report.print_table(
        f"start-up — {args.model or 'embedded default model'}, {args.output_len} greedy tokens per call, each row "
        "a fresh process; bN = batch N, pL = L-token prompts, new every call (targets: cold <= 30 s, warm <= 5 s, "
        "first call <= 1.3x the last)",
        ["config", "cache", "start s", "import s", "warm-up s", "executables", "from cache", *calls,
         "compiles after start"], rows)
    payload = {"benchmark": "startup", "machine": hardware.machine_info(), "model": args.model, "dtype": args.dtype,
               "output_len": args.output_len, "calls": args.calls, "prompt_lens": args.prompt_lens,
               "results": results}
    report.write_json(args.output, payload)
    return payload


def add_arguments(p) -> None:
    p.add_argument("--model", default=None, help="model dir / random:<preset>; default: the embedded model")
    p.add_argument("--configs", nargs="+", default=list(CONFIGS), choices=list(CONFIGS))
    p.add_argument("--output-len", type=report.positive_int, default=96)
    p.add_argument("--calls", type=report.positive_int, default=5, help="identical generate calls per batch size")
    p.add_argument("--batch-sizes", type=report.positive_int, nargs="+", default=[1, 16])
    p.add_argument("--prompt-lens", type=_prompt_len, nargs="+", default=["short", 400],
                   help="'short' (a few tokens, the same every call) and/or prompt lengths in tokens (new prompts "
                        "every call)")
    p.add_argument("--max-num-seqs", type=report.positive_int, default=64, help="engine setting (plan size)")
    p.add_argument("--max-num-batched-tokens", type=report.positive_int, default=2048, help="engine setting")
    p.add_argument("--dtype", default="auto", help="engine setting (bfloat16 on a CPU: bfloat16 weights, float32 "
                   "compute)")
    p.add_argument("--output", default=None, help="write the results as JSON here")


def _prompt_len(text: str) -> str | int:
    return "short" if text == "short" else report.positive_int(text)


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "--child":
        print(json.dumps(child(json.loads(sys.argv[2]))))
