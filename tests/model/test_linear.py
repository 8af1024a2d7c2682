"""``linear``: dense, K-major (XLA or the C++ matvec kernel) and the K-major conversion the CPU loader applies
(values, not speed)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxinfer.model.linear as linear_module
from jaxinfer.loading.model_source import load_model
from jaxinfer.model.linear import KMajorWeight, k_major_linear_weights, linear
from jaxinfer.quantization.quantized_weight import LINEAR_WEIGHT_NAMES


@pytest.mark.parametrize("lead", [(1,), (5,), (2, 3)])
def test_k_major_weight_computes_the_same_product(lead):
    kx, kw = jax.random.split(jax.random.key(0))
    x = jax.random.normal(kx, (*lead, 48), jnp.float32)
    w = jax.random.normal(kw, (48, 80), jnp.float32)
    kw_ = KMajorWeight(jnp.asarray(w.T))
    assert kw_.shape == w.shape and kw_.dtype == w.dtype
    np.testing.assert_allclose(linear(x, kw_), np.asarray(x) @ np.asarray(w), rtol=1e-5, atol=1e-5)
    out = linear(x, kw_, out_dtype=jnp.float32)
    assert out.dtype == jnp.float32 and out.shape == (*lead, 80)


def test_conversion_touches_only_dense_linear_weights():
    w = jnp.arange(6.0).reshape(2, 3)
    params = {"embed": jnp.ones((4, 2)), "lm_head": w, "final_norm": jnp.ones(2),
              "layers": [{"wq": w, "wo": w, "attn_norm": jnp.ones(2), "bq": jnp.ones(3)}]}
    assert k_major_linear_weights(params, min_bytes=1 << 20)["layers"][0]["wq"] is w  # too small: unchanged
    out = k_major_linear_weights(params, min_bytes=0)
    assert isinstance(out["lm_head"], KMajorWeight) and isinstance(out["layers"][0]["wq"], KMajorWeight)
    np.testing.assert_array_equal(out["layers"][0]["wo"].t, w.T)
    assert out["embed"] is params["embed"] and out["layers"][0]["bq"] is params["layers"][0]["bq"]
    assert out["layers"][0]["attn_norm"] is params["layers"][0]["attn_norm"] and params["lm_head"] is w


def test_the_cpu_loader_stores_large_layer_weights_k_major(monkeypatch):
    monkeypatch.setenv("JAXINFER_CPU_KERNELS", "0")  # without the C++ kernel, only weights of >= 1 MiB
    params = load_model(None, jnp.float32).params  # the embedded default model: every weight under 1 MiB
    assert not any(isinstance(w, KMajorWeight) for lp in params["layers"] for w in lp.values())
    monkeypatch.setattr(linear_module, "K_MAJOR_MIN_BYTES", 0)
    params = load_model(None, jnp.float32).params
    for lp in params["layers"]:
        for name in LINEAR_WEIGHT_NAMES:
            if name in lp:
                assert isinstance(lp[name], KMajorWeight), name
    monkeypatch.delenv("JAXINFER_CPU_KERNELS")  # with it, every dense linear weight
    monkeypatch.setattr(linear_module, "K_MAJOR_MIN_BYTES", 1 << 40)
    params = load_model(None, jnp.float32).params
    for lp in params["layers"]:
        for name in LINEAR_WEIGHT_NAMES:
            if name in lp:
                assert isinstance(lp[name], KMajorWeight), name


def test_engine_with_k_major_weights_generates_the_same_tokens(monkeypatch):
    from jaxinfer import LLM, SamplingParams

    prompts = [{"prompt_token_ids": [5, 17, 3, 99, 250]}, {"prompt_token_ids": list(range(40, 75))}]
    params = SamplingParams(temperature=0.0, max_tokens=24, logprobs=1)

    def run():
        llm = LLM(compilation="lazy", max_num_seqs=4, max_model_len=128, max_num_batched_tokens=64)
        return [o.outputs[0] for o in llm.generate(prompts, params, use_tqdm=False)]

    monkeypatch.setenv("JAXINFER_CPU_KERNELS", "0")  # XLA's dots, on [in, out] weights
    plain = run()
    monkeypatch.setattr(linear_module, "K_MAJOR_MIN_BYTES", 0)
    k_major = run()  # XLA's dots on [out, in] weights
    monkeypatch.delenv("JAXINFER_CPU_KERNELS")
    kernel = run()  # decode steps by the C++ kernels (jaxinfer.cpu.ffi): products and attention
    for other in (k_major, kernel):
        for a, b in zip(plain, other):
            assert a.token_ids == b.token_ids
            np.testing.assert_allclose([lp[t] for lp, t in zip(a.logprobs, a.token_ids)],
                                       [lp[t] for lp, t in zip(b.logprobs, b.token_ids)], atol=1e-4)
