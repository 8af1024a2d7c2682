"""The Responses API's request body (``POST /v1/responses``) and the store of finished responses.

``ResponsesRequest`` follows ``jaxinfer.server.protocol``'s field policy (honoured, inert or refused):

* honoured: ``model``, ``input`` (a string, or a list of items: messages whose content is a string or a list of
  ``input_text`` / ``output_text`` parts; ``function_call`` items, an earlier answer's calls; and
  ``function_call_output`` items, their results), ``instructions`` (a system message in front, not carried over
  by ``previous_response_id``, as OpenAI does), ``max_output_tokens``, ``temperature``, ``top_p``, ``stream``,
  ``store``, ``previous_response_id``, ``metadata`` (echoed and stored), ``top_logprobs`` with ``include:
  ["message.output_text.logprobs"]`` (the output text's logprobs; without that include, top_logprobs changes
  nothing and is listed as ignored, as are the other include values: they name outputs of hosted tools, images
  and reasoning, of which there are none), ``tools`` of type ``function`` (``name``, ``description``,
  ``parameters``, ``strict``), ``tool_choice`` ("none", "auto", "required" or ``{"type": "function", "name":
  N}``) and ``parallel_tool_calls`` (false: at most one call): as chat completions' tools
  (``jaxinfer.server.chat_tools``), with the same server flags ("auto", the default with tools, needs
  ``--enable-auto-tool-choice --tool-call-parser``).
* inert: ``user``, ``service_tier``, ``reasoning`` (the model does not reason), ``max_tool_calls`` (it bounds
  hosted tools' calls, and there are none), ``safety_identifier``, ``prompt_cache_key``,
  ``prompt_cache_retention``, ``stream_options``, ``verbosity`` and ``text.verbosity``, routers' bookkeeping.
* refused when not neutral: tools of other types (``web_search``, ``file_search``, ``computer``, ``mcp``, ...),
  ``tool_choice`` naming no given function or of another type, ``text.format`` of another type than text,
  json_object and json_schema (those two are structured outputs, as ``response_format`` on chat), ``truncation`` other than "disabled", ``background``, ``conversation``, ``prompt``, ``context_management``,
  ``moderation``, input parts other than text (``input_image``, ``input_file``, ...), input items other than
  messages and function calls and their outputs (reasoning, item references, hosted tools' calls), a
  ``function_call_output`` whose ``call_id`` no earlier ``function_call`` has, and the fields every route
  refuses (``logit_bias``, guided decoding, ...).

Input items become chat-template messages (``ChatHistory``): a message as it is; consecutive ``function_call``
items as one assistant message's ``tool_calls`` (joined to the assistant message just before them, which is how
an answer that says something and then calls was made), arguments parsed to an object as chat completions'
history is; a ``function_call_output`` as a ``role: "tool"`` message with its ``tool_call_id``.

``ResponseStore`` keeps the last ``MAX_STORED_RESPONSES`` responses stored with ``store: true`` (least
recently used dropped first), each with its conversation so far, for ``GET /v1/responses/{id}`` and
``previous_response_id``.
"""

from __future__ import annotations

import collections
import dataclasses
from typing import Any

from pydantic import Field

from jaxinfer.sampling_params import SamplingParams, StructuredOutputsParams
from jaxinfer.server.protocol import (_REFUSED_COMMON, _ROUTER_INERT, CHAT_ROLES, MAX_TOP_LOGPROBS, FieldError,
                                      _arguments, _Body)

MAX_STORED_RESPONSES = 1024
TEXT_PART_TYPES = ("input_text", "output_text")
LOGPROBS_INCLUDE = "message.output_text.logprobs"
TOOL_CHOICES = ("none", "auto", "required")  # and {"type": "function", "name": N}
MESSAGE_TYPES = (None, "message")
FUNCTION_CALL = "function_call"
FUNCTION_CALL_OUTPUT = "function_call_output"
# the fields of each kind of input item (besides type, id and status, which every item may carry)
ITEM_FIELDS = {"message": ("role", "content", "phase"), FUNCTION_CALL: ("call_id", "name", "arguments"),
               FUNCTION_CALL_OUTPUT: ("call_id", "output")}


class InputPart(_Body):
    """A content part of an input message or of a function call's output: text only (``input_text``, or
    ``output_text`` of an earlier answer)."""

    type: str
    text: str | None = None
    annotations: Any = None  # an earlier answer's output_text carries these: they do not change the prompt
    logprobs: Any = None
    INERT = ("annotations", "logprobs")

    def check_fields(self, strict: bool, prefix: str = "") -> list[str]:
        if self.type not in TEXT_PART_TYPES or self.text is None:
            raise FieldError(prefix + "type", f"{prefix}type: content parts of type {self.type!r} are not "
                                              f"supported: this model reads text only (parts of type "
                                              f"{' or '.join(map(repr, TEXT_PART_TYPES))} with a 'text' field)")
        return super().check_fields(strict, prefix)


