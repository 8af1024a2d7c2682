"""The one declaration of a model's parameters, and everything derived from it.

``param_specs(cfg)`` returns a pytree with exactly the structure of the params pytree, whose leaves are
``ParamSpec`` records (shape, logical axes, HF tensor name, whether HF stores it transposed, how to
initialise it). Random init, abstract shapes (for ``jax.eval_shape``-style planning and orbax restore),
the HF name table used by the safetensors loader, and sharding rules (logical axis -> mesh axis, in
``sharding.rules``) are all derived from it, so a new parameter is added in one place only.

Params pytree (layers are a Python list; linear weights are ``[in, out]``)::

    path                       shape         logical axes            HF tensor (transposed?)
    embed                      [V, H]        (vocab, embed)          model.embed_tokens.weight
    lm_head                    [H, V]        (embed, vocab)          lm_head.weight (T)   -- absent if tied
    final_norm                 [H]           (embed,)                model.norm.weight
    layers[i].attn_norm        [H]           (embed,)                model.layers.{i}.input_layernorm.weight
    layers[i].wq               [H, Hq*D]     (embed, q_heads)        model.layers.{i}.self_attn.q_proj.weight (T)
    layers[i].wk               [H, Hkv*D]    (embed, kv_heads)       model.layers.{i}.self_attn.k_proj.weight (T)
    layers[i].wv               [H, Hkv*D]    (embed, kv_heads)       model.layers.{i}.self_attn.v_proj.weight (T)
    layers[i].wo               [Hq*D, H]     (q_heads, embed)        model.layers.{i}.self_attn.o_proj.weight (T)
    layers[i].bq               [Hq*D]        (q_heads,)              model.layers.{i}.self_attn.q_proj.bias   -- attention_bias
    layers[i].bk               [Hkv*D]       (kv_heads,)             model.layers.{i}.self_attn.k_proj.bias   -- attention_bias
    layers[i].bv               [Hkv*D]       (kv_heads,)             model.layers.{i}.self_attn.v_proj.bias   -- attention_bias
    layers[i].bo               [H]           (embed,)                model.layers.{i}.self_attn.o_proj.bias   -- GPT-OSS
    layers[i].sinks            [Hq]          (q_heads,)              model.layers.{i}.self_attn.sinks         -- GPT-OSS
    layers[i].q_norm           [D]           (head_dim,)             model.layers.{i}.self_attn.q_norm.weight -- qk_norm
    layers[i].k_norm           [D]           (head_dim,)             model.layers.{i}.self_attn.k_norm.weight -- qk_norm
    layers[i].mlp_norm         [H]           (embed,)                model.layers.{i}.post_attention_layernorm.weight
                                                                     [Gemma: pre_feedforward_layernorm]
    layers[i].post_attn_norm   [H]           (embed,)                ...post_attention_layernorm.weight   -- Gemma
    layers[i].post_mlp_norm    [H]           (embed,)                ...post_feedforward_layernorm.weight -- Gemma
    layers[i].w_gate           [H, F]        (embed, mlp)            model.layers.{i}.mlp.gate_proj.weight (T)
    layers[i].w_up             [H, F]        (embed, mlp)            model.layers.{i}.mlp.up_proj.weight (T)
    layers[i].w_down           [F, H]        (mlp, embed)            model.layers.{i}.mlp.down_proj.weight (T)

An MoE layer (``cfg.num_experts > 0``) has, instead of w_gate / w_up / w_down::

    layers[i].router           [H, E]        (embed, None)           ...mlp.gate.weight (T)   [Mixtral: block_sparse_moe.gate]
    layers[i].expert_w_gate    [E, H, Fe]    (experts, embed, expert_mlp)  ...mlp.experts.{e}.gate_proj.weight (T)  [Mixtral: w1]
    layers[i].expert_w_up      [E, H, Fe]    (experts, embed, expert_mlp)  ...mlp.experts.{e}.up_proj.weight (T)    [Mixtral: w3]
    layers[i].expert_w_down    [E, Fe, H]    (experts, expert_mlp, embed)  ...mlp.experts.{e}.down_proj.weight (T)  [Mixtral: w2]
    layers[i].shared_w_gate    [H, Fs]       (embed, mlp)            ...mlp.shared_expert.gate_proj.weight (T) -- Qwen2-MoE
    layers[i].shared_w_up      [H, Fs]       (embed, mlp)            ...mlp.shared_expert.up_proj.weight (T)   -- Qwen2-MoE
    layers[i].shared_w_down    [Fs, H]       (mlp, embed)            ...mlp.shared_expert.down_proj.weight (T) -- Qwen2-MoE
    layers[i].shared_gate      [H, 1]        (embed, None)           ...mlp.shared_expert_gate.weight (T)      -- Qwen2-MoE

GPT-OSS stores each layer's experts stacked and untransposed: ``mlp.experts.gate_up_proj`` ``[E, H, 2 Fe]`` (gate
the even columns, up the odd ones: ``expert_w_gate`` / ``expert_w_up``), ``mlp.experts.down_proj`` ``[E, Fe, H]``,
their biases ``expert_b_gate`` / ``expert_b_up`` ``[E, Fe]`` and ``expert_b_down`` ``[E, H]`` (axes (experts,
expert_mlp) / (experts, embed)), and ``mlp.router.{weight,bias}`` (``router``, ``router_bias`` ``[E]``).

A DeepSeek layer (multi-head latent attention) is declared by ``jaxinfer.model.mla_weights``.

V vocab (``cfg.padded_vocab_size``: with the rows a tensor-parallel split pads on), H hidden, F
intermediate, Hq / Hkv query / key-value heads, D head_dim, E experts, Fe / Fs the
routed / shared experts' widths. ``q_heads`` and ``kv_heads`` name a flattened ``heads * head_dim`` axis
(sharding it splits whole heads when the mesh axis divides the head count); ``None`` names a dimension that
is never sharded (the router's expert axis: every device routes every token). A tied checkpoint uses
``embed.T`` as the LM head. The routed experts are stacked along a leading axis: HF stores one tensor per
expert, and ``hf_name_table`` maps each to its slot (path ``(..., "expert_w_gate", e)``).
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp

from jaxinfer.config.model import ModelConfig
from jaxinfer.model.mla_weights import mla_layer_specs

Path = tuple[str | int, ...]  # a location in the params pytree, e.g. ("layers", 3, "wq")

LOGICAL_AXES = ("vocab", "embed", "q_heads", "kv_heads", "head_dim", "mlp", "experts", "expert_mlp", None)


@dataclasses.dataclass(frozen=True)
class HFPart:
    """Which part of a shared HF tensor (as HF stores it) a parameter is: ``start:stop:step`` of ``axis``,
    along which the HF tensor has ``size`` entries."""

    axis: int
    start: int
    stop: int
    size: int
    step: int = 1

    def index(self, ndim: int) -> tuple[slice, ...]:
        """The numpy index that cuts this part out of the HF tensor."""
        return (slice(None),) * (self.axis % ndim) + (slice(self.start, self.stop, self.step),)


@dataclasses.dataclass(frozen=True)
class ParamSpec:
    """Declaration of one parameter array (a pytree leaf: it is not a registered pytree node)."""

    shape: tuple[int, ...]
    logical_axes: tuple[str | None, ...]  # one name from LOGICAL_AXES per dimension
    hf_name: str  # tensor name in an HF safetensors checkpoint; with an "{expert}" field when stacked
    transpose: bool  # HF stores the [out, in] transpose of our [in, out] layout
    init: str = "normal"  # "normal" (std given at init time), "ones" or "zeros" (RMSNorm scales, Gemma's + 1)
    stacked: bool = False  # the leading axis stacks one HF tensor per expert (hf_name has an {expert} field)
    # this parameter is part of an HF tensor that several parameters share, split at load (Phi-3's fused
    # qkv_proj / gate_up_proj; GPT-OSS's gate_up_proj, gate and up interleaved)
    hf_part: HFPart | None = None

    def __post_init__(self):
        if len(self.shape) != len(self.logical_axes):
            raise ValueError(f"{self.hf_name}: shape {self.shape} vs logical axes {self.logical_axes}")
        if any(a not in LOGICAL_AXES for a in self.logical_axes):
            raise ValueError(f"{self.hf_name}: unknown logical axis in {self.logical_axes}; known: {LOGICAL_AXES}")
        if self.stacked != ("{expert}" in self.hf_name):
            raise ValueError(f"{self.hf_name}: a stacked spec's HF name has an {{expert}} field, and only it")

    def hf_names(self) -> list[tuple[str, int | None]]:
        """(HF tensor name, slot along the stacked axis or None) for every tensor this parameter is read from."""
        if not self.stacked:
            return [(self.hf_name, None)]
        return [(self.hf_name.format(expert=e), e) for e in range(self.shape[0])]


def _linear(hf_name: str, n_in: int, n_out: int, axes: tuple[str | None, str | None]) -> ParamSpec:
    return ParamSpec((n_in, n_out), axes, hf_name, transpose=True)


def _rows_of(hf_name: str, start: int, stop: int, total: int, n_in: int, axes) -> ParamSpec:
    """A linear weight that is rows start:stop of HF's fused [total, n_in] tensor ``hf_name``."""
    return ParamSpec((n_in, stop - start), axes, hf_name, transpose=True, hf_part=HFPart(0, start, stop, total))


