"""Host-side state of one sequence (one of a request's ``n`` samples). No JAX here.

A sequence's tokens are its prompt followed by what it generated so far; ``num_computed_tokens`` says how
many of them have their K/V in the cache. Scheduling is nothing but moving that counter forward (a prefill
chunk, one decode token, or a token plus speculative guesses) and backward (preemption resets it to 0).

A request with ``prompt_logprobs`` gives its ``n`` sequences one shared ``prompt_logprobs`` dict, filled by
whichever of them computes a prompt position first: the logits at position ``p`` give the entry of prompt
token ``p + 1``. Until it is complete a sequence computes its whole prompt (no prefix-cache hits: the cache
holds K/V, not logits); once complete, the entries are never computed again (preemption, the other samples).

Async scheduling (``jaxinfer.core.async_step``) schedules a step before the previous one's tokens reach the
host: a token a running step will choose is *pending* (``num_pending_tokens``). It counts in ``num_tokens``
(the scheduler plans with it) but is not in ``token_ids`` until it arrives, so block hashes, stop checks and
outputs only ever see real tokens.
"""

from __future__ import annotations

import enum
from typing import Any

from jaxinfer.sampling_params import SamplingParams


class SequenceStatus(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    FINISHED = "finished"


class Sequence:
    def __init__(
        self,
        seq_id: int,
        request_id: str,
        sample_index: int,
        prompt_token_ids: list[int],
        params: SamplingParams,
        seed: int,
        arrival_time: float,
        priority: int = 0,
        cache_salt: str | None = None,
    ):
        self.seq_id = seq_id
        self.request_id = request_id
        self.sample_index = sample_index
        self.token_ids: list[int] = list(prompt_token_ids)
        self.num_prompt_tokens = len(prompt_token_ids)
        self.params = params
        self.seed = seed  # per-sequence sampling seed
        self.arrival_time = arrival_time
        self.priority = priority  # lower value = served first (vLLM's convention)
        self.cache_salt = cache_salt
        self.status = SequenceStatus.WAITING
        self.num_computed_tokens = 0
        self.num_pending_tokens = 0  # chosen by a step in flight, not yet in token_ids (async scheduling)
        self.spec_token_ids: list[int] = []  # draft tokens proposed for the next step (not yet verified)
        self.draft_num_computed = 0  # tokens whose K/V the draft model has in its cache
        self.block_ids: list[int] = []
        self.block_hashes: list[bytes] = []  # chained hashes of the full blocks of token_ids
        self.num_registered_blocks = 0  # leading block_ids the block manager has offered to the prefix cache
        self.num_cached_tokens = 0  # prompt tokens that the prefix cache supplied at first admission
        self.num_preemptions = 0
        self.logprobs: list[dict[int, float]] = []
        # prompt token index (1 .. num_prompt_tokens - 1) -> its entry ({token_id: Logprob}); None: not asked.
        # The engine sets one dict shared by all the request's sequences.
        self.prompt_logprobs: dict[int, dict] | None = None
        self.cumulative_logprob = 0.0
        self.finish_reason: str | None = None
        self.stop_reason: int | str | None = None
        self.text = ""
        self.detokenizer: Any = None  # set by the engine when a tokenizer exists
        # structured outputs: a jaxinfer.structured.matcher.GrammarMatcher that has accepted every output token
        self.grammar: Any = None
        self.num_forced_tokens = 0  # output tokens appended by jump-forward (no decode step of their own)
        self.first_scheduled_time: float | None = None
        self.first_token_time: float | None = None
        self.finished_time: float | None = None

    @property
    def num_tokens(self) -> int:
        """Known tokens plus pending ones: what the scheduler plans with."""
        return len(self.token_ids) + self.num_pending_tokens

    @property
    def output_token_ids(self) -> list[int]:
        return self.token_ids[self.num_prompt_tokens :]

    @property
    def num_output_tokens(self) -> int:
        """Output tokens in ``token_ids`` (pending ones not counted)."""
        return len(self.token_ids) - self.num_prompt_tokens

    @property
    def needs_prompt_logprobs(self) -> bool:
        """Prompt logprobs were asked for and some prompt token has no entry yet."""
        d = self.prompt_logprobs
        return d is not None and len(d) < self.num_prompt_tokens - 1

    def prompt_logprob_positions(self, start: int, num_tokens: int) -> list[int]:
        """The positions among ``start .. start + num_tokens - 1`` whose logits give a missing prompt logprob
        (that of the prompt token right after each)."""
        if not self.needs_prompt_logprobs:
            return []
        end = min(start + num_tokens, self.num_prompt_tokens - 1)
        return [p for p in range(start, end) if p + 1 not in self.prompt_logprobs]

    @property
    def can_choose_ahead(self) -> bool:
        """True when its next tokens can be chosen several at a time on the device (multi-step decoding,
        speculation): no penalties (they read the output history), no min_tokens ban left to lift, and no
        grammar (its mask depends on every earlier token: a constrained sequence takes single steps)."""
        p = self.params
        return not p.has_penalties and self.num_output_tokens >= p.min_tokens and self.grammar is None

    @property
    def is_finished(self) -> bool:
        return self.status is SequenceStatus.FINISHED

    def __repr__(self) -> str:
        return (
            f"Sequence(id={self.seq_id}, req={self.request_id!r}, status={self.status.value}, "
            f"tokens={self.num_tokens}, computed={self.num_computed_tokens}, blocks={len(self.block_ids)})"
        )
