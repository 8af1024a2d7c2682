"""The OpenAI API's request bodies (pydantic, strict types), the field policy, and OpenAI's error JSON.

Bodies are parsed from the raw bytes, so malformed JSON, a wrong type or a missing field become one
``APIError`` (HTTP 400) whose message and ``param`` name the field. Values are checked by the engine's own
validation (``SamplingParams``, ``LLMEngine.validate_request``): the ``to_sampling_params`` methods only
translate OpenAI's names. Besides OpenAI's fields, vLLM's extras are honoured (``top_k``, ``min_p``,
``repetition_penalty``, ``ignore_eos``, ``min_tokens``, ``stop_token_ids``, ``include_stop_str_in_output``,
``skip_special_tokens``, ``return_token_ids``).

The field policy: every field is honoured, inert or refused.

* **inert** (``INERT``): accepted and ignored, because ignoring it cannot change the output (``store``,
  ``metadata``, ``user``, ``parallel_tool_calls``, ``service_tier``, routers' bookkeeping, ...). So is an
  **unknown** field, as vLLM does, unless the server runs with ``--strict-fields`` (then it is a 400).
  ``parse`` returns the ignored fields' names; the server logs each name once and lists them in the
  ``x-jaxinfer-ignored-fields`` response header.
* **refused** (``REFUSED``): a field that, ignored, would silently change the result (``logit_bias``,
  ``suffix``, ``best_of`` other than ``n``, beam search, ...) is a 400 naming it when given a value other than
  its neutral one (``null``, ``false``, empty, or the listed neutral value): a client that sends
  ``"logit_bias": {}`` is served.

Structured outputs (``structured_output_params``): ``response_format`` (``text``, ``json_object``,
``json_schema``), vLLM's ``structured_outputs`` object (``json``, ``regex``, ``choice``, ``grammar``,
``json_object``, ``whitespace_pattern``) and, as aliases of it, the older ``guided_json`` / ``guided_regex`` /
``guided_choice`` / ``guided_grammar`` (removed from vLLM 0.12, still sent by older clients). At most one
constraint per request: two are a 400 naming the second.
"""

from __future__ import annotations

import dataclasses
import json
from typing import Any, ClassVar, Literal, Union

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from jaxinfer.sampling_params import SamplingParams, StructuredOutputsParams
from jaxinfer.server.constraint_fields import constraint_of
from jaxinfer.server.field_error import FieldError

CHAT_ROLES = ("system", "developer", "user", "assistant", "tool")
MAX_TOP_LOGPROBS = 20  # as SamplingParams.logprobs


class APIError(Exception):
    """An error answered as ``{"error": {"message", "type", "param", "code"}}`` with an HTTP status."""

    TYPES = {400: "invalid_request_error", 401: "authentication_error", 404: "not_found_error",
             405: "invalid_request_error", 413: "invalid_request_error", 500: "internal_server_error",
             503: "service_unavailable"}

    def __init__(self, status: int, message: str, param: str | None = None, code: str | None = None,
                 headers: dict[str, str] | None = None):
        super().__init__(message)
        self.status, self.message, self.param, self.code = status, message, param, code
        self.headers = headers or {}

    def body(self) -> dict[str, Any]:
        return {"error": {"message": self.message, "type": self.TYPES.get(self.status, "error"),
                          "param": self.param, "code": self.code}}



# The neutral value of a refused field: given it, the field changes nothing (besides null / false / empty).
_NEUTRAL = {"response_format": {"type": "text"}, "modalities": ["text"],
            "truncation": "disabled", "spaces_between_special_tokens": True, "text": {"format": {"type": "text"}}}


def _is_neutral(name: str, value: Any) -> bool:
    if value is None or value is False or (isinstance(value, (str, list, dict)) and not value):
        return True
    return _NEUTRAL.get(name, object()) == value


