"""Function tools in the Responses API (``/v1/responses``): one live server on the embedded model with the hermes
tool-call parser and auto tool choice, driven by the official ``openai`` client and, where it is installed, the
OpenAI Agents SDK. Forced calls (tool_choice required / named) are checked against their tools' JSON schemas;
round trips (function_call + function_call_output items, in the input or through previous_response_id) against
chat completions with the same conversation; streams against the SDK's own stream parser and the non-streamed
response; refusals for their ``param``. Tests without the server drive ``ResponsesServing`` with fake engines."""

from __future__ import annotations

import asyncio
import json

import pytest

openai = pytest.importorskip("openai")
httpx = pytest.importorskip("httpx")
jsonschema = pytest.importorskip("jsonschema")
pytest.importorskip("uvicorn")
pytest.importorskip("fastapi")

from pydantic import TypeAdapter  # noqa: E402

from jaxinfer.outputs import CompletionOutput, RequestMetrics, RequestOutput  # noqa: E402
from jaxinfer.server.chat_tools import make_tool_plan  # noqa: E402
from jaxinfer.server.options import ServerOptions  # noqa: E402
from jaxinfer.server.protocol import APIError, ChatCompletionRequest, parse  # noqa: E402
from jaxinfer.server.responses import ResponsesServing, _Turn  # noqa: E402
from jaxinfer.server.responses_protocol import ChatHistory, ResponsesRequest  # noqa: E402

MODEL = "jaxinfer-default"
ASK = "What is 2 + 3, and how is the weather in Paris?"
ADD = {"type": "function", "name": "add", "description": "Add two integers.",
       "parameters": {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
                      "required": ["a", "b"]}}
WEATHER = {"type": "function", "name": "get_weather", "description": "The weather in a city.", "strict": True,
           "parameters": {"type": "object", "properties": {"city": {"type": "string", "maxLength": 24}},
                          "required": ["city"], "additionalProperties": False}}
TOOLS = [ADD, WEATHER]
SCHEMAS = {t["name"]: t["parameters"] for t in TOOLS}
EVENTS = TypeAdapter(openai.types.responses.ResponseStreamEvent)


@pytest.fixture(scope="module")
def server(tools_server):
    return tools_server


@pytest.fixture(scope="module")
def url(server):
    return server[0]


@pytest.fixture(scope="module")
def client(url):
    return openai.OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0, timeout=120)


def _create(client, n=80, **kw):
    return client.responses.create(model=MODEL, max_output_tokens=n, temperature=0.0, **kw)


def _calls(response):
    return [item for item in response.output if item.type == "function_call"]


def _check_call(call):
    """A function_call item of a finished response: a given tool, arguments valid for its schema."""
    assert call.name in SCHEMAS and call.status == "completed"
    assert call.id.startswith("fc_") and call.call_id.startswith("call_")
    jsonschema.validate(json.loads(call.arguments), SCHEMAS[call.name])


def _chat_calls(calls):
    """Function call items as chat completions' assistant tool_calls."""
    return [{"id": c.call_id, "type": "function", "function": {"name": c.name, "arguments": c.arguments}}
            for c in calls]


def _chat_tools(tools):
    return [{"type": "function", "function": {k: v for k, v in t.items() if k != "type"}} for t in tools]


# ------------------------------------------------------------------------------------------- forced calls
def test_required_calls_validate_and_are_stored(client):
    resp = _create(client, input=ASK, tools=TOOLS, tool_choice="required")
    calls = _calls(resp)
    assert calls  # several, until max_output_tokens: parallel calls are allowed
    for call in calls:
        _check_call(call)
    assert len({c.call_id for c in calls}) == len(calls) and len({c.id for c in calls}) == len(calls)
    # the response echoes the tools and the choice (the Agents SDK reads them)
    assert [t.name for t in resp.tools] == ["add", "get_weather"] and resp.tool_choice == "required"
    assert resp.tools[1].strict is True and resp.tools[0].description == "Add two integers."
    assert resp.parallel_tool_calls is True
    assert client.responses.retrieve(resp.id).model_dump() == resp.model_dump()


