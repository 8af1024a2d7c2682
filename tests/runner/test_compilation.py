"""Nothing compiles after start: the plan covers every executable a workload runs, warm-up compiles it at
construction, a second process loads it from the disk cache, and a changed configuration never loads a
stale entry."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
import warnings

import jax
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from jaxinfer import LLM, SamplingParams
from jaxinfer.runner.compile_cache import ExecutableCache
from tests.prompts import random_prompts

SMALL = dict(max_model_len=64, num_kv_blocks=9, max_num_seqs=4, max_num_batched_tokens=24)


def _mixed_workload(llm: LLM, seed: int) -> None:
    """Prompts of every length (chunked prefill under a 24-token budget), shared prefixes (cache hits, and a
    full-prompt hit), greedy and sampled rows, logprobs, penalties, min_tokens with stop ids, n > 1, an
    abort mid-flight and preemption in an 8-block pool."""
    rng = np.random.default_rng(seed)
    prompts = random_prompts([3, 17, 40, 9, 33, 1], seed=seed)
    shared = prompts[2]["prompt_token_ids"][:32]
    prompts += [{"prompt_token_ids": shared + [5, 6]}, {"prompt_token_ids": shared}]
    params = [
        SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True),
        SamplingParams(temperature=0.9, top_p=0.8, top_k=7, max_tokens=9, seed=1, ignore_eos=True),
        SamplingParams(temperature=0.0, max_tokens=10, logprobs=3, ignore_eos=True),
        SamplingParams(temperature=0.7, presence_penalty=0.5, repetition_penalty=1.2, max_tokens=8, ignore_eos=True),
        SamplingParams(temperature=0.0, min_tokens=4, max_tokens=8, stop_token_ids=[1, 2, 3]),
        SamplingParams(temperature=1.0, n=3, max_tokens=6, seed=2, ignore_eos=True),
        SamplingParams(temperature=0.0, max_tokens=15, ignore_eos=True),
        SamplingParams(temperature=0.0, max_tokens=5, ignore_eos=True, logprobs=1),
    ]
    engine = llm.llm_engine
    for i, (p, sp) in enumerate(zip(prompts, params)):
        engine.add_request(f"w{seed}-{i}", p, sp)
    steps = 0
    while engine.has_unfinished_requests():
        engine.step()
        steps += 1
        if steps == 3:
            engine.abort_request(f"w{seed}-{int(rng.integers(0, len(prompts)))}")


def _planned_keys(engine) -> list[tuple]:
    return [(executables, set(keys)) for executables, keys in engine.warm_up_plan()]


@pytest.mark.parametrize("speculation", [None, "ngram", "draft_model"])
def test_eager_start_then_zero_compilations_under_a_mixed_workload(hf_checkpoints, speculation):
    path = str(hf_checkpoints["llama_gqa"])
    spec = None
    if speculation == "ngram":
        spec = {"method": "ngram", "num_speculative_tokens": 2, "prompt_lookup_min": 1, "adaptive": False}
    elif speculation == "draft_model":
        spec = {"method": "draft_model", "model": path, "num_speculative_tokens": 2, "adaptive": False}
    llm = LLM(model=path, speculative_config=spec, **SMALL)
    engine = llm.llm_engine
    report = engine.warm_up_report
    planned = sum(len(keys) for _, keys in _planned_keys(engine))
    assert report is not None and report.num_executables == planned
    assert engine.stats()["num_compilations"] == planned
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)  # a compilation after start warns: fail on it
        for seed in range(2):
            _mixed_workload(llm, seed)
    stats = engine.stats()
    assert stats["num_compilations_after_start"] == 0
    assert stats["num_preemptions"] > 0 and stats["prefix_cache_hit_tokens"] > 0
    if speculation:
        assert stats["num_draft_tokens"] > 0


@settings(max_examples=6, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(max_num_seqs=st.integers(1, 6), budget=st.integers(6, 40), k=st.one_of(st.none(), st.integers(1, 3)),
       lengths=st.lists(st.integers(1, 45), min_size=1, max_size=8), seed=st.integers(0, 2**16))
def test_every_executable_a_workload_runs_is_in_the_plan(hf_checkpoints, max_num_seqs, budget, k, lengths, seed):
    """Lazy mode compiles exactly what is used: whatever the configuration and the workload, every key
    compiled is one the plan lists."""
    path = str(hf_checkpoints["llama_gqa"])
    spec = None if k is None else {"method": "ngram", "num_speculative_tokens": k, "prompt_lookup_min": 1}
    llm = LLM(model=path, compilation="lazy", max_model_len=96, num_kv_blocks=20, max_num_seqs=max_num_seqs,
              max_num_batched_tokens=budget,
              enable_chunked_prefill=True, speculative_config=spec)
    rng = np.random.default_rng(seed)
    prompts = random_prompts(lengths, seed=seed)
    params = [SamplingParams(temperature=float(rng.choice([0.0, 0.8])), max_tokens=int(rng.integers(1, 20)),
                             ignore_eos=True, logprobs=int(rng.integers(0, 3)) if rng.random() < 0.3 else None)
              for _ in lengths]
    llm.generate(prompts, params, use_tqdm=False)
    for executables, keys in _planned_keys(llm.llm_engine):
        assert executables.ready_keys() <= keys


def test_lazy_mode_compiles_on_first_use_and_says_so_in_stats(hf_checkpoints):
    llm = LLM(model=str(hf_checkpoints["llama_gqa"]), compilation="lazy", enable_compilation_cache=False, **SMALL)
    assert llm.llm_engine.warm_up_report is None and llm.llm_engine.stats()["num_compilations"] == 0
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)  # lazy compilation is expected: no warning
        llm.generate(random_prompts([5], seed=0), SamplingParams(max_tokens=3), use_tqdm=False)
    stats = llm.llm_engine.stats()
    assert stats["num_compilations"] >= 2 and stats["num_compilations_after_start"] >= 2


def test_a_compilation_after_start_is_counted_and_named(hf_checkpoints, monkeypatch):
    llm = LLM(model=str(hf_checkpoints["llama_gqa"]), **SMALL)
    engine = llm.llm_engine
    execute = engine.runner.execute

    def execute_and_compile(*args, **kwargs):
        jax.jit(lambda x: x * 5 - 1)(np.float32(1))  # an operation outside the plan
        return execute(*args, **kwargs)

    monkeypatch.setattr(engine.runner, "execute", execute_and_compile)
    with pytest.warns(RuntimeWarning, match="compiled .*lambda.* after start"):
        llm.generate(random_prompts([5], seed=1), SamplingParams(max_tokens=1), use_tqdm=False)
    assert engine.stats()["num_compilations_after_start"] == 1


_START = textwrap.dedent("""
    import json, sys, time
    t0 = time.perf_counter()
    from jaxinfer import LLM
    kwargs = json.loads(sys.argv[1])
    llm = LLM(**kwargs)
    e = llm.llm_engine
    out = llm.generate([{"prompt_token_ids": [3, 4, 5, 6, 7]}] * 2, use_tqdm=False)
    r = e.warm_up_report
    loaded = e.runner.executables.loaded_keys
    print(json.dumps({"executables": r.num_executables, "from_cache": r.num_from_cache,
                      "steps_from_cache": sum(k[0] == "step" for k in loaded),
                      "after_start": e.stats()["num_compilations_after_start"],
                      "tokens": [o.outputs[0].token_ids for o in out]}))
