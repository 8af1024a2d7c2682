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
                         "--configs", "plain",
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
            assert set(r["calls_s"]) == {"1", "3"} and all(len(v) == 2 for v in r["calls_s"].values())
    assert (tmp_path / "startup.json").is_file()
