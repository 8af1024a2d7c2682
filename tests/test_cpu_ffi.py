"""The C++ matvec kernel (``jaxinfer.cpu_ffi``) against its plain-jnp reference on fuzzed shapes, its e4m3
decoding on every byte, its errors, and where the engine's linears call it."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest

from jaxinfer import cpu_ffi
from jaxinfer.cpu_ffi import build
from jaxinfer.linear import KMajorWeight, linear
from jaxinfer.quantization import quantize_weight, quantized_linear, with_cpu_storage


def test_the_kernel_builds_here():
    # CI machines have a C++ compiler: a missing one must fail here, not silently slow the engine down.
    assert cpu_ffi.unavailable_reason() is None
    assert cpu_ffi.available() and cpu_ffi.fingerprint() != "off"


def _weight(rng, n, k, kind):
    if kind == "f32":
        return jnp.asarray(rng.standard_normal((n, k), dtype=np.float32)), None
    if kind == "int8":
        w = rng.integers(-128, 128, (n, k), dtype=np.int8)
    else:  # every e4m3 byte but the two NaNs (0x7F, 0xFF)
        w = rng.integers(-128, 128, (n, k), dtype=np.int8)
        w[(w & 0x7F) == 0x7F] = 0x7E
    return jnp.asarray(w), jnp.asarray(rng.uniform(0.001, 0.1, n).astype(np.float32))


SHAPES = [(1, 1, 1), (1, 7, 3), (2, 37, 129), (3, 100, 203), (4, 256, 64), (5, 9, 17), (7, 768, 33),
          (8, 64, 1000), (9, 130, 70), (16, 33, 5), (33, 40, 41), (70, 24, 130)]


@pytest.mark.parametrize("kind", cpu_ffi.ops.KINDS)
@pytest.mark.parametrize("m,k,n", SHAPES)
def test_matvec_matches_the_reference(kind, m, k, n):
    rng = np.random.default_rng(m * 10007 + k * 101 + n)
    x = rng.standard_normal((m, k), dtype=np.float32)
    x[m // 2] = 0.0  # an all-zero activation row
    w, scale = _weight(rng, n, k, kind)
    got = jax.jit(cpu_ffi.matvec, static_argnames="kind")(jnp.asarray(x), w, scale, kind=kind)
    want = cpu_ffi.matvec_reference(jnp.asarray(x), w, scale, kind)
    assert got.shape == (m, n) and got.dtype == jnp.float32
    tol = 1e-5 * float(jnp.max(jnp.abs(want))) * np.sqrt(k) + 1e-30
    np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=1e-5, atol=tol)
    np.testing.assert_array_equal(np.asarray(got)[m // 2], 0.0)


def test_e4m3_decoding_of_every_byte_is_exact():
    codes = np.array([b for b in range(-128, 128) if (b & 0x7F) != 0x7F], np.int8)
    w = jnp.asarray(codes.reshape(-1, 1))
    got = cpu_ffi.matvec(jnp.ones((1, 1), jnp.float32), w, jnp.ones(len(codes), jnp.float32), "e4m3_bits")
    want = codes.view(ml_dtypes.float8_e4m3fn).astype(np.float32)
    np.testing.assert_array_equal(np.asarray(got)[0], want)


def test_many_rows_split_across_threads_agree_with_one_call_per_row():
    rng = np.random.default_rng(0)
    x = jnp.asarray(rng.standard_normal((3, 300), dtype=np.float32))
    w, scale = _weight(rng, 5003, 300, "int8")
    whole = cpu_ffi.matvec(x, w, scale, "int8")
    for lo, hi in ((0, 1000), (1000, 4096), (4096, 5003)):
        np.testing.assert_array_equal(whole[:, lo:hi], cpu_ffi.matvec(x, w[lo:hi], scale[lo:hi], "int8"))


def test_bad_inputs_are_value_errors():
    x = jnp.ones((2, 8), jnp.float32)
    with pytest.raises(ValueError, match="kind"):
        cpu_ffi.matvec(x, jnp.ones((4, 8)), kind="int4")
    with pytest.raises(ValueError, match=r"w \[N, K\]"):
        cpu_ffi.matvec(x, jnp.ones((4, 9), jnp.float32))
    with pytest.raises(ValueError, match="float32"):
        cpu_ffi.matvec(x.astype(jnp.bfloat16), jnp.ones((4, 8), jnp.float32))
    with pytest.raises(ValueError, match="scale"):
        cpu_ffi.matvec(x, jnp.ones((4, 8), jnp.int8), None, "int8")
    with pytest.raises(ValueError, match="scale"):
        cpu_ffi.matvec(x, jnp.ones((4, 8), jnp.int8), jnp.ones(3), "int8")


def _targets(fn, *args) -> str:
    return jax.jit(fn).lower(*args).as_text()


def test_linear_calls_the_kernel_for_decode_sized_products_only():
    w = KMajorWeight(jnp.ones((64, 32), jnp.float32))
    small, big = jnp.ones((2, 4, 32), jnp.float32), jnp.ones((3, 32, 32), jnp.float32)
    assert "jaxinfer_matvec_f32" in _targets(linear, small, w)  # 8 rows: the kernel
    assert "jaxinfer_matvec_f32" not in _targets(linear, big, w)  # 96 rows: XLA's dot
    np.testing.assert_allclose(linear(small, w), np.full((2, 4, 64), 32.0))
    qw = with_cpu_storage(quantize_weight(jnp.ones((32, 64), jnp.float32), "int8"))
    assert "jaxinfer_matvec_int8" in _targets(lambda x: quantized_linear(x, qw, implementation="cpu"), big)
    fw = with_cpu_storage(quantize_weight(jnp.ones((32, 64), jnp.float32), "fp8_w8a16"))
    assert "jaxinfer_matvec_e4m3" in _targets(lambda x: quantized_linear(x, fw, implementation="cpu"), small)
    assert "jaxinfer_matvec_e4m3" not in _targets(lambda x: quantized_linear(x, fw, implementation="cpu"), big)


def test_switched_off_by_the_environment(monkeypatch):
    monkeypatch.setenv(build.ENV_SWITCH, "0")
    assert not cpu_ffi.available() and cpu_ffi.fingerprint() == "off"
    assert cpu_ffi.unavailable_reason() == f"{build.ENV_SWITCH}=0"
    w = KMajorWeight(jnp.ones((64, 32), jnp.float32))
    assert "jaxinfer_matvec" not in _targets(linear, jnp.ones((1, 32), jnp.float32), w)
