"""AsyncLLMEngine: an LLMEngine stepped by its own thread, with an ``async for`` API for asyncio code.

One thread owns the ``LLMEngine``: it takes commands (add a request, abort one) from a thread-safe queue,
steps the engine whenever it has work, and hands every ``RequestOutput`` to the event loop of the request's
caller (``loop.call_soon_threadsafe``, one hop per loop per step). Nothing else touches the engine's state
except through that queue, so the engine itself needs no locks.

    engine = AsyncLLMEngine.from_config(EngineConfig(...)); engine.start()
    async for out in engine.generate("def f(x):", SamplingParams(max_tokens=16), "req-1"):
        print(out.outputs[0].text)

* Validation runs in the caller, before anything is queued: a bad prompt or parameter is a ``ValueError``
  from ``generate`` (or from ``validate``, to check several prompts before queuing any).
* Cancellation: when the consumer stops iterating (its task is cancelled, the client went away, it broke
  out of the loop), the request is aborted and its KV blocks are freed by the engine thread before its
  next step.
* Backpressure: with ``max_waiting_requests``, ``generate`` raises ``EngineOverloadedError`` when that many
  sequences already wait for a slot (nothing is queued).
* A step that raises kills the engine, it does not hang it: the traceback is logged once, every in-flight
  request and every later one fails at once with ``EngineDeadError`` (vLLM's name), ``is_dead`` turns True.
* ``await reset_prefix_cache()`` runs ``LLMEngine.reset_prefix_cache`` on the engine thread between two steps
  and returns its bool; when the thread stops, the engine's KV-cache event publisher is closed.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import queue
import threading
import time
from typing import Any, AsyncIterator, Protocol

from jaxinfer.config.engine import EngineConfig
from jaxinfer.llm_engine import LLMEngine
from jaxinfer.outputs import RequestOutput
from jaxinfer.sampling_params import SamplingParams

logger = logging.getLogger("jaxinfer.server")
_IDLE_POLL_S = 0.001  # a static batch that is still forming: poll instead of spinning


class EngineDeadError(RuntimeError):
    """The engine thread stopped because a step raised; ``__cause__`` is that exception."""


class EngineOverloadedError(RuntimeError):
    """More requests wait than ``max_waiting_requests`` allows: retry later (HTTP 503)."""


@dataclasses.dataclass
class RequestTimes:
    """One request's timeline in the engine's clock (``time.monotonic``) and its token counts."""

    arrival: float
    num_prompt_tokens: int
    first_token: float | None = None
    last_token: float | None = None
    finished: float | None = None
    num_generation_tokens: int = 0  # over all n samples


class RequestObserver(Protocol):
    """What the server's metrics receive from ``generate`` (called in the caller's event loop)."""

    def on_tokens(self, num_new: int, since_last_s: float | None, ttft_s: float | None) -> None: ...

    def on_finished(self, reason: str, times: RequestTimes) -> None: ...


@dataclasses.dataclass
class _Add:
    request_id: str
    prompt_token_ids: list[int]
    params: SamplingParams
    arrival_time: float
    loop: asyncio.AbstractEventLoop
    queue: asyncio.Queue


@dataclasses.dataclass
class _Abort:
    request_id: str


@dataclasses.dataclass
class _ResetPrefixCache:
    loop: asyncio.AbstractEventLoop
    future: asyncio.Future


class AsyncLLMEngine:
    def __init__(self, engine: LLMEngine, max_waiting_requests: int | None = None,
                 observer: RequestObserver | None = None):
        if max_waiting_requests is not None and (not isinstance(max_waiting_requests, int)
                                                 or max_waiting_requests < 0):
            raise ValueError(f"max_waiting_requests must be an int >= 0 or None, got {max_waiting_requests!r}")
        self.engine = engine
        self.max_waiting_requests = max_waiting_requests
        self.observer = observer
        self._commands: queue.SimpleQueue = queue.SimpleQueue()
        self._wake = threading.Event()
        self._streams: dict[str, _Add] = {}  # engine thread only
        self._in_flight: set[str] = set()  # ids given to generate() and not yet done (any thread, under _lock)
        self._lock = threading.Lock()
        self._stop = False
        self._dead: EngineDeadError | None = None
        self._stats = engine.stats()
        self._thread = threading.Thread(target=self._run, name="jaxinfer-engine", daemon=True)

    @classmethod
    def from_config(cls, config: EngineConfig, **kwargs: Any) -> "AsyncLLMEngine":
        return cls(LLMEngine(config), **kwargs)

    # ---------------------------------------------------------------------------------------- lifecycle
    def start(self) -> None:
        if not self._thread.is_alive():
            self._thread.start()

    def shutdown(self, timeout: float | None = 10.0) -> None:
        """Abort whatever still runs and stop the engine thread."""
        self._stop = True
        self._wake.set()
        if self._thread.is_alive():
            self._thread.join(timeout)

    @property
    def is_dead(self) -> bool:
        return self._dead is not None

    @property
    def dead_error(self) -> EngineDeadError | None:
        return self._dead

    @property
    def tokenizer(self):
        return self.engine.tokenizer

    @property
    def max_model_len(self) -> int:
        return self.engine.max_model_len

    def stats(self) -> dict[str, Any]:
        """The engine's ``stats()`` as of its last step (published by the engine thread), plus ``num_queued``:
        requests handed to ``generate`` that the engine thread has not taken yet."""
        return {**self._stats, "num_queued": self._commands.qsize()}

    def num_waiting(self) -> int:
        """Sequences waiting for a slot: in the scheduler's queue or not yet taken by the engine thread."""
        return len(self.engine.scheduler.waiting) + self._commands.qsize()

    # ------------------------------------------------------------------------------------------- requests
    def validate(self, prompt: Any, params: SamplingParams) -> tuple[str | None, list[int]]:
        """(prompt text, prompt token ids) or a ``ValueError``: the engine's own validation, nothing queued."""
        if self._dead is not None:
            raise self._dead
        if self._stop:
            raise EngineDeadError("the engine was shut down")
        return self.engine.validate_request(prompt, params)

    def check_capacity(self, num_new: int = 1) -> None:
        """``EngineOverloadedError`` if ``num_new`` more requests would exceed ``max_waiting_requests``."""
        limit = self.max_waiting_requests
        if limit is not None and self.num_waiting() + num_new > limit:
            raise EngineOverloadedError(
                f"the server is overloaded: more than {limit} requests would wait (--max-waiting-requests); "
                "retry later")

    async def generate(self, prompt: Any, params: SamplingParams, request_id: str,
                       arrival_time: float | None = None) -> AsyncIterator[RequestOutput]:
        """Yield the request's ``RequestOutput`` after every step that produced tokens for it, the last one
        with ``finished=True``. Leaving the loop early aborts the request."""
        arrival = time.monotonic() if arrival_time is None else arrival_time
        text, ids = self.validate(prompt, params)
        self.check_capacity()
        with self._lock:
            if request_id in self._in_flight:
                raise ValueError(f"request id {request_id!r} is already in use")
            self._in_flight.add(request_id)
        loop = asyncio.get_running_loop()
        q: asyncio.Queue = asyncio.Queue()
        times = RequestTimes(arrival, len(ids))
        finished = False
        self._send(_Add(request_id, ids, params, arrival, loop, q))
        try:
            while True:
                item = await q.get()
                if isinstance(item, BaseException):
                    finished = True  # nothing left to abort
                    raise item
                out, now = item
                out.prompt = text
                self._observe(out, now, times)
                if out.finished:
                    finished = True
                yield out
                if finished:
                    return
        finally:
            with self._lock:
                self._in_flight.discard(request_id)
            if not finished:
                self._send(_Abort(request_id))
                if self.observer is not None:
                    times.finished = time.monotonic()
                    self.observer.on_finished("abort", times)

    async def reset_prefix_cache(self) -> bool:
        """Forget the prefix cache (``LLMEngine.reset_prefix_cache``, run on the engine thread): False while
        requests hold KV blocks."""
        if self._dead is not None:
            raise self._dead
        if self._stop:
            raise EngineDeadError("the engine was shut down")
        loop = asyncio.get_running_loop()
        future = loop.create_future()
        self._send(_ResetPrefixCache(loop, future))
        return await future

    def _observe(self, out: RequestOutput, now: float, times: RequestTimes) -> None:
        total = sum(len(c.token_ids) for c in out.outputs)
        new = total - times.num_generation_tokens
        if new > 0:
            ttft = None
            since = None if times.last_token is None else now - times.last_token
            if times.first_token is None:
                times.first_token = now
                ttft = now - times.arrival
            times.last_token = now
            times.num_generation_tokens = total
            if self.observer is not None:
                self.observer.on_tokens(new, since, ttft)
        if out.finished:
            times.finished = now
            if self.observer is not None:
                reason = next((c.finish_reason for c in out.outputs if c.finish_reason != "stop"), "stop")
                self.observer.on_finished(reason, times)

    def _send(self, command) -> None:
        self._commands.put(command)
        self._wake.set()

    # --------------------------------------------------------------------------------------- engine thread
    def _run(self) -> None:
        engine = self.engine
        while True:
            self._wake.clear()
            if self._dead is not None:  # fail whatever arrives, until shutdown
                self._drain()
                if self._stop:
                    break
                self._wake.wait()
                continue
            try:
                self._drain()
                if self._stop:
                    break
                if not engine.has_unfinished_requests():
                    self._stats = engine.stats()
                    self._wake.wait()
                    continue
                steps_before = engine.num_steps
                outputs = engine.step()
                self._deliver(outputs, time.monotonic())
                self._stats = engine.stats()
                if engine.num_steps == steps_before and not outputs:  # nothing scheduled (a static batch forming)
                    self._wake.wait(_IDLE_POLL_S)
            except BaseException as exc:  # noqa: BLE001 - any failure kills the engine, loudly
                self._die(exc)
        self._abort_all()
        try:
            engine.close_kv_events()
        except Exception:  # noqa: BLE001 - stopping anyway
            logger.exception("closing the KV-cache event publisher failed")

    def _drain(self) -> None:
        while True:
            try:
                cmd = self._commands.get_nowait()
            except queue.Empty:
                return
            if isinstance(cmd, _Abort):
                self._streams.pop(cmd.request_id, None)
                if self._dead is None:
                    self.engine.abort_request(cmd.request_id)
                continue
            if self._dead is not None or self._stop:
                err = self._dead or EngineDeadError("the engine is shutting down")
                if isinstance(cmd, _ResetPrefixCache):
                    _resolve(cmd.loop, cmd.future, error=err)
                else:
                    cmd.loop.call_soon_threadsafe(cmd.queue.put_nowait, err)
                continue
            if isinstance(cmd, _ResetPrefixCache):
                try:
                    _resolve(cmd.loop, cmd.future, result=self.engine.reset_prefix_cache())
                except Exception as exc:  # noqa: BLE001 - delivered to the caller
                    _resolve(cmd.loop, cmd.future, error=exc)
                continue
            try:
                self.engine.add_request(cmd.request_id, {"prompt_token_ids": cmd.prompt_token_ids}, cmd.params,
                                        arrival_time=cmd.arrival_time)
            except Exception as exc:  # noqa: BLE001 - delivered to the caller
                cmd.loop.call_soon_threadsafe(cmd.queue.put_nowait, exc)
                continue
            self._streams[cmd.request_id] = cmd

    def _deliver(self, outputs: list[RequestOutput], now: float) -> None:
        by_loop: dict[asyncio.AbstractEventLoop, list] = {}
        for out in outputs:
            stream = self._streams.get(out.request_id)
            if stream is None:
                continue
            if out.finished:
                del self._streams[out.request_id]
            by_loop.setdefault(stream.loop, []).append((stream.queue, (out, now)))
        for loop, items in by_loop.items():
            try:
                loop.call_soon_threadsafe(_put_all, items)
            except RuntimeError:  # that loop is closed: its requests are gone
                pass

    def _die(self, exc: BaseException) -> None:
        dead = EngineDeadError(f"the engine is dead: a step raised {type(exc).__name__}: {exc}")
        dead.__cause__ = exc
        self._dead = dead
        logger.error("engine step failed; the engine is dead and every request fails from now on",
                     exc_info=(type(exc), exc, exc.__traceback__))
        streams, self._streams = self._streams, {}
        for stream in streams.values():
            try:
                stream.loop.call_soon_threadsafe(stream.queue.put_nowait, dead)
            except RuntimeError:
                pass

    def _abort_all(self) -> None:
        streams, self._streams = self._streams, {}
        if self._dead is None and streams:
            self.engine.abort_request(list(streams))
        for stream in streams.values():
            try:
                stream.loop.call_soon_threadsafe(stream.queue.put_nowait,
                                                 EngineDeadError("the engine was shut down"))
            except RuntimeError:
                pass
        self._drain()  # anything queued meanwhile fails instead of waiting forever


def _resolve(loop: asyncio.AbstractEventLoop, future: asyncio.Future, result: Any = None,
             error: BaseException | None = None) -> None:
    """Complete ``future`` in its own loop (from the engine thread); nothing if the caller went away."""
    def done() -> None:
        if future.done():  # the caller was cancelled meanwhile
            return
        if error is not None:
            future.set_exception(error)
        else:
            future.set_result(result)

    try:
        loop.call_soon_threadsafe(done)
    except RuntimeError:  # that loop is closed
        pass


def _put_all(items) -> None:
    for q, item in items:
        q.put_nowait(item)
