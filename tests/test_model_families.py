"""The model families beyond Llama / Qwen (Gemma 2, Gemma 3, Phi-3, GPT-OSS) through the engine, against HF transformers:
greedy tokens and logprobs with prefix caching and chunked prefill on, on the XLA loops and the C++ CPU
kernels (the Pallas backend: ``test_pallas_backend``; tensor parallelism: ``tests/sharding``; plain prefill
logits and 32 greedy tokens: ``test_hf_parity``)."""

from __future__ import annotations

import numpy as np
import pytest

from jaxinfer import LLM, SamplingParams
from tests import hf_oracle

FAMILIES = ["gemma2", "gemma3", "phi3", "gpt_oss"]


def _prompts():
    rng = np.random.default_rng(21)
    shared = rng.integers(0, 256, size=35).tolist()  # 2 full blocks shared; past the windows (8 to 20)
    return [shared + [7, 9], shared + [3], rng.integers(0, 256, size=50).tolist()]


@pytest.mark.parametrize("backend", ["xla", "cpu"])
@pytest.mark.parametrize("name", FAMILIES)
def test_prefix_cache_and_chunked_prefill_match_hf(name, backend, hf_checkpoints, hf_models):
    llm = LLM(compilation="lazy", model=str(hf_checkpoints[name]), max_model_len=96, num_kv_blocks=32, max_num_seqs=4,
              attention_backend=backend, enable_prefix_caching=True, max_num_batched_tokens=16)
    params = SamplingParams(temperature=0.0, max_tokens=16, logprobs=2, ignore_eos=True)
    first = llm.generate([{"prompt_token_ids": _prompts()[0]}], params, use_tqdm=False)  # fills the cache
    rest = llm.generate([{"prompt_token_ids": p} for p in _prompts()[1:]], params, use_tqdm=False)
    assert llm.llm_engine.stats()["prefix_cache_hit_tokens"] >= 32  # the second prompt reused 2 blocks
    for prompt, out in zip(_prompts(), first + rest):
        tokens, lps = hf_oracle.hf_greedy(hf_models[name], prompt, 16)
        comp = out.outputs[0]
        assert comp.token_ids == tokens, (name, backend, len(prompt))
        np.testing.assert_allclose([lp[t] for lp, t in zip(comp.logprobs, comp.token_ids)], lps, atol=1e-4)


def test_longrope_past_its_short_range_is_refused_clearly(hf_checkpoints):
    """Phi-3's long factors (contexts past original_max_position_embeddings) are not implemented: the default
    max_model_len stops there, and asking for more says so."""
    path = str(hf_checkpoints["phi3"])
    with pytest.raises(NotImplementedError, match=r"longrope's long factors .*max_model_len <= 256"):
        LLM(compilation="lazy", model=path, max_model_len=300, num_kv_blocks=32)
    assert LLM(compilation="lazy", model=path, num_kv_blocks=32).llm_engine.max_model_len == 256


def test_partial_rotary_is_refused_clearly():
    from jaxinfer.config.model import ModelConfig

    d = dict(architectures=["Phi3ForCausalLM"], vocab_size=64, hidden_size=32, intermediate_size=64,
             num_hidden_layers=1, num_attention_heads=2, partial_rotary_factor=0.75)
    with pytest.raises(NotImplementedError, match="partial_rotary_factor=0.75"):
        ModelConfig.from_hf_dict(d)


@pytest.mark.parametrize("name", FAMILIES)
def test_config_survives_conversion(name, hf_checkpoints):
    """``jaxinfer convert`` writes ``ModelConfig.to_hf_dict()`` as the new config.json: read back, it is the same
    config (layer types, soft-caps, local RoPE base, longrope factors included)."""
    from jaxinfer.config.model import ModelConfig

    cfg = ModelConfig.from_pretrained(hf_checkpoints[name])
    assert ModelConfig.from_hf_dict(cfg.to_hf_dict()) == cfg


def test_gpt_oss_mxfp4_checkpoint_is_refused_clearly(hf_checkpoints):
    """The published GPT-OSS checkpoints are MXFP4: refused by name, with the way to a bf16 checkpoint."""
    import json

    from jaxinfer.config.model import ModelConfig

    d = json.loads((hf_checkpoints["gpt_oss"] / "config.json").read_text())
    d["quantization_config"] = {"quant_method": "mxfp4", "modules_to_not_convert": ["model.layers.*.self_attn"]}
    with pytest.raises(NotImplementedError, match=r"MXFP4 .*Mxfp4Config\(dequantize=True\)"):
        ModelConfig.from_hf_dict(d)


@pytest.mark.parametrize("scaling", [
    {"factor": 32.0, "beta_fast": 32.0, "beta_slow": 1.0, "truncate": False, "original_max_position_embeddings": 4096},
    {"factor": 40.0, "mscale": 0.707, "mscale_all_dim": 0.707, "original_max_position_embeddings": 4096},  # DeepSeek
    {"factor": 4.0, "mscale": 1.0, "mscale_all_dim": 0.5, "original_max_position_embeddings": 2048},
    {"factor": 8.0, "original_max_position_embeddings": 64},  # truncated ramp (HF's default)
], ids=["gpt-oss", "deepseek", "mscale-ratio", "truncated"])
def test_yarn_frequencies_and_attention_factor_match_hf(scaling):
    """YaRN's per-frequency blend and its cos / sin factor, against transformers' own computation."""
    from jaxinfer.config.rope import inv_freq, parse_rope_scaling

    hf_oracle.skip_unless_available()
    rope = {"rope_type": "yarn", "rope_theta": 50000.0, **scaling}
    want_inv, want_factor = hf_oracle.rope_init("gpt_oss", dict(head_dim=64, hidden_size=256, num_attention_heads=4,
                                                                 max_position_embeddings=131072, rope_parameters=rope))
    s = parse_rope_scaling(rope, 131072)
    np.testing.assert_allclose(inv_freq(50000.0, 64, s), want_inv, rtol=1e-5)  # HF computes in float32
    assert s.attention_factor == pytest.approx(want_factor, rel=1e-12)
