"""``jaxinfer-bench quant`` end to end on a tiny HF-written Llama (untied LM head): every variant timed at
every shape, the weight bytes each reads, greedy agreement (the LM-head variant through a converted
checkpoint), llama.cpp's rows skipped with a reason."""

from __future__ import annotations

import argparse
import json

from bench import quant


def _parse(argv):
    p = argparse.ArgumentParser()
    quant.add_arguments(p)
    return p.parse_args(argv)


def test_quant_bench_rows_bytes_and_agreement(hf_checkpoints, tmp_path):
    model = str(hf_checkpoints["llama_gqa"])
    out = tmp_path / "quant.json"
    payload = quant.run(_parse(["--quick", "--model", model, "--agreement-model", model, "--methods", "unquantized",
                                "int8", "int8_lm_head", "--steps", "1", "--agreement-tokens", "6", "--no-llamacpp",
                                "--output", str(out)]))
    assert json.loads(out.read_text())["results"] == json.loads(json.dumps(payload["results"], default=str))
    rows = {(r["method"], r["shape"]): r for r in payload["results"]}
    assert set(rows) == {(m, s) for m in ("unquantized", "int8", "int8_lm_head")
                         for s in ("decode-b1", "decode-b8", "prefill-64")}
    assert all(r["step_s"] > 0 and r["tok_per_s"] > 0 and r["floor_s"] > 0 for r in rows.values())
    dense, int8, head = (rows[m, "decode-b1"]["weight_bytes_read"] for m in ("unquantized", "int8", "int8_lm_head"))
    assert head < int8 < dense  # the untied LM head is read in 8 bits too
    agreement = payload["greedy_agreement"]
    assert agreement["unquantized"] == {"identical_prefix": 12, "of": 12}
    assert all(0 < agreement[m]["identical_prefix"] <= 12 for m in ("int8", "int8_lm_head"))
    assert {r["method"]: r["status"] for r in payload["llamacpp"]} == {"llama.cpp-f32": "skipped",
                                                                         "llama.cpp-q8_0": "skipped"}