def _experts(hf_name: str, n: int, n_in: int, n_out: int, axes: tuple[str, str]) -> ParamSpec:
    return ParamSpec((n, n_in, n_out), ("experts", *axes), hf_name, transpose=True, stacked=True)


def _gpt_oss_moe_specs(cfg: ModelConfig, pre: str) -> dict[str, ParamSpec]:
    """GPT-OSS stores each layer's experts as whole stacks, already ``[E, in, out]``; gate and up interleaved
    along the last axis of ``gate_up_proj`` (gate at even columns), split at load."""
    h, e, fe = cfg.hidden_size, cfg.num_experts, cfg.moe_intermediate_size
    moe = f"{pre}.mlp.experts"

    def stack(name, shape, axes, part=None):
        return ParamSpec(shape, ("experts", *axes), f"{moe}.{name}", transpose=False, hf_part=part)

    even, odd = HFPart(-1, 0, 2 * fe, 2 * fe, 2), HFPart(-1, 1, 2 * fe, 2 * fe, 2)
    return {
        "router": _linear(f"{pre}.mlp.router.weight", h, e, ("embed", None)),
        "router_bias": _vector(f"{pre}.mlp.router.bias", e, None, "normal"),
        "expert_w_gate": stack("gate_up_proj", (e, h, fe), ("embed", "expert_mlp"), even),
        "expert_w_up": stack("gate_up_proj", (e, h, fe), ("embed", "expert_mlp"), odd),
        "expert_w_down": stack("down_proj", (e, fe, h), ("expert_mlp", "embed")),
        "expert_b_gate": stack("gate_up_proj_bias", (e, fe), ("expert_mlp",), even),
        "expert_b_up": stack("gate_up_proj_bias", (e, fe), ("expert_mlp",), odd),
        "expert_b_down": stack("down_proj_bias", (e, h), ("embed",)),
    }


