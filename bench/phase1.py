"""``jaxinfer-bench phase1``: the seed's whole Phase-1 table in one command.

Each optimization is measured by its own experiment (``serve``, ``paged``, ``prefix``, ``spec``, ``tp``,
``moe``, ``quant``), run as a separate process (``jaxinfer-bench <experiment> ... --output <dir>/<x>.json``,
its output streamed, so a long run shows progress); this command only chooses their settings, collects
their JSON and prints one table: the optimization, the phase it acts on, what it saves, the seed's value
(vLLM on an A100 unless stated), the value measured here, the physical floor where one applies, and the
machine. Every row keeps the exact command that reproduces it and the compilations its engines made after
start. An experiment that is not available is reported as such and the command still succeeds; one that
fails is reported with its error and the command exits non-zero after the others ran.

``--quick`` (the default on a CPU) sizes everything to finish within ~15 minutes on a 2-core machine, cold
compilation cache included, on the embedded model and small presets; the engines of ``serve``, ``paged``,
``prefix`` and ``spec`` share one engine configuration, so they share compiled executables through the
on-disk cache. Without it (meant for a GPU) the experiments run their full defaults on 7B shapes.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shlex
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Callable

from bench import registry, report

OPTIMIZATIONS = ("continuous_batching", "paged_attention", "prefix_caching", "speculative_decoding",
                 "tensor_parallel", "moe", "quantization")
SHARED_ENGINE = ["--max-model-len", "1024", "--max-num-seqs", "32"]  # one plan for serve / paged / prefix / spec
TINY_ENGINE = ["--max-model-len", "128", "--max-num-seqs", "4"]


@dataclasses.dataclass(frozen=True)
class Row:
    optimization: str
    experiment: str  # the jaxinfer-bench subcommand
    phase: str  # prefill | decode | both
    saves: str  # waiting | memory | compute | bandwidth
    seed: str
    quick_args: tuple[str, ...]
    full_args: tuple[str, ...]
    summarize: Callable[[dict], tuple[str, str | None, dict]]  # payload -> (measured, floor, details)
    env: tuple[tuple[str, str], ...] = ()
    tiny_args: tuple[str, ...] = ()  # seconds, for smoke tests: the numbers mean nothing


def _x(v: float) -> str:
    return f"{v:.2f}x"


def _ms(v: float) -> str:
    return f"{v * 1e3:.0f} ms" if v < 1 else f"{v:.2f} s"


def _continuous(p: dict) -> tuple[str, str | None, dict]:
    r, runs = p["ratios"], p["runs"]
    st, co = runs["static"], runs["continuous"]
    measured = (f"P50 {_ms(st['e2e_s']['p50'])} -> {_ms(co['e2e_s']['p50'])} = {_x(r['e2e_p50_static_over_continuous'])}"
                f" (first pass {_x(r['first_pass']['e2e_p50_static_over_continuous'])}), throughput "
                f"{st['output_throughput_tok_s']:.0f} -> {co['output_throughput_tok_s']:.0f} tok/s = "
                f"{_x(r['throughput_continuous_over_static'])}")
    details = {"ratios": r, "rate": p["workload"]["rate"], "num_requests": p["workload"]["num_requests"],
               "e2e_p50_s": {m: runs[m]["e2e_s"]["p50"] for m in runs},
               "ttft_p50_s": {m: runs[m]["ttft_s"]["p50"] for m in runs},
               "throughput_tok_s": {m: runs[m]["output_throughput_tok_s"] for m in runs},
               "first_pass_e2e_p50_s": {m: runs[m]["first_pass"]["e2e_s"]["p50"] for m in runs},
               "compilations_after_start": sum(runs[m]["num_compilations_after_start"] for m in runs)}
    return measured, None, details


def _paged(p: dict) -> tuple[str, str | None, dict]:
    sweep, mem = p["sweep"], p["kv_memory"]
    lo, hi = sweep[0], sweep[-1]
    measured = (f"batch {lo['batch_size']} -> {hi['batch_size']}: {lo['output_tok_per_s']:.0f} -> "
                f"{hi['output_tok_per_s']:.0f} tok/s, latency {lo['mean_latency_s']:.2f} -> "
                f"{hi['mean_latency_s']:.2f} s; KV waste {mem['contiguous_waste']:.0%} contiguous -> "
                f"{mem['paged_waste']:.1%} paged")
    floor = f"latency {hi['latency_floor_s']:.2f} s at batch {hi['batch_size']} (bandwidth)"
    return measured, floor, {"sweep": sweep, "kv_memory": mem,
                             "compilations_after_start": p["compilations_after_start"]}


def _prefix(p: dict) -> tuple[str, str | None, dict]:
    r, runs = p["ratios"], p["runs"]
    off, on = runs["caching off"], runs["caching on"]
    measured = (f"TTFT P50 {_ms(off['ttft_s']['p50'])} -> {_ms(on['ttft_s']['p50'])} = "
                f"{_x(r['ttft_p50_off_over_on'])} (first pass {_x(r['first_pass']['ttft_p50_off_over_on'])}), "
                f"throughput {_x(r['output_throughput_on_over_off'])}, hit rate {on['prefix_cache_hit_rate']:.2f}")
    return measured, None, {"ratios": r, "ttft_p50_s": {k: v["ttft_s"]["p50"] for k, v in runs.items()},
                            "compilations_after_start": sum(v["num_compilations_after_start"] for v in runs.values())}


def _spec(p: dict) -> tuple[str, str | None, dict]:
    cells = {}
    for r in p["results"]:
        if r["method"] != "off":
            cells[f"{r['method']} {r['task']} b{r['batch_size']}"] = (r["speedup"], r["acceptance_rate"],
                                                                    r["first_pass_speedup"], r["greedy_identical"])
    measured = "; ".join(f"{k} {_x(v[0])} (accept {v[1]:.2f})" for k, v in cells.items())
    identical = all(v[3] for v in cells.values())
    return measured + ("" if identical else " — GREEDY MISMATCH"), None, {
        "cells": {k: {"speedup": v[0], "acceptance": v[1], "first_pass_speedup": v[2], "greedy_identical": v[3]}
                  for k, v in cells.items()},
        "compilations_after_start": sum(r["compilations_in_timed_run"] for r in p["results"])}


def _tp(p: dict) -> tuple[str, str | None, dict]:
    parts, layers = [], {}
    for r in p["results"]:
        if r["tp"] == 1:
            continue
        measured = r.get("measured_speedup")
        pred = r["predicted_speedup"] or {}
        value = f"{_x(measured)} measured" if measured else f"{_x(pred.get('accelerator', 0))} predicted"
        parts.append(f"TP={r['tp']} {value}, {r['all_reduces']} all-reduces/step")
        layers[r["tp"]] = r["all_reduces"]
    return "; ".join(parts) or "no TP size ran", None, {"results": p["results"], "model": p["model"],
                                                        "prediction": p["model_of_prediction"]}


def _moe(p: dict) -> tuple[str, str | None, dict]:
    s = p["summary"]
    measured = "; ".join(f"b{r['batch_size']} {_x(r['speedup'])} (bytes {_x(r['bytes_ratio'])}, "
                         f"{r['experts_per_layer']:.1f} experts/layer)" for r in s)
    return measured, "speedup = ratio of bytes read", {"summary": s, "model": p["model"]}


def _quant(p: dict) -> tuple[str, str | None, dict]:
    rows = p.get("summary") or p.get("results") or []
    measured = "; ".join(f"{r.get('method')} {r.get('shape', '')} {_x(r['speedup'])}" for r in rows
                         if r.get("speedup") is not None)
    return measured or "see details", None, {"results": rows}


ROWS = (
    Row("continuous_batching", "serve", "decode", "waiting", "32 Poisson requests: P50 6.36 -> 2.41 s (2.64x), "
        "throughput 717 -> 705 tok/s", ("--compare", "--rate", "4", "--num-requests", "16", "--passes", "2",
                                        "--output-len-range", "16", "128", *SHARED_ENGINE),
        ("--compare", "--rate", "4", "--passes", "3", "--model", "random:llama-2-7b", "--dtype", "bfloat16"),
        _continuous, tiny_args=("--compare", "--rate", "50", "--num-requests", "3", "--passes", "1",
                                "--input-len-range", "4", "12", "--output-len-range", "2", "6",
                                "--static-batch-timeout", "0.02", "--max-num-batched-tokens", "32", *TINY_ENGINE)),
    Row("paged_attention", "paged", "decode", "memory", "batch 1 -> 32: 80 -> 2,408 tok/s, latency 1.25 -> 1.33 s; "
        "KV waste 60-80% -> < 4%", ("--batch-sizes", "1", "4", "16", "32", "--output-len", "64",
                                    "--kv-requests", "32", *SHARED_ENGINE),
        ("--model", "random:llama-2-7b", "--dtype", "bfloat16"), _paged,
        tiny_args=("--batch-sizes", "1", "2", "--input-len", "8", "--output-len", "4", "--kv-requests", "3",
                   "--kv-input-range", "4", "20", "--kv-output-range", "2", "8", *TINY_ENGINE)),
    Row("prefix_caching", "prefix", "prefill", "compute", "32 requests sharing a 500-token document: TTFT P50 829 -> "
        "156 ms (5.3x), 835 -> 1,412 tok/s", ("--num-requests", "16", "--passes", "2", *SHARED_ENGINE),
        ("--passes", "3", "--model", "random:llama-2-7b", "--dtype", "bfloat16"), _prefix,
        tiny_args=("--num-requests", "3", "--doc-len", "40", "--question-len-range", "2", "4", "--output-len", "2",
                   "--passes", "1", "--max-num-batched-tokens", "32", *TINY_ENGINE)),
    Row("speculative_decoding", "spec", "decode", "compute", "copy 2.78x (b1) / 2.38x (b16); free 1.13x / 0.85x",
        ("--batch-sizes", "1", "16", "--output-len", "64", "--repeats", "2", "--warmup-passes", "4",
         *SHARED_ENGINE), (), _spec,
        tiny_args=("--batch-sizes", "1", "--tasks", "copy", "--output-len", "4", "--passage-tokens", "16",
                   "--repeats", "1", "--warmup-passes", "1", *TINY_ENGINE)),
    Row("tensor_parallel", "tp", "both", "bandwidth", "TP=2 1.55x, TP=4 2.16x (gpt-fast 1.61x / 2.42x)",
        ("--tp-sizes", "1", "2", "4"), (), _tp, (("XLA_FLAGS", "--xla_force_host_platform_device_count=8"),),
        tiny_args=("--tp-sizes", "1", "2", "--model", "random:llama-150m", "--dtype", "float32")),
    Row("moe", "moe", "decode", "bandwidth", "batch 1 4.19x, batch 32 1.23x over the dense twin",
        ("--batch-sizes", "1", "4", "32", "--steps", "8"), (), _moe,
        tiny_args=("--batch-sizes", "1", "--steps", "1", "--context", "8")),
    Row("quantization", "quant", "decode", "bandwidth", "FP8 1.5x bandwidth-bound, 0.84x compute-bound; INT8 ~1.0x",
        ("--quick",), (), _quant, tiny_args=("--quick",)),
)


def _command(row: Row, settings: str, out: Path) -> list[str]:
    args = {"quick": row.quick_args, "full": row.full_args, "tiny": row.tiny_args}[settings]
    return [sys.executable, "-m", "bench.cli", row.experiment, *args, "--output", str(out)]


def run_row(row: Row, settings: str, out_dir: Path, available: set[str], timeout_s: float | None = None) -> dict:
    """Run one row's experiment in its own process; ``timeout_s``: kill it after that long (the row then says
    "timed out", and a budget of zero or less skips it)."""
    base = {"optimization": row.optimization, "phase": row.phase, "saves": row.saves, "seed": row.seed}
    if row.experiment not in available:
        return {**base, "measured": "not implemented", "floor": None, "details": {},
                "reason": f"no `jaxinfer-bench {row.experiment}` experiment on this version"}
    out = out_dir / f"{row.experiment}.json"
    cmd = _command(row, settings, out)
    shown = " ".join(f"{k}={shlex.quote(v)}" for k, v in row.env)
    shown = (shown + " " if shown else "") + "jaxinfer-bench " + shlex.join(cmd[3:-2])
    print(f"\n=== {row.optimization}: {shown}", flush=True)
    if timeout_s is not None and timeout_s <= 0:
        return {**base, "measured": "skipped", "floor": None, "details": {}, "command": shown,
                "reason": "the time budget (--time-budget-s) was spent before this row"}
    env = {**os.environ, **dict(row.env)}
    try:
        proc = subprocess.run(cmd, env=env, timeout=timeout_s)
    except subprocess.TimeoutExpired:
        return {**base, "measured": "timed out", "floor": None, "details": {}, "command": shown,
                "reason": f"killed after {timeout_s:.0f} s (the rest of --time-budget-s)"}
    if proc.returncode != 0 or not out.is_file():
        return {**base, "measured": "failed", "floor": None, "details": {}, "command": shown,
                "error": f"exit status {proc.returncode}"}
    payload = json.loads(out.read_text())
    measured, floor, details = row.summarize(payload)
    return {**base, "measured": measured, "floor": floor, "details": details, "command": shown,
            "machine": payload.get("machine"), "result_file": out.name}


def run(args) -> dict:
    import jax

    from bench import hardware

    quick = args.quick if args.quick is not None else jax.default_backend() == "cpu"
    settings = "tiny" if args.tiny else "quick" if quick else "full"
    selected = [r for r in ROWS if r.optimization in args.only] if args.only else list(ROWS)
    out_dir = Path(args.results_dir or tempfile.mkdtemp(prefix="jaxinfer-phase1-"))
    out_dir.mkdir(parents=True, exist_ok=True)
    machine = hardware.machine_info()
    deadline = None if args.time_budget_s is None else time.monotonic() + args.time_budget_s
    rows = []
    for row in selected:
        timeout = None if deadline is None else deadline - time.monotonic()
        rows.append(run_row(row, settings, out_dir, set(registry.EXPERIMENTS), timeout))
        report.write_json(args.output, {"benchmark": "phase1", "settings": settings, "machine": machine,
                                        "results_dir": str(out_dir), "rows": rows, "complete": False})
    report.print_table(
        f"Phase 1 — {machine['device']} ({machine['cpu']}), jax {machine['jax_version']}"
        f", {settings} settings; every row: `jaxinfer-bench <row's command>`",
        ["optimization", "phase", "saves", "seed (vLLM, A100)", "measured here", "floor"],
        [[r["optimization"], r["phase"], r["saves"], r["seed"], r["measured"], r["floor"] or "-"] for r in rows])
    payload = {"benchmark": "phase1", "settings": settings, "machine": machine, "results_dir": str(out_dir),
               "rows": rows, "complete": True}
    if args.plots:
        from bench import phase1_plots

        payload["plots"] = phase1_plots.make_all(rows, args.plots, out_dir)
    report.write_json(args.output, payload)
    if any(r["measured"] == "failed" for r in rows):
        raise SystemExit(f"phase1: {sum(r['measured'] == 'failed' for r in rows)} experiment(s) failed (see above)")
    return payload


def add_arguments(p) -> None:
    quick = p.add_mutually_exclusive_group()
    quick.add_argument("--quick", dest="quick", action="store_true", default=None,
                       help="small settings, ~15 min on a 2-core CPU (default on a CPU)")
    quick.add_argument("--full", dest="quick", action="store_false", help="each experiment's full defaults (GPU)")
    quick.add_argument("--tiny", action="store_true", help="seconds per row, for smoke tests (numbers meaningless)")
    p.add_argument("--only", nargs="+", choices=OPTIMIZATIONS, default=None, help="run only these rows")
    p.add_argument("--results-dir", default=None, help="keep each experiment's JSON here (default: a temp dir)")
    p.add_argument("--plots", default=None, metavar="DIR", help="write PNG plots into DIR")
    p.add_argument("--time-budget-s", type=report.positive_float, default=None,
                   help="stop starting rows (and kill a running one) after this many seconds; the JSON is "
                        "rewritten after every row, so a killed run keeps what it measured")
    p.add_argument("--output", default=None, help="write the table as JSON here")
