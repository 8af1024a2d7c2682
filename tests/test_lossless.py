"""Greedy output is identical with every engine feature on or off: prefix cache cold/warm, chunked
prefill with a tiny budget, preemption in a tiny KV pool (also with multi-step decoding), static batching,
aborts. No block leaks."""

from __future__ import annotations

import numpy as np
import pytest

from jaxinfer import LLM, SamplingParams

GREEDY = SamplingParams(temperature=0.0, max_tokens=20, ignore_eos=True)


def _shared_prefix_prompts():
    rng = np.random.default_rng(21)
    doc = rng.integers(0, 256, size=40).tolist()
    return [
        doc,  # the document itself (a later full-prompt hit)
        doc + rng.integers(0, 256, size=5).tolist(),  # non-aligned suffix
        doc[:32] + rng.integers(0, 256, size=16).tolist(),  # block-aligned shared prefix (2 blocks)
        doc[:7] + rng.integers(0, 256, size=3).tolist(),  # shorter than one block
        doc,  # exact repeat: full-prompt hit, last token recomputed
        rng.integers(0, 256, size=23).tolist(),  # unrelated
    ]


def _run(llm, prompts, params=GREEDY):
    outs = llm.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False)
    return [o.outputs[0].token_ids for o in outs]


def _no_leak(llm):
    s = llm.llm_engine.stats()
    assert s["free_blocks"] == s["total_blocks"] and s["num_running"] == 0 and s["num_waiting"] == 0
    llm.llm_engine.block_manager.check_invariants()


@pytest.fixture(scope="module")
def reference(hf_checkpoints):
    """Each prompt alone, no prefix cache, no chunking, a roomy pool."""
    llm = LLM(compilation="lazy", model=str(hf_checkpoints["llama_gqa"]), max_model_len=128, num_kv_blocks=64,
              enable_prefix_caching=False, enable_chunked_prefill=False, max_num_batched_tokens=128)
    return [_run(llm, [p])[0] for p in _shared_prefix_prompts()]


def test_prefix_cache_cold_and_warm(hf_checkpoints, reference):
    llm = LLM(compilation="lazy", model=str(hf_checkpoints["llama_gqa"]), max_model_len=128, num_kv_blocks=64)
    prompts = _shared_prefix_prompts()
    assert _run(llm, prompts) == reference  # cold: the batch shares prefixes among itself
    hits_cold = llm.llm_engine.stats()["prefix_cache_hit_tokens"]
    assert hits_cold > 0
    assert _run(llm, prompts) == reference  # warm: everything cached
    s = llm.llm_engine.stats()
    # warm: every full block but the one holding the last token: 32 + 32 + 32 + 0 + 32 + 16
    assert s["prefix_cache_hit_tokens"] - hits_cold == 144
    _no_leak(llm)


def test_chunked_prefill_tiny_budget(hf_checkpoints, reference):
    llm = LLM(compilation="lazy", model=str(hf_checkpoints["llama_gqa"]), max_model_len=128, num_kv_blocks=64,
              max_num_batched_tokens=7, enable_prefix_caching=False)
    assert _run(llm, _shared_prefix_prompts()) == reference
    _no_leak(llm)


def test_preemption_in_a_tiny_pool(hf_checkpoints, reference):
    # 6 prompts of up to ~68 tokens at the end need ~25 blocks together; 9 usable blocks force preemption.
    llm = LLM(compilation="lazy", model=str(hf_checkpoints["llama_gqa"]), max_model_len=80, num_kv_blocks=10,
              max_num_batched_tokens=32)
    assert _run(llm, _shared_prefix_prompts()) == reference
    assert llm.llm_engine.stats()["num_preemptions"] > 0
    _no_leak(llm)


def test_multi_step_decoding_with_preemption_and_prefix_cache(hf_checkpoints, reference):
    # bursts of 4 decode steps (jaxinfer.runner.multistep) in the tiny pool: their extra blocks make preemption likelier
    llm = LLM(compilation="lazy", model=str(hf_checkpoints["llama_gqa"]), max_model_len=80, num_kv_blocks=10,
              max_num_batched_tokens=32, num_scheduler_steps=4)
    assert _run(llm, _shared_prefix_prompts()) == reference
    assert llm.llm_engine.stats()["num_preemptions"] > 0
    _no_leak(llm)


def test_static_batching(hf_checkpoints, reference):
    llm = LLM(compilation="lazy", model=str(hf_checkpoints["llama_gqa"]), max_model_len=128, num_kv_blocks=64, max_num_seqs=2,
              batching="static", static_batch_timeout_s=0.0)
    assert _run(llm, _shared_prefix_prompts()) == reference
    _no_leak(llm)


def test_aborts_mid_flight_leave_survivors_unchanged(hf_checkpoints, reference):
    llm = LLM(compilation="lazy", model=str(hf_checkpoints["llama_gqa"]), max_model_len=80, num_kv_blocks=14,
              max_num_batched_tokens=16)
    engine = llm.llm_engine
    prompts = _shared_prefix_prompts()
    for i, p in enumerate(prompts):
        engine.add_request(str(i), {"prompt_token_ids": p}, GREEDY)
    done = {}
    step = 0
    while engine.has_unfinished_requests():
        for out in engine.step():
            if out.finished:
                done[out.request_id] = out.outputs[0].token_ids
        step += 1
        if step == 3:
            engine.abort_request(["1", "4"])  # mid-prefill / waiting
        if step == 9:
            engine.abort_request("0")  # mid-decode
    assert set(done) == {"2", "3", "5"}
    for rid, toks in done.items():
        assert toks == reference[int(rid)]
    _no_leak(llm)
