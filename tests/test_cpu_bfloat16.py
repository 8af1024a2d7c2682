"""``dtype="bfloat16"`` on a CPU: bfloat16 linear weights, float32 activations and KV cache
(``loading.model_source.activation_dtype``). On a checkpoint stored in bfloat16 it computes exactly what the
float32 engine computes on the same checkpoint (the same values, widened in registers instead of at load), so
greedy tokens and their logprobs must be equal."""

from __future__ import annotations

import shutil

import jax.numpy as jnp
import pytest
from safetensors.flax import load_file, save_file

from jaxinfer import LLM, SamplingParams
from jaxinfer.model.linear import KMajorWeight


@pytest.fixture(scope="module")
def bf16_checkpoint(hf_checkpoints, tmp_path_factory):
    src = hf_checkpoints["llama_gqa"]
    dst = tmp_path_factory.mktemp("bf16") / "llama_gqa_bf16"
    shutil.copytree(src, dst)
    for f in dst.glob("*.safetensors"):
        save_file({k: v.astype(jnp.bfloat16) for k, v in load_file(str(f)).items()}, str(f), metadata={"format": "pt"})
    return dst


def test_bfloat16_weights_compute_in_float32(bf16_checkpoint):
    prompts = [{"prompt_token_ids": [(11 * i + 3 * j) % 200 + 1 for j in range(5 + 7 * i)]} for i in range(6)]
    params = SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True, logprobs=1)
    runs = {}
    for dtype in ("float32", "bfloat16"):
        llm = LLM(compilation="lazy", model=str(bf16_checkpoint), dtype=dtype, max_model_len=128, num_kv_blocks=64,
                  max_num_batched_tokens=128)
        eng = llm.llm_engine
        wo = eng.runner.params["layers"][0]["wo"]
        assert isinstance(wo, KMajorWeight) and wo.dtype == (jnp.bfloat16 if dtype == "bfloat16" else jnp.float32)
        assert eng.kv_dtype == jnp.float32 and eng.runner.params["embed"].dtype == jnp.float32
        outs = llm.generate(prompts, params, use_tqdm=False)
        runs[dtype] = [(o.outputs[0].token_ids, [lp[t] for lp, t in zip(o.outputs[0].logprobs, o.outputs[0].token_ids)])
                       for o in outs]
    for (tokens32, lps32), (tokens16, lps16) in zip(runs["float32"], runs["bfloat16"]):
        assert tokens16 == tokens32
        assert max(abs(a - b) for a, b in zip(lps32, lps16)) < 1e-5
