"""``jaxinfer-bench router``: replicas behind the SMG router on a multi-tenant shared-prefix workload, each
routing policy on the same replicas in one invocation.

The workload: D tenants, each with its own long shared prefix (a document: the start of a different Python
standard-library source file, cut to a length drawn from ``--prefix-len``), K requests per tenant, each the
tenant's document followed by a question of its own (another file's lines); the D x K requests arrive
interleaved (a random tenant order) with Poisson gaps at ``--rate``, greedy, ``ignore_eos``, ``--output-len``
tokens each, streamed (``bench/serve_http.py``'s client).

For each policy (``--policies``, default ``round_robin cache_aware``): every replica's prefix cache is reset
(``POST /reset_prefix_cache``), SMG starts in front of the replicas with that policy, the workload runs through
it, and SMG stops. Reported per policy: the prefix-cache hit rate from the replicas' own counters
(``vllm:prefix_cache_hits_total / vllm:prefix_cache_queries_total``, deltas over the run) next to the
workload's ideal (each tenant's document computed once, in whole KV blocks), TTFT P50/P99, E2E P50, output
throughput, and how many requests each replica served. The replicas start warm (eager compilation) and a
warm-up pass of other documents runs through each router before its timed pass, so both policies are
measured in steady state.

``--data-parallel-size N`` starts N local replicas (on a CPU each on its own cores, as
``jaxinfer serve --data-parallel-size`` does); ``--worker-urls`` measures replicas started elsewhere.
"""

from __future__ import annotations

import asyncio
import json
import logging
import re
import sys
import sysconfig
import time
import urllib.request
from pathlib import Path

import numpy as np

from bench import report
from bench.serve_http import replay_http, summarize_http
from bench.workload import TimedRequest, arrival_offsets

DEFAULT_POLICIES = ("round_robin", "cache_aware")
DOCS_DIR = Path(sysconfig.get_paths()["stdlib"])
DOC_FILES = ("argparse.py", "ast.py", "calendar.py", "csv.py", "dataclasses.py", "difflib.py", "email/message.py",
             "fractions.py", "ftplib.py", "gettext.py", "heapq.py", "inspect.py", "ipaddress.py", "json/decoder.py",
             "logging/__init__.py", "mailbox.py", "pathlib.py", "pickle.py", "pprint.py", "random.py", "shutil.py",
             "statistics.py", "string.py", "tarfile.py", "textwrap.py", "threading.py", "typing.py", "zipfile.py")
QUESTIONS_FILE = "functools.py"


def add_arguments(p) -> None:
    p.add_argument("--model", default=None, help="model of the local replicas (default: the embedded model)")
    where = p.add_mutually_exclusive_group()
    where.add_argument("--data-parallel-size", type=report.positive_int, default=2, help="local replicas to start")
    where.add_argument("--worker-urls", nargs="+", default=None, metavar="URL", help="replicas started elsewhere")
    p.add_argument("--policies", nargs="+", default=list(DEFAULT_POLICIES), help="SMG routing policies to compare")
    p.add_argument("--router-args", default="", help="more `smg launch` flags, one string")
    p.add_argument("--tenants", type=report.positive_int, default=4)
    p.add_argument("--requests-per-tenant", type=report.positive_int, default=8)
    p.add_argument("--prefix-len", type=report.positive_int, nargs=2, default=[300, 900], metavar=("LO", "HI"),
                   help="shared-prefix (document) tokens per tenant, drawn uniformly")
    p.add_argument("--question-len", type=report.positive_int, default=24, help="tokens of each request's own part")
    p.add_argument("--output-len", type=report.positive_int, default=32)
    p.add_argument("--rate", type=float, default=2.0, help="mean arrival rate, requests/s (Poisson)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--max-num-seqs", type=report.positive_int, default=16, help="engine setting of each replica")
    p.add_argument("--replica-args", default="", help="more `jaxinfer serve` flags for the local replicas")
    p.add_argument("--output", default=None, help="write the results as JSON here")


# ------------------------------------------------------------------------------------------ HTTP helpers
def _post(url: str, body: dict | None = None, timeout_s: float = 60.0) -> tuple[int, dict]:
    req = urllib.request.Request(url, data=json.dumps(body or {}).encode(), method="POST",
                                 headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=timeout_s) as r:
            return r.status, json.loads(r.read() or b"{}")
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read() or b"{}")


def _get(url: str, timeout_s: float = 30.0) -> bytes:
    with urllib.request.urlopen(url, timeout=timeout_s) as r:
        return r.read()


