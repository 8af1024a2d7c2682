"""Tool calling on chat completions: what a request's ``tool_choice`` asks of the engine, and the output as
OpenAI's ``tool_calls`` (whole, or as streamed deltas).

* ``none``: the tools still reach the chat template; the output is plain content.
* ``auto`` (the default when tools are given): the model decides; its output is parsed by the server's
  ``--tool-call-parser`` (needs ``--enable-auto-tool-choice``, as in vLLM).
* ``required`` / a named function: the output is forced to be calls in the parser's format (hermes' when the
  server has none) by a structured-output constraint built from the tools' JSON schemas
  (``ToolParser.constraint``), so even a model that never saw the tools produces calls whose arguments validate.
  ``parallel_tool_calls: false`` allows exactly one call. A function's arguments object allows no keys beyond its
  ``properties`` unless its schema says otherwise (``additionalProperties`` unset is taken as false, as OpenAI's
  strict mode requires): a call's arguments are what the function declares, and a model cannot pad a call with
  invented keys until ``max_tokens``.

A finished output that holds calls has ``finish_reason: "tool_calls"`` (unless it was cut by ``length``).
Where the tokenizer has a call marker (``<tool_call>``, ``[TOOL_CALLS]``, ...) as a special token, the constraint
asks for that token and the text keeps special tokens (else the parser would not see the marker).
"""

from __future__ import annotations

import dataclasses
from typing import Any

from jaxinfer.sampling_params import SamplingParams, StructuredOutputsParams
from jaxinfer.server.protocol import ChatCompletionRequest, FieldError
from jaxinfer.server.options import ServerOptions
from jaxinfer.server.tool_parsers import ToolParser, get_tool_parser

MARKERS = ("<tool_call>", "</tool_call>", "[TOOL_CALLS]", "<|python_tag|>")
TOOL_CHOICES = ("none", "auto", "required")
FORCED_PARSER = "hermes"  # the format of required / named calls on a server without --tool-call-parser


def special_markers(tokenizer) -> dict[str, int]:
    """The call markers that this tokenizer holds as special tokens: marker -> token id."""
    if tokenizer is None:
        return {}
    added = tokenizer.hf_tokenizer.get_added_tokens_decoder()
    return {t.content: i for i, t in added.items() if t.special and t.content in MARKERS}


@dataclasses.dataclass(frozen=True)
class ToolPlan:
    mode: str  # "none" | "auto" | "required" | "named"
    parser: ToolParser | None  # parses the output into calls (None: plain content)
    tools: list[dict] | None  # what the chat template receives
    constraint: StructuredOutputsParams | None = None
    keep_special_tokens: bool = False

    def apply(self, params: SamplingParams) -> SamplingParams:
        """The request's sampling parameters with the tool constraint (and the markers kept in the text)."""
        changes: dict[str, Any] = {}
        if self.constraint is not None:
            changes["structured_outputs"] = self.constraint
        if self.keep_special_tokens and self.parser is not None:
            changes["skip_special_tokens"] = False
        return dataclasses.replace(params, **changes) if changes else params

    def message(self, text: str, finish_reason: str | None) -> tuple[dict, str | None]:
        """The assistant message of a finished output, and its finish_reason."""
        if self.parser is None:
            return {"role": "assistant", "content": text}, finish_reason
        extracted = self.parser.extract(text)
        if not extracted.tool_calls:
            return {"role": "assistant", "content": text}, finish_reason
        message = {"role": "assistant", "content": extracted.content,
                   "tool_calls": [c.to_openai() for c in extracted.tool_calls]}
        return message, ("tool_calls" if finish_reason == "stop" else finish_reason)

    def streamer(self) -> "ToolDeltas | None":
        return ToolDeltas(self.parser) if self.parser is not None else None


class ToolDeltas:
    """One streamed choice's text turned into delta pieces (content, or tool calls once each is complete)."""

    def __init__(self, parser: ToolParser):
        self.stream = parser.streamer()
        self.called = False

    def pieces(self, text: str, finished: bool) -> list[dict]:
        out = self.stream.feed(text) if text else []
        if finished:
            out += self.stream.finish()
        self.called = self.called or any("tool_calls" in p for p in out)
        return out

    def finish_reason(self, finish_reason: str | None) -> str | None:
        return "tool_calls" if self.called and finish_reason == "stop" else finish_reason


def plan_tools(req: ChatCompletionRequest, options: ServerOptions, tokenizer) -> ToolPlan:
    """A chat request's tool plan; ``FieldError`` naming the field when it cannot be served."""
    mode = tool_mode(req)
    conflict = req.constraint_field if req.structured_output_params() is not None else None
    return make_tool_plan(mode, tool_dicts(req), req.tool_choice, req.parallel_tool_calls is not False, options,
                          tokenizer, conflict)


