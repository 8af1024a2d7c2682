"""RoPE frequency scaling as HF configs spell it, and the inverse frequencies it gives.

``parse_rope_scaling(d)`` reads an HF ``rope_scaling`` / ``rope_parameters`` dict into a frozen
``RopeScaling`` (None for plain RoPE) and refuses the types not implemented; ``inv_freq(base, dim, s)``
computes the ``dim // 2`` inverse frequencies HF's ``ROPE_INIT_FUNCTIONS`` compute for that type, and
``RopeScaling.attention_factor`` is what HF multiplies cos and sin by. Types:

* "linear": every frequency divided by ``factor``;
* "llama3": low frequencies divided by ``factor``, high ones kept, a smooth ramp between;
* "longrope" (Phi-3; "su" is its old name): per-frequency divisors, ``short_factor`` up to
  ``original_max_position_embeddings`` (only those are implemented: ``ModelConfig.max_supported_model_len``);
* "yarn" (GPT-OSS, DeepSeek-V2/V3): interpolated frequencies below a ramp between the dimensions that
  rotate ``beta_slow`` and ``beta_fast`` times over the original context, extrapolated (unchanged) above it,
  and an attention factor ``0.1 ln(factor) + 1`` (or the ratio of two such with ``mscale`` / ``mscale_all_dim``).
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

SUPPORTED_ROPE_SCALING = ("default", "llama3", "linear", "longrope", "su", "yarn")


@dataclasses.dataclass(frozen=True)
class RopeScaling:
    """RoPE frequency scaling (see the module docstring); plain RoPE has no RopeScaling."""

    rope_type: str  # "llama3", "linear", "longrope" or "yarn"
    factor: float
    low_freq_factor: float = 1.0  # llama3
    high_freq_factor: float = 4.0  # llama3
    original_max_position_embeddings: int = 8192
    short_factor: tuple[float, ...] = ()  # longrope
    long_factor: tuple[float, ...] = ()  # longrope
    attention_factor: float = 1.0  # cos and sin are multiplied by it (longrope, yarn)
    beta_fast: float = 32.0  # yarn
    beta_slow: float = 1.0  # yarn
    truncate: bool = True  # yarn: round the ramp's ends to whole dimensions
    mscale: float | None = None  # yarn (DeepSeek): the attention factor's numerator mscale
    mscale_all_dim: float | None = None  # yarn (DeepSeek): and its denominator's

    def to_hf(self) -> dict[str, Any]:
        """The HF ``rope_scaling`` dict this was parsed from (the keys its type reads)."""
        d: dict[str, Any] = {"rope_type": self.rope_type, "factor": self.factor,
                             "original_max_position_embeddings": self.original_max_position_embeddings}
        if self.rope_type == "llama3":
            d.update(low_freq_factor=self.low_freq_factor, high_freq_factor=self.high_freq_factor)
        elif self.rope_type == "longrope":
            d.update(short_factor=list(self.short_factor), long_factor=list(self.long_factor),
                     attention_factor=self.attention_factor)
        elif self.rope_type == "yarn":
            d.update(beta_fast=self.beta_fast, beta_slow=self.beta_slow, truncate=self.truncate,
                     attention_factor=self.attention_factor)
            if self.mscale is not None:
                d.update(mscale=self.mscale, mscale_all_dim=self.mscale_all_dim)
        return d


def yarn_mscale(factor: float, mscale: float = 1.0) -> float:
    """YaRN's attention temperature ``0.1 * mscale * ln(factor) + 1`` (1 when not extending)."""
    return 1.0 if factor <= 1 else 0.1 * mscale * math.log(factor) + 1.0


def _parse_longrope(scaling: dict[str, Any], max_position_embeddings: int | None) -> RopeScaling:
    """Phi-3's longrope: the factor is the context extension, the attention factor HF's default from it."""
    original = int(scaling.get("original_max_position_embeddings") or 4096)
    factor = scaling.get("factor")
    if factor is None:
        factor = (max_position_embeddings or original) / original
    attention = scaling.get("attention_factor")
    if attention is None:
        attention = 1.0 if factor <= 1.0 else math.sqrt(1 + math.log(factor) / math.log(original))
    return RopeScaling(rope_type="longrope", factor=float(factor), original_max_position_embeddings=original,
                       short_factor=tuple(float(x) for x in scaling["short_factor"]),
                       long_factor=tuple(float(x) for x in scaling["long_factor"]), attention_factor=float(attention))


