"""Speculative decoding: greedy output identical with speculation on and off (n-gram and draft model,
also under prefix caching, chunked prefill and preemption), and the rejection sampler preserves the
target distribution exactly."""

from __future__ import annotations

import dataclasses
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxinfer import LLM, SamplingParams
from jaxinfer.sample.rejection_sampler import draft_sample, verify
from jaxinfer.sample.sampler import SamplingMetadata, processed_logits
from tests import hf_oracle

GREEDY = SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True)


def _prompts():
    rng = np.random.default_rng(5)
    chunk = rng.integers(0, 256, size=12).tolist()
    return [
        chunk + rng.integers(0, 256, size=5).tolist() + chunk,  # repeated span: n-gram has something to copy
        rng.integers(0, 256, size=30).tolist(),
        chunk * 3,
        rng.integers(0, 256, size=7).tolist(),
    ]


def _run(llm, prompts=None, params=GREEDY):
    prompts = prompts or _prompts()
    outs = llm.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False)
    return [o.outputs[0].token_ids for o in outs]


def _no_leak(llm):
    s = llm.llm_engine.stats()
    assert s["free_blocks"] == s["total_blocks"]
    llm.llm_engine.block_manager.check_invariants()


@pytest.fixture(scope="module")
def reference(hf_checkpoints):
    llm = LLM(compilation="lazy", model=str(hf_checkpoints["llama_gqa"]), max_model_len=128, num_kv_blocks=64,
              enable_prefix_caching=False)
    return _run(llm)


NGRAM = {"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_max": 3, "prompt_lookup_min": 1,
         "adaptive": False}


@pytest.mark.parametrize(
    "engine_kwargs",
    [
        dict(),  # plain
        dict(max_num_batched_tokens=6),  # chunked prefill with a tiny budget, drafts trimmed to the budget
        dict(num_kv_blocks=9, max_model_len=80, max_num_batched_tokens=32),  # preemption
    ],
    ids=["plain", "tiny-budget", "preemption"],
)
def test_ngram_greedy_identical(hf_checkpoints, reference, engine_kwargs):
    kwargs = dict(max_model_len=128, num_kv_blocks=64, speculative_config=NGRAM)
    kwargs.update(engine_kwargs)
    llm = LLM(compilation="lazy", model=str(hf_checkpoints["llama_gqa"]), **kwargs)
    assert _run(llm) == reference
    assert _run(llm) == reference  # again, with a warm prefix cache
    s = llm.llm_engine.stats()
    assert s["num_draft_tokens"] > 0 and 0 <= s["num_accepted_tokens"] <= s["num_draft_tokens"]
    if "num_kv_blocks" in engine_kwargs:
        assert s["num_preemptions"] > 0
    _no_leak(llm)


def test_draft_model_greedy_identical(hf_checkpoints, reference):
    spec = {"method": "draft_model", "model": str(hf_checkpoints["llama_mqa_tied"]), "num_speculative_tokens": 3,
            "adaptive": False}
    llm = LLM(compilation="lazy", model=str(hf_checkpoints["llama_gqa"]), max_model_len=128, num_kv_blocks=64,
              speculative_config=spec, max_num_batched_tokens=16)
    assert _run(llm) == reference
    s = llm.llm_engine.stats()
    assert s["num_draft_tokens"] > 0
    _no_leak(llm)


def test_target_as_its_own_draft_accepts_everything(hf_checkpoints, reference):
    """A draft identical to the target must be accepted at every position (greedy): this checks that the
    draft's own KV cache follows the target's through catch-up, acceptance and rollback."""
    path = str(hf_checkpoints["llama_gqa"])
    spec = {"method": "draft_model", "model": path, "num_speculative_tokens": 4, "adaptive": False}
    llm = LLM(compilation="lazy", model=path, max_model_len=128, num_kv_blocks=64, speculative_config=spec)
    assert _run(llm) == reference
    s = llm.llm_engine.stats()
    assert s["num_draft_tokens"] > 20 and s["num_accepted_tokens"] == s["num_draft_tokens"]
    _no_leak(llm)