def _joined(content: str | list[InputPart] | None) -> str:
    if isinstance(content, str):
        return content
    return "".join(part.text for part in content or ())


class InputItem(_Body):
    """An input item: a message (``type`` "message" or absent), a ``function_call`` (an earlier answer's call) or a
    ``function_call_output`` (the result of a call). ``id`` / ``status`` / ``phase`` are what an earlier response's
    output items carry back: they do not change the prompt."""

    type: str | None = None
    role: str | None = None
    content: str | list[InputPart] | None = None
    call_id: str | None = None
    name: str | None = None
    arguments: str | None = None
    output: str | list[InputPart] | None = None
    id: Any = None
    status: Any = None
    phase: Any = None
    INERT = ("id", "status", "phase")

    @property
    def kind(self) -> str:
        return "message" if self.type in MESSAGE_TYPES else self.type

    def check_fields(self, strict: bool, prefix: str = "") -> list[str]:
        if self.kind not in ITEM_FIELDS:
            raise FieldError(prefix + "type", f"{prefix}type: input items of type {self.type!r} are not supported: "
                                              "only messages, function_call and function_call_output (reasoning "
                                              "items, item references and hosted tools' calls are not implemented)")
        own = ITEM_FIELDS[self.kind]
        for name in ("role", "content", "call_id", "name", "arguments", "output"):
            if name not in own and getattr(self, name) is not None:
                raise FieldError(prefix + name, f"field {prefix + name!r} is not a field of {self.kind} items")
        for name in own:
            value = getattr(self, name)
            if name != "phase" and value is None:
                raise FieldError(prefix + name, f"field {prefix + name!r} is required")
            if name in ("call_id", "name") and not value:
                raise FieldError(prefix + name, f"field {prefix + name!r} must not be empty")
        if self.kind == "message" and self.role not in CHAT_ROLES:
            raise FieldError(prefix + "role", f"{prefix}role {self.role!r} is not supported; use one of "
                                              f"{list(CHAT_ROLES)}")
        return super().check_fields(strict, prefix)

    def text(self) -> str:
        """A message's text, or a function call output's."""
        return _joined(self.content if self.kind == "message" else self.output)


class ChatHistory:
    """A conversation as chat-template messages, built from Responses items (see the module docstring).

    ``call_ids``: the ids of the function calls in it, which a ``function_call_output`` must answer."""

    def __init__(self, messages=()):
        self.messages: list[dict] = list(messages)
        self.call_ids = {c["id"] for m in self.messages for c in m.get("tool_calls") or ()}
        self._open = False  # the last message is this history's own assistant message: calls join it

    def say(self, role: str, text: str) -> None:
        self.messages.append({"role": role, "content": text})
        self._open = role == "assistant"

    def call(self, call_id: str, name: str, arguments: str) -> None:
        if not self._open:
            self.messages.append({"role": "assistant", "content": ""})
            self._open = True
        last = self.messages[-1]
        call = {"id": call_id, "type": "function", "function": {"name": name, "arguments": _arguments(arguments)}}
        last["tool_calls"] = [*last.get("tool_calls", ()), call]
        self.call_ids.add(call_id)

    def result(self, call_id: str, text: str) -> None:
        self.messages.append({"role": "tool", "tool_call_id": call_id, "content": text})
        self._open = False

    def add_output(self, items: list[dict]) -> None:
        """A response's output items (messages and function calls)."""
        for item in items:
            if item["type"] == "message":
                self.say("assistant", "".join(part["text"] for part in item["content"]))
            elif item["type"] == FUNCTION_CALL:
                self.call(item["call_id"], item["name"], item["arguments"])


class FunctionTool(_Body):
    """A tool of the request: a function (``type`` "function"). Other types (hosted tools) are refused."""

    type: str
    name: str | None = None
    description: str | None = None
    parameters: dict | None = None  # a JSON schema; None: no arguments ({"type": "object"})
    strict: bool | None = None  # the schema is enforced for required / named calls either way
    REFUSED = {"defer_loading": "deferred tool loading needs tool search, which is not implemented"}

    def check_fields(self, strict: bool, prefix: str = "") -> list[str]:
        if self.type != "function":
            raise FieldError(prefix + "type", f"{prefix}type: tools of type {self.type!r} are not supported: only "
                                              "'function' tools (hosted tools such as web_search, file_search, "
                                              "computer or mcp are not implemented)")
        if not self.name:
            raise FieldError(prefix + "name", f"field {prefix + 'name'!r} is required")
        return super().check_fields(strict, prefix)

    def chat_dict(self) -> dict:
        """The tool in chat completions' shape, as chat templates and tool parsers read it."""
        function = {"name": self.name, **({"description": self.description} if self.description else {}),
                    "parameters": self.parameters if self.parameters is not None else {"type": "object"}}
        return {"type": "function", "function": function}

    def echo(self) -> dict:
        """The tool as the response object lists it."""
        return {"type": "function", "name": self.name, "description": self.description,
                "parameters": self.parameters, "strict": self.strict}


