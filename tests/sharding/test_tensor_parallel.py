"""Tensor and expert parallelism on 8 simulated CPU devices, against the unsharded model and HF transformers.

Every sharded run happens in ONE subprocess (``python -m tests.sharding.test_tensor_parallel SPEC OUT``) started with
``XLA_FLAGS=--xla_force_host_platform_device_count=8``: the device count is fixed when jax initialises and the
rest of the suite runs on one device. The worker computes and records; the tests here assert.

Per case (a checkpoint, a tensor-parallel size, an expert-parallel size, an attention backend) the worker runs
the pure layer the engine will run: ``model.forward`` over the paged cache, jitted with the plan's shardings
(params placed by ``ShardingPlan.place_params``, cache allocated sharded by KV head), on a ragged prefill of
three prompts (with padding tokens) and then 8 greedy decode steps of the three together (with a padded
sequence slot); the same on one device; and the collectives of the compiled decode step.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from tests import hf_oracle

# name -> (checkpoint, tensor_parallel_size, expert_parallel_size, attention backend)
CASES = {
    "llama_gqa-tp2": ("llama_gqa", 2, 1, "xla"),
    "llama_gqa-tp4": ("llama_gqa", 4, 1, "xla"),  # 2 KV heads on 4 devices: each held by two
    "llama_gqa-tp4-pallas": ("llama_gqa", 4, 1, "pallas"),  # the Pallas kernel under shard_map (interpret)
    "llama_mqa_tied-tp4": ("llama_mqa_tied", 4, 1, "xla"),  # MQA; tied, vocab-parallel embedding = LM head
    "llama_linear_rope-tp4": ("llama_linear_rope", 4, 1, "xla"),  # 4 KV heads, one per device
    "mistral_window-tp4": ("mistral_window", 4, 1, "xla"),
    "qwen2-tp2": ("qwen2", 2, 1, "xla"),  # q/k/v biases split with their heads
    "qwen3_head_dim-tp4": ("qwen3_head_dim", 4, 1, "xla"),  # q/k norm on replicated KV heads
    "llama_8heads-tp8": ("llama_8heads", 8, 1, "xla"),
    "mixtral-tp2": ("mixtral", 2, 1, "xla"),  # every expert's FFN split in two
    "mixtral-tp8": ("mixtral", 8, 1, "xla"),
    "mixtral-ep8": ("mixtral", 8, 8, "xla"),  # one expert per device, attention tensor-parallel over 8
    "mixtral-ep2-tp4": ("mixtral", 4, 2, "xla"),  # 2 expert groups x each expert split in 2
    "qwen2_moe-tp4": ("qwen2_moe", 4, 1, "xla"),  # + the shared expert split 4 ways
    "qwen2_moe-ep4": ("qwen2_moe", 4, 4, "xla"),
    "qwen3_moe-ep8": ("qwen3_moe", 8, 8, "xla"),  # MQA: the one KV head on all 8 devices; 2 experts each
    "qwen3_moe-tp2": ("qwen3_moe", 2, 1, "xla"),
    "gemma2-tp2": ("gemma2", 2, 1, "xla"),  # soft-capping, per-layer windows, sandwich norms; vocab 301 padded
    "gemma3-tp2": ("gemma3", 2, 1, "xla"),  # MQA: the KV head on both devices; local / global RoPE
    "phi3-tp4": ("phi3", 4, 1, "xla"),  # the fused qkv / gate_up split at load, then split again by head
    # sinks split with the query heads; each expert's FFN (and its gate / up biases) split in two, the down
    # bias added by one of the two; vocab 257 padded
    "gpt_oss-tp2": ("gpt_oss", 2, 1, "xla"),
    "gpt_oss-ep2-tp4": ("gpt_oss", 4, 2, "pallas"),  # 2 experts per group, each split in 2; sinks in the kernel
    # vocabularies the split does not divide: embedding and LM head padded per the plan, padding never seen
    "llama_vocab333-tp2": ("llama_vocab333", 2, 1, "xla"),
    "llama_vocab333-tp4": ("llama_vocab333", 4, 1, "xla"),
    "llama_vocab333-tp2-int8-head": ("llama_vocab333", 2, 1, "xla", "int8"),  # quantized LM head padded too
    "qwen2_vocab389_tied-tp2": ("qwen2_vocab389_tied", 2, 1, "xla"),  # tied: the padded embedding is the head
    "qwen2_vocab389_tied-tp4": ("qwen2_vocab389_tied", 4, 1, "xla"),
    "llama_vocab32001_mqa-tp2": ("llama_vocab32001_mqa", 2, 1, "xla"),
    "llama_vocab32001_mqa-tp4": ("llama_vocab32001_mqa", 4, 1, "xla"),
    "mixtral_vocab333-ep2-tp4": ("mixtral_vocab333", 4, 2, "xla"),  # an expert-parallel mesh pads the same way
}
BIG = ("qwen2.5-7b", 4)  # preset lowered abstractly (nothing materialised) with a 4-device mesh
PROMPT_LENGTHS = (23, 40, 5)
BLOCKS = ([5, 2], [7, 1, 9], [3])  # non-contiguous; room for 8 more tokens each
NUM_DECODE = 8
BLOCK_SIZE = 16
NUM_BLOCKS = 12


def _prompts() -> list[list[int]]:
    rng = np.random.default_rng(11)
    return [rng.integers(0, 256, size=n).tolist() for n in PROMPT_LENGTHS]


# --------------------------------------------------------------------------------------------- the worker

def _worker(spec_path: str, out_dir: str) -> None:
    import jax
    import jax.numpy as jnp

    import sharding
    from jaxinfer.config.model import ModelConfig
    from jaxinfer.loading.loader import load_hf_params
    from jaxinfer.model.attention import get_attention_fn
    from jaxinfer.model.decoder import forward
    from jaxinfer.model.kv_cache import allocate_kv_cache
    from jaxinfer.model.sharding_plan import ShardingPlan
    from jaxinfer.quantization.quantized_weight import quantize_params
    from jaxinfer.runner.batch_packing import WorkItem, pack
    from jaxinfer.runner.shape_plan import ShapePlan, StepShape

    assert jax.device_count() == 8, jax.devices()
    spec = json.loads(Path(spec_path).read_text())
    prompts = _prompts()
    arrays, report = {}, {"cases": {}}

    def compile_step(cfg, shape, backend, plan, args):
        attn = get_attention_fn(backend, query_width=shape.query_width or None, sliding_window=cfg.sliding_window,
                                interpret=True)
        if plan is None:
            fn = jax.jit(lambda p, c, b: forward(p, c, b, cfg, attn), donate_argnums=1)
        else:
            fn = jax.jit(lambda p, c, b: forward(p, c, b, plan.cfg, plan.shard_attention(attn), moe_fn=plan.moe_fn(),
                                                 gather_logits=plan.gather_logits),
                         in_shardings=(jax.tree.map(lambda a: a.sharding, args[0]), plan.kv_cache_sharding,
                                       plan.batch_sharding),  # as placed (quantized leaves have their own)
                         out_shardings=(plan.logits_sharding, plan.kv_cache_sharding), donate_argnums=1)
        return fn.lower(*args).compile()

    def run(cfg, params, cache, backend, plan=None):
        """Prefill, then greedy decodes: (logits per step, tokens per step, decode-step HLO text)."""
        tokens = [list(p) for p in prompts]
        logits_out, executables = [], {}
        for step in range(1 + NUM_DECODE):
            if step == 0:
                items = [WorkItem(b, 0, p, len(p)) for b, p in zip(BLOCKS, prompts)]
            else:
                items = [WorkItem(b, len(t) - 1, [t[-1]], 1) for b, t in zip(BLOCKS, tokens)]
            if step == 0:  # the prefill returns every position's logits: more rows than the engine's plan has
                shape = StepShape(num_tokens=128, num_seqs=4, num_logits=128, query_width=None)
            else:
                shape = ShapePlan(max_num_seqs=4, max_num_batched_tokens=128).shape_for(
                    [len(i.tokens) for i in items], sum(i.num_logits for i in items))
            batch, _ = pack(items, BLOCK_SIZE, shape, 4)
            if shape not in executables:
                executables[shape] = compile_step(cfg, shape, backend, plan, (params, cache, batch))
            logits, cache = executables[shape](params, cache, batch)
            logits = np.asarray(logits)[: sum(i.num_logits for i in items)]
            logits_out.append(logits)
            last = np.cumsum([i.num_logits for i in items]) - 1
            for t, row in zip(tokens, last):
                t.append(int(np.argmax(logits[row])))
        return logits_out, [t[len(p):] for t, p in zip(tokens, prompts)], executables[shape].as_text()

    def load(path, cfg, quant, shardings=None):
        params = load_hf_params(path, cfg, jnp.float32, shardings=shardings)
        return params if quant is None else quantize_params(params, quant, include_lm_head=True)

    references = {}
    for name in spec["cases"]:
        arch, tp, ep, backend, *quant = CASES[name]
        quant = quant[0] if quant else None
        path = spec["checkpoints"][arch]
        cfg = ModelConfig.from_pretrained(path)
        if (arch, quant) not in references:  # one device, XLA attention
            cache = allocate_kv_cache(cfg, NUM_BLOCKS, BLOCK_SIZE, jnp.float32)
            references[arch, quant] = run(cfg, load(path, cfg, quant), cache, "xla")
        plan = ShardingPlan.create(cfg, sharding.make_mesh(tp, ep))
        params = plan.place_params(load(path, cfg, quant, plan.load_shardings()))
        shard_shapes = {str(s.sharding.shard_shape(s.shape)) for s in jax.tree.leaves(params["layers"][0])}
        logits, tokens, hlo = run(cfg, params, plan.allocate_kv_cache(NUM_BLOCKS, BLOCK_SIZE, jnp.float32),
                                  backend, plan)
        ref_logits, ref_tokens, _ = references[arch, quant]
        for i, (got, want) in enumerate(zip(logits, ref_logits)):
            arrays[f"{name}/logits{i}"], arrays[f"{name}/ref_logits{i}"] = got, want
        report["cases"][name] = {
            "tokens": tokens, "ref_tokens": ref_tokens, "collectives": sharding.collectives_by_scope(hlo),
            "num_layers": cfg.num_layers, "kv_heads_on_devices": plan.cfg.num_kv_heads,
            "layer0_shard_shapes": sorted(shard_shapes), "vocab_padding": plan.cfg.vocab_padding,
            "head_shard_shape": list(jax.tree.leaves(params.get("lm_head", params["embed"]))[0].sharding.shard_shape(
                jax.tree.leaves(params.get("lm_head", params["embed"]))[0].shape)),
        }

    from jaxinfer.config.presets import preset_config
    from jaxinfer.runner.batch_packing import abstract_batch
    from jaxinfer.runner.shape_plan import StepShape

    if not spec["big"]:
        np.savez(Path(out_dir) / "arrays.npz", **arrays)
        (Path(out_dir) / "report.json").write_text(json.dumps(report))
        return

    cfg = preset_config(BIG[0])
    plan = ShardingPlan.create(cfg, sharding.make_mesh(BIG[1]))
    shape = StepShape(num_tokens=8, num_seqs=8, num_logits=8, query_width=1)
    batch = abstract_batch(shape, 64, sharding=plan.batch_sharding)
    attn = get_attention_fn("xla", query_width=1, sliding_window=None)
    step = jax.jit(lambda p, c, b: forward(p, c, b, plan.cfg, plan.shard_attention(attn), moe_fn=plan.moe_fn()),
                   out_shardings=(plan.logits_sharding, plan.kv_cache_sharding), donate_argnums=1)
    hlo = step.lower(plan.abstract_params(jnp.bfloat16), plan.abstract_kv_cache(512, BLOCK_SIZE, jnp.bfloat16),
                     batch).compile().as_text()
    report["big"] = {"collectives": sharding.collectives_by_scope(hlo), "num_layers": cfg.num_layers,
                     "sizes": [[c.kind, c.elements, c.scope] for c in sharding.hlo.collectives(hlo)],
                     "weight_bytes_per_device": plan.weight_bytes_per_device(jnp.bfloat16),
                     "weight_bytes": cfg.num_params * 2}
    np.savez(Path(out_dir) / "arrays.npz", **arrays)
    (Path(out_dir) / "report.json").write_text(json.dumps(report))


# ---------------------------------------------------------------------------------------------- the tests

@pytest.fixture(scope="module")
def checkpoints(hf_checkpoints, tmp_path_factory):
    extra = tmp_path_factory.mktemp("tp_ckpts")
    return {**hf_checkpoints, **{n: hf_oracle.build_checkpoint(n, extra) for n in hf_oracle.EXTRA_ARCHS}}


@pytest.fixture(scope="module")
def sharded(checkpoints, tmp_path_factory):
    """Run the worker once: (report dict, arrays)."""
    out = tmp_path_factory.mktemp("tp_out")
    spec = out / "spec.json"
    spec.write_text(json.dumps({"checkpoints": {k: str(v) for k, v in checkpoints.items()}, "cases": list(CASES),
                                "big": True}))
    env = dict(os.environ, JAX_PLATFORMS="cpu",
               XLA_FLAGS=(os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8").strip())
    root = Path(__file__).resolve().parents[2]
    env["PYTHONPATH"] = os.pathsep.join([str(root), env.get("PYTHONPATH", "")])
    proc = subprocess.run([sys.executable, "-m", "tests.sharding.test_tensor_parallel", str(spec), str(out)], cwd=root,
                          env=env, capture_output=True, text=True, timeout=1800)
    if proc.returncode:
        pytest.fail(f"sharded worker failed ({proc.returncode}):\n{proc.stderr[-6000:]}")
    return json.loads((out / "report.json").read_text()), dict(np.load(out / "arrays.npz"))


@pytest.fixture(scope="module")
def hf_reference(checkpoints, hf_models):
    """arch -> (prefill logits per prompt, 1 + NUM_DECODE greedy tokens per prompt) from transformers."""
    models = dict(hf_models)
    for name in hf_oracle.EXTRA_ARCHS:
        models[name] = hf_oracle.load_hf(checkpoints[name])
    out = {}
    for arch in {a for a, *_ in CASES.values()}:
        out[arch] = ([hf_oracle.hf_logits(models[arch], p) for p in _prompts()],
                     [hf_oracle.hf_greedy(models[arch], p, 1 + NUM_DECODE)[0] for p in _prompts()])
    return out


@pytest.mark.parametrize("case", sorted(CASES))
def test_sharded_logits_equal_unsharded(case, sharded):
    report, arrays = sharded
    r = report["cases"][case]
    for step in range(1 + NUM_DECODE):
        got, want = arrays[f"{case}/logits{step}"], arrays[f"{case}/ref_logits{step}"]
        np.testing.assert_allclose(got, want, atol=1e-4, rtol=0, err_msg=f"{case}, step {step}")
    assert r["tokens"] == r["ref_tokens"]


@pytest.mark.parametrize("case", sorted(c for c in CASES if len(CASES[c]) == 4))  # HF has no int8 LM head
def test_sharded_model_matches_hf(case, sharded, hf_reference):
    report, arrays = sharded
    arch = CASES[case][0]
    hf_logits, hf_tokens = hf_reference[arch]
    prefill = arrays[f"{case}/logits0"]
    starts = np.cumsum((0,) + PROMPT_LENGTHS)
    for i, want in enumerate(hf_logits):
        np.testing.assert_allclose(prefill[starts[i]:starts[i + 1]], want, atol=1e-4, rtol=0, err_msg=f"prompt {i}")
    assert report["cases"][case]["tokens"] == hf_tokens


def _unscoped_into_lm_head(collectives: dict) -> dict:
    """The sampled rows' logits all-gather is inserted by the partitioner at the step's output: jax 0.10.2 gives
    it no op_name (scope ""), jax 0.12 the op_name of the LM head matmul that produced the logits ("lm_head").
    Count what carries no scope under "lm_head", so both read the same (anything else unscoped still shows)."""
    out = {scope: dict(kinds) for scope, kinds in collectives.items() if scope}
    for kind, n in collectives.get("", {}).items():
        out.setdefault("lm_head", {})[kind] = out.get("lm_head", {}).get(kind, 0) + n
    return out


@pytest.mark.parametrize("case", sorted(CASES))
def test_decode_step_has_two_all_reduces_per_layer(case, sharded):
    """Attention's o projection and the MLP's down projection (or the MoE block's psum): one all-reduce
    each; the vocab-parallel embedding lookup one more; the sampled rows' logits one all-gather; nothing
    else (no all-gather of weights or of the KV cache)."""
    r = sharded[0]["cases"][case]
    expected = {f"layer{i}": {"all-reduce": 2} for i in range(r["num_layers"])}
    expected.update({"embed": {"all-reduce": 1}, "lm_head": {"all-gather": 1}})
    assert _unscoped_into_lm_head(r["collectives"]) == expected


def test_qwen25_7b_shapes_compile_to_56_layer_all_reduces(sharded):
    big = sharded[0]["big"]
    layers = {k: v for k, v in big["collectives"].items() if k.startswith("layer")}
    assert big["num_layers"] == 28 and len(layers) == 28
    assert sum(v["all-reduce"] for v in layers.values()) == 56
    assert all(v == {"all-reduce": 2} for v in layers.values())
    big_collectives = _unscoped_into_lm_head(big["collectives"])
    assert big_collectives["embed"] == {"all-reduce": 1} and big_collectives["lm_head"] == {"all-gather": 1}
    # what each all-reduce carries: 8 decode tokens x hidden (bf16 on a GPU; XLA:CPU promotes it to f32)
    assert {n for kind, n, scope in big["sizes"] if kind == "all-reduce"} == {8 * 3584}
    assert [n for kind, n, scope in big["sizes"] if kind == "all-gather"] == [8 * 152064]  # the sampled rows' logits
    # 4 devices: every layer's weights split 4 ways; only norms (and nothing else) replicated
    assert big["weight_bytes"] / 4 <= big["weight_bytes_per_device"] < big["weight_bytes"] / 4 * 1.001


def test_kv_heads_replicated_when_fewer_than_devices(sharded):
    cases = sharded[0]["cases"]
    assert cases["llama_gqa-tp4"]["kv_heads_on_devices"] == 4  # 2 KV heads, each on 2 devices
    assert cases["llama_mqa_tied-tp4"]["kv_heads_on_devices"] == 4  # MQA
    assert cases["qwen3_moe-ep8"]["kv_heads_on_devices"] == 8
    assert cases["llama_linear_rope-tp4"]["kv_heads_on_devices"] == 4  # 4 KV heads: already one each
    # each device holds one KV head's projection: [hidden, head_dim] (and 2 of 8 query heads: [64, 16])
    assert "(64, 8)" in cases["llama_8heads-tp8"]["layer0_shard_shapes"]
    assert "(64, 16)" in cases["llama_gqa-tp4"]["layer0_shard_shapes"]


def test_odd_vocabularies_are_padded_to_an_even_split(sharded):
    """333 and 389 at TP 2 and 4, 32001 at TP 2 and 4, 333 on a 2 x 2 expert x tensor mesh: padded to the next
    multiple of 64, each device holding an equal share of the embedding / LM head rows (the logits equal the
    one-device model's, above: the padding is never seen); 256 divides evenly and is not padded."""
    cases = sharded[0]["cases"]
    expected = {"llama_vocab333-tp2": (51, [64, 192]), "llama_vocab333-tp4": (51, [64, 96]),
                "llama_vocab333-tp2-int8-head": (51, [192, 64]),  # qweight [vocab, hidden]
                "qwen2_vocab389_tied-tp2": (59, [224, 64]), "qwen2_vocab389_tied-tp4": (59, [112, 64]),
                "llama_vocab32001_mqa-tp2": (63, [64, 16032]), "llama_vocab32001_mqa-tp4": (63, [64, 8016]),
                "mixtral_vocab333-ep2-tp4": (51, [64, 96])}
    for case, (padding, shard) in expected.items():
        assert (cases[case]["vocab_padding"], cases[case]["head_shard_shape"]) == (padding, shard), case
    assert cases["llama_gqa-tp4"]["vocab_padding"] == 0


def test_experts_are_split_over_devices(sharded):
    cases = sharded[0]["cases"]
    assert "(1, 64, 128)" in cases["mixtral-ep8"]["layer0_shard_shapes"]  # one whole expert per device
    assert "(4, 64, 64)" in cases["mixtral-ep2-tp4"]["layer0_shard_shapes"]  # 4 experts, half their FFN
    assert "(8, 64, 16)" in cases["mixtral-tp8"]["layer0_shard_shapes"]  # all experts, 1/8 of each FFN


if __name__ == "__main__":
    _worker(sys.argv[1], sys.argv[2])
