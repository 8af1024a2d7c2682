"""``jaxinfer-bench structured`` runs its engine measurements end to end (numbers are not judged here: timing
belongs to the bench), and jump-forward's outputs are identical to masked decoding on the schema suite."""

from __future__ import annotations

import argparse

import pytest

from bench import registry
from bench.structured import engine_costs
from bench.structured.schemas import SCHEMAS
from jaxinfer import LLM


@pytest.fixture(scope="module")
def llm():
    return LLM(compilation="lazy", max_num_seqs=4, max_model_len=512)


def test_jump_forward_measurement_is_identical_and_counts_forced_tokens(llm):
    fixed = [s for s in SCHEMAS if s[0] == "long_fixed_parts"]
    row = engine_costs.measure_jump_forward(llm, fixed + list(SCHEMAS[:3]), repeats=1, max_tokens=120)
    assert row["identical"] and 0 < row["forced_tokens"] <= row["output_tokens"]
    assert len(row["seconds_off"]) == len(row["seconds_on"]) == 1


def test_cost_measurement_matches_lengths(llm):
    row = engine_costs.measure_cost(llm, batch=1, repeats=1, max_tokens=40)
    assert row["requests"] == 4 and len(row["ratio"]) == 1 and row["ratio"][0] > 0
    assert row["mask_us_per_token"][0] > 0
    assert llm.llm_engine.output_processor.jump_forward  # switched back on


def test_registered_with_the_cli():
    for name in ("structured", "structured-masks"):
        module = registry.load(name)
        module.add_arguments(argparse.ArgumentParser())
