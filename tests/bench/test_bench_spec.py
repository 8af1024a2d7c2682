"""`jaxinfer-bench spec` on the embedded models, tiny settings: every method's greedy tokens equal the
non-speculative ones, the rows are complete, and bad counts are refused. Structure only, no timing."""

from __future__ import annotations

import argparse

import pytest

from bench import spec


def _parse(argv):
    p = argparse.ArgumentParser()
    spec.add_arguments(p)
    return p.parse_args(argv)


def test_spec_bench_interleaved_run(tmp_path):
    out = tmp_path / "spec.json"
    args = _parse(["--batch-sizes", "1", "2", "--tasks", "copy", "--output-len", "6", "--passage-tokens", "24",
                   "--repeats", "2", "--warmup-passes", "1", "--max-num-batched-tokens", "64",
                   "--output", str(out)])
    payload = spec.run(args)
    results = payload["results"]
    methods = {r["method"] for r in results}
    assert {"off", "ngram"} <= methods
    assert len(results) == len(methods) * 2  # every method at both batch sizes
    for r in results:
        assert r["greedy_identical"], (r["method"], r["batch_size"])
        assert len(r["pass_seconds"]) == 2 and r["tok_per_s"] > 0
        if r["method"] == "off":
            assert r["draft_tokens"] == 0 and r["speedup"] == 1.0
    assert out.is_file()


@pytest.mark.parametrize("bad", ["0", "-1", "two"])
def test_spec_bench_refuses_bad_counts(bad, capsys):
    with pytest.raises(SystemExit):
        _parse(["--repeats", bad])
    assert "expected a positive integer" in capsys.readouterr().err


class _FakeLLM:
    """Stands in for LLM in ``_warm_up``: each pass may compile and may change the rule's choices."""

    def __init__(self, compiles_per_pass, choices_per_pass):
        self.passes = 0
        self._compiles, self._choices = compiles_per_pass, choices_per_pass
        outer = self

        class _Ctl:
            def choices(self):
                return outer._choices[min(outer.passes, len(outer._choices) - 1)]

        class _Engine:
            spec_controller = _Ctl()

            def stats(self):
                return {"num_compilations": sum(outer._compiles[: outer.passes])}

        self.llm_engine = _Engine()

    def generate(self, *args, **kwargs):
        self.passes += 1


def test_warm_up_lasts_until_the_rule_settles_not_only_the_compiles():
    # no compile after the first pass, but the rule's choice at batch 16 flips until pass 4
    llm = _FakeLLM([3, 0, 0, 0, 0, 0, 0, 0], [{}, {16: 4}, {16: 0}, {16: 4}, {16: 0}, {16: 0}, {16: 0}])
    assert spec._warm_up(llm, [], None, max_passes=12)[0] == 6  # passes 5 and 6 changed nothing
    capped = _FakeLLM([1] * 20, [{}])
    assert spec._warm_up(capped, [], None, max_passes=5)[0] == 5
