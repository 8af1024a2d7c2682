"""OpenAI's Responses API: ``POST /v1/responses``, ``GET /v1/responses/{id}``, ``DELETE /v1/responses/{id}``.

A request (``jaxinfer.server.responses_protocol.ResponsesRequest``, with its field policy) becomes chat
messages — ``instructions`` as a system message in front, then the conversation of ``previous_response_id``
(its input items and its output items, from the store), then the new ``input`` — rendered with the
checkpoint's chat template and the request's function tools: the same prompt, and at temperature 0 the same
text, as ``/v1/chat/completions`` with those messages and tools. One engine request makes the output.

Function tools are planned as on chat completions (``jaxinfer.server.chat_tools.make_tool_plan``): with
``tool_choice`` "required" or a named function the output is forced to be calls; with "auto" the server's
``--tool-call-parser`` reads the calls out of the text. Each call becomes a ``function_call`` output item
(``id`` "fc_...", ``call_id`` the call's id, ``name``, ``arguments`` as JSON text, ``status`` "completed")
after the message item holding the text outside the calls (no message item when the calls are all there is).
Output text logprobs are not given with a tool-call parser at work (a 400 naming ``include``).

Non-streamed, the answer is a ``response`` object as OpenAI's (``status`` "completed", or "incomplete" with
``incomplete_details.reason`` "max_output_tokens" when the output was cut by length; ``usage`` with
``input_tokens_details.cached_tokens``: the prompt tokens served from the prefix cache). Streamed, it is
OpenAI's event sequence, each ``event: TYPE`` / ``data: JSON`` with a ``sequence_number``:
``response.created``, ``response.in_progress``, then for a message ``response.output_item.added``,
``response.content_part.added``, one ``response.output_text.delta`` per new text (with its tokens' logprobs
when asked for), ``response.output_text.done``, ``response.content_part.done``, ``response.output_item.done``;
for a function call ``response.output_item.added`` (status "in_progress", arguments ""),
``response.function_call_arguments.delta``, ``response.function_call_arguments.done`` and
``response.output_item.done``; and ``response.completed`` (or ``response.incomplete``) with all the items. The
items come one after the other, in the order the model wrote them: with tools, the message item opens with the
first text outside a call (so text written after a call, rare, is a second message item), and a call is sent
once it is complete (its markup could otherwise still prove to be text). Without a tool-call parser the message
item opens at once. An engine failure after the stream started ends it with an ``error`` event and
``response.failed``. A client that goes away aborts its engine request.

With ``store`` (the default, as OpenAI), the finished response is kept in memory (the last
``MAX_STORED_RESPONSES``, least recently used dropped first; nothing survives a restart) for ``GET``,
``DELETE`` and ``previous_response_id`` (whose conversation holds the function calls, so the next turn may
send just their outputs). ``store: false`` keeps nothing.
"""

from __future__ import annotations

import dataclasses
import itertools
import time
import uuid
from typing import Any, AsyncIterator, Callable, Iterator

from fastapi import Request

from jaxinfer.outputs import CompletionOutput, RequestOutput
from jaxinfer.sampling_params import SamplingParams
from jaxinfer.server.async_engine import EngineDeadError
from jaxinfer.server.chat_tools import ToolPlan, make_tool_plan
from jaxinfer.server.protocol import APIError, FieldError, field_error
from jaxinfer.server.responses_protocol import LOGPROBS_INCLUDE, ChatHistory, ResponsesRequest, ResponseStore
from jaxinfer.server.serving import OpenAIServing, _usage, anext_or_none, collect, engine_error, merge, sse
from jaxinfer.server.text_stream import CompletionDeltas

CONTENT_INDEX = 0  # a message item's one text part
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
    """One response being made: its request, ids, conversation (history and input as chat messages,
    instructions excluded) and tool plan (None: no tools)."""

    req: ResponsesRequest
    params: SamplingParams
    id: str
    message_id: str
    created_at: int
    conversation: list[dict]
    plan: ToolPlan | None = None

    @property
    def parser(self):
        """The tool-call parser that reads the output, or None (plain text)."""
        return self.plan.parser if self.plan is not None else None


