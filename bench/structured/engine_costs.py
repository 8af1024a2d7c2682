"""What a constraint costs in the engine (in process, the embedded model), measured in one run:

* ``cost``: TPOT with a constraint over TPOT without, on the same prompts and output lengths: each constrained
  request's output length is measured first (jump-forward off, so every token is a decode step), then the same
  prompts run free (``ignore_eos``) to exactly those lengths; batch 1 (one request at a time) and batch 16
  (16 requests, 16 schemas, at once); alternated ``repeats`` times, medians reported, the first repetition
  (the first call after ``LLM(...)``) also on its own. The host time of the masks per token (computed while the
  device runs the step) is reported beside it.
* ``overlap``: the same 16 constrained requests with the masks computed while the device runs each step and
  after it (whether computing them in the device's shadow pays on this machine).
* ``jump_forward``: end-to-end time of the same constrained batch with jump-forward off and on (the engine's
  switch flipped between runs, alternating), with the outputs checked identical token for token, and the share
  of output tokens the grammar forced.
* ``startup``: ``LLM(...)`` construction with a fresh compile cache (cold) and again (warm), with structured
  outputs on (the masked token choosers compiled) and disabled.
"""

from __future__ import annotations

import statistics
import tempfile
import time

from bench.structured.schemas import SCHEMAS

PROMPT = "User: write one {} record as JSON.\nAssistant:"


def _tpot(outputs) -> float:
    """Mean over requests of (finished - first token) / (tokens - 1): seconds per output token after the first."""
    values = [(o.metrics.finished_time - o.metrics.first_token_time) / (len(o.outputs[0].token_ids) - 1)
              for o in outputs if len(o.outputs[0].token_ids) > 1]
    return statistics.mean(values)


def _constrained(schema: dict, max_tokens: int):
    from jaxinfer import SamplingParams, StructuredOutputsParams

    return SamplingParams(temperature=0.0, max_tokens=max_tokens, structured_outputs=StructuredOutputsParams(json=schema))


def _generate(llm, prompts, params):
    return llm.generate(prompts, params, use_tqdm=False)


def measure_cost(llm, batch: int, repeats: int = 3, max_tokens: int = 400) -> dict:
    from jaxinfer import SamplingParams

    engine = llm.llm_engine
    engine.output_processor.jump_forward = False  # every token a decode step: the mask's cost alone
    chosen = SCHEMAS[:batch] if batch > 1 else SCHEMAS[:4]
    prompts = [PROMPT.format(name.replace("_", " ")) for name, _ in chosen]
    params = [_constrained(schema, max_tokens) for _, schema in chosen]
    ratios, constrained_tpot, free_tpot, mask_us = [], [], [], []
    for _ in range(repeats):
        stats0 = engine.stats()
        if batch > 1:
            outs = _generate(llm, prompts, params)
        else:
            outs = [o for p, sp in zip(prompts, params) for o in _generate(llm, [p], sp)]
        stats1 = engine.stats()
        lengths = [len(o.outputs[0].token_ids) for o in outs]
        free = [SamplingParams(temperature=0.0, max_tokens=n, ignore_eos=True) for n in lengths]
        if batch > 1:
            frees = _generate(llm, prompts, free)
        else:
            frees = [o for p, sp in zip(prompts, free) for o in _generate(llm, [p], sp)]
        assert [len(o.outputs[0].token_ids) for o in frees] == lengths
        c, f = _tpot(outs), _tpot(frees)
        constrained_tpot.append(c * 1e3)
        free_tpot.append(f * 1e3)
        ratios.append(c / f)
        masks = stats1["structured_masks"] - stats0["structured_masks"]
        mask_us.append((stats1["structured_mask_seconds"] - stats0["structured_mask_seconds"]) / max(masks, 1) * 1e6)
    engine.output_processor.jump_forward = True
    return {"batch": batch, "requests": len(prompts), "output_tokens": lengths,
            "tpot_constrained_ms": _round(constrained_tpot), "tpot_free_ms": _round(free_tpot),
            "ratio": _round(ratios, 3), "ratio_median": round(statistics.median(ratios), 3),
            "ratio_first_call": round(ratios[0], 3), "mask_us_per_token": _round(mask_us, 1)}


def measure_overlap(llm, repeats: int = 3, max_tokens: int = 400) -> dict:
    """End-to-end time of 16 constrained requests at once (jump-forward off) with the masks computed while the
    device runs each step and after it (``ModelRunner.overlap_masks``; its default: after on a CPU), alternating."""
    engine = llm.llm_engine
    engine.output_processor.jump_forward = False
    prompts = [PROMPT.format(name.replace("_", " ")) for name, _ in SCHEMAS[:16]]
    params = [_constrained(schema, max_tokens) for _, schema in SCHEMAS[:16]]
    times = {True: [], False: []}
    default = engine.runner.overlap_masks
    for _ in range(repeats):
        for overlap in (False, True):
            engine.runner.overlap_masks = overlap
            t0 = time.perf_counter()
            _generate(llm, prompts, params)
            times[overlap].append(time.perf_counter() - t0)
    engine.runner.overlap_masks = default
    engine.output_processor.jump_forward = True
    return {"seconds_overlapped": _round(times[True], 3), "seconds_after_step": _round(times[False], 3),
            "speedup_median": round(statistics.median(times[False]) / statistics.median(times[True]), 3)}


def measure_jump_forward(llm, schemas, repeats: int = 3, max_tokens: int = 400) -> dict:
    engine = llm.llm_engine
    prompts = [PROMPT.format(name.replace("_", " ")) for name, _ in schemas]
    params = [_constrained(schema, max_tokens) for _, schema in schemas]
    times = {False: [], True: []}
    tokens = {}
    forced = 0
    for _ in range(repeats):
        for on in (False, True):
            engine.output_processor.jump_forward = on
            before = engine.stats()["num_forced_tokens"]
            t0 = time.perf_counter()
            outs = _generate(llm, prompts, params)
            times[on].append(time.perf_counter() - t0)
            ids = [o.outputs[0].token_ids for o in outs]
            assert tokens.setdefault(on, ids) == ids
            if on:
                forced = engine.stats()["num_forced_tokens"] - before
    engine.output_processor.jump_forward = True
    total = sum(len(t) for t in tokens[True])
    return {"schemas": [n for n, _ in schemas], "identical": tokens[True] == tokens[False],
            "output_tokens": total, "forced_tokens": forced, "forced_share": round(forced / total, 3),
            "seconds_off": _round(times[False], 3), "seconds_on": _round(times[True], 3),
            "speedup_median": round(statistics.median(times[False]) / statistics.median(times[True]), 3)}


def measure_startup(engine_kwargs: dict) -> dict:
    from jaxinfer import LLM

    out = {}
    for backend in ("auto", "disabled"):
        with tempfile.TemporaryDirectory() as cache:
            for run in ("cold", "warm"):
                t0 = time.perf_counter()
                llm = LLM(**engine_kwargs, compilation_cache_dir=cache,
                          structured_outputs_config={"backend": backend})
                seconds = time.perf_counter() - t0
                out[f"{backend}_{run}_s"] = round(seconds, 2)
                out[f"{backend}_executables"] = llm.llm_engine.stats()["num_compilations"]
                del llm
    return out


def _round(values, digits: int = 2) -> list[float]:
    return [round(v, digits) for v in values]