def test_named_call_and_one_call_without_parallel(client):
    named = _create(client, input=ASK, tools=TOOLS, tool_choice={"type": "function", "name": "get_weather"})
    assert named.status == "completed" and [o.type for o in named.output] == ["function_call"]
    _check_call(named.output[0])
    assert named.output[0].name == "get_weather" and named.tool_choice.name == "get_weather"
    single = _create(client, input=ASK, tools=TOOLS, tool_choice="required", parallel_tool_calls=False)
    assert single.status == "completed" and [o.type for o in single.output] == ["function_call"]
    _check_call(single.output[0])
    assert single.parallel_tool_calls is False


def test_auto_and_none_answer_with_text(client):
    auto = _create(client, 12, input="def add(a, b):", tools=TOOLS)  # auto: the default with tools
    none = _create(client, 12, input="def add(a, b):", tools=TOOLS, tool_choice="none")
    assert auto.tool_choice == "auto" and none.tool_choice == "none"
    assert [o.type for o in none.output] == ["message"] and none.output_text
    assert auto.output and all(o.type in ("message", "function_call") for o in auto.output)


# ---------------------------------------------------------------------------------------------- round trips
def test_round_trip_in_input_and_through_previous_response_id(server, client):
    first = _create(client, input=ASK, tools=TOOLS, tool_choice="required", parallel_tool_calls=False)
    (call,) = first.output
    _check_call(call)
    output = {"type": "function_call_output", "call_id": call.call_id, "output": "5"}
    whole = [{"role": "user", "content": ASK}, call.model_dump(exclude_none=True), output]
    again = _create(client, 16, input=whole, tools=TOOLS, tool_choice="none")
    continued = _create(client, 16, input=[output], previous_response_id=first.id, tools=TOOLS, tool_choice="none")
    # the same conversation on chat completions: the same prompt, so the same greedy text
    messages = [{"role": "user", "content": ASK}, {"role": "assistant", "content": None,
                                                    "tool_calls": _chat_calls([call])},
                {"role": "tool", "tool_call_id": call.call_id, "content": "5"}]
    chat = client.chat.completions.create(model=MODEL, messages=messages, tools=_chat_tools(TOOLS),
                                          tool_choice="none", max_tokens=16, temperature=0.0)
    assert again.output_text == continued.output_text == chat.choices[0].message.content
    assert again.usage.input_tokens == continued.usage.input_tokens == chat.usage.prompt_tokens
    # the stored conversation holds the call and its output as the chat template reads them
    stored = server[1].state.responses.store.get(continued.id).conversation
    assert stored[1] == {"role": "assistant", "content": "", "tool_calls": [
        {"id": call.call_id, "type": "function", "function": {"name": call.name,
                                                              "arguments": json.loads(call.arguments)}}]}
    assert stored[2] == {"role": "tool", "tool_call_id": call.call_id, "content": "5"}
    assert stored[3] == {"role": "assistant", "content": continued.output_text}


