"""Reading pre-quantized FP8 checkpoints into the params pytree, with ``QuantizedWeight`` leaves.

Two layouts, both HF safetensors directories whose ``config.json`` carries a ``quantization_config``:

* compressed-tensors (``"quant_method": "compressed-tensors"``, the format vLLM serves, written by
  llm-compressor): each quantized linear has ``<name>.weight`` in float8_e4m3fn ``[out, in]``,
  ``<name>.weight_scale`` (per tensor ``[]``/``[1]``, per channel ``[out, 1]``, or per block
  ``[ceil(out/BN), ceil(in/BK)]`` with ``block_structure``) and, for static activation scales,
  ``<name>.input_scale`` (per tensor).
* FP8 (``"quant_method": "fp8"``): per tensor as AutoFP8 writes it (``weight_scale``, and
  ``input_scale`` when ``activation_scheme`` is static), or block-wise with
  ``weight_block_size`` and ``<name>.weight_scale_inv`` (DeepSeek-V3, Qwen3-FP8).

Which linears are quantized is read from the tensors themselves (an e4m3 weight and its scale);
the rest (embeddings, norms, layers in the config's ignore list) load as dense arrays exactly as
``jaxinfer.loading.loader`` loads them. Scales multiply to dequantize in every layout; a per-tensor scale
is broadcast to one per output channel (same numbers). The method of each ``QuantizedWeight``:
"fp8_block" for block scales, "fp8" (W8A8) when the checkpoint quantizes activations, else
"fp8_w8a16"; ``method="fp8_w8a16"`` runs W8A8 checkpoints weight-only (GPUs before sm_89).

Anything inconsistent (a scale whose shape does not fit its weight, an e4m3 weight without a
scale, a scale without an e4m3 weight, non-finite or negative scales, unsupported schemes) raises
``CheckpointError``/``NotImplementedError`` naming the file and tensor, before anything is placed.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np

from jaxinfer.config.model import ModelConfig
from jaxinfer.loading.loader import CheckpointError, safetensors_files
from jaxinfer.model.weights import abstract_params, hf_name_table
from jaxinfer.quantization.quantized_weight import QuantizedWeight, check_method

_DTYPES = {
    "F64": np.dtype(np.float64), "F32": np.dtype(np.float32), "F16": np.dtype(np.float16),
    "BF16": np.dtype(ml_dtypes.bfloat16), "F8_E4M3": np.dtype(ml_dtypes.float8_e4m3fn),
    "F8_E5M2": np.dtype(ml_dtypes.float8_e5m2), "I64": np.dtype(np.int64),
    "I32": np.dtype(np.int32), "I16": np.dtype(np.int16), "I8": np.dtype(np.int8),
    "U8": np.dtype(np.uint8), "BOOL": np.dtype(np.bool_),
}
_E4M3 = np.dtype(ml_dtypes.float8_e4m3fn)
_SCALE_SUFFIXES = (".weight_scale", ".weight_scale_inv", ".input_scale")


@dataclasses.dataclass(frozen=True)
class CheckpointQuantization:
    """What a checkpoint's ``quantization_config`` promises (parsed, validated)."""

    quant_method: str  # "compressed-tensors" | "fp8"
    weight_strategy: str  # "tensor" | "channel" | "block"
    block_shape: tuple[int, int] | None  # (BN, BK) for "block"
    activations: str | None  # "dynamic" | "static" | None (weights only)


def _unsupported(what: str) -> NotImplementedError:
    return NotImplementedError(f"{what}; supported: compressed-tensors 8-bit float (e4m3) weights "
                               "per tensor, channel or block, and quant_method 'fp8' (AutoFP8, "
                               "block-wise weight_scale_inv)")


