"""Prompt logprobs (``SamplingParams.prompt_logprobs``) against HF transformers' per-position log-softmax, and
lossless: chunked prefill on or off, prefix cache warm or cold, preemption, n > 1 and speculation give the
same entries, the sampled tokens do not change, nothing compiles after start, and tensor parallelism over
two processes gives the one-device entries."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import warnings

import numpy as np
import pytest

from jaxinfer import LLM, Logprob, SamplingParams
from jaxinfer.runner.shape_plan import ShapePlan
from tests import hf_oracle
from tests.runner.test_multihost import _free_port

TOL = 1e-4
# a 9-block pool (8 usable, 4 per 64-token sequence) and a 24-token budget: prompts are chunked and running
# sequences preempted; "whole": every prompt in one step, blocks to spare
CHUNKED = dict(max_model_len=64, num_kv_blocks=9, max_num_seqs=4, max_num_batched_tokens=24)
WHOLE = dict(max_model_len=64, num_kv_blocks=40, max_num_seqs=4, max_num_batched_tokens=64,
             enable_chunked_prefill=False)
LENGTHS = (1, 2, 15, 16, 17, 40)  # around the 16-token block, and longer than the 24-token budget


def _prompt(n: int, seed: int) -> list[int]:
    return np.random.default_rng(seed).integers(0, 256, size=n).tolist()


PROMPTS = [_prompt(n, seed=100 + n) for n in LENGTHS]


@pytest.fixture(scope="module")
def chunked(hf_checkpoints):
    return LLM(model=str(hf_checkpoints["llama_gqa"]), **CHUNKED)


@pytest.fixture(scope="module")
def whole(hf_checkpoints):
    return LLM(model=str(hf_checkpoints["llama_gqa"]), **WHOLE)


def _generate(llm: LLM, prompts: list[list[int]], params) -> list:
    """Outputs in prompt order; an eager engine fails on any compilation after start."""
    if llm.llm_engine.config.compilation != "eager":
        return llm.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False)
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)  # a compilation after start warns
        outs = llm.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False)
    assert llm.llm_engine.stats()["num_compilations_after_start"] == 0
    return outs


def _greedy(k: int | None, **kw) -> SamplingParams:
    return SamplingParams(temperature=0.0, max_tokens=kw.pop("max_tokens", 6), ignore_eos=True, prompt_logprobs=k, **kw)


def _check_against_hf(prompt: list[int], entries: list, ref: np.ndarray, k: int) -> None:
    """``entries`` (RequestOutput.prompt_logprobs) against ``ref``, HF's [n, V] log-softmax: logprobs within
    TOL, ranks and the top-k set exact except where HF's own values are within TOL of a tie."""
    assert len(entries) == len(prompt) and entries[0] is None
    for i in range(1, len(prompt)):
        row, tok, entry = ref[i - 1], prompt[i], entries[i]
        assert next(iter(entry)) == tok, "the prompt token comes first"
        assert all(isinstance(v, Logprob) for v in entry.values())
        for token_id, lp in entry.items():
            assert abs(lp.logprob - row[token_id]) < TOL, (i, token_id)
            assert 1 + np.sum(row > row[token_id] + TOL) <= lp.rank <= 1 + np.sum(row > row[token_id] - TOL)
        assert len(entry) in (k, k + 1)
        top = [t for t in entry if t != tok] if len(entry) == k + 1 else list(entry)  # the top k
        kth = np.sort(row)[::-1][k - 1] if k else np.inf
        assert all(row[t] >= kth - TOL for t in top), f"position {i}: a top token HF ranks lower"
        assert set(np.flatnonzero(row > kth + TOL)) <= set(top), f"position {i}: HF's top token missing"


def test_prompt_logprobs_match_hf_with_chunked_prefill(chunked, hf_models):
    k = 5
    outs = _generate(chunked, PROMPTS, _greedy(k))
    for prompt, out in zip(PROMPTS, outs):
        _check_against_hf(prompt, out.prompt_logprobs, hf_oracle.hf_log_softmax(hf_models["llama_gqa"], prompt), k)
    stats = chunked.llm_engine.stats()
    assert stats["free_blocks"] == stats["total_blocks"]


@pytest.mark.parametrize("name", ["mistral_window", "qwen2"])
def test_prompt_logprobs_match_hf_other_architectures(name, hf_checkpoints, hf_models):
    """A sliding window shorter than the prompt (mistral), tied embeddings and q/k/v biases (qwen2)."""
    llm = LLM(model=str(hf_checkpoints[name]), compilation="lazy", **CHUNKED)
    prompts = PROMPTS[-2:]
    for prompt, out in zip(prompts, _generate(llm, prompts, _greedy(20))):
        _check_against_hf(prompt, out.prompt_logprobs, hf_oracle.hf_log_softmax(hf_models[name], prompt), 20)


