"""Engine behaviour on a tiny HF-written Llama: batching invariance, stop conditions, seeds, aborts,
cache donation and compilation counts."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxinfer import LLM, SamplingParams
from jaxinfer.model.kv_cache import allocate_kv_cache
from jaxinfer.model.step_batch import single_sequence_batch
from jaxinfer.runner.shape_plan import bucket
from jaxinfer.runner.step_functions import make_step_fn
from tests.prompts import random_prompts

GREEDY = SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True)


@pytest.fixture(scope="module")
def llm(hf_checkpoints):
    return LLM(compilation="lazy", model=str(hf_checkpoints["llama_gqa"]), max_model_len=128, num_kv_blocks=64, max_num_seqs=8)


def _tokens(outs):
    return [o.outputs[0].token_ids for o in outs]


def test_batch_equals_each_alone(llm):
    prompts = random_prompts([1, 15, 16, 17, 33, 5])
    together = _tokens(llm.generate(prompts, GREEDY, use_tqdm=False))
    alone = [_tokens(llm.generate([p], GREEDY, use_tqdm=False))[0] for p in prompts]
    assert together == alone


def test_cached_decoding_equals_full_forward(llm):
    """Logits of token t from step-by-step cached decoding equal those of one forward pass over all tokens."""
    engine = llm.llm_engine
    cfg, params = engine.model_config, engine.runner.params
    ids = random_prompts([20], seed=3)[0]["prompt_token_ids"]
    out = llm.generate([{"prompt_token_ids": ids}], SamplingParams(temperature=0.0, max_tokens=10,
                                                                  ignore_eos=True, logprobs=0), use_tqdm=False)[0]
    full = ids + out.outputs[0].token_ids
    step = make_step_fn(cfg, "xla")
    cache = allocate_kv_cache(cfg, 8, 16, jnp.float32)
    logits, _ = step(params, cache, single_sequence_batch(full, [1, 2], 16, all_logits=True), 32)
    logp = jax.nn.log_softmax(np.asarray(logits)[len(ids) - 1 : -1], axis=-1)
    expected = [float(logp[i, t]) for i, t in enumerate(out.outputs[0].token_ids)]
    got = [lp[t] for lp, t in zip(out.outputs[0].logprobs, out.outputs[0].token_ids)]
    np.testing.assert_allclose(got, expected, atol=1e-5)
    assert [int(np.argmax(r)) for r in np.asarray(logits)[len(ids) - 1 : -1]] == out.outputs[0].token_ids


@pytest.mark.parametrize("num_tokens", [40, 2, 1])  # a prefill chunk, two decodes, a batch-1 decode
@pytest.mark.parametrize("num_blocks", [16, 64, 1024])
def test_step_updates_cache_in_place(llm, num_blocks, num_tokens):
    cfg, params = llm.llm_engine.model_config, llm.llm_engine.runner.params
    cache = allocate_kv_cache(cfg, num_blocks, 16, jnp.float32)
    cache_bytes = sum(x.nbytes for kv in cache for x in kv)
    batch = jax.device_put(single_sequence_batch(list(range(num_tokens)), [3, 9, 4], 16, start=40 - num_tokens))
    compiled = make_step_fn(cfg, "xla").lower(params, cache, batch, bucket(num_tokens)).compile()
    mem = compiled.memory_analysis()
    assert mem.alias_size_in_bytes >= cache_bytes  # outputs alias the donated cache
    assert mem.temp_size_in_bytes < max(cache_bytes / 20, 1 << 20), (mem.temp_size_in_bytes, cache_bytes)


def test_no_recompiles_after_warmup(llm):
    prompts = random_prompts([3, 17, 30, 9], seed=5)
    llm.generate(prompts, GREEDY, use_tqdm=False)
    before = llm.llm_engine.stats()["num_compilations"]
    llm.generate(random_prompts([3, 17, 30, 9], seed=6), GREEDY, use_tqdm=False)
    assert llm.llm_engine.stats()["num_compilations"] == before


def test_stop_conditions(llm):
    p = random_prompts([12], seed=7)
    free_run = llm.generate(p, SamplingParams(temperature=0.0, max_tokens=20, ignore_eos=True), use_tqdm=False)[0]
    toks = free_run.outputs[0].token_ids
    assert len(toks) == 20 and free_run.outputs[0].finish_reason == "length"
    # stop_token_ids: stops at the first occurrence, keeps the token, reports it
    stop_tok = toks[5]
    first = toks.index(stop_tok)
    out = llm.generate(p, SamplingParams(temperature=0.0, max_tokens=20, stop_token_ids=[stop_tok]),
                       use_tqdm=False)[0].outputs[0]
    assert out.token_ids == toks[: first + 1] and out.finish_reason == "stop" and out.stop_reason == stop_tok
    # min_tokens bans the stop token until min_tokens tokens exist
    out = llm.generate(p, SamplingParams(temperature=0.0, max_tokens=20, stop_token_ids=[stop_tok],
                                         min_tokens=first + 2), use_tqdm=False)[0].outputs[0]
    assert len(out.token_ids) >= first + 2
    assert stop_tok not in out.token_ids[: first + 1]
    # EOS (the model's eos id) stops unless ignore_eos
    eos = llm.llm_engine.eos_token_ids
    assert eos, "the HF checkpoint declares an eos_token_id"


def test_eos_stops_generation(hf_checkpoints):
    # Make the greedy continuation's 4th token the EOS id of this engine.
    llm = LLM(compilation="lazy", model=str(hf_checkpoints["llama_gqa"]), max_model_len=64, num_kv_blocks=16, max_num_seqs=2)
    p = random_prompts([8], seed=11)
    toks = llm.generate(p, GREEDY, use_tqdm=False)[0].outputs[0].token_ids
    llm.llm_engine.output_processor.eos_token_ids = (toks[3],)  # the stop condition
    llm.llm_engine.runner.eos_token_ids = (toks[3],)  # the ban until min_tokens
    out = llm.generate(p, SamplingParams(temperature=0.0, max_tokens=24), use_tqdm=False)[0].outputs[0]
    assert out.token_ids == toks[: toks.index(toks[3]) + 1] and out.finish_reason == "stop"
    out = llm.generate(p, SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True), use_tqdm=False)[0]
    assert out.outputs[0].token_ids == toks


def test_seeded_sampling_independent_of_batch(llm):
    p = random_prompts([10, 4, 25], seed=9)
    sp = SamplingParams(temperature=1.0, top_p=0.9, max_tokens=16, seed=1234, ignore_eos=True)
    alone = llm.generate([p[0]], sp, use_tqdm=False)[0].outputs[0].token_ids
    mixed = llm.generate([p[1], p[0], p[2]], [SamplingParams(temperature=0.7, max_tokens=5), sp, GREEDY],
                         use_tqdm=False)[1].outputs[0].token_ids
    assert alone == mixed
    other = llm.generate([p[0]], SamplingParams(temperature=1.0, top_p=0.9, max_tokens=16, seed=99,
                                                 ignore_eos=True), use_tqdm=False)[0].outputs[0].token_ids
    assert other != alone


def test_n_samples(llm):
    out = llm.generate(random_prompts([6]), SamplingParams(n=3, temperature=1.0, max_tokens=12, seed=5, ignore_eos=True),
                       use_tqdm=False)[0]
    assert [c.index for c in out.outputs] == [0, 1, 2]
    assert all(len(c.token_ids) == 12 for c in out.outputs)
    assert len({tuple(c.token_ids) for c in out.outputs}) > 1


def test_results_in_input_order_and_metrics(llm):
    prompts = random_prompts([30, 2, 17], seed=12)
    outs = llm.generate(prompts, [SamplingParams(temperature=0, max_tokens=m, ignore_eos=True) for m in (3, 9, 1)],
                        use_tqdm=False)
    assert [len(o.outputs[0].token_ids) for o in outs] == [3, 9, 1]
    assert [o.prompt_token_ids for o in outs] == [p["prompt_token_ids"] for p in prompts]
    for o in outs:
        m = o.metrics
        assert o.finished and m.arrival_time <= m.first_scheduled_time <= m.first_token_time <= m.finished_time


def test_abort_frees_everything(llm):
    engine = llm.llm_engine
    params = SamplingParams(temperature=0.0, max_tokens=40, ignore_eos=True)
    for i, p in enumerate(random_prompts([20, 35, 8], seed=13)):
        engine.add_request(f"abort-{i}", p, params)
    engine.step()
    engine.step()
    engine.abort_request(["abort-0", "abort-2"])
    survivors = []
    while engine.has_unfinished_requests():
        survivors += [o for o in engine.step() if o.finished]
    assert [o.request_id for o in survivors] == ["abort-1"]
    alone = llm.generate([random_prompts([20, 35, 8], seed=13)[1]], params, use_tqdm=False)[0]
    assert survivors[0].outputs[0].token_ids == alone.outputs[0].token_ids
    s = engine.stats()
    assert s["free_blocks"] == s["total_blocks"]
    engine.block_manager.check_invariants()


def test_penalties_are_wired_to_prompt_and_output_tokens(llm):
    p = random_prompts([30], seed=14)
    free = llm.generate(p, GREEDY, use_tqdm=False)[0].outputs[0].token_ids
    prompt = p[0]["prompt_token_ids"]
    assert len(set(free)) < len(free) or set(free) & set(prompt), "the unpenalised run must repeat something"
    out = llm.generate(p, SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True, repetition_penalty=1e4),
                       use_tqdm=False)[0].outputs[0].token_ids
    assert len(set(out)) == len(out) and not set(out) & set(prompt)
