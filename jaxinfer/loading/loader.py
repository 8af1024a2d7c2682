"""Loading and saving model weights: HF safetensors in, orbax checkpoints out and back in.

* ``load_hf_params`` reads an HF model directory (``model.safetensors``, or the shards listed in
  ``model.safetensors.index.json``) into the params pytree declared in ``jaxinfer.model.weights``, without
  torch: tensors come through ``safetensors`` as numpy arrays (bfloat16 as ``ml_dtypes.bfloat16``), are
  checked against the declaration, transposed to ``[in, out]``, cast, and placed on device one at a time.
  Per-expert tensors of an MoE model are written into their slot of the stacked ``[E, ...]`` array on the
  device (allocated when its first expert arrives, updated in place), so host memory still holds one
  tensor at a time.
* ``save_params`` / ``restore_params`` store the pytree with orbax next to an HF ``config.json`` (the
  ``jaxinfer convert`` format); ``convert_hf_checkpoint`` does HF -> orbax end to end.

Every failure names the file and tensor involved.
"""

from __future__ import annotations

import functools
import json
import shutil
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from safetensors import SafetensorError, safe_open

from jaxinfer.config.model import ModelConfig
from jaxinfer.model.weights import ParamSpec, abstract_params, spec_leaves_with_paths

SINGLE_FILE = "model.safetensors"
INDEX_FILE = "model.safetensors.index.json"
PARAMS_SUBDIR = "params"  # orbax checkpoint inside a converted directory
MARKER_FILE = "jaxinfer_checkpoint.json"  # format marker + saved dtype of a converted directory
FORMAT_NAME = "jaxinfer-orbax"
# Copied from an HF directory into a converted one when present.
AUX_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "generation_config.json",
    "tokenizer.model",
    "vocab.json",
    "merges.txt",
    "chat_template.jinja",
)


class CheckpointError(ValueError):
    """A checkpoint directory or file that cannot be loaded as the config describes."""


def _is_ignored(name: str) -> bool:
    """Tensors that HF checkpoints may carry but that the model recomputes (rotary buffers)."""
    return name.endswith("rotary_emb.inv_freq")


def safetensors_files(model_dir: str | Path) -> list[Path]:
    """The safetensors files of an HF directory: the shards of the index, else ``model.safetensors``."""
    model_dir = Path(model_dir)
    index_path = model_dir / INDEX_FILE
    if index_path.is_file():
        try:
            weight_map = json.loads(index_path.read_text())["weight_map"]
        except (json.JSONDecodeError, KeyError, TypeError) as e:
            raise CheckpointError(f"{index_path}: not a valid safetensors index ({e})") from e
        shards = sorted(set(weight_map.values()))
        for shard in shards:
            if not (model_dir / shard).is_file():
                raise CheckpointError(f"{index_path} references shard {shard!r}, which is missing from {model_dir}")
        return [model_dir / s for s in shards]
    single = model_dir / SINGLE_FILE
    if single.is_file():
        return [single]
    found = sorted(p.name for p in model_dir.iterdir()) if model_dir.is_dir() else []
    hint = " (PyTorch .bin checkpoints are not supported: re-save with safe_serialization)" if any(
        n.endswith(".bin") or n.endswith(".pt") for n in found
    ) else ""
    raise CheckpointError(
        f"no {SINGLE_FILE} or {INDEX_FILE} in {model_dir}{hint}; files there: {found}"
    )


def _sharding_for(shardings: Any, path: tuple) -> Any:
    if shardings is None or isinstance(shardings, jax.sharding.Sharding):
        return shardings
    node = shardings
    for part in path:
        node = node[part]
    return node


def _set_at(tree: dict, path: tuple, value: Any) -> None:
    node = tree
    for part in path[:-1]:
        node = node[part] if isinstance(node, list) else node.setdefault(part, {})
    node[path[-1]] = value