""")


def _start(cache_dir, **kwargs) -> dict:
    kwargs = {"compilation_cache_dir": str(cache_dir), **SMALL, **kwargs}
    proc = subprocess.run([sys.executable, "-c", _START, json.dumps(kwargs)], capture_output=True, text=True,
                          timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_a_second_process_loads_every_executable_and_a_changed_configuration_loads_none(hf_checkpoints, tmp_path):
    model = str(hf_checkpoints["llama_gqa"])
    first = _start(tmp_path, model=model)
    assert first["from_cache"] == 0 and first["executables"] > 10 and first["after_start"] == 0
    second = _start(tmp_path, model=model)
    assert second["from_cache"] == second["executables"] == first["executables"]
    assert second["after_start"] == 0 and second["tokens"] == first["tokens"]
    # another model, or a wider block table (max_model_len), shares no model step with the cached ones (the
    # samplers, which depend only on the vocabulary size and the rows, are legitimately shared)
    other_model = _start(tmp_path, model=str(hf_checkpoints["qwen2"]))
    assert other_model["steps_from_cache"] == 0 and other_model["from_cache"] < other_model["executables"]
    longer = _start(tmp_path, model=model, max_model_len=128)
    assert longer["steps_from_cache"] == 0 and longer["tokens"] == first["tokens"]


def test_cache_keys_depend_on_everything_that_shapes_an_executable(monkeypatch, tmp_path):
    cache = ExecutableCache(tmp_path)
    args = (jax.ShapeDtypeStruct((4, 8), np.float32),)
    base = cache.key("step|cfg", args)
    assert cache.key("step|cfg", args) == base
    assert cache.key("step|other-cfg", args) != base
    assert cache.key("step|cfg", (jax.ShapeDtypeStruct((4, 8), np.float16),)) != base
    assert cache.key("step|cfg", (jax.ShapeDtypeStruct((4, 16), np.float32),)) != base
    monkeypatch.setattr(jax, "__version__", "0.0.0-other")
    assert cache.key("step|cfg", args) != base
    monkeypatch.undo()
    monkeypatch.setenv("XLA_FLAGS", "--xla_cpu_enable_fast_math=true")
    assert cache.key("step|cfg", args) != base


def test_an_unreadable_cache_entry_is_recompiled(tmp_path):
    cache = ExecutableCache(tmp_path)
    compiled = jax.jit(lambda x: x + 1).lower(np.float32(0)).compile()
    assert cache.store("k", compiled)
    assert float(cache.load("k")(np.float32(2))) == 3.0
    (cache.directory / "k.bin").write_bytes(b"not an executable")
    with pytest.warns(UserWarning, match="unreadable cached executable"):
        assert cache.load("k") is None
    assert not (cache.directory / "k.bin").exists()
