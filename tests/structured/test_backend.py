"""The grammar backend and the bitmask: llguidance's masks agree row for row between the batched fill and each
matcher's own, ``apply_token_bitmask`` equals a plain numpy reference on fuzzed masks, forced tokens are exactly
the one-token masks, compiled grammars are cached, and whitespace follows the configured pattern."""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
import pytest

from jaxinfer.loading.model_source import default_model_dir
from jaxinfer.sample.sampler import apply_token_bitmask
from jaxinfer.sampling_params import StructuredOutputsParams as SO
from jaxinfer.structured.backend import GrammarBackend, bitmask_words

TOKENIZER = (default_model_dir() / "tokenizer.json").read_text()
SCHEMA = {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"enum": ["xy", "z"]}},
          "required": ["a", "b"], "additionalProperties": False}


@pytest.fixture(scope="module")
def backend():
    return GrammarBackend(TOKENIZER, 4096, [0])


def _allowed(row: np.ndarray, vocab: int) -> np.ndarray:
    return np.unpackbits(row.view(np.uint8), bitorder="little")[:vocab].astype(bool)


@pytest.mark.parametrize("vocab", [1, 31, 32, 33, 4096, 5000])
def test_apply_token_bitmask_matches_numpy(vocab):
    rng = np.random.default_rng(vocab)
    rows = 5
    mask = rng.integers(-2**31, 2**31, size=(rows, bitmask_words(vocab) + 1), dtype=np.int64).astype(np.int32)
    mask[0] = -1  # a free row
    logits = rng.standard_normal((rows, vocab)).astype(np.float32)
    got = np.asarray(apply_token_bitmask(jnp.asarray(logits), jnp.asarray(mask)))
    want = np.where(np.stack([_allowed(r, vocab) for r in mask]), logits, -np.inf)
    np.testing.assert_array_equal(got, want)
    np.testing.assert_array_equal(got[0], logits[0])


def test_batched_fill_equals_each_matchers_mask(backend):
    grammars = [backend.compile(SO(json=SCHEMA)), backend.compile(SO(regex="[a-c]{2,4}")),
                backend.compile(SO(choice=["left", "right"]))]
    matchers = [backend.matcher(g) for g in grammars] + [None]
    prefix = backend.tokenizer.tokenize_str('{"a":1')
    assert all(matchers[0].accept(t) for t in prefix)
    bitmask = np.full((4, backend.words), -1, np.int32)
    backend.fill_bitmasks(matchers, bitmask)
    for i, grammar in enumerate(grammars):  # a fresh matcher in the same state computes the same row alone
        fresh = backend.matcher(grammar)
        if i == 0:
            assert all(fresh.accept(t) for t in prefix)
        np.testing.assert_array_equal(bitmask[i], fresh.mask())
    assert (bitmask[3] == -1).all()  # the free row untouched
    assert backend.mask_time.rows >= 3


def test_forced_tokens_are_exactly_the_one_token_masks(backend):
    m = backend.matcher(backend.compile(SO(json=SCHEMA)))
    text = '{"a":7,"b":"xy"}'
    for token in backend.tokenizer.tokenize_str(text):
        forced = m.forced_token()  # before mask(): its forced-bytes filter runs only on a fresh state
        allowed = np.flatnonzero(_allowed(m.mask(), backend.num_tokens))
        if forced is not None:  # a forced token is the only one allowed
            assert list(allowed) == [forced]
        elif len(allowed) == 1:  # one token allowed but not forced: only where llguidance forces no bytes
            assert not m.ll_matcher.compute_ff_bytes()
        assert m.accept(token)
    assert m.is_accepting
    assert m.forced_token() in (None, 0)  # only EOS remains


def test_compile_cache_and_errors(backend):
    so = SO(json=SCHEMA)
    assert backend.compile(so) is backend.compile(SO(json=dict(reversed(list(SCHEMA.items())))))
    with pytest.raises(ValueError, match="structured_outputs.regex"):
        backend.compile(SO(regex="("))
    with pytest.raises(ValueError, match="structured_outputs.grammar"):
        backend.compile(SO(grammar="start: missing"))


def test_whitespace_pattern(backend):
    spaced = backend.tokenizer.tokenize_str('{ "a": 1, "b": "z" }')
    compact = backend.matcher(backend.compile(SO(json=SCHEMA)))
    assert not all(compact.accept(t) for t in spaced)
    flexible = backend.matcher(backend.compile(SO(json=SCHEMA, whitespace_pattern=r"[ ]{0,1}")))
    assert all(flexible.accept(t) for t in spaced) and flexible.is_accepting
