"""Draft-model proposals: a small model with the target's tokenizer guesses the next k tokens.

The draft runs through the same machinery as the target: the same ragged jitted step (its own config,
params and paged KV cache), the same block ids (its cache has as many blocks as the target's, so the block
manager's allocations serve both). Per sequence, ``draft_num_computed`` says how many tokens the draft has
K/V for; a proposal first catches up on the missing ones (a prompt, the tokens accepted last step, or
everything since speculation was last on) in fixed-width chunks, then samples d1 from a step over the
last few tokens, then runs the k-1 single-token rounds that follow in one compiled call (``draft_rounds``:
each round feeds the previous round's tokens, still on device, at the next position; the host waits once
for all k tokens instead of once per round). After verification the engine clamps
``draft_num_computed`` to the target's computed length, so rejected guesses are simply overwritten.
The draft distributions q of the proposals stay on device for the rejection sampler.
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np

from jaxinfer import rejection_sampler
from jaxinfer.attention import get_attention_fn
from jaxinfer.batch import NULL_SLOT, StepBatch, bucket
from jaxinfer.batch_packing import WorkItem
from jaxinfer.config import ModelConfig
from jaxinfer.model import forward
from jaxinfer.runner import ModelRunner


CATCH_UP_CHUNKS = 8  # a catch-up step feeds up to 8 x (1 + k) tokens per sequence


class DraftProposer:
    def __init__(self, runner: ModelRunner):
        self.runner = runner
        self._q_rounds = None  # q of every round: [k, S_bucket, V] on device
        self._slot: dict[int, int] = {}  # seq_id -> row of that sequence in every round

    def propose(self, seqs, ks: list[int]) -> None:
        """Set ``seq.spec_token_ids`` (up to ``ks[i]`` tokens) for each sequence; blocks must already cover
        positions up to ``num_tokens + k - 2``."""
        active = [(s, k) for s, k in zip(seqs, ks) if k > 0]
        self._q_rounds, self._slot = None, {}
        if not active:
            return
        runner = self.runner
        self._catch_up([s for s, _ in active])
        # round 0: each sequence's unseen tokens (at most query_width), sampling d1 at its last position
        items = [WorkItem(s.block_ids, s.draft_num_computed, s.token_ids[s.draft_num_computed :], 1)
                 for s, _ in active]
        logits, starts = runner.run_step(items)
        order = sorted(range(len(active)), key=lambda i: starts[i])  # row order
        members = [active[i][0] for i in order]
        ks_by_row = [active[i][1] for i in order]
        width = logits.shape[0]
        rows = [(s, s.num_output_tokens) for s in members]
        # Later rounds reuse this metadata with only the sampling step advanced: the engine proposes only
        # for sequences without penalties and past min_tokens, so no ids are banned at any round's step.
        md, _, all_greedy, truncation = runner.build_sampling_metadata(rows, width)
        id_widths = tuple(m.shape[1] for m in (md.prompt_token_ids, md.output_token_ids, md.banned_token_ids))
        runner._note(("draft_sample", width, id_widths, truncation, all_greedy))
        first, q0 = rejection_sampler.draft_sample_jit(logits, md, apply_truncation=truncation, all_greedy=all_greedy)
        self._slot = {s.seq_id: i for i, s in enumerate(members)}
        max_k = max(ks_by_row)
        if max_k == 1:
            tokens, self._q_rounds = np.asarray(first)[None], q0[None]
        else:
            tables = np.zeros((width, min(bucket(max(len(s.block_ids) for s in members)), runner.max_blocks_per_seq)),
                              np.int32)
            first_pos = np.zeros(width, np.int32)  # where round 1 feeds d1
            rounds_left = np.zeros(width, np.int32)  # rounds 1.. each row takes part in (k - 1)
            for i, (s, k) in enumerate(zip(members, ks_by_row)):
                tables[i, : len(s.block_ids)] = s.block_ids
                first_pos[i], rounds_left[i] = s.num_tokens, k - 1
            # always k - 1 rounds for the configured k (rows near max_tokens sit the last ones out): one
            # compiled shape per batch size, not one more per shorter proposal at the end of a request
            rounds = max((runner.query_width or 0) - 2, max_k - 1)
            runner._note(("draft_rounds", width, tables.shape[1], rounds, id_widths, truncation, all_greedy))
            rest, q_rest, runner.kv_cache = self._rounds_fn(
                runner.params, runner.kv_cache, first, tables, first_pos, rounds_left, md,
                rounds=rounds, apply_truncation=truncation, all_greedy=all_greedy)
            tokens = np.asarray(jnp.concatenate([first[None], rest]))  # the one host sync: [k, width]
            self._q_rounds = jnp.concatenate([q0[None], q_rest])
        for i, (s, k) in enumerate(zip(members, ks_by_row)):
            s.spec_token_ids = [int(t) for t in tokens[:k, i]]
            s.draft_num_computed = s.num_tokens + k - 1  # K/V now covers up to the token fed in the last round

    @functools.cached_property
    def _rounds_fn(self):
        r = self.runner
        return make_draft_rounds_fn(r.cfg, r.block_size, r.attention_backend, r.interpret)

    def _catch_up(self, seqs) -> None:
        """Feed the draft the tokens it has not seen (after steps without speculation, or a prompt) in
        chunks of ``CATCH_UP_CHUNKS x query_width`` tokens, leaving at most ``query_width`` for the first
        proposal round: every catch-up step then has one shape per batch size, however long the gap."""
        width = self.runner.query_width or 1
        chunk = CATCH_UP_CHUNKS * width
        while True:
            items = []
            for s in seqs:
                behind = s.num_tokens - width - s.draft_num_computed
                if behind > 0:
                    n = min(behind, chunk)
                    start = s.draft_num_computed
                    items.append(WorkItem(s.block_ids, start, s.token_ids[start : start + n], 0))
                    s.draft_num_computed = start + n
            if not items:
                return
            self.runner.run_step(items, query_width=chunk)

    def probs_for(self, owners: list[tuple], num_rows: int):
        """[num_rows, V] draft distributions for verification rows (seq, j); rows past a draft: zeros."""
        round_idx = np.zeros(num_rows, np.int32)
        slot_idx = np.zeros(num_rows, np.int32)
        valid = np.zeros(num_rows, bool)
        for r, (seq, j) in enumerate(owners):
            if j < len(seq.spec_token_ids) and seq.seq_id in self._slot:
                round_idx[r], slot_idx[r], valid[r] = j, self._slot[seq.seq_id], True
        return _gather_rows(self._q_rounds, round_idx, slot_idx, valid)


@jax.jit
def _gather_rows(q_rounds, round_idx, slot_idx, valid):
    """Row r: ``q_rounds[round_idx[r], slot_idx[r]]`` where ``valid[r]``, else zeros (one compiled call,
    not a handful of eager ops per step)."""
    gathered = q_rounds[round_idx, slot_idx]
    return jnp.where(valid[:, None], gathered, jnp.zeros((1, gathered.shape[-1]), gathered.dtype))


def make_draft_rounds_fn(cfg: ModelConfig, block_size: int, attention_backend: str, interpret: bool | None):
    """The jitted proposal rounds after the first: ``fn(params, kv_cache, first [S], block_tables [S, MB],
    first_pos [S], rounds_left [S], md, *, rounds, apply_truncation, all_greedy) -> (tokens [rounds, S],
    q [rounds, S, V], kv_cache)``.

    Round j (1-based) feeds each row's previous token at ``first_pos + j - 1`` (writing its K/V) and samples
    the next one with the sampling step ``md.steps + j``; a row takes part in its first ``rounds_left``
    rounds only (later rounds write nothing and their outputs are ignored). The rounds are unrolled
    (``rounds`` is static, k - 1), so the cache is updated in place from one round to the next.
    """
    attn_fn = get_attention_fn(attention_backend, max_q_len=1, sliding_window=cfg.sliding_window,
                               interpret=interpret, num_prefill_slots=0)

    def draft_rounds(params, kv_cache, first, block_tables, first_pos, rounds_left, md, *, rounds: int,
                     apply_truncation: bool, all_greedy: bool):
        num_seqs = first.shape[0]
        slots = jnp.arange(num_seqs, dtype=jnp.int32)
        tokens, tokens_out, q_out = first, [], []
        for j in range(1, rounds + 1):
            pos = first_pos + (j - 1)
            active = j <= rounds_left
            block = jnp.take_along_axis(block_tables, jnp.clip(pos // block_size, 0, block_tables.shape[1] - 1)[:, None],
                                        axis=1)[:, 0]
            batch = StepBatch(
                token_ids=tokens, positions=pos,
                slot_mapping=jnp.where(active, block * block_size + pos % block_size, NULL_SLOT),
                block_tables=block_tables, cu_q_lens=jnp.arange(num_seqs + 1, dtype=jnp.int32),
                kv_lens=jnp.where(active, pos + 1, 0), logits_indices=slots)
            logits, kv_cache = forward(params, kv_cache, batch, cfg, attn_fn)
            md_j = dataclasses.replace(md, steps=md.steps + j)
            tokens, q = rejection_sampler.draft_sample(logits, md_j, apply_truncation=apply_truncation,
                                                       all_greedy=all_greedy)
            tokens_out.append(tokens)
            q_out.append(q)
        return jnp.stack(tokens_out), jnp.stack(q_out), kv_cache

    return jax.jit(draft_rounds, donate_argnames="kv_cache",
                   static_argnames=("rounds", "apply_truncation", "all_greedy"))