def _empty_tree(cfg: ModelConfig) -> dict[str, Any]:
    return {"layers": [{} for _ in range(cfg.num_layers)]}


class _HostPlacer:
    """Arrays stay numpy; a stacked leaf is a host buffer filled slot by slot."""

    def place(self, arr, path):
        return arr

    def new_stack(self, shape, dtype, path):
        return np.zeros(shape, dtype)

    def set_slot(self, stack, slot, arr, path):
        stack[slot] = arr
        return stack


class _DevicePlacer:
    """Arrays go to device with the given shardings; a stacked leaf is a device array updated in place."""

    def __init__(self, shardings):
        self.shardings = shardings

    def place(self, arr, path):
        return jax.device_put(arr, _sharding_for(self.shardings, path))

    def new_stack(self, shape, dtype, path):
        return _zeros_fn(shape, np.dtype(dtype), _sharding_for(self.shardings, path))()

    def set_slot(self, stack, slot, arr, path):
        return _set_slot_fn(stack.sharding)(stack, arr, np.int32(slot))


@functools.lru_cache(maxsize=None)
def _zeros_fn(shape, dtype, sharding):
    return jax.jit(lambda: jnp.zeros(shape, dtype), out_shardings=sharding)


@functools.lru_cache(maxsize=None)
def _set_slot_fn(sharding):
    """``stack.at[slot].set(arr)`` in place (the stack is donated); compiled once per stacked leaf shape."""
    return jax.jit(lambda stack, arr, slot: jax.lax.dynamic_update_index_in_dim(stack, arr.astype(stack.dtype),
                                                                                   slot, 0),
                   out_shardings=sharding, donate_argnums=0)


def load_hf_params_host(model_dir: str | Path, cfg: ModelConfig, dtype: Any = jnp.float32) -> dict[str, Any]:
    """Like ``load_hf_params`` but returns host numpy arrays (for conversion or custom placement)."""
    return _load(model_dir, cfg, dtype, _HostPlacer())


def load_hf_params(
    model_dir: str | Path, cfg: ModelConfig, dtype: Any = jnp.float32, shardings: Any = None
) -> dict[str, Any]:
    """Read an HF safetensors checkpoint into the params pytree of ``cfg`` as jax arrays of ``dtype``.

    ``shardings``: None (default device), one ``jax.sharding.Sharding`` for every array, or a pytree
    of shardings with the params' structure. Each tensor is placed as soon as it is read, so host memory
    holds one tensor at a time (a per-expert tensor goes into its slot of the stacked device array).
    Raises ``CheckpointError`` naming the file/tensor on missing, unexpected or mis-shaped tensors and on
    unreadable files.
    """
    return _load(model_dir, cfg, dtype, _DevicePlacer(shardings))


def _hf_tensor_table(cfg: ModelConfig) -> dict[str, list[tuple[tuple, ParamSpec, int | None]]]:
    """HF tensor name -> [(path of the leaf, its spec, slot in the stacked axis or None)]: one leaf per tensor,
    or several where a fused tensor is split at load (``ParamSpec.hf_part``)."""
    table: dict[str, list] = {}
    for path, spec in spec_leaves_with_paths(cfg):
        for name, slot in spec.hf_names():
            table.setdefault(name, []).append((path, spec, slot))
    return table


def _hf_shape(spec: ParamSpec, slot: int | None) -> tuple[int, ...]:
    """The shape HF stores: one slot of a stacked leaf, transposed back where HF stores [out, in]; the whole
    fused tensor for a spec that is a part of it (``ParamSpec.hf_part``)."""
    shape = spec.shape[1:] if slot is not None else spec.shape
    shape = list(reversed(shape)) if spec.transpose else list(shape)
    if spec.hf_part is not None:
        shape[spec.hf_part.axis] = spec.hf_part.size
    return tuple(shape)


