"""``jaxinfer-bench host-loop``: the engine's host work per step against a simulated device step.

On a GPU the host must schedule, pack, launch and apply each step's tokens (stop checks, detokenization,
outputs) in less time than the device takes to run it, or the device waits. This measures that without a
GPU: the real engine (scheduler, block manager, packing, sampling metadata, output processor, incremental
detokenizer of the embedded model's tokenizer) drives a *simulated device* — a step's tokens are ready D ms
after it was launched (after the step before it, the device runs one step at a time), and waiting for them
is a sleep, so the device costs the host no CPU. The tokens are text: each sequence reads the tokenized
source of Python's ``json`` package from its own offset on (EOS removed), the same in both modes, so the
detokenizer sees real text rather than random ids (whose broken UTF-8 it would hold back).

Workload per batch size B (``--batch-sizes``): B requests at once, prompts of ``--prompt-len-range`` tokens
(random ids), each ``--output-len`` tokens (ignore_eos, detokenized, with a stop string checked every token
that never matches), max_num_seqs = B, so every decode step carries B sequences. Each batch size runs
synchronously and with async scheduling (``jaxinfer.core.async_step``), in one process, alternating.
Reported: TPOT (each request's (last token - first token) / (n - 1), the median over requests) and TPOT / D
(1.0: the device never waits for the host), and the host's time per step by phase
(``LLMEngine.stats()["host_seconds"]``). Targets (D = 3.3 ms, a 7B bfloat16 decode step on an H200): with
async scheduling TPOT <= 1.05 D at batch 64 and <= 1.15 D at batch 256.
"""

from __future__ import annotations

import time

import numpy as np

from bench import report

PHASES = ("schedule", "prepare", "wait", "launch", "update")


class SimulatedDevice:
    """A device that runs one step at a time, each for ``step_s`` seconds, and answers with fixed tokens."""

    def __init__(self, step_s: float, text_ids: list[int]):
        self.step_s = step_s
        self.text_ids = text_ids
        self.free_at = 0.0  # when the last launched step finishes
        self.num_steps = 0
        self.slept_s = 0.0  # the host's waits for the device

    def launch(self, owners: list) -> "SimulatedStep":
        start = max(time.perf_counter(), self.free_at)
        self.free_at = start + self.step_s
        self.num_steps += 1
        rows = [(s.seq.seq_id, s.seq.num_tokens) for s in owners]  # the position each row's token takes
        return SimulatedStep(self, self.free_at, rows)

    def token(self, seq_id: int, position: int) -> int:
        return self.text_ids[(seq_id * 7_919 + position) % len(self.text_ids)]


def text_token_ids(tokenizer, eos: set[int]) -> list[int]:
    """The tokenized source of Python's json package, EOS ids removed."""
    import json
    from pathlib import Path

    text = "".join(p.read_text(encoding="utf-8") for p in sorted(Path(json.__file__).parent.glob("*.py")))
    return [t for t in tokenizer.encode(text, add_special_tokens=False) if t not in eos]


class SimulatedStep:
    def __init__(self, device: SimulatedDevice, ready_at: float, rows: list[tuple[int, int]]):
        self.device, self.ready_at, self.rows = device, ready_at, rows

    def collect(self) -> dict:
        from jaxinfer.runner.model_runner import SampledToken

        t = time.perf_counter()
        if self.ready_at > t:
            time.sleep(self.ready_at - t)
        self.device.slept_s += time.perf_counter() - t
        return {seq_id: [SampledToken(self.device.token(seq_id, pos), -1.0, {})] for seq_id, pos in self.rows}


def simulate(engine, device: SimulatedDevice) -> None:
    """Make ``engine`` run its steps on ``device``: the real host-side packing, the device simulated."""
    from jaxinfer.core.async_step import RunnerOps
    from jaxinfer.runner import launch
    from jaxinfer.runner.model_runner import StepOutput

    runner = engine.runner

    def dispatch(prepared):
        return device.launch(prepared.owners) if prepared.owners else None

    def execute(scheduled, draft_q_for=None):
        step = dispatch(launch.prepare(runner, scheduled))
        return StepOutput(step.collect() if step is not None else {})

    runner.execute = execute  # the synchronous path (LLMEngine._execute)
    if engine.stepper is not None:
        engine.stepper.runner = RunnerOps(launch.can_launch, lambda s: launch.prepare(runner, s), dispatch, execute)


