"""The scheduler: which sequences run in the next step and how many tokens each. No JAX here.

Continuous batching with a token budget (vLLM v1's unified view): every sequence has
``num_computed_tokens`` and ``num_tokens``; a step advances some of them. Running sequences are served first
(a decode token, or the next chunk of an unfinished prefill), then waiting ones are admitted in policy order
(``fcfs`` or ``priority``) while the token budget, ``max_num_seqs`` and the block pool allow. Prefills larger
than the remaining budget are chunked when chunked prefill is on. When a running sequence needs a block and
none is free, the scheduler preempts by recompute: the victim (lowest priority, then latest arrival) drops
its blocks and goes back to the front of the waiting queue, keeping its generated tokens.
``batching="static"`` is the baseline: a batch is admitted only when nothing runs, and only once
``max_num_seqs`` sequences wait or the oldest has waited ``static_batch_timeout_s``.

A sequence that still needs prompt logprobs (``Sequence.needs_prompt_logprobs``) is admitted without prefix-cache
hits: the cache holds K/V, not the logits those positions must give. A step that computes such positions
carries no draft tokens, like a step with a prefill chunk.
"""

from __future__ import annotations

import dataclasses
import time
from typing import Callable

from jaxinfer.core.block_manager import BlockManager
from jaxinfer.core.sequence import Sequence, SequenceStatus


@dataclasses.dataclass(frozen=True)
class SchedulerConfig:
    max_num_seqs: int = 64
    max_num_batched_tokens: int = 2048
    max_model_len: int = 2048
    enable_chunked_prefill: bool = True
    policy: str = "fcfs"  # "fcfs" | "priority"
    batching: str = "continuous"  # "continuous" | "static"
    static_batch_timeout_s: float = 0.5

    def __post_init__(self):
        if self.policy not in ("fcfs", "priority"):
            raise ValueError(f"scheduling policy must be 'fcfs' or 'priority', got {self.policy!r}")
        if self.batching not in ("continuous", "static"):
            raise ValueError(f"batching must be 'continuous' or 'static', got {self.batching!r}")
        if self.max_num_seqs < 1 or self.max_num_batched_tokens < 1:
            raise ValueError("max_num_seqs and max_num_batched_tokens must be >= 1")
        if not self.enable_chunked_prefill and self.max_num_batched_tokens < self.max_model_len:
            raise ValueError(
                f"without chunked prefill, max_num_batched_tokens ({self.max_num_batched_tokens}) must be >= "
                f"max_model_len ({self.max_model_len}) so that every prompt fits in one step"
            )


@dataclasses.dataclass
class ScheduledSeq:
    seq: Sequence
    num_new_tokens: int  # tokens computed this step from seq.num_computed_tokens, speculative ones included
    num_spec_tokens: int = 0  # how many of them are draft tokens (seq.spec_token_ids[:num_spec_tokens])
    samples: bool = dataclasses.field(init=False)  # reaches the end of the known tokens: sample a next one
    # the sequence as scheduled: the step computes from ``start``; a preemption since then voids its K/V
    start: int = dataclasses.field(init=False)
    preemptions: int = dataclasses.field(init=False)

    def __post_init__(self):
        real = self.num_new_tokens - self.num_spec_tokens
        self.start, self.preemptions = self.seq.num_computed_tokens, self.seq.num_preemptions
        self.samples = self.start + real == self.seq.num_tokens

    @property
    def prompt_logprob_positions(self) -> list[int]:
        """Positions computed in this step whose logits give a prompt logprob still missing."""
        real = self.num_new_tokens - self.num_spec_tokens
        return self.seq.prompt_logprob_positions(self.seq.num_computed_tokens, real)


@dataclasses.dataclass
class SchedulerOutput:
    scheduled: list[ScheduledSeq]
    preempted: list[Sequence]

    @property
    def num_tokens(self) -> int:
        return sum(s.num_new_tokens for s in self.scheduled)

    @property
    def is_empty(self) -> bool:
        return not self.scheduled