def _load(model_dir: str | Path, cfg: ModelConfig, dtype: Any, placer) -> dict[str, Any]:
    target_dtype = np.dtype(jnp.dtype(dtype))
    table = _hf_tensor_table(cfg)
    params = _empty_tree(cfg)
    stacks: dict[tuple, Any] = {}  # path -> stacked leaf being filled
    seen: dict[str, Path] = {}
    for file in safetensors_files(model_dir):
        try:
            with safe_open(str(file), framework="numpy") as f:
                for name in f.keys():
                    if name in seen:
                        raise CheckpointError(f"tensor {name!r} appears in both {seen[name]} and {file}")
                    seen[name] = file
                    if _is_ignored(name):
                        continue
                    shape = tuple(f.get_slice(name).get_shape())
                    if name not in table:
                        if name == "lm_head.weight" and cfg.tie_word_embeddings:
                            want = (cfg.vocab_size, cfg.hidden_size)
                            if shape != want:
                                raise CheckpointError(
                                    f"{file}: tensor {name!r} has shape {shape}, expected {want} (tied embeddings)"
                                )
                            continue  # tied: the model uses embed.T; a stored copy is redundant
                        raise CheckpointError(
                            f"{file}: unexpected tensor {name!r} (shape {shape}) for a "
                            f"{cfg.architecture} config with {cfg.num_layers} layers"
                        )
                    entries = table[name]
                    for path, spec, slot in entries:
                        if shape != _hf_shape(spec, slot):
                            raise CheckpointError(
                                f"{file}: tensor {name!r} has shape {shape}, expected {_hf_shape(spec, slot)}"
                            )
                    tensor = f.get_tensor(name)
                    for path, spec, slot in entries:
                        arr = tensor if spec.hf_part is None else tensor[spec.hf_part.index(tensor.ndim)]
                        if spec.transpose:
                            arr = arr.T
                        arr = np.ascontiguousarray(arr, dtype=target_dtype)
                        if slot is None:
                            _set_at(params, path, placer.place(arr, path))
                            continue
                        if path not in stacks:
                            stacks[path] = placer.new_stack(spec.shape, target_dtype, path)
                        stacks[path] = placer.set_slot(stacks[path], slot, arr, path)
        except SafetensorError as e:
            raise CheckpointError(f"{file}: cannot read safetensors file (truncated or corrupt?): {e}") from e
    missing = [name for name in table if name not in seen]
    if missing:
        shown = ", ".join(missing[:8]) + (f", ... ({len(missing)} in all)" if len(missing) > 8 else "")
        raise CheckpointError(f"{model_dir}: missing tensors: {shown}")
    for path, stack in stacks.items():
        _set_at(params, path, stack)
    return params


# ---------------------------------------------------------------------------------------------------
# orbax


def is_orbax_dir(path: str | Path) -> bool:
    """True for a directory written by ``save_params`` (as opposed to an HF safetensors directory)."""
    path = Path(path)
    return (path / MARKER_FILE).is_file() and (path / PARAMS_SUBDIR).is_dir()


def _checkpointer():
    import orbax.checkpoint as ocp  # deferred: orbax is slow to import and only needed here

    return ocp.StandardCheckpointer()


def save_params(
    params: Any,
    out_dir: str | Path,
    cfg: ModelConfig,
    copy_files_from: str | Path | None = None,
    overwrite: bool = False,
) -> Path:
    """Write ``params`` with orbax to ``out_dir/params`` plus an HF ``config.json`` and a format marker.

    ``copy_files_from``: an HF directory whose tokenizer / generation-config files are copied along.
    Returns ``out_dir``. Refuses to replace an existing checkpoint unless ``overwrite``.
    """
    out_dir = Path(out_dir).resolve()  # orbax wants absolute paths
    ckpt_dir = out_dir / PARAMS_SUBDIR
    if ckpt_dir.exists():
        if not overwrite:
            raise FileExistsError(f"{ckpt_dir} already exists (pass overwrite=True to replace it)")
        shutil.rmtree(ckpt_dir)
    dtypes = {str(np.dtype(x.dtype)) for x in jax.tree.leaves(params)}
    if len(dtypes) != 1:
        raise ValueError(f"params mix dtypes {sorted(dtypes)}; cast them to one dtype before saving")
    out_dir.mkdir(parents=True, exist_ok=True)
    with _checkpointer() as ckptr:
        ckptr.save(ckpt_dir, params)
        ckptr.wait_until_finished()
    write_checkpoint_files(out_dir, cfg, copy_files_from, dtype=dtypes.pop())
    return out_dir


