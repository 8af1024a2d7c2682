"""The token chooser's host-side inputs: which compiled variant a step's rows need (``choose_variant``) and
their per-row sampling parameters as numpy arrays (``sampling_metadata``), with the id matrices of the
variant's fixed widths (prompt and output ids for penalties, the ids banned until ``min_tokens``)."""

from __future__ import annotations

import numpy as np

from jaxinfer.runner.shape_plan import SamplerVariant
from jaxinfer.sample.sampler import SamplingMetadata


def choose_variant(params: list, max_logprobs: int, masked: bool = False) -> SamplerVariant:
    """The cheapest compiled token chooser that serves every row's parameters exactly: greedy rows without
    penalties or logprobs take the argmax path; anything else the general one (penalties cost nothing
    measurable when zero: CPU, 4,096-token vocabulary, 1-64 rows). ``masked``: some row is constrained (its
    variant applies a token bitmask)."""
    if all(p.greedy and not p.has_penalties and p.logprobs is None for p in params):
        return SamplerVariant(greedy=True, num_logprobs=0, penalties=False, masked=masked)
    return SamplerVariant(greedy=False, num_logprobs=max_logprobs, penalties=True, masked=masked)


def sampling_metadata(rows: list[tuple], num_rows: int, variant: SamplerVariant, max_model_len: int,
                      banned_width: int, eos_token_ids: tuple[int, ...]) -> SamplingMetadata:
    """Per-row sampling parameters as numpy arrays. ``rows``: (sequence, index of the token sampled at this
    row); ``num_rows`` the padded row count. The penalties variant carries prompt and output ids
    ``max_model_len`` wide (the others one column), the banned ids ``banned_width`` wide."""
    seqs = [q for q, _ in rows]
    params = [q.params for q in seqs]

    def col(values, dtype, fill):
        arr = np.full(num_rows, fill, dtype)
        arr[: len(values)] = values
        return arr

    def id_matrix(lists, width):
        mat = np.full((num_rows, width), -1, np.int32)
        for i, x in enumerate(lists):
            mat[i, : len(x)] = x
        return mat

    if variant.penalties:
        prompt_ids = id_matrix([q.token_ids[: q.num_prompt_tokens] for q in seqs], max_model_len)
        output_ids = id_matrix([q.output_token_ids for q in seqs], max_model_len)
    else:
        prompt_ids = output_ids = np.full((num_rows, 1), -1, np.int32)
    banned = id_matrix([banned_ids(q, step, eos_token_ids) for q, step in rows], banned_width)
    return SamplingMetadata(
        temperature=col([p.temperature for p in params], np.float32, 0.0),
        top_k=col([p.top_k for p in params], np.int32, 0),
        top_p=col([p.top_p for p in params], np.float32, 1.0),
        min_p=col([p.min_p for p in params], np.float32, 0.0),
        presence_penalty=col([p.presence_penalty for p in params], np.float32, 0.0),
        frequency_penalty=col([p.frequency_penalty for p in params], np.float32, 0.0),
        repetition_penalty=col([p.repetition_penalty for p in params], np.float32, 1.0),
        seeds=col([q.seed for q in seqs], np.uint32, 0),
        steps=col([step for _, step in rows], np.int32, 0),
        prompt_token_ids=prompt_ids,
        output_token_ids=output_ids,
        banned_token_ids=banned,
    )  # numpy arrays: a compiled call transfers them in microseconds; device_put of the pytree ~0.2 ms


def banned_ids(seq, step: int, eos_token_ids: tuple[int, ...]) -> list[int]:
    """The ids a row may not sample: its stop ids and (unless ``ignore_eos``) EOS, until ``min_tokens``."""
    p = seq.params
    if step >= p.min_tokens:
        return []
    ids = list(p.stop_token_ids)
    if not p.ignore_eos:
        ids += list(eos_token_ids)
    return ids
