"""Tool-call parsers for the server, by the names of vLLM's ``--tool-call-parser``: hermes, llama3_json, mistral.

``get_tool_parser(name)`` gives a parser: ``extract`` reads a whole output into content and calls, ``streamer``
turns streamed text into OpenAI delta pieces, ``constraint`` gives an llguidance grammar that forces calls
(see ``base``).
"""

from __future__ import annotations

from collections.abc import Callable

from jaxinfer.server.tool_parsers.base import ExtractedToolCalls, ToolCall, ToolCallStream, ToolParser, make_call_id
from jaxinfer.server.tool_parsers.hermes import HermesToolParser
from jaxinfer.server.tool_parsers.llama3_json import Llama3JsonToolParser
from jaxinfer.server.tool_parsers.mistral import MistralToolParser

TOOL_PARSERS: dict[str, type[ToolParser]] = {
    "hermes": HermesToolParser,
    "llama3_json": Llama3JsonToolParser,
    "mistral": MistralToolParser,
}


def get_tool_parser(name: str, id_factory: Callable[[], str] | None = None) -> ToolParser:
    """The parser called ``name``; ``id_factory`` makes the tool call ids (each parser has its default)."""
    try:
        cls = TOOL_PARSERS[name]
    except KeyError:
        raise ValueError(f"unknown tool-call parser {name!r}; valid names: {', '.join(sorted(TOOL_PARSERS))}") \
            from None
    return cls(id_factory)


__all__ = ["TOOL_PARSERS", "ExtractedToolCalls", "ToolCall", "ToolCallStream", "ToolParser", "get_tool_parser",
           "make_call_id", "HermesToolParser", "Llama3JsonToolParser", "MistralToolParser"]
