"""Tests of jaxinfer.sample.sampler, each against an independent numpy reference.

Masks (min_p / top_k / top_p, with ties) must equal a brute-force numpy computation exactly; penalties match a
per-token numpy loop; sampled distributions pass a chi-square goodness-of-fit test against the exact
(renormalised) distribution; seeded draws do not depend on the rest of the batch.
"""

from __future__ import annotations

import itertools
import math
from collections import Counter

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxinfer.sample.sampler import TRUNCATION_METHODS, SamplingMetadata, processed_logits, sample

try:
    from scipy import stats as scipy_stats
except ImportError:  # the sampler does not need scipy; the tests fall back to a closed form
    scipy_stats = None

ALPHA = 1e-3  # significance level of the goodness-of-fit tests

_ROW_FIELDS = {
    "temperature": (np.float32, 1.0),
    "top_k": (np.int32, 0),
    "top_p": (np.float32, 1.0),
    "min_p": (np.float32, 0.0),
    "presence_penalty": (np.float32, 0.0),
    "frequency_penalty": (np.float32, 0.0),
    "repetition_penalty": (np.float32, 1.0),
    "seeds": (np.uint32, None),  # default: the row index
    "steps": (np.int32, 0),
}
_ID_FIELDS = ("prompt_token_ids", "output_token_ids", "banned_token_ids")


def make_md(num_rows: int, **fields) -> SamplingMetadata:
    """Metadata with every feature off unless given; scalars broadcast to all rows."""
    values = {}
    for name, (dtype, default) in _ROW_FIELDS.items():
        value = fields.pop(name, np.arange(num_rows) if default is None else default)
        values[name] = jnp.asarray(np.broadcast_to(np.asarray(value, dtype), (num_rows,)))
    for name in _ID_FIELDS:
        value = fields.pop(name, np.full((num_rows, 1), -1))
        values[name] = jnp.asarray(np.asarray(value, np.int32).reshape(num_rows, -1))
    assert not fields, f"unknown fields {sorted(fields)}"
    return SamplingMetadata(**values)


# ----------------------------------------------------------------------------------------- references


def ref_log_softmax(x: np.ndarray) -> np.ndarray:
    x = np.asarray(x, np.float64)
    shifted = x - x.max(-1, keepdims=True)
    return shifted - np.log(np.exp(shifted).sum(-1, keepdims=True))


def ref_penalties(logits, prompt_ids, output_ids, repetition, frequency, presence) -> np.ndarray:
    """Token by token: HF repetition penalty on prompt+output, then OpenAI frequency/presence on output."""
    out = np.asarray(logits, np.float64).copy()
    vocab_size = out.shape[1]
    for r in range(out.shape[0]):
        valid = lambda ids: [int(t) for t in ids if 0 <= t < vocab_size]  # noqa: E731
        for t in set(valid(prompt_ids[r]) + valid(output_ids[r])):
            out[r, t] = out[r, t] / repetition[r] if out[r, t] > 0 else out[r, t] * repetition[r]
        for t, count in Counter(valid(output_ids[r])).items():
            out[r, t] -= frequency[r] * count + presence[r]
    return out


def ref_keep(scaled_row, min_p: float, top_k: int, top_p: float) -> np.ndarray:
    """Brute-force survivor mask of one row of temperature-scaled logits (float64)."""
    x = np.asarray(scaled_row, np.float64)
    probs = np.exp(x - x.max())
    probs /= probs.sum()
    keep = probs >= min_p * probs.max()
    if 0 < top_k < len(x):
        keep &= x >= np.sort(x)[::-1][top_k - 1]
    if top_p < 1.0:
        q = np.where(keep, probs, 0.0)
        q /= q.sum()
        mass_above = np.array([q[q > q[i]].sum() for i in range(len(x))])
        keep &= mass_above < top_p
    return keep


def chi_square_p_value(observed: np.ndarray, expected_probs: np.ndarray) -> float:
    """P-value of Pearson's chi-square goodness-of-fit test (scipy if present, else Wilson-Hilferty)."""
    n = observed.sum()
    expected = expected_probs * n
    assert expected.min() >= 5, "too few expected counts per bin for the chi-square approximation"
    stat = float(((observed - expected) ** 2 / expected).sum())
    dof = len(observed) - 1
    if scipy_stats is not None:
        return float(scipy_stats.chi2.sf(stat, dof))
    z = ((stat / dof) ** (1 / 3) - (1 - 2 / (9 * dof))) / math.sqrt(2 / (9 * dof))
    return 0.5 * math.erfc(z / math.sqrt(2))


