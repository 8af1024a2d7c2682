"""One engine over two processes (jax.distributed, gloo collectives on the CPU, 2 devices each): tensor
parallelism over all 4 devices, process 0 serving the requests and process 1 replaying its steps. Greedy
tokens and logprobs equal a single-process run on one device."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import textwrap

import numpy as np
import pytest

from jaxinfer import LLM, SamplingParams
from tests.prompts import random_prompts

ENGINE = dict(max_model_len=64, num_kv_blocks=32, max_num_seqs=4, max_num_batched_tokens=24)
PARAMS = dict(temperature=0.0, max_tokens=10, ignore_eos=True, logprobs=1)
LENGTHS = [5, 30, 12]  # the 30-token prompt is chunked under the 24-token budget

_PROCESS = textwrap.dedent("""
    import json, sys
    pid, port, path, lengths = int(sys.argv[1]), sys.argv[2], sys.argv[3], json.loads(sys.argv[4])
    import jax
    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    jax.distributed.initialize(f"127.0.0.1:{port}", num_processes=2, process_id=pid)
    from jaxinfer import LLM, SamplingParams
    from tests.prompts import random_prompts
    from tests.runner.test_multihost import ENGINE, PARAMS
    assert jax.device_count() == 4 and jax.local_device_count() == 2
    llm = LLM(model=path, tensor_parallel_size=4, compilation="lazy", enable_compilation_cache=False, **ENGINE)
    if pid == 0:
        outs = llm.generate(random_prompts(lengths, seed=3), SamplingParams(**PARAMS), use_tqdm=False)
        llm.close()
        print(json.dumps([[o.outputs[0].token_ids, [max(lp.values()) for lp in o.outputs[0].logprobs]]
                          for o in outs]))
    else:
        llm.llm_engine.follow()
        print(json.dumps("followed"))
""")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_tensor_parallel_over_two_processes_equals_one_device(hf_checkpoints):
    path = str(hf_checkpoints["llama_gqa"])
    env = {**os.environ, "XLA_FLAGS": "--xla_force_host_platform_device_count=2", "JAX_PLATFORMS": "cpu"}
    port = _free_port()
    procs = [subprocess.Popen([sys.executable, "-c", _PROCESS, str(i), str(port), path, json.dumps(LENGTHS)],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
                              cwd=os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
             for i in range(2)]
    results = []
    for p in procs:
        out, err = p.communicate(timeout=900)
        assert p.returncode == 0, err[-4000:]
        results.append(json.loads(out.strip().splitlines()[-1]))
    assert results[1] == "followed"
    llm = LLM(model=path, compilation="lazy", **ENGINE)
    single = llm.generate(random_prompts(LENGTHS, seed=3), SamplingParams(**PARAMS), use_tqdm=False)
    for (tokens, logprobs), ref in zip(results[0], single):
        assert tokens == ref.outputs[0].token_ids
        np.testing.assert_allclose(logprobs, [max(lp.values()) for lp in ref.outputs[0].logprobs], atol=1e-4)


def test_a_follower_cannot_generate(hf_checkpoints, monkeypatch):
    llm = LLM(model=str(hf_checkpoints["llama_gqa"]), compilation="lazy", **ENGINE)
    monkeypatch.setattr("jaxinfer.runner.multihost.is_leader", lambda: False)
    with pytest.raises(RuntimeError, match="follows process 0"):
        llm.generate(random_prompts([3], seed=0), use_tqdm=False)