def parse_quantization_config(qcfg: dict[str, Any]) -> CheckpointQuantization:
    """Parse an HF ``quantization_config`` dict; NotImplementedError for any other scheme."""
    method = qcfg.get("quant_method")
    if method == "fp8":
        if qcfg.get("fmt", "e4m3") != "e4m3":
            raise _unsupported(f"fp8 checkpoints in format {qcfg.get('fmt')!r}")
        block = qcfg.get("weight_block_size")
        scheme = qcfg.get("activation_scheme", "dynamic")
        if scheme not in ("dynamic", "static"):
            raise _unsupported(f"activation_scheme {scheme!r}")
        if block is not None:
            return CheckpointQuantization("fp8", "block", _block_shape(block), "dynamic")
        return CheckpointQuantization("fp8", "tensor", None, scheme)
    if method == "compressed-tensors":
        groups = list((qcfg.get("config_groups") or {}).values())
        if not groups:
            raise CheckpointError("compressed-tensors quantization_config has no config_groups")
        parsed = {_parse_group(g) for g in groups}
        if len(parsed) != 1:
            raise _unsupported(f"several different quantization schemes in one checkpoint {parsed}")
        return parsed.pop()
    raise _unsupported(f"quant_method {method!r}")


def _block_shape(block) -> tuple[int, int]:
    if not (isinstance(block, (list, tuple)) and len(block) == 2 and all(
            isinstance(b, int) and b > 0 for b in block)):
        raise CheckpointError(f"weight block size must be two positive ints, got {block!r}")
    return (block[0], block[1])


def _parse_group(group: dict[str, Any]) -> CheckpointQuantization:
    weights = group.get("weights") or {}
    if (weights.get("num_bits"), weights.get("type")) != (8, "float"):
        raise _unsupported(f"compressed-tensors weights with num_bits={weights.get('num_bits')} "
                           f"type={weights.get('type')!r}")
    if weights.get("symmetric") is False or weights.get("dynamic"):
        raise _unsupported("asymmetric or dynamic weight quantization")
    strategy = weights.get("strategy")
    if strategy not in ("tensor", "channel", "block"):
        raise _unsupported(f"weight strategy {strategy!r}")
    block = _block_shape(weights.get("block_structure")) if strategy == "block" else None
    acts = group.get("input_activations")
    if acts is None:
        activations = None
    else:
        if (acts.get("num_bits"), acts.get("type")) != (8, "float"):
            raise _unsupported(f"activations with num_bits={acts.get('num_bits')} "
                               f"type={acts.get('type')!r}")
        activations = "dynamic" if acts.get("dynamic") else "static"
        if activations == "static" and acts.get("strategy") != "tensor":
            raise _unsupported(f"static activation scales per {acts.get('strategy')!r}")
    if strategy == "block" and activations == "static":
        raise _unsupported("static activation scales with block-wise weights")
    return CheckpointQuantization("compressed-tensors", strategy, block, activations)


def checkpoint_quantization(model_dir: str | Path) -> CheckpointQuantization | None:
    """The parsed ``quantization_config`` of ``model_dir/config.json``, or None if it has none."""
    config = json.loads((Path(model_dir) / "config.json").read_text())
    qcfg = config.get("quantization_config")
    return None if qcfg is None else parse_quantization_config(qcfg)


# ----------------------------------------------------------------------------------------------
# safetensors (read directly: the numpy backend of safetensors cannot return float8 arrays)
# ----------------------------------------------------------------------------------------------


def _read_header(file: Path) -> tuple[dict[str, Any], int]:
    try:
        with open(file, "rb") as f:
            header_len = int.from_bytes(f.read(8), "little")
            header = json.loads(f.read(header_len))
    except (OSError, ValueError) as e:
        raise CheckpointError(f"{file}: cannot read safetensors header ({e})") from e
    header.pop("__metadata__", None)
    return header, 8 + header_len


def _read_tensor(file: Path, info: dict[str, Any], data_start: int, name: str) -> np.ndarray:
    dtype = _DTYPES.get(info["dtype"])
    if dtype is None:
        raise CheckpointError(f"{file}: tensor {name!r} has unsupported dtype {info['dtype']}")
    begin, end = info["data_offsets"]
    shape = tuple(info["shape"])
    if end - begin != int(np.prod(shape)) * dtype.itemsize:
        raise CheckpointError(f"{file}: tensor {name!r} byte range does not match {shape}")
    if data_start + end > file.stat().st_size:
        raise CheckpointError(f"{file}: tensor {name!r} is truncated")
    if end == begin:
        return np.zeros(shape, dtype)
    raw = np.memmap(file, dtype=np.uint8, mode="r", offset=data_start + begin, shape=(end - begin,))
    return raw.view(dtype).reshape(shape)  # read lazily, one tensor at a time


