"""The serving benchmarks (`jaxinfer-bench serve`, `jaxinfer-bench prefix`) on a tiny HF-written checkpoint.

Structure and invariants only (every request completes with its requested length, percentiles are ordered,
the prefix cache hits only when enabled, plots are real PNGs); no timing thresholds.
"""

from __future__ import annotations

import argparse
import json
import math

import numpy as np
import pytest

from bench import prefix, serve
from bench.workload import (TimedRequest, WorkloadSpec, arrival_offsets, make_workload, percentiles, random_prompts,
                            workload_spec)
from tests import hf_oracle

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


@pytest.fixture(scope="module")
def tiny_llama(tmp_path_factory):
    hf_oracle.skip_unless_available()
    config = dict(vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                  num_key_value_heads=2, max_position_embeddings=256)
    path = tmp_path_factory.mktemp("serving") / "tiny-llama"
    return str(hf_oracle.write_random_checkpoint("LlamaConfig", config, path, seed=0))


def _parse(module, argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser()
    module.add_arguments(p)
    return p.parse_args(argv)


def _assert_ordered(stats: dict) -> None:
    assert stats["p50"] <= stats["p90"] <= stats["p99"]
    assert all(math.isfinite(stats[k]) and stats[k] >= 0 for k in ("p50", "p90", "p99", "mean"))


def _assert_run(run: dict, workload: list[TimedRequest]) -> None:
    requested = {r.request_id: r.output_len for r in workload}
    assert run["num_requests"] == len(workload) == len(run["requests"])
    for q in run["requests"]:
        assert q["output_len"] == q["requested_output_len"] == requested[q["request_id"]]
        assert 0 <= q["queue_s"] <= q["ttft_s"] <= q["e2e_s"]
    assert run["total_output_tokens"] == sum(requested.values())
    for key in ("ttft_s", "tpot_s", "itl_s", "e2e_s", "queue_s"):
        _assert_ordered(run[key])
    assert run["output_throughput_tok_s"] == pytest.approx(run["total_output_tokens"] / run["makespan_s"])
    # the makespan starts at the first arrival: it covers every request's life
    assert run["makespan_s"] >= max(q["arrival_s"] + q["e2e_s"] for q in run["requests"]) - 1e-6
    occ = run["occupancy"]
    assert len(occ) == run["num_steps"] > 0
    assert all(0 <= s["num_running"] <= run["max_batch_occupancy"] for s in occ)
    # the engine compiled its plan at start: no pass compiles anything
    assert run["num_compilations_during_run"] == run["first_pass"]["num_compilations_during_run"] == 0
    assert run["num_compilations_after_start"] == 0 and run["compile_stall_s"] == 0
    first = run["first_pass"]
    assert first["num_requests"] == run["num_requests"] and first["total_output_tokens"] == run["total_output_tokens"]
    _assert_ordered(first["e2e_s"])


def test_arrival_offsets_match_rate_and_shape():
    rng = np.random.default_rng(0)
    poisson = arrival_offsets(20001, rate=4.0, burstiness=1.0, rng=rng)
    gaps = np.diff(poisson)
    assert poisson[0] == 0 and np.all(gaps >= 0)
    assert gaps.mean() == pytest.approx(0.25, rel=0.03)
    assert gaps.std() / gaps.mean() == pytest.approx(1.0, rel=0.05)  # exponential: CV 1
    bursty = np.diff(arrival_offsets(20001, rate=4.0, burstiness=0.25, rng=rng))
    assert bursty.std() / bursty.mean() == pytest.approx(2.0, rel=0.1)  # gamma shape k: CV 1/sqrt(k)
    assert np.all(arrival_offsets(5, math.inf, 1.0, rng) == 0)


def test_workload_variants_share_schedule_not_tokens():
    spec = WorkloadSpec(8, 10.0, 1.0, (3, 9), (2, 7), seed=3)
    a, b = make_workload(spec, 100, 0), make_workload(spec, 100, 1)
    assert [(r.arrival_s, len(r.prompt_token_ids), r.output_len) for r in a] == \
           [(r.arrival_s, len(r.prompt_token_ids), r.output_len) for r in b]
    assert [r.prompt_token_ids for r in a] != [r.prompt_token_ids for r in b]
    assert all(3 <= len(r.prompt_token_ids) <= 9 and 2 <= r.output_len <= 7 for r in a)
    assert all(0 <= t < 100 for r in a for t in r.prompt_token_ids)


def test_random_prompts_draw_one_prompt_after_the_other():
    """The batch builder of latency / paged / serve-model: the same draws as one ``rng.integers`` per prompt."""
    prompts = random_prompts(np.random.default_rng([0, 4]), 4, 7, 50)
    rng = np.random.default_rng([0, 4])
    assert prompts == [{"prompt_token_ids": rng.integers(0, 50, size=7).tolist()} for _ in range(4)]
    assert all(len(p["prompt_token_ids"]) == 7 and all(type(t) is int for t in p["prompt_token_ids"]) for p in prompts)


def test_percentiles_against_numpy():
    v = np.random.default_rng(1).exponential(size=101)
    p = percentiles(v)
    assert p["p50"] == pytest.approx(np.median(v)) and p["mean"] == pytest.approx(v.mean())
    assert p["p99"] == pytest.approx(np.sort(v)[99])  # linear interpolation: index 0.99 * 100
    assert math.isnan(percentiles([])["p50"])


def test_serve_compare(tiny_llama, tmp_path):
    out = tmp_path / "serve.json"
    args = _parse(serve, [
        "--model", tiny_llama, "--dtype", "float32", "--num-requests", "6", "--rate", "40",
        "--input-len-range", "4", "20", "--output-len-range", "2", "12", "--max-num-seqs", "4",
        "--static-batch-timeout", "0.02", "--passes", "2", "--max-num-batched-tokens", "32",
        "--max-model-len", "64", "--compare", "--plot", str(tmp_path / "plots"), "--output", str(out)])
    payload = serve.run(args)
    assert json.loads(out.read_text())["runs"].keys() == {"static", "continuous"}
    workload = make_workload(workload_spec(args), 256)
    for mode in ("static", "continuous"):
        run = payload["runs"][mode]
        assert run["batching"] == mode
        _assert_run(run, workload)
        assert run["max_batch_occupancy"] <= 4
    ratios = payload["ratios"]
    assert set(ratios) >= {"e2e_p50_static_over_continuous", "throughput_continuous_over_static", "first_pass"}
    assert all(v > 0 for v in [*ratios["first_pass"].values(), *(v for k, v in ratios.items() if k != "first_pass")])
    for path in payload["plots"].values():
        assert open(path, "rb").read(8) == PNG_MAGIC


def test_serve_single_mode_fixed_lengths_one_pass(tiny_llama):
    args = _parse(serve, [
        "--model", tiny_llama, "--dtype", "float32", "--num-requests", "3", "--rate", "inf", "--input-len", "5",
        "--output-len", "4", "--passes", "1", "--batching", "continuous", "--max-num-seqs", "4",
        "--max-num-batched-tokens", "32", "--max-model-len", "64"])
    payload = serve.run(args)
    assert list(payload["runs"]) == ["continuous"] and payload["ratios"] is None and payload["plots"] == {}
    run = payload["runs"]["continuous"]
    _assert_run(run, make_workload(workload_spec(args), 256))
    assert all(q["input_len"] == 5 for q in run["requests"])
    assert run["max_batch_occupancy"] == 3  # all arrive at once and fit in one batch
    assert len(run["occupancy"]) == 4  # one step per output token (prefill samples the first)


def test_prefix_cache_off_and_on(tiny_llama, tmp_path):
    out = tmp_path / "prefix.json"
    args = _parse(prefix, [
        "--model", tiny_llama, "--dtype", "float32", "--num-requests", "4", "--doc-len", "40",
        "--question-len-range", "3", "5", "--output-len", "3", "--passes", "2", "--max-num-seqs", "4",
        "--max-num-batched-tokens", "32", "--max-model-len", "64", "--plot", str(tmp_path), "--output", str(out)])
    payload = prefix.run(args)
    ratios = json.loads(out.read_text())["ratios"]
    assert ratios["first_pass"] == pytest.approx(payload["ratios"]["first_pass"])
    assert {k: v for k, v in ratios.items() if k != "first_pass"} == pytest.approx(
        {k: v for k, v in payload["ratios"].items() if k != "first_pass"})
    spec = prefix.PrefixSpec(4, 40, (3, 5), 3, math.inf, 1.0, 0)
    workload = prefix.make_prefix_workload(spec, 256)
    assert all(r.prompt_token_ids[:40] == workload[0].prompt_token_ids[:40] for r in workload)
    off, on = payload["runs"]["caching off"], payload["runs"]["caching on"]
    for run in (off, on):
        _assert_run(run, workload)
        assert run["prefix_cache_query_tokens"] >= 0
    assert off["prefix_cache_hit_tokens"] == 0
    assert all(q["num_cached_tokens"] == 0 for q in off["requests"])
    # the document is 40 tokens = 2 full blocks of 16: the 3 requests after the first hit both
    assert on["prefix_cache_hit_tokens"] == 3 * 32
    assert sorted(q["num_cached_tokens"] for q in on["requests"]) == [0, 32, 32, 32]
    for path in payload["plots"].values():
        assert open(path, "rb").read(8) == PNG_MAGIC
