"""Weight declaration, HF safetensors loading, orbax convert/restore and presets.

The reference is HF transformers itself: it builds random tiny models and writes their checkpoints;
every loaded array must equal the torch state dict (transposed for linear layers) exactly. Both come from
the oracle (tests/hf_oracle.py: in process, or in the oracle process where torch is not importable here).
"""

from __future__ import annotations

import dataclasses
import shutil
from pathlib import Path

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest
from safetensors import safe_open
from safetensors.numpy import save_file

from jaxinfer.config.model import ModelConfig
from jaxinfer.config.presets import PRESETS, preset_config, preset_hf_dict
from jaxinfer.loading.loader import (
    CheckpointError,
    convert_hf_checkpoint,
    is_orbax_dir,
    load_hf_params,
    load_hf_params_host,
    restore_params,
    save_params,
)
from jaxinfer.model.weights import (
    ParamSpec,
    abstract_params,
    get_at_path,
    hf_name_table,
    init_random_params,
    logical_axes,
    param_specs,
)

from tests import hf_oracle

KINDS = ("llama_gqa", "llama_tied", "qwen2_bias", "qwen3_qknorm")
TINY = dict(vocab_size=96, hidden_size=32, intermediate_size=48, num_hidden_layers=2, num_attention_heads=4)


def _hf_config(kind: str) -> tuple[str, dict]:
    """The transformers config class and its arguments of ``kind``."""
    if kind == "llama_gqa":
        return "LlamaConfig", dict(TINY, num_key_value_heads=2)
    if kind == "llama_tied":
        return "LlamaConfig", dict(TINY, num_key_value_heads=4, tie_word_embeddings=True)
    if kind == "qwen2_bias":
        return "Qwen2Config", dict(TINY, num_key_value_heads=2, tie_word_embeddings=False)
    if kind == "qwen3_qknorm":  # head_dim 16 != hidden 32 / 4 heads
        return "Qwen3Config", dict(TINY, num_key_value_heads=2, head_dim=16, tie_word_embeddings=False)
    raise ValueError(kind)


def _write_hf(out: Path, kind: str, dtype: str | None = None, max_shard_size=None) -> dict[str, np.ndarray]:
    """Save a random HF model to ``out``; return its state dict as float32 numpy arrays."""
    hf_oracle.skip_unless_available()
    cls_name, kwargs = _hf_config(kind)
    _, state = hf_oracle.write_random_checkpoint(cls_name, kwargs, out, seed=sorted(KINDS).index(kind), dtype=dtype,
                                                 max_shard_size=max_shard_size, return_state=True)
    return state


@pytest.fixture(scope="module")
def hf_dirs(tmp_path_factory):
    """kind -> (directory, reference state dict), built once per module."""
    hf_oracle.skip_unless_available()
    out = {}
    for kind in KINDS:
        d = tmp_path_factory.mktemp(kind)
        out[kind] = (d, _write_hf(d, kind))
    return out


def _assert_matches_state_dict(params, cfg: ModelConfig, state: dict[str, np.ndarray]):
    table = hf_name_table(cfg)
    expected_names = set(state) - ({"lm_head.weight"} if cfg.tie_word_embeddings else set())
    assert set(table) == expected_names
    for name, (path, transpose) in table.items():
        ours = np.asarray(get_at_path(params, path))
        ref = state[name].T if transpose else state[name]
        assert ours.shape == ref.shape, name
        np.testing.assert_array_equal(ours.astype(np.float32), ref, err_msg=name)
    # structure and shapes are exactly the declared ones
    abstract = abstract_params(cfg, jnp.float32)
    assert jax.tree.structure(params) == jax.tree.structure(abstract)
    assert jax.tree.map(lambda a: a.shape, params) == jax.tree.map(lambda a: a.shape, abstract)


# ------------------------------------------------------------------------------------------- loading


