"""The server's field policy, usage reporting, OpenAI error JSON and per-request bounds, end to end: one live
server on the embedded model (small bounds: --max-n 4, --max-request-tokens 96, --max-body-bytes 8192) driven
by the openai SDK and httpx; greedy outputs compared with the same request without the ignored fields."""

from __future__ import annotations

import json

import pytest

openai = pytest.importorskip("openai")
httpx = pytest.importorskip("httpx")
pytest.importorskip("uvicorn")
pytest.importorskip("fastapi")

from jaxinfer.server.protocol import APIError, ChatCompletionRequest, CompletionRequest, parse  # noqa: E402
from tests.server.test_server import ENGINE, live_server  # noqa: E402

MODEL = "jaxinfer-default"
BOUNDS = ["--max-n", "4", "--max-request-tokens", "96", "--max-body-bytes", "8192"]
CHAT = [{"role": "user", "content": "write a loop"}]


@pytest.fixture(scope="module")
def url():
    with live_server([*ENGINE, *BOUNDS]) as (url, _):
        yield url


@pytest.fixture(scope="module")
def client(url):
    return openai.OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0, timeout=120)


def _post(url, route, body, **kw):
    return httpx.post(url + route, json=body, timeout=60, **kw)


# ------------------------------------------------------------------------------------------ field policy
INERT = {"store": True, "metadata": {"who": "test"}, "service_tier": "auto", "user": "u1", "no_stop_trim": True,
         "separate_reasoning": True, "some_new_field": {"x": 1}}


def test_inert_and_unknown_fields_are_ignored_named_and_change_nothing(url):
    base = {"model": MODEL, "prompt": "def add(a, b):", "max_tokens": 12, "temperature": 0.0}
    plain = _post(url, "/v1/completions", base)
    extra = _post(url, "/v1/completions", {**base, **INERT})
    assert plain.status_code == extra.status_code == 200, extra.text
    assert extra.json()["choices"][0]["text"] == plain.json()["choices"][0]["text"]
    assert "x-jaxinfer-ignored-fields" not in plain.headers
    assert set(extra.headers["x-jaxinfer-ignored-fields"].split(",")) == set(INERT)
    chat = {"model": MODEL, "messages": CHAT, "max_tokens": 12, "temperature": 0.0}
    plain = _post(url, "/v1/chat/completions", chat)
    extra = _post(url, "/v1/chat/completions", {**chat, "parallel_tool_calls": False, "reasoning_effort": "low",
                                                "stream_reasoning": True, "tools": [], "tool_choice": "none",
                                                "response_format": {"type": "text"}, "logit_bias": {}})
    assert extra.status_code == 200, extra.text
    assert extra.json()["choices"][0]["message"] == plain.json()["choices"][0]["message"]
    # the neutral values of refused fields are not "ignored": they change nothing by their value
    assert set(extra.headers["x-jaxinfer-ignored-fields"].split(",")) == {"reasoning_effort", "stream_reasoning"}


REFUSED = [
    ("/v1/completions", {"prompt": "x", "logit_bias": {"50": 100}}, "logit_bias"),
    ("/v1/completions", {"prompt": "x", "suffix": "end"}, "suffix"),
    ("/v1/completions", {"prompt": "x", "best_of": 3}, "best_of"),
    ("/v1/completions", {"prompt": "x", "guided_decoding_backend": "xgrammar"}, "guided_decoding_backend"),
    # tools without tool_choice mean "auto", which this server (no --enable-auto-tool-choice) cannot serve
    ("/v1/chat/completions", {"messages": CHAT, "tools": [{"type": "function", "function": {"name": "f"}}]},
     "tool_choice"),
    ("/v1/chat/completions", {"messages": CHAT, "response_format": {"type": "xml"}}, "response_format.type"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": [
        {"type": "image_url", "image_url": {"url": "data:,"}}]}]}, "messages[0].content[0].type"),
    ("/v1/chat/completions", {"messages": CHAT, "continue_final_message": True}, "continue_final_message"),
]


@pytest.mark.parametrize("route,body,param", REFUSED, ids=[r[2] for r in REFUSED])
def test_fields_that_would_change_the_result_are_refused_with_their_param(url, route, body, param):
    r = _post(url, route, {"model": MODEL, **body})
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert error["param"] == param and param in error["message"] and error["type"] == "invalid_request_error"


def test_strict_fields_refuses_unknown_fields_and_still_accepts_inert_ones():
    body = json.dumps({"prompt": "x", "store": True, "brand_new": 1}).encode()
    _, ignored = parse(CompletionRequest, body)
    assert ignored == ["store", "brand_new"]
    with pytest.raises(APIError) as err:
        parse(CompletionRequest, body, strict_fields=True)
    assert err.value.status == 400 and err.value.param == "brand_new"
    req, ignored = parse(ChatCompletionRequest, json.dumps({"messages": CHAT, "store": True}).encode(), True)
    assert ignored == ["store"] and req.messages[0].content == "write a loop"


# ----------------------------------------------------------------------------------------------- usage
def test_continuous_usage_stats_put_the_usage_so_far_on_every_chunk(client):
    chunks = list(client.completions.create(
        model=MODEL, prompt="import os\n", max_tokens=10, temperature=0.0, stream=True,
        stream_options={"include_usage": True, "continuous_usage_stats": True}, extra_body={"ignore_eos": True}))
    assert all(c.usage is not None for c in chunks)
    counts = [c.usage.completion_tokens for c in chunks]
    assert counts == sorted(counts) and counts[-1] == 10
    assert {c.usage.prompt_tokens for c in chunks} == {chunks[-1].usage.prompt_tokens}
    assert chunks[-1].choices == []
    chat = list(client.chat.completions.create(
        model=MODEL, messages=CHAT, max_tokens=6, temperature=0.0, stream=True,
        stream_options={"include_usage": True, "continuous_usage_stats": True}, extra_body={"ignore_eos": True}))
    assert all(c.usage is not None for c in chat) and chat[-1].usage.completion_tokens == 6


