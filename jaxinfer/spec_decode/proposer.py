"""The one interface of a speculative proposer: guess each sequence's next tokens before the target runs.

A proposer sets ``seq.spec_token_ids`` (up to ``k`` tokens per sequence) for the sequences the engine lists;
the target verifies them in its next step. Two implementations: ``ngram.NgramProposer`` (prompt lookup, on
the host) and ``draft_model.DraftModelProposer`` (a small model run through its own ``ModelRunner``).
"""

from __future__ import annotations

from typing import Any, Callable, Hashable, Protocol


class Proposer(Protocol):
    method: str  # the speculative_config "method" it implements

    def propose(self, seqs: list, ks: list[int]) -> None:
        """Set ``seqs[i].spec_token_ids`` to at most ``ks[i]`` guessed tokens (fewer, or none, is allowed)."""

    def warm_up_plan(self) -> list[tuple[Any, list[Hashable]]]:
        """(executables, keys) this proposer runs: compiled with the target's at start ([] on the host)."""

    def runners(self) -> list:
        """The model runners it owns (counted in the engine's stats)."""

    # For the verifier of sampled rows: ``q_for(owners, num_rows)`` gives the draft distributions of the
    # rows, or None when the drafts are point masses (the verifier then accepts with probability p(draft)).
    q_for: Callable | None
