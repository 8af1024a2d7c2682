"""jaxinfer.server.tool_parsers: extract, streaming and the llguidance constraint of each parser.

Streaming is checked against extract on the same text, fed in every way: one character at a time, in two pieces
split at every boundary, and in random chunkings (fixed seed). The promise checked is exact: the content pieces
concatenate to ``extract(text).content or ""`` (extract strips the content; the stream drops leading whitespace
and holds trailing whitespace until more content follows), and per call index the name and the concatenated
argument pieces equal extract's. The constraint is checked with llguidance on the embedded model's tokenizer,
and by sampling random tokens under its mask: whatever comes out, extract reads as valid calls.
"""

from __future__ import annotations

import itertools
import json
import random
import re
from pathlib import Path

import jsonschema
import llguidance
import llguidance.numpy as llnp
import numpy as np
import pytest

from jaxinfer.server.tool_parsers import TOOL_PARSERS, ToolCall, get_tool_parser

TOKENIZER_JSON = Path(__file__).resolve().parents[2] / "jaxinfer" / "embedded_models" / "default" / "tokenizer.json"


@pytest.fixture(scope="module")
def tokenizer():
    return llguidance.LLTokenizer(TOKENIZER_JSON.read_text(), eos_token=0)


def parser(name):
    counter = itertools.count()
    return get_tool_parser(name, id_factory=lambda: f"call_{next(counter):024d}")


WEATHER = {"city": "Paris", "unit": "celsius"}
TIME = {"tz": "Europe/Paris"}

