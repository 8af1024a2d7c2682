"""``linear``: dense, K-major and the K-major conversion the CPU loader applies (values, not speed)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxinfer.linear import KMajorWeight, k_major_linear_weights, linear
from jaxinfer.model_source import load_model
from jaxinfer.quantization import LINEAR_WEIGHT_NAMES


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
    out = k_major_linear_weights(params)
    assert isinstance(out["lm_head"], KMajorWeight) and isinstance(out["layers"][0]["wq"], KMajorWeight)
    np.testing.assert_array_equal(out["layers"][0]["wo"].t, w.T)
    assert out["embed"] is params["embed"] and out["layers"][0]["bq"] is params["layers"][0]["bq"]
    assert out["layers"][0]["attn_norm"] is params["layers"][0]["attn_norm"] and params["lm_head"] is w


def test_the_cpu_loader_stores_layer_weights_k_major():
    cfg, params, *_ = load_model(None, jnp.float32)  # the embedded default model
    for lp in params["layers"]:
        for name in LINEAR_WEIGHT_NAMES:
            if name in lp:
                assert isinstance(lp[name], KMajorWeight), name
