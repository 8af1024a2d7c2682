"""`jaxinfer-bench startup` on a tiny HF-written checkpoint and a small plan: a cold and a warm fresh process
per configuration, the warm one loading every executable the cold one compiled. Structure only, no timing."""

from __future__ import annotations

import argparse

from bench import startup


def test_startup_bench_cold_then_warm(hf_checkpoints, tmp_path):
    p = argparse.ArgumentParser()
    startup.add_arguments(p)
    args = p.parse_args(["--model", str(hf_checkpoints["llama_gqa"]), "--output-len", "3", "--calls", "2",
                         "--batch-sizes", "1", "3", "--max-num-seqs", "4", "--max-num-batched-tokens", "16",
                         "--configs", "plain", "--prompt-lens", "short", "20",
                         "--output", str(tmp_path / "startup.json")])
    payload = startup.run(args)
    rows = {(r["config"], r["cache"]): r for r in payload["results"]}
    assert set(rows) == {("plain", "cold"), ("plain", "warm")}
    for config in ("plain",):
        cold, warm = rows[(config, "cold")], rows[(config, "warm")]
        assert cold["from_cache"] == 0 and cold["executables"] > 0
        assert warm["from_cache"] == warm["executables"] == cold["executables"]
        for r in (cold, warm):
            assert r["compilations_after_start"] == 0
            cases = {"b1", "b3", "b1p20", "b3p20"}
            assert set(r["calls_s"]) == set(r["mean_ttft_s"]) == cases
            assert all(len(v) == 2 for v in r["calls_s"].values())
            assert all(r[f"{c}_ttft_first_over_last"] > 0 for c in cases)
    assert (tmp_path / "startup.json").is_file()


class _Engine:  # what _prompt_ids reads of an engine without a tokenizer
    tokenizer = None

    class model_config:
        vocab_size = 1000


def test_long_prompts_are_new_every_call_and_request():
    """No two long prompts of a run share their first KV block (so no call hits the prefix cache)."""
    prompts = [tuple(ids) for call in range(5) for ids in startup._prompt_ids(_Engine, 16, 400, call)]
    assert all(len(p) == 400 for p in prompts)
    assert len({p[:16] for p in prompts}) == len(prompts) == 80
    short = [startup._prompt_ids(_Engine, 4, "short", call) for call in range(2)]
    assert short[0] == short[1] and all(len(p) < 16 for p in short[0])
