"""The sharding layer without devices: the logical-axis table, validation, the HLO collective counter, and
the sharded step cross-lowered for CUDA on an abstract GPU mesh.

Sharded execution (8 simulated devices, one subprocess) is in ``test_tensor_parallel.py``.
"""

from __future__ import annotations

import jax
import pytest
from jax.sharding import PartitionSpec as P

import sharding
from jaxinfer.config.model import ModelConfig
from jaxinfer.config.presets import preset_config
from jaxinfer.model.sharding_plan import ShardingPlan, validate
from jaxinfer.model.weights import ParamSpec, param_specs
from sharding import hlo, rules

ALL = ("expert", "tensor")


def test_every_logical_axis_has_a_row():
    from jaxinfer.model.weights import LOGICAL_AXES

    assert set(LOGICAL_AXES) == set(rules.LOGICAL_AXIS_RULES)
    for cfg in (preset_config("qwen2.5-7b"), preset_config("qwen2-57b-a14b"), preset_config("qwen3-30b-a3b")):
        for spec in jax.tree.leaves(param_specs(cfg), is_leaf=lambda x: isinstance(x, ParamSpec)):
            rules.partition_spec(spec.logical_axes)  # raises KeyError on a missing row


def test_megatron_layout():
    """q/k/v and gate/up column-parallel, o and down row-parallel, vocab-parallel embedding and head."""
    layer = param_specs(preset_config("qwen2.5-7b"))["layers"][0]
    spec = {k: rules.partition_spec(s.logical_axes) for k, s in layer.items()}
    for column in ("wq", "wk", "wv", "w_gate", "w_up"):
        assert spec[column] == P(None, ALL), column
    for row in ("wo", "w_down"):
        assert spec[row] == P(ALL, None), row
    assert spec["bq"] == P(ALL) and spec["attn_norm"] == P(None)
    top = param_specs(preset_config("qwen2.5-7b"))
    assert rules.partition_spec(top["embed"].logical_axes) == P(ALL, None)
    assert rules.partition_spec(top["lm_head"].logical_axes) == P(None, ALL)
    assert rules.partition_spec(rules.KV_CACHE_AXES) == P(None, None, ALL, None)


def test_moe_layout():
    layer = param_specs(preset_config("qwen2-57b-a14b"))["layers"][0]
    spec = {k: rules.partition_spec(s.logical_axes) for k, s in layer.items()}
    assert spec["router"] == P(None, None)  # every device routes every token
    assert spec["expert_w_gate"] == spec["expert_w_up"] == P("expert", None, "tensor")
    assert spec["expert_w_down"] == P("expert", "tensor", None)
    assert spec["shared_w_gate"] == P(None, ALL) and spec["shared_w_down"] == P(ALL, None)
    assert spec["shared_gate"] == P(None, None)


def test_kv_heads_replicated_up_to_the_device_count():
    cfg = preset_config("qwen2.5-7b")  # 28 query heads, 4 KV heads
    assert rules.kv_heads_on_devices(cfg.num_kv_heads, 2) == 4
    assert rules.kv_heads_on_devices(cfg.num_kv_heads, 4) == 4
    moe = preset_config("qwen3-30b-a3b")  # 32 query heads, 4 KV heads
    validate(moe, 8)
    assert rules.kv_heads_on_devices(moe.num_kv_heads, 8) == 8
    from jax.sharding import AbstractMesh, AxisType

    mesh = AbstractMesh((1, 8), ("expert", "tensor"), axis_types=(AxisType.Auto, AxisType.Auto))
    plan = ShardingPlan.create(moe, mesh)
    assert plan.cfg.num_kv_heads == 8 and plan.source_cfg == moe and plan.kv_head_repeats == 2


def _tiny(**kw):
    d = dict(architecture="llama", vocab_size=256, hidden_size=64, intermediate_size=128, num_layers=2,
             num_heads=4, num_kv_heads=2, head_dim=16)
    d.update(kw)
    return ModelConfig(**d)


MOE = dict(architecture="mixtral", num_experts=8, num_experts_per_tok=2, moe_intermediate_size=128)