class _Body(BaseModel):
    """A request body or part: unknown fields are kept (``model_extra``) for the field policy."""

    model_config = ConfigDict(extra="allow", strict=True)
    INERT: ClassVar[tuple[str, ...]] = ()  # declared fields accepted and ignored (they cannot change the output)
    REFUSED: ClassVar[dict[str, str]] = {}  # field -> why it is refused when given a non-neutral value

    def check_fields(self, strict: bool, prefix: str = "") -> list[str]:
        """Apply the field policy to this body and its parts: raise ``FieldError`` for a refused field with a
        non-neutral value (and, with ``strict``, for an unknown field); return the ignored fields' dotted
        names (inert fields given a non-neutral value, and unknown ones)."""
        ignored = []
        for name, why in self.REFUSED.items():
            if not _is_neutral(name, self._value(name)):
                raise FieldError(prefix + name, f"field {prefix + name!r} is refused: {why}")
        for name in self.INERT:
            if not _is_neutral(name, self._value(name)):
                ignored.append(prefix + name)
        for name in self.model_extra or {}:
            if name in self.REFUSED or name in self.INERT:
                continue
            if strict:
                raise FieldError(prefix + name, f"unknown field {prefix + name!r} (not supported by this server; "
                                                "it runs with --strict-fields)")
            ignored.append(prefix + name)
        for name in type(self).model_fields:
            ignored += _check_part(getattr(self, name), strict, f"{prefix}{name}")
        return ignored

    def _value(self, name: str) -> Any:
        return getattr(self, name) if name in type(self).model_fields else (self.model_extra or {}).get(name)


def _check_part(value: Any, strict: bool, path: str) -> list[str]:
    if isinstance(value, _Body):
        return value.check_fields(strict, path + ".")
    if isinstance(value, list):
        return [f for i, v in enumerate(value) for f in _check_part(v, strict, f"{path}[{i}]")]
    return []


# Fields that vLLM's or SGLang's clients and routers send and that change nothing here.
_ROUTER_INERT = ("no_stop_trim", "separate_reasoning", "stream_reasoning", "include_reasoning", "priority",
                 "request_id", "cache_salt")
_REFUSED_COMMON = {
    "logit_bias": "logit_bias is not implemented; sending it would silently sample without the bias",
    "guided_decoding_backend": "a per-request grammar backend is not selectable (this server uses llguidance)",
    "use_beam_search": "beam search is not implemented",
    "length_penalty": "length_penalty applies to beam search, which is not implemented",
    "allowed_token_ids": "allowed_token_ids is not implemented",
    "bad_words": "bad_words is not implemented",
    "truncate_prompt_tokens": "prompt truncation is not implemented: send a prompt that fits",
    "prompt_logprobs": "prompt_logprobs on this route is not implemented (use /v1/completions with echo and "
                       "logprobs)",
    "return_hidden_states": "hidden states are not returned by this server",
    "spaces_between_special_tokens": "only spaces_between_special_tokens=true is implemented",
    "lora_request": "LoRA adapters are not implemented",
}


class StreamOptions(_Body):
    include_usage: bool = False
    continuous_usage_stats: bool = False  # vLLM's: the usage so far on every chunk


