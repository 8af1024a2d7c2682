"""One constrained sequence's grammar state: advances with every token the sequence emits and says which
tokens may come next.

A ``GrammarMatcher`` wraps an llguidance matcher. ``accept`` consumes an emitted token; ``mask`` is the packed
bitmask (int32 [words], bit ``t % 32`` of word ``t // 32`` set when token t is allowed), computed once per state
and kept until the next token; ``forced_token`` is the next token when the mask allows exactly one (jump-forward
appends such tokens without a decode step: a row whose mask has one token samples that token at any
temperature, so skipping the step changes nothing). The state lives with the sequence: preemption recomputes
K/V but keeps the tokens, so the matcher needs no restoring.
"""

from __future__ import annotations

import dataclasses
import time

import numpy as np


@dataclasses.dataclass
class MaskTime:
    """Host time spent computing token masks (one per backend: its matchers and its batched fills add to it)."""

    seconds: float = 0.0
    rows: int = 0  # masks computed

    def add(self, seconds: float, rows: int) -> None:
        self.seconds += seconds
        self.rows += rows


class GrammarMatcher:
    def __init__(self, ll_matcher, words: int, eos_token_ids: tuple[int, ...], timing: MaskTime | None = None):
        self.ll_matcher = ll_matcher
        self.timing = timing if timing is not None else MaskTime()
        self.words = words
        self.eos_token_ids = eos_token_ids
        self._mask: np.ndarray | None = None  # the current state's mask, once computed
        self.num_accepted = 0

    def accept(self, token_id: int) -> bool:
        """Consume an emitted token; False if the grammar does not allow it (the matcher is then in error)."""
        self._mask = None
        ok = self.ll_matcher.consume_token(int(token_id))
        self.num_accepted += ok
        return ok

    def cached_mask(self) -> np.ndarray | None:
        return self._mask

    def mask(self) -> np.ndarray:
        """The allowed-token bitmask of the current state (int32 [words])."""
        if self._mask is None:
            t = time.perf_counter()
            row = np.full((1, self.words), -1, np.int32)
            self.ll_matcher.unsafe_compute_mask_ptr(row.ctypes.data, row.nbytes)
            self._mask = row[0]
            self.timing.add(time.perf_counter() - t, 1)
        return self._mask

    def forced_token(self) -> int | None:
        """The one token the grammar allows next, or None when it allows several (or none). Where the grammar
        forces no bytes (llguidance answers that in microseconds) one token cannot be forced either, and no mask
        is computed here (the step's batched fill computes it, while the device runs)."""
        if self._mask is None and not self.ll_matcher.compute_ff_bytes():
            return None
        mask = self.mask()
        nonzero = np.flatnonzero(mask)
        if len(nonzero) != 1:
            return None
        word = int(mask[nonzero[0]]) & 0xFFFFFFFF
        if word & (word - 1):
            return None  # several bits in the one word
        return int(nonzero[0]) * 32 + word.bit_length() - 1

    @property
    def is_terminated(self) -> bool:
        """The grammar accepts nothing more (only EOS)."""
        return self.ll_matcher.is_stopped()

    @property
    def is_accepting(self) -> bool:
        return self.ll_matcher.is_accepting()

    @property
    def error(self) -> str:
        return self.ll_matcher.get_error()
