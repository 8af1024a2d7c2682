"""``jaxinfer-bench compare``: jaxinfer beside PyTorch and llama.cpp baselines on the same HF checkpoint.

Runners (``--baselines`` picks the ones besides jaxinfer; default per platform, see ``DEFAULT_BASELINES``):

- ``jaxinfer``: ``LLM(...)`` in ``--dtype``, prefix cache off (no baseline has one), shape plan compiled at start.
- ``jaxinfer-multistep``: the same with ``num_scheduler_steps=8`` (multi-step decoding, ``jaxinfer.runner.multistep``).
- ``hf-eager``: HF transformers ``generate``, eager PyTorch (``bench.hf_baselines``).
- ``hf-compile``: the same with a static KV cache and the decode step through ``torch.compile``.
- ``llama.cpp-f32`` / ``llama.cpp-q8_0``: llama.cpp via llama-cpp-python on GGUF files written by
  llama.cpp's own converter from the same checkpoint (``bench.llamacpp``); batch 1 only.
- ``vllm`` / ``vllm-default-bind``: vLLM's offline ``LLM.generate`` (``bench.vllm_baseline``), in vLLM's own
  interpreter (``--vllm-python``), computing on every core as jaxinfer does, or with vLLM's default binding.

``--dtype`` (float32 by default) applies to jaxinfer, HF and vLLM, and to the bytes a decode step reads.

Each runner lives in its own fresh process (so no framework's threads compete with another's), loaded one
after the other; only one process works at a time while the others wait on their pipe. Protocol: the
worker builds the runner and answers ``("ready", info)`` (or ``("unavailable", reason)`` /
``("error", text)``), then serves ``(method, args)`` calls (``generate``, ``stats``, ``bandwidth``) with
``("ok", result)`` or ``("error", text)`` until ``("stop",)``.

Schedule: first an untimed pass per batch size that warms every shape up and records the greedy tokens
and each token's raw logprob (the correctness pass); then ``--repeats`` timed rounds, each generating
1 and N tokens per runner and batch size, the runner order rotated every round so drift hits all alike.
Reported per runner and batch size, from the medians: tok/s = B * N / t(N); TPOT = (t(N) - t(1)) / (N - 1)
(the same definition for every runner); the bandwidth floor (bytes a decode step must read / bandwidth
measured in the same run) over TPOT; and against jaxinfer's greedy tokens: sequences identical, mean
identical prefix, and the largest |logprob difference| over the identical prefix. Every row carries its
machine and the command that reproduces it. Without ``--model`` a ~134M-parameter Llama with random
weights is written by transformers itself.
"""

from __future__ import annotations

import importlib
import importlib.metadata
import json
import os
import platform
import shlex
import signal
import statistics
import time
import traceback
from pathlib import Path

import numpy as np

from bench import report
from jaxinfer.env_report import cpu_model

DEFAULT_CACHE = Path.home() / ".cache" / "jaxinfer" / "llama-150m-hf"
REFERENCE = "jaxinfer"
RUNNERS = {  # name -> (class as "module:Class", settings it adds)
    REFERENCE: ("bench.compare:JaxinferRunner", {}),
    "jaxinfer-multistep": ("bench.compare:JaxinferRunner", {"num_scheduler_steps": 8}),
    "hf-eager": ("bench.hf_baselines:HFEagerRunner", {}),
    "hf-compile": ("bench.hf_baselines:HFCompileRunner", {}),
    "llama.cpp-f32": ("bench.llamacpp:LlamaCppRunner", {"outtype": "f32"}),
    "llama.cpp-q8_0": ("bench.llamacpp:LlamaCppRunner", {"outtype": "q8_0"}),
    "vllm": ("bench.vllm_baseline:VllmRunner", {"vllm_bind": "all"}),  # runs in vLLM's interpreter
    "vllm-default-bind": ("bench.vllm_baseline:VllmRunner", {"vllm_bind": "default"}),
}
BASELINES = tuple(name for name in RUNNERS if name != REFERENCE)
DEFAULT_BASELINES = {"cpu": tuple(b for b in BASELINES if b != "vllm-default-bind"),
                     "gpu": ("jaxinfer-multistep", "hf-eager", "hf-compile")}