@pytest.mark.parametrize("cfg, tp, ep, match", [
    (_tiny(), 3, 1, r"num_attention_heads=4 is not divisible by tensor_parallel_size=3.*1, 2, 4"),
    (_tiny(), 8, 1, "num_attention_heads=4 is not divisible"),
    (_tiny(num_heads=12, num_kv_heads=4), 6, 1, "num_key_value_heads=4 and tensor_parallel_size=6"),
    (_tiny(), 2, 2, "expert parallelism .* this llama model is dense"),
    (_tiny(), 4, 3, "expert_parallel_size=3 must divide tensor_parallel_size=4"),
    (_tiny(), 0, 1, "tensor_parallel_size must be a positive int"),
    (_tiny(), 2.0, 1, "tensor_parallel_size must be a positive int"),
    (_tiny(vocab_size=255), 2, 1, None),  # padded to 256 (test_odd_vocabulary_is_padded_not_refused)
    (_tiny(intermediate_size=130), 4, 1, r"intermediate_size=130 cannot be split 4 ways.*that do: 1, 2, 5, 10, 13, 26\)$"),
    (_tiny(**MOE), 4, 4, None),
    (_tiny(**dict(MOE, num_experts=6)), 4, 4, "num_experts=6 cannot be split 4 ways"),
    (_tiny(**dict(MOE, moe_intermediate_size=18)), 4, 1, "moe_intermediate_size=18 cannot be split 4 ways"),
    (_tiny(**dict(MOE, moe_intermediate_size=18)), 4, 2, None),  # experts 2 ways, each expert's FFN 2 ways
    (_tiny(**dict(MOE, moe_intermediate_size=21)), 4, 2, "moe_intermediate_size=21 cannot be split 2 ways"),
    (_tiny(**dict(MOE, moe_intermediate_size=21)), 4, 4, None),  # whole experts per device
])
def test_validation(cfg, tp, ep, match):
    if match is None:
        validate(cfg, tp, ep)
    else:
        with pytest.raises(ValueError, match=match):
            validate(cfg, tp, ep)


def test_generic_validation_takes_plain_sizes():
    """sharding.rules.validate knows no model config: head counts as ints, other dims as (name, size, axis)."""
    rules.validate(4, 1, num_heads=8, num_kv_heads=2, dims=[("vocab_size", 256, "vocab")])
    with pytest.raises(ValueError, match="num_attention_heads=6 is not divisible by tensor_parallel_size=4"):
        rules.validate(4, num_heads=6, num_kv_heads=2)
    with pytest.raises(ValueError, match="num_key_value_heads=3 and tensor_parallel_size=2"):
        rules.validate(2, num_heads=6, num_kv_heads=3)
    with pytest.raises(ValueError, match=r"width=6 cannot be split 4 ways .*expert_parallel_size=4"):
        rules.validate(4, 4, num_heads=4, num_kv_heads=4, dims=[("width", 6, "experts")])
    rules.validate(4, 2, num_heads=4, num_kv_heads=4, dims=[("width", 6, "experts"), ("width", 6, "expert_mlp")])
    with pytest.raises(ValueError, match="expert_parallel_size=3 must divide"):
        rules.validate(4, 3, num_heads=4, num_kv_heads=4)


def test_too_many_devices_fails_before_allocating():
    before = len(jax.live_arrays())
    n = jax.device_count()
    with pytest.raises(ValueError, match=rf"tensor_parallel_size={n * 2} needs {n * 2} devices, but only {n}.*XLA_FLAGS"):
        sharding.make_mesh(n * 2)
    assert len(jax.live_arrays()) == before


def test_single_device_plan_is_the_unsharded_model():
    cfg = _tiny()
    plan = ShardingPlan.create(cfg, sharding.make_mesh(1))
    assert plan.cfg == cfg and plan.kv_head_repeats == 1
    assert plan.weight_bytes_per_device() == cfg.num_params * 4


HLO = """
ENTRY %main {
  %all-reduce.2 = f32[1,64]{1,0} all-reduce(%x), channel_id=5, metadata={op_name="jit(step)/embed/gather"}
  %all-reduce-start.3 = (bf16[4,64]{1,0}, f32[8]{0}) all-reduce-start(%a, %b), metadata={op_name="jit(step)/layer0/dot_general"}
  %all-reduce-done.3 = (bf16[4,64]{1,0}, f32[8]{0}) all-reduce-done(%all-reduce-start.3)
  %psum.14 = f32[1,64]{1,0} all-reduce(%s), metadata={op_name="jit(step)/layer0/shard_map/psum"}
  %all-gather = f32[1,256]{0,1} all-gather(%y), dimensions={1}
  %fusion = f32[1,64]{1,0} fusion(%all-reduce.2), kind=kLoop, metadata={op_name="jit(step)/layer1/add"}
}
"""