class _Sampling(_Body):
    """Fields shared by completions and chat completions."""

    # null is accepted for every optional field and means its default (some clients send explicit nulls)
    model: str | None = None
    n: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    seed: int | None = None
    stop: str | list[str] | None = None
    stream: bool | None = False
    stream_options: StreamOptions | None = None
    # inert: accepted, ignored (see the module docstring)
    user: Any = None  # an end-user id for abuse monitoring
    store: Any = None
    metadata: Any = None
    service_tier: Any = None
    INERT = ("user", "store", "metadata", "service_tier")
    REFUSED = dict(_REFUSED_COMMON)
    # structured outputs (see the module docstring)
    response_format: dict | None = None
    structured_outputs: dict | None = None
    guided_json: dict | str | None = None
    guided_regex: str | None = None
    guided_choice: list[str] | None = None
    guided_grammar: str | None = None
    guided_whitespace_pattern: str | None = None
    # vLLM's extras
    top_k: int | None = None
    min_p: float | None = None
    repetition_penalty: float | None = None
    ignore_eos: bool = False
    min_tokens: int | None = None
    stop_token_ids: list[int] | None = None
    include_stop_str_in_output: bool = False
    skip_special_tokens: bool = True
    return_token_ids: bool = False  # add the generated (and prompt) token ids to each choice

    def _params(self, max_tokens: int | None, logprobs: int | None) -> SamplingParams:
        if self.stream_options is not None and not self.stream:
            raise ValueError("stream_options is only allowed with stream=true")
        given = {k: v for k, v in dict(
            n=self.n, temperature=self.temperature, top_p=self.top_p, top_k=self.top_k, min_p=self.min_p,
            presence_penalty=self.presence_penalty, frequency_penalty=self.frequency_penalty,
            repetition_penalty=self.repetition_penalty, min_tokens=self.min_tokens).items() if v is not None}
        return SamplingParams(
            **given, seed=self.seed, max_tokens=max_tokens, stop=self.stop, stop_token_ids=self.stop_token_ids,
            ignore_eos=self.ignore_eos, include_stop_str_in_output=self.include_stop_str_in_output,
            logprobs=logprobs, skip_special_tokens=self.skip_special_tokens,
            structured_outputs=self.structured_output_params())

    def structured_output_params(self) -> StructuredOutputsParams | None:
        """The request's constraint (``response_format``, ``structured_outputs`` or a ``guided_*`` alias), or
        None; ``FieldError`` naming the field when it is malformed or a second one is given."""
        return constraint_of(self)

    @property
    def constraint_field(self) -> str:
        """The request field its constraint came from (for error messages' ``param``)."""
        for name in ("response_format", "guided_json", "guided_regex", "guided_choice", "guided_grammar"):
            if getattr(self, name) is not None and (name != "response_format" or
                                                    self.response_format.get("type") != "text"):
                return name
        return "structured_outputs"

    def param_aliases(self) -> dict[str, str]:
        """Engine field -> this request's field, for error messages' ``param``."""
        return {"structured_outputs": self.constraint_field}

    @property
    def include_usage(self) -> bool:
        return bool(self.stream_options and self.stream_options.include_usage)

    @property
    def continuous_usage(self) -> bool:
        """vLLM's ``continuous_usage_stats``: the usage so far on every chunk (with ``include_usage``)."""
        return self.include_usage and self.stream_options.continuous_usage_stats


class CompletionRequest(_Sampling):
    prompt: Union[str, list[str], list[int], list[list[int]]]
    max_tokens: int | None = 16
    logprobs: int | None = None
    echo: bool = False
    best_of: int | None = None
    REFUSED = {**_REFUSED_COMMON, "suffix": "suffix (insertion) is not implemented"}
    INERT = _Sampling.INERT + _ROUTER_INERT

    def check_fields(self, strict: bool, prefix: str = "") -> list[str]:
        if self.best_of is not None and self.best_of != (self.n or 1):
            raise FieldError("best_of", f"best_of={self.best_of} (other than n) is not implemented: it would "
                                        "return the best of several samples, which this server does not rank")
        return super().check_fields(strict, prefix)

    def prompts(self) -> list[Any]:
        """The prompts as the engine takes them: text, or ``{"prompt_token_ids": [...]}``."""
        p = self.prompt
        if isinstance(p, str):
            return [p]
        if not p:
            raise ValueError("prompt must not be empty")
        if all(isinstance(x, int) for x in p):
            return [{"prompt_token_ids": list(p)}]
        if all(isinstance(x, str) for x in p):
            return list(p)
        return [{"prompt_token_ids": list(x)} for x in p]

    @property
    def scoring_only(self) -> bool:
        """``echo`` with ``max_tokens=0``: the prompt (and with ``logprobs`` its logprobs), nothing generated."""
        return self.echo and self.max_tokens == 0

    def to_sampling_params(self) -> SamplingParams:
        if self.max_tokens == 0 and not self.echo:
            raise FieldError("max_tokens", "max_tokens=0 generates nothing: it needs echo=true (to score the prompt)")
        # scoring only: one token is generated (the prefill computes it anyway) and not returned
        params = self._params(1 if self.scoring_only else self.max_tokens, self.logprobs)
        if self.echo and self.logprobs is not None:  # the prompt's logprobs come back in front
            params = dataclasses.replace(params, prompt_logprobs=self.logprobs)
        return params


