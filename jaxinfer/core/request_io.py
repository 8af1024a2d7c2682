"""A request's way in and out of the engine, without JAX: prompt validation (``process_prompt``,
``validate_request``), the stop conditions applied to each emitted token (``append_token``), and the
``RequestOutput`` built from a request's sequences (``make_output``).

Every check runs before anything is queued, so a bad request is refused with a ``ValueError`` and the engine
keeps serving everyone else.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np

from jaxinfer.core.sequence import Sequence
from jaxinfer.core.tokenizer import check_stop
from jaxinfer.outputs import CompletionOutput, RequestMetrics, RequestOutput
from jaxinfer.sampling_params import SamplingParams


@dataclasses.dataclass(frozen=True)
class RequestLimits:
    """What a request is checked against: the model's vocabulary and context, its EOS ids, the width of the
    matrix of ids banned until ``min_tokens``, and its tokenizer (None: token ids only)."""

    vocab_size: int
    max_model_len: int
    eos_token_ids: tuple[int, ...]
    banned_width: int
    tokenizer: Any = None


@dataclasses.dataclass
class EngineRequest:
    """A request inside the engine: its prompt, parameters, ``n`` sequences and metrics."""

    request_id: str
    prompt: str | None
    prompt_token_ids: list[int]
    params: SamplingParams
    seqs: list[Sequence]
    metrics: RequestMetrics
    aborted: bool = False

    @property
    def finished(self) -> bool:
        return all(s.is_finished for s in self.seqs)


def check_prompt_ids(ids: list[int], limits: RequestLimits) -> None:
    if not ids:
        raise ValueError("the prompt is empty")
    bad = [i for i in ids if i < 0 or i >= limits.vocab_size]
    if bad:
        raise ValueError(f"prompt token ids out of range [0, {limits.vocab_size}): {bad[:5]}")
    if len(ids) >= limits.max_model_len:
        raise ValueError(
            f"the prompt has {len(ids)} tokens but max_model_len is {limits.max_model_len} "
            "(at least one token must be generated)"
        )


def process_prompt(prompt: Any, limits: RequestLimits) -> tuple[str | None, list[int]]:
    """Turn a prompt (str, {"prompt": str} or {"prompt_token_ids": [...]}) into (text, ids), validated."""
    if isinstance(prompt, dict):
        unknown = set(prompt) - {"prompt", "prompt_token_ids"}
        if unknown or len(prompt) != 1:
            raise ValueError(
                f"a dict prompt must have exactly one of 'prompt' or 'prompt_token_ids', got keys {sorted(prompt)}"
            )
        if "prompt" in prompt:
            prompt = prompt["prompt"]
        else:
            ids = prompt["prompt_token_ids"]
            if isinstance(ids, np.ndarray):
                ids = ids.tolist()
            if not isinstance(ids, (list, tuple)) or not all(
                isinstance(i, (int, np.integer)) and not isinstance(i, bool) for i in ids
            ):
                raise ValueError("prompt_token_ids must be a list of ints")
            ids = [int(i) for i in ids]
            check_prompt_ids(ids, limits)
            return None, ids
    if isinstance(prompt, str):
        if limits.tokenizer is None:
            raise ValueError(
                "this model has no tokenizer (no tokenizer.json): pass {'prompt_token_ids': [...]} instead of text"
            )
        ids = limits.tokenizer.encode(prompt)
        check_prompt_ids(ids, limits)
        return prompt, ids
    raise ValueError(
        f"a prompt must be a str, {{'prompt': str}} or {{'prompt_token_ids': list[int]}}, got {type(prompt).__name__}"
    )


def validate_request(prompt: Any, params: SamplingParams, limits: RequestLimits) -> tuple[str | None, list[int]]:
    """(text, ids) of a request the engine can run, or ValueError saying why not."""
    if not isinstance(params, SamplingParams):
        raise ValueError(f"params must be a SamplingParams, got {type(params).__name__}")
    text, ids = process_prompt(prompt, limits)
    if params.max_tokens is not None and len(ids) + params.max_tokens > limits.max_model_len:
        raise ValueError(
            f"prompt ({len(ids)} tokens) + max_tokens ({params.max_tokens}) exceeds max_model_len "
            f"({limits.max_model_len})"
        )
    if params.min_tokens and len(params.stop_token_ids) + len(limits.eos_token_ids) > limits.banned_width:
        raise ValueError(
            f"with min_tokens, at most {limits.banned_width - len(limits.eos_token_ids)} stop_token_ids can be "
            f"banned until min_tokens is reached; got {len(params.stop_token_ids)}"
        )
    if params.stop and limits.tokenizer is None:
        raise ValueError("stop strings need a tokenizer; this model has none (use stop_token_ids)")
    return text, ids


def append_token(seq: Sequence, tok, now: float, eos_token_ids, max_model_len: int,
                 new_text: str | None = None) -> bool:
    """Append one emitted token (a ``SampledToken``), apply the stop conditions; True when the sequence
    finished (its finish_reason, stop_reason and finished_time are then set). ``new_text``: the text the
    token completes, when the caller has already run the sequence's detokenizer on it (a batched step)."""
    p = seq.params
    seq.token_ids.append(tok.token_id)
    if seq.first_token_time is None:
        seq.first_token_time = now
    seq.cumulative_logprob += tok.logprob
    if p.logprobs is not None:
        entry = {tok.token_id: tok.logprob}
        entry.update({k: v for k, v in tok.top_logprobs.items() if k != tok.token_id})
        seq.logprobs.append(entry)
    if new_text is None:
        new_text = seq.detokenizer.append([tok.token_id]) if seq.detokenizer is not None else ""
    if new_text:
        seq.text += new_text
    n_out = seq.num_output_tokens
    reason = stop_reason = None
    if n_out >= p.min_tokens:
        if not p.ignore_eos and tok.token_id in eos_token_ids:
            reason = "stop"
        elif tok.token_id in p.stop_token_ids:
            reason, stop_reason = "stop", tok.token_id
        elif p.stop and new_text:  # only matches that end in the new text (earlier text was checked, or
            # was generated before min_tokens and must not stop the sequence now)
            text, matched = check_stop(seq.text, p.stop, p.include_stop_str_in_output, len(new_text))
            if matched is not None:
                seq.text, reason, stop_reason = text, "stop", matched
    if reason is None and (
        (p.max_tokens is not None and n_out >= p.max_tokens) or len(seq.token_ids) >= max_model_len
    ):
        reason = "length"
    if reason is None:
        return False
    if seq.detokenizer is not None and not isinstance(stop_reason, str):
        seq.text += seq.detokenizer.flush()  # bytes held back for an incomplete character
    seq.finish_reason, seq.stop_reason = reason, stop_reason
    seq.finished_time = now
    return True


