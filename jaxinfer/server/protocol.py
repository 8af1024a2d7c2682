"""The OpenAI API's request bodies (pydantic, strict types) and OpenAI's error JSON.

Bodies are parsed from the raw bytes, so malformed JSON, a wrong type, a missing field or an unknown one all
become one ``APIError`` (HTTP 400) whose message names the field. Values are checked by the engine's own
validation (``SamplingParams``, ``LLMEngine.validate_request``): the ``to_sampling_params`` methods only
translate OpenAI's names. Fields the engine cannot honour are refused, never ignored: an unknown field is a
400 that names it. Besides OpenAI's fields, vLLM's extras are accepted (``top_k``, ``min_p``,
``repetition_penalty``, ``ignore_eos``, ``min_tokens``, ``stop_token_ids``, ``include_stop_str_in_output``,
``skip_special_tokens``, ``return_token_ids``).
"""

from __future__ import annotations

from typing import Any, Literal, Union

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from jaxinfer.sampling_params import SamplingParams

CHAT_ROLES = ("system", "developer", "user", "assistant")


class APIError(Exception):
    """An error answered as ``{"error": {"message", "type", "param", "code"}}`` with an HTTP status."""

    TYPES = {400: "invalid_request_error", 401: "authentication_error", 404: "not_found_error",
             500: "internal_server_error", 503: "service_unavailable"}

    def __init__(self, status: int, message: str, param: str | None = None, code: str | None = None,
                 headers: dict[str, str] | None = None):
        super().__init__(message)
        self.status, self.message, self.param, self.code = status, message, param, code
        self.headers = headers or {}

    def body(self) -> dict[str, Any]:
        return {"error": {"message": self.message, "type": self.TYPES.get(self.status, "error"),
                          "param": self.param, "code": self.code if self.code is not None else self.status}}


class _Body(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)


class StreamOptions(_Body):
    include_usage: bool = False


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
    user: str | None = None  # accepted and unused (OpenAI: an end-user id for abuse monitoring)
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
            logprobs=logprobs, skip_special_tokens=self.skip_special_tokens)

    @property
    def include_usage(self) -> bool:
        return bool(self.stream_options and self.stream_options.include_usage)


class CompletionRequest(_Sampling):
    prompt: Union[str, list[str], list[int], list[list[int]]]
    max_tokens: int | None = 16
    logprobs: int | None = None
    echo: bool = False

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

    def to_sampling_params(self) -> SamplingParams:
        if self.echo and self.logprobs is not None:
            raise ValueError("echo with logprobs needs the prompt's logprobs, which jaxinfer does not compute: "
                             "drop one of them")
        return self._params(self.max_tokens, self.logprobs)


class TextPart(_Body):
    type: Literal["text"]
    text: str


class ChatMessage(_Body):
    role: str
    content: str | list[TextPart] | None = None
    name: str | None = None

    def text(self) -> str:
        if self.content is None:
            return ""
        if isinstance(self.content, str):
            return self.content
        return "".join(part.text for part in self.content)


class ChatCompletionRequest(_Sampling):
    messages: list[ChatMessage]
    max_tokens: int | None = None
    max_completion_tokens: int | None = None
    logprobs: bool = False
    top_logprobs: int | None = None
    add_generation_prompt: bool = True

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
            raise ValueError("top_logprobs needs logprobs=true")
        logprobs = (self.top_logprobs or 0) if self.logprobs else None
        max_tokens = self.max_completion_tokens if self.max_completion_tokens is not None else self.max_tokens
        return self._params(max_tokens, logprobs)

    def dicts(self) -> list[dict[str, str]]:
        return [{"role": m.role, "content": m.text(), **({"name": m.name} if m.name else {})}
                for m in self.messages]


class TokenizeRequest(_Body):
    model: str | None = None
    prompt: str | None = None
    messages: list[ChatMessage] | None = None
    add_special_tokens: bool = True
    add_generation_prompt: bool = True


class DetokenizeRequest(_Body):
    model: str | None = None
    tokens: list[int] = Field(...)


def parse(model: type[BaseModel], raw: bytes) -> Any:
    """Parse a request body; any problem is an ``APIError`` 400 that names the field."""
    if not raw.strip():
        raise APIError(400, "the request body is empty; send a JSON object")
    try:
        return model.model_validate_json(raw)
    except ValidationError as exc:
        raise APIError(400, _describe(exc)) from None


def _describe(exc: ValidationError) -> str:
    errors = exc.errors(include_url=False)
    if errors and errors[0]["type"] == "json_invalid":
        return f"the request body is not valid JSON: {errors[0]['msg']}"
    if errors and errors[0]["type"] == "model_type":
        return "the request body must be a JSON object"
    parts = []
    seen = set()
    for e in errors:
        loc = ".".join(str(x) for x in e["loc"] if not _is_union_tag(x))
        if e["type"] == "extra_forbidden":
            msg = f"unknown field {loc!r} (not supported by this server)"
        elif e["type"] == "missing":
            msg = f"field {loc!r} is required"
        else:
            msg = f"{loc or 'body'}: {e['msg']} (got {e.get('input')!r:.80})"
        if msg not in seen:
            seen.add(msg)
            parts.append(msg)
    return "; ".join(parts[:4])


def _is_union_tag(x) -> bool:
    """pydantic puts the tried union member in ``loc`` ("str", "list[int]", ...): not a field name."""
    return isinstance(x, str) and (x in ("str", "int", "float", "bool", "none") or "[" in x
                                   or x.startswith(("function-", "lax-", "union[")))
