"""What the engine returns: vLLM's RequestOutput / CompletionOutput, plus per-request timing metrics.

``RequestOutput.prompt_logprobs`` (asked with ``SamplingParams(prompt_logprobs=k)``) holds one entry per prompt
token: None for the first (nothing precedes it), then ``{token_id: Logprob}`` with the prompt token itself
(first) and the k most probable tokens of the model's distribution at the previous position — the raw
log-softmax, before temperature or penalties. The sampled tokens' ``CompletionOutput.logprobs`` stay plain
``{token_id: logprob}`` floats.
"""

from __future__ import annotations

import dataclasses


@dataclasses.dataclass(frozen=True)
class Logprob:
    """One token's entry in ``RequestOutput.prompt_logprobs`` (vLLM's shape)."""

    logprob: float  # log-softmax of the raw logits (float32)
    rank: int  # 1 + the number of vocabulary tokens strictly more probable (1 = most likely)
    decoded_token: str | None = None  # the token's text (None: the model has no tokenizer)


@dataclasses.dataclass
class RequestMetrics:
    arrival_time: float
    first_scheduled_time: float | None = None
    first_token_time: float | None = None
    finished_time: float | None = None
    num_cached_tokens: int = 0  # prompt tokens served from the prefix cache

    @property
    def time_to_first_token(self) -> float | None:
        return None if self.first_token_time is None else self.first_token_time - self.arrival_time


@dataclasses.dataclass
class CompletionOutput:
    index: int
    text: str
    token_ids: list[int]
    logprobs: list[dict[int, float]] | None  # per generated token: {token_id: logprob}, sampled token first
    finish_reason: str | None  # "stop" | "length" | "abort" | None while running
    stop_reason: int | str | None = None  # the stop token id or stop string that ended it
    cumulative_logprob: float | None = None

    def finished(self) -> bool:
        return self.finish_reason is not None


@dataclasses.dataclass
class RequestOutput:
    request_id: str
    prompt: str | None
    prompt_token_ids: list[int]
    outputs: list[CompletionOutput]
    finished: bool
    metrics: RequestMetrics
    num_cached_tokens: int = 0
    # None unless SamplingParams.prompt_logprobs was set; else one entry per prompt token (see the module doc)
    prompt_logprobs: list[dict[int, Logprob] | None] | None = None
