"""Bad input gets a clear error, before anything is queued, and the engine keeps serving."""

from __future__ import annotations

import math

import pytest

from jaxinfer import LLM, SamplingParams
from jaxinfer.config.model import ModelConfig

GREEDY = SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True)


@pytest.fixture(scope="module")
def llm(hf_checkpoints):
    return LLM(compilation="lazy", model=str(hf_checkpoints["llama_gqa"]), max_model_len=64, num_kv_blocks=32, max_num_seqs=4)


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(temperature=-0.1), "temperature"),
        (dict(temperature=math.nan), "temperature"),
        (dict(top_p=0.0), "top_p"),
        (dict(top_p=1.5), "top_p"),
        (dict(top_k=-2), "top_k"),
        (dict(min_p=2.0), "min_p"),
        (dict(presence_penalty=3.0), "presence_penalty"),
        (dict(frequency_penalty=math.inf), "frequency_penalty"),
        (dict(repetition_penalty=0.0), "repetition_penalty"),
        (dict(max_tokens=0), "max_tokens"),
        (dict(min_tokens=5, max_tokens=2), "min_tokens"),
        (dict(n=0), "n"),
        (dict(logprobs=-1), "logprobs"),
        (dict(seed=-1), "seed"),
        (dict(stop=[1, 2]), "stop"),
        (dict(stop=""), "stop"),
        (dict(stop_token_ids=[-3]), "stop_token_ids"),
        (dict(max_tokens=2.5), "max_tokens"),
    ],
)
def test_sampling_params_rejected(kwargs, match):
    with pytest.raises(ValueError, match=match):
        SamplingParams(**kwargs)


def test_unknown_keyword_arguments():
    with pytest.raises(TypeError, match="temprature"):
        SamplingParams(temprature=0.5)
    with pytest.raises(TypeError, match="blok_size"):
        LLM(compilation="lazy", model="random:llama-150m", blok_size=16)


@pytest.mark.parametrize(
    "prompt, match",
    [
        ({"prompt_token_ids": []}, "empty"),
        ({"prompt_token_ids": [1, 256]}, "out of range"),
        ({"prompt_token_ids": [-1]}, "out of range"),
        ({"prompt_token_ids": [1.5]}, "list of ints"),
        ({"prompt_token_ids": list(range(64))}, "max_model_len"),
        ({"prompt": "hi", "prompt_token_ids": [1]}, "exactly one"),
        ({"tokens": [1]}, "exactly one"),
        (3.14, "prompt must be"),
        ("text without a tokenizer", "no tokenizer"),
    ],
)
def test_bad_prompts_rejected(llm, prompt, match):
    with pytest.raises(ValueError, match=match):
        llm.generate([prompt], GREEDY, use_tqdm=False)


def test_prompt_plus_max_tokens_over_max_model_len(llm):
    with pytest.raises(ValueError, match="max_model_len"):
        llm.generate([{"prompt_token_ids": list(range(60))}], SamplingParams(max_tokens=10), use_tqdm=False)


def test_one_bad_prompt_rejects_the_call_and_nothing_is_lost(llm):
    good = [{"prompt_token_ids": [5, 6, 7, 8]}, {"prompt_token_ids": [9, 10]}]
    before = [o.outputs[0].token_ids for o in llm.generate(good, GREEDY, use_tqdm=False)]
    stats = llm.llm_engine.stats()
    with pytest.raises(ValueError, match="out of range"):
        llm.generate([good[0], {"prompt_token_ids": [999]}, good[1]], GREEDY, use_tqdm=False)
    assert not llm.llm_engine.has_unfinished_requests()
    assert llm.llm_engine.stats()["free_blocks"] == stats["free_blocks"]
    after = [o.outputs[0].token_ids for o in llm.generate(good, GREEDY, use_tqdm=False)]
    assert after == before


def test_engine_add_request_errors(llm):
    engine = llm.llm_engine
    engine.add_request("dup", {"prompt_token_ids": [1, 2]}, GREEDY)
    with pytest.raises(ValueError, match="already in use"):
        engine.add_request("dup", {"prompt_token_ids": [1, 2]}, GREEDY)
    with pytest.raises(ValueError, match="SamplingParams"):
        engine.add_request("x", {"prompt_token_ids": [1, 2]}, {"temperature": 0})
    engine.abort_request("dup")
    assert not engine.has_unfinished_requests()


@pytest.mark.parametrize(
    "kwargs, exc, match",
    [
        (dict(num_kv_blocks=3), ValueError, "cannot hold one request"),
        (dict(block_size=12), ValueError, "block_size"),
        (dict(max_num_seqs=0), ValueError, "max_num_seqs"),
        (dict(attention_backend="cuda"), ValueError, "attention_backend"),
        (dict(dtype="int4"), ValueError, "dtype"),
        (dict(quantization="int4"), ValueError, "quantization must be one of"),
        (dict(quantization="fp8_block"), ValueError, "quantization must be one of"),
        (dict(kv_cache_dtype="fp16"), ValueError, "kv_cache_dtype must be one of"),
        (dict(tensor_parallel_size=2), ValueError, "needs 2 devices"),
        (dict(tensor_parallel_size=0), ValueError, "tensor_parallel_size must be a positive int"),
        (dict(enable_chunked_prefill=False, max_num_batched_tokens=16), ValueError, "max_num_batched_tokens"),
        (dict(batching="dynamic"), ValueError, "batching"),
        (dict(max_model_len=4096), ValueError, "max_position_embeddings"),
        (dict(enable_compilation_cache="yes"), TypeError, "enable_compilation_cache must be True or False"),
        (dict(compilation="sometimes"), ValueError, "compilation must be one of"),
        (dict(enable_prefix_caching=1), TypeError, "enable_prefix_caching must be True or False"),
    ],
)
def test_impossible_engine_settings(hf_checkpoints, kwargs, exc, match):
    base = dict(model=str(hf_checkpoints["llama_gqa"]), max_model_len=64, compilation="lazy")
    base.update(kwargs)
    with pytest.raises(exc, match=match):
        LLM(**base)


def test_unknown_architecture_and_rope_type():
    with pytest.raises(NotImplementedError, match="GPT2LMHeadModel"):
        ModelConfig.from_hf_dict({"architectures": ["GPT2LMHeadModel"]})
    base = {"architectures": ["LlamaForCausalLM"], "vocab_size": 10, "hidden_size": 8, "intermediate_size": 16,
            "num_hidden_layers": 1, "num_attention_heads": 2}
    with pytest.raises(NotImplementedError, match="'dynamic' is not supported"):  # yarn is supported now
        ModelConfig.from_hf_dict({**base, "rope_scaling": {"rope_type": "dynamic", "factor": 4.0}})




def test_missing_model_dir():
    with pytest.raises(FileNotFoundError, match="does not exist"):
        LLM(compilation="lazy", model="/nonexistent/model")
