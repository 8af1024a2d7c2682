"""``jaxinfer-bench compare``: the same HF checkpoint in HF transformers (PyTorch, CPU) and in jaxinfer.

Both decode greedily the same random prompts. Reported per batch size: end-to-end generate throughput
(median of ``--repeats`` calls per side; jaxinfer's prefix cache is off, as HF has none), TPOT (HF:
``(t(N) - t(1)) / (N - 1)`` from the median ``generate`` times; jaxinfer: median engine step), the
fraction of the memory bandwidth (measured in the same run) each achieves at its TPOT, and greedy token
agreement. Without ``--model`` a ~150M-parameter Llama with random weights is written by transformers itself.
HF runs first, in a separate process, so neither framework's threads compete with the other's.
"""

from __future__ import annotations

import json
import statistics
import time
from pathlib import Path

import numpy as np

from bench import hardware, latency, report
from jaxinfer import LLM, SamplingParams

DEFAULT_CACHE = Path.home() / ".cache" / "jaxinfer" / "llama-150m-hf"


def ensure_hf_checkpoint(path: Path, preset: str = "llama-150m") -> Path:
    """Write a random checkpoint with real transformers (once); returns its directory."""
    if (path / "config.json").is_file():
        return path
    import torch
    import transformers

    from jaxinfer.presets import preset_hf_dict

    d = preset_hf_dict(preset)
    d.pop("architectures", None)
    config = transformers.LlamaConfig(**d, initializer_range=0.05)
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(config)
    model.save_pretrained(path, safe_serialization=True)
    return path


def _hf_generate(model, prompts: np.ndarray, n: int) -> tuple[float, np.ndarray]:
    import torch

    ids = torch.tensor(prompts)
    t = time.perf_counter()
    with torch.no_grad():
        out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=n, min_new_tokens=n,
                             do_sample=False, pad_token_id=0)
    return time.perf_counter() - t, out[:, prompts.shape[1]:].numpy()


def _hf_worker(path: str, jobs: list, queue) -> None:
    """Runs in a fresh process (no JAX threads beside torch's): HF generate timings and tokens per job."""
    import torch
    import transformers

    model = transformers.AutoModelForCausalLM.from_pretrained(path, local_files_only=True,
                                                              dtype=torch.float32).eval()
    results = []
    for prompts, n, repeats in jobs:
        _hf_generate(model, prompts, 2)  # warm-up
        t1 = statistics.median(_hf_generate(model, prompts, 1)[0] for _ in range(repeats))
        runs = [_hf_generate(model, prompts, n) for _ in range(repeats)]
        tn, tokens = statistics.median(t for t, _ in runs), runs[0][1]
        results.append((t1, tn, tokens))
    queue.put((torch.__version__, transformers.__version__, torch.get_num_threads(), results))


def run_hf_baseline(path: Path, jobs: list) -> tuple:
    import multiprocessing as mp

    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    proc = ctx.Process(target=_hf_worker, args=(str(path), jobs, queue))
    proc.start()
    out = queue.get()
    proc.join()
    return out


