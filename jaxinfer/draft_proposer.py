"""Draft-model proposals: a small model with the target's tokenizer guesses the next k tokens.

The draft runs through the same machinery as the target: the same ragged jitted step (its own config,
params and paged KV cache), the same block ids (its cache has as many blocks as the target's, so the block
manager's allocations serve both). Per sequence, ``draft_num_computed`` says how many tokens the draft has
K/V for; a proposal first catches up on the missing ones (a prompt, the tokens accepted last step, or
everything since speculation was last on) in fixed-width chunks, then samples d1 from a step over the
last few tokens, then runs k-1 single-token steps. After verification the engine clamps
``draft_num_computed`` to the target's computed length, so rejected guesses are simply overwritten.
The draft distributions q of the proposals stay on device for the rejection sampler.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from jaxinfer import rejection_sampler
from jaxinfer.batch_packing import WorkItem
from jaxinfer.runner import ModelRunner


CATCH_UP_CHUNKS = 8  # a catch-up step feeds up to 8 x (1 + k) tokens per sequence


class DraftProposer:
    def __init__(self, runner: ModelRunner):
        self.runner = runner
        self._q_rounds: list = []  # per round j: q [S_bucket, V] on device
        self._slot: dict[int, int] = {}  # seq_id -> row of that sequence in every round

    def propose(self, seqs, ks: list[int]) -> None:
        """Set ``seq.spec_token_ids`` (up to ``ks[i]`` tokens) for each sequence; blocks must already cover
        positions up to ``num_tokens + k - 2``."""
        active = [(s, k) for s, k in zip(seqs, ks) if k > 0]
        self._q_rounds, self._slot = [], {}
        if not active:
            return
        runner = self.runner
        self._catch_up([s for s, _ in active])
        max_k = max(k for _, k in active)
        drafts = {s.seq_id: [] for s, _ in active}
        for j in range(max_k):
            items, members = [], []
            for s, k in active:
                if j >= k:
                    continue
                if j == 0:
                    start = s.draft_num_computed
                    tokens = s.token_ids[start:]
                else:
                    start = s.num_tokens + j - 1
                    tokens = [drafts[s.seq_id][-1]]
                items.append(WorkItem(s.block_ids, start, tokens, 1))
                members.append(s)
            logits, starts = runner.run_step(items)
            members = [m for _, m in sorted(zip(starts, members), key=lambda p: p[0])]  # row order
            rows = [(s, s.num_output_tokens + j) for s in members]
            md, _, all_greedy, truncation = runner.build_sampling_metadata(rows, logits.shape[0])
            runner._note(("draft_sample", logits.shape[0], md.banned_token_ids.shape[1], truncation, all_greedy))
            tokens, q = rejection_sampler.draft_sample_jit(logits, md, apply_truncation=truncation,
                                                           all_greedy=all_greedy)
            tokens = np.asarray(tokens)
            if j == 0:
                self._slot = {s.seq_id: i for i, s in enumerate(members)}
                width = logits.shape[0]
            else:
                # keep every round's rows aligned with round 0's slots
                order = [self._slot[s.seq_id] for s in members]
                if q.shape[0] != width or order != list(range(len(members))):  # else already aligned
                    q = jnp.zeros((width, q.shape[1]), q.dtype).at[jnp.asarray(order)].set(q[: len(members)])
                tokens_full = np.zeros(width, np.int32)
                tokens_full[order] = tokens[: len(members)]
                tokens = tokens_full
            self._q_rounds.append(q)
            for s in members:
                drafts[s.seq_id].append(int(tokens[self._slot[s.seq_id]]))
            for s in members:
                s.draft_num_computed = s.num_tokens + j  # K/V now covers up to the token fed this round
        for s, _ in active:
            s.spec_token_ids = drafts[s.seq_id]

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
            if j < len(seq.spec_token_ids) and seq.seq_id in self._slot and j < len(self._q_rounds):
                round_idx[r], slot_idx[r], valid[r] = j, self._slot[seq.seq_id], True
        return _gather_rows(tuple(self._q_rounds), round_idx, slot_idx, valid)


@jax.jit
def _gather_rows(q_rounds, round_idx, slot_idx, valid):
    """Row r: ``q_rounds[round_idx[r]][slot_idx[r]]`` where ``valid[r]``, else zeros (one compiled call,
    not a handful of eager ops per step)."""
    gathered = jnp.stack(q_rounds)[round_idx, slot_idx]
    return jnp.where(valid[:, None], gathered, jnp.zeros((1, gathered.shape[-1]), gathered.dtype))
