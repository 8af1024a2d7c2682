"""A model laid over a mesh: which config the sharded model runs, and where every array lives.

The engine's side of tensor / expert parallelism: it knows the model config, the weights declaration
(``jaxinfer.model.weights``), the MoE block, the KV cache and quantized weights, and hands the top-level
``sharding`` package (which knows none of them) logical axes, head counts and functions to wrap::

    mesh = sharding.make_mesh(tensor_parallel_size, expert_parallel_size)   # over jax.devices()
    plan = ShardingPlan.create(cfg, mesh)                                   # ValueError if cfg cannot split so
    params = loader.load_hf_params(path, cfg, dtype, shardings=plan.load_shardings())
    params = plan.place_params(params)                                      # KV heads replicated if tp > kv heads
    kv_cache = plan.allocate_kv_cache(num_blocks, block_size, dtype)
    step = jax.jit(lambda p, c, b: model.forward(p, c, b, plan.cfg, plan.shard_attention(attn_fn),
                                                 moe_fn=plan.moe_fn(), gather_logits=plan.gather_logits),
                   in_shardings=(plan.param_shardings(), plan.kv_cache_sharding, plan.batch_sharding),
                   out_shardings=(plan.logits_sharding, plan.kv_cache_sharding), donate_argnums=1)

``ShardingPlan.create(cfg, mesh)`` validates (``validate``: a clear ValueError before anything is
allocated) and fixes the one way the sharded model differs from the checkpoint: when the tensor-parallel
size exceeds the number of KV heads, each KV head is replicated so that every device holds the head its
query heads read (``plan.cfg.num_kv_heads == tp``; the model is mathematically the same, since GQA over
repeated KV heads is GQA over the originals). The k/v projections (and biases) are expanded the same way
by ``place_params``, so they stay column-parallel: each device computes just its own KV head. A
vocabulary the split does not divide is padded (``vocab_padding``: zero rows in the embedding and LM head,
quantized or not; ``plan.cfg.vocab_padding``), and ``model.forward`` drops the padding's logits after
gathering them (``gather_logits``), so nothing downstream sees it.

From the plan come the shardings of the params (the weights declaration's logical axes through
``sharding.rules.LOGICAL_AXIS_RULES``), of the KV cache (split by KV head: every device holds every block for
its heads, so the host's block ids are valid on every device), of the step batch (replicated), and of the
logits (replicated: the LM head is vocab-parallel and only the rows that are sampled are gathered).
A quantized weight (``jaxinfer.quantization.quantized_weight.QuantizedWeight``) is placed with its scales
sharded like its output channels (``quantized_shardings``).
"""

from __future__ import annotations

import dataclasses
import functools
import math
from typing import Any

import jax
import jax.numpy as jnp
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from jaxinfer.config.model import ModelConfig
from jaxinfer.model import moe, weights
from jaxinfer.model.kv_cache import allocate_kv_cache, kv_cache_array_shape, kv_cache_bytes_per_block
from jaxinfer.quantization.quantized_weight import QuantizedWeight, is_quantized
from jaxinfer.quantization.quantized_weight import logical_axes as quant_logical_axes
from sharding import ops, rules
from sharding.mesh import EXPERT, check_parallel_sizes
from sharding.rules import KV_CACHE_AXES

# the params of a layer that the MoE block reads (those the config has): they go into its shard_map
MOE_KEYS = ("router", "router_bias", *moe.EXPERT_KEYS, "shared_w_gate", "shared_w_up", "shared_w_down", "shared_gate")


def validate(cfg: ModelConfig, tensor_parallel_size: int, expert_parallel_size: int = 1,
             num_devices: int | None = None) -> None:
    """ValueError, naming the setting to change, if ``cfg`` cannot be split this way (``sharding.rules.validate``
    on its head counts and split dimensions). Pure: run it before anything is allocated."""
    tp, ep = tensor_parallel_size, expert_parallel_size
    check_parallel_sizes(tp, ep, num_devices)
    if ep > 1 and not cfg.is_moe:
        raise ValueError(
            f"expert parallelism (expert_parallel_size={ep}) needs a mixture-of-experts model; "
            f"this {cfg.architecture} model is dense: turn expert parallelism off"
        )
    dims = []  # the vocabulary is padded to an even split (``vocab_padding``), never refused
    if cfg.is_mla and (cfg.first_k_dense_replace or not cfg.is_moe):  # DeepSeek's dense layers
        dims.append(("intermediate_size", cfg.intermediate_size, "mlp"))
    if cfg.num_shared_experts:
        dims.append(("n_shared_experts * moe_intermediate_size", cfg.num_shared_experts * cfg.moe_intermediate_size,
                     "mlp"))
    if cfg.is_moe:
        dims.append(("num_experts", cfg.num_experts, "experts"))
        dims.append(("moe_intermediate_size", cfg.moe_intermediate_size, "expert_mlp"))
        if cfg.shared_expert_intermediate_size:
            dims.append(("shared_expert_intermediate_size", cfg.shared_expert_intermediate_size, "mlp"))
    else:
        dims.append(("intermediate_size", cfg.intermediate_size, "mlp"))
    rules.validate(tp, ep, num_heads=cfg.num_heads, num_kv_heads=cfg.num_kv_heads, dims=dims,
                   num_devices=num_devices)