def _moe_specs(cfg: ModelConfig, pre: str) -> dict[str, ParamSpec]:
    if cfg.architecture == "gpt_oss":
        return _gpt_oss_moe_specs(cfg, pre)
    h, e, fe, fs = cfg.hidden_size, cfg.num_experts, cfg.moe_intermediate_size, cfg.shared_expert_intermediate_size
    if cfg.architecture == "mixtral":
        moe, names = f"{pre}.block_sparse_moe", ("w1", "w3", "w2")
    else:
        moe, names = f"{pre}.mlp", ("gate_proj", "up_proj", "down_proj")
    gate, up, down = (f"{moe}.experts.{{expert}}.{n}.weight" for n in names)
    specs = {
        "router": _linear(f"{moe}.gate.weight", h, e, ("embed", None)),
        "expert_w_gate": _experts(gate, e, h, fe, ("embed", "expert_mlp")),
        "expert_w_up": _experts(up, e, h, fe, ("embed", "expert_mlp")),
        "expert_w_down": _experts(down, e, fe, h, ("expert_mlp", "embed")),
    }
    if fs:
        specs["shared_w_gate"] = _linear(f"{moe}.shared_expert.gate_proj.weight", h, fs, ("embed", "mlp"))
        specs["shared_w_up"] = _linear(f"{moe}.shared_expert.up_proj.weight", h, fs, ("embed", "mlp"))
        specs["shared_w_down"] = _linear(f"{moe}.shared_expert.down_proj.weight", fs, h, ("mlp", "embed"))
        specs["shared_gate"] = _linear(f"{moe}.shared_expert_gate.weight", h, 1, ("embed", None))
    return specs


def _vector(hf_name: str, n: int, axis: str, init: str) -> ParamSpec:
    return ParamSpec((n,), (axis,), hf_name, transpose=False, init=init)


