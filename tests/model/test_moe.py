"""Mixture-of-experts models: config parsing, stacked-expert loading, presets, and the routed-expert compute.

End-to-end parity with HF transformers (prefill logits within 1e-4, 32 greedy tokens through ``LLM``) runs in
``test_hf_parity.py``, which covers every arch of ``hf_oracle.ARCHS`` (Mixtral, Qwen2-MoE, Qwen3-MoE
included). Here: the pieces, against HF's own tensors and a dense reference written in the test.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from safetensors import safe_open

from jaxinfer.config.model import ModelConfig
from jaxinfer.config.presets import preset_config, preset_hf_dict
from jaxinfer.loading.loader import load_hf_params, load_hf_params_host, restore_params, save_params
from jaxinfer.model import moe
from jaxinfer.model.weights import abstract_params, get_at_path, hf_name_table, init_random_params, logical_axes
from tests import hf_oracle

MOE_ARCHS = ("mixtral", "qwen2_moe", "qwen3_moe")


# ------------------------------------------------------------------------------------------------ config

def _qwen3_moe_dict(**overrides):
    d = dict(architectures=["Qwen3MoeForCausalLM"], vocab_size=256, hidden_size=64, intermediate_size=128,
             num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
             moe_intermediate_size=32, num_experts_per_tok=2, norm_topk_prob=True)
    d.update(overrides)
    return d


def test_expert_count_accepts_hub_and_transformers5_spellings():
    hub = ModelConfig.from_hf_dict(_qwen3_moe_dict(num_experts=8))
    tf5 = ModelConfig.from_hf_dict(_qwen3_moe_dict(num_local_experts=8))
    assert hub == tf5 and hub.num_experts == 8 and hub.qk_norm and hub.norm_topk_prob


@pytest.mark.parametrize("overrides, match", [
    (dict(num_experts=8, decoder_sparse_step=2), "decoder_sparse_step"),
    (dict(num_experts=8, mlp_only_layers=[1]), "mlp_only_layers"),
    (dict(num_experts=8, use_sliding_window=True, sliding_window=32), "use_sliding_window"),
])
def test_unsupported_moe_layouts_are_refused(overrides, match):
    with pytest.raises(NotImplementedError, match=match):
        ModelConfig.from_hf_dict(_qwen3_moe_dict(**overrides))


def test_bad_expert_counts_are_refused():
    with pytest.raises(ValueError, match="num_experts_per_tok"):
        ModelConfig.from_hf_dict(_qwen3_moe_dict(num_experts=2, num_experts_per_tok=3))
    with pytest.raises(ValueError, match="num_experts"):
        ModelConfig.from_hf_dict(_qwen3_moe_dict())  # neither num_experts nor num_local_experts


@pytest.mark.parametrize("name", MOE_ARCHS)
def test_config_round_trips_and_counts_params_like_transformers(name, hf_checkpoints, hf_models):
    cfg = ModelConfig.from_pretrained(hf_checkpoints[name])
    assert cfg.is_moe
    assert ModelConfig.from_hf_dict(cfg.to_hf_dict()) == cfg
    assert cfg.num_params == hf_oracle.num_parameters(hf_models[name])
    assert sum(int(np.prod(a.shape)) for a in jax.tree.leaves(abstract_params(cfg))) == cfg.num_params
    expected = {"mixtral": (2, True, 0), "qwen2_moe": (2, False, 96), "qwen3_moe": (4, True, 0)}[name]
    assert (cfg.num_experts_per_tok, cfg.norm_topk_prob, cfg.shared_expert_intermediate_size) == expected


# ------------------------------------------------------------------------------------------------ presets

PUBLISHED = {  # (total, active) parameters from the model cards
    "mixtral-8x7b": (46.7e9, 12.9e9),
    "qwen3-30b-a3b": (30.5e9, 3.3e9),
    "qwen2-57b-a14b": (57.4e9, 14.2e9),
}


@pytest.mark.parametrize("name", sorted(PUBLISHED))
def test_moe_presets_have_published_sizes(name):
    cfg = preset_config(name)
    total, active = PUBLISHED[name]
    assert abs(cfg.num_params / total - 1) < 0.02
    assert abs(cfg.num_active_params / active - 1) < 0.03


@pytest.mark.parametrize("name", sorted(PUBLISHED))
def test_moe_preset_param_count_matches_transformers(name):
    hf_oracle.skip_unless_available()
    model_type = {"MixtralForCausalLM": "mixtral", "Qwen2MoeForCausalLM": "qwen2_moe",
                  "Qwen3MoeForCausalLM": "qwen3_moe"}[preset_hf_dict(name)["architectures"][0]]
    assert hf_oracle.count_parameters(model_type, preset_hf_dict(name)) == preset_config(name).num_params


def test_small_moe_and_dense_twin_have_equal_total_params():
    moe_cfg, dense = preset_config("moe-240m"), preset_config("moe-240m-dense")
    assert moe_cfg.is_moe and not dense.is_moe
    router = moe_cfg.num_layers * moe_cfg.hidden_size * moe_cfg.num_experts
    assert dense.num_params + router == moe_cfg.num_params
    assert moe_cfg.num_active_params < moe_cfg.num_params / 2


# ------------------------------------------------------------------------------------------------ loading

@pytest.mark.parametrize("name", MOE_ARCHS)
def test_stacked_experts_equal_the_per_expert_tensors(name, hf_checkpoints):
    path = hf_checkpoints[name]
    cfg = ModelConfig.from_pretrained(path)
    params = load_hf_params(path, cfg, jnp.float32)
    host = load_hf_params_host(path, cfg, jnp.float32)
    table = hf_name_table(cfg)
    with safe_open(str(path / "model.safetensors"), framework="numpy") as f:
        assert set(table) == set(f.keys())
        for hf_name, (where, transpose) in table.items():
            ref = f.get_tensor(hf_name)
            ref = ref.T if transpose else ref
            np.testing.assert_array_equal(np.asarray(get_at_path(params, where)), ref, err_msg=hf_name)
            np.testing.assert_array_equal(get_at_path(host, where), ref, err_msg=hf_name)
    layer = params["layers"][1]
    assert layer["expert_w_gate"].shape == (cfg.num_experts, cfg.hidden_size, cfg.moe_intermediate_size)
    assert layer["expert_w_down"].shape == (cfg.num_experts, cfg.moe_intermediate_size, cfg.hidden_size)
    assert ("shared_gate" in layer) == (name == "qwen2_moe") and "w_gate" not in layer
    assert logical_axes(cfg)["layers"][0]["expert_w_up"] == ("experts", "embed", "expert_mlp")


def test_moe_orbax_round_trip(hf_checkpoints, tmp_path):
    path = hf_checkpoints["qwen2_moe"]
    cfg = ModelConfig.from_pretrained(path)
    params = load_hf_params(path, cfg, jnp.float32)
    save_params(params, tmp_path / "conv", cfg)
    cfg2, restored = restore_params(tmp_path / "conv")
    assert cfg2 == cfg
    jax.tree.map(np.testing.assert_array_equal, params, restored)


# ------------------------------------------------------------------------------------------ routed experts

def _layer(cfg, seed):
    return init_random_params(cfg, jax.random.key(seed), jnp.float32, std=0.2)["layers"][0]


def _dense_reference(lp, x, valid, cfg):
    """Every expert on every token, weighted by a dense [T, E] routing matrix (the definition, slowly)."""
    probs = jax.nn.softmax(x @ lp["router"], axis=-1)
    top_w, top_i = jax.lax.top_k(probs, cfg.num_experts_per_tok)
    if cfg.norm_topk_prob:
        top_w = top_w / top_w.sum(-1, keepdims=True)
    dense_w = jnp.zeros_like(probs).at[jnp.arange(x.shape[0])[:, None], top_i].set(top_w) * valid[:, None]
    h = jax.nn.silu(jnp.einsum("th,ehf->tef", x, lp["expert_w_gate"])) * jnp.einsum("th,ehf->tef", x, lp["expert_w_up"])
    out = jnp.einsum("tef,efh,te->th", h, lp["expert_w_down"], dense_w)
    if "shared_gate" in lp:
        shared = jax.nn.silu(x @ lp["shared_w_gate"]) * (x @ lp["shared_w_up"]) @ lp["shared_w_down"]
        out = out + jax.nn.sigmoid(x @ lp["shared_gate"]) * shared
    return out


MOE_CFGS = {
    "mixtral_like": ModelConfig(architecture="mixtral", vocab_size=32, hidden_size=16, intermediate_size=24,
                                num_layers=1, num_heads=2, num_kv_heads=2, head_dim=8, num_experts=8,
                                num_experts_per_tok=2, moe_intermediate_size=24, norm_topk_prob=True),
    "qwen2_moe_like": ModelConfig(architecture="qwen2_moe", vocab_size=32, hidden_size=16, intermediate_size=24,
                                  num_layers=1, num_heads=2, num_kv_heads=2, head_dim=8, num_experts=6,
                                  num_experts_per_tok=3, moe_intermediate_size=12,
                                  shared_expert_intermediate_size=20),
}


@pytest.mark.parametrize("impl", ["tiles", "ragged_dot"])
@pytest.mark.parametrize("num_tokens", [1, 3, 16, 70])
@pytest.mark.parametrize("kind", sorted(MOE_CFGS))
def test_routed_experts_equal_dense_reference(kind, num_tokens, impl):
    cfg = MOE_CFGS[kind]
    lp = _layer(cfg, seed=num_tokens)
    x = jax.random.normal(jax.random.key(100 + num_tokens), (num_tokens, cfg.hidden_size))
    valid = jnp.arange(num_tokens) < max(1, num_tokens - 2)  # trailing padding tokens
    got = jax.jit(functools.partial(moe.moe_block, cfg=cfg, impl=impl))(lp, x, valid)
    np.testing.assert_allclose(np.asarray(got), np.asarray(_dense_reference(lp, x, valid, cfg)), atol=2e-5, rtol=0)


@pytest.mark.parametrize("impl", ["tiles", "ragged_dot"])
def test_expert_and_ffn_shards_sum_to_the_whole(impl):
    """What expert parallelism (experts split, offsets) and TP inside experts (FFN split) compute per device
    sums to the unsharded block (the shared expert is split with the FFN)."""
    cfg = MOE_CFGS["qwen2_moe_like"]
    lp = _layer(cfg, seed=7)
    x = jax.random.normal(jax.random.key(8), (9, cfg.hidden_size))
    valid = jnp.ones(9, bool)
    whole = moe.moe_block(lp, x, valid, cfg, impl=impl)
    total = 0.0
    for device in range(4):  # mesh (expert 2, tensor 2): experts [3g, 3g + 3), FFN half h, shared quarter
        g, h = divmod(device, 2)
        e, f, s = slice(3 * g, 3 * g + 3), slice(6 * h, 6 * h + 6), slice(5 * device, 5 * device + 5)
        part = dict(lp, expert_w_gate=lp["expert_w_gate"][e, :, f], expert_w_up=lp["expert_w_up"][e, :, f],
                    expert_w_down=lp["expert_w_down"][e, f], shared_w_gate=lp["shared_w_gate"][:, s],
                    shared_w_up=lp["shared_w_up"][:, s], shared_w_down=lp["shared_w_down"][s])
        total = total + moe.moe_block(part, x, valid, cfg, expert_offset=3 * g, impl=impl)
    np.testing.assert_allclose(np.asarray(total), np.asarray(whole), atol=2e-5, rtol=0)


def test_decode_computes_only_the_routed_experts():
    """Batch 1: poison every expert the token is not routed to with NaN; the output stays finite and equal
    (a formulation that touched them, a dense loop or masked products, would turn NaN)."""
    cfg = MOE_CFGS["mixtral_like"]
    lp = _layer(cfg, seed=3)
    x = jax.random.normal(jax.random.key(4), (1, cfg.hidden_size))
    valid = jnp.ones(1, bool)
    _, ids = moe.route(x, lp["router"], cfg, valid)
    unused = np.setdiff1d(np.arange(cfg.num_experts), np.asarray(ids))
    assert len(unused) == cfg.num_experts - cfg.num_experts_per_tok
    poisoned = dict(lp, **{k: lp[k].at[unused].set(jnp.nan) for k in ("expert_w_gate", "expert_w_up", "expert_w_down")})
    clean = moe.moe_block(lp, x, valid, cfg, impl="tiles")
    got = jax.jit(functools.partial(moe.moe_block, cfg=cfg))(poisoned, x, valid)  # "auto" on this CPU
    np.testing.assert_array_equal(np.asarray(got), np.asarray(clean))


def test_padding_tokens_touch_no_expert():
    cfg = MOE_CFGS["mixtral_like"]
    lp = _layer(cfg, seed=5)
    x = jax.random.normal(jax.random.key(6), (4, cfg.hidden_size))
    valid = jnp.array([True, False, False, False])
    _, ids = moe.route(x[:1], lp["router"], cfg, valid[:1])
    unused = np.setdiff1d(np.arange(cfg.num_experts), np.asarray(ids))
    poisoned = dict(lp, **{k: lp[k].at[unused].set(jnp.nan) for k in ("expert_w_gate", "expert_w_up", "expert_w_down")})
    got = moe.moe_block(poisoned, x, valid, cfg, impl="tiles")
    assert np.isfinite(np.asarray(got)).all() and not np.asarray(got[1:]).any()


def test_formulation_choice_is_explicit():
    assert moe.choose_impl(64, 8, "cpu") == moe.TILES
    assert moe.choose_impl(2, 8, "gpu") == moe.TILES
    assert moe.choose_impl(64, 8, "gpu") == moe.RAGGED_DOT
    assert [moe.tile_rows(p, 8) for p in (2, 8, 16, 64, 100, 10**6)] == [1, 1, 2, 8, 8, moe.MAX_TILE_ROWS]
    with pytest.raises(ValueError, match="moe impl"):
        moe.moe_block(_layer(MOE_CFGS["mixtral_like"], 0), jnp.zeros((1, 16)), jnp.ones(1, bool),
                      MOE_CFGS["mixtral_like"], impl="dense")


@pytest.mark.parametrize("num_tokens", [1, 16])
def test_unstacked_experts_compute_the_same(num_tokens):
    """One buffer per expert (lax.switch over them) equals the stacked arrays; only routed experts are run."""
    cfg = MOE_CFGS["qwen2_moe_like"]
    lp = _layer(cfg, seed=11)
    x = jax.random.normal(jax.random.key(12), (num_tokens, cfg.hidden_size))
    valid = jnp.ones(num_tokens, bool)
    unstacked = moe.unstack_experts({"layers": [lp]})["layers"][0]
    assert isinstance(unstacked["expert_w_up"], tuple) and len(unstacked["expert_w_up"]) == cfg.num_experts
    block = jax.jit(functools.partial(moe.moe_block, cfg=cfg))
    got = block(unstacked, x, valid)
    np.testing.assert_allclose(np.asarray(got), np.asarray(moe.moe_block(lp, x, valid, cfg)), atol=1e-5, rtol=0)
    if num_tokens == 1:
        _, ids = moe.route(x, lp["router"], cfg, valid)
        poisoned = {k: (tuple(w if i in np.asarray(ids) else jnp.full_like(w, jnp.nan) for i, w in enumerate(v))
                        if k.startswith("expert_w") else v) for k, v in unstacked.items()}
        np.testing.assert_array_equal(np.asarray(block(poisoned, x, valid)), np.asarray(got))
    with pytest.raises(ValueError, match="stacked"):
        moe.moe_block(unstacked, x, valid, cfg, impl="ragged_dot")