def run_case(batch: int, mode: str, args) -> dict:
    from jaxinfer import LLM, SamplingParams

    max_len = args.prompt_len_range[1] + args.output_len + 16
    blocks = batch * (-(-max_len // 16)) + 8
    llm = LLM(model=args.model, compilation="lazy", max_num_seqs=batch, max_model_len=max_len,
              max_num_batched_tokens=args.max_num_batched_tokens, num_kv_blocks=blocks,
              enable_prefix_caching=True, async_scheduling=(mode == "async"))
    engine = llm.llm_engine
    vocab = engine.model_config.vocab_size
    device = SimulatedDevice(args.step_ms / 1e3, text_token_ids(engine.tokenizer, set(engine.eos_token_ids)))
    simulate(engine, device)
    rng = np.random.default_rng(batch)
    lo, hi = args.prompt_len_range
    prompts = [{"prompt_token_ids": [int(x) for x in rng.integers(1, vocab, int(rng.integers(lo, hi + 1)))]}
               for _ in range(batch)]
    params = SamplingParams(temperature=0.0, max_tokens=args.output_len, ignore_eos=True, stop=["\x00\x00\x00"])
    t0 = time.perf_counter()
    outs = llm.generate(prompts, params, use_tqdm=False)
    wall = time.perf_counter() - t0
    tpots = [(o.metrics.finished_time - o.metrics.first_token_time) / (len(o.outputs[0].token_ids) - 1)
             for o in outs]
    host = dict(engine.stats()["host_seconds"])
    steps = max(host["steps"], 1)
    if mode == "sync":  # its execute phase waited for the device inside: count that wait as the wait
        host["prepare"] -= device.slept_s
        host["wait"] = device.slept_s
    row = {"batch_size": batch, "mode": mode, "step_ms": args.step_ms, "tpot_ms": float(np.median(tpots)) * 1e3,
           "tpot_p90_ms": float(np.percentile(tpots, 90)) * 1e3, "wall_s": wall, "device_steps": device.num_steps,
           "engine_steps": host["steps"], "async_steps": host["async_steps"],
           "host_ms_per_step": {k: host[k] / steps * 1e3 for k in PHASES},
           "tokens": [o.outputs[0].token_ids for o in outs]}
    row["tpot_over_step"] = row["tpot_ms"] / args.step_ms if args.step_ms else None
    # the host's own work (waiting for the device excluded), per step
    row["host_busy_ms_per_step"] = sum(v for k, v in row["host_ms_per_step"].items() if k != "wait")
    return row


def run(args) -> dict:
    from bench import hardware

    rows = []
    for batch in args.batch_sizes:
        pair = {}
        for mode in ("sync", "async"):
            pair[mode] = run_case(batch, mode, args)
            print(f"[host-loop] batch {batch} {mode}: TPOT {pair[mode]['tpot_ms']:.2f} ms", flush=True)
        same = pair["sync"].pop("tokens") == pair["async"].pop("tokens")
        for r in pair.values():
            r["tokens_identical_sync_async"] = same
            rows.append(r)
    table = []
    for r in rows:
        ms = r["host_ms_per_step"]
        table.append([r["batch_size"], r["mode"], r["tpot_ms"], r["tpot_over_step"], r["host_busy_ms_per_step"],
                      *(ms[k] for k in PHASES), r["engine_steps"], r["tokens_identical_sync_async"]])
    report.print_table(
        f"host loop against a simulated {args.step_ms} ms device step — {args.model or 'embedded model'} "
        f"(its tokenizer), prompts {args.prompt_len_range[0]}-{args.prompt_len_range[1]} tokens, "
        f"{args.output_len} output tokens, B requests at once (targets with async: TPOT/D <= 1.05 at B=64, "
        "<= 1.15 at B=256)",
        ["batch", "mode", "TPOT ms", "TPOT / D", "host busy ms/step", *(f"{k} ms" for k in PHASES), "steps",
         "tokens sync = async"], table)
    payload = {"benchmark": "host-loop", "machine": hardware.machine_info(), "model": args.model,
               "step_ms": args.step_ms, "output_len": args.output_len, "prompt_len_range": args.prompt_len_range,
               "command": _command(args), "rows": rows}
    report.write_json(args.output, payload)
    return payload


def _command(args) -> str:
    cmd = ["jaxinfer-bench", "host-loop", "--batch-sizes", *map(str, args.batch_sizes), "--step-ms", str(args.step_ms),
           "--output-len", str(args.output_len), "--prompt-len-range", *map(str, args.prompt_len_range),
           "--max-num-batched-tokens", str(args.max_num_batched_tokens)]
    return " ".join(cmd + (["--model", args.model] if args.model else []))


def add_arguments(p) -> None:
    p.add_argument("--model", default=None, help="model dir; default: the embedded model (its tokenizer)")
    p.add_argument("--batch-sizes", type=report.positive_int, nargs="+", default=[1, 16, 64, 256])
    p.add_argument("--step-ms", type=float, default=3.3, help="the simulated device step (D), ms")
    p.add_argument("--output-len", type=report.positive_int, default=128)
    p.add_argument("--prompt-len-range", type=report.positive_int, nargs=2, default=[128, 512],
                   metavar=("LO", "HI"))
    p.add_argument("--max-num-batched-tokens", type=report.positive_int, default=8192)
    p.add_argument("--output", default=None, help="write the results as JSON here")
