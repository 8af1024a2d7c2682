"""The mistral tool-call format (Mistral 7B v0.3, Nemo, Small: the tokenizers before v11)::

    [TOOL_CALLS] [{"name": "get_weather", "arguments": {"city": "Paris"}}, {"name": "get_time", "arguments": {}}]

``[TOOL_CALLS]`` followed by a JSON list of call objects (a single object is taken too); text before and after
the block is content. If the JSON does not parse, or an element is not a call, or the list is empty, the marker
and what follows stay content. The v11+ form (``[TOOL_CALLS]name[ARGS]{...}``) is not read.

Mistral tool call ids are 9 alphanumerics. ``[TOOL_CALLS]`` is a special token: the server must decode without
skipping special tokens to see it; pass its id in ``constraint(..., special_tokens={"[TOOL_CALLS]": id})`` so
the grammar asks for the token rather than its spelling.
"""

from __future__ import annotations

from collections.abc import Mapping

from jaxinfer.server.tool_parsers.base import (Calls, Step, Text, ToolParser, call_from_object, decode_json_at,
                                               json_rule, lark_literal, plain_text_end, random_alphanumerics,
                                               skip_whitespace)

TOOL_CALLS = "[TOOL_CALLS]"


def make_mistral_call_id() -> str:
    return random_alphanumerics(9)


class MistralToolParser(ToolParser):
    name = "mistral"
    arguments_key = "arguments"

    @staticmethod
    def default_id() -> str:
        return make_mistral_call_id()

    def _step(self, text: str, pos: int, final: bool, after_call: bool) -> Step:
        end, found = plain_text_end(text, pos, TOOL_CALLS, final)
        if end > pos or not found:
            return Text(end) if end > pos else None
        after_tag = pos + len(TOOL_CALLS)
        first = skip_whitespace(text, after_tag)
        if first == len(text):
            return Text(after_tag) if final else None
        if text[first] not in "[{":
            return Text(after_tag)
        decoded = decode_json_at(text, first)
        if decoded is None:
            return Text(after_tag) if final else None
        value, block_end = decoded
        items = value if isinstance(value, list) else [value]
        calls = [call_from_object(item, ("arguments",)) for item in items]
        if not calls or None in calls:
            return Text(after_tag)
        return Calls(block_end, tuple(calls))

    def _grammar(self, call_schema: dict, single: bool, special_tokens: Mapping[str, int]) -> str:
        calls = {"type": "array", "items": call_schema, "minItems": 1}
        if single:
            calls["maxItems"] = 1
        return f'start: {lark_literal(TOOL_CALLS, special_tokens)} " "? calls\ncalls: {json_rule(calls)}\n'