class TextPart(_Body):
    type: str
    text: str | None = None

    def check_fields(self, strict: bool, prefix: str = "") -> list[str]:
        if self.type != "text" or self.text is None:
            raise FieldError(prefix + "type", f"{prefix}type: content part of type {self.type!r} is not supported: "
                                              "this model reads text only (parts of type 'text' with a 'text' field)")
        return super().check_fields(strict, prefix)


class CalledFunction(_Body):
    name: str
    arguments: str | dict = "{}"  # OpenAI sends the JSON text; some clients the object


class ToolCallItem(_Body):
    """An assistant message's earlier tool call (history)."""

    id: str | None = None
    type: str = "function"
    function: CalledFunction


class ChatMessage(_Body):
    role: str
    content: str | list[TextPart] | None = None
    name: str | None = None
    tool_calls: list[ToolCallItem] | None = None  # assistant: the calls it made
    tool_call_id: str | None = None  # tool: which call this is the result of
    REFUSED = {"function_call": "function calls (the deprecated API) are not implemented: use tools"}
    INERT = ("refusal", "reasoning_content")
    refusal: Any = None
    reasoning_content: Any = None

    def template_dict(self) -> dict[str, Any]:
        """The message as HF chat templates read it: tool calls' arguments as objects (templates write them with
        ``tojson``), a tool result's ``tool_call_id``."""
        d: dict[str, Any] = {"role": self.role, "content": self.text()}
        if self.name:
            d["name"] = self.name
        if self.tool_calls:
            d["tool_calls"] = [{"id": c.id, "type": c.type,
                                "function": {"name": c.function.name, "arguments": _arguments(c.function.arguments)}}
                               for c in self.tool_calls]
        if self.tool_call_id is not None:
            d["tool_call_id"] = self.tool_call_id
        return d

    def text(self) -> str:
        if self.content is None:
            return ""
        if isinstance(self.content, str):
            return self.content
        return "".join(part.text for part in self.content)


class FunctionDefinition(_Body):
    name: str
    description: str | None = None
    parameters: dict | None = None  # a JSON schema; None: no arguments ({"type": "object"})
    strict: bool | None = None  # the schema is enforced for required / named calls either way


class ToolDefinition(_Body):
    type: str
    function: FunctionDefinition

    def check_fields(self, strict: bool, prefix: str = "") -> list[str]:
        if self.type != "function":
            raise FieldError(prefix + "type", f"{prefix}type: only tools of type 'function' are supported, got "
                                              f"{self.type!r}")
        return super().check_fields(strict, prefix)


class ChatCompletionRequest(_Sampling):
    messages: list[ChatMessage]
    max_tokens: int | None = None
    max_completion_tokens: int | None = None
    logprobs: bool = False
    top_logprobs: int | None = None
    add_generation_prompt: bool = True
    tools: list[ToolDefinition] | None = None
    tool_choice: str | dict | None = None  # "none" | "auto" | "required" | {"type": "function", "function": {"name"}}
    parallel_tool_calls: bool | None = None  # None: True (OpenAI's default)
    reasoning_effort: Any = None  # inert: the model does not reason
    prediction: Any = None  # inert: predicted outputs only speed up generation
    INERT = _Sampling.INERT + _ROUTER_INERT + ("reasoning_effort", "prediction")
    REFUSED = {**_REFUSED_COMMON,
               "functions": "functions are not implemented",
               "function_call": "functions are not implemented",
               "modalities": "only text output is implemented",
               "audio": "audio output is not implemented",
               "echo": "echo on chat completions is not implemented",
               "continue_final_message": "continue_final_message is not implemented",
               "chat_template": "a per-request chat template is not implemented",
               "chat_template_kwargs": "chat template arguments are not implemented",
               "documents": "documents are not implemented",
               "web_search_options": "web search is not implemented"}

    def check_messages(self) -> None:
        if not self.messages:
            raise ValueError("messages must not be empty")
        for i, m in enumerate(self.messages):
            if m.role not in CHAT_ROLES:
                raise ValueError(f"messages[{i}].role {m.role!r} is not supported; use one of {list(CHAT_ROLES)}")

    def to_sampling_params(self) -> SamplingParams:
        self.check_messages()
        if self.max_tokens is not None and self.max_completion_tokens is not None:
            raise ValueError("give max_tokens or max_completion_tokens, not both")
        if self.top_logprobs is not None and not self.logprobs:
            raise FieldError("top_logprobs", "top_logprobs needs logprobs=true")
        if self.top_logprobs is not None and not 0 <= self.top_logprobs <= MAX_TOP_LOGPROBS:
            raise FieldError("top_logprobs", f"top_logprobs must be in [0, {MAX_TOP_LOGPROBS}], "
                                             f"got {self.top_logprobs}")
        logprobs = (self.top_logprobs or 0) if self.logprobs else None
        max_tokens = self.max_completion_tokens if self.max_completion_tokens is not None else self.max_tokens
        return self._params(max_tokens, logprobs)

    def param_aliases(self) -> dict[str, str]:
        """Engine field -> this request's field, for error messages' ``param``."""
        return {**super().param_aliases(), "logprobs": "top_logprobs",
                "max_tokens": "max_tokens" if self.max_completion_tokens is None else "max_completion_tokens"}

    def dicts(self) -> list[dict[str, Any]]:
        return [m.template_dict() for m in self.messages]