def _parse_yarn(scaling: dict[str, Any], max_position_embeddings: int | None) -> RopeScaling:
    """YaRN as HF's ``_compute_yarn_parameters`` reads it (its defaults included)."""
    original = int(scaling["original_max_position_embeddings"])
    factor = scaling.get("factor")
    if factor is None:
        factor = (max_position_embeddings or original) / original
    factor = float(factor)
    mscale, mscale_all_dim = scaling.get("mscale"), scaling.get("mscale_all_dim")
    attention = scaling.get("attention_factor")
    if attention is None:
        if mscale and mscale_all_dim:
            attention = yarn_mscale(factor, mscale) / yarn_mscale(factor, mscale_all_dim)
        else:
            attention = yarn_mscale(factor)
    return RopeScaling(rope_type="yarn", factor=factor, original_max_position_embeddings=original,
                       attention_factor=float(attention), beta_fast=float(scaling.get("beta_fast") or 32),
                       beta_slow=float(scaling.get("beta_slow") or 1), truncate=bool(scaling.get("truncate", True)),
                       mscale=None if mscale is None else float(mscale),
                       mscale_all_dim=None if mscale_all_dim is None else float(mscale_all_dim))


def parse_rope_scaling(scaling: dict[str, Any] | None, max_position_embeddings: int | None = None
                       ) -> RopeScaling | None:
    """The ``RopeScaling`` of an HF scaling dict (None: plain RoPE); a type not implemented is refused."""
    if not scaling:
        return None
    rope_type = scaling.get("rope_type") or scaling.get("type") or "default"
    if rope_type not in SUPPORTED_ROPE_SCALING:
        raise NotImplementedError(
            f"rope scaling type {rope_type!r} is not supported; supported: {SUPPORTED_ROPE_SCALING}"
        )
    if rope_type == "default":
        return None
    if rope_type in ("longrope", "su"):
        return _parse_longrope(scaling, max_position_embeddings)
    if rope_type == "yarn":
        return _parse_yarn(scaling, max_position_embeddings)
    return RopeScaling(
        rope_type=rope_type,
        factor=float(scaling["factor"]),
        low_freq_factor=float(scaling.get("low_freq_factor", 1.0)),
        high_freq_factor=float(scaling.get("high_freq_factor", 4.0)),
        original_max_position_embeddings=int(scaling.get("original_max_position_embeddings", 8192)),
    )


def _yarn_inv_freq(inv: list[float], base: float, dim: int, s: RopeScaling) -> list[float]:
    def correction_dim(rotations: float) -> float:  # the dimension that rotates `rotations` times over the context
        return dim * math.log(s.original_max_position_embeddings / (rotations * 2 * math.pi)) / (2 * math.log(base))

    low, high = correction_dim(s.beta_fast), correction_dim(s.beta_slow)
    if s.truncate:
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, dim - 1)
    if low == high:
        high += 0.001  # HF's guard against a zero-width ramp
    out = []
    for i, f in enumerate(inv):
        ramp = min(max((i - low) / (high - low), 0.0), 1.0)  # 0: extrapolate (keep f), 1: interpolate (f / factor)
        out.append(f / s.factor * ramp + f * (1 - ramp))
    return out


def _llama3_inv_freq(inv: list[float], s: RopeScaling) -> list[float]:
    low_wavelen = s.original_max_position_embeddings / s.low_freq_factor
    high_wavelen = s.original_max_position_embeddings / s.high_freq_factor
    out = []
    for f in inv:
        wavelen = 2 * math.pi / f
        if wavelen < high_wavelen:
            out.append(f)
        elif wavelen > low_wavelen:
            out.append(f / s.factor)
        else:
            smooth = (s.original_max_position_embeddings / wavelen - s.low_freq_factor) / (
                s.high_freq_factor - s.low_freq_factor
            )
            out.append((1 - smooth) * f / s.factor + smooth * f)
    return out


def inv_freq(base: float, dim: int, s: RopeScaling | None) -> list[float]:
    """Inverse RoPE frequencies (length ``dim // 2``) of base ``base``, scaled by ``s``."""
    inv = [1.0 / (base ** (2 * i / dim)) for i in range(dim // 2)]
    if s is None:
        return inv
    if s.rope_type == "longrope":  # the short factors: contexts up to original_max_position_embeddings
        return [f / e for f, e in zip(inv, s.short_factor)]
    if s.rope_type == "linear":
        return [f / s.factor for f in inv]
    if s.rope_type == "yarn":
        return _yarn_inv_freq(inv, base, dim, s)
    return _llama3_inv_freq(inv, s)


def rope_inv_freq(cfg, local: bool = False) -> list[float]:
    """Inverse RoPE frequencies of a ``ModelConfig`` (length head_dim // 2). ``local``: those of Gemma 3's
    sliding-window layers (base ``cfg.rope_local_theta``, never scaled)."""
    if local:
        return inv_freq(cfg.rope_local_theta, cfg.head_dim, None)
    return inv_freq(cfg.rope_theta, cfg.head_dim, cfg.rope_scaling)
