"""Tests for jaxinfer.quantization.quantized_weight (QuantizedWeight, quantize/dequantize, quantized_linear on every
implementation, params trees, logical axes) and the CPU formulation in jaxinfer.cpu.quantized_matmul.

Quantization is checked against a numpy/ml_dtypes oracle; ``quantized_linear`` against the Pallas
kernels' own references (W8A8) or a float64 numpy matmul of the dequantized weight (weight-only).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxinfer.config.model import ModelConfig
from jaxinfer.cpu import quantized_matmul as quant_cpu
from jaxinfer.model.weights import init_random_params
from jaxinfer.model.weights import logical_axes as dense_logical_axes
from jaxinfer.quantization import quantized_weight as Q
from pallas_kernels.fp8_block_matmul import fp8_block_matmul_reference
from pallas_kernels.fp8_matmul import fp8_matmul_reference
from tests.pallas_kernels import quant_cases as cases

pytestmark = pytest.mark.filterwarnings("ignore:The Pallas Triton backend is deprecated")


def random_dense(k: int, n: int, seed: int = 0) -> np.ndarray:
    """A dense [in, out] weight with a zero output channel and one channel of huge values."""
    rng = np.random.default_rng(seed)
    w = (rng.standard_normal((k, n)) * 0.05).astype(np.float32)
    w[:, 1] = 0.0
    w[:, 2] *= 1e5  # far past 448 before scaling
    return w


def np_quantize(w_in_out: np.ndarray, method: str, block_shape=(128, 128)):
    """Independent oracle: (qweight [N, K], scale) with numpy and ml_dtypes."""
    w = w_in_out.T.astype(np.float32)
    if method == "int8":
        scale = cases.np_scale(np.abs(w).max(axis=1), 127.0)
        return np.clip(np.round(w / scale[:, None]), -127, 127).astype(np.int8), scale
    if method == "fp8_block":
        bn, bk = block_shape
        n, k = w.shape
        scale = np.ones((-(-n // bn), -(-k // bk)), np.float32)
        q = np.zeros((n, k), cases.E4M3)
        for i in range(scale.shape[0]):
            for j in range(scale.shape[1]):
                block = w[i * bn:(i + 1) * bn, j * bk:(j + 1) * bk]
                scale[i, j] = cases.np_scale(np.abs(block).max(), 448.0)
                q[i * bn:(i + 1) * bn, j * bk:(j + 1) * bk] = cases.np_to_e4m3(block / scale[i, j])
        return q, scale
    scale = cases.np_scale(np.abs(w).max(axis=1), 448.0)
    return cases.np_to_e4m3(w / scale[:, None]), scale


@pytest.mark.parametrize("method", Q.METHODS)
def test_quantize_weight_matches_numpy_oracle(method):
    w = random_dense(300, 200)
    block_shape = (64, 128) if method == "fp8_block" else None
    qw = Q.quantize_weight(w, method, block_shape=block_shape)
    Q.validate(qw)
    want_q, want_scale = np_quantize(w, method, block_shape or (128, 128))
    assert qw.qweight.shape == (200, 300) and qw.shape == (300, 200)
    np.testing.assert_array_equal(np.asarray(qw.qweight).view(np.uint8), want_q.view(np.uint8))
    np.testing.assert_allclose(np.asarray(qw.scale), want_scale, rtol=2.5e-7)  # XLA: 1 ulp
    deq = np.asarray(Q.dequantize(qw))
    assert deq.shape == w.shape and np.isfinite(deq).all()
    np.testing.assert_array_equal(deq[:, 1], 0.0)  # the all-zero channel stays exactly zero
    # Relative error per output channel: e4m3 keeps 3 mantissa bits, int8 rounds to scale / 2.
    bound = 2.0**-4 if method != "int8" else 0.5 / 127
    err = np.abs(deq - w).max(axis=0) / np.maximum(np.abs(w).max(axis=0), 1e-30)
    if method != "fp8_block":  # block scales follow blocks, not channels
        assert (err <= bound + 1e-7).all()


def test_quantize_refuses_unknown_method_and_bad_shapes():
    with pytest.raises(ValueError, match="unknown quantization method"):
        Q.quantize_weight(np.zeros((4, 4), np.float32), "int4")
    with pytest.raises(ValueError, match="dense"):
        Q.quantize_weight(np.zeros((4,), np.float32), "int8")
    with pytest.raises(ValueError, match="block_shape"):
        Q.quantize_weight(np.zeros((4, 4), np.float32), "int8", block_shape=(32, 32))


def expected_linear(x, qw: Q.QuantizedWeight):
    """What quantized_linear must return, from code it does not use."""
    if qw.method == "fp8":
        return np.asarray(fp8_matmul_reference(x, qw.qweight, qw.scale, qw.input_scale))
    if qw.method == "fp8_block":
        return np.asarray(fp8_block_matmul_reference(x, qw.qweight, qw.scale,
                                                     block_shape=qw.block_shape))
    w = np.asarray(qw.qweight).astype(np.float32) * np.asarray(qw.scale)[:, None]
    return cases.np_matmul(x, w)


@pytest.mark.parametrize("implementation", Q.IMPLEMENTATIONS)
@pytest.mark.parametrize("method", Q.METHODS)
def test_quantized_linear_matches_reference(method, implementation):
    rng = np.random.default_rng(1)
    w = random_dense(300, 200)
    qw = Q.quantize_weight(w, method, block_shape=(64, 128) if method == "fp8_block" else None)
    x = rng.standard_normal((11, 300)).astype(np.float32)
    x[4] = 0.0
    out = Q.quantized_linear(jnp.asarray(x).reshape(1, 11, 300), qw, implementation=implementation)
    assert out.shape == (1, 11, 200) and out.dtype == jnp.float32
    cases.assert_close(np.asarray(out)[0], expected_linear(x, qw), rtol=1e-5,
                       zero_rows=cases.zero_rows_of(x))


@pytest.mark.parametrize("method", ["fp8", "fp8_w8a16", "fp8_block"])
def test_cpu_storage_of_e4m3_gives_identical_results(method):
    qw = Q.quantize_weight(random_dense(96, 40), method, block_shape=(32, 32) if method == "fp8_block" else None)
    bits = Q.with_cpu_storage(qw)
    assert bits.qweight.dtype == jnp.int8 and Q.validate(bits) is bits
    x = np.random.default_rng(2).standard_normal((3, 96)).astype(np.float32)
    # the same values (exactly); the product by another route (the C++ kernel for the bytes), another sum order
    np.testing.assert_array_equal(np.asarray(Q.dequantize(bits)), np.asarray(Q.dequantize(qw)))
    np.testing.assert_allclose(np.asarray(Q.quantized_linear(x, bits, implementation="cpu")),
                               np.asarray(Q.quantized_linear(x, qw, implementation="cpu")), rtol=1e-5, atol=1e-5)
    with pytest.raises(ValueError, match="CPU storage"):
        Q.quantized_linear(x, bits, implementation="pallas")
    int8 = Q.quantize_weight(random_dense(96, 40), "int8")
    assert Q.with_cpu_storage(int8) is int8


def test_static_input_scale_saturates_like_the_kernel():
    qw = Q.quantize_weight(random_dense(64, 32), "fp8")
    qw = Q.QuantizedWeight(qw.qweight, qw.scale, jnp.float32(0.005), "fp8")
    x = np.random.default_rng(3).standard_normal((5, 64)).astype(np.float32) * 10  # |x|/s >> 448
    for implementation in Q.IMPLEMENTATIONS:
        out = np.asarray(Q.quantized_linear(x, qw, implementation=implementation))
        cases.assert_close(out, expected_linear(x, qw), rtol=1e-5)
    dynamic = Q.with_method(Q.with_method(qw, "fp8_w8a16"), "fp8")
    assert dynamic.input_scale is None  # weight-only drops the static activation scale


def test_half_precision_input_keeps_its_dtype():
    qw = Q.quantize_weight(random_dense(64, 48), "int8")
    x = jnp.ones((2, 3, 64), jnp.bfloat16)
    out = Q.quantized_linear(x, qw)
    assert out.dtype == jnp.bfloat16 and out.shape == (2, 3, 48)
    assert Q.quantized_linear(x, qw, out_dtype=jnp.float32).dtype == jnp.float32


def test_quantized_linear_rejects_bad_input():
    qw = Q.quantize_weight(random_dense(64, 48), "int8")
    with pytest.raises(ValueError, match="features"):
        Q.quantized_linear(jnp.ones((2, 32)), qw)
    with pytest.raises(ValueError, match="implementation"):
        Q.quantized_linear(jnp.ones((2, 64)), qw, implementation="cuda")


def test_validate_names_the_mismatch():
    qw = Q.quantize_weight(random_dense(64, 48), "fp8")
    with pytest.raises(ValueError, match="scale must have shape"):
        Q.validate(Q.QuantizedWeight(qw.qweight, qw.scale[:10], None, "fp8"))
    with pytest.raises(ValueError, match="stores qweight"):
        Q.validate(Q.QuantizedWeight(qw.qweight, qw.scale, None, "int8"))
    with pytest.raises(ValueError, match="input_scale"):
        Q.validate(Q.QuantizedWeight(qw.qweight, qw.scale, jnp.float32(1.0), "fp8_w8a16"))
    with pytest.raises(ValueError, match="block_shape"):
        Q.QuantizedWeight(qw.qweight, qw.scale, None, "fp8_block")
    with pytest.raises(ValueError, match="unknown quantization method"):
        Q.QuantizedWeight(qw.qweight, qw.scale, None, "nf4")
    with pytest.raises(ValueError, match="share a layout"):
        Q.with_method(Q.quantize_weight(random_dense(64, 48), "int8"), "fp8")


def test_is_a_pytree_with_static_method():
    qw = Q.quantize_weight(random_dense(64, 48), "fp8")
    leaves, treedef = jax.tree_util.tree_flatten(qw)
    assert len(leaves) == 2  # qweight, scale (input_scale None is no leaf)
    assert jax.tree_util.tree_unflatten(treedef, leaves).method == "fp8"
    traces = []

    @jax.jit
    def f(x, w):
        traces.append(w.method)
        return Q.quantized_linear(x, w, implementation="cpu")

    x = jnp.ones((2, 64))
    f(x, qw)
    f(x, qw)
    f(x, Q.with_method(qw, "fp8_w8a16"))
    assert traces == ["fp8", "fp8_w8a16"]  # one compile per method, none per call


@pytest.mark.parametrize("method", Q.METHODS)
def test_logical_axes_follow_the_output_channel(method):
    qw = Q.quantize_weight(random_dense(64, 48), method,
                           block_shape=(32, 32) if method == "fp8_block" else None)
    axes = Q.logical_axes(qw, ("embed", "mlp"))
    is_axes = lambda a: isinstance(a, tuple)  # noqa: E731
    assert (jax.tree.structure(axes, is_leaf=is_axes) ==
            jax.tree.structure(jax.tree.map(lambda a: (), qw), is_leaf=is_axes))
    assert axes.qweight == ("mlp", "embed")
    assert axes.scale == (("mlp", "embed") if method == "fp8_block" else ("mlp",))
    for array, names in zip(jax.tree.leaves(qw), jax.tree.leaves(axes, is_leaf=is_axes)):
        assert array.ndim == len(names)


TINY = ModelConfig(architecture="llama", vocab_size=128, hidden_size=64, intermediate_size=96,
                   num_layers=2, num_heads=4, num_kv_heads=2, head_dim=16)


def test_quantize_params_converts_only_linear_layers():
    params = init_random_params(TINY, jax.random.key(0))
    quantized = Q.quantize_params(params, "int8")
    for layer, original in zip(quantized["layers"], params["layers"]):
        for name, value in layer.items():
            if name in Q.LINEAR_WEIGHT_NAMES:
                assert Q.is_quantized(value) and value.shape == original[name].shape
            else:
                assert value is original[name]
    assert quantized["embed"] is params["embed"] and quantized["lm_head"] is params["lm_head"]
    assert Q.is_quantized(Q.quantize_params(params, "int8", include_lm_head=True)["lm_head"])
    linear = sum(v.size for layer in params["layers"] for k, v in layer.items()
                 if k in Q.LINEAR_WEIGHT_NAMES)
    saved = Q.weight_bytes(params) - Q.weight_bytes(quantized)
    assert saved == 3 * linear - 4 * sum(v.shape[1] for layer in params["layers"]
                                         for k, v in layer.items() if k in Q.LINEAR_WEIGHT_NAMES)
    # every quantized leaf gets axes with the structure sharding will map over
    dense_axes = dense_logical_axes(TINY)
    axes = Q.logical_axes(quantized["layers"][0]["wq"], dense_axes["layers"][0]["wq"])
    assert axes.qweight == ("q_heads", "embed") and axes.scale == ("q_heads",)


@pytest.mark.parametrize("n, k", [(1, 40), (37, 40), (600, 24), (256, 64)])
@pytest.mark.parametrize("kind", ["int8", "e4m3", "e4m3_bits"])
def test_chunked_dequant_matmul(n, k, kind):
    rng = np.random.default_rng(4)
    if kind == "int8":
        w = rng.integers(-127, 128, (n, k), dtype=np.int8)
        values = w.astype(np.float32)
    else:
        w = cases.random_e4m3(rng, (n, k))
        values = w.astype(np.float32)
        if kind == "e4m3_bits":
            w = w.view(np.int8)
    x = rng.standard_normal((3, k)).astype(np.float32)
    out = quant_cpu.chunked_dequant_matmul(x, jnp.asarray(w), kind, chunk_bytes=32 * k * 4)
    assert quant_cpu.chunk_rows(n, k, 32 * k * 4) == min(32, n)
    cases.assert_close(out, cases.np_matmul(x, values), rtol=1e-6)


@pytest.mark.parametrize("n, k", [(600, 40), (37, 40)])
def test_chunked_dequant_matmul_with_block_scales(n, k):
    """Chunks that straddle weight blocks (the last one is shifted back) pick each row's scales."""
    rng = np.random.default_rng(5)
    w = cases.random_e4m3(rng, (n, k))
    block_shape = (32, 16)
    scale = (10.0 ** rng.uniform(-3, 0, (-(-n // 32), -(-k // 16)))).astype(np.float32)
    values = w.astype(np.float32) * np.repeat(np.repeat(scale, 32, 0), 16, 1)[:n, :k]
    x = rng.standard_normal((2, k)).astype(np.float32)
    out = quant_cpu.chunked_dequant_matmul(x, jnp.asarray(w.view(np.int8)), "e4m3_bits",
                                           block_scale=jnp.asarray(scale), block_shape=block_shape,
                                           chunk_bytes=64 * k * 4)  # 64 rows: 2 blocks each
    cases.assert_close(out, cases.np_matmul(x, values), rtol=1e-6)


@pytest.mark.parametrize("method", Q.METHODS)
def test_pallas_path_cross_lowers_for_cuda_inside_jit(method):
    """As the model will call it: [T, H] bfloat16 activations, under jit, lowered for CUDA."""
    qw = Q.quantize_weight(random_dense(96, 200), method,
                           block_shape=(64, 32) if method == "fp8_block" else None)
    abstract_qw = jax.tree.map(lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype), qw)
    x = jax.ShapeDtypeStruct((3, 5, 96), jnp.bfloat16)
    fn = lambda x, w: Q.quantized_linear(x, w, implementation="pallas", interpret=False)  # noqa: E731
    text = cases.lower_for_cuda(fn, x, abstract_qw)
    assert text.count("__gpu$xla.gpu.triton") == 1


SHARDING_SCRIPT = """
import os
os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=2"
import jax, numpy as np
from jax.sharding import NamedSharding, PartitionSpec as P
from jaxinfer.cpu import ffi as cpu_ffi
from jaxinfer.quantization import quantized_weight as Q

cpu_ffi.load()  # as a CPU engine does at start: the traced and the eager product then take the same kernels
mesh = jax.make_mesh((2,), ("tp",), axis_types=(jax.sharding.AxisType.Auto,))
rules = {"mlp": "tp", "embed": None}  # column parallel: output channels split over "tp"
is_axes = lambda a: isinstance(a, tuple)
rng = np.random.default_rng(0)
w = rng.standard_normal((96, 128)).astype(np.float32)
x = rng.standard_normal((4, 96)).astype(np.float32)
for method in Q.METHODS:
    qw = Q.quantize_weight(w, method, block_shape=(32, 32) if method == "fp8_block" else None)
    specs = jax.tree.map(lambda names: P(*[rules[n] for n in names]),
                         Q.logical_axes(qw, ("embed", "mlp")), is_leaf=is_axes)
    placed = jax.device_put(qw, jax.tree.map(lambda s: NamedSharding(mesh, s), specs))
    assert placed.scale.sharding.spec == specs.scale
    local = jax.shard_map(lambda x, w: Q.quantized_linear(x, w, implementation="cpu"), mesh=mesh,
                          in_specs=(P(), specs), out_specs=P(None, "tp"), check_vma=False)
    out = np.asarray(jax.jit(local)(x, placed))
    want = np.asarray(Q.quantized_linear(x, qw, implementation="cpu"))
    np.testing.assert_allclose(out, want, rtol=1e-6, atol=1e-6)
    print(method, "ok")
"""


def test_logical_axes_place_weights_for_tensor_parallelism():
    """Each device holds its output channels' qweight rows and their scales, and computes them."""
    import os
    import subprocess
    import sys

    env = dict(os.environ, JAX_PLATFORMS="cpu")
    result = subprocess.run([sys.executable, "-c", SHARDING_SCRIPT], capture_output=True,
                            text=True, env=env, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.split() == [word for m in Q.METHODS for word in (m, "ok")]