def sample_counts(logits_row: np.ndarray, num_draws: int, **fields) -> np.ndarray:
    """Token histogram of num_draws rows that share one row of logits, each with its own seed and step."""
    rng = np.random.default_rng(7)
    logits = np.broadcast_to(np.asarray(logits_row, np.float32), (num_draws, len(logits_row)))
    md = make_md(
        num_draws,
        seeds=np.arange(num_draws) + 12345,
        steps=rng.integers(0, 1000, num_draws),
        **fields,
    )
    out = sample(jnp.asarray(logits), md, num_logprobs=0, apply_penalties=False, all_greedy=False)
    return np.bincount(np.asarray(out.tokens), minlength=len(logits_row))


# ------------------------------------------------------------------------------------------- masks


@pytest.mark.parametrize("method", TRUNCATION_METHODS)
def test_masks_equal_brute_force_for_all_parameter_combinations(method):
    vocab_size = 48
    combos = list(
        itertools.product(
            [0.5, 1.0, 1.7],  # temperature
            [0, -1, 1, 3, 7, vocab_size, vocab_size + 5],  # top_k
            [1.0, 0.9, 0.5, 0.2, 0.05],  # top_p
            [0.0, 0.05, 0.3],  # min_p
        )
    )
    rng = np.random.default_rng(0)
    # Logits on a grid of quarters: many exact ties, and every value exact in float32.
    logits = (rng.integers(-12, 13, (len(combos), vocab_size)) / 4).astype(np.float32)
    temperature, top_k, top_p, min_p = (np.array(c) for c in zip(*combos))
    md = make_md(len(combos), temperature=temperature, top_k=top_k, top_p=top_p, min_p=min_p)

    got = np.asarray(processed_logits(jnp.asarray(logits), md, truncation_method=method))

    scaled = logits.astype(np.float64) / temperature[:, None]
    for r in range(len(combos)):
        want = ref_keep(scaled[r], min_p[r], top_k[r], top_p[r])
        np.testing.assert_array_equal(np.isfinite(got[r]), want, err_msg=f"row {r}: params {combos[r]}")
        np.testing.assert_allclose(got[r][want], scaled[r][want], rtol=1e-6)


@pytest.mark.parametrize("method", TRUNCATION_METHODS)
def test_tie_rules_on_hand_computed_rows(method):
    # probabilities 4/11, 2/11, 2/11, 2/11, 1/11
    row = np.log(np.array([4.0, 2.0, 2.0, 2.0, 1.0]))
    cases = [  # (top_k, top_p, min_p) -> survivors, worked out by hand
        ((1, 1.0, 0.0), {0}),
        ((2, 1.0, 0.0), {0, 1, 2, 3}),  # the 2nd largest is tied three ways: all kept
        ((4, 1.0, 0.0), {0, 1, 2, 3}),
        ((0, 0.3, 0.0), {0}),  # 4/11 >= 0.3 already
        ((0, 0.5, 0.0), {0, 1, 2, 3}),  # the tie group straddles 0.5: kept whole
        ((0, 0.95, 0.0), {0, 1, 2, 3, 4}),
        ((0, 0.0, 0.0), {0}),  # top_p 0 still keeps the most probable token
        ((0, 1.0, 0.4), {0, 1, 2, 3}),  # 2/11 >= 0.4 * 4/11
        ((0, 1.0, 0.6), {0}),
        ((0, 1.0, 1.0), {0}),
        ((3, 0.7, 0.0), {0, 1, 2, 3}),  # top_k keeps 4 (ties), then 4/10 < 0.7 keeps the tie group
        # top_p acts on the distribution renormalised after min_p: with 1/11 still there, the mass above
        # the 2/11s is 4/11 < 0.38; once min_p drops 1/11 it is 4/10 >= 0.38.
        ((0, 0.38, 0.0), {0, 1, 2, 3}),
        ((0, 0.38, 0.3), {0}),
    ]
    logits = np.tile(row.astype(np.float32), (len(cases), 1))
    (top_k, top_p, min_p) = (np.array(c) for c in zip(*[params for params, _ in cases]))
    md = make_md(len(cases), top_k=top_k, top_p=top_p, min_p=min_p)
    got = np.asarray(processed_logits(jnp.asarray(logits), md, truncation_method=method))
    for r, (params, survivors) in enumerate(cases):
        assert set(np.flatnonzero(np.isfinite(got[r]))) == survivors, params