def make_output(req: EngineRequest) -> RequestOutput:
    """The request's ``RequestOutput`` as of now (one ``CompletionOutput`` per sequence)."""
    completions = [
        CompletionOutput(
            index=s.sample_index,
            text=s.text,
            token_ids=list(s.output_token_ids),
            logprobs=list(s.logprobs) if req.params.logprobs is not None else None,
            finish_reason=s.finish_reason,
            stop_reason=s.stop_reason,
            cumulative_logprob=s.cumulative_logprob,
        )
        for s in req.seqs
    ]
    req.metrics.num_cached_tokens = req.seqs[0].num_cached_tokens
    return RequestOutput(
        request_id=req.request_id,
        prompt=req.prompt,
        prompt_token_ids=req.prompt_token_ids,
        outputs=completions,
        finished=req.finished,
        metrics=req.metrics,
        num_cached_tokens=req.metrics.num_cached_tokens,
        prompt_logprobs=prompt_logprobs_list(req),
    )


def prompt_logprobs_list(req: EngineRequest) -> list | None:
    """``RequestOutput.prompt_logprobs``: None unless asked; else None for the first prompt token, then each
    later token's entry (complete once a token was generated: a sequence computes its whole prompt, or finds
    every entry there, before it samples)."""
    if req.params.prompt_logprobs is None:
        return None
    entries = req.seqs[0].prompt_logprobs
    return [None] + [entries.get(i) for i in range(1, len(req.prompt_token_ids))]