def _same_entries(a: list, b: list, exact: bool = True) -> None:
    assert len(a) == len(b) and a[0] is None and b[0] is None
    for x, y in zip(a[1:], b[1:]):
        assert list(x) == list(y) and [v.rank for v in x.values()] == [v.rank for v in y.values()]
        if exact:
            assert x == y
        else:
            np.testing.assert_allclose([v.logprob for v in x.values()], [v.logprob for v in y.values()], atol=1e-5)


def test_chunked_prefill_on_and_off_give_the_same_prompt_logprobs(chunked, whole):
    a = _generate(chunked, PROMPTS, _greedy(4))
    b = _generate(whole, PROMPTS, _greedy(4))
    for x, y in zip(a, b):
        _same_entries(x.prompt_logprobs, y.prompt_logprobs, exact=False)
        assert x.outputs[0].token_ids == y.outputs[0].token_ids


def test_prefix_cache_warm_and_cold_give_the_same_prompt_logprobs(whole):
    prompt = _prompt(40, seed=7)
    cold = _generate(whole, [prompt], _greedy(3))[0]
    # warm the cache with the same prompt (a plain request), then ask again: computed, not hit
    plain = _generate(whole, [prompt], SamplingParams(temperature=0.0, max_tokens=2, ignore_eos=True))[0]
    assert plain.num_cached_tokens == 32  # the first request's blocks are in the cache
    warm = _generate(whole, [prompt], _greedy(3))[0]
    assert warm.num_cached_tokens == 0
    _same_entries(cold.prompt_logprobs, warm.prompt_logprobs)
    assert cold.outputs[0].token_ids == warm.outputs[0].token_ids
    assert plain.outputs[0].token_ids == cold.outputs[0].token_ids[:2]


def test_k_zero_gives_only_the_prompt_token(chunked):
    prompt = PROMPTS[-1]
    out = _generate(chunked, [prompt], _greedy(0))[0]
    assert out.prompt_logprobs[0] is None
    assert all(list(e) == [t] for e, t in zip(out.prompt_logprobs[1:], prompt[1:]))


def test_not_asked_is_none_and_a_one_token_prompt_has_one_entry(chunked):
    outs = _generate(chunked, [PROMPTS[0], PROMPTS[2]], [_greedy(2), _greedy(None)])
    assert outs[0].prompt_logprobs == [None]
    assert outs[1].prompt_logprobs is None


@pytest.mark.parametrize("value", [-1, 21, 1.5, True, "3"])
def test_invalid_prompt_logprobs_are_refused(value):
    with pytest.raises(ValueError, match="prompt_logprobs"):
        SamplingParams(prompt_logprobs=value)


def test_sampled_tokens_and_their_logprobs_do_not_change(chunked):
    plain = SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True, logprobs=2)
    asked = SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True, logprobs=2, prompt_logprobs=2)
    a, b = _generate(chunked, PROMPTS, plain), _generate(chunked, PROMPTS, asked)
    for x, y in zip(a, b):
        assert x.prompt_logprobs is None and y.prompt_logprobs is not None
        assert x.outputs[0].token_ids == y.outputs[0].token_ids
        for lx, ly in zip(x.outputs[0].logprobs, y.outputs[0].logprobs):
            assert list(lx) == list(ly)
            np.testing.assert_allclose(list(lx.values()), list(ly.values()), atol=1e-5)


def test_preemption_mixed_requests_and_n_samples(chunked, whole):
    """Four long prompts at once in an 8-block pool (sequences are preempted and recomputed), beside requests
    without prompt logprobs, and n = 3 samples of one request: the entries of the uncontended run."""
    prompts = [_prompt(40, seed=s) for s in range(4)] + [_prompt(30, seed=9)]
    params = [_greedy(3, max_tokens=16) if i % 2 == 0 else _greedy(None, max_tokens=16) for i in range(4)]
    params.append(SamplingParams(temperature=1.0, n=3, seed=5, max_tokens=4, ignore_eos=True, prompt_logprobs=3))
    before = chunked.llm_engine.stats()["num_preemptions"]
    a = _generate(chunked, prompts, params)
    assert chunked.llm_engine.stats()["num_preemptions"] > before
    b = _generate(whole, prompts, params)
    for x, y, p in zip(a, b, params):
        assert [c.token_ids for c in x.outputs] == [c.token_ids for c in y.outputs]
        if p.prompt_logprobs is None:
            assert x.prompt_logprobs is None
        else:
            _same_entries(x.prompt_logprobs, y.prompt_logprobs, exact=False)
    assert len(a[-1].outputs) == 3 and len(a[-1].prompt_logprobs) == 30


