"""Tests for the block-wise FP8 Pallas kernel (interpret mode on CPU), its reference, and its CUDA
lowering: 128 x 128 weight blocks (also 64 x 32), 1 x BK activation groups, partial last blocks.
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
from pallas_kernels.fp8_block_matmul import fp8_block_matmul, fp8_block_matmul_reference
from tests.pallas_kernels import quant_cases as cases

pytestmark = pytest.mark.filterwarnings("ignore:The Pallas Triton backend is deprecated")

# The block kernel's K tile is the weight block's K, so block_k is not a knob here.
BLOCK_SHAPES = [
    (1, 200, 70, {}, (128, 128)),
    (1, 1040, 300, {"split_k": 3}, (128, 128)),
    (5, 333, 130, {"split_k": 4}, (64, 32)),
    (17, 520, 33, {"block_n": 32, "split_k": 9}, (128, 128)),
    (130, 96, 200, {}, (64, 32)),
    (512, 150, 40, {"block_m": 64}, (128, 128)),
]
BLOCK_IDS = [f"m{m}-k{k}-n{n}-b{b[0]}x{b[1]}" + "".join(f"-{a}{v}" for a, v in kw.items())
             for m, k, n, kw, b in BLOCK_SHAPES]


def make_weight(n: int, k: int, block_shape, seed: int):
    rng = np.random.default_rng(seed)
    grid = (-(-n // block_shape[0]), -(-k // block_shape[1]))
    # Scales spanning orders of magnitude: a block mixed up with its neighbour shows.
    scale = (10.0 ** rng.uniform(-4, 0, grid)).astype(np.float32)
    return cases.random_e4m3(rng, (n, k)), scale


def oracle(x, w_q, w_scale, block_shape):
    bn, bk = block_shape
    xq, x_scale = cases.np_quantize_groups(x, bk)
    n, k = w_q.shape
    x_deq = xq.astype(np.float32) * np.repeat(x_scale, bk, axis=1)[:, :k]
    w_deq = w_q.astype(np.float32) * np.repeat(np.repeat(w_scale, bn, 0), bk, 1)[:n, :k]
    return cases.np_matmul(x_deq, w_deq)


@pytest.mark.parametrize("m, k, n, knobs, block_shape", BLOCK_SHAPES, ids=BLOCK_IDS)
@settings(max_examples=4, deadline=None)
@given(case=cases.activation_cases())
def test_kernel_matches_reference(m, k, n, knobs, block_shape, case):
    x = cases.make_activations(m, k, case)
    w_q, w_scale = make_weight(n, k, block_shape, case.seed)
    out = fp8_block_matmul(x, w_q, w_scale, block_shape=block_shape, **knobs)
    assert out.shape == (m, n) and out.dtype == jnp.float32
    ref = fp8_block_matmul_reference(x, w_q, w_scale, block_shape=block_shape)
    cases.assert_close(out, ref, rtol=1e-5, zero_rows=cases.zero_rows_of(x))


@pytest.mark.parametrize("block_shape", [(128, 128), (64, 32)])
def test_reference_matches_numpy_oracle(block_shape):
    rng = np.random.default_rng(0)
    x = rng.standard_normal((7, 300)).astype(np.float32) * 5
    x[1] = 0.0
    x[2, :40] = 0.0  # an all-zero group in an otherwise live row
    x[5, 9] = 1e5
    w_q, w_scale = make_weight(150, 300, block_shape, 1)
    ref = fp8_block_matmul_reference(x, w_q, w_scale, block_shape=block_shape)
    cases.assert_close(ref, oracle(x, w_q, w_scale, block_shape), rtol=1e-6,
                       zero_rows=cases.zero_rows_of(x))


@pytest.mark.parametrize("dtype", [jnp.bfloat16, jnp.float16], ids=lambda d: d.__name__)
def test_half_precision_activations(dtype):
    rng = np.random.default_rng(2)
    x = jnp.asarray(rng.standard_normal((20, 300)), dtype)
    w_q, w_scale = make_weight(50, 300, (128, 128), 3)
    out = fp8_block_matmul(x, w_q, w_scale)
    assert out.dtype == dtype
    ref = fp8_block_matmul_reference(x, w_q, w_scale)
    cases.assert_close(out.astype(jnp.float32), ref.astype(jnp.float32), rtol=1e-2)


@pytest.mark.parametrize("change, message", [
    (dict(w_scale=np.ones((2, 2), np.float32)), "w_scale must be"),
    (dict(block_shape=(128, 100)), "block_shape"),
    (dict(block_shape=(16, 128)), "block_shape"),
    (dict(block_n=256), "block_n"),
    (dict(w_q=np.zeros((130, 300), np.int8)), "w_q dtype"),
])
def test_rejects_bad_arguments(change, message):
    args = dict(x=np.zeros((4, 300), np.float32), w_q=np.zeros((130, 300), cases.E4M3),
                w_scale=np.ones((2, 3), np.float32))
    args.update(change)
    with pytest.raises(ValueError, match=message):
        fp8_block_matmul(**args)


def test_refuses_gpus_without_fp8_tensor_cores(monkeypatch):
    monkeypatch.setattr(gpu_target, "gpu_compute_capability", lambda: 80)
    with pytest.raises(NotImplementedError, match="fp8 tensor cores"):
        fp8_block_matmul(np.zeros((3, 200), np.float32), np.zeros((8, 200), cases.E4M3),
                         np.ones((1, 2), np.float32), interpret=False)


def _shapes(m, k, n, dtype, block_shape):
    s = jax.ShapeDtypeStruct
    grid = (-(-n // block_shape[0]), -(-k // block_shape[1]))
    return s((m, k), dtype), s((n, k), fp8.E4M3), s(grid, jnp.float32)


@pytest.mark.parametrize("m, k, n, knobs, block_shape", BLOCK_SHAPES, ids=BLOCK_IDS)
def test_fuzzed_shapes_cross_lower_for_cuda(m, k, n, knobs, block_shape):
    fn = functools.partial(fp8_block_matmul, interpret=False, block_shape=block_shape, **knobs)
    cases.lower_for_cuda(fn, *_shapes(m, k, n, jnp.float32, block_shape))


@pytest.mark.parametrize("m", [1, 16, 2048])
@pytest.mark.parametrize("k, n", [(7168, 18432), (4096, 12288), (2048, 6144)],
                         ids=["deepseek-v3-up", "qwen3-8b-up", "qwen3-1.7b-up"])
def test_model_shapes_cross_lower_for_cuda(m, k, n):
    cases.lower_for_cuda(functools.partial(fp8_block_matmul, interpret=False),
                         *_shapes(m, k, n, jnp.bfloat16, (128, 128)))
