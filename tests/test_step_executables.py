"""Step executables: a new shape runs padded in a compiled larger one while it compiles in the background,
with identical results; nothing fits -> the step waits; too costly a fallback is not used."""

from __future__ import annotations

import numpy as np
import pytest

from jaxinfer import LLM, SamplingParams
from jaxinfer.batch_packing import StepShape, WorkItem, pack, plan_shape
from jaxinfer.runner import ModelRunner
from tests.prompts import random_prompts

GREEDY = SamplingParams(temperature=0.0, max_tokens=20, ignore_eos=True)


@pytest.fixture(scope="module")
def engine_parts(hf_checkpoints):
    llm = LLM(model=str(hf_checkpoints["llama_gqa"]), max_model_len=128, num_kv_blocks=64, max_num_seqs=8,
              background_compilation=False)
    e = llm.llm_engine
    return e.model_config, e.runner.params


def _runner(cfg, params, background=True, ratio=3.0):
    r = ModelRunner(cfg, params, num_blocks=64, block_size=16, max_model_len=128, kv_dtype=np.float32,
                    background_compilation=background)
    r.executables.max_fallback_cost_ratio = ratio
    return r


def _decode_items(n):
    return [WorkItem([1 + 2 * i, 2 + 2 * i], 20, [7 + i], 1) for i in range(n)]


def _prefill_items(n, length=20):
    per_seq = -(-length // 16)
    return [WorkItem(list(range(1 + per_seq * i, 1 + per_seq * (i + 1))), 0, list(range(3, 3 + length)), 1)
            for i in range(n)]


def test_new_shape_runs_in_a_larger_compiled_one_with_identical_logits(engine_parts):
    cfg, params = engine_parts
    runner = _runner(cfg, params, ratio=1e9)
    runner.run_step(_prefill_items(4))  # nothing compiled yet: this one waits (blocking)
    assert runner.executables.num_blocking == 1
    big = next(iter(runner.executables._ready))
    small_items = _prefill_items(2)
    assert plan_shape(small_items, runner.max_blocks_per_seq) != big
    logits_fallback, rows = runner.run_step(small_items)
    assert runner.executables.num_fallback_steps == 1 and runner.executables.num_blocking == 1
    runner.executables.wait()
    logits_exact, rows_exact = runner.run_step(small_items)  # the same K/V rewritten, the exact shape now
    assert runner.executables.num_fallback_steps == 1
    assert rows == rows_exact
    np.testing.assert_allclose(np.asarray(logits_fallback)[:2], np.asarray(logits_exact)[:2], rtol=1e-5, atol=1e-5)


def test_a_step_nothing_compiled_can_hold_waits(engine_parts):
    cfg, params = engine_parts
    runner = _runner(cfg, params)
    runner.run_step(_decode_items(1))
    runner.run_step(_decode_items(4))  # 4 sequences do not fit the 1-sequence shape
    assert runner.executables.num_blocking == 2 and runner.executables.num_fallback_steps == 0


def test_too_costly_a_fallback_is_not_used(engine_parts):
    cfg, params = engine_parts
    runner = _runner(cfg, params, ratio=3.0)
    runner.run_step(_prefill_items(8, length=100))  # an expensive shape
    runner.run_step(_decode_items(1))  # fits in it, but costs far more than 3x a 1-token decode
    assert runner.executables.num_blocking == 2 and runner.executables.num_fallback_steps == 0


def test_without_background_compilation_every_new_shape_waits(engine_parts):
    cfg, params = engine_parts
    runner = _runner(cfg, params, background=False)
    runner.run_step(_prefill_items(4))
    runner.run_step(_prefill_items(2))
    assert runner.executables.num_blocking == 2 and runner.executables.num_fallback_steps == 0
    assert runner.num_compilations == 2


def test_greedy_tokens_identical_with_background_compilation_on_and_off(hf_checkpoints):
    prompts = random_prompts([3, 17, 40, 9, 64, 1], seed=5)
    outs = {}
    for background in (False, True):
        llm = LLM(model=str(hf_checkpoints["llama_gqa"]), max_model_len=128, num_kv_blocks=64, max_num_seqs=4,
                  max_num_batched_tokens=48, background_compilation=background)
        outs[background] = [o.outputs[0].token_ids for o in llm.generate(prompts, GREEDY, use_tqdm=False)]
        if background:
            assert llm.llm_engine.stats()["num_fallback_steps"] > 0  # the feature was exercised
    assert outs[True] == outs[False]


def test_stepshape_cost_grows_with_every_count():
    base = StepShape(16, 4, 4, 4, 8, 2)
    kw = dict(token_flops=10.0, context_flops=1.0, logits_flops=5.0, block_size=16)
    for bigger in (StepShape(32, 4, 4, 4, 8, 2), StepShape(16, 4, 8, 4, 8, 2), StepShape(16, 4, 4, 8, 8, 2),
                   StepShape(16, 4, 4, 4, 16, 2), StepShape(16, 8, 4, 4, 8, 2)):
        assert bigger.cost(**kw) > base.cost(**kw)


def test_a_nearly_as_cheap_compiled_shape_is_reused_without_compiling(engine_parts):
    cfg, params = engine_parts
    runner = _runner(cfg, params)
    runner.run_step([WorkItem([1, 2, 3, 4], 40, [7], 1)])  # 4 blocks per sequence
    need = plan_shape([WorkItem([5], 3, [7], 1)], runner.max_blocks_per_seq)  # 1 block: a little cheaper
    logits, _ = runner.run_step([WorkItem([5], 3, [7], 1)])
    runner.executables.wait()
    assert need not in runner.executables._ready  # not compiled: the 4-block shape serves it for good
    assert runner.executables.stats()["reused_shapes"] == 1 and runner.executables.num_blocking == 1
