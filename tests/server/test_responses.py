"""OpenAI's Responses API (``/v1/responses``), end to end: one live server on the embedded model driven by the
official ``openai`` client (and httpx for raw bodies). Texts are checked against ``/v1/chat/completions``
with the same messages at temperature 0 (the same prompt, so the same greedy text); the stream against the
non-streamed response; the store with GET / DELETE / ``previous_response_id``; the field policy."""

from __future__ import annotations

import asyncio
import contextlib
import json
import time

import pytest

openai = pytest.importorskip("openai")
httpx = pytest.importorskip("httpx")
pytest.importorskip("uvicorn")
pytest.importorskip("fastapi")

from jaxinfer.outputs import CompletionOutput, RequestMetrics, RequestOutput  # noqa: E402
from jaxinfer.server.async_engine import EngineDeadError  # noqa: E402
from jaxinfer.server.responses import ResponsesServing, _Turn  # noqa: E402
from jaxinfer.server.responses_protocol import ResponsesRequest, ResponseStore  # noqa: E402
from tests.server.test_server import ENGINE, _metric, _metrics, live_server  # noqa: E402

KEY = "responses-key"
MODEL = "jaxinfer-default"
ASK = "A function that reverses a string."
RULES = "You write Python."
STREAM_ORDER = ["response.created", "response.in_progress", "response.output_item.added",
                "response.content_part.added", "response.output_text.delta", "response.output_text.done",
                "response.content_part.done", "response.output_item.done"]


@pytest.fixture(scope="module")
def server():
    with live_server([*ENGINE, "--api-key", KEY]) as running:
        yield running


@pytest.fixture(scope="module")
def url(server):
    return server[0]


@pytest.fixture(scope="module")
def client(url):
    return openai.OpenAI(base_url=url + "/v1", api_key=KEY, max_retries=0, timeout=120)


def _post(url, body, **kw):
    return httpx.post(url + "/v1/responses", json=body, headers={"Authorization": f"Bearer {KEY}"}, timeout=60,
                      **kw)


def _chat(client, messages, n, **kw):
    return client.chat.completions.create(model=MODEL, messages=messages, max_tokens=n, temperature=0.0, **kw)


def _create(client, n, **kw):
    return client.responses.create(model=MODEL, max_output_tokens=n, temperature=0.0, **kw)


@contextlib.contextmanager
def _eos_at(app, token_id: int):
    """The live engine stops at ``token_id`` as at its EOS (the embedded model hardly ever ends by itself)."""
    processor = app.state.engine.engine.output_processor
    saved = processor.eos_token_ids
    processor.eos_token_ids = (token_id,)
    try:
        yield
    finally:
        processor.eos_token_ids = saved


# ----------------------------------------------------------------------------------------- non-streamed
def test_text_equals_chat_completion_greedy(client):
    chat = _chat(client, [{"role": "system", "content": RULES}, {"role": "user", "content": ASK}], 20)
    resp = _create(client, 20, instructions=RULES, input=[{"role": "user", "content": ASK}])
    assert resp.output_text == chat.choices[0].message.content
    assert resp.id.startswith("resp_") and resp.object == "response" and resp.model == MODEL
    assert resp.status == "incomplete" and chat.choices[0].finish_reason == "length"  # 20 tokens, no EOS
    (message,) = resp.output
    assert message.type == "message" and message.role == "assistant" and message.id.startswith("msg_")
    assert [(p.type, p.annotations) for p in message.content] == [("output_text", [])]
    assert resp.usage.input_tokens == chat.usage.prompt_tokens
    assert resp.usage.output_tokens == chat.usage.completion_tokens == 20
    assert resp.usage.total_tokens == resp.usage.input_tokens + 20
    assert resp.usage.input_tokens_details.cached_tokens >= 0 and resp.usage.output_tokens_details.reasoning_tokens == 0
    assert (resp.instructions, resp.max_output_tokens, resp.temperature, resp.top_p) == (RULES, 20, 0.0, 1.0)
    assert (resp.store, resp.tools, resp.tool_choice, resp.parallel_tool_calls) == (True, [], "auto", True)
    assert resp.text.format.type == "text" and resp.previous_response_id is None and resp.metadata == {}


