"""``pack`` (vectorized over the items) against a plain per-item reference on fuzzed work items."""

from __future__ import annotations

import random

import jax
import numpy as np

from jaxinfer.model.step_batch import NULL_SLOT
from jaxinfer.runner.batch_packing import WorkItem, pack
from jaxinfer.runner.shape_plan import StepShape


def _reference(items, bs, shape, max_blocks):
    T, S, R = shape.num_tokens, shape.num_seqs, shape.num_logits
    ids, pos, slots = np.zeros(T, np.int32), np.zeros(T, np.int32), np.full(T, NULL_SLOT, np.int32)
    tables, cu = np.zeros((S, max_blocks), np.int32), np.zeros(S + 1, np.int32)
    kv, logits, starts = np.zeros(S, np.int32), np.zeros(R, np.int32), []
    t = r = 0
    for i, w in enumerate(items):
        tables[i, : len(w.block_ids)] = w.block_ids
        for k, tok in enumerate(w.tokens):
            p = w.start + k
            ids[t + k], pos[t + k], slots[t + k] = tok, p, w.block_ids[p // bs] * bs + p % bs
        n = len(w.tokens)
        kv[i] = w.start + n
        starts.append(r)
        for j in range(w.num_logits):
            logits[r + j] = t + n - w.num_logits + j
        r, t = r + w.num_logits, t + n
        cu[i + 1] = t
    cu[len(items) + 1:] = t
    return [ids, pos, slots, tables, cu, kv, logits], starts


def test_pack_matches_the_per_item_reference():
    rng = random.Random(0)
    for _ in range(500):
        bs, max_blocks = rng.choice([1, 2, 4, 16]), rng.randint(1, 12)
        items = []
        for _ in range(rng.randint(0, 6)):
            blocks = [rng.randint(1, 99) for _ in range(rng.randint(1, max_blocks))]
            start = rng.randint(0, len(blocks) * bs - 1)
            tokens = [rng.randint(0, 999) for _ in range(rng.randint(1, len(blocks) * bs - start))]
            items.append(WorkItem(blocks, start, tokens, rng.randint(0, len(tokens))))
        shape = StepShape(sum(len(w.tokens) for w in items) + rng.randint(0, 5), len(items) + rng.randint(0, 3),
                          sum(w.num_logits for w in items) + rng.randint(0, 3), None)
        batch, starts = pack(items, bs, shape, max_blocks)
        want, want_starts = _reference(items, bs, shape, max_blocks)
        assert starts == want_starts
        for got, ref in zip(jax.tree.leaves(batch), want):
            assert got.dtype == np.int32 and np.array_equal(got, ref)
