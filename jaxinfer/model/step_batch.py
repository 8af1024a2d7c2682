"""The step batch: one padded, ragged batch of query tokens, as a pytree the jitted step takes.

The runner packs a scheduler plan into this; the model and attention read it. Tokens of all sequences are
laid flat (sequence after sequence, `cu_q_lens` marks the boundaries); token and sequence counts are padded
to buckets so the set of compiled shapes stays small. Padding tokens write their K/V to the null slot
(slot 0 of block 0, which the block manager never hands out) and padding sequence slots have q_len 0 and
kv_len 0.
"""

from __future__ import annotations

import dataclasses

import jax

NULL_SLOT = 0  # block 0 is reserved: padding writes land here and nothing ever reads them


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class StepBatch:
    token_ids: jax.Array  # [T] i32    flat query tokens, T padded to a bucket
    positions: jax.Array  # [T] i32    absolute position of each token in its sequence
    slot_mapping: jax.Array  # [T] i32 cache slot (block * block_size + offset) each token's K/V is written to
    block_tables: jax.Array  # [S, MB] i32  block ids per sequence slot, padded with 0
    cu_q_lens: jax.Array  # [S+1] i32  cumulative query lengths; padded slots repeat the last value
    kv_lens: jax.Array  # [S] i32     context length incl. this step's tokens; 0 for padded slots
    logits_indices: jax.Array  # [L] i32 flat token indices whose logits are returned (padding: 0)


def single_sequence_batch(token_ids, block_ids, block_size: int, *, start: int = 0, all_logits: bool = False):
    """A StepBatch for one sequence computing ``token_ids`` at positions ``start, start+1, ...``.

    For direct users of the pure layer (and tests): ``block_ids`` are the cache blocks of the sequence, in
    order; with ``all_logits`` the logits of every token are returned, else only of the last one.
    """
    import numpy as np

    n = len(token_ids)
    pos = np.arange(start, start + n, dtype=np.int32)
    blocks = np.asarray(block_ids, np.int32)
    if len(blocks) * block_size < start + n:
        raise ValueError(f"{len(blocks)} blocks of {block_size} cannot hold {start + n} tokens")
    return StepBatch(
        token_ids=np.asarray(token_ids, np.int32),
        positions=pos,
        slot_mapping=(blocks[pos // block_size] * block_size + pos % block_size).astype(np.int32),
        block_tables=blocks[None, :],
        cu_q_lens=np.asarray([0, n], np.int32),
        kv_lens=np.asarray([start + n], np.int32),
        logits_indices=np.arange(n, dtype=np.int32) if all_logits else np.asarray([n - 1], np.int32),
    )