class ResponsesServing:
    """The Responses API's logic over ``OpenAIServing``, and the store of its finished responses."""

    def __init__(self, serving: OpenAIServing, store: ResponseStore | None = None):
        self.serving = serving
        self.store = store if store is not None else ResponseStore()

    # ------------------------------------------------------------------------------------------ requests
    async def create(self, req: ResponsesRequest, raw_request) -> dict | AsyncIterator[str]:
        self.serving.check_model(req.model)
        aliases = req.param_aliases()
        try:
            params = req.to_sampling_params()
            plan = self._plan(req)
            params = plan.apply(params)
            history = ChatHistory(self._history(req.previous_response_id))
            req.add_input(history)
        except ValueError as exc:
            raise _renamed(field_error(exc, aliases), aliases) from None
        system = [{"role": "system", "content": req.instructions}] if req.instructions else []
        ids = self.serving.render_chat(system + history.messages, True, plan.tools)
        rid, gens = self._start(ids, params, aliases)
        key = rid.split("-", 1)[1]
        turn = _Turn(req, params, f"resp_{key}", f"msg_{key}", int(time.time()), history.messages, plan)
        merged = merge(gens)
        first = await self.serving.first_output(merged)
        if req.stream:
            return self._stream(turn, merged, first)
        (out,) = await collect(merged, first, 1, raw_request)
        return self._finish(turn, out)

    def _plan(self, req: ResponsesRequest) -> ToolPlan:
        """The request's tool plan (chat completions' plan of the tools in the chat shape)."""
        mode, choice = req.tool_mode()
        plan = make_tool_plan(mode, req.chat_tools(), choice, req.parallel_tool_calls is not False,
                              self.serving.options, self.serving.tokenizer,
                              "text.format" if req.constraint is not None else None)
        if plan.parser is not None and req.wants_logprobs:
            raise FieldError("include", f"include {LOGPROBS_INCLUDE!r} with tools (tool_choice {mode!r}) is not "
                                        "implemented: the output's tokens are partly calls, not text")
        return plan

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
            rid, _, gens = self.serving.start([{"prompt_token_ids": ids}], params, "resp", aliases)
        except APIError as exc:
            raise _renamed(exc, aliases) from None
        return rid, gens

    def _finish(self, turn: _Turn, out: RequestOutput, items: list[dict] | None = None) -> dict:
        """The finished response object of ``out`` (its output ``items`` when they were streamed, else made from
        ``out``); stored if asked to be."""
        c = out.outputs[0]
        status = _status(c)
        if items is None:
            items = self._items(turn, c, status)
        response = self._response(turn, status, items, _responses_usage(out))
        if turn.req.store:
            history = ChatHistory(turn.conversation)
            history.add_output(items)
            self.store.put(response, history.messages)
        return response

    def _items(self, turn: _Turn, c: CompletionOutput, status: str) -> list[dict]:
        """The output items of a finished output: its message, or the text outside the calls and the calls."""
        if turn.parser is None:
            logprobs = self._logprobs(turn, c.token_ids, c.logprobs)
            return [_message(turn.message_id, status, [_text_part(c.text, logprobs)])]
        message, _ = turn.plan.message(c.text, c.finish_reason)
        calls = [_function_call(call["id"], call["function"]["name"], call["function"]["arguments"], "completed")
                 for call in message.get("tool_calls") or ()]
        if calls and not message["content"]:
            return calls
        return [_message(turn.message_id, status, [_text_part(message["content"] or "", [])]), *calls]

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
            "text": _text_config(req), "tool_choice": req.echoed_tool_choice(),
            "tools": [t.echo() for t in req.tools or ()], "top_logprobs": req.top, "top_p": params.top_p,
            "truncation": "disabled", "usage": usage, "user": req.user, "metadata": req.metadata or {},
        }

    # ----------------------------------------------------------------------------------------- streaming
    async def _stream(self, turn: _Turn, merged, first) -> AsyncIterator[str]:
        numbers = itertools.count()

        def event(kind: str, **fields) -> str:
            return f"event: {kind}\n" + sse({"type": kind, "sequence_number": next(numbers), **fields})

        items = _StreamedItems(event, turn.message_id)
        calls = turn.plan.streamer() if turn.parser is not None else None
        deltas, last = CompletionDeltas(None), first[1]
        try:
            opening = self._response(turn, "in_progress", [], None)
            yield event("response.created", response=opening)
            yield event("response.in_progress", response=opening)
            if calls is None:  # plain text: the one message item opens at once
                for line in items.text_start():
                    yield line
            item = first
            while item is not None:
                last, c = item[1], item[1].outputs[0]
                text, ids, logprobs = deltas.next(c)
                if calls is None:
                    if text or (ids and turn.req.wants_logprobs):
                        for line in items.text(text, self._logprobs(turn, ids, logprobs)):
                            yield line
                else:
                    for piece in calls.pieces(text, c.finish_reason is not None):
                        for line in items.piece(piece):
                            yield line
                item = await anext_or_none(merged)
        except (EngineDeadError, ValueError) as exc:
            error = engine_error(exc)
            yield event("error", code=error.code, message=error.message, param=error.param)
            yield event("response.failed", response=self._response(
                turn, "failed", [], None, error={"code": "server_error", "message": error.message}))
            return
        finally:  # also when the client goes away: its engine request is aborted
            await merged.aclose()
        status = _status(last.outputs[0])
        if not items.items:  # nothing was written: an empty message, as the response without streaming has
            for line in items.text_start():
                yield line
        for line in items.close(status):
            yield line
        response = self._finish(turn, last, items.items)
        yield event(f"response.{response['status']}", response=response)


