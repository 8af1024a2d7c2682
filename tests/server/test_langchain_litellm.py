"""LangChain (``langchain-openai``'s ``ChatOpenAI``) and LiteLLM, unmodified, against one live server with the
embedded model and ``--tool-call-parser hermes --enable-auto-tool-choice``: structured outputs
(``with_structured_output`` json_schema / json_mode / function_calling, LiteLLM's ``response_format``), forced
tool calls (``bind_tools`` with required / named choices, LiteLLM's ``tools``), histories holding tool calls and
their results, and streamed tool calls against the non-streamed ones. Skipped where the clients are absent
(``pip install langchain-openai litellm``).

Every request body the server parses is recorded (``jaxinfer.server.app.parse`` wrapped for the module), so each
test asserts what the client actually sent and that nothing it sent was refused or ignored unexpectedly (the
ignored fields are the ones the server lists in ``x-jaxinfer-ignored-fields``).

The embedded model is tiny: its free text is nonsense, so the checks rest on what the constraints guarantee
(a schema-valid object, calls whose arguments validate) and on greedy decoding being deterministic. Free strings
in the schemas are bounded (``maxLength``) so that a constrained output ends well inside ``max_tokens``.
"""

from __future__ import annotations

import contextlib
import json
import os

import pytest

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")  # litellm: no cost-map download (no network here)

pytest.importorskip("fastapi")
pytest.importorskip("uvicorn")
openai = pytest.importorskip("openai")
jsonschema = pytest.importorskip("jsonschema")
langchain_openai = pytest.importorskip("langchain_openai")
litellm = pytest.importorskip("litellm")

from langchain_core.messages import AIMessage, HumanMessage, ToolMessage  # noqa: E402
from langchain_core.tools import tool  # noqa: E402
from pydantic import BaseModel, Field  # noqa: E402

import jaxinfer.server.app as server_app  # noqa: E402
from jaxinfer.server.protocol import APIError  # noqa: E402

MODEL = "jaxinfer-default"
litellm.suppress_debug_info = True


class Person(BaseModel):
    name: str = Field(max_length=12)
    age: int = Field(ge=0, le=120)


class Loose(BaseModel):
    """For json_mode: the server guarantees a JSON object, not these keys, so every field has a default."""

    name: str = "anon"
    age: int = 0


@tool
def get_weather(city: str) -> str:
    """Get the weather in a city."""
    return f"sunny in {city}"


@tool
def add(a: int, b: int) -> int:
    """Add two integers."""
    return a + b


TOOLS = [get_weather, add]
WEATHER = {"type": "function", "function": {"name": "get_weather", "description": "Get the weather in a city.",
                                            "parameters": {"type": "object", "properties": {
                                                "city": {"type": "string", "maxLength": 16}},
                                                "required": ["city"]}}}
