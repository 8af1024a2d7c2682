"""The shape plan: buckets, the planned shape of any step, and packing work items into it."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from jaxinfer.runner.batch_packing import WorkItem, pack
from jaxinfer.runner.shape_plan import ShapePlan, StepShape, seq_buckets, token_buckets


def test_buckets():
    assert seq_buckets(64) == (1, 2, 4, 8, 16, 32, 64)
    assert seq_buckets(48) == (1, 2, 4, 8, 16, 32, 48)
    assert seq_buckets(1) == (1,)
    assert token_buckets(2048) == (16, 32, 64, 128, 256, 384, 512, 768, 1024, 1536, 2048)
    assert token_buckets(1000) == (16, 32, 64, 128, 256, 384, 512, 768, 1000)
    assert token_buckets(7) == (7,)


def test_default_plan_is_small():
    plan = ShapePlan(max_num_seqs=64, max_num_batched_tokens=2048)
    shapes = plan.step_shapes()
    assert len(shapes) == 15  # decode 1, 2, 4, 8 + 11 mixed (decodes of 16+ sequences run in mixed shapes)
    assert {s.kind for s in shapes} == {"decode", "mixed"}
    assert plan.logits_rows() == [1, 2, 4, 8, 16, 32, 64]
    spec = ShapePlan(64, 2048, verify_width=5).step_shapes()
    assert len(spec) == 22 and sum(s.kind == "verify" for s in spec) == 7
    # a decode of every sequence fits even when the token budget is smaller than max_num_seqs
    small_budget = ShapePlan(max_num_seqs=64, max_num_batched_tokens=24)
    assert small_budget.shape_for([1] * 64, 64) == StepShape(64, 64, 64, None)


def test_decode_verify_and_mixed_steps():
    plan = ShapePlan(max_num_seqs=64, max_num_batched_tokens=2048, verify_width=5)
    assert plan.shape_for([1] * 3, 3) == StepShape(4, 4, 4, 1)
    assert plan.shape_for([1] * 20, 20) == StepShape(32, 32, 32, None)  # a large decode: a mixed shape
    assert plan.shape_for([5, 1, 3], 9) == StepShape(20, 4, 20, 5)  # verification, whatever the drafts
    assert plan.shape_for([300, 1, 1], 3) == StepShape(384, 64, 64, None)
    assert plan.shape_for([6, 1], 2) == StepShape(16, 16, 16, None)
    draft = ShapePlan(64, 2048, verify_width=5, verify_logits="last")
    assert draft.shape_for([5, 2], 2) == StepShape(10, 2, 2, 5)


def test_a_step_beyond_the_configuration_is_refused():
    plan = ShapePlan(max_num_seqs=4, max_num_batched_tokens=64)
    with pytest.raises(ValueError, match="exceeds the plan"):
        plan.shape_for([1] * 5, 5)
    with pytest.raises(ValueError, match="exceeds the plan"):
        plan.shape_for([40, 40], 2)
    with pytest.raises(ValueError, match="logits rows"):
        plan.shape_for([30, 30], 40)


@settings(max_examples=300, deadline=None)
@given(max_num_seqs=st.integers(1, 80), budget=st.integers(1, 3000), k=st.one_of(st.none(), st.integers(1, 8)),
       data=st.data())
def test_every_step_within_the_configuration_has_a_planned_shape(max_num_seqs, budget, k, data):
    """Any step the scheduler can form (at most max_num_seqs sequences; a prefill step within the token
    budget with one logits row per sequence; a verification step of at most 1 + k tokens per sequence)
    gets a shape that is in the plan and fits it."""
    plan = ShapePlan(max_num_seqs, budget, None if k is None else k + 1)
    n = data.draw(st.integers(1, max_num_seqs))
    if k is not None and data.draw(st.booleans()):
        runs = data.draw(st.lists(st.integers(1, k + 1), min_size=n, max_size=n))
        logits = sum(runs)
    else:
        if budget < n:
            return
        runs = [1] * n
        extra = data.draw(st.integers(0, budget - n))
        for _ in range(extra):
            runs[data.draw(st.integers(0, n - 1))] += 1
        logits = data.draw(st.integers(0, n))
    shape = plan.shape_for(runs, logits)
    assert shape in plan.step_shapes()
    assert shape.num_seqs >= n and shape.num_tokens >= sum(runs) and shape.num_logits >= logits
    if shape.query_width:
        assert max(runs) <= shape.query_width
    assert shape.num_logits in plan.logits_rows()


def test_pack_lays_items_out_with_full_width_tables():
    items = [WorkItem([3, 4], 20, [7, 8, 9], 1), WorkItem([5], 2, [6], 1), WorkItem([9, 10, 11], 30, [1, 2], 0)]
    shape = StepShape(16, 16, 16, None)
    batch, starts = pack(items, 16, shape, max_blocks=8)
    assert batch.block_tables.shape == (16, 8)
    assert list(batch.cu_q_lens[:5]) == [0, 3, 4, 6, 6]
    assert list(batch.kv_lens[:4]) == [23, 3, 32, 0]
    assert starts == [0, 1, 2]
    assert list(batch.logits_indices[:2]) == [2, 3]
    assert list(batch.slot_mapping[:3]) == [4 * 16 + 4, 4 * 16 + 5, 4 * 16 + 6]
    assert np.all(batch.slot_mapping[6:] == 0)  # padding tokens write to the null slot


def test_verification_rows_point_at_each_sequences_trailing_tokens():
    items = [WorkItem([1, 2, 3, 4], 40, [7] * (1 + d), 1 + d) for d in (4, 0, 2)]
    plan = ShapePlan(8, 64, verify_width=5)
    shape = plan.shape_for([len(w.tokens) for w in items], sum(w.num_logits for w in items))
    batch, starts = pack(items, 16, shape, max_blocks=8)
    cu = batch.cu_q_lens
    for i, d in enumerate((4, 0, 2)):
        rows = batch.logits_indices[starts[i] : starts[i] + 1 + d]
        assert list(rows) == list(range(cu[i + 1] - 1 - d, cu[i + 1]))
