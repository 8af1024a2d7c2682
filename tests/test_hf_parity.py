"""jaxinfer against HF transformers on random checkpoints that transformers itself wrote (CPU, float32)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxinfer import LLM, SamplingParams
from jaxinfer.config.model import ModelConfig
from jaxinfer.loading.loader import load_hf_params
from jaxinfer.model.attention import get_attention_fn
from jaxinfer.model.decoder import forward
from jaxinfer.model.kv_cache import allocate_kv_cache
from jaxinfer.model.step_batch import single_sequence_batch
from tests import hf_oracle

ARCHS = list(hf_oracle.ARCHS)
PROMPT_LENGTHS = (1, 15, 16, 17, 40)  # around the 16-token block boundary


def _prompt(n: int, seed: int) -> list[int]:
    return np.random.default_rng(seed).integers(0, 256, size=n).tolist()


@pytest.mark.parametrize("name", ARCHS)
def test_prefill_logits_match_hf(name, hf_checkpoints, hf_models):
    path = hf_checkpoints[name]
    cfg = ModelConfig.from_pretrained(path)
    params = load_hf_params(path, cfg, jnp.float32)
    ids = _prompt(45, seed=1)
    cache = allocate_kv_cache(cfg, num_blocks=8, block_size=16, dtype=jnp.float32)
    batch = single_sequence_batch(ids, [5, 2, 7], 16, all_logits=True)  # non-contiguous blocks
    attn = get_attention_fn("xla", query_width=None, sliding_window=cfg.sliding_window)
    logits, _ = jax.jit(lambda p, c, b: forward(p, c, b, cfg, attn))(params, cache, batch)
    expected = hf_oracle.hf_logits(hf_models[name], ids)
    np.testing.assert_allclose(np.asarray(logits), expected, atol=1e-4, rtol=0)


@pytest.mark.parametrize("name", ARCHS)
def test_greedy_tokens_and_logprobs_match_hf(name, hf_checkpoints, hf_models):
    llm = LLM(compilation="lazy", model=str(hf_checkpoints[name]), max_model_len=128, num_kv_blocks=48, max_num_seqs=8)
    prompts = [_prompt(n, seed=n) for n in PROMPT_LENGTHS]
    params = SamplingParams(temperature=0.0, max_tokens=32, logprobs=3, ignore_eos=True)
    outs = llm.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False)
    for prompt, out in zip(prompts, outs):
        expected_tokens, expected_lps = hf_oracle.hf_greedy(hf_models[name], prompt, 32)
        comp = out.outputs[0]
        assert comp.token_ids == expected_tokens, f"{name}, prompt of {len(prompt)} tokens"
        got_lps = [lp[t] for lp, t in zip(comp.logprobs, comp.token_ids)]
        np.testing.assert_allclose(got_lps, expected_lps, atol=1e-4)
        assert all(len(lp) == 3 or len(lp) == 4 for lp in comp.logprobs)
        assert comp.finish_reason == "length"
    assert llm.llm_engine.stats()["free_blocks"] == llm.llm_engine.stats()["total_blocks"]
