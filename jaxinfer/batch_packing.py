"""Packing host-side work into a padded StepBatch (numpy in, device arrays out).

A work item is one sequence's contribution to a step: its block ids, the position of its first new token,
the new tokens, and how many of its trailing positions need logits (1 for a normal step, 1 + k when k
speculative tokens are verified, 0 for a prefill chunk that does not reach the end of the prompt). Counts
are padded to powers of two (tokens, sequences, blocks per sequence, logits rows, longest query run), so a
serving workload touches only a few compiled shapes.
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


def pack(items: list[WorkItem], block_size: int, max_blocks_per_seq: int, query_width: int | None = None):
    """Returns (device StepBatch, static max_q_len, static num_prefill_slots, first logits row of each item).

    Items with more than one token are laid out first, so that the slots ``[0, num_prefill_slots)`` hold
    every multi-token item and the rest are single-token decodes (see the XLA attention path).

    ``query_width`` (speculative decoding: 1 + k) makes verification steps one shape per batch size: when
    some item has several tokens and none has more than ``query_width``, the step is padded as if every
    slot verified ``query_width`` tokens (logits rows too, if any item wants more than one), so varying
    numbers of drafts do not compile new shapes.
    """
    bs = block_size
    order = sorted(range(len(items)), key=lambda i: len(items[i].tokens) == 1)
    items = [items[i] for i in order]
    num_tokens = sum(len(w.tokens) for w in items)
    T = bucket(num_tokens)
    S = bucket(len(items))
    MB = min(bucket(max(len(w.block_ids) for w in items)), max_blocks_per_seq)
    max_q = min(bucket(max(len(w.tokens) for w in items)), T)
    multi = sum(1 for w in items if len(w.tokens) > 1)
    prefill_slots = 0 if max_q == 1 else min(bucket(multi), S)
    R = max(bucket(max(sum(w.num_logits for w in items), 1)), S)
    lengths = [len(w.tokens) for w in items]
    if query_width is not None and 1 < max(lengths) <= query_width:
        T = bucket(S * query_width)
        R = T if max(w.num_logits for w in items) > 1 else S
        max_q, prefill_slots = bucket(query_width), S

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
    return jax.device_put(batch), max_q, prefill_slots, starts


def signature(batch: StepBatch, max_q: int) -> tuple:
    """The compiled-shape key of a step."""
    return (batch.token_ids.shape[0], batch.kv_lens.shape[0], batch.block_tables.shape[1],
            batch.logits_indices.shape[0], max_q)