class _StreamedItems:
    """The output items of a streamed response, made one after the other, and the events that make them."""

    def __init__(self, event: Callable[..., str], message_id: str):
        self.event = event
        self.items: list[dict] = []
        self.open: int | None = None  # the output_index of the item being made
        self.message_id = message_id  # the first message item's id

    def _add(self, item: dict) -> Iterator[str]:
        self.open = len(self.items)
        self.items.append(item)
        yield self.event("response.output_item.added", output_index=self.open, item=item)

    def _where(self, **more) -> dict:
        return {"item_id": self.items[self.open]["id"], "output_index": self.open, **more}

    def text_start(self) -> Iterator[str]:
        """A new message item and its text part."""
        yield from self.close("completed")
        message_id = self.message_id if not self.items else f"msg_{uuid.uuid4().hex}"
        yield from self._add(_message(message_id, "in_progress", []))
        part = _text_part("", [])
        yield self.event("response.content_part.added", **self._where(content_index=CONTENT_INDEX), part=part)
        self.items[self.open]["content"].append(part)

    def text(self, delta: str, logprobs: list[dict]) -> Iterator[str]:
        if self.open is None or self.items[self.open]["type"] != "message":
            yield from self.text_start()
        part = self.items[self.open]["content"][CONTENT_INDEX]
        part["text"] += delta
        part["logprobs"] += logprobs
        yield self.event("response.output_text.delta", **self._where(content_index=CONTENT_INDEX), delta=delta,
                         logprobs=logprobs)

    def piece(self, piece: dict) -> Iterator[str]:
        """The events of one chat delta piece from ``ToolDeltas``: content, or a call's header or arguments."""
        text = piece.get("content") or ""
        if self.items and (self.open is None or self.items[self.open]["type"] != "message"):
            text = text.lstrip()  # a message after a call: without the whitespace that separated them
        if text:
            yield from self.text(text, [])
        for call in piece.get("tool_calls") or ():
            function = call.get("function") or {}
            if call.get("id") is not None:  # a new call's header
                yield from self.close("completed")
                yield from self._add(_function_call(call["id"], function["name"], "", "in_progress"))
            if function.get("arguments"):
                self.items[self.open]["arguments"] += function["arguments"]
                yield self.event("response.function_call_arguments.delta", **self._where(),
                                 delta=function["arguments"])

    def close(self, status: str) -> Iterator[str]:
        """Ends the item being made (a message with ``status``; a call is complete once it is sent)."""
        if self.open is None:
            return
        item = self.items[self.open]
        if item["type"] == "message":
            item["status"] = status
            part = item["content"][CONTENT_INDEX]
            where = self._where(content_index=CONTENT_INDEX)
            yield self.event("response.output_text.done", **where, text=part["text"], logprobs=part["logprobs"])
            yield self.event("response.content_part.done", **where, part=part)
        else:
            item["status"] = "completed"
            yield self.event("response.function_call_arguments.done", **self._where(), name=item["name"],
                             arguments=item["arguments"])
        yield self.event("response.output_item.done", output_index=self.open, item=item)
        self.open = None


def _status(c: CompletionOutput) -> str:
    return "incomplete" if c.finish_reason == "length" else "completed"


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


def _function_call(call_id: str, name: str, arguments: str, status: str) -> dict:
    return {"type": "function_call", "id": f"fc_{uuid.uuid4().hex}", "call_id": call_id, "name": name,
            "arguments": arguments, "status": status}


def _text_config(req: ResponsesRequest) -> dict[str, Any]:
    fmt = req.text.format if req.text is not None else None
    config: dict[str, Any] = {"format": fmt.echo() if fmt is not None else {"type": "text"}}
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

