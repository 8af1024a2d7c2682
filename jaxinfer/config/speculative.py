"""The ``speculative_config`` dict of ``LLM(...)``, validated into a frozen SpeculativeConfig."""

from __future__ import annotations

import dataclasses
from typing import Any

METHODS = ("ngram", "draft_model")
_KEYS = {
    "ngram": {"method", "num_speculative_tokens", "prompt_lookup_max", "prompt_lookup_min", "adaptive"},
    "draft_model": {"method", "num_speculative_tokens", "model", "adaptive"},
}


@dataclasses.dataclass(frozen=True)
class SpeculativeConfig:
    method: str
    num_speculative_tokens: int
    prompt_lookup_max: int = 4
    prompt_lookup_min: int = 1
    model: str | None = None  # the draft model (method "draft_model")
    adaptive: bool = True  # propose fewer tokens when speculation does not pay for itself

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "SpeculativeConfig":
        if not isinstance(d, dict):
            raise ValueError(f"speculative_config must be a dict, got {type(d).__name__}")
        method = d.get("method")
        if method not in METHODS:
            raise ValueError(f"speculative_config['method'] must be one of {METHODS}, got {method!r}")
        unknown = set(d) - _KEYS[method]
        if unknown:
            raise ValueError(f"unknown speculative_config keys for method {method!r}: {sorted(unknown)}")
        k = d.get("num_speculative_tokens")
        if not isinstance(k, int) or isinstance(k, bool) or not 1 <= k <= 16:
            raise ValueError(f"num_speculative_tokens must be an int in [1, 16], got {k!r}")
        cfg = cls(method=method, num_speculative_tokens=k, **{key: d[key] for key in d if key not in ("method", "num_speculative_tokens")})
        if method == "ngram":
            lo, hi = cfg.prompt_lookup_min, cfg.prompt_lookup_max
            if not (isinstance(lo, int) and isinstance(hi, int) and 1 <= lo <= hi):
                raise ValueError(f"need 1 <= prompt_lookup_min ({lo!r}) <= prompt_lookup_max ({hi!r})")
        elif not cfg.model:
            raise ValueError("speculative_config with method 'draft_model' needs 'model': the draft model's path")
        if not isinstance(cfg.adaptive, bool):
            raise ValueError(f"speculative_config['adaptive'] must be a bool, got {cfg.adaptive!r}")
        return cfg