def tool_mode(req: ChatCompletionRequest) -> str:
    """"none" (no tools, or tool_choice "none"), "auto", "required" or "named"; ``FieldError`` for a tool_choice
    that names no given tool or is malformed."""
    tools = req.tools or []
    choice = req.tool_choice
    if choice is None:
        return "auto" if tools else "none"
    if isinstance(choice, str):
        if choice not in TOOL_CHOICES:
            raise FieldError("tool_choice", f"tool_choice must be one of {list(TOOL_CHOICES)} or a named function, "
                                            f"got {choice!r}")
        if choice != "none" and not tools:
            raise FieldError("tool_choice", f"tool_choice {choice!r} needs tools")
        return choice
    function = choice.get("function") if choice.get("type") == "function" else None
    name = function.get("name") if isinstance(function, dict) else None
    if not isinstance(name, str):
        raise FieldError("tool_choice", 'a named tool_choice is {"type": "function", "function": {"name": ...}}')
    if name not in {t.function.name for t in tools}:
        raise FieldError("tool_choice", f"tool_choice names {name!r}, which is not among the tools "
                                        f"{[t.function.name for t in tools]}")
    return "named"


def tool_dicts(req: ChatCompletionRequest) -> list[dict] | None:
    """The tools as chat templates and parsers read them (OpenAI's shape, parameters defaulted)."""
    if not req.tools:
        return None
    return [{"type": "function", "function": {
        "name": t.function.name, **({"description": t.function.description} if t.function.description else {}),
        "parameters": t.function.parameters if t.function.parameters is not None else {"type": "object"}}}
        for t in req.tools]


def make_tool_plan(mode: str, tools: list[dict] | None, tool_choice: Any, parallel: bool, options: ServerOptions,
                   tokenizer, conflicting_field: str | None = None) -> ToolPlan:
    """The tool plan of ``mode`` ("none" | "auto" | "required" | "named") for ``tools`` in OpenAI's chat shape
    (``{"type": "function", "function": {"name", "parameters", ...}}``) and ``tool_choice`` in the chat shape
    ("required" or ``{"type": "function", "function": {"name": N}}``). ``conflicting_field``: the request's
    other constraint, if it has one (a forced call cannot be combined with it)."""
    if mode == "none":
        return ToolPlan("none", None, tools)
    markers = special_markers(tokenizer)
    if mode == "auto":
        if not (options.enable_auto_tool_choice and options.tool_call_parser):
            raise FieldError("tool_choice", '"auto" tool choice (the default with tools) needs the server to run '
                                            "with --enable-auto-tool-choice and --tool-call-parser; or send "
                                            'tool_choice "required", a named function, or "none"')
        return ToolPlan("auto", get_tool_parser(options.tool_call_parser), tools, keep_special_tokens=bool(markers))
    if conflicting_field is not None:
        raise FieldError("tool_choice", f"tool_choice {tool_choice!r:.60} forces tool calls, which cannot be "
                                        f"combined with {conflicting_field}")
    parser = get_tool_parser(options.tool_call_parser or FORCED_PARSER)
    closed = [{**t, "function": {**t["function"], "parameters": closed_schema(t["function"]["parameters"])}}
              for t in tools]
    try:
        grammar = parser.constraint(closed, tool_choice, parallel, special_tokens=markers)
    except ValueError as exc:
        raise FieldError("tools", str(exc)) from None
    return ToolPlan(mode, parser, tools, StructuredOutputsParams(grammar=grammar), keep_special_tokens=bool(markers))


_SUBSCHEMA_LISTS = ("anyOf", "oneOf", "allOf", "prefixItems")
_SUBSCHEMA_MAPS = ("properties", "$defs", "definitions")


def closed_schema(schema: Any) -> Any:
    """``schema`` with ``additionalProperties: false`` on every object that declares ``properties`` and says
    nothing about other keys (a copy; the rest unchanged)."""
    if not isinstance(schema, dict):
        return schema
    out = dict(schema)
    if "properties" in out and "additionalProperties" not in out and "patternProperties" not in out:
        out["additionalProperties"] = False
    for key in _SUBSCHEMA_MAPS:
        if isinstance(out.get(key), dict):
            out[key] = {k: closed_schema(v) for k, v in out[key].items()}
    for key in _SUBSCHEMA_LISTS:
        if isinstance(out.get(key), list):
            out[key] = [closed_schema(v) for v in out[key]]
    if isinstance(out.get("items"), dict):
        out["items"] = closed_schema(out["items"])
    return out
