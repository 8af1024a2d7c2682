"""The one function every linear projection of the model goes through: ``linear(x, w)``.

A dense weight ``w [in, out]`` is a plain matmul of activations ``x [..., in]``. A quantized weight (a
``QuantizedWeight`` pytree from ``jaxinfer.quantization``, placed in the params by quantize-on-load or a
pre-quantized checkpoint) goes to ``quantized_linear(x, w)``, which picks the Pallas kernel on a GPU and the
measured CPU formulation elsewhere, so the model code never changes. Sharding does not look in here
either: under ``jit`` with sharded weights XLA partitions the matmul (column- or row-parallel) from the
weights' shardings (a quantized weight's scales are sharded with its output channels).

Not routed through here: the stacked routed-expert weights of an MoE layer (``jaxinfer.moe`` indexes one
expert at a time or calls ``ragged_dot``: a grouped matmul, not a linear), and the tied LM head
(``embed.T`` of the embedding table).
"""

from __future__ import annotations

import jax.numpy as jnp

from jaxinfer.quantization import QuantizedWeight, quantized_linear


def linear(x, w, *, out_dtype=None):
    """``x @ w``; ``out_dtype``: the result (and accumulation) dtype, default the promoted input dtype
    (for a quantized ``w``: x's dtype)."""
    if isinstance(w, QuantizedWeight):
        return quantized_linear(x, w, out_dtype=out_dtype)
    if out_dtype is None:
        return x @ w
    return jnp.dot(x, w, preferred_element_type=out_dtype)
