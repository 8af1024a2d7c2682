"""Which GPU the kernels compile for, and what it can do: interpret mode off a GPU, the compute capability,
fp8 tensor cores (sm_89+).

The compute capability is the compile target's: under ``jax.sharding.use_abstract_mesh`` with an abstract
device whose kind names a GPU (how a compile without a GPU says what it compiles for; Pallas's Triton
lowering reads the same), that GPU's; otherwise the first local GPU's; None on a machine without one."""

from __future__ import annotations

import jax


def resolve_interpret(interpret: bool | None) -> bool:
    """``None``: interpret (run on the CPU) unless the default backend is a GPU."""
    return jax.default_backend() != "gpu" if interpret is None else bool(interpret)


# device-kind fragments of the GPUs whose kernels are configured per target, -> compute capability
_KNOWN_KINDS = (("A100", 80), ("A30", 80), ("A10", 86), ("L40", 89), ("L4", 89), ("H100", 90), ("H200", 90),
                ("H800", 90), ("GH200", 90))


def _capability_of_kind(kind: str) -> int | None:
    for fragment, capability in _KNOWN_KINDS:
        if fragment in kind:
            return capability
    return None


def gpu_compute_capability() -> int | None:
    """The compile target's compute capability as an int (90 for sm_90), or None without a GPU target."""
    abstract_device = getattr(jax.sharding.get_abstract_mesh(), "abstract_device", None)
    if abstract_device is not None and abstract_device.platform in ("gpu", "cuda"):
        capability = _capability_of_kind(abstract_device.device_kind)
        if capability is not None:
            return capability
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
