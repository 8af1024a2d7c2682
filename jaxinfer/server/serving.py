"""The OpenAI endpoints' logic: completions and chat completions, streamed or not, plus tokenize.

Each handler validates every prompt (the engine's own checks) and the server's capacity before anything is
queued, then starts one engine request per prompt (a request with ``n > 1`` is one engine request with n
sequences; choice ``index = prompt_index * n + sample_index``, as OpenAI numbers them). The first output is
awaited before the HTTP response starts, so a request that fails early (dead engine) still gets its status
code; later failures of a stream end it with an error event. Streams are server-sent events in OpenAI's
chunk format ending with ``data: [DONE]``; with ``stream_options.include_usage`` the last chunk holds the
usage, and with vLLM's ``continuous_usage_stats`` as well every chunk holds the usage so far. Usage reports
``prompt_tokens_details.cached_tokens``: the request's prompt tokens served from the prefix cache. A client
that goes away cancels its requests (their KV blocks are freed before the next step).

Bounds (``ServerOptions``) are checked with the prompts, before anything is queued: ``n`` at most
``max_n``, and ``n`` times the tokens a sequence may generate at most ``max_request_tokens``.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import time
import uuid
from typing import Any, AsyncIterator

from jaxinfer.outputs import RequestOutput
from jaxinfer.sampling_params import SamplingParams
from jaxinfer.server.async_engine import AsyncLLMEngine, EngineDeadError, EngineOverloadedError
from jaxinfer.server.chat_template import ChatTemplate
from jaxinfer.server.chat_tools import plan_tools
from jaxinfer.server.options import ServerOptions
from jaxinfer.server.protocol import APIError, ChatCompletionRequest, CompletionRequest, field_error
from jaxinfer.server.text_stream import CompletionDeltas

RETRY_AFTER_S = 1


def engine_error(exc: Exception, aliases: dict[str, str] | None = None) -> APIError:
    """The HTTP form of what the engine raised (``aliases``: engine field -> the request's, for ``param``)."""
    if isinstance(exc, EngineDeadError):
        return APIError(500, str(exc), code="engine_dead")
    if isinstance(exc, EngineOverloadedError):
        return APIError(503, str(exc), code="overloaded", headers={"Retry-After": str(RETRY_AFTER_S)})
    if isinstance(exc, ValueError):
        return field_error(exc, aliases)
    raise exc


def sse(payload: Any) -> str:
    return f"data: {json.dumps(payload, ensure_ascii=False, separators=(',', ':'))}\n\n"


class OpenAIServing:
    def __init__(self, engine: AsyncLLMEngine, model_name: str, chat_template: ChatTemplate | None = None,
                 options: ServerOptions = ServerOptions()):
        self.engine = engine
        self.model_name = model_name
        self.chat_template = chat_template
        self.options = options
        self.tokenizer = engine.tokenizer

    # ------------------------------------------------------------------------------------------ helpers
    def check_model(self, name: str | None) -> None:
        if name is not None and name != self.model_name:
            raise APIError(404, f"the model {name!r} does not exist; this server serves {self.model_name!r}",
                           param="model", code="model_not_found")

    def start(self, prompts: list[Any], params: SamplingParams, prefix: str,
              aliases: dict[str, str] | None = None) -> tuple[str, list, list]:
        """Validate all prompts, check capacity, then start one engine request per prompt (``aliases``: engine
        field -> the request's, for the ``param`` of an error)."""
        try:
            validated, per_prompt = [], []
            for p in prompts:
                text, ids = self.engine.validate(p, self._uncapped(params))
                capped = self._cap_max_tokens(params, len(ids))
                self.engine.validate({"prompt_token_ids": ids}, capped)
                validated.append((text, ids))
                per_prompt.append(capped)
            for capped, v in zip(per_prompt, validated):
                self._check_bounds(capped, [v])
            self.engine.check_capacity(len(prompts))
        except (ValueError, EngineDeadError, EngineOverloadedError) as exc:
            raise engine_error(exc, aliases) from None
        rid = f"{prefix}-{uuid.uuid4().hex}"
        arrival = time.monotonic()
        gens = [self.engine.generate({"prompt_token_ids": ids}, per_prompt[i],
                                     f"{rid}-{i}" if len(prompts) > 1 else rid, arrival_time=arrival)
                for i, (_, ids) in enumerate(validated)]
        return rid, validated, gens

    @staticmethod
    def _uncapped(params: SamplingParams) -> SamplingParams:
        """``params`` without the max_tokens bound (to validate the prompt before capping max_tokens to it)."""
        if params.max_tokens is None:
            return params
        return dataclasses.replace(params, max_tokens=None, min_tokens=0)

    def _cap_max_tokens(self, params: SamplingParams, prompt_len: int) -> SamplingParams:
        """vLLM's rule: a ``max_tokens`` beyond the context left after the prompt is lowered to what is left (the
        request ends with finish_reason "length" there) instead of refused."""
        room = self.engine.max_model_len - prompt_len
        if params.max_tokens is None or params.max_tokens <= room:
            return params
        return dataclasses.replace(params, max_tokens=room)

    def _check_bounds(self, params: SamplingParams, validated: list) -> None:
        if params.n > self.options.max_n:
            raise APIError(400, f"n must be <= {self.options.max_n} on this server (--max-n), got {params.n}",
                           param="n")
        limit = self.options.request_token_limit(self.engine.max_model_len)
        for _, ids in validated:
            per_seq = params.max_tokens if params.max_tokens is not None else self.engine.max_model_len - len(ids)
            if params.n * per_seq > limit:
                raise APIError(400, f"n x max_tokens = {params.n} x {per_seq} = {params.n * per_seq} tokens is "
                                    f"more than one request may generate on this server ({limit}, "
                                    "--max-request-tokens)", param="max_tokens")

    async def first_output(self, merged: AsyncIterator) -> tuple[int, RequestOutput]:
        try:
            return await merged.__anext__()
        except (ValueError, EngineDeadError, EngineOverloadedError) as exc:
            await merged.aclose()
            raise engine_error(exc) from None
        except BaseException:  # cancelled while waiting: abort the requests now
            await merged.aclose()
            raise

    def _token_text(self, token_id: int) -> str:
        return self.tokenizer.decode([token_id], skip_special_tokens=False) if self.tokenizer else str(token_id)

    def _prompt_text(self, text: str | None, ids: list[int]) -> str:
        if text is not None:
            return text
        return self.tokenizer.decode(ids) if self.tokenizer else ""

    # ------------------------------------------------------------------------------------- completions
    async def completions(self, req: CompletionRequest, raw_request) -> dict | AsyncIterator[str]:
        self.check_model(req.model)
        try:
            params = req.to_sampling_params()
            prompts = req.prompts()
        except ValueError as exc:
            raise field_error(exc, req.param_aliases()) from None
        rid, validated, gens = self.start(prompts, params, "cmpl", req.param_aliases())
        merged = merge(gens)
        first = await self.first_output(merged)
        created = int(time.time())
        if req.stream:
            return self._stream_completions(req, params, rid, created, validated, merged, first)
        finals = await collect(merged, first, len(gens), raw_request)
        choices, n_prompt, n_out, n_cached = [], 0, 0, 0
        for i, out in enumerate(finals):
            prompt_text = self._prompt_text(validated[i][0], out.prompt_token_ids) if req.echo else ""
            n_prompt += len(out.prompt_token_ids)
            n_cached += out.num_cached_tokens
            for c in out.outputs:
                ids, lps, text = (([], [], "") if req.scoring_only else (c.token_ids, c.logprobs, c.text))
                n_out += len(ids)
                logprobs = None
                if req.logprobs is not None:
                    logprobs = self._completion_logprobs(ids, lps, len(prompt_text))
                    if req.echo:
                        logprobs = _joined(self._prompt_logprobs(out), logprobs)
                choice = {"index": i * params.n + c.index, "text": prompt_text + text, "logprobs": logprobs,
                          "finish_reason": c.finish_reason, "stop_reason": c.stop_reason}
                if req.return_token_ids:
                    choice.update(token_ids=ids, prompt_token_ids=out.prompt_token_ids)
                choices.append(choice)
        return {"id": rid, "object": "text_completion", "created": created, "model": self.model_name,
                "choices": choices, "usage": _usage(n_prompt, n_out, n_cached)}

    def _prompt_logprobs(self, out: RequestOutput) -> dict:
        """The prompt's part of a completion's ``logprobs`` (``echo`` with ``logprobs``): the first token has
        none (null), each later one its logprob and the top ones (``RequestOutput.prompt_logprobs``)."""
        tokens, token_lps, tops, offsets, offset = [], [], [], [], 0
        for tid, entry in zip(out.prompt_token_ids, out.prompt_logprobs or []):
            t = self._token_text(tid)
            tokens.append(t)
            token_lps.append(None if entry is None else entry[tid].logprob)
            tops.append(None if entry is None else {self._token_text(k): v.logprob for k, v in entry.items()})
            offsets.append(offset)
            offset += len(t)
        return {"tokens": tokens, "token_logprobs": token_lps, "top_logprobs": tops, "text_offset": offsets}

    async def _stream_completions(self, req, params, rid, created, validated, merged, first) -> AsyncIterator[str]:
        deltas: dict[tuple[int, int], CompletionDeltas] = {}
        offsets: dict[tuple[int, int], int] = {}
        done: set[tuple[int, int]] = set()
        n_prompt: dict[int, int] = {}
        n_cached: dict[int, int] = {}
        n_out: dict[tuple[int, int], int] = {}

        def choices(item):
            i, out = item
            n_prompt[i] = len(out.prompt_token_ids)
            n_cached[i] = out.num_cached_tokens
            for c in out.outputs:
                key = (i, c.index)
                if key in done:
                    continue
                tracker = deltas.get(key)
                prefix, prompt_lps = "", None
                if tracker is None:
                    tracker = deltas[key] = CompletionDeltas(params.stop)
                    if req.echo:
                        prefix = self._prompt_text(validated[i][0], out.prompt_token_ids)
                        if req.logprobs is not None:
                            prompt_lps = self._prompt_logprobs(out)
                    offsets[key] = len(prefix)
                text, ids, logprobs = tracker.next(c)
                if req.scoring_only:
                    text, ids, logprobs = "", [], []
                if not (prefix or text or ids or c.finish_reason):
                    continue
                n_out[key] = 0 if req.scoring_only else len(c.token_ids)
                choice = {"index": i * params.n + c.index, "text": prefix + text,
                          "logprobs": None, "finish_reason": c.finish_reason, "stop_reason": c.stop_reason}
                if req.logprobs is not None:
                    generated = self._completion_logprobs(ids, logprobs, offsets[key])
                    offsets[key] += sum(len(t) for t in generated["tokens"])
                    choice["logprobs"] = generated if prompt_lps is None else _joined(prompt_lps, generated)
                if req.return_token_ids:
                    choice["token_ids"] = ids
                if c.finish_reason is not None:
                    done.add(key)
                yield choice

        base = {"id": rid, "object": "text_completion", "created": created, "model": self.model_name}
        async for event in _sse_stream(req, base, merged, first, choices,
                                       lambda: _usage(sum(n_prompt.values()), sum(n_out.values()),
                                                      sum(n_cached.values()))):
            yield event

    def _completion_logprobs(self, token_ids: list[int], logprobs: list[dict] | None, offset: int) -> dict:
        tokens, token_lps, tops, offsets = [], [], [], []
        for tid, entry in zip(token_ids, logprobs or []):
            t = self._token_text(tid)
            tokens.append(t)
            token_lps.append(entry[tid])
            tops.append({self._token_text(k): v for k, v in entry.items()})
            offsets.append(offset)
            offset += len(t)
        return {"tokens": tokens, "token_logprobs": token_lps, "top_logprobs": tops, "text_offset": offsets}

    # ------------------------------------------------------------------------------------------- chat
    def render_chat(self, messages: list[dict], add_generation_prompt: bool, tools: list[dict] | None = None) -> list[int]:
        if self.chat_template is None or self.tokenizer is None:
            raise APIError(400, "this model has no chat template (tokenizer_config.json 'chat_template' or "
                                "chat_template.jinja): use /v1/completions")
        try:
            text = self.chat_template.render(messages, add_generation_prompt, tools)
        except ValueError as exc:
            raise APIError(400, str(exc)) from None
        return self.tokenizer.encode(text, add_special_tokens=False)

    async def chat(self, req: ChatCompletionRequest, raw_request) -> dict | AsyncIterator[str]:
        self.check_model(req.model)
        try:
            params = req.to_sampling_params()
            tools = plan_tools(req, self.options, self.tokenizer)
            params = tools.apply(params)
        except ValueError as exc:
            raise field_error(exc, req.param_aliases()) from None
        ids = self.render_chat(req.dicts(), req.add_generation_prompt, tools.tools)
        rid, _, gens = self.start([{"prompt_token_ids": ids}], params, "chatcmpl", req.param_aliases())
        merged = merge(gens)
        first = await self.first_output(merged)
        created = int(time.time())
        top = req.top_logprobs or 0
        if req.stream:
            return self._stream_chat(req, params, rid, created, merged, first, top, tools)
        (out,) = await collect(merged, first, 1, raw_request)
        choices = []
        for c in out.outputs:
            message, finish_reason = tools.message(c.text, c.finish_reason)
            choice = {"index": c.index, "message": message,
                      "logprobs": {"content": self.chat_logprobs(c.token_ids, c.logprobs, top)}
                      if req.logprobs else None,
                      "finish_reason": finish_reason, "stop_reason": c.stop_reason}
            if req.return_token_ids:
                choice.update(token_ids=c.token_ids, prompt_token_ids=out.prompt_token_ids)
            choices.append(choice)
        return {"id": rid, "object": "chat.completion", "created": created, "model": self.model_name,
                "choices": choices,
                "usage": _usage(len(out.prompt_token_ids), sum(len(c.token_ids) for c in out.outputs),
                                out.num_cached_tokens)}

    async def _stream_chat(self, req, params, rid, created, merged, first, top, tools) -> AsyncIterator[str]:
        deltas = {i: CompletionDeltas(params.stop) for i in range(params.n)}
        calls = {i: tools.streamer() for i in range(params.n)}  # None without a tool-call parser
        done: set[int] = set()
        n_prompt, n_out, n_cached = len(first[1].prompt_token_ids), {}, [first[1].num_cached_tokens]

        def choices(item):
            n_cached[0] = item[1].num_cached_tokens
            for c in item[1].outputs:
                if c.index in done:
                    continue
                text, ids, logprobs = deltas[c.index].next(c)
                if not (text or ids or c.finish_reason):
                    continue
                n_out[c.index] = len(c.token_ids)
                finished = c.finish_reason is not None
                stream = calls[c.index]
                if stream is None:
                    pieces, finish_reason = [{"content": text} if text else {}], c.finish_reason
                else:  # content, and each tool call once it is complete
                    pieces, finish_reason = stream.pieces(text, finished), stream.finish_reason(c.finish_reason)
                    if not pieces and (finished or (ids and (req.logprobs or req.return_token_ids))):
                        pieces = [{}]
                for k, piece in enumerate(pieces):
                    last = k == len(pieces) - 1
                    choice = {"index": c.index, "delta": piece,
                              "logprobs": {"content": self.chat_logprobs(ids, logprobs, top)} if req.logprobs and k == 0
                              else None, "finish_reason": finish_reason if last else None,
                              "stop_reason": c.stop_reason if last else None}
                    if req.return_token_ids:
                        choice["token_ids"] = ids if k == 0 else []
                    yield choice
                if finished:
                    done.add(c.index)

        base = {"id": rid, "object": "chat.completion.chunk", "created": created, "model": self.model_name}
        opening = [{"index": i, "delta": {"role": "assistant", "content": ""}, "logprobs": None, "finish_reason": None}
                   for i in range(params.n)]
        async for event in _sse_stream(req, base, merged, first, choices,
                                       lambda: _usage(n_prompt, sum(n_out.values()), n_cached[0]), opening):
            yield event

    def chat_logprobs(self, token_ids: list[int], logprobs: list[dict] | None, top: int) -> list[dict]:
        content = []
        for tid, entry in zip(token_ids, logprobs or []):
            best = sorted(entry.items(), key=lambda kv: -kv[1])[:top]
            content.append({**self._lp(tid, entry[tid]), "top_logprobs": [self._lp(k, v) for k, v in best]})
        return content

    def _lp(self, token_id: int, logprob: float) -> dict:
        t = self._token_text(token_id)
        return {"token": t, "logprob": logprob, "bytes": list(t.encode("utf-8"))}


# ---------------------------------------------------------------------------------------------- plumbing

async def _sse_stream(req, base: dict, merged, first, choices, usage, opening=()) -> AsyncIterator[str]:
    """The server-sent events of a stream: the ``opening`` choices, then one chunk per choice that
    ``choices(item)`` yields for each merged engine output (``first``, then ``merged``'s), an engine error as a
    final error event, the usage chunk if asked for (``usage()``), and ``[DONE]``."""
    def usage_field():  # the usage so far on every chunk (continuous_usage_stats), else null, or nothing
        if req.continuous_usage:
            return {"usage": usage()}
        return {"usage": None} if req.include_usage else {}

    try:
        for choice in opening:
            yield sse({**base, "choices": [choice], **usage_field()})
        item = first
        while item is not None:
            for choice in choices(item):
                yield sse({**base, "choices": [choice], **usage_field()})
            item = await anext_or_none(merged)
    except (EngineDeadError, ValueError) as exc:
        yield sse(engine_error(exc).body())
    finally:
        await merged.aclose()
    if req.include_usage:
        yield sse({**base, "choices": [], "usage": usage()})
    yield "data: [DONE]\n\n"

def _usage(prompt: int, completion: int, cached: int = 0) -> dict:
    """OpenAI's usage; ``cached``: prompt tokens served from the prefix cache."""
    return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion,
            "prompt_tokens_details": {"cached_tokens": cached}}


