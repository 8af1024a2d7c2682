"""The one function every linear projection of the model goes through: ``linear(x, w)``.

Today it is a plain matmul of activations ``x [..., in]`` with a weight ``w [in, out]``. It is the single
point where quantized weights plug in: a quantized checkpoint stores some leaves as a ``QuantizedWeight``
pytree (``jaxinfer.quantization``), and this function will dispatch those to ``quantized_linear(x, qw)``,
so the model code never changes. Sharding does not look in here either: under ``jit`` with sharded
weights XLA partitions the matmul (column- or row-parallel) from the weights' shardings.

Not routed through here: the stacked routed-expert weights of an MoE layer (``jaxinfer.moe`` indexes one
expert at a time or calls ``ragged_dot``: a grouped matmul, not a linear), and the tied LM head
(``embed.T`` of the embedding table).
"""

from __future__ import annotations

import jax.numpy as jnp


def linear(x, w, *, out_dtype=None):
    """``x @ w``; ``out_dtype``: the result (and accumulation) dtype, default the promoted input dtype."""
    if out_dtype is None:
        return x @ w
    return jnp.dot(x, w, preferred_element_type=out_dtype)