DTYPE_BYTES = {"float32": 4, "bfloat16": 2}
_VERSIONED = ("jax", "jaxlib", "torch", "transformers", "llama-cpp-python", "gguf", "numpy")


def ensure_hf_checkpoint(path: Path, preset: str = "llama-150m") -> Path:
    """Write a random checkpoint with real transformers (once); returns its directory."""
    if (path / "config.json").is_file():
        return path
    import torch
    import transformers

    from jaxinfer.config.presets import preset_hf_dict

    d = preset_hf_dict(preset)
    d.pop("architectures", None)
    config = transformers.LlamaConfig(**d, initializer_range=0.05)
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(config)
    model.save_pretrained(path, safe_serialization=True)
    return path


class JaxinferRunner:
    """The engine under test, as a runner: ``LLM.generate`` with greedy ``SamplingParams``."""

    max_batch_size = None

    @staticmethod
    def unavailable_reason(settings: dict) -> str | None:
        return None

    def __init__(self, checkpoint: str, settings: dict):
        from jaxinfer import LLM, SamplingParams

        self._sampling_params = SamplingParams
        self.dtype = settings.get("dtype", "float32")
        self.llm = LLM(model=checkpoint, dtype=self.dtype, max_model_len=settings["max_model_len"],
                       max_num_seqs=settings["max_num_seqs"], enable_prefix_caching=False,
                       compilation=settings.get("compilation", "eager"),
                       num_scheduler_steps=settings.get("num_scheduler_steps", 1))

    def generate(self, prompts: np.ndarray, n: int, logprobs: bool) -> dict:
        sp = self._sampling_params(temperature=0.0, max_tokens=n, ignore_eos=True, logprobs=0 if logprobs else None)
        reqs = [{"prompt_token_ids": p.tolist()} for p in prompts]
        t = time.perf_counter()
        outs = self.llm.generate(reqs, sp, use_tqdm=False)
        seconds = time.perf_counter() - t
        tokens = np.array([o.outputs[0].token_ids for o in outs])
        lp = None
        if logprobs:
            lp = np.array([[d[tok] for d, tok in zip(o.outputs[0].logprobs, o.outputs[0].token_ids)] for o in outs])
        return {"seconds": seconds, "tokens": tokens, "logprobs": lp}

    def info(self) -> dict:
        from bench import hardware

        engine = self.llm.llm_engine
        cfg = engine.model_config
        embed = 0 if cfg.tie_word_embeddings else cfg.vocab_size * cfg.hidden_size  # read one row per token
        report_, size = engine.warm_up_report, DTYPE_BYTES[self.dtype]
        return {"jax_machine": hardware.machine_info(), "num_params": cfg.num_params, "dtype": self.dtype,
                "compilation": engine.config.compilation, "start_s": report_.seconds if report_ else None,
                "num_scheduler_steps": engine.config.num_scheduler_steps,
                "decode_bytes": {"weights": (cfg.num_params - embed) * size,
                                 "kv_per_token": cfg.kv_cache_bytes_per_token(size)}}

    def stats(self) -> dict:
        return {"compilations_after_start": self.llm.llm_engine.stats()["num_compilations_after_start"]}

    def bandwidth(self) -> dict:
        from bench import hardware

        return hardware.measure_bandwidth().to_json()


# ----------------------------------------------------------------------------------------- the processes
def _describe(exc: BaseException) -> str:
    tail = "".join(traceback.format_exception(exc)).strip().splitlines()[-6:]
    return f"{type(exc).__name__}: {exc}".strip()[:600] + "\n  " + "\n  ".join(tail)


