"""Tests for ``jaxinfer-bench kernels`` (bench/kernels.py) and the GPU suite's summary, on CPU.

The bench is run end to end on tiny float32 cases (interpret mode: correctness only); the comparison
helper must flag wrong outputs (a perturbed element, NaN, unwritten padding, a kernel with the wrong
scale); the byte counts are checked against hand arithmetic.
"""

from __future__ import annotations

import json

import jax.numpy as jnp
import numpy as np
import pytest

from bench import cli, gpu_suite, kernels
from bench.kernels import HeadShape, KernelCase

pytestmark = pytest.mark.filterwarnings("ignore:The Pallas Triton backend is deprecated")

TINY = HeadShape("tiny", 8, 2, 32)


# ------------------------------------------------------------------------------------- compare_outputs


def _ref(seed=0, shape=(5, 4, 8)):
    return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)


def test_compare_accepts_exact_and_rounded_outputs():
    ref = _ref()
    assert kernels.compare_outputs(ref, ref, jnp.float32).ok
    rounded = np.asarray(jnp.asarray(ref).astype(jnp.bfloat16).astype(jnp.float32))
    assert not kernels.compare_outputs(rounded, ref, jnp.float32).ok  # bf16 rounding is not float32-exact
    check = kernels.compare_outputs(rounded, ref, jnp.bfloat16)
    assert check.ok, check.reason
    assert 0 < check.max_abs_err <= 2**-8 * np.abs(ref).max()


def test_compare_flags_one_wrong_element():
    ref = _ref(1, (64, 8, 32))
    out = ref.copy()
    out[17, 3, 5] += 0.1 * np.abs(ref).max()  # one element off: barely moves the L2 norm
    check = kernels.compare_outputs(out, ref, jnp.bfloat16)
    assert not check.ok and "max abs err" in check.reason
    assert check.rel_l2_err < kernels.TOLERANCES["bfloat16"][0]
    assert check.max_abs_err == pytest.approx(0.1 * np.abs(ref).max(), rel=1e-5)


def test_compare_flags_nan_and_unwritten_padding():
    ref = _ref(2)
    out = ref.copy()
    out[0, 0, 0] = np.nan
    check = kernels.compare_outputs(out, ref, jnp.float32)
    assert not check.ok and "non-finite" in check.reason
    check = kernels.compare_outputs(ref, ref, jnp.float32, padding=np.full((3, 4, 8), 0.5))
    assert not check.ok and "padding" in check.reason and check.padding_max_abs == 0.5
    assert kernels.compare_outputs(ref, ref, jnp.float32, padding=np.zeros((3, 4, 8))).ok


def test_compare_flags_a_uniformly_wrong_output():
    ref = _ref(3)
    check = kernels.compare_outputs(ref * 1.05, ref, jnp.bfloat16)
    assert not check.ok and "rel L2" in check.reason


# ---------------------------------------------------------------------------------- cases and inputs


def test_bytes_and_flops_by_hand():
    case = KernelCase("mixed", TINY, q_lens=(1, 4), kv_lens=(100, 10))
    # K/V: (100 + 10) keys x 2 (K and V) x 2 kv heads x 32 x 4 bytes; q + out: 2 x 5 tokens x 8 x 32 x 4.
    assert kernels.kv_bytes(case, 4) == 110 * 2 * 2 * 32 * 4
    assert kernels.bytes_moved(case, 4) == 110 * 2 * 2 * 32 * 4 + 2 * 5 * 8 * 32 * 4
    # (query, visible key) pairs: 100 for the decode; 7+8+9+10 for the chunk.
    assert kernels.attention_flops(case) == 4 * (100 + 34) * 8 * 32
    windowed = KernelCase("check", TINY, q_lens=(3,), kv_lens=(50,), sliding_window=8)
    assert kernels.kv_bytes(windowed, 2) == (8 + 2) * 2 * 2 * 32 * 2  # keys 40..49
    assert kernels.attention_flops(windowed) == 4 * 24 * 8 * 32
    latent = KernelCase("decode", kernels.DEEPSEEK_V2_LITE, q_lens=(1,), kv_lens=(100,))
    # one 576-lane row per key (keys and values); q 576 lanes in, 512 out; q.k over 576 lanes, p.v over 512
    assert kernels.kv_bytes(latent, 2) == 100 * 576 * 2
    assert kernels.bytes_moved(latent, 2) == 100 * 576 * 2 + 16 * (576 + 512) * 2
    assert kernels.attention_flops(latent) == 2 * 100 * 16 * (576 + 512)


