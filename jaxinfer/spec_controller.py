"""How many tokens to speculate this step: the adaptive rule. Host side, no JAX (numpy only).

With a per-position acceptance rate ``a``, proposing ``k`` tokens yields ``E(k) = 1 + a + ... + a^k``
tokens per sequence per step. A step's cost is modelled from measurements in this run as
``t = c0 + c1 * scored_tokens + c2 * proposed_tokens`` (least squares over recent steps). Each step picks
``k`` in ``{0, K}`` (two choices only, so speculation adds one family of compiled shapes, not one per k)
that maximises ``B * E(k) / t(B * (1 + k), B * k)`` for the B decoding sequences, so
speculation turns itself down when verification costs more than it returns (large batches on a
compute-bound device, text the drafts cannot guess). Every ``probe_every`` steps it proposes ``K`` anyway,
so a stale acceptance estimate can recover.
"""

from __future__ import annotations

import collections

import numpy as np


class SpecController:
    def __init__(self, max_k: int, adaptive: bool = True, window: int = 64, probe_every: int = 16):
        self.max_k = max_k
        self.adaptive = adaptive
        self.probe_every = probe_every
        self.samples: collections.deque = collections.deque(maxlen=window)  # (scored, proposed, seconds)
        self.proposed = 0
        self.accepted = 0
        self.per_position_proposed = [0] * max_k
        self.per_position_accepted = [0] * max_k
        self.steps = 0

    @property
    def acceptance_rate(self) -> float:
        return self.accepted / self.proposed if self.proposed else 0.0

    def record_acceptance(self, num_proposed: int, num_accepted: int) -> None:
        self.proposed += num_proposed
        self.accepted += num_accepted
        for j in range(num_proposed):
            self.per_position_proposed[j] += 1
            if j < num_accepted:
                self.per_position_accepted[j] += 1

    def record_step(self, scored_tokens: int, proposed_tokens: int, seconds: float) -> None:
        self.samples.append((scored_tokens, proposed_tokens, seconds))

    def _cost_model(self):
        if len(self.samples) < 8:
            return None
        data = np.asarray(self.samples, dtype=np.float64)
        design = np.column_stack([np.ones(len(data)), data[:, 0], data[:, 1]])
        coef, *_ = np.linalg.lstsq(design, data[:, 2], rcond=None)
        return np.maximum(coef, 0.0)

    def choose_k(self, num_decoding: int, other_tokens: int = 0) -> int:
        self.steps += 1
        if not self.adaptive or self.max_k == 0 or num_decoding == 0:
            return self.max_k
        if self.proposed < 8 or self.steps % self.probe_every == 0:
            return self.max_k
        coef = self._cost_model()
        if coef is None:
            return self.max_k
        a = min(self.acceptance_rate, 0.999)
        best_k, best_rate = 0, -1.0
        for k in (0, self.max_k):
            gained = num_decoding * sum(a**i for i in range(k + 1))
            cost = coef[0] + coef[1] * (num_decoding * (1 + k) + other_tokens) + coef[2] * num_decoding * k
            rate = gained / max(cost, 1e-9)
            if rate > best_rate:
                best_k, best_rate = k, rate
        return best_k