def test_history_items_become_chat_template_messages():
    """Responses items -> the messages ChatMessage.template_dict gives for the same chat history."""
    items = [{"role": "user", "content": "hi"},
             {"type": "message", "role": "assistant", "id": "msg_1", "status": "completed",
              "content": [{"type": "output_text", "text": "Let me look.", "annotations": []}]},
             {"type": "function_call", "id": "fc_1", "call_id": "c1", "name": "add", "arguments": '{"a": 1, "b": 2}',
              "status": "completed"},
             {"type": "function_call", "call_id": "c2", "name": "get_weather", "arguments": '{"city": "Oslo"}'},
             {"type": "function_call_output", "call_id": "c1", "output": "3"},
             {"type": "function_call_output", "call_id": "c2",
              "output": [{"type": "input_text", "text": "sun"}, {"type": "input_text", "text": "ny"}]},
             {"type": "function_call", "call_id": "c3", "name": "add", "arguments": "not json"}]
    req, _ = parse(ResponsesRequest, json.dumps({"input": items}).encode())
    history = ChatHistory()
    req.add_input(history)
    chat = ChatCompletionRequest.model_validate({"messages": [
        {"role": "user", "content": "hi"},
        {"role": "assistant", "content": "Let me look.", "tool_calls": [
            {"id": "c1", "type": "function", "function": {"name": "add", "arguments": '{"a": 1, "b": 2}'}},
            {"id": "c2", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Oslo"}'}}]},
        {"role": "tool", "tool_call_id": "c1", "content": "3"},
        {"role": "tool", "tool_call_id": "c2", "content": "sunny"},
        {"role": "assistant", "content": "", "tool_calls": [
            {"id": "c3", "type": "function", "function": {"name": "add", "arguments": "not json"}}]}]})
    assert history.messages == chat.dicts()
    # an output must answer an earlier call
    req, _ = parse(ResponsesRequest, json.dumps({"input": items[4:5]}).encode())
    with pytest.raises(ValueError) as exc:
        req.add_input(ChatHistory())
    assert exc.value.field == "input[0].call_id"
    req.add_input(ChatHistory(history.messages[:2]))  # the call is in the earlier conversation: fine


# ----------------------------------------------------------------------------------------------- streaming
def test_stream_events_parse_in_the_sdk_and_equal_the_response(client):
    kw = dict(input=ASK, tools=TOOLS, tool_choice={"type": "function", "name": "add"})
    plain = _create(client, **kw)
    raw = list(_create(client, stream=True, **kw))
    kinds = [e.type for e in raw]
    assert kinds == ["response.created", "response.in_progress", "response.output_item.added",
                     "response.function_call_arguments.delta", "response.function_call_arguments.done",
                     "response.output_item.done", "response.completed"]
    assert [e.sequence_number for e in raw] == list(range(len(raw)))
    added, delta, done, item_done, completed = raw[2:]
    assert added.output_index == delta.output_index == done.output_index == item_done.output_index == 0
    assert added.item.type == "function_call" and added.item.status == "in_progress" and added.item.arguments == ""
    assert delta.item_id == done.item_id == added.item.id == item_done.item.id == completed.response.output[0].id
    assert delta.delta == done.arguments == item_done.item.arguments == plain.output[0].arguments
    assert item_done.item.status == "completed" and item_done.item.call_id == added.item.call_id
    assert (item_done.item.name, completed.response.output[0].name) == ("add", "add")
    # the SDK's stream helper accumulates the events into the same final response
    with client.responses.stream(model=MODEL, max_output_tokens=80, temperature=0.0, **kw) as stream:
        deltas = [e for e in stream if e.type == "response.function_call_arguments.delta"]
        final = stream.get_final_response()
    assert deltas[-1].snapshot == plain.output[0].arguments
    assert [(o.type, o.name, o.arguments) for o in final.output] == \
        [(o.type, o.name, o.arguments) for o in plain.output]
    assert final.usage.output_tokens == plain.usage.output_tokens
    assert client.responses.retrieve(final.id).output[0].call_id == final.output[0].call_id


def test_parallel_stream_indexes(client):
    events = list(_create(client, stream=True, input=ASK, tools=TOOLS, tool_choice="required"))
    final = events[-1].response
    added = [e for e in events if e.type == "response.output_item.added"]
    assert [e.output_index for e in added] == list(range(len(final.output))) and len(added) > 1
    for e in events:
        if e.type.startswith("response.function_call_arguments"):
            assert final.output[e.output_index].id == e.item_id
    done = [e.item for e in events if e.type == "response.output_item.done"]
    assert [d.model_dump() for d in done] == [o.model_dump() for o in final.output]


class _FakeServing:
    model_name = MODEL
    options = ServerOptions(enable_auto_tool_choice=True, tool_call_parser="hermes")
    tokenizer = None


def _output(text: str, finish_reason: str | None):
    return RequestOutput("resp-ab", None, [1, 2], [CompletionOutput(0, text, [7], None, finish_reason)],
                         finish_reason is not None, RequestMetrics(0.0))


def _fake_stream(body: dict, chunks: list[str]) -> tuple[list[dict], dict]:
    """The events of streaming ``chunks`` of model text for the request ``body`` (no engine), and the
    non-streamed response of the same text."""
    req, _ = parse(ResponsesRequest, json.dumps(body).encode())
    responses = ResponsesServing(_FakeServing())
    plan = responses._plan(req)
    texts = ["".join(chunks[:i + 1]) for i in range(len(chunks))]

    async def merged():
        for i, text in enumerate(texts):
            yield 0, _output(text, "stop" if i == len(texts) - 1 else None)

    async def run():
        turn = _Turn(req, plan.apply(req.to_sampling_params()), "resp_ab", "msg_ab", 0,
                     [{"role": "user", "content": "x"}], plan)
        it = merged()
        lines = [line async for line in responses._stream(turn, it, await it.__anext__())]
        return lines, responses._finish(turn, _output(texts[-1], "stop"))

    lines, plain = asyncio.run(run())
    return [json.loads(line.split("data: ", 1)[1]) for line in lines], plain


def test_content_and_calls_stream_as_items_in_order():
    """Text, two calls, more text: a message, the calls, a second message; each event as the SDK types it and
    the SDK's stream state accumulating them into the final response."""
    call = '<tool_call>\n{"name": "add", "arguments": {"a": 1, "b": 2}}\n</tool_call>'
    weather = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Oslo"}}\n</tool_call>'
    chunks = ["Let me ", "add.\n", call[:15], call[15:], "\n", weather, "\nDone", "."]
    events, plain = _fake_stream({"input": "x", "tools": TOOLS}, chunks)
    from openai.lib.streaming.responses import ResponseStreamState

    state = ResponseStreamState(input_tools=TOOLS, text_format=openai.omit)
    for event in events:
        state.handle_event(EVENTS.validate_python(event))
    final = events[-1]["response"]
    assert [(o["type"], o.get("name")) for o in final["output"]] == \
        [("message", None), ("function_call", "add"), ("function_call", "get_weather"), ("message", None)]
    assert final["output"][0]["content"][0]["text"] == "Let me add."
    assert final["output"][3]["content"][0]["text"] == "Done."
    assert [json.loads(o["arguments"]) for o in final["output"][1:3]] == [{"a": 1, "b": 2}, {"city": "Oslo"}]
    assert final["status"] == "completed" and all(o["status"] == "completed" for o in final["output"])
    assert state._completed_response.output[1].arguments == final["output"][1]["arguments"]
    kinds = [e["type"] for e in events]
    assert kinds[2:6] == ["response.output_item.added", "response.content_part.added",
                          "response.output_text.delta", "response.output_text.delta"]
    assert kinds.count("response.output_item.added") == kinds.count("response.output_item.done") == 4
    # without streaming: the text outside the calls in one message, then the calls
    assert [(o["type"], o.get("name")) for o in plain["output"]] == \
        [("message", None), ("function_call", "add"), ("function_call", "get_weather")]
    assert plain["output"][0]["content"][0]["text"] == "Let me add.\n\n\nDone."
    assert [o["arguments"] for o in plain["output"][1:]] == [o["arguments"] for o in final["output"][1:3]]


def test_calls_only_stream_has_no_message_and_an_unparsed_call_is_text():
    call = '<tool_call>\n{"name": "add", "arguments": {"a": 4, "b": 5}}\n</tool_call>'
    events, plain = _fake_stream({"input": "x", "tools": TOOLS}, [call[:20], call[20:]])
    assert [o["type"] for o in events[-1]["response"]["output"]] == [o["type"] for o in plain["output"]] == \
        ["function_call"]
    broken = '<tool_call>\n{"name": "add", "arguments": 3}\n</tool_call>'
    events, plain = _fake_stream({"input": "x", "tools": TOOLS}, [broken])
    assert [o["type"] for o in events[-1]["response"]["output"]] == ["message"]
    assert plain["output"][0]["content"][0]["text"] == broken


# ------------------------------------------------------------------------------------------------ refusals
REFUSED = [
    ("hosted tool", {"tools": [ADD, {"type": "web_search"}]}, "tools[1].type"),
    ("file_search tool", {"tools": [{"type": "file_search", "vector_store_ids": ["v"]}]}, "tools[0].type"),
    ("unknown named tool", {"tools": TOOLS, "tool_choice": {"type": "function", "name": "nope"}}, "tool_choice"),
    ("hosted tool_choice", {"tools": TOOLS, "tool_choice": {"type": "file_search"}}, "tool_choice"),
    ("bad tool_choice", {"tools": TOOLS, "tool_choice": "always"}, "tool_choice"),
    ("required without tools", {"tool_choice": "required"}, "tool_choice"),
    ("duplicate names", {"tools": [ADD, ADD]}, "tools[1].name"),
    ("nameless tool", {"tools": [{"type": "function"}]}, "tools[0].name"),
    ("output without call", {"input": [{"type": "function_call_output", "call_id": "c", "output": "1"}]},
     "input[0].call_id"),
    ("call without name", {"input": [{"type": "function_call", "call_id": "c", "arguments": "{}"}]},
     "input[0].name"),
    ("reasoning item", {"input": [{"type": "reasoning", "id": "rs_1", "summary": []}]}, "input[0].type"),
    ("image in an output", {"input": [
        {"type": "function_call", "call_id": "c", "name": "add", "arguments": "{}"},
        {"type": "function_call_output", "call_id": "c", "output": [{"type": "input_image", "image_url": "x"}]}]},
     "input[1].output[0].type"),
    ("logprobs with tools", {"tools": TOOLS, "include": ["message.output_text.logprobs"]}, "include"),
    ("uncompilable schema", {"tools": [{**ADD, "parameters": {"type": "object", "properties": {
        "a": {"type": "string", "pattern": "(?<=x)y"}}}}], "tool_choice": "required"}, "tools"),
]


@pytest.mark.parametrize("name,extra,param", REFUSED, ids=[r[0] for r in REFUSED])
def test_refusals_are_400s_naming_the_field(url, name, extra, param):
    body = {"model": MODEL, "input": ASK, "max_output_tokens": 4, **extra}
    r = httpx.post(url + "/v1/responses", json=body, timeout=60)
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert error["param"] == param and error["type"] == "invalid_request_error", error


def test_openai_client_sees_the_refusal(client):
    with pytest.raises(openai.BadRequestError, match=r"tools\[0\]\.type"):
        client.responses.create(model=MODEL, input=ASK, tools=[{"type": "web_search"}])


def test_auto_needs_the_server_flags():
    """On a server without --enable-auto-tool-choice / --tool-call-parser, "auto" (the default with tools) is a
    400 naming tool_choice; required and named are planned (forced in hermes' format)."""
    class Serving(_FakeServing):
        options = ServerOptions()

        def check_model(self, name):
            pass

    responses = ResponsesServing(Serving())
    for choice in (None, "auto"):
        body = {"input": "x", "tools": TOOLS, **({"tool_choice": choice} if choice else {})}
        req, _ = parse(ResponsesRequest, json.dumps(body).encode())
        with pytest.raises(APIError) as exc:
            asyncio.run(responses.create(req, None))
        assert exc.value.status == 400 and exc.value.param == "tool_choice"
        assert "--enable-auto-tool-choice" in exc.value.message
    for choice, mode in (("required", "required"), ({"type": "function", "name": "add"}, "named"), ("none", "none")):
        req, _ = parse(ResponsesRequest, json.dumps({"input": "x", "tools": TOOLS, "tool_choice": choice}).encode())
        plan = responses._plan(req)
        assert plan.mode == mode and (plan.constraint is None) == (mode == "none")
    # the same plan chat completions makes for the same tools
    chat = make_tool_plan("required", _chat_tools(TOOLS), "required", False, ServerOptions(), None)
    req, _ = parse(ResponsesRequest, json.dumps({"input": "x", "tools": TOOLS, "tool_choice": "required",
                                                 "parallel_tool_calls": False}).encode())
    assert responses._plan(req).constraint == chat.constraint


# ------------------------------------------------------------------------------------------- the Agents SDK
def _agent(model_class, url):
    agents = pytest.importorskip("agents")
    agents.set_tracing_disabled(True)
    seen = []

    @agents.function_tool
    def add(a: int, b: int) -> int:
        """Add two integers."""
        seen.append({"a": a, "b": b})
        return a + b

    model = model_class(model=MODEL, openai_client=openai.AsyncOpenAI(base_url=url + "/v1", api_key="unused",
                                                                      max_retries=0, timeout=120))
    agent = agents.Agent(name="adder", instructions="Add the numbers with the tool.", tools=[add], model=model,
                         model_settings=agents.ModelSettings(tool_choice="required", parallel_tool_calls=False,
                                                             temperature=0.0, max_tokens=60),
                         tool_use_behavior="stop_on_first_tool")
    return agents, agent, add, seen


@pytest.mark.parametrize("model_class", ["OpenAIResponsesModel", "OpenAIChatCompletionsModel"])
def test_agents_sdk_function_tool(url, model_class):
    agents = pytest.importorskip("agents")
    agents, agent, add, seen = _agent(getattr(agents, model_class), url)
    result = asyncio.run(agents.Runner.run(agent, "What is 2 + 3?"))
    (args,) = seen
    jsonschema.validate(args, add.params_json_schema)
    assert result.final_output == str(args["a"] + args["b"])  # the SDK hands tool results on as text
    calls = [i for i in result.new_items if i.type == "tool_call_item"]
    assert len(calls) == 1 and calls[0].raw_item.name == "add"


def test_agents_sdk_sends_the_tool_result_back(server, url):
    """run_llm_again: the SDK's second request carries its own function_call and function_call_output items.
    The server renders and answers it; the tiny model then writes until max_tokens, which the SDK reports as a
    ModelBehaviorError (an incomplete response), so the check is on the stored conversation of that answer."""
    agents = pytest.importorskip("agents")
    agents, agent, add, seen = _agent(agents.OpenAIResponsesModel, url)
    store = server[1].state.responses.store
    with pytest.raises(agents.exceptions.ModelBehaviorError, match="max_output_tokens"):
        asyncio.run(agents.Runner.run(agent.clone(tool_use_behavior="run_llm_again"), "What is 2 + 3?", max_turns=2))
    (args,) = seen
    first, second = list(store._items.values())[-2:]
    (call,) = first.response["output"]
    assert call["type"] == "function_call" and json.loads(call["arguments"]) == args
    assert second.response["status"] == "incomplete" and second.response["tool_choice"] == "auto"  # reset
    assert second.conversation[-3:-1] == (
        {"role": "assistant", "content": "", "tool_calls": [
            {"id": call["call_id"], "type": "function", "function": {"name": "add", "arguments": args}}]},
        {"role": "tool", "tool_call_id": call["call_id"], "content": str(args["a"] + args["b"])})


# ------------------------------------------------------------------------------------ structured outputs
FORMAT_SCHEMA = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 12},
                                                  "rain": {"type": "boolean"}},
                 "required": ["city", "rain"], "additionalProperties": False}