def _norm_init(cfg: ModelConfig) -> str:
    """RMSNorm scales start at 1: weights of ones, or zeros where the norm adds 1 itself (Gemma)."""
    return "zeros" if cfg.norm_offset else "ones"


def _layer_specs(cfg: ModelConfig, i: int) -> dict[str, ParamSpec]:
    if cfg.is_mla:  # DeepSeek-V2 / V3: latent attention, dense then MoE layers (jaxinfer.model.mla_weights)
        return mla_layer_specs(cfg, i, _linear, _vector, _experts)
    h, f, q, kv = cfg.hidden_size, cfg.intermediate_size, cfg.q_size, cfg.kv_size
    pre = f"model.layers.{i}"
    norm = _norm_init(cfg)
    specs = {
        "attn_norm": _vector(f"{pre}.input_layernorm.weight", h, "embed", norm),
        "wq": _linear(f"{pre}.self_attn.q_proj.weight", h, q, ("embed", "q_heads")),
        "wk": _linear(f"{pre}.self_attn.k_proj.weight", h, kv, ("embed", "kv_heads")),
        "wv": _linear(f"{pre}.self_attn.v_proj.weight", h, kv, ("embed", "kv_heads")),
        "wo": _linear(f"{pre}.self_attn.o_proj.weight", q, h, ("q_heads", "embed")),
    }
    if cfg.architecture == "phi3":  # one qkv_proj [q + 2 kv, H] in the checkpoint
        qkv, total = f"{pre}.self_attn.qkv_proj.weight", q + 2 * kv
        specs["wq"] = _rows_of(qkv, 0, q, total, h, ("embed", "q_heads"))
        specs["wk"] = _rows_of(qkv, q, q + kv, total, h, ("embed", "kv_heads"))
        specs["wv"] = _rows_of(qkv, q + kv, total, total, h, ("embed", "kv_heads"))
    if cfg.attention_bias:
        specs["bq"] = _vector(f"{pre}.self_attn.q_proj.bias", q, "q_heads", "normal")
        specs["bk"] = _vector(f"{pre}.self_attn.k_proj.bias", kv, "kv_heads", "normal")
        specs["bv"] = _vector(f"{pre}.self_attn.v_proj.bias", kv, "kv_heads", "normal")
    if cfg.attention_out_bias:
        specs["bo"] = _vector(f"{pre}.self_attn.o_proj.bias", h, "embed", "normal")
    if cfg.attention_sinks:  # one logit per query head: a [Hq] vector split with the heads
        specs["sinks"] = _vector(f"{pre}.self_attn.sinks", cfg.num_heads, "q_heads", "normal")
    if cfg.qk_norm:
        specs["q_norm"] = _vector(f"{pre}.self_attn.q_norm.weight", cfg.head_dim, "head_dim", norm)
        specs["k_norm"] = _vector(f"{pre}.self_attn.k_norm.weight", cfg.head_dim, "head_dim", norm)
    if cfg.sandwich_norms:  # Gemma: HF's post_attention_layernorm follows attention; the MLP is pre- and post-normed
        specs["post_attn_norm"] = _vector(f"{pre}.post_attention_layernorm.weight", h, "embed", norm)
        specs["mlp_norm"] = _vector(f"{pre}.pre_feedforward_layernorm.weight", h, "embed", norm)
        specs["post_mlp_norm"] = _vector(f"{pre}.post_feedforward_layernorm.weight", h, "embed", norm)
    else:
        specs["mlp_norm"] = _vector(f"{pre}.post_attention_layernorm.weight", h, "embed", norm)
    if cfg.is_moe:
        specs.update(_moe_specs(cfg, pre))
        return specs
    if cfg.architecture == "phi3":  # one gate_up_proj [2 F, H]: gate rows first
        gate_up = f"{pre}.mlp.gate_up_proj.weight"
        specs["w_gate"] = _rows_of(gate_up, 0, f, 2 * f, h, ("embed", "mlp"))
        specs["w_up"] = _rows_of(gate_up, f, 2 * f, 2 * f, h, ("embed", "mlp"))
    else:
        specs["w_gate"] = _linear(f"{pre}.mlp.gate_proj.weight", h, f, ("embed", "mlp"))
        specs["w_up"] = _linear(f"{pre}.mlp.up_proj.weight", h, f, ("embed", "mlp"))
    specs["w_down"] = _linear(f"{pre}.mlp.down_proj.weight", f, h, ("mlp", "embed"))
    return specs


