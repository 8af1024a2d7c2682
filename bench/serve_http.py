"""``jaxinfer-bench serve --url URL`` / ``--launch``: the serving bench through an OpenAI-compatible HTTP server.

The workload is ``bench/serve.py``'s, from ``bench/workload.py`` (same Poisson schedule, prompt and output lengths, token-id prompts,
greedy with ``ignore_eos`` so every request produces exactly its output length, the same passes with other
prompt tokens each). An asyncio client (httpx) sends each request at its arrival time as a streaming
``POST /v1/completions`` and times it on the client side, as ``vllm bench serve`` does: TTFT (arrival to
the first chunk), ITL (gaps between a request's chunks), TPOT (``(last - first) / (n_out - 1)``)
and end-to-end latency, from the scheduled arrival time (a late send counts as latency, as queueing does in
the in-process run). It needs nothing of jaxinfer's on the server side (only vLLM's ``ignore_eos`` extra,
which vLLM and SGLang accept), so a vLLM or SGLang server is measured by the same code.

``--launch`` starts ``jaxinfer serve`` with the engine settings the in-process run uses, waits for
``/health``, runs, and stops it with SIGTERM (``bench/vllm_serve.py`` does the same for ``vllm serve``).
``--baseline JSON`` (a ``jaxinfer-bench serve --output JSON`` in-process result) prints HTTP next to
in-process: the throughput ratio and the TTFT P50 difference.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

from bench import hardware, report
from bench.workload import TimedRequest, engine_kwargs, make_workload, percentiles, workload_spec

ROOT = Path(__file__).resolve().parent.parent


def add_arguments(p) -> None:
    """Options of ``jaxinfer-bench serve`` that switch it to HTTP (the workload options are shared)."""
    g = p.add_argument_group("through HTTP")
    target = g.add_mutually_exclusive_group()
    target.add_argument("--url", default=None, help="measure the OpenAI-compatible server at this base URL")
    target.add_argument("--launch", action="store_true", help="start `jaxinfer serve` with the same engine "
                        "settings as the in-process run, measure it through HTTP, stop it")
    g.add_argument("--served-model-name", default=None, help="'model' sent in requests (default: from /v1/models)")
    g.add_argument("--api-key", default=None)
    g.add_argument("--vocab-size", type=int, default=None,
                   help="prompt token ids are drawn below this (default: the model's config.json)")
    g.add_argument("--baseline", default=None, metavar="JSON",
                   help="an in-process `jaxinfer-bench serve --output` result to compare with")


# ------------------------------------------------------------------------------------------- the client
@dataclasses.dataclass
class HttpRecord:
    request_id: str
    arrival_s: float
    input_len: int
    requested_output_len: int
    output_len: int = 0
    chunk_times: list[float] = dataclasses.field(default_factory=list)  # seconds after the start of the run
    finish_s: float | None = None
    error: str | None = None


async def _send(client, url: str, model: str, req: TimedRequest, start: float, headers: dict) -> HttpRecord:
    rec = HttpRecord(req.request_id, req.arrival_s, len(req.prompt_token_ids), req.output_len)
    await asyncio.sleep(max(0.0, start + req.arrival_s - time.perf_counter()))
    prompt = req.prompt_text if req.prompt_text is not None else list(req.prompt_token_ids)
    body = {"model": model, "prompt": prompt, "max_tokens": req.output_len,
            "temperature": 0.0, "ignore_eos": True, "stream": True, "stream_options": {"include_usage": True}}
    try:
        async with client.stream("POST", url + "/v1/completions", json=body, headers=headers) as resp:
            if resp.status_code != 200:
                rec.error = f"HTTP {resp.status_code}: {(await resp.aread())[:200]!r}"
                return rec
            async for line in resp.aiter_lines():
                if not line.startswith("data: "):
                    continue
                if line == "data: [DONE]":
                    break
                now = time.perf_counter() - start
                chunk = json.loads(line[6:])
                if chunk.get("choices"):  # a token step (its text may be held back: counted as vLLM's bench does)
                    rec.chunk_times.append(now)
                if chunk.get("usage"):
                    rec.output_len = chunk["usage"]["completion_tokens"]
                    rec.input_len = chunk["usage"].get("prompt_tokens") or rec.input_len
                if "error" in chunk:
                    rec.error = chunk["error"].get("message", "error")
        rec.finish_s = time.perf_counter() - start
    except Exception as exc:  # noqa: BLE001 - reported per request
        rec.error = f"{type(exc).__name__}: {exc}"
    return rec


async def replay_http(url: str, model: str, workload: list[TimedRequest], api_key: str | None) -> list[HttpRecord]:
    import httpx

    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    limits = httpx.Limits(max_connections=len(workload) + 4, max_keepalive_connections=len(workload) + 4)
    async with httpx.AsyncClient(timeout=None, limits=limits) as client:
        start = time.perf_counter()
        return list(await asyncio.gather(*(_send(client, url, model, r, start, headers) for r in workload)))


def summarize_http(records: list[HttpRecord], allow_failed: bool = False) -> dict:
    """Client-side latencies and throughput of one replay. A failed request raises, unless ``allow_failed``:
    then the summary is over the requests that succeeded, with ``num_failed`` and the first errors."""
    failed = [r for r in records if r.error or not r.chunk_times]
    if failed and not allow_failed:
        raise RuntimeError(f"{len(failed)} requests failed, e.g. {failed[0].request_id}: {failed[0].error}")
    errors = [f"{r.request_id}: {r.error or 'no token came back'}" for r in failed[:3]]
    records = [r for r in records if r not in failed]
    if not records:
        return {"num_requests": len(failed), "num_failed": len(failed), "errors": errors}
    rows, itl = [], []
    for r in records:
        ttft = r.chunk_times[0] - r.arrival_s
        n = r.output_len or len(r.chunk_times)
        rows.append({"request_id": r.request_id, "arrival_s": r.arrival_s, "input_len": r.input_len,
                     "output_len": n, "requested_output_len": r.requested_output_len, "ttft_s": ttft,
                     "tpot_s": (r.chunk_times[-1] - r.chunk_times[0]) / (n - 1) if n > 1 else None,
                     "e2e_s": r.finish_s - r.arrival_s, "num_chunks": len(r.chunk_times)})
        itl.extend(np.diff(r.chunk_times).tolist())
    makespan = max(r.finish_s for r in records)
    total_out = sum(q["output_len"] for q in rows)
    return {
        "num_requests": len(records) + len(failed), "num_failed": len(failed), "errors": errors,
        "total_input_tokens": sum(q["input_len"] for q in rows),
        "total_output_tokens": total_out, "makespan_s": makespan,
        "output_throughput_tok_s": total_out / makespan, "request_throughput_req_s": len(records) / makespan,
        "ttft_s": percentiles(q["ttft_s"] for q in rows),
        "tpot_s": percentiles(q["tpot_s"] for q in rows if q["tpot_s"] is not None),
        "itl_s": percentiles(itl), "e2e_s": percentiles(q["e2e_s"] for q in rows), "requests": rows,
    }


# ------------------------------------------------------------------------------------------ the server
def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def launch_server(args, spec, log_path: str | None = None) -> tuple[subprocess.Popen, str]:
    """``jaxinfer serve`` with the engine settings of the in-process run (``bench.workload.engine_kwargs``)."""
    port = _free_port()
    kw = engine_kwargs(args, spec, batching=args.batching, static_batch_timeout_s=args.static_batch_timeout)
    cmd = [sys.executable, "-m", "jaxinfer.cli", "serve", *([args.model] if args.model else []),
           "--host", "127.0.0.1", "--port", str(port), "--log-level", "warning"]
    for key, value in kw.items():
        cmd += [f"--{key.replace('_', '-')}", str(value)]
    out = open(log_path, "w") if log_path else subprocess.DEVNULL
    proc = subprocess.Popen(cmd, cwd=ROOT, stdout=out, stderr=subprocess.STDOUT)
    return proc, f"http://127.0.0.1:{port}"


def wait_healthy(url: str, proc: subprocess.Popen | None = None, timeout_s: float = 600.0) -> None:
    import httpx

    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"the server exited with status {proc.returncode} before it was healthy")
        try:
            if httpx.get(url + "/health", timeout=5).status_code == 200:
                return
        except httpx.TransportError:
            pass
        time.sleep(0.2)
    raise TimeoutError(f"{url}/health did not answer 200 within {timeout_s:.0f} s")


def stop_server(proc: subprocess.Popen, timeout_s: float = 60.0) -> None:
    """SIGTERM, then SIGKILL after ``timeout_s``."""
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(timeout_s)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(10)


def client_passes(url: str, model: str, args, spec, vocab: int, allow_failed: bool = False) -> list[dict]:
    """The workload's ``--passes`` through the server at ``url``, one summary per pass: the same passes as
    the in-process run (other prompt tokens each; the last one is variant 0)."""
    summaries = []
    for k in range(args.passes):
        last = k == args.passes - 1
        workload = make_workload(spec, vocab, 0 if last else k + 1, "req" if last else f"pass{k}")
        records = asyncio.run(replay_http(url, model, workload, args.api_key))
        summaries.append(summarize_http(records, allow_failed))
    return summaries


def _model_name(url: str, api_key: str | None) -> str:
    import httpx

    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    return httpx.get(url + "/v1/models", headers=headers, timeout=30).json()["data"][0]["id"]


def _vocab_size(args) -> int:
    if args.vocab_size:
        return args.vocab_size
    from jaxinfer.loading.model_source import default_model_dir

    path = Path(args.model) if args.model and Path(args.model).is_dir() else default_model_dir()
    return json.loads((path / "config.json").read_text())["vocab_size"]


# ------------------------------------------------------------------------------------------------- run
def compare(http: dict, inproc: dict) -> dict:
    return {
        "throughput_http_over_inprocess": http["output_throughput_tok_s"] / inproc["output_throughput_tok_s"],
        "ttft_p50_http_minus_inprocess_ms": (http["ttft_s"]["p50"] - inproc["ttft_s"]["p50"]) * 1e3,
        "ttft_p99_http_minus_inprocess_ms": (http["ttft_s"]["p99"] - inproc["ttft_s"]["p99"]) * 1e3,
        "itl_p50_http_minus_inprocess_ms": (http["itl_s"]["p50"] - inproc["itl_s"]["p50"]) * 1e3,
        "e2e_p50_http_over_inprocess": http["e2e_s"]["p50"] / inproc["e2e_s"]["p50"],
    }


def _row(label: str, r: dict) -> list:
    return [label, r["output_throughput_tok_s"], r["ttft_s"]["p50"] * 1e3, r["ttft_s"]["p99"] * 1e3,
            r["itl_s"]["p50"] * 1e3, r["itl_s"]["p99"] * 1e3, r["tpot_s"]["p50"] * 1e3, r["e2e_s"]["p50"] * 1e3,
            r["e2e_s"]["p99"] * 1e3, r["makespan_s"]]


def run(args) -> dict:
    spec = workload_spec(args)
    proc, log_path = None, None
    url = args.url.rstrip("/") if args.url else None
    if args.launch:
        log_path = os.path.join(os.environ.get("TMPDIR", "/tmp"), f"jaxinfer-serve-{os.getpid()}.log")
        proc, url = launch_server(args, spec, log_path)
    try:
        t0 = time.monotonic()
        wait_healthy(url, proc)
        start_s = time.monotonic() - t0
        model = args.served_model_name or _model_name(url, args.api_key)
        summaries = client_passes(url, model, args, spec, _vocab_size(args))
    finally:
        if proc is not None:
            stop_server(proc)
    steady = summaries[-1]
    steady["first_pass"] = {k: v for k, v in summaries[0].items() if k != "requests"}
    rows = [_row("HTTP first pass", summaries[0]), _row(f"HTTP pass {len(summaries)}", steady)]
    baseline = comparison = None
    if args.baseline:
        baseline = json.loads(Path(args.baseline).read_text())["runs"]["continuous"]
        rows += [_row("in-process first pass", baseline["first_pass"]),
                 _row(f"in-process pass {len(baseline['passes'])}", baseline)]
        comparison = compare(steady, baseline)
        comparison["first_pass"] = compare(steady["first_pass"], baseline["first_pass"])
    report.print_table(
        f"serving through HTTP ({url}, model {model}); {spec.num_requests} requests at {spec.rate} req/s, input "
        f"{spec.input_len_range[0]}..{spec.input_len_range[1]}, output {spec.output_len_range[0]}.."
        f"{spec.output_len_range[1]} tokens (offered {spec.offered_output_tok_s:.0f} out tok/s)",
        ["run", "out tok/s", "TTFT P50 ms", "TTFT P99 ms", "ITL P50 ms", "ITL P99 ms", "TPOT P50 ms",
         "E2E P50 ms", "E2E P99 ms", "makespan s"], rows)
    if comparison:
        c = comparison
        print(f"HTTP / in-process throughput {c['throughput_http_over_inprocess']:.3f} (goal >= 0.95); TTFT P50 "
              f"HTTP - in-process {c['ttft_p50_http_minus_inprocess_ms']:+.1f} ms (goal <= 5 ms)")
    payload = {"benchmark": "serve_http", "machine": hardware.machine_info(), "url": url, "model": model,
               "launched": bool(args.launch), "server_start_s": start_s if args.launch else None,
               "workload": {**dataclasses.asdict(spec), "offered_output_tok_s": spec.offered_output_tok_s},
               "passes": args.passes, "runs": {"http": steady}, "baseline": args.baseline,
               "comparison": comparison}
    report.write_json(args.output, payload)
    return payload
