"""The jitted sampler: from one step's logits to one next token per sequence slot, on device.

The engine calls `sample` once per step on the logits of the sequences that need a next token. Every
per-request sampling parameter arrives as an array with one row per sequence slot (`SamplingMetadata`),
so one compiled function serves any mix of requests; only the static flags (`num_logprobs`,
`apply_penalties`, `apply_truncation`, `all_greedy`, `truncation_method`) select a different compilation.

Processing order (vLLM's), each step on the float32 logits of one row:

1. penalties (if ``apply_penalties``):
   repetition (HF/CTRL) on every token seen in the prompt or the output so far:
   ``logit > 0 -> logit / rp``, else ``logit * rp``; then frequency and presence (OpenAI) on output tokens:
   ``logit -= frequency * count + presence * (count > 0)``.
2. banned ids -> ``-inf`` (the engine bans EOS / stop ids until ``min_tokens`` is reached).
3. greedy rows (temperature < `GREEDY_TEMPERATURE_EPS`) take the argmax here (ties: the lowest id).
4. temperature: ``logit / T``.
5. truncation (if ``apply_truncation``), each a threshold on the scaled logit, so ties never split
   (found by one sort per row on accelerators, by a sort-free radix select on CPU; same result):
   - min_p: keep tokens whose probability is >= ``min_p * max probability``;
   - top_k: keep tokens whose logit is >= the k-th largest logit (all tokens tied with the k-th are kept,
     so more than k may survive);
   - top_p: on the distribution renormalised over what min_p and top_k kept, keep token i iff the total
     probability of the tokens strictly more probable than i is < top_p. This is the smallest set of the
     most probable tokens whose cumulative probability reaches top_p, grown to include every token tied
     with its least probable member. The most probable token always survives.
6. sample: Gumbel-max (``argmax(logit + Gumbel noise)``) with the row's own key
   ``fold_in(key(seed), step)``, so a row's token depends only on its logits, parameters, seed and step,
   never on the rest of the batch or on where the row sits in it.

Logprobs are those of the RAW model distribution, ``log_softmax(logits)`` before penalties, temperature and
truncation (vLLM's default). `prompt_logprobs` computes the same for given target tokens (a prompt's next
tokens), with each target's rank in the vocabulary, so that only [rows, K] comes back to the host.

Parameter conventions: top_k <= 0 or >= V disables top-k, top_p >= 1 disables top-p, min_p <= 0 disables
min-p, repetition_penalty 1 (or <= 0, which padded rows may carry) disables the repetition penalty. Token id
arrays are padded with -1; any id outside [0, V) is ignored, and any of them may have zero columns.
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp

GREEDY_TEMPERATURE_EPS = 1e-5  # a temperature below this is greedy (dividing by it would overflow)


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class SamplingMetadata:
    """Per-row sampling parameters of one step; S is the (bucketed) number of sequence slots."""

    temperature: jax.Array  # [S] f32   < GREEDY_TEMPERATURE_EPS => greedy
    top_k: jax.Array  # [S] i32         <= 0 or >= V => disabled
    top_p: jax.Array  # [S] f32         >= 1 => disabled
    min_p: jax.Array  # [S] f32         <= 0 => disabled
    presence_penalty: jax.Array  # [S] f32   OpenAI, on output tokens
    frequency_penalty: jax.Array  # [S] f32  OpenAI, on output tokens
    repetition_penalty: jax.Array  # [S] f32 HF/CTRL, on prompt + output tokens; 1 => off
    seeds: jax.Array  # [S] u32         per-sequence seed
    steps: jax.Array  # [S] i32         index of the token being sampled (number generated so far)
    prompt_token_ids: jax.Array  # [S, P] i32  -1 padded; P may be 0
    output_token_ids: jax.Array  # [S, O] i32  -1 padded; O may be 0
    banned_token_ids: jax.Array  # [S, M] i32  -1 padded; M may be 0


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class SamplerOutput:
    """What one step of sampling returns, K = num_logprobs."""

    tokens: jax.Array  # [S] i32         the sampled token of each row
    logprobs: jax.Array  # [S] f32       raw-distribution logprob of the sampled token
    topk_ids: jax.Array  # [S, K] i32    ids of the K most probable tokens (raw distribution), best first
    topk_logprobs: jax.Array  # [S, K] f32  their raw logprobs


def _check_shapes(logits: jax.Array, md: SamplingMetadata) -> None:
    if logits.ndim != 2:
        raise ValueError(f"logits must be [S, V], got shape {logits.shape}")
    num_rows = logits.shape[0]
    for field in dataclasses.fields(md):
        value = getattr(md, field.name)
        want_ndim = 2 if field.name.endswith("token_ids") else 1
        if value.ndim != want_ndim or value.shape[0] != num_rows:
            raise ValueError(
                f"SamplingMetadata.{field.name} has shape {value.shape}; expected "
                f"{'[S, N]' if want_ndim == 2 else '[S]'} with S={num_rows} (the rows of logits)"
            )


def apply_token_bitmask(logits: jax.Array, bitmask: jax.Array) -> jax.Array:
    """Logits [S, V] with every token not allowed by ``bitmask`` (int32 [S, ceil(V / 32)] or wider: bit
    ``t % 32`` of word ``t // 32`` set = token t allowed) at -inf. A row of all bits set is unchanged."""
    bits = (bitmask[:, :, None] >> jnp.arange(32, dtype=jnp.int32)) & 1
    allowed = bits.reshape(bitmask.shape[0], -1)[:, : logits.shape[-1]].astype(bool)
    return jnp.where(allowed, logits, -jnp.inf)


def _scatter_ids(ids: jax.Array, vocab_size: int) -> jax.Array:
    """Ids ready for a `mode="drop"` scatter: padding and out-of-range ids point past the vocab."""
    return jnp.where((ids >= 0) & (ids < vocab_size), ids, vocab_size)


def _token_counts(ids: jax.Array, vocab_size: int) -> jax.Array:
    """[S, V] i32: how often each token occurs in each row of ``ids`` (padding ignored)."""
    rows = jnp.arange(ids.shape[0])[:, None]
    counts = jnp.zeros((ids.shape[0], vocab_size), jnp.int32)
    return counts.at[rows, _scatter_ids(ids, vocab_size)].add(1, mode="drop")


def apply_penalties(logits: jax.Array, md: SamplingMetadata) -> jax.Array:
    """Repetition penalty on prompt+output tokens, then frequency and presence on output tokens."""
    vocab_size = logits.shape[-1]
    output_counts = _token_counts(md.output_token_ids, vocab_size)
    seen = (_token_counts(md.prompt_token_ids, vocab_size) + output_counts) > 0
    rp = md.repetition_penalty.astype(jnp.float32)
    rp = jnp.where(rp > 0, rp, 1.0)[:, None]
    penalised = jnp.where(logits > 0, logits / rp, logits * rp)
    logits = jnp.where(seen, penalised, logits)
    logits = logits - md.frequency_penalty[:, None] * output_counts.astype(jnp.float32)
    return logits - md.presence_penalty[:, None] * (output_counts > 0).astype(jnp.float32)


def apply_bans(logits: jax.Array, banned_token_ids: jax.Array) -> jax.Array:
    """Set the logits of each row's banned ids to -inf."""
    rows = jnp.arange(logits.shape[0])[:, None]
    ids = _scatter_ids(banned_token_ids, logits.shape[-1])
    return logits.at[rows, ids].set(-jnp.inf, mode="drop")


def adjusted_logits(logits: jax.Array, md: SamplingMetadata, with_penalties: bool) -> jax.Array:
    """Steps 1-2 of the processing order, in float32: what greedy rows take the argmax of."""
    logits = logits.astype(jnp.float32)
    if with_penalties:
        logits = apply_penalties(logits, md)
    return apply_bans(logits, md.banned_token_ids)


def _thresholds_by_sort(
    scaled: jax.Array, cut: jax.Array, k: jax.Array, k_enabled: jax.Array, top_p: jax.Array
) -> tuple[jax.Array, jax.Array]:
    """top_k and top_p thresholds [S, 1] from one descending sort per row (fast on GPU)."""
    vocab_size = scaled.shape[-1]
    sorted_desc = jnp.sort(scaled, axis=-1, descending=True)
    kth_logit = jnp.take_along_axis(sorted_desc, jnp.clip(k - 1, 0, vocab_size - 1), axis=-1)
    cut = jnp.maximum(cut, jnp.where(k_enabled, kth_logit, -jnp.inf))
    # Sorted position j is eligible if the mass before it is < top_p; the eligible positions form a
    # prefix, and the value at its end is the threshold (so a tie group is never split).
    cut_sorted = jnp.where(sorted_desc >= cut, sorted_desc, -jnp.inf)
    probs_sorted = jax.nn.softmax(cut_sorted, axis=-1)
    mass_before = jnp.concatenate(
        [jnp.zeros_like(probs_sorted[:, :1]), jnp.cumsum(probs_sorted, axis=-1)[:, :-1]], axis=-1
    )
    num_eligible = jnp.maximum(jnp.sum(mass_before < top_p, axis=-1, keepdims=True), 1)
    return cut, jnp.take_along_axis(cut_sorted, num_eligible - 1, axis=-1)


def _order_keys(x: jax.Array) -> jax.Array:
    """uint32 keys whose unsigned order is the order of the float32 values. -0.0 and +0.0 get adjacent
    keys; harmless, as thresholds are applied as float comparisons, where the two are equal."""
    bits = jax.lax.bitcast_convert_type(x.astype(jnp.float32), jnp.uint32)
    return jnp.where(bits >> 31 == 1, ~bits, bits | jnp.uint32(0x80000000))


def _from_order_keys(keys: jax.Array) -> jax.Array:
    bits = jnp.where(keys >> 31 == 1, keys ^ jnp.uint32(0x80000000), ~keys)
    return jax.lax.bitcast_convert_type(bits, jnp.float32)


def _largest_key_where(holds, num_rows: int) -> jax.Array:
    """Per row, the largest uint32 t with ``holds(t)``, for a predicate that is monotone (true up to
    some t, false above it); 0 if it holds nowhere. One bit per pass, most significant first."""

    def try_bit(i, found):
        candidate = found | (jnp.uint32(1) << (31 - i).astype(jnp.uint32))
        return jnp.where(holds(candidate), candidate, found)

    return jax.lax.fori_loop(0, 32, try_bit, jnp.zeros((num_rows, 1), jnp.uint32))


def _thresholds_by_search(
    scaled: jax.Array, cut: jax.Array, k: jax.Array, k_enabled: jax.Array, top_p: jax.Array
) -> tuple[jax.Array, jax.Array]:
    """The same thresholds as `_thresholds_by_sort`, exactly, without sorting: a radix select of 32
    fused passes over the row for each (XLA's CPU sort is ~20x slower)."""
    num_rows = scaled.shape[0]
    keys = _order_keys(scaled)
    # The k-th largest logit: the largest t with count(logit >= t) >= k.
    k = jnp.maximum(k, 1)  # disabled rows: any answer will do, but a finite one
    kth_key = _largest_key_where(lambda t: jnp.sum(keys >= t, axis=-1, keepdims=True) >= k, num_rows)
    cut = jnp.maximum(cut, jnp.where(k_enabled, _from_order_keys(kth_key), -jnp.inf))
    # Token i survives top_p iff mass(logit > x_i) < top_p, i.e. iff x_i >= the largest t with
    # mass(logit >= t) >= top_p (the mass function only steps at token values, so t is one of them).
    probs = jax.nn.softmax(jnp.where(scaled >= cut, scaled, -jnp.inf), axis=-1)
    max_key = jnp.max(keys, axis=-1, keepdims=True)  # bounds the answer when top_p <= 0

    def mass_reaches_top_p(t):
        mass = jnp.sum(jnp.where(keys >= t, probs, 0.0), axis=-1, keepdims=True)
        return (mass >= top_p) & (t <= max_key)

    top_p_key = _largest_key_where(mass_reaches_top_p, num_rows)
    return cut, _from_order_keys(top_p_key)


TRUNCATION_METHODS = ("sort", "search")


def truncate(
    scaled: jax.Array, min_p: jax.Array, top_k: jax.Array, top_p: jax.Array, method: str = "sort"
) -> jax.Array:
    """min_p, then top_k, then top_p on temperature-scaled logits [S, V]; dropped tokens become -inf.

    Every filter is a lower threshold on the scaled logit, so the filters combine by taking the largest
    threshold. ``method`` only changes how the top_k / top_p thresholds are found ("sort": one sort per
    row; "search": a sort-free radix select); the surviving sets are the same.
    """
    if method not in TRUNCATION_METHODS:
        raise ValueError(f"truncation method {method!r} is not one of {TRUNCATION_METHODS}")
    vocab_size = scaled.shape[-1]
    max_logit = jnp.max(scaled, axis=-1, keepdims=True)
    # min_p: p_i >= min_p * p_max  <=>  logit_i >= max_logit + log(min_p); log(0) = -inf keeps everything.
    min_p = jnp.clip(min_p.astype(jnp.float32), 0.0, 1.0)[:, None]
    cut = max_logit + jnp.log(min_p)
    k = top_k.astype(jnp.int32)[:, None]
    k_enabled = (k > 0) & (k < vocab_size)
    top_p = top_p.astype(jnp.float32)[:, None]
    find = _thresholds_by_sort if method == "sort" else _thresholds_by_search
    cut, top_p_logit = find(scaled, cut, k, k_enabled, top_p)
    cut = jnp.maximum(cut, jnp.where(top_p < 1.0, top_p_logit, -jnp.inf))
    # Whatever the parameters, the most probable token survives (no all -inf row, no NaN).
    cut = jnp.minimum(cut, max_logit)
    return jnp.where(scaled >= cut, scaled, -jnp.inf)


def default_truncation_method() -> str:
    """"search" on CPU (XLA:CPU sorts slowly), "sort" on accelerators."""
    return "search" if jax.default_backend() == "cpu" else "sort"


def first_argmax(x: jax.Array) -> jax.Array:
    """[S] i32 argmax over the last axis, ties to the lowest id, as two plain reductions (XLA:CPU's
    variadic argmax reduction is ~3x slower). A row with NaN gives V - 1 rather than an invalid id."""
    vocab_size = x.shape[-1]
    best = jnp.max(x, axis=-1, keepdims=True)
    ids = jnp.arange(vocab_size, dtype=jnp.int32)
    return jnp.minimum(jnp.min(jnp.where(x == best, ids, vocab_size), axis=-1), vocab_size - 1)


def _is_greedy(temperature: jax.Array) -> jax.Array:
    return ~(temperature >= GREEDY_TEMPERATURE_EPS)  # NaN temperature counts as greedy


@functools.partial(jax.jit, static_argnames=("apply_penalties", "apply_truncation", "truncation_method"))
def processed_logits(
    logits: jax.Array,
    md: SamplingMetadata,
    *,
    apply_penalties: bool = True,
    apply_truncation: bool = True,
    truncation_method: str | None = None,
) -> jax.Array:
    """[S, V] f32: the exact distribution (as logits, dropped tokens -inf) each row samples from.

    Sampling row r draws from ``softmax(processed_logits(...)[r])``. A greedy row is a point mass: 0 at
    its argmax, -inf elsewhere. The flags must match those given to `sample`; ``truncation_method``
    None means `default_truncation_method()`.
    """
    _check_shapes(logits, md)
    adjusted = adjusted_logits(logits, md, apply_penalties)
    greedy = _is_greedy(md.temperature)[:, None]
    temperature = jnp.where(greedy, 1.0, md.temperature[:, None].astype(jnp.float32))
    scaled = adjusted / temperature
    if apply_truncation:
        method = truncation_method or default_truncation_method()
        scaled = truncate(scaled, md.min_p, md.top_k, md.top_p, method)
    vocab_ids = jnp.arange(logits.shape[-1])[None, :]
    point_mass = jnp.where(vocab_ids == first_argmax(adjusted)[:, None], 0.0, -jnp.inf)
    return jnp.where(greedy, point_mass, scaled)


def row_keys(seeds: jax.Array, steps: jax.Array) -> jax.Array:
    """[S] typed PRNG keys: ``fold_in(key(seed), step)`` per row."""
    return jax.vmap(lambda seed, step: jax.random.fold_in(jax.random.key(seed), step))(seeds, steps)


def raw_logprob_outputs(
    logits: jax.Array, tokens: jax.Array, num_logprobs: int
) -> tuple[jax.Array, jax.Array, jax.Array]:
    """(logprob of each row's token, top-``num_logprobs`` ids, their logprobs) under the raw distribution."""
    raw = jax.nn.log_softmax(logits.astype(jnp.float32), axis=-1)
    token_logprobs = jnp.take_along_axis(raw, tokens[:, None], axis=-1)[:, 0]
    if num_logprobs == 0:
        empty = jnp.zeros((logits.shape[0], 0))
        return token_logprobs, empty.astype(jnp.int32), empty.astype(jnp.float32)
    topk_logprobs, topk_ids = jax.lax.top_k(raw, num_logprobs)
    return token_logprobs, topk_ids.astype(jnp.int32), topk_logprobs


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class PromptLogprobs:
    """Raw-distribution logprobs of given target tokens, one row per logits row, K = num_logprobs."""

    target_logprobs: jax.Array  # [N] f32   logprob of each row's target token
    target_ranks: jax.Array  # [N] i32      1 + the number of tokens strictly more probable than the target
    topk_ids: jax.Array  # [N, K] i32       the K most probable tokens, best first
    topk_logprobs: jax.Array  # [N, K] f32  their logprobs


def prompt_logprobs(logits: jax.Array, targets: jax.Array, num_logprobs: int) -> PromptLogprobs:
    """Per row of ``logits`` [N, V]: the logprob and rank of ``targets`` [N] (ids outside [0, V): any finite
    answer) and the top ``num_logprobs``, all under ``log_softmax`` of the float32 logits."""
    raw = jax.nn.log_softmax(logits.astype(jnp.float32), axis=-1)
    safe = jnp.clip(targets, 0, logits.shape[-1] - 1).astype(jnp.int32)
    target_lp = jnp.take_along_axis(raw, safe[:, None], axis=-1)
    ranks = 1 + jnp.sum(raw > target_lp, axis=-1, dtype=jnp.int32)
    topk_lps, topk_ids = jax.lax.top_k(raw, num_logprobs)
    return PromptLogprobs(target_lp[:, 0], ranks, topk_ids.astype(jnp.int32), topk_lps)


@functools.partial(
    jax.jit,
    static_argnames=(
        "num_logprobs", "apply_penalties", "all_greedy", "apply_truncation", "truncation_method"
    ),
)
def sample(
    logits: jax.Array,
    md: SamplingMetadata,
    *,
    num_logprobs: int,
    apply_penalties: bool,
    all_greedy: bool,
    apply_truncation: bool = True,
    truncation_method: str | None = None,
) -> SamplerOutput:
    """Sample one token per row of ``logits`` [S, V] (see the module docstring for the processing order).

    Static flags, each a separate compilation, so cheap batches compile cheap:
      num_logprobs: K, how many top raw logprobs to return per row (0 allowed).
      apply_penalties: False skips the penalty scatters (no row has a penalty set).
      all_greedy: True when every row is greedy: argmax only, no sort and no random numbers (rows with a
        temperature are then treated as greedy too).
      apply_truncation: False skips top_k / top_p / min_p entirely (no row sets any of them).
      truncation_method: "sort" or "search" (same result); None picks `default_truncation_method()`.
    """
    _check_shapes(logits, md)
    vocab_size = logits.shape[-1]
    if not 0 <= num_logprobs <= vocab_size:
        raise ValueError(f"num_logprobs={num_logprobs} must be in [0, vocab size {vocab_size}]")
    if all_greedy:
        tokens = first_argmax(adjusted_logits(logits, md, apply_penalties))
    else:
        final = processed_logits(
            logits,
            md,
            apply_penalties=apply_penalties,
            apply_truncation=apply_truncation,
            truncation_method=truncation_method,
        )
        noise = jax.vmap(lambda key: jax.random.gumbel(key, (vocab_size,), jnp.float32))(
            row_keys(md.seeds, md.steps)
        )
        tokens = first_argmax(final + noise)
    token_logprobs, topk_ids, topk_logprobs = raw_logprob_outputs(logits, tokens, num_logprobs)
    return SamplerOutput(tokens, token_logprobs, topk_ids, topk_logprobs)