class TextFormat(_Body):
    """``text.format``: "text", "json_object", or "json_schema" with ``name``, ``schema`` (enforced, strict or
    not, as on chat completions), ``strict`` and ``description``."""

    type: str
    name: str | None = None
    json_schema: dict | bool | None = Field(None, alias="schema")
    strict: bool | None = None
    description: str | None = None

    def check_fields(self, strict: bool, prefix: str = "") -> list[str]:
        if self.type not in ("text", "json_object", "json_schema"):
            raise FieldError(prefix + "type", f"{prefix}type must be 'text', 'json_object' or 'json_schema', got "
                                              f"{self.type!r}")
        if self.type == "json_schema" and self.json_schema is None:
            raise FieldError(prefix + "schema", f"{prefix}schema is required with type 'json_schema'")
        return super().check_fields(strict, prefix)

    def constraint(self) -> StructuredOutputsParams | None:
        if self.type == "json_object":
            return StructuredOutputsParams(json_object=True)
        if self.type == "json_schema":
            return StructuredOutputsParams(json=self.json_schema if isinstance(self.json_schema, dict) else {})
        return None

    def echo(self) -> dict[str, Any]:
        """The format as the response object repeats it."""
        out: dict[str, Any] = {"type": self.type}
        if self.type == "json_schema":
            out.update(name=self.name, schema=self.json_schema, strict=self.strict, description=self.description)
        return out


class TextConfig(_Body):
    format: TextFormat | None = None
    verbosity: Any = None  # inert: a hint to OpenAI's models about length
    INERT = ("verbosity",)