def test_prompt_logprobs_beside_speculative_decoding(hf_checkpoints, whole):
    """A prompt-logprobs chunk in a step where other sequences had drafts: the drafts are dropped, the step
    runs a planned shape (eager engine, zero compilations after start), tokens and entries unchanged."""
    spec = {"method": "ngram", "num_speculative_tokens": 2, "prompt_lookup_min": 1, "adaptive": False}
    llm = LLM(model=str(hf_checkpoints["llama_gqa"]), speculative_config=spec, **CHUNKED)
    engine = llm.llm_engine
    repetitive = ([5, 6, 7, 8] * 5)[:18]
    engine.add_request("decoding", {"prompt_token_ids": repetitive}, _greedy(None, max_tokens=30))
    for _ in range(4):
        engine.step()
    engine.add_request("scored", {"prompt_token_ids": PROMPTS[-1]}, _greedy(4, max_tokens=3))
    finished = {}
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)
        while engine.has_unfinished_requests():
            finished.update({o.request_id: o for o in engine.step() if o.finished})
    stats = engine.stats()
    assert stats["num_compilations_after_start"] == 0 and stats["num_draft_tokens"] > 0
    ref = _generate(whole, [repetitive, PROMPTS[-1]], [_greedy(None, max_tokens=30), _greedy(4, max_tokens=3)])
    assert finished["decoding"].outputs[0].token_ids == ref[0].outputs[0].token_ids
    assert finished["scored"].outputs[0].token_ids == ref[1].outputs[0].token_ids
    _same_entries(finished["scored"].prompt_logprobs, ref[1].prompt_logprobs, exact=False)


_TWO_PROCESSES = textwrap.dedent("""
    import json, sys
    pid, port, path = int(sys.argv[1]), sys.argv[2], sys.argv[3]
    import jax
    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    jax.distributed.initialize(f"127.0.0.1:{port}", num_processes=2, process_id=pid)
    from jaxinfer import LLM
    from tests.test_prompt_logprobs import CHUNKED, PROMPTS, _greedy
    llm = LLM(model=path, tensor_parallel_size=4, compilation="lazy", enable_compilation_cache=False, **CHUNKED)
    if pid == 0:
        outs = llm.generate([{"prompt_token_ids": p} for p in PROMPTS[-3:]], _greedy(3), use_tqdm=False)
        llm.close()
        print(json.dumps([[o.outputs[0].token_ids, [[[t, v.logprob, v.rank] for t, v in e.items()]
                                                    for e in o.prompt_logprobs[1:]]] for o in outs]))
    else:
        llm.llm_engine.follow()
        print(json.dumps("followed"))
""")


def test_tensor_parallel_over_two_processes(hf_checkpoints, chunked):
    """The prompt-logprobs step sharded over 4 devices in 2 processes (process 1 replays it): the one-device
    entries."""
    path = str(hf_checkpoints["llama_gqa"])
    env = {**os.environ, "XLA_FLAGS": "--xla_force_host_platform_device_count=2", "JAX_PLATFORMS": "cpu"}
    port = _free_port()
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    procs = [subprocess.Popen([sys.executable, "-c", _TWO_PROCESSES, str(i), str(port), path], stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True, env=env, cwd=root) for i in range(2)]
    results = []
    for p in procs:
        out, err = p.communicate(timeout=900)
        assert p.returncode == 0, err[-4000:]
        results.append(json.loads(out.strip().splitlines()[-1]))
    assert results[1] == "followed"
    for (tokens, entries), ref in zip(results[0], _generate(chunked, PROMPTS[-3:], _greedy(3))):
        assert tokens == ref.outputs[0].token_ids
        for got, want in zip(entries, ref.prompt_logprobs[1:]):
            assert [t for t, _, _ in got] == list(want) and [r for _, _, r in got] == [v.rank for v in want.values()]
            np.testing.assert_allclose([lp for _, lp, _ in got], [v.logprob for v in want.values()], atol=1e-5)


def test_prompt_steps_are_few_mixed_shapes_that_fit_every_step():
    for seqs, budget in [(64, 2048), (4, 24), (6, 100), (1, 6), (48, 4096)]:
        plan = ShapePlan(seqs, budget)
        buckets = plan.prompt_token_buckets
        assert set(buckets) <= set(plan.mixed_token_buckets) and buckets[-1] == plan.mixed_token_buckets[-1]
        assert all(b <= 4 * a for a, b in zip(buckets, buckets[1:]))
        for total in range(1, budget + 1, max(1, budget // 97)):
            n = min(seqs, total)
            shape = plan.prompt_shape_for([total - n + 1] + [1] * (n - 1), n)
            assert shape in plan.prompt_step_shapes() and shape.num_tokens >= total and shape.kind == "mixed"
    assert ShapePlan(64, 2048).prompt_token_buckets == (16, 64, 256, 1024, 2048)
