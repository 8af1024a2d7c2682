"""The grammar backend: llguidance compiles each constraint for the model's tokenizer once, then hands every
constrained sequence its own matcher.

Why llguidance (measured in ``bench/structured/mask_cost.py``): its Rust core computes a token mask in tens of
microseconds on a 4k vocabulary, builds no per-schema index up front (outlines-core's index over a 150k
vocabulary takes seconds per schema), supports the JSON-schema features clients send (``pattern``, ``format``,
``anyOf``, ``$ref``), and installs as one 7.6 MB wheel with no Python dependencies (xgrammar would pull torch,
transformers and triton into a JAX engine).

A constraint compiles to llguidance's grammar text; an invalid schema, regex or grammar is a ``ValueError``
naming the problem, raised before the request is queued. Compiled grammars are kept (an LRU of
``cache_size``), so a server receiving the same schema again does not recompile it.
"""

from __future__ import annotations

import collections
import json
import re
import time
from typing import Any, Iterable

from jaxinfer.sampling_params import StructuredOutputsParams
from jaxinfer.structured.matcher import GrammarMatcher, MaskTime

_GBNF_RULE = re.compile(r"^\s*[A-Za-z][\w-]*\s*::=", re.MULTILINE)  # a rule line of a GBNF grammar
INSTALL_HINT = "structured outputs need llguidance: pip install 'jaxinfer[structured]' (or pip install llguidance)"


def _llguidance():
    try:
        import llguidance
    except ImportError as exc:  # an optional dependency: say how to get it
        raise ImportError(INSTALL_HINT) from exc
    return llguidance


