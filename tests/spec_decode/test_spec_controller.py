"""The adaptive speculation rule (host side): it plays whichever of k=0 / k=K measured faster."""

from __future__ import annotations

from jaxinfer.spec_decode.controller import SpecController


def _run(ctl: SpecController, throughput: dict, steps: int, num_decoding: int = 1, other_tokens: int = 0):
    """Play ``steps`` steps where arm k yields ``throughput[k]`` tokens per second; returns the choices."""
    choices = []
    for _ in range(steps):
        k = ctl.choose_k(num_decoding, other_tokens)
        choices.append(k)
        ctl.record_step(emitted_tokens=throughput[k], seconds=1.0)
    return choices


def test_explores_both_arms_first_then_plays_the_faster_one():
    ctl = SpecController(max_k=4, min_samples=3, first_probe_interval=1000)
    choices = _run(ctl, {0: 10.0, 4: 25.0}, 20)
    assert choices[:6] == [4, 4, 4, 0, 0, 0]
    assert set(choices[6:]) == {4}


def test_turns_speculation_off_when_it_measured_slower():
    ctl = SpecController(max_k=4, min_samples=3, first_probe_interval=1000)
    choices = _run(ctl, {0: 30.0, 4: 12.0}, 20)
    assert set(choices[6:]) == {0}


def test_choices_report_the_preferred_arm_per_batch_bucket():
    ctl = SpecController(max_k=4, min_samples=3, first_probe_interval=1000)
    assert ctl.choices() == {}
    _run(ctl, {0: 30.0, 4: 12.0}, 3, num_decoding=16)  # k=4 measured (3 samples), k=0 not yet
    assert ctl.choices() == {16: None}
    _run(ctl, {0: 30.0, 4: 12.0}, 10, num_decoding=16)
    _run(ctl, {0: 10.0, 4: 25.0}, 10, num_decoding=32)
    assert ctl.choices() == {16: 0, 32: 4}


def test_a_smaller_bucket_next_to_one_settled_on_k0_starts_at_k0():
    """A batch shrinking at the end of a run reaches new buckets: they do not explore k = K first (a draft
    model would catch up on everything each time) but leave it to their first retry."""
    ctl = SpecController(max_k=4, min_samples=3, first_probe_interval=8)
    _run(ctl, {0: 30.0, 4: 12.0}, 10, num_decoding=16)
    assert ctl.choices() == {16: 0}
    choices = _run(ctl, {0: 10.0, 4: 25.0}, 20, num_decoding=3)
    assert choices[:10] == [0] * 10  # k = 0 measured (3 steps), then played until the retry interval (8)
    assert choices[10:13] == [4, 4, 4] and set(choices[13:]) == {4}  # the retry measures k = 4: it wins
    fresh = SpecController(max_k=4, min_samples=3, first_probe_interval=8)
    assert _run(fresh, {0: 10.0, 4: 25.0}, 3, num_decoding=3) == [4, 4, 4]  # no neighbour: k = K first


def test_speculation_must_win_by_the_margin():
    near = SpecController(max_k=4, min_samples=3, first_probe_interval=1000, speculation_margin=0.1)
    assert set(_run(near, {0: 20.0, 4: 21.0}, 20)[6:]) == {0}  # 5% ahead: not worth switching on
    clear = SpecController(max_k=4, min_samples=3, first_probe_interval=1000, speculation_margin=0.1)
    assert set(_run(clear, {0: 20.0, 4: 23.0}, 20)[6:]) == {4}  # 15% ahead


def test_a_single_outlier_does_not_decide():
    ctl = SpecController(max_k=2, min_samples=3, first_probe_interval=1000)
    ctl.choose_k(1)
    ctl.record_step(emitted_tokens=1.0, seconds=10.0)  # a compile inside the first speculative step
    choices = _run(ctl, {0: 10.0, 2: 20.0}, 20)
    assert set(choices[-10:]) == {2}


def test_throughput_counts_every_token_of_bimodal_steps():
    """On text that is copyable in places a speculative step emits 5 tokens or 2: here 5, 2, 2, ... in
    7 s each (3 tokens per 7 s = 0.43 tok/s) against 1 token per 3.3 s without speculation (0.30 tok/s).
    Speculation is 42% ahead, though the median step emits 2 tokens (0.29 tok/s)."""
    ctl = SpecController(max_k=4, min_samples=3, first_probe_interval=8)
    pattern = iter([5, 2, 2] * 200)
    choices = []
    for _ in range(300):
        k = ctl.choose_k(1)
        choices.append(k)
        ctl.record_step(emitted_tokens=next(pattern) if k else 1, seconds=7.0 if k else 3.3)
    assert choices[-100:].count(4) >= 90


def test_retry_interval_doubles_while_the_choice_holds():
    ctl = SpecController(max_k=4, min_samples=2, first_probe_interval=4, max_probe_interval=32, retry_budget=0)
    choices = _run(ctl, {0: 30.0, 4: 12.0}, 300)
    retries = [i for i in range(5, len(choices)) if choices[i] == 4 and choices[i - 1] == 0]
    assert all(choices[i + 1] == 4 and choices[i + 2] == 0 for i in retries[:-1])  # each retry: 2 steps
    gaps = [b - a for a, b in zip(retries, retries[1:])]
    assert gaps == sorted(gaps) and gaps[0] < gaps[-1]  # growing intervals...
    assert gaps[-3:] == [gaps[-1]] * 3  # ...up to the cap
    assert choices[-100:].count(4) <= 8  # settled on "off": retries cost little


