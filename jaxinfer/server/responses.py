"""OpenAI's Responses API: ``POST /v1/responses``, ``GET /v1/responses/{id}``, ``DELETE /v1/responses/{id}``.

A request (``jaxinfer.server.responses_protocol.ResponsesRequest``, with its field policy) becomes chat
messages — ``instructions`` as a system message in front, then the conversation of ``previous_response_id``
(its input messages and its output message, from the store), then the new ``input`` — rendered with the
checkpoint's chat template: the same prompt, and at temperature 0 the same text, as
``/v1/chat/completions`` with those messages. One engine request makes one output message.

Non-streamed, the answer is a ``response`` object as OpenAI's (``status`` "completed", or "incomplete" with
``incomplete_details.reason`` "max_output_tokens" when the output was cut by length; ``usage`` with
``input_tokens_details.cached_tokens``: the prompt tokens served from the prefix cache). Streamed, it is
OpenAI's event sequence, each ``event: TYPE`` / ``data: JSON`` with a ``sequence_number``:
``response.created``, ``response.in_progress``, ``response.output_item.added``,
``response.content_part.added``, one ``response.output_text.delta`` per new text (with its tokens' logprobs
when asked for), ``response.output_text.done``, ``response.content_part.done``, ``response.output_item.done``
and ``response.completed`` (or ``response.incomplete``). An engine failure after the stream started ends it
with an ``error`` event and ``response.failed``. A client that goes away aborts its engine request.

With ``store`` (the default, as OpenAI), the finished response is kept in memory (the last
``MAX_STORED_RESPONSES``, least recently used dropped first; nothing survives a restart) for ``GET``,
``DELETE`` and ``previous_response_id``. ``store: false`` keeps nothing.
"""

from __future__ import annotations

import dataclasses
import itertools
import time
from typing import Any, AsyncIterator

from fastapi import Request

from jaxinfer.outputs import RequestOutput
from jaxinfer.sampling_params import SamplingParams
from jaxinfer.server.async_engine import EngineDeadError
from jaxinfer.server.protocol import APIError, field_error
from jaxinfer.server.responses_protocol import ResponsesRequest, ResponseStore
from jaxinfer.server.serving import OpenAIServing, _usage, anext_or_none, collect, engine_error, merge, sse
from jaxinfer.server.text_stream import CompletionDeltas

MESSAGE_INDEX = 0  # the one output item's output_index and its one text part's content_index
CACHE_WRITE_TOKENS = 0  # OpenAI's explicit prompt-cache writes (prompt_cache_options): never made here


def add_responses_routes(app, serving: OpenAIServing, authorize, read, respond) -> None:
    """Adds the Responses API's routes to ``app`` (see the module docstring); the store is the routes' own."""
    responses = ResponsesServing(serving)
    app.state.responses = responses

    @app.post("/v1/responses")
    async def create(request: Request):
        authorize(request)
        req, ignored = await read(request, ResponsesRequest)
        return respond(await responses.create(req, request), ignored)

    @app.get("/v1/responses/{response_id}")
    async def retrieve(request: Request, response_id: str):
        authorize(request)
        if request.query_params.get("stream", "false").lower() not in ("false", "0"):
            raise APIError(400, "streaming a stored response again is not implemented: GET it without stream",
                           param="stream")
        return respond(responses.stored(response_id).response)

    @app.delete("/v1/responses/{response_id}")
    async def delete(request: Request, response_id: str):
        authorize(request)
        responses.stored(response_id)  # a 404 unless it is stored
        responses.store.delete(response_id)
        return respond({"id": response_id, "object": "response", "deleted": True})


@dataclasses.dataclass
class _Turn:
    """One response being made: its request, ids and conversation (input messages, instructions excluded)."""

    req: ResponsesRequest
    params: SamplingParams
    id: str
    message_id: str
    created_at: int
    conversation: list[dict]


