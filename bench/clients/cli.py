"""``jaxinfer-bench clients``: third-party clients (openai SDK, lm-eval, aiperf), unmodified, against jaxinfer serve.

Starts ``jaxinfer serve`` (``python -m jaxinfer.cli serve [--serve-args] --host 127.0.0.1 --port FREE``, the
embedded default model unless ``--serve-args`` names one) and waits for ``/health``, then runs

1. the ``openai`` SDK (``bench.clients.openai_sdk``): completions, chat, ``responses.create`` (plain and
   streamed), streaming with ``stream_options={"include_usage": True, "continuous_usage_stats": True}``,
   ``n``, logprobs, and prompt logprobs (``echo`` + ``logprobs``);
2. lm-evaluation-harness, ``local-completions`` (``bench.clients.lm_eval_harness``), on the three tasks of
   ``bench/clients/lm_eval_tasks``: ``generate_until``, ``multiple_choice``, ``loglikelihood_rolling``;
3. aiperf (``bench.clients.aiperf_load``): a streaming chat load with per-chunk usage, its TTFT / ITL
   percentiles next to ``jaxinfer-bench serve --url`` against the same server and ``jaxinfer-bench serve``
   in process (after the server has stopped) on the same workload.

``--lm-eval CMD`` / ``--aiperf CMD`` run a client from another environment (default: ``python -m lm_eval`` /
``aiperf`` where this interpreter has them, else on PATH; missing: the rows say ``skipped``). Each row: the
client, what it exercised, its version, the command, ``ok`` or ``failed`` with the first line of the error,
and key numbers; a check that waits for a server feature still being built says so (``pending``). A table
on stdout, everything (and where each client's log is) as JSON under ``--output``. Exit status 1 when a check
that is not pending failed.
"""

from __future__ import annotations

import argparse
import os
import platform
import shlex
import tempfile
import time
from pathlib import Path

from bench import report
from bench.clients import aiperf_load, lm_eval_harness, openai_sdk, server
from bench.clients.common import FAILED, OK, ClientResult, clip, package_version, tool_command

CLIENTS = ("openai", "lm-eval", "aiperf")


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--clients", nargs="+", choices=CLIENTS, default=list(CLIENTS), help="which clients to run")
    p.add_argument("--serve-args", default="", help="more arguments for `jaxinfer serve` (one shell-quoted string; "
                   "a model path or engine flags such as '--compilation lazy')")
    p.add_argument("--api-key", default=None, help="start the server with this API key; the clients send it")
    p.add_argument("--lm-eval", default=None, metavar="CMD",
                   help="the lm_eval command (default: python -m lm_eval here, else lm_eval on PATH)")
    p.add_argument("--aiperf", default=None, metavar="CMD", help="the aiperf command (default: aiperf beside this "
                   "interpreter, else on PATH)")
    p.add_argument("--lm-eval-tasks", nargs="+", choices=list(lm_eval_harness.TASKS),
                   default=list(lm_eval_harness.TASKS))
    p.add_argument("--load-requests", type=report.positive_int, default=16,
                   help="the load: this many streamed requests, all at once (aiperf's concurrency)")
    p.add_argument("--load-input-len", type=report.positive_int, default=64, help="prompt tokens per request")
    p.add_argument("--load-output-len", type=report.positive_int, default=32, help="output tokens per request")
    p.add_argument("--no-inprocess", action="store_true",
                   help="leave out the in-process `jaxinfer-bench serve` next to aiperf")
    p.add_argument("--server-timeout", type=float, default=900.0, help="seconds to wait for /health")
    p.add_argument("--work-dir", default=None, help="the clients' logs and outputs (default: a new temp dir)")
    p.add_argument("--output", default=None, help="write the results as JSON here")


def _engine_settings(serve_args: list[str]) -> tuple[dict, str | None]:
    """The EngineConfig `jaxinfer serve SERVE_ARGS` builds, as `jaxinfer-bench serve` flags, and its model."""
    from jaxinfer.server import launch

    parser = argparse.ArgumentParser()
    launch.add_arguments(parser)
    cfg = launch.engine_config(parser.parse_args(serve_args))
    return ({"max_num_seqs": cfg.max_num_seqs, "max_num_batched_tokens": cfg.max_num_batched_tokens,
             "dtype": cfg.dtype, "seed": cfg.seed}, cfg.model)


def _tokenizer_dir(model: str | None) -> Path:
    from jaxinfer.loading.model_source import default_model_dir

    return Path(model) if model and Path(model).is_dir() else Path(default_model_dir())


def _git_state() -> dict:
    """The commit the server ran from and how many paths differed from it (others' work in progress counts)."""
    import subprocess

    def git(*a):
        try:
            out = subprocess.run(["git", *a], cwd=server.ROOT, capture_output=True, text=True, timeout=30)
        except (OSError, subprocess.TimeoutExpired):
            return None
        return out.stdout if out.returncode == 0 else None

    commit, status = git("rev-parse", "HEAD"), git("status", "--porcelain", "--untracked-files=no")
    return {"commit": commit.strip() if commit else None,
            "modified_paths": None if status is None else len(status.splitlines())}


