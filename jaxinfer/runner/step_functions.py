"""The jitted functions the model runner compiles, and their abstract inputs: the ragged step
(``make_step_fn``), its prompt-logprobs variant (``make_prompt_step_fn``), the token chooser
(``choose_tokens``: sampling or verifying speculative tokens), the token chooser's abstract sampling metadata
and a harmless batch that runs every loop of a step once (warm-up). ``jaxinfer.runner.model_runner`` keys,
compiles and calls them; ``bench.gpu_compile`` compiles them for a GPU without one.
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np

from jaxinfer.config.model import ModelConfig
from jaxinfer.model.attention import get_attention_fn
from jaxinfer.model.decoder import forward
from jaxinfer.model.linear import with_cpu_kernels
from jaxinfer.model.moe import moe_block
from jaxinfer.runner.batch_packing import abstract_batch
from jaxinfer.runner.shape_plan import SamplerVariant, StepShape
from jaxinfer.sample import rejection_sampler
from jaxinfer.sample import sampler as sampler_lib
from jaxinfer.sampling_params import MAX_LOGPROBS


def make_step_fn(cfg: ModelConfig, attention_backend: str = "xla", interpret: bool | None = None,
                 sharding_plan=None):
    """The jitted ragged step ``step(params, kv_cache, batch, query_width) -> (logits, kv_cache)``.

    ``kv_cache`` is donated and updated in place; ``query_width`` (static) is the step kind for the XLA
    attention path: W >= 1 if no sequence computes more than W tokens, None for a mixed step. With a
    ``sharding_plan`` (tensor / expert parallelism) attention and MoE layers run per device under
    ``shard_map`` and XLA partitions the rest from the params' shardings; the logits come back replicated.
    """
    step = _step_body(cfg, attention_backend, interpret, sharding_plan)
    out = None if sharding_plan is None else (sharding_plan.logits_sharding, sharding_plan.kv_cache_sharding)
    return jax.jit(step, donate_argnames="kv_cache", static_argnames=("query_width",), out_shardings=out)


def make_prompt_step_fn(cfg: ModelConfig, attention_backend: str = "xla", interpret: bool | None = None,
                        sharding_plan=None, num_logprobs: int = MAX_LOGPROBS):
    """The jitted prompt-logprobs step ``prompt_step(params, kv_cache, batch, targets, query_width) -> (logits,
    PromptLogprobs, kv_cache)``: ``make_step_fn``'s step computing the logits of every token of ``batch``.
    ``logits`` are the rows of ``batch.logits_indices`` (what the token chooser samples, as from the plain
    step); ``PromptLogprobs`` [T] score ``targets`` [T] (each flat token's next prompt token; -1: none) with
    the top ``num_logprobs``."""
    step = _step_body(cfg, attention_backend, interpret, sharding_plan)

    def prompt_step(params, kv_cache, batch, targets, query_width: int | None = None):
        every = dataclasses.replace(batch, logits_indices=jnp.arange(batch.token_ids.shape[0], dtype=jnp.int32))
        logits, kv_cache = step(params, kv_cache, every, query_width)
        scored = sampler_lib.prompt_logprobs(logits, targets, num_logprobs)
        return logits[batch.logits_indices], scored, kv_cache

    out = None
    if sharding_plan is not None:
        out = (sharding_plan.logits_sharding, sharding_plan.replicated, sharding_plan.kv_cache_sharding)
    return jax.jit(prompt_step, donate_argnames="kv_cache", static_argnames=("query_width",), out_shardings=out)


def _step_body(cfg: ModelConfig, attention_backend: str, interpret: bool | None, sharding_plan):
    """The step function before ``jax.jit`` (see ``make_step_fn``)."""
    moe_fn = sharding_plan.moe_fn() if sharding_plan is not None else moe_block

    def step(params, kv_cache, batch, query_width: int | None = None):
        if attention_backend == "xla":  # pure XLA: the linears keep XLA's dots too
            params = with_cpu_kernels(params, False)
        attn_fn = get_attention_fn(attention_backend, query_width=query_width, sliding_window=cfg.sliding_window,
                                   interpret=interpret)
        if sharding_plan is not None:
            attn_fn = sharding_plan.shard_attention(attn_fn)
        gather = sharding_plan.gather_logits if sharding_plan is not None else None
        return forward(params, kv_cache, batch, cfg, attn_fn, moe_fn=moe_fn, gather_logits=gather)

    return step


@functools.partial(jax.jit, static_argnames=("greedy", "num_logprobs", "penalties", "speculative"))
def choose_tokens(logits, md, draft_tokens, draft_q=None, bitmask=None, *, greedy: bool, num_logprobs: int,
                  penalties: bool, speculative: bool = True):
    """One step's next tokens, [R] rows: a row with a draft token (>= 0) verifies it (the rejection sampler),
    a row without one samples from the target's distribution (the sampler). ``draft_q``: None (point-mass
    drafts: n-gram, or greedy rows) or ``(q_rounds [k, S', V], round [R], slot [R])``, the draft model's
    distributions and where each row's draft sits in them. ``bitmask``: None, or the allowed tokens of each row
    (int32 [R, words], structured outputs): the forbidden ones' logits are -inf before anything else, so
    greedy, sampling, penalties and logprobs all see the constrained distribution. ``speculative`` False (an
    engine without speculation: no row ever has a draft) compiles the sampler alone. Returns a
    ``rejection_sampler.VerifyOutput``."""
    if bitmask is not None:
        logits = sampler_lib.apply_token_bitmask(logits, bitmask)
    if greedy:  # every row greedy, no penalties: accept iff the draft is the argmax, emit the argmax
        target = sampler_lib.first_argmax(sampler_lib.adjusted_logits(logits, md, with_penalties=False))
        accepted = (draft_tokens >= 0) & (draft_tokens == target)
        return rejection_sampler.VerifyOutput(accepted, target,
                                              *sampler_lib.raw_logprob_outputs(logits, target, num_logprobs))
    probs = None
    if draft_q is not None:
        q_rounds, rounds, slots = draft_q
        probs = jnp.where((draft_tokens >= 0)[:, None], q_rounds[rounds, slots], 0.0)

    def verify(_):
        return rejection_sampler.verify(logits, md, draft_tokens, probs, num_logprobs=num_logprobs,
                                        apply_truncation=True, apply_penalties=penalties)

    def sample(_):
        out = sampler_lib.sample(logits, md, num_logprobs=num_logprobs, apply_penalties=penalties, all_greedy=False,
                                 apply_truncation=True)
        return rejection_sampler.VerifyOutput(jnp.zeros(out.tokens.shape, bool), out.tokens, out.logprobs,
                                              out.topk_ids, out.topk_logprobs)

    if not speculative:
        return sample(None)
    return jax.lax.cond(jnp.any(draft_tokens >= 0), verify, sample, None)


def abstract_sampling_metadata(num_rows: int, variant: SamplerVariant, max_model_len: int, banned_width: int,
                               sharding=None) -> sampler_lib.SamplingMetadata:
    """The token chooser's SamplingMetadata of ``num_rows`` rows for ``variant`` as ShapeDtypeStructs: the
    penalties variant carries prompt and output ids up to ``max_model_len`` wide, the others one column."""
    ids = max_model_len if variant.penalties else 1
    f32, i32, u32 = (jax.ShapeDtypeStruct((num_rows,), d, sharding=sharding) for d in (jnp.float32, jnp.int32, jnp.uint32))
    mat = lambda w: jax.ShapeDtypeStruct((num_rows, w), jnp.int32, sharding=sharding)
    return sampler_lib.SamplingMetadata(f32, i32, f32, f32, f32, f32, f32, u32, i32, mat(ids), mat(ids),
                                        mat(banned_width))


def zeros_like_abstract(tree):
    """Host zeros for a pytree of ShapeDtypeStructs (None leaves stay None)."""
    return jax.tree.map(lambda a: np.zeros(a.shape, a.dtype), tree)


def exercise_batch(shape: StepShape, max_blocks: int):
    """A harmless batch of ``shape`` that still runs every loop of the step once: all tokens write to the
    null slot and read the null block, slot 0 computes a short run (two tokens in a mixed step, W in a
    verification step) and slot 1 a decode. (XLA:CPU prepares a kernel on its first execution: a warm-up
    run that skipped the attention loops would leave that cost to the first request.)"""
    batch = zeros_like_abstract(abstract_batch(shape, max_blocks))
    runs = [shape.query_width or 2] + ([1] if shape.num_seqs > 1 else [])
    runs[0] = min(runs[0], shape.num_tokens - (len(runs) - 1))
    cu = np.cumsum([0] + runs)
    batch.cu_q_lens[:] = cu[-1]
    batch.cu_q_lens[: len(cu)] = cu
    batch.kv_lens[: len(runs)] = runs
    batch.positions[: cu[-1]] = np.concatenate([np.arange(n) for n in runs])
    return batch
