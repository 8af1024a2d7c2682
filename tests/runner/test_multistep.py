"""Multi-step decoding (``num_scheduler_steps``, ``jaxinfer.runner.multistep``): the same tokens, logprobs and
finish reasons as single steps — greedy and seeded sampling, stops in the middle of a burst, the length
limits, and the requests it must leave to single steps — no compilation after start, no leaked blocks."""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
import pytest

from jaxinfer import LLM, SamplingParams
from jaxinfer.runner.batch_packing import WorkItem, pack
from jaxinfer.runner.multistep import next_decode_batch
from jaxinfer.runner.shape_plan import StepShape

PROMPTS = [list(range(5, 17)), [250, 3, 77, 9, 9, 31], list(range(100, 131)), [42]]


def _engine(model, steps, **kw):
    kw = dict(dict(max_model_len=64, max_num_seqs=4, num_kv_blocks=48, block_size=8), **kw)
    return LLM(model=model, num_scheduler_steps=steps, **kw)


def _generate(llm, params):
    outs = llm.generate([{"prompt_token_ids": p} for p in PROMPTS], params, use_tqdm=False)
    return [(o.outputs[0].token_ids, o.outputs[0].finish_reason, o.outputs[0].logprobs) for o in outs]


def _same(a, b):
    for (ta, fa, la), (tb, fb, lb) in zip(a, b):
        assert ta == tb and fa == fb
        if la is not None:
            assert [sorted(d) for d in la] == [sorted(d) for d in lb]
            np.testing.assert_allclose([v for d in la for v in d.values()], [v for d in lb for v in d.values()],
                                       rtol=1e-5, atol=1e-5)


def _no_leak(llm):
    s = llm.llm_engine.stats()
    assert s["free_blocks"] == s["total_blocks"] and s["num_running"] == 0 and s["num_waiting"] == 0
    llm.llm_engine.block_manager.check_invariants()


CASES = {
    "greedy, different lengths": [SamplingParams(temperature=0.0, max_tokens=n, ignore_eos=True) for n in (3, 17, 9, 1)],
    "greedy, stop ids mid-burst, logprobs": [SamplingParams(temperature=0.0, max_tokens=30, logprobs=2,
                                                           stop_token_ids=[int(t)]) for t in range(60, 64)],
    "seeded sampling": [SamplingParams(temperature=0.9, top_k=40, top_p=0.9, seed=s, max_tokens=13, ignore_eos=True)
                        for s in range(4)],
    "past max_model_len": [SamplingParams(temperature=0.0, max_tokens=None, ignore_eos=True)] * 4,
    "penalties and min_tokens (single steps)": [
        SamplingParams(temperature=0.0, max_tokens=12, repetition_penalty=1.3, ignore_eos=True),
        SamplingParams(temperature=0.0, max_tokens=12, min_tokens=7, stop_token_ids=[61, 62, 63]),
        SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True),
        SamplingParams(temperature=0.0, max_tokens=12, presence_penalty=0.5, ignore_eos=True)],
}


@pytest.fixture(scope="module")
def engines():
    return {n: _engine(None, n, compilation="lazy") for n in (1, 4)}


@pytest.mark.parametrize("case", list(CASES))
def test_tokens_are_those_of_single_steps(engines, case):
    params = CASES[case]
    single, multi = (_generate(engines[n], params) for n in (1, 4))
    _same(single, multi)
    if case == "past max_model_len":
        assert all(f == "length" and len(PROMPTS[i]) + len(t) == 64 for i, (t, f, _) in enumerate(multi))
    if case == "greedy, stop ids mid-burst, logprobs":
        assert any(f == "stop" for _, f, _ in multi)  # the case exercises a stop (the seed data guarantees it)
    _no_leak(engines[4])


def test_bursts_are_used_and_fewer_host_steps_run(engines):
    params = SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True)
    before = {n: e.llm_engine.num_steps for n, e in engines.items()}
    _same(*(_generate(engines[n], params) for n in (1, 4)))
    steps = {n: e.llm_engine.num_steps - before[n] for n, e in engines.items()}
    assert steps[1] == 24  # one prefill step (its token) + 23 decode steps
    assert steps[4] == 1 + 6  # the prefill, then 23 decode tokens in bursts of 4 (the last one of 3)


def test_hf_checkpoint_with_prefix_cache_and_chunked_prefill(hf_checkpoints):
    model = str(hf_checkpoints["llama_gqa"])
    params = SamplingParams(temperature=0.0, max_tokens=21, ignore_eos=True)
    kw = dict(compilation="lazy", max_num_batched_tokens=16)
    single = _generate(_engine(model, 1, **kw), params)
    multi_llm = _engine(model, 8, **kw)
    _same(single, _generate(multi_llm, params))
    _same(single, _generate(multi_llm, params))  # warm prefix cache
    _no_leak(multi_llm)


def test_eager_plan_compiles_the_multistep_executables_at_start():
    llm = _engine(None, 3, max_num_seqs=2)
    _generate(llm, SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True))
    _generate(llm, SamplingParams(temperature=0.5, max_tokens=8, logprobs=1, seed=1, ignore_eos=True))
    assert llm.llm_engine.stats()["num_compilations_after_start"] == 0
    assert any(k[0] == "multistep" for k in llm.llm_engine.runner.plan_keys())


def test_next_decode_batch_is_the_packed_next_step():
    bs, shape, max_blocks = 4, StepShape(8, 8, 8, None), 5
    items = [WorkItem([3, 7, 9], 7, [11], 1), WorkItem([2], 0, [5], 1), WorkItem([4, 6], 3, [8], 1)]
    batch, _ = pack(items, bs, shape, max_blocks)
    chosen = np.asarray([21, 22, 23, 0, 0, 0, 0, 0], np.int32)
    got = next_decode_batch(batch, jnp.asarray(chosen), bs)
    want, _ = pack([WorkItem(w.block_ids, w.start + 1, [int(t)], 1) for w, t in zip(items, chosen)], bs, shape,
                   max_blocks)
    for name in ("token_ids", "positions", "slot_mapping", "block_tables", "cu_q_lens", "kv_lens", "logits_indices"):
        np.testing.assert_array_equal(np.asarray(getattr(got, name)), getattr(want, name), err_msg=name)


def test_bad_settings_are_rejected():
    with pytest.raises(ValueError, match="num_scheduler_steps"):
        LLM(num_scheduler_steps=0)
    with pytest.raises(ValueError, match="speculative"):
        LLM(num_scheduler_steps=4, speculative_config={"method": "ngram", "num_speculative_tokens": 2})
