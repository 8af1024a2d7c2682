"""Text <-> token ids: an HF ``tokenizers`` wrapper, incremental detokenization, and stop strings.

* ``Tokenizer`` wraps ``tokenizers.Tokenizer`` loaded from ``tokenizer.json`` and knows the model's
  BOS / EOS ids (from ``generation_config.json``, ``config.json`` and ``tokenizer_config.json``).
* ``IncrementalDetokenizer`` turns a growing list of generated ids into text pieces, holding back
  bytes of a multi-byte UTF-8 character split across tokens (byte-level BPE) until it is complete.
  It decodes a short window (a few already-emitted tokens + the new ones) and emits the difference,
  so leading-space rules of the decoder see the same context as in a full decode.
* ``check_stop`` finds the first stop string in generated text, also one straddling two appends.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Iterable, Sequence

from tokenizers import Tokenizer as HFTokenizer

REPLACEMENT_CHAR = "\ufffd"  # what a decoder emits for an incomplete UTF-8 sequence
# Tokens of context re-decoded before the new ones (enough for decoders that look back one token).
CONTEXT_TOKENS = 5


def _read_json(path: Path) -> dict[str, Any]:
    if not path.is_file():
        return {}
    return json.loads(path.read_text(encoding="utf-8"))


def _as_id_list(value: Any) -> list[int]:
    if value is None:
        return []
    if isinstance(value, (list, tuple)):
        return [int(v) for v in value]
    return [int(value)]


def _token_content(value: Any) -> str | None:
    """tokenizer_config stores special tokens as a string or as ``{"content": ...}``."""
    if isinstance(value, dict):
        return value.get("content")
    return value if isinstance(value, str) else None


class Tokenizer:
    """Encode / decode with a fast HF tokenizer; carries the model's BOS and EOS token ids."""

    def __init__(
        self,
        hf_tokenizer: HFTokenizer,
        bos_token_id: int | None = None,
        eos_token_ids: Sequence[int] = (),
        add_bos_token: bool | None = None,
    ):
        self.hf_tokenizer = hf_tokenizer
        self.bos_token_id = bos_token_id
        self.eos_token_ids = tuple(eos_token_ids)
        # True: make sure encode() starts with BOS; None/False: trust the tokenizer's post-processor.
        self.add_bos_token = add_bos_token

    @property
    def eos_token_id(self) -> int | None:
        return self.eos_token_ids[0] if self.eos_token_ids else None

    @property
    def vocab_size(self) -> int:
        return self.hf_tokenizer.get_vocab_size(with_added_tokens=True)

    def token_to_id(self, token: str) -> int | None:
        return self.hf_tokenizer.token_to_id(token)

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        ids = list(self.hf_tokenizer.encode(text, add_special_tokens=add_special_tokens).ids)
        if add_special_tokens and self.add_bos_token and self.bos_token_id is not None:
            if not ids or ids[0] != self.bos_token_id:
                ids.insert(0, self.bos_token_id)
        return ids

    def decode(self, ids: Iterable[int], skip_special_tokens: bool = True) -> str:
        return self.hf_tokenizer.decode(list(ids), skip_special_tokens=skip_special_tokens)


def load_tokenizer(model_dir: str | Path) -> Tokenizer | None:
    """The tokenizer of an HF model directory, or None when it has no ``tokenizer.json``."""
    model_dir = Path(model_dir)
    path = model_dir / "tokenizer.json"
    if not path.is_file():
        return None
    hf = HFTokenizer.from_file(str(path))
    tok_cfg = _read_json(model_dir / "tokenizer_config.json")
    gen_cfg = _read_json(model_dir / "generation_config.json")
    model_cfg = _read_json(model_dir / "config.json")

    def special_id(key: str) -> list[int]:
        content = _token_content(tok_cfg.get(key))
        tid = hf.token_to_id(content) if content else None
        return [] if tid is None else [tid]

    eos: list[int] = []
    for candidate in (
        _as_id_list(gen_cfg.get("eos_token_id")),
        _as_id_list(model_cfg.get("eos_token_id")),
        special_id("eos_token"),
    ):
        eos.extend(i for i in candidate if i not in eos)
    bos_candidates = (
        _as_id_list(gen_cfg.get("bos_token_id"))
        + _as_id_list(model_cfg.get("bos_token_id"))
        + special_id("bos_token")
    )
    add_bos = tok_cfg.get("add_bos_token")
    return Tokenizer(
        hf,
        bos_token_id=bos_candidates[0] if bos_candidates else None,
        eos_token_ids=eos,
        add_bos_token=None if add_bos is None else bool(add_bos),
    )