def test_own_draft_with_uneven_room_and_sampling(hf_checkpoints, reference):
    """The draft's rounds after the first run as one compiled call in which each row takes part in its own
    number of rounds: requests near their max_tokens propose fewer tokens than the rest of the batch, and
    must still get the target's greedy tokens with every draft accepted. Under temperature sampling a draft
    identical to the target has q = p, so (up to float rounding between the two step shapes) every draft
    is accepted: a q from the wrong round or row would not be."""
    path = str(hf_checkpoints["llama_gqa"])
    spec = {"method": "draft_model", "model": path, "num_speculative_tokens": 4, "adaptive": False}
    llm = LLM(compilation="lazy", model=path, max_model_len=128, num_kv_blocks=64, speculative_config=spec)
    lengths = [6, 24, 9, 13]  # 6 and 9 leave room for fewer than 4 drafts at their last verification steps
    outs = llm.generate([{"prompt_token_ids": p} for p in _prompts()],
                        [SamplingParams(temperature=0.0, max_tokens=n, ignore_eos=True) for n in lengths],
                        use_tqdm=False)
    assert [o.outputs[0].token_ids for o in outs] == [ref[:n] for ref, n in zip(reference, lengths)]
    s = llm.llm_engine.stats()
    assert s["num_accepted_tokens"] == s["num_draft_tokens"] > 20
    # shorter proposals near max_tokens ran in the planned proposal calls (k - 1 = 3 rounds), no new shape
    engine = llm.llm_engine
    (draft_executables, planned), = engine.proposer.warm_up_plan()
    used = draft_executables.ready_keys()
    assert any(key[0] == "draft_propose" for key in used) and used <= set(planned)
    before = s
    sampled = SamplingParams(temperature=0.8, top_k=20, max_tokens=24, ignore_eos=True, seed=3)
    outs = llm.generate([{"prompt_token_ids": p} for p in _prompts()], sampled, use_tqdm=False)
    assert all(len(o.outputs[0].token_ids) == 24 for o in outs)
    s = llm.llm_engine.stats()
    drafted = s["num_draft_tokens"] - before["num_draft_tokens"]
    accepted = s["num_accepted_tokens"] - before["num_accepted_tokens"]
    assert drafted > 40 and accepted >= 0.97 * drafted, (accepted, drafted)
    _no_leak(llm)


def test_speculation_respects_stop_tokens_and_max_tokens(hf_checkpoints, reference):
    llm = LLM(compilation="lazy", model=str(hf_checkpoints["llama_gqa"]), max_model_len=128, num_kv_blocks=64, speculative_config=NGRAM)
    ref = reference[2]
    stop = ref[9]
    out = llm.generate([{"prompt_token_ids": _prompts()[2]}],
                       SamplingParams(temperature=0.0, max_tokens=24, stop_token_ids=[stop]), use_tqdm=False)[0]
    assert out.outputs[0].token_ids == ref[: ref.index(stop) + 1]
    out = llm.generate([{"prompt_token_ids": _prompts()[2]}],
                       SamplingParams(temperature=0.0, max_tokens=7, ignore_eos=True), use_tqdm=False)[0]
    assert out.outputs[0].token_ids == ref[:7]
    _no_leak(llm)


def test_bad_speculative_configs(hf_checkpoints, tmp_path):
    path = str(hf_checkpoints["llama_gqa"])
    for bad, match in [
        ({"method": "eagle", "num_speculative_tokens": 2}, "method"),
        ({"method": "ngram", "num_speculative_tokens": 0}, "num_speculative_tokens"),
        ({"method": "ngram", "num_speculative_tokens": 2, "prompt_lookup_min": 3, "prompt_lookup_max": 2}, "prompt_lookup"),
        ({"method": "ngram", "num_speculative_tokens": 2, "draft": "x"}, "unknown"),
        ({"method": "draft_model", "num_speculative_tokens": 2}, "model"),
    ]:
        with pytest.raises(ValueError, match=match):
            LLM(compilation="lazy", model=path, max_model_len=64, speculative_config=bad)
    other = dict(vocab_size=300, hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2,
                 max_position_embeddings=512)
    hf_oracle.write_random_checkpoint("LlamaConfig", other, tmp_path / "d", seed=None)
    with pytest.raises(ValueError, match="vocabulary"):
        LLM(compilation="lazy", model=path, max_model_len=64,
            speculative_config={"method": "draft_model", "model": str(tmp_path / "d"), "num_speculative_tokens": 2})


