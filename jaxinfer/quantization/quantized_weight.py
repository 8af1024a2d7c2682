"""Quantized linear weights: their representation, quantization on load, and the one matmul the
model calls, independent of the engine.

A dense linear weight is ``[in, out]`` (``jaxinfer.model.weights``); its quantized form is a
``QuantizedWeight`` pytree holding the 8-bit weight K-major, ``qweight [N, K] = [out, in]`` (the
layout of HF checkpoints, and the B operand an fp8 tensor-core dot wants), and its scales:

=============  =================  ===============================  ============================
method         qweight            scale                            activations
=============  =================  ===============================  ============================
"fp8"          float8_e4m3fn      [N] per output channel           e4m3, dynamic per token (or a
                                                                   static per-tensor input_scale)
"fp8_w8a16"    float8_e4m3fn      [N] per output channel           unquantized (weight-only)
"int8"         int8               [N] per output channel           unquantized (weight-only)
"fp8_block"    float8_e4m3fn      [ceil(N/BN), ceil(K/BK)] blocks  e4m3 per token and BK group
=============  =================  ===============================  ============================

``dequantize(qw)[k, n] == qweight[n, k] * scale[...]``: scales multiply. On the CPU, e4m3 weights
may be held as their bytes typed int8 (``with_cpu_storage``), which XLA:CPU decodes 10x faster.

``quantized_linear(x, qw)`` is ``x @ dequantize(qw)`` computed the method's way: the Pallas kernels
(``pallas_kernels.fp8_matmul`` / ``w8a16_matmul`` / ``fp8_block_matmul``) on a GPU, and on the
CPU the formulation measured fastest there (``jaxinfer.cpu.quantized_matmul``), with the same numerics: the
W8A8 methods quantize the activations exactly as the kernels do.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from jaxinfer.cpu import quantized_matmul as quant_cpu
from pallas_kernels import fp8_format as fp8
from pallas_kernels.fp8_block_matmul import DEFAULT_BLOCK_SHAPE, dequantize_blocks, fp8_block_matmul
from pallas_kernels.fp8_matmul import fp8_matmul
from pallas_kernels.w8a16_matmul import w8a16_matmul

METHODS = ("fp8", "fp8_w8a16", "int8", "fp8_block")
FP8_METHODS = ("fp8", "fp8_w8a16", "fp8_block")
IMPLEMENTATIONS = ("pallas", "cpu", "xla")
# Linear weights of the params pytree (jaxinfer.model.weights) that quantize_params converts by default.
LINEAR_WEIGHT_NAMES = ("wq", "wk", "wv", "wo", "w_gate", "w_up", "w_down")


@functools.partial(jax.tree_util.register_dataclass,
                   data_fields=["qweight", "scale", "input_scale"],
                   meta_fields=["method", "block_shape", "cpu_kernel"])
@dataclasses.dataclass(frozen=True)
class QuantizedWeight:
    """An 8-bit linear weight (a pytree; ``method`` and ``block_shape`` are static).

    qweight      [N, K]  K-major (= HF's [out, in]); int8 or float8_e4m3fn (see the module table)
    scale        [N] float32 per output channel, or [ceil(N/BN), ceil(K/BK)] for "fp8_block"
    input_scale  None, or a float32 scalar: a static per-tensor activation scale ("fp8" only)
    block_shape  (BN, BK) for "fp8_block", else None
    cpu_kernel   whether the "cpu" implementation may hand the product to the C++ kernels (static;
                 ``jaxinfer.model.linear.with_cpu_kernels``); False keeps XLA's formulation
    """

    qweight: Any
    scale: Any
    input_scale: Any = None
    method: str = "fp8"
    block_shape: tuple[int, int] | None = None
    cpu_kernel: bool = True

    def __post_init__(self):
        if self.method not in METHODS:
            raise ValueError(f"unknown quantization method {self.method!r}; choose from {METHODS}")
        if (self.method == "fp8_block") != (self.block_shape is not None):
            raise ValueError(f"block_shape={self.block_shape!r} is set for 'fp8_block' and only "
                             f"for it (method {self.method!r})")

    @property
    def in_features(self) -> int:
        return self.qweight.shape[1]

    @property
    def out_features(self) -> int:
        return self.qweight.shape[0]

    @property
    def shape(self) -> tuple[int, int]:
        """The dense weight's shape ``[in, out]``."""
        return (self.in_features, self.out_features)

    @property
    def nbytes(self) -> int:
        leaves = jax.tree.leaves(self)
        return sum(int(np.prod(a.shape)) * jnp.dtype(a.dtype).itemsize for a in leaves)


def check_method(method: str) -> str:
    if method not in METHODS:
        raise ValueError(f"unknown quantization method {method!r}; choose from {METHODS}")
    return method


def validate(qw: QuantizedWeight) -> QuantizedWeight:
    """Checks dtypes and shapes of a concrete QuantizedWeight (ValueError naming the mismatch)."""
    if not isinstance(qw, QuantizedWeight):
        raise ValueError(f"expected a QuantizedWeight, got {type(qw).__name__}")
    if qw.qweight.ndim != 2:
        raise ValueError(f"qweight must be [N, K], got shape {qw.qweight.shape}")
    dtype = jnp.dtype(qw.qweight.dtype)
    allowed = ((jnp.dtype(jnp.int8),) if qw.method == "int8"
               else (fp8.E4M3, jnp.dtype(jnp.int8)))  # int8-typed e4m3 bytes: CPU storage
    if dtype not in allowed:
        raise ValueError(f"method {qw.method!r} stores qweight as "
                         f"{' or '.join(map(str, allowed))}, got {dtype}")
    n, k = qw.qweight.shape
    want = ((-(-n // qw.block_shape[0]), -(-k // qw.block_shape[1])) if qw.method == "fp8_block"
            else (n,))
    if tuple(qw.scale.shape) != want:
        raise ValueError(f"method {qw.method!r}: scale must have shape {want} for qweight "
                         f"[{n}, {k}], got {tuple(qw.scale.shape)}")
    if qw.input_scale is not None and (qw.method != "fp8" or int(np.prod(qw.input_scale.shape)) != 1):
        raise ValueError(f"input_scale must be a scalar and only for method 'fp8' "
                         f"(got shape {qw.input_scale.shape} with {qw.method!r})")
    return qw


# ----------------------------------------------------------------------------------------------
# Quantize / dequantize
# ----------------------------------------------------------------------------------------------


@functools.partial(jax.jit, static_argnames=("method", "block_shape"))
def _quantize(w_in_out, method: str, block_shape):
    w = w_in_out.astype(jnp.float32).T  # [N, K]
    if method == "fp8_block":
        bn, bk = block_shape
        n, k = w.shape
        gn, gk = -(-n // bn), -(-k // bk)
        blocks = jnp.pad(w, ((0, gn * bn - n), (0, gk * bk - k))).reshape(gn, bn, gk, bk)
        scale = fp8.absmax_scale(jnp.max(jnp.abs(blocks), axis=(1, 3)), fp8.E4M3_MAX)
        q = fp8.saturate_to_e4m3(blocks / scale[:, None, :, None])
        return q.reshape(gn * bn, gk * bk)[:n, :k], scale
    if method == "int8":
        scale = fp8.absmax_scale(jnp.max(jnp.abs(w), axis=1), fp8.INT8_MAX)
        q = jnp.clip(jnp.round(w / scale[:, None]), -fp8.INT8_MAX, fp8.INT8_MAX).astype(jnp.int8)
        return q, scale
    scale = fp8.absmax_scale(jnp.max(jnp.abs(w), axis=1), fp8.E4M3_MAX)
    return fp8.saturate_to_e4m3(w / scale[:, None]), scale


def quantize_weight(w_in_out, method: str, *, block_shape: tuple[int, int] | None = None
                    ) -> QuantizedWeight:
    """Quantize a dense ``[in, out]`` weight by absmax per output channel (per block for
    "fp8_block", default 128 x 128). Activation scales stay dynamic (``input_scale=None``)."""
    check_method(method)
    if w_in_out.ndim != 2:
        raise ValueError(f"expected a dense [in, out] weight, got shape {w_in_out.shape}")
    if method == "fp8_block":
        block_shape = tuple(block_shape or DEFAULT_BLOCK_SHAPE)
    elif block_shape is not None:
        raise ValueError(f"block_shape only applies to 'fp8_block', not {method!r}")
    qweight, scale = _quantize(jnp.asarray(w_in_out), method, block_shape)
    return QuantizedWeight(qweight, scale, None, method, block_shape)


def _weight_values(qw: QuantizedWeight) -> jax.Array:
    """qweight as float32 numbers (unscaled), whatever its storage dtype."""
    if qw.method != "int8" and jnp.dtype(qw.qweight.dtype) == jnp.dtype(jnp.int8):
        return fp8.e4m3_bits_to_float(qw.qweight)
    return qw.qweight.astype(jnp.float32)


def dequantize(qw: QuantizedWeight) -> jax.Array:
    """The dense float32 ``[in, out]`` weight that ``qw`` stands for."""
    if qw.method == "fp8_block":
        return dequantize_blocks(_weight_values(qw), qw.scale, qw.block_shape).T
    return (_weight_values(qw) * qw.scale.astype(jnp.float32)[:, None]).T


def with_method(qw: QuantizedWeight, method: str) -> QuantizedWeight:
    """The same bytes run another way: per-channel e4m3 weights as "fp8" (W8A8) or "fp8_w8a16"
    (weight-only, e.g. on an A100). A static input_scale only survives into "fp8"."""
    check_method(method)
    if {qw.method, method} - {"fp8", "fp8_w8a16"}:
        if method == qw.method:
            return qw
        raise ValueError(f"cannot run {qw.method!r} weights as {method!r}; only 'fp8' and "
                         "'fp8_w8a16' share a layout")
    return QuantizedWeight(qw.qweight, qw.scale, qw.input_scale if method == "fp8" else None,
                           method, None)


def with_cpu_storage(qw: QuantizedWeight) -> QuantizedWeight:
    """e4m3 weights as their bytes typed int8 (a free view on the host), the fast form for
    XLA:CPU; other weights unchanged. Keep e4m3 for the GPU kernels."""
    if qw.method == "int8" or jnp.dtype(qw.qweight.dtype) != fp8.E4M3:
        return qw
    if isinstance(qw.qweight, np.ndarray):
        bits = qw.qweight.view(np.int8)
    else:
        bits = jnp.asarray(np.asarray(qw.qweight).view(np.int8))
    return dataclasses.replace(qw, qweight=bits)


# ----------------------------------------------------------------------------------------------
# The matmul
# ----------------------------------------------------------------------------------------------


def default_implementation() -> str:
    return "pallas" if jax.default_backend() == "gpu" else "cpu"


def _weight_kind(qw: QuantizedWeight) -> str:
    if qw.method == "int8":
        return "int8"
    return "e4m3_bits" if jnp.dtype(qw.qweight.dtype) == jnp.dtype(jnp.int8) else "e4m3"


def _quantize_activations_like_kernels(x, qw: QuantizedWeight):
    """x as the W8A8 kernels see it: quantized to e4m3 and dequantized (float32); unchanged for
    the weight-only methods."""
    if qw.method == "fp8":
        xq, x_scale = fp8.quantize_rows_fp8(x, qw.input_scale)
        return xq.astype(jnp.float32) * x_scale[:, None]
    if qw.method == "fp8_block":
        group = qw.block_shape[1]
        xq, x_scale = fp8.quantize_groups_fp8(x, group)
        return xq.astype(jnp.float32) * jnp.repeat(x_scale, group, axis=1)[:, :x.shape[1]]
    return x.astype(jnp.float32)


def _linear_cpu(x, qw: QuantizedWeight):
    from jaxinfer.cpu import ffi as cpu_ffi

    x = _quantize_activations_like_kernels(x, qw)
    kind = _weight_kind(qw)
    if qw.cpu_kernel and qw.method != "fp8_block" and kind != "e4m3":
        y = cpu_ffi.product(x, qw.qweight, qw.scale, kind)
        if y is not None:
            return y
    if qw.method != "fp8_block":
        return quant_cpu.chunked_dequant_matmul(x, qw.qweight, kind) * qw.scale[None, :]
    return quant_cpu.chunked_dequant_matmul(x, qw.qweight, kind, block_scale=qw.scale,
                                            block_shape=qw.block_shape)


def _linear_xla(x, qw: QuantizedWeight):
    """The plain XLA formulation (dequantize, dot): what XLA fuses on its own on a GPU."""
    x = _quantize_activations_like_kernels(x, qw)
    return jnp.dot(x, dequantize(qw), precision=jax.lax.Precision.HIGHEST)


def _linear_pallas(x, qw: QuantizedWeight, interpret: bool | None):
    if _weight_kind(qw) == "e4m3_bits":
        raise ValueError("int8-typed e4m3 bytes are CPU storage; the Pallas kernels want the "
                         "float8_e4m3fn weight (do not apply with_cpu_storage on a GPU)")
    if qw.method == "fp8":
        return fp8_matmul(x, qw.qweight, qw.scale, qw.input_scale, interpret=interpret)
    if qw.method == "fp8_block":
        return fp8_block_matmul(x, qw.qweight, qw.scale, block_shape=qw.block_shape,
                                interpret=interpret)
    return w8a16_matmul(x, qw.qweight, qw.scale, interpret=interpret)


def quantized_linear(x: jax.Array, qw: QuantizedWeight, *, out_dtype=None,
                     implementation: str | None = None, interpret: bool | None = None
                     ) -> jax.Array:
    """``x [..., K] @ dequantize(qw)`` -> ``[..., N]`` in ``out_dtype`` (default x's dtype).

    ``implementation``: "pallas" (the GPU kernels), "cpu" (``jaxinfer.cpu.quantized_matmul``), "xla"
    (dequantize then ``jnp.dot``), or None: "pallas" on a GPU, "cpu" elsewhere. ``interpret``
    is passed to the kernels (None: interpreted unless on a GPU; False to lower them for CUDA).
    """
    implementation = default_implementation() if implementation is None else implementation
    if implementation not in IMPLEMENTATIONS:
        raise ValueError(f"implementation must be one of {IMPLEMENTATIONS}, got {implementation!r}")
    if x.shape[-1] != qw.in_features:
        raise ValueError(f"x has {x.shape[-1]} features, the weight expects {qw.in_features} "
                         f"(qweight {tuple(qw.qweight.shape)} is [out, in])")
    lead = x.shape[:-1]
    x2 = x.reshape(-1, x.shape[-1])
    if implementation == "pallas":
        out = _linear_pallas(x2, qw, interpret)
    elif implementation == "cpu":
        out = _linear_cpu(x2, qw)
    else:
        out = _linear_xla(x2, qw)
    return out.astype(x.dtype if out_dtype is None else out_dtype).reshape(*lead, qw.out_features)


# ----------------------------------------------------------------------------------------------
# Whole params trees, sharding
# ----------------------------------------------------------------------------------------------


def is_quantized(x: Any) -> bool:
    return isinstance(x, QuantizedWeight)


def quantize_params(params: dict[str, Any], method: str, *, include_lm_head: bool = False,
                    block_shape: tuple[int, int] | None = None) -> dict[str, Any]:
    """The params pytree with every layer's linear weight (``LINEAR_WEIGHT_NAMES``) quantized;
    embeddings, norms, biases and (unless ``include_lm_head``) the LM head stay as they are."""
    check_method(method)
    quantize = functools.partial(quantize_weight, method=method, block_shape=block_shape)
    out = dict(params)
    out["layers"] = [{name: quantize(value) if name in LINEAR_WEIGHT_NAMES else value
                      for name, value in layer.items()} for layer in params["layers"]]
    if include_lm_head and "lm_head" in params:
        out["lm_head"] = quantize(params["lm_head"])
    return out


def weight_bytes(params: Any) -> int:
    """Bytes of every array in a params pytree (quantized weights count their scales)."""
    return sum(int(np.prod(a.shape)) * jnp.dtype(a.dtype).itemsize for a in jax.tree.leaves(params))


def logical_axes(qw: QuantizedWeight, dense_axes: tuple[str, str]) -> QuantizedWeight:
    """Logical axis names of each array of ``qw``, given the dense ``[in, out]`` weight's.

    Returns a QuantizedWeight whose leaves are tuples of axis names (map it with
    ``is_leaf=lambda a: isinstance(a, tuple)``): qweight ``(out, in)``; a per-channel scale
    ``(out,)``, shards with its channels; a block scale ``(out, in)``, shards with its blocks (the
    mesh axis must divide the block count); input_scale ``()``, replicated.
    """
    axis_in, axis_out = dense_axes
    scale_axes = (axis_out, axis_in) if qw.method == "fp8_block" else (axis_out,)
    return QuantizedWeight((axis_out, axis_in), scale_axes,
                           None if qw.input_scale is None else (), qw.method, qw.block_shape)
