"""``jaxinfer-bench latency`` (the default command) end to end on the embedded model, single- and multi-step."""

from __future__ import annotations

import argparse
import json

import pytest

from bench import latency


def _parse(argv):
    p = argparse.ArgumentParser()
    latency.add_arguments(p)
    return p.parse_args(argv)


@pytest.mark.parametrize("steps, decode_steps", [(1, 5), (4, 2)])  # 6 tokens: the prefill's, then 5 decoded
def test_latency_bench_runs_and_counts_tokens_per_step(tmp_path, steps, decode_steps):
    out = tmp_path / "latency.json"
    payload = latency.run(_parse(["--batch-sizes", "1", "2", "--input-len", "8", "--output-len", "6",
                                  "--num-scheduler-steps", str(steps), "--output", str(out)]))
    assert json.loads(out.read_text())["num_scheduler_steps"] == steps == payload["num_scheduler_steps"]
    assert payload["compilations_after_start"] == 0
    for r in payload["results"]:
        assert r["decode_steps"] == decode_steps  # a burst of 4, then the last token alone
        assert r["tpot_s"] > 0 and r["first_pass_tpot_s"] > 0 and 0 < r["bandwidth_fraction"]
        assert r["tok_per_s"] == pytest.approx(r["batch_size"] / r["tpot_s"])


def test_num_scheduler_steps_must_be_positive():
    with pytest.raises(SystemExit):
        _parse(["--num-scheduler-steps", "0"])