def _arguments(arguments: str | dict) -> Any:
    """A history tool call's arguments as an object (the JSON text parsed; left as text if it does not parse)."""
    if isinstance(arguments, dict):
        return arguments
    try:
        return json.loads(arguments)
    except ValueError:
        return arguments


class TokenizeRequest(_Body):
    model: str | None = None
    prompt: str | None = None
    messages: list[ChatMessage] | None = None
    add_special_tokens: bool = True
    add_generation_prompt: bool = True


class DetokenizeRequest(_Body):
    model: str | None = None
    tokens: list[int] = Field(...)


def parse(model: type[_Body], raw: bytes, strict_fields: bool = False) -> tuple[Any, list[str]]:
    """Parse a request body and apply the field policy: ``(body, ignored field names)``. Any problem is an
    ``APIError`` 400 whose message and ``param`` name the (first) field."""
    if not raw.strip():
        raise APIError(400, "the request body is empty; send a JSON object")
    try:
        body = model.model_validate_json(raw)
    except ValidationError as exc:
        message, param = _describe(exc)
        raise APIError(400, message, param=param) from None
    try:
        return body, body.check_fields(strict_fields)
    except FieldError as exc:
        raise APIError(400, str(exc), param=exc.field) from None


_SAMPLING_FIELDS = frozenset(f.name for f in dataclasses.fields(SamplingParams))


def field_error(exc: ValueError, aliases: dict[str, str] | None = None) -> APIError:
    """The 400 of a value the engine refused. ``SamplingParams``' messages start with the field's name: then
    ``param`` is the request's name for that field (``aliases``: engine name -> request name)."""
    if isinstance(exc, FieldError):
        return APIError(400, str(exc), param=exc.field)
    first = str(exc).split(" ", 1)[0].rstrip(":")
    head = first.split(".", 1)[0]  # "structured_outputs.json does not compile: ..." names structured_outputs
    param = (aliases or {}).get(head, first) if head in _SAMPLING_FIELDS else None
    return APIError(400, str(exc), param=param)


def _describe(exc: ValidationError) -> tuple[str, str | None]:
    errors = exc.errors(include_url=False)
    if errors and errors[0]["type"] == "json_invalid":
        return f"the request body is not valid JSON: {errors[0]['msg']}", None
    if errors and errors[0]["type"] == "model_type":
        return "the request body must be a JSON object", None
    parts, params = [], []
    seen = set()
    for e in errors:
        loc = ".".join(str(x) for x in e["loc"] if not _is_union_tag(x))
        params.append(loc or None)
        if e["type"] == "missing":
            msg = f"field {loc!r} is required"
        else:
            msg = f"{loc or 'body'}: {e['msg']} (got {e.get('input')!r:.80})"
        if msg not in seen:
            seen.add(msg)
            parts.append(msg)
    return "; ".join(parts[:4]), params[0] if params else None


def _is_union_tag(x) -> bool:
    """pydantic puts the tried union member in ``loc`` ("str", "list[int]", ...): not a field name."""
    return isinstance(x, str) and (x in ("str", "int", "float", "bool", "none") or "[" in x
                                   or x.startswith(("function-", "lax-", "union[")))