class ResponsesRequest(_Body):
    model: str | None = None
    input: str | list[InputItem]
    instructions: str | None = None
    max_output_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    top_logprobs: int | None = None
    include: list[str] | None = None
    stream: bool | None = False
    store: bool | None = True
    previous_response_id: str | None = None
    metadata: dict[str, str] | None = None
    text: TextConfig | None = None
    tools: list[FunctionTool] | None = None
    tool_choice: str | dict | None = None  # "none" | "auto" | "required" | {"type": "function", "name": N}
    parallel_tool_calls: bool | None = None  # None: True (OpenAI's default)
    truncation: str | None = None
    # inert: accepted, echoed where the response has them, ignored (see the module docstring)
    user: str | None = None
    service_tier: Any = None
    reasoning: Any = None
    INERT = ("user", "service_tier", "reasoning", "max_tool_calls", "safety_identifier", "prompt_cache_key",
             "prompt_cache_retention", "stream_options", "verbosity") + _ROUTER_INERT
    REFUSED = {**_REFUSED_COMMON,
               "truncation": "only truncation='disabled' is implemented ('auto' would drop input from the front); "
                             "a prompt longer than the context is a 400",
               "background": "background responses are not implemented: the response is made while you wait",
               "conversation": "conversations are not implemented: continue one with previous_response_id",
               "prompt": "prompt templates (stored on OpenAI's side) are not implemented",
               "context_management": "context management (compaction) is not implemented",
               "moderation": "moderation is not implemented"}

    def check_fields(self, strict: bool, prefix: str = "") -> list[str]:
        if self.top_logprobs is not None and not 0 <= self.top_logprobs <= MAX_TOP_LOGPROBS:
            raise FieldError("top_logprobs", f"top_logprobs must be in [0, {MAX_TOP_LOGPROBS}], "
                                             f"got {self.top_logprobs}")
        if isinstance(self.input, list) and not self.input:
            raise FieldError("input", "input must not be empty")
        ignored = super().check_fields(strict, prefix)  # the tools' and items' own fields first
        seen: set[str] = set()
        for i, tool in enumerate(self.tools or ()):
            if tool.name in seen:
                raise FieldError(f"tools[{i}].name", f"tools[{i}].name {tool.name!r}: another tool has that name")
            seen.add(tool.name)
        self.tool_mode()
        if self.top_logprobs is not None and not self.wants_logprobs:
            ignored.append("top_logprobs")  # without the include, no logprobs are returned
        if any(item != LOGPROBS_INCLUDE for item in self.include or ()):
            ignored.append("include")  # outputs of hosted tools, images or reasoning: there are none
        return ignored

    @property
    def wants_logprobs(self) -> bool:
        return LOGPROBS_INCLUDE in (self.include or ())

    @property
    def top(self) -> int:
        """How many alternatives each output token's logprobs list."""
        return self.top_logprobs or 0

    def tool_mode(self) -> tuple[str, Any]:
        """(mode, tool_choice in chat completions' shape): mode "none" (no tools, or tool_choice "none"), "auto",
        "required" or "named". ``FieldError`` for a tool_choice that is malformed, of a type other than function,
        or names no given tool."""
        names = [t.name for t in self.tools or ()]
        choice = self.tool_choice
        if choice is None:
            return ("auto" if names else "none"), "auto"
        if isinstance(choice, str):
            if choice not in TOOL_CHOICES:
                raise FieldError("tool_choice", f"tool_choice must be one of {list(TOOL_CHOICES)} or "
                                                f"{{'type': 'function', 'name': ...}}, got {choice!r}")
            if not names:
                if choice == "required":
                    raise FieldError("tool_choice", "tool_choice 'required' needs tools")
                return "none", choice  # with no tools, "auto" changes nothing
            return choice, choice
        kind = choice.get("type")
        if kind != "function":
            raise FieldError("tool_choice", f"tool_choice of type {kind!r:.40} is not supported: only 'none', "
                                            "'auto', 'required' or {'type': 'function', 'name': ...} (hosted "
                                            "tools, mcp, custom tools and allowed_tools are not implemented)")
        name = choice.get("name")
        if not isinstance(name, str):
            raise FieldError("tool_choice", "a function tool_choice is {'type': 'function', 'name': ...}")
        if name not in names:
            raise FieldError("tool_choice", f"tool_choice names the function {name!r}, which is not among the "
                                            f"tools {names}")
        return "named", {"type": "function", "function": {"name": name}}

    def chat_tools(self) -> list[dict] | None:
        """The tools in chat completions' shape (parameters defaulted), or None when there are none."""
        return [t.chat_dict() for t in self.tools] if self.tools else None

    def echoed_tool_choice(self) -> str | dict:
        return self.tool_choice if self.tool_choice is not None else "auto"

    def add_input(self, history: ChatHistory) -> None:
        """Appends the new input to ``history`` (the conversation of ``previous_response_id``, or empty).
        ``FieldError`` for a function call output that answers no call in the history or before it."""
        if isinstance(self.input, str):
            history.say("user", self.input)
            return
        for i, item in enumerate(self.input):
            if item.kind == "message":
                history.say(item.role, item.text())
            elif item.kind == FUNCTION_CALL:
                history.call(item.call_id, item.name, item.arguments)
            else:
                if item.call_id not in history.call_ids:
                    raise FieldError(f"input[{i}].call_id", f"input[{i}].call_id {item.call_id!r}: no function "
                                     "call with that call_id comes before this output (in the input, or in the "
                                     "conversation of previous_response_id)")
                history.result(item.call_id, item.text())

    @property
    def constraint(self) -> StructuredOutputsParams | None:
        """The structured-output constraint of ``text.format`` (None for text)."""
        fmt = self.text.format if self.text is not None else None
        return fmt.constraint() if fmt is not None else None

    def to_sampling_params(self) -> SamplingParams:
        given = {k: v for k, v in dict(temperature=self.temperature, top_p=self.top_p).items() if v is not None}
        return SamplingParams(**given, max_tokens=self.max_output_tokens,
                              logprobs=self.top if self.wants_logprobs else None, structured_outputs=self.constraint)

    @staticmethod
    def param_aliases() -> dict[str, str]:
        """Engine field -> this request's field, for error messages' ``param``."""
        return {"max_tokens": "max_output_tokens", "logprobs": "top_logprobs", "structured_outputs": "text.format"}


@dataclasses.dataclass(frozen=True)
class StoredResponse:
    response: dict  # the response object as GET /v1/responses/{id} returns it
    conversation: tuple[dict, ...]  # its input messages (instructions excluded) and its output message


class ResponseStore:
    """The last ``capacity`` stored responses by id; the least recently used is dropped first."""

    def __init__(self, capacity: int = MAX_STORED_RESPONSES):
        if capacity < 1:
            raise ValueError(f"capacity must be >= 1, got {capacity}")
        self.capacity = capacity
        self._items: collections.OrderedDict[str, StoredResponse] = collections.OrderedDict()

    def __len__(self) -> int:
        return len(self._items)

    def put(self, response: dict, conversation: list[dict]) -> None:
        self._items[response["id"]] = StoredResponse(response, tuple(conversation))
        self._items.move_to_end(response["id"])
        while len(self._items) > self.capacity:
            self._items.popitem(last=False)

    def get(self, response_id: str) -> StoredResponse | None:
        item = self._items.get(response_id)
        if item is not None:
            self._items.move_to_end(response_id)
        return item

    def delete(self, response_id: str) -> bool:
        return self._items.pop(response_id, None) is not None