def test_collective_counter():
    found = hlo.collectives(HLO)
    assert [(c.kind, c.bytes, c.elements, c.scope) for c in found] == [
        ("all-reduce", 256, 64, "embed"), ("all-reduce", 4 * 64 * 2 + 32, 4 * 64 + 8, "layer0"),
        ("all-reduce", 256, 64, "layer0"), ("all-gather", 1024, 256, ""),
    ]
    assert hlo.count_collectives(HLO) == {"all-reduce": 3, "all-gather": 1}
    assert hlo.collectives_by_scope(HLO) == {"embed": {"all-reduce": 1}, "layer0": {"all-reduce": 2},
                                             "": {"all-gather": 1}}


@pytest.mark.parametrize("arch, tp, ep, impl", [("llama_gqa", 4, 1, "auto"), ("qwen3_moe", 4, 4, "tiles"),
                                                ("qwen3_moe", 4, 2, "ragged_dot")])
def test_sharded_step_cross_lowers_for_cuda(arch, tp, ep, impl, hf_checkpoints):
    """The sharded decode step with the Pallas attention kernel under shard_map lowers for CUDA (a 4-GPU
    abstract mesh: no device needed), so GPU lowering errors fail here."""
    import jax.numpy as jnp
    from jax._src.mesh import AbstractDevice
    from jax.sharding import AbstractMesh, AxisType

    from jaxinfer.model.attention import get_attention_fn
    from jaxinfer.model.decoder import forward
    from jaxinfer.runner.batch_packing import abstract_batch
    from jaxinfer.runner.shape_plan import StepShape

    cfg = ModelConfig.from_pretrained(hf_checkpoints[arch])
    mesh = AbstractMesh((ep, tp // ep), ("expert", "tensor"), axis_types=(AxisType.Auto, AxisType.Auto),
                        abstract_device=AbstractDevice("NVIDIA H200", 132, "gpu"))
    plan = ShardingPlan.create(cfg, mesh)
    batch = abstract_batch(StepShape(4, 4, 4, 1), 4, sharding=plan.batch_sharding)
    attn = get_attention_fn("pallas", query_width=1, sliding_window=None, interpret=False)
    step = jax.jit(lambda p, c, b: forward(p, c, b, plan.cfg, plan.shard_attention(attn), moe_fn=plan.moe_fn(impl)),
                   out_shardings=(plan.logits_sharding, plan.kv_cache_sharding), donate_argnums=1)
    with jax.sharding.use_abstract_mesh(mesh):
        lowered = step.trace(plan.abstract_params(jnp.bfloat16), plan.abstract_kv_cache(16, 16, jnp.bfloat16),
                             batch).lower(lowering_platforms=("cuda",))
    text = lowered.as_text()
    assert "custom_call @__gpu$xla.gpu.triton" in text  # the kernel, lowered by Triton for the GPU
    # per layer: attention under shard_map, and for an MoE model the MoE block (its psum an explicit all_reduce)
    assert text.count("sdy.manual_computation") == cfg.num_layers * (2 if cfg.is_moe else 1)
    assert text.count("all_reduce") == (cfg.num_layers if cfg.is_moe else 0)


@pytest.mark.parametrize("vocab, shards, padding", [
    (256, 2, 0), (255, 2, 1), (333, 2, 51), (333, 4, 51), (389, 8, 59), (32001, 2, 63), (32000, 8, 0),
    (151936, 8, 0), (50257, 4, 47), (65, 128, 63),  # 128 devices: padded to a multiple of 128, not of 64
])
def test_odd_vocabulary_is_padded_not_refused(vocab, shards, padding):
    from jax.sharding import AbstractMesh, AxisType

    from jaxinfer.model.sharding_plan import vocab_padding

    assert vocab_padding(vocab, shards) == padding
    assert (vocab + padding) % shards == 0
    if shards <= 8:
        mesh = AbstractMesh((1, shards), ("expert", "tensor"), axis_types=(AxisType.Auto, AxisType.Auto))
        plan = ShardingPlan.create(_tiny(vocab_size=vocab, num_heads=8, num_kv_heads=8), mesh)
        assert plan.cfg.vocab_padding == padding and plan.cfg.vocab_size == vocab  # what the user sees: unchanged
        assert plan.source_cfg.vocab_padding == 0
        assert plan.abstract_params()["embed"].shape == (vocab + padding, 64)
