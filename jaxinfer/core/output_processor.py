"""Applying a step's result: emitted tokens onto their sequences and requests, then RequestOutputs. No JAX.

The engine loop is schedule -> execute -> ``OutputProcessor.update``: for each scheduled sequence the tokens
it emitted are appended through the stop conditions (``request_io.append_token``), the scheduler is told how
many tokens now have K/V (accepted speculative tokens included, rejected ones not) and which sequences
finished, and every request that emitted a token gets a ``RequestOutput``. It also owns the table of live
requests (added when validated, dropped when finished or aborted).
"""

from __future__ import annotations

from typing import Iterable

from jaxinfer.core import request_io
from jaxinfer.outputs import RequestOutput


class OutputProcessor:
    def __init__(self, scheduler, eos_token_ids: tuple[int, ...], max_model_len: int):
        self.scheduler = scheduler
        self.eos_token_ids = eos_token_ids
        self.max_model_len = max_model_len
        self.requests: dict[str, request_io.EngineRequest] = {}

    def add(self, req: request_io.EngineRequest) -> None:
        """Register a validated request (its id unused: the engine checks that first) and queue its sequences."""
        self.requests[req.request_id] = req
        for seq in req.seqs:
            self.scheduler.add(seq)

    def abort(self, request_ids: Iterable[str]) -> None:
        for rid in request_ids:
            req = self.requests.pop(rid, None)
            if req is None:
                continue
            for seq in req.seqs:
                if not seq.is_finished:
                    seq.finish_reason = "abort"
                    self.scheduler.remove(seq)

    def update(self, scheduled: list, emitted: dict[int, list], now: float) -> list[RequestOutput]:
        """Apply one step: ``scheduled`` the plan's ``ScheduledSeq``s, ``emitted`` seq_id -> the tokens it
        emitted (objects with ``token_id``, ``logprob``, ``top_logprobs``). Returns the outputs of the requests
        that emitted tokens."""
        touched: dict[str, request_io.EngineRequest] = {}
        for s in scheduled:
            seq = s.seq
            req = self.requests[seq.request_id]
            if req.metrics.first_scheduled_time is None:
                req.metrics.first_scheduled_time = seq.first_scheduled_time
            tokens = emitted.get(seq.seq_id, [])
            accepted = max(len(tokens) - 1, 0)  # speculative tokens that held (the last one is the target's)
            computed = seq.num_computed_tokens + s.num_new_tokens - s.num_spec_tokens + accepted
            finished = False
            for tok in tokens:
                finished = request_io.append_token(seq, tok, now, self.eos_token_ids, self.max_model_len)
                if finished:
                    break
            self.scheduler.commit_computed(seq, min(computed, seq.num_tokens))
            if finished:
                self.scheduler.remove(seq)
            if tokens:
                if req.metrics.first_token_time is None:
                    req.metrics.first_token_time = now
                touched[req.request_id] = req
        outputs = []
        for req in touched.values():
            if req.finished:
                req.metrics.finished_time = now
                self.requests.pop(req.request_id, None)
            outputs.append(request_io.make_output(req))
        return outputs
