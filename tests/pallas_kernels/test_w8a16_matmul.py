"""Tests for the weight-only W8A16 Pallas kernel (interpret mode on CPU), its reference, its CUDA
lowering, and the bit-level e4m3 decode that lets it run fp8 weights on an A100.

Weights cover every finite int8 and e4m3 value (subnormals and +-448 included); e4m3 weights are
run both through the native conversion and through the bit decode.
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
from pallas_kernels.w8a16_matmul import default_fp8_decode, w8a16_matmul, w8a16_matmul_reference
from tests.pallas_kernels import quant_cases as cases

pytestmark = pytest.mark.filterwarnings("ignore:The Pallas Triton backend is deprecated")

WEIGHTS = ["int8", "e4m3-native", "e4m3-bits"]


def make_weight(kind: str, n: int, k: int, seed: int):
    rng = np.random.default_rng(seed)
    scale = (rng.random(n) * 0.02 + 1e-3).astype(np.float32)
    if kind == "int8":
        return rng.integers(-127, 128, (n, k), dtype=np.int8), scale, None
    return cases.random_e4m3(rng, (n, k)), scale, kind.split("-")[1]


def oracle(x, w_q, w_scale):
    return cases.np_matmul(np.asarray(x, np.float32), w_q.astype(np.float32) * w_scale[:, None])


@pytest.mark.parametrize("weight", WEIGHTS)
@pytest.mark.parametrize("m, k, n, knobs", cases.SHAPES, ids=cases.SHAPE_IDS)
@settings(max_examples=3, deadline=None)
@given(case=cases.activation_cases())
def test_kernel_matches_reference_fp32(m, k, n, knobs, weight, case):
    x = cases.make_activations(m, k, case)
    w_q, w_scale, decode = make_weight(weight, n, k, case.seed)
    out = w8a16_matmul(x, w_q, w_scale, fp8_decode=decode, **knobs)
    assert out.shape == (m, n) and out.dtype == jnp.float32
    ref = w8a16_matmul_reference(x, w_q, w_scale)
    cases.assert_close(out, ref, rtol=1e-5, zero_rows=cases.zero_rows_of(x))


@pytest.mark.parametrize("weight", WEIGHTS)
def test_reference_matches_numpy_oracle(weight):
    rng = np.random.default_rng(0)
    x = rng.standard_normal((6, 210)).astype(np.float32)
    x[2] = 0.0
    w_q, w_scale, _ = make_weight(weight, 45, 210, 1)
    ref = w8a16_matmul_reference(x, w_q, w_scale)
    cases.assert_close(ref, oracle(x, w_q, w_scale), rtol=1e-6, zero_rows=cases.zero_rows_of(x))


@pytest.mark.parametrize("weight", WEIGHTS)
@pytest.mark.parametrize("dtype", [jnp.bfloat16, jnp.float16], ids=lambda d: d.__name__)
def test_half_precision_activations(dtype, weight):
    rng = np.random.default_rng(2)
    x = jnp.asarray(rng.standard_normal((20, 130)), dtype)
    w_q, w_scale, decode = make_weight(weight, 50, 130, 3)
    out = w8a16_matmul(x, w_q, w_scale, fp8_decode=decode)
    assert out.dtype == dtype
    expected = oracle(np.asarray(x.astype(jnp.float32)), w_q, w_scale)
    cases.assert_close(out.astype(jnp.float32), expected, rtol=1e-2)


def test_e4m3_bit_decode_is_exact_for_every_finite_value():
    bits = np.arange(256, dtype=np.uint8)
    finite = (bits & 0x7F) != 0x7F
    expected = bits.view(cases.E4M3).astype(np.float32)
    for typed in (bits, bits.view(np.int8)):  # unsigned bytes (GPU) and int8 storage (CPU)
        decoded = np.asarray(fp8.e4m3_bits_to_float(jnp.asarray(typed)))
        np.testing.assert_array_equal(decoded[finite], expected[finite])
    assert np.signbit(np.asarray(fp8.e4m3_bits_to_float(jnp.asarray(np.uint8(0x80)))))  # -0.0


def test_default_fp8_decode_per_platform(monkeypatch):
    assert default_fp8_decode(interpret=True) == "native"
    monkeypatch.setattr(gpu_target, "gpu_compute_capability", lambda: 80)
    assert default_fp8_decode(interpret=False) == "bits"
    monkeypatch.setattr(gpu_target, "gpu_compute_capability", lambda: 90)
    assert default_fp8_decode(interpret=False) == "native"


@pytest.mark.parametrize("change, message", [
    (dict(x=np.zeros((4, 32), np.int8)), "x dtype"),
    (dict(w_q=np.zeros((8, 32), np.float32)), "w_q dtype"),
    (dict(w_q=np.zeros((32, 8), np.int8)), "K of x"),
    (dict(w_scale=np.zeros((8, 1), np.float32)), "w_scale"),
    (dict(fp8_decode="lut"), "fp8_decode"),
    (dict(block_n=48), "block_n"),
])
def test_rejects_bad_arguments(change, message):
    args = dict(x=np.zeros((4, 32), np.float32), w_q=np.zeros((8, 32), np.int8),
                w_scale=np.ones((8,), np.float32))
    args.update(change)
    with pytest.raises(ValueError, match=message):
        w8a16_matmul(**args)


def _shapes(m, k, n, dtype, weight_dtype):
    s = jax.ShapeDtypeStruct
    return s((m, k), dtype), s((n, k), weight_dtype), s((n,), jnp.float32)


def _weight_dtype(weight):
    return jnp.int8 if weight == "int8" else fp8.E4M3


def _decode(weight):
    return None if weight == "int8" else weight.split("-")[1]


@pytest.mark.parametrize("weight", WEIGHTS)
@pytest.mark.parametrize("m, k, n, knobs", cases.SHAPES, ids=cases.SHAPE_IDS)
def test_fuzzed_shapes_cross_lower_for_cuda(m, k, n, knobs, weight):
    fn = functools.partial(w8a16_matmul, interpret=False, fp8_decode=_decode(weight), **knobs)
    cases.lower_for_cuda(fn, *_shapes(m, k, n, jnp.float32, _weight_dtype(weight)))


@pytest.mark.parametrize("weight", WEIGHTS)
@pytest.mark.parametrize("m", [1, 16, 2048])
@pytest.mark.parametrize("dtype", [jnp.bfloat16, jnp.float16], ids=lambda d: d.__name__)
def test_model_shapes_cross_lower_for_cuda(m, dtype, weight):
    fn = functools.partial(w8a16_matmul, interpret=False, fp8_decode=_decode(weight))
    cases.lower_for_cuda(fn, *_shapes(m, 4096, 11008, dtype, _weight_dtype(weight)))


@pytest.mark.parametrize("m", [1, 2048])
def test_a100_lowering_needs_the_bit_decode(monkeypatch, m):
    """On sm_80 Pallas refuses to convert from e4m3; the bit decode has no fp8 value in the kernel."""
    cases.pretend_gpu_capability(monkeypatch, "8.0")
    shapes = _shapes(m, 4096, 11008, jnp.bfloat16, fp8.E4M3)
    a100 = dict(device_kind="NVIDIA A100-SXM4-80GB", num_cores=108)
    cases.lower_for_cuda(functools.partial(w8a16_matmul, interpret=False, fp8_decode="bits"),
                         *shapes, **a100)
    cases.lower_for_cuda(functools.partial(w8a16_matmul, interpret=False), *_shapes(
        m, 4096, 11008, jnp.bfloat16, jnp.int8), **a100)
    with pytest.raises(NotImplementedError, match="float8_e4m3fn"):
        cases.lower_for_cuda(functools.partial(w8a16_matmul, interpret=False,
                                               fp8_decode="native"), *shapes, **a100)