class ResponsesServing:
    """The Responses API's logic over ``OpenAIServing``, and the store of its finished responses."""

    def __init__(self, serving: OpenAIServing, store: ResponseStore | None = None):
        self.serving = serving
        self.store = store if store is not None else ResponseStore()

    # ------------------------------------------------------------------------------------------ requests
    async def create(self, req: ResponsesRequest, raw_request) -> dict | AsyncIterator[str]:
        self.serving.check_model(req.model)
        try:
            params = req.to_sampling_params()
        except ValueError as exc:
            raise _renamed(field_error(exc, req.param_aliases()), req.param_aliases()) from None
        conversation = self._history(req.previous_response_id) + req.input_messages()
        system = [{"role": "system", "content": req.instructions}] if req.instructions else []
        ids = self.serving.render_chat(system + conversation, True)
        rid, gens = self._start(ids, params, req.param_aliases())
        key = rid.split("-", 1)[1]
        turn = _Turn(req, params, f"resp_{key}", f"msg_{key}", int(time.time()), conversation)
        merged = merge(gens)
        first = await self.serving.first_output(merged)
        if req.stream:
            return self._stream(turn, merged, first)
        (out,) = await collect(merged, first, 1, raw_request)
        return self._finish(turn, out)

    def stored(self, response_id: str):
        item = self.store.get(response_id)
        if item is None:
            raise APIError(404, f"no response {response_id!r} is stored on this server ({self._why_not_stored()})",
                           param="response_id", code="response_not_found")
        return item

    def _history(self, previous_id: str | None) -> list[dict]:
        if previous_id is None:
            return []
        item = self.store.get(previous_id)
        if item is None:
            raise APIError(404, f"previous response {previous_id!r} is not stored on this server "
                                f"({self._why_not_stored()})", param="previous_response_id",
                           code="previous_response_not_found")
        return list(item.conversation)

    def _why_not_stored(self) -> str:
        return (f"unknown, made with store=false, deleted, or dropped: the last {self.store.capacity} are kept, "
                "in memory only")

    def _start(self, ids: list[int], params: SamplingParams, aliases: dict[str, str]):
        """One engine request; a refusal's ``param`` is named as this request names it."""
        try:
            rid, _, gens = self.serving.start([{"prompt_token_ids": ids}], params, "resp")
        except APIError as exc:
            raise _renamed(exc, aliases) from None
        return rid, gens

    def _finish(self, turn: _Turn, out: RequestOutput) -> dict:
        """The finished response object of ``out``; stored if asked to be."""
        c = out.outputs[0]
        status = "incomplete" if c.finish_reason == "length" else "completed"
        logprobs = self._logprobs(turn, c.token_ids, c.logprobs)
        message = _message(turn.message_id, status, [_text_part(c.text, logprobs)])
        response = self._response(turn, status, [message], _responses_usage(out))
        if turn.req.store:
            self.store.put(response, [*turn.conversation, {"role": "assistant", "content": c.text}])
        return response

    def _logprobs(self, turn: _Turn, token_ids: list[int], logprobs: list | None) -> list[dict]:
        if not turn.req.wants_logprobs:
            return []
        return self.serving.chat_logprobs(token_ids, logprobs, turn.req.top)

    # ------------------------------------------------------------------------------------------- objects
    def _response(self, turn: _Turn, status: str, output: list[dict], usage: dict | None,
                  error: dict | None = None) -> dict:
        req, params = turn.req, turn.params
        return {
            "id": turn.id, "object": "response", "created_at": turn.created_at, "status": status,
            "completed_at": int(time.time()) if status == "completed" else None, "error": error,
            "incomplete_details": {"reason": "max_output_tokens"} if status == "incomplete" else None,
            "instructions": req.instructions, "max_output_tokens": req.max_output_tokens,
            "model": self.serving.model_name, "output": output,
            "parallel_tool_calls": True if req.parallel_tool_calls is None else req.parallel_tool_calls,
            "previous_response_id": req.previous_response_id, "reasoning": {"effort": None, "summary": None},
            "service_tier": "default", "store": bool(req.store), "temperature": params.temperature,
            "text": _text_config(req), "tool_choice": req.tool_choice or "auto", "tools": [],
            "top_logprobs": req.top, "top_p": params.top_p, "truncation": "disabled", "usage": usage,
            "user": req.user, "metadata": req.metadata or {},
        }

    # ----------------------------------------------------------------------------------------- streaming
    async def _stream(self, turn: _Turn, merged, first) -> AsyncIterator[str]:
        numbers = itertools.count()

        def event(kind: str, **fields) -> str:
            return f"event: {kind}\n" + sse({"type": kind, "sequence_number": next(numbers), **fields})

        part = {"item_id": turn.message_id, "output_index": MESSAGE_INDEX, "content_index": MESSAGE_INDEX}
        deltas, last = CompletionDeltas(None), first[1]
        try:
            opening = self._response(turn, "in_progress", [], None)
            yield event("response.created", response=opening)
            yield event("response.in_progress", response=opening)
            yield event("response.output_item.added", output_index=MESSAGE_INDEX,
                        item=_message(turn.message_id, "in_progress", []))
            yield event("response.content_part.added", **part, part=_text_part("", []))
            item = first
            while item is not None:
                last, c = item[1], item[1].outputs[0]
                text, ids, logprobs = deltas.next(c)
                if text or (ids and turn.req.wants_logprobs):
                    yield event("response.output_text.delta", **part, delta=text,
                                logprobs=self._logprobs(turn, ids, logprobs))
                item = await anext_or_none(merged)
        except (EngineDeadError, ValueError) as exc:
            error = engine_error(exc)
            yield event("error", code=error.code, message=error.message, param=error.param)
            yield event("response.failed", response=self._response(
                turn, "failed", [], None, error={"code": "server_error", "message": error.message}))
            return
        finally:  # also when the client goes away: its engine request is aborted
            await merged.aclose()
        response = self._finish(turn, last)
        message = response["output"][0]
        done_part = message["content"][0]
        yield event("response.output_text.done", **part, text=done_part["text"], logprobs=done_part["logprobs"])
        yield event("response.content_part.done", **part, part=done_part)
        yield event("response.output_item.done", output_index=MESSAGE_INDEX, item=message)
        yield event(f"response.{response['status']}", response=response)


