"""The GPUs ``gpu-compile`` compiles for: each an XLA target description shipped with the package.

A target description (``targets/*.txtpb``, an XLA ``GpuTargetConfigProto`` in text form) is what XLA's GPU
compiler asks a device for — SM count, shared memory per block and per SM, registers, clock, memory
bandwidth, compute capability — written from public device data. With it, XLA compiles for a GPU on a
machine that has none (``jax.experimental.topologies.get_topology_desc``). This module only reads the files
and the few limits the report checks against; it imports no JAX.
"""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

TARGETS_DIR = Path(__file__).with_name("targets")
MAX_REGISTERS_PER_THREAD = 255  # every NVIDIA GPU since Kepler


@dataclasses.dataclass(frozen=True)
class GpuTarget:
    """One GPU model, its description file and the limits the report checks."""

    name: str  # the short name on the command line: a100, h100, h200
    file: str  # under targets/
    device_kind: str  # what jax reports as the device kind (it picks the Pallas Triton target)
    compute_capability: int  # 80 for sm_80
    core_count: int  # SMs
    shared_memory_per_block_optin: int  # bytes a kernel may use, opting in
    registers_per_block: int

    @property
    def sm(self) -> str:
        return f"sm_{self.compute_capability}"

    @property
    def config_text(self) -> str:
        return (TARGETS_DIR / self.file).read_text()


def _field(text: str, name: str) -> int:
    match = re.search(rf"\b{name}:\s*(\d+)", text)
    if match is None:
        raise ValueError(f"target description has no {name}")
    return int(match.group(1))


def _load(name: str, file: str) -> GpuTarget:
    text = (TARGETS_DIR / file).read_text()
    kind = re.search(r'device_description_str:\s*"([^"]+)"', text).group(1)
    cc = re.search(r"cuda_compute_capability\s*{\s*major:\s*(\d+)(?:\s+minor:\s*(\d+))?", text)
    return GpuTarget(name=name, file=file, device_kind=kind,
                     compute_capability=int(cc.group(1)) * 10 + int(cc.group(2) or 0),
                     core_count=_field(text, "core_count"),
                     shared_memory_per_block_optin=_field(text, "shared_memory_per_block_optin"),
                     registers_per_block=_field(text, "registers_per_block_limit"))


_FILES = {"a100": "a100_sxm4_80gb.txtpb", "h100": "h100_sxm5_80gb.txtpb", "h200": "h200_sxm_141gb.txtpb"}
DEFAULT_TARGETS = ("a100", "h200")  # sm_80 and sm_90 (H100 and H200 compile alike; the suite's GPU is an H200)


def target(name: str) -> GpuTarget:
    if name not in _FILES:
        raise ValueError(f"unknown GPU target {name!r}; known: {', '.join(_FILES)}")
    return _load(name, _FILES[name])


def all_targets() -> list[GpuTarget]:
    return [target(n) for n in _FILES]


def target_for_device_kind(device_kind: str) -> GpuTarget | None:
    """The shipped target of a real device (``jax.devices()[0].device_kind``), or None if none matches."""
    for t in all_targets():
        if t.device_kind.split()[1].split("-")[0] in device_kind:  # "A100", "H100", "H200"
            return t
    return None