def _joined(first: dict, second: dict) -> dict:
    """Two completion ``logprobs`` blocks, one after the other."""
    return {k: first[k] + second[k] for k in first}


async def anext_or_none(it: AsyncIterator):
    try:
        return await it.__anext__()
    except StopAsyncIteration:
        return None


async def merge(gens: list[AsyncIterator[RequestOutput]]) -> AsyncIterator[tuple[int, RequestOutput]]:
    """(prompt index, output) from several ``generate`` streams as they come; closing it aborts them all."""
    if len(gens) == 1:
        try:
            async for out in gens[0]:
                yield 0, out
        finally:
            await gens[0].aclose()
        return
    q: asyncio.Queue = asyncio.Queue()

    async def pump(i, gen):
        try:
            async for out in gen:
                q.put_nowait((i, out))
            q.put_nowait((i, None))
        except Exception as exc:  # noqa: BLE001 - re-raised by the consumer
            q.put_nowait((i, exc))
        finally:
            await gen.aclose()

    tasks = [asyncio.ensure_future(pump(i, g)) for i, g in enumerate(gens)]
    try:
        remaining = len(gens)
        while remaining:
            i, item = await q.get()
            if item is None:
                remaining -= 1
            elif isinstance(item, Exception):
                raise item
            else:
                yield i, item
    finally:
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


async def collect(merged: AsyncIterator, first, num: int, raw_request) -> list[RequestOutput]:
    """The final output of each of ``num`` requests; if the client disconnects first, abort them."""
    finals: dict[int, RequestOutput] = {}

    async def consume():
        item = first
        while item is not None:
            if item[1].finished:
                finals[item[0]] = item[1]
            item = await anext_or_none(merged)

    task = asyncio.ensure_future(consume())
    watcher = asyncio.ensure_future(_disconnected(raw_request)) if raw_request is not None else None
    try:
        waiting = {task} | ({watcher} if watcher else set())
        await asyncio.wait(waiting, return_when=asyncio.FIRST_COMPLETED)
        if not task.done():  # the client went away
            raise APIError(499, "the client disconnected; its requests were aborted")
        exc = task.exception()
        if exc is not None:
            raise engine_error(exc) if isinstance(exc, (EngineDeadError, ValueError)) else exc
    finally:
        if watcher is not None:
            watcher.cancel()
        if not task.done():
            task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        await merged.aclose()
    return [finals[i] for i in range(num)]


async def _disconnected(raw_request) -> None:
    while True:
        message = await raw_request.receive()
        if message["type"] == "http.disconnect":
            return
