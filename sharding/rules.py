"""The one table from logical axes to mesh axes, and the checks that a model's sizes fit a mesh.

Every array that is sharded names its dimensions with logical axes (the caller declares them: one tuple of
names per param leaf, and here the KV cache and the attention activations). Their shardings all come from
``LOGICAL_AXIS_RULES``; a new layer kind adds rows to it, not code elsewhere. Nothing here knows a model
config: ``validate`` takes head counts as ints and the other split dimensions as ``(name, size, axis)``.

The layout is Megatron's: q/k/v and gate/up are column-parallel (their output axis split), o and down
row-parallel (their input axis split), so a dense layer's attention and MLP each end in one all-reduce;
the embedding and LM head are split over the vocabulary; the residual stream (``embed``) is replicated.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import jax
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from sharding.mesh import ALL_DEVICES, EXPERT, TENSOR, check_parallel_sizes

# logical axis -> the mesh axes it is split over (empty: replicated)
LOGICAL_AXIS_RULES: dict[str | None, tuple[str, ...]] = {
    "vocab": ALL_DEVICES,  # vocab-parallel embedding and LM head (logits gathered for the sampled rows only)
    "embed": (),  # the residual stream: every device holds all of it
    "q_heads": ALL_DEVICES,  # attention runs on each device's own heads (EP included: attention stays TP)
    "kv_heads": ALL_DEVICES,  # KV heads follow their query heads (replicated up to the device count if fewer)
    "head_dim": (),
    "mlp": ALL_DEVICES,  # dense MLP and Qwen2-MoE's shared expert
    "experts": (EXPERT,),  # routed experts spread over the expert axis
    "expert_mlp": (TENSOR,),  # each routed expert's FFN split over the rest
    None: (),  # never split (the router's expert axis: every device routes every token)
}

KV_CACHE_AXES = (None, None, "kv_heads", "head_dim")  # [num_blocks, block_size, kv_heads, head_dim]
HEADS_ACTIVATION_AXES = (None, "q_heads", "head_dim")  # q / attention output [tokens, heads, head_dim]


def mesh_axes(logical_axis: str | None) -> tuple[str, ...]:
    if logical_axis not in LOGICAL_AXIS_RULES:
        raise KeyError(f"logical axis {logical_axis!r} has no row in sharding.rules.LOGICAL_AXIS_RULES")
    return LOGICAL_AXIS_RULES[logical_axis]


def partition_spec(logical_axes) -> PartitionSpec:
    """The ``PartitionSpec`` of an array whose dimensions are named by ``logical_axes``."""
    entries = []
    for axis in logical_axes:
        mapped = mesh_axes(axis)
        entries.append(None if not mapped else mapped[0] if len(mapped) == 1 else mapped)
    return PartitionSpec(*entries)


def shards(logical_axis: str | None, tensor_parallel_size: int, expert_parallel_size: int) -> int:
    """How many ways a dimension named ``logical_axis`` is split on a mesh of these sizes."""
    size = {EXPERT: expert_parallel_size, TENSOR: tensor_parallel_size // expert_parallel_size}
    n = 1
    for axis in mesh_axes(logical_axis):
        n *= size[axis]
    return n


def named_sharding(mesh: Mesh, logical_axes) -> NamedSharding:
    """Where an array whose dimensions are named by ``logical_axes`` lives on ``mesh``."""
    return NamedSharding(mesh, partition_spec(logical_axes))


def tree_shardings(mesh: Mesh, logical_axes_tree: Any) -> Any:
    """``named_sharding`` of every leaf of a pytree whose leaves are tuples of logical axes (e.g. the
    logical axes of each param of a model)."""
    return jax.tree.map(lambda axes: named_sharding(mesh, axes), logical_axes_tree,
                        is_leaf=lambda a: isinstance(a, tuple))


def kv_heads_on_devices(num_kv_heads: int, tensor_parallel_size: int) -> int:
    """KV heads the sharded model keeps: ``num_kv_heads``, or ``tensor_parallel_size`` when that is larger
    (each KV head is then replicated ``tp // num_kv_heads`` times, so every device holds exactly the one
    head its query heads read: GQA with fewer KV heads than devices, and MQA)."""
    return max(num_kv_heads, tensor_parallel_size)


def validate(tensor_parallel_size: int, expert_parallel_size: int = 1, *, num_heads: int, num_kv_heads: int,
             dims: Iterable[tuple[str, int, str | None]] = (), num_devices: int | None = None) -> None:
    """ValueError, naming the setting to change, if a model of these sizes cannot be split this way. Pure:
    run it before anything is allocated. ``dims``: the other split dimensions as ``(name, size,
    logical_axis)``, e.g. ``("vocab_size", 151936, "vocab")``; each must divide evenly."""
    tp, ep = tensor_parallel_size, expert_parallel_size
    check_parallel_sizes(tp, ep, num_devices)
    if num_heads % tp:
        raise ValueError(
            f"num_attention_heads={num_heads} is not divisible by tensor_parallel_size={tp}: "
            f"use a tensor_parallel_size that divides it ({_divisors(num_heads)})"
        )
    if num_kv_heads % tp and tp % num_kv_heads:
        raise ValueError(
            f"num_key_value_heads={num_kv_heads} and tensor_parallel_size={tp}: one must divide the other "
            "(the KV heads are split over the devices, or replicated so each device holds one)"
        )
    for name, value, axis in dims:
        n = shards(axis, tp, ep)
        if value % n:
            raise ValueError(
                f"{name}={value} cannot be split {n} ways (tensor_parallel_size={tp}, "
                f"expert_parallel_size={ep}); choose sizes whose split divides it "
                f"(splits of up to 64 that do: {_divisors(value, 64)})"
            )


def _divisors(n: int, up_to: int | None = None) -> str:
    return ", ".join(str(d) for d in range(1, min(n, up_to or n) + 1) if n % d == 0)
