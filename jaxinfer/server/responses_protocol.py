"""The Responses API's request body (``POST /v1/responses``) and the store of finished responses.

``ResponsesRequest`` follows ``jaxinfer.server.protocol``'s field policy (honoured, inert or refused):

* honoured: ``model``, ``input`` (a string, or a list of messages whose content is a string or a list of
  ``input_text`` / ``output_text`` parts), ``instructions`` (a system message in front, not carried over by
  ``previous_response_id``, as OpenAI does), ``max_output_tokens``, ``temperature``, ``top_p``, ``stream``,
  ``store``, ``previous_response_id``, ``metadata`` (echoed and stored), ``top_logprobs`` with ``include:
  ["message.output_text.logprobs"]`` (the output text's logprobs; without that include, top_logprobs changes
  nothing and is listed as ignored, as are the other include values: they name outputs of tools, images
  and reasoning, of which there are none).
* inert: ``user``, ``service_tier``, ``parallel_tool_calls``, ``reasoning`` (the model does not reason),
  ``max_tool_calls``, ``safety_identifier``, ``prompt_cache_key``, ``prompt_cache_retention``,
  ``stream_options``, ``verbosity`` and ``text.verbosity``, routers' bookkeeping.
* refused when not neutral: ``tools``, ``tool_choice`` other than "auto" / "none", ``text.format`` other
  than ``{"type": "text"}``, ``truncation`` other than "disabled", ``background``, ``conversation``,
  ``prompt``, ``context_management``, ``moderation``, input parts other than text (``input_image``,
  ``input_file``, ...), input items other than messages (tool calls and outputs, reasoning, item
  references), and the fields every route refuses (``logit_bias``, guided decoding, ...).

``ResponseStore`` keeps the last ``MAX_STORED_RESPONSES`` responses stored with ``store: true`` (least
recently used dropped first), each with its conversation so far, for ``GET /v1/responses/{id}`` and
``previous_response_id``.
"""

from __future__ import annotations

import collections
import dataclasses
from typing import Any

from jaxinfer.sampling_params import SamplingParams
from jaxinfer.server.protocol import _REFUSED_COMMON, _ROUTER_INERT, CHAT_ROLES, MAX_TOP_LOGPROBS, FieldError, _Body

MAX_STORED_RESPONSES = 1024
TEXT_PART_TYPES = ("input_text", "output_text")
LOGPROBS_INCLUDE = "message.output_text.logprobs"
TOOL_CHOICES_WITHOUT_TOOLS = ("auto", "none")  # with no tools, either changes nothing


class InputPart(_Body):
    """A content part of an input message: text only (``input_text``, or ``output_text`` of an earlier answer)."""

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


class InputMessage(_Body):
    """An input item: a message (``type`` "message" or absent). ``id`` / ``status`` / ``phase`` are what an
    earlier response's output message carries back: they do not change the prompt."""

    type: str | None = None
    role: str | None = None
    content: str | list[InputPart] | None = None
    id: Any = None
    status: Any = None
    phase: Any = None
    INERT = ("id", "status", "phase")

    def check_fields(self, strict: bool, prefix: str = "") -> list[str]:
        if self.type not in (None, "message"):
            raise FieldError(prefix + "type", f"{prefix}type: input items of type {self.type!r} are not supported: "
                                              "only messages (tool calls, reasoning items and item references are "
                                              "not implemented; continue a conversation with previous_response_id)")
        if self.role is None:
            raise FieldError(prefix + "role", f"field {prefix + 'role'!r} is required")
        if self.role not in CHAT_ROLES:
            raise FieldError(prefix + "role", f"{prefix}role {self.role!r} is not supported; use one of "
                                              f"{list(CHAT_ROLES)}")
        if self.content is None:
            raise FieldError(prefix + "content", f"field {prefix + 'content'!r} is required")
        return super().check_fields(strict, prefix)

    def text(self) -> str:
        if isinstance(self.content, str):
            return self.content
        return "".join(part.text for part in self.content or ())


