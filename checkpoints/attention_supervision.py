"""Auxiliary attention losses that give a tiny model a copy circuit within a CPU-sized training budget.

Copying text already in the context is done by an *induction circuit*: a previous-token head (position t
attends to t-1, so each position learns which token preceded it) feeding an induction head (position t
attends to the positions j whose preceding tokens match the tokens just before and at t, and copies x[j]).
Left to the language-modelling loss alone, such circuits form only after ~10^7 training tokens
(Aoyama et al., 2025, "Predicting the Formation of Induction Heads"), far beyond a 20-minute CPU run.

So training adds two cross-entropies on chosen heads' attention probabilities:
* previous-token loss: ``-log P[t, t-1]`` for every ``t >= 1``;
* induction loss: at each position whose last ``>= 2`` tokens occurred before, the target is uniform over
  the positions right after the longest such earlier match (up to ``max_match`` tokens).
The targets are computed from the token ids alone; the trained model is a plain Llama, the losses only
steer where two heads learn to look.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp


def previous_token_loss(probs_BTS: jax.Array, offset: int = 1) -> jax.Array:
    """Mean of ``-log P[t, t - offset]`` over queries ``t >= offset``."""
    to_previous_BT = jnp.diagonal(probs_BTS, offset=-offset, axis1=1, axis2=2)
    return -jnp.mean(jnp.log(to_previous_BT + 1e-9))


def _shift(mask_BTS: jax.Array, rows: int, cols: int) -> jax.Array:
    """``out[b, t, j] = mask[b, t - rows, j - cols]``, False where that index is negative."""
    padded = jnp.pad(mask_BTS, ((0, 0), (rows, 0), (cols, 0)))
    return padded[:, : mask_BTS.shape[1], : mask_BTS.shape[2]]


def induction_targets(tokens_BT: jax.Array, max_match: int = 3) -> tuple[jax.Array, jax.Array]:
    """Target attention ``[B, T, T]`` (rows sum to 1 where supervised) and the supervised mask ``[B, T]``.

    ``score[t, j]`` counts how many tokens ending at ``t`` equal those ending at ``j - 1``
    (``x[t] == x[j-1]``, then ``x[t-1] == x[j-2]``, ... up to ``max_match``), for ``1 <= j <= t``.
    Query ``t`` is supervised when its best score is at least 2; its target spreads evenly over the
    positions ``j`` reaching that best score.
    """
    t = tokens_BT.shape[1]
    same_BTS = tokens_BT[:, :, None] == tokens_BT[:, None, :]
    run_BTS = _shift(same_BTS, 0, 1)
    score_BTS = run_BTS.astype(jnp.int32)
    for m in range(1, max_match):
        run_BTS = run_BTS & _shift(same_BTS, m, m + 1)
        score_BTS = score_BTS + run_BTS.astype(jnp.int32)
    causal_TS = jnp.arange(t)[:, None] >= jnp.arange(t)[None, :]
    score_BTS = jnp.where(causal_TS, score_BTS, 0)
    best_BT = jnp.max(score_BTS, axis=-1)
    mask_BT = best_BT >= 2
    hit_BTS = (score_BTS == best_BT[:, :, None]) & mask_BT[:, :, None]
    target_BTS = hit_BTS / jnp.maximum(jnp.sum(hit_BTS, axis=-1, keepdims=True), 1)
    return target_BTS, mask_BT


def induction_loss(probs_BTS: jax.Array, target_BTS: jax.Array, mask_BT: jax.Array) -> jax.Array:
    """Cross-entropy of a head's attention against ``induction_targets``, over supervised queries."""
    per_query_BT = -jnp.sum(target_BTS * jnp.log(probs_BTS + 1e-9), axis=-1)
    return jnp.sum(per_query_BT * mask_BT) / jnp.maximum(jnp.sum(mask_BT), 1)
