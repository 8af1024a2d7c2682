"""The C++ kernels (``jaxinfer.cpu.ffi``) against plain-jnp references on fuzzed shapes: the matrix products
(matvec, gemm, AMX gemm: every weight kind, every e4m3 byte, errors, where the engine's linears call them),
paged attention of short query runs and ragged attention of whole steps (float32 and e4m3-byte caches, GQA,
windows, padding; where the attention path calls them)."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest

from jaxinfer.cpu import ffi as cpu_ffi
from jaxinfer.cpu.ffi import build
from jaxinfer.model.attention import xla_ragged_paged_attention
from jaxinfer.model.linear import KMajorWeight, linear
from jaxinfer.quantization.quantized_weight import quantize_weight, quantized_linear, with_cpu_storage
from pallas_kernels.ragged_paged_attention import ragged_paged_attention_reference


def test_the_kernel_builds_here():
    # CI machines have a C++ compiler: a missing one must fail here, not silently slow the engine down.
    assert cpu_ffi.unavailable_reason() is None
    assert cpu_ffi.available() and cpu_ffi.fingerprint() != "off"


def test_a_fresh_build_and_a_failing_compiler(monkeypatch, tmp_path):
    monkeypatch.setenv("JAXINFER_CACHE_DIR", str(tmp_path / "fresh"))
    library, reason = build._build.__wrapped__()  # the real compiler, into an empty cache: sources side by side
    assert reason == "" and library.is_file() and library.parent.parent == tmp_path / "fresh" / "cpu_ffi"
    assert [p.name for p in library.parent.iterdir()] == [library.name]  # objects and partial files removed
    monkeypatch.setenv("JAXINFER_CACHE_DIR", str(tmp_path / "failing"))
    monkeypatch.setenv("CXX", "false")  # a compiler that fails every command
    library, reason = build._build.__wrapped__()
    assert library is None and reason.startswith(
        "compiling matvec.cc, gemm.cc, gemm_amx.cc, paged_attention.cc, ragged_attention.cc failed")
    assert not list((tmp_path / "failing").rglob("*.so")) and not list((tmp_path / "failing").rglob("*.o"))


def _weight(rng, n, k, kind):
    if kind == "f32":
        return jnp.asarray(rng.standard_normal((n, k), dtype=np.float32)), None
    if kind == "bf16":
        return jnp.asarray(rng.standard_normal((n, k), dtype=np.float32), jnp.bfloat16), None
    if kind == "int8":
        w = rng.integers(-128, 128, (n, k), dtype=np.int8)
    else:  # every e4m3 byte but the two NaNs (0x7F, 0xFF)
        w = rng.integers(-128, 128, (n, k), dtype=np.int8)
        w[(w & 0x7F) == 0x7F] = 0x7E
    return jnp.asarray(w), jnp.asarray(rng.uniform(0.001, 0.1, n).astype(np.float32))


SHAPES = [(1, 1, 1), (1, 7, 3), (2, 37, 129), (3, 100, 203), (4, 256, 64), (5, 9, 17), (7, 768, 33),
          (8, 64, 1000), (9, 130, 70), (16, 33, 5), (33, 40, 41), (70, 24, 130),
          (100, 300, 50), (129, 600, 97)]  # the gemm kernel's K passes (256) and row blocks (32) cut anywhere


NEEDS_AMX = pytest.mark.skipif(not build.amx_available(), reason="no AMX tiles on this CPU (or JAXINFER_CPU_AMX=0)")
ALGORITHM_KINDS = ([("matvec", kind) for kind in cpu_ffi.ops.KINDS] + [("gemm", kind) for kind in cpu_ffi.ops.GEMM_KINDS]
                   + [pytest.param("gemm_amx", kind, marks=NEEDS_AMX) for kind in ("int8", "e4m3_bits")])
AMX_SHAPES = [(300, 70, 40), (40, 2048, 48), (17, 4096, 16), (129, 64, 2049)]  # 128-row panels, 4 KiB rows, ends


@pytest.mark.parametrize("algorithm, kind", ALGORITHM_KINDS)
@pytest.mark.parametrize("m,k,n", SHAPES)
def test_products_match_the_reference(algorithm, kind, m, k, n):
    rng = np.random.default_rng(m * 10007 + k * 101 + n)
    x = rng.standard_normal((m, k), dtype=np.float32)
    x[m // 2] = 0.0  # an all-zero activation row
    w, scale = _weight(rng, n, k, kind)
    fn = getattr(cpu_ffi, algorithm)
    got = jax.jit(fn, static_argnames="kind")(jnp.asarray(x), w, scale, kind=kind)
    want = cpu_ffi.matvec_reference(jnp.asarray(x), w, scale, kind)
    assert got.shape == (m, n) and got.dtype == jnp.float32
    tol = 1e-5 * float(jnp.max(jnp.abs(want))) * np.sqrt(k) + 1e-30
    np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=1e-5, atol=tol)
    np.testing.assert_array_equal(np.asarray(got)[m // 2], 0.0)


@NEEDS_AMX
@pytest.mark.parametrize("kind", ["int8", "e4m3_bits"])
@pytest.mark.parametrize("m,k,n", AMX_SHAPES)
def test_amx_products_on_larger_shapes(kind, m, k, n):
    rng = np.random.default_rng(m + k + n)
    x = rng.standard_normal((m, k), dtype=np.float32) * np.float32(1e3)  # wide exponents: the split must be exact
    x[:, ::7] *= np.float32(1e-6)
    w, scale = _weight(rng, n, k, kind)
    got = cpu_ffi.gemm_amx(jnp.asarray(x), w, scale, kind)
    want = cpu_ffi.matvec_reference(jnp.asarray(x), w, scale, kind)
    gemm = cpu_ffi.gemm(jnp.asarray(x), w, scale, kind)  # the float32 kernel: the AMX error is no larger
    scale_of = float(jnp.max(jnp.abs(want))) * np.sqrt(k)
    np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=1e-5, atol=1e-5 * scale_of)
    assert float(jnp.max(jnp.abs(got - want))) <= 2 * float(jnp.max(jnp.abs(gemm - want))) + 1e-6 * scale_of


@NEEDS_AMX
@pytest.mark.parametrize("k", [32, 31])  # whole tiles (vector decode and transpose) and cut ones (one by one)
def test_amx_decodes_every_weight_byte_exactly(k):
    codes = np.array([b for b in range(-128, 128) if (b & 0x7F) != 0x7F], np.int8)
    for kind in ("int8", "e4m3_bits"):
        w = np.resize(codes, (16, k)).astype(np.int8)
        got = cpu_ffi.gemm_amx(jnp.eye(k, dtype=jnp.float32), jnp.asarray(w), jnp.ones(16, jnp.float32), kind)
        want = w.view(ml_dtypes.float8_e4m3fn).astype(np.float32) if kind == "e4m3_bits" else w.astype(np.float32)
        np.testing.assert_array_equal(np.asarray(got), want.T)  # one-hot rows pick each weight exactly


def test_e4m3_decoding_of_every_byte_is_exact():
    codes = np.array([b for b in range(-128, 128) if (b & 0x7F) != 0x7F], np.int8)
    w = jnp.asarray(codes.reshape(-1, 1))
    got = cpu_ffi.matvec(jnp.ones((1, 1), jnp.float32), w, jnp.ones(len(codes), jnp.float32), "e4m3_bits")
    want = codes.view(ml_dtypes.float8_e4m3fn).astype(np.float32)
    np.testing.assert_array_equal(np.asarray(got)[0], want)


@pytest.mark.parametrize("algorithm, m", [("matvec", 3), ("gemm", 40), pytest.param("gemm_amx", 40, marks=NEEDS_AMX)])
def test_many_rows_split_across_threads_agree_with_one_call_per_row(algorithm, m):
    rng = np.random.default_rng(0)
    x = jnp.asarray(rng.standard_normal((m, 300), dtype=np.float32))
    w, scale = _weight(rng, 5003, 300, "int8")
    fn = getattr(cpu_ffi, algorithm)
    whole = fn(x, w, scale, "int8")
    for lo, hi in ((0, 1000), (1000, 4096), (4096, 5003)):
        np.testing.assert_array_equal(whole[:, lo:hi], fn(x, w[lo:hi], scale[lo:hi], "int8"))


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
    with pytest.raises(ValueError, match="8-bit"):
        cpu_ffi.gemm_amx(x, jnp.ones((4, 8), jnp.float32), None, "f32")
    with pytest.raises(ValueError, match="bfloat16"):
        cpu_ffi.matvec(x, jnp.ones((4, 8), jnp.float32), None, "bf16")
    with pytest.raises(ValueError, match="matvec does"):
        cpu_ffi.gemm(x, jnp.ones((4, 8), jnp.bfloat16), None, "bf16")


def _targets(fn, *args) -> str:
    return jax.jit(fn).lower(*args).as_text()


def test_linear_calls_each_kernel_where_it_is_the_faster():
    w = KMajorWeight(jnp.ones((64, 32), jnp.float32))
    x = {rows: jnp.ones((rows, 32), jnp.float32) for rows in (8, 16, 32, 96)}
    assert "jaxinfer_matvec_f32" in _targets(linear, x[16], w)  # decode sizes: the matvec kernel
    for rows in (32, 96):  # larger float32 products: XLA's dot (faster than the gemm kernel inside the model)
        plain = _targets(linear, x[rows], w)
        assert "jaxinfer_matvec" not in plain and "jaxinfer_gemm" not in plain
    np.testing.assert_allclose(linear(x[96].reshape(3, 32, 32), w), np.full((3, 32, 64), 32.0))
    gemm = "jaxinfer_gemm_amx" if build.amx_available() else "jaxinfer_gemm"  # 8-bit prefill: AMX tiles if any
    qw = with_cpu_storage(quantize_weight(jnp.ones((32, 64), jnp.float32), "int8"))
    int8 = lambda x: quantized_linear(x, qw, implementation="cpu")  # noqa: E731
    assert "jaxinfer_matvec_int8" in _targets(int8, x[16]) and f"{gemm}_int8" in _targets(int8, x[32])
    fw = with_cpu_storage(quantize_weight(jnp.ones((32, 64), jnp.float32), "fp8_w8a16"))
    e4m3 = lambda x: quantized_linear(x, fw, implementation="cpu")  # noqa: E731
    assert "jaxinfer_matvec_e4m3" in _targets(e4m3, x[8]) and f"{gemm}_e4m3" in _targets(e4m3, x[32])
    # bfloat16 weights (a bfloat16 model on a CPU): the matvec kernel up to 64 rows, then XLA on widened weights
    bw = KMajorWeight(jnp.ones((64, 32), jnp.bfloat16))
    assert "jaxinfer_matvec_bf16" in _targets(linear, x[32], bw) and "jaxinfer_" not in _targets(linear, x[96], bw)
    np.testing.assert_array_equal(linear(x[96], bw), np.full((96, 64), 32.0, np.float32))


def test_amx_switched_off_by_the_environment_falls_back_to_the_gemm_kernel(monkeypatch):
    monkeypatch.setenv(build.AMX_SWITCH, "0")
    assert not build.amx_available() and not cpu_ffi.fingerprint().endswith("-amx")
    qw = with_cpu_storage(quantize_weight(jnp.ones((32, 64), jnp.float32), "int8"))
    lowered = _targets(lambda x: quantized_linear(x, qw, implementation="cpu"), jnp.ones((32, 32), jnp.float32))
    assert "jaxinfer_gemm_int8" in lowered and "amx" not in lowered
    with pytest.raises(RuntimeError, match="AMX"):
        cpu_ffi.gemm_amx(jnp.ones((32, 32), jnp.float32), qw.qweight, qw.scale, "int8")


def test_switched_off_by_the_environment(monkeypatch):
    monkeypatch.setenv(build.ENV_SWITCH, "0")
    assert not cpu_ffi.available() and cpu_ffi.fingerprint() == "off"
    assert cpu_ffi.unavailable_reason() == f"{build.ENV_SWITCH}=0"
    w = KMajorWeight(jnp.ones((64, 32), jnp.float32))
    assert "jaxinfer_matvec" not in _targets(linear, jnp.ones((1, 32), jnp.float32), w)


# ------------------------------------------------------------------ paged attention of short query runs
def _paged_case(rng, *, q_lens, kv_lens, hq, hkv, d, bs, num_blocks, width, cache_kind):
    """q [S, W, Hq, D], caches, a table padded past every context, and the same step as flat ragged inputs
    for the plain-jnp reference (with float32 caches: e4m3 bytes decoded)."""
    mb = max(-(-k // bs) for k in kv_lens) + 2
    tables = np.zeros((len(q_lens), mb), np.int32)
    perm, used = rng.permutation(np.arange(1, num_blocks)), 0
    for i, k in enumerate(kv_lens):
        n = -(-k // bs)
        tables[i, :n] = perm[used: used + n]
        used += n
    if cache_kind == "f32":
        k = rng.standard_normal((num_blocks, bs, hkv, d), dtype=np.float32)
        v = rng.standard_normal((num_blocks, bs, hkv, d), dtype=np.float32)
        k_ref, v_ref = k, v
    else:
        k, v = (rng.integers(-128, 128, (num_blocks, bs, hkv, d), dtype=np.int8) for _ in range(2))
        for c in (k, v):
            c[(c & 0x7F) >= 0x70] = 0x38  # e4m3 below 2^7, and no NaN: keeps softmax in a sane range
        k_ref, v_ref = (c.view(ml_dtypes.float8_e4m3fn).astype(np.float32) for c in (k, v))
    q = rng.standard_normal((len(q_lens), width, hq, d), dtype=np.float32) * 0.3
    flat = np.concatenate([q[s, :n] for s, n in enumerate(q_lens)])
    cu = np.concatenate([[0], np.cumsum(q_lens)]).astype(np.int32)
    return (q, k, v, tables, np.asarray(q_lens, np.int32), np.asarray(kv_lens, np.int32)), \
        (flat, k_ref, v_ref, tables, cu, np.asarray(kv_lens, np.int32))


@pytest.mark.parametrize("cache_kind", ["f32", "e4m3_bits"])
@pytest.mark.parametrize("q_lens, kv_lens, hq, hkv, d, bs, width, window", [
    ([1, 1, 1], [1, 40, 17], 4, 4, 16, 4, 1, None),  # decodes, one at the first position
    ([1, 0, 1], [70, 0, 9], 6, 2, 20, 8, 1, 13),  # GQA, a padding slot, head size not a multiple of 8 / 16
    ([3, 1, 4], [3, 33, 50], 8, 2, 64, 16, 4, None),  # verification runs of up to 4 queries
    ([2, 4], [30, 29], 3, 1, 7, 4, 5, 6),  # multi-query attention, a window shorter than a block
])
def test_paged_attention_matches_the_reference(cache_kind, q_lens, kv_lens, hq, hkv, d, bs, width, window):
    rng = np.random.default_rng(sum(kv_lens) * 31 + d)
    args, ref_args = _paged_case(rng, q_lens=q_lens, kv_lens=kv_lens, hq=hq, hkv=hkv, d=d, bs=bs, num_blocks=40,
                                 width=width, cache_kind=cache_kind)
    got = np.asarray(jax.jit(functools.partial(cpu_ffi.paged_attention, sm_scale=0.3, sliding_window=window))(
        *map(jnp.asarray, args)))
    want = np.asarray(ragged_paged_attention_reference(*map(jnp.asarray, ref_args), sm_scale=0.3,
                                                       sliding_window=window))
    assert got.shape == args[0].shape and got.dtype == np.float32
    tol = 2e-5 * max(1.0, float(np.abs(want).max()))  # float32 sums in another order
    for s, n in enumerate(q_lens):
        np.testing.assert_allclose(got[s, :n], want[sum(q_lens[:s]): sum(q_lens[:s]) + n], rtol=2e-5, atol=tol)
        np.testing.assert_array_equal(got[s, n:], 0.0)  # padding queries


def test_paged_attention_threads_agree_with_one_call_per_sequence():
    rng = np.random.default_rng(3)
    args, _ = _paged_case(rng, q_lens=[1] * 9, kv_lens=list(range(5, 95, 10)), hq=4, hkv=2, d=32, bs=8,
                          num_blocks=200, width=1, cache_kind="f32")
    q, k, v, tables, q_lens, kv_lens = map(jnp.asarray, args)
    whole = cpu_ffi.paged_attention(q, k, v, tables, q_lens, kv_lens, sm_scale=0.2)
    for s in range(9):
        one = cpu_ffi.paged_attention(q[s:s + 1], k, v, tables[s:s + 1], q_lens[s:s + 1], kv_lens[s:s + 1],
                                      sm_scale=0.2)
        np.testing.assert_array_equal(whole[s], one[0])


def test_paged_attention_bad_inputs_are_value_errors():
    q, k = jnp.ones((2, 1, 4, 8), jnp.float32), jnp.ones((5, 4, 2, 8), jnp.float32)
    t, lens = jnp.zeros((2, 3), jnp.int32), jnp.ones(2, jnp.int32)
    call = functools.partial(cpu_ffi.paged_attention, sm_scale=1.0)
    with pytest.raises(ValueError, match="head size"):
        call(q, jnp.ones((5, 4, 2, 16)), jnp.ones((5, 4, 2, 16)), t, lens, lens)
    with pytest.raises(ValueError, match="head size or head groups"):
        call(jnp.ones((2, 1, 3, 8), jnp.float32), k, k, t, lens, lens)
    with pytest.raises(ValueError, match="match q's S"):
        call(q, k, k, t[:1], lens, lens)
    with pytest.raises(ValueError, match="float32"):
        call(q, k.astype(jnp.bfloat16), k.astype(jnp.bfloat16), t, lens, lens)
    with pytest.raises(ValueError, match="sliding_window"):
        call(q, k, k, t, lens, lens, sliding_window=0)


def test_cpu_attention_uses_the_kernels_for_every_step(monkeypatch):
    q, k = jnp.ones((6, 4, 8), jnp.float32), jnp.ones((9, 4, 2, 8), jnp.float32)
    tables, cu, kv = jnp.ones((3, 2), jnp.int32), jnp.asarray([0, 1, 2, 3], jnp.int32), jnp.full(3, 5, jnp.int32)

    def text(width):
        fn = functools.partial(xla_ragged_paged_attention, sm_scale=1.0, query_width=width)
        return _targets(fn, q, k, k, tables, cu, kv)

    assert "jaxinfer_paged_attention_f32" in text(1)  # decode: the short-query kernel
    mixed = text(None)  # a mixed step: its single queries by the short-query kernel, its runs by the ragged one
    assert "jaxinfer_ragged_attention_f32" in mixed and "jaxinfer_paged_attention_f32" in mixed
    for width in (1, None):
        assert "_e4m3" in _targets(
            functools.partial(xla_ragged_paged_attention, sm_scale=1.0, query_width=width), q, k.astype(jnp.int8),
            k.astype(jnp.int8), tables, cu, kv)
    monkeypatch.setenv(build.ENV_SWITCH, "0")
    assert "jaxinfer_paged_attention" not in text(1) and "jaxinfer_ragged_attention" not in text(None)


# ------------------------------------------------------------------ ragged attention of whole steps
RAGGED_CASES = [  # q_lens (0: a padding slot), kv_lens, hq, hkv, d, bs, window, padding tokens
    ([40, 1, 7, 1], [40, 30, 50, 1], 4, 2, 64, 16, None, 3),  # a prompt, decodes, a prefill chunk
    ([33, 1, 0], [100, 7, 0], 8, 8, 128, 8, 13, 0),  # a window, a padding slot
    ([70, 5], [70, 90], 32, 1, 16, 4, None, 2),  # 32 heads on one KV head: 8 queries per task
    ([3, 60], [3, 61], 6, 2, 20, 4, 9, 1),  # head size 20 (no register fast path), a short window
    ([1, 1, 1], [9, 1, 33], 4, 4, 32, 8, None, 0),  # decodes only
]


def _ragged_case(rng, q_lens, kv_lens, hq, hkv, d, bs, pad, cache_kind):
    (_, k, v, tables, _, kv), (flat, k_ref, v_ref, _, cu, _) = _paged_case(
        rng, q_lens=q_lens, kv_lens=kv_lens, hq=hq, hkv=hkv, d=d, bs=bs, num_blocks=80, width=max(q_lens),
        cache_kind=cache_kind)
    q = np.concatenate([flat, rng.standard_normal((pad, hq, d), dtype=np.float32)])  # padding tokens past cu[S]
    return (q, k, v, tables, cu, kv), (q, k_ref, v_ref, tables, cu, kv)


@pytest.mark.parametrize("cache_kind", ["f32", "e4m3_bits"])
@pytest.mark.parametrize("q_lens, kv_lens, hq, hkv, d, bs, window, pad", RAGGED_CASES)
def test_ragged_attention_matches_the_reference(cache_kind, q_lens, kv_lens, hq, hkv, d, bs, window, pad):
    rng = np.random.default_rng(sum(kv_lens) * 7 + d + hq)
    args, ref_args = _ragged_case(rng, q_lens, kv_lens, hq, hkv, d, bs, pad, cache_kind)
    got = np.asarray(jax.jit(functools.partial(cpu_ffi.ragged_attention, sm_scale=0.3, sliding_window=window))(
        *map(jnp.asarray, args)))
    want = np.asarray(ragged_paged_attention_reference(*map(jnp.asarray, ref_args), sm_scale=0.3,
                                                       sliding_window=window))
    assert got.shape == args[0].shape and got.dtype == np.float32
    tol = 2e-5 * max(1.0, float(np.abs(want).max()))  # float32 sums in another order, a polynomial exp
    real = sum(q_lens)
    np.testing.assert_allclose(got[:real], want[:real], rtol=2e-5, atol=tol)
    np.testing.assert_array_equal(got[real:], 0.0)  # padding tokens


def test_ragged_attention_scores_far_apart_keep_a_stable_softmax():
    # scores spanning hundreds (one key dominates, later chunks raise the running maximum): no overflow or NaN
    rng = np.random.default_rng(5)
    args, ref_args = _ragged_case(rng, [50], [50], 2, 1, 16, 8, 0, "f32")
    q, k, v, tables, cu, kv = args
    q = q * 40.0
    got = cpu_ffi.ragged_attention(*map(jnp.asarray, (q, k, v, tables, cu, kv)), sm_scale=1.0)
    want = ragged_paged_attention_reference(*map(jnp.asarray, (q, *ref_args[1:])), sm_scale=1.0)
    assert np.isfinite(np.asarray(got)).all()
    np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=1e-4, atol=1e-4)


def test_ragged_attention_threads_agree_with_one_call_per_sequence():
    rng = np.random.default_rng(4)
    q_lens, kv_lens = [37, 1, 12, 1, 64], [40, 9, 80, 1, 64]
    args, _ = _ragged_case(rng, q_lens, kv_lens, 4, 2, 32, 8, 0, "f32")
    q, k, v, tables, cu, kv = map(jnp.asarray, args)
    whole = cpu_ffi.ragged_attention(q, k, v, tables, cu, kv, sm_scale=0.2)
    for s in range(len(q_lens)):
        lo, hi = int(cu[s]), int(cu[s + 1])
        one = cpu_ffi.ragged_attention(q[lo:hi], k, v, tables[s:s + 1], jnp.asarray([0, hi - lo], jnp.int32),
                                       kv[s:s + 1], sm_scale=0.2)
        np.testing.assert_array_equal(whole[lo:hi], one)


def test_ragged_attention_bad_inputs_are_value_errors():
    q, k = jnp.ones((4, 4, 8), jnp.float32), jnp.ones((5, 4, 2, 8), jnp.float32)
    t, cu, kv = jnp.zeros((2, 3), jnp.int32), jnp.asarray([0, 2, 4], jnp.int32), jnp.ones(2, jnp.int32)
    call = functools.partial(cpu_ffi.ragged_attention, sm_scale=1.0)
    with pytest.raises(ValueError, match="head size"):
        call(q, jnp.ones((5, 4, 2, 16)), jnp.ones((5, 4, 2, 16)), t, cu, kv)
    with pytest.raises(ValueError, match="agree on S"):
        call(q, k, k, t, cu[:2], kv)
    with pytest.raises(ValueError, match="float32"):
        call(q.astype(jnp.bfloat16), k, k, t, cu, kv)
    with pytest.raises(ValueError, match="sliding_window"):
        call(q, k, k, t, cu, kv, sliding_window=0)


# ------------------------------------------------------------------ built / loaded outside traces only
def test_traced_code_never_builds_the_kernels(monkeypatch):
    """Inside a trace only ``loaded()`` is asked: kernels not loaded there mean XLA's formulation (products,
    attention), an explicit kernel call is a RuntimeError naming ``load()``, and nothing is built; an eager call
    loads them (outside any trace)."""
    builds = []
    monkeypatch.setattr(build, "loaded", lambda: False)
    monkeypatch.setattr(build, "available", lambda: builds.append("available") or False)
    monkeypatch.setattr(build, "unavailable_reason", lambda: builds.append("reason") or "not built")
    w = KMajorWeight(jnp.ones((64, 32), jnp.float32))
    x = jnp.ones((1, 32), jnp.float32)
    assert "jaxinfer_" not in _targets(linear, x, w) and builds == []
    q, k, tables, cu, kv = (jnp.ones((4, 2, 8), jnp.float32), jnp.ones((4, 4, 1, 8), jnp.float32),
                            jnp.ones((1, 2), jnp.int32), jnp.asarray([0, 4], jnp.int32), jnp.asarray([4], jnp.int32))
    attn = functools.partial(xla_ragged_paged_attention, sm_scale=1.0)
    assert "jaxinfer_" not in _targets(attn, q, k, k, tables, cu, kv) and builds == []
    with pytest.raises(RuntimeError, match=r"never built inside a jit trace: call jaxinfer.cpu.ffi.load\(\)"):
        _targets(cpu_ffi.matvec, x, w.t)
    assert builds == []
    np.testing.assert_allclose(linear(x, w), np.full((1, 64), 32.0))  # eager: tries to load them, then XLA
    assert builds == ["available"]


def test_load_and_loaded():
    assert cpu_ffi.load() and cpu_ffi.loaded() and build.library_path().is_file()
    assert cpu_ffi.compiler() is not None