def test_string_and_part_inputs_are_user_messages(client):
    chat = _chat(client, [{"role": "user", "content": ASK}], 12)
    assert _create(client, 12, input=ASK).output_text == chat.choices[0].message.content
    parts = [{"type": "input_text", "text": "A function that"}, {"type": "input_text", "text": " reverses a string."}]
    assert _create(client, 12, input=[{"type": "message", "role": "user", "content": parts}]).output_text == \
        chat.choices[0].message.content
    convo = [{"role": "developer", "content": RULES}, {"role": "user", "content": "def f():"},
             {"role": "assistant", "content": "    return 1"}, {"role": "user", "content": ASK}]
    as_items = [*convo[:2], {"type": "message", "role": "assistant", "id": "msg_x", "status": "completed",
                             "content": [{"type": "output_text", "text": "    return 1", "annotations": []}]},
                convo[3]]
    assert _create(client, 12, input=as_items).output_text == _chat(client, convo, 12).choices[0].message.content


def test_max_output_tokens_makes_it_incomplete(client):
    resp = _create(client, 3, input=ASK)
    assert resp.status == "incomplete" and resp.incomplete_details.reason == "max_output_tokens"
    assert resp.output[0].status == "incomplete" and resp.usage.output_tokens == 3 and resp.completed_at is None
    events = list(_create(client, 3, input=ASK, stream=True))
    assert events[-1].type == "response.incomplete"
    assert events[-1].response.incomplete_details.reason == "max_output_tokens"
    assert events[-1].response.output_text == resp.output_text


def test_completed_when_the_model_stops(server, client):
    url, app = server
    msgs = [{"role": "user", "content": ASK}]
    ids = _chat(client, msgs, 12, extra_body={"return_token_ids": True}).choices[0].token_ids
    with _eos_at(app, ids[4]):
        chat = _chat(client, msgs, 12)
        resp = _create(client, 12, input=ASK)
        with client.responses.stream(model=MODEL, input=ASK, max_output_tokens=12, temperature=0.0) as stream:
            kinds = [event.type for event in stream]
            final = stream.get_final_response()
    assert chat.choices[0].finish_reason == "stop"
    assert resp.status == "completed" and resp.incomplete_details is None and resp.completed_at >= resp.created_at
    assert resp.output[0].status == "completed" and resp.output_text == chat.choices[0].message.content
    assert resp.usage.output_tokens == chat.usage.completion_tokens == ids.index(ids[4]) + 1
    assert kinds[-1] == "response.completed" and final.output_text == resp.output_text
    assert final.status == "completed" and final.usage.output_tokens == resp.usage.output_tokens


# -------------------------------------------------------------------------------------------- streamed
def test_stream_events_in_order_and_deltas_make_the_text(client):
    plain = _create(client, 24, input=ASK, instructions=RULES)
    events = list(_create(client, 24, input=ASK, instructions=RULES, stream=True))
    kinds = [e.type for e in events]
    deltas = [e for e in events if e.type == "response.output_text.delta"]
    assert len(deltas) > 1  # really streamed
    assert list(dict.fromkeys(kinds)) == [*STREAM_ORDER, "response.incomplete"]
    assert kinds == [*STREAM_ORDER[:4], *["response.output_text.delta"] * len(deltas), *STREAM_ORDER[5:],
                     "response.incomplete"]
    assert [e.sequence_number for e in events] == list(range(len(events)))
    created, final = events[0].response, events[-1].response
    assert created.status == "in_progress" and created.output == [] and created.usage is None
    assert created.id == final.id and events[2].item.id == final.output[0].id == deltas[0].item_id
    text = "".join(d.delta for d in deltas)
    assert text == events[-4].text == events[-3].part.text == final.output_text == plain.output_text
    assert events[-2].item.content[0].text == text and events[-2].item.status == "incomplete"
    assert final.usage.output_tokens == plain.usage.output_tokens == 24
    assert final.usage.input_tokens == plain.usage.input_tokens


def test_logprobs_with_include_equal_chat_logprobs(client):
    chat = _chat(client, [{"role": "user", "content": ASK}], 8, logprobs=True, top_logprobs=3)
    def flat(logprobs):
        return [(t.token, t.logprob, [(a.token, a.logprob) for a in t.top_logprobs]) for t in logprobs]

    want = flat(chat.choices[0].logprobs.content)
    kw = dict(input=ASK, top_logprobs=3, include=["message.output_text.logprobs"])
    assert flat(_create(client, 8, **kw).output[0].content[0].logprobs) == want
    streamed = [lp for e in _create(client, 8, stream=True, **kw) if e.type == "response.output_text.delta"
                for lp in e.logprobs]
    assert [(t.token, t.logprob) for t in streamed] == [w[:2] for w in want]
    assert _create(client, 8, input=ASK).output[0].content[0].logprobs == []  # not asked for


