"""Structured outputs and tool calling through the server, driven by the official ``openai`` client: every
finished constrained output validates (``jsonschema``), forced tool calls name a given tool with arguments that
validate, streamed tool calls equal the non-streamed ones, a tool history renders, and every misuse is a 400
whose ``param`` names the field. The server is conftest's ``tools_server`` (``--tool-call-parser hermes
--enable-auto-tool-choice``)."""

from __future__ import annotations

import json
import re

import pytest

openai = pytest.importorskip("openai")
jsonschema = pytest.importorskip("jsonschema")

from jaxinfer.server.chat_template import ChatTemplate  # noqa: E402
from jaxinfer.server.chat_tools import closed_schema, make_tool_plan  # noqa: E402
from jaxinfer.server.options import ServerOptions  # noqa: E402
from jaxinfer.server.protocol import FieldError  # noqa: E402

MODEL = "jaxinfer-default"
CITY = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 20},
                                         "temperature": {"type": "number", "minimum": -50, "maximum": 60},
                                         "sunny": {"type": "boolean"}},
        "required": ["city", "temperature", "sunny"], "additionalProperties": False}
WEATHER = {"type": "function", "function": {"name": "get_weather", "description": "the weather in a city",
                                            "parameters": {"type": "object",
                                                           "properties": {"city": {"type": "string", "maxLength": 20},
                                                                          "unit": {"enum": ["c", "f"]}},
                                                           "required": ["city", "unit"]}}}
ADD = {"type": "function", "function": {"name": "add", "parameters": {
    "type": "object", "properties": {"a": {"type": "integer", "minimum": 0, "maximum": 99},
                                     "b": {"type": "integer", "minimum": 0, "maximum": 99}}, "required": ["a", "b"]}}}
TOOLS = [WEATHER, ADD]
ASK = [{"role": "user", "content": "What is the weather in Paris?"}]


@pytest.fixture(scope="module")
def client(tools_server):
    return openai.OpenAI(base_url=tools_server[0] + "/v1", api_key="x", max_retries=0, timeout=120)


def _chat(client, **kw):
    return client.chat.completions.create(model=MODEL, messages=kw.pop("messages", ASK),
                                          **{"max_tokens": 120, "temperature": 0, **kw})


def _valid_calls(calls, tools=TOOLS):
    schemas = {t["function"]["name"]: t["function"]["parameters"] for t in tools}
    assert calls
    for call in calls:
        assert call.type == "function" and call.id.startswith("call_")
        jsonschema.validate(json.loads(call.function.arguments), schemas[call.function.name])


def _bad_request(fn, param):
    with pytest.raises(openai.BadRequestError) as err:
        fn()
    assert err.value.body["param"] == param, err.value.body
    return err.value.body["message"]


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_response_format_json_schema_and_object(client, temperature):
    for n in range(2):
        r = _chat(client, temperature=temperature, seed=n, response_format={
            "type": "json_schema", "json_schema": {"name": "city", "schema": CITY, "strict": True}})
        assert r.choices[0].finish_reason == "stop"
        jsonschema.validate(json.loads(r.choices[0].message.content), CITY)
    r = _chat(client, temperature=temperature, max_tokens=60, response_format={"type": "json_object"})
    content = r.choices[0].message.content
    assert content.startswith("{")
    if r.choices[0].finish_reason == "stop":
        assert isinstance(json.loads(content), dict)


