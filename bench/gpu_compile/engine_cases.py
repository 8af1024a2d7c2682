"""The engine's own executables ``gpu-compile`` compiles, at 7B shapes: what a GPU engine compiles at start.

Built the way the engine builds them (``jaxinfer.runner.model_runner``: ``make_step_fn`` with Pallas
attention, ``choose_tokens``), from abstract params (random-weight model shapes: ``jaxinfer.config.presets``),
an abstract paged KV cache and abstract step batches of the shape plan (``jaxinfer.runner.shape_plan``):

* Llama-2-7B bf16: the decode steps at 1 and 8 sequences and the mixed steps of 16 and 512 tokens of the plan
  the GPU suite's start-up stage uses (``max_num_seqs=16``, ``max_num_batched_tokens=512``, 4096-token
  context, 16-token blocks), and the token chooser (greedy, and the general sampler with logprobs);
* tensor parallelism: Qwen2.5-7B's decode and mixed steps at TP = 2 and 4, over compile-only devices;
* an MoE model: Qwen3-30B-A3B's decode and mixed steps;
* the other families' steps (Gemma 2 / 3, Phi-3, GPT-OSS, DeepSeek-V2-Lite / V3's latent attention).

``layers`` cuts each model to its first N layers (the test suite compiles one layer's worth; every layer
of a model is the same code at the same shapes, so one layer is the whole model's set of kernels).
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp

from bench.gpu_compile.kernel_cases import CompileCase
from jaxinfer.config.presets import preset_config
from jaxinfer.runner.shape_plan import SamplerVariant, ShapePlan

BF16 = jnp.bfloat16
BLOCK_SIZE = 16
MAX_MODEL_LEN = 4096
PLAN = ShapePlan(max_num_seqs=16, max_num_batched_tokens=512)
STEP_TOKENS = {"decode": (1, 8), "mixed": (16, 512)}  # the plan's steps compiled per model


def _config(name: str, layers: int | None):
    cfg = preset_config(name)
    if layers is None:
        return cfg
    n = min(layers, cfg.num_layers)
    return dataclasses.replace(cfg, num_layers=n, layer_types=cfg.layer_types[:n])


def _shape(kind: str, tokens: int):
    shapes = [s for s in PLAN.step_shapes() if s.num_tokens == tokens and s.kind == kind]
    if not shapes:
        raise ValueError(f"the plan has no {kind} step of {tokens} tokens: {PLAN.step_shapes()}")
    return shapes[0]


def _step_build(model: str, kind: str, tokens: int, layers: int | None, tp: int, compiler):
    from jaxinfer.model import weights
    from jaxinfer.model.fused_qkv import fuse_qkv_weights
    from jaxinfer.runner.batch_packing import abstract_batch
    from jaxinfer.runner.step_functions import make_step_fn

    cfg = _config(model, layers)
    shape = _shape(kind, tokens)
    max_blocks = MAX_MODEL_LEN // BLOCK_SIZE
    num_blocks = 1 + PLAN.max_num_seqs * max_blocks
    if tp == 1:
        from jaxinfer.model.kv_cache import kv_cache_array_shape

        cache_one = jax.ShapeDtypeStruct(kv_cache_array_shape(cfg, num_blocks, BLOCK_SIZE), BF16)  # MLA: the latent
        params = fuse_qkv_weights(weights.abstract_params(cfg, BF16))  # as load_model places them on one GPU
        args = compiler.place((params, [(cache_one,) * cfg.kv_cache_arrays] * cfg.num_layers,
                               abstract_batch(shape, max_blocks)))
        step = make_step_fn(cfg, "pallas", interpret=False)
    else:
        from jaxinfer.model.sharding_plan import ShardingPlan

        plan = ShardingPlan.create(cfg, compiler.mesh(tp))
        args = (plan.abstract_params(BF16), plan.abstract_kv_cache(num_blocks, BLOCK_SIZE, BF16),
                abstract_batch(shape, max_blocks, sharding=plan.replicated))
        step = make_step_fn(plan.cfg, "pallas", interpret=False, sharding_plan=plan)
    return step, args, {"query_width": shape.query_width}


def _tokens_build(model: str, rows: int, variant: SamplerVariant, compiler):
    from jaxinfer.runner.step_functions import abstract_sampling_metadata, choose_tokens

    cfg = preset_config(model)
    args = compiler.place((jax.ShapeDtypeStruct((rows, cfg.vocab_size), jnp.float32),
                           abstract_sampling_metadata(rows, variant, MAX_MODEL_LEN, 16),
                           jax.ShapeDtypeStruct((rows,), jnp.int32)))
    statics = {"greedy": variant.greedy, "num_logprobs": variant.num_logprobs, "penalties": variant.penalties,
               "speculative": False}
    bitmask = None
    if variant.masked:  # structured outputs: the grammar's allowed tokens per row (jaxinfer.structured)
        (bitmask,) = compiler.place((jax.ShapeDtypeStruct((rows, -(-cfg.vocab_size // 32)), jnp.int32),))
    return choose_tokens, (*args, None, bitmask), statics


def engine_cases(layers: int | None = None) -> list[CompileCase]:
    """``layers``: None for whole models (the bench), else the first N layers of each (the test suite)."""
    depth = "all layers" if layers is None else f"{layers} layer{'s' * (layers != 1)}"
    out = []

    def step(model, kind, tokens, tp=1, quick=False):
        tp_s = f" TP={tp}" if tp > 1 else ""
        out.append(CompileCase("engine", f"{model} {kind} step T={tokens}{tp_s} ({depth})",
                               functools.partial(_step_build, model, kind, tokens, layers, tp), quick=quick,
                               num_devices=tp))

    for kind, token_counts in STEP_TOKENS.items():
        for t in token_counts:
            step("llama-2-7b", kind, t, quick=(kind, t) == ("decode", 8))
    for variant in (SamplerVariant(True, 0, False), SamplerVariant(False, 20, True),
                    SamplerVariant(True, 0, False, masked=True), SamplerVariant(False, 20, True, masked=True)):
        out.append(CompileCase("engine", f"llama-2-7b token chooser rows=16 ({variant})",
                               functools.partial(_tokens_build, "llama-2-7b", 16, variant),
                               quick=variant.greedy))
    for tp in (2, 4):
        step("qwen2.5-7b", "decode", 8, tp, quick=tp == 2)
        step("qwen2.5-7b", "mixed", 512, tp)
    step("qwen3-30b-a3b", "decode", 8, quick=True)
    step("qwen3-30b-a3b", "mixed", 512)
    # head_dim 256; Gemma 2's soft-capped attention, Gemma 3's local / global layers (both kinds from 2 layers on)
    for model in ("gemma-2-9b", "gemma-3-4b"):
        step(model, "decode", 8, quick=True)
        step(model, "mixed", 512)
    step("gemma-2-9b", "decode", 8, 2)
    step("phi-3-mini", "decode", 8)  # sliding window 2047 over the whole plan's context
    step("phi-3-mini", "mixed", 512)
    # attention sinks in the kernel, the biased router and experts, the clamped SwiGLU; sliding / full layers
    step("gpt-oss-20b", "decode", 8, quick=True)
    step("gpt-oss-20b", "mixed", 512)
    step("gpt-oss-20b", "decode", 8, 2)
    # MLA over the latent cache (576-wide rows, 512 of them the values), the kernel's latent-row mode; V2-Lite's
    # 16 heads in one program, V3's 128 in head blocks; V2-Lite's layer 1 is an MoE layer (V3's first 3 are dense)
    step("deepseek-v2-lite", "decode", 8, quick=True)
    step("deepseek-v2-lite", "mixed", 512)
    step("deepseek-v2-lite", "decode", 8, 2)
    step("deepseek-v3", "decode", 8)
    step("deepseek-v3", "mixed", 512)
    return out
