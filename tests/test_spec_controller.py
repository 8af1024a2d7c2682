"""The adaptive speculation rule (host side): it turns speculation off exactly when it does not pay."""

from __future__ import annotations

from jaxinfer.spec_controller import SpecController


def _trained(cost_per_token: float, fixed: float, acceptance: float, batch: int) -> SpecController:
    ctl = SpecController(max_k=4, probe_every=1000)
    for scored in (batch, batch * 5, batch * 2, batch * 3, batch, batch * 5, batch * 4, batch * 2):
        ctl.record_step(scored, 0, fixed + cost_per_token * scored)
    for i in range(25):  # 25 sequences x 4 proposals, accepted at the given rate overall
        ctl.record_acceptance(4, int(round(4 * acceptance)) if i % 2 else int(4 * acceptance))
    return ctl


def test_cheap_verification_and_good_guesses_speculate():
    ctl = _trained(cost_per_token=0.0001, fixed=0.03, acceptance=0.8, batch=1)  # bandwidth-bound batch 1
    assert ctl.choose_k(num_decoding=1) == 4


def test_expensive_verification_and_poor_guesses_do_not():
    ctl = _trained(cost_per_token=0.01, fixed=0.01, acceptance=0.2, batch=16)  # compute-bound batch 16
    assert ctl.choose_k(num_decoding=16) == 0


def test_probe_and_cold_start_propose_k():
    ctl = SpecController(max_k=3, probe_every=2)
    assert ctl.choose_k(4) == 3  # no acceptance measured yet
    ctl = _trained(cost_per_token=0.01, fixed=0.01, acceptance=0.1, batch=16)
    ctl.probe_every = 2
    choices = [ctl.choose_k(16) for _ in range(4)]
    assert 4 in choices and 0 in choices  # periodic probes keep the acceptance estimate fresh


def test_acceptance_bookkeeping():
    ctl = SpecController(max_k=3)
    ctl.record_acceptance(3, 1)
    ctl.record_acceptance(2, 2)
    assert ctl.acceptance_rate == 3 / 5
    assert ctl.per_position_proposed == [2, 2, 1] and ctl.per_position_accepted == [2, 1, 0]
