"""Tests for the FP8 W8A8 Pallas kernel (interpret mode on CPU), its reference, and its CUDA lowering.

The kernel is checked against ``fp8_matmul_reference`` on shapes from decode to prefill with
zero rows and values far past e4m3's 448; the reference against a numpy/ml_dtypes oracle.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings

from pallas_kernels import fp8_format as fp8
from pallas_kernels import gpu_target
from pallas_kernels.fp8_matmul import fp8_matmul, fp8_matmul_reference
from tests.pallas_kernels import quant_cases as cases

pytestmark = pytest.mark.filterwarnings("ignore:The Pallas Triton backend is deprecated")


def make_weight(n: int, k: int, seed: int):
    rng = np.random.default_rng(seed)
    return cases.random_e4m3(rng, (n, k)), (rng.random(n) * 0.02 + 1e-3).astype(np.float32)


@pytest.mark.parametrize("m, k, n, knobs", cases.SHAPES, ids=cases.SHAPE_IDS)
@settings(max_examples=4, deadline=None)
@given(case=cases.activation_cases())
def test_kernel_matches_reference(m, k, n, knobs, case):
    x = cases.make_activations(m, k, case)
    w_q, w_scale = make_weight(n, k, case.seed)
    out = fp8_matmul(x, w_q, w_scale, **knobs)
    ref = fp8_matmul_reference(x, w_q, w_scale)
    assert out.shape == (m, n) and out.dtype == jnp.float32
    cases.assert_close(out, ref, rtol=1e-5, zero_rows=cases.zero_rows_of(x))


@pytest.mark.parametrize("static_scale", [None, 0.01])  # 0.01: |x| > 4.48 saturates at 448
def test_reference_matches_numpy_oracle(static_scale):
    rng = np.random.default_rng(0)
    x = rng.standard_normal((9, 300)).astype(np.float32) * 10
    x[3] = 0.0
    x[4, 7] = 1e6
    w_q, w_scale = make_weight(70, 300, 1)
    xq, x_scale = cases.np_quantize_rows(x, static_scale)
    if static_scale is not None:
        assert (np.abs(xq.astype(np.float32)) == 448.0).sum() > 100  # many values saturated
    expected = cases.np_matmul(xq.astype(np.float32) * x_scale[:, None],
                               w_q.astype(np.float32) * w_scale[:, None])
    scale_arg = None if static_scale is None else np.float32(static_scale)
    ref = fp8_matmul_reference(x, w_q, w_scale, scale_arg)
    cases.assert_close(ref, expected, rtol=1e-6, zero_rows=cases.zero_rows_of(x))
    out = fp8_matmul(x, w_q, w_scale, scale_arg)
    cases.assert_close(out, expected, rtol=1e-5, zero_rows=cases.zero_rows_of(x))


@pytest.mark.parametrize("dtype", [jnp.bfloat16, jnp.float16], ids=lambda d: d.__name__)
def test_half_precision_activations(dtype):
    rng = np.random.default_rng(2)
    x = jnp.asarray(rng.standard_normal((20, 130)), dtype)
    w_q, w_scale = make_weight(50, 130, 3)
    out = fp8_matmul(x, w_q, w_scale)
    assert out.dtype == dtype
    ref = fp8_matmul_reference(x, w_q, w_scale)
    cases.assert_close(out.astype(jnp.float32), ref.astype(jnp.float32), rtol=1e-2)


def test_out_dtype_and_static_scale_shape():
    x = np.ones((2, 40), np.float32)
    w_q, w_scale = make_weight(16, 40, 4)
    out = fp8_matmul(x, w_q, w_scale, jnp.full((1,), 0.5, jnp.float32), out_dtype=jnp.bfloat16)
    assert out.dtype == jnp.bfloat16 and out.shape == (2, 16)


@pytest.mark.parametrize("change, message", [
    (dict(x=np.zeros((4,), np.float32)), "x must be"),
    (dict(x=np.zeros((4, 32), np.int32)), "x dtype"),
    (dict(w_q=np.zeros((8, 32), np.int8)), "w_q dtype"),
    (dict(w_q=np.zeros((8, 16), cases.E4M3)), "K of x"),
    (dict(w_scale=np.zeros((4,), np.float32)), "w_scale"),
    (dict(input_scale=np.ones((2,), np.float32)), "input_scale"),
    (dict(block_m=24), "block_m"),
    (dict(block_k=16), "block_k"),
    (dict(split_k=0), "split_k"),
])
def test_rejects_bad_arguments(change, message):
    args = dict(x=np.zeros((4, 32), np.float32), w_q=np.zeros((8, 32), cases.E4M3),
                w_scale=np.ones((8,), np.float32))
    args.update(change)
    with pytest.raises(ValueError, match=message):
        fp8_matmul(**args)


def test_refuses_gpus_without_fp8_tensor_cores(monkeypatch):
    monkeypatch.setattr(gpu_target, "gpu_compute_capability", lambda: 80)
    with pytest.raises(NotImplementedError, match="fp8_w8a16"):
        fp8_matmul(np.zeros((3, 48), np.float32), np.zeros((8, 48), cases.E4M3),
                   np.ones((8,), np.float32), interpret=False)


def _shapes(m, k, n, dtype, static_scale=False):
    s = jax.ShapeDtypeStruct
    args = [s((m, k), dtype), s((n, k), fp8.E4M3), s((n,), jnp.float32)]
    if static_scale:
        args.append(s((), jnp.float32))
    return args


@pytest.mark.parametrize("m, k, n, knobs", cases.SHAPES, ids=cases.SHAPE_IDS)
def test_fuzzed_shapes_cross_lower_for_cuda(m, k, n, knobs):
    cases.lower_for_cuda(functools.partial(fp8_matmul, interpret=False, **knobs),
                         *_shapes(m, k, n, jnp.float32))


@pytest.mark.parametrize("m", [1, 16, 64, 2048])  # decode (split-K), small batch, prefill
@pytest.mark.parametrize("k, n", [(4096, 11008), (896, 4864)], ids=["7B-up", "0.5B-up"])
@pytest.mark.parametrize("dtype", [jnp.bfloat16, jnp.float16], ids=lambda d: d.__name__)
def test_model_shapes_cross_lower_for_cuda(m, k, n, dtype):
    cases.lower_for_cuda(functools.partial(fp8_matmul, interpret=False),
                         *_shapes(m, k, n, dtype, static_scale=(m == 16)))