@pytest.mark.parametrize("kind", KINDS)
def test_load_matches_transformers_state_dict(hf_dirs, kind):
    d, state = hf_dirs[kind]
    cfg = ModelConfig.from_pretrained(d)
    params = load_hf_params(d, cfg, jnp.float32)
    assert all(isinstance(x, jax.Array) and x.dtype == jnp.float32 for x in jax.tree.leaves(params))
    _assert_matches_state_dict(params, cfg, state)
    layer = params["layers"][0]
    assert ("lm_head" in params) == (not cfg.tie_word_embeddings)
    assert ("bq" in layer) == (kind == "qwen2_bias")
    assert ("q_norm" in layer) == (kind == "qwen3_qknorm")
    if kind == "qwen3_qknorm":
        assert layer["wq"].shape == (32, 4 * 16) and layer["q_norm"].shape == (16,)


def test_load_sharded_checkpoint(tmp_path):
    state = _write_hf(tmp_path, "llama_gqa", max_shard_size="10KB")
    assert (tmp_path / "model.safetensors.index.json").is_file()
    assert len(list(tmp_path.glob("model-*.safetensors"))) > 2
    cfg = ModelConfig.from_pretrained(tmp_path)
    _assert_matches_state_dict(load_hf_params(tmp_path, cfg), cfg, state)


def test_load_bf16_checkpoint(tmp_path):
    state = _write_hf(tmp_path, "qwen2_bias", dtype="bfloat16")
    with safe_open(str(tmp_path / "model.safetensors"), framework="numpy") as f:
        assert f.get_slice("model.norm.weight").get_dtype() == "BF16"
    cfg = ModelConfig.from_pretrained(tmp_path)
    _assert_matches_state_dict(load_hf_params(tmp_path, cfg, jnp.float32), cfg, state)
    params_bf16 = load_hf_params(tmp_path, cfg, jnp.bfloat16)
    assert all(x.dtype == jnp.bfloat16 for x in jax.tree.leaves(params_bf16))
    _assert_matches_state_dict(params_bf16, cfg, state)  # bf16 -> f32 -> compare is exact


def test_load_host_returns_numpy_and_single_sharding(hf_dirs):
    d, state = hf_dirs["llama_gqa"]
    cfg = ModelConfig.from_pretrained(d)
    host = load_hf_params_host(d, cfg, jnp.bfloat16)
    assert all(type(x) is np.ndarray and x.dtype == ml_dtypes.bfloat16 for x in jax.tree.leaves(host))
    sharding = jax.sharding.SingleDeviceSharding(jax.devices()[0])
    placed = load_hf_params(d, cfg, jnp.float32, shardings=sharding)
    assert all(x.sharding == sharding for x in jax.tree.leaves(placed))
    _assert_matches_state_dict(placed, cfg, state)


# -------------------------------------------------------------------------------------- error cases


def _read_all(path: Path) -> dict[str, np.ndarray]:
    with safe_open(str(path), framework="numpy") as f:
        return {k: f.get_tensor(k) for k in f.keys()}


def _copy_with_tensors(src: Path, dst: Path, edit) -> ModelConfig:
    """Copy an HF dir, rewriting model.safetensors through ``edit(tensors) -> tensors``."""
    dst.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(src / "config.json", dst / "config.json")
    save_file(edit(_read_all(src / "model.safetensors")), str(dst / "model.safetensors"))
    return ModelConfig.from_pretrained(dst)


def test_error_missing_tensor(hf_dirs, tmp_path):
    src, _ = hf_dirs["llama_gqa"]
    name = "model.layers.1.mlp.up_proj.weight"
    cfg = _copy_with_tensors(src, tmp_path, lambda t: {k: v for k, v in t.items() if k != name})
    with pytest.raises(CheckpointError, match=f"missing tensors: {name}"):
        load_hf_params(tmp_path, cfg)


