"""The training script's cycles: resuming a saved checkpoint at a cycle boundary reproduces, bit for bit,
the run that was never interrupted (the committed default model was made that way), and a checkpoint of
another recipe is refused."""

from __future__ import annotations

import dataclasses
import sys
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("tokenizers")
pytest.importorskip("safetensors")

CHECKPOINTS = Path(__file__).resolve().parents[2] / "checkpoints"
sys.path.insert(0, str(CHECKPOINTS))

import stdlib_corpus as corpus  # noqa: E402
import train  # noqa: E402
from safetensors.numpy import load_file  # noqa: E402
from tiny_llama import TinyLlamaConfig  # noqa: E402


@pytest.fixture(scope="module")
def data():
    documents = corpus.read_documents(corpus.stdlib_files()[:4])
    tok = corpus.train_tokenizer(documents, 320)
    stream = corpus.encode_stream(tok, documents)
    train_stream, val = corpus.split_stream(stream, 0.3)
    return {"tokenizer": tok, "eot": tok.token_to_id(corpus.END_OF_TEXT), "train": train_stream, "val": val,
            "corpus_description": "four stdlib files"}


SPEC = train.TrainSpec(
    model=TinyLlamaConfig(vocab_size=320, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                          num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256),
    steps=3, cycles=2, peak_lr=3e-3, warmup_steps=1, batch_size=2, seq_len=32, copy_warmup_steps=2,
    induction_heads=((1, 0),))


def _weights(out: Path) -> dict:
    return load_file(str(out / "tiny" / "model.safetensors"))


def test_resume_after_a_cycle_equals_the_uninterrupted_run(data, tmp_path):
    whole = train.train_one("tiny", SPEC, SPEC.steps, data, tmp_path / "whole", seed=3)
    train.train_one("tiny", dataclasses.replace(SPEC, cycles=1), SPEC.steps, data, tmp_path / "split", seed=3)
    resumed = train.train_one("tiny", SPEC, SPEC.steps, data, tmp_path / "split", seed=3, resume=True)
    a, b = _weights(tmp_path / "whole"), _weights(tmp_path / "split")
    assert a.keys() == b.keys()
    for name in a:
        np.testing.assert_array_equal(a[name], b[name], err_msg=name)
    assert resumed["resumed_after_cycle"] == 1 and whole["resumed_after_cycle"] is None
    assert resumed["steps"] == whole["steps"] == 6
    assert resumed["val_loss"] == whole["val_loss"]


def test_resume_refuses_another_recipe_or_a_finished_run(data, tmp_path):
    train.train_one("tiny", dataclasses.replace(SPEC, cycles=1), SPEC.steps, data, tmp_path, seed=3)
    with pytest.raises(SystemExit, match="another recipe or seed"):
        train.train_one("tiny", dataclasses.replace(SPEC, peak_lr=1e-3), SPEC.steps, data, tmp_path, seed=3,
                        resume=True)
    with pytest.raises(SystemExit, match="another recipe or seed"):
        train.train_one("tiny", SPEC, SPEC.steps, data, tmp_path, seed=4, resume=True)
    with pytest.raises(SystemExit, match="cycles of"):  # nothing left to resume: one cycle of one
        train.train_one("tiny", dataclasses.replace(SPEC, cycles=1), SPEC.steps, data, tmp_path, seed=3,
                        resume=True)


def test_bad_cycle_settings_and_a_missing_checkpoint_are_refused_before_training(data, tmp_path):
    with pytest.raises(SystemExit, match="cycles and steps must be >= 1"):
        train.train_one("tiny", dataclasses.replace(SPEC, cycles=0), SPEC.steps, data, tmp_path, seed=3)
    with pytest.raises(SystemExit, match="nothing to resume"):
        train.train_one("tiny", SPEC, SPEC.steps, data, tmp_path / "empty", seed=3, resume=True)
