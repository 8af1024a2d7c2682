"""Attention backends named by what runs: how "auto" resolves per platform, the errors for "cpu" where it
cannot run, that "xla" on a CPU lowers to a step without any C++ kernel call while "cpu" calls them
(attention and linears), and that the default CPU engine ("auto" -> "cpu") keeps its greedy tokens."""

from __future__ import annotations

import warnings

import jax.numpy as jnp
import numpy as np
import pytest

from jaxinfer import LLM, SamplingParams
from jaxinfer.config.engine import ATTENTION_BACKENDS
from jaxinfer.cpu import ffi as cpu_ffi
from jaxinfer.cpu.ffi import build
from jaxinfer.loading.model_source import load_model
from jaxinfer.model.attention import BACKENDS, get_attention_fn, resolve_attention_backend
from jaxinfer.model.kv_cache import allocate_kv_cache
from jaxinfer.model.linear import KMajorWeight, linear, with_cpu_kernels
from jaxinfer.model.step_batch import single_sequence_batch
from jaxinfer.quantization.quantized_weight import quantize_weight, quantized_linear, with_cpu_storage
from jaxinfer.runner.step_functions import make_step_fn

KERNEL_PREFIX = "jaxinfer_"  # every C++ kernel's FFI target starts with it (build.TARGETS)


def test_the_config_and_the_dispatch_name_the_same_backends():
    assert set(ATTENTION_BACKENDS) == {"auto", *BACKENDS} == {"auto", "pallas", "xla", "cpu"}
    assert all(t.startswith(KERNEL_PREFIX) for t in build.TARGETS)


@pytest.mark.parametrize("requested, platform, expected", [
    ("auto", "gpu", "pallas"), ("auto", "tpu", "xla"), ("auto", "cpu", "cpu"),
    ("xla", "cpu", "xla"), ("xla", "gpu", "xla"), ("pallas", "cpu", "pallas"), ("pallas", "gpu", "pallas"),
    ("cpu", "cpu", "cpu"),
])
def test_resolution(requested, platform, expected):
    assert resolve_attention_backend(requested, platform) == expected


def test_cpu_is_refused_off_the_cpu_platform():
    with pytest.raises(ValueError, match="attention_backend='cpu' runs the C.. CPU kernels .* JAX runs on 'gpu'"):
        resolve_attention_backend("cpu", "gpu")


def test_unknown_and_unresolved_names():
    with pytest.raises(ValueError, match="attention_backend must be one of"):
        resolve_attention_backend("cuda", "cpu")
    with pytest.raises(ValueError, match="must be resolved first"):
        get_attention_fn("auto", query_width=1, sliding_window=None)


def test_the_global_off_switch(monkeypatch):
    monkeypatch.setenv("JAXINFER_CPU_KERNELS", "0")
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # switched off on purpose: no warning
        assert resolve_attention_backend("auto", "cpu") == "xla"
    with pytest.raises(ValueError, match="cannot be used here: JAXINFER_CPU_KERNELS=0. Use attention_backend='xla'"):
        resolve_attention_backend("cpu", "cpu")
    with pytest.raises(RuntimeError, match="call jaxinfer.cpu.ffi.load"):
        get_attention_fn("cpu", query_width=1, sliding_window=None)


def test_kernels_that_cannot_be_built(monkeypatch):
    reason = "no C++ compiler found (set CXX, or install g++ / clang++)"
    for module in (build, cpu_ffi):
        monkeypatch.setattr(module, "unavailable_reason", lambda: reason)
    with pytest.warns(UserWarning, match="C.. CPU kernels are unavailable, using pure XLA instead: no C.. compiler"):
        assert resolve_attention_backend("auto", "cpu") == "xla"
    with pytest.raises(ValueError, match="cannot be used here: no C.. compiler found"):
        resolve_attention_backend("cpu", "cpu")


@pytest.fixture(scope="module")
def model():
    assert cpu_ffi.load()
    loaded = load_model(None, jnp.float32)  # the embedded default model: K-major weights on the CPU
    return loaded.config, loaded.params


