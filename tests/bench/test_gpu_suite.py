"""bench/gpu_suite.sh and bench/gpu_suite.py: the gpu_compile stage's summary, the latency rows, and the script's
own bookkeeping (every stage has a limit in both modes; at most 8 files go to $OUT, the device tool's limit)."""

from __future__ import annotations

import json
import re
from pathlib import Path

from bench import gpu_suite

SUITE = Path(__file__).resolve().parents[2] / "bench" / "gpu_suite.sh"


def _entry(case, verdict, status="compiled", message=None, spill_bytes=0, sm="sm_90"):
    return {"target": "h200", "sm": sm, "group": "g", "case": case, "status": status, "message": message,
            "seconds": 1.0, "kernels": [], "summary": {"verdict": verdict, "spill_bytes": spill_bytes}}


def test_summary_counts_gpu_compile_verdicts_per_target(tmp_path, capsys):
    payload = {"experiment": "gpu-compile", "jax": "0.11.2", "python": "3.12.1", "targets": ["h200", "a100"],
               "groups": ["attention"], "quick": True, "layers": 1, "seconds": 34.4,
               "results": [_entry("a", "ok"), _entry("b", "ok"), _entry("m", "failed", "failed", "boom\nmore"),
                           _entry("q", "spills", spill_bytes=8),
                           _entry("fp8", "refused", "refused", "no fp8 tensor cores", sm="sm_80")]}
    (tmp_path / "gpu_compile.json").write_text(json.dumps(payload))
    s = gpu_suite.summarize(tmp_path, None, gpu_compile_file=tmp_path / "gpu_compile.json")
    g = s["gpu_compile"]
    assert g["counts"]["sm_90"] == {"ok": 2, "refused": 0, "failed": 1, "spills": 1, "over-limit": 0}
    assert g["counts"]["sm_80"]["refused"] == 1 and g["entries"] == 5 and g["jax"] == "0.11.2"
    assert g["problems"] == ["sm_90 m: failed (boom)", "sm_90 q: spills (8 spill bytes)"]
    written = json.loads((tmp_path / "summary.json").read_text())
    assert written["embedded"]["gpu_compile"] == payload and written["gpu_compile"] == g
    out = capsys.readouterr().out
    assert "gpu_compile (deviceless, jax 0.11.2, 5 entries, 34 s): sm_90: ok 2, refused 0, failed 1, spills 1" in out
    assert "   ! sm_90 m: failed (boom)" in out and "gpu_compile: 0 bytes" not in out and "bytes embedded" not in out


def test_summary_without_gpu_compile_result(tmp_path, capsys):
    s = gpu_suite.summarize(tmp_path, None, gpu_compile_file=tmp_path / "missing.json")
    assert s["gpu_compile"] is None and s["embedded"]["gpu_compile"] is None
    assert "gpu_compile: no result" in capsys.readouterr().out


def test_latency_rows_read_compilations_after_start(tmp_path, capsys):
    row = {"batch_size": 1, "tpot_s": 0.01, "floor_s": 0.005, "bandwidth_fraction": 0.5, "tok_per_s": 100.0}
    (tmp_path / "latency_m_pallas.json").write_text(json.dumps({"model": "m", "compilations_after_start": 0,
                                                                "results": [row]}))
    s = gpu_suite.summarize(tmp_path, None)
    assert s["latency"]["latency_m_pallas"]["compilations_after_start"] == 0
    assert "compilations after start 0" in capsys.readouterr().out


def _limits(text: str) -> list[set[str]]:
    return [set(re.findall(r"(\w+)=\d+", m)) for m in re.findall(r"LIMITS=\(([^)]*)\)", text)]


def test_every_stage_has_a_limit_in_both_modes():
    text = SUITE.read_text()
    stages = re.findall(r"^run_stage (\w+) ", text, re.M)
    assert stages[0] == "gpu_compile" and stages[1] == "ceilings"
    smoke, device = _limits(text)
    assert set(stages) <= smoke and set(stages) <= device, (set(stages) - smoke, set(stages) - device)


def test_at_most_eight_files_go_to_out():
    text = SUITE.read_text()
    # the files the stages write under $OUT; each latency stage writes one (three of them), plus the log and summary
    targets = set(re.findall(r'"\$OUT/([^"]+)"', text)) | {"suite.log", "summary.json"}
    assert "gpu_compile.json" not in targets  # it goes to the scratch folder and is embedded in summary.json
    assert len(targets) <= 8, sorted(targets)