def _runner_class(spec: str) -> type:
    module, cls_name = spec.split(":")
    return getattr(importlib.import_module(module), cls_name)


def _worker(spec: str, checkpoint: str, settings: dict, conn) -> None:
    """The body of a runner's process (see the module docstring for the protocol)."""
    try:
        cls = _runner_class(spec)
        reason = cls.unavailable_reason(settings)
        if reason:
            conn.send(("unavailable", reason))
            return
        runner = cls(checkpoint, settings)
        conn.send(("ready", {"info": runner.info(), "max_batch_size": runner.max_batch_size}))
    except BaseException as exc:  # noqa: BLE001 - everything goes back to the parent as a row's reason
        conn.send(("error", _describe(exc)))
        return
    while True:
        method, *call_args = conn.recv()
        if method == "stop":
            return
        try:
            conn.send(("ok", getattr(runner, method)(*call_args)))
        except Exception as exc:  # noqa: BLE001
            conn.send(("error", _describe(exc)))


class Worker:
    """The parent's handle on one runner process. ``status``: ready | skipped | failed (+ ``reason``). A runner
    class may name another in its ``worker_class`` (``bench.vllm_baseline``'s starts another interpreter)."""

    def __init__(self, name: str, spec: str, checkpoint: str, settings: dict, timeout_s: float):
        self.name, self.timeout_s, self.info, self.max_batch_size = name, timeout_s, {}, None
        t = time.perf_counter()
        self._conn, self._proc = self._start(spec, checkpoint, settings)
        kind, payload = self._receive()
        self.load_s = time.perf_counter() - t
        self.status, self.reason = {"ready": ("ready", None), "unavailable": ("skipped", payload)}.get(
            kind, ("failed", payload))
        if kind == "ready":
            self.info, self.max_batch_size = payload["info"], payload["max_batch_size"]
        else:
            self.close()

    def _start(self, spec: str, checkpoint: str, settings: dict):
        """(connection, process): a spawned child of this interpreter (``bench.vllm_baseline`` starts another)."""
        import multiprocessing as mp

        ctx = mp.get_context("spawn")
        conn, child = ctx.Pipe()
        proc = ctx.Process(target=_worker, args=(spec, checkpoint, settings, child), daemon=True)
        proc.start()
        child.close()
        return conn, proc

    def _receive(self) -> tuple[str, object]:
        if not self._conn.poll(self.timeout_s):
            self._proc.kill()
            return "error", f"no answer within {self.timeout_s:.0f} s (--worker-timeout); process killed"
        try:
            return self._conn.recv()
        except (EOFError, ConnectionError):
            self._proc.join(5)
            code = self._proc.exitcode
            how = f"exit code {code}" if code is None or code >= 0 else f"signal {signal.Signals(-code).name}"
            hint = ": an instruction this CPU cannot execute" if code == -signal.SIGILL else ""
            return "error", f"the process died ({how}{hint})"

    def supports(self, batch_size: int) -> bool:
        return self.status == "ready" and (self.max_batch_size is None or batch_size <= self.max_batch_size)

    def call(self, method: str, *call_args):
        """The runner's answer; on an error the worker is marked failed (its reason kept) and None returned."""
        if self.status != "ready":
            return None
        self._conn.send((method, *call_args))
        kind, payload = self._receive()
        if kind == "ok":
            return payload
        self.status, self.reason = "failed", f"{method}: {payload}"
        self.close()
        return None

    def close(self) -> None:
        if self._proc.is_alive():
            try:
                self._conn.send(("stop",))
            except (OSError, ValueError):
                pass
            self._proc.join(30)
            if self._proc.is_alive():
                self._proc.kill()
        self._conn.close()


