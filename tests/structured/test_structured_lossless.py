"""Greedy output under a constraint is identical, token for token (and logprob for logprob), with every engine
feature on or off: jump-forward, prefix caching (cold and warm), chunked prefill with a tiny budget, preemption
in a tiny KV pool, n-gram speculation (constrained sequences take no drafts), multi-step decoding (constrained
sequences take single steps). Sampled output (temperature 1, fixed seeds) is identical with jump-forward on or
off too: a row whose mask allows one token samples it at any temperature."""

from __future__ import annotations

import json

import jsonschema
import pytest

from jaxinfer import LLM, SamplingParams, StructuredOutputsParams

# long fixed parts (keys, a const, enums): jump-forward has tokens to skip
SCHEMA = {"type": "object",
          "properties": {"identifier": {"type": "integer", "minimum": 0, "maximum": 999},
                         "classification": {"enum": ["alpha", "beta"]},
                         "description": {"type": "string", "maxLength": 12},
                         "version": {"const": "v1.0.0"},
                         "measurements": {"type": "array", "items": {"type": "number"}, "maxItems": 2}},
          "required": ["identifier", "classification", "description", "version", "measurements"],
          "additionalProperties": False}
SYSTEM = ("System: you are a careful assistant that writes one JSON record for a database of measurements, "
          "and nothing else.\n")
PROMPTS = [SYSTEM + "User: a record please.\nAssistant:", "The weather today is", "def add(a, b):",
           "Once upon a time", SYSTEM + "User: another record.\nAssistant:"]
SMALL = dict(max_num_seqs=4, max_model_len=256, compilation="lazy")


def _params(temperature=0.0, **kw):
    return SamplingParams(temperature=temperature, max_tokens=120, seed=11, logprobs=2,
                          structured_outputs=StructuredOutputsParams(json=SCHEMA), **kw)


def _run(llm, params=None):
    outs = llm.generate(PROMPTS, params or _params(), use_tqdm=False)
    return [(o.outputs[0].token_ids, [sorted(e.items()) for e in o.outputs[0].logprobs]) for o in outs]


@pytest.fixture(scope="module")
def reference():
    """No jump-forward, no prefix cache, no chunking: every token sampled in a decode step of its own."""
    llm = LLM(**SMALL, enable_prefix_caching=False, max_num_batched_tokens=256,
              structured_outputs_config={"jump_forward": False})
    greedy, sampled = _run(llm), _run(llm, _params(1.0))
    for tokens, _ in greedy + sampled:
        jsonschema.validate(json.loads(llm.get_tokenizer().decode(tokens)), SCHEMA)
    assert llm.llm_engine.stats()["num_forced_tokens"] == 0
    return greedy, sampled


def _close(a, b):
    assert [t for t, _ in a] == [t for t, _ in b]
    for (_, la), (_, lb) in zip(a, b):
        for ea, eb in zip(la, lb):
            assert [k for k, _ in ea] == [k for k, _ in eb]
            assert all(abs(x - y) < 1e-4 for (_, x), (_, y) in zip(ea, eb))


@pytest.fixture(scope="module")
def default_llm():
    """Jump-forward on (the default), prefix cache on."""
    return LLM(**SMALL, max_num_batched_tokens=256)


def test_jump_forward_and_prefix_cache(reference, default_llm):
    llm = default_llm
    _close(_run(llm), reference[0])  # cold
    _close(_run(llm), reference[0])  # warm: prompts (and earlier outputs) cached
    assert llm.llm_engine.stats()["prefix_cache_hit_tokens"] > 0
    forced = llm.llm_engine.stats()["num_forced_tokens"]
    assert forced > 0  # the schema's fixed parts were skipped, not decoded
    _close(_run(llm, _params(1.0)), reference[1])


def test_chunked_prefill_and_preemption(reference):
    llm = LLM(**{**SMALL, "max_model_len": 176}, max_num_batched_tokens=16, num_kv_blocks=12)
    _close(_run(llm), reference[0])
    assert llm.llm_engine.stats()["num_preemptions"] > 0


def test_speculation_and_multistep(reference):
    spec = LLM(**SMALL, max_num_batched_tokens=256,
               speculative_config={"method": "ngram", "num_speculative_tokens": 3, "adaptive": False})
    _close(_run(spec), reference[0])
    assert spec.llm_engine.stats()["num_draft_tokens"] == 0  # every request constrained: none got drafts
    multi = LLM(**SMALL, max_num_batched_tokens=256, num_scheduler_steps=4)
    _close(_run(multi), reference[0])


def test_abort_mid_flight_frees_everything(default_llm):
    engine = default_llm.llm_engine
    for i, p in enumerate(PROMPTS):
        engine.add_request(str(i), p, _params())
    for _ in range(3):
        engine.step()
    engine.abort_request([str(i) for i in range(len(PROMPTS))])
    assert not engine.has_unfinished_requests()
    while engine.scheduler.running or engine.scheduler.waiting:
        engine.step()
    s = engine.stats()
    assert s["free_blocks"] == s["total_blocks"]
