"""Tokenizer wrapper, incremental detokenization and stop strings, on tokenizers trained here."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest
from tokenizers import Tokenizer as HFTokenizer
from tokenizers import decoders, models, pre_tokenizers, processors, trainers

from jaxinfer.core.tokenizer import IncrementalDetokenizer, Tokenizer, check_stop, load_tokenizer

MULTILINGUAL = [
    "Hello world! The quick brown fox jumps over the lazy dog.",
    "naïve café — déjà vu, Größe, Ελληνικά, русский текст",
    "你好，世界！机器学习与推理引擎。日本語のテキストも少し。",
    "emoji time 🎉🚀 and a family 👨‍👩‍👧 plus flags 🇫🇷 then 😀 done",
    "mixed: def f(x):\n    return x * 2  # 二倍 🐍\n",
]
SPECIALS = ["<s>", "</s>", "<pad>"]


def _corpus() -> list[str]:
    """Some English / Python text (the stdlib json package) plus a little multilingual text."""
    src = Path(json.__file__).parent
    texts = [p.read_text(encoding="utf-8") for p in sorted(src.glob("*.py"))]
    return texts + MULTILINGUAL


def _train_byte_level(vocab_size: int = 800) -> HFTokenizer:
    tok = HFTokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=SPECIALS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(_corpus(), trainer=trainer)
    bos = tok.token_to_id("<s>")
    tok.post_processor = processors.TemplateProcessing(
        single="<s> $A", pair="<s> $A <s> $B", special_tokens=[("<s>", bos)]
    )
    return tok


@pytest.fixture(scope="module")
def tok_dir(tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("bpe")
    hf = _train_byte_level()
    hf.save(str(d / "tokenizer.json"))
    (d / "tokenizer_config.json").write_text(
        json.dumps({"bos_token": "<s>", "eos_token": {"content": "</s>"}, "tokenizer_class": "PreTrainedTokenizerFast"})
    )
    (d / "generation_config.json").write_text(json.dumps({"eos_token_id": [hf.token_to_id("</s>"), 7]}))
    (d / "config.json").write_text(json.dumps({"eos_token_id": 9, "bos_token_id": 0}))
    return d


@pytest.fixture(scope="module")
def tok(tok_dir) -> Tokenizer:
    t = load_tokenizer(tok_dir)
    assert t is not None
    return t


def test_load_reads_special_ids(tok, tok_dir):
    hf = HFTokenizer.from_file(str(tok_dir / "tokenizer.json"))
    eos = hf.token_to_id("</s>")
    # generation_config first, then config.json, then tokenizer_config's eos token; no duplicates
    assert tok.eos_token_ids == (eos, 7, 9)
    assert tok.eos_token_id == eos
    assert tok.bos_token_id == 0 == hf.token_to_id("<s>")
    assert tok.vocab_size == hf.get_vocab_size(with_added_tokens=True)


def test_load_without_tokenizer_json_is_none(tmp_path):
    assert load_tokenizer(tmp_path) is None


@pytest.mark.parametrize("text", MULTILINGUAL)
def test_encode_decode_round_trip(tok, text):
    ids = tok.encode(text)
    assert ids[0] == tok.bos_token_id  # added by the post-processor
    assert tok.encode(text, add_special_tokens=False) == ids[1:]
    assert tok.decode(ids) == text
    assert tok.decode(ids, skip_special_tokens=False) == "<s>" + text


def test_add_bos_token_from_tokenizer_config(tmp_path):
    hf = _train_byte_level()
    hf.post_processor = None  # BOS must now come from tokenizer_config's add_bos_token
    hf.save(str(tmp_path / "tokenizer.json"))
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({"bos_token": "<s>", "add_bos_token": True}))
    t = load_tokenizer(tmp_path)
    bos = hf.token_to_id("<s>")
    assert t.bos_token_id == bos
    assert t.encode("hi there") == [bos] + hf.encode("hi there").ids
    assert t.encode("hi there", add_special_tokens=False) == hf.encode("hi there").ids


def test_matches_transformers_fast_tokenizer(tok, tok_dir):
    from transformers import PreTrainedTokenizerFast

    ref = PreTrainedTokenizerFast(tokenizer_file=str(tok_dir / "tokenizer.json"))
    for text in MULTILINGUAL:
        assert tok.encode(text) == ref(text)["input_ids"]
        assert tok.encode(text, add_special_tokens=False) == ref(text, add_special_tokens=False)["input_ids"]
        ids = tok.encode(text)
        assert tok.decode(ids) == ref.decode(ids, skip_special_tokens=True)


def _splits_a_character(tok: Tokenizer, ids: list[int]) -> bool:
    return any("\ufffd" in tok.decode([i]) for i in ids)


@pytest.mark.parametrize("text", MULTILINGUAL[1:])
def test_incremental_equals_full_decode_one_token_at_a_time(tok, text):
    ids = tok.encode(text, add_special_tokens=False)
    if text is not MULTILINGUAL[1]:  # the test must exercise characters split over tokens
        assert _splits_a_character(tok, ids)
    prompt = tok.encode("Prompt: ")
    detok = IncrementalDetokenizer(tok, prompt)
    pieces = [detok.append([t]) for t in ids]
    assert all("\ufffd" not in p for p in pieces)
    assert "".join(pieces) == tok.decode(ids) == text
    assert detok.text == text
    assert detok.output_ids == ids
    assert detok.flush() == ""


def test_incremental_random_chunks_and_empty_prompt(tok):
    text = " ".join(MULTILINGUAL)
    ids = tok.encode(text, add_special_tokens=False)
    rng = random.Random(0)
    for trial in range(20):
        detok = IncrementalDetokenizer(tok, [] if trial % 2 else tok.encode("ctx"))
        pieces, i = [], 0
        while i < len(ids):
            n = rng.randint(1, 5)  # speculative decoding appends several tokens at once
            pieces.append(detok.append(ids[i : i + n]))
            i += n
        assert all("\ufffd" not in p for p in pieces)
        assert "".join(pieces) == text


def test_incremental_holds_back_incomplete_character_until_flush(tok):
    ids = tok.encode("ok 🚀", add_special_tokens=False)
    # find a cut that leaves the rocket incomplete
    cut = next(k for k in range(len(ids), 0, -1) if tok.decode(ids[:k]).endswith("\ufffd"))
    detok = IncrementalDetokenizer(tok, tok.encode("x"))
    emitted = "".join(detok.append([t]) for t in ids[:cut])
    assert "\ufffd" not in emitted
    assert emitted + detok.flush() == tok.decode(ids[:cut])


def test_incremental_skips_special_tokens(tok):
    eos = tok.token_to_id("</s>")
    ids = tok.encode("end here", add_special_tokens=False)
    detok = IncrementalDetokenizer(tok, [])
    assert "".join(detok.append([t]) for t in ids + [eos]) == "end here"
    keep = IncrementalDetokenizer(tok, [], skip_special_tokens=False)
    assert "".join(keep.append([t]) for t in ids + [eos]) == "end here</s>"


def test_incremental_metaspace_keeps_spaces():
    """A SentencePiece-style decoder strips the leading space of a decode: the context window must not."""
    hf = HFTokenizer(models.BPE(unk_token="<unk>"))
    hf.pre_tokenizer = pre_tokenizers.Metaspace()
    hf.decoder = decoders.Metaspace()
    trainer = trainers.BpeTrainer(vocab_size=300, special_tokens=["<unk>"], show_progress=False)
    hf.train_from_iterator(_corpus()[:3], trainer=trainer)
    tok = Tokenizer(hf)
    text = "the quick brown fox returns the value"
    ids = tok.encode(text)
    assert tok.decode(ids) == text
    for prompt in ([], tok.encode("say")):
        detok = IncrementalDetokenizer(tok, prompt)
        streamed = "".join(detok.append([t]) for t in ids)
        assert streamed == (text if not prompt else " " + text)


# ----------------------------------------------------------------------------------------- stop strings


def test_check_stop_basic():
    assert check_stop("hello world", ["wor"]) == ("hello ", "wor")
    assert check_stop("hello world", ["wor"], include_stop_str_in_output=True) == ("hello wor", "wor")
    assert check_stop("hello world", ["xyz"]) == ("hello world", None)
    assert check_stop("hello world", []) == ("hello world", None)
    assert check_stop("hello world", [""]) == ("hello world", None)


def test_check_stop_earliest_wins():
    # "lo" starts before "hello"'s later "wor"; same start: the longer stop string is reported
    assert check_stop("hello world", ["wor", "lo"]) == ("hel", "lo")
    assert check_stop("hello world", ["he", "hell"], True) == ("hell", "hell")


def test_check_stop_straddles_appends():
    stops = ["STOP", "\n\n"]
    text, found = "", None
    for piece in ["abc S", "TO", "P tail"]:
        text += piece
        text, found = check_stop(text, stops, new_text_len=len(piece))
        if found:
            break
    assert (text, found) == ("abc ", "STOP")
    # with new_text_len the search ignores matches that ended in earlier (already checked) text
    assert check_stop("STOP" + "x" * 10, ["STOP"], new_text_len=3) == ("STOP" + "x" * 10, None)
    assert check_stop("xxSTO" + "P", ["STOP"], new_text_len=1) == ("xx", "STOP")


def test_stop_string_over_detokenized_stream(tok):
    text = "first line 你好\n\nsecond line"
    ids = tok.encode(text, add_special_tokens=False)
    detok = IncrementalDetokenizer(tok, [])
    out, found = "", None
    for t in ids:
        piece = detok.append([t])
        out += piece
        out, found = check_stop(out, ["\n\n"], new_text_len=len(piece))
        if found:
            break
    assert (out, found) == ("first line 你好", "\n\n")


def test_batched_append_equals_one_detokenizer_at_a_time(tok):
    """``append_each`` (one decode_batch per window, what an engine step does) emits exactly what ``append``
    does, sequence by sequence, multi-byte characters and special tokens included."""
    rng = random.Random(3)
    streams = [tok.encode(text, add_special_tokens=False) for text in MULTILINGUAL]
    streams.append([tok.token_to_id("</s>"), *tok.encode("after a special", add_special_tokens=False)])
    prompts = [tok.encode(rng.choice(MULTILINGUAL), add_special_tokens=False)[:5] for _ in streams]
    for skip in (True, False):
        one = [IncrementalDetokenizer(tok, p, skip_special_tokens=skip) for p in prompts]
        batched = [IncrementalDetokenizer(tok, p, skip_special_tokens=skip) for p in prompts]
        for step in range(max(map(len, streams))):
            live = [i for i, s in enumerate(streams) if step < len(s)]
            want = [one[i].append([streams[i][step]]) for i in live]
            got = IncrementalDetokenizer.append_each([batched[i] for i in live], [streams[i][step] for i in live])
            assert got == want
        assert [d.text + d.flush() for d in batched] == [d.text + d.flush() for d in one]
