"""Tensor and expert parallelism through the engine (``LLM(tensor_parallel_size=N, ...)``) on 8 simulated CPU
devices: greedy tokens equal the one-device engine's and HF's, logprobs within 1e-4, with prefix caching,
chunked prefill and n-gram speculation on; bad settings refused before anything is loaded.

The sharded engines run in ONE subprocess started with 8 devices (the device count is fixed when jax
initialises); the one-device references run here."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest

from jaxinfer import LLM, SamplingParams
from tests import hf_oracle
from tests.prompts import random_prompts

ENGINE = dict(max_model_len=96, num_kv_blocks=48, max_num_seqs=4, max_num_batched_tokens=16)
PARAMS = dict(temperature=0.0, max_tokens=12, ignore_eos=True, logprobs=1)
NGRAM = {"method": "ngram", "num_speculative_tokens": 2, "prompt_lookup_min": 1, "adaptive": False}
# name -> (checkpoint, tensor_parallel_size, enable_expert_parallel, speculation)
CASES = {
    "llama_gqa-tp2-ngram": ("llama_gqa", 2, False, NGRAM),
    "llama_mqa_tied-tp4": ("llama_mqa_tied", 4, False, None),  # one KV head, replicated on the 4 devices
    "qwen3_head_dim-tp2": ("qwen3_head_dim", 2, False, None),
    "mixtral-ep2": ("mixtral", 2, True, None),  # experts over 2 devices, attention tensor-parallel
    "qwen2_vocab389_tied-tp2-ngram": ("qwen2_vocab389_tied", 2, False, NGRAM),  # the vocabulary padded to 448
}
EXTRA = ("qwen2_vocab389_tied",)  # checkpoints of hf_oracle.EXTRA_ARCHS the cases use
BAD = {  # (checkpoint, tensor_parallel_size, enable_expert_parallel) -> message
    "heads": (("llama_gqa", 8, False), "not divisible by tensor_parallel_size=8"),
    "devices": (("llama_gqa", 16, False), "needs 16 devices"),
    "dense-ep": (("llama_gqa", 2, True), "mixture-of-experts"),
}


def _prompts():
    shared = random_prompts([20], seed=7)[0]["prompt_token_ids"]  # a shared 20-token prefix: cache hits
    return [{"prompt_token_ids": shared + [1, 2]}, {"prompt_token_ids": shared + [3]}] + random_prompts([5, 37],
                                                                                                        seed=8)


_WORKER = textwrap.dedent("""
    import json, sys
    import jax
    from jaxinfer import LLM, SamplingParams
    from tests.sharding.test_tp_engine import BAD, CASES, ENGINE, PARAMS, _prompts
    assert jax.device_count() == 8
    paths = json.loads(sys.argv[1])
    out = {"cases": {}, "errors": {}}
    for name, (arch, tp, ep, spec) in CASES.items():
        llm = LLM(model=paths[arch], tensor_parallel_size=tp, enable_expert_parallel=ep, speculative_config=spec,
                  compilation="lazy", enable_compilation_cache=False, **ENGINE)
        res = llm.generate(_prompts(), SamplingParams(**PARAMS), use_tqdm=False)
        stats = llm.llm_engine.stats()
        out["cases"][name] = {"tokens": [o.outputs[0].token_ids for o in res],
                              "logprobs": [[max(lp.values()) for lp in o.outputs[0].logprobs] for o in res],
                              "hits": stats["prefix_cache_hit_tokens"], "drafts": stats["num_draft_tokens"]}
    for name, ((arch, tp, ep), _) in BAD.items():
        try:
            LLM(model=paths[arch], tensor_parallel_size=tp, enable_expert_parallel=ep, compilation="lazy", **ENGINE)
            out["errors"][name] = None
        except ValueError as e:
            out["errors"][name] = str(e)
    print(json.dumps(out))
""")


@pytest.fixture(scope="module")
def checkpoints(hf_checkpoints, tmp_path_factory):
    extra = tmp_path_factory.mktemp("tp_engine_ckpts")
    return {**hf_checkpoints, **{n: hf_oracle.build_checkpoint(n, extra) for n in EXTRA}}


@pytest.fixture(scope="module")
def models(checkpoints, hf_models):
    return {**hf_models, **{n: hf_oracle.load_hf(checkpoints[n]) for n in EXTRA}}


@pytest.fixture(scope="module")
def sharded_runs(checkpoints):
    paths = {name: str(p) for name, p in checkpoints.items()}
    env = {**os.environ, "XLA_FLAGS": "--xla_force_host_platform_device_count=8", "JAX_PLATFORMS": "cpu"}
    proc = subprocess.run([sys.executable, "-c", _WORKER, json.dumps(paths)], capture_output=True, text=True,
                          env=env, timeout=1500, cwd=os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
    assert proc.returncode == 0, proc.stderr[-4000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("name", list(CASES))
def test_sharded_engine_equals_one_device_and_hf(name, sharded_runs, checkpoints, models):
    arch, tp, ep, spec = CASES[name]
    got = sharded_runs["cases"][name]
    llm = LLM(model=str(checkpoints[arch]), compilation="lazy", **ENGINE)
    ref = llm.generate(_prompts(), SamplingParams(**PARAMS), use_tqdm=False)
    assert got["tokens"] == [o.outputs[0].token_ids for o in ref]
    np.testing.assert_allclose(np.concatenate(got["logprobs"]),
                               np.concatenate([[max(lp.values()) for lp in o.outputs[0].logprobs] for o in ref]),
                               atol=1e-4)
    for prompt, tokens in zip(_prompts()[2:], got["tokens"][2:]):
        hf_tokens, _ = hf_oracle.hf_greedy(models[arch], prompt["prompt_token_ids"], PARAMS["max_tokens"])
        assert tokens == hf_tokens
    assert got["hits"] >= 16  # the shared prefix's full block hit the cache in the sharded engine too
    if spec is not None:
        assert got["drafts"] > 0


@pytest.mark.parametrize("name", list(BAD))
def test_impossible_parallel_settings_are_refused(name, sharded_runs):
    assert sharded_runs["errors"][name] is not None and BAD[name][1] in sharded_runs["errors"][name]
