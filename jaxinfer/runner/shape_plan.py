"""The shape plan: every executable an engine configuration can run, listed before the first request.

A compiled XLA executable has fixed array shapes, so the engine pads each step into one of a few planned
shapes and compiles all of them at start (``LLM(..., compilation="eager")``, the default). The plan is a
pure function of the configuration — ``max_num_seqs``, ``max_num_batched_tokens``, ``max_model_len``, the
block size, speculation — and this module imports no JAX.

Step shapes (``StepShape``): the block-table width is always the full ``max_model_len`` (the attention
visits only the blocks some query needs, so a wide table costs a few bytes of transfer), and a step is one
of three kinds:

* decode — every sequence computes one token: ``S`` slots, ``T = S`` tokens, ``S`` logits rows, for ``S``
  below 16 (from 16 sequences on, a decode step runs in the mixed shape of the same size: its attention
  then costs the same, measured, and the plan stays smaller);
* verify — under speculation, no sequence computes more than ``W = 1 + k`` tokens: ``T = S * W`` tokens,
  ``S * W`` logits rows for the target (one per scored position), ``S`` for a draft model's first round;
* mixed — anything else (prompts, prefill chunks beside decodes): ``T`` tokens from the token buckets,
  ``S = R = min(T, max sequence bucket)`` (a step never has more sequences than tokens). A step that
  carries a prefill chunk carries no draft tokens (the scheduler drops them), so one logits row per
  sequence is enough.

Buckets, chosen by measured cost (see the README): sequences in powers of two up to ``max_num_seqs``
(padding a decode step from 17 to 32 sequences costs little: the weights are read once whatever the
batch); tokens in powers of two from 16 to 256, then steps of 1.5x / 1.33x (384, 512, 768, 1024, 1536,
2048, ...), the last being ``max_num_batched_tokens`` itself (a multi-token step's cost grows with its
tokens, so padding is bounded by 1.5x).

Prompt-logprobs steps (``prompt_step_shapes``): a step that computes positions whose logits give prompt
logprobs (``SamplingParams.prompt_logprobs``) returns the logits of every token, so it runs as its own
executable, always in a mixed shape: its tokens padded to ``prompt_token_buckets`` (16, 64, 256, 1024, ...
every other power of two of the token buckets, and the budget), at most 4x, which keeps the extra
executables few (5 in the default configuration) for a feature most steps never use.

Sampler executables are keyed by (rows, ``SamplerVariant``): greedy without logprobs, and the general path
(temperature, top-k/p, min-p, penalties, seeds, the top ``max_logprobs`` logprobs), which also serves
greedy requests that ask for logprobs; with structured outputs, each of the two again with a token bitmask
per row (``masked``), taken by any step that has a constrained row.
"""

from __future__ import annotations

import dataclasses
from typing import Iterable

MIN_TOKEN_BUCKET = 16
SMALL_TOKEN_BUCKETS_END = 256  # powers of two up to here, then steps of 1.5x / 1.33x


@dataclasses.dataclass(frozen=True)
class StepShape:
    num_tokens: int  # T: flat query tokens
    num_seqs: int  # S: sequence slots
    num_logits: int  # R: logits rows
    # W: at most W tokens per sequence (1 decode, 1 + k verify); None = mixed (any). The step function and the
    # attention take the same value (``query_width``), so "mixed" has one spelling everywhere.
    query_width: int | None

    @property
    def kind(self) -> str:
        return {None: "mixed", 1: "decode"}.get(self.query_width, "verify")

    def _key(self) -> tuple[int, int, int, int]:
        return (self.num_tokens, self.num_seqs, self.num_logits, self.query_width or 0)

    def __lt__(self, other: "StepShape") -> bool:
        return self._key() < other._key()

    def __str__(self) -> str:
        return f"{self.kind}(T={self.num_tokens}, S={self.num_seqs}, R={self.num_logits})"


@dataclasses.dataclass(frozen=True, order=True)
class SamplerVariant:
    """A compiled flavour of the sampler / verifier; the general one serves every request."""

    greedy: bool  # every row greedy: argmax only (rows with a temperature must not be present)
    num_logprobs: int  # top logprobs returned per row (0 or the engine's max_logprobs)
    penalties: bool  # presence / frequency / repetition penalties applied (id matrices max_model_len wide)
    masked: bool = False  # a token bitmask per row (structured outputs: the grammar's allowed tokens)

    def __str__(self) -> str:
        mask = "+masked" if self.masked else ""
        if self.greedy:
            return "greedy" + (f"+logprobs{self.num_logprobs}" if self.num_logprobs else "") + mask
        return "general" + ("+penalties" if self.penalties else "") + f"+logprobs{self.num_logprobs}" + mask


def bucket(n: int, minimum: int = 1) -> int:
    """Smallest power of two >= max(n, minimum): the padded size of a count of n."""
    size = max(minimum, 1)
    while size < n:
        size *= 2
    return size


def seq_buckets(max_num_seqs: int) -> tuple[int, ...]:
    """1, 2, 4, ... up to ``max_num_seqs`` (which ends the list even when it is not a power of two)."""
    out, b = [], 1
    while b < max_num_seqs:
        out.append(b)
        b *= 2
    return tuple(out + [max_num_seqs])


def token_buckets(max_num_batched_tokens: int) -> tuple[int, ...]:
    """Token counts of mixed steps: 16, 32, ..., 256, 384, 512, 768, 1024, 1536, ... and the budget itself."""
    out, b = [], MIN_TOKEN_BUCKET
    while b < max_num_batched_tokens:
        out.append(b)
        if b < SMALL_TOKEN_BUCKETS_END:
            b *= 2
        else:  # alternate x1.5 and x1.33: 256 -> 384 -> 512 -> 768 -> 1024 -> ...
            b = b * 3 // 2 if b & (b - 1) == 0 else b * 4 // 3
    return tuple(out + [max_num_batched_tokens])