@pytest.mark.parametrize("method", TRUNCATION_METHODS)
def test_masks_on_wide_ranged_logits_with_signed_zeros_and_infinities(method):
    """Values of every magnitude and sign (the search method orders float bit patterns), -0.0 tied
    with +0.0, and tokens already at -inf (e.g. a padded vocabulary)."""
    rng = np.random.default_rng(11)
    num_rows, vocab_size = 40, 64
    shape = (num_rows, vocab_size)
    logits = rng.choice([-1, 1], shape) * 10.0 ** rng.uniform(-30, 1.5, shape)
    logits[:, :6] = [0.0, -0.0, 0.0, -0.0, -np.inf, -np.inf]
    logits[::2, 6:] = np.minimum(logits[::2, 6:], -1e-3)  # the signed zeros are the top tie group
    logits = logits.astype(np.float32)
    top_k = rng.integers(0, 20, num_rows)
    top_p = rng.choice([1.0, 0.9, 0.6, 0.3, 0.01], num_rows)
    min_p = rng.choice([0.0, 0.1, 0.5], num_rows)
    md = make_md(num_rows, top_k=top_k, top_p=top_p, min_p=min_p)
    got = np.asarray(processed_logits(jnp.asarray(logits), md, truncation_method=method))
    for r in range(num_rows):
        want = ref_keep(logits[r], min_p[r], top_k[r], top_p[r]) & np.isfinite(logits[r])
        np.testing.assert_array_equal(np.isfinite(got[r]), want, err_msg=f"row {r}")
    assert np.isfinite(got[::2, :4]).all(), "-0.0 and +0.0 are one tie group"


# --------------------------------------------------------------------------------------- penalties


def test_penalties_match_reference():
    num_rows, vocab_size = 6, 32
    rng = np.random.default_rng(1)
    logits = rng.normal(0, 2, (num_rows, vocab_size)).astype(np.float32)
    prompt = rng.integers(0, vocab_size, (num_rows, 9))
    output = rng.integers(0, 8, (num_rows, 7))  # small ids: many repeats
    prompt[:, 6:] = -1
    output[1, 3:] = -1
    output[2] = -1
    prompt[3, 0] = vocab_size + 3  # out of range: ignored
    repetition = np.array([1.0, 1.3, 0.8, 2.0, 1.0, 1.5], np.float32)
    frequency = np.array([0.0, 0.5, -0.3, 0.2, 1.0, 0.0], np.float32)
    presence = np.array([0.0, 0.4, 0.6, -0.5, 0.0, 1.2], np.float32)
    md = make_md(
        num_rows,
        repetition_penalty=repetition,
        frequency_penalty=frequency,
        presence_penalty=presence,
        prompt_token_ids=prompt,
        output_token_ids=output,
    )
    got = np.asarray(processed_logits(jnp.asarray(logits), md))
    want = ref_penalties(logits, prompt, output, repetition, frequency, presence)
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-5)
    assert not np.allclose(want, logits), "the test data must actually change the logits"


def test_empty_token_id_arrays():
    logits = np.random.default_rng(2).normal(size=(3, 20)).astype(np.float32)
    empty = np.zeros((3, 0), np.int32)
    md = make_md(3, repetition_penalty=1.5, presence_penalty=1.0, prompt_token_ids=empty,
                 output_token_ids=empty, banned_token_ids=empty)
    np.testing.assert_allclose(np.asarray(processed_logits(jnp.asarray(logits), md)), logits, rtol=1e-6)


# ------------------------------------------------------------------------------------ greedy, bans


