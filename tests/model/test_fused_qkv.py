"""The fused query/key/value weight (jaxinfer.model.fused_qkv): the same logits and greedy tokens as the
three separate projections, for Llama-, Qwen2- (biases) and Qwen3-shaped (q/k norms, GQA) models; what is
left unfused; the abstract form gpu-compile compiles."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxinfer.config import presets
from jaxinfer.config.model import ModelConfig
from jaxinfer.model import weights
from jaxinfer.model.attention import xla_ragged_paged_attention
from jaxinfer.model.decoder import forward
from jaxinfer.model.fused_qkv import fuse_qkv_weights
from jaxinfer.model.kv_cache import allocate_kv_cache
from jaxinfer.model.step_batch import single_sequence_batch
from jaxinfer.quantization.quantized_weight import quantize_weight

TINY = {"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4,
        "num_key_value_heads": 2, "head_dim": 16, "vocab_size": 97}


def _tiny(preset: str) -> ModelConfig:
    return ModelConfig.from_hf_dict({**presets.preset_hf_dict(preset), **TINY})


def _logits(cfg, params, tokens):
    cache = allocate_kv_cache(cfg, 8, 16, jnp.float32)
    batch = single_sequence_batch(tokens, [1, 2], 16, all_logits=True)
    logits, _ = jax.jit(lambda p, c, b: forward(p, c, b, cfg, xla_ragged_paged_attention))(params, cache, batch)
    return np.asarray(logits)


@pytest.mark.parametrize("preset", ["llama-2-7b", "qwen2.5-7b", "qwen3-0.6b"])
def test_fused_weights_give_the_same_logits_and_greedy_tokens(preset):
    cfg = _tiny(preset)
    assert cfg.attention_bias == (preset == "qwen2.5-7b") and cfg.qk_norm == (preset == "qwen3-0.6b")
    params = weights.init_random_params(cfg, jax.random.key(3), jnp.float32, std=0.2)
    fused = fuse_qkv_weights(params)
    for lp, flp in zip(params["layers"], fused["layers"]):
        assert not {"wq", "wk", "wv"} & set(flp)
        np.testing.assert_array_equal(flp["wqkv"], np.concatenate([lp["wq"], lp["wk"], lp["wv"]], axis=1))
        assert flp["wqkv"].shape == (cfg.hidden_size, cfg.q_size + 2 * cfg.kv_size)
    tokens = [5, 17, 3, 88, 41, 9, 60, 2, 33, 71]
    want, got = _logits(cfg, params, tokens), _logits(cfg, fused, tokens)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    np.testing.assert_array_equal(got.argmax(-1), want.argmax(-1))


def test_quantized_and_mixed_layers_are_left_separate():
    cfg = _tiny("llama-2-7b")
    params = weights.init_random_params(cfg, jax.random.key(0), jnp.float32)
    layer0 = dict(params["layers"][0], wq=quantize_weight(params["layers"][0]["wq"], "int8"))
    layer1 = dict(params["layers"][1], wk=params["layers"][1]["wk"].astype(jnp.bfloat16))
    fused = fuse_qkv_weights({**params, "layers": [layer0, layer1]})
    for lp in fused["layers"]:
        assert "wqkv" not in lp and {"wq", "wk", "wv"} <= set(lp)


def test_abstract_params_fuse_to_the_abstract_weight():
    cfg = presets.preset_config("llama-3-8b")
    fused = fuse_qkv_weights(weights.abstract_params(cfg, jnp.bfloat16))
    w = fused["layers"][0]["wqkv"]
    assert isinstance(w, jax.ShapeDtypeStruct)
    assert (w.shape, w.dtype) == ((4096, 4096 + 2 * 1024), jnp.bfloat16)
