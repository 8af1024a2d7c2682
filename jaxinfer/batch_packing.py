"""Packing host-side work into a padded StepBatch of numpy arrays.

A work item is one sequence's contribution to a step: its block ids, the position of its first new token,
the new tokens, and how many of its trailing positions need logits (1 for a normal step, 1 + k when k
speculative tokens are verified, 0 for a prefill chunk that does not reach the end of the prompt).

``plan_shape`` rounds the step's counts up (blocks per sequence, logits rows, longest query run and
multi-token slots to powers of two; tokens to powers of two up to 256, then multiples of 256; sequences to
powers of two up to 8, then multiples of 8): a
``StepShape``, the key of one compiled executable.
``pack`` lays the items out in any shape that fits them, so a step may also run in a larger shape that is
already compiled (see ``jaxinfer.step_executables``).
"""

from __future__ import annotations

import dataclasses

import jax
import numpy as np

from jaxinfer.batch import NULL_SLOT, StepBatch, bucket


@dataclasses.dataclass
class WorkItem:
    block_ids: list[int]
    start: int  # position of tokens[0]
    tokens: list[int]
    num_logits: int  # trailing positions whose logits are returned


@dataclasses.dataclass(frozen=True, order=True)
class StepShape:
    num_tokens: int  # T: flat query tokens
    num_seqs: int  # S: sequence slots
    max_blocks: int  # MB: block-table width
    num_logits: int  # R: logits rows
    max_q_len: int  # longest query run of the slots [0, num_prefill_slots)
    num_prefill_slots: int  # P: leading slots that may hold several tokens; the rest hold one

    def fits(self, need: "StepShape") -> bool:
        """Whether a step planned as ``need`` can run in this shape (every count at least as large)."""
        if need.num_prefill_slots and (self.num_prefill_slots < need.num_prefill_slots
                                       or self.max_q_len < need.max_q_len):
            return False
        return (self.num_tokens >= need.num_tokens and self.num_seqs >= need.num_seqs
                and self.max_blocks >= need.max_blocks and self.num_logits >= need.num_logits)

    def cost(self, token_flops: float, context_flops: float, logits_flops: float, block_size: int) -> float:
        """A FLOP estimate: projections per token, attention per (query slot x key), the LM head per row."""
        P, S = self.num_prefill_slots, self.num_seqs
        query_slots = P * self.max_q_len + (S - P)
        return (self.num_tokens * token_flops + query_slots * self.max_blocks * block_size * context_flops
                + self.num_logits * logits_flops)


TOKEN_STEP = 256  # past this many tokens a step is padded to a multiple of it, not to a power of two


def bucket_tokens(n: int) -> int:
    """Padded token count of a multi-token step: powers of two up to 256, then multiples of 256 (a
    1,152-token prefill step runs as 1,280 tokens, not 2,048: every projection is computed per token)."""
    return bucket(n) if n <= TOKEN_STEP else -(-n // TOKEN_STEP) * TOKEN_STEP


def bucket_seqs(n: int) -> int:
    """Padded sequence count: powers of two up to 8, then multiples of 8 (a batch of 17 runs as 24, not 32)."""
    return bucket(n) if n <= 8 else -(-n // 8) * 8


def plan_shape(items: list[WorkItem], max_blocks_per_seq: int, query_width: int | None = None) -> StepShape:
    """The bucketed shape of a step.

    ``query_width`` (speculative decoding: 1 + k) makes verification steps one shape per batch size: when
    some item has several tokens and none has more than ``query_width``, the step is padded as if every
    slot verified ``query_width`` tokens (logits rows too, if any item wants more than one), so varying
    numbers of drafts do not compile new shapes.
    """
    lengths = [len(w.tokens) for w in items]
    S = bucket_seqs(len(items))
    T = S if max(lengths) == 1 else bucket_tokens(sum(lengths))
    MB = min(bucket(max(len(w.block_ids) for w in items)), max_blocks_per_seq)
    max_q = min(bucket(max(lengths)), T)
    multi = sum(1 for n in lengths if n > 1)
    P = 0 if max_q == 1 else min(bucket(multi), S)
    num_logits = sum(w.num_logits for w in items)
    R = S if num_logits <= S else bucket(num_logits)
    if query_width is not None and 1 < max(lengths) <= query_width:
        T = S * query_width  # exact, not a power of two: S already is a bucket
        R = T if max(w.num_logits for w in items) > 1 else S
        max_q, P = query_width, S
    return StepShape(T, S, MB, R, max_q, P)


def pack(items: list[WorkItem], block_size: int, shape: StepShape):
    """Lay the items out in ``shape`` (which must fit them): (StepBatch of numpy arrays, first logits row
    per item).

    Items with more than one token are laid out first, so that the slots ``[0, num_prefill_slots)`` hold
    every multi-token item and the rest are single-token decodes (see the XLA attention path).
    """
    bs = block_size
    order = sorted(range(len(items)), key=lambda i: len(items[i].tokens) == 1)
    items = [items[i] for i in order]
    T, S, MB, R = shape.num_tokens, shape.num_seqs, shape.max_blocks, shape.num_logits

    token_ids = np.zeros(T, np.int32)
    positions = np.zeros(T, np.int32)
    slot_mapping = np.full(T, NULL_SLOT, np.int32)
    block_tables = np.zeros((S, MB), np.int32)
    cu_q_lens = np.zeros(S + 1, np.int32)
    kv_lens = np.zeros(S, np.int32)
    logits_indices = np.zeros(R, np.int32)
    row_starts = []
    t = r = 0
    for i, w in enumerate(items):
        n = len(w.tokens)
        token_ids[t : t + n] = w.tokens
        pos = np.arange(w.start, w.start + n)
        positions[t : t + n] = pos
        blocks = np.asarray(w.block_ids, np.int32)
        slot_mapping[t : t + n] = blocks[pos // bs] * bs + pos % bs
        block_tables[i, : len(blocks)] = blocks
        kv_lens[i] = w.start + n
        row_starts.append(r)
        logits_indices[r : r + w.num_logits] = np.arange(t + n - w.num_logits, t + n)
        r += w.num_logits
        t += n
        cu_q_lens[i + 1] = t
    cu_q_lens[len(items) + 1 :] = t
    batch = StepBatch(token_ids, positions, slot_mapping, block_tables, cu_q_lens, kv_lens, logits_indices)
    starts = [0] * len(items)
    for slot, i in enumerate(order):
        starts[i] = row_starts[slot]
    return batch, starts  # numpy: the compiled step transfers its arguments far faster than device_put


def abstract_batch(shape: StepShape) -> StepBatch:
    """The StepBatch of ``shape`` as ShapeDtypeStructs (for compiling ahead of the data)."""
    T, S, MB, R = shape.num_tokens, shape.num_seqs, shape.max_blocks, shape.num_logits

    def i32(*dims):
        return jax.ShapeDtypeStruct(dims, np.int32)

    return StepBatch(i32(T), i32(T), i32(T), i32(S, MB), i32(S + 1), i32(S), i32(R))
