"""Draft-model proposals: a small model with the target's tokenizer guesses the next k tokens.

The draft runs through the same machinery as the target: the same ragged compiled step (its own config,
params and paged KV cache), the same block ids (its cache has as many blocks as the target's, so the block
manager's allocations serve both). Per sequence, ``draft_num_computed`` says how many tokens the draft has
K/V for; a proposal first catches up on the missing ones (a prompt, the tokens accepted last step, or
everything since speculation was last on) in mixed steps of at most ``max_num_batched_tokens`` tokens,
leaving at most 1 + k for round 0, a step over each sequence's last unseen tokens whose logits give d1;
then one compiled call (``draft_propose``) samples d1 and runs the k - 1 single-token rounds that follow,
each feeding the previous round's tokens, still on device, at the next position: the host waits once for
all k tokens. After verification the engine clamps ``draft_num_computed`` to the target's computed length,
so rejected guesses are simply overwritten. The draft distributions q stay on device, laid out
``[k, max sequence bucket, V]``, for the verifier (only when some row samples: greedy verification ignores q).
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np

from jaxinfer.config.model import ModelConfig
from jaxinfer.config.speculative import SpeculativeConfig
from jaxinfer.loading.model_source import load_model
from jaxinfer.model.attention import get_attention_fn
from jaxinfer.model.decoder import forward
from jaxinfer.model.linear import with_cpu_kernels
from jaxinfer.model.step_batch import NULL_SLOT, StepBatch
from jaxinfer.runner.batch_packing import WorkItem
from jaxinfer.runner.executables import Entry
from jaxinfer.runner.model_runner import ModelRunner, RunnerOptions
from jaxinfer.runner.step_functions import zeros_like_abstract
from jaxinfer.runner.shape_plan import SamplerVariant, ShapePlan
from jaxinfer.sample import rejection_sampler


class DraftModelProposer:
    """The ``Proposer`` of ``method="draft_model"``: runs the draft through its own ``ModelRunner``."""

    method = "draft_model"

    def __init__(self, runner: ModelRunner, num_speculative_tokens: int):
        self.runner = runner
        self.k = num_speculative_tokens
        self.q_width = runner.plan.seq_buckets[-1]  # rows of the q buffer the verifier reads
        self._q_rounds = None  # [k, q_width, V] on device (sampling proposals only)
        # what the verifier reads when the proposals were greedy but the step samples some rows: a greedy row
        # accepts its draft iff p(draft) > 0 (the argmax) whatever q is, so zeros serve
        self._no_q = jnp.zeros((self.k, self.q_width, runner.cfg.vocab_size), jnp.float32)
        self._slot: dict[int, int] = {}  # seq_id -> row of that sequence in every round
        self._propose_fn = make_draft_propose_fn(runner.cfg, runner.block_size, runner.attention_backend,
                                                 runner.interpret)
        runner.add_builder("draft_propose", self._propose_entry)

    @classmethod
    def load(cls, spec: SpeculativeConfig, target_cfg: ModelConfig, target_tokenizer, *, dtype, seed: int,
             plan: ShapePlan, options: RunnerOptions, cache=None) -> "DraftModelProposer":
        """Load ``spec.model`` and check it can draft for the target (same vocabulary and tokenizer, enough
        positions); its runner shares the target's block layout (``options``) with a dense cache."""
        draft = load_model(spec.model, dtype, seed)
        cfg = draft.config
        if cfg.vocab_size != target_cfg.vocab_size:
            raise ValueError(
                f"the draft model's vocabulary ({cfg.vocab_size}) differs from the target's "
                f"({target_cfg.vocab_size}): a draft must share the target's tokenizer"
            )
        if (draft.tokenizer is not None and target_tokenizer is not None
                and draft.tokenizer.vocab_size != target_tokenizer.vocab_size):
            raise ValueError("the draft model's tokenizer differs from the target's")
        if cfg.max_position_embeddings < options.max_model_len and cfg.rope_scaling is None:
            raise ValueError(
                f"the draft model supports {cfg.max_position_embeddings} positions, less than "
                f"max_model_len={options.max_model_len}"
            )
        runner = ModelRunner(cfg, draft.params, plan=plan, options=dataclasses.replace(options, kv_dtype=dtype),
                             cache=cache, name="draft")
        return cls(runner, spec.num_speculative_tokens)

    def warm_up_plan(self) -> list:
        """The draft runner's step shapes and a proposal call per batch size, greedy or sampling."""
        keys = self.runner.plan_keys(samples=False)
        keys += [("draft_propose", s, g) for s in self.runner.plan.seq_buckets for g in (True, False)]
        return [(self.runner.executables, keys)]

    def runners(self) -> list:
        return [self.runner]

    def _variant(self, greedy: bool) -> SamplerVariant:
        return SamplerVariant(greedy=greedy, num_logprobs=0, penalties=False)

    def _propose_entry(self, key) -> Entry:
        _, rows, greedy = key
        r = self.runner
        i32 = lambda *d: jax.ShapeDtypeStruct(d, jnp.int32)  # noqa: E731
        args = (jax.ShapeDtypeStruct((rows, r.cfg.vocab_size), jnp.float32),
                r.sampling_arrays(rows, self._variant(greedy)), i32(rows, r.max_blocks_per_seq), i32(rows), i32(rows))
        statics = {"rounds": self.k - 1, "greedy": greedy, "q_width": self.q_width}
        exercise = zeros_like_abstract(args)  # row 0 takes part in every round, reading and writing the null block
        exercise[-1][0] = self.k - 1
        return r.model_call_entry(self._propose_fn, args, statics, exercise)

    def propose(self, seqs, ks: list[int]) -> None:
        """Set ``seq.spec_token_ids`` (up to ``ks[i]`` tokens) for each sequence; blocks must already cover
        positions up to ``num_tokens + k - 2``."""
        active = [(s, k) for s, k in zip(seqs, ks) if k > 0]
        self._q_rounds, self._slot = None, {}
        if not active:
            return
        runner = self.runner
        self._catch_up([s for s, _ in active])
        # round 0: each sequence's unseen tokens (at most 1 + k), logits at its last position give d1
        items = [WorkItem(s.block_ids, s.draft_num_computed, s.token_ids[s.draft_num_computed :], 1)
                 for s, _ in active]
        logits, starts = runner.run_step(items)
        order = sorted(range(len(active)), key=lambda i: starts[i])  # row order
        members = [active[i][0] for i in order]
        ks_by_row = [active[i][1] for i in order]
        width = logits.shape[0]
        rows = [(s, s.num_output_tokens) for s in members]
        # Every round reuses this metadata with only the sampling step advanced: the engine proposes only
        # for sequences without penalties and past min_tokens, so no ids are banned at any round's step.
        greedy = all(s.params.greedy for s in members)
        md = runner.build_sampling_metadata(rows, width, self._variant(greedy))
        tables = np.zeros((width, runner.max_blocks_per_seq), np.int32)
        first_pos = np.zeros(width, np.int32)  # where round 1 feeds d1
        rounds_left = np.zeros(width, np.int32)  # rounds 1.. each row takes part in (its k - 1)
        for i, (s, k) in enumerate(zip(members, ks_by_row)):
            tables[i, : len(s.block_ids)] = s.block_ids
            first_pos[i], rounds_left[i] = s.num_tokens, k - 1
        # always k - 1 rounds (rows near max_tokens sit the last ones out): one executable per batch size
        tokens, q = runner.call_model(("draft_propose", width, greedy), logits, md, tables, first_pos, rounds_left)
        tokens = np.asarray(tokens)  # the one host sync: [k, width]
        self._q_rounds = q
        self._slot = {s.seq_id: i for i, s in enumerate(members)}
        for i, (s, k) in enumerate(zip(members, ks_by_row)):
            s.spec_token_ids = [int(t) for t in tokens[:k, i]]
            s.draft_num_computed = s.num_tokens + k - 1  # K/V now covers up to the token fed in the last round

    def _catch_up(self, seqs) -> None:
        """Feed the draft the tokens it has not seen (after steps without speculation, or a prompt), leaving
        at most 1 + k for the first proposal round, in mixed steps of at most the token budget."""
        width, budget = self.k + 1, self.runner.plan.max_num_batched_tokens
        while True:
            items, used = [], 0
            for s in seqs:
                behind = s.num_tokens - width - s.draft_num_computed
                n = min(behind, budget - used)
                if n > 0:
                    start = s.draft_num_computed
                    items.append(WorkItem(s.block_ids, start, s.token_ids[start : start + n], 0))
                    s.draft_num_computed = start + n
                    used += n
            if not items:
                return
            self.runner.run_step(items)

    def q_for(self, owners: list[tuple], num_rows: int):
        """For verification rows (seq, j): (q [k, q_width, V], round [R], slot [R]); rows past a draft
        point at round 0 of slot 0 (the verifier ignores rows without a draft)."""
        round_idx = np.zeros(num_rows, np.int32)
        slot_idx = np.zeros(num_rows, np.int32)
        for r, (seq, j) in enumerate(owners):
            if j < len(seq.spec_token_ids) and seq.seq_id in self._slot:
                round_idx[r], slot_idx[r] = j, self._slot[seq.seq_id]
        return (self._no_q if self._q_rounds is None else self._q_rounds), round_idx, slot_idx