def _lowered_step(cfg, params, backend, num_tokens, query_width):
    cache = allocate_kv_cache(cfg, 8, 16, jnp.float32)
    batch = single_sequence_batch(list(range(3, 3 + num_tokens)), [1, 2], 16, start=20 - num_tokens)
    return make_step_fn(cfg, backend).lower(params, cache, batch, query_width).as_text()


@pytest.mark.parametrize("num_tokens, query_width", [(1, 1), (8, None)], ids=["decode", "mixed"])
def test_xla_on_the_cpu_runs_no_cpu_kernel_and_cpu_does(model, num_tokens, query_width):
    cfg, params = model
    xla = _lowered_step(cfg, params, "xla", num_tokens, query_width)
    assert KERNEL_PREFIX not in xla
    cpu = _lowered_step(cfg, params, "cpu", num_tokens, query_width)
    assert "jaxinfer_paged_attention_f32" in cpu
    if num_tokens == 1:
        assert "jaxinfer_matvec_f32" in cpu  # the linears of a decode: the matvec kernel
    else:
        assert "jaxinfer_ragged_attention_f32" in cpu  # a prompt run: the ragged kernel


def test_the_step_applies_the_backend_to_the_linears_only_inside_the_trace(model):
    cfg, params = model
    make_step_fn(cfg, "xla")  # building or lowering a step leaves the caller's params as they were
    _lowered_step(cfg, params, "xla", 1, 1)
    flags = [w.cpu_kernel for lp in params["layers"] for w in lp.values() if isinstance(w, KMajorWeight)]
    assert flags and all(flags)


def test_with_cpu_kernels_turns_every_kernel_product_off():
    import jax

    x = jnp.ones((4, 32), jnp.float32)
    w = KMajorWeight(jnp.ones((64, 32), jnp.float32))
    qw = with_cpu_storage(quantize_weight(jnp.ones((32, 64), jnp.float32), "int8"))
    on = jax.jit(lambda x: linear(x, w) + quantized_linear(x, qw, implementation="cpu")).lower(x).as_text()
    assert "jaxinfer_matvec_f32" in on and "jaxinfer_matvec_int8" in on
    tree = with_cpu_kernels({"w": w, "qw": qw, "other": jnp.ones(2)}, False)
    assert not tree["w"].cpu_kernel and not tree["qw"].cpu_kernel and tree["w"].t is w.t
    off = jax.jit(lambda x: linear(x, tree["w"]) + quantized_linear(x, tree["qw"], implementation="cpu"))
    assert KERNEL_PREFIX not in off.lower(x).as_text()
    np.testing.assert_allclose(off(x), jax.jit(lambda x: linear(x, w) + quantized_linear(x, qw))(x), rtol=1e-6)


PROMPTS = [{"prompt_token_ids": [5, 17, 3, 99, 250]}, {"prompt_token_ids": list(range(40, 75))}]
GREEDY = SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True)


def _engine(**kwargs):
    return LLM(compilation="lazy", max_num_seqs=4, max_model_len=128, max_num_batched_tokens=64, **kwargs)


def test_the_default_cpu_engine_runs_the_kernels_and_xla_gives_its_greedy_tokens(monkeypatch):
    default = _engine()
    assert default.llm_engine.attention_backend == "cpu"
    tokens = [o.outputs[0].token_ids for o in default.generate(PROMPTS, GREEDY, use_tqdm=False)]
    explicit = _engine(attention_backend="cpu")
    assert [o.outputs[0].token_ids for o in explicit.generate(PROMPTS, GREEDY, use_tqdm=False)] == tokens
    xla = _engine(attention_backend="xla")
    assert xla.llm_engine.attention_backend == "xla"
    assert [o.outputs[0].token_ids for o in xla.generate(PROMPTS, GREEDY, use_tqdm=False)] == tokens
    monkeypatch.setenv("JAXINFER_CPU_KERNELS", "0")
    assert _engine().llm_engine.attention_backend == "xla"
    with pytest.raises(ValueError, match="attention_backend='cpu'"):
        _engine(attention_backend="cpu")