class IncrementalDetokenizer:
    """Streams the text of generated tokens; ``"".join`` of all pieces equals ``decode(output_ids)``.

    ``prefix_offset:read_offset`` is the window of already-emitted tokens re-decoded for context;
    ``read_offset:`` are tokens whose text has not been emitted yet (held back while it ends in an
    incomplete UTF-8 character).
    """

    def __init__(self, tokenizer: Tokenizer, prompt_ids: Sequence[int], skip_special_tokens: bool = True):
        self.tokenizer = tokenizer
        self.skip_special_tokens = skip_special_tokens
        self.all_ids: list[int] = list(prompt_ids)
        self.num_prompt_ids = len(self.all_ids)
        self.read_offset = len(self.all_ids)
        self.prefix_offset = max(self.read_offset - CONTEXT_TOKENS, 0)
        self.text = ""  # all output text emitted so far

    @property
    def output_ids(self) -> list[int]:
        return self.all_ids[self.num_prompt_ids :]

    def _decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=self.skip_special_tokens)

    def append(self, token_ids: Iterable[int]) -> str:
        """Add generated ids; returns the newly completed text (possibly "")."""
        self.all_ids.extend(int(t) for t in token_ids)
        prefix_text = self._decode(self.all_ids[self.prefix_offset : self.read_offset])
        full_text = self._decode(self.all_ids[self.prefix_offset :])
        return self._emit(prefix_text, full_text)

    @staticmethod
    def append_each(detokenizers: list["IncrementalDetokenizer"], token_ids: list[int]) -> list[str]:
        """``append([t])`` of each detokenizer and its token, with one batched decode per window for all of
        them (the tokenizer's ``decode_batch``): what one engine step does for every sequence it advanced.
        All must share one tokenizer and ``skip_special_tokens``."""
        if not detokenizers:
            return []
        for d, t in zip(detokenizers, token_ids):
            d.all_ids.append(int(t))
        first = detokenizers[0]
        hf, skip = first.tokenizer.hf_tokenizer, first.skip_special_tokens
        prefixes = hf.decode_batch([d.all_ids[d.prefix_offset : d.read_offset] for d in detokenizers],
                                   skip_special_tokens=skip)
        fulls = hf.decode_batch([d.all_ids[d.prefix_offset :] for d in detokenizers], skip_special_tokens=skip)
        return [d._emit(p, f) for d, p, f in zip(detokenizers, prefixes, fulls)]

    def _emit(self, prefix_text: str, full_text: str) -> str:
        if len(full_text) <= len(prefix_text) or full_text.endswith(REPLACEMENT_CHAR):
            return ""  # nothing new yet, or a character is still incomplete
        new_text = full_text[len(prefix_text) :]
        self._advance()
        self.text += new_text
        return new_text

    def _advance(self) -> None:
        """Everything so far is emitted; keep the last few tokens as decoding context."""
        self.read_offset = len(self.all_ids)
        self.prefix_offset = max(self.read_offset - CONTEXT_TOKENS, 0)

    def flush(self) -> str:
        """Emit whatever is held back (incomplete characters decode as U+FFFD); call when finished."""
        prefix_text = self._decode(self.all_ids[self.prefix_offset : self.read_offset])
        full_text = self._decode(self.all_ids[self.prefix_offset :])
        new_text = full_text[len(prefix_text) :] if len(full_text) > len(prefix_text) else ""
        self._advance()
        self.text += new_text
        return new_text


def check_stop(
    text: str,
    stop_strings: Sequence[str],
    include_stop_str_in_output: bool = False,
    new_text_len: int | None = None,
) -> tuple[str, str | None]:
    """Find the earliest stop string in ``text``: ``(text cut at it, the stop string)``, else ``(text, None)``.

    The cut drops the stop string unless ``include_stop_str_in_output``. ``new_text_len``: how many
    characters at the end of ``text`` are new since the last check; the search then only looks where
    a match could end inside them (a stop string straddling old and new text is still found).
    """
    stops = [s for s in stop_strings if s]
    if not stops:
        return text, None
    best_pos, best_stop = -1, None
    for stop in stops:
        # with new_text_len: only a match that ends inside the new text (each stop string its own bound)
        start = 0 if new_text_len is None else max(0, len(text) - new_text_len - len(stop) + 1)
        pos = text.find(stop, start)
        if pos != -1 and (best_pos == -1 or pos < best_pos or (pos == best_pos and len(stop) > len(best_stop))):
            best_pos, best_stop = pos, stop
    if best_stop is None:
        return text, None
    end = best_pos + len(best_stop) if include_stop_str_in_output else best_pos
    return text[:end], best_stop