def test_checked_sequences_keep_prefills_and_spread_decodes():
    case = KernelCase("mixed", TINY, q_lens=(7,) + (1,) * 30 + (5,), kv_lens=(9,) + (20,) * 30 + (6,))
    seqs = kernels.checked_sequences(case, limit=6)
    assert len(seqs) == 6 and {0, 31} <= set(seqs)
    assert 1 in seqs and 30 in seqs  # first and last decode
    assert kernels.checked_sequences(KernelCase("decode", TINY, (1, 1), (3, 4))) == [0, 1]


def test_build_inputs_follow_the_engine_layout():
    case = KernelCase("mixed", TINY, q_lens=(3, 1, 1), kv_lens=(40, 17, 1))
    inputs = kernels.build_inputs(case, jnp.float32, num_sets=2, seed=4)
    assert inputs.q.shape == (8, 8, 32)  # 5 tokens -> bucket 8
    assert np.asarray(inputs.cu_q_lens).tolist() == [0, 3, 4, 5, 5]  # 3 sequences -> 4 slots
    assert np.asarray(inputs.kv_lens).tolist() == [40, 17, 1, 0]
    pages = [3, 2, 1]
    used = []
    for table in inputs.block_tables:
        t = np.asarray(table)
        assert t.shape == (4, 4)
        for s, n in enumerate(pages):
            assert (t[s, n:] == 0).all()
            used += t[s, :n].tolist()
    assert 0 not in used and len(set(used)) == len(used) == 2 * sum(pages)  # disjoint sets, block 0 free
    k = np.asarray(inputs.k_cache)
    assert k.shape[0] == 1 + 2 * sum(pages) + kernels.POISON_BLOCKS
    assert np.isfinite(k[used]).all() and np.isfinite(k[0]).all()
    spare = sorted(set(range(1, k.shape[0])) - set(used))
    assert len(spare) == kernels.POISON_BLOCKS and np.isnan(k[spare]).all()
    assert inputs.query_width is None  # a mixed step


# --------------------------------------------------------------------------------------- running cases


def test_wrong_kernel_output_is_flagged(monkeypatch):
    case = KernelCase("check", TINY, q_lens=(1, 6), kv_lens=(45, 20))
    opts = kernels.RunOptions(dtype=jnp.float32, timing=False)
    good = kernels.run_case(case, opts)
    assert good["status"] == "PASS", good
    real = kernels._kernel_fn
    monkeypatch.setattr(kernels, "_kernel_fn", lambda c, sm_scale: real(c, 1.25 * sm_scale))
    bad = kernels.run_case(case, opts)
    assert bad["status"] == "FAIL" and not bad["correctness"]["kernel"]["ok"]
    assert bad["correctness"]["xla"]["ok"]  # the XLA path is judged separately
    assert bad["timing"] is None


def test_timing_path_on_cpu():
    case = KernelCase("decode", TINY, q_lens=(1, 1), kv_lens=(33, 50))
    opts = kernels.RunOptions(dtype=jnp.float32, timing=True, warmup=1, repeats=2,
                              bandwidth_bytes_per_s=1e10, page_sets=2)
    r = kernels.run_case(case, opts)
    assert r["status"] == "PASS", r
    t = r["timing"]
    assert t["page_sets"] == 2 and t["kernel_s"] > 0 and t["xla_s"] > 0
    assert t["achieved_gb_per_s"] == pytest.approx(r["bytes"] / t["kernel_s"] / 1e9)
    assert t["bandwidth_fraction"] == pytest.approx(r["bytes"] / 1e10 / t["kernel_s"])
    assert t["speedup_vs_xla"] == pytest.approx(t["xla_s"] / t["kernel_s"])


