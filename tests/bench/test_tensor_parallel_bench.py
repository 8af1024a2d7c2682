"""``jaxinfer-bench tp`` and ``jaxinfer-bench moe`` pieces that run without simulated devices."""

from __future__ import annotations

import argparse

import jax.numpy as jnp
import pytest

from bench import moe as moe_bench
from bench import tp as tp_bench
from jaxinfer.config.presets import preset_config


def test_prediction_model():
    # one device: bytes / bandwidth, no communication
    assert tp_bench.predicted_time(8e9, 0, 0, 1, 4e12, 1e-5, 4.5e11) == pytest.approx(2e-3)
    # two devices: half the bytes, 57 all-reduces of 7 KB: latency dominates the communication
    t2 = tp_bench.predicted_time(4e9, 57, 7168, 2, 4e12, 1e-5, 4.5e11)
    assert t2 == pytest.approx(1e-3 + 57 * (1e-5 + 7168 / 4.5e11))


def test_tp_bench_runs_on_one_device(tmp_path):
    parser = argparse.ArgumentParser()
    tp_bench.add_arguments(parser)
    args = parser.parse_args(["--model", "random:qwen2.5-0.5b", "--tp-sizes", "1", "--context", "64",
                              "--output", str(tmp_path / "tp.json")])
    payload = tp_bench.run(args)
    (r,) = payload["results"]
    assert r["tp"] == 1 and r["all_reduces"] == 0 and r["predicted_speedup"]["accelerator"] == 1.0
    cfg = preset_config("qwen2.5-0.5b")
    assert r["weight_bytes_per_device"] == cfg.num_params * 2  # bf16, nothing split
    assert (tmp_path / "tp.json").is_file()


def test_moe_bench_bytes_follow_experts_touched():
    cfg = preset_config("moe-240m")
    all_read = moe_bench.weight_bytes_read(cfg, 4, cfg.num_experts)
    two = moe_bench.weight_bytes_read(cfg, 4, 2)
    assert all_read - two == 4 * cfg.num_layers * 6 * cfg.expert_params
    dense = preset_config("moe-240m-dense")
    assert moe_bench.weight_bytes_read(dense, 4, 0) == pytest.approx(all_read, rel=1e-3)
    shape, batches, num_blocks = moe_bench.decode_batches(cfg, 3, 40, 2, seed=0)
    assert len(batches) == 2 and shape.num_seqs == 4 and num_blocks == 1 + 3 * 3
    assert list(batches[0].kv_lens[:3]) == [41, 41, 41] and batches[0].kv_lens[3] == 0
    assert jnp.dtype(batches[0].token_ids.dtype) == jnp.int32
