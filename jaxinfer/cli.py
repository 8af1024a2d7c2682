"""The ``jaxinfer`` command: ``generate`` text from a model, ``convert`` an HF checkpoint to orbax, ``serve`` it
over an OpenAI-compatible HTTP API (``jaxinfer.server``), and ``env``: what this machine gives jaxinfer
(``jaxinfer.env_report``)."""

from __future__ import annotations

import argparse
import json
import sys

from jaxinfer.config.engine import ATTENTION_BACKENDS


def _generate(args) -> int:
    from jaxinfer import LLM, SamplingParams

    llm = LLM(model=args.model, dtype=args.dtype, max_model_len=args.max_model_len,
              attention_backend=args.attention_backend, seed=args.seed)
    params = SamplingParams(temperature=args.temperature, top_p=args.top_p, top_k=args.top_k,
                            max_tokens=args.max_tokens, seed=args.seed, n=args.n)
    prompts = args.prompt or [line.rstrip("\n") for line in sys.stdin if line.strip()]
    if args.token_ids:
        prompts = [{"prompt_token_ids": [int(t) for t in p.replace(",", " ").split()]} for p in prompts]
    for out in llm.generate(prompts, params, use_tqdm=False):
        for comp in out.outputs:
            if args.json:
                print(json.dumps({"prompt": out.prompt, "text": comp.text, "token_ids": comp.token_ids,
                                  "finish_reason": comp.finish_reason}))
            else:
                print((out.prompt or "") + comp.text if comp.text or out.prompt else comp.token_ids)
    return 0


def _convert(args) -> int:
    import jax.numpy as jnp

    from jaxinfer.loading.loader import convert_hf_checkpoint

    if args.quantization is not None:
        return _convert_quantized(args)
    out = convert_hf_checkpoint(args.hf_dir, args.out_dir, dtype=jnp.dtype(args.dtype), overwrite=args.overwrite)
    print(f"wrote {out}")
    return 0


def _serve(args) -> int:
    from jaxinfer.server.launch import serve

    return serve(args)


def _env(args) -> int:
    from jaxinfer import env_report

    return env_report.main(as_json=args.json)


def _convert_quantized(args) -> int:
    """``convert --quantization METHOD``: quantize on load (as ``LLM(quantization=METHOD)`` does; e4m3
    weights kept as float8) and write a quantized orbax directory (``jaxinfer.loading.quantized_orbax``)."""
    import jax.numpy as jnp

    from jaxinfer.config.model import ModelConfig
    from jaxinfer.loading.loader import load_hf_params
    from jaxinfer.loading.quantized_orbax import save_quantized_params
    from jaxinfer.quantization import options as quant_setup

    cfg = ModelConfig.from_pretrained(args.hf_dir)
    options = quant_setup.QuantOptions(args.quantization, include_lm_head=args.quantize_lm_head)
    quant_setup.check_checkpoint(options, args.hf_dir)
    if quant_setup.checkpoint_kind(args.hf_dir) != "dense":
        raise SystemExit(f"{args.hf_dir} is already quantized: convert an unquantized checkpoint")
    dtype = jnp.dtype(args.dtype)
    params = quant_setup.apply(load_hf_params(args.hf_dir, cfg, dtype), cfg, options, platform="any")
    out = save_quantized_params(params, args.out_dir, cfg, copy_files_from=args.hf_dir, overwrite=args.overwrite)
    print(quant_setup.summary_line(quant_setup.describe(params, cfg, dtype, options)))
    print(f"wrote {out}")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="jaxinfer")
    sub = parser.add_subparsers(dest="command", required=True)
    g = sub.add_parser("generate", help="generate completions (prompts as arguments or one per stdin line)")
    g.add_argument("prompt", nargs="*")
    g.add_argument("--model", default=None, help="HF dir, converted dir, or random:<preset>; default: embedded model")
    g.add_argument("--dtype", default="auto")
    g.add_argument("--max-model-len", type=int, default=None)
    g.add_argument("--attention-backend", default="auto", choices=ATTENTION_BACKENDS,
                   help="pallas, xla (pure XLA), cpu (the C++ CPU kernels); auto: pallas on a GPU, cpu on a CPU")
    g.add_argument("--max-tokens", type=int, default=64)
    g.add_argument("--temperature", type=float, default=0.0)
    g.add_argument("--top-p", type=float, default=1.0)
    g.add_argument("--top-k", type=int, default=0)
    g.add_argument("--n", type=int, default=1)
    g.add_argument("--seed", type=int, default=0)
    g.add_argument("--token-ids", action="store_true", help="prompts are whitespace/comma separated token ids")
    g.add_argument("--json", action="store_true", help="one JSON object per completion")
    g.set_defaults(func=_generate)
    c = sub.add_parser("convert", help="convert an HF safetensors checkpoint to an orbax checkpoint")
    c.add_argument("hf_dir")
    c.add_argument("out_dir")
    c.add_argument("--dtype", default="bfloat16", choices=["float32", "bfloat16", "float16"])
    c.add_argument("--overwrite", action="store_true")
    c.add_argument("--quantization", default=None, choices=["fp8", "fp8_w8a16", "int8"],
                   help="quantize the linear weights (absmax per output channel) and write a quantized checkpoint")
    c.add_argument("--quantize-lm-head", action="store_true", help="with --quantization: the LM head too")
    c.set_defaults(func=_convert)
    s = sub.add_parser("serve", help="serve a model over an OpenAI-compatible HTTP API (needs the server extra)")
    from jaxinfer.server.launch import add_arguments as add_serve_arguments

    add_serve_arguments(s)
    s.set_defaults(func=_serve)
    e = sub.add_parser("env", help="report versions, devices, the attention backend 'auto' picks, the C++ CPU "
                                   "kernels, the caches and the JAXINFER_* variables set (for bug reports)")
    e.add_argument("--json", action="store_true", help="one JSON object")
    e.set_defaults(func=_env)
    args = parser.parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    raise SystemExit(main())
