"""The engine with attention_backend="pallas" (interpret mode on CPU) against HF transformers."""

from __future__ import annotations

import numpy as np
import pytest

from jaxinfer import LLM, SamplingParams
from tests import hf_oracle


@pytest.mark.parametrize("name", ["llama_gqa", "qwen3_head_dim", "mistral_window", "gemma2", "gemma3", "phi3",
                                  "gpt_oss"])
def test_pallas_backend_matches_hf(name, hf_checkpoints, hf_models):
    llm = LLM(compilation="lazy", model=str(hf_checkpoints[name]), max_model_len=96, num_kv_blocks=32, max_num_seqs=4,
              attention_backend="pallas", max_num_batched_tokens=32)
    engine = llm.llm_engine
    rng = np.random.default_rng(4)
    prompts = [rng.integers(0, 256, size=n).tolist() for n in (17, 40, 3)]
    params = SamplingParams(temperature=0.0, max_tokens=12, logprobs=1, ignore_eos=True)
    # Staggered arrivals: later prompts prefill (in 32-token chunks) while earlier ones decode.
    engine.add_request("0", {"prompt_token_ids": prompts[0]}, params)
    engine.step()
    engine.add_request("1", {"prompt_token_ids": prompts[1]}, params)
    engine.step()
    engine.add_request("2", {"prompt_token_ids": prompts[2]}, params)
    done = {}
    while engine.has_unfinished_requests():
        done.update({o.request_id: o for o in engine.step() if o.finished})
    for i, prompt in enumerate(prompts):
        tokens, lps = hf_oracle.hf_greedy(hf_models[name], prompt, 12)
        comp = done[str(i)].outputs[0]
        assert comp.token_ids == tokens
        np.testing.assert_allclose([lp[t] for lp, t in zip(comp.logprobs, comp.token_ids)], lps, atol=1e-4)


@pytest.mark.parametrize("method", ["ngram", "draft_model"])
def test_pallas_backend_speculation_is_lossless(method, hf_checkpoints, hf_models):
    """Verification steps (1 + k queries per sequence) and the draft's fused proposal rounds through the
    Pallas kernel: greedy tokens equal HF's, and the target as its own draft has every guess accepted."""
    path = str(hf_checkpoints["llama_gqa"])
    spec = {"method": method, "num_speculative_tokens": 3, "adaptive": False}
    spec.update({"model": path} if method == "draft_model" else {"prompt_lookup_max": 3, "prompt_lookup_min": 1})
    llm = LLM(compilation="lazy", model=path, max_model_len=96, num_kv_blocks=32, max_num_seqs=4, attention_backend="pallas",
              speculative_config=spec)
    rng = np.random.default_rng(6)
    chunk = rng.integers(0, 256, size=6).tolist()
    prompts = [chunk * 3, rng.integers(0, 256, size=11).tolist()]
    outs = llm.generate([{"prompt_token_ids": p} for p in prompts],
                        SamplingParams(temperature=0.0, max_tokens=10, ignore_eos=True), use_tqdm=False)
    for prompt, out in zip(prompts, outs):
        assert out.outputs[0].token_ids == hf_oracle.hf_greedy(hf_models["llama_gqa"], prompt, 10)[0]
    stats = llm.llm_engine.stats()
    assert stats["num_draft_tokens"] > 0
    if method == "draft_model":
        assert stats["num_accepted_tokens"] == stats["num_draft_tokens"]
