"""LLM: the offline facade (vLLM's names). ``LLM(model=...).generate(prompts, params)``.

``generate`` validates every prompt before queuing any, so one bad prompt rejects the call and leaves the
engine exactly as it was; results come back in input order.
"""

from __future__ import annotations

import dataclasses
import itertools
from typing import Any
from typing import Sequence as Seq

from jaxinfer.config.engine import EngineConfig
from jaxinfer.core.progress import ProgressBar
from jaxinfer.llm_engine import LLMEngine
from jaxinfer.outputs import RequestOutput
from jaxinfer.sampling_params import SamplingParams

_ENGINE_FIELDS = {f.name for f in dataclasses.fields(EngineConfig)}


class LLM:
    def __init__(self, model: str | None = None, **kwargs: Any):
        unknown = sorted(set(kwargs) - _ENGINE_FIELDS)
        if unknown:
            raise TypeError(f"LLM() got unknown keyword argument(s) {unknown}; valid: {sorted(_ENGINE_FIELDS)}")
        self.llm_engine = LLMEngine(EngineConfig(model=model, **kwargs))
        self._counter = itertools.count()

    def close(self) -> None:
        """Stop publishing KV-cache events (``kv_events_config``); multi-process engines: on process 0, release
        the processes in ``follow()``. A no-op for an engine with neither."""
        self.llm_engine.close()

    def reset_prefix_cache(self) -> bool:
        """Forget every cached prefix block (vLLM's name); False while requests hold KV blocks."""
        return self.llm_engine.reset_prefix_cache()

    def get_tokenizer(self):
        return self.llm_engine.tokenizer

    def generate(
        self,
        prompts: Any,
        sampling_params: SamplingParams | Seq[SamplingParams] | None = None,
        use_tqdm: bool = True,
        priority: Seq[int] | None = None,
    ) -> list[RequestOutput]:
        if isinstance(prompts, (str, dict)):
            prompts = [prompts]
        if not isinstance(prompts, (list, tuple)):
            raise ValueError(f"prompts must be a prompt or a list of prompts, got {type(prompts).__name__}")
        if prompts and all(isinstance(p, int) for p in prompts):
            raise ValueError("pass token ids as {'prompt_token_ids': [...]}, not a bare list of ints")
        if sampling_params is None:
            sampling_params = SamplingParams()
        if isinstance(sampling_params, SamplingParams):
            params_list = [sampling_params] * len(prompts)
        else:
            params_list = list(sampling_params)
            if len(params_list) != len(prompts):
                raise ValueError(f"got {len(params_list)} SamplingParams for {len(prompts)} prompts")
        priorities = list(priority) if priority is not None else [0] * len(prompts)
        if len(priorities) != len(prompts):
            raise ValueError(f"got {len(priorities)} priorities for {len(prompts)} prompts")
        engine = self.llm_engine
        if not engine.is_leader:
            raise RuntimeError("this process follows process 0 (jax.distributed): call llm.llm_engine.follow() "
                               "here and generate on process 0")
        # one RequestOutput per request, when it finishes (vLLM's LLM does the same): no outputs built per step
        final: dict[int, SamplingParams] = {}
        for sp in params_list:
            if sp.output_kind == "cumulative" and id(sp) not in final:
                final[id(sp)] = dataclasses.replace(sp, output_kind="final_only")
        params_list = [final.get(id(sp), sp) for sp in params_list]
        for p, sp in zip(prompts, params_list):  # validate all before queuing any
            engine.validate_request(p, sp)
        ids = []
        for p, sp, prio in zip(prompts, params_list, priorities):
            rid = str(next(self._counter))
            engine.add_request(rid, p, sp, priority=prio)
            ids.append(rid)
        return self._run(ids, use_tqdm)

    def _run(self, ids: list[str], use_tqdm: bool) -> list[RequestOutput]:
        finished: dict[str, RequestOutput] = {}
        engine = self.llm_engine
        progress = ProgressBar("generate", len(ids)) if use_tqdm else None
        try:
            while engine.has_unfinished_requests():
                for out in engine.step():
                    if out.finished:
                        finished[out.request_id] = out
                        if progress:
                            progress.advance()
        finally:
            if progress:
                progress.close()
        return [finished[i] for i in ids]
