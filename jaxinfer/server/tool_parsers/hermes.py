"""The hermes tool-call format (Qwen2.5, Qwen3, Hermes 2/3): each call is a JSON object in tags, one per block::

    Let me look that up.
    <tool_call>
    {"name": "get_weather", "arguments": {"city": "Paris"}}
    </tool_call>
    <tool_call>
    {"name": "get_time", "arguments": {"tz": "CET"}}
    </tool_call>

A block's body (between the tags, whitespace stripped) must be exactly one call object, else the whole block
stays in the content as written. A last block whose ``</tool_call>`` never came (the output ended) is read the
same way. Text before, between and after the blocks is content.
"""

from __future__ import annotations

from collections.abc import Mapping

from jaxinfer.server.tool_parsers.base import (Calls, Step, Text, ToolParser, call_from_object, json_rule,
                                               lark_literal, loads_json, plain_text_end, skip_whitespace)

OPEN_TAG = "<tool_call>"
CLOSE_TAG = "</tool_call>"


class HermesToolParser(ToolParser):
    name = "hermes"
    arguments_key = "arguments"

    def _step(self, text: str, pos: int, final: bool, after_call: bool) -> Step:
        end, found = plain_text_end(text, pos, OPEN_TAG, final)
        if end > pos or not found:
            return Text(end) if end > pos else None
        body_start = pos + len(OPEN_TAG)
        close = text.find(CLOSE_TAG, body_start)
        if close < 0:
            first = skip_whitespace(text, body_start)
            if first < len(text) and text[first] != "{":
                return Text(body_start)  # not a call object, whatever follows: the tag is content
            if not final:
                return None
            body, block_end = text[body_start:], len(text)
        else:
            body, block_end = text[body_start:close], close + len(CLOSE_TAG)
        ok, obj = loads_json(body.strip())
        call = call_from_object(obj, ("arguments",)) if ok else None
        # a malformed block: its opening tag is content, and the scan goes on after it (so the body and the
        # closing tag are content too, unless another opening tag inside starts a valid block)
        return Calls(block_end, (call,)) if call else Text(body_start)

    def _grammar(self, call_schema: dict, single: bool, special_tokens: Mapping[str, int]) -> str:
        start = "start: tool_call" if single else 'start: tool_call ("\\n" tool_call)*'
        return (f"{start}\n"
                f'tool_call: {lark_literal(OPEN_TAG, special_tokens)} "\\n" call "\\n" '
                f"{lark_literal(CLOSE_TAG, special_tokens)}\n"
                f"call: {json_rule(call_schema)}\n")
