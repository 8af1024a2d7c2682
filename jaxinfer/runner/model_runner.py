"""The model runner: where host-side plans meet device-side arrays.

It owns the params, the paged KV cache and the compiled executables of one model (the target, or a draft
model). ``execute(plan)`` packs the scheduler's plan into one of the planned step shapes (see
``jaxinfer.runner.shape_plan``), runs the step with the cache donated, then chooses the next tokens — sampling,
or verifying speculative tokens — in one more compiled call, and returns them to the host.

``execute_multistep`` runs several decode steps of a decode-only batch in one call (``jaxinfer.runner.multistep``).

Prompt logprobs: a step that computes prompt positions still missing their logprobs runs the prompt-logprobs
variant of a mixed step (``("prompt_step", StepShape)``, ``ShapePlan.prompt_step_shapes``, compiled at start
like the rest): it computes the logits of every token, scores each position's next prompt token on device
(``sampler.prompt_logprobs``: its logprob and rank, and the top ``MAX_LOGPROBS``) and hands the token chooser
the usual rows, so only [T, MAX_LOGPROBS] comes back to the host, never [T, V].

Every executable is keyed (``("step", StepShape)``, ``("prompt_step", StepShape)``, ``("tokens", rows,
SamplerVariant)``, ``("multistep", StepShape, SamplerVariant)``, ...) and held by
``jaxinfer.runner.executables.Executables``, which compiles the whole plan at start (``plan_keys``) or on first use.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from jaxinfer.config.model import ModelConfig
from jaxinfer.core.scheduler import ScheduledSeq
from jaxinfer.model.kv_cache import allocate_kv_cache
from jaxinfer.runner.batch_packing import WorkItem, abstract_batch, pack, pack_prompt_targets
from jaxinfer.runner.compile_cache import ExecutableCache
from jaxinfer.runner.executables import Entry, Executables, abstract
from jaxinfer.runner.multihost import Channel, host_values, unpack_arrays
from jaxinfer.runner.multistep import make_multistep_fn
from jaxinfer.runner.sampling_inputs import choose_variant, sampling_metadata
from jaxinfer.runner.shape_plan import SamplerVariant, ShapePlan, StepShape
from jaxinfer.runner.step_functions import (
    abstract_sampling_metadata,
    choose_tokens,
    exercise_batch,
    make_prompt_step_fn,
    make_step_fn,
    zeros_like_abstract,
)
from jaxinfer.sample import sampler as sampler_lib
from jaxinfer.sampling_params import MAX_LOGPROBS  # the logprobs variants return this many (or the vocabulary)


@dataclasses.dataclass
class SampledToken:
    token_id: int
    logprob: float
    top_logprobs: dict[int, float]  # empty unless logprobs were requested


@dataclasses.dataclass
class PromptLogprobRow:
    """The logprobs of one prompt token, from the logits at the position before it."""

    index: int  # the prompt token's index (1 .. num_prompt_tokens - 1)
    token_id: int
    logprob: float
    rank: int  # 1 + the number of tokens strictly more probable
    top: list[tuple[int, float, int]]  # the request's top ``prompt_logprobs``: (token id, logprob, rank), best first


@dataclasses.dataclass
class StepOutput:
    """What one executed step gives the host."""

    tokens: dict[int, list[SampledToken]]  # seq_id -> the tokens it emits
    prompt_logprobs: dict[int, list[PromptLogprobRow]] = dataclasses.field(default_factory=dict)  # seq_id -> rows


@dataclasses.dataclass(frozen=True)
class RunnerOptions:
    """What the runners of one engine share (the target's and a draft model's)."""

    num_blocks: int  # KV cache blocks (block 0 is the null block)
    block_size: int
    max_model_len: int
    kv_dtype: Any
    attention_backend: str = "xla"
    interpret: bool | None = None  # Pallas interpret mode (None: on CPU)
    eos_token_ids: tuple[int, ...] = ()
    banned_width: int = 16  # columns of the banned-ids matrix (EOS and stop ids until min_tokens)
    # structured outputs: a ``jaxinfer.structured.backend.GrammarBackend`` (its bitmask width decides the masked
    # token choosers' shapes), or None: no request is constrained, no masked variant is compiled
    grammar_backend: Any = None

    @property
    def max_blocks_per_seq(self) -> int:
        return -(-self.max_model_len // self.block_size)


class ModelRunner:
    def __init__(
        self,
        cfg: ModelConfig,
        params,
        *,
        plan: ShapePlan,
        options: RunnerOptions,
        draft_q_shape: tuple[int, int] | None = None,
        cache: ExecutableCache | None = None,
        name: str = "target",
        sharding_plan=None,
        num_scheduler_steps: int = 1,
    ):
        """``plan``: this runner's step shapes. ``draft_q_shape``: (k, rows) of the draft model's distributions
        the verifier reads (draft-model speculation), else None. ``sharding_plan``: a ``ShardingPlan`` (tensor /
        expert parallelism; ``cfg`` must be its ``cfg``), or None for one device. ``num_scheduler_steps`` > 1
        plans multi-step decode executables of up to that many steps (``jaxinfer.runner.multistep``; one
        device)."""
        self.cfg = cfg
        self.plan = plan
        self.options = options
        self.eos_token_ids = tuple(options.eos_token_ids)
        self.params = params
        self.block_size = options.block_size
        self.max_model_len = options.max_model_len
        self.attention_backend, self.interpret = options.attention_backend, options.interpret
        self.max_blocks_per_seq = options.max_blocks_per_seq
        self.banned_width = options.banned_width
        self.draft_q_shape = draft_q_shape
        self.grammar_backend = options.grammar_backend
        # structured outputs: compute the step's token masks while the device runs it (True), or after it is done.
        # On a GPU the device computes on its own; on a CPU the step's XLA threads and the masks share the cores,
        # and computing them after the step was faster on 2 cores (jaxinfer-bench structured, overlap row)
        self.overlap_masks = jax.default_backend() != "cpu"
        self.max_logprobs = min(MAX_LOGPROBS, cfg.vocab_size)
        self.sharding_plan = sharding_plan
        if sharding_plan is None:
            self.kv_cache = allocate_kv_cache(cfg, options.num_blocks, options.block_size, options.kv_dtype)
        else:
            self.kv_cache = sharding_plan.allocate_kv_cache(options.num_blocks, options.block_size, options.kv_dtype)
        # host arrays fed to a sharded executable are placed replicated, like its compiled inputs
        self._replicated = sharding_plan.replicated if sharding_plan is not None else None
        self.step_fn = make_step_fn(cfg, self.attention_backend, self.interpret, sharding_plan)
        self.prompt_step_fn = make_prompt_step_fn(cfg, self.attention_backend, self.interpret, sharding_plan,
                                                  self.max_logprobs)
        self._builders = {"step": self._step_entry, "prompt_step": self._prompt_step_entry,
                          "tokens": self._tokens_entry, "multistep": self._multistep_entry}
        if num_scheduler_steps > 1 and (sharding_plan is not None or plan.verify_width is not None):
            raise ValueError("multi-step decoding runs on one device without speculation")
        self.num_scheduler_steps = num_scheduler_steps
        self.multistep_fn = make_multistep_fn(self.step_fn, choose_tokens, self.block_size)
        self.executables = Executables(self._build, cache, name=name)
        self.channel = Channel()  # multi-process runs: process 0 publishes every device call (else no-op)
        self._keys: list | None = None  # plan_keys(), indexed by the channel
        self._last_logits = None  # a follower's latest step output, for the token chooser that follows
        mesh = "" if sharding_plan is None else f"|mesh={dict(sharding_plan.mesh.shape)}"
        self._description = (f"{cfg!r}|{self.attention_backend}|{self.interpret}|bs={self.block_size}"
                             f"|len={self.max_model_len}{mesh}")

    # -------------------------------------------------------------- the plan
    def add_builder(self, kind: str, build) -> None:
        """Register how to build the executables whose key starts with ``kind`` (e.g. a draft proposer's)."""
        self._builders[kind] = build

    def _build(self, key) -> Entry:
        return self._builders[key[0]](key)

    def model_call_entry(self, fn, args: tuple, statics: dict, exercise=None) -> Entry:
        """The Entry of ``fn(params, kv_cache, *args, **statics) -> (*outputs, kv_cache)``: a function that
        runs this runner's model on its cache (e.g. a draft proposer's rounds). ``exercise``: harmless host
        values of ``args`` its first run executes on (None: no first run)."""
        def run_once(compiled):
            *_, self.kv_cache = compiled(self.params, self.kv_cache, *exercise)
            jax.block_until_ready(self.kv_cache)

        return Entry(fn, (abstract(self.params), abstract(self.kv_cache), *args), statics, self._description,
                     run_once if exercise is not None else None)

    def call_model(self, key, *args):
        """Run the executable of ``key`` (built by ``model_call_entry``) on this runner's params and cache;
        the cache is donated and replaced. Returns the other outputs."""
        *outputs, self.kv_cache = self.executables.get(key)(self.params, self.kv_cache, *args)
        return outputs

    def _step_entry(self, key) -> Entry:
        shape: StepShape = key[1]
        batch = abstract_batch(shape, self.max_blocks_per_seq, sharding=self._replicated)
        args = (abstract(self.params), abstract(self.kv_cache), batch)

        def run_once(compiled):
            _, self.kv_cache = compiled(self.params, self.kv_cache, exercise_batch(shape, self.max_blocks_per_seq))
            jax.block_until_ready(self.kv_cache)

        return Entry(self.step_fn, args, {"query_width": shape.query_width}, self._description, run_once)

    def _prompt_step_entry(self, key) -> Entry:
        shape: StepShape = key[1]
        batch = abstract_batch(shape, self.max_blocks_per_seq, sharding=self._replicated)
        targets = jax.ShapeDtypeStruct((shape.num_tokens,), jnp.int32, sharding=self._replicated)
        args = (abstract(self.params), abstract(self.kv_cache), batch, targets)

        def run_once(compiled):
            exercise = exercise_batch(shape, self.max_blocks_per_seq)
            *_, self.kv_cache = compiled(self.params, self.kv_cache, exercise, np.full(shape.num_tokens, -1, np.int32))
            jax.block_until_ready(self.kv_cache)

        return Entry(self.prompt_step_fn, args, {"query_width": None}, self._description + "|prompt_logprobs",
                     run_once)

    def sampling_arrays(self, num_rows: int, variant: SamplerVariant) -> sampler_lib.SamplingMetadata:
        """Abstract SamplingMetadata of ``num_rows`` rows for ``variant`` (its id matrices' widths)."""
        return abstract_sampling_metadata(num_rows, variant, self.max_model_len, self.banned_width, self._replicated)

    def _tokens_entry(self, key) -> Entry:
        _, rows, variant = key
        rep = self._replicated
        logits = jax.ShapeDtypeStruct((rows, self.cfg.vocab_size), jnp.float32, sharding=rep)
        draft_q = None
        if self.draft_q_shape is not None and not variant.greedy:
            k, width = self.draft_q_shape
            draft_q = (jax.ShapeDtypeStruct((k, width, self.cfg.vocab_size), jnp.float32),
                       jax.ShapeDtypeStruct((rows,), jnp.int32), jax.ShapeDtypeStruct((rows,), jnp.int32))
        bitmask = None
        if variant.masked:
            bitmask = jax.ShapeDtypeStruct((rows, self.grammar_backend.words), jnp.int32, sharding=rep)
        args = (logits, self.sampling_arrays(rows, variant), jax.ShapeDtypeStruct((rows,), jnp.int32, sharding=rep),
                draft_q, bitmask)
        statics = {"greedy": variant.greedy, "num_logprobs": variant.num_logprobs, "penalties": variant.penalties,
                   "speculative": self.plan.verify_width is not None}

        def run_once(compiled):  # sampling rows, then (under speculation) a row verifying a draft
            inputs = zeros_like_abstract(args)
            inputs[2][:] = -1
            if variant.masked:
                inputs[4][:] = -1  # every token allowed
            jax.block_until_ready(compiled(*inputs))
            if statics["speculative"]:
                inputs[2][0] = 0
                jax.block_until_ready(compiled(*inputs))

        return Entry(choose_tokens, args, statics, f"{self.cfg.vocab_size}|{self.draft_q_shape}", run_once)

    def _multistep_entry(self, key) -> Entry:
        _, shape, variant = key
        args = (abstract(self.params), abstract(self.kv_cache), abstract_batch(shape, self.max_blocks_per_seq),
                self.sampling_arrays(shape.num_logits, variant), jax.ShapeDtypeStruct((), jnp.int32))
        statics = {"max_steps": self.num_scheduler_steps, "greedy": variant.greedy,
                   "num_logprobs": variant.num_logprobs, "penalties": variant.penalties}

        def run_once(compiled):  # two iterations of single-query slots (padding writes go to the null block)
            batch = exercise_batch(dataclasses.replace(shape, query_width=1), self.max_blocks_per_seq)
            md = zeros_like_abstract(args[3])
            _, self.kv_cache = compiled(self.params, self.kv_cache, batch, md, np.int32(2))
            jax.block_until_ready(self.kv_cache)

        return Entry(self.multistep_fn, args, statics, self._description + "|multistep", run_once)

    def sampler_variants(self) -> list[SamplerVariant]:
        """The token choosers' variants: greedy and general, and with structured outputs each again masked."""
        plain = [SamplerVariant(True, 0, False), SamplerVariant(False, self.max_logprobs, True)]
        if self.grammar_backend is None:
            return plain
        return plain + [dataclasses.replace(v, masked=True) for v in plain]

    def multistep_variants(self) -> list[SamplerVariant]:
        """Multi-step decoding never carries a constrained sequence (it takes single steps)."""
        return [v for v in self.sampler_variants() if not v.masked]

    def plan_keys(self, samples: bool = True) -> list:
        """Every executable this runner may run: its step shapes and, if it samples (``samples``), its
        prompt-logprobs steps and the token choosers for every logits-row count and sampler variant."""
        keys = [("step", s) for s in self.plan.step_shapes()]
        if samples:
            keys += [("prompt_step", s) for s in self.plan.prompt_step_shapes()]
            keys += [("tokens", r, v) for r in self.plan.logits_rows() for v in self.sampler_variants()]
        if samples and self.num_scheduler_steps > 1:
            keys += [("multistep", s, v) for s in self.decode_shapes() for v in self.multistep_variants()]
        return keys

    def decode_shapes(self) -> list[StepShape]:
        """The shapes decode-only batches of 1 .. max_num_seqs sequences are packed into."""
        return sorted({self.plan.shape_for([1] * n, n) for n in range(1, self.plan.max_num_seqs + 1)})

    def key_index(self, key) -> int:
        if self._keys is None:
            self._keys = self.plan_keys()
            self._index = {k: i for i, k in enumerate(self._keys)}
        return self._index[key]

    def max_payload_words(self) -> int:
        """The most int32 words one published call carries (the multi-process broadcast's largest buffer)."""
        words = 0
        for key in self.plan_keys():
            if key[0] in ("step", "prompt_step"):
                arrays = jax.tree.leaves(abstract_batch(key[1], self.max_blocks_per_seq))
                arrays += [np.zeros(key[1].num_tokens)] if key[0] == "prompt_step" else []  # its targets
            else:
                arrays = jax.tree.leaves(self.sampling_arrays(key[1], key[2])) + [np.zeros(key[1])]
                arrays += [self._bitmask_like(key[1])] if key[2].masked else []
            words = max(words, sum(int(np.prod(a.shape)) for a in arrays))
        return words

    def follow(self) -> None:
        """On a process other than 0: run every call process 0 publishes, until it stops."""
        self.channel.follow(self._replay)

    def _replay(self, key_index: int, words: np.ndarray) -> None:
        key = self.plan_keys()[key_index] if self._keys is None else self._keys[key_index]
        executable = self.executables.get(key)
        if key[0] == "step":
            like = abstract_batch(key[1], self.max_blocks_per_seq)
            batch = jax.tree.unflatten(jax.tree.structure(like), unpack_arrays(words, jax.tree.leaves(like)))
            self._last_logits, self.kv_cache = executable(self.params, self.kv_cache, batch)
        elif key[0] == "prompt_step":
            like = abstract_batch(key[1], self.max_blocks_per_seq)
            *leaves, targets = unpack_arrays(words, jax.tree.leaves(like) + [np.zeros(key[1].num_tokens, np.int32)])
            batch = jax.tree.unflatten(jax.tree.structure(like), leaves)
            self._last_logits, _, self.kv_cache = executable(self.params, self.kv_cache, batch, targets)
        else:
            like = self.sampling_arrays(key[1], key[2])
            n = len(jax.tree.leaves(like))
            extra = [self._bitmask_like(key[1])] if key[2].masked else []
            arrays = unpack_arrays(words, jax.tree.leaves(like) + [np.zeros(key[1], np.int32)] + extra)
            md = jax.tree.unflatten(jax.tree.structure(like), arrays[:n])
            bitmask = arrays[n + 1] if extra else None
            jax.block_until_ready(executable(self._last_logits, md, arrays[n], None, bitmask))

    def _bitmask_like(self, rows: int) -> np.ndarray:
        return np.zeros((rows, self.grammar_backend.words), np.int32)

    @property
    def num_compilations(self) -> int:
        return self.executables.num_compiled + self.executables.num_loaded

    # ----------------------------------------------------------------- stepping
    def run_step(self, items: list[WorkItem]):
        """Run the compiled step on work items: (logits [R, V] on device, first logits row of each item)."""
        shape = self.plan.shape_for([len(w.tokens) for w in items], sum(w.num_logits for w in items))
        key = ("step", shape)
        executable = self.executables.get(key)
        batch, rows = pack(items, self.block_size, shape, self.max_blocks_per_seq)
        if self.sharding_plan is not None:
            self.channel.publish(self.key_index(key), jax.tree.leaves(batch))
        logits, self.kv_cache = executable(self.params, self.kv_cache, batch)
        return logits, rows

    def run_prompt_step(self, items: list[WorkItem]):
        """Run the prompt-logprobs step on work items (some with ``prompt_targets``): (logits [R, V] on device,
        first logits row of each item, ``PromptLogprobs`` [T] on device, in the flat token layout)."""
        shape = self.plan.prompt_shape_for([len(w.tokens) for w in items], sum(w.num_logits for w in items))
        key = ("prompt_step", shape)
        executable = self.executables.get(key)
        batch, rows = pack(items, self.block_size, shape, self.max_blocks_per_seq)
        targets = pack_prompt_targets(items, shape.num_tokens)
        if self.sharding_plan is not None:
            self.channel.publish(self.key_index(key), jax.tree.leaves(batch) + [targets])
        logits, scored, self.kv_cache = executable(self.params, self.kv_cache, batch, targets)
        return logits, rows, scored

    def build_sampling_metadata(self, rows: list[tuple], num_rows: int, variant: SamplerVariant):
        """Per-row sampling parameters as numpy arrays (``runner.sampling_inputs.sampling_metadata``)."""
        return sampling_metadata(rows, num_rows, variant, self.max_model_len, self.banned_width, self.eos_token_ids)

    # --------------------------------------------------------------- executing
    def execute(self, scheduled: list[ScheduledSeq], draft_q_for=None) -> StepOutput:
        """Run one step: for every sequence that reached its end, the tokens it emits, and for every sequence
        that computed prompt positions still missing their logprobs, those prompt logprobs (by seq_id).

        Without speculation that is one sampled token. A sequence verifying k draft tokens emits its
        accepted drafts followed by one token from the target (resampled or bonus). ``draft_q_for`` maps
        [(seq, j)] to the draft model's distributions for the rows (None: point-mass drafts, i.e. n-gram).
        """
        items = [_work_item(s) for s in scheduled]
        prompt_rows = {}
        if any(w.prompt_targets is not None for w in items):
            logits, starts, scored = self.run_prompt_step(items)
            prompt_rows = _prompt_logprob_rows(scheduled, items, scored)
        else:
            logits, starts = self.run_step(items)
        owners = []  # (scheduled seq, j) per logits row, in row order
        for s, start in sorted(zip(scheduled, starts), key=lambda p: p[1]):
            if s.samples:
                owners += [(s, j) for j in range(s.num_spec_tokens + 1)]
        if not owners:
            return StepOutput({}, prompt_rows)
        num_rows = logits.shape[0]
        rows = [(s.seq, s.seq.num_output_tokens + j) for s, j in owners]
        matchers = [s.seq.grammar for s, _ in owners]
        masked = any(m is not None for m in matchers)
        variant = choose_variant([s.seq.params for s, _ in owners], self.max_logprobs, masked)
        md = self.build_sampling_metadata(rows, num_rows, variant)
        bitmask = None
        if masked:  # while the device runs the step (dispatched asynchronously above)
            if not self.overlap_masks:
                jax.block_until_ready(logits)
            bitmask = np.full((num_rows, self.grammar_backend.words), -1, np.int32)
            self.grammar_backend.fill_bitmasks(matchers, bitmask)
        drafts = np.full(num_rows, -1, np.int32)
        drafts[: len(owners)] = [s.seq.spec_token_ids[j] if j < s.num_spec_tokens else -1 for s, j in owners]
        draft_q = None
        if self.draft_q_shape is not None and not variant.greedy:
            draft_q = draft_q_for([(s.seq, j) for s, j in owners], num_rows)
        key = ("tokens", num_rows, variant)
        if self.sharding_plan is not None:
            self.channel.publish(self.key_index(key), jax.tree.leaves(md) + [drafts] + ([bitmask] if masked else []))
        out = self.executables.get(key)(logits, md, drafts, draft_q, bitmask)
        tokens, logprobs, top_ids, top_lps, acc = host_values(
            out.tokens, out.logprobs, out.topk_ids, out.topk_logprobs, out.accepted)
        result: dict[int, list[SampledToken]] = {}
        for i, (s, j) in enumerate(owners):
            emitted = result.setdefault(s.seq.seq_id, [])
            if len(emitted) < j or (emitted and j > 0 and not acc[i - 1]):
                continue  # an earlier draft of this sequence was rejected: later rows are void
            n = s.seq.params.logprobs or 0
            # a token the constraint forbids (-inf) is no candidate: it is left out of the top logprobs
            top = {int(top_ids[i, m]): float(top_lps[i, m]) for m in range(n) if top_lps[i, m] > -np.inf}
            emitted.append(SampledToken(int(tokens[i]), float(logprobs[i]), top))
        return StepOutput(result, prompt_rows)

    def execute_multistep(self, scheduled: list[ScheduledSeq], num_steps: int) -> StepOutput:
        """Run ``num_steps`` (<= num_scheduler_steps) decode steps of a decode-only batch in one call: every
        sequence's ``num_steps`` chosen tokens (by seq_id). Each sequence must own blocks for its next
        ``num_steps - 1`` positions too. (A decode computes no prompt logprobs: the last prompt position's
        logits are the first sample's.)"""
        items = [WorkItem(s.seq.block_ids, s.seq.num_computed_tokens, [s.seq.token_ids[-1]], 1) for s in scheduled]
        shape = self.plan.shape_for([1] * len(items), len(items))
        batch, _ = pack(items, self.block_size, shape, self.max_blocks_per_seq)
        rows = [(s.seq, s.seq.num_output_tokens) for s in scheduled]  # row r is item r's
        variant = choose_variant([s.seq.params for s in scheduled], self.max_logprobs)
        md = self.build_sampling_metadata(rows, shape.num_logits, variant)
        out, self.kv_cache = self.executables.get(("multistep", shape, variant))(
            self.params, self.kv_cache, batch, md, np.int32(num_steps))
        tokens, logprobs, top_ids, top_lps = host_values(out.tokens, out.logprobs, out.topk_ids, out.topk_logprobs)
        result: dict[int, list[SampledToken]] = {}
        for r, s in enumerate(scheduled):
            n = s.seq.params.logprobs or 0
            result[s.seq.seq_id] = [
                SampledToken(int(tokens[i, r]), float(logprobs[i, r]),
                             {int(top_ids[i, r, m]): float(top_lps[i, r, m]) for m in range(n)})
                for i in range(num_steps)]
        return StepOutput(result)


def _work_item(s: ScheduledSeq) -> WorkItem:
    """The work of one scheduled sequence: its new tokens (drafts last), its logits rows, and the prompt token
    each position scores where prompt logprobs are missing."""
    seq, k = s.seq, s.num_spec_tokens
    start = seq.num_computed_tokens
    real = s.num_new_tokens - k
    tokens = seq.token_ids[start : start + real] + seq.spec_token_ids[:k]
    targets = None
    positions = s.prompt_logprob_positions
    if positions:
        targets = [-1] * len(tokens)
        for p in positions:
            targets[p - start] = seq.token_ids[p + 1]
    return WorkItem(seq.block_ids, start, tokens, (1 + k) if s.samples else 0, targets)


def _prompt_logprob_rows(scheduled: list[ScheduledSeq], items: list[WorkItem], scored) -> dict:
    """seq_id -> the ``PromptLogprobRow``s of the positions its item scored (``scored``: the prompt step's
    ``PromptLogprobs`` in the flat token layout, items laid out in order), each with the request's top k."""
    lps, ranks, top_ids, top_lps = host_values(scored.target_logprobs, scored.target_ranks, scored.topk_ids,
                                               scored.topk_logprobs)
    top_ranks = 1 + np.sum(top_lps[:, None, :] > top_lps[:, :, None], axis=-1)  # sorted: the rest are below
    out, t = {}, 0
    for s, w in zip(scheduled, items):
        if w.prompt_targets is not None:
            k = s.seq.params.prompt_logprobs
            out[s.seq.seq_id] = [
                PromptLogprobRow(w.start + i + 1, target, float(lps[t + i]), int(ranks[t + i]),
                                 [(int(top_ids[t + i, m]), float(top_lps[t + i, m]), int(top_ranks[t + i, m]))
                                  for m in range(min(k, top_ids.shape[1]))])
                for i, target in enumerate(w.prompt_targets) if target >= 0]
        t += len(w.tokens)
    return out