@pytest.mark.parametrize("all_greedy", [True, False])
def test_greedy_is_argmax_of_penalised_and_banned_logits(all_greedy):
    num_rows, vocab_size = 8, 40
    rng = np.random.default_rng(3)
    logits = rng.normal(0, 2, (num_rows, vocab_size)).astype(np.float32)
    prompt = rng.integers(0, vocab_size, (num_rows, 5))
    output = np.argsort(-logits, axis=1)[:, :3]  # penalise the current favourites
    banned = np.argsort(-logits, axis=1)[:, 3:5]  # and ban the next ones
    banned[0] = -1
    repetition = rng.uniform(1.0, 3.0, num_rows)
    frequency = rng.uniform(0.0, 2.0, num_rows)
    presence = rng.uniform(0.0, 2.0, num_rows)
    temperature = np.zeros(num_rows) if all_greedy else np.where(np.arange(num_rows) % 2, 0.0, 1.0)
    md = make_md(num_rows, temperature=temperature, top_k=5, top_p=0.5,
                 repetition_penalty=repetition, frequency_penalty=frequency, presence_penalty=presence,
                 prompt_token_ids=prompt, output_token_ids=output, banned_token_ids=banned)
    out = sample(jnp.asarray(logits), md, num_logprobs=0, apply_penalties=True, all_greedy=all_greedy)

    want = ref_penalties(logits, prompt, output, repetition, frequency, presence)
    for r in range(num_rows):
        want[r, banned[r][banned[r] >= 0]] = -np.inf
    greedy_rows = temperature == 0
    np.testing.assert_array_equal(np.asarray(out.tokens)[greedy_rows], want.argmax(1)[greedy_rows])
    assert (want.argmax(1) != logits.argmax(1)).any(), "penalties and bans must matter in this test"


@pytest.mark.parametrize("all_greedy", [True, False])
def test_greedy_ties_go_to_the_lowest_id(all_greedy):
    logits = np.array([[0.0, 2.0, 1.0, 2.0, 2.0], [3.0, 3.0, 3.0, 3.0, 3.0], [-1.0, -5.0, -1.0, -3.0, -2.0]])
    md = make_md(3, temperature=0.0, banned_token_ids=[[-1], [0], [-1]])
    out = sample(jnp.asarray(logits, jnp.float32), md, num_logprobs=0, apply_penalties=False,
                 all_greedy=all_greedy)
    np.testing.assert_array_equal(np.asarray(out.tokens), [1, 1, 0])


def test_banned_ids_never_sampled():
    vocab_size, num_draws = 8, 4000
    row = np.array([6.0, 6.0, 0.0, 0.5, -1.0, 1.0, 0.0, 0.2], np.float32)  # banned ids are the favourites
    banned = np.tile([[0, 1, -1]], (num_draws, 1))
    counts = sample_counts(row, num_draws, temperature=2.0, banned_token_ids=banned)
    assert counts[0] == counts[1] == 0
    assert (counts[2:] > 0).all()  # everything else still reachable
    assert counts.sum() == num_draws and len(counts) == vocab_size


# ---------------------------------------------------------------------------------------- seeding


def test_seeded_tokens_do_not_depend_on_batch_composition_or_position():
    vocab_size = 1000
    rng = np.random.default_rng(4)
    logits = rng.normal(0, 0.5, (8, vocab_size)).astype(np.float32)
    params = dict(
        temperature=rng.uniform(0.5, 1.5, 8),
        top_k=[0, 50, 0, 300, 0, 0, 20, 0],
        top_p=[1.0, 1.0, 0.9, 0.95, 1.0, 0.8, 1.0, 1.0],
        seeds=rng.integers(0, 2**32, 8, dtype=np.uint64),
        steps=rng.integers(0, 500, 8),
    )
    alone = sample(jnp.asarray(logits), make_md(8, **params), num_logprobs=0,
                   apply_penalties=False, all_greedy=False)

    # The same 8 rows, shuffled into a batch of 16 among strangers with other logits and parameters.
    positions = rng.permutation(16)[:8]
    big_logits = rng.normal(0, 3, (16, vocab_size)).astype(np.float32)
    big_logits[positions] = logits
    big_params = dict(temperature=rng.uniform(0.0, 2.0, 16), top_k=rng.integers(0, 100, 16),
                      top_p=rng.uniform(0.5, 1.0, 16), seeds=rng.integers(0, 2**32, 16, dtype=np.uint64),
                      steps=rng.integers(0, 500, 16))
    for name, value in params.items():
        big_params[name][positions] = value
    mixed = sample(jnp.asarray(big_logits), make_md(16, **big_params), num_logprobs=3,
                   apply_penalties=False, all_greedy=False)
    np.testing.assert_array_equal(np.asarray(mixed.tokens)[positions], np.asarray(alone.tokens))


