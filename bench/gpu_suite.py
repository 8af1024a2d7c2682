"""Helpers of the one-call GPU suite (``bench/gpu_suite.sh``): measured ceilings, a tiny model, the summary.

* ``ceilings --output F``: machine info, a device-to-device copy of a large random array (bytes read plus
  bytes written over the median time), a large bf16 matmul on random data (FLOP/s), and
  ``bench.hardware.measure_bandwidth`` (the probe the other benchmarks scale by).
* ``tiny-model DIR``: a random tiny Llama in HF format (config.json + model.safetensors, numpy only), so
  the suite's smoke mode can run the engine end to end on a CPU.
* ``summary --out-dir D --stages F [--spec S] [--gpu-compile G] [--quant Q] [--embed NAME=FILE ...]``: reads
  every JSON the suite wrote and the stage log (and the JSON of the stages that write none to ``D``, embedded:
  the device tool returns at most 8 files), writes ``summary.json`` and prints the compact table the suite
  ends with (gpu-compile's verdicts counted per target: ok / refused / failed / spills / over-limit).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import numpy as np

KV_TOKENS_FOR_BANDWIDTH = 16384  # "paged attention >= 80% of bandwidth at >= 16k KV tokens"


# --------------------------------------------------------------------------------------------- ceilings


def _median_seconds(fn, warmup: int = 3, repeats: int = 10) -> float:
    import jax

    for _ in range(warmup):
        jax.block_until_ready(fn())
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        jax.block_until_ready(fn())
        times.append(time.perf_counter() - t)
    return statistics.median(times)


def measure_ceilings(copy_bytes: int, matmul_size: int) -> dict:
    import jax
    import jax.numpy as jnp

    from bench import hardware

    x = jax.random.uniform(jax.random.key(0), (copy_bytes // 4,), jnp.float32)
    copy = jax.jit(jnp.copy)  # a fresh output buffer: XLA cannot alias a non-donated input
    copy_s = _median_seconds(lambda: copy(x))
    del x
    n = matmul_size
    ka, kb = jax.random.split(jax.random.key(1))
    a = jax.random.normal(ka, (n, n), jnp.bfloat16)
    b = jax.random.normal(kb, (n, n), jnp.bfloat16)
    matmul = jax.jit(lambda p, q: p @ q)
    matmul_s = _median_seconds(lambda: matmul(a, b))
    del a, b
    bw = hardware.measure_bandwidth()
    return {
        "benchmark": "ceilings",
        "machine": hardware.machine_info(),
        "copy": {"bytes": copy_bytes, "seconds": copy_s, "gb_per_s": 2 * copy_bytes / copy_s / 1e9,
                 "note": "device-to-device copy of random float32; bytes read + bytes written"},
        "matmul_bf16": {"m": n, "n": n, "k": n, "seconds": matmul_s, "tflop_per_s": 2 * n**3 / matmul_s / 1e12,
                        "note": "random normal bf16 operands, XLA dot, median of 10 after 3 warm-ups"},
        "bandwidth_probes": bw.to_json(),
    }


# ------------------------------------------------------------------------------------------- tiny model

TINY_LLAMA = {
    "architectures": ["LlamaForCausalLM"], "vocab_size": 512, "hidden_size": 64, "intermediate_size": 128,
    "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2, "rms_norm_eps": 1e-5,
    "rope_theta": 10000.0, "max_position_embeddings": 512, "tie_word_embeddings": False,
    "hidden_act": "silu", "bos_token_id": 1, "eos_token_id": 2, "torch_dtype": "float32",
}


def write_tiny_model(path: Path, seed: int = 0) -> Path:
    """A random tiny Llama as an HF directory (tensor names and layouts from ``jaxinfer.model.weights``)."""
    from safetensors.numpy import save_file

    from jaxinfer.config.model import ModelConfig
    from jaxinfer.model.weights import spec_leaves_with_paths

    cfg = ModelConfig.from_hf_dict(TINY_LLAMA)
    rng = np.random.default_rng(seed)
    tensors = {}
    for _, spec in spec_leaves_with_paths(cfg):
        if spec.init == "ones":
            arr = np.ones(spec.shape, np.float32)
        else:
            arr = (0.05 * rng.standard_normal(spec.shape)).astype(np.float32)
        tensors[spec.hf_name] = np.ascontiguousarray(arr.T if spec.transpose else arr)
    path.mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(path / "model.safetensors"))
    (path / "config.json").write_text(json.dumps(TINY_LLAMA, indent=2) + "\n")
    return path


# ---------------------------------------------------------------------------------------------- summary


def _load(path: Path) -> dict | None:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def kernel_summary(payload: dict | None) -> dict | None:
    """Counts, and the bandwidth fraction of the timed cases with >= 16k KV tokens in the batch."""
    if not payload:
        return None
    results = payload.get("results", [])
    counts = {s: sum(r.get("status") == s for r in results) for s in ("PASS", "FAIL", "ERROR", "SKIPPED")}
    timed = [r for r in results if r.get("timing")]
    long = [r for r in timed if r.get("total_kv_tokens", 0) >= KV_TOKENS_FOR_BANDWIDTH
            and r["timing"].get("bandwidth_fraction") is not None]
    fractions = sorted(r["timing"]["bandwidth_fraction"] for r in long)
    speedups = [r["timing"]["speedup_vs_xla"] for r in timed if r["timing"].get("speedup_vs_xla")]
    best = max(long, key=lambda r: r["timing"]["bandwidth_fraction"], default=None)
    return {
        "counts": counts, "cases": max(len(results), payload.get("planned_cases") or 0), "timed": len(timed),
        "bandwidth_gb_per_s": (payload.get("bandwidth") or {}).get("gb_per_s"),
        "long_kv_cases": len(long),
        "long_kv_bandwidth_fraction_median": statistics.median(fractions) if fractions else None,
        "long_kv_bandwidth_fraction_min": fractions[0] if fractions else None,
        "long_kv_bandwidth_fraction_max": fractions[-1] if fractions else None,
        "long_kv_best_case": best["name"] if best else None,
        "speedup_vs_xla_median": statistics.median(speedups) if speedups else None,
        "failures": [f"{r['name']}: {r.get('error') or (r.get('correctness') or {}).get('kernel', {}).get('reason')}"
                     for r in results if r.get("status") in ("FAIL", "ERROR")],
    }


def latency_summary(payload: dict | None) -> dict | None:
    if not payload:
        return None
    rows = {}
    for r in payload.get("results", []):
        rows[str(r["batch_size"])] = {"tpot_ms": r["tpot_s"] * 1e3, "floor_ms": r["floor_s"] * 1e3,
                                      "floor_over_tpot": r["bandwidth_fraction"], "tok_per_s": r["tok_per_s"]}
    return {"model": payload.get("model"), "dtype": payload.get("dtype"),
            "bandwidth_gb_per_s": (payload.get("bandwidth") or {}).get("gb_per_s"),
            # the latency bench's name since 603a121 (before: recompiles_after_warmup)
            "compilations_after_start": payload.get("compilations_after_start",
                                                    payload.get("recompiles_after_warmup")),
            "batches": rows}


def spec_summary(payload: dict | None) -> dict | None:
    """The spec bench's rows, compact (its per-pass times and per-position acceptance dropped)."""
    if not payload:
        return None
    keep = ("task", "batch_size", "method", "tok_per_s", "speedup", "acceptance_rate", "mean_tokens_per_seq_step",
            "greedy_identical", "compilations_in_timed_run")
    return {"dtype": payload.get("dtype"), "k": payload.get("k"), "output_len": payload.get("output_len"),
            "rows": [{key: r.get(key) for key in keep} for r in payload.get("results", [])]}