# (label, text, content, [(name, arguments)])
CASES = {
    "hermes": [
        ("single", '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris", "unit": "celsius"}}\n'
                   '</tool_call>', None, [("get_weather", WEATHER)]),
        ("multiple", '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris", "unit": "celsius"}}\n'
                     '</tool_call>\n<tool_call>\n{"name": "get_time", "arguments": {"tz": "Europe/Paris"}}\n'
                     '</tool_call>', None, [("get_weather", WEATHER), ("get_time", TIME)]),
        ("leading content", 'Let me check that for you.\n\n<tool_call>\n{"name": "get_time", "arguments": '
                            '{"tz": "Europe/Paris"}}\n</tool_call>\n', "Let me check that for you.",
         [("get_time", TIME)]),
        ("content between", 'First: <tool_call>{"name": "get_time", "arguments": {"tz": "Europe/Paris"}}'
                            '</tool_call> then <b>bold</b> and <tool_c', "First:  then <b>bold</b> and <tool_c",
         [("get_time", TIME)]),
        ("malformed", 'Sure.\n<tool_call>\n{"name": "get_time", "arguments": {"tz": }\n</tool_call>',
         'Sure.\n<tool_call>\n{"name": "get_time", "arguments": {"tz": }\n</tool_call>', []),
        ("malformed then valid", '<tool_call>\n{"name": 3}\n</tool_call>\n<tool_call>\n{"name": "get_time", '
                                 '"arguments": {"tz": "Europe/Paris"}}\n</tool_call>',
         '<tool_call>\n{"name": 3}\n</tool_call>', [("get_time", TIME)]),
        ("not json", "<tool_call>get_time(tz='CET')</tool_call> ok", "<tool_call>get_time(tz='CET')</tool_call> ok",
         []),
        ("unterminated", '<tool_call>\n{"name": "get_time", "arguments": {"tz": "Europe/Paris"}}\n', None,
         [("get_time", TIME)]),
        ("unicode", '<tool_call>\n{"name": "say", "arguments": {"text": "h\\u00e9llo \u4e16\u754c", "n": [1, 2.5, '
                    'null, true]}}\n</tool_call>', None, [("say", {"text": "h\u00e9llo \u4e16\u754c",
                                                                   "n": [1, 2.5, None, True]})]),
        ("no calls", "  The weather in Paris is sunny.\n\nEnjoy!  ", "The weather in Paris is sunny.\n\nEnjoy!", []),
        ("empty", "", None, []),
    ],
    "llama3_json": [
        ("single", '{"name": "get_weather", "parameters": {"city": "Paris", "unit": "celsius"}}', None,
         [("get_weather", WEATHER)]),
        ("python tag, arguments", '<|python_tag|>{"name": "get_time", "arguments": {"tz": "Europe/Paris"}}', None,
         [("get_time", TIME)]),
        ("multiple", '<|python_tag|>{"name": "get_weather", "parameters": {"city": "Paris", "unit": "celsius"}}; '
                     '{"name": "get_time", "parameters": {"tz": "Europe/Paris"}}\n',
         None, [("get_weather", WEATHER), ("get_time", TIME)]),
        ("leading whitespace", '\n {"name": "get_time", "parameters": {"tz": "Europe/Paris"}};{"name": "get_time", '
                               '"parameters": {"tz": "Europe/Paris"}}', None, [("get_time", TIME)] * 2),
        ("leading content", 'Let me check. <|python_tag|>{"name": "get_time", "parameters": {"tz": "Europe/Paris"}}',
         "Let me check.", [("get_time", TIME)]),
        ("trailing content", '{"name": "get_time", "parameters": {"tz": "Europe/Paris"}} Done; ok',
         "Done; ok", [("get_time", TIME)]),
        ("malformed", '{"name": "get_weather", "parameters": {"city": }}',
         '{"name": "get_weather", "parameters": {"city": }}', []),
        ("malformed second", '{"name": "get_time", "parameters": {"tz": "Europe/Paris"}}; {"name": oops}',
         '; {"name": oops}', [("get_time", TIME)]),
        ("plain json", '{"answer": 42, "parameters": {}}', '{"answer": 42, "parameters": {}}', []),
        ("json mid text", 'Use {"name": "get_time", "parameters": {}} next time.',
         'Use {"name": "get_time", "parameters": {}} next time.', []),
        ("tag then prose", "<|python_tag|>brave_search.call(query='x')", "<|python_tag|>brave_search.call(query='x')",
         []),
        ("no calls", "The weather is nice today.", "The weather is nice today.", []),
    ],
    "mistral": [
        ("single", '[TOOL_CALLS] [{"name": "get_weather", "arguments": {"city": "Paris", "unit": "celsius"}}]',
         None, [("get_weather", WEATHER)]),
        ("multiple", '[TOOL_CALLS][{"name": "get_weather", "arguments": {"city": "Paris", "unit": "celsius"}}, '
                     '{"name": "get_time", "arguments": "{\\"tz\\": \\"Europe/Paris\\"}"}]',
         None, [("get_weather", WEATHER), ("get_time", TIME)]),
        ("leading content", 'I will look it up.\n[TOOL_CALLS] [{"name": "get_time", "arguments": '
                            '{"tz": "Europe/Paris"}}]</s>', "I will look it up.\n</s>", [("get_time", TIME)]),
        ("single object", '[TOOL_CALLS] {"name": "get_time", "arguments": {"tz": "Europe/Paris"}}', None,
         [("get_time", TIME)]),
        ("malformed", '[TOOL_CALLS] [{"name": "get_time", "arguments": {"tz": "Europe/Paris"}]',
         '[TOOL_CALLS] [{"name": "get_time", "arguments": {"tz": "Europe/Paris"}]', []),
        ("not a call", '[TOOL_CALLS] [{"name": "get_time"}] [TOOL', '[TOOL_CALLS] [{"name": "get_time"}] [TOOL', []),
        ("not json", "[TOOL_CALLS] get_time", "[TOOL_CALLS] get_time", []),
        ("no calls", "Paris is sunny [today].", "Paris is sunny [today].", []),
    ],
}
ALL_CASES = [(name, *case) for name, cases in CASES.items() for case in cases]
CASE_IDS = [f"{name}-{case[0]}" for name, cases in CASES.items() for case in cases]


@pytest.mark.parametrize("name,label,text,content,calls", ALL_CASES, ids=CASE_IDS)
def test_extract(name, label, text, content, calls):
    result = parser(name).extract(text)
    assert result.content == content
    assert [(c.name, json.loads(c.arguments)) for c in result.tool_calls] == calls
    for c in result.tool_calls:
        assert c.arguments == json.dumps(json.loads(c.arguments), ensure_ascii=False)
    assert result.tools_called == bool(calls)
    assert len({c.id for c in result.tool_calls}) == len(calls)