def read_safetensors(file: str | Path) -> dict[str, np.ndarray]:
    """Every tensor of one safetensors file as a read-only memory-mapped numpy array (float8 and
    bfloat16 as ml_dtypes types)."""
    file = Path(file)
    header, data_start = _read_header(file)
    return {name: _read_tensor(file, info, data_start, name) for name, info in header.items()}


# ----------------------------------------------------------------------------------------------
# Loading
# ----------------------------------------------------------------------------------------------


def _scale_vector(scale: np.ndarray, n: int, where: str) -> np.ndarray:
    """A per-tensor ([] / [1]) or per-channel ([N] / [N, 1]) scale as float32 [N]."""
    if scale.size == 1:
        return np.full((n,), scale.reshape(()), np.float32)
    if scale.shape in ((n,), (n, 1)):
        return scale.reshape(n).astype(np.float32)
    raise CheckpointError(f"{where}: shape {scale.shape} fits neither a per-tensor scale nor "
                          f"one per output channel ({n})")


def _check_scale_values(scale: np.ndarray, where: str) -> None:
    values = scale.astype(np.float32)
    if not np.all(np.isfinite(values)) or np.any(values < 0):
        raise CheckpointError(f"{where}: scales must be finite and >= 0")


def _quantized_weight(name: str, weight: np.ndarray, scales: dict[str, np.ndarray],
                      spec: CheckpointQuantization, method: str | None, where: str):
    n, k = weight.shape
    if ".weight_scale_inv" in scales or spec.weight_strategy == "block":
        if spec.block_shape is None:
            raise CheckpointError(f"{where}: block scales but no weight block size in the config")
        scale = scales.get(".weight_scale_inv", scales.get(".weight_scale"))
        bn, bk = spec.block_shape
        want = (-(-n // bn), -(-k // bk))
        if scale is None or tuple(scale.shape) != want:
            got = None if scale is None else tuple(scale.shape)
            raise CheckpointError(f"{where}: block scale of {name!r} must be {list(want)} for its "
                                  f"weight {[n, k]} in {bn} x {bk} blocks, got {got}")
        if ".input_scale" in scales:
            raise CheckpointError(f"{where}: {name!r} has an input_scale with block-wise weights")
        if method not in (None, "fp8_block"):
            raise ValueError(f"block-wise fp8 checkpoints load as 'fp8_block', not {method!r}")
        _check_scale_values(scale, where)
        return QuantizedWeight(weight, scale.astype(np.float32), None, "fp8_block", (bn, bk))
    if ".weight_scale" not in scales:
        raise CheckpointError(f"{where}: {name!r} is float8_e4m3fn but has no weight_scale")
    scale = _scale_vector(scales[".weight_scale"], n, f"{where}: {name}_scale")
    _check_scale_values(scale, where)
    input_scale = scales.get(".input_scale")
    if input_scale is not None:
        if input_scale.size != 1:
            raise CheckpointError(f"{where}: input_scale of {name!r} must be per tensor, got "
                                  f"shape {input_scale.shape}")
        _check_scale_values(input_scale, where)
        input_scale = input_scale.reshape(()).astype(np.float32)
    if spec.activations == "static" and input_scale is None:
        raise CheckpointError(f"{where}: the config promises static activation scales but "
                              f"{name!r} has no input_scale")
    default = "fp8" if spec.activations is not None else "fp8_w8a16"
    chosen = default if method is None else method
    if chosen not in ("fp8", "fp8_w8a16"):
        raise ValueError(f"per-tensor/per-channel fp8 checkpoints load as 'fp8' or 'fp8_w8a16', "
                         f"not {chosen!r}")
    return QuantizedWeight(weight, scale, input_scale if chosen == "fp8" else None, chosen, None)


def load_quantized_hf_params(model_dir: str | Path, cfg: ModelConfig, dtype: Any = jnp.float32,
                             method: str | None = None) -> dict[str, Any]:
    """Read a pre-quantized FP8 checkpoint into the params pytree of ``cfg``.

    Dense tensors become jax arrays of ``dtype``; each quantized linear becomes a
    ``QuantizedWeight`` (qweight e4m3 ``[out, in]`` as stored, float32 scales). ``method``
    overrides the per-channel method ("fp8" or "fp8_w8a16"); None follows the checkpoint.
    Everything is read and checked before anything is placed on a device.
    """
    if method is not None:
        check_method(method)
    spec = checkpoint_quantization(model_dir)
    if spec is None:
        raise CheckpointError(f"{model_dir}/config.json has no quantization_config; load it with "
                              "jaxinfer.loading.loader.load_hf_params (and quantize on load if wanted)")
    table = hf_name_table(cfg)
    abstract = abstract_params(cfg)
    tensors: dict[str, tuple[np.ndarray, Path]] = {}
    for file in safetensors_files(model_dir):
        for name, array in read_safetensors(file).items():
            if name in tensors:
                raise CheckpointError(f"tensor {name!r} appears in both {tensors[name][1]} and {file}")
            tensors[name] = (array, file)

    leaves: dict[tuple, Any] = {}
    used: set[str] = set()
    for hf_name, (path, transpose) in table.items():
        if hf_name not in tensors:
            raise CheckpointError(f"{model_dir}: missing tensor {hf_name!r}")
        array, file = tensors[hf_name]
        used.add(hf_name)
        want = _node(abstract, path).shape
        stored_shape = tuple(reversed(want)) if transpose else tuple(want)
        where = f"{file}: {hf_name}"
        if array.shape != stored_shape:
            raise CheckpointError(f"{where}: shape {array.shape}, expected {stored_shape}")
        prefix = hf_name[: -len(".weight")] if hf_name.endswith(".weight") else None
        scales = {}
        for suffix in _SCALE_SUFFIXES if prefix else ():
            if prefix + suffix in tensors:
                scales[suffix] = tensors[prefix + suffix][0]
                used.add(prefix + suffix)
        if array.dtype == _E4M3:
            if not transpose:
                raise NotImplementedError(f"{where}: only linear layers may be quantized")
            leaves[path] = _quantized_weight(hf_name, array, scales, spec, method, where)
        elif array.dtype.kind == "f" and array.dtype.itemsize == 1:
            raise NotImplementedError(f"{where}: dtype {array.dtype} is not supported (only e4m3)")
        elif scales:
            raise CheckpointError(f"{where}: has {sorted(scales)} but is stored as {array.dtype}, "
                                  "not float8_e4m3fn")
        else:
            leaves[path] = (array, transpose)  # converted when placed
    for name in tensors:
        if name in used or name.endswith("rotary_emb.inv_freq"):
            continue
        if name == "lm_head.weight" and cfg.tie_word_embeddings:
            continue  # tied: a stored copy is redundant (as jaxinfer.loading.loader does)
        raise CheckpointError(f"{tensors[name][1]}: unexpected tensor {name!r} for a "
                              f"{cfg.architecture} config with {cfg.num_layers} layers")
    target = np.dtype(jnp.dtype(dtype))
    params: dict[str, Any] = {"layers": [{} for _ in range(cfg.num_layers)]}
    for path, leaf in leaves.items():  # all checked: now read and place one tensor at a time
        if isinstance(leaf, tuple):
            array, transpose = leaf
            leaf = np.ascontiguousarray(array.T if transpose else array, dtype=target)
        node = params
        for part in path[:-1]:
            node = node[part]
        node[path[-1]] = jax.tree.map(lambda a: jax.device_put(np.asarray(a)), leaf)
    return params


def _node(tree: Any, path: tuple) -> Any:
    for part in path:
        tree = tree[part]
    return tree