def quant_summary(payload: dict | None) -> dict | None:
    """The quant bench's speedups per method and shape, its greedy agreement and KV blocks."""
    if not payload:
        return None
    return {"model": payload.get("model"), "dtype": payload.get("dtype"),
            "speedups": [{k: r.get(k) for k in ("method", "shape", "speedup", "bytes_ratio", "step_ms")}
                         for r in payload.get("summary", [])],
            "greedy_agreement": payload.get("greedy_agreement"), "kv_blocks": payload.get("kv_blocks")}


GPU_COMPILE_VERDICTS = ("ok", "refused", "failed", "spills", "over-limit")


def gpu_compile_summary(payload: dict | None) -> dict | None:
    """``jaxinfer-bench gpu-compile``'s counts of each verdict per target (compute capability), and the
    entries that are not ok or refused (case, verdict, the first line of XLA's message)."""
    if not payload:
        return None
    counts: dict[str, dict[str, int]] = {}
    problems = []
    for r in payload.get("results", []):
        verdict = (r.get("summary") or {}).get("verdict") or r.get("status")
        c = counts.setdefault(r.get("sm") or r.get("target") or "?", dict.fromkeys(GPU_COMPILE_VERDICTS, 0))
        c[verdict] = c.get(verdict, 0) + 1
        if verdict not in ("ok", "refused"):
            message = ((r.get("message") or "").strip().splitlines() or [""])[0]
            spills = (r.get("summary") or {}).get("spill_bytes")
            problems.append(f"{r.get('sm')} {r.get('case')}: {verdict}"
                            + (f" ({spills} spill bytes)" if verdict == "spills" else "")
                            + (f" ({message[:100]})" if message else ""))
    return {"jax": payload.get("jax"), "python": payload.get("python"), "targets": payload.get("targets"),
            "groups": payload.get("groups"), "quick": payload.get("quick"), "layers": payload.get("layers"),
            "seconds": payload.get("seconds"), "entries": len(payload.get("results", [])), "counts": counts,
            "problems": problems}