def test_structured_outputs_field_and_aliases_on_completions(client):
    r = client.completions.create(model=MODEL, prompt="Is it sunny?", max_tokens=10, n=3, temperature=1.0, seed=1,
                                  extra_body={"structured_outputs": {"choice": ["yes", "no"]}})
    assert {c.text for c in r.choices} <= {"yes", "no"}
    r = client.completions.create(model=MODEL, prompt="A code:", max_tokens=12, temperature=1.0,
                                  extra_body={"structured_outputs": {"regex": r"[A-Z]{2}-[0-9]{3}"}})
    assert re.fullmatch(r"[A-Z]{2}-[0-9]{3}", r.choices[0].text)
    r = client.completions.create(model=MODEL, prompt="Answer:", max_tokens=10,
                                  extra_body={"guided_choice": ["left", "right"]})
    assert r.choices[0].text in ("left", "right")
    r = client.completions.create(model=MODEL, prompt="City:", max_tokens=120,
                                  extra_body={"guided_json": CITY})
    jsonschema.validate(json.loads(r.choices[0].text), CITY)
    r = _chat(client, extra_body={"structured_outputs": {"json": CITY}})
    jsonschema.validate(json.loads(r.choices[0].message.content), CITY)


def test_streamed_constrained_output_equals_the_whole(client):
    kw = dict(response_format={"type": "json_schema", "json_schema": {"name": "city", "schema": CITY}})
    whole = _chat(client, **kw).choices[0].message.content
    pieces = [c.choices[0].delta.content or "" for c in _chat(client, stream=True, **kw) if c.choices]
    assert "".join(pieces) == whole


def test_constraint_errors_name_the_field(client):
    _bad_request(lambda: _chat(client, response_format={"type": "json_schema", "json_schema": {
        "name": "x", "schema": {"type": "nonsense"}}}), "response_format")
    _bad_request(lambda: client.completions.create(model=MODEL, prompt="x", extra_body={
        "structured_outputs": {"regex": "a(b"}}), "structured_outputs")
    _bad_request(lambda: _chat(client, response_format={"type": "json_object"},
                               extra_body={"guided_regex": "a+"}), "guided_regex")
    _bad_request(lambda: _chat(client, extra_body={"structured_outputs": {"json": {}, "regex": "a"}}),
                 "structured_outputs")
    _bad_request(lambda: _chat(client, extra_body={"structured_outputs": {"jsonn": {}}}), "structured_outputs.jsonn")
    _bad_request(lambda: _chat(client, response_format={"type": "xml"}), "response_format.type")
    _bad_request(lambda: _chat(client, response_format={"type": "json_object"}, extra_body={"ignore_eos": True}),
                 "ignore_eos")


def test_tool_choice_required_named_and_single(client):
    r = _chat(client, tools=TOOLS, tool_choice="required", parallel_tool_calls=False)
    assert r.choices[0].finish_reason == "tool_calls"
    _valid_calls(r.choices[0].message.tool_calls)
    assert len(r.choices[0].message.tool_calls) == 1
    r = _chat(client, tools=TOOLS, tool_choice={"type": "function", "function": {"name": "get_weather"}})
    calls = r.choices[0].message.tool_calls
    _valid_calls(calls)
    assert [c.function.name for c in calls] == ["get_weather"] and r.choices[0].finish_reason == "tool_calls"
    for seed in range(3):  # sampled: still valid calls
        r = _chat(client, tools=TOOLS, tool_choice="required", parallel_tool_calls=False, temperature=1.0, seed=seed)
        _valid_calls(r.choices[0].message.tool_calls)


def test_tool_choice_auto_and_none(client):
    r = _chat(client, tools=TOOLS, max_tokens=16)  # auto (the default with tools): the model decides
    assert r.choices[0].finish_reason in ("stop", "length", "tool_calls")
    r = _chat(client, tools=TOOLS, tool_choice="none", max_tokens=16)
    assert not r.choices[0].message.tool_calls


def test_streamed_tool_calls_equal_the_whole(client):
    kw = dict(tools=TOOLS, tool_choice={"type": "function", "function": {"name": "add"}})
    whole = _chat(client, **kw).choices[0].message.tool_calls
    calls: dict[int, dict] = {}
    finish = None
    for chunk in _chat(client, stream=True, **kw):
        if not chunk.choices:
            continue
        finish = chunk.choices[0].finish_reason or finish
        for d in chunk.choices[0].delta.tool_calls or []:
            call = calls.setdefault(d.index, {"name": "", "arguments": "", "id": None})
            call["id"] = call["id"] or d.id
            call["name"] += (d.function.name or "") if d.function else ""
            call["arguments"] += (d.function.arguments or "") if d.function else ""
    assert finish == "tool_calls"
    assert [(c["name"], c["arguments"]) for _, c in sorted(calls.items())] == \
        [(c.function.name, c.function.arguments) for c in whole]
    assert all(c["id"].startswith("call_") for c in calls.values())


