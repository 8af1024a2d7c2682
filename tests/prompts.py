"""Random token-id prompts for engine tests (the HF test checkpoints have a 256-token vocabulary)."""

from __future__ import annotations

import numpy as np


def random_prompts(lengths, seed: int = 0, vocab: int = 256) -> list[dict]:
    rng = np.random.default_rng(seed)
    return [{"prompt_token_ids": rng.integers(0, vocab, size=n).tolist()} for n in lengths]