def test_client_disconnect_mid_stream_aborts(url):
    before = _metrics(url)
    body = {"model": MODEL, "input": ASK, "max_output_tokens": 200, "temperature": 0.0, "stream": True}
    with httpx.stream("POST", url + "/v1/responses", json=body, headers={"Authorization": f"Bearer {KEY}"},
                      timeout=60) as r:
        lines = r.iter_lines()
        seen = [next(lines) for _ in range(16)]  # the opening events and a few deltas, then hang up
    assert seen[0] == "event: response.created" and "event: response.output_text.delta" in seen
    for _ in range(400):
        m = _metrics(url)
        if _metric(m, "jaxinfer:request_success_total", finished_reason="abort") > \
                _metric(before, "jaxinfer:request_success_total", finished_reason="abort") and \
                _metric(m, "jaxinfer:num_requests_running") == 0:
            break
        time.sleep(0.05)
    assert _metric(m, "jaxinfer:num_requests_running") == 0 and _metric(m, "jaxinfer:kv_cache_usage_perc") == 0.0
    generated = _metric(m, "jaxinfer:generation_tokens_total") - _metric(before, "jaxinfer:generation_tokens_total")
    assert generated < 200  # aborted, not run to its end


# ----------------------------------------------------------------------------------------------- store
def test_store_retrieve_continue_delete(server, client):
    store = server[1].state.responses.store
    first = _create(client, 10, input=ASK, instructions=RULES, metadata={"run": "1"})
    got = client.responses.retrieve(first.id)
    assert got.model_dump() == first.model_dump() and got.metadata == {"run": "1"}
    # the stored conversation (not its instructions, as OpenAI) + its answer + the new input
    second = _create(client, 10, input="Now in one line.", previous_response_id=first.id)
    history = [{"role": "user", "content": ASK}, {"role": "assistant", "content": first.output_text},
               {"role": "user", "content": "Now in one line."}]
    chat = _chat(client, history, 10)
    assert second.output_text == chat.choices[0].message.content and second.previous_response_id == first.id
    assert second.usage.input_tokens == chat.usage.prompt_tokens
    third = _create(client, 10, input="Again.", previous_response_id=second.id, instructions=RULES)
    history = [{"role": "system", "content": RULES}, *history,
               {"role": "assistant", "content": second.output_text}, {"role": "user", "content": "Again."}]
    assert third.output_text == _chat(client, history, 10).choices[0].message.content
    # store=false keeps nothing
    size = len(store)
    unstored = _create(client, 4, input=ASK, store=False)
    assert unstored.store is False and len(store) == size
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(unstored.id)
    with pytest.raises(openai.NotFoundError) as exc:
        _create(client, 4, input="x", previous_response_id=unstored.id)
    assert exc.value.body["param"] == "previous_response_id"
    # delete
    client.responses.delete(first.id)
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(first.id)
    assert client.responses.retrieve(second.id).output_text == second.output_text  # its own conversation stays


def test_streamed_response_is_stored(client):
    events = list(_create(client, 6, input=ASK, stream=True))
    final = events[-1].response
    assert client.responses.retrieve(final.id).model_dump() == final.model_dump()


def test_unknown_response_is_a_404_in_openai_json(url, client):
    r = httpx.get(url + "/v1/responses/resp_nope", headers={"Authorization": f"Bearer {KEY}"})
    assert r.status_code == 404
    assert r.json()["error"]["type"] == "not_found_error" and "resp_nope" in r.json()["error"]["message"]
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve("resp_nope")
    with pytest.raises(openai.NotFoundError):
        client.responses.delete("resp_nope")
    assert httpx.get(url + "/v1/responses/resp_nope").status_code == 401  # no key
    assert httpx.post(url + "/v1/responses", json={"input": ASK}).status_code == 401


def test_store_is_bounded_least_recently_used_first():
    store = ResponseStore(capacity=3)
    for i in range(3):
        store.put({"id": f"r{i}"}, [{"role": "user", "content": str(i)}])
    assert store.get("r0").conversation == ({"role": "user", "content": "0"},)  # r0 is now the most recent
    store.put({"id": "r3"}, [])
    assert len(store) == 3 and store.get("r1") is None and store.get("r0") is not None
    assert store.delete("r0") and not store.delete("r0")
    with pytest.raises(ValueError):
        ResponseStore(capacity=0)


