"""aiperf (NVIDIA's load generator) against the server, next to jaxinfer's own benches on the same workload.

aiperf runs ``profile`` on the chat endpoint, streamed, with ``--use-server-token-count --per-chunk-usage``
(``stream_options.continuous_usage_stats``: the server's usage on every chunk, which aiperf 0.13 only sends on
the chat endpoint), ``--request-count N --concurrency N`` (all requests at once), synthetic prompts of
``--isl`` tokens (its own text, tokenized with the model's tokenizer) and ``--osl`` output tokens made exact
with ``--extra-inputs ignore_eos:true``; N distinct prompts and no warm-up pass (aiperf's warm-up replays the
same prompts, so its measured pass would be served from the prefix cache: ``cached_prompt_tokens`` shows
it). Its TTFT, ITL and latency percentiles come from its ``profile_export_aiperf.json``. aiperf's ITL is per request
``(latency - TTFT) / (output tokens - 1)``: what jaxinfer's benches call TPOT; their ITL is the gap between
consecutive tokens.

Next to it, the same N requests, all at once, with the prompt length the server counted for aiperf's requests
(the chat template adds a few tokens) and the same output length, 2 passes with other prompt tokens each
(the last reported): ``jaxinfer-bench serve --url`` (jaxinfer's own HTTP client, streaming
``/v1/completions``, token-id prompts) against the same server, and ``jaxinfer-bench serve`` in process with
the server's engine settings (run after the server has stopped, so the two do not share the CPU).
"""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

from bench.clients.common import (FAILED, OK, SKIPPED, ClientResult, clip, first_error_line, run_command, shown,
                                  tool_version)

ROOT = Path(__file__).resolve().parents[2]


def command(prefix: list[str], url: str, model: str, tokenizer_dir: str | Path, num_requests: int, isl: int,
            osl: int, artifact_dir: Path, api_key: str | None = None) -> list[str]:
    return [*prefix, "profile", "--model", model, "--url", url, "--endpoint-type", "chat", "--streaming",
            "--tokenizer", str(tokenizer_dir), "--isl", str(isl), "--isl-stddev", "0", "--osl", str(osl),
            "--osl-stddev", "0", "--extra-inputs", "ignore_eos:true", "--use-server-token-count",
            "--per-chunk-usage", "--request-count", str(num_requests), "--concurrency", str(num_requests),
            "--num-dataset-entries", str(num_requests), "--random-seed", "0", "--ui", "none",
            "--no-server-metrics", "--no-gpu-telemetry", "--workers-max", "1",
            "--record-processor-service-count", "1", "--artifact-dir", str(artifact_dir),
            *(["--api-key", api_key] if api_key else [])]


def _pcts(metric: dict | None, scale: float = 1.0) -> dict:
    if not metric:
        return {}
    return {k: metric[k] * scale for k in ("p50", "p90", "p99", "avg") if isinstance(metric.get(k), (int, float))}


def read_export(artifact_dir: Path) -> dict:
    """TTFT, ITL, latency (ms), throughput and counts from aiperf's JSON export."""
    data = json.loads((artifact_dir / "profile_export_aiperf.json").read_text())
    avg = lambda name: (data.get(name) or {}).get("avg")  # noqa: E731
    return {"ttft_ms": _pcts(data.get("time_to_first_token")), "itl_ms": _pcts(data.get("inter_token_latency")),
            "e2e_ms": _pcts(data.get("request_latency")), "output_tok_s": avg("output_token_throughput"),
            "requests": avg("request_count"), "completed": avg("completed_request_count"),
            "error_rate_pct": avg("request_error_rate"), "isl_mean": avg("input_sequence_length"),
            "osl_mean": avg("output_sequence_length"), "cached_prompt_tokens": avg("usage_prompt_cache_read_tokens"),
            "errors": data.get("error_summary") or [],
            "aiperf_version": data.get("aiperf_version")}