class TextFormat(_Body):
    type: str

    def check_fields(self, strict: bool, prefix: str = "") -> list[str]:
        if self.type != "text":
            field = prefix.rstrip(".")
            raise FieldError(field, f"field {field!r} of type {self.type!r} is refused: structured outputs "
                                    "(json_schema, json_object) are not implemented yet; only {'type': 'text'}")
        return super().check_fields(strict, prefix)


class TextConfig(_Body):
    format: TextFormat | None = None
    verbosity: Any = None  # inert: a hint to OpenAI's models about length
    INERT = ("verbosity",)


class ResponsesRequest(_Body):
    model: str | None = None
    input: str | list[InputMessage]
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
    tool_choice: Any = None
    tools: Any = None
    truncation: str | None = None
    # inert: accepted, echoed where the response has them, ignored (see the module docstring)
    user: str | None = None
    parallel_tool_calls: bool | None = None
    service_tier: Any = None
    reasoning: Any = None
    INERT = ("user", "parallel_tool_calls", "service_tier", "reasoning", "max_tool_calls", "safety_identifier",
             "prompt_cache_key", "prompt_cache_retention", "stream_options", "verbosity") + _ROUTER_INERT
    REFUSED = {**_REFUSED_COMMON,
               "tools": "tools are not implemented yet (they would be ignored and no tool call made)",
               "truncation": "only truncation='disabled' is implemented ('auto' would drop input from the front); "
                             "a prompt longer than the context is a 400",
               "background": "background responses are not implemented: the response is made while you wait",
               "conversation": "conversations are not implemented: continue one with previous_response_id",
               "prompt": "prompt templates (stored on OpenAI's side) are not implemented",
               "context_management": "context management (compaction) is not implemented",
               "moderation": "moderation is not implemented"}

    def check_fields(self, strict: bool, prefix: str = "") -> list[str]:
        if self.tool_choice is not None and self.tool_choice not in TOOL_CHOICES_WITHOUT_TOOLS:
            raise FieldError("tool_choice", f"field 'tool_choice' ({self.tool_choice!r:.60}) is refused: tools are "
                                            "not implemented yet (only 'auto' or 'none', which change nothing)")
        if self.top_logprobs is not None and not 0 <= self.top_logprobs <= MAX_TOP_LOGPROBS:
            raise FieldError("top_logprobs", f"top_logprobs must be in [0, {MAX_TOP_LOGPROBS}], "
                                             f"got {self.top_logprobs}")
        if isinstance(self.input, list) and not self.input:
            raise FieldError("input", "input must not be empty")
        ignored = super().check_fields(strict, prefix)
        if self.top_logprobs is not None and not self.wants_logprobs:
            ignored.append("top_logprobs")  # without the include, no logprobs are returned
        if any(item != LOGPROBS_INCLUDE for item in self.include or ()):
            ignored.append("include")  # outputs of tools, images or reasoning: there are none
        return ignored

    @property
    def wants_logprobs(self) -> bool:
        return LOGPROBS_INCLUDE in (self.include or ())

    @property
    def top(self) -> int:
        """How many alternatives each output token's logprobs list."""
        return self.top_logprobs or 0

    def input_messages(self) -> list[dict[str, str]]:
        """The new input as chat messages (``instructions`` not included)."""
        if isinstance(self.input, str):
            return [{"role": "user", "content": self.input}]
        return [{"role": m.role, "content": m.text()} for m in self.input]

    def to_sampling_params(self) -> SamplingParams:
        given = {k: v for k, v in dict(temperature=self.temperature, top_p=self.top_p).items() if v is not None}
        return SamplingParams(**given, max_tokens=self.max_output_tokens,
                              logprobs=self.top if self.wants_logprobs else None)

    @staticmethod
    def param_aliases() -> dict[str, str]:
        """Engine field -> this request's field, for error messages' ``param``."""
        return {"max_tokens": "max_output_tokens", "logprobs": "top_logprobs"}


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