def _is_power_of_4(n: int) -> bool:
    return n > 0 and n & (n - 1) == 0 and (n.bit_length() - 1) % 2 == 0


def _first_at_least(buckets: Iterable[int], n: int) -> int:
    for b in buckets:
        if b >= n:
            return b
    raise ValueError(f"{n} exceeds the largest planned bucket {max(buckets)}")


@dataclasses.dataclass(frozen=True)
class ShapePlan:
    """The step shapes of one runner (the target model's, or a draft model's) and the rows its sampler sees.

    ``verify_width``: 1 + k under speculation (None without): the query width of verification steps. ``verify_logits``: "all" (the target scores
    every position of a verification run) or "last" (a draft model's first round samples one token per
    sequence). ``max_num_batched_tokens`` bounds the tokens of one step.
    """

    max_num_seqs: int
    max_num_batched_tokens: int
    verify_width: int | None = None
    verify_logits: str = "all"

    def __post_init__(self):
        if self.verify_logits not in ("all", "last"):
            raise ValueError(f"verify_logits must be 'all' or 'last', got {self.verify_logits!r}")

    @property
    def seq_buckets(self) -> tuple[int, ...]:
        return seq_buckets(self.max_num_seqs)

    @property
    def token_buckets(self) -> tuple[int, ...]:
        return token_buckets(self.max_num_batched_tokens)

    @property
    def mixed_token_buckets(self) -> tuple[int, ...]:
        """Token counts of mixed steps: the token buckets, and room for a decode of every sequence."""
        return tuple(sorted(set(self.token_buckets) | ({self.seq_buckets[-1]} if self.seq_buckets[-1] >= MIN_TOKEN_BUCKET
                                                       else set())))

    def _mixed(self, tokens: int) -> StepShape:
        seqs = min(tokens, self.seq_buckets[-1])
        return StepShape(tokens, seqs, seqs, None)

    def _verify(self, seqs: int) -> StepShape:
        w = self.verify_width
        return StepShape(seqs * w, seqs, seqs * w if self.verify_logits == "all" else seqs, w)

    @property
    def decode_buckets(self) -> tuple[int, ...]:
        """Batch sizes with a decode shape of their own (larger decode steps run in mixed shapes)."""
        return tuple(s for s in self.seq_buckets if s < MIN_TOKEN_BUCKET)

    def step_shapes(self) -> list[StepShape]:
        """Every step shape this runner may run."""
        shapes = [StepShape(s, s, s, 1) for s in self.decode_buckets]
        if self.verify_width is not None:
            shapes += [self._verify(s) for s in self.seq_buckets]
        shapes += [self._mixed(t) for t in self.mixed_token_buckets]
        return sorted(set(shapes))

    @property
    def prompt_token_buckets(self) -> tuple[int, ...]:
        """Token counts of prompt-logprobs steps: the mixed buckets 16 * 4**i, and the largest."""
        mixed = self.mixed_token_buckets
        quarters = {b for b in mixed if b % MIN_TOKEN_BUCKET == 0 and _is_power_of_4(b // MIN_TOKEN_BUCKET)}
        return tuple(sorted(quarters | {mixed[-1]}))

    def prompt_step_shapes(self) -> list[StepShape]:
        """The shapes of steps that return prompt logprobs (mixed, all ``T`` tokens' logits computed)."""
        return [self._mixed(t) for t in self.prompt_token_buckets]

    def prompt_shape_for(self, run_lengths: list[int], num_logits: int) -> StepShape:
        """The planned shape of a prompt-logprobs step (see ``shape_for``; a mixed shape whatever the runs)."""
        if len(run_lengths) > self.max_num_seqs:
            raise ValueError(f"a step of {len(run_lengths)} sequences exceeds max_num_seqs={self.max_num_seqs}")
        shape = self._mixed(_first_at_least(self.prompt_token_buckets, sum(run_lengths)))
        if num_logits > shape.num_logits:
            raise ValueError(f"{num_logits} logits rows do not fit {shape} (a prompt-logprobs step carries no "
                             "draft tokens)")
        return shape

    def shape_for(self, run_lengths: list[int], num_logits: int) -> StepShape:
        """The planned shape of a step whose sequences compute ``run_lengths`` tokens each and that needs
        ``num_logits`` logits rows. Raises ValueError if the step exceeds the configuration."""
        n, total, longest = len(run_lengths), sum(run_lengths), max(run_lengths)
        verify = self.verify_width is not None and 1 < longest <= self.verify_width
        if n > self.max_num_seqs or (longest > 1 and not verify and total > self.max_num_batched_tokens):
            raise ValueError(f"a step of {n} sequences and {total} tokens exceeds the plan "
                             f"(max_num_seqs={self.max_num_seqs}, max_num_batched_tokens={self.max_num_batched_tokens})")
        if longest == 1 and n <= max(self.decode_buckets, default=0):
            s = _first_at_least(self.decode_buckets, n)
            shape = StepShape(s, s, s, 1)
        elif verify:
            shape = self._verify(_first_at_least(self.seq_buckets, n))
        else:  # the token budget never binds a decode step: max_num_seqs tokens always have a bucket
            shape = self._mixed(_first_at_least(self.mixed_token_buckets, total))
        if num_logits > shape.num_logits:
            raise ValueError(f"{num_logits} logits rows do not fit {shape} (a step with a prefill chunk carries "
                             "no draft tokens)")
        return shape

    def logits_rows(self) -> list[int]:
        """Every logits-row count a step of this runner may produce (the sampler's row counts)."""
        return sorted({s.num_logits for s in self.step_shapes()})
