"""Applying a step's result: emitted tokens onto their sequences and requests, then RequestOutputs. No JAX.

The engine loop is schedule -> execute -> ``OutputProcessor.update``: for each scheduled sequence the tokens
it emitted are appended through the stop conditions (``request_io.append_token``), the scheduler is told how
many tokens now have K/V (accepted speculative tokens included, rejected ones not) and which sequences
finished, and every request that emitted a token gets a ``RequestOutput``. It also owns the table of live
requests (added when validated, dropped when finished or aborted).

Prompt logprobs computed in a step (rows with ``index``, ``token_id``, ``logprob``, ``rank`` and ``top``) become
``{token_id: Logprob}`` entries of the sequence's shared ``prompt_logprobs`` dict, the prompt token first; an
index that already has its entry (another sample of the request computed it, or the sequence did before a
preemption) keeps the first one.

Structured outputs: a constrained sequence's matcher accepts each token it emits; with ``jump_forward``, once
the step's tokens are in, every token its grammar forces (a mask that allows exactly one token) is appended
right away, logprob 0 (the constrained distribution's, which has all its mass there), and computed with the
next step's work instead of in decode steps of its own. A masked row allowing one token samples exactly that
token whatever the temperature, and the next sampled token's seed step counts the forced ones, so the output is
the same token for token with jump-forward on or off.
"""

from __future__ import annotations

import dataclasses
import logging
from typing import Iterable

from jaxinfer.core import request_io
from jaxinfer.core.tokenizer import IncrementalDetokenizer
from jaxinfer.outputs import Logprob, RequestOutput


logger = logging.getLogger("jaxinfer")


@dataclasses.dataclass(frozen=True)
class ForcedToken:
    """A token the grammar forces (jump-forward): all of the constrained distribution's mass is on it."""

    token_id: int
    logprob: float = 0.0
    top_logprobs: dict = dataclasses.field(default_factory=dict)


class TokenTexts:
    """Each token id's text (``decoded_token`` of a ``Logprob``), decoded once; None without a tokenizer."""

    def __init__(self, tokenizer=None):
        self.tokenizer = tokenizer
        self._texts: dict[int, str] = {}

    def __call__(self, token_id: int) -> str | None:
        if self.tokenizer is None:
            return None
        text = self._texts.get(token_id)
        if text is None:
            text = self._texts[token_id] = self.tokenizer.decode([token_id], skip_special_tokens=False)
        return text


