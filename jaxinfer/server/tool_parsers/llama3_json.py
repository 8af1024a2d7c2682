"""The llama3_json tool-call format (Llama 3.1 / 3.2 / 3.3 JSON tool calling)::

    {"name": "get_weather", "parameters": {"city": "Paris"}}
    <|python_tag|>{"name": "get_weather", "parameters": {"city": "Paris"}}; {"name": "get_time", "parameters": {}}

A call is a JSON object with ``name`` and ``parameters`` (or ``arguments``, which vLLM also accepts). Calls start
either at the very beginning of the output (after whitespace) with ``{``, or after a ``<|python_tag|>`` anywhere
(the text before the tag is content); further calls follow a call after ``;`` (whitespace around it allowed).
A JSON value that is not a call (plain JSON, or JSON that does not parse) is content, as is all other text: unlike
vLLM, a JSON object in the middle of prose is not taken for a call. Whitespace after the last call is dropped;
other text after it is content.

``<|python_tag|>`` is a special token: the server must decode without skipping special tokens to see it. The
constraint's grammar asks for the bare JSON form (no tag), which needs no special token from the tokenizer.
"""

from __future__ import annotations

from collections.abc import Mapping

from jaxinfer.server.tool_parsers.base import (Calls, Step, Text, ToolParser, call_from_object, decode_json_at,
                                               json_rule, plain_text_end, skip_whitespace)

PYTHON_TAG = "<|python_tag|>"
ARGUMENT_KEYS = ("parameters", "arguments")

_PENDING = object()
_INVALID = object()


def _call_at(text: str, pos: int, final: bool):
    """The call whose JSON object starts at ``pos`` (a ``{``) as ``(call, end)``, or _PENDING, or _INVALID."""
    decoded = decode_json_at(text, pos)
    if decoded is None:
        return _INVALID if final else _PENDING
    call = call_from_object(decoded[0], ARGUMENT_KEYS)
    return (call, decoded[1]) if call else _INVALID


class Llama3JsonToolParser(ToolParser):
    name = "llama3_json"
    arguments_key = "parameters"

    def _step(self, text: str, pos: int, final: bool, after_call: bool) -> Step:
        if after_call:
            step = self._next_in_sequence(text, pos, final)
            if step is not _INVALID:
                return step
        elif not text[:pos].strip():  # nothing but whitespace before: a call may start the output
            first = skip_whitespace(text, pos)
            if first < len(text) and text[first] == "{":
                if first > pos:
                    return Text(first)
                found = _call_at(text, pos, final)
                if found is _PENDING:
                    return None
                return Text(pos + 1) if found is _INVALID else Calls(found[1], (found[0],))
        end, found_tag = plain_text_end(text, pos, PYTHON_TAG, final)
        if end > pos or not found_tag:
            return Text(end) if end > pos else None
        after_tag = pos + len(PYTHON_TAG)
        first = skip_whitespace(text, after_tag)
        if first == len(text):
            return Text(after_tag) if final else None
        if text[first] != "{":
            return Text(after_tag)
        found = _call_at(text, first, final)
        if found is _PENDING:
            return None
        return Text(after_tag) if found is _INVALID else Calls(found[1], (found[0],))

    def _next_in_sequence(self, text: str, pos: int, final: bool):
        """After a call: ``; {...}`` continues the calls (a Calls step), whitespace to the end is dropped; anything
        else is _INVALID (read as plain text)."""
        sep = skip_whitespace(text, pos)
        if sep == len(text):
            return Calls(sep, ()) if final else None
        if text[sep] != ";":
            return _INVALID
        first = skip_whitespace(text, sep + 1)
        if first == len(text):
            return _INVALID if final else None
        if text[first] != "{":
            return _INVALID
        found = _call_at(text, first, final)
        if found is _PENDING:
            return None
        return _INVALID if found is _INVALID else Calls(found[1], (found[0],))

    def _grammar(self, call_schema: dict, single: bool, special_tokens: Mapping[str, int]) -> str:
        start = "start: call" if single else 'start: call ("; " call)*'
        return f"{start}\ncall: {json_rule(call_schema)}\n"