def test_error_untied_without_lm_head(hf_dirs, tmp_path):
    src, _ = hf_dirs["qwen3_qknorm"]
    cfg = _copy_with_tensors(src, tmp_path, lambda t: {k: v for k, v in t.items() if k != "lm_head.weight"})
    with pytest.raises(CheckpointError, match="missing tensors: lm_head.weight"):
        load_hf_params(tmp_path, cfg)


def test_error_unexpected_tensor(hf_dirs, tmp_path):
    src, _ = hf_dirs["llama_gqa"]
    extra = "model.layers.0.mlp.extra_proj.weight"
    cfg = _copy_with_tensors(src, tmp_path, lambda t: {**t, extra: np.zeros((3, 3), np.float32)})
    with pytest.raises(CheckpointError, match=r"model\.safetensors: unexpected tensor 'model\.layers\.0\.mlp\.extra_proj"):
        load_hf_params(tmp_path, cfg)


def test_error_extra_layer_is_unexpected(hf_dirs, tmp_path):
    src, _ = hf_dirs["llama_gqa"]
    extra = "model.layers.2.input_layernorm.weight"  # config says 2 layers
    cfg = _copy_with_tensors(src, tmp_path, lambda t: {**t, extra: np.ones((32,), np.float32)})
    with pytest.raises(CheckpointError, match="unexpected tensor 'model.layers.2.input_layernorm.weight'"):
        load_hf_params(tmp_path, cfg)


def test_error_misshaped_tensor(hf_dirs, tmp_path):
    src, _ = hf_dirs["qwen2_bias"]
    name = "model.layers.0.self_attn.k_proj.bias"
    cfg = _copy_with_tensors(src, tmp_path, lambda t: {**t, name: np.zeros((15,), np.float32)})
    with pytest.raises(CheckpointError, match=r"k_proj\.bias' has shape \(15,\), expected \(16,\)"):
        load_hf_params(tmp_path, cfg)


def test_ignored_and_redundant_tensors_load(hf_dirs, tmp_path):
    src, state = hf_dirs["llama_tied"]

    def add(t):
        inv = "model.layers.0.self_attn.rotary_emb.inv_freq"
        return {**t, "lm_head.weight": t["model.embed_tokens.weight"].copy(), inv: np.ones((4,), np.float32)}

    cfg = _copy_with_tensors(src, tmp_path, add)
    assert cfg.tie_word_embeddings
    params = load_hf_params(tmp_path, cfg)
    assert "lm_head" not in params
    _assert_matches_state_dict(params, cfg, state)


def test_error_tied_lm_head_of_wrong_shape(hf_dirs, tmp_path):
    src, _ = hf_dirs["llama_tied"]
    cfg = _copy_with_tensors(src, tmp_path, lambda t: {**t, "lm_head.weight": np.zeros((5, 32), np.float32)})
    with pytest.raises(CheckpointError, match=r"'lm_head.weight' has shape \(5, 32\)"):
        load_hf_params(tmp_path, cfg)


@pytest.mark.parametrize("keep_bytes", [-100, 20, 4])
def test_error_truncated_file(hf_dirs, tmp_path, keep_bytes):
    src, _ = hf_dirs["llama_gqa"]
    shutil.copyfile(src / "config.json", tmp_path / "config.json")
    data = (src / "model.safetensors").read_bytes()
    (tmp_path / "model.safetensors").write_bytes(data[:keep_bytes])
    cfg = ModelConfig.from_pretrained(tmp_path)
    with pytest.raises(CheckpointError, match=r"model\.safetensors: cannot read safetensors file"):
        load_hf_params(tmp_path, cfg)


def test_error_index_references_missing_shard(tmp_path):
    _write_hf(tmp_path, "llama_gqa", max_shard_size="10KB")
    shard = sorted(tmp_path.glob("model-*.safetensors"))[1]
    shard.unlink()
    cfg = ModelConfig.from_pretrained(tmp_path)
    with pytest.raises(CheckpointError, match=f"references shard '{shard.name}', which is missing"):
        load_hf_params(tmp_path, cfg)


