"""How many tokens to speculate next step: the adaptive rule. Host side, no JAX.

Whether speculation pays depends on things a formula gets wrong: how well the drafts guess this text,
what the draft model costs, which compiled shape the wider verification step falls into, and how the
device's step time grows with tokens. So the rule measures instead of modelling. It chooses between two
arms, ``k = 0`` and ``k = K`` (two choices only, so speculation adds one family of compiled shapes, not
one per k), separately for each decoding batch size (rounded up to a power of two). For every pure-decode
step it records the tokens the decoding sequences emitted and the step's time (the step + the proposal
time that prepared it). An arm's throughput over its recent steps is their mean tokens per step over their
median step time: the median keeps a stray slow step (a draft catching up, a page fault) from deciding,
and the mean counts every token (the tokens of a speculative step are bimodal on text that is copyable in
places: a median of per-step rates sat on the low mode and turned a 1.5x draft off). The rule plays the
arm with the higher throughput, k = K only if it is ``speculation_margin`` (10%) ahead (near parity a
draft model would otherwise be switched on and off on noise, catching up at each switch: the spec
bench's draft copy task at batch 16 ran at 0.88x that way). Every
``probe_interval`` steps the other arm is measured again, afresh, over ``min_samples`` steps (its old
samples were taken under other conditions; the median discounts the first step's outlier, e.g. a draft
model catching up on everything since it last ran). The interval doubles each time the retry confirms the
choice (up to ``max_probe_interval`` steps), and resets when the retry changes it (the text turned
copyable). A retry of an arm that loses badly is expensive (a draft model catching up, then k sequential
draft steps per step), so the interval is also kept long enough for retries to cost at most
``retry_budget`` of the time: the time the confirming retry lost against the better arm, divided by
``retry_budget`` x the better arm's step time, up to ``max_budget_interval`` steps. The engine does not
record step cycles that waited for a compilation or ran while one compiled in the background
(``discard_step``).

The controller lives as long as the engine: what it learned in one ``generate`` call carries over to the
next, as it would in a server.
"""

from __future__ import annotations

import collections
import dataclasses
import statistics


def _batch_key(num_decoding: int) -> int:
    return 1 << max(num_decoding - 1, 0).bit_length()


@dataclasses.dataclass
class _ArmStats:
    """Recent steps of both arms at one batch-size bucket (tokens emitted, seconds), and the retry schedule."""

    tokens: dict  # recent tokens emitted per step, per arm
    seconds: dict  # recent step durations per arm
    probe_interval: int
    exploring: set  # arms being measured: played until they have min_samples fresh samples
    steps_since_probe: int = 0
    choice_before_retry: int | None = None  # set while the other arm is being re-measured
    retry_seconds: float = 0.0  # time and tokens of the current retry's steps
    retry_tokens: float = 0.0

    def rate(self, k: int) -> float:
        """Tokens/s of arm k: mean tokens per step over the median step time (stdlib: a few samples)."""
        return statistics.fmean(self.tokens[k]) / statistics.median(self.seconds[k])


