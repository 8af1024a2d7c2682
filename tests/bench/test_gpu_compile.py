"""``jaxinfer-bench gpu-compile``: the parsers on recorded text (every leg), and a real deviceless compile for
A100 and H200 of a sample of the kernels and one layer of the engine's 7B executables (where the CUDA plugin
and ptxas are installed: the jax-0.12 leg, ``pip install -e ".[gpu-compile]"``), including a tile that must
fail."""

from __future__ import annotations

import pytest

from bench.gpu_compile import cli, deviceless, ptxas_log, targets

PTXAS = """I1202 08:00:00.1 1 subprocess_compilation.cc:356] ptxas info    : 0 bytes gmem
ptxas info    : Compiling entry function 'ragged_paged_attention' for 'sm_80'
ptxas info    : Function properties for ragged_paged_attention
    8 bytes stack frame, 140 bytes spill stores, 136 bytes spill loads
ptxas info    : Used 255 registers, used 1 barriers, 368 bytes cmem[0]
ptxas info    : Compile time = 11.3 ms
I1202 08:00:00.2 1 subprocess_compilation.cc:356] ptxas info    : 0 bytes gmem
ptxas info    : Compiling entry function 'loop_add_fusion' for 'sm_80'
ptxas info    : Function properties for loop_add_fusion
    0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
ptxas info    : Used 10 registers, used 0 barriers, 360 bytes cmem[0]
"""
LAUNCHES = """001: kCustomKernel [source       | next=002 (1)] ragged_paged_attention grid: [13, 4, 8] threads: [256, 1, 1]  shared_memory: 65536 bytes
002: kCustomKernel [prev=001 (1) | sink        ] loop_add_fusion grid: [1, 1, 1] threads: [64, 1, 1]  shared_memory: 0 bytes
"""


def test_ptxas_report_and_launch_table_are_parsed():
    kernels = ptxas_log.merge(ptxas_log.parse_ptxas(PTXAS), ptxas_log.parse_launches(LAUNCHES))
    by_name = {k.name: k for k in kernels}
    attn, add = by_name["ragged_paged_attention"], by_name["loop_add_fusion"]
    assert (attn.sm, attn.registers, attn.spill_store_bytes, attn.spill_load_bytes, attn.stack_frame_bytes) == (
        "sm_80", 255, 140, 136, 8)
    assert (attn.threads_per_block, attn.shared_memory_bytes, attn.launches) == (256, 65536, 1)
    assert attn.spills and not add.spills
    assert (add.registers, add.threads_per_block) == (10, 64)


def _row(**kernel):
    base = dict(name="ragged_paged_attention", sm="sm_80", registers=128, stack_frame_bytes=0, spill_store_bytes=0,
                spill_load_bytes=0, threads_per_block=128, shared_memory_bytes=1024, launches=1)
    return {"status": "compiled", "kernels": [{**base, **kernel}]}


def test_verdicts_check_spills_and_every_limit():
    a100 = targets.target("a100")
    assert cli.verdict(_row(), a100) == "ok"
    assert cli.verdict(_row(spill_store_bytes=4), a100) == "spills"
    assert cli.verdict(_row(shared_memory_bytes=a100.shared_memory_per_block_optin + 1), a100) == "over-limit"
    assert cli.verdict(_row(registers=255, threads_per_block=512), a100) == "over-limit"  # 130560 > 65536
    assert cli.verdict({"status": "refused", "kernels": []}, a100) == "refused"


def test_targets_ship_with_their_limits():
    a100, h100, h200 = (targets.target(n) for n in ("a100", "h100", "h200"))
    assert (a100.compute_capability, a100.core_count, a100.shared_memory_per_block_optin) == (80, 108, 166912)
    assert (h100.compute_capability, h100.shared_memory_per_block_optin) == (90, 232448)
    assert (h200.compute_capability, h200.device_kind) == (90, "NVIDIA H200")
    assert targets.target_for_device_kind("NVIDIA H200") == h200
    assert targets.target_for_device_kind("NVIDIA A100-SXM4-40GB") == a100
    with pytest.raises(ValueError, match="unknown GPU target"):
        targets.target("v100")


needs_tools = pytest.mark.skipif(deviceless.tools_missing() is not None,
                                 reason=f"deviceless GPU compile unavailable: {deviceless.tools_missing()}")


@pytest.fixture(scope="module")
def quick_rows():
    """The quick set (a few attention and matmul cases, one layer of the engine's executables, the Mosaic GPU
    probe) compiled for A100 and H200 in one child process."""
    rows = cli.run_worker(["--targets", "a100", "h200", "--quick", "--layers", "1",
                           "--groups", "attention", "matmul", "engine", "mosaic", "oversized"])
    by_name = {t.name: t for t in targets.all_targets()}
    for r in rows:
        r["summary"] = cli.summarize(r, by_name[r["target"]])
    return rows


@needs_tools
def test_quick_set_compiles_clean_for_a100_and_h200(quick_rows):
    rows = [r for r in quick_rows if r["group"] != "oversized"]
    assert {r["target"] for r in rows} == {"a100", "h200"}
    for r in rows:
        expected = "refused" if r["sm"] == "sm_80" and (r["case"].startswith(("fp8_w8a8", "fp8_block"))
                                                         or r["group"] == "mosaic") else "ok"
        assert r["summary"]["verdict"] == expected, (r["sm"], r["case"], r["message"], r["summary"])
    pallas = [k for r in rows for k in r["kernels"] if k["name"].startswith(cli.PALLAS_KERNELS)]
    assert pallas and all(k["registers"] and k["sm"] in ("sm_80", "sm_90a") for k in pallas)
    steps = [r for r in rows if r["group"] == "engine" and "step" in r["case"]]
    assert steps and all(any(k["name"] == "ragged_paged_attention" for k in r["kernels"]) for r in steps)


@needs_tools
def test_an_oversized_tile_is_reported_as_failed(quick_rows):
    rows = [r for r in quick_rows if r["group"] == "oversized"]
    assert len(rows) == 2
    for r in rows:
        assert r["summary"]["verdict"] == "failed"
        assert "shared memory" in r["message"].lower(), r["message"]
