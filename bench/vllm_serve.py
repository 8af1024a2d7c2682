"""``jaxinfer-bench serve --vs-vllm``: ``vllm serve`` and ``jaxinfer serve`` under the same HTTP workload in one
invocation, side by side.

Each server runs alone (started, measured, stopped before the next; vLLM first), on the same model directory
(``--model``, default the embedded model), the same ``max_model_len`` / ``max_num_seqs`` /
``max_num_batched_tokens`` / seed and dtype (``--dtype auto`` means float32 here, for both), and the same
cores: vLLM computes on every core this process may use (``--vllm-bind all``; ``default`` leaves vLLM's own
binding), as jaxinfer does. vLLM runs in its own interpreter (``--vllm-python``, resolved as in
``bench.vllm_baseline``) through that module's CLI wrapper, with request and access logging off, as
``jaxinfer serve --log-level warning`` runs.

Clients (``--client``): ``ours`` is ``bench/serve_http.py``'s (the serving bench's Poisson workload,
``--passes`` passes; the last one is reported, the first in ``first_pass``); ``vllm-bench`` is vLLM's own
``vllm bench serve --backend vllm --dataset-name random --ignore-eos`` with the same number of requests, rate,
burstiness and length ranges (a range lo..hi becomes ``--random-*-len round((lo+hi)/2)`` with
``--random-range-ratio`` (hi-lo)/(hi+lo), so the same range within a token), its JSON kept in full;
``both`` runs ours, then vLLM's, on each server. Printed per client: both servers' rows (output tok/s,
TTFT / TPOT / ITL / E2E percentiles, failed requests) and the ratios (``side_by_side``): latencies as
vLLM / jaxinfer, throughput as jaxinfer / vLLM, so above 1 means jaxinfer is better.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import subprocess
import time
from pathlib import Path

from bench import report, serve_http, vllm_baseline
from bench.workload import engine_kwargs, workload_spec

SERVERS = ("vllm", "jaxinfer")


def add_arguments(g) -> None:
    """Options of ``jaxinfer-bench serve`` for the side-by-side run (``g``: the HTTP argument group)."""
    g.add_argument("--vs-vllm", action="store_true",
                   help="start `vllm serve`, then `jaxinfer serve`, measure both with the same workload, side by side")
    g.add_argument("--vllm-python", default=None, metavar="PATH",
                   help=f"the interpreter of vLLM's venv (default: ${vllm_baseline.PYTHON_ENV}, else this one)")
    g.add_argument("--vllm-bind", choices=("all", "default"), default="all",
                   help="vLLM's threads on every core (as jaxinfer) or on vLLM's default binding")
    g.add_argument("--client", choices=("ours", "vllm-bench", "both"), default="ours",
                   help="with --vs-vllm: our HTTP client, `vllm bench serve`, or both on each server")
    g.add_argument("--server-timeout", type=report.positive_float, default=1200.0,
                   help="seconds a server may take to answer /health (vLLM compiles its model at start)")


# ------------------------------------------------------------------------------------------- the servers
def vllm_serve_command(python: str, model_dir: str, port: int, kw: dict) -> list[str]:
    """``vllm serve`` (through ``bench.vllm_baseline``'s wrapper) with the engine settings jaxinfer gets."""
    return [python, "-m", "bench.vllm_baseline", "cli", "serve", model_dir, "--host", "127.0.0.1",
            "--port", str(port), "--dtype", kw["dtype"], "--max-model-len", str(kw["max_model_len"]),
            "--max-num-seqs", str(kw["max_num_seqs"]), "--max-num-batched-tokens", str(kw["max_num_batched_tokens"]),
            "--seed", str(kw["seed"]), "--no-enable-log-requests", "--disable-uvicorn-access-log"]


def _launch(name: str, args, spec, python: str | None, model_dir: str, log_path: Path):
    if name == "jaxinfer":
        return serve_http.launch_server(args, spec, str(log_path))
    port = serve_http._free_port()
    cmd = vllm_serve_command(python, model_dir, port, engine_kwargs(args, spec))
    with open(log_path, "w") as log:
        proc = subprocess.Popen(cmd, cwd=vllm_baseline.ROOT, env=vllm_baseline.child_env(python, args.vllm_bind),
                                stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT)
    return proc, f"http://127.0.0.1:{port}"


def _log_tail(path: Path, n: int = 15) -> list[str]:
    try:
        return [line for line in path.read_text(errors="replace").splitlines() if line.strip()][-n:]
    except OSError:
        return []


# ------------------------------------------------------------------------------------------- the clients
def random_len_args(lo: int, hi: int) -> tuple[int, float]:
    """vLLM's random-dataset (length, range ratio) for a uniform lo..hi: [len*(1-r), len*(1+r)] ~ [lo, hi]."""
    mid = max(1, round((lo + hi) / 2))
    return mid, math.floor((hi - lo) / (2 * mid) * 1e6) / 1e6  # rounded down: vLLM floors / ceils the bounds


def vllm_bench_command(python: str, url: str, model: str, tokenizer: str, spec, result_dir: Path,
                       result_file: str) -> list[str]:
    in_len, in_ratio = random_len_args(*spec.input_len_range)
    out_len, out_ratio = random_len_args(*spec.output_len_range)
    rate = "inf" if math.isinf(spec.rate) else str(spec.rate)
    return [python, "-m", "bench.vllm_baseline", "cli", "bench", "serve", "--backend", "vllm", "--base-url", url,
            "--model", model, "--tokenizer", tokenizer, "--dataset-name", "random",
            "--random-input-len", str(in_len), "--random-output-len", str(out_len),
            "--random-range-ratio", json.dumps({"input": in_ratio, "output": out_ratio}),
            "--num-prompts", str(spec.num_requests), "--request-rate", rate, "--burstiness", str(spec.burstiness),
            "--seed", str(spec.seed), "--ignore-eos", "--percentile-metrics", "ttft,tpot,itl,e2el",
            "--metric-percentiles", "50,90,99", "--save-result", "--result-dir", str(result_dir),
            "--result-filename", result_file]


def from_vllm_bench(result: dict) -> dict:
    """``vllm bench serve``'s JSON in the shape of ``serve_http.summarize_http`` (seconds, p50/p90/p99/mean)."""
    def metric(name):
        return {**{f"p{p}": result.get(f"p{p}_{name}_ms", math.nan) / 1e3 for p in (50, 90, 99)},
                "mean": result.get(f"mean_{name}_ms", math.nan) / 1e3}

    failed = result.get("failed", 0) or 0
    return {"num_requests": result.get("completed", 0) + failed, "num_failed": failed,
            "total_output_tokens": result.get("total_output_tokens"), "makespan_s": result.get("duration"),
            "output_throughput_tok_s": result.get("output_throughput", math.nan),
            "ttft_s": metric("ttft"), "tpot_s": metric("tpot"), "itl_s": metric("itl"), "e2e_s": metric("e2el")}


def run_vllm_bench(python: str, url: str, model: str, tokenizer: str, spec, out_dir: Path, tag: str) -> dict:
    out_dir.mkdir(parents=True, exist_ok=True)
    name, log_path = f"vllm-bench-{tag}.json", out_dir / f"vllm-bench-{tag}.log"
    cmd = vllm_bench_command(python, url, model, tokenizer, spec, out_dir, name)
    with open(log_path, "w") as log:
        code = subprocess.run(cmd, cwd=vllm_baseline.ROOT, env=vllm_baseline.child_env(python, "default"),
                              stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT).returncode
    if code != 0 or not (out_dir / name).is_file():
        return {"error": f"vllm bench serve exited with {code}", "log": str(log_path), "log_tail": _log_tail(log_path)}
    raw = json.loads((out_dir / name).read_text())
    return {**from_vllm_bench(raw), "raw_json": str(out_dir / name), "log": str(log_path)}


# ------------------------------------------------------------------------------------------ the summary
def _ratio(num, den) -> float | None:
    if num is None or den is None or not den or math.isnan(num) or math.isnan(den):
        return None
    return num / den


def side_by_side(vllm: dict, jaxinfer: dict) -> dict:
    """Latencies vLLM / jaxinfer and throughput jaxinfer / vLLM (above 1: jaxinfer better), failed requests."""
    out = {f"{m}_{p}_vllm_over_jaxinfer": _ratio(vllm.get(f"{m}_s", {}).get(p), jaxinfer.get(f"{m}_s", {}).get(p))
           for m in ("ttft", "tpot", "itl", "e2e") for p in ("p50", "p99")}
    out["throughput_jaxinfer_over_vllm"] = _ratio(jaxinfer.get("output_throughput_tok_s"),
                                                  vllm.get("output_throughput_tok_s"))
    out["failed_requests"] = {"vllm": vllm.get("num_failed"), "jaxinfer": jaxinfer.get("num_failed")}
    return out


def _row(label: str, r: dict) -> list:
    if "ttft_s" not in r:
        return [label, *["-"] * 9, r.get("num_failed", "-"), (r.get("error") or "; ".join(r.get("errors", [])))[:80]]
    ms = [r[f"{m}_s"][p] * 1e3 for m, p in (("ttft", "p50"), ("ttft", "p99"), ("tpot", "p50"), ("tpot", "p99"),
                                            ("itl", "p50"), ("itl", "p99"), ("e2e", "p50"), ("e2e", "p99"))]
    return [label, r["output_throughput_tok_s"], *ms, r.get("num_failed", 0), "; ".join(r.get("errors", []))[:80]]


def _ratio_row(label: str, c: dict) -> list:
    def f(v):
        return "-" if v is None else f"{v:.2f}x"
    keys = ("ttft_p50", "ttft_p99", "tpot_p50", "tpot_p99", "itl_p50", "itl_p99", "e2e_p50", "e2e_p99")
    return [label, f(c["throughput_jaxinfer_over_vllm"]), *[f(c[f"{k}_vllm_over_jaxinfer"]) for k in keys],
            f"{c['failed_requests']['vllm']} / {c['failed_requests']['jaxinfer']}", ""]


# ------------------------------------------------------------------------------------------------- run
def run(args) -> dict:
    if args.url:
        raise SystemExit("--vs-vllm starts both servers itself: drop --url")
    python, source = vllm_baseline.resolve_python(args.vllm_python)
    if python is None:
        raise SystemExit(source)
    if args.dtype == "auto":
        args.dtype = "float32"
    from jaxinfer.loading.model_source import default_model_dir

    model_dir = str(Path(args.model) if args.model else default_model_dir())
    if not Path(model_dir, "config.json").is_file():
        raise SystemExit(f"--vs-vllm needs an HF model directory both servers can load, got {model_dir}")
    args.model = model_dir
    spec = workload_spec(args)
    vocab = serve_http._vocab_size(args)
    out_dir = Path(args.output).parent if args.output else Path(os.environ.get("TMPDIR", "/tmp"))
    clients = ("ours", "vllm-bench") if args.client == "both" else (args.client,)
    servers = {}
    for name in SERVERS:
        log_path = Path(os.environ.get("TMPDIR", "/tmp")) / f"{name}-serve-vs-{os.getpid()}.log"
        print(f"[serve --vs-vllm] starting {name} serve (log {log_path}) ...")
        t0 = time.monotonic()
        proc, url = _launch(name, args, spec, python, model_dir, log_path)
        entry = {"url": url, "log": str(log_path), "command": proc.args}
        try:
            serve_http.wait_healthy(url, proc, args.server_timeout)
            entry["start_s"] = time.monotonic() - t0
            model = serve_http._model_name(url, args.api_key)
            entry["model"] = model
            print(f"[serve --vs-vllm] {name} healthy after {entry['start_s']:.0f} s; measuring ...")
            if "ours" in clients:
                passes = serve_http.client_passes(url, model, args, spec, vocab, allow_failed=True)
                entry["ours"] = {**passes[-1], "first_pass": {k: v for k, v in passes[0].items() if k != "requests"}}
            if "vllm-bench" in clients:
                entry["vllm-bench"] = run_vllm_bench(python, url, model, model_dir, spec, out_dir,
                                                     f"{name}-{os.getpid()}")
        except Exception as exc:  # noqa: BLE001 - one server failing still reports the other
            entry["error"] = f"{type(exc).__name__}: {exc}"
            entry["log_tail"] = _log_tail(log_path)
            print(f"[serve --vs-vllm] {name} failed: {entry['error']}\n  " + "\n  ".join(entry["log_tail"]))
        finally:
            serve_http.stop_server(proc)
        if name == "vllm":
            entry["vllm_log_binding"] = vllm_baseline.binding_lines(log_path.read_text(errors="replace"))
        servers[name] = entry
    comparisons = {}
    for client in clients:
        results = {name: servers[name].get(client) or {"error": servers[name].get("error", "not run")}
                   for name in SERVERS}
        comparisons[client] = side_by_side(results["vllm"], results["jaxinfer"])
        report.print_table(
            f"vllm serve vs jaxinfer serve — client: {client}; {model_dir} ({args.dtype}); {spec.num_requests} "
            f"requests at {spec.rate} req/s, input {spec.input_len_range[0]}..{spec.input_len_range[1]}, output "
            f"{spec.output_len_range[0]}..{spec.output_len_range[1]} tokens; vLLM binding {args.vllm_bind}; ratios: "
            "tok/s jaxinfer/vLLM, latencies vLLM/jaxinfer (above 1: jaxinfer better)",
            ["server", "out tok/s", "TTFT P50 ms", "TTFT P99 ms", "TPOT P50 ms", "TPOT P99 ms", "ITL P50 ms",
             "ITL P99 ms", "E2E P50 ms", "E2E P99 ms", "failed", "note"],
            [_row("vllm serve", results["vllm"]), _row("jaxinfer serve", results["jaxinfer"]),
             _ratio_row("ratio", comparisons[client])])
    from bench import hardware

    payload = {"benchmark": "serve_vs_vllm", "machine": hardware.machine_info(), "model": model_dir,
               "dtype": args.dtype, "vllm_python": python, "vllm_python_from": source, "vllm_bind": args.vllm_bind,
               "workload": {**dataclasses.asdict(spec), "offered_output_tok_s": spec.offered_output_tok_s},
               "engine": engine_kwargs(args, spec), "passes": args.passes, "clients": list(clients),
               "servers": servers, "comparisons": comparisons}
    report.write_json(args.output, payload)
    return payload