def _is_spec(x) -> bool:
    return isinstance(x, weights.ParamSpec)


VOCAB_PAD_MULTIPLE = 64  # a padded vocabulary is a multiple of this (and of the split), as vLLM pads it


def vocab_padding(vocab_size: int, shards: int) -> int:
    """Rows to append to a vocabulary of ``vocab_size`` split ``shards`` ways: 0 when the split is even,
    else up to the next multiple of lcm(64, shards)."""
    if vocab_size % shards == 0:
        return 0
    multiple = math.lcm(VOCAB_PAD_MULTIPLE, shards)
    return -vocab_size % multiple


@dataclasses.dataclass(frozen=True)
class ShardingPlan:
    mesh: Mesh
    source_cfg: ModelConfig  # the checkpoint's config (what the loader reads)
    cfg: ModelConfig  # what the sharded model runs: KV heads replicated up to the device count if fewer

    @classmethod
    def create(cls, cfg: ModelConfig, mesh: Mesh) -> "ShardingPlan":
        tp, ep = mesh.size, mesh.shape[EXPERT]
        validate(cfg, tp, ep)
        kv_heads = cfg.num_kv_heads if cfg.is_mla else rules.kv_heads_on_devices(cfg.num_kv_heads, tp)
        run_cfg = dataclasses.replace(cfg, num_kv_heads=kv_heads,
                                      vocab_padding=vocab_padding(cfg.vocab_size, rules.shards("vocab", tp, ep)))
        return cls(mesh, cfg, run_cfg)

    @property
    def tensor_parallel_size(self) -> int:
        return self.mesh.size

    @property
    def expert_parallel_size(self) -> int:
        return self.mesh.shape[EXPERT]

    @property
    def kv_head_repeats(self) -> int:
        """How many devices hold a copy of each of the checkpoint's KV heads (1: none replicated)."""
        return self.cfg.num_kv_heads // self.source_cfg.num_kv_heads

    def named(self, logical_axes) -> NamedSharding:
        return rules.named_sharding(self.mesh, logical_axes)

    @property
    def replicated(self) -> NamedSharding:
        return NamedSharding(self.mesh, PartitionSpec())

    # ------------------------------------------------------------------ params
    def param_shardings(self) -> Any:
        """Shardings of the params pytree the sharded model runs (``self.cfg``)."""
        return rules.tree_shardings(self.mesh, weights.logical_axes(self.cfg))

    def load_shardings(self) -> Any:
        """Shardings for loading the checkpoint's params (``source_cfg``) before ``place_params``: as
        ``param_shardings``, except KV projections that are to be replicated stay whole on each device."""
        def one(spec):
            axes = spec.logical_axes
            if self.kv_head_repeats > 1:
                axes = tuple(None if a == "kv_heads" else a for a in axes)
            if self.cfg.vocab_padding:  # an uneven split cannot be placed: whole until padded
                axes = tuple(None if a == "vocab" else a for a in axes)
            return self.named(axes)

        return jax.tree.map(one, weights.param_specs(self.source_cfg), is_leaf=_is_spec)

    def place_params(self, params: Any) -> Any:
        """The checkpoint's params (any placement, e.g. from ``loader.load_hf_params(..., load_shardings())``)
        as the sharded model's: KV projections expanded if heads are replicated, every leaf resharded.
        One leaf at a time (no second copy of the model)."""
        flat, treedef = jax.tree_util.tree_flatten(weights.param_specs(self.cfg), is_leaf=_is_spec)
        leaves = jax.tree_util.tree_leaves(params, is_leaf=is_quantized)
        if len(leaves) != len(flat):
            raise ValueError(f"params have {len(leaves)} leaves; the config declares {len(flat)}")
        placed = []
        for spec, leaf in zip(flat, leaves):
            if is_quantized(leaf):
                placed.append(self._place_quantized(spec, leaf))
                continue
            sharding = self.named(spec.logical_axes)
            if "vocab" in spec.logical_axes and self.cfg.vocab_padding:
                placed.append(_pad_axis_fn(spec.logical_axes.index("vocab"), self.cfg.vocab_padding, sharding)(leaf))
            elif "kv_heads" in spec.logical_axes and self.kv_head_repeats > 1:
                placed.append(_repeat_heads_fn(spec.logical_axes.index("kv_heads"), self.source_cfg.head_dim,
                                               self.kv_head_repeats, sharding)(leaf))
            else:
                placed.append(jax.device_put(leaf, sharding))
        return jax.tree_util.tree_unflatten(treedef, placed)

    def quantized_shardings(self, spec: weights.ParamSpec, qw: QuantizedWeight) -> QuantizedWeight:
        """Shardings of a quantized weight's arrays: qweight [out, in] as the dense weight's axes (swapped),
        per-channel scales with their output channels, block scales with their blocks, a static input scale
        replicated (the rows of ``sharding.rules`` via ``quantization.logical_axes``)."""
        axes = quant_logical_axes(qw, spec.logical_axes)
        if qw.method == "fp8_block":
            for size, axis in zip(qw.scale.shape, axes.scale):
                n = rules.shards(axis, self.tensor_parallel_size, self.expert_parallel_size)
                if size % n:
                    raise ValueError(f"{spec.hf_name}: {size} weight blocks along {axis!r} cannot be split "
                                     f"{n} ways; choose a tensor_parallel_size that divides the block count")
        return rules.tree_shardings(self.mesh, axes)

    def _place_quantized(self, spec: weights.ParamSpec, qw: QuantizedWeight) -> QuantizedWeight:
        if "vocab" in spec.logical_axes and self.cfg.vocab_padding:
            qw = self._pad_quantized_vocab(spec, qw)
        shardings = self.quantized_shardings(spec, qw)
        if "kv_heads" in spec.logical_axes and self.kv_head_repeats > 1:
            if qw.method == "fp8_block":
                raise NotImplementedError(f"{spec.hf_name}: block-quantized KV projections cannot be replicated "
                                          "over more devices than KV heads; use a smaller tensor_parallel_size")
            repeat = functools.partial(_repeat_heads_fn, 0, self.source_cfg.head_dim, self.kv_head_repeats)
            return dataclasses.replace(qw, qweight=repeat(shardings.qweight)(qw.qweight),
                                       scale=repeat(shardings.scale)(qw.scale),
                                       input_scale=None if qw.input_scale is None else
                                       jax.device_put(qw.input_scale, shardings.input_scale))
        return jax.device_put(qw, shardings)

    def _pad_quantized_vocab(self, spec: weights.ParamSpec, qw: QuantizedWeight) -> QuantizedWeight:
        """A quantized LM head with the padded vocabulary's output channels: zero weights, scale 1 (their
        logits are 0 and dropped by the model)."""
        if qw.method == "fp8_block":
            raise NotImplementedError(
                f"{spec.hf_name}: a block-quantized LM head cannot be padded to split vocab_size="
                f"{self.cfg.vocab_size} {self.tensor_parallel_size} ways; leave the LM head unquantized or use "
                "a tensor_parallel_size that divides the vocabulary")
        pad = self.cfg.vocab_padding
        qweight = jnp.pad(qw.qweight, ((0, pad), (0, 0)))  # [N, K] = [vocab, hidden]
        scale = jnp.pad(qw.scale, (0, pad), constant_values=1.0)
        return dataclasses.replace(qw, qweight=qweight, scale=scale)

    def abstract_params(self, dtype=jnp.float32) -> Any:
        """The sharded params as ``ShapeDtypeStruct``s with shardings (ahead-of-time compilation)."""
        return jax.tree.map(lambda a, s: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=s),
                            weights.abstract_params(self.cfg, dtype), self.param_shardings())

    def weight_bytes_per_device(self, dtype=jnp.float32) -> int:
        """Bytes of params each device holds (from the shardings: replicated leaves count in full)."""
        total = 0
        for a in jax.tree.leaves(self.abstract_params(dtype)):
            local = a.sharding.shard_shape(a.shape)
            n = 1
            for d in local:
                n *= d
            total += n * jnp.dtype(a.dtype).itemsize
        return total

    # ---------------------------------------------------------------- KV cache
    @property
    def kv_cache_sharding(self) -> NamedSharding:
        """Split by KV head; MLA's one latent array per layer is replicated (every device's heads read it all)."""
        return self.replicated if self.cfg.is_mla else self.named(KV_CACHE_AXES)

    def allocate_kv_cache(self, num_blocks: int, block_size: int, dtype) -> list:
        return allocate_kv_cache(self.cfg, num_blocks, block_size, dtype, sharding=self.kv_cache_sharding)

    def abstract_kv_cache(self, num_blocks: int, block_size: int, dtype) -> list:
        shape = kv_cache_array_shape(self.cfg, num_blocks, block_size)
        one = jax.ShapeDtypeStruct(shape, jnp.dtype(dtype), sharding=self.kv_cache_sharding)
        return [(one,) * self.cfg.kv_cache_arrays for _ in range(self.cfg.num_layers)]

    def kv_cache_bytes_per_block_per_device(self, block_size: int, dtype) -> int:
        """What one more KV block costs each device (size the KV pool from per-device free memory)."""
        shards = 1 if self.cfg.is_mla else self.tensor_parallel_size  # MLA's latent cache is replicated
        return kv_cache_bytes_per_block(self.cfg, block_size, dtype) // shards

    # ----------------------------------------------------------- step in / out
    @property
    def batch_sharding(self) -> NamedSharding:
        """Every StepBatch array: replicated (each device needs all block tables, lengths and tokens)."""
        return self.replicated

    @property
    def logits_sharding(self) -> NamedSharding:
        return self.replicated

    # ------------------------------------------------------------- the model
    @property
    def gather_logits(self):
        """``model.forward``'s ``gather_logits``: the logits made whole before a padded vocabulary is dropped."""
        return ops.replicate(self.mesh)

    def shard_attention(self, attn_fn):
        return ops.shard_attention(attn_fn, self.mesh, cache_axes=(None,) * 4 if self.cfg.is_mla else KV_CACHE_AXES)

    def moe_fn(self, impl: str = "auto"):
        """A ``moe_fn(lp, x, valid, cfg)`` for ``model.forward``: on one device the plain MoE block, else each
        device's local experts (and its slice of a shared expert) under ``shard_map``, then one psum."""
        if self.mesh.size == 1:  # nothing to split: no shard_map, no (trivial) all-reduce
            return functools.partial(moe.moe_block, impl=impl)
        cfg = self.cfg
        moe_layer = next((i for i in range(cfg.num_layers) if cfg.layer_is_moe(i)), 0)  # DeepSeek: dense first
        layer_specs = weights.param_specs(cfg)["layers"][moe_layer]
        param_axes = {k: layer_specs[k].logical_axes for k in MOE_KEYS if k in layer_specs}

        def local(lp, x, valid, expert_offset, tensor_rank):
            return moe.moe_block(lp, x, valid, cfg, expert_offset=expert_offset, impl=impl, tensor_rank=tensor_rank)

        sharded = ops.shard_moe(local, self.mesh, param_axes, cfg.num_experts // self.expert_parallel_size)

        def moe_fn(lp, x, valid, cfg_):
            return sharded(lp, x, valid)

        return moe_fn


@functools.lru_cache(maxsize=None)
def _pad_axis_fn(axis: int, pad: int, sharding):
    """Jitted: append ``pad`` zero entries along ``axis`` (the padded vocabulary), placed with ``sharding``."""
    def pad_fn(x):
        widths = [(0, 0)] * x.ndim
        widths[axis] = (0, pad)
        return jnp.pad(x, widths)

    return jax.jit(pad_fn, out_shardings=sharding)


@functools.lru_cache(maxsize=None)
def _repeat_heads_fn(axis: int, head_dim: int, repeats: int, sharding):
    """Jitted: repeat each head (``head_dim`` entries of dimension ``axis``) ``repeats`` times, placed with
    ``sharding`` (head h of the result is the source's head h // repeats)."""
    def repeat(x):
        shape = x.shape
        heads = x.reshape(*shape[:axis], shape[axis] // head_dim, head_dim, *shape[axis + 1:])
        heads = jnp.repeat(heads, repeats, axis=axis)
        return heads.reshape(*shape[:axis], shape[axis] * repeats, *shape[axis + 1:])

    return jax.jit(repeat, out_shardings=sharding)


def param_shardings(cfg: ModelConfig, mesh: Mesh) -> Any:
    """Shardings of the sharded model's params (see ``ShardingPlan.param_shardings``)."""
    return ShardingPlan.create(cfg, mesh).param_shardings()


def kv_cache_sharding(cfg: ModelConfig, mesh: Mesh) -> NamedSharding:
    return ShardingPlan.create(cfg, mesh).kv_cache_sharding