def test_error_no_safetensors(hf_dirs, tmp_path):
    src, _ = hf_dirs["llama_gqa"]
    shutil.copyfile(src / "config.json", tmp_path / "config.json")
    (tmp_path / "pytorch_model.bin").write_bytes(b"not used")
    cfg = ModelConfig.from_pretrained(tmp_path)
    with pytest.raises(CheckpointError, match=r"no model\.safetensors.*\.bin checkpoints are not supported"):
        load_hf_params(tmp_path, cfg)


# --------------------------------------------------------------------------------------------- orbax


def test_convert_restore_round_trip(hf_dirs, tmp_path):
    src, state = hf_dirs["qwen3_qknorm"]
    (src / "tokenizer.json").write_text('{"fake": "tokenizer"}')
    cfg = ModelConfig.from_pretrained(src)
    out = tmp_path / "converted"
    convert_hf_checkpoint(src, out, dtype=jnp.float32)
    assert is_orbax_dir(out) and not is_orbax_dir(src)
    assert (out / "tokenizer.json").read_text() == '{"fake": "tokenizer"}'
    assert (out / "generation_config.json").is_file()
    cfg2, params = restore_params(out)
    assert cfg2 == cfg
    assert all(isinstance(x, jax.Array) and x.dtype == jnp.float32 for x in jax.tree.leaves(params))
    _assert_matches_state_dict(params, cfg, state)
    # a cast on restore
    _, params_bf16 = restore_params(out, dtype=jnp.bfloat16)
    assert all(x.dtype == jnp.bfloat16 for x in jax.tree.leaves(params_bf16))
    ref = load_hf_params(src, cfg, jnp.bfloat16)
    jax.tree.map(lambda a, b: np.testing.assert_array_equal(np.asarray(a), np.asarray(b)), params_bf16, ref)
    with pytest.raises(FileExistsError):
        convert_hf_checkpoint(src, out, dtype=jnp.float32)


def test_save_restore_bf16_random_params(tmp_path):
    cfg = preset_config("llama-150m")
    small = dataclasses.replace(
        cfg, num_layers=2, vocab_size=128, hidden_size=64, intermediate_size=96,
        num_heads=4, num_kv_heads=2, head_dim=16, tie_word_embeddings=True,
    )
    params = init_random_params(small, jax.random.key(1), jnp.bfloat16)
    save_params(params, tmp_path / "ck", small)
    cfg2, restored = restore_params(tmp_path / "ck")
    assert cfg2 == small
    assert jax.tree.structure(restored) == jax.tree.structure(params)
    jax.tree.map(lambda a, b: np.testing.assert_array_equal(np.asarray(a), np.asarray(b)), restored, params)
    assert all(x.dtype == jnp.bfloat16 for x in jax.tree.leaves(restored))


def test_restore_rejects_hf_dir(hf_dirs):
    with pytest.raises(CheckpointError, match="not a jaxinfer orbax checkpoint"):
        restore_params(hf_dirs["llama_gqa"][0])


# ---------------------------------------------------------------------------------- declaration


@pytest.mark.parametrize("kind", KINDS)
def test_random_init_matches_declaration(hf_dirs, kind):
    cfg = ModelConfig.from_pretrained(hf_dirs[kind][0])
    params = init_random_params(cfg, jax.random.key(0), jnp.float32)
    abstract = abstract_params(cfg, jnp.float32)
    assert jax.tree.structure(params) == jax.tree.structure(abstract)
    assert jax.tree.map(lambda a: (a.shape, a.dtype), params) == jax.tree.map(lambda a: (a.shape, a.dtype), abstract)
    assert sum(x.size for x in jax.tree.leaves(params)) == cfg.num_params
    np.testing.assert_array_equal(params["final_norm"], np.ones(cfg.hidden_size))
    assert abs(float(jnp.std(params["embed"])) - 0.02) < 0.003
    again = init_random_params(cfg, jax.random.key(0), jnp.float32)
    jax.tree.map(lambda a, b: np.testing.assert_array_equal(a, b), params, again)
    assert not np.array_equal(params["layers"][0]["wq"], params["layers"][1]["wq"])