def run_aiperf(prefix: list[str] | None, url: str, model: str, tokenizer_dir: str | Path, num_requests: int,
               isl: int, osl: int, work_dir: Path, api_key: str | None = None,
               timeout_s: float = 900.0) -> ClientResult:
    if prefix is None:
        return ClientResult("aiperf", "profile chat --per-chunk-usage", None, "pip install aiperf", result=SKIPPED,
                            error="aiperf is not installed (the clients extra; or pass --aiperf CMD)")
    art = work_dir / "aiperf"
    cmd = command(prefix, url, model, tokenizer_dir, num_requests, isl, osl, art, api_key)
    row = ClientResult("aiperf", "profile chat --per-chunk-usage", tool_version(prefix, "aiperf"), shown(cmd))
    done = run_command(cmd, timeout_s=timeout_s, log_path=work_dir / "aiperf.log")
    row.seconds = done.seconds
    if done.returncode != 0:
        row.result, row.error = FAILED, first_error_line(done.output)
        return row
    try:
        got = read_export(art)
    except (OSError, ValueError, KeyError) as exc:
        row.result, row.error = FAILED, f"{type(exc).__name__}: {exc}"
        return row
    row.numbers = got
    if got["errors"] or (got["completed"] or 0) < num_requests or (got["error_rate_pct"] or 0) > 0:
        first = got["errors"][0] if got["errors"] else {}
        row.result, row.error = FAILED, clip(f"{got['completed']} of {num_requests} requests completed; "
                                             f"{json.dumps(first)[:200]}")
    else:
        row.result = OK
    return row


# ----------------------------------------------------------------------------- jaxinfer's benches, same load
def bench_serve_command(out_json: Path, num_requests: int, input_len: int, output_len: int,
                        url: str | None = None, engine: dict | None = None, api_key: str | None = None) -> list[str]:
    cmd = [sys.executable, "-m", "bench.cli", "serve", "--num-requests", str(num_requests), "--rate", "inf",
           "--input-len", str(input_len), "--output-len", str(output_len), "--passes", "2", "--output", str(out_json)]
    if url is not None:
        cmd += ["--url", url, *(["--api-key", api_key] if api_key else [])]
    for key, value in (engine or {}).items():
        cmd += [f"--{key.replace('_', '-')}", str(value)]
    return cmd


def read_bench_serve(out_json: Path) -> dict:
    """The last pass of a ``jaxinfer-bench serve`` JSON (in process or ``--url``), in aiperf's units (ms)."""
    data = json.loads(out_json.read_text())
    run = data["runs"].get("http") or data["runs"]["continuous"]
    return {"ttft_ms": _pcts_s(run["ttft_s"]), "tpot_ms": _pcts_s(run["tpot_s"]), "itl_ms": _pcts_s(run["itl_s"]),
            "e2e_ms": _pcts_s(run["e2e_s"]), "output_tok_s": run["output_throughput_tok_s"]}


def _pcts_s(p: dict) -> dict:
    return {("avg" if k == "mean" else k): v * 1e3 for k, v in p.items()
            if isinstance(v, (int, float)) and not math.isnan(v)}


def run_bench_serve(label: str, out_json: Path, num_requests: int, input_len: int, output_len: int, work_dir: Path,
                    url: str | None = None, engine: dict | None = None, api_key: str | None = None,
                    timeout_s: float = 1200.0) -> ClientResult:
    cmd = bench_serve_command(out_json, num_requests, input_len, output_len, url, engine, api_key)
    shown_cmd = shown(cmd).replace("python -m bench.cli", "jaxinfer-bench", 1)
    row = ClientResult("jaxinfer-bench", label, None, shown_cmd)
    done = run_command(cmd, cwd=ROOT, timeout_s=timeout_s, log_path=work_dir / (out_json.stem + ".log"))
    row.seconds = done.seconds
    if done.returncode != 0:
        row.result, row.error = FAILED, first_error_line(done.output)
        return row
    try:
        row.numbers = read_bench_serve(out_json)
    except (OSError, ValueError, KeyError) as exc:
        row.result, row.error = FAILED, f"{type(exc).__name__}: {exc}"
        return row
    row.result = OK
    return row


def load_rows(results: list[ClientResult]) -> list[list]:
    """The load table: TTFT, ITL (aiperf's is per-request mean: compare with TPOT), TPOT, E2E, throughput."""
    rows = []
    for r in results:
        if r.result != OK:
            continue
        n = r.numbers
        g = lambda key, p: (n.get(key) or {}).get(p)  # noqa: E731
        per_request_itl = g("itl_ms", "p50") if r.client == "aiperf" else g("tpot_ms", "p50")
        rows.append([f"{r.client}: {r.check}", g("ttft_ms", "p50"), g("ttft_ms", "p90"), g("ttft_ms", "p99"),
                     per_request_itl, g("itl_ms", "p99") if r.client == "aiperf" else g("tpot_ms", "p99"),
                     None if r.client == "aiperf" else g("itl_ms", "p50"), g("e2e_ms", "p50"), n.get("output_tok_s")])
    return rows


LOAD_COLUMNS = ["run", "TTFT P50 ms", "TTFT P90 ms", "TTFT P99 ms", "ITL/TPOT P50 ms", "ITL/TPOT P99 ms",
                "token gap P50 ms", "E2E P50 ms", "out tok/s"]
