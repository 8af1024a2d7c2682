"""``jaxinfer-bench spec``: speculative decoding off vs on, on a verbatim-copy task and a free continuation.

Copy task: the prompt holds a passage of Python source followed by its first lines again, so the natural
continuation repeats the passage (what prompt-lookup drafts can guess). Free task: the prompt is the start
of a different source file; the continuation is new text. Both use the embedded default model (greedy,
``--output-len`` tokens) at each batch size. Per configuration: tokens/s, speedup over no speculation,
acceptance rate, mean accepted length (tokens emitted per sequence per verification step) and the
per-position acceptance; plus whether the greedy tokens equal the non-speculative ones.

One engine per method stays up for the whole run (each compiled its shape plan at construction, so no
pass compiles anything). Per (task, batch size) each engine's first pass over the prompts is timed as
"first" — what a user meets on a first call — then it makes untimed passes until two in a row leave the
adaptive rule's choice (per batch-size bucket) unchanged, at most ``--warmup-passes``: the steady state of
a server, where the rule has measured both arms at this batch size and settled. Then ``--repeats`` rounds of
one timed pass per method, interleaved (off, n-gram, draft, off, ...), so that a drift in the machine's speed
(this CPU is shared) hits every method alike; steady tok/s comes from each method's median pass.
Compilations inside the timed passes are reported.
"""

from __future__ import annotations

import statistics
import sysconfig
import time
from pathlib import Path

from bench import hardware, report
from jaxinfer import LLM, SamplingParams
from jaxinfer.config.engine import DTYPES
from jaxinfer.loading.model_source import DRAFT_MODEL_DIR


def _sources(count: int, skip: int) -> list[str]:
    """Deterministic list of stdlib source texts."""
    root = Path(sysconfig.get_paths()["stdlib"])
    files = sorted(p for p in root.glob("*.py") if p.stat().st_size > 6000)
    return [files[(skip + 7 * i) % len(files)].read_text(errors="replace") for i in range(count)]


