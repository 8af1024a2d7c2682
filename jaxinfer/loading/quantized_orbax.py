"""Quantized orbax checkpoints: what ``jaxinfer convert --quantization METHOD`` writes, read back bit-equal.

The directory has the layout of ``jaxinfer.loading.loader.save_params`` (``params/`` written by orbax, an HF
``config.json``, tokenizer files, the ``jaxinfer_checkpoint.json`` marker) and the marker says which
leaves are quantized. In the orbax tree each ``QuantizedWeight`` is a dict ``{"qweight", "scale"[,
"input_scale"]}``; e4m3 weights are stored as their bytes typed int8 (a bit-exact view), so the files
need no float8 support from tensorstore. Dense leaves keep one dtype (the one converted to).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from jaxinfer.config.model import ModelConfig
from jaxinfer.loading.loader import MARKER_FILE, PARAMS_SUBDIR, CheckpointError, is_orbax_dir, write_checkpoint_files
from jaxinfer.quantization.quantized_weight import QuantizedWeight, is_quantized, validate
from pallas_kernels.fp8_format import E4M3


def _path_name(keys) -> str:
    return "/".join(str(k.key if isinstance(k, jax.tree_util.DictKey) else k.idx) for k in keys)


def is_quantized_orbax(path: str | Path) -> bool:
    """A ``jaxinfer convert --quantization`` directory (as opposed to a dense orbax or HF one)."""
    path = Path(path)
    if not is_orbax_dir(path):
        return False
    return "quantization" in json.loads((path / MARKER_FILE).read_text())


def save_quantized_params(params: Any, out_dir: str | Path, cfg: ModelConfig, copy_files_from=None,
                          overwrite: bool = False) -> Path:
    """Write a params pytree with ``QuantizedWeight`` leaves (see the module doc). Returns ``out_dir``."""
    out_dir = Path(out_dir).resolve()
    ckpt_dir = out_dir / PARAMS_SUBDIR
    if ckpt_dir.exists():
        if not overwrite:
            raise FileExistsError(f"{ckpt_dir} already exists (pass overwrite=True to replace it)")
        shutil.rmtree(ckpt_dir)
    quantized: dict[str, dict] = {}

    def to_storable(keys, leaf):
        if not is_quantized(leaf):
            return np.asarray(leaf)
        e4m3 = jnp.dtype(leaf.qweight.dtype) == E4M3
        quantized[_path_name(keys)] = {"method": leaf.method, "block_shape": leaf.block_shape,
                                       "e4m3": e4m3 or leaf.method != "int8",
                                       "input_scale": leaf.input_scale is not None}
        entry = {"qweight": np.asarray(leaf.qweight).view(np.int8), "scale": np.asarray(leaf.scale, np.float32)}
        if leaf.input_scale is not None:
            entry["input_scale"] = np.asarray(leaf.input_scale, np.float32)
        return entry

    tree = jax.tree_util.tree_map_with_path(to_storable, params, is_leaf=is_quantized)
    if not quantized:
        raise ValueError("no quantized weights in params: save dense params with jaxinfer.loading.loader.save_params")
    dense = {str(np.asarray(a).dtype) for a in jax.tree.leaves(params, is_leaf=is_quantized) if not is_quantized(a)}
    if len(dense) != 1:
        raise ValueError(f"dense params mix dtypes {sorted(dense)}; cast them to one dtype before saving")
    out_dir.mkdir(parents=True, exist_ok=True)
    import orbax.checkpoint as ocp  # deferred: slow to import

    with ocp.StandardCheckpointer() as ckptr:
        ckptr.save(ckpt_dir, tree)
        ckptr.wait_until_finished()
    write_checkpoint_files(out_dir, cfg, copy_files_from, dtype=dense.pop(), quantization=quantized)
    return out_dir


def restore_quantized_params(ckpt_dir: str | Path, dtype: Any = None) -> tuple[ModelConfig, Any]:
    """Read a quantized directory back: ``(cfg, params)`` with ``QuantizedWeight`` leaves whose bytes
    and scales equal what was saved; dense leaves cast to ``dtype`` (None: as saved). Shapes and
    dtypes are checked against the config before anything is returned."""
    import orbax.checkpoint as ocp

    ckpt_dir = Path(ckpt_dir).resolve()
    if not is_quantized_orbax(ckpt_dir):
        raise CheckpointError(f"{ckpt_dir} is not a quantized jaxinfer checkpoint")
    marker = json.loads((ckpt_dir / MARKER_FILE).read_text())
    cfg = ModelConfig.from_pretrained(ckpt_dir)
    with ocp.StandardCheckpointer() as ckptr:
        try:
            tree = ckptr.restore(ckpt_dir / PARAMS_SUBDIR)
        except (ValueError, KeyError, FileNotFoundError) as e:
            raise CheckpointError(f"{ckpt_dir / PARAMS_SUBDIR}: cannot restore: {e}") from e
    tree = _as_lists(tree)
    dt = jnp.dtype(dtype if dtype is not None else marker["dtype"])
    from jaxinfer.model.weights import abstract_params

    want = abstract_params(cfg)

    def rebuild(path_keys, spec):
        name = _path_name(path_keys)
        node = tree
        for k in name.split("/"):
            node = node[int(k)] if isinstance(node, list) else node[k]
        info = marker["quantization"].get(name)
        if info is None:
            if tuple(node.shape) != tuple(spec.shape):
                raise CheckpointError(f"{ckpt_dir}: {name} has shape {node.shape}, config wants {spec.shape}")
            return jnp.asarray(node, dt)
        qweight = np.asarray(node["qweight"])
        if info["e4m3"]:
            qweight = qweight.view(E4M3)
        block = tuple(info["block_shape"]) if info["block_shape"] is not None else None
        input_scale = jnp.asarray(node["input_scale"]) if info["input_scale"] else None
        qw = QuantizedWeight(jnp.asarray(qweight), jnp.asarray(node["scale"]), input_scale, info["method"], block)
        try:
            validate(qw)
        except ValueError as e:
            raise CheckpointError(f"{ckpt_dir}: {name}: {e}") from e
        if qw.shape != tuple(spec.shape):
            raise CheckpointError(f"{ckpt_dir}: {name} is a [{qw.in_features}, {qw.out_features}] weight, "
                                  f"config wants {list(spec.shape)}")
        return qw

    return cfg, jax.tree_util.tree_map_with_path(rebuild, want)


def _as_lists(tree):
    """orbax may give the layers list back as a dict keyed "0", "1", ...: make it a list again."""
    if isinstance(tree, dict):
        if tree and all(isinstance(k, str) and k.isdigit() for k in tree):
            return [_as_lists(tree[str(i)]) for i in range(len(tree))]
        return {k: _as_lists(v) for k, v in tree.items()}
    if isinstance(tree, (list, tuple)):
        return [_as_lists(v) for v in tree]
    return tree