def test_cached_tokens_report_this_requests_prefix_cache_hits(client):
    prompt = "class Stack:\n    def __init__(self):\n        self.items = []\n" * 3  # > 2 blocks of 16
    first = client.completions.create(model=MODEL, prompt=prompt, max_tokens=4, temperature=0.0)
    second = client.completions.create(model=MODEL, prompt=prompt, max_tokens=4, temperature=0.0)
    assert first.usage.prompt_tokens_details.cached_tokens == 0
    cached = second.usage.prompt_tokens_details.cached_tokens
    assert cached > 0 and cached % 16 == 0 and cached < second.usage.prompt_tokens
    assert second.choices[0].text == first.choices[0].text
    streamed = list(client.completions.create(model=MODEL, prompt=prompt, max_tokens=4, temperature=0.0,
                                              stream=True, stream_options={"include_usage": True}))
    assert streamed[-1].usage.prompt_tokens_details.cached_tokens == cached


# ---------------------------------------------------------------------------------------------- errors
def test_unknown_routes_wrong_methods_and_models_answer_openai_errors(url, client):
    r = httpx.get(url + "/v1/nowhere")
    assert r.status_code == 404 and r.json()["error"]["type"] == "not_found_error"
    r = httpx.get(url + "/v1/completions")
    assert r.status_code == 405 and "GET" in r.json()["error"]["message"]
    assert client.models.retrieve(MODEL).id == MODEL
    with pytest.raises(openai.NotFoundError):
        client.models.retrieve("gpt-4")


@pytest.mark.parametrize("route,body,param", [
    ("/v1/completions", {"prompt": "x", "max_tokens": "ten"}, "max_tokens"),
    ("/v1/completions", {"prompt": "x", "temperature": -1}, "temperature"),
    ("/v1/chat/completions", {"messages": CHAT, "logprobs": True, "top_logprobs": 50}, "top_logprobs"),
    ("/v1/chat/completions", {"messages": CHAT, "max_completion_tokens": -2}, "max_completion_tokens"),
    ("/v1/completions", {"prompt": "x", "max_tokens": 0}, "max_tokens"),
])
def test_value_errors_name_the_request_field(url, route, body, param):
    r = _post(url, route, {"model": MODEL, **body})
    assert r.status_code == 400 and r.json()["error"]["param"] == param, r.text


# ---------------------------------------------------------------------------------------------- bounds
def test_bounds_are_refused_before_anything_is_queued(url):
    r = _post(url, "/v1/completions", {"model": MODEL, "prompt": "x", "n": 5, "max_tokens": 2})
    assert r.status_code == 400 and r.json()["error"]["param"] == "n" and "--max-n" in r.text
    r = _post(url, "/v1/completions", {"model": MODEL, "prompt": "x", "n": 4, "max_tokens": 25})
    assert r.status_code == 400 and r.json()["error"]["param"] == "max_tokens" and "100" in r.text
    r = _post(url, "/v1/chat/completions", {"model": MODEL, "messages": CHAT, "n": 2})  # no max_tokens: the context
    assert r.status_code == 400 and r.json()["error"]["param"] == "max_tokens"
    r = _post(url, "/v1/completions", {"model": MODEL, "prompt": "x" * 9000})
    assert r.status_code == 413 and r.json()["error"]["code"] == "request_too_large"
    assert _post(url, "/v1/completions", {"model": MODEL, "prompt": "x", "n": 4, "max_tokens": 24}).status_code == 200
    metrics = httpx.get(url + "/metrics").text
    assert 'jaxinfer:num_requests_waiting{model_name="jaxinfer-default"} 0.0' in metrics


# ------------------------------------------------------------------------------------------ prompt scoring
def test_echo_with_logprobs_returns_the_prompts_logprobs_as_the_library_does(client):
    from jaxinfer import LLM, SamplingParams

    ids = [13, 1042, 287, 318, 257, 1332, 25]
    scored = client.completions.create(model=MODEL, prompt=ids, echo=True, logprobs=2, max_tokens=0)
    lp = scored.choices[0].logprobs
    assert scored.usage.completion_tokens == 0 and len(lp.tokens) == len(ids)
    assert lp.token_logprobs[0] is None and lp.top_logprobs[0] is None
    llm = LLM(compilation="lazy", max_num_seqs=4, max_model_len=256, seed=0)
    (ref,) = llm.generate([{"prompt_token_ids": ids}], SamplingParams(max_tokens=1, prompt_logprobs=2),
                          use_tqdm=False)
    want = [entry[tid].logprob for tid, entry in zip(ids[1:], ref.prompt_logprobs[1:])]
    assert lp.token_logprobs[1:] == pytest.approx(want, abs=1e-5)
    assert all(2 <= len(top) <= 3 for top in lp.top_logprobs[1:])  # the top 2 and the prompt token
    generated = client.completions.create(model=MODEL, prompt=ids, echo=True, logprobs=1, max_tokens=3,
                                          temperature=0.0, extra_body={"ignore_eos": True})
    g = generated.choices[0].logprobs
    assert len(g.tokens) == len(ids) + 3 and g.token_logprobs[1:len(ids)] == pytest.approx(want, abs=1e-5)
    assert g.text_offset == sorted(g.text_offset)