def test_different_seeds_and_steps_give_different_tokens():
    vocab_size, num_rows = 1000, 64
    logits = np.tile(np.random.default_rng(5).normal(0, 0.3, vocab_size).astype(np.float32), (num_rows, 1))

    def draw(seeds, steps):
        md = make_md(num_rows, seeds=seeds, steps=steps)
        return np.asarray(sample(jnp.asarray(logits), md, num_logprobs=0, apply_penalties=False,
                                 all_greedy=False).tokens)

    # Near-uniform over 1000 tokens: 64 independent draws repeat a token only a few times.
    assert len(set(draw(np.arange(num_rows), 0))) > 50
    assert len(set(draw(7, np.arange(num_rows)))) > 50
    same = draw(7, 3)
    assert (same == same[0]).all()


# ---------------------------------------------------------------------------------- distributions


def test_temperature_sampling_matches_softmax():
    row = np.random.default_rng(6).normal(0, 1.0, 12).astype(np.float32)
    temperature = 0.7
    counts = sample_counts(row, 24000, temperature=temperature)
    expected = np.exp(ref_log_softmax(row.astype(np.float64) / temperature))
    assert chi_square_p_value(counts, expected) > ALPHA
    # The test has power: the untempered distribution is clearly rejected.
    assert chi_square_p_value(counts, np.exp(ref_log_softmax(row))) < 1e-6


def test_truncated_sampling_matches_renormalised_distribution():
    row = np.random.default_rng(8).normal(0, 1.5, 16).astype(np.float32)
    temperature, top_k, top_p, min_p = 1.3, 9, 0.85, 0.04
    counts = sample_counts(row, 24000, temperature=temperature, top_k=top_k, top_p=top_p, min_p=min_p)
    scaled = row.astype(np.float64) / temperature
    keep = ref_keep(scaled, min_p, top_k, top_p)
    assert 3 <= keep.sum() < top_k, "every filter should matter for this row"
    assert counts[~keep].sum() == 0
    expected = np.exp(ref_log_softmax(scaled[keep]))
    assert chi_square_p_value(counts[keep], expected) > ALPHA
    # Power: the untruncated distribution restricted to the kept tokens is rejected.
    untruncated = np.exp(ref_log_softmax(row.astype(np.float64)))[keep]
    assert chi_square_p_value(counts[keep], untruncated / untruncated.sum()) < 1e-6


# --------------------------------------------------------------------------------------- logprobs


@pytest.mark.parametrize("all_greedy", [True, False])
def test_logprobs_are_raw_log_softmax(all_greedy):
    num_rows, vocab_size, k = 6, 50, 5
    rng = np.random.default_rng(9)
    logits = rng.normal(0, 3, (num_rows, vocab_size)).astype(np.float32)
    md = make_md(num_rows, temperature=0.0 if all_greedy else 0.6, top_k=10, repetition_penalty=1.7,
                 frequency_penalty=0.5, output_token_ids=np.argsort(-logits, 1)[:, :4])
    out = sample(jnp.asarray(logits), md, num_logprobs=k, apply_penalties=True, all_greedy=all_greedy)
    raw = ref_log_softmax(logits)
    tokens = np.asarray(out.tokens)
    np.testing.assert_allclose(np.asarray(out.logprobs), raw[np.arange(num_rows), tokens], atol=1e-5)
    want_ids = np.argsort(-raw, axis=1)[:, :k]
    np.testing.assert_array_equal(np.asarray(out.topk_ids), want_ids)
    np.testing.assert_allclose(np.asarray(out.topk_logprobs), np.take_along_axis(raw, want_ids, 1), atol=1e-5)

    none = sample(jnp.asarray(logits), md, num_logprobs=0, apply_penalties=True, all_greedy=all_greedy)
    assert none.topk_ids.shape == (num_rows, 0) and none.topk_logprobs.shape == (num_rows, 0)
    np.testing.assert_array_equal(np.asarray(none.tokens), tokens)


# ------------------------------------------------------------------------------- padding, flags


