"""`jaxinfer-bench phase1` on tiny settings: every optimization has a row; rows carry a measured value (or say
"not implemented"), their command and machine; an experiment that fails makes the command fail after the
others ran; plots are real PNGs. Structure only, no timing."""

from __future__ import annotations

import argparse
import json

import pytest

from bench import phase1

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def _parse(argv):
    p = argparse.ArgumentParser()
    phase1.add_arguments(p)
    return p.parse_args(argv)


def test_every_optimization_has_one_row_with_settings_for_every_mode():
    assert [r.optimization for r in phase1.ROWS] == list(phase1.OPTIMIZATIONS)
    for r in phase1.ROWS:
        assert r.phase in ("prefill", "decode", "both") and r.saves in ("waiting", "memory", "compute", "bandwidth")
        assert r.quick_args and r.tiny_args and r.seed


def test_tiny_run_of_a_cheap_row(tmp_path):
    out = tmp_path / "phase1.json"
    args = _parse(["--tiny", "--only", "moe", "--results-dir", str(tmp_path / "results"),
                   "--plots", str(tmp_path / "plots"), "--output", str(out)])
    payload = phase1.run(args)
    assert json.loads(out.read_text())["rows"] == payload["rows"]
    assert payload["settings"] == "tiny" and payload["machine"]["cpu"] and payload["complete"]
    [row] = payload["rows"]
    assert row["optimization"] == "moe" and row["measured"] not in ("failed", "not implemented", "")
    assert row["command"].split("jaxinfer-bench ")[-1].startswith("moe ")
    assert row["machine"]["jax_version"] and (tmp_path / "results" / row["result_file"]).is_file()
    assert {r["batch_size"] for r in row["details"]["summary"]} == {1}
    assert set(payload["plots"]) == {"moe"} and open(payload["plots"]["moe"], "rb").read(8) == PNG_MAGIC


def test_missing_and_failing_experiments(tmp_path, monkeypatch):
    row = phase1.ROWS[-1]
    missing = phase1.run_row(row, "tiny", tmp_path, available=set())
    assert missing["measured"] == "not implemented" and "no `jaxinfer-bench" in missing["reason"]
    broken = phase1.Row("moe", "moe", "decode", "bandwidth", "seed", ("--no-such-flag",), (), phase1._moe,
                        tiny_args=("--no-such-flag",))
    failed = phase1.run_row(broken, "tiny", tmp_path, available={"moe"})
    assert failed["measured"] == "failed" and "exit status 2" in failed["error"]
    monkeypatch.setattr(phase1, "ROWS", (broken,))
    with pytest.raises(SystemExit, match="1 experiment"):
        phase1.run(_parse(["--tiny", "--results-dir", str(tmp_path)]))


def test_time_budget_skips_and_kills_rows(tmp_path):
    moe = next(r for r in phase1.ROWS if r.optimization == "moe")
    skipped = phase1.run_row(moe, "tiny", tmp_path, available={"moe"}, timeout_s=0)
    assert skipped["measured"] == "skipped" and "budget" in skipped["reason"]
    killed = phase1.run_row(moe, "tiny", tmp_path, available={"moe"}, timeout_s=0.2)  # jax alone takes longer
    assert killed["measured"] == "timed out" and not (tmp_path / "moe.json").exists()


@pytest.mark.parametrize("bad", ["0", "-5", "soon"])
def test_time_budget_must_be_a_positive_number(bad, capsys):
    with pytest.raises(SystemExit):
        _parse(["--tiny", "--time-budget-s", bad])
    assert "--time-budget-s" in capsys.readouterr().err
