"""AsyncLLMEngine without HTTP: ``async for`` outputs equal ``LLM.generate``; leaving the loop (or cancelling
the task) aborts the request and frees its KV blocks; bad input is a ValueError before anything is queued."""

from __future__ import annotations

import asyncio

import pytest

from jaxinfer import LLM, EngineConfig, SamplingParams
from jaxinfer.server import AsyncLLMEngine, EngineOverloadedError

CONFIG = dict(compilation="lazy", max_num_seqs=4, max_model_len=256)


@pytest.fixture(scope="module")
def engine():
    eng = AsyncLLMEngine.from_config(EngineConfig(**CONFIG))
    eng.start()
    yield eng
    eng.shutdown()


def test_generate_streams_what_llm_generate_returns(engine):
    prompts = ["def fibonacci(n):", "import sys\n"]
    params = SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True)
    ref = LLM(**CONFIG).generate(prompts, params, use_tqdm=False)

    async def one(i, p):
        outs = [out async for out in engine.generate(p, params, f"r{i}")]
        assert outs[-1].finished and not any(o.finished for o in outs[:-1]) and len(outs) > 1
        return outs[-1]

    async def main():
        return await asyncio.gather(*(one(i, p) for i, p in enumerate(prompts)))

    got = asyncio.run(main())
    assert [g.outputs[0].token_ids for g in got] == [r.outputs[0].token_ids for r in ref]
    assert [g.outputs[0].text for g in got] == [r.outputs[0].text for r in ref]
    assert got[0].prompt == prompts[0]


def _idle(engine) -> bool:
    s = engine.stats()
    return s["num_running"] == 0 and s["num_waiting"] == 0 and s["free_blocks"] == s["total_blocks"]


def test_leaving_the_loop_or_cancelling_aborts_and_frees_blocks(engine):
    params = SamplingParams(temperature=0.0, max_tokens=200, ignore_eos=True)

    async def main():
        async for out in engine.generate("def f(x):", params, "brk"):
            if len(out.outputs[0].token_ids) >= 3:
                break

        async def consume():
            async for _ in engine.generate("def g(x):", params, "cnl"):
                pass

        task = asyncio.ensure_future(consume())
        await asyncio.sleep(0.3)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        for _ in range(500):
            if _idle(engine) and not engine.engine.has_unfinished_requests():
                return True
            await asyncio.sleep(0.01)
        return False

    assert asyncio.run(main())


def test_bad_input_and_overload_queue_nothing(engine):
    async def main():
        with pytest.raises(ValueError, match="max_model_len"):
            async for _ in engine.generate({"prompt_token_ids": [1] * 300}, SamplingParams(), "bad"):
                pass
        engine.max_waiting_requests = 0
        try:
            with pytest.raises(EngineOverloadedError):
                async for _ in engine.generate("x", SamplingParams(), "over"):
                    pass
        finally:
            engine.max_waiting_requests = None

    asyncio.run(main())
    assert not engine.engine.has_unfinished_requests()