def param_specs(cfg: ModelConfig) -> dict[str, Any]:
    """The params pytree of ``cfg`` with a ``ParamSpec`` at every leaf (see the module docstring)."""
    v, h = cfg.padded_vocab_size, cfg.hidden_size
    specs: dict[str, Any] = {
        "embed": ParamSpec((v, h), ("vocab", "embed"), "model.embed_tokens.weight", transpose=False),
    }
    if not cfg.tie_word_embeddings:
        specs["lm_head"] = _linear("lm_head.weight", h, v, ("embed", "vocab"))
    specs["final_norm"] = _vector("model.norm.weight", h, "embed", _norm_init(cfg))
    specs["layers"] = [_layer_specs(cfg, i) for i in range(cfg.num_layers)]
    return specs


def _is_spec(x: Any) -> bool:
    return isinstance(x, ParamSpec)


def _key_to_plain(k: Any) -> str | int:
    if isinstance(k, jax.tree_util.DictKey):
        return k.key
    if isinstance(k, jax.tree_util.SequenceKey):
        return k.idx
    raise TypeError(f"unexpected pytree key {k!r}")


def spec_leaves_with_paths(cfg: ModelConfig) -> list[tuple[Path, ParamSpec]]:
    """Every (path, spec) pair, in pytree flattening order; a path is e.g. ``("layers", 0, "wq")``."""
    flat, _ = jax.tree_util.tree_flatten_with_path(param_specs(cfg), is_leaf=_is_spec)
    return [(tuple(_key_to_plain(k) for k in keys), spec) for keys, spec in flat]


def hf_name_table(cfg: ModelConfig) -> dict[str, tuple[Path, bool]]:
    """HF tensor name -> (path in the params pytree, whether to transpose on load).

    A per-expert tensor's path ends with its slot in the stacked array: ``("layers", 0, "expert_w_up", 3)``
    (``get_at_path`` indexes the array with it)."""
    table = {}
    for path, spec in spec_leaves_with_paths(cfg):
        if spec.hf_part is not None:
            raise NotImplementedError(f"{spec.hf_name}: a fused HF tensor split over several parameters "
                                      f"({cfg.architecture}) has no one-to-one name table")
        for name, slot in spec.hf_names():
            table[name] = (path if slot is None else (*path, slot), spec.transpose)
    return table


def logical_axes(cfg: ModelConfig) -> dict[str, Any]:
    """The params pytree with each leaf's logical axis names (a tuple of str) — input to sharding rules."""
    return jax.tree.map(lambda s: s.logical_axes, param_specs(cfg), is_leaf=_is_spec)


def abstract_params(cfg: ModelConfig, dtype: Any = jnp.float32) -> dict[str, Any]:
    """The params pytree as ``jax.ShapeDtypeStruct`` leaves (no memory allocated)."""
    dt = jnp.dtype(dtype)
    return jax.tree.map(lambda s: jax.ShapeDtypeStruct(s.shape, dt), param_specs(cfg), is_leaf=_is_spec)


def init_random_params(
    cfg: ModelConfig, key: jax.Array, dtype: Any = jnp.float32, std: float = 0.02
) -> dict[str, Any]:
    """Random params: ``normal(0, std)`` for matrices and biases, ones for RMSNorm scales.

    Each leaf gets its own key (``fold_in`` of its flat index), so the result is deterministic in
    ``key`` and arrays are created one at a time (no full-model temporary).
    """
    dt = jnp.dtype(dtype)
    flat, treedef = jax.tree_util.tree_flatten(param_specs(cfg), is_leaf=_is_spec)
    leaves = []
    for index, spec in enumerate(flat):
        if spec.init in ("ones", "zeros"):
            leaves.append((jnp.ones if spec.init == "ones" else jnp.zeros)(spec.shape, dt))
        elif spec.init == "normal":
            sample = jax.random.normal(jax.random.fold_in(key, index), spec.shape, dtype=jnp.float32)
            leaves.append((sample * std).astype(dt))
        else:
            raise ValueError(f"unknown init {spec.init!r} for {spec.hf_name}")
    return jax.tree_util.tree_unflatten(treedef, leaves)


def get_at_path(tree: Any, path: Path) -> Any:
    """``tree[p0][p1]...`` for a path from ``spec_leaves_with_paths`` / ``hf_name_table``."""
    for part in path:
        tree = tree[part]
    return tree
