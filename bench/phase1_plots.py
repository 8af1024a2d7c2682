"""PNG plots of a ``jaxinfer-bench phase1`` run, drawn from the experiments' own JSON files.

One function per figure; each returns its path, or None when its experiment did not run.
"""

from __future__ import annotations

import json
from pathlib import Path

from bench.plots import _cdf, _pyplot


def _load(rows: list[dict], results_dir: Path, optimization: str) -> dict | None:
    for r in rows:
        if r["optimization"] == optimization and r.get("result_file"):
            return json.loads((results_dir / r["result_file"]).read_text())
    return None


def _save(fig, plt, path: Path) -> str:
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return str(path)


def batch_sweep(paged: dict, path: Path) -> str:
    """Throughput and latency against the batch size, latency next to its bandwidth floor."""
    plt = _pyplot()
    sweep = paged["sweep"]
    b = [r["batch_size"] for r in sweep]
    fig, (a1, a2) = plt.subplots(1, 2, figsize=(11, 4))
    a1.plot(b, [r["output_tok_per_s"] for r in sweep], "o-")
    a1.set_xscale("log", base=2)
    a1.set(xlabel="batch size", ylabel="output tokens / s", title="throughput")
    a2.plot(b, [r["mean_latency_s"] for r in sweep], "o-", label="measured (mean request)")
    a2.plot(b, [r["latency_floor_s"] for r in sweep], "k--", label="bandwidth floor")
    a2.set_xscale("log", base=2)
    a2.set(xlabel="batch size", ylabel="seconds", title="latency per request")
    for ax in (a1, a2):
        ax.grid(alpha=0.3)
    a2.legend()
    return _save(fig, plt, path)


def decode_vs_floor(paged: dict, path: Path) -> str:
    """Decode time per step (latency / output tokens) against the roofline floor, per batch size."""
    plt = _pyplot()
    sweep = paged["sweep"]
    b = [r["batch_size"] for r in sweep]
    out_len = paged["sweep"][0]["latency_floor_s"] / paged["sweep"][0]["decode_floor_s"]
    fig, ax = plt.subplots(figsize=(6, 4))
    ax.plot(b, [1e3 * r["mean_latency_s"] / out_len for r in sweep], "o-", label="measured per token")
    ax.plot(b, [1e3 * r["decode_floor_s"] for r in sweep], "k--", label="floor (bytes / bandwidth)")
    ax.set_xscale("log", base=2)
    ax.set(xlabel="batch size", ylabel="ms per decode step", title="decode vs its floor")
    ax.grid(alpha=0.3)
    ax.legend()
    return _save(fig, plt, path)


def request_cdf(payload: dict, key: str, title: str, path: Path) -> str:
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(6, 4))
    for label, run in payload["runs"].items():
        _cdf(ax, [r[key] for r in run["requests"]], label)
    ax.set(xlabel="seconds", ylabel="fraction of requests", title=title, ylim=(0, 1.02))
    ax.grid(alpha=0.3)
    ax.legend()
    return _save(fig, plt, path)


def spec_speedup(spec: dict, path: Path) -> str:
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(6, 4))
    for method in sorted({r["method"] for r in spec["results"]} - {"off"}):
        rs = [r for r in spec["results"] if r["method"] == method]
        ax.scatter([r["acceptance_rate"] for r in rs], [r["speedup"] for r in rs], label=method)
        for r in rs:
            ax.annotate(f"{r['task']} b{r['batch_size']}", (r["acceptance_rate"], r["speedup"]), fontsize=7)
    ax.axhline(1.0, color="k", lw=0.8)
    ax.set(xlabel="acceptance rate", ylabel="speedup over no speculation", title="speculative decoding")
    ax.grid(alpha=0.3)
    ax.legend()
    return _save(fig, plt, path)


def bars(labels: list[str], values: list[float], title: str, ylabel: str, path: Path, reference=None) -> str:
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(6, 4))
    ax.bar(labels, values, label="measured here")
    if reference is not None:
        ax.plot(labels, reference, "k*", markersize=10, label="reference")
        ax.legend()
    ax.axhline(1.0, color="k", lw=0.8)
    ax.set(title=title, ylabel=ylabel)
    ax.grid(alpha=0.3, axis="y")
    return _save(fig, plt, path)


def make_all(rows: list[dict], out_dir: str | Path, results_dir: str | Path | None = None) -> dict[str, str]:
    out, results = Path(out_dir), Path(results_dir or rows and rows[0].get("results_dir") or ".")
    plots: dict[str, str] = {}
    paged = _load(rows, results, "paged_attention")
    if paged:
        plots["batch_sweep"] = batch_sweep(paged, out / "paged_batch_sweep.png")
        plots["decode_vs_floor"] = decode_vs_floor(paged, out / "decode_vs_floor.png")
    serve = _load(rows, results, "continuous_batching")
    if serve:
        plots["latency_cdf"] = request_cdf(serve, "e2e_s", "end-to-end latency: static vs continuous",
                                           out / "serve_latency_cdf.png")
    prefix = _load(rows, results, "prefix_caching")
    if prefix:
        plots["ttft_cdf"] = request_cdf(prefix, "ttft_s", "time to first token: prefix cache off vs on",
                                        out / "prefix_ttft_cdf.png")
    spec = _load(rows, results, "speculative_decoding")
    if spec:
        plots["spec_speedup"] = spec_speedup(spec, out / "spec_speedup_vs_acceptance.png")
    tp = _load(rows, results, "tensor_parallel")
    if tp:
        rs = [r for r in tp["results"] if r["tp"] > 1 and r["predicted_speedup"]]
        if rs:
            ref = tp.get("reference_speedups", {}).get("seed", {})
            plots["tp"] = bars([f"TP={r['tp']}" for r in rs],
                               [r["measured_speedup"] or r["predicted_speedup"]["accelerator"] for r in rs],
                               "tensor parallelism (predicted where no devices)", "speedup", out / "tp.png",
                               [ref.get(str(r["tp"]), ref.get(r["tp"], float("nan"))) for r in rs])
    moe = _load(rows, results, "moe")
    if moe:
        s = moe["summary"]
        plots["moe"] = bars([f"b{r['batch_size']}" for r in s], [r["speedup"] for r in s],
                            "MoE over its dense twin (stars: ratio of bytes read)", "speedup", out / "moe.png",
                            [r["bytes_ratio"] for r in s])
    quant = _load(rows, results, "quantization")
    if quant:
        rs = [r for r in (quant.get("summary") or quant.get("results") or []) if r.get("speedup") is not None]
        if rs:
            plots["quant"] = bars([f"{r.get('method')} {r.get('shape', '')}" for r in rs], [r["speedup"] for r in rs],
                                  "quantization vs unquantized", "speedup", out / "quant.png")
    return plots