# ------------------------------------------------------------------------------------------ the schedule
def start_workers(runners: dict, checkpoint: str, settings: dict, timeout_s: float, log=print) -> dict:
    """name -> Worker, started one after the other (``runners``: name -> (spec, extra settings))."""
    workers = {}
    for name, (spec, extra) in runners.items():
        log(f"[compare] starting {name} ...")
        cls = getattr(_runner_class(spec), "worker_class", Worker)  # vLLM's: a process in its own interpreter
        w = cls(name, spec, checkpoint, {**settings, **extra}, timeout_s)
        log(f"[compare] {name}: {w.status} ({w.load_s:.1f} s){'' if w.reason is None else ': ' + w.reason}")
        workers[name] = w
    return workers


def measure(workers: dict, prompts: dict, n: int, repeats: int, log=print) -> dict:
    """Runs the schedule over started workers (the reference first) and closes them. Returns
    {"runners": name -> {"status", "reason", "info", "stats", "batches": {b: {tokens, logprobs, t1, tn}}},
    "bandwidth": the reference's measurement}."""
    out = {name: {"batches": {b: {"t1": [], "tn": [], "timed_tokens_match": True} for b in prompts}}
           for name in workers}
    try:
        for b, p in prompts.items():  # the correctness pass, which also warms every shape up
            for name, w in workers.items():
                if w.supports(b):  # then the timed calls' own shapes and flags, untimed (a warm-up)
                    res = w.call("generate", p, n, True)
                    if res is not None and w.call("generate", p, n, False) and w.call("generate", p, 1, False):
                        out[name]["batches"][b].update(tokens=res["tokens"], logprobs=res["logprobs"])
        ref = workers.get(REFERENCE)
        bandwidth = ref.call("bandwidth") if ref is not None else None
        stats_before = {name: w.call("stats") for name, w in workers.items()}
        names = list(workers)
        for r in range(repeats):
            order = names[r % len(names):] + names[:r % len(names)]  # rotate: each runner leads in turn
            for b, p in prompts.items():
                for name in order:
                    w, cell = workers[name], out[name]["batches"][b]
                    if not w.supports(b):
                        continue
                    one, full = w.call("generate", p, 1, False), w.call("generate", p, n, False)
                    if one is None or full is None:
                        continue
                    cell["t1"].append(one["seconds"])
                    cell["tn"].append(full["seconds"])
                    cell["timed_tokens_match"] &= bool(np.array_equal(full["tokens"], cell["tokens"]))
                    log(f"[compare] round {r + 1}/{repeats} batch {b} {name}: {full['seconds']:.2f} s")
        for name, w in workers.items():
            after = w.call("stats")
            out[name].update(status=w.status, reason=w.reason, info=w.info, max_batch_size=w.max_batch_size,
                             load_s=w.load_s, stats={"before_timed_rounds": stats_before[name], "after": after})
    finally:
        for w in workers.values():
            w.close()
    return {"runners": out, "bandwidth": bandwidth}


# ------------------------------------------------------------------------------- correctness and summary
def greedy_agreement(ref: np.ndarray, other: np.ndarray) -> tuple[float, float, list[int]]:
    """(fraction of sequences identical, mean identical prefix length, prefix length per sequence)."""
    same = np.asarray(ref) == np.asarray(other)
    prefix = [int(np.argmin(np.append(row, False))) for row in same]
    return float(np.mean(same.all(axis=1))), float(np.mean(prefix)), prefix


def logprob_drift(ref: np.ndarray, other: np.ndarray, prefix: list[int]) -> dict | None:
    """|logprob difference| of the same token after the same context, i.e. over each identical prefix."""
    diffs = np.concatenate([np.abs(np.asarray(ref[i][:k], np.float64) - np.asarray(other[i][:k], np.float64))
                            for i, k in enumerate(prefix)])
    if diffs.size == 0:
        return None
    return {"max_abs": float(diffs.max()), "mean_abs": float(diffs.mean()), "positions": int(diffs.size)}


