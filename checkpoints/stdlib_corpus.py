"""Training text for the embedded checkpoints: the Python standard library's own sources.

Every machine with Python has them, offline. Files are the top-level ``*.py`` modules of
``sysconfig.get_paths()["stdlib"]`` in sorted order (~4.7 MB on CPython 3.11), joined by the end-of-text
token. The same text trains a byte-level BPE tokenizer (lossless on any UTF-8 text) and is then split by
token position into train (first 95%) and validation (last 5%) streams.

Training windows get repeated spans spliced in, and some rows are repeated random token strings
(``sample_batch``), so the model learns to copy what already appeared in its context: the behaviour
prompt-lookup speculative decoding relies on.
"""

from __future__ import annotations

import json
import sysconfig
from pathlib import Path

import numpy as np
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

END_OF_TEXT = "<|endoftext|>"


def stdlib_files() -> list[Path]:
    """The top-level modules of this interpreter's standard library, sorted by name."""
    return sorted(Path(sysconfig.get_paths()["stdlib"]).glob("*.py"))


def read_documents(files: list[Path]) -> list[str]:
    return [f.read_text(encoding="utf-8", errors="replace") for f in files]


def train_tokenizer(documents: list[str], vocab_size: int) -> Tokenizer:
    """Byte-level BPE (GPT-2 style pre-tokenisation, no normaliser) with ``<|endoftext|>`` as id 0."""
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=[END_OF_TEXT],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(documents, trainer=trainer, length=len(documents))
    return tok


def save_tokenizer(tok: Tokenizer, out_dir: Path, model_max_length: int) -> None:
    """``tokenizer.json`` plus a ``tokenizer_config.json`` that makes AutoTokenizer load it as-is."""
    out_dir.mkdir(parents=True, exist_ok=True)
    tok.save(str(out_dir / "tokenizer.json"))
    config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": END_OF_TEXT,
        "eos_token": END_OF_TEXT,
        "pad_token": END_OF_TEXT,
        "add_bos_token": False,
        "add_eos_token": False,
        "clean_up_tokenization_spaces": False,
        "model_max_length": model_max_length,
    }
    (out_dir / "tokenizer_config.json").write_text(json.dumps(config, indent=2) + "\n")


def encode_stream(tok: Tokenizer, documents: list[str]) -> np.ndarray:
    """All documents as one int32 token stream, each followed by the end-of-text id."""
    eot = tok.token_to_id(END_OF_TEXT)
    pieces = []
    for enc in tok.encode_batch(documents):
        pieces.append(np.asarray(enc.ids, dtype=np.int32))
        pieces.append(np.asarray([eot], dtype=np.int32))
    return np.concatenate(pieces)


def split_stream(stream: np.ndarray, val_fraction: float) -> tuple[np.ndarray, np.ndarray]:
    cut = int(len(stream) * (1.0 - val_fraction))
    return stream[:cut], stream[cut:]


def _splice_repeat(window: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """Make part of the window a verbatim copy of something earlier in it.

    Half the time the window becomes ``A + A + continuation-of-A`` (a passage, then the passage again);
    otherwise a random span is pasted over a later position inside otherwise natural text.
    """
    n = len(window)
    if rng.random() < 0.5:
        span = int(rng.integers(16, n // 2 + 1))
        return np.concatenate([window[:span], window[: n - span]])
    span = int(rng.integers(8, n // 3 + 1))
    src = int(rng.integers(0, n - 2 * span + 1))
    dst = int(rng.integers(src + span, n - span + 1))
    out = window.copy()
    out[dst : dst + span] = window[src : src + span]
    return out


def random_repeats(length: int, vocab_size: int, rng: np.random.Generator) -> np.ndarray:
    """A random string of 8-64 token ids (never end-of-text, id 0) repeated to fill ``length``.

    Nothing but copying predicts these after the first period, so they teach copying with a clean
    signal: no bigram statistics of real text compete with it.
    """
    period = int(rng.integers(8, 65))
    unit = rng.integers(1, vocab_size, size=period, dtype=np.int64).astype(np.int32)
    return np.tile(unit, length // period + 1)[:length]


def sample_batch(
    stream: np.ndarray,
    batch: int,
    length: int,
    repeat_fraction: float,
    rng: np.random.Generator,
    random_fraction: float = 0.0,
    vocab_size: int = 0,
) -> np.ndarray:
    """``[batch, length + 1]`` training rows.

    Each row is, with probability ``random_fraction``, a repeated random token string; otherwise a
    window of the stream, which with probability ``repeat_fraction`` carries a copied span.
    """
    rows = []
    for _ in range(batch):
        if rng.random() < random_fraction:
            rows.append(random_repeats(length + 1, vocab_size, rng))
            continue
        s = int(rng.integers(0, len(stream) - length - 1))
        window = stream[s : s + length + 1]
        rows.append(_splice_repeat(window, rng) if rng.random() < repeat_fraction else window)
    return np.stack(rows)