ADD = {"type": "function", "function": {"name": "add", "description": "Add two integers.", "parameters": {
    "type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}}, "required": ["a", "b"]}}}


# ------------------------------------------------------------------------------------------ the server
class Recorder:
    """Every body the server parses: ``{"route", "body", "ignored", "error"}`` (error: (status, param, message))."""

    def __init__(self, parse):
        self.parse, self.entries = parse, []

    def __call__(self, model, raw, strict_fields=False):
        try:
            body = json.loads(raw)
        except ValueError:
            body = raw
        entry = {"route": model.__name__, "body": body, "ignored": None, "error": None}
        self.entries.append(entry)
        try:
            parsed, ignored = self.parse(model, raw, strict_fields)
        except APIError as exc:
            entry["error"] = (exc.status, exc.param, exc.message)
            raise
        entry["ignored"] = list(ignored)
        return parsed, ignored

    @contextlib.contextmanager
    def capture(self):
        """A list that holds, on leaving, the entries recorded inside the block."""
        start, out = len(self.entries), []
        yield out
        out.extend(self.entries[start:])


@pytest.fixture(scope="module")
def served(tools_server):
    """conftest's shared tool-calling server, every body it parses recorded while this module runs."""
    with pytest.MonkeyPatch.context() as mp:
        recorder = Recorder(server_app.parse)
        mp.setattr(server_app, "parse", recorder)
        yield tools_server[0], recorder


@pytest.fixture(scope="module")
def url(served):
    return served[0]


@pytest.fixture(scope="module")
def rec(served):
    return served[1]


def chat_model(url, **kw):
    kw = {"temperature": 0, "max_tokens": 64, **kw}
    return langchain_openai.ChatOpenAI(base_url=url + "/v1", api_key="x", model=MODEL, max_retries=0, timeout=120,
                                       **kw)


def served_ok(entries, n=1, ignored=()):
    """The ``n`` recorded bodies, each served (no refusal) with no ignored field beyond ``ignored``."""
    assert len(entries) == n, [e["body"] for e in entries]
    for e in entries:
        assert e["error"] is None, e
        assert set(e["ignored"]) <= set(ignored), (e["ignored"], e["body"])
    return [e["body"] for e in entries]


def check_calls(calls, body, n=None, names=None):
    """Each call (``(name, args dict)``) names a tool of the request body and its args validate against that
    tool's parameters schema as sent."""
    schemas = {t["function"]["name"]: t["function"]["parameters"] for t in body["tools"]}
    assert calls and (n is None or len(calls) == n), calls
    for name, args in calls:
        assert name in schemas and (names is None or name in names), (name, names)
        jsonschema.validate(args, schemas[name])


def lc_calls(message):
    return [(c["name"], c["args"]) for c in message.tool_calls]


# -------------------------------------------------------------------------------------------- LangChain
@pytest.mark.parametrize("strict", [None, True])
def test_langchain_structured_json_schema(url, rec, strict):
    with rec.capture() as sent:
        out = chat_model(url).with_structured_output(Person, method="json_schema", strict=strict,
                                                     include_raw=True).invoke("Give a person.")
    (body,) = served_ok(sent)
    rf = body["response_format"]
    assert rf["type"] == "json_schema" and rf["json_schema"]["name"] == "Person"
    assert rf["json_schema"]["strict"] is True  # LangChain sends strict whether asked or not
    assert out["parsing_error"] is None and isinstance(out["parsed"], Person)
    jsonschema.validate(json.loads(out["raw"].content), Person.model_json_schema())
    assert out["raw"].response_metadata["finish_reason"] == "stop"


def test_langchain_structured_json_mode(url, rec):
    """json_mode sends ``response_format: {"type": "json_object"}``, which guarantees a JSON object (when the output
    ends within max_tokens), not the keys the prompt describes: this model only closes the object early for some
    prompts (for many it writes one long key until max_tokens, and LangChain's ``parse`` call then raises
    LengthFinishReasonError), so the prompt is one it closes at temperature 0, and the model's fields have
    defaults."""
    with rec.capture() as sent:
        out = chat_model(url).with_structured_output(Loose, method="json_mode", include_raw=True).invoke(
            "Give a person as JSON.")
    (body,) = served_ok(sent)
    assert body["response_format"] == {"type": "json_object"}
    assert isinstance(json.loads(out["raw"].content), dict)
    assert out["parsing_error"] is None and isinstance(out["parsed"], Loose)


@pytest.mark.parametrize("strict", [None, True])
def test_langchain_structured_function_calling(url, rec, strict):
    with rec.capture() as sent:
        out = chat_model(url).with_structured_output(Person, method="function_calling", strict=strict,
                                                     include_raw=True).invoke("Give a person.")
    (body,) = served_ok(sent)
    assert body["tool_choice"] == {"type": "function", "function": {"name": "Person"}}
    assert body["parallel_tool_calls"] is False
    assert [t["function"].get("strict") for t in body["tools"]] == [strict]
    assert out["parsing_error"] is None and isinstance(out["parsed"], Person)
    check_calls(lc_calls(out["raw"]), body, n=1, names={"Person"})  # parallel_tool_calls false: one call
    assert out["raw"].response_metadata["finish_reason"] == "tool_calls"


@pytest.mark.parametrize("choice,parallel,sent_choice", [
    ("required", False, "required"),
    ("any", False, "required"),  # LangChain's name for required
    ("add", False, {"type": "function", "function": {"name": "add"}}),
    ("get_weather", None, {"type": "function", "function": {"name": "get_weather"}}),
])
def test_langchain_bind_tools_forced(url, rec, choice, parallel, sent_choice):
    # get_weather's city is a free string (LangChain's schema has no bound): 128 tokens leave it room to end
    bound = chat_model(url, max_tokens=128).bind_tools(TOOLS, tool_choice=choice, parallel_tool_calls=parallel)
    with rec.capture() as sent:
        msg = bound.invoke("What is the weather in Paris, and what is 2 + 3?")
    (body,) = served_ok(sent)
    assert body["tool_choice"] == sent_choice and body.get("parallel_tool_calls") == parallel
    assert [t["function"]["name"] for t in body["tools"]] == ["get_weather", "add"]
    assert isinstance(msg, AIMessage) and not msg.invalid_tool_calls
    names = None if choice in ("required", "any") else {choice}
    check_calls(lc_calls(msg), body, n=1 if parallel is False else None, names=names)
    assert msg.response_metadata["finish_reason"] == "tool_calls"


def test_langchain_history_with_tool_calls(url, rec):
    """An agent's turn: a forced call, the tool run by LangChain, its result sent back (assistant ``tool_calls``
    and a ``role: "tool"`` message), then a free answer and a forced one on that history."""
    model = chat_model(url)
    question = HumanMessage("What is the weather in Paris?")
    with rec.capture() as sent:
        first = model.bind_tools(TOOLS, tool_choice="get_weather", parallel_tool_calls=False).invoke([question])
        (call,) = first.tool_calls
        result = get_weather.invoke(call)  # a ToolMessage with the call's id
        history = [question, first, result]
        answer = model.bind_tools(TOOLS).invoke(history)  # tool_choice unset: auto
        plain = model.invoke(history)  # no tools in this request, calls in the history
        again = model.bind_tools(TOOLS, tool_choice="add", parallel_tool_calls=False).invoke(history)
    bodies = served_ok(sent, n=4)
    assert isinstance(result, ToolMessage) and result.tool_call_id == call["id"]
    for body in bodies[1:]:
        user, assistant, tool_msg = body["messages"]
        assert assistant["role"] == "assistant" and assistant["tool_calls"][0]["id"] == call["id"]
        assert json.loads(assistant["tool_calls"][0]["function"]["arguments"]) == call["args"]
        assert tool_msg == {"role": "tool", "tool_call_id": call["id"], "content": result.content}
    assert "tool_choice" not in bodies[1] and "tools" not in bodies[2]
    for msg in (answer, plain, again):
        assert isinstance(msg, AIMessage)
    # the history reached the prompt
    assert answer.usage_metadata["input_tokens"] > first.usage_metadata["input_tokens"]
    check_calls(lc_calls(again), bodies[3], n=1, names={"add"})


@pytest.mark.parametrize("choice", ["required", "add"])
def test_langchain_stream_tool_calls_equal_invoke(url, rec, choice):
    bound = chat_model(url, stream_usage=True).bind_tools(TOOLS, tool_choice=choice, parallel_tool_calls=False)
    prompt = "What is 2 + 3?"
    with rec.capture() as sent:
        whole = bound.invoke(prompt)
        total = None
        for chunk in bound.stream(prompt):
            total = chunk if total is None else total + chunk
    invoked, streamed = served_ok(sent, n=2)
    assert streamed["stream"] is True and streamed["stream_options"] == {"include_usage": True}
    assert lc_calls(total) == lc_calls(whole) and not total.invalid_tool_calls
    check_calls(lc_calls(total), invoked, n=1)
    assert total.response_metadata["finish_reason"] == whole.response_metadata["finish_reason"] == "tool_calls"
    assert total.usage_metadata["output_tokens"] == whole.usage_metadata["output_tokens"]


def test_langchain_sampling_fields(url, rec):
    """The fields ChatOpenAI's options become: honoured, except the ones that cannot change this model's output
    (``reasoning_effort``, ``service_tier``, ``user``), which are served and listed as ignored."""
    model = chat_model(url, max_tokens=8, seed=1, n=1, stop=["\n"], logprobs=True, top_logprobs=2,
                       presence_penalty=0.1, frequency_penalty=0.1, top_p=0.9, stream_usage=True)
    extras = chat_model(url, max_tokens=8, reasoning_effort="low", service_tier="auto", store=False,
                        model_kwargs={"user": "u"})
    with rec.capture() as sent:
        msg = model.invoke("hi")
        list(model.stream("hi"))
        extras.invoke("hi")
    plain, streamed, extra = sent
    served_ok([plain, streamed], n=2)
    served_ok([extra], ignored={"reasoning_effort", "service_tier", "user"})
    assert set(extra["ignored"]) == {"reasoning_effort", "service_tier", "user"}
    assert {"max_completion_tokens", "seed", "stop", "logprobs", "top_logprobs", "top_p"} <= set(plain["body"])
    assert len(msg.response_metadata["logprobs"]["content"][0]["top_logprobs"]) == 2


# ---------------------------------------------------------------------------------------------- LiteLLM
PREFIXES = ["openai", "hosted_vllm"]


def ll(url, prefix, **kw):
    kw = {"messages": [{"role": "user", "content": "Give a person."}], "max_tokens": 64, "temperature": 0, **kw}
    return litellm.completion(model=f"{prefix}/{MODEL}", api_base=url + "/v1", api_key="x", **kw)


def ll_calls(message):
    return [(c.function.name, json.loads(c.function.arguments)) for c in message.tool_calls or []]


@pytest.mark.parametrize("prefix", PREFIXES)
@pytest.mark.parametrize("form", ["pydantic", "dict"])
def test_litellm_response_format_json_schema(url, rec, prefix, form):
    # closed as OpenAI's strict mode requires (LiteLLM adds it to a pydantic class's schema): a schema open to other
    # keys lets this model add keys until max_tokens
    schema = {**Person.model_json_schema(), "additionalProperties": False}
    rf = Person if form == "pydantic" else {"type": "json_schema",
                                            "json_schema": {"name": "person", "schema": schema, "strict": True}}
    with rec.capture() as sent:
        resp = ll(url, prefix, response_format=rf)
    (body,) = served_ok(sent)
    assert body["response_format"]["type"] == "json_schema"
    assert body["response_format"]["json_schema"]["schema"]["properties"] == schema["properties"]
    assert resp.choices[0].finish_reason == "stop"
    jsonschema.validate(json.loads(resp.choices[0].message.content), schema)


@pytest.mark.parametrize("prefix", PREFIXES)
def test_litellm_json_object(url, rec, prefix):
    with rec.capture() as sent:
        resp = ll(url, prefix, messages=[{"role": "user", "content": "Give a person as JSON."}],
                  response_format={"type": "json_object"})
    (body,) = served_ok(sent)
    assert body["response_format"] == {"type": "json_object"}
    assert isinstance(json.loads(resp.choices[0].message.content), dict)


@pytest.mark.parametrize("prefix", PREFIXES)
@pytest.mark.parametrize("choice", ["required", "named"])
def test_litellm_tools_forced(url, rec, prefix, choice):
    tools = [WEATHER, ADD]
    tool_choice = "required" if choice == "required" else {"type": "function", "function": {"name": "add"}}
    with rec.capture() as sent:
        resp = ll(url, prefix, messages=[{"role": "user", "content": "What is 2 + 3?"}], tools=tools,
                  tool_choice=tool_choice, parallel_tool_calls=False)
    (body,) = served_ok(sent)
    assert body["tool_choice"] == tool_choice and body["parallel_tool_calls"] is False
    assert resp.choices[0].finish_reason == "tool_calls"
    check_calls(ll_calls(resp.choices[0].message), body, n=1, names=None if choice == "required" else {"add"})


@pytest.mark.parametrize("prefix", PREFIXES)
def test_litellm_stream_tool_calls_equal_completion(url, rec, prefix):
    kw = dict(messages=[{"role": "user", "content": "Weather in Paris?"}], tools=[WEATHER], tool_choice="required",
              parallel_tool_calls=False)
    with rec.capture() as sent:
        whole = ll(url, prefix, **kw)
        chunks = list(ll(url, prefix, stream=True, stream_options={"include_usage": True}, **kw))
    invoked, streamed = served_ok(sent, n=2)
    assert streamed["stream"] is True and streamed["stream_options"] == {"include_usage": True}
    built = litellm.stream_chunk_builder(chunks)
    assert ll_calls(built.choices[0].message) == ll_calls(whole.choices[0].message)
    check_calls(ll_calls(built.choices[0].message), invoked, n=1)
    assert built.choices[0].finish_reason == whole.choices[0].finish_reason == "tool_calls"
    assert built.usage.completion_tokens == whole.usage.completion_tokens


@pytest.mark.parametrize("prefix", PREFIXES)
def test_litellm_history_with_tool_calls(url, rec, prefix):
    history = [{"role": "user", "content": "Weather in Paris?"},
               {"role": "assistant", "content": None, "tool_calls": [
                   {"id": "call_1", "type": "function",
                    "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}]},
               {"role": "tool", "tool_call_id": "call_1", "content": "sunny"}]
    with rec.capture() as sent:
        free = ll(url, prefix, messages=history, tools=[WEATHER], max_tokens=16)
        forced = ll(url, prefix, messages=history, tools=[WEATHER], tool_choice="required", parallel_tool_calls=False)
    bodies = served_ok(sent, n=2)
    assert bodies[0]["messages"][1]["tool_calls"][0]["id"] == "call_1"
    assert bodies[0]["messages"][2] == history[2]
    assert free.choices[0].message.role == "assistant"
    check_calls(ll_calls(forced.choices[0].message), bodies[1], n=1)


@pytest.mark.parametrize("prefix", PREFIXES)
def test_litellm_sampling_fields(url, rec, prefix):
    """What LiteLLM passes through: all served; ``reasoning_effort`` is ignored (the model does not reason);
    vLLM's extras (``top_k``, ``min_p``, ``repetition_penalty``) are honoured; ``logit_bias`` (sent only when the
    caller gives it) is refused with a 400 naming it rather than silently sampling without it."""
    msgs = [{"role": "user", "content": "hi"}]
    with rec.capture() as sent:
        ll(url, prefix, messages=msgs, max_tokens=8, temperature=0.5, seed=1, n=2, stop=["\n"], logprobs=True,
           top_logprobs=2, presence_penalty=0.1, frequency_penalty=0.1, top_p=0.9)
        ll(url, prefix, messages=msgs, max_tokens=None, max_completion_tokens=8)
        ll(url, prefix, messages=msgs, max_tokens=8, reasoning_effort="low")
        if prefix == "hosted_vllm":
            ll(url, prefix, messages=msgs, max_tokens=8, top_k=5, min_p=0.1, repetition_penalty=1.1)
        else:
            ll(url, prefix, messages=msgs, max_tokens=8, extra_body={"top_k": 5})
        litellm.text_completion(model=f"{prefix}/{MODEL}", api_base=url + "/v1", api_key="x", prompt="def f(",
                                max_tokens=8)
        with pytest.raises(litellm.BadRequestError, match="logit_bias"):
            ll(url, prefix, messages=msgs, max_tokens=8, logit_bias={"1": 5})
    *ok, refused = sent
    served_ok(ok, n=5, ignored={"reasoning_effort"})
    assert [e["ignored"] for e in ok] == [[], [], ["reasoning_effort"], [], []]
    assert ok[1]["body"]["max_completion_tokens"] == 8 and ok[4]["route"] == "CompletionRequest"
    assert "top_k" in ok[3]["body"]
    assert refused["error"][:2] == (400, "logit_bias")
