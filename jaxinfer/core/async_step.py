"""Async scheduling: the next step is scheduled and packed while the current one runs. No JAX here.

A synchronous engine step is schedule -> execute (the host waits for the device) -> apply the tokens. With
``async_scheduling`` the host works while the device runs: each ``step()`` call

1. schedules step N+1 before step N's tokens are known: every sequence step N samples for has one *pending*
   token (``Sequence.num_pending_tokens``), which the scheduler counts like any other token;
2. packs step N+1 on the host, a placeholder where a pending token goes (``runner.launch.prepare``);
3. waits for step N's tokens, puts them in the placeholders and launches step N+1 — the only host work
   between the end of one device step and the start of the next;
4. applies step N's tokens (stop checks, detokenization, outputs) while step N+1 runs, and returns step N's
   outputs. The first call of a run launches and returns nothing.

Step N+1 runs on exactly the inputs a synchronous engine would pack, so the tokens are identical. A sequence
that finishes in step N (EOS, a stop string) was scheduled in step N+1 anyway: that row's work is wasted and
its token dropped, as is the work of a request aborted meanwhile. A sequence whose pending token may be its
last (``max_tokens``, ``max_model_len``) is held out of step N+1. Steps that read the output history on the
host — penalties, ``min_tokens``, grammars, prompt logprobs — cannot run on a placeholder: while any live
sequence needs one, the engine drains the step in flight and steps synchronously.

``HostTimes`` adds up the host's time per phase, in both modes (``LLMEngine.stats()["host_seconds"]``).
"""

from __future__ import annotations

import dataclasses
import time
from typing import Any, Callable

from jaxinfer.core.scheduler import ScheduledSeq


@dataclasses.dataclass
class HostTimes:
    """Seconds the host spent per phase of the engine's steps (cumulative), and how many steps ran."""

    schedule: float = 0.0
    prepare: float = 0.0  # packing a step (async) / packing, launching and waiting (synchronous: execute)
    wait: float = 0.0  # waiting for the device's tokens (async)
    launch: float = 0.0  # placeholders filled and the step launched (async)
    update: float = 0.0  # tokens applied: stop checks, detokenization, outputs
    steps: int = 0
    async_steps: int = 0

    def as_dict(self) -> dict[str, float]:
        return dataclasses.asdict(self)


@dataclasses.dataclass
class InFlight:
    scheduled: list[ScheduledSeq]
    launched: Any  # the runner's LaunchedStep (collect() -> seq_id -> tokens), or None: nothing samples


@dataclasses.dataclass(frozen=True)
class RunnerOps:
    """What the stepper needs of the runner (``jaxinfer.runner.launch``)."""

    can_launch: Callable[[list[ScheduledSeq]], bool]
    prepare: Callable[[list[ScheduledSeq]], Any]
    dispatch: Callable[[Any], Any]
    execute: Callable[[list[ScheduledSeq]], Any]  # the synchronous path: -> StepOutput


class AsyncStepper:
    """Drives the scheduler, the runner and the output processor with one step in flight."""

    def __init__(self, scheduler, output_processor, runner: RunnerOps, max_model_len: int,
                 clock: Callable[[], float] = time.perf_counter):
        self.scheduler = scheduler
        self.output_processor = output_processor
        self.runner = runner
        self.max_model_len = max_model_len
        self.clock = clock
        self.times = HostTimes()
        self.in_flight: InFlight | None = None

    # ------------------------------------------------------------------ steps
    def step(self) -> list:
        """One engine step (see the module docstring); returns the RequestOutputs of the step it applied."""
        prev = self.in_flight
        if prev is not None and not self._all_launchable():
            return self.drain()
        t0 = self.clock()
        plan = self.scheduler.schedule(hold=self._may_finish if prev is not None else None)
        t1 = self.clock()
        self.times.schedule += t1 - t0
        if plan.is_empty:
            return self.drain() if prev is not None else []
        if not self.runner.can_launch(plan.scheduled):  # only without a step in flight (_all_launchable)
            return self._step_synchronously(plan.scheduled, t1)
        prepared = self.runner.prepare(plan.scheduled)
        t2 = self.clock()
        tokens = prev.launched.collect() if prev is not None and prev.launched is not None else {}
        t3 = self.clock()
        prepared.fill(tokens)
        launched = self.runner.dispatch(prepared)
        self._mark_launched(plan.scheduled)
        self.in_flight = InFlight(plan.scheduled, launched)
        t4 = self.clock()
        self.times.prepare += t2 - t1
        self.times.wait += t3 - t2
        self.times.launch += t4 - t3
        self.times.steps += 1
        self.times.async_steps += 1
        return self._apply(prev, tokens) if prev is not None else []

    def drain(self) -> list:
        """Wait for the step in flight, if any, and apply its tokens."""
        prev, self.in_flight = self.in_flight, None
        if prev is None:
            return []
        t0 = self.clock()
        tokens = prev.launched.collect() if prev.launched is not None else {}
        self.times.wait += self.clock() - t0
        return self._apply(prev, tokens)

    def step_synchronously(self, scheduled: list[ScheduledSeq] | None = None) -> list:
        """A synchronous step (nothing in flight): schedule, execute, apply."""
        t0 = self.clock()
        if scheduled is None:
            plan = self.scheduler.schedule()
            if plan.is_empty:
                return []
            scheduled = plan.scheduled
        t1 = self.clock()
        self.times.schedule += t1 - t0
        return self._step_synchronously(scheduled, t1)

    def _step_synchronously(self, scheduled: list[ScheduledSeq], t0: float) -> list:
        result = self.runner.execute(scheduled)
        t1 = self.clock()
        outputs = self.output_processor.update(scheduled, result.tokens, time.monotonic(),
                                               prompt_logprobs=result.prompt_logprobs)
        self.times.prepare += t1 - t0
        self.times.update += self.clock() - t1
        self.times.steps += 1
        return outputs

    # ---------------------------------------------------------- bookkeeping
    def _all_launchable(self) -> bool:
        """No live sequence needs its output history on the host for its next step."""
        for seq in self.scheduler.running:
            if not seq.can_choose_ahead or seq.needs_prompt_logprobs:
                return False
        for seq in self.scheduler.waiting:
            if not seq.can_choose_ahead or seq.needs_prompt_logprobs:
                return False
        return True

    def _may_finish(self, seq) -> bool:
        """A pending token that may be the sequence's last: hold it out of the next step."""
        if not seq.num_pending_tokens:
            return False
        p = seq.params
        if p.max_tokens is not None and seq.num_output_tokens + seq.num_pending_tokens >= p.max_tokens:
            return True
        return seq.num_tokens >= self.max_model_len

    @staticmethod
    def _mark_launched(scheduled: list[ScheduledSeq]) -> None:
        """The launched step's work counts as done for scheduling; its sampled tokens are pending."""
        for s in scheduled:
            s.seq.num_computed_tokens = s.start + s.num_new_tokens
            if s.samples:
                s.seq.num_pending_tokens += 1

    def _apply(self, prev: InFlight, tokens: dict) -> list:
        t0 = self.clock()
        for s in prev.scheduled:
            if s.samples:
                s.seq.num_pending_tokens -= 1
        outputs = self.output_processor.update(prev.scheduled, tokens, time.monotonic())
        self.times.update += self.clock() - t0
        return outputs
