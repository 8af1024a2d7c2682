"""The device mesh: the engine's parallel sizes laid over ``jax.devices()``.

A mesh has two axes, ``("expert", "tensor")``, of sizes ``(ep, tp // ep)``: ``tp`` devices in all
(``tensor_parallel_size``), of which the routed experts are split ``ep`` ways (``expert_parallel_size``) and
each expert's FFN the remaining ``tp // ep`` ways. Attention, the dense MLP, the shared expert and the
vocabulary are split over both axes, i.e. over every device. So

* ``make_mesh(4)`` is plain tensor parallelism over 4 devices (mesh ``(1, 4)``);
* ``make_mesh(4, 4)`` is vLLM's ``enable_expert_parallel=True`` at ``tensor_parallel_size=4``: experts spread
  over the 4 devices, attention still tensor-parallel over them (mesh ``(4, 1)``);
* ``make_mesh(4, 2)`` is the hybrid: 2 groups of experts, each expert split over 2 devices.

Axes are ``AxisType.Auto`` (XLA's partitioner propagates shardings from the weights; a Megatron MLP then
compiles to exactly one all-reduce). ``jax.devices()`` lists every process's devices when
``jax.distributed`` is initialised, so the same call builds the global mesh of a multi-host run.
"""

from __future__ import annotations

import jax
from jax.sharding import AxisType, Mesh

EXPERT = "expert"
TENSOR = "tensor"
ALL_DEVICES = (EXPERT, TENSOR)  # a dimension split over every device of the mesh
MESH_AXES = ALL_DEVICES


def check_parallel_sizes(tensor_parallel_size: int, expert_parallel_size: int = 1,
                         num_devices: int | None = None) -> None:
    """ValueError for sizes no mesh can have (checked before any device is touched)."""
    for name, value in (("tensor_parallel_size", tensor_parallel_size), ("expert_parallel_size", expert_parallel_size)):
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise ValueError(f"{name} must be a positive int, got {value!r}")
    if tensor_parallel_size % expert_parallel_size:
        raise ValueError(
            f"expert_parallel_size={expert_parallel_size} must divide tensor_parallel_size={tensor_parallel_size}: "
            "the experts are spread over the same devices that attention is tensor-parallel over"
        )
    if num_devices is not None and tensor_parallel_size > num_devices:
        hint = (" (on a CPU, simulate devices with XLA_FLAGS=--xla_force_host_platform_device_count=N set "
                "before jax is imported)") if jax.default_backend() == "cpu" else ""
        raise ValueError(
            f"tensor_parallel_size={tensor_parallel_size} needs {tensor_parallel_size} devices, "
            f"but only {num_devices} are visible{hint}"
        )


def make_mesh(tensor_parallel_size: int = 1, expert_parallel_size: int = 1, devices=None) -> Mesh:
    """A ``(expert, tensor)`` mesh over the first ``tensor_parallel_size`` of ``devices`` (default: all
    global devices). ``enable_expert_parallel=True`` in the engine means ``expert_parallel_size =
    tensor_parallel_size``."""
    devices = list(jax.devices() if devices is None else devices)
    check_parallel_sizes(tensor_parallel_size, expert_parallel_size, len(devices))
    shape = (expert_parallel_size, tensor_parallel_size // expert_parallel_size)
    return jax.make_mesh(shape, MESH_AXES, axis_types=(AxisType.Auto, AxisType.Auto),
                         devices=devices[:tensor_parallel_size])


def parallel_sizes(mesh: Mesh) -> tuple[int, int]:
    """(tensor_parallel_size, expert_parallel_size) of a mesh from ``make_mesh``."""
    return mesh.size, mesh.shape[EXPERT]