def test_text_format_json_schema_and_object(client):
    import jsonschema

    fmt = {"type": "json_schema", "name": "weather", "schema": FORMAT_SCHEMA, "strict": True}
    resp = client.responses.create(model=MODEL, input="The weather as JSON.", max_output_tokens=80, temperature=0,
                                   text={"format": fmt})
    assert resp.status == "completed"
    jsonschema.validate(json.loads(resp.output_text), FORMAT_SCHEMA)
    assert resp.text.format.type == "json_schema" and resp.text.format.name == "weather"
    streamed = "".join(e.delta for e in client.responses.create(
        model=MODEL, input="The weather as JSON.", max_output_tokens=80, temperature=0, text={"format": fmt},
        stream=True) if e.type == "response.output_text.delta")
    assert streamed == resp.output_text
    resp = client.responses.create(model=MODEL, input="Any JSON object.", max_output_tokens=40, temperature=0,
                                   text={"format": {"type": "json_object"}})
    assert resp.output_text.startswith("{")


def test_text_format_errors_name_the_field(client):
    with pytest.raises(openai.BadRequestError) as err:
        client.responses.create(model=MODEL, input="x", text={"format": {"type": "json_schema", "name": "x",
                                                                          "schema": {"type": "nonsense"}}})
    assert err.value.body["param"] == "text.format"
    with pytest.raises(openai.BadRequestError) as err:
        client.responses.create(model=MODEL, input="x", tools=TOOLS, tool_choice="required",
                                text={"format": {"type": "json_object"}})
    assert err.value.body["param"] == "tool_choice"
