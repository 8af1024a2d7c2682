"""Packing work items into a padded StepBatch: bucketed shapes, and one shape per batch size under
speculation however many drafts each sequence carries."""

from __future__ import annotations

import numpy as np

from jaxinfer.batch_packing import WorkItem, pack, signature


def _sig(items, query_width=None):
    batch, max_q, prefill_slots, starts = pack(items, 16, 8, query_width)
    return (*signature(batch, max_q), prefill_slots), batch, starts


def _verify_item(seq: int, num_drafts: int) -> WorkItem:
    blocks = [1 + 4 * seq + i for i in range(4)]
    return WorkItem(blocks, 40, [7] * (1 + num_drafts), 1 + num_drafts)


def test_single_decode_is_not_padded_to_eight_tokens():
    sig, batch, _ = _sig([WorkItem([1, 2, 3], 40, [5], 1)])
    assert batch.token_ids.shape == (1,) and sig[0] == 1


def test_verification_steps_share_one_shape_per_batch_size():
    sigs = set()
    for drafts in ([4, 4, 4], [1, 0, 0], [0, 2, 3], [4, 0, 1]):
        sig, batch, starts = _sig([_verify_item(i, d) for i, d in enumerate(drafts)], query_width=5)
        sigs.add(sig)
        # every item's logits rows still point at its own trailing tokens
        cu = np.asarray(batch.cu_q_lens)
        li = np.asarray(batch.logits_indices)
        order = sorted(range(3), key=lambda i: drafts[i] == 0)
        for slot, i in enumerate(order):
            rows = li[starts[i] : starts[i] + 1 + drafts[i]]
            assert list(rows) == list(range(cu[slot + 1] - 1 - drafts[i], cu[slot + 1]))
    assert len(sigs) == 1
    (T, S, MB, R, max_q, prefill_slots), = sigs
    assert (T, S, R, max_q, prefill_slots) == (32, 4, 32, 8, 4)


def test_without_query_width_shapes_follow_the_tokens():
    a, _, _ = _sig([_verify_item(i, d) for i, d in enumerate([4, 4, 4])])
    b, _, _ = _sig([_verify_item(i, d) for i, d in enumerate([1, 0, 0])])
    assert a != b


def test_catch_up_steps_ask_for_no_logits_rows_beyond_the_slots():
    items = [WorkItem([1, 2, 3, 4], 0, list(range(n)), 0) for n in (40, 13, 2)]
    sig, batch, _ = _sig(items, query_width=40)
    T, S, MB, R, max_q, prefill_slots = sig
    assert (T, S, R, max_q) == (256, 4, 4, 64)