def _renamed(error: APIError, aliases: dict[str, str]) -> APIError:
    """``error`` with the engine's names of its ``param`` and of its message's first word as the request's."""
    error.param = aliases.get(error.param, error.param)
    first, space, rest = error.message.partition(" ")
    error.message = aliases.get(first, first) + space + rest
    error.args = (error.message,)
    return error


def _message(message_id: str, status: str, content: list[dict]) -> dict:
    return {"type": "message", "id": message_id, "status": status, "role": "assistant", "content": content}


def _text_part(text: str, logprobs: list[dict]) -> dict:
    return {"type": "output_text", "text": text, "annotations": [], "logprobs": logprobs}


def _text_config(req: ResponsesRequest) -> dict[str, Any]:
    config: dict[str, Any] = {"format": {"type": "text"}}
    if req.text is not None and req.text.verbosity is not None:
        config["verbosity"] = req.text.verbosity
    return config


def _responses_usage(out: RequestOutput) -> dict:
    """The Responses API's usage of one finished request (serving's usage under the Responses names)."""
    usage = _usage(len(out.prompt_token_ids), sum(len(c.token_ids) for c in out.outputs), out.num_cached_tokens)
    return {"input_tokens": usage["prompt_tokens"],
            "input_tokens_details": {"cached_tokens": usage["prompt_tokens_details"]["cached_tokens"],
                                     "cache_write_tokens": CACHE_WRITE_TOKENS},
            "output_tokens": usage["completion_tokens"], "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": usage["total_tokens"]}