def summarize(measured: dict, batch_sizes: list[int], n: int, mean_context: float) -> list[dict]:
    """One row per runner and batch size, compared with the reference's tokens, logprobs and TPOT."""
    runners, bw = measured["runners"], measured["bandwidth"]
    ref = runners.get(REFERENCE, {})
    ref_bytes = ref.get("info", {}).get("decode_bytes")
    rows = []
    for name, res in runners.items():
        decode_bytes = res.get("info", {}).get("decode_bytes", ref_bytes)  # HF and vLLM read the same weights (--dtype)
        for b in batch_sizes:
            cell = res["batches"][b]
            row = {"runner": name, "batch_size": b, "status": res["status"], "reason": res["reason"]}
            max_b = res.get("max_batch_size")
            if res["status"] == "ready" and max_b is not None and b > max_b:
                row.update(status="unsupported", reason=f"runs batch {max_b} only (one sequence at a time)")
            elif res["status"] == "ready" and cell["tn"]:
                t1, tn = statistics.median(cell["t1"]), statistics.median(cell["tn"])
                tpot = (tn - t1) / (n - 1) if n > 1 else None
                row.update(status="ok", tok_per_s=b * n / tn, tpot_s=tpot, t1_s=cell["t1"], tn_s=cell["tn"],
                           timed_tokens_match_correctness_pass=cell["timed_tokens_match"])
                if decode_bytes and decode_bytes.get("weights") and bw and tpot:
                    step_bytes = decode_bytes["weights"] + b * mean_context * decode_bytes["kv_per_token"]
                    floor = step_bytes / bw["bytes_per_s"]
                    row.update(decode_bytes_per_step=step_bytes, floor_s=floor, floor_over_tpot=floor / tpot,
                               achieved_gb_per_s=step_bytes / tpot / 1e9)
            stats = res.get("stats") or {}
            before, after = stats.get("before_timed_rounds") or {}, stats.get("after") or {}
            row["stats_change_during_timed_rounds"] = {k: after[k] - before[k] for k in after if k in before}
            rows.append(row)
    by_key = {(r["runner"], r["batch_size"]): r for r in rows}
    for row in rows:
        ref_row = by_key.get((REFERENCE, row["batch_size"]))
        ref_cell = ref.get("batches", {}).get(row["batch_size"], {})
        cell = runners[row["runner"]]["batches"][row["batch_size"]]
        if row["status"] != "ok" or row["runner"] == REFERENCE or "tokens" not in ref_cell:
            continue
        identical, mean_prefix, prefix = greedy_agreement(ref_cell["tokens"], cell["tokens"])
        row.update(greedy_sequences_identical=identical, greedy_mean_identical_prefix=mean_prefix)
        if ref_cell.get("logprobs") is not None and cell.get("logprobs") is not None:
            row["logprob_drift"] = logprob_drift(ref_cell["logprobs"], cell["logprobs"], prefix)
        if ref_row and ref_row.get("tpot_s") and row.get("tpot_s"):
            row["jaxinfer_speedup_tpot"] = row["tpot_s"] / ref_row["tpot_s"]
            row["jaxinfer_speedup_tok_per_s"] = ref_row["tok_per_s"] / row["tok_per_s"]
    return rows


def machine(jax_machine: dict | None, load_at_start: list[float]) -> dict:
    """The machine every row ran on: CPU, cores, the versions of every framework involved, and the load
    average (1, 5, 15 min) before the run and now (other work on the machine makes every timing suspect)."""
    versions = {}
    for dist in _VERSIONED:
        try:
            versions[dist] = importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            versions[dist] = None
    return {"cpu_model": cpu_model(), "cpu_count": os.cpu_count(), "python": platform.python_version(),
            "os": platform.platform(), "load_average_at_start": load_at_start,
            "load_average_at_end": list(os.getloadavg()), "versions": versions,
            **({"jax": jax_machine} if jax_machine else {})}