def bitmask_words(vocab_size: int) -> int:
    """int32 words of one row of a token bitmask (bit ``t % 32`` of word ``t // 32`` is token t)."""
    return -(-vocab_size // 32)


class GrammarBackend:
    """Compiles constraints and creates matchers for one tokenizer.

    ``tokenizer_json``: the HF ``tokenizer.json`` text; ``vocab_size``: the model's (its logits' width, which
    may exceed the tokenizer's: the extra ids are never allowed); ``eos_token_ids``: allowed exactly when the
    grammar accepts. ``whitespace_pattern``: the default regex of whitespace inside JSON (None: none at all,
    compact JSON)."""

    def __init__(self, tokenizer_json: str, vocab_size: int, eos_token_ids: Iterable[int],
                 whitespace_pattern: str | None = None, cache_size: int = 256):
        llg = _llguidance()
        self._llg = llg
        self.eos_token_ids = tuple(int(t) for t in eos_token_ids)
        if not self.eos_token_ids:
            raise ValueError("structured outputs need an EOS token (the grammar allows it where the output is complete)")
        self.tokenizer = llg.LLTokenizer(tokenizer_json, eos_token=list(self.eos_token_ids))
        self.num_tokens = max(vocab_size, self.tokenizer.vocab_size)  # llguidance's vocabulary: ids it may allow
        if self.num_tokens != self.tokenizer.vocab_size:
            self.tokenizer = llg.LLTokenizer(tokenizer_json, n_vocab=self.num_tokens, eos_token=list(self.eos_token_ids))
        self.vocab_size = vocab_size
        self.words = bitmask_words(self.num_tokens)
        self.whitespace_pattern = whitespace_pattern
        self._executor = None  # llguidance's thread pool, created on the first batched fill (most engines never fill)
        self.mask_time = MaskTime()  # host time its masks took (engine stats: structured_mask_seconds)
        self._cache: collections.OrderedDict[Any, str] = collections.OrderedDict()
        self._cache_size = cache_size

    @classmethod
    def for_tokenizer(cls, tokenizer, vocab_size: int, eos_token_ids, **kwargs) -> "GrammarBackend":
        """The backend of a ``jaxinfer.core.tokenizer.Tokenizer``."""
        return cls(tokenizer.hf_tokenizer.to_str(), vocab_size, eos_token_ids, **kwargs)

    # ----------------------------------------------------------- compiling
    def compile(self, so: StructuredOutputsParams) -> str:
        """llguidance's grammar text for ``so``, checked against this tokenizer; ValueError if it is invalid."""
        key = self._key(so)
        grammar = self._cache.get(key)
        if grammar is not None:
            self._cache.move_to_end(key)
            return grammar
        grammar = self._grammar_text(so)
        error = self._llg.LLMatcher.validate_grammar(grammar, self.tokenizer)
        if error:
            raise ValueError(f"structured_outputs.{so.kind} does not compile: {error.strip()}")
        self._cache[key] = grammar
        if len(self._cache) > self._cache_size:
            self._cache.popitem(last=False)
        return grammar

    def _key(self, so: StructuredOutputsParams):
        value = getattr(so, so.kind)
        if isinstance(value, dict):
            value = json.dumps(value, sort_keys=True)
        return so.kind, value, so.whitespace_pattern

    def _json_options(self, so: StructuredOutputsParams) -> dict:
        pattern = so.whitespace_pattern or self.whitespace_pattern
        if pattern is None:
            return {"whitespace_flexible": False}
        return {"whitespace_flexible": True, "whitespace_pattern": pattern}

    def _grammar_text(self, so: StructuredOutputsParams) -> str:
        llm = self._llg.LLMatcher
        kind = so.kind
        try:
            if kind == "json":
                schema = so.json
                if isinstance(schema, str):
                    try:
                        schema = json.loads(schema)
                    except json.JSONDecodeError as exc:
                        raise ValueError(f"structured_outputs.json is not valid JSON: {exc}") from None
                if not isinstance(schema, (dict, bool)):
                    raise ValueError("structured_outputs.json must be a JSON schema object")
                return llm.grammar_from_json_schema(schema, defaults=self._json_options(so))
            if kind == "json_object":
                return llm.grammar_from_json_schema({"type": "object"}, defaults=self._json_options(so))
            if kind == "regex":
                return llm.grammar_from_regex(so.regex)
            if kind == "choice":
                return llm.grammar_from_lark("start: " + " | ".join(_lark_string(c) for c in so.choice))
            grammar = so.grammar
            if _GBNF_RULE.search(grammar):  # GBNF (llama.cpp's notation): llguidance converts it
                from llguidance.gbnf_to_lark import gbnf_to_lark

                grammar = gbnf_to_lark(grammar)
            return llm.grammar_from_lark(grammar)
        except ValueError as exc:
            if str(exc).startswith("structured_outputs"):
                raise
            raise ValueError(f"structured_outputs.{kind} does not compile: {exc}") from None

    # ------------------------------------------------------------- matchers
    def matcher(self, grammar: str) -> GrammarMatcher:
        """A fresh matcher of a compiled grammar (one per sequence)."""
        m = self._llg.LLMatcher(self.tokenizer, grammar, log_level=0)
        if m.is_error():
            raise ValueError(f"structured_outputs does not compile: {m.get_error()}")
        return GrammarMatcher(m, self.words, self.eos_token_ids, self.mask_time)

    def fill_bitmasks(self, matchers: list[GrammarMatcher | None], bitmask) -> None:
        """Row r of ``bitmask`` (int32 [rows, words], all bits set on entry) <- the tokens ``matchers[r]`` allows
        next (None: the row is free). Masks a matcher computed already are copied, the others computed in
        parallel by llguidance's thread pool (the GIL released)."""
        todo = []
        for row, m in enumerate(matchers):
            if m is None:
                continue
            cached = m.cached_mask()
            if cached is not None:
                bitmask[row] = cached
            else:
                todo.append((m.ll_matcher, row))
        if todo:
            t = time.perf_counter()
            if self._executor is None:
                self._executor = self._llg.LLExecutor()
            self._executor.unsafe_compute_mask_ptr(todo, bitmask.ctypes.data, self.words * 4, bitmask.shape[0])
            self.mask_time.add(time.perf_counter() - t, len(todo))


def _lark_string(text: str) -> str:
    """``text`` as a Lark string literal (JSON's escapes are Lark's)."""
    return json.dumps(text, ensure_ascii=False)