def reassemble(pieces):
    """(content, [(name, arguments)]) from streamed delta pieces, checking their shape on the way."""
    content, calls = "", []
    for piece in pieces:
        assert len(piece) == 1 and set(piece) <= {"content", "tool_calls"}, piece
        if "content" in piece:
            assert isinstance(piece["content"], str) and piece["content"]
            content += piece["content"]
            continue
        (delta,) = piece["tool_calls"]
        i = delta["index"]
        if "id" in delta:  # the header: a new call
            assert i == len(calls) and delta["type"] == "function" and delta["id"]
            assert delta["function"]["arguments"] == ""
            calls.append([delta["function"]["name"], ""])
        else:
            assert set(delta) == {"index", "function"} and set(delta["function"]) == {"arguments"}
            assert 0 <= i < len(calls)
            calls[i][1] += delta["function"]["arguments"]
    return content, [tuple(c) for c in calls]


def stream(name, chunks):
    s = parser(name).streamer()
    pieces = []
    for chunk in chunks:
        pieces += s.feed(chunk)
    pieces += s.finish()
    return reassemble(pieces)


def expected_stream(name, text):
    result = parser(name).extract(text)
    return result.content or "", [(c.name, c.arguments) for c in result.tool_calls]


def random_chunkings(text, n, seed):
    rng = random.Random(seed)
    for _ in range(n):
        cuts = sorted(rng.sample(range(1, len(text)), min(len(text) - 1, rng.randint(1, 8)))) if len(text) > 1 else []
        bounds = [0, *cuts, len(text)]
        yield [text[a:b] for a, b in zip(bounds, bounds[1:])]


@pytest.mark.parametrize("name,label,text,content,calls", ALL_CASES, ids=CASE_IDS)
def test_streaming_matches_extract(name, label, text, content, calls):
    want = expected_stream(name, text)
    assert stream(name, list(text)) == want  # a boundary after every character
    for k in range(len(text) + 1):
        assert stream(name, [text[:k], text[k:]]) == want, k
    for chunks in random_chunkings(text, 30, seed=len(text)):
        assert stream(name, chunks) == want, chunks


@pytest.mark.parametrize("name,text,held", [
    ("hermes", "Hi <tool_", "Hi"), ("hermes", "Hi <tool_call>\n{", "Hi"), ("hermes", "a\n\n", "a"),
    ("llama3_json", "Hello <|python", "Hello"), ("llama3_json", ' {"name": "get_time"', ""),
    ("mistral", "Ok [TOOL", "Ok"), ("mistral", "Ok [TOOL_CALLS] [{", "Ok"),
])
def test_streaming_holds_back_possible_markup(name, text, held):
    s = parser(name).streamer()
    content, calls = reassemble(s.feed(text))
    assert content == held and calls == []


def test_streaming_sends_a_call_once_its_block_closes():
    s = parser("hermes").streamer()
    assert s.feed('<tool_call>\n{"name": "get_time", "arguments": {"tz": "UTC"}}\n') == []
    pieces = s.feed("</tool_call>")
    assert reassemble(pieces) == ("", [("get_time", '{"tz": "UTC"}')])
    assert pieces[0]["tool_calls"][0]["id"] == "call_" + "0" * 24
    assert s.finish() == []


def test_streaming_text_after_partial_tag_is_content():
    s = parser("hermes").streamer()
    assert reassemble(s.feed("Hello <tool")) == ("Hello", [])
    assert reassemble(s.feed("ing> x")) == (" <tooling> x", [])
    assert s.finish() == []


def test_ids_and_registry():
    assert re.fullmatch(r"call_[A-Za-z0-9]{24}", get_tool_parser("hermes").new_id())
    assert re.fullmatch(r"call_[A-Za-z0-9]{24}", get_tool_parser("llama3_json").new_id())
    assert re.fullmatch(r"[A-Za-z0-9]{9}", get_tool_parser("mistral").new_id())
    assert set(TOOL_PARSERS) == {"hermes", "llama3_json", "mistral"}
    with pytest.raises(ValueError, match="hermes, llama3_json, mistral"):
        get_tool_parser("pythonic")
    call = ToolCall("call_1", "f", '{"a": 1}')
    assert call.to_openai() == {"id": "call_1", "type": "function", "function": {"name": "f", "arguments": '{"a": 1}'}}


# ---- the constraint ----------------------------------------------------------------------------------------