def replica_counters(url: str) -> dict[str, float]:
    """The ``vllm:`` counters and gauges a replica exposes, summed over labels."""
    totals: dict[str, float] = {}
    for line in _get(url + "/metrics").decode().splitlines():
        m = re.match(r"^(vllm:[a-z_]+)(?:\{[^}]*\})? ([-+0-9.eE]+|NaN)$", line)
        if m:
            totals[m.group(1)] = totals.get(m.group(1), 0.0) + float(m.group(2))
    return totals


# ----------------------------------------------------------------------------------------------- workload
def _tokens(url: str, text: str) -> list[int]:
    return _post(url + "/tokenize", {"prompt": text, "add_special_tokens": False})[1]["tokens"]


def _text(url: str, tokens: list[int]) -> str:
    return _post(url + "/detokenize", {"tokens": tokens})[1]["prompt"]


def build_workload(url: str, args, variant: int) -> tuple[list[TimedRequest], dict]:
    """The interleaved multi-tenant requests of one pass and the facts its ideal hit rate needs; ``variant``
    picks other documents (a warm-up pass shares nothing with the timed one)."""
    rng = np.random.default_rng([args.seed, variant])
    files = [DOC_FILES[(variant * args.tenants + t) % len(DOC_FILES)] for t in range(args.tenants)]
    question_lines = [ln for ln in (DOCS_DIR / QUESTIONS_FILE).read_text().splitlines() if ln.strip()]
    docs = []
    for name in files:
        want = int(rng.integers(args.prefix_len[0], args.prefix_len[1] + 1))
        docs.append(_text(url, _tokens(url, (DOCS_DIR / name).read_text())[:want]))
    tenants = rng.permutation(np.repeat(np.arange(args.tenants), args.requests_per_tenant))
    arrivals = arrival_offsets(len(tenants), args.rate, 1.0, rng)
    requests, prompts = [], []
    for i, t in enumerate(tenants):
        start = int(rng.integers(0, len(question_lines) - 8))
        question = _text(url, _tokens(url, "\n".join(question_lines[start:start + 8]))[:args.question_len])
        prompt = f"{docs[t]}\n# Question {i}: what does this do?\n{question}"
        prompts.append((int(t), prompt))
        requests.append(TimedRequest(f"v{variant}-t{t}-r{i}", float(arrivals[i]), (), args.output_len, prompt))
    return requests, {"tenants": [int(t) for t in tenants], "prompts": prompts, "files": files}


def ideal_hit_rate(url: str, prompts: list[tuple[int, str]], block_size: int) -> dict:
    """The hit rate of a perfect router with unlimited cache: every request after its tenant's first reuses
    the whole blocks of the prefix it shares with that tenant's earlier requests (the last token is always
    computed)."""
    seen: dict[int, list[list[int]]] = {}
    hits = total = 0
    for tenant, prompt in prompts:
        ids = _tokens(url, prompt)
        total += len(ids)
        best = 0
        for other in seen.get(tenant, []):
            n = 0
            while n < min(len(ids), len(other)) and ids[n] == other[n]:
                n += 1
            best = max(best, n)
        hits += min(best, len(ids) - 1) // block_size * block_size
        seen.setdefault(tenant, []).append(ids)
    return {"hit_rate": hits / total, "hit_tokens": hits, "prompt_tokens": total}


# ------------------------------------------------------------------------------------------------ running
def _start_replicas(args) -> tuple[list, list[str]]:
    import os
    import shlex

    from jaxinfer.server import data_parallel as dp

    plans = dp.plan_replicas(args.data_parallel_size, dp.free_ports(args.data_parallel_size),
                             devices_per_replica=None, tensor_parallel_size=1, gpus=dp.visible_gpus(),
                             cpus=sorted(os.sched_getaffinity(0)))
    children = []
    for plan in plans:
        argv = [sys.executable, "-m", "jaxinfer.cli", "serve", *([args.model] if args.model else []),
                "--host", "127.0.0.1", "--port", str(plan.port), "--data-parallel-rank", str(plan.rank),
                "--max-num-seqs", str(args.max_num_seqs), "--log-level", "warning", *shlex.split(args.replica_args)]
        env = dict(os.environ)
        if plan.cuda_visible_devices is not None:
            env["CUDA_VISIBLE_DEVICES"] = plan.cuda_visible_devices
        child = dp.Child(f"replica {plan.rank}", argv, env, plan.cpus)
        child.start()
        children.append(child)
    urls = [p.url for p in plans]
    deadline = time.monotonic() + 1800
    while not all(dp.http_ok(u + "/health") for u in urls):
        if any(c.exited() is not None for c in children) or time.monotonic() > deadline:
            raise RuntimeError("a replica did not start (see its output above)")
        time.sleep(0.5)
    return children, urls


