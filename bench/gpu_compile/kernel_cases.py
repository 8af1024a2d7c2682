"""The Pallas kernels ``gpu-compile`` compiles, at the shapes the GPU suite runs them at.

* Ragged paged attention (``pallas_kernels.ragged_paged_attention``): every case of the GPU suite's sweep
  and of its on-device check (``bench.kernels``: decode, mixed, split-K, sliding window, block size 32,
  head dims 64 to 256, DeepSeek's latent rows), plus prefill chunks and an fp8 KV cache, bf16, laid out as
  the engine lays them out (tokens and sequences padded to powers of two, block 0 reserved).
* The quantized matmuls (``fp8_matmul`` W8A8, ``w8a16_matmul`` with int8 and e4m3 weights,
  ``fp8_block_matmul``) at Llama-2-7B's projection shapes (q/o, gate/up, down; Llama-3-8B's k/v) for
  M = 1, 64 and 512 tokens.

Each case is a ``CompileCase`` whose ``build(compiler)`` returns (jitted function, abstract arguments on
the target's device, static keywords); nothing is allocated.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable

import jax
import jax.numpy as jnp

from bench import kernels as attention_bench
from jaxinfer.runner.shape_plan import bucket

BF16 = jnp.bfloat16


@dataclasses.dataclass(frozen=True)
class CompileCase:
    """One executable to compile for every target."""

    group: str  # "attention" | "matmul" | "engine" | "mosaic"
    name: str
    build: Callable  # build(compiler) -> (jitted fn, abstract args, static kwargs)
    quick: bool = False  # part of the quick set (the test suite's)
    num_devices: int = 1  # compile-only devices it spans (tensor parallelism)


# ------------------------------------------------------------------------------------------- attention
def _attention_build(case: attention_bench.KernelCase, kv_dtype, compiler):
    from pallas_kernels.ragged_paged_attention import ragged_paged_attention

    h, bs = case.heads, case.block_size
    num_seqs, num_tokens = bucket(case.batch), bucket(case.num_tokens, 8)
    pages = [-(-kv // bs) for kv in case.kv_lens]
    num_blocks = 1 + sum(pages) + attention_bench.POISON_BLOCKS
    s = jax.ShapeDtypeStruct
    cache = s((num_blocks, bs, h.num_kv_heads, h.head_dim), kv_dtype)
    args = (s((num_tokens, h.num_q_heads, h.head_dim), BF16), cache, None if h.value_dim else cache,
            s((num_seqs, bucket(max(pages))), jnp.int32), s((num_seqs + 1,), jnp.int32), s((num_seqs,), jnp.int32))
    fn = jax.jit(functools.partial(ragged_paged_attention, sm_scale=h.head_dim ** -0.5,
                                   sliding_window=case.sliding_window, num_kv_splits=case.num_kv_splits,
                                   value_dim=h.value_dim, interpret=False))
    return fn, compiler.place(args), {}


def _prefill(heads, chunk, ctx):
    return attention_bench.KernelCase("prefill", heads, (chunk,), (ctx,))


def attention_cases() -> list[CompileCase]:
    kinds = attention_bench.GPU_HEAD_SHAPES
    cases = [(c, BF16) for c in attention_bench.gpu_cases() + attention_bench.gpu_check_cases()]
    cases += [(_prefill(h, chunk, ctx), BF16) for h in kinds for chunk, ctx in ((512, 512), (2048, 2048))]
    fp8 = jnp.float8_e4m3fn
    cases += [(attention_bench._decode(h, 16, 4096), fp8) for h in kinds]
    cases += [(attention_bench._mixed(attention_bench.LLAMA3_8B, 1, 512, 2048, 31, 4096), fp8),
              (_prefill(attention_bench.LLAMA3_8B, 512, 512), fp8)]
    quick = {0, 3}  # a decode and a mixed step of llama-3-8b: the test suite's sample
    out = []
    for i, (case, kv_dtype) in enumerate(cases):
        name = case.name + (" kv-fp8" if kv_dtype == fp8 else "")
        out.append(CompileCase("attention", name, functools.partial(_attention_build, case, kv_dtype),
                               quick=i in quick))
    return out


# --------------------------------------------------------------------------------------------- matmuls
# (name, N, K): the projection's output and input features
PROJECTIONS = (("llama-2-7b q/o", 4096, 4096), ("llama-2-7b gate/up", 11008, 4096),
               ("llama-2-7b down", 4096, 11008), ("llama-3-8b k/v", 1024, 4096))
TOKENS = (1, 64, 512)


def _matmul_build(kind: str, m: int, n: int, k: int, compiler):
    from pallas_kernels import fp8_block_matmul, fp8_matmul, w8a16_matmul

    s = jax.ShapeDtypeStruct
    x = s((m, k), BF16)
    if kind == "fp8_w8a8":
        fn, args = functools.partial(fp8_matmul.fp8_matmul, interpret=False), (
            x, s((n, k), jnp.float8_e4m3fn), s((n,), jnp.float32))
    elif kind in ("w8a16_int8", "w8a16_fp8"):
        wdt = jnp.int8 if kind == "w8a16_int8" else jnp.float8_e4m3fn
        fn, args = functools.partial(w8a16_matmul.w8a16_matmul, interpret=False), (
            x, s((n, k), wdt), s((n,), jnp.float32))
    elif kind == "fp8_block":
        bn, bk = fp8_block_matmul.DEFAULT_BLOCK_SHAPE
        fn, args = functools.partial(fp8_block_matmul.fp8_block_matmul, interpret=False), (
            x, s((n, k), jnp.float8_e4m3fn), s((-(-n // bn), -(-k // bk)), jnp.float32))
    else:
        raise ValueError(kind)
    return jax.jit(fn), compiler.place(args), {}


MATMUL_KINDS = ("fp8_w8a8", "w8a16_int8", "w8a16_fp8", "fp8_block")


def matmul_cases() -> list[CompileCase]:
    out = []
    for kind in MATMUL_KINDS:
        for proj, n, k in PROJECTIONS:
            for m in TOKENS:
                out.append(CompileCase("matmul", f"{kind} {proj} M={m} (N={n}, K={k})",
                                       functools.partial(_matmul_build, kind, m, n, k),
                                       quick=(proj, m) == (PROJECTIONS[1][0], 64)))
    return out


# ------------------------------------------------------------------------------------------- oversized
def _oversized_build(compiler):
    """w8a16 with 256 x 128 x 512 tiles over 4 stages: ~1.3 MiB of shared memory, past every GPU's limit."""
    from pallas_kernels import w8a16_matmul

    s = jax.ShapeDtypeStruct
    fn = functools.partial(w8a16_matmul.w8a16_matmul, interpret=False, block_m=256, block_n=128, block_k=512,
                           num_stages=4, num_warps=8)
    args = (s((512, 4096), BF16), s((4096, 4096), jnp.int8), s((4096,), jnp.float32))
    return jax.jit(fn), compiler.place(args), {}


def oversized_cases() -> list[CompileCase]:
    """A deliberately oversized tile (not in the default groups): the check that a failure is reported."""
    return [CompileCase("oversized", "w8a16_int8 M=512 with 256x128x512 tiles, 4 stages", _oversized_build,
                        quick=True)]
