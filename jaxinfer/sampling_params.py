"""SamplingParams: how to pick each next token and when to stop (vLLM's names and defaults).

Everything is validated at construction, so a request that cannot be honoured is refused before it is
queued. Host side: no JAX.

``logprobs=k`` returns, per generated token, its logprob and the k most probable tokens';
``prompt_logprobs=k`` the same for every prompt token after the first (``RequestOutput.prompt_logprobs``;
such a request computes its whole prompt: the prefix cache holds K/V, not logits). Both are at most
``MAX_LOGPROBS`` and both read the raw model distribution (with ``structured_outputs``: the constrained one,
every token the grammar forbids at -inf).

``structured_outputs=StructuredOutputsParams(...)`` constrains the output to a JSON schema, any JSON object, a
regular expression, one of several strings, or a Lark grammar (vLLM's names). The type of each field is checked
here; whether the schema, regex or grammar compiles is checked when the request is added (``LLMEngine``
compiles it with the model's tokenizer: an invalid one is a ``ValueError`` naming the problem, nothing queued).
"""

from __future__ import annotations

import dataclasses
import math

MAX_LOGPROBS = 20  # the most top logprobs ``logprobs`` and ``prompt_logprobs`` may ask for
STRUCTURED_KINDS = ("json", "json_object", "regex", "choice", "grammar")
OUTPUT_KINDS = ("cumulative", "final_only")


@dataclasses.dataclass(frozen=True)
class StructuredOutputsParams:
    """One constraint on the output (exactly one field set), as vLLM's ``StructuredOutputsParams``:

    * ``json``: a JSON schema (a dict, or its JSON text): the output is one JSON value that validates;
    * ``json_object=True``: the output is a JSON object (any);
    * ``regex``: the output matches the regular expression (Rust ``regex`` syntax, anchored at both ends);
    * ``choice``: the output is exactly one of these strings;
    * ``grammar``: a Lark grammar (llguidance's dialect, which may embed ``%json {...}``), or a GBNF one
      (``::=`` rules, as llama.cpp writes them), converted to Lark.

    ``whitespace_pattern``: for ``json`` / ``json_object``, the regex of the whitespace allowed between tokens
    (None: the engine's default, see ``EngineConfig.structured_outputs_config``).
    """

    json: dict | str | None = None
    regex: str | None = None
    choice: list[str] | tuple[str, ...] | None = None
    grammar: str | None = None
    json_object: bool | None = None
    whitespace_pattern: str | None = None

    def __post_init__(self):
        given = [k for k in STRUCTURED_KINDS if getattr(self, k) not in (None, False)]
        if len(given) != 1:
            raise ValueError("structured_outputs needs exactly one of json, json_object, regex, choice, grammar; "
                             f"got {given or 'none'}")
        if self.json is not None and not isinstance(self.json, (dict, str)):
            raise ValueError(f"structured_outputs.json must be a JSON schema (dict or str), got {type(self.json).__name__}")
        for name in ("regex", "grammar", "whitespace_pattern"):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, str) or not value):
                raise ValueError(f"structured_outputs.{name} must be a non-empty string, got {value!r}")
        if self.json_object not in (None, True, False):
            raise ValueError(f"structured_outputs.json_object must be a bool, got {self.json_object!r}")
        if self.choice is not None:
            if not isinstance(self.choice, (list, tuple)) or not self.choice or \
                    not all(isinstance(c, str) and c for c in self.choice):
                raise ValueError(f"structured_outputs.choice must be a non-empty list of non-empty strings, "
                                 f"got {self.choice!r}")
            object.__setattr__(self, "choice", tuple(self.choice))

    @property
    def kind(self) -> str:
        """Which constraint: "json", "json_object", "regex", "choice" or "grammar"."""
        return next(k for k in STRUCTURED_KINDS if getattr(self, k) not in (None, False))