def _retry_starts(choices: list[int], best: int) -> list[int]:
    return [i for i in range(1, len(choices)) if choices[i] != best and choices[i - 1] == best]


def test_retries_of_a_much_slower_arm_cost_at_most_the_budget():
    # k=4 takes 5 s per step for 2 tokens, k=0 1 s for 1 token: a 2-step retry loses 2 x (5 - 2) = 6 s.
    ctl = SpecController(max_k=4, min_samples=2, first_probe_interval=4, max_probe_interval=32, retry_budget=0.05)
    choices = []
    for _ in range(2000):
        k = ctl.choose_k(1)
        choices.append(k)
        ctl.record_step(emitted_tokens=2.0 if k else 1.0, seconds=5.0 if k else 1.0)
    starts = _retry_starts(choices, best=0)
    gaps = [b - a for a, b in zip(starts, starts[1:])]
    assert gaps[-1] >= 6 / (0.05 * 1.0)  # 120 steps, beyond max_probe_interval
    settled = choices[starts[-2]:starts[-1]]
    lost = settled.count(4) * (5.0 - 2.0)
    assert lost / len(settled) <= 0.05 + 1e-9


def test_retry_budget_interval_is_capped():
    ctl = SpecController(max_k=4, min_samples=2, first_probe_interval=4, max_probe_interval=16, retry_budget=0.001,
                         max_budget_interval=50)
    choices = []
    for _ in range(400):
        k = ctl.choose_k(1)
        choices.append(k)
        ctl.record_step(emitted_tokens=1.0, seconds=10.0 if k else 1.0)
    starts = _retry_starts(choices, best=0)
    assert 50 <= max(b - a for a, b in zip(starts, starts[1:])) <= 50 + 2


def test_a_retry_that_wins_switches_back():
    ctl = SpecController(max_k=4, min_samples=2, first_probe_interval=4)
    _run(ctl, {0: 30.0, 4: 12.0}, 40)  # free text: off
    choices = _run(ctl, {0: 30.0, 4: 90.0}, 80)  # the text became copyable
    assert choices[-20:].count(4) >= 17  # speculating again, apart from the occasional retry of k=0


def test_mixed_steps_are_not_measured():
    ctl = SpecController(max_k=4, min_samples=2, first_probe_interval=1000)
    _run(ctl, {0: 1.0, 4: 1000.0}, 10, other_tokens=64)  # prefill-dominated: no evidence either way
    assert ctl.summary()[1]["tok_per_s"] == {0: None, 4: None}


def test_each_batch_size_bucket_learns_separately():
    ctl = SpecController(max_k=4, min_samples=2, first_probe_interval=1000)
    _run(ctl, {0: 10.0, 4: 40.0}, 10, num_decoding=1)
    _run(ctl, {0: 40.0, 4: 10.0}, 10, num_decoding=16)
    assert ctl.choose_k(1) == 4
    assert ctl.choose_k(13) == 0  # 13 rounds up to the 16 bucket


def test_not_adaptive_always_proposes_k():
    ctl = SpecController(max_k=3, adaptive=False)
    assert set(_run(ctl, {0: 100.0, 3: 1.0}, 10)) == {3}


def test_acceptance_bookkeeping():
    ctl = SpecController(max_k=3)
    ctl.record_acceptance(3, 1)
    ctl.record_acceptance(2, 2)
    assert ctl.acceptance_rate == 3 / 5
    assert ctl.per_position_proposed == [2, 2, 1] and ctl.per_position_accepted == [2, 1, 0]


def test_a_retry_replaces_the_stale_samples_of_the_arm_not_played():
    ctl = SpecController(max_k=4, min_samples=2, first_probe_interval=4)
    _run(ctl, {0: 5.0, 4: 20.0}, 6)  # arm 0 measured while something slowed it
    _run(ctl, {0: 18.0, 4: 20.0}, 40)  # now it is nearly as fast: its retries say so
    assert ctl.summary()[1]["tok_per_s"][0] == 18.0


def test_discarded_steps_are_not_measured():
    ctl = SpecController(max_k=4, min_samples=2, first_probe_interval=1000)
    for _ in range(5):
        ctl.choose_k(1)
        ctl.discard_step()  # e.g. a compilation was running in the background
    assert ctl.summary()[1]["tok_per_s"] == {0: None, 4: None}


def test_steps_that_emit_nothing_do_not_break_the_retry_budget():
    # e.g. every decoding sequence was aborted between choose_k and the step: both arms measure 0 tok/s
    ctl = SpecController(max_k=4, min_samples=2, first_probe_interval=2)
    choices = _run(ctl, {0: 0.0, 4: 0.0}, 50)
    assert set(choices) == {0, 4}  # still alternating retries, no ZeroDivisionError
