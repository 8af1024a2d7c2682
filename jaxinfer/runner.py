"""The model runner: where host-side plans meet device-side arrays.

It owns the params, the paged KV cache and the jitted functions. ``execute(plan)`` packs the scheduler's
plan into a padded ``StepBatch`` (token/sequence/block counts rounded up to powers of two so that the set of
compiled shapes stays small), runs the jitted step with the cache donated, samples the sequences that reached
the end of their known tokens, and returns the sampled tokens to the host. Each distinct compiled signature
is counted in ``num_compilations``.
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np

from jaxinfer import sampler as sampler_lib
from jaxinfer.attention import get_attention_fn
from jaxinfer.batch import NULL_SLOT, StepBatch, bucket
from jaxinfer.config import ModelConfig
from jaxinfer.kv_cache import allocate_kv_cache
from jaxinfer.model import forward
from jaxinfer.scheduler import ScheduledSeq


def make_step_fn(cfg: ModelConfig, attention_backend: str = "xla", interpret: bool | None = None):
    """The jitted ragged step ``step(params, kv_cache, batch, max_q_len) -> (logits, kv_cache)``.

    ``kv_cache`` is donated and updated in place; ``max_q_len`` (static) bounds the longest query run
    for the XLA attention path.
    """

    def step(params, kv_cache, batch: StepBatch, max_q_len: int):
        attn_fn = get_attention_fn(
            attention_backend, max_q_len=max_q_len, sliding_window=cfg.sliding_window, interpret=interpret
        )
        return forward(params, kv_cache, batch, cfg, attn_fn)

    return jax.jit(step, donate_argnames="kv_cache", static_argnames="max_q_len")


@dataclasses.dataclass
class SampledToken:
    token_id: int
    logprob: float
    top_logprobs: dict[int, float]  # empty unless logprobs were requested


class ModelRunner:
    def __init__(
        self,
        cfg: ModelConfig,
        params,
        *,
        num_blocks: int,
        block_size: int,
        max_model_len: int,
        kv_dtype,
        attention_backend: str = "xla",
        interpret: bool | None = None,
        eos_token_ids: tuple[int, ...] = (),
    ):
        self.cfg = cfg
        self.eos_token_ids = tuple(eos_token_ids)
        self.params = params
        self.block_size = block_size
        self.max_blocks_per_seq = -(-max_model_len // block_size)
        self.kv_cache = allocate_kv_cache(cfg, num_blocks, block_size, kv_dtype)
        self.step_fn = make_step_fn(cfg, attention_backend, interpret)
        self.sample_fn = sampler_lib.sample  # jitted; static flags select cheap variants
        self._signatures: set = set()

    @property
    def num_compilations(self) -> int:
        return len(self._signatures)

    def _note(self, signature) -> None:
        self._signatures.add(signature)

    # ----------------------------------------------------------------- packing
    def build_batch(self, scheduled: list[ScheduledSeq]) -> tuple[StepBatch, int]:
        bs = self.block_size
        num_tokens = sum(s.num_new_tokens for s in scheduled)
        T = bucket(num_tokens, 8)
        S = bucket(len(scheduled))
        max_blocks = max(len(s.seq.block_ids) for s in scheduled)
        MB = min(bucket(max_blocks), bucket(self.max_blocks_per_seq))
        max_q = min(bucket(max(s.num_new_tokens for s in scheduled)), T)

        token_ids = np.zeros(T, np.int32)
        positions = np.zeros(T, np.int32)
        slot_mapping = np.full(T, NULL_SLOT, np.int32)
        block_tables = np.zeros((S, MB), np.int32)
        cu_q_lens = np.zeros(S + 1, np.int32)
        kv_lens = np.zeros(S, np.int32)
        logits_indices = np.zeros(S, np.int32)
        t = 0
        for i, s in enumerate(scheduled):
            seq, n = s.seq, s.num_new_tokens
            start = seq.num_computed_tokens
            token_ids[t : t + n] = seq.token_ids[start : start + n]
            pos = np.arange(start, start + n)
            positions[t : t + n] = pos
            blocks = np.asarray(seq.block_ids, np.int32)
            slot_mapping[t : t + n] = blocks[pos // bs] * bs + pos % bs
            block_tables[i, : len(blocks)] = blocks
            kv_lens[i] = start + n
            t += n
            cu_q_lens[i + 1] = t
            logits_indices[i] = t - 1
        cu_q_lens[len(scheduled) + 1 :] = t
        batch = StepBatch(
            token_ids=token_ids,
            positions=positions,
            slot_mapping=slot_mapping,
            block_tables=block_tables,
            cu_q_lens=cu_q_lens,
            kv_lens=kv_lens,
            logits_indices=logits_indices,
        )
        return jax.device_put(batch), max_q

    def build_sampling_metadata(self, scheduled: list[ScheduledSeq], num_rows: int):
        seqs = [s.seq for s in scheduled]
        params = [q.params for q in seqs]
        apply_penalties = any(p.has_penalties for p in params)
        all_greedy = all(p.greedy for p in params)
        truncation = any(p.top_k > 0 or p.top_p < 1.0 or p.min_p > 0.0 for p in params if not p.greedy)
        rows = num_rows

        def col(values, dtype, fill):
            arr = np.full(rows, fill, dtype)
            arr[: len(values)] = values
            return arr

        def id_matrix(lists):
            width = bucket(max((len(x) for x in lists), default=1), 8)
            mat = np.full((rows, width), -1, np.int32)
            for i, x in enumerate(lists):
                mat[i, : len(x)] = x
            return mat

        if apply_penalties:
            prompt_ids = id_matrix([q.token_ids[: q.num_prompt_tokens] for q in seqs])
            output_ids = id_matrix([q.output_token_ids for q in seqs])
        else:
            prompt_ids = np.full((rows, 1), -1, np.int32)
            output_ids = np.full((rows, 1), -1, np.int32)
        banned = id_matrix([self._banned_ids(q) for q in seqs])
        md = sampler_lib.SamplingMetadata(
            temperature=col([p.temperature for p in params], np.float32, 0.0),
            top_k=col([p.top_k for p in params], np.int32, 0),
            top_p=col([p.top_p for p in params], np.float32, 1.0),
            min_p=col([p.min_p for p in params], np.float32, 0.0),
            presence_penalty=col([p.presence_penalty for p in params], np.float32, 0.0),
            frequency_penalty=col([p.frequency_penalty for p in params], np.float32, 0.0),
            repetition_penalty=col([p.repetition_penalty for p in params], np.float32, 1.0),
            seeds=col([q.seed for q in seqs], np.uint32, 0),
            steps=col([q.num_output_tokens for q in seqs], np.int32, 0),
            prompt_token_ids=prompt_ids,
            output_token_ids=output_ids,
            banned_token_ids=banned,
        )
        return jax.device_put(md), apply_penalties, all_greedy, truncation

    def _banned_ids(self, seq) -> list[int]:
        p = seq.params
        if seq.num_output_tokens >= p.min_tokens:
            return []
        ids = list(p.stop_token_ids)
        if not p.ignore_eos:
            ids += list(self.eos_token_ids)
        return ids

    # --------------------------------------------------------------- executing
    def execute(self, scheduled: list[ScheduledSeq]) -> dict[int, SampledToken]:
        """Run one step; return the sampled token for every sequence that reached its end (by seq_id)."""
        batch, max_q = self.build_batch(scheduled)
        self._note(("step", batch.token_ids.shape[0], batch.kv_lens.shape[0], batch.block_tables.shape[1], max_q))
        logits, self.kv_cache = self.step_fn(self.params, self.kv_cache, batch, max_q)
        sampling = [s for s in scheduled if s.samples]
        if not sampling:
            return {}
        num_rows = logits.shape[0]
        md, apply_penalties, all_greedy, truncation = self.build_sampling_metadata(scheduled, num_rows)
        num_logprobs = max((s.seq.params.logprobs or 0) for s in scheduled)
        self._note(
            ("sample", num_rows, md.prompt_token_ids.shape[1], md.output_token_ids.shape[1],
             md.banned_token_ids.shape[1], num_logprobs, apply_penalties, all_greedy, truncation)
        )
        out = self.sample_fn(
            logits, md, num_logprobs=num_logprobs, apply_penalties=apply_penalties, all_greedy=all_greedy,
            apply_truncation=truncation,
        )
        tokens, logprobs, top_ids, top_lps = jax.device_get(
            (out.tokens, out.logprobs, out.topk_ids, out.topk_logprobs)
        )
        result = {}
        for i, s in enumerate(scheduled):
            if not s.samples:
                continue
            k = s.seq.params.logprobs or 0
            top = {int(top_ids[i, j]): float(top_lps[i, j]) for j in range(k)}
            result[s.seq.seq_id] = SampledToken(int(tokens[i]), float(logprobs[i]), top)
        return result
