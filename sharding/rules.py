"""The one table from logical axes to mesh axes, and the checks that a model fits a mesh.

Every array the engine shards names its dimensions with logical axes: the params through
``jaxinfer.model.weights`` (one ``ParamSpec`` per leaf), the KV cache and the step's activations here. Their
shardings all come from ``LOGICAL_AXIS_RULES``; a new layer kind adds rows to it, not code elsewhere.

The layout is Megatron's: q/k/v and gate/up are column-parallel (their output axis split), o and down
row-parallel (their input axis split), so a dense layer's attention and MLP each end in one all-reduce;
the embedding and LM head are split over the vocabulary; the residual stream (``embed``) is replicated.
"""

from __future__ import annotations

from jax.sharding import PartitionSpec

from jaxinfer.config.model import ModelConfig
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


def kv_heads_on_devices(cfg: ModelConfig, tensor_parallel_size: int) -> int:
    """KV heads the sharded model keeps: ``num_kv_heads``, or ``tensor_parallel_size`` when that is larger
    (each KV head is then replicated ``tp // num_kv_heads`` times, so every device holds exactly the one
    head its query heads read: GQA with fewer KV heads than devices, and MQA)."""
    return max(cfg.num_kv_heads, tensor_parallel_size)


def validate(cfg: ModelConfig, tensor_parallel_size: int, expert_parallel_size: int = 1,
             num_devices: int | None = None) -> None:
    """ValueError, naming the setting to change, if ``cfg`` cannot be split this way. Pure: run it before
    anything is allocated."""
    tp, ep = tensor_parallel_size, expert_parallel_size
    check_parallel_sizes(tp, ep, num_devices)
    if ep > 1 and not cfg.is_moe:
        raise ValueError(
            f"expert parallelism (expert_parallel_size={ep}) needs a mixture-of-experts model; "
            f"this {cfg.architecture} model is dense: turn expert parallelism off"
        )
    if cfg.num_heads % tp:
        raise ValueError(
            f"num_attention_heads={cfg.num_heads} is not divisible by tensor_parallel_size={tp}: "
            f"use a tensor_parallel_size that divides it ({_divisors(cfg.num_heads)})"
        )
    if cfg.num_kv_heads % tp and tp % cfg.num_kv_heads:
        raise ValueError(
            f"num_key_value_heads={cfg.num_kv_heads} and tensor_parallel_size={tp}: one must divide the other "
            "(the KV heads are split over the devices, or replicated so each device holds one)"
        )
    sizes = [("vocab_size", cfg.vocab_size, "vocab")]
    if cfg.is_moe:
        sizes.append(("num_experts", cfg.num_experts, "experts"))
        sizes.append(("moe_intermediate_size", cfg.moe_intermediate_size, "expert_mlp"))
        if cfg.shared_expert_intermediate_size:
            sizes.append(("shared_expert_intermediate_size", cfg.shared_expert_intermediate_size, "mlp"))
    else:
        sizes.append(("intermediate_size", cfg.intermediate_size, "mlp"))
    for name, value, axis in sizes:
        n = shards(axis, tp, ep)
        if value % n:
            raise ValueError(
                f"{name}={value} cannot be split {n} ways (tensor_parallel_size={tp}, "
                f"expert_parallel_size={ep}); choose sizes whose split divides it"
            )


def _divisors(n: int) -> str:
    return ", ".join(str(d) for d in range(1, n + 1) if n % d == 0)