def test_logical_axes_have_one_name_per_dim(hf_dirs):
    cfg = ModelConfig.from_pretrained(hf_dirs["qwen2_bias"][0])
    axes = logical_axes(cfg)
    assert axes["embed"] == ("vocab", "embed")
    assert axes["layers"][0]["wk"] == ("embed", "kv_heads")
    assert axes["layers"][1]["w_down"] == ("mlp", "embed")
    specs = jax.tree.leaves(param_specs(cfg), is_leaf=lambda x: isinstance(x, ParamSpec))
    assert all(len(s.shape) == len(s.logical_axes) for s in specs)


# --------------------------------------------------------------------------------------------- presets

PUBLISHED_PARAMS = {
    "llama-2-7b": 6.74e9,
    "llama-3-8b": 8.03e9,
    "llama-3.1-8b": 8.03e9,
    "qwen2.5-0.5b": 0.49e9,
    "qwen2.5-7b": 7.62e9,
    "qwen3-0.6b": 0.6e9,
    "gemma-2-9b": 9.24e9,
    "gemma-3-4b": 3.88e9,
    "phi-3-mini": 3.82e9,  # the text model (4.3e9 with the SigLIP vision tower, which is not served)
    "gpt-oss-20b": 20.91e9,  # OpenAI's model card: 20.91B total, 3.61B active
}


@pytest.mark.parametrize("name", sorted(PUBLISHED_PARAMS))
def test_presets_have_published_sizes(name):
    cfg = preset_config(name)
    assert abs(cfg.num_params / PUBLISHED_PARAMS[name] - 1) < 0.02
    declared = sum(int(np.prod(a.shape)) for a in jax.tree.leaves(abstract_params(cfg)))
    assert declared == cfg.num_params


def test_gpt_oss_preset_is_active_3_6b():
    cfg = preset_config("gpt-oss-20b")
    # the model card's 3.61B active leaves the embedding lookup out (it counts the unembedding)
    assert abs((cfg.num_active_params - cfg.vocab_size * cfg.hidden_size) / 3.61e9 - 1) < 0.01
    assert cfg.rope_scaling.rope_type == "yarn" and cfg.layer_sliding_window(0) == 128
    assert cfg.layer_sliding_window(1) is None


def test_llama31_has_llama3_rope_scaling():
    cfg = preset_config("llama-3.1-8b")
    assert cfg.rope_scaling is not None and cfg.rope_scaling.rope_type == "llama3"
    assert cfg.eos_token_ids == (128001, 128008, 128009)


@pytest.mark.parametrize("name", ["qwen2.5-0.5b", "qwen3-0.6b", "llama-150m", "gemma-2-9b", "gemma-3-4b", "phi-3-mini",
                                  "gpt-oss-20b"])
def test_preset_param_count_matches_transformers(name):
    """Build the preset in transformers on the meta device: same parameter count as ours."""
    hf_oracle.skip_unless_available()
    model_type = {"LlamaForCausalLM": "llama", "Qwen2ForCausalLM": "qwen2", "Qwen3ForCausalLM": "qwen3",
                  "Gemma2ForCausalLM": "gemma2", "Gemma3ForCausalLM": "gemma3_text", "Phi3ForCausalLM": "phi3",
                  "GptOssForCausalLM": "gpt_oss"}[
        PRESETS[name]["architectures"][0]]
    assert hf_oracle.count_parameters(model_type, preset_hf_dict(name)) == preset_config(name).num_params


def test_unknown_preset_lists_names():
    with pytest.raises(ValueError, match="unknown model preset 'llama-9000'.*llama-2-7b.*qwen2.5-7b"):
        preset_config("llama-9000")
    d = preset_hf_dict("llama-150m")
    d["vocab_size"] = 1
    assert PRESETS["llama-150m"]["vocab_size"] == 32000