def make_prompts(tokenizer, task: str, batch: int, passage_tokens: int) -> list[dict]:
    prompts = []
    for text in _sources(batch, skip=3 if task == "copy" else 11):
        ids = tokenizer.encode(text, add_special_tokens=False)[200 : 200 + passage_tokens]
        if task == "copy":
            ids = ids + tokenizer.encode("\n\n", add_special_tokens=False) + ids[: passage_tokens // 8]
        prompts.append({"prompt_token_ids": ids})
    return prompts


def _settled_state(engine):
    """What must stop changing before timing: the compilation count (constant once the plan is compiled)
    and the adaptive rule's choices."""
    ctl = engine.spec_controller
    return engine.stats()["num_compilations"], (ctl.choices() if ctl is not None else None)


def _warm_up(llm: LLM, prompts, params: SamplingParams, max_passes: int) -> tuple[int, float]:
    """Passes until two in a row change neither the compilations nor the adaptive rule's choices (at most
    ``max_passes``); returns how many, and the wall time of the first (a user's first call)."""
    engine = llm.llm_engine
    passes = quiet = 0
    first_s = None
    while passes < max_passes and quiet < 2:
        before = _settled_state(engine)
        t = time.perf_counter()
        llm.generate(prompts, params, use_tqdm=False)
        if first_s is None:
            first_s = time.perf_counter() - t
        passes += 1
        quiet = quiet + 1 if _settled_state(engine) == before else 0
    return passes, first_s


class _Timing:
    """One engine's timed passes over one prompt set, and its counters around them."""

    def __init__(self, llm: LLM, warm_up: tuple[int, float]):
        self.llm, self.engine = llm, llm.llm_engine
        self.warmup_passes, self.first_pass_seconds = warm_up
        self.before = self.engine.stats()
        self.steps0 = self.engine.num_steps
        ctl = self.engine.spec_controller
        if ctl is not None:
            ctl.per_position_proposed = [0] * ctl.max_k
            ctl.per_position_accepted = [0] * ctl.max_k
        self.pass_seconds: list[float] = []
        self.outs = None

    def run_pass(self, prompts, params) -> None:
        t = time.perf_counter()
        self.outs = self.llm.generate(prompts, params, use_tqdm=False)
        self.pass_seconds.append(time.perf_counter() - t)

    def result(self) -> dict:
        after = self.engine.stats()
        drafted = after["num_draft_tokens"] - self.before["num_draft_tokens"]
        accepted = after["num_accepted_tokens"] - self.before["num_accepted_tokens"]
        repeats = len(self.pass_seconds)
        generated = sum(len(o.outputs[0].token_ids) for o in self.outs)
        steps = (self.engine.num_steps - self.steps0) / repeats
        elapsed = statistics.median(self.pass_seconds)
        ctl = self.engine.spec_controller
        per_pos = None
        if ctl is not None:
            per_pos = [a / p if p else None for a, p in zip(ctl.per_position_accepted, ctl.per_position_proposed)]
        return {
            "warmup_passes": self.warmup_passes,
            "compilations_in_timed_run": after["num_compilations_after_start"] - self.before["num_compilations_after_start"],
            "first_pass_tok_per_s": generated / self.first_pass_seconds,
            "tok_per_s": generated / elapsed,
            "seconds": elapsed,
            "pass_seconds": self.pass_seconds,
            "steps": steps,
            "draft_tokens": drafted,
            "accepted_tokens": accepted,
            "acceptance_rate": accepted / drafted if drafted else 0.0,
            "mean_tokens_per_seq_step": generated / max(steps * len(self.outs), 1),
            "per_position_acceptance": per_pos,
            "tokens": [o.outputs[0].token_ids for o in self.outs],
        }


def run(args) -> dict:
    methods = {
        "off": None,
        "ngram": {"method": "ngram", "num_speculative_tokens": args.k, "prompt_lookup_max": 4,
                  "prompt_lookup_min": 2, "adaptive": not args.no_adaptive},
    }
    if args.draft_model or DRAFT_MODEL_DIR.joinpath("config.json").is_file():
        methods["draft"] = {"method": "draft_model", "model": args.draft_model or str(DRAFT_MODEL_DIR),
                            "num_speculative_tokens": args.k, "adaptive": not args.no_adaptive}
    max_len = max(args.passage_tokens * 2 + args.output_len + 64, args.max_model_len or 0)
    engines = {method: LLM(model=args.model, max_num_seqs=max(args.max_num_seqs or 0, *args.batch_sizes),
                           max_num_batched_tokens=args.max_num_batched_tokens, speculative_config=spec,
                           max_model_len=max_len, dtype=args.dtype)
               for method, spec in methods.items()}
    tok = engines["off"].get_tokenizer()
    params = SamplingParams(temperature=0.0, max_tokens=args.output_len, ignore_eos=True)
    results, rows = [], []
    for task in args.tasks:
        for b in args.batch_sizes:
            prompts = make_prompts(tok, task, b, args.passage_tokens)
            timings = {m: _Timing(llm, _warm_up(llm, prompts, params, args.warmup_passes))
                       for m, llm in engines.items()}
            for _ in range(args.repeats):  # interleaved: a drift in the machine's speed hits every method
                for timing in timings.values():
                    timing.run_pass(prompts, params)
            for method, timing in timings.items():
                r = timing.result()
                r.update(method=method, task=task, batch_size=b)
                results.append(r)
    base = {(r["task"], r["batch_size"]): r for r in results if r["method"] == "off"}
    for r in results:
        ref = base[(r["task"], r["batch_size"])]
        r["speedup"] = r["tok_per_s"] / ref["tok_per_s"]
        r["first_pass_speedup"] = r["first_pass_tok_per_s"] / ref["first_pass_tok_per_s"]
        r["greedy_identical"] = r["tokens"] == ref["tokens"]
        pp = r["per_position_acceptance"]
        rows.append([r["task"], r["batch_size"], r["method"], r["first_pass_tok_per_s"], r["first_pass_speedup"],
                     r["tok_per_s"], r["speedup"],
                     r["acceptance_rate"], r["mean_tokens_per_seq_step"],
                     " ".join("-" if x is None else f"{x:.2f}" for x in pp) if pp else "-",
                     "yes" if r["greedy_identical"] else "NO", r["compilations_in_timed_run"]])
    report.print_table(
        f"speculative decoding — k={args.k}, {args.output_len} tokens, adaptive={not args.no_adaptive} "
        "(seed, vLLM: copy 2.78x b1 / 2.38x b16; free 1.13x / 0.85x)",
        ["task", "batch", "method", "first tok/s", "first speedup", "steady tok/s", "steady speedup", "accept",
         "tok/seq/step", "per-position", "identical", "compiles"],
        rows)
    for r in results:
        r.pop("tokens")
    payload = {"benchmark": "spec", "machine": hardware.machine_info(), "k": args.k, "output_len": args.output_len,
               "dtype": args.dtype, "results": results}
    report.write_json(args.output, payload)
    return payload


def add_arguments(p) -> None:
    p.add_argument("--model", default=None, help="target model; default: the embedded model")
    p.add_argument("--draft-model", default=None, help="draft model; default: the embedded draft model if present")
    p.add_argument("--dtype", default="auto", choices=DTYPES,
                   help="engine dtype (auto: float32 on CPU, bfloat16 on GPU)")
    p.add_argument("--k", type=int, default=4, help="num_speculative_tokens")
    p.add_argument("--batch-sizes", type=int, nargs="+", default=[1, 16])
    p.add_argument("--tasks", nargs="+", default=["copy", "free"], choices=["copy", "free"])
    p.add_argument("--passage-tokens", type=int, default=192)
    p.add_argument("--output-len", type=int, default=128)
    p.add_argument("--no-adaptive", action="store_true", help="always propose k tokens")
    p.add_argument("--repeats", type=report.positive_int, default=5, help="timed passes per method; tok/s is taken from the median")
    p.add_argument("--warmup-passes", type=report.positive_int, default=12,
                   help="most passes before the timed ones (the first is timed as the first call); stops after "
                        "two in a row left the adaptive rule's choices unchanged")
    p.add_argument("--max-model-len", type=int, default=None, help="engine setting (default: what the prompts need)")
    p.add_argument("--max-num-seqs", type=int, default=None, help="engine setting (default: the largest batch)")
    p.add_argument("--max-num-batched-tokens", type=report.positive_int, default=2048, help="engine setting")
    p.add_argument("--output", default=None)
