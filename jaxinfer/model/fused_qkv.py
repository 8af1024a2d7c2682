"""One weight for the query, key and value projections on a single GPU: ``wqkv = [wq | wk | wv]``.

The params pytree declares ``wq``, ``wk`` and ``wv`` separately (``jaxinfer.model.weights``: one HF
tensor each). The three share their input, so on a GPU ``fuse_qkv_weights`` concatenates them once, at
load, into ``wqkv [H, (Hq + 2 Hkv) * D]`` and the decoder (``qkv_projection``) computes all three with one
matmul, splitting the result. The products are the same (one output column is one dot product either way).

Why at load: left separate, XLA's dot merger joins two of the three itself, with the concatenation of the
two weights inside the GEMM kernel, at every step; compiled for an A100 without autotuning
(``jaxinfer-bench gpu-compile``), that merged kernel of the Llama-2-7B mixed step of 16 tokens used 8 bytes
of stack (a register spill), the one spill of the whole run, while one GEMM over a weight concatenated at
load compiles clean (56 registers). It is also one GEMM launch per layer instead of two.

Applied on one GPU device to plain weight arrays only: a quantized weight (``QuantizedWeight``, with its
own scales and Pallas kernels) keeps the three products, a tensor-parallel model keeps its per-head
column shardings, and the CPU keeps its K-major weights (``jaxinfer.model.linear``), whose fast matvec was
measured separately per projection.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

QKV_NAMES = ("wq", "wk", "wv")


def _fusable(lp: dict) -> bool:
    return all(isinstance(lp.get(n), (jax.Array, jax.ShapeDtypeStruct)) for n in QKV_NAMES) and len(
        {lp[n].dtype for n in QKV_NAMES}) == 1


def fuse_qkv_weights(params: dict) -> dict:
    """``params`` with each layer's plain ``wq``, ``wk``, ``wv`` replaced by ``wqkv`` (their concatenation
    along the output axis); layers whose three are not plain arrays of one dtype are left as they are.
    Abstract params (``jax.ShapeDtypeStruct`` leaves) get the abstract fused weight. The separate arrays
    are freed when the caller drops ``params`` (until then the attention weights are held twice)."""
    layers = []
    for lp in params["layers"]:
        if not _fusable(lp):
            layers.append(lp)
            continue
        fused = {k: v for k, v in lp.items() if k not in QKV_NAMES}
        parts = [lp[n] for n in QKV_NAMES]
        if isinstance(parts[0], jax.ShapeDtypeStruct):
            width = sum(p.shape[1] for p in parts)
            fused["wqkv"] = jax.ShapeDtypeStruct((parts[0].shape[0], width), parts[0].dtype)
        else:
            fused["wqkv"] = jnp.concatenate(parts, axis=1)
        layers.append(fused)
    return {**params, "layers": layers}


def qkv_projection(lp: dict, x, q_size: int, kv_size: int, linear):
    """``(q, k, v)`` of the activations ``x [T, H]``: from ``wqkv`` with one ``linear`` if the layer has
    it, else one ``linear`` per weight."""
    if "wqkv" not in lp:
        return linear(x, lp["wq"]), linear(x, lp["wk"]), linear(x, lp["wv"])
    qkv = linear(x, lp["wqkv"])
    return qkv[..., :q_size], qkv[..., q_size:q_size + kv_size], qkv[..., q_size + kv_size:]
