"""The model runner: where host-side plans meet device-side arrays.

It owns the params, the paged KV cache and the jitted functions. ``execute(plan)`` plans the step's shape
(token/sequence/block counts rounded up to buckets so that the set of compiled shapes stays small),
takes an executable for it from ``StepExecutables`` (which may hand out a larger compiled shape while the
exact one compiles in the background), packs the plan into a padded ``StepBatch``, runs the step with the
cache donated, samples the sequences that reached the end of their known tokens, and returns the sampled
tokens to the host. Every compiled step shape and sampler signature is counted in ``num_compilations``.
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np

from jaxinfer import sampler as sampler_lib
from jaxinfer.attention import get_attention_fn
from jaxinfer.batch import StepBatch, bucket
from jaxinfer.batch_packing import StepShape, WorkItem, pack, plan_shape
from jaxinfer import rejection_sampler
from jaxinfer.config import ModelConfig
from jaxinfer.kv_cache import allocate_kv_cache
from jaxinfer.model import forward
from jaxinfer.scheduler import ScheduledSeq
from jaxinfer.step_executables import StepExecutables


def make_step_fn(cfg: ModelConfig, attention_backend: str = "xla", interpret: bool | None = None):
    """The jitted ragged step ``step(params, kv_cache, batch, max_q_len) -> (logits, kv_cache)``.

    ``kv_cache`` is donated and updated in place; ``max_q_len`` (static) bounds the longest query run and
    ``num_prefill_slots`` (static) says how many leading sequence slots may have more than one query (the
    rest are single-token decodes), both for the XLA attention path.
    """

    def step(params, kv_cache, batch: StepBatch, max_q_len: int, num_prefill_slots: int | None = None):
        attn_fn = get_attention_fn(
            attention_backend, max_q_len=max_q_len, sliding_window=cfg.sliding_window, interpret=interpret,
            num_prefill_slots=num_prefill_slots,
        )
        return forward(params, kv_cache, batch, cfg, attn_fn)

    return jax.jit(step, donate_argnames="kv_cache", static_argnames=("max_q_len", "num_prefill_slots"))


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
        query_width: int | None = None,
        background_compilation: bool = True,
    ):
        self.cfg = cfg
        self.eos_token_ids = tuple(eos_token_ids)
        self.params = params
        self.block_size = block_size
        self.query_width = query_width  # 1 + k under speculation: verification steps get one shape per batch
        self.attention_backend, self.interpret = attention_backend, interpret
        self.max_blocks_per_seq = -(-max_model_len // block_size)
        self.kv_cache = allocate_kv_cache(cfg, num_blocks, block_size, kv_dtype)
        self.step_fn = make_step_fn(cfg, attention_backend, interpret)
        self.executables = StepExecutables(self.step_fn, params, self.kv_cache, self._shape_cost,
                                           background=background_compilation)
        self.sample_fn = sampler_lib.sample  # jitted; static flags select cheap variants
        self._signatures: set = set()  # sampler signatures seen (each one compiled once)

    @property
    def num_compilations(self) -> int:
        return len(self._signatures) + self.executables.num_compiled

    @property
    def num_blocking_compilations(self) -> int:
        """Compilations a step waited for: step shapes nothing compiled could hold, and sampler shapes."""
        return len(self._signatures) + self.executables.num_blocking

    def _shape_cost(self, shape: StepShape) -> float:
        cfg = self.cfg
        return shape.cost(token_flops=2.0 * cfg.num_params,
                          context_flops=4.0 * cfg.num_layers * cfg.num_heads * cfg.head_dim,
                          logits_flops=2.0 * cfg.hidden_size * cfg.vocab_size, block_size=self.block_size)

    def _note(self, signature) -> None:
        self._signatures.add(signature)

    # ----------------------------------------------------------------- stepping
    def run_step(self, items: list[WorkItem], query_width: int | None = None):
        """Run the jitted step on packed work items: (logits [R, V] on device, first row of each item).

        ``query_width`` overrides the runner's (see ``batch_packing.plan_shape``)."""
        width = self.query_width if query_width is None else query_width
        shape, executable = self.executables.get(plan_shape(items, self.max_blocks_per_seq, width))
        batch, rows = pack(items, self.block_size, shape)
        logits, self.kv_cache = executable(self.params, self.kv_cache, batch)
        return logits, rows

    def build_sampling_metadata(self, rows: list[tuple], num_rows: int):
        """Per-row sampling parameters. ``rows``: (sequence, index of the token sampled at this row)."""
        seqs = [q for q, _ in rows]
        params = [q.params for q in seqs]
        apply_penalties = any(p.has_penalties for p in params)
        all_greedy = all(p.greedy for p in params)
        truncation = any(p.top_k > 0 or p.top_p < 1.0 or p.min_p > 0.0 for p in params if not p.greedy)

        def col(values, dtype, fill):
            arr = np.full(num_rows, fill, dtype)
            arr[: len(values)] = values
            return arr

        def id_matrix(lists):
            width = bucket(max((len(x) for x in lists), default=1), 8)
            mat = np.full((num_rows, width), -1, np.int32)
            for i, x in enumerate(lists):
                mat[i, : len(x)] = x
            return mat

        if apply_penalties:
            prompt_ids = id_matrix([q.token_ids[: q.num_prompt_tokens] for q in seqs])
            output_ids = id_matrix([q.output_token_ids for q in seqs])
        else:
            prompt_ids = np.full((num_rows, 1), -1, np.int32)
            output_ids = np.full((num_rows, 1), -1, np.int32)
        banned = id_matrix([self._banned_ids(q, step) for q, step in rows])
        md = sampler_lib.SamplingMetadata(
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
        )
        # numpy arrays: a jitted call transfers them in microseconds; jax.device_put of the pytree took ~0.2 ms
        return md, apply_penalties, all_greedy, truncation

    def _banned_ids(self, seq, step: int) -> list[int]:
        p = seq.params
        if step >= p.min_tokens:
            return []
        ids = list(p.stop_token_ids)
        if not p.ignore_eos:
            ids += list(self.eos_token_ids)
        return ids

    # --------------------------------------------------------------- executing
    def execute(self, scheduled: list[ScheduledSeq], draft_probs_for=None) -> dict[int, list[SampledToken]]:
        """Run one step; for every sequence that reached its end, the tokens it emits (by seq_id).

        Without speculation that is one sampled token. A sequence verifying k draft tokens emits its
        accepted drafts followed by one token from the target (resampled or bonus). ``draft_probs_for``
        maps [(seq, j)] to the draft distributions [R, V] (None: point-mass drafts, i.e. n-gram).
        """
        items = []
        for s in scheduled:
            seq, k = s.seq, s.num_spec_tokens
            start = seq.num_computed_tokens
            tokens = seq.token_ids[start : start + s.num_new_tokens - k] + seq.spec_token_ids[:k]
            items.append(WorkItem(seq.block_ids, start, tokens, (1 + k) if s.samples else 0))
        logits, starts = self.run_step(items)
        owners = []  # (scheduled seq, j) per logits row, in row order
        for s, start in sorted(zip(scheduled, starts), key=lambda p: p[1]):
            if s.samples:
                owners += [(s, j) for j in range(s.num_spec_tokens + 1)]
        rows = [(s.seq, s.seq.num_output_tokens + j) for s, j in owners]
        drafts = [s.seq.spec_token_ids[j] if j < s.num_spec_tokens else -1 for s, j in owners]
        if not rows:
            return {}
        num_rows = logits.shape[0]
        md, apply_penalties, all_greedy, truncation = self.build_sampling_metadata(rows, num_rows)
        num_logprobs = max((s.seq.params.logprobs or 0) for s in scheduled)
        speculating = any(s.num_spec_tokens for s in scheduled)
        if speculating:
            draft_arr = np.full(num_rows, -1, np.int32)
            draft_arr[: len(drafts)] = drafts
            probs = None  # greedy rows accept iff the draft is the argmax, whatever the draft's q
            if draft_probs_for is not None and not all_greedy:
                probs = draft_probs_for([(s.seq, j) for s, j in owners], num_rows)
            self._note(("verify", num_rows, md.banned_token_ids.shape[1], num_logprobs, truncation, probs is None,
                        all_greedy))
            out = rejection_sampler.verify(logits, md, draft_arr, probs, num_logprobs=num_logprobs,
                                           apply_truncation=truncation, all_greedy=all_greedy)
            accepted = out.accepted
        else:
            self._note(("sample", num_rows, md.prompt_token_ids.shape[1], md.output_token_ids.shape[1],
                        md.banned_token_ids.shape[1], num_logprobs, apply_penalties, all_greedy, truncation))
            out = self.sample_fn(logits, md, num_logprobs=num_logprobs, apply_penalties=apply_penalties,
                                 all_greedy=all_greedy, apply_truncation=truncation)
            accepted = np.zeros(num_rows, bool)  # an eager jnp op costs ~0.05 ms per step
        tokens, logprobs, top_ids, top_lps, acc = jax.device_get(
            (out.tokens, out.logprobs, out.topk_ids, out.topk_logprobs, accepted)
        )
        result: dict[int, list[SampledToken]] = {}
        for i, (s, j) in enumerate(owners):
            emitted = result.setdefault(s.seq.seq_id, [])
            if len(emitted) < j or (emitted and j > 0 and not acc[i - 1]):
                continue  # an earlier draft of this sequence was rejected: later rows are void
            n = s.seq.params.logprobs or 0
            top = {int(top_ids[i, m]): float(top_lps[i, m]) for m in range(n)}
            emitted.append(SampledToken(int(tokens[i]), float(logprobs[i]), top))
        return result
