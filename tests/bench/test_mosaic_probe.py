"""The Mosaic GPU probe (bench/gpu_compile/mosaic_probe.py): its TMA + mbarrier + wgmma matmuls compile
for sm_90 on a machine without a GPU, run correctly in Mosaic GPU's interpret mode on the CPU, and an
sm_80 target is refused (those instructions are Hopper's).

The compiles need the CUDA plugin and a ptxas (the Python 3.12 leg: jax-cuda12-plugin and
nvidia-cuda-nvcc-cu12); without them they skip. Every jax call runs in a child process with
``JAX_PLATFORMS=cpu`` (the plugin needs it without a GPU; the rest of the suite imports jax without it).
"""

from __future__ import annotations

import importlib.metadata
import re

import pytest

from bench.gpu_compile import deviceless, mosaic_probe

needs_gpu_compiler = pytest.mark.skipif(deviceless.tools_missing() is not None,
                                        reason=f"deviceless GPU compile: {deviceless.tools_missing()}")


def _jax_version() -> tuple[int, ...]:
    return tuple(int(p) for p in re.findall(r"\d+", importlib.metadata.version("jax"))[:3])


def _assert_hopper_kernel(result: dict, wgmma_shape: str):
    assert result["compiled"], result["error"]
    assert result["error"] is None
    # ptxas's report (MOSAIC_GPU_DUMP_PTXAS): an sm_90a kernel of one warpgroup, within the register file
    assert result["ptxas_target"] == "sm_90a", result
    assert result["threads_per_block"] == 128
    assert 0 < result["ptxas_registers"] <= 255
    assert result["ptxas_spill_stores"] == 0 and result["ptxas_spill_loads"] == 0, result
    # the PTX (MOSAIC_GPU_DUMP_PTX): TMA copies in and out, wgmma of the expected shape and types
    assert result["ptx_tma_loads"] > 0 and result["ptx_tma_stores"] > 0
    assert result["ptx_wgmma"] > 0
    assert result["ptx_wgmma_shapes"] == [wgmma_shape]


@needs_gpu_compiler
def test_bf16_probe_compiles_for_sm90_without_a_gpu():
    result = mosaic_probe.compile_deviceless("h100")
    _assert_hopper_kernel(result, "m64n128k16.f32.bf16.bf16")
    assert "Warpgroup lowering semantics" in result["description"]


@needs_gpu_compiler
def test_fp8_probe_compiles_for_sm90_without_a_gpu():
    """e4m3 x e4m3 wgmma with the weight tile K-major (as pallas_kernels.fp8_matmul stores it) and the
    per-token / per-channel scales applied to the accumulator in registers."""
    result = mosaic_probe.compile_deviceless("h100", fp8=True)
    _assert_hopper_kernel(result, "m64n128k32.f32.e4m3.e4m3")


@needs_gpu_compiler
def test_probe_is_refused_for_sm80():
    """No TMA, no wgmma on an A100: the compile fails (LLVM aborts the child on the first Hopper-only
    intrinsic) and compile_deviceless reports it rather than dying with it."""
    result = mosaic_probe.compile_deviceless("a100")
    assert not result["compiled"]
    assert result["error"]
    assert result.get("ptxas_target") is None  # ptxas never saw it


def test_parse_mosaic_dump_reads_ptxas_and_ptx():
    text = """ptxas info    : Compiling entry function 'probe_mosaic_gpu_kernel' for 'sm_90a'
ptxas info    : Function properties for probe_mosaic_gpu_kernel
    16 bytes stack frame, 8 bytes spill stores, 4 bytes spill loads
ptxas info    : Used 168 registers, used 2 barriers, 1 bytes smem
.maxntid 128, 1, 1
\t{ .reg .pred p; wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 {%r1}, p; }
\t{ .reg .pred p; wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 {%r2}, p; }
\tcp.async.bulk.tensor.4d.shared::cta.global.mbarrier::complete_tx::bytes [%r3], [%rd1, {%r4}], [%r5];
\tcp.async.bulk.tensor.4d.global.shared::cta.bulk_group [%rd2, {%r6}], [%r7];
"""
    stats = mosaic_probe.parse_mosaic_dump(text)
    assert stats == {"ptxas_registers": 168, "ptxas_spill_stores": 8, "ptxas_spill_loads": 4,
                     "ptxas_stack_frame_bytes": 16, "kernel_name": "probe_mosaic_gpu_kernel",
                     "ptxas_target": "sm_90a", "threads_per_block": 128, "ptx_wgmma": 2,
                     "ptx_tma_loads": 1, "ptx_tma_stores": 1,
                     "ptx_wgmma_shapes": ["m64n64k16.f32.bf16.bf16"]}
    assert mosaic_probe.parse_mosaic_dump("")["ptx_wgmma"] == 0


def test_bf16_probe_matches_reference_in_interpret_mode():
    """Mosaic GPU's interpreter simulates the TMA copies, barriers and wgmma on the CPU: two output tiles
    side by side (a row / column mix-up shows), 4 K steps through the 3 shared-memory slots, so slots are
    refilled (jax 0.10.2 and 0.12 alike)."""
    result = mosaic_probe.interpret_check((128, 256, 256))
    assert result["ok"], result


@pytest.mark.skipif(_jax_version() < (0, 12),
                    reason="jax 0.10.2's GPU interpreter cannot read a transposed shared-memory ref "
                           "(AttributeError: 'TransposeTransform' object has no attribute 'indices'); "
                           "jax 0.12's can")
def test_fp8_probe_matches_reference_in_interpret_mode():
    result = mosaic_probe.interpret_check((128, 256, 512), fp8=True)
    assert result["ok"], result
