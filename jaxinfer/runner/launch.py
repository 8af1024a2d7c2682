"""Launching a step without waiting for its tokens: the runner's side of async scheduling.

``ModelRunner.execute`` packs, runs and waits. Async scheduling (``jaxinfer.core.async_step``) splits that in
three so the host's work overlaps the device's:

- ``prepare(runner, scheduled)``: everything on the host — work items, the packed ``StepBatch``, the token
  chooser's rows and sampling metadata — while the previous step still runs. A sequence scheduled on a token
  that step has not delivered yet (``Sequence.num_pending_tokens``) gets a placeholder in the batch, and its
  flat position is recorded;
- ``PreparedStep.fill(tokens)``: once the previous step's tokens are on the host, they replace the
  placeholders (the only work between one step's end and the next one's launch);
- ``dispatch(runner, prepared)``: launches the step and its token chooser (JAX dispatches asynchronously) and
  returns a ``LaunchedStep``, whose ``collect()`` waits for the tokens and returns the ``StepOutput``.

The inputs the step finally runs on are the ones ``execute`` would have packed, so the tokens are the same.
Only plain steps launch this way: no draft tokens, no prompt logprobs, no grammar masks, no penalties or
``min_tokens`` (their inputs read the output history); the engine runs any other step synchronously.
"""

from __future__ import annotations

import dataclasses

import jax
import numpy as np

from jaxinfer.core.scheduler import ScheduledSeq
from jaxinfer.runner.batch_packing import WorkItem, pack
from jaxinfer.runner.model_runner import SampledToken
from jaxinfer.runner.multihost import host_values
from jaxinfer.runner.sampling_inputs import choose_variant

PLACEHOLDER = 0  # the token id packed where a pending token goes until fill() (any valid id would do)


@dataclasses.dataclass
class PreparedStep:
    scheduled: list[ScheduledSeq]
    key: tuple  # the step executable's
    batch: object  # StepBatch of numpy arrays
    owners: list[ScheduledSeq]  # one logits row each, in row order
    variant: object  # SamplerVariant
    metadata: object  # SamplingMetadata of numpy arrays
    pending: list[tuple[int, int]]  # (flat token position, seq_id) of each placeholder

    def fill(self, tokens: dict) -> None:
        """Put the previous step's tokens (seq_id -> [SampledToken]) where the placeholders are."""
        ids = self.batch.token_ids
        for position, seq_id in self.pending:
            ids[position] = tokens[seq_id][-1].token_id


@dataclasses.dataclass
class LaunchedStep:
    owners: list[ScheduledSeq]
    out: object  # the token chooser's outputs, on the device

    def collect(self) -> dict:
        """seq_id -> [SampledToken] (waits for the device)."""
        tokens, logprobs, top_ids, top_lps = host_values(
            self.out.tokens, self.out.logprobs, self.out.topk_ids, self.out.topk_logprobs)
        result = {}
        for i, s in enumerate(self.owners):
            n = s.seq.params.logprobs or 0
            top = {int(top_ids[i, m]): float(top_lps[i, m]) for m in range(n)}
            result[s.seq.seq_id] = [SampledToken(int(tokens[i]), float(logprobs[i]), top)]
        return result


def can_launch(scheduled: list[ScheduledSeq]) -> bool:
    """True when the step is a plain one that ``prepare`` handles (see the module docstring)."""
    for s in scheduled:
        if s.num_spec_tokens or s.prompt_logprob_positions or (s.samples and not s.seq.can_choose_ahead):
            return False
    return True


def prepare(runner, scheduled: list[ScheduledSeq]) -> PreparedStep:
    """Pack ``scheduled`` (a step ``can_launch`` accepts) on the host."""
    items, holes = [], []
    t = 0
    for s in scheduled:
        seq, start = s.seq, s.start
        tokens = seq.token_ids[start : start + s.num_new_tokens]
        for k in range(len(tokens), s.num_new_tokens):  # pending: chosen by the step in flight
            holes.append((t + k, seq.seq_id))
            tokens.append(PLACEHOLDER)
        items.append(WorkItem(seq.block_ids, start, tokens, 1 if s.samples else 0))
        t += s.num_new_tokens
    shape = runner.plan.shape_for([len(w.tokens) for w in items], sum(w.num_logits for w in items))
    batch, _ = pack(items, runner.block_size, shape, runner.max_blocks_per_seq)
    owners = [s for s in scheduled if s.samples]  # rows follow the items' order
    variant = metadata = None
    if owners:
        rows = [(s.seq, s.seq.num_output_tokens + s.seq.num_pending_tokens) for s in owners]
        variant = choose_variant([s.seq.params for s in owners], runner.max_logprobs)
        metadata = runner.build_sampling_metadata(rows, shape.num_logits, variant)
    return PreparedStep(scheduled, ("step", shape), batch, owners, variant, metadata, holes)


def dispatch(runner, prepared: PreparedStep) -> LaunchedStep | None:
    """Launch the step and its token chooser; None when no sequence samples (the step only fills K/V)."""
    if runner.sharding_plan is not None:
        runner.channel.publish(runner.key_index(prepared.key), _leaves(prepared.batch))
    logits, runner.kv_cache = runner.executables.get(prepared.key)(runner.params, runner.kv_cache, prepared.batch)
    if not prepared.owners:
        return None
    num_rows = logits.shape[0]
    drafts = np.full(num_rows, -1, np.int32)
    key = ("tokens", num_rows, prepared.variant)
    if runner.sharding_plan is not None:
        runner.channel.publish(runner.key_index(key), _leaves(prepared.metadata) + [drafts])
    out = runner.executables.get(key)(logits, prepared.metadata, drafts, None, None)
    return LaunchedStep(prepared.owners, out)


def _leaves(tree) -> list:
    return jax.tree.leaves(tree)
