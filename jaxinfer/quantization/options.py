"""The engine's quantization options: checked before anything is allocated, applied while the model loads.

``LLM(quantization=..., kv_cache_dtype=...)``:

* ``quantization=None``: the checkpoint's own weights. A pre-quantized checkpoint (HF
  ``quantization_config``: compressed-tensors or fp8, read by ``jaxinfer.loading.quantized_hf``; or a
  ``jaxinfer convert --quantization`` directory, ``jaxinfer.loading.quantized_orbax``) loads quantized.
* ``"fp8"`` (W8A8 e4m3), ``"fp8_w8a16"`` (e4m3 weights only), ``"int8"`` (int8 weights only): a dense
  checkpoint is quantized on load, absmax per output channel, every layer's q/k/v/o and (dense models)
  gate/up/down projection; embeddings, norms, biases, the LM head (unless ``include_lm_head``) and an MoE
  layer's router, routed expert stacks and shared expert stay as they are (the expert stacks are read by
  ``jaxinfer.model.moe`` as grouped matmuls, not through ``linear``). A pre-quantized fp8 checkpoint loads as it is, and
  ``"fp8_w8a16"`` runs its per-channel weights weight-only; ``"int8"`` on it is refused.
* ``kv_cache_dtype="fp8"``: e4m3 K/V with per-layer scales folded into the weights (``jaxinfer.quantization.kv_cache``).

``check_options`` runs before anything is read or allocated (platform: W8A8 fp8 needs fp8 tensor cores,
sm_89+, and the Pallas attention kernel needs sm_89+ to read e4m3 K/V; checkpoint: methods the checkpoint
cannot be run as). Inconsistent checkpoint scales are refused by the loaders before anything is placed.
``describe`` reports what was quantized and the weight bytes before and after (``LLMEngine.stats()``
and the load log).
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp

from jaxinfer.config.model import ModelConfig
from jaxinfer.model.kv_cache import FP8_BITS_KV_DTYPE, FP8_KV_DTYPE
from jaxinfer.quantization import kv_cache as quant_kv
from jaxinfer.quantization.quantized_weight import (
    LINEAR_WEIGHT_NAMES,
    is_quantized,
    quantize_weight,
    weight_bytes,
    with_cpu_storage,
    with_method,
)

# linear weights quantized on load: every layer's attention and dense-MLP projections (an MoE layer's
# router, routed experts and shared expert stay unquantized)
QUANTIZED_ON_LOAD = LINEAR_WEIGHT_NAMES
FP8_MIN_COMPUTE_CAPABILITY = (8, 9)  # Ada / Hopper: fp8 tensor cores and e4m3 conversion in Triton


@dataclasses.dataclass(frozen=True)
class QuantOptions:
    quantization: str | None = None
    kv_cache_dtype: str = "auto"
    include_lm_head: bool = False

    @property
    def active(self) -> bool:
        return self.quantization is not None or self.kv_cache_dtype == "fp8"


def _compute_capability(device) -> tuple[int, int] | None:
    cc = getattr(device, "compute_capability", None)
    if not cc:
        return None
    major, _, minor = str(cc).partition(".")
    return int(major), int(minor or 0)


def has_fp8_compute(platform: str, devices=None) -> bool:
    """False on a GPU older than sm_89 (no fp8 tensor cores; Triton cannot convert e4m3 there)."""
    if platform != "gpu":
        return True  # the CPU formulations (jaxinfer.cpu.quantized_matmul) run every method
    devices = jax.devices() if devices is None else devices
    ccs = [cc for cc in (_compute_capability(d) for d in devices) if cc is not None]
    return not ccs or min(ccs) >= FP8_MIN_COMPUTE_CAPABILITY


def check_platform(options: QuantOptions, platform: str, attention_backend: str, devices=None) -> None:
    """ValueError if this platform cannot run the options (before anything is loaded)."""
    if has_fp8_compute(platform, devices):
        return
    devices = jax.devices() if devices is None else devices
    kind = devices[0].device_kind
    cc = "%d.%d" % min(c for c in (_compute_capability(d) for d in devices) if c is not None)
    if options.quantization == "fp8":
        raise ValueError(f"quantization='fp8' (W8A8) needs fp8 tensor cores (compute capability >= 8.9); "
                         f"this {kind} is {cc}: use quantization='fp8_w8a16' (weight-only) or 'int8'")
    if options.kv_cache_dtype == "fp8" and attention_backend == "pallas":
        raise ValueError(f"kv_cache_dtype='fp8' with the Pallas attention kernel needs compute capability "
                         f">= 8.9 (Triton cannot convert e4m3 on {kind}, {cc}): use attention_backend='xla' "
                         "or kv_cache_dtype='auto'")


def checkpoint_kind(model) -> str:
    """"hf-quantized" (HF dir with a quantization_config), "orbax-quantized", or "dense"."""
    if model is None or (isinstance(model, str) and model.startswith("random:")):
        return "dense"
    path = Path(model)
    from jaxinfer.loading.quantized_orbax import is_quantized_orbax

    if is_quantized_orbax(path):
        return "orbax-quantized"
    config = path / "config.json"
    if config.is_file() and "quantization_config" in json.loads(config.read_text()):
        return "hf-quantized"
    return "dense"


def check_checkpoint(options: QuantOptions, model, fp8_compute: bool = True) -> str:
    """The checkpoint kind; ValueError when the requested method cannot run this checkpoint (or, without
    ``fp8_compute``, on this GPU). Reads only config files (a checkpoint's scales are checked by its loader,
    before anything is placed)."""
    kind = checkpoint_kind(model)
    q = options.quantization
    if kind == "hf-quantized":
        from jaxinfer.loading.quantized_hf import checkpoint_quantization

        spec = checkpoint_quantization(model)  # NotImplementedError for schemes we cannot read
        if q == "int8":
            raise ValueError(f"{model} is an fp8 checkpoint ({spec.quant_method}, per {spec.weight_strategy}); "
                             "it cannot be run as 'int8': use quantization=None, 'fp8' or 'fp8_w8a16', or an "
                             "unquantized checkpoint")
        if q == "fp8_w8a16" and spec.weight_strategy == "block":
            raise ValueError(f"{model} has block-wise fp8 weights, which run as W8A8 only: use quantization=None "
                             "or 'fp8'")
        if not fp8_compute and spec.weight_strategy == "block":
            raise ValueError(f"{model} has block-wise fp8 weights (W8A8), which need fp8 tensor cores (compute "
                             "capability >= 8.9); this GPU has none")
    elif kind == "orbax-quantized" and q is not None:
        from jaxinfer.loading.loader import MARKER_FILE

        methods = {v["method"] for v in json.loads((Path(model) / MARKER_FILE).read_text())["quantization"].values()}
        if methods != {q} and not (methods <= {"fp8", "fp8_w8a16"} and q in ("fp8", "fp8_w8a16")):
            raise ValueError(f"{model} was converted with quantization {sorted(methods)}; it cannot run as {q!r} "
                             "(use quantization=None, or convert again)")
    return kind


def load_prequantized(model, kind: str, cfg: ModelConfig, dtype, options: QuantOptions) -> Any:
    """Params of a pre-quantized checkpoint (QuantizedWeight leaves; dense leaves in ``dtype``). On a GPU
    without fp8 tensor cores, per-channel fp8 weights run weight-only unless asked otherwise."""
    method = options.quantization if options.quantization in ("fp8", "fp8_w8a16") else None
    if method is None and not has_fp8_compute(jax.default_backend()):
        method = "fp8_w8a16"
    if kind == "hf-quantized":
        from jaxinfer.loading.quantized_hf import checkpoint_quantization, load_quantized_hf_params

        if checkpoint_quantization(model).weight_strategy == "block":
            method = None  # block-wise weights run as "fp8_block" (W8A8) whatever was asked ("fp8" or None)
        return load_quantized_hf_params(model, cfg, dtype, method=method)
    from jaxinfer.loading.quantized_orbax import restore_quantized_params

    _, params = restore_quantized_params(model, dtype)
    if method is None:
        return params
    return jax.tree.map(lambda a: with_method(a, method) if is_quantized(a) else a, params, is_leaf=is_quantized)


def apply(params: dict, cfg: ModelConfig, options: QuantOptions, platform: str) -> dict:
    """Fold the fp8 KV scales in, then quantize the linear weights on load (where not already quantized),
    one weight at a time; e4m3 weights held as int8-typed bytes on the CPU (``with_cpu_storage``)."""
    if options.kv_cache_dtype == "fp8":
        params = quant_kv.fold_kv_scales(params, cfg, quant_kv.kv_scales(params, cfg))
    method = options.quantization
    out = dict(params)
    if method is not None:
        layers = []
        for lp in params["layers"]:
            lp = dict(lp)
            for name in QUANTIZED_ON_LOAD:
                if name in lp and not is_quantized(lp[name]):
                    lp[name] = quantize_weight(lp[name], method)
            layers.append(lp)
        out["layers"] = layers
        if options.include_lm_head and "lm_head" in out and not is_quantized(out["lm_head"]):
            out["lm_head"] = quantize_weight(out["lm_head"], method)
    if platform == "cpu":
        out = jax.tree.map(lambda a: with_cpu_storage(a) if is_quantized(a) else a, out, is_leaf=is_quantized)
    return out


def kv_cache_dtype(options: QuantOptions, model_dtype, attention_backend: str = "pallas"):
    """The KV cache arrays' dtype: the model's, or e4m3 (its bytes typed int8 for the XLA and C++ attention
    paths on a CPU, backends "xla" and "cpu": ``jaxinfer.model.kv_cache.FP8_BITS_KV_DTYPE``)."""
    if options.kv_cache_dtype != "fp8":
        return jnp.dtype(model_dtype)
    if attention_backend in ("xla", "cpu") and jax.default_backend() == "cpu":
        return FP8_BITS_KV_DTYPE
    return FP8_KV_DTYPE


def describe(params: dict, cfg: ModelConfig, dtype, options: QuantOptions, kind: str = "dense") -> dict[str, Any]:
    """What was quantized: methods, how many weights, which stayed dense, weight bytes before (the dense
    model in ``dtype``) and after."""
    from jaxinfer.model.weights import abstract_params

    before = weight_bytes(abstract_params(cfg, dtype))
    quantized, dense = {}, set()
    for keys, leaf in jax.tree_util.tree_flatten_with_path(params, is_leaf=is_quantized)[0]:
        name = next((k.key for k in reversed(keys) if isinstance(k, jax.tree_util.DictKey)), "?")
        if is_quantized(leaf):
            quantized[leaf.method] = quantized.get(leaf.method, 0) + 1
        else:
            dense.add(name)
    after = weight_bytes(params)
    return {
        "quantization": options.quantization,
        "checkpoint": kind,
        "kv_cache_dtype": options.kv_cache_dtype,
        "quantized_weights": quantized,
        "unquantized": sorted(dense),
        "weight_bytes_before": int(before),
        "weight_bytes_after": int(after),
        "weight_bytes_ratio": round(after / before, 4) if before else None,
    }


def summary_line(report: dict[str, Any]) -> str:
    n = sum(report["quantized_weights"].values())
    methods = ", ".join(f"{v} {k}" for k, v in sorted(report["quantized_weights"].items())) or "none"
    return (f"quantization: {n} weights quantized ({methods}); weights {report['weight_bytes_before'] / 1e6:.1f} -> "
            f"{report['weight_bytes_after'] / 1e6:.1f} MB; kv_cache_dtype={report['kv_cache_dtype']}; "
            f"unquantized: {', '.join(report['unquantized'])}")