def _fmt(v, spec: str = ".3g") -> str:
    return "-" if v is None else format(v, spec)


def embedded_line(name: str, payload: dict) -> str:
    """One line for an embedded bench JSON: phase1's rows, startup's start times, a phase1 experiment's
    measured value (tp, moe, quant: the phase1 row's own summary), or its size."""
    from bench import phase1

    summarizers = {r.experiment: r.summarize for r in phase1.ROWS}
    if name in summarizers:
        try:
            return f"{name}: {summarizers[name](payload)[0]}"
        except (KeyError, TypeError) as e:
            return f"{name}: unreadable ({e!r})"
    if payload.get("benchmark") == "phase1":
        return f"{name}: " + " | ".join(f"{r['optimization']}: {r['measured']}" for r in payload.get("rows", []))
    if name.startswith("startup"):
        cells = []
        for r in payload.get("results", []):
            ratios = [f"{k.removesuffix('_first_over_last')} first/last {v:.2f}" for k, v in r.items()
                      if k.endswith("_first_over_last")]
            cells.append(", ".join([f"{r.get('config')}/{r.get('cache')} start {_fmt(r.get('start_s'), '.1f')} s",
                                    *ratios]))
        return f"{name}: " + " | ".join(cells)
    return f"{name}: {len(json.dumps(payload, default=str))} bytes embedded"