class SpecController:
    def __init__(
        self,
        max_k: int,
        adaptive: bool = True,
        window: int = 16,
        min_samples: int = 3,
        first_probe_interval: int = 8,
        max_probe_interval: int = 256,
        retry_budget: float = 0.02,
        max_budget_interval: int = 4096,
        speculation_margin: float = 0.1,
    ):
        self.max_k = max_k
        self.adaptive = adaptive
        self.window = window
        self.min_samples = min_samples
        self.first_probe_interval = first_probe_interval
        self.max_probe_interval = max_probe_interval
        self.retry_budget = retry_budget
        self.max_budget_interval = max_budget_interval
        self.speculation_margin = speculation_margin
        self._arms: dict[int, _ArmStats] = {}
        self._pending: tuple[int, int] | None = None  # (batch key, k) of the step being prepared
        self.proposed = 0
        self.accepted = 0
        self.per_position_proposed = [0] * max_k
        self.per_position_accepted = [0] * max_k

    # ------------------------------------------------------------ acceptance
    @property
    def acceptance_rate(self) -> float:
        return self.accepted / self.proposed if self.proposed else 0.0

    def record_acceptance(self, num_proposed: int, num_accepted: int) -> None:
        self.proposed += num_proposed
        self.accepted += num_accepted
        for j in range(num_proposed):
            self.per_position_proposed[j] += 1
            if j < num_accepted:
                self.per_position_accepted[j] += 1

    # -------------------------------------------------------------- choosing
    def _stats(self, key: int) -> _ArmStats:
        if key not in self._arms:
            arms = (0, self.max_k)
            tokens = {k: collections.deque(maxlen=self.window) for k in arms}
            seconds = {k: collections.deque(maxlen=self.window) for k in arms}
            # A bucket next to a larger one that settled on k = 0 starts at k = 0 and leaves k = K to its
            # first retry: a batch shrinking at the end of a run reaches bucket after bucket, and exploring
            # k = K first in each made a draft model catch up every time (200-300 ms steps at batch 8-16).
            settled = [(b, c) for b, c in self.choices().items() if b > key and c is not None]
            start_off = bool(settled) and min(settled)[1] == 0
            exploring = {0} if start_off else {self.max_k, 0}
            self._arms[key] = _ArmStats(tokens, seconds, self.first_probe_interval, exploring=exploring)
        return self._arms[key]

    def choose_k(self, num_decoding: int, other_tokens: int = 0) -> int:
        """The k for the next step, with ``num_decoding`` sequences decoding and ``other_tokens`` prefill
        tokens beside them (a mixed step is not measured: its time is mostly the prefill's)."""
        k = self._choose(num_decoding)
        measured = self.adaptive and num_decoding > 0 and other_tokens == 0 and self.max_k > 0
        self._pending = (_batch_key(num_decoding), k) if measured else None
        return k

    def _choose(self, num_decoding: int) -> int:
        if not self.adaptive or self.max_k == 0 or num_decoding == 0:
            return self.max_k
        st = self._stats(_batch_key(num_decoding))
        for k in (self.max_k, 0):  # measure the arms that need it first, speculation first
            if k in st.exploring:
                if len(st.tokens[k]) < self.min_samples:
                    return k
                st.exploring.discard(k)
        best = self._best(st)
        if st.choice_before_retry is not None:  # a retry just finished: did it change the choice?
            if best == st.choice_before_retry:
                st.probe_interval = max(min(2 * st.probe_interval, self.max_probe_interval), self._budget_interval(st, best))
            else:
                st.probe_interval = self.first_probe_interval
            st.choice_before_retry = None
        st.steps_since_probe += 1
        if st.steps_since_probe >= st.probe_interval:
            # Re-measure the other arm afresh (its old samples were taken under other conditions:
            # other contexts, other text); its first step may be an outlier (a draft catching up on
            # everything since it last ran), which the median over min_samples steps discounts.
            other = 0 if best == self.max_k else self.max_k
            st.steps_since_probe = 0
            st.choice_before_retry = best
            st.retry_seconds = st.retry_tokens = 0.0
            st.tokens[other].clear()
            st.seconds[other].clear()
            st.exploring.add(other)
            return other
        return best

    def _best(self, st: _ArmStats) -> int:
        """k = K only if its throughput beats k = 0's by ``speculation_margin``: speculating has costs its
        median step time leaves out (a draft model catching up each time speculation turns back on, whose
        first step the median discounts), and near parity the two arms would otherwise trade places on
        noise, paying that catch-up at every switch."""
        if not st.tokens[self.max_k]:
            return 0  # k = K not measured yet at this bucket (see ``_stats``)
        return self.max_k if st.rate(self.max_k) > (1.0 + self.speculation_margin) * st.rate(0) else 0

    def _budget_interval(self, st: _ArmStats, best: int) -> int:
        """Steps between retries for the retry just finished to cost ``retry_budget`` of the time: the
        seconds it lost (its time minus what the better arm would have taken for its tokens) over the
        budget's share of the better arm's step time."""
        best_rate, step = st.rate(best), statistics.median(st.seconds[best])
        if self.retry_budget <= 0 or best_rate <= 0 or step <= 0:
            return 0
        lost = st.retry_seconds - st.retry_tokens / best_rate
        if lost <= 0:
            return 0
        return min(int(lost / (self.retry_budget * step)), self.max_budget_interval)

    # ------------------------------------------------------------- measuring
    def record_step(self, emitted_tokens: int, seconds: float) -> None:
        """The outcome of the step prepared by the last ``choose_k``: tokens its decoding sequences emitted
        and the seconds it took (proposal included)."""
        if self._pending is None or seconds <= 0:
            return
        key, k = self._pending
        self._pending = None
        st = self._stats(key)
        st.tokens[k].append(emitted_tokens)
        st.seconds[k].append(seconds)
        if st.choice_before_retry is not None and k != st.choice_before_retry:
            st.retry_seconds += seconds
            st.retry_tokens += emitted_tokens

    def discard_step(self) -> None:
        """The step prepared by the last ``choose_k`` is not representative (a compilation shared the CPU
        with it): forget it. An arm being measured is simply played again."""
        self._pending = None

    def choices(self) -> dict:
        """Per batch-size bucket, the arm the rule has settled on (None while an arm is being measured)."""
        return {key: (self._best(st) if st.tokens[0] and st.tokens[self.max_k] and not st.exploring else None)
                for key, st in sorted(self._arms.items())}

    def summary(self) -> dict:
        """Per batch-size bucket: the throughput of each arm and the current retry interval."""
        return {
            key: {
                "tok_per_s": {k: (st.rate(k) if st.tokens[k] else None) for k in st.tokens},
                "probe_interval": st.probe_interval,
            }
            for key, st in sorted(self._arms.items())
        }
