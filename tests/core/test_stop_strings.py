"""Stop strings are matched against newly generated text only.

A stop string generated before ``min_tokens`` was reached must not end the sequence later (the engine used to
search the whole text once ``min_tokens`` was reached and cut the output at that early occurrence), and with
several stop strings a short one lying entirely in already-checked text is not found again."""

from __future__ import annotations

import pytest

from jaxinfer import LLM, SamplingParams
from jaxinfer.core.tokenizer import check_stop

PROMPT = "def fibonacci(n):"


def test_check_stop_bounds_each_stop_string_by_its_own_length():
    # "ab" lies entirely in old text; the long stop string's bound must not widen the search for "ab"
    assert check_stop("abxxxY", ["ab", "QQQQQQ"], new_text_len=1) == ("abxxxY", None)
    assert check_stop("abxxxY", ["xY", "QQQQQQ"], new_text_len=1) == ("abxx", "xY")


@pytest.fixture(scope="module")
def llm():
    return LLM(compilation="lazy", max_num_seqs=2, max_model_len=128)


def _greedy(llm, **kw):
    return llm.generate([PROMPT], SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True, **kw),
                        use_tqdm=False)[0].outputs[0]


def test_stop_string_before_min_tokens_does_not_cut_later(llm):
    full = _greedy(llm)
    tok = llm.get_tokenizer()
    early = tok.decode(full.token_ids[:2])  # text of the first two tokens: generated before min_tokens=8
    assert early and full.text.count(early) == 1 and len(tok.decode(full.token_ids[:8])) > len(early)
    out = _greedy(llm, stop=[early], min_tokens=8)
    assert out.text == full.text and out.token_ids == full.token_ids
    assert out.finish_reason == "length" and out.stop_reason is None


def test_stop_string_after_min_tokens_still_stops(llm):
    full = _greedy(llm)
    tok = llm.get_tokenizer()
    start = len(tok.decode(full.token_ids[:10]))
    late = full.text[start:start + 3]
    first = full.text.find(late)
    out = _greedy(llm, stop=[late], min_tokens=4)
    assert out.finish_reason == "stop" and out.stop_reason == late
    assert out.text == full.text[:first]
