"""Tool-call markers that the tokenizer holds as special tokens (``<tool_call>`` in Qwen's, ``[TOOL_CALLS]`` in
Mistral's): the forcing grammar asks for the token, a matcher accepts the call spelled with it, the request keeps
special tokens in its text (else the parser would never see the marker), and the parser reads the decoded text.
A tokenizer without such tokens (the embedded one) keeps the defaults."""

from __future__ import annotations

import json

import pytest
from tokenizers import AddedToken
from tokenizers import Tokenizer as HFTokenizer

from jaxinfer.core.tokenizer import Tokenizer
from jaxinfer.loading.model_source import default_model_dir
from jaxinfer.sampling_params import SamplingParams
from jaxinfer.server.chat_tools import make_tool_plan, special_markers
from jaxinfer.server.options import ServerOptions
from jaxinfer.structured.backend import GrammarBackend

TOOLS = [{"type": "function", "function": {"name": "add", "parameters": {
    "type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}}, "required": ["a", "b"]}}}]


def _tokenizer(special: bool) -> Tokenizer:
    hf = HFTokenizer.from_file(str(default_model_dir() / "tokenizer.json"))
    if special:
        hf.add_special_tokens([AddedToken("<tool_call>", special=True), AddedToken("</tool_call>", special=True)])
    return Tokenizer(hf, eos_token_ids=(0,))


def test_special_markers_reach_the_grammar_and_the_text():
    tok = _tokenizer(special=True)
    markers = special_markers(tok)
    assert set(markers) == {"<tool_call>", "</tool_call>"}
    plan = make_tool_plan("required", TOOLS, "required", False, ServerOptions(), tok)
    assert plan.keep_special_tokens
    params = plan.apply(SamplingParams(max_tokens=64))
    assert params.skip_special_tokens is False and params.structured_outputs.grammar
    backend = GrammarBackend(tok.hf_tokenizer.to_str(), tok.vocab_size, (0,))
    matcher = backend.matcher(backend.compile(params.structured_outputs))
    body = "\n" + json.dumps({"name": "add", "arguments": {"a": 1, "b": 2}}) + "\n"
    ids = [markers["<tool_call>"], *tok.encode(body, add_special_tokens=False), markers["</tool_call>"]]
    assert all(matcher.accept(t) for t in ids) and matcher.is_accepting
    text = tok.decode(ids, skip_special_tokens=False)
    message, finish = plan.message(text, "stop")
    assert finish == "tool_calls" and message["tool_calls"][0]["function"]["name"] == "add"
    assert json.loads(message["tool_calls"][0]["function"]["arguments"]) == {"a": 1, "b": 2}
    # spelled out in plain characters instead of the special token, the marker is not what the grammar allows
    spelled = backend.matcher(backend.compile(params.structured_outputs))
    plain = tok.encode("<tool", add_special_tokens=False) + tok.encode("_call>", add_special_tokens=False)
    assert markers["<tool_call>"] not in plain
    assert not all(spelled.accept(t) for t in plain)


def test_plain_markers_keep_the_defaults():
    tok = _tokenizer(special=False)
    assert special_markers(tok) == {}
    plan = make_tool_plan("required", TOOLS, "required", True, ServerOptions(), tok)
    assert not plan.keep_special_tokens
    assert plan.apply(SamplingParams()).skip_special_tokens is True


@pytest.mark.parametrize("parser", ["hermes", "llama3_json", "mistral"])
def test_each_parser_forces_calls_that_it_parses(parser):
    tok = _tokenizer(special=False)
    plan = make_tool_plan("named", TOOLS, {"type": "function", "function": {"name": "add"}}, True,
                          ServerOptions(tool_call_parser=parser), tok)
    assert plan.parser.name == parser
    backend = GrammarBackend(tok.hf_tokenizer.to_str(), tok.vocab_size, (0,))
    matcher = backend.matcher(backend.compile(plan.constraint))
    # walk the grammar greedily on the lowest allowed id until it accepts, then parse what it wrote
    import numpy as np

    ids = []
    for _ in range(200):
        if matcher.is_terminated:
            break
        allowed = np.flatnonzero(np.unpackbits(matcher.mask().view(np.uint8), bitorder="little")[:tok.vocab_size])
        choice = next((int(t) for t in allowed if t != 0), 0)
        if choice == 0:
            break
        assert matcher.accept(choice)
        ids.append(choice)
    message, finish = plan.message(tok.decode(ids, skip_special_tokens=False), "stop")
    assert finish == "tool_calls" and [c["function"]["name"] for c in message["tool_calls"]] == ["add"]