def summarize(out_dir: Path, stages_file: Path | None, spec_file: Path | None = None,
              quant_file: Path | None = None, embed: dict[str, Path] | None = None,
              gpu_compile_file: Path | None = None) -> dict:
    stages = []
    if stages_file and stages_file.is_file():
        stages = [json.loads(line) for line in stages_file.read_text().splitlines() if line.strip()]
    ceilings = _load(out_dir / "ceilings.json")
    gpu_compile = _load(gpu_compile_file) if gpu_compile_file else None
    summary = {
        "benchmark": "gpu_suite",
        "date": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "machine": (ceilings or {}).get("machine") or _machine_info_or_none(),
        "stages": stages,
        "gpu_compile": gpu_compile_summary(gpu_compile),
        "ceilings": None if not ceilings else {
            "copy_gb_per_s": ceilings["copy"]["gb_per_s"],
            "matmul_bf16_tflop_per_s": ceilings["matmul_bf16"]["tflop_per_s"],
            "matmul_size": ceilings["matmul_bf16"]["m"],
            "measure_bandwidth_gb_per_s": ceilings["bandwidth_probes"]["gb_per_s"],
        },
        "kernel_check": kernel_summary(_load(out_dir / "kernels_check.json")),
        "kernel_sweep": kernel_summary(_load(out_dir / "kernels.json")),
        "latency": {p.stem: latency_summary(_load(p)) for p in sorted(out_dir.glob("latency_*.json"))},
        "spec": spec_summary(_load(spec_file)) if spec_file else None,
        "quant": quant_summary(_load(quant_file)) if quant_file else None,
        "embedded": {name: _load(path) for name, path in (embed or {}).items()},
    }
    if gpu_compile_file:  # whole (each kernel's registers, spills, shared memory): it has no file of its own
        summary["embedded"]["gpu_compile"] = gpu_compile
    (out_dir / "summary.json").write_text(json.dumps(summary, indent=2, default=str) + "\n")
    print_summary(summary)
    return summary


def _machine_info_or_none():
    try:
        from bench import hardware

        return hardware.machine_info()
    except Exception:  # summary must print even when JAX cannot start
        return None


def print_summary(s: dict) -> None:
    m = s.get("machine") or {}
    lines = [f"== jaxinfer GPU suite: {m.get('device', '?')} | jax {m.get('jax_version', '?')} | {s['date']}"]
    for st in s["stages"]:
        lines.append(f"   stage {st['stage']:<24} {st['status']:<8} rc={st['rc']:<4} {st['seconds']:>4}s"
                     f" (limit {st['limit_s']}s)")
    g = s.get("gpu_compile")
    if g:
        per_target = " | ".join(f"{sm}: " + ", ".join(f"{k} {n}" for k, n in c.items()) for sm, c in g["counts"].items())
        lines.append(f"gpu_compile (deviceless, jax {g['jax']}, {g['entries']} entries, {_fmt(g['seconds'], '.0f')} s): "
                     + (per_target or "nothing compiled"))
        lines += [f"   ! {p[:150]}" for p in g["problems"][:8]]
    elif "gpu_compile" in s:
        lines.append("gpu_compile: no result (see its stage in suite.log)")
    c = s["ceilings"]
    if c:
        lines.append(f"ceilings: copy {_fmt(c['copy_gb_per_s'], '.0f')} GB/s | measure_bandwidth "
                     f"{_fmt(c['measure_bandwidth_gb_per_s'], '.0f')} GB/s | bf16 matmul {c['matmul_size']}^3 "
                     f"{_fmt(c['matmul_bf16_tflop_per_s'], '.3g')} TFLOP/s")
    for key in ("kernel_check", "kernel_sweep"):
        k = s[key]
        if not k:
            lines.append(f"{key}: no result")
            continue
        cnt = k["counts"]
        line = (f"{key}: PASS {cnt['PASS']} FAIL {cnt['FAIL']} ERROR {cnt['ERROR']} SKIPPED {cnt['SKIPPED']}"
                f" (of {k['cases']}; timed {k['timed']})")
        if k["timed"]:
            line += (f" | BW {_fmt(k['bandwidth_gb_per_s'], '.0f')} GB/s; >=16k KV tokens ({k['long_kv_cases']} cases):"
                     f" median {_fmt(k['long_kv_bandwidth_fraction_median'], '.0%')}"
                     f" min {_fmt(k['long_kv_bandwidth_fraction_min'], '.0%')}"
                     f" max {_fmt(k['long_kv_bandwidth_fraction_max'], '.0%')} of BW"
                     f" | vs XLA median {_fmt(k['speedup_vs_xla_median'], '.2f')}x")
        lines.append(line)
        lines += [f"   ! {f[:150]}" for f in k["failures"][:6]]
    for name, lat in s["latency"].items():
        if not lat:
            lines.append(f"{name}: no result")
            continue
        parts = [f"b{b}: TPOT {_fmt(r['tpot_ms'], '.2f')} ms, floor {_fmt(r['floor_ms'], '.2f')} ms "
                 f"({_fmt(r['floor_over_tpot'], '.0%')})" for b, r in lat["batches"].items()]
        lines.append(f"{name}: " + " | ".join(parts) + f" | compilations after start {lat['compilations_after_start']}")
    sp = s.get("spec")
    if sp:
        cells = [f"{r['task']} b{r['batch_size']} {r['method']} {_fmt(r['speedup'], '.2f')}x"
                 f"{'' if r['greedy_identical'] else ' NOT IDENTICAL'}" for r in sp["rows"] if r["method"] != "off"]
        lines.append(f"spec (k={sp['k']}, {sp['dtype']}): " + " | ".join(cells))
    q = s.get("quant")
    if q:
        cells = [f"{r['method']} {r['shape']} {_fmt(r['speedup'], '.2f')}x" for r in q["speedups"]]
        lines.append(f"quant ({q['model']}, {q['dtype']}): " + " | ".join(cells))
    for name, payload in (s.get("embedded") or {}).items():
        if name == "gpu_compile":  # its line is above
            continue
        lines.append(embedded_line(name, payload) if payload else f"{name}: no result")
    print("\n".join(lines), flush=True)


