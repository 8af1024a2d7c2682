"""``jaxinfer-bench gate-up`` on a small preset: both formulations give the same products, every figure is there."""

from __future__ import annotations

import argparse
import json

import pytest

from bench import gate_up


def test_split_and_fused_gate_up_agree_and_report(tmp_path, capsys):
    out = tmp_path / "gate_up.json"
    args = argparse.Namespace(model="llama-150m", rows=[1, 8], dtype="float32", repeats=2, peak_tflops=None,
                              output=str(out))
    gate_up.run(args)
    result = json.loads(out.read_text())
    assert (result["hidden"], result["intermediate"]) == (768, 2048)
    assert [r["rows"] for r in result["rows"]] == [1, 8]
    for r in result["rows"]:
        assert r["max_abs_diff"] < 1e-4  # the same dot products, one GEMM or two
        assert r["floor_ms"] > 0 and r["split"]["median_ms"] > 0 and r["fused"]["median_ms"] > 0
        assert abs(r["fused_speedup"] - r["split"]["median_ms"] / r["fused"]["median_ms"]) < 1e-9
    assert "split/fused" in capsys.readouterr().out


def test_rows_and_repeats_must_be_positive():
    args = argparse.Namespace(model="llama-150m", rows=[0], dtype="float32", repeats=2, peak_tflops=None, output=None)
    with pytest.raises(ValueError, match="must be positive"):
        gate_up.run(args)