class OutputProcessor:
    def __init__(self, scheduler, eos_token_ids: tuple[int, ...], max_model_len: int, tokenizer=None,
                 jump_forward: bool = True):
        self.scheduler = scheduler
        self.jump_forward = jump_forward
        self.num_forced_tokens = 0  # appended by jump-forward, over the engine's life
        self.eos_token_ids = eos_token_ids
        self.max_model_len = max_model_len
        self.token_text = TokenTexts(tokenizer)
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

    def update(self, scheduled: list, emitted: dict[int, list], now: float,
               prompt_logprobs: dict[int, list] | None = None) -> list[RequestOutput]:
        """Apply one step: ``scheduled`` the plan's ``ScheduledSeq``s, ``emitted`` seq_id -> the tokens it
        emitted (objects with ``token_id``, ``logprob``, ``top_logprobs``), ``prompt_logprobs`` seq_id -> the
        prompt logprob rows it computed. Returns the outputs of the requests that emitted tokens."""
        touched: dict[str, request_io.EngineRequest] = {}
        texts = self._detokenize_single_tokens(scheduled, emitted)
        for s in scheduled:
            seq = s.seq
            if seq.is_finished:
                continue  # finished or aborted after this step was scheduled (async scheduling): nothing to apply
            self._add_prompt_logprobs(seq, (prompt_logprobs or {}).get(seq.seq_id, ()))
            req = self.requests[seq.request_id]
            if req.metrics.first_scheduled_time is None:
                req.metrics.first_scheduled_time = seq.first_scheduled_time
            tokens = emitted.get(seq.seq_id, [])
            accepted = max(len(tokens) - 1, 0)  # speculative tokens that held (the last one is the target's)
            computed = s.start + s.num_new_tokens - s.num_spec_tokens + accepted
            finished = False
            text = texts.get(seq.seq_id)
            for tok in tokens:
                finished = self._append(seq, tok, now, text)
                if finished:
                    break
            if tokens and not finished and seq.grammar is not None and self.jump_forward:
                finished = self._jump_forward(seq, now)
            if seq.num_preemptions == s.preemptions:  # else its K/V is gone: it recomputes from 0
                # async scheduling may already have scheduled the next step, which counts this one as done
                self.scheduler.commit_computed(seq, max(seq.num_computed_tokens, min(computed, seq.num_tokens)))
            if finished:
                self.scheduler.remove(seq)
            if tokens:
                if req.metrics.first_token_time is None:
                    req.metrics.first_token_time = now
                if req.params.output_kind == "cumulative" or req.finished:
                    touched[req.request_id] = req
        outputs = []
        for req in touched.values():
            if req.finished:
                req.metrics.finished_time = now
                self.requests.pop(req.request_id, None)
            outputs.append(request_io.make_output(req))
        return outputs

    @staticmethod
    def _detokenize_single_tokens(scheduled: list, emitted: dict[int, list]) -> dict[int, str]:
        """seq_id -> the text of its one emitted token, for every live sequence that emitted exactly one and
        has a detokenizer: all decoded in one batch (``IncrementalDetokenizer.append_each``; sequences that
        skip special tokens and those that keep them in a batch each). Others detokenize token by token."""
        groups: dict[bool, list] = {}
        for s in scheduled:
            seq = s.seq
            tokens = emitted.get(seq.seq_id)
            if tokens and len(tokens) == 1 and seq.detokenizer is not None and not seq.is_finished:
                groups.setdefault(seq.detokenizer.skip_special_tokens, []).append((seq, tokens[0].token_id))
        texts = {}
        for pairs in groups.values():
            detoks = [seq.detokenizer for seq, _ in pairs]
            for (seq, _), text in zip(pairs, IncrementalDetokenizer.append_each(detoks, [t for _, t in pairs])):
                texts[seq.seq_id] = text
        return texts

    def _append(self, seq, tok, now: float, new_text: str | None = None) -> bool:
        """Append one token through the stop conditions and the sequence's grammar; True when it finished.
        ``new_text``: its text, already detokenized (batched), or None."""
        if request_io.append_token(seq, tok, now, self.eos_token_ids, self.max_model_len, new_text):
            return True
        if seq.grammar is not None and not seq.grammar.accept(tok.token_id):
            # cannot happen while the mask is applied; should it, the output could no longer be valid
            logger.error("request %s: token %d is outside its grammar (%s); the sequence is aborted",
                         seq.request_id, tok.token_id, seq.grammar.error)
            seq.finish_reason, seq.finished_time = "abort", now
            return True
        return False

    def _jump_forward(self, seq, now: float) -> bool:
        """Append the tokens the grammar forces, one at a time while its mask allows exactly one."""
        while True:
            token = seq.grammar.forced_token()
            if token is None:
                return False
            top = {token: 0.0} if seq.params.logprobs else {}
            seq.num_forced_tokens += 1
            self.num_forced_tokens += 1
            if self._append(seq, ForcedToken(token, 0.0, top), now):
                return True

    def _add_prompt_logprobs(self, seq, rows) -> None:
        """Store each row as the entry of its prompt index, unless that index has one already."""
        for row in rows:
            if row.index in seq.prompt_logprobs:
                continue
            entry = {row.token_id: Logprob(row.logprob, row.rank, self.token_text(row.token_id))}
            for token_id, logprob, rank in row.top:
                if token_id not in entry:
                    entry[token_id] = Logprob(logprob, rank, self.token_text(token_id))
            seq.prompt_logprobs[row.index] = entry