# ---------------------------------------------------------------- the rejection sampler, exactly
def _md(n, temperature, top_k=0):
    return SamplingMetadata(
        temperature=jnp.full(n, temperature, jnp.float32), top_k=jnp.full(n, top_k, jnp.int32),
        top_p=jnp.ones(n, jnp.float32), min_p=jnp.zeros(n, jnp.float32),
        presence_penalty=jnp.zeros(n, jnp.float32), frequency_penalty=jnp.zeros(n, jnp.float32),
        repetition_penalty=jnp.ones(n, jnp.float32), seeds=jnp.arange(n, dtype=jnp.uint32),
        steps=jnp.full(n, 3, jnp.int32), prompt_token_ids=jnp.full((n, 1), -1, jnp.int32),
        output_token_ids=jnp.full((n, 1), -1, jnp.int32), banned_token_ids=jnp.full((n, 1), -1, jnp.int32))


def _chi_square_ok(counts, probs, n):
    keep = probs > 0
    assert counts[~keep].sum() == 0, "a token outside the target's support was emitted"
    expected = probs[keep] * n
    stat = float(((counts[keep] - expected) ** 2 / expected).sum())
    dof = int(keep.sum()) - 1
    # Wilson-Hilferty approximation of the chi-square 0.999 quantile
    z = 3.09
    crit = dof * (1 - 2 / (9 * dof) + z * math.sqrt(2 / (9 * dof))) ** 3
    return stat < crit, (stat, crit)


@pytest.mark.parametrize("draft", ["point_mass", "distribution"])
@pytest.mark.parametrize("top_k", [0, 3])
def test_rejection_sampling_preserves_the_target_distribution(draft, top_k):
    n, vocab = 40000, 6
    logits_row = jnp.asarray([2.0, 1.0, 0.5, 0.0, -0.5, 1.5])
    logits = jnp.tile(logits_row, (n, 1))
    md = _md(n, 0.8, top_k)
    target = np.asarray(jax.nn.softmax(processed_logits(logits[:1], _md(1, 0.8, top_k)), axis=-1))[0]
    rng = np.random.default_rng(0)
    q_row = np.asarray([0.05, 0.1, 0.5, 0.05, 0.2, 0.1])  # a draft that disagrees with the target
    drafts = rng.choice(vocab, size=n, p=q_row).astype(np.int32)
    probs = jnp.tile(jnp.asarray(q_row, jnp.float32), (n, 1)) if draft == "distribution" else None
    out = verify(logits, md, jnp.asarray(drafts), probs, num_logprobs=0, apply_truncation=top_k > 0)
    counts = np.bincount(np.asarray(out.tokens), minlength=vocab)
    ok, detail = _chi_square_ok(counts, target, n)
    assert ok, detail
    acc = np.asarray(out.accepted)
    assert np.all(np.asarray(out.tokens)[acc] == drafts[acc])
    # acceptance rate equals its exact value: sum_x min(p(x), q(x)) for a distribution draft, sum_x q(x) p(x) for point masses
    q_used = q_row
    expected_rate = np.minimum(target, q_used).sum() if draft == "distribution" else (q_used * target).sum()
    assert abs(acc.mean() - expected_rate) < 4 * math.sqrt(expected_rate * (1 - expected_rate) / n)


@pytest.mark.parametrize("all_greedy", [False, True])
def test_greedy_verification_is_argmax(all_greedy):
    logits = jax.random.normal(jax.random.key(0), (64, 50))
    md = _md(64, 0.0)
    drafts = np.asarray(jnp.argmax(logits, -1)).astype(np.int32)
    drafts[::2] = (drafts[::2] + 1) % 50  # every other draft wrong
    drafts[5] = -1  # a bonus row
    out = verify(logits, md, jnp.asarray(drafts), None, num_logprobs=2, apply_truncation=False,
                 all_greedy=all_greedy)
    argmax = np.asarray(jnp.argmax(logits, -1))
    assert np.array_equal(np.asarray(out.tokens), argmax)
    assert np.array_equal(np.asarray(out.accepted), (drafts == argmax) & (drafts >= 0))
    raw = np.asarray(jax.nn.log_softmax(logits, -1))
    np.testing.assert_allclose(np.asarray(out.logprobs), raw[np.arange(64), argmax], atol=1e-6)


