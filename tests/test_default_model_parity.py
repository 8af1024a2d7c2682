"""The embedded default model (trained here) gives the same greedy tokens in HF transformers and jaxinfer,
and the same continuation with speculation on."""

from __future__ import annotations

import pytest

from jaxinfer import LLM, SamplingParams
from jaxinfer.loading.model_source import DEFAULT_MODEL_DIR
from tests import hf_oracle

pytestmark = pytest.mark.skipif(not (DEFAULT_MODEL_DIR / "config.json").is_file(), reason="no default model")


def test_default_model_matches_hf_and_speculation_is_lossless():
    hf_oracle.skip_unless_available()
    prompt = "import os\n\n\ndef main(argv):\n    for name in os.listdir("
    llm = LLM(compilation="lazy", max_model_len=256, num_kv_blocks=64)
    ids = llm.get_tokenizer().encode(prompt)
    params = SamplingParams(temperature=0.0, max_tokens=32, ignore_eos=True)
    ours = llm.generate([{"prompt_token_ids": ids}], params, use_tqdm=False)[0].outputs[0].token_ids
    hf_tokens, _ = hf_oracle.hf_greedy(hf_oracle.load_hf(DEFAULT_MODEL_DIR), ids, 32)
    assert ours == hf_tokens
    spec = LLM(compilation="lazy", max_model_len=256, num_kv_blocks=64,
               speculative_config={"method": "ngram", "num_speculative_tokens": 4, "adaptive": False})
    assert spec.generate([{"prompt_token_ids": ids}], params, use_tqdm=False)[0].outputs[0].token_ids == ours