def padded_batch(num_real: int, num_rows: int, vocab_size: int):
    """Real rows with every feature on, then padded rows: logits, parameters and ids all zero / -1."""
    rng = np.random.default_rng(10)
    logits = np.zeros((num_rows, vocab_size), np.float32)
    logits[:num_real] = rng.normal(0, 2, (num_real, vocab_size))
    real = np.arange(num_rows) < num_real
    md = make_md(
        num_rows,
        temperature=np.where(real, 0.9, 0.0), top_k=np.where(real, 7, 0), top_p=np.where(real, 0.9, 0.0),
        min_p=np.where(real, 0.01, 0.0), presence_penalty=np.where(real, 0.3, 0.0),
        frequency_penalty=np.where(real, 0.2, 0.0), repetition_penalty=np.where(real, 1.2, 0.0),
        seeds=np.where(real, np.arange(num_rows) + 1, 0), steps=np.where(real, 4, 0),
        prompt_token_ids=np.where(real[:, None], rng.integers(0, vocab_size, (num_rows, 6)), -1),
        output_token_ids=np.where(real[:, None], rng.integers(0, vocab_size, (num_rows, 3)), -1),
        banned_token_ids=np.where(real[:, None], [[0, 1]], -1),
    )
    return logits, md


@pytest.mark.parametrize(
    "apply_penalties,all_greedy,apply_truncation",
    [(True, False, True), (False, False, False), (True, True, True), (False, True, False)],
)
def test_padded_rows_give_no_nan(apply_penalties, all_greedy, apply_truncation):
    vocab_size, num_real = 24, 3
    logits, md = padded_batch(num_real, 8, vocab_size)
    out = sample(jnp.asarray(logits), md, num_logprobs=2, apply_penalties=apply_penalties,
                 all_greedy=all_greedy, apply_truncation=apply_truncation)
    for leaf in jax.tree_util.tree_leaves(out):
        assert not np.isnan(np.asarray(leaf, np.float64)).any()
    assert ((np.asarray(out.tokens) >= 0) & (np.asarray(out.tokens) < vocab_size)).all()
    final = np.asarray(processed_logits(jnp.asarray(logits), md, apply_penalties=apply_penalties,
                                        apply_truncation=apply_truncation))
    assert not np.isnan(final).any() and np.isfinite(final).any(axis=1).all()
    # Padding does not disturb the real rows.
    real_logits, real_md = logits[:num_real], jax.tree_util.tree_map(lambda a: a[:num_real], md)
    alone = sample(jnp.asarray(real_logits), real_md, num_logprobs=2, apply_penalties=apply_penalties,
                   all_greedy=all_greedy, apply_truncation=apply_truncation)
    np.testing.assert_array_equal(np.asarray(out.tokens)[:num_real], np.asarray(alone.tokens))


def _primitive_names(jaxpr) -> set[str]:
    names = set()
    for eqn in jaxpr.eqns:
        names.add(eqn.primitive.name)
        for param in eqn.params.values():
            for sub in param if isinstance(param, (tuple, list)) else (param,):
                inner = getattr(sub, "jaxpr", sub)
                if hasattr(inner, "eqns"):
                    names |= _primitive_names(inner)
    return names


def test_static_flags_skip_work():
    logits, md = padded_batch(2, 4, 16)

    def primitives(**flags):
        closed = jax.make_jaxpr(
            lambda x, m: sample(x, m, num_logprobs=1, truncation_method="sort", **flags)
        )(jnp.asarray(logits), md)
        return _primitive_names(closed.jaxpr)

    def uses_rng(names):
        return any(n.startswith("random_") or "threefry" in n for n in names)

    full = primitives(apply_penalties=True, all_greedy=False)
    assert "sort" in full and uses_rng(full) and "scatter-add" in full  # the probe sees the work
    greedy = primitives(apply_penalties=False, all_greedy=True)
    assert "sort" not in greedy and not uses_rng(greedy) and "scatter-add" not in greedy
    untruncated = primitives(apply_penalties=True, all_greedy=False, apply_truncation=False)
    assert "sort" not in untruncated and uses_rng(untruncated)


def test_bad_shapes_are_refused():
    logits = jnp.zeros((4, 10))
    with pytest.raises(ValueError, match="top_k"):
        sample(logits, make_md(4).__class__(**{**make_md(4).__dict__, "top_k": jnp.zeros(3, jnp.int32)}),
               num_logprobs=0, apply_penalties=False, all_greedy=True)
    with pytest.raises(ValueError, match="num_logprobs"):
        sample(logits, make_md(4), num_logprobs=11, apply_penalties=False, all_greedy=True)
