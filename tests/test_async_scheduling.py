"""Async scheduling (``async_scheduling=True``, jaxinfer.core.async_step) gives the tokens of the synchronous
engine: greedy and seeded sampling, with the prefix cache, chunked prefill, preemption, EOS and max_tokens
finishing rows that were already scheduled, aborts in flight, and requests that force synchronous steps
(penalties, min_tokens, prompt logprobs). No block leaks; the steps really ran ahead."""

from __future__ import annotations

import pytest

from jaxinfer import LLM, SamplingParams
from tests.test_lossless import _no_leak, _run, _shared_prefix_prompts

GREEDY = SamplingParams(temperature=0.0, max_tokens=20, ignore_eos=True)


def _llm(hf_checkpoints, async_scheduling, **kw):
    settings = dict(max_model_len=128, num_kv_blocks=64, max_num_batched_tokens=128)
    settings.update(kw)
    return LLM(compilation="lazy", model=str(hf_checkpoints["llama_gqa"]), async_scheduling=async_scheduling,
               **settings)


@pytest.fixture(scope="module")
def engines(hf_checkpoints):
    """(synchronous, async) engines of the same settings, shared by the tests below."""
    return _llm(hf_checkpoints, False), _llm(hf_checkpoints, True)


def _outputs(llm, prompts, params):
    outs = llm.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False)
    return [(o.outputs[0].token_ids, o.outputs[0].finish_reason,
             [round(lp[t], 5) for lp, t in zip(o.outputs[0].logprobs or [], o.outputs[0].token_ids)])
            for o in outs]


def test_cpu_default_is_synchronous(engines):
    sync, on = engines
    assert sync.llm_engine.stats()["async_scheduling"] is False and on.llm_engine.stats()["async_scheduling"] is True


def test_greedy_and_prefix_cache_identical(engines):
    sync, on = engines
    prompts = _shared_prefix_prompts()
    before = on.llm_engine.stats()["host_seconds"]["async_steps"]
    for _ in range(2):  # cold, then warm (every prompt hits the prefix cache)
        assert _run(on, prompts) == _run(sync, prompts)
    assert on.llm_engine.stats()["host_seconds"]["async_steps"] - before >= 2 * 19  # every decode step ran ahead
    assert on.llm_engine.stats()["prefix_cache_hit_tokens"] > 0
    _no_leak(on)


def test_rows_that_finish_while_the_next_step_is_scheduled(engines):
    """EOS (the model's own: most tokens of this random model are not EOS, so an early stop token stands in)
    and max_tokens of every length finish sequences whose next step was already planned."""
    sync, on = engines
    prompts = _shared_prefix_prompts()
    first = _run(sync, prompts[:1])[0]
    params = [SamplingParams(temperature=0.0, max_tokens=m, stop_token_ids=[first[3]] if i % 2 else [])
              for i, m in enumerate((1, 2, 3, 7, 20, 33))]
    assert _outputs(on, prompts, params) == _outputs(sync, prompts, params)
    _no_leak(on)


def test_seeded_sampling_and_logprobs_identical(engines):
    sync, on = engines
    params = SamplingParams(temperature=1.0, top_p=0.9, seed=7, max_tokens=16, logprobs=2, ignore_eos=True)
    assert _outputs(on, _shared_prefix_prompts(), params) == _outputs(sync, _shared_prefix_prompts(), params)
    _no_leak(on)


def test_requests_that_need_synchronous_steps(engines):
    """Penalties, min_tokens and prompt logprobs read the output history on the host: the engine drains the
    step in flight and steps synchronously while such a request lives; the others' tokens do not change."""
    sync, on = engines
    prompts = _shared_prefix_prompts()
    params = [GREEDY, SamplingParams(temperature=0.0, max_tokens=12, repetition_penalty=1.3, ignore_eos=True),
              GREEDY, SamplingParams(temperature=0.0, max_tokens=12, min_tokens=5), GREEDY,
              SamplingParams(temperature=0.0, max_tokens=6, prompt_logprobs=1, ignore_eos=True)]
    assert _outputs(on, prompts, params) == _outputs(sync, prompts, params)
    _no_leak(on)


def test_abort_while_a_step_is_in_flight(engines):
    sync, on = engines
    prompts = _shared_prefix_prompts()
    eng = on.llm_engine
    for i, p in enumerate(prompts):
        eng.add_request(f"a{i}", {"prompt_token_ids": p}, GREEDY)
    finished = {}
    for n in range(200):
        for out in eng.step():
            if out.finished:
                finished[out.request_id] = out.outputs[0].token_ids
        if n == 4:
            eng.abort_request(["a1", "a4"])
        if not eng.has_unfinished_requests():
            break
    expected = _run(sync, prompts)
    assert set(finished) == {"a0", "a2", "a3", "a5"}
    assert [finished[f"a{i}"] for i in (0, 2, 3, 5)] == [expected[i] for i in (0, 2, 3, 5)]
    _no_leak(on)


def test_chunked_prefill_and_preemption(hf_checkpoints, engines):
    sync, _ = engines
    prompts = _shared_prefix_prompts()
    reference = _run(sync, prompts)
    chunked = _llm(hf_checkpoints, True, max_num_batched_tokens=7, enable_prefix_caching=False)
    assert _run(chunked, prompts) == reference
    _no_leak(chunked)
    tiny = _llm(hf_checkpoints, True, max_model_len=80, num_kv_blocks=10, max_num_batched_tokens=32)
    assert _run(tiny, prompts) == reference
    assert tiny.llm_engine.stats()["num_preemptions"] > 0
    _no_leak(tiny)


def test_refused_with_speculation_or_multistep(hf_checkpoints):
    with pytest.raises(ValueError, match="async_scheduling=True cannot be combined with speculative"):
        LLM(compilation="lazy", model=str(hf_checkpoints["llama_gqa"]), async_scheduling=True,
            speculative_config={"method": "ngram", "num_speculative_tokens": 2})
    with pytest.raises(ValueError, match="num_scheduler_steps"):
        LLM(compilation="lazy", model=str(hf_checkpoints["llama_gqa"]), async_scheduling=True,
            num_scheduler_steps=4)


def test_bad_settings_are_clear_errors():
    from jaxinfer.config.engine import EngineConfig

    with pytest.raises(TypeError, match="async_scheduling must be True, False or None"):
        EngineConfig(async_scheduling="yes")
    with pytest.raises(ValueError, match="output_kind must be one of"):
        SamplingParams(output_kind="delta")


def test_generate_builds_final_outputs_only(engines):
    """LLM.generate asks for final_only: the step API of the same engine still streams cumulative outputs."""
    _, on = engines
    eng = on.llm_engine
    eng.add_request("f", {"prompt_token_ids": [5, 6, 7]}, SamplingParams(max_tokens=4, ignore_eos=True,
                                                                         output_kind="final_only"))
    eng.add_request("c", {"prompt_token_ids": [5, 6, 8]}, SamplingParams(max_tokens=4, ignore_eos=True))
    seen = {"f": [], "c": []}
    while eng.has_unfinished_requests():
        for out in eng.step():
            seen[out.request_id].append(out.finished)
    assert seen["f"] == [True] and len(seen["c"]) == 4 and seen["c"][-1] is True
    _no_leak(on)