@dataclasses.dataclass(frozen=True)
class SamplingParams:
    n: int = 1
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0  # 0 or -1: disabled
    min_p: float = 0.0
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0
    seed: int | None = None
    max_tokens: int | None = 16  # None: up to max_model_len
    min_tokens: int = 0
    stop: str | list[str] | tuple[str, ...] | None = None
    stop_token_ids: list[int] | tuple[int, ...] | None = None
    ignore_eos: bool = False
    include_stop_str_in_output: bool = False
    logprobs: int | None = None  # number of top logprobs besides the sampled token's
    prompt_logprobs: int | None = None  # top logprobs besides the prompt token's, at every prompt position
    skip_special_tokens: bool = True
    structured_outputs: StructuredOutputsParams | None = None
    # vLLM's RequestOutputKind: "cumulative" = a RequestOutput after every step that emitted tokens (the whole
    # output so far); "final_only" = one when the request finishes (what LLM.generate asks for: no per-step cost)
    output_kind: str = "cumulative"

    def __post_init__(self):
        _check_int("n", self.n, lo=1)
        if self.output_kind not in OUTPUT_KINDS:
            raise ValueError(f"output_kind must be one of {OUTPUT_KINDS}, got {self.output_kind!r}")
        _check_float("temperature", self.temperature, lo=0.0)
        _check_float("top_p", self.top_p, lo=0.0, lo_open=True, hi=1.0)
        _check_int("top_k", self.top_k, lo=-1)
        _check_float("min_p", self.min_p, lo=0.0, hi=1.0)
        _check_float("presence_penalty", self.presence_penalty, lo=-2.0, hi=2.0)
        _check_float("frequency_penalty", self.frequency_penalty, lo=-2.0, hi=2.0)
        _check_float("repetition_penalty", self.repetition_penalty, lo=0.0, lo_open=True)
        if self.seed is not None:
            _check_int("seed", self.seed, lo=0, hi=2**32 - 1)
        if self.max_tokens is not None:
            _check_int("max_tokens", self.max_tokens, lo=1)
        _check_int("min_tokens", self.min_tokens, lo=0)
        if self.max_tokens is not None and self.min_tokens > self.max_tokens:
            raise ValueError(f"min_tokens ({self.min_tokens}) must be <= max_tokens ({self.max_tokens})")
        if self.logprobs is not None:
            _check_int("logprobs", self.logprobs, lo=0, hi=MAX_LOGPROBS)
        if self.prompt_logprobs is not None:
            _check_int("prompt_logprobs", self.prompt_logprobs, lo=0, hi=MAX_LOGPROBS)
        stop = self.stop
        if stop is None:
            stop = ()
        elif isinstance(stop, str):
            stop = (stop,)
        elif isinstance(stop, (list, tuple)) and all(isinstance(s, str) for s in stop):
            stop = tuple(stop)
        else:
            raise ValueError(f"stop must be a string or a list of strings, got {self.stop!r}")
        if any(s == "" for s in stop):
            raise ValueError("stop strings must be non-empty")
        object.__setattr__(self, "stop", stop)
        ids = self.stop_token_ids or ()
        if not isinstance(ids, (list, tuple)) or not all(_is_int(i) and i >= 0 for i in ids):
            raise ValueError(f"stop_token_ids must be a list of non-negative ints, got {self.stop_token_ids!r}")
        object.__setattr__(self, "stop_token_ids", tuple(int(i) for i in ids))
        for name in ("ignore_eos", "include_stop_str_in_output", "skip_special_tokens"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"{name} must be a bool, got {getattr(self, name)!r}")
        so = self.structured_outputs
        if so is not None:
            if not isinstance(so, StructuredOutputsParams):
                raise ValueError(f"structured_outputs must be a StructuredOutputsParams, got {type(so).__name__}")
            # the grammar decides where the output ends: EOS is allowed exactly when it accepts
            if self.ignore_eos:
                raise ValueError("ignore_eos cannot be combined with structured_outputs (the grammar allows EOS "
                                 "exactly when the output is complete)")
            if self.min_tokens:
                raise ValueError("min_tokens cannot be combined with structured_outputs (a complete output may be "
                                 "shorter; the grammar decides where it ends)")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0

    @property
    def has_penalties(self) -> bool:
        return self.presence_penalty != 0 or self.frequency_penalty != 0 or self.repetition_penalty != 1.0


def _is_int(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _check_int(name, v, lo=None, hi=None):
    if not _is_int(v):
        raise ValueError(f"{name} must be an int, got {v!r}")
    if (lo is not None and v < lo) or (hi is not None and v > hi):
        raise ValueError(f"{name} must be in [{lo}, {hi if hi is not None else 'inf'}], got {v}")


def _check_float(name, v, lo=None, hi=None, lo_open=False):
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        raise ValueError(f"{name} must be a number, got {v!r}")
    if math.isnan(v) or math.isinf(v):
        raise ValueError(f"{name} must be finite, got {v}")
    if lo is not None and (v < lo or (lo_open and v == lo)):
        raise ValueError(f"{name} must be {'>' if lo_open else '>='} {lo}, got {v}")
    if hi is not None and v > hi:
        raise ValueError(f"{name} must be <= {hi}, got {v}")