def test_greedy_fast_paths_match_the_general_path():
    """``all_greedy`` compiles the greedy reduction directly; it must give exactly what the general
    rejection sampler and draft sampler give on greedy rows: same tokens, acceptances and logprobs, with
    banned ids respected and whatever distribution the draft claims."""
    n, vocab = 96, 40
    logits = jax.random.normal(jax.random.key(1), (n, vocab)) * 3
    banned = np.full((n, 2), -1, np.int32)
    banned[::3, 0] = np.asarray(jnp.argmax(logits, -1))[::3]  # the raw argmax is banned on every third row
    md = dataclasses.replace(_md(n, 0.0), banned_token_ids=jnp.asarray(banned))
    rng = np.random.default_rng(2)
    drafts = rng.integers(-1, vocab, size=n).astype(np.int32)
    best = np.asarray(jnp.argmax(jnp.where(jnp.arange(vocab) == jnp.asarray(banned[:, :1]), -jnp.inf, logits), -1))
    drafts[::4] = best[::4]  # some drafts right
    q = jax.nn.softmax(jax.random.normal(jax.random.key(3), (n, vocab)), -1)
    for probs in (None, q):
        general = verify(logits, md, jnp.asarray(drafts), probs, num_logprobs=3, apply_truncation=False)
        fast = verify(logits, md, jnp.asarray(drafts), probs, num_logprobs=3, apply_truncation=False,
                      all_greedy=True)
        for a, b in zip(jax.tree.leaves(general), jax.tree.leaves(fast)):
            np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
        assert np.array_equal(np.asarray(fast.tokens), best)
        assert np.array_equal(np.asarray(fast.accepted), (drafts >= 0) & (drafts == best))
    tok_general, q_general = draft_sample(logits, md, apply_truncation=False)
    tok_fast, q_fast = draft_sample(logits, md, apply_truncation=False, all_greedy=True)
    np.testing.assert_array_equal(np.asarray(tok_general), best)
    np.testing.assert_array_equal(np.asarray(tok_fast), best)
    np.testing.assert_array_equal(np.asarray(q_general), np.asarray(q_fast))


def test_adaptive_rule_ignores_step_cycles_during_which_something_compiled(hf_checkpoints):
    """A cycle (proposals + step) during which anything compiled (the lazy mode's first use of a shape, or any
    stray compilation) is not measured: a compile of seconds would otherwise make that arm look hopeless
    (and set a long retry interval)."""
    spec = {**NGRAM, "adaptive": True}
    llm = LLM(compilation="lazy", model=str(hf_checkpoints["llama_gqa"]), max_model_len=128, num_kv_blocks=64,
              speculative_config=spec)
    engine = llm.llm_engine
    llm.generate([{"prompt_token_ids": list(range(20))}], GREEDY, use_tqdm=False)  # compiles what the run needs
    calls, inject = [], [False]
    engine.spec_controller.record_step = lambda *args: calls.append("record")
    engine.spec_controller.discard_step = lambda: calls.append("discard")
    execute = engine.runner.execute

    def execute_and_compile(*args, **kwargs):
        if inject[0]:
            inject[0] = False
            jax.jit(lambda x: x * 3 + 1)(np.float32(2))  # a new function: one real compilation, on this thread
        return execute(*args, **kwargs)

    engine.runner.execute = execute_and_compile
    engine.add_request("r", {"prompt_token_ids": list(range(20))}, GREEDY)
    engine.step()  # prefill, then the proposals for step 2
    inject[0] = True  # a compilation during step 2's cycle
    engine.step()
    engine.step()
    assert calls == ["record", "discard", "record"]
