"""What a GPU compile says about each kernel: ptxas's resource report and XLA's launch table, parsed.

XLA's GPU compiler assembles every kernel's PTX with ``ptxas -v`` and (at ``TF_CPP_VMODULE=
subprocess_compilation=2``) logs its report::

    ptxas info    : Compiling entry function 'kern' for 'sm_80'
    ptxas info    : Function properties for kern
        0 bytes stack frame, 8 bytes spill stores, 8 bytes spill loads
    ptxas info    : Used 255 registers, used 1 barriers, 368 bytes cmem[0]

and, with ``--xla_dump_to``, writes the executable's thunk sequence, one launch per line::

    001: kCustomKernel [source | next=002 (1)] kern grid: [1, 1, 1] threads: [128, 1, 1]  shared_memory: 0 bytes

(a Triton kernel's shared memory is dynamic, so only the launch table knows it). Pure text parsing.
"""

from __future__ import annotations

import dataclasses
import re

_ENTRY = re.compile(r"Compiling entry function '([^']+)' for '(sm_\d+a?)'")
_PROPERTIES = re.compile(r"Function properties for (\S+)")
_FRAME = re.compile(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads")
_USED = re.compile(r"Used (\d+) registers")
_LAUNCH = re.compile(r"\]\s+(\S+) grid: \[([\d, ]+)\] threads: \[([\d, ]+)\]\s+shared_memory: (\d+) bytes")


@dataclasses.dataclass
class KernelResources:
    """One kernel as ptxas and XLA's launch table report it (None where a source said nothing)."""

    name: str
    sm: str | None = None
    registers: int | None = None
    stack_frame_bytes: int = 0
    spill_store_bytes: int = 0
    spill_load_bytes: int = 0
    threads_per_block: int | None = None
    shared_memory_bytes: int | None = None
    launches: int = 0

    @property
    def spills(self) -> bool:
        return self.spill_store_bytes > 0 or self.spill_load_bytes > 0

    def to_json(self) -> dict:
        return dataclasses.asdict(self)


def parse_ptxas(text: str) -> dict[str, KernelResources]:
    """Entry function name -> its resources. A function ptxas assembled more than once (XLA may split a
    module for parallel compilation) keeps its largest figures."""
    kernels: dict[str, KernelResources] = {}
    current: KernelResources | None = None
    properties_of: str | None = None
    for line in text.splitlines():
        if m := _ENTRY.search(line):
            current = kernels.setdefault(m.group(1), KernelResources(m.group(1)))
            current.sm = m.group(2)
        elif m := _PROPERTIES.search(line):
            properties_of = m.group(1)
        elif (m := _FRAME.search(line)) and current is not None and properties_of == current.name:
            frame, stores, loads = map(int, m.groups())
            current.stack_frame_bytes = max(current.stack_frame_bytes, frame)
            current.spill_store_bytes = max(current.spill_store_bytes, stores)
            current.spill_load_bytes = max(current.spill_load_bytes, loads)
        elif (m := _USED.search(line)) and current is not None:
            current.registers = max(current.registers or 0, int(m.group(1)))
    return kernels


def parse_launches(text: str) -> dict[str, tuple[int, int]]:
    """Kernel name -> (threads per block, shared memory bytes) from XLA's thunk-sequence dump (the largest
    over the kernel's launches), with the number of launches folded in by ``merge``."""
    out: dict[str, tuple[int, int, int]] = {}
    for m in _LAUNCH.finditer(text):
        name = m.group(1)
        threads = 1
        for t in m.group(3).split(","):
            threads *= int(t)
        shared = int(m.group(4))
        old = out.get(name, (0, 0, 0))
        out[name] = (max(old[0], threads), max(old[1], shared), old[2] + 1)
    return out


def merge(kernels: dict[str, KernelResources], launches: dict[str, tuple[int, int, int]]) -> list[KernelResources]:
    """The kernels of one executable: ptxas's figures with their launch shape and shared memory."""
    merged = dict(kernels)
    for name, (threads, shared, count) in launches.items():
        k = merged.setdefault(name, KernelResources(name))
        k.threads_per_block, k.shared_memory_bytes, k.launches = threads, shared, count
    return sorted(merged.values(), key=lambda k: k.name)