def _fmt_numbers(numbers: dict, limit: int = 110) -> str:
    parts = []
    for k, v in numbers.items():
        if isinstance(v, dict):
            v = v.get("p50")
            k = f"{k} p50"
        if isinstance(v, float):
            v = f"{v:.4g}"
        if isinstance(v, (list, tuple)) or v is None or k.endswith("_version"):
            continue
        parts.append(f"{k}={v}")
    text = ", ".join(parts)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _print(results: list[ClientResult], load: list[ClientResult], served, args) -> None:
    rows = []
    for r in results:
        outcome = r.result if r.result == OK else f"{r.result}: {clip(r.error or '', 100)}"
        waits = ("waits for it" if r.result == FAILED else "passes already") if r.pending else ""
        rows.append([r.client, r.check, r.version or "-", outcome, waits, _fmt_numbers(r.numbers)])
    title = (f"third-party clients against `{served.shown_command}` ({served.model}, max_model_len "
             f"{served.max_model_len}, healthy after {served.start_s:.1f} s)")
    report.print_table(title, ["client", "check", "version", "result", "pending feature", "key numbers"], rows)
    load_rows = aiperf_load.load_rows(load)
    if load_rows:
        report.print_table(f"the same load: {args.load_requests} streamed requests at once, output "
                           f"{args.load_output_len} tokens (aiperf's ITL is per request, (latency - TTFT) / "
                           "(tokens - 1): compare it with TPOT; token gap: jaxinfer's ITL)",
                           aiperf_load.LOAD_COLUMNS, load_rows)


def run(args) -> dict:
    work = Path(args.work_dir) if args.work_dir else Path(tempfile.mkdtemp(prefix="jaxinfer-clients-"))
    work.mkdir(parents=True, exist_ok=True)
    serve_args = shlex.split(args.serve_args)
    engine, model_arg = _engine_settings(serve_args)
    tokenizer_dir = _tokenizer_dir(model_arg)
    t0 = time.monotonic()
    served = server.start(serve_args, work / "serve.log", api_key=args.api_key, timeout_s=args.server_timeout)
    results: list[ClientResult] = []
    load: list[ClientResult] = []
    try:
        if "openai" in args.clients:
            results += openai_sdk.run_all(served.url, served.model, args.api_key)
        if "lm-eval" in args.clients:
            prefix = tool_command(args.lm_eval, "lm_eval", "lm_eval")
            results += lm_eval_harness.run_all(prefix, served.url, served.model, tokenizer_dir, served.max_model_len,
                                               work, args.api_key, tuple(args.lm_eval_tasks))
        if "aiperf" in args.clients:
            prefix = tool_command(args.aiperf, "aiperf", "aiperf")
            row = aiperf_load.run_aiperf(prefix, served.url, served.model, tokenizer_dir, args.load_requests,
                                         args.load_input_len, args.load_output_len, work, args.api_key)
            results.append(row)
            load.append(row)
            isl = round(row.numbers["isl_mean"]) if row.result == OK and row.numbers.get("isl_mean") else \
                args.load_input_len
            load.append(aiperf_load.run_bench_serve("serve --url (same server)", work / "bench_serve_http.json",
                                                    args.load_requests, isl, args.load_output_len, work,
                                                    url=served.url, api_key=args.api_key))
    finally:
        exit_code = served.stop()
    if "aiperf" in args.clients and not args.no_inprocess:
        isl = next((round(r.numbers["isl_mean"]) for r in load if r.client == "aiperf" and r.result == OK), None)
        load.append(aiperf_load.run_bench_serve(
            "serve (in process, the server's engine settings)", work / "bench_serve_inprocess.json",
            args.load_requests, isl or args.load_input_len, args.load_output_len, work,
            engine={**engine, "max_model_len": served.max_model_len, **({"model": model_arg} if model_arg else {})}))
    results += [r for r in load if r.client == "jaxinfer-bench"]
    _print(results, load, served, args)
    unexpected = [r for r in results if r.result == FAILED and not r.pending]
    pending = [r for r in results if r.result == FAILED and r.pending]
    print(f"{sum(r.result == OK for r in results)} ok, {len(unexpected)} failed, {len(pending)} failed on server "
          f"features still being built, {sum(r.result == 'skipped' for r in results)} skipped; logs in {work}")
    payload = {
        "benchmark": "clients",
        "machine": {"python": platform.python_version(), "machine": platform.machine(), "cpu_count": os.cpu_count(),
                    "jax_version": package_version("jax"), "jaxinfer_version": package_version("jaxinfer"),
                    "date": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "git": _git_state()},
        "server": {"command": served.shown_command, "url": served.url, "model": served.model,
                   "max_model_len": served.max_model_len, "start_s": served.start_s, "exit_code": exit_code,
                   "engine": engine, "log": str(served.log_path)},
        "work_dir": str(work), "seconds": time.monotonic() - t0,
        "load": {"num_requests": args.load_requests, "input_len": args.load_input_len,
                 "output_len": args.load_output_len, "runs": [r.to_json() for r in load]},
        "results": [r.to_json() for r in results],
    }
    report.write_json(args.output, payload)
    if unexpected:
        raise SystemExit(f"clients: {len(unexpected)} check(s) failed that wait for no pending server feature")
    return payload