def test_cli_runs_tiny_cases_and_writes_json(tmp_path, capsys):
    path = tmp_path / "k.json"
    assert cli.main(["kernels", "--cases", "cpu", "--max-cases", "2", "--strict", "--output", str(path)]) == 0
    payload = json.loads(path.read_text())
    assert payload["benchmark"] == "kernels" and payload["case_set"] == "cpu"
    assert payload["dtype"] == "float32" and payload["timing_meaningful"] is False
    assert payload["machine"]["platform"] == "cpu" and payload["bandwidth"] is None
    assert payload["counts"] == {"PASS": 2, "FAIL": 0, "ERROR": 0, "SKIPPED": 0}
    for r in payload["results"]:
        assert r["status"] == "PASS" and r["error"] is None and r["timing"] is None
        for path_name in ("kernel", "xla"):
            c = r["correctness"][path_name]
            assert c["ok"] and c["max_abs_err"] < 1e-5 and c["padding_max_abs"] == 0.0
        assert r["bytes"] > r["kv_bytes"] > 0
    assert "PASS 2" in capsys.readouterr().out


# ------------------------------------------------------------------------------------------ suite summary


def test_suite_summary_reads_the_bench_json(tmp_path):
    def case(name, kv_tokens, fraction, status="PASS"):
        timing = None if status != "PASS" else {"bandwidth_fraction": fraction, "speedup_vs_xla": 2.0}
        return {"name": name, "status": status, "total_kv_tokens": kv_tokens, "timing": timing,
                "correctness": None, "error": "boom" if status == "ERROR" else None}

    sweep = {"bandwidth": {"gb_per_s": 4000.0},
             "results": [case("a", 16384, 0.8), case("b", 65536, 0.6), case("c", 1024, 0.1),
                         case("d", 99999, None, "ERROR")]}
    (tmp_path / "kernels.json").write_text(json.dumps(sweep))
    stages = tmp_path / "stages.jsonl"
    stages.write_text('{"stage":"kernel_sweep","status":"ok","rc":0,"seconds":3,"limit_s":9}\n')
    s = gpu_suite.summarize(tmp_path, stages)
    k = s["kernel_sweep"]
    assert k["counts"] == {"PASS": 3, "FAIL": 0, "ERROR": 1, "SKIPPED": 0}
    assert k["long_kv_cases"] == 2 and k["long_kv_bandwidth_fraction_median"] == pytest.approx(0.7)
    assert k["long_kv_bandwidth_fraction_min"] == 0.6 and k["long_kv_best_case"] == "a"
    assert k["failures"] == ["d: boom"] and s["kernel_check"] is None
    assert json.loads((tmp_path / "summary.json").read_text())["stages"][0]["stage"] == "kernel_sweep"
    assert s["spec"] is None


def test_suite_summary_embeds_the_spec_bench(tmp_path, capsys):
    row = {"task": "copy", "batch_size": 1, "tok_per_s": 10.0, "acceptance_rate": 0.9, "mean_tokens_per_seq_step": 4.0,
           "compilations_in_timed_run": 0, "pass_seconds": [1.0], "per_position_acceptance": [0.9]}
    spec = {"benchmark": "spec", "dtype": "float32", "k": 4, "output_len": 128,
            "results": [{**row, "method": "off", "speedup": 1.0, "greedy_identical": True},
                        {**row, "method": "ngram", "speedup": 3.1, "greedy_identical": True},
                        {**row, "method": "draft", "speedup": 1.9, "greedy_identical": False}]}
    (tmp_path / "scratch").mkdir()
    (tmp_path / "scratch" / "spec.json").write_text(json.dumps(spec))
    s = gpu_suite.summarize(tmp_path, None, tmp_path / "scratch" / "spec.json")
    rows = s["spec"]["rows"]
    assert [r["method"] for r in rows] == ["off", "ngram", "draft"] and rows[1]["speedup"] == 3.1
    assert "pass_seconds" not in rows[0] and s["spec"]["dtype"] == "float32"
    assert json.loads((tmp_path / "summary.json").read_text())["spec"] == s["spec"]
    out = capsys.readouterr().out
    assert "copy b1 ngram 3.10x" in out and "copy b1 draft 1.90x NOT IDENTICAL" in out
    assert gpu_suite.summarize(tmp_path, None, tmp_path / "missing.json")["spec"] is None


