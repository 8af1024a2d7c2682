"""The engine with attention_backend="pallas" (interpret mode on CPU) against HF transformers."""

from __future__ import annotations

import numpy as np
import pytest

from jaxinfer import LLM, SamplingParams
from tests import hf_oracle


@pytest.mark.parametrize("name", ["llama_gqa", "qwen3_head_dim", "mistral_window"])
def test_pallas_backend_matches_hf(name, hf_checkpoints, hf_models):
    llm = LLM(model=str(hf_checkpoints[name]), max_model_len=96, num_kv_blocks=32, max_num_seqs=4,
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
