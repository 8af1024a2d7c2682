"""The Mosaic GPU evidence case of ``gpu-compile``: a minimal Hopper kernel (``mosaic_probe``) compiled
deviceless for sm_90, showing that the toolchain a port off the deprecated Triton backend needs works here.
Mosaic GPU targets Hopper and later, so on other targets the case is refused by design."""

from __future__ import annotations

from bench.gpu_compile.kernel_cases import CompileCase


def _build(compiler):
    from bench.gpu_compile import mosaic_probe

    if compiler.target.compute_capability < 90:
        raise NotImplementedError(f"Mosaic GPU kernels target sm_90 and later; {compiler.target.sm} keeps the "
                                  "Triton kernels")
    import jax

    fn, arg_specs, _ = mosaic_probe.mosaic_probe_case()  # a plgpu.kernel: jit it to trace and lower it
    return jax.jit(fn), compiler.place(arg_specs), {}


def mosaic_cases() -> list[CompileCase]:
    return [CompileCase("mosaic", "mosaic-gpu bf16 matmul (TMA pipeline + wgmma)", _build, quick=True)]
