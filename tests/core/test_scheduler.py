"""Scheduler unit tests with no model: budgets, chunking, preemption, priorities, static batching,
prefix-aware admission. A fake step appends token 1 to every sequence that reached its end."""

from __future__ import annotations

from jaxinfer.core.block_manager import BlockManager
from jaxinfer.core.scheduler import Scheduler, SchedulerConfig
from jaxinfer.core.sequence import Sequence, SequenceStatus
from jaxinfer.sampling_params import SamplingParams


class Clock:
    def __init__(self):
        self.t = 0.0

    def __call__(self):
        return self.t


def make(num_blocks=64, block_size=4, caching=True, **cfg):
    clock = Clock()
    cfg.setdefault("max_model_len", 64)
    sched = Scheduler(SchedulerConfig(**cfg), BlockManager(num_blocks, block_size, caching), clock=clock)
    return sched, clock


def seq(i, n_prompt, arrival=None, priority=0, tokens=None):
    ids = tokens if tokens is not None else [i * 1000 + j for j in range(n_prompt)]
    return Sequence(i, f"r{i}", 0, ids, SamplingParams(), seed=0,
                    arrival_time=float(i) if arrival is None else arrival, priority=priority)


def fake_step(sched):
    out = sched.schedule()
    for s in out.scheduled:
        computed = s.seq.num_computed_tokens + s.num_new_tokens
        if s.samples:
            s.seq.token_ids.append(1)
        sched.commit_computed(s.seq, computed)
    return out


def test_decodes_first_then_prefill_chunks_within_budget():
    sched, _ = make(max_num_batched_tokens=10)
    a = seq(0, 3)
    sched.add(a)
    out = fake_step(sched)
    assert [(s.seq.seq_id, s.num_new_tokens) for s in out.scheduled] == [(0, 3)]
    sched.add(seq(1, 25))
    out = fake_step(sched)
    assert [(s.seq.seq_id, s.num_new_tokens) for s in out.scheduled] == [(0, 1), (1, 9)]
    out = fake_step(sched)
    assert [(s.seq.seq_id, s.num_new_tokens) for s in out.scheduled] == [(0, 1), (1, 9)]
    out = fake_step(sched)
    assert [(s.seq.seq_id, s.num_new_tokens, s.samples) for s in out.scheduled] == [(0, 1, True), (1, 7, True)]


def test_max_num_seqs_caps_running():
    sched, _ = make(max_num_seqs=2)
    for i in range(4):
        sched.add(seq(i, 2))
    out = fake_step(sched)
    assert [s.seq.seq_id for s in out.scheduled] == [0, 1]
    assert len(sched.waiting) == 2


def test_preemption_by_recompute_when_blocks_run_out():
    sched, _ = make(num_blocks=5, block_size=4, max_num_batched_tokens=64)  # 4 usable blocks
    a, b = seq(0, 8), seq(1, 8)  # 2 blocks each
    sched.add(a)
    sched.add(b)
    fake_step(sched)  # both prefilled, 9 tokens each now (8 + 1 sampled)
    assert a.num_tokens == 9 and sched.blocks.num_free_blocks == 0
    out = fake_step(sched)  # both need a 3rd block: the later arrival is preempted
    assert [v.seq_id for v in out.preempted] == [1]
    assert b.status is SequenceStatus.WAITING and b.num_computed_tokens == 0 and b.num_tokens == 9
    assert sched.waiting[0] is b and sched.num_preemptions == 1
    sched.remove(a)
    out = fake_step(sched)  # b resumes: a took b's tail block (evicted first), its first block is a hit
    assert [(s.seq.seq_id, s.num_new_tokens) for s in out.scheduled] == [(1, 5)]
    assert b.num_tokens == 10


def test_priority_policy_preempts_lower_priority_when_full():
    sched, _ = make(max_num_seqs=2, policy="priority")
    low1, low2 = seq(0, 3, priority=5), seq(1, 3, priority=5)
    sched.add(low1)
    sched.add(low2)
    fake_step(sched)
    urgent = seq(2, 3, priority=0)
    sched.add(urgent)
    out = fake_step(sched)
    assert [v.seq_id for v in out.preempted] == [1]  # lowest priority, latest arrival
    assert {s.seq.seq_id for s in out.scheduled} == {0, 2}
    # equal priority never displaces
    sched2, _ = make(max_num_seqs=1, policy="priority")
    sched2.add(seq(0, 3, priority=1))
    fake_step(sched2)
    sched2.add(seq(1, 3, priority=1))
    assert fake_step(sched2).preempted == []


def test_fcfs_never_preempts_for_newcomers():
    sched, _ = make(max_num_seqs=1)
    sched.add(seq(0, 3, priority=9))
    fake_step(sched)
    sched.add(seq(1, 3, priority=0))
    out = fake_step(sched)
    assert out.preempted == [] and [s.seq.seq_id for s in out.scheduled] == [0]


def test_static_batching_waits_for_full_batch_or_timeout_and_for_empty_running():
    sched, clock = make(max_num_seqs=3, batching="static", static_batch_timeout_s=1.0)
    sched.add(seq(0, 2, arrival=0.0))
    sched.add(seq(1, 2, arrival=0.0))
    assert fake_step(sched).is_empty  # 2 < 3 waiting and no timeout yet
    clock.t = 1.5
    out = fake_step(sched)
    assert [s.seq.seq_id for s in out.scheduled] == [0, 1]
    sched.add(seq(2, 2, arrival=1.5))
    clock.t = 10.0
    out = fake_step(sched)
    assert [s.seq.seq_id for s in out.scheduled] == [0, 1]  # running batch not empty: no admission
    for s in list(sched.running):
        sched.remove(s)
    out = fake_step(sched)
    assert [s.seq.seq_id for s in out.scheduled] == [2]
    # a full batch starts without waiting for the timeout
    sched3, clock3 = make(max_num_seqs=2, batching="static", static_batch_timeout_s=100.0)
    sched3.add(seq(0, 2, arrival=0.0))
    sched3.add(seq(1, 2, arrival=0.0))
    assert [s.seq.seq_id for s in fake_step(sched3).scheduled] == [0, 1]


def test_requests_sharing_a_new_prefix_compute_it_once():
    sched, _ = make(block_size=4, max_num_batched_tokens=100)
    doc = list(range(500, 520))  # 20 tokens = 5 full blocks
    seqs = [seq(i, 0, tokens=doc + [i]) for i in range(4)]
    for s in seqs:
        sched.add(s)
    out = fake_step(sched)
    assert [(s.seq.seq_id, s.num_new_tokens) for s in out.scheduled] == [(0, 21)]
    out = fake_step(sched)  # the others now hit the 5 cached blocks and compute only their last token
    assert sorted((s.seq.seq_id, s.num_new_tokens) for s in out.scheduled) == [(0, 1), (1, 1), (2, 1), (3, 1)]
    assert [s.num_cached_tokens for s in seqs] == [0, 20, 20, 20]
    bm = sched.blocks
    assert bm.query_tokens == 84 and bm.hit_tokens == 60
    assert bm.miss_tokens["never_seen"] == 21 and bm.miss_tokens["shorter_than_block"] == 3


def test_without_chunked_prefill_a_prompt_is_never_split():
    sched, _ = make(max_num_batched_tokens=64, enable_chunked_prefill=False)
    sched.add(seq(0, 40))
    sched.add(seq(1, 40))
    out = fake_step(sched)
    assert [(s.seq.seq_id, s.num_new_tokens) for s in out.scheduled] == [(0, 40)]
