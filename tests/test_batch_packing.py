"""Packing work items into a padded StepBatch: bucketed shapes, one shape per batch size under
speculation however many drafts each sequence carries, and packing into any larger shape."""

from __future__ import annotations

import dataclasses

import numpy as np

from jaxinfer.batch_packing import StepShape, WorkItem, pack, plan_shape


def _sig(items, query_width=None):
    shape = plan_shape(items, 8, query_width)
    batch, starts = pack(items, 16, shape)
    return dataclasses.astuple(shape), batch, starts


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
    assert (T, S, R, max_q, prefill_slots) == (20, 4, 20, 5, 4)


def test_without_query_width_shapes_follow_the_tokens():
    a, _, _ = _sig([_verify_item(i, d) for i, d in enumerate([4, 4, 4])])
    b, _, _ = _sig([_verify_item(i, d) for i, d in enumerate([1, 0, 0])])
    assert a != b


def test_catch_up_steps_ask_for_no_logits_rows_beyond_the_slots():
    items = [WorkItem([1, 2, 3, 4], 0, list(range(n)), 0) for n in (40, 13, 2)]
    sig, batch, _ = _sig(items, query_width=40)
    T, S, MB, R, max_q, prefill_slots = sig
    assert (T, S, R, max_q) == (160, 4, 4, 40)


def test_fits_requires_every_count_and_room_for_multi_token_slots():
    need = StepShape(64, 4, 4, 4, 32, 2)
    assert StepShape(128, 8, 8, 8, 32, 2).fits(need)
    assert not StepShape(128, 8, 8, 8, 16, 2).fits(need)  # query runs too short
    assert not StepShape(128, 8, 8, 8, 32, 1).fits(need)  # too few multi-token slots
    assert not StepShape(32, 8, 8, 8, 32, 2).fits(need)
    decode = StepShape(4, 4, 4, 4, 1, 0)
    assert StepShape(64, 4, 4, 4, 32, 2).fits(decode)  # single tokens fit any slot


def test_packing_into_a_larger_shape_keeps_every_token_in_place():
    items = [WorkItem([1, 2], 3, [9, 8, 7], 1), WorkItem([3], 5, [6], 1), WorkItem([4, 5, 6], 20, [5, 4], 2)]
    need = plan_shape(items, 8)
    big = StepShape(need.num_tokens * 4, need.num_seqs * 2, need.max_blocks * 2, need.num_logits * 2,
                     need.max_q_len * 2, need.num_prefill_slots * 2)
    a, starts_a = pack(items, 16, need)
    b, starts_b = pack(items, 16, big)
    n = int(a.cu_q_lens[-1])
    assert starts_a == starts_b
    for field in ("token_ids", "positions", "slot_mapping"):
        assert np.array_equal(np.asarray(getattr(a, field))[:n], np.asarray(getattr(b, field))[:n])
        assert not np.asarray(getattr(b, field))[n:].any()  # padding: token 0 at position 0, null slot
    assert np.array_equal(np.asarray(a.logits_indices)[:4], np.asarray(b.logits_indices)[:4])
    assert np.array_equal(np.asarray(b.kv_lens)[:3], [6, 22, 6]) and not np.asarray(b.kv_lens)[3:].any()


def test_large_decode_batches_round_up_to_multiples_of_eight():
    items = [WorkItem([1 + i], 3, [7], 1) for i in range(17)]
    sig, batch, _ = _sig(items)
    T, S, MB, R, max_q, prefill_slots = sig
    assert (T, S, R, max_q, prefill_slots) == (24, 24, 24, 1, 0)
    sig5, _, _ = _sig(items[:5])
    assert sig5[:2] == (8, 8)


def test_long_prefill_steps_pad_to_multiples_of_256_tokens():
    from jaxinfer.batch_packing import bucket_tokens

    assert [bucket_tokens(n) for n in (1, 3, 200, 256, 257, 1152, 2048)] == [1, 4, 256, 256, 512, 1280, 2048]
    items = [WorkItem(list(range(1 + 20 * i, 21 + 20 * i)), 0, [3] * 288, 1) for i in range(4)]
    shape = plan_shape(items, 32)
    assert shape.num_tokens == 1280 and shape.max_q_len == 512
    batch, _ = pack(items, 16, shape)
    assert batch.token_ids.shape == (1280,)
