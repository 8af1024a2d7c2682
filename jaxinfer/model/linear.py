"""The one function every linear projection of the model goes through: ``linear(x, w)``.

A dense weight ``w [in, out]`` is a plain matmul of activations ``x [..., in]``. A quantized weight (a
``QuantizedWeight`` pytree from ``jaxinfer.quantization.quantized_weight``, placed in the params by quantize-on-load or a
pre-quantized checkpoint) goes to ``quantized_linear(x, w)``, which picks the Pallas kernel on a GPU and the
measured CPU formulation elsewhere, so the model code never changes. Sharding does not look in here
either: under ``jit`` with sharded weights XLA partitions the matmul (column- or row-parallel) from the
weights' shardings (a quantized weight's scales are sharded with its output channels).

On one CPU device the dense linear weights are stored K-major (``KMajorWeight``: ``[out, in]``, the
contraction over the last axis of both operands): XLA:CPU's matrix-vector products read them faster
(on a 2-core CPU, the chain of a 134M Llama's weights at batch 1: 23.0 ms K-major vs 27.0 ms ``[in, out]``;
keeping ``[in, out]`` with a K-major device layout instead was 8x slower) — when they are large: the embedded
default model's 256 x 256 and 256 x 768 weights ran slower K-major (decode at batch 4: 3.48 vs 2.74 ms), the
134M model's 768-wide ones (>= 2.4 MB) faster, so only weights of at least ``K_MAJOR_MIN_BYTES`` convert.
``k_major_linear_weights`` converts a params pytree once, at load. Float32 products with a K-major weight go
to the C++ kernels (``jaxinfer.cpu.ffi.product``) where they are faster than XLA's dot: decode-sized ones
(up to ``MATVEC_MAX_ROWS``) to the matvec kernel (1.3x XLA's dot over the 134M Llama's weights at batch 1);
larger ones stay with XLA. A weight's static ``cpu_kernel`` flag turns that off (``with_cpu_kernels``: what
``attention_backend="xla"`` applies).

Not routed through here: the stacked routed-expert weights of an MoE layer (``jaxinfer.model.moe`` indexes one
expert at a time or calls ``ragged_dot``: a grouped matmul, not a linear), and the tied LM head
(``embed.T`` of the embedding table).
"""

from __future__ import annotations

import dataclasses
import functools
import math
from typing import Any

import jax
import jax.numpy as jnp

from jaxinfer.cpu import ffi as cpu_ffi
from jaxinfer.quantization.quantized_weight import LINEAR_WEIGHT_NAMES, QuantizedWeight, quantized_linear

K_MAJOR_MIN_BYTES = 1 << 20  # between the two measured sizes (768 KB: slower K-major; 2.4 MB: faster)


@functools.partial(jax.tree_util.register_dataclass, data_fields=["t"], meta_fields=["cpu_kernel"])
@dataclasses.dataclass(frozen=True)
class KMajorWeight:
    """A dense linear weight ``w [in, out]`` held transposed: ``t = w.T``, ``[out, in]``. ``cpu_kernel``
    (static): whether its products may go to the C++ kernels (``with_cpu_kernels``)."""

    t: Any
    cpu_kernel: bool = True

    @property
    def shape(self) -> tuple[int, int]:
        return self.t.shape[1], self.t.shape[0]

    @property
    def dtype(self):
        return self.t.dtype


def linear(x, w, *, out_dtype=None):
    """``x @ w``; ``out_dtype``: the result (and accumulation) dtype, default the promoted input dtype
    (for a quantized ``w``: x's dtype)."""
    if isinstance(w, QuantizedWeight):
        return quantized_linear(x, w, out_dtype=out_dtype)
    if isinstance(w, KMajorWeight):
        rows = math.prod(x.shape[:-1])
        kind = {jnp.dtype(jnp.float32): "f32", jnp.dtype(jnp.bfloat16): "bf16"}.get(jnp.dtype(w.dtype))
        if w.cpu_kernel and out_dtype in (None, jnp.float32) and kind and x.dtype == jnp.float32:
            y = cpu_ffi.product(x.reshape(rows, x.shape[-1]), w.t, kind=kind)
            if y is not None:
                return y.reshape(*x.shape[:-1], w.t.shape[0])
        t = w.t.astype(x.dtype) if x.dtype == jnp.float32 and w.dtype != x.dtype else w.t  # bf16 weights, f32 compute
        return jax.lax.dot_general(x, t, (((x.ndim - 1,), (1,)), ((), ())), preferred_element_type=out_dtype)
    if out_dtype is None:
        return x @ w
    return jnp.dot(x, w, preferred_element_type=out_dtype)


def k_major_linear_weights(params: dict, min_bytes: int | None = None) -> dict:
    """``params`` with every dense layer linear weight (``LINEAR_WEIGHT_NAMES``) and an untied LM head of at
    least ``min_bytes`` as ``KMajorWeight`` (quantized weights, already ``[out, in]``, smaller ones and
    everything else unchanged); ``min_bytes`` defaults to 0 when the C++ matvec kernel is available (it is
    faster than XLA on small weights too: the embedded model's decode at batch 1 / 4 takes 1.31 / 2.06 ms with
    it, 1.56 / 2.94 ms with XLA's dot), else to ``K_MAJOR_MIN_BYTES``."""
    if min_bytes is None:
        min_bytes = 0 if cpu_ffi.available() else K_MAJOR_MIN_BYTES

    def convert(w):
        if isinstance(w, jax.Array) and w.ndim == 2 and w.nbytes >= min_bytes:
            return KMajorWeight(jnp.asarray(w.T))  # a real copy: the transposed bytes, not a view
        return w

    out = dict(params)
    out["layers"] = [{k: convert(v) if k in LINEAR_WEIGHT_NAMES else v for k, v in lp.items()}
                     for lp in params["layers"]]
    if "lm_head" in out:
        out["lm_head"] = convert(out["lm_head"])
    return out


def _has_cpu_kernel_flag(w) -> bool:
    return isinstance(w, (KMajorWeight, QuantizedWeight))


def with_cpu_kernels(params, enabled: bool):
    """``params`` with every K-major and quantized weight's ``cpu_kernel`` flag set to ``enabled`` (the same
    arrays: only the static flag changes). ``enabled=False`` keeps every product with XLA's formulations:
    ``make_step_fn(cfg, "xla")`` applies it inside the traced step, which is how ``attention_backend="xla"``
    means no C++ kernel anywhere. With True, the kernels take the products where they are loaded and faster."""
    def tag(w):
        if _has_cpu_kernel_flag(w) and w.cpu_kernel != enabled:
            return dataclasses.replace(w, cpu_kernel=enabled)
        return w

    return jax.tree.map(tag, params, is_leaf=_has_cpu_kernel_flag)