def reproduce_command(args, baselines: list[str], batch_sizes: list[int]) -> str:
    cmd = ["jaxinfer-bench", "compare"]
    if args.model:
        cmd += ["--model", str(args.model)]
    elif Path(args.cache_dir) != DEFAULT_CACHE:
        cmd += ["--cache-dir", str(args.cache_dir)]
    cmd += ["--baselines", *baselines] if baselines else ["--baselines"]
    cmd += ["--batch-sizes", *map(str, batch_sizes), "--input-len", str(args.input_len),
            "--output-len", str(args.output_len), "--repeats", str(args.repeats)]
    if args.dtype != "float32":
        cmd += ["--dtype", args.dtype]
    if args.vllm_python and any(b.startswith("vllm") for b in baselines):
        cmd += ["--vllm-python", str(args.vllm_python)]
    if args.compilation != "eager":
        cmd += ["--compilation", args.compilation]
    if args.torch_compile_backend != "inductor":
        cmd += ["--torch-compile-backend", args.torch_compile_backend]
    if args.llamacpp_cache_dir:
        cmd += ["--llamacpp-cache-dir", str(args.llamacpp_cache_dir)]
    if args.threads:
        cmd += ["--threads", str(args.threads)]
    return shlex.join(cmd)


# --------------------------------------------------------------------------------------------- the command
def _fmt_row(r: dict, n: int) -> list:
    if r["status"] != "ok":
        note = f"{r['status']}: {(r['reason'] or '').splitlines()[0][:90]}"
        return [r["runner"], r["batch_size"], "-", "-", "-", "-", "-", "-", "-", note]
    drift = r.get("logprob_drift")
    ref = r["runner"] == REFERENCE
    return [r["runner"], r["batch_size"], r["tok_per_s"], r["tpot_s"] * 1e3 if r["tpot_s"] else "-",
            "ref" if ref else (f"{r['jaxinfer_speedup_tpot']:.2f}x" if "jaxinfer_speedup_tpot" in r else "-"),
            r.get("floor_over_tpot", "-"),
            "ref" if ref else f"{r.get('greedy_sequences_identical', 0):.0%}",
            "ref" if ref else f"{r.get('greedy_mean_identical_prefix', 0):.1f}/{n}",
            "ref" if ref else (f"{drift['max_abs']:.2e}" if drift else "-"),
            "" if r.get("timed_tokens_match_correctness_pass", True) else "timed tokens differ from the checked ones"]