# ------------------------------------------------------------------------------------------------- CLI


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.gpu_suite", description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    c = sub.add_parser("ceilings")
    c.add_argument("--copy-bytes", type=int, default=4 << 30)
    c.add_argument("--matmul-size", type=int, default=8192)
    c.add_argument("--output", required=True)
    t = sub.add_parser("tiny-model")
    t.add_argument("path")
    s = sub.add_parser("summary")
    s.add_argument("--out-dir", required=True)
    s.add_argument("--stages", default=None)
    s.add_argument("--spec", default=None, help="the spec bench's JSON (embedded in summary.json)")
    s.add_argument("--quant", default=None, help="the quant bench's JSON (embedded in summary.json)")
    s.add_argument("--gpu-compile", default=None,
                   help="jaxinfer-bench gpu-compile's JSON (counts per target; embedded whole in summary.json)")
    s.add_argument("--embed", nargs="*", default=[], metavar="NAME=FILE",
                   help="other bench JSONs to embed whole (the device tool returns few files)")
    args = p.parse_args(argv)
    if args.cmd == "ceilings":
        payload = measure_ceilings(args.copy_bytes, args.matmul_size)
        Path(args.output).write_text(json.dumps(payload, indent=2, default=str) + "\n")
        print(f"copy {payload['copy']['gb_per_s']:.0f} GB/s; bf16 matmul {payload['matmul_bf16']['tflop_per_s']:.1f} "
              f"TFLOP/s; measure_bandwidth {payload['bandwidth_probes']['gb_per_s']:.0f} GB/s "
              f"({payload['bandwidth_probes']['probe']}) on {payload['machine']['device']}")
    elif args.cmd == "tiny-model":
        print(f"wrote {write_tiny_model(Path(args.path))}")
    else:
        embed = dict(item.split("=", 1) for item in args.embed)
        summarize(Path(args.out_dir), Path(args.stages) if args.stages else None,
                  Path(args.spec) if args.spec else None, Path(args.quant) if args.quant else None,
                  {k: Path(v) for k, v in embed.items()}, Path(args.gpu_compile) if args.gpu_compile else None)
    return 0


if __name__ == "__main__":
    sys.exit(main())