class Scheduler:
    def __init__(self, config: SchedulerConfig, block_manager: BlockManager, clock: Callable[[], float] = time.monotonic):
        self.config = config
        self.blocks = block_manager
        self.clock = clock
        self.waiting: list[Sequence] = []
        self.running: list[Sequence] = []
        self.num_preemptions = 0

    # ------------------------------------------------------------- queueing
    def add(self, seq: Sequence) -> None:
        seq.status = SequenceStatus.WAITING
        self.waiting.append(seq)

    def remove(self, seq: Sequence) -> None:
        """Take a sequence out of the queues and release its blocks (finish or abort)."""
        if seq in self.running:
            self.running.remove(seq)
        if seq in self.waiting:
            self.waiting.remove(seq)
        self.blocks.free_sequence(seq)
        seq.status = SequenceStatus.FINISHED

    def _order_key(self, seq: Sequence):
        if self.config.policy == "priority":
            return (seq.priority, seq.arrival_time, seq.seq_id)
        return (seq.arrival_time, seq.seq_id)

    def _pick_victim(self, candidates: list[Sequence]) -> Sequence:
        """Lowest priority (largest value), then latest arrival."""
        return max(candidates, key=self._order_key)

    def _preempt(self, seq: Sequence) -> None:
        self.running.remove(seq)
        self.blocks.free_sequence(seq)
        seq.num_computed_tokens = 0
        seq.draft_num_computed = 0
        seq.spec_token_ids = []
        seq.status = SequenceStatus.WAITING
        seq.num_preemptions += 1
        self.num_preemptions += 1
        self.waiting.insert(0, seq)

    # ------------------------------------------------------------ scheduling
    def schedule(self, hold: Callable[[Sequence], bool] | None = None) -> SchedulerOutput:
        """The next step's work. ``hold``: running sequences it returns True for sit this step out (async
        scheduling holds those whose pending token may be their last)."""
        cfg = self.config
        budget = cfg.max_num_batched_tokens
        scheduled: list[ScheduledSeq] = []
        preempted: list[Sequence] = []

        self.waiting.sort(key=self._order_key)
        self._maybe_preempt_for_priority(preempted)

        # 1. Running sequences, in policy order: each needs its remaining tokens (decode: 1).
        self.running.sort(key=self._order_key)
        i = 0
        while i < len(self.running) and budget > 0:
            seq = self.running[i]
            if hold is not None and hold(seq):
                i += 1
                continue
            remaining = seq.num_tokens - seq.num_computed_tokens
            num_spec = min(len(seq.spec_token_ids), budget - 1) if remaining == 1 else 0
            num_new = min(remaining, budget) + num_spec
            if num_new <= 0:
                i += 1
                continue
            while not self.blocks.grow(seq, seq.num_computed_tokens + num_new):
                victim = self._pick_victim(self.running[i:])
                self._preempt(victim)
                preempted.append(victim)
                if victim is seq:
                    break
            if seq.status is not SequenceStatus.RUNNING:
                continue  # preempted itself; self.running shifted left
            scheduled.append(ScheduledSeq(seq, num_new, num_spec))
            budget -= num_new
            i += 1

        # 2. Waiting sequences.
        if cfg.batching == "static" and not self._static_batch_ready():
            return SchedulerOutput(self._drop_drafts_beside_prefill(scheduled), preempted)
        self.waiting.sort(key=self._order_key)
        admitted = []
        for seq in list(self.waiting):
            if budget <= 0 or len(self.running) >= cfg.max_num_seqs or seq in preempted:
                break
            bypass = seq.needs_prompt_logprobs  # every prompt position must give its logits
            cached = self._cached_prefix(seq, bypass)
            if self.blocks.waits_for_pending(seq, len(cached)):
                continue  # another sequence is computing this prefix right now: hit its blocks next step
            num_cached = len(cached) * self.blocks.block_size
            remaining = seq.num_tokens - num_cached
            num_new = min(remaining, budget)
            if num_new < remaining and not cfg.enable_chunked_prefill:
                break
            if not self.blocks.admit(seq, cached, num_cached + num_new):
                break  # wait for blocks to free up (FCFS: no overtaking)
            if seq.first_scheduled_time is None:
                seq.first_scheduled_time = self.clock()
                seq.num_cached_tokens = num_cached
                if not bypass:
                    self.blocks.record_query(seq, num_cached)
            seq.num_computed_tokens = num_cached
            seq.status = SequenceStatus.RUNNING
            self.running.append(seq)
            admitted.append(seq)
            scheduled.append(ScheduledSeq(seq, num_new))
            budget -= num_new
        for seq in admitted:
            self.waiting.remove(seq)
        return SchedulerOutput(self._drop_drafts_beside_prefill(scheduled), preempted)

    def _cached_prefix(self, seq: Sequence, bypass: bool) -> list[int]:
        """The prefix-cache blocks ``seq`` is admitted with: none when it ``bypass``es the cache (its block hashes
        are still computed, so that its blocks enter the cache and others can wait for them)."""
        if not bypass:
            return self.blocks.find_cached_prefix(seq)
        self.blocks.update_hashes(seq)
        return []

    @staticmethod
    def _drop_drafts_beside_prefill(scheduled: list[ScheduledSeq]) -> list[ScheduledSeq]:
        """A step that computes a prefill chunk (or prompt logprobs) carries no draft tokens: such a step's
        time is mostly the prefill's, and keeping verification out of it keeps one logits row per sequence
        (a small, fixed set of compiled step shapes). The drafts' blocks are released after the step as
        usual."""
        if not any(s.num_new_tokens - s.num_spec_tokens > 1 or s.prompt_logprob_positions for s in scheduled):
            return scheduled
        return [ScheduledSeq(s.seq, s.num_new_tokens - s.num_spec_tokens) if s.num_spec_tokens else s
                for s in scheduled]

    def _static_batch_ready(self) -> bool:
        if self.running or not self.waiting:
            return False
        if len(self.waiting) >= self.config.max_num_seqs:
            return True
        oldest = min(s.arrival_time for s in self.waiting)
        return self.clock() - oldest >= self.config.static_batch_timeout_s

    def _maybe_preempt_for_priority(self, preempted: list[Sequence]) -> None:
        """With the priority policy and a full batch, a more urgent waiting sequence displaces the least urgent."""
        if self.config.policy != "priority" or not self.waiting:
            return
        while len(self.running) >= self.config.max_num_seqs:
            head = self.waiting[0]
            victim = self._pick_victim(self.running)
            if self._order_key(victim) <= self._order_key(head):
                return
            self._preempt(victim)
            preempted.append(victim)
            # the victim was inserted at the front; keep the waiting queue in policy order
            self.waiting.sort(key=self._order_key)

    # ---------------------------------------------------------- bookkeeping
    def commit_computed(self, seq: Sequence, num_computed: int) -> None:
        """After a step: ``num_computed`` tokens of ``seq`` have valid K/V. Surplus blocks (rejected
        speculative tokens) are released and newly full blocks enter the prefix cache."""
        seq.num_computed_tokens = num_computed
        seq.draft_num_computed = min(seq.draft_num_computed, num_computed)
        seq.spec_token_ids = []
        if seq.block_ids:
            self.blocks.truncate(seq, max(seq.num_tokens, num_computed))
            self.blocks.cache_computed_blocks(seq)