def run(args) -> dict:
    load_at_start = list(os.getloadavg())
    if load_at_start[0] > 0.5 * (os.cpu_count() or 1):
        print(f"[compare] warning: load average {load_at_start[0]:.1f} on {os.cpu_count()} cores: other work is "
              "running, so every timing of this run is suspect (the JSON records the load)")
    path = Path(args.model) if args.model else ensure_hf_checkpoint(Path(args.cache_dir))
    vocab = json.loads((path / "config.json").read_text())["vocab_size"]
    n, batch_sizes = args.output_len, list(dict.fromkeys(args.batch_sizes))
    prompts = {b: np.random.default_rng(b).integers(0, vocab, size=(b, args.input_len)) for b in batch_sizes}
    settings = {"max_model_len": args.input_len + n + 16, "max_num_seqs": max(batch_sizes), "dtype": args.dtype,
                "vllm_python": args.vllm_python,
                "compilation": args.compilation, "torch_compile_backend": args.torch_compile_backend,
                "llamacpp_cache_dir": args.llamacpp_cache_dir, "threads": args.threads}
    # The reference starts first: its platform decides the default baselines (no JAX backend starts here).
    workers = start_workers({REFERENCE: RUNNERS[REFERENCE]}, str(path), settings, args.worker_timeout)
    if workers[REFERENCE].status != "ready":
        raise RuntimeError(f"jaxinfer could not start: {workers[REFERENCE].reason}")
    settings["platform"] = workers[REFERENCE].info["jax_machine"]["platform"]
    baselines = list(DEFAULT_BASELINES.get(settings["platform"], ("hf-eager",)) if args.baselines is None
                     else dict.fromkeys(args.baselines))
    workers.update(start_workers({name: RUNNERS[name] for name in baselines}, str(path), settings,
                                 args.worker_timeout))
    measured = measure(workers, prompts, n, args.repeats)
    ref_info = measured["runners"][REFERENCE]["info"]
    rows = summarize(measured, batch_sizes, n, args.input_len + n / 2)
    common = machine(ref_info.get("jax_machine"), load_at_start)
    for row in rows:
        res = measured["runners"][row["runner"]]
        row["machine"] = {**common, "runner": res["info"], "load_s": res.get("load_s"), "stats": res.get("stats")}
        own = [] if row["runner"] == REFERENCE else [row["runner"]]
        row["command"] = reproduce_command(args, own, [row["batch_size"]])
    bw = measured["bandwidth"]
    report.print_table(
        f"jaxinfer vs baselines — {path} ({ref_info.get('num_params', 0) / 1e6:.0f}M params, {args.dtype}), "
        f"{args.input_len}+{n} tokens, greedy, median of {args.repeats}; {common['cpu_model']}; bandwidth "
        f"{bw['gb_per_s'] if bw else float('nan'):.1f} GB/s; load average {load_at_start[0]:.1f} at start, "
        f"{common['load_average_at_end'][0]:.1f} at end",
        ["runner", "batch", "tok/s", "TPOT ms", "jaxinfer speedup (TPOT)", "floor/TPOT", "greedy identical",
         "mean identical prefix", "max |Δ logprob|", "note"], [_fmt_row(r, n) for r in rows])
    payload = {"benchmark": "compare", "machine": common, "model": str(path),
               "num_params": ref_info.get("num_params"), "input_len": args.input_len, "output_len": n,
               "repeats": args.repeats, "batch_sizes": batch_sizes, "baselines": baselines, "bandwidth": bw,
               "command": reproduce_command(args, baselines, batch_sizes), "rows": rows}
    report.write_json(args.output, payload)
    return payload


def add_arguments(p) -> None:
    p.add_argument("--model", default=None,
                   help="an HF checkpoint dir; default: a random 134M Llama written by transformers")
    p.add_argument("--cache-dir", default=str(DEFAULT_CACHE), help="where the default checkpoint is written")
    p.add_argument("--baselines", nargs="*", choices=BASELINES, default=None,
                   help=f"runners beside jaxinfer (none: jaxinfer alone); default on CPU: "
                        f"{' '.join(DEFAULT_BASELINES['cpu'])}; on GPU: {' '.join(DEFAULT_BASELINES['gpu'])}")
    p.add_argument("--batch-sizes", type=report.positive_int, nargs="+", default=[1, 16])
    p.add_argument("--input-len", type=report.positive_int, default=32)
    p.add_argument("--output-len", type=report.positive_int, default=64)
    p.add_argument("--repeats", type=report.positive_int, default=3, help="timed rounds; medians are reported")
    p.add_argument("--dtype", choices=tuple(DTYPE_BYTES), default="float32",
                   help="weights and compute of jaxinfer, HF and vLLM (llama.cpp keeps its GGUF's types)")
    p.add_argument("--vllm-python", default=None, metavar="PATH",
                   help="the interpreter of vLLM's venv (default: $JAXINFER_VLLM_PYTHON, else this one if it has vllm)")
    p.add_argument("--compilation", choices=("eager", "lazy"), default="eager", help="jaxinfer's LLM(compilation=...)")
    p.add_argument("--torch-compile-backend", default="inductor", help="hf-compile's torch.compile backend")
    p.add_argument("--llamacpp-cache-dir", default=None,
                   help="where llama.cpp's converter and GGUF files are cached; default: ~/.cache/jaxinfer/llama.cpp")
    p.add_argument("--threads", type=report.positive_int, default=None, help="llama.cpp threads (default: all cores)")
    p.add_argument("--worker-timeout", type=report.positive_float, default=3600.0,
                   help="seconds one runner call may take")
    p.add_argument("--output", default=None, help="write the results as JSON here")
