"""Resolve the ``model=`` argument into (config, params, tokenizer).

Accepted: ``None`` (the embedded default model in ``jaxinfer/embedded_models/default``), an HF directory
(``config.json`` + ``*.safetensors`` [+ ``tokenizer.json``]), a directory written by ``jaxinfer convert``
(orbax), or ``"random:<preset>"`` (random weights with the real shapes of a named model).
"""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp

from jaxinfer.config.model import ModelConfig

DEFAULT_MODEL_DIR = Path(__file__).resolve().parents[1] / "embedded_models" / "default"
DRAFT_MODEL_DIR = Path(__file__).resolve().parents[1] / "embedded_models" / "draft"


def default_model_dir() -> Path:
    from jaxinfer import envs

    override = envs.default_model_override()  # $JAXINFER_DEFAULT_MODEL, or None
    path = Path(override) if override else DEFAULT_MODEL_DIR
    if not (path / "config.json").is_file():
        raise FileNotFoundError(
            f"the embedded default model is missing at {path}; run `python checkpoints/train.py` "
            "or pass model=PATH"
        )
    return path


@dataclasses.dataclass(frozen=True)
class LoadedModel:
    """What ``load_model`` returns."""

    config: ModelConfig  # the config the (possibly sharded) model runs
    params: Any  # the params pytree, placed
    tokenizer: Any  # a jaxinfer.core.tokenizer.Tokenizer, or None (random weights, no tokenizer.json)
    source: str  # where it came from (a path, or "random:<preset>")
    sharding_plan: Any = None  # the ShardingPlan of a mesh, or None on one device


def activation_dtype(dtype, platform: str):
    """The dtype a model of ``dtype`` computes in (activations, KV cache): on a CPU a bfloat16 model keeps its
    linear weights in bfloat16 (half the bytes a decode step streams) and computes in float32 (XLA:CPU has no
    fast bfloat16 arithmetic without AVX512-BF16 / AMX; the C++ matvec kernel widens the weights in registers)."""
    if platform == "cpu" and jnp.dtype(dtype) == jnp.bfloat16:
        return jnp.dtype(jnp.float32)
    return jnp.dtype(dtype)


def float32_except_linear_weights(params):
    """``params`` with every array but the K-major and quantized linear weights as float32 (embeddings, norms,
    biases): the CPU's bfloat16 layout (``activation_dtype``)."""
    from jaxinfer.model.linear import KMajorWeight
    from jaxinfer.quantization.quantized_weight import QuantizedWeight

    def keep(x):
        return isinstance(x, (KMajorWeight, QuantizedWeight))

    def widen(x):
        if keep(x) or not jnp.issubdtype(x.dtype, jnp.floating):
            return x
        return x.astype(jnp.float32)

    return jax.tree.map(widen, params, is_leaf=keep)


def resolve_dtype(dtype: str, platform: str):
    if dtype == "auto":
        # This CPU has no native bf16 (AVX2): float32 is both faster and exact there.
        return jnp.float32 if platform == "cpu" else jnp.bfloat16
    return jnp.dtype(dtype)


def load_model(model: str | os.PathLike | None, dtype, seed: int = 0, mesh=None, expert_parallel: bool = False,
               quant=None):
    """The model ``model`` names, loaded as a ``LoadedModel`` (config, params, tokenizer, source, sharding plan).

    With a ``mesh`` (tensor / expert parallelism), the checkpoint is validated against it before anything
    is read (``model.sharding_plan.ShardingPlan.create``: a clear ValueError), loaded straight into its shardings and
    placed as the sharded model's params; the returned config is the one the sharded model runs (KV heads
    replicated up to the device count if fewer). Without one, params sit on the default device (on a
    single CPU device an MoE model's experts are unstacked, which XLA:CPU reads in place, and the large
    linear weights held K-major; on one GPU each layer's query, key and value weights become one,
    ``jaxinfer.model.fused_qkv``).
    ``expert_parallel`` on a dense model is a ValueError, raised before any weight is read.
    ``quant``: a ``jaxinfer.quantization.options.QuantOptions`` (None: load as stored): pre-quantized checkpoints are
    read by its loaders, and its KV scales and quantize-on-load are applied before the params are placed.
    """
    from jaxinfer.config import presets
    from jaxinfer.core.tokenizer import load_tokenizer
    from jaxinfer.cpu import ffi as cpu_ffi
    from jaxinfer.loading import loader
    from jaxinfer.model import moe, weights
    from jaxinfer.model.fused_qkv import fuse_qkv_weights
    from jaxinfer.model.linear import k_major_linear_weights
    from jaxinfer.quantization import options as quant_setup

    tokenizer, source = None, str(model)
    if isinstance(model, str) and model.startswith("random:"):
        cfg = presets.preset_config(model.split(":", 1)[1])
        plan = _plan(cfg, mesh, expert_parallel)
        params = weights.init_random_params(cfg, jax.random.key(seed), dtype)
    else:
        path = default_model_dir() if model is None else Path(model)
        if not path.is_dir():
            raise FileNotFoundError(f"model directory {str(path)!r} does not exist")
        tokenizer, source = load_tokenizer(path), str(path)
        kind = quant_setup.checkpoint_kind(path)
        if kind != "dense":
            cfg = ModelConfig.from_pretrained(path)
            plan = _plan(cfg, mesh, expert_parallel)
            params = quant_setup.load_prequantized(path, kind, cfg, dtype, quant or quant_setup.QuantOptions())
        elif loader.is_orbax_dir(path):
            cfg = ModelConfig.from_pretrained(path)
            plan = _plan(cfg, mesh, expert_parallel)
            _, params = loader.restore_params(path, shardings=plan.load_shardings() if plan else None)
            params = jax.tree.map(lambda x: jnp.asarray(x, dtype), params)
        else:
            cfg = ModelConfig.from_pretrained(path)
            plan = _plan(cfg, mesh, expert_parallel)
            params = loader.load_hf_params(path, cfg, dtype, shardings=plan.load_shardings() if plan else None)
    if quant is not None:
        params = quant_setup.apply(params, cfg, quant, jax.default_backend())
    if plan is not None:
        return LoadedModel(plan.cfg, plan.place_params(params), tokenizer, source, plan)
    if jax.default_backend() == "cpu":
        if cfg.is_moe:
            params = moe.unstack_experts(params)
        params = k_major_linear_weights(params)  # XLA:CPU's gemv reads [out, in] faster (jaxinfer.model.linear)
        if jnp.dtype(dtype) == jnp.bfloat16:
            params = float32_except_linear_weights(params)
        cpu_ffi.available()  # build and register the C++ matvec kernel now: executables loaded from disk call it
    else:
        params = fuse_qkv_weights(params)  # one QKV GEMM per layer (jaxinfer.model.fused_qkv)
    return LoadedModel(cfg, params, tokenizer, source, None)


def _plan(cfg: ModelConfig, mesh, expert_parallel: bool):
    if expert_parallel and not cfg.is_moe:
        raise ValueError(f"enable_expert_parallel needs a mixture-of-experts model; this {cfg.architecture} "
                         "model is dense: turn expert parallelism off")
    if mesh is None:
        return None
    from jaxinfer.model.sharding_plan import ShardingPlan

    return ShardingPlan.create(cfg, mesh)
