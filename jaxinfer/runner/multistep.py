"""Multi-step decoding: up to N decode steps of a batch in one compiled call (``num_scheduler_steps``, the
name vLLM gave this).

Between two single decode steps the device waits for the host: the token chooser's result comes back, the
engine appends the tokens and checks the stop conditions, the scheduler plans the next step and the runner
packs and dispatches it. On the 134M Llama at batch 1 on the 2-core CPU that is ~1.2 ms of each ~17.5 ms
token. A multi-step call runs the step and the token chooser in a ``lax.fori_loop``: each iteration feeds the
tokens it chose back as the next step's input, one position further on, so the host is involved once per
N tokens.

It is the same computation as N single steps (the same step function at ``query_width=1``, the same
sampler with the same per-row seeds and step indices), so the tokens are identical. The engine uses it
only where that holds without the host in between (``burst_length``): a decode-only batch,
no speculation, no penalties (they read the output history) and no min_tokens bans still to lift. Stop
conditions are applied afterwards: the tokens a sequence chose after it finished are dropped (their K/V
went to blocks allocated for them, which are freed with the sequence).
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp

from jaxinfer.model.step_batch import NULL_SLOT, StepBatch


def burst_length(scheduled: list, max_steps: int, max_model_len: int, block_manager) -> int:
    """How many decode steps to run in one call (1: a single step): several only when the host has nothing to
    do in between — every scheduled sequence decodes one known token, has no penalties (they read the output
    history) and no min_tokens bans left to lift — at most ``max_steps``, as many as the longest remaining
    ``max_tokens`` and the closest ``max_model_len`` allow, and only once ``block_manager`` gave every sequence
    blocks for them all."""
    n = max_steps
    if n <= 1:
        return 1
    remaining = 1
    for s in scheduled:
        q, p = s.seq, s.seq.params
        if not s.samples or s.num_new_tokens != 1 or s.num_spec_tokens or not q.can_choose_ahead:
            return 1
        n = min(n, max_model_len - q.num_tokens + 1)
        remaining = max(remaining, n if p.max_tokens is None else p.max_tokens - q.num_output_tokens)
    n = min(n, remaining)
    if n > 1 and all(block_manager.grow(s.seq, s.seq.num_tokens + n - 1) for s in scheduled):
        return n
    return 1


def next_decode_batch(batch: StepBatch, tokens: jax.Array, block_size: int) -> StepBatch:
    """The decode step after ``batch`` (every live slot one query: token t is slot t's and logits row t's):
    each live slot's token is its chosen ``tokens[t]``, one position further, with its K/V slot looked up in
    the slot's block table; padding stays padding."""
    num_tokens = batch.token_ids.shape[0]
    num_seqs, max_blocks = batch.block_tables.shape
    t = jnp.arange(num_tokens)
    live = t < batch.cu_q_lens[-1]
    chosen = jnp.zeros(num_tokens, jnp.int32).at[: tokens.shape[0]].set(tokens[:num_tokens].astype(jnp.int32))
    pos = batch.positions + 1
    block = batch.block_tables[jnp.minimum(t, num_seqs - 1), jnp.clip(pos // block_size, 0, max_blocks - 1)]
    return dataclasses.replace(
        batch,
        token_ids=jnp.where(live, chosen, 0),
        positions=jnp.where(live, pos, 0),
        slot_mapping=jnp.where(live, block * block_size + pos % block_size, NULL_SLOT),
        kv_lens=jnp.where(batch.kv_lens > 0, batch.kv_lens + 1, 0),
    )


def make_multistep_fn(step_fn, choose_fn, block_size: int):
    """The jitted ``multistep(params, kv_cache, batch, md, num_steps) -> (outputs, kv_cache)``.

    ``step_fn(params, kv_cache, batch, query_width)`` is the runner's step and ``choose_fn(logits, md, drafts,
    draft_q, **sampler_statics)`` its token chooser. ``num_steps`` (a device scalar, at most the static
    ``max_steps``) iterations run; ``outputs`` holds the chooser's output of iteration i at index i (rows
    past ``num_steps`` are zeros). ``kv_cache`` is donated.
    """

    def multistep(params, kv_cache, batch, md, num_steps, *, max_steps: int, greedy: bool, num_logprobs: int,
                  penalties: bool):
        num_rows = batch.logits_indices.shape[0]
        no_drafts = jnp.full((num_rows,), -1, jnp.int32)
        statics = dict(greedy=greedy, num_logprobs=num_logprobs, penalties=penalties, speculative=False)

        def one_step(kv_cache, batch, md):
            logits, kv_cache = step_fn(params, kv_cache, batch, query_width=1)
            return choose_fn(logits, md, no_drafts, None, **statics), kv_cache

        shapes, _ = jax.eval_shape(one_step, kv_cache, batch, md)
        outputs = jax.tree.map(lambda s: jnp.zeros((max_steps, *s.shape), s.dtype), shapes)

        def body(i, carry):
            kv_cache, batch, md, outputs = carry
            out, kv_cache = one_step(kv_cache, batch, md)
            outputs = jax.tree.map(lambda buf, x: buf.at[i].set(x), outputs, out)
            batch = next_decode_batch(batch, out.tokens, block_size)
            md = dataclasses.replace(md, steps=md.steps + 1)
            return kv_cache, batch, md, outputs

        num_steps = jnp.clip(num_steps, 0, max_steps)
        kv_cache, _, _, outputs = jax.lax.fori_loop(0, num_steps, body, (kv_cache, batch, md, outputs))
        return outputs, kv_cache

    return jax.jit(multistep, donate_argnames="kv_cache",
                   static_argnames=("max_steps", "greedy", "num_logprobs", "penalties"))