def test_suite_summary_embeds_startup_moe_and_phase1(tmp_path, capsys):
    startup = {"benchmark": "startup", "results": [{"config": "plain", "cache": "warm", "start_s": 41.5,
                                                    "b1_first_over_last": 1.07, "b16_first_over_last": 0.98}]}
    moe = {"benchmark": "moe", "model": "m", "summary": [{"batch_size": 1, "speedup": 2.5, "bytes_ratio": 3.0,
                                                          "experts_per_layer": 2.0}]}
    phase1 = {"benchmark": "phase1", "rows": [{"optimization": "moe", "measured": "b1 2.50x"},
                                              {"optimization": "quantization", "measured": "skipped"}]}
    for name, payload in (("startup", startup), ("moe", moe), ("phase1", phase1)):
        (tmp_path / f"{name}.json").write_text(json.dumps(payload))
    embed = {name: tmp_path / f"{name}.json" for name in ("startup", "moe", "phase1", "tp")}  # tp: no file
    s = gpu_suite.summarize(tmp_path, None, embed=embed)
    assert s["embedded"]["moe"] == moe and s["embedded"]["tp"] is None
    assert json.loads((tmp_path / "summary.json").read_text())["embedded"]["phase1"] == phase1
    out = capsys.readouterr().out
    assert "startup: plain/warm start 41.5 s, b1 first/last 1.07, b16 first/last 0.98" in out
    assert "moe: b1 2.50x (bytes 3.00x, 2.0 experts/layer)" in out
    assert "phase1: moe: b1 2.50x | quantization: skipped" in out and "tp: no result" in out


def _abstract_h200():
    """jax >= 0.11 lowers Triton kernels without a GPU only for a named abstract device (0.10 needs none)."""
    import jax
    from jax._src.mesh import AbstractDevice  # no public name yet

    device = AbstractDevice(device_kind="NVIDIA H200", num_cores=132, platform="gpu")
    return jax.sharding.use_abstract_mesh(jax.sharding.AbstractMesh((1,), ("x",), abstract_device=device))


@pytest.mark.parametrize("case_set", ["gpu-check", "gpu"])
def test_gpu_cases_lower_for_cuda(case_set):
    """Every device case of the suite's first stages lowers for CUDA (Triton), at its bf16 shapes."""
    import jax

    from pallas_kernels.ragged_paged_attention import ragged_paged_attention

    cases = kernels.CASE_SETS[case_set]()
    cases = cases if case_set == "gpu-check" else cases[:4]
    for case in cases:
        h, bs = case.heads, case.block_size
        pages = [-(-kv // bs) for kv in case.kv_lens]
        num_seqs, num_blocks = kernels.bucket(case.batch), 1 + sum(pages) + kernels.POISON_BLOCKS
        cache = jax.ShapeDtypeStruct((num_blocks, bs, h.num_kv_heads, h.head_dim), jnp.bfloat16)
        args = (jax.ShapeDtypeStruct((kernels.bucket(case.num_tokens, 8), h.num_q_heads, h.head_dim),
                                     jnp.bfloat16), cache, None if h.value_dim else cache,
                jax.ShapeDtypeStruct((num_seqs, kernels.bucket(max(pages))), jnp.int32),
                jax.ShapeDtypeStruct((num_seqs + 1,), jnp.int32), jax.ShapeDtypeStruct((num_seqs,), jnp.int32))
        fn = lambda q, k, v, t, cu, kv: ragged_paged_attention(
            q, k, v, t, cu, kv, sm_scale=h.head_dim**-0.5, sliding_window=case.sliding_window,
            num_kv_splits=case.num_kv_splits, value_dim=h.value_dim, interpret=False)
        with _abstract_h200():
            text = jax.jit(fn).trace(*args).lower(lowering_platforms=("cuda",)).as_text()
        assert "triton" in text.lower(), case.name
