"""Prompt-lookup (n-gram) proposals: guess the next tokens by finding the sequence's own recent n-gram
earlier in its tokens and copying what followed it there. Host side, no JAX.

For n from ``max_n`` down to ``min_n``: take the last n tokens; find their most recent earlier occurrence;
propose the (up to k) tokens that followed it. No match: no proposal.
"""

from __future__ import annotations


def propose_ngram(tokens: list[int], k: int, min_n: int, max_n: int) -> list[int]:
    total = len(tokens)
    if k <= 0:
        return []
    for n in range(min(max_n, total - 1), min_n - 1, -1):
        suffix = tokens[total - n :]
        # scan right to left so the most recent occurrence wins; it must end before the suffix starts
        for start in range(total - n - 1, -1, -1):
            if tokens[start : start + n] == suffix:
                follow = tokens[start + n : start + n + k]
                if follow:
                    return follow
    return []


class NgramProposer:
    """The ``Proposer`` of ``method="ngram"``: point-mass drafts from ``propose_ngram``, nothing compiled."""

    method = "ngram"
    q_for = None

    def __init__(self, min_n: int, max_n: int):
        self.min_n, self.max_n = min_n, max_n

    def propose(self, seqs: list, ks: list[int]) -> None:
        for seq, k in zip(seqs, ks):
            seq.spec_token_ids = propose_ngram(seq.token_ids, k, self.min_n, self.max_n)

    def warm_up_plan(self) -> list:
        return []

    def runners(self) -> list:
        return []
