"""FP8 KV cache (``kv_cache_dtype="fp8"``): per-layer K and V scales, folded into the weights.

Each layer stores ``K / k_scale`` and ``V / v_scale`` as float8_e4m3fn (max 448). Nothing in the
attention backends knows the scales: they are folded into the weights once, on load, because every
use of K and V is linear in them:

* scores ``q . K = (k_scale q) . (K / k_scale)``: the q projection (or, with q/k-norm, the q norm's
  weight) is multiplied by ``k_scale`` and the k projection (or k norm) divided by it;
* output ``P V = v_scale (P (V / v_scale))``: the v projection is divided by ``v_scale`` and the
  output projection multiplied by it.

RoPE is linear, so it commutes with the scaling. A quantized projection has its scales multiplied
(and a static input scale of the output projection divided by ``v_scale``, so its activations quantize
exactly as before). Both attention backends then just read e4m3 caches (the XLA path widens them, the
Pallas kernel widens each loaded block).

The scales come from the weights, as bounds no key or value can exceed (so the cache never
saturates): the attention input is an RMS-normalised vector, whose norm is at most
``sqrt(hidden) * max|norm weight|``, so ``|k_j| <= that * ||W_k[:, j]|| + |b_k[j]|`` (Cauchy-Schwarz),
and a rotary pair (j, j + D/2) at most the root of its two bounds' squares; with q/k-norm a key's norm
is at most ``sqrt(head_dim) * max|k_norm|``. ``scale = bound / 448``. The bound is loose by about
sqrt(hidden) for typical activations, which e4m3's range absorbs (typical values stay far above its
smallest normal, 2**-6, where the relative precision is the same 2**-4 as at 448).
"""

from __future__ import annotations

import dataclasses
import math

import jax.numpy as jnp
import numpy as np

from jaxinfer.config.model import ModelConfig
from jaxinfer.quantization.quantized_weight import QuantizedWeight, dequantize

E4M3_MAX = 448.0


def _dense(w) -> np.ndarray:
    """A linear weight as a float32 numpy [in, out] array (quantized ones dequantized)."""
    if isinstance(w, QuantizedWeight):
        return np.asarray(dequantize(w), np.float32)
    return np.asarray(jnp.asarray(w, jnp.float32))


def _column_bounds(lp: dict, name: str, bias: str, x_norm: float) -> np.ndarray:
    w = _dense(lp[name])
    bound = x_norm * np.sqrt((w.astype(np.float64) ** 2).sum(axis=0))
    if bias in lp:
        bound = bound + np.abs(np.asarray(lp[bias], np.float64))
    return bound


def _rotary_pairs(bound: np.ndarray, head_dim: int) -> float:
    """Max bound after RoPE (pairs j, j + D/2 of every head mix)."""
    heads = bound.reshape(-1, head_dim)
    half = head_dim // 2
    pair = np.sqrt(heads[:, :half] ** 2 + heads[:, half:] ** 2)
    return float(pair.max())


def layer_bounds(lp: dict, cfg: ModelConfig) -> tuple[float, float]:
    """(largest |key|, largest |value|) a layer can write, from its weights (see the module doc)."""
    x_norm = math.sqrt(cfg.hidden_size) * float(np.abs(np.asarray(lp["attn_norm"], np.float32)).max())
    if cfg.qk_norm:
        k_bound = math.sqrt(cfg.head_dim) * float(np.abs(np.asarray(lp["k_norm"], np.float32)).max())
    else:
        k_bound = _rotary_pairs(_column_bounds(lp, "wk", "bk", x_norm), cfg.head_dim)
    v_bound = float(_column_bounds(lp, "wv", "bv", x_norm).max())
    return k_bound, v_bound


def kv_scales(params: dict, cfg: ModelConfig) -> list[tuple[float, float]]:
    """Per layer ``(k_scale, v_scale)``: the layer's bound / 448 (1.0 for an all-zero projection)."""
    if cfg.is_mla:
        raise NotImplementedError(f"kv_cache_dtype='fp8' is not implemented for {cfg.architecture} (multi-head latent "
                                  "attention caches a latent row, not K and V: no K/V projection to fold a scale "
                                  "into); use kv_cache_dtype='auto'")
    scales = []
    for lp in params["layers"]:
        scales.append(tuple(b / E4M3_MAX if b > 0 else 1.0 for b in layer_bounds(lp, cfg)))
    return scales


def _scaled(w, factor: float):
    """``w * factor`` for a dense array or a QuantizedWeight (its scales; bytes untouched)."""
    if isinstance(w, QuantizedWeight):
        return dataclasses.replace(w, scale=w.scale * jnp.float32(factor))
    return (jnp.asarray(w).astype(jnp.float32) * factor).astype(jnp.asarray(w).dtype)


def fold_kv_scales(params: dict, cfg: ModelConfig, scales: list[tuple[float, float]]) -> dict:
    """The params with each layer's ``(k_scale, v_scale)`` folded in (see the module doc)."""
    out = dict(params)
    layers = []
    for lp, (k_scale, v_scale) in zip(params["layers"], scales):
        lp = dict(lp)
        if cfg.qk_norm:
            lp["q_norm"], lp["k_norm"] = _scaled(lp["q_norm"], k_scale), _scaled(lp["k_norm"], 1 / k_scale)
        else:
            lp["wq"], lp["wk"] = _scaled(lp["wq"], k_scale), _scaled(lp["wk"], 1 / k_scale)
            if "bq" in lp:
                lp["bq"], lp["bk"] = _scaled(lp["bq"], k_scale), _scaled(lp["bk"], 1 / k_scale)
        lp["wv"] = _scaled(lp["wv"], 1 / v_scale)
        if "bv" in lp:
            lp["bv"] = _scaled(lp["bv"], 1 / v_scale)
        wo = _scaled(lp["wo"], v_scale)
        if isinstance(wo, QuantizedWeight) and wo.input_scale is not None:
            wo = dataclasses.replace(wo, input_scale=wo.input_scale / jnp.float32(v_scale))
        lp["wo"] = wo
        layers.append(lp)
    out["layers"] = layers
    return out
