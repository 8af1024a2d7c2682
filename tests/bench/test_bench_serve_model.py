"""The serving model (``jaxinfer-bench serve-model``): the cost fit and the simulated replay, no engine."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest

from bench import serve
from bench.workload import TimedRequest, WorkloadSpec, make_workload
from bench.serve_model import fit_cost, simulate


def test_fit_is_the_best_non_negative_fit():
    """Where plain least squares wants a negative coefficient, the fit equals the best fit over every subset
    of non-negative coefficients (brute force: the independent oracle)."""
    rng = np.random.default_rng(1)
    samples = []
    for _ in range(40):
        n, ctx, pre, pairs = rng.integers(1, 32), rng.integers(0, 9000), rng.integers(0, 2048), rng.integers(0, 10**6)
        seconds = 5e-3 + 2e-4 * n + 1e-6 * ctx - 1e-6 * pre + 1e-9 * pairs  # pre's true effect is negative
        samples.append((n, ctx, pre, pairs, seconds * rng.uniform(0.95, 1.05)))
    x = np.array([[1.0, *smp[:4]] for smp in samples])
    y = np.array([smp[4] for smp in samples])
    a, b = x / y[:, None], np.ones_like(y)
    assert np.linalg.lstsq(a, b, rcond=None)[0].min() < 0  # the constraint binds
    best = np.inf
    for mask in itertools.product([False, True], repeat=5):
        cols = [i for i in range(5) if mask[i]]
        coef = np.zeros(5)
        if cols:
            coef[cols] = np.linalg.lstsq(a[:, cols], b, rcond=None)[0]
        if coef.min() >= 0:
            best = min(best, float(np.sum((a @ coef - b) ** 2)))
    fit = fit_cost(samples)
    got = np.array([fit[k] for k in ("a_s", "b_s_per_seq", "c_s_per_context_token", "p_s_per_prefill_token",
                                     "r_s_per_prefill_pair")])
    assert got.min() >= 0
    assert float(np.sum((a @ got - b) ** 2)) == pytest.approx(best, rel=1e-6)


def test_simulated_steps_are_costed_by_what_they_hold():
    """One request (3-token prompt, 3 output tokens): a prefill step of 3 tokens (1 + 2 + 3 = 6 query-key
    pairs), then two decodes attending to 4 and 5 keys."""
    workload = [TimedRequest("r", 0.0, (5, 6, 7), 3)]
    steps = []

    def cost(n, ctx, pre, pairs):
        steps.append((n, ctx, pre, pairs))
        return 1.0

    out = simulate(workload, cost, batching="continuous", max_num_seqs=4, max_num_batched_tokens=64, max_len=8,
                   static_batch_timeout_s=0.0)
    assert steps == [(1, 0, 3, 6), (1, 4, 0, 0), (1, 5, 0, 0)]
    assert out["e2e_p50_s"] == 3.0 and out["output_throughput_tok_s"] == 1.0


def test_fit_recovers_a_known_cost_model():
    rng = np.random.default_rng(0)
    true = (2e-3, 1e-4, 3e-7, 5e-5, 0.0)  # no pair term: the fit must keep it at zero, not negative
    samples = []
    for _ in range(60):
        n, ctx, pre, pairs = rng.integers(1, 32), rng.integers(0, 9000), rng.integers(0, 2048), rng.integers(0, 10**6)
        seconds = true[0] + true[1] * n + true[2] * ctx + true[3] * pre + true[4] * pairs
        samples.append((n, ctx, pre, pairs, seconds))
    fit = fit_cost(samples)
    got = [fit[k] for k in ("a_s", "b_s_per_seq", "c_s_per_context_token", "p_s_per_prefill_token", "r_s_per_prefill_pair")]
    np.testing.assert_allclose(got, true, rtol=1e-6, atol=1e-12)
    assert fit["median_relative_error"] < 1e-6


def _workload(rate, n=12):
    spec = WorkloadSpec(n, rate, 1.0, (20, 60), (5, 40), seed=3)
    return make_workload(spec, vocab_size=100), spec.max_len


def _sim(workload, max_len, batching, max_num_seqs, cost=lambda n, ctx, pre, pairs: 0.01):
    return simulate(workload, cost, batching=batching, max_num_seqs=max_num_seqs, max_num_batched_tokens=512,
                    max_len=max_len, static_batch_timeout_s=0.0)


def test_one_batch_for_everyone_is_the_same_in_both_modes():
    workload, max_len = _workload(math.inf)
    static, cont = (_sim(workload, max_len, mode, max_num_seqs=16) for mode in serve.MODES)
    assert static == pytest.approx(cont)
    # every request decodes one token per 10 ms step after one prefill step: its latency is known
    lengths = sorted(r.output_len for r in workload)
    assert cont["e2e_p50_s"] == pytest.approx(0.01 * (1 + np.percentile(lengths, 50) - 1))


def test_static_batches_wait_for_their_longest_request():
    workload, max_len = _workload(math.inf)
    static, cont = (_sim(workload, max_len, mode, max_num_seqs=3) for mode in serve.MODES)
    assert static["e2e_p50_s"] > cont["e2e_p50_s"]
    assert static["output_throughput_tok_s"] < cont["output_throughput_tok_s"]


@pytest.mark.parametrize("bad", ["0", "-2", "nan", "fast"])
def test_bad_rates_are_refused_before_anything_runs(bad, capsys):
    from bench.cli import main

    with pytest.raises(SystemExit) as exit_info:
        main(["serve-model", "--rates", "4", bad])
    assert exit_info.value.code == 2
    assert "expected a positive number" in capsys.readouterr().err
