"""Which GPU the kernels compile for, and what it can do: interpret mode off a GPU, the compute capability,
fp8 tensor cores (sm_89+)."""

from __future__ import annotations

import jax


def resolve_interpret(interpret: bool | None) -> bool:
    """``None``: interpret (run on the CPU) unless the default backend is a GPU."""
    return jax.default_backend() != "gpu" if interpret is None else bool(interpret)


def gpu_compute_capability() -> int | None:
    """The first GPU's compute capability as an int (90 for sm_90), or None without a GPU."""
    try:
        device = jax.local_devices(backend="gpu")[0]
    except RuntimeError:
        return None
    capability = getattr(device, "compute_capability", None)
    if capability is None:
        return None
    return int(str(capability).replace(".", ""))


def has_fp8_tensor_cores(capability: int | None) -> bool:
    """Ada (sm_89) and Hopper (sm_90) onwards multiply e4m3 natively; A100 (sm_80) does not."""
    return capability is not None and capability >= 89


def require_fp8_tensor_cores(interpret: bool, what: str, instead: str) -> None:
    """NotImplementedError when compiling for a GPU older than sm_89 (checked on the GPU itself;
    interpret mode and CPU-side cross-lowering see no GPU and pass)."""
    capability = None if interpret else gpu_compute_capability()
    if capability is not None and not has_fp8_tensor_cores(capability):
        raise NotImplementedError(f"{what} needs fp8 tensor cores (sm_89+: Ada, Hopper); this GPU "
                                  f"is sm_{capability}. {instead}")