def test_tool_history_renders_and_answers(client):
    history = ASK + [
        {"role": "assistant", "content": None, "tool_calls": [{"id": "call_1", "type": "function", "function": {
            "name": "get_weather", "arguments": json.dumps({"city": "Paris", "unit": "c"})}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "21 C and sunny"}]
    r = _chat(client, messages=history, tools=TOOLS, tool_choice="none", max_tokens=8)
    assert r.choices[0].message.content is not None and r.usage.prompt_tokens > 0
    r = _chat(client, messages=history, tools=TOOLS, tool_choice="required", parallel_tool_calls=False)
    _valid_calls(r.choices[0].message.tool_calls)


def test_tool_errors_name_the_field(client):
    _bad_request(lambda: _chat(client, tools=TOOLS, tool_choice={"type": "function", "function": {"name": "nope"}}),
                 "tool_choice")
    _bad_request(lambda: _chat(client, tool_choice="required"), "tool_choice")
    _bad_request(lambda: _chat(client, tools=[{"type": "code_interpreter", "function": {"name": "x"}}]),
                 "tools[0].type")
    bad = {"type": "function", "function": {"name": "broken", "parameters": {"type": "nonsense"}}}
    message = _bad_request(lambda: _chat(client, tools=[bad], tool_choice="required"), "tools")
    assert "broken" in message
    _bad_request(lambda: _chat(client, tools=TOOLS, tool_choice="required",
                               response_format={"type": "json_object"}), "tool_choice")


def test_auto_needs_the_server_flags():
    with pytest.raises(FieldError, match="enable-auto-tool-choice") as err:
        make_tool_plan("auto", TOOLS, None, True, ServerOptions(), None)
    assert err.value.field == "tool_choice"
    with pytest.raises(ValueError, match="needs --tool-call-parser"):
        ServerOptions(enable_auto_tool_choice=True)
    with pytest.raises(ValueError, match="unknown tool-call parser"):
        ServerOptions(tool_call_parser="nope")


def test_chat_template_receives_tools_and_history():
    template = ChatTemplate("{% for t in tools %}[{{ t.function.name }}]{% endfor %}"
                            "{% for m in messages %}{{ m.role }}:{{ m.content }}"
                            "{% for c in m.tool_calls or [] %}<{{ c.function.name }} {{ c.function.arguments | tojson }}>"
                            "{% endfor %}{% if m.tool_call_id %}#{{ m.tool_call_id }}{% endif %};{% endfor %}")
    messages = [{"role": "assistant", "content": "", "tool_calls": [
        {"id": "c1", "type": "function", "function": {"name": "add", "arguments": {"a": 1}}}]},
        {"role": "tool", "content": "2", "tool_call_id": "c1"}]
    assert template.render(messages, tools=TOOLS) == '[get_weather][add]assistant:<add {"a": 1}>;tool:2#c1;'


def test_closed_schema_closes_declared_objects_only():
    schema = {"type": "object", "properties": {"p": {"type": "object", "properties": {"q": {}}},
                                               "free": {"type": "object"},
                                               "open": {"type": "object", "properties": {},
                                                        "additionalProperties": True}}}
    closed = closed_schema(schema)
    assert closed["additionalProperties"] is False and closed["properties"]["p"]["additionalProperties"] is False
    assert "additionalProperties" not in closed["properties"]["free"]
    assert closed["properties"]["open"]["additionalProperties"] is True
    assert "additionalProperties" not in schema  # a copy