def _run_policy(policy: str, urls: list[str], args, workloads: dict) -> dict:
    from jaxinfer.server import data_parallel as dp

    for u in urls:
        status, body = _post(u + "/reset_prefix_cache")
        if status != 200:
            raise RuntimeError(f"{u}: POST /reset_prefix_cache answered {status}: {body}")
    port = dp.free_ports(1)[0]
    router = dp.Child(f"router {policy}", dp.router_argv(dp.find_smg(), "127.0.0.1", port, urls, policy,
                                                         args.router_args, graceful_s=30))
    router.start()
    router_url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 120
        while not dp.router_ready(router_url, len(urls)):
            if router.exited() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"SMG ({policy}) did not report the replicas healthy")
            time.sleep(0.2)
        model = json.loads(_get(router_url + "/v1/models"))["data"][0]["id"]
        asyncio.run(replay_http(router_url, model, workloads["warmup"][0], None))
        before = [replica_counters(u) for u in urls]
        records = asyncio.run(replay_http(router_url, model, workloads["timed"][0], None))
        after = [replica_counters(u) for u in urls]
    finally:
        router.terminate()
        router.wait(60)
    summary = summarize_http(records, allow_failed=True)

    def delta(key, i):
        return after[i].get(key, 0.0) - before[i].get(key, 0.0)

    hits = sum(delta("vllm:prefix_cache_hits_total", i) for i in range(len(urls)))
    queries = sum(delta("vllm:prefix_cache_queries_total", i) for i in range(len(urls)))
    return {"policy": policy, "hit_rate": hits / queries if queries else 0.0, "hit_tokens": hits,
            "query_tokens": queries,
            "requests_per_replica": [delta("vllm:request_success_total", i) for i in range(len(urls))],
            **{k: summary[k] for k in ("num_requests", "num_failed", "errors", "output_throughput_tok_s",
                                       "ttft_s", "e2e_s", "tpot_s", "makespan_s") if k in summary}}


def run(args) -> dict:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    children = []
    if args.worker_urls:
        urls = list(args.worker_urls)
    else:
        children, urls = _start_replicas(args)
    try:
        block_size = 16
        workloads = {"warmup": build_workload(urls[0], args, variant=1), "timed": build_workload(urls[0], args, 0)}
        ideal = ideal_hit_rate(urls[0], workloads["timed"][1]["prompts"], block_size)
        rows = [_run_policy(policy, urls, args, workloads) for policy in args.policies]
    finally:
        for c in children:
            c.terminate()
        for c in children:
            c.wait(60)
    import os
    import platform

    from jaxinfer.env_report import cpu_model, package_version

    machine = {"cpu": cpu_model(), "cpu_count": os.cpu_count(), "python": platform.python_version(),
               "smg_version": package_version("smg"), "date": time.strftime("%Y-%m-%dT%H:%M:%S%z")}
    result = {"machine": machine, "replicas": urls, "ideal": ideal, "policies": rows,
              "workload": {"tenants": args.tenants, "requests_per_tenant": args.requests_per_tenant,
                           "prefix_len": args.prefix_len, "question_len": args.question_len,
                           "output_len": args.output_len, "rate": args.rate, "seed": args.seed,
                           "documents": workloads["timed"][1]["files"]}}
    base = rows[0]
    table = []
    for r in rows:
        table.append([r["policy"], f"{r['hit_rate']:.3f}", f"{r['hit_rate'] / ideal['hit_rate']:.2f}",
                      f"{r['ttft_s']['p50'] * 1e3:.0f}", f"{r['ttft_s']['p99'] * 1e3:.0f}",
                      f"{r['e2e_s']['p50']:.2f}", f"{r['output_throughput_tok_s']:.0f}",
                      f"{base['ttft_s']['p50'] / r['ttft_s']['p50']:.2f}x",
                      " / ".join(f"{n:.0f}" for n in r["requests_per_replica"]), str(r["num_failed"])])
    title = (f"{len(urls)} replicas behind SMG, {args.tenants} tenants x {args.requests_per_tenant} requests at "
             f"{args.rate}/s: ideal hit rate {ideal['hit_rate']:.3f}")
    report.print_table(title, ["policy", "hit rate", "of ideal", "TTFT P50 ms", "TTFT P99 ms", "E2E P50 s", "out tok/s",
                        f"TTFT P50 vs {base['policy']}", "requests per replica", "failed"], table)
    report.write_json(args.output, result)
    return result