def run(args) -> dict:
    path = Path(args.model) if args.model else ensure_hf_checkpoint(Path(args.cache_dir))
    with open(path / "config.json") as f:
        vocab = json.load(f)["vocab_size"]
    n = args.output_len
    all_prompts = {b: np.random.default_rng(b).integers(0, vocab, size=(b, args.input_len)) for b in args.batch_sizes}
    torch_version, tf_version, torch_threads, hf_runs = run_hf_baseline(
        path, [(all_prompts[b], n, args.repeats) for b in args.batch_sizes])
    llm = LLM(model=str(path), dtype="float32", max_model_len=args.input_len + args.output_len + 16,
              max_num_seqs=max(args.batch_sizes), enable_prefix_caching=False)  # HF has no prefix cache
    engine = llm.llm_engine
    cfg = engine.model_config
    bw = hardware.measure_bandwidth()
    results, rows = [], []
    for b, (hf_t1, hf_tn, hf_tokens) in zip(args.batch_sizes, hf_runs):
        prompts = all_prompts[b]
        hf_tpot = (hf_tn - hf_t1) / (n - 1)
        sp = SamplingParams(temperature=0.0, max_tokens=n, ignore_eos=True)
        reqs = [{"prompt_token_ids": p.tolist()} for p in prompts]
        t = time.perf_counter()
        llm.generate(reqs, sp, use_tqdm=False)  # the first call (the plan was compiled at construction)
        first_s = time.perf_counter() - t
        times = []
        for _ in range(args.repeats):
            t = time.perf_counter()
            outs = llm.generate(reqs, sp, use_tqdm=False)
            times.append(time.perf_counter() - t)
        ours_t = statistics.median(times)
        ours_tpot = latency.run_batch(llm, b, args.input_len, n, seed=4)["tpot_s"]
        ours_tokens = np.array([o.outputs[0].token_ids for o in outs])

        agree = (ours_tokens == hf_tokens)
        prefix = [int(np.argmin(np.append(row, False))) for row in agree]  # leading identical tokens
        floor = hardware.decode_bytes_per_step(cfg, engine.dtype, b, args.input_len + n / 2) / bw.bytes_per_s
        r = {
            "batch_size": b,
            "hf_tok_per_s": b * n / hf_tn, "jaxinfer_tok_per_s": b * n / ours_t,
            "jaxinfer_first_call_tok_per_s": b * n / first_s,
            "speedup_generate": hf_tn / ours_t,
            "hf_tpot_s": hf_tpot, "jaxinfer_tpot_s": ours_tpot, "speedup_tpot": hf_tpot / ours_tpot,
            "floor_s": floor, "hf_bandwidth_fraction": floor / hf_tpot,
            "jaxinfer_bandwidth_fraction": floor / ours_tpot,
            "greedy_sequences_identical": float(np.mean(agree.all(axis=1))),
            "greedy_mean_identical_prefix": float(np.mean(prefix)),
        }
        results.append(r)
        rows.append([b, r["hf_tok_per_s"], r["jaxinfer_tok_per_s"], r["speedup_generate"], hf_tpot * 1e3,
                     ours_tpot * 1e3, floor * 1e3, r["hf_bandwidth_fraction"], r["jaxinfer_bandwidth_fraction"],
                     f"{r['greedy_sequences_identical']:.0%}"])
    report.print_table(
        f"HF transformers vs jaxinfer — {path} ({cfg.num_params / 1e6:.0f}M params, float32); "
        f"bandwidth {bw.bytes_per_s / 1e9:.1f} GB/s ({bw.probe}); {args.input_len}+{args.output_len} tokens",
        ["batch", "HF tok/s", "jaxinfer tok/s", "speedup", "HF TPOT ms", "ours TPOT ms", "floor ms",
         "HF floor/TPOT", "ours floor/TPOT", "greedy identical"], rows)
    payload = {"benchmark": "compare", "machine": hardware.machine_info(), "model": str(path),
               "num_params": cfg.num_params, "torch_version": torch_version, "hf_in_separate_process": True,
               "transformers_version": tf_version, "torch_threads": torch_threads,
               "input_len": args.input_len, "output_len": args.output_len, "bandwidth": bw.to_json(),
               "results": results}
    report.write_json(args.output, payload)
    return payload


def add_arguments(p) -> None:
    p.add_argument("--model", default=None, help="an HF checkpoint dir; default: a random 150M Llama written by transformers")
    p.add_argument("--cache-dir", default=str(DEFAULT_CACHE), help="where the default checkpoint is written")
    p.add_argument("--batch-sizes", type=int, nargs="+", default=[1, 16])
    p.add_argument("--input-len", type=int, default=32)
    p.add_argument("--output-len", type=int, default=64)
    p.add_argument("--repeats", type=report.positive_int, default=3, help="timed generate calls per side; the median is reported")
    p.add_argument("--output", default=None, help="write the results as JSON here")