def write_checkpoint_files(out_dir: Path, cfg: ModelConfig, copy_files_from, **marker_fields) -> None:
    """Beside the saved params: ``config.json``, the tokenizer / generation files copied from
    ``copy_files_from`` (if given) and the format marker (with ``marker_fields``, e.g. the saved dtype)."""
    (out_dir / "config.json").write_text(json.dumps(cfg.to_hf_dict(), indent=2) + "\n")
    if copy_files_from is not None:
        for name in AUX_FILES:
            src = Path(copy_files_from) / name
            if src.is_file():
                shutil.copyfile(src, out_dir / name)
    marker = {"format": FORMAT_NAME, "version": 1, **marker_fields}
    (out_dir / MARKER_FILE).write_text(json.dumps(marker, indent=2) + "\n")


def restore_params(ckpt_dir: str | Path, dtype: Any = None, shardings: Any = None) -> tuple[ModelConfig, Any]:
    """Read a ``save_params`` directory back: ``(cfg, params)`` as jax arrays.

    ``dtype``: None keeps the saved dtype, else orbax casts on restore. ``shardings``: None (default
    device), one ``Sharding`` for all arrays, or a pytree of shardings like the params.
    """
    ckpt_dir = Path(ckpt_dir).resolve()
    if not is_orbax_dir(ckpt_dir):
        raise CheckpointError(f"{ckpt_dir} is not a jaxinfer orbax checkpoint (no {MARKER_FILE} + {PARAMS_SUBDIR}/)")
    marker = json.loads((ckpt_dir / MARKER_FILE).read_text())
    if marker.get("format") != FORMAT_NAME:
        raise CheckpointError(f"{ckpt_dir / MARKER_FILE}: unknown format {marker.get('format')!r}")
    cfg = ModelConfig.from_pretrained(ckpt_dir)
    dt = jnp.dtype(dtype if dtype is not None else marker["dtype"])
    default = jax.sharding.SingleDeviceSharding(jax.devices()[0])
    target = jax.tree_util.tree_map_with_path(
        lambda keys, a: jax.ShapeDtypeStruct(
            a.shape, dt, sharding=_sharding_for(shardings, _plain_path(keys)) or default
        ),
        abstract_params(cfg),
    )
    with _checkpointer() as ckptr:
        try:
            params = ckptr.restore(ckpt_dir / PARAMS_SUBDIR, target)
        except (ValueError, KeyError, FileNotFoundError) as e:
            raise CheckpointError(f"{ckpt_dir / PARAMS_SUBDIR}: cannot restore params for its config.json: {e}") from e
    return cfg, params


def _plain_path(keys: tuple) -> tuple:
    return tuple(k.key if isinstance(k, jax.tree_util.DictKey) else k.idx for k in keys)


def convert_hf_checkpoint(
    hf_dir: str | Path, out_dir: str | Path, dtype: Any = jnp.bfloat16, overwrite: bool = False
) -> Path:
    """HF safetensors directory -> orbax directory (``jaxinfer convert HF_DIR OUT_DIR``)."""
    cfg = ModelConfig.from_pretrained(hf_dir)
    params = load_hf_params_host(hf_dir, cfg, dtype)
    return save_params(params, out_dir, cfg, copy_files_from=hf_dir, overwrite=overwrite)
