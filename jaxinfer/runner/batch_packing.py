"""Packing host-side work into a padded StepBatch of numpy arrays.

A work item is one sequence's contribution to a step: its block ids, the position of its first new token,
the new tokens, and how many of its trailing positions need logits (1 for a normal step, 1 + k when k
speculative tokens are verified, 0 for a prefill chunk that does not reach the end of the prompt) and, for
prompt logprobs, the prompt token each of its positions is to score (``prompt_targets``).
``pack`` lays items out in a planned ``StepShape`` (see ``jaxinfer.runner.shape_plan``), with block tables at the
runner's full width; ``abstract_batch`` describes that layout for compiling ahead of the data;
``pack_prompt_targets`` lays the targets out beside it, one per flat token.
"""

from __future__ import annotations

import dataclasses
import itertools

import jax
import numpy as np

from jaxinfer.model.step_batch import NULL_SLOT, StepBatch
from jaxinfer.runner.shape_plan import StepShape


@dataclasses.dataclass
class WorkItem:
    block_ids: list[int]
    start: int  # position of tokens[0]
    tokens: list[int]
    num_logits: int  # trailing positions whose logits are returned
    # per token: the prompt token whose logprob its logits give (-1: none); None: no prompt logprobs
    prompt_targets: list[int] | None = None


def pack(items: list[WorkItem], block_size: int, shape: StepShape, max_blocks: int):
    """Lay the items out in ``shape`` (which must fit them), block tables ``max_blocks`` wide: (StepBatch of
    numpy arrays, first logits row of each item). Items keep their order; padding slots have q_len 0 and
    kv_len 0, padding tokens write to the null slot, padding logits rows read token 0.

    Vectorized over the items (one numpy call per array, one slice per block table row): on a host driving a
    GPU this runs every step, for every sequence of the batch."""
    bs = block_size
    T, S, R = shape.num_tokens, shape.num_seqs, shape.num_logits
    n = len(items)
    token_ids = np.zeros(T, np.int32)
    positions = np.zeros(T, np.int32)
    slot_mapping = np.full(T, NULL_SLOT, np.int32)
    block_tables = np.zeros((S, max_blocks), np.int32)
    cu_q_lens = np.zeros(S + 1, np.int32)
    kv_lens = np.zeros(S, np.int32)
    logits_indices = np.zeros(R, np.int32)
    if n == 0:
        return StepBatch(token_ids, positions, slot_mapping, block_tables, cu_q_lens, kv_lens, logits_indices), []
    lens = np.fromiter((len(w.tokens) for w in items), np.int64, n)
    first = np.fromiter((w.start for w in items), np.int64, n)
    num_logits = np.fromiter((w.num_logits for w in items), np.int64, n)
    ends = np.cumsum(lens)
    total = int(ends[-1])
    cu_q_lens[1 : n + 1] = ends
    cu_q_lens[n + 1 :] = total
    kv_lens[:n] = first + lens
    for i, w in enumerate(items):
        block_tables[i, : len(w.block_ids)] = w.block_ids
    token_ids[:total] = np.fromiter(itertools.chain.from_iterable(w.tokens for w in items), np.int32, total)
    item = np.repeat(np.arange(n), lens)
    pos = first[item] + np.arange(total) - (ends - lens)[item]
    positions[:total] = pos
    slot_mapping[:total] = block_tables[item, pos // bs] * bs + pos % bs
    row_starts = np.cumsum(num_logits) - num_logits
    num_rows = int(num_logits.sum())
    owner = np.repeat(np.arange(n), num_logits)
    logits_indices[:num_rows] = (ends - num_logits)[owner] + np.arange(num_rows) - row_starts[owner]
    batch = StepBatch(token_ids, positions, slot_mapping, block_tables, cu_q_lens, kv_lens, logits_indices)
    return batch, row_starts.tolist()  # numpy: the compiled step transfers its arguments far faster than device_put


def pack_prompt_targets(items: list[WorkItem], num_tokens: int) -> np.ndarray:
    """[T] i32: each flat token's prompt target in ``pack``'s layout (-1 for none and for padding)."""
    targets = np.full(num_tokens, -1, np.int32)
    t = 0
    for w in items:
        if w.prompt_targets is not None:
            targets[t : t + len(w.tokens)] = w.prompt_targets
        t += len(w.tokens)
    return targets


def abstract_batch(shape: StepShape, max_blocks: int, sharding=None) -> StepBatch:
    """The StepBatch of ``shape`` as ShapeDtypeStructs (for compiling ahead of the data)."""
    T, S, R = shape.num_tokens, shape.num_seqs, shape.num_logits

    def i32(*dims):
        return jax.ShapeDtypeStruct(dims, np.int32, sharding=sharding)

    return StepBatch(i32(T), i32(T), i32(T), i32(S, max_blocks), i32(S + 1), i32(S), i32(R))
