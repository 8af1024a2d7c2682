"""Collectives of a compiled step, read from its HLO text (for tests and ``bench/tp.py``).

``compiled = jax.jit(step, ...).lower(...).compile()``; ``collectives(compiled.as_text())`` lists each
collective instruction with its kind, the bytes of its result, and the model scope it came from:
``model.forward`` runs every layer in ``jax.named_scope("layer{i}")`` (and the embedding / LM head in
"embed" / "lm_head"), and XLA keeps that name in each instruction's ``op_name`` metadata, collectives
inserted by the partitioner included. Async pairs count once (the ``-start`` half).

XLA:CPU promotes bf16 all-reduces to f32 (its reduction computation is "..._promoted"): on a CPU the bytes of a
bf16 model's all-reduces read twice what a GPU sends; ``elements`` does not depend on that.
"""

from __future__ import annotations

import collections
import dataclasses
import re

KINDS = ("all-reduce", "all-gather", "reduce-scatter", "all-to-all", "ragged-all-to-all", "collective-permute")
_INSTRUCTION = re.compile(r"=\s*(?P<type>.+?)\s+(?P<kind>" + "|".join(KINDS) + r")(?:-start)?\(")
_ARRAY = re.compile(r"\b(?P<dtype>pred|[subf]\d+|bf16|f8e\w+)\[(?P<dims>[\d,]*)\]")
_OP_NAME = re.compile(r'op_name="(?P<name>[^"]*)"')
_DTYPE_BITS = {"pred": 8, "bf16": 16}


@dataclasses.dataclass(frozen=True)
class Collective:
    kind: str  # e.g. "all-reduce"
    bytes: int  # of its result (all arrays of a tuple-shaped, combined collective)
    elements: int  # array elements of its result
    scope: str  # "layer3", "embed", "lm_head", or "" when the instruction carries no scope


def _bits(dtype: str) -> int:
    if dtype in _DTYPE_BITS:
        return _DTYPE_BITS[dtype]
    if dtype.startswith("f8"):
        return 8
    return int(dtype[1:])


def _result_size(type_text: str) -> tuple[int, int]:
    """(bytes, elements) of an instruction's result type."""
    total_bytes = total_elements = 0
    for m in _ARRAY.finditer(type_text):
        n = 1
        for d in filter(None, m["dims"].split(",")):
            n *= int(d)
        total_bytes += n * _bits(m["dtype"]) // 8
        total_elements += n
    return total_bytes, total_elements


def _scope(op_name: str) -> str:
    parts = op_name.split("/")
    return parts[1] if len(parts) > 2 and parts[0].startswith("jit(") else ""


def collectives(hlo_text: str) -> list[Collective]:
    found = []
    for line in hlo_text.splitlines():
        m = _INSTRUCTION.search(line)
        if m is None:
            continue
        name = _OP_NAME.search(line)
        num_bytes, elements = _result_size(m["type"])
        found.append(Collective(m["kind"], num_bytes, elements, _scope(name["name"]) if name else ""))
    return found


def count_collectives(hlo_text: str) -> dict[str, int]:
    """kind -> number of instructions."""
    return dict(collections.Counter(c.kind for c in collectives(hlo_text)))


def collectives_by_scope(hlo_text: str) -> dict[str, dict[str, int]]:
    """scope -> kind -> number of instructions (see the module doc for the scopes)."""
    out: dict[str, collections.Counter] = collections.defaultdict(collections.Counter)
    for c in collectives(hlo_text):
        out[c.scope][c.kind] += 1
    return {scope: dict(counts) for scope, counts in out.items()}