def tool(name, parameters=None):
    fn = {"name": name, "description": f"{name} {{does things}}\nwell"}
    if parameters is not None:
        fn["parameters"] = parameters
    return {"type": "function", "function": fn}


TOOLS = [
    tool("get_weather", {"type": "object", "properties": {
        "city": {"type": "string", "maxLength": 12}, "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}},
        "required": ["city", "unit"], "additionalProperties": False}),
    tool("get_time", {"type": "object", "properties": {"tz": {"type": "string", "enum": ["UTC", "Europe/Paris"]},
                                                      "hour": {"type": "integer", "minimum": 0, "maximum": 23}},
                      "required": ["tz"], "additionalProperties": False}),
    tool("set_flags", {"type": "object", "properties": {
        "flags": {"type": "array", "items": {"type": "boolean"}, "maxItems": 3},
        "level": {"type": "object", "properties": {"n": {"type": "integer", "minimum": 0, "maximum": 9}},
                  "required": ["n"], "additionalProperties": False}},
        "required": ["flags", "level"], "additionalProperties": False}),
    tool("ping", {"type": "object", "properties": {}, "additionalProperties": False}),
]
OPEN_TOOLS = [tool("anything"), tool("get_time", TOOLS[1]["function"]["parameters"])]
SCHEMAS = {t["function"]["name"]: t["function"].get("parameters", {"type": "object"}) for t in TOOLS + OPEN_TOOLS}


def render(name, calls):
    """Calls written by hand in the parser's format, in the constraint's spelling."""
    if name == "hermes":
        return "\n".join(f"<tool_call>\n{json.dumps({'name': n, 'arguments': a})}\n</tool_call>" for n, a in calls)
    if name == "llama3_json":
        return "; ".join(json.dumps({"name": n, "parameters": a}) for n, a in calls)
    return "[TOOL_CALLS] " + json.dumps([{"name": n, "arguments": a} for n, a in calls])


def accepts(tokenizer, grammar, text):
    matcher = llguidance.LLMatcher(tokenizer, grammar, log_level=0)
    assert not matcher.is_error(), matcher.get_error()
    return matcher.consume_tokens(tokenizer.tokenize_str(text)) and matcher.is_accepting()


NAMES = list(TOOL_PARSERS)
VALID = [("get_weather", WEATHER), ("get_time", {"tz": "UTC", "hour": 7}), ("ping", {}),
         ("set_flags", {"flags": [True, False], "level": {"n": 3}})]


@pytest.mark.parametrize("name", NAMES)
def test_constraint_required(name, tokenizer):
    grammar = parser(name).constraint(TOOLS, "required")
    assert llguidance.LLMatcher.validate_grammar(grammar, tokenizer) == ""
    for call in VALID:
        assert accepts(tokenizer, grammar, render(name, [call])), call
    assert accepts(tokenizer, grammar, render(name, VALID))
    assert not accepts(tokenizer, grammar, "")
    assert not accepts(tokenizer, grammar, "Sure, here you go.")
    assert not accepts(tokenizer, grammar, render(name, [("get_wether", WEATHER)]))
    assert not accepts(tokenizer, grammar, render(name, [("get_weather", {"city": "Paris", "unit": "kelvin"})]))
    assert not accepts(tokenizer, grammar, render(name, [("get_weather", {"city": "Paris"})]))
    assert not accepts(tokenizer, grammar, render(name, [("get_weather", {"city": "Llanfairpwllgwyngyll",
                                                                          "unit": "celsius"})]))
    assert not accepts(tokenizer, grammar, render(name, [("get_time", {"tz": "UTC", "hour": 24})]))
    assert not accepts(tokenizer, grammar, render(name, [("ping", {"extra": 1})]))
    assert not accepts(tokenizer, grammar, render(name, [("get_time", {"tz": "UTC"}), ("nope", {})]))


@pytest.mark.parametrize("name", NAMES)
def test_constraint_not_parallel_and_named(name, tokenizer):
    single = parser(name).constraint(TOOLS, "required", parallel=False)
    assert llguidance.LLMatcher.validate_grammar(single, tokenizer) == ""
    assert accepts(tokenizer, single, render(name, [VALID[0]]))
    assert not accepts(tokenizer, single, render(name, VALID[:2]))
    named = parser(name).constraint(TOOLS, {"type": "function", "function": {"name": "get_time"}})
    assert llguidance.LLMatcher.validate_grammar(named, tokenizer) == ""
    assert accepts(tokenizer, named, render(name, [VALID[1]]))
    assert not accepts(tokenizer, named, render(name, [VALID[0]]))
    assert not accepts(tokenizer, named, render(name, [VALID[1], VALID[1]]))


@pytest.mark.parametrize("name", NAMES)
def test_constraint_tool_without_parameters(name, tokenizer):
    grammar = parser(name).constraint(OPEN_TOOLS, "required")
    assert llguidance.LLMatcher.validate_grammar(grammar, tokenizer) == ""
    assert accepts(tokenizer, grammar, render(name, [("anything", {})]))
    assert accepts(tokenizer, grammar, render(name, [("anything", {"a": [1, {"b": None}]})]))
    assert not accepts(tokenizer, grammar, render(name, [("anything", [1])]))


@pytest.mark.parametrize("name", NAMES)
def test_constraint_errors(name):
    p = parser(name)
    bad = [TOOLS[0], tool("broken", {"type": "nonsense"})]
    with pytest.raises(ValueError, match="'broken'"):
        p.constraint(bad, "required")
    with pytest.raises(ValueError, match="'broken'"):
        p.constraint([tool("broken", ["not", "a", "schema"])], "required")
    with pytest.raises(ValueError, match="'missing'"):
        p.constraint(TOOLS, {"type": "function", "function": {"name": "missing"}})
    for choice in ("auto", "none"):
        with pytest.raises(ValueError, match="does not force"):
            p.constraint(TOOLS, choice)
    with pytest.raises(ValueError, match="at least one tool"):
        p.constraint([], "required")
    # the named tool's schema is the only one compiled
    assert p.constraint(bad, {"type": "function", "function": {"name": "get_weather"}})


def test_constraint_special_token_marker(tokenizer):
    grammar = parser("mistral").constraint(TOOLS, "required", special_tokens={"[TOOL_CALLS]": 0})
    assert "<[0]>" in grammar and '"[TOOL_CALLS]"' not in grammar
    assert llguidance.LLMatcher.validate_grammar(grammar, tokenizer) == ""


def sample(tokenizer, grammar, seed, max_tokens=300):
    """Random tokens under the grammar's mask: the text, and whether the matcher ended accepting."""
    matcher = llguidance.LLMatcher(tokenizer, grammar, log_level=0)
    rng = np.random.default_rng(seed)
    bitmask = llnp.allocate_token_bitmask(1, tokenizer.vocab_size)
    tokens = []
    for _ in range(max_tokens):
        if matcher.is_stopped():
            break
        llnp.fill_next_token_bitmask(matcher, bitmask)
        allowed = np.flatnonzero(np.unpackbits(bitmask[0].view(np.uint8), bitorder="little")[:tokenizer.vocab_size])
        assert len(allowed), matcher.get_error()
        token = int(rng.choice(allowed))
        assert matcher.consume_token(token), matcher.get_error()
        if token == tokenizer.eos_token:
            break
        tokens.append(token)
    return tokenizer.decode_str(tokens), matcher.is_accepting() and not matcher.is_error()


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("choice", ["required", "single", "named"])
def test_sampling_under_the_constraint_gives_valid_calls(name, choice, tokenizer):
    p = parser(name)
    if choice == "named":
        grammar, allowed_names = p.constraint(TOOLS, {"type": "function", "function": {"name": "set_flags"}}), \
            {"set_flags"}
    else:
        grammar, allowed_names = p.constraint(TOOLS, "required", parallel=choice == "required"), set(SCHEMAS)
    n_calls = n_complete = 0
    for seed in range(10):
        text, complete = sample(tokenizer, grammar, seed)
        if not complete:
            # uniform sampling may keep adding calls past 300 tokens when any number is allowed
            assert choice == "required", text
            continue
        n_complete += 1
        result = p.extract(text)
        assert result.content is None and result.tool_calls, text
        assert choice == "required" or len(result.tool_calls) == 1
        for call in result.tool_calls:
            assert call.name in allowed_names
            jsonschema.validate(json.loads(call.arguments), SCHEMAS[call.name])
        n_calls += len(result.tool_calls)
        assert stream(name, list(text)) == expected_stream(name, text)
    assert n_complete >= 8 and n_calls >= n_complete
