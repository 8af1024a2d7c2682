"""DeepSeek-V2 / V3 (multi-head latent attention, DeepSeek MoE) against HF transformers, on random tiny checkpoints
transformers wrote (``hf_oracle.DEEPSEEK_ARCHS``): prefill logits, greedy tokens and logprobs through the engine
with prefix caching and chunked prefill on the XLA loops, the C++ CPU kernels and the Pallas kernel
(interpreted), tensor parallelism over 2 simulated devices, and the compressed cache's size.

The checkpoints are built once per module; the engines of one backend are shared by the tests that use it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxinfer import LLM, SamplingParams
from jaxinfer.config.model import ModelConfig
from jaxinfer.loading.loader import load_hf_params
from jaxinfer.model.attention import get_attention_fn
from jaxinfer.model.decoder import forward
from jaxinfer.model.kv_cache import allocate_kv_cache, kv_cache_bytes_per_block
from jaxinfer.model.step_batch import single_sequence_batch
from tests import hf_oracle

NAMES = list(hf_oracle.DEEPSEEK_ARCHS)
ENGINE = dict(max_model_len=96, num_kv_blocks=32, max_num_seqs=4, enable_prefix_caching=True,
              max_num_batched_tokens=16)
NUM_TOKENS = 32


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    hf_oracle.skip_unless_available()
    root = tmp_path_factory.mktemp("deepseek_ckpts")
    return {name: hf_oracle.build_checkpoint(name, root) for name in NAMES}


@pytest.fixture(scope="module")
def models(checkpoints):
    return {name: hf_oracle.load_hf(path) for name, path in checkpoints.items()}


@pytest.fixture(scope="module")
def greedy_reference(models):
    """name -> [(tokens, logprobs)] of HF's greedy continuation of each of ``_prompts()``."""
    return {name: [hf_oracle.hf_greedy(models[name], p, NUM_TOKENS) for p in _prompts()] for name in NAMES[:2]}


def _prompts():
    rng = np.random.default_rng(21)
    shared = rng.integers(0, 256, size=35).tolist()  # 2 full 16-token blocks shared by the first two
    return [shared + [7, 9], shared + [3], rng.integers(0, 256, size=50).tolist()]


@pytest.mark.parametrize("name", NAMES)
def test_prefill_logits_match_hf(name, checkpoints, models):
    cfg = ModelConfig.from_pretrained(checkpoints[name])
    assert cfg.is_mla and cfg.num_kv_heads == 1
    params = load_hf_params(checkpoints[name], cfg, jnp.float32)
    ids = np.random.default_rng(1).integers(0, 256, size=45).tolist()
    cache = allocate_kv_cache(cfg, num_blocks=8, block_size=16, dtype=jnp.float32)
    assert [a.shape for a in cache[0]] == [(8, 16, 1, cfg.kv_lora_rank + cfg.qk_rope_head_dim)]  # one latent row
    batch = single_sequence_batch(ids, [5, 2, 7], 16, all_logits=True)  # non-contiguous blocks
    attn = get_attention_fn("xla", query_width=None, sliding_window=None)
    logits, _ = jax.jit(lambda p, c, b: forward(p, c, b, cfg, attn))(params, cache, batch)
    np.testing.assert_allclose(np.asarray(logits), hf_oracle.hf_logits(models[name], ids), atol=1e-4, rtol=0)


def _check_engine(llm, name, greedy_reference, staggered: bool = False):
    params = SamplingParams(temperature=0.0, max_tokens=NUM_TOKENS, logprobs=2, ignore_eos=True)
    first = llm.generate([{"prompt_token_ids": _prompts()[0]}], params, use_tqdm=False)  # fills the cache
    rest = llm.generate([{"prompt_token_ids": p} for p in _prompts()[1:]], params, use_tqdm=False)
    assert llm.llm_engine.stats()["prefix_cache_hit_tokens"] >= 32  # the second prompt reused 2 blocks
    for (tokens, lps), out, prompt in zip(greedy_reference[name], first + rest, _prompts()):
        comp = out.outputs[0]
        assert comp.token_ids == tokens, (name, len(prompt))
        np.testing.assert_allclose([lp[t] for lp, t in zip(comp.logprobs, comp.token_ids)], lps, atol=1e-4)


@pytest.mark.parametrize("backend", ["xla", "cpu", "pallas"])
@pytest.mark.parametrize("name", NAMES[:2])
def test_engine_matches_hf(name, backend, checkpoints, greedy_reference):
    """32 greedy tokens equal HF's, logprobs within 1e-4, with prefix caching and 16-token prefill chunks."""
    llm = LLM(compilation="lazy", model=str(checkpoints[name]), attention_backend=backend, **ENGINE)
    _check_engine(llm, name, greedy_reference)