def test_engine_failure_mid_stream_ends_with_error_and_failed():
    """No server: the stream of a request whose engine dies after its first output."""
    class Serving:
        model_name = MODEL

    def output(text):
        return RequestOutput("resp-ab", None, [1, 2], [CompletionOutput(0, text, [7], None, None)], False,
                             RequestMetrics(0.0))

    async def merged():
        yield 0, output("de")
        raise EngineDeadError("the engine died")

    async def events():
        responses = ResponsesServing(Serving())
        req = ResponsesRequest(input="x")
        turn = _Turn(req, req.to_sampling_params(), "resp_ab", "msg_ab", 0, [{"role": "user", "content": "x"}])
        it = merged()
        lines = [e async for e in responses._stream(turn, it, await it.__anext__())]
        return lines, len(responses.store)

    lines, stored = asyncio.run(events())
    kinds = [line.split("\n", 1)[0].removeprefix("event: ") for line in lines]
    assert kinds == [*STREAM_ORDER[:5], "error", "response.failed"] and stored == 0
    error, failed = (json.loads(line.split("data: ", 1)[1]) for line in lines[-2:])
    assert error["message"] == "the engine died" and error["code"] == "engine_dead"
    assert failed["response"]["status"] == "failed" and failed["response"]["error"]["code"] == "server_error"


# ------------------------------------------------------------------------------------------ field policy
REFUSED = [
    # a function tool without tool_choice means "auto", which a server without --enable-auto-tool-choice refuses
    ("tools", {"tools": [{"type": "function", "name": "f", "parameters": {}}]}, "tool_choice"),
    ("tool_choice", {"tool_choice": "required"}, "tool_choice"),
    ("input_image", {"input": [{"role": "user", "content": [
        {"type": "input_text", "text": "what is this"}, {"type": "input_image", "image_url": "https://x/y.png"}]}]},
     "input[0].content[1].type"),
    ("input_file", {"input": [{"role": "user", "content": [{"type": "input_file", "file_id": "f"}]}]},
     "input[0].content[0].type"),
    ("tool output item", {"input": [{"type": "function_call_output", "call_id": "c", "output": "1"}]},
     "input[0].call_id"),  # an output answering no earlier call
    ("xml format", {"text": {"format": {"type": "xml"}}}, "text.format.type"),
    ("json_schema without a schema", {"text": {"format": {"type": "json_schema", "name": "x"}}},
     "text.format.schema"),
    ("truncation auto", {"truncation": "auto"}, "truncation"),
    ("background", {"background": True}, "background"),
    ("conversation", {"conversation": "conv_1"}, "conversation"),
    ("logit_bias", {"logit_bias": {"1": 5}}, "logit_bias"),
    ("unknown role", {"input": [{"role": "wizard", "content": "hi"}]}, "input[0].role"),
    ("empty input", {"input": []}, "input"),
    ("no input", {"input": None}, "input"),
    ("max_output_tokens 0", {"max_output_tokens": 0}, "max_output_tokens"),
    ("top_logprobs 21", {"top_logprobs": 21}, "top_logprobs"),
]


@pytest.mark.parametrize("name,extra,param", REFUSED, ids=[r[0] for r in REFUSED])
def test_refused_fields_are_a_400_naming_them(url, name, extra, param):
    body = {"model": MODEL, "input": ASK, "max_output_tokens": 4, **extra}
    r = _post(url, {k: v for k, v in body.items() if v is not None})
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert error["param"] == param and error["type"] == "invalid_request_error"
    assert (param or "max_model_len").split("[")[0].split(".")[0] in error["message"]


def test_openai_client_sees_refusals_and_unknown_models(client):
    with pytest.raises(openai.BadRequestError, match="tools"):
        client.responses.create(model=MODEL, input=ASK, tools=[{"type": "web_search"}])
    with pytest.raises(openai.NotFoundError):
        client.responses.create(model="gpt-4o", input=ASK)


def test_inert_and_neutral_fields_are_accepted_and_change_nothing(url):
    base = {"model": MODEL, "input": ASK, "max_output_tokens": 10, "temperature": 0.0}
    inert = {"user": "u1", "reasoning": {"effort": "low"}, "service_tier": "auto",
             "include": ["reasoning.encrypted_content"], "top_logprobs": 2, "safety_identifier": "s",
             "prompt_cache_key": "k", "some_new_field": 1}
    neutral = {"tools": [], "tool_choice": "auto", "text": {"format": {"type": "text"}}, "truncation": "disabled",
               "parallel_tool_calls": False, "metadata": {"a": "b"}, "store": True, "stream": False,
               "previous_response_id": None}
    plain = _post(url, base)
    extra = _post(url, {**base, **inert, **neutral})
    assert plain.status_code == extra.status_code == 200, extra.text
    assert "x-jaxinfer-ignored-fields" not in plain.headers
    assert set(extra.headers["x-jaxinfer-ignored-fields"].split(",")) == set(inert)
    got = extra.json()
    assert got["output"][0]["content"][0]["text"] == plain.json()["output"][0]["content"][0]["text"]
    assert (got["user"], got["metadata"], got["parallel_tool_calls"]) == ("u1", {"a": "b"}, False)
    assert got["output"][0]["content"][0]["logprobs"] == []  # top_logprobs without the include: none
