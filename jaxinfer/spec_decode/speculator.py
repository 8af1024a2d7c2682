"""Speculation in the engine loop: after each step, account for the drafts it verified, then propose the
next step's. Host side, no JAX (the proposer behind it may run a draft model).

Which sequences get drafts: those that decode next step (no prefill chunk is due: the scheduler would drop
the drafts of a step that carries one), can choose tokens ahead (``Sequence.can_choose_ahead``: no
penalties, min_tokens reached), have room under ``max_tokens`` / ``max_model_len``, and for which the block
manager grants blocks for the drafted positions. How many: the ``SpecController``'s choice of k, which it
learns from each step's cycle time — the caller's loop, scheduling, the device step, bookkeeping, and the
proposals that prepared it. A cycle during which anything compiled is not measured.
"""

from __future__ import annotations

import time

from jaxinfer.spec_decode.controller import SpecController


class Speculator:
    def __init__(self, proposer, controller: SpecController, scheduler, max_model_len: int):
        self.proposer = proposer
        self.controller = controller
        self.scheduler = scheduler
        self.max_model_len = max_model_len
        self.num_draft_tokens = 0
        self.num_accepted_tokens = 0
        self._propose_seconds = 0.0  # host + draft time spent preparing the next step's proposals
        self._proposed_at = 0.0  # when they were ready: the step they prepared runs from then on
        self._compiles_before_proposal = 0  # compilations (any kind) before the proposals of the next step

    def after_step(self, scheduled: list, emitted: dict[int, list], compilations: int) -> None:
        """Record the step's acceptances and cycle time, then propose for the next step. ``compilations``:
        how many compilations (any kind) the engine has seen so far."""
        for s in scheduled:
            if s.num_spec_tokens:
                accepted = max(len(emitted.get(s.seq.seq_id, [])) - 1, 0)
                self.num_draft_tokens += s.num_spec_tokens
                self.num_accepted_tokens += accepted
                self.controller.record_acceptance(s.num_spec_tokens, accepted)
        t = time.perf_counter()
        if compilations != self._compiles_before_proposal:
            self.controller.discard_step()  # something compiled during the cycle (lazy mode): not the arm's time
        else:
            emitted_count = sum(len(tokens) for tokens in emitted.values())
            self.controller.record_step(emitted_count, t - self._proposed_at + self._propose_seconds)
        self._compiles_before_proposal = compilations
        self.propose()
        self._proposed_at = time.perf_counter()
        self._propose_seconds = self._proposed_at - t

    def propose(self) -> int:
        """Propose draft tokens for the running sequences that decode next step; returns how many."""
        sched = self.scheduler
        decoding = [q for q in sched.running if q.num_computed_tokens == q.num_tokens - 1]
        prefilling = sum(q.num_tokens - q.num_computed_tokens for q in sched.running) - len(decoding)
        admits = (sched.config.batching == "continuous" and sched.waiting
                  and len(sched.running) < sched.config.max_num_seqs)
        k = self.controller.choose_k(len(decoding), prefilling or int(bool(admits)))
        if prefilling or admits:
            return 0  # the next step computes a prefill chunk: the scheduler would drop the drafts
        seqs, ks = [], []
        for q in decoding:
            p = q.params
            room = self.max_model_len - q.num_tokens
            if p.max_tokens is not None:
                room = min(room, p.max_tokens - q.num_output_tokens)
            kq = min(k, room - 1)
            if not q.can_choose_ahead or kq <= 0:
                continue  # penalties and min_tokens bans depend on every earlier token: decode plainly
            if not sched.blocks.grow(q, q.num_tokens + kq):
                continue
            seqs.append(q)
            ks.append(kq)
        self.proposer.propose(seqs, ks)
        return sum(len(q.spec_token_ids) for q in seqs)