def test_latent_cache_bytes_per_token(checkpoints):
    """The cache holds kv_lora_rank + rope numbers per token and layer, not expanded K and V: with DeepSeek-V2-Lite's
    real shapes 576 per layer against 16 heads x (192 key + 128 value) = 5120 (8.9x), in bfloat16."""
    from jaxinfer.config.presets import preset_config

    for cfg in (ModelConfig.from_pretrained(checkpoints["deepseek_v2"]), preset_config("deepseek-v2-lite")):
        per_token = cfg.kv_cache_bytes_per_token(2)
        assert per_token == 2 * cfg.num_layers * (cfg.kv_lora_rank + cfg.qk_rope_head_dim)
        assert kv_cache_bytes_per_block(cfg, 16, jnp.bfloat16) == 16 * per_token
    lite = preset_config("deepseek-v2-lite")
    expanded = lite.num_layers * lite.num_heads * (lite.qk_nope_head_dim + lite.qk_rope_head_dim + lite.v_head_dim) * 2
    assert (lite.kv_cache_bytes_per_token(2), expanded) == (27 * 576 * 2, 27 * 16 * 320 * 2)


def test_fp8_kv_cache_is_refused_clearly(checkpoints):
    with pytest.raises(NotImplementedError, match="latent row, not K and V"):
        LLM(compilation="lazy", model=str(checkpoints["deepseek_v2"]), kv_cache_dtype="fp8", **ENGINE)


def test_config_survives_conversion(checkpoints):
    for name in NAMES:
        cfg = ModelConfig.from_pretrained(checkpoints[name])
        assert ModelConfig.from_hf_dict(cfg.to_hf_dict()) == cfg


def test_param_count_matches_hf(checkpoints, models):
    for name in NAMES:
        assert ModelConfig.from_pretrained(checkpoints[name]).num_params == hf_oracle.num_parameters(models[name])


_TP_WORKER = textwrap.dedent("""
    import json, sys
    import jax
    from jaxinfer import LLM, SamplingParams
    from tests.test_deepseek import ENGINE, NUM_TOKENS, _prompts
    assert jax.device_count() == 2
    out = {}
    for case, (name, path) in json.loads(sys.argv[1]).items():
        llm = LLM(model=path, tensor_parallel_size=2, enable_expert_parallel=case.endswith("ep2"), compilation="lazy",
                  enable_compilation_cache=False, attention_backend="xla", **ENGINE)
        params = SamplingParams(temperature=0.0, max_tokens=NUM_TOKENS, logprobs=1, ignore_eos=True)
        res = llm.generate([{"prompt_token_ids": _prompts()[0]}], params, use_tqdm=False)
        res += llm.generate([{"prompt_token_ids": p} for p in _prompts()[1:]], params, use_tqdm=False)
        out[case] = {"tokens": [o.outputs[0].token_ids for o in res],
                     "logprobs": [[lp[t] for lp, t in zip(o.outputs[0].logprobs, o.outputs[0].token_ids)] for o in res],
                     "hits": llm.llm_engine.stats()["prefix_cache_hit_tokens"]}
    print(json.dumps(out))
""")


def test_tensor_parallel_2_matches_hf(checkpoints, greedy_reference):
    """TP=2 over simulated CPU devices (query heads split, the latent cache replicated; the experts' FFNs split, or
    with expert parallelism V3's 8 experts 4 per device): 32 greedy tokens equal HF's, logprobs within 1e-4."""
    paths = {f"{name}-tp2": (name, str(checkpoints[name])) for name in NAMES[:2]}
    paths["deepseek_v3-ep2"] = ("deepseek_v3", str(checkpoints["deepseek_v3"]))
    env = {**os.environ, "XLA_FLAGS": "--xla_force_host_platform_device_count=2", "JAX_PLATFORMS": "cpu"}
    proc = subprocess.run([sys.executable, "-c", _TP_WORKER, json.dumps(paths)], capture_output=True, text=True,
                          env=env, timeout=1500, cwd=Path(__file__).resolve().parents[1])
    assert proc.returncode == 0, proc.stderr[-4000:]
    got = json.loads(proc.stdout.strip().splitlines()[-1])
    for case, (name, _) in paths.items():
        assert got[case]["hits"] >= 32
        for (tokens, lps), g_tokens, g_lps in zip(greedy_reference[name], got[case]["tokens"], got[case]["logprobs"]):
            assert g_tokens == tokens, case
            np.testing.assert_allclose(g_lps, lps, atol=1e-4)


@pytest.mark.parametrize("name,model_type,published", [("deepseek-v2-lite", "deepseek_v2", 15.7e9),
                                                        ("deepseek-v3", "deepseek_v3", 671e9)])
def test_presets_have_hf_parameter_counts(name, model_type, published):
    """``random:deepseek-v2-lite`` / ``random:deepseek-v3`` have the real shapes: transformers builds the preset on the
    meta device with our parameter count (the published 15.7B / 671B), and the declared params are exactly those
    plus V3's correction biases (a buffer in HF, not a parameter)."""
    from jaxinfer.config.presets import preset_config, preset_hf_dict
    from jaxinfer.model.weights import abstract_params

    hf_oracle.skip_unless_available()
    cfg = preset_config(name)
    assert abs(cfg.num_params / published - 1) < 0.01
    assert hf_oracle.count_parameters(model_type, preset_hf_dict(name)) == cfg.num_params
    biases = (cfg.num_layers - cfg.first_k_dense_replace) * cfg.num_experts if cfg.topk_method == "noaux_tc" else 0
    declared = sum(int(np.prod(a.shape)) for a in jax.tree.leaves(abstract_params(cfg)))
    assert declared == cfg.num_params + biases