def make_draft_propose_fn(cfg: ModelConfig, block_size: int, attention_backend: str, interpret: bool | None):
    """The jitted proposal: ``fn(params, kv_cache, logits0 [S, V], md, block_tables [S, MB], first_pos [S],
    rounds_left [S], *, rounds, greedy, q_width) -> (tokens [1 + rounds, S], q [1 + rounds, q_width, V] or
    None, kv_cache)``.

    d1 is sampled from ``logits0``; round j (1-based) feeds each row's previous token at
    ``first_pos + j - 1`` (writing its K/V) and samples the next with the sampling step ``md.steps + j``; a
    row takes part in its first ``rounds_left`` rounds only (later rounds write to the null slot and their
    outputs are ignored). The rounds are unrolled (``rounds`` is static, k - 1), so the cache is updated in
    place from one round to the next. With ``greedy`` every row takes the argmax and no q is returned.
    """
    attn_fn = get_attention_fn(attention_backend, query_width=1, sliding_window=cfg.sliding_window,
                               interpret=interpret)

    def draft_propose(params, kv_cache, logits0, md, block_tables, first_pos, rounds_left, *, rounds: int,
                      greedy: bool, q_width: int):
        if attention_backend == "xla":  # pure XLA: the linears keep XLA's dots too
            params = with_cpu_kernels(params, False)
        num_seqs = logits0.shape[0]
        slots = jnp.arange(num_seqs, dtype=jnp.int32)
        tokens, q = rejection_sampler.draft_sample(logits0, md, apply_truncation=True, all_greedy=greedy)
        tokens_out, q_out = [tokens], [q]
        for j in range(1, rounds + 1):
            pos = first_pos + (j - 1)
            active = j <= rounds_left
            col = jnp.clip(pos // block_size, 0, block_tables.shape[1] - 1)[:, None]
            block = jnp.take_along_axis(block_tables, col, axis=1)[:, 0]
            batch = StepBatch(
                token_ids=tokens, positions=pos,
                slot_mapping=jnp.where(active, block * block_size + pos % block_size, NULL_SLOT),
                block_tables=block_tables, cu_q_lens=jnp.arange(num_seqs + 1, dtype=jnp.int32),
                kv_lens=jnp.where(active, pos + 1, 0), logits_indices=slots)
            logits, kv_cache = forward(params, kv_cache, batch, cfg, attn_fn)
            md_j = dataclasses.replace(md, steps=md.steps + j)
            tokens, q = rejection_sampler.draft_sample(logits, md_j, apply_truncation=True, all_greedy=greedy)
            tokens_out.append(tokens)
            q_out.append(q)
        if greedy:
            return jnp.stack(tokens_out), None, kv_cache
        q_all = jnp.stack(q_out)
        q_all = jnp.pad(q_all, ((0, 0), (0, q_width - num_seqs), (0, 0)))
        return jnp.stack(tokens_out), q_all, kv_cache

    return jax.jit(draft_propose, donate_argnames="kv_cache", static_argnames=("rounds", "greedy", "q_width"))
