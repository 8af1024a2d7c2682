"""Resolve the ``model=`` argument into (config, params, tokenizer).

Accepted: ``None`` (the embedded default model in ``checkpoints/default``), an HF directory
(``config.json`` + ``*.safetensors`` [+ ``tokenizer.json``]), a directory written by ``jaxinfer convert``
(orbax), or ``"random:<preset>"`` (random weights with the real shapes of a named model).
"""

from __future__ import annotations

import os
from pathlib import Path

import jax
import jax.numpy as jnp

from jaxinfer.config import ModelConfig

DEFAULT_MODEL_DIR = Path(__file__).resolve().parent.parent / "checkpoints" / "default"
DRAFT_MODEL_DIR = Path(__file__).resolve().parent.parent / "checkpoints" / "draft"


def default_model_dir() -> Path:
    override = os.environ.get("JAXINFER_DEFAULT_MODEL")
    path = Path(override) if override else DEFAULT_MODEL_DIR
    if not (path / "config.json").is_file():
        raise FileNotFoundError(
            f"the embedded default model is missing at {path}; run `python checkpoints/train.py` "
            "or pass model=PATH"
        )
    return path


def resolve_dtype(dtype: str, platform: str):
    if dtype == "auto":
        # This CPU has no native bf16 (AVX2): float32 is both faster and exact there.
        return jnp.float32 if platform == "cpu" else jnp.bfloat16
    return jnp.dtype(dtype)


def load_model(model: str | os.PathLike | None, dtype, seed: int = 0):
    """Return (ModelConfig, params pytree, Tokenizer | None, source description)."""
    from jaxinfer import loader, presets, weights
    from jaxinfer.tokenizer import load_tokenizer

    if isinstance(model, str) and model.startswith("random:"):
        cfg = presets.preset_config(model.split(":", 1)[1])
        params = weights.init_random_params(cfg, jax.random.key(seed), dtype)
        return cfg, params, None, model
    path = default_model_dir() if model is None else Path(model)
    if not path.is_dir():
        raise FileNotFoundError(f"model directory {str(path)!r} does not exist")
    if loader.is_orbax_dir(path):
        cfg, params = loader.restore_params(path)
        params = jax.tree.map(lambda x: jnp.asarray(x, dtype), params)
    else:
        cfg = ModelConfig.from_pretrained(path)
        params = loader.load_hf_params(path, cfg, dtype)
    return cfg, params, load_tokenizer(path), str(path)
