"""Shared by the quantized-matmul kernel tests: numpy oracles, operand builders, CUDA lowering.

The oracles are written with numpy and ml_dtypes only (not with the jnp helpers the kernels use),
so the kernels' references are themselves checked against code they do not share.
"""

from __future__ import annotations

import functools
import types

import jax
import ml_dtypes
import numpy as np
from hypothesis import strategies as st

E4M3 = ml_dtypes.float8_e4m3fn
E4M3_MAX = 448.0

# (M, K, N, kernel knobs): M from 1 to 512, K and N not multiples of the tiles; explicit split-K
# (including more splits than K steps: empty splits must write zeros) and tile overrides.
SHAPES = [
    (1, 200, 70, {}),
    (1, 1040, 96, {"split_k": 3}),
    (5, 333, 130, {"split_k": 4, "block_k": 64}),
    (16, 64, 257, {}),
    (17, 520, 33, {"block_n": 32, "split_k": 9}),
    (130, 96, 200, {}),
    (512, 150, 40, {"block_m": 64}),
]
SHAPE_IDS = [f"m{m}-k{k}-n{n}" + "".join(f"-{a}{b}" for a, b in kw.items())
             for m, k, n, kw in SHAPES]


@st.composite
def activation_cases(draw):
    """How to fill x: a seed, which rows are all zero, and how far past 448 the outliers go."""
    return types.SimpleNamespace(
        seed=draw(st.integers(0, 2**31 - 1)),
        zero_rows=draw(st.sampled_from(["none", "first", "alternate", "all"])),
        outlier=draw(st.sampled_from([1.0, 1e3, 1e6])),
    )


def make_activations(m: int, k: int, case, dtype=np.float32) -> np.ndarray:
    rng = np.random.default_rng(case.seed)
    x = rng.standard_normal((m, k)).astype(np.float32)
    x[rng.random((m, k)) < 0.01] *= case.outlier  # a few values far past e4m3's range
    if case.zero_rows == "first":
        x[0] = 0.0
    elif case.zero_rows == "alternate":
        x[::2] = 0.0
    elif case.zero_rows == "all":
        x[:] = 0.0
    return x.astype(dtype)


def zero_rows_of(x: np.ndarray) -> np.ndarray:
    return ~np.any(np.asarray(x, np.float32) != 0.0, axis=1)


def random_e4m3(rng, shape) -> np.ndarray:
    """Every finite e4m3 value is equally likely: random bytes minus the NaN patterns."""
    bits = rng.integers(0, 256, shape, dtype=np.uint8)
    bits[(bits & 0x7F) == 0x7F] = 0x7E  # 0x7f / 0xff are NaN: use 448 / -448 instead
    return bits.view(E4M3)


# ----------------------------------------------------------------------------------------------
# numpy oracles
# ----------------------------------------------------------------------------------------------


def np_scale(absmax: np.ndarray, qmax: float) -> np.ndarray:
    return np.where(absmax > 0, absmax / np.float32(qmax), np.float32(1.0)).astype(np.float32)


def np_to_e4m3(values: np.ndarray) -> np.ndarray:
    return np.clip(values, -E4M3_MAX, E4M3_MAX).astype(np.float32).astype(E4M3)


def np_quantize_rows(x: np.ndarray, static_scale: float | None = None):
    x = np.asarray(x, np.float32)
    if static_scale is None:
        scale = np_scale(np.abs(x).max(axis=1), E4M3_MAX)
    else:
        scale = np.full(x.shape[0], static_scale, np.float32)
    return np_to_e4m3(x / scale[:, None]), scale


def np_quantize_groups(x: np.ndarray, group: int):
    x = np.asarray(x, np.float32)
    m, k = x.shape
    num_groups = -(-k // group)
    scale = np.empty((m, num_groups), np.float32)
    q = np.empty((m, k), E4M3)
    for g in range(num_groups):
        cols = slice(g * group, min(k, (g + 1) * group))
        scale[:, g] = np_scale(np.abs(x[:, cols]).max(axis=1), E4M3_MAX)
        q[:, cols] = np_to_e4m3(x[:, cols] / scale[:, g:g + 1])
    return q, scale


def np_matmul(x_deq: np.ndarray, w_deq: np.ndarray) -> np.ndarray:
    """``x [M, K] @ w [N, K].T`` in float64."""
    return np.asarray(x_deq, np.float64) @ np.asarray(w_deq, np.float64).T


def assert_close(out, expected, *, rtol: float, zero_rows=None):
    """Elementwise ``|out - expected| <= rtol * (max |expected| + 1)``; rows that must be exactly
    zero (all-zero activations) are checked bit for bit."""
    out = np.asarray(out, np.float64)
    expected = np.asarray(expected, np.float64)
    assert out.shape == expected.shape
    assert np.isfinite(out).all(), "non-finite output"
    np.testing.assert_allclose(out, expected, rtol=0,
                               atol=rtol * (np.abs(expected).max(initial=0.0) + 1.0))
    if zero_rows is not None and zero_rows.any():
        np.testing.assert_array_equal(out[zero_rows], 0.0)


# ----------------------------------------------------------------------------------------------
# CUDA lowering on the CPU
# ----------------------------------------------------------------------------------------------


def lower_for_cuda(fn, *shapes, device_kind: str = "NVIDIA H200", num_cores: int = 132):
    """The real Triton lowering of ``fn`` for CUDA, run on the CPU (jax >= 0.11 needs the target
    GPU named through an abstract mesh; 0.10 accepts it too). Returns the lowered text."""
    gpu = jax.sharding.AbstractDevice(device_kind=device_kind, num_cores=num_cores,
                                      platform="gpu")
    mesh = jax.sharding.AbstractMesh((1,), ("x",), abstract_device=gpu)
    with jax.sharding.use_abstract_mesh(mesh):
        lowered = jax.jit(fn).trace(*shapes).lower(lowering_platforms=("cuda",))
    text = lowered.as_text()
    assert "__gpu$xla.gpu.triton" in text, "expected a Triton custom call"
    return text


def pretend_gpu_capability(monkeypatch, capability: str):
    """Make Pallas's Triton lowering believe the local GPU has ``capability`` (e.g. "8.0"):
    it reads ``jax.local_devices(backend="gpu")[0].compute_capability`` while lowering."""
    real_local_devices = jax.local_devices

    @functools.wraps(real_local_devices)
    def local_devices(*args, backend=None, **kwargs):
        if backend == "gpu":
            return [types.SimpleNamespace(compute_capability=capability)]
        return real_local_devices(*args, backend=backend, **kwargs)

    monkeypatch.setattr(jax, "local_devices", local_devices)
