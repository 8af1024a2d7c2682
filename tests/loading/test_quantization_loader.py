"""Tests for jaxinfer.loading.quantized_hf: pre-quantized FP8 checkpoints written here, in each layout
(compressed-tensors per channel / per tensor / static activation scales / block, and the
``fp8`` method's block-wise ``weight_scale_inv``), from random checkpoints HF transformers saved.

Loading must give the QuantizedWeights that quantizing the checkpoint's dequantized weights on load
gives (per-channel and block layouts, whose quantization is the same absmax rule), or exactly the
checkpoint's dequantized values (per tensor); everything else must equal what the unquantized
loader reads. Inconsistent checkpoints must be refused with errors that name the tensor.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import jax
import ml_dtypes
import numpy as np
import pytest
from safetensors.numpy import load_file, save_file

from jaxinfer.config.model import ModelConfig
from jaxinfer.loading.loader import CheckpointError, load_hf_params
from jaxinfer.loading.quantized_hf import (
    load_quantized_hf_params,
    parse_quantization_config,
    read_safetensors,
)
from jaxinfer.model.weights import get_at_path, hf_name_table, spec_leaves_with_paths
from jaxinfer.quantization import quantized_weight as Q
from tests.pallas_kernels import quant_cases as cases

pytestmark = pytest.mark.filterwarnings("ignore:The Pallas Triton backend is deprecated")

E4M3 = ml_dtypes.float8_e4m3fn


def _group(strategy, activations, block=None):
    weights = {"num_bits": 8, "type": "float", "symmetric": True, "dynamic": False,
               "strategy": strategy, "block_structure": block}
    acts = None if activations is None else {
        "num_bits": 8, "type": "float", "symmetric": True, "dynamic": activations == "dynamic",
        "strategy": "token" if activations == "dynamic" else "tensor"}
    return {"quant_method": "compressed-tensors", "format": "float-quantized", "ignore": ["lm_head"],
            "config_groups": {"group_0": {"targets": ["Linear"], "weights": weights,
                                          "input_activations": acts}}}


# name -> (quantization_config, weight layout, expected QuantizedWeight method)
LAYOUTS = {
    "ct-channel-dynamic": (_group("channel", "dynamic"), "channel", "fp8"),
    "ct-channel-weight-only": (_group("channel", None), "channel", "fp8_w8a16"),
    "ct-tensor-static": (_group("tensor", "static"), "tensor", "fp8"),
    "ct-block": (_group("block", "dynamic", [32, 32]), "block32", "fp8_block"),
    "fp8-block-128": ({"quant_method": "fp8", "fmt": "e4m3", "activation_scheme": "dynamic",
                       "weight_block_size": [128, 128]}, "block128", "fp8_block"),
    "fp8-tensor-static": ({"quant_method": "fp8", "activation_scheme": "static"}, "tensor", "fp8"),
}


def quantize_like_a_checkpoint(w_out_in: np.ndarray, layout: str):
    """What a quantizer writes for one [out, in] weight: {suffix: array}, numpy + ml_dtypes."""
    w = w_out_in.astype(np.float32)
    if layout == "channel":
        scale = cases.np_scale(np.abs(w).max(axis=1), 448.0)
        return {".weight": cases.np_to_e4m3(w / scale[:, None]), ".weight_scale": scale[:, None]}
    if layout == "tensor":
        scale = cases.np_scale(np.abs(w).max(keepdims=True), 448.0).reshape(1)
        return {".weight": cases.np_to_e4m3(w / scale), ".weight_scale": scale,
                ".input_scale": np.array([0.02], np.float32)}
    b = int(layout.removeprefix("block"))
    n, k = w.shape
    scale = np.ones((-(-n // b), -(-k // b)), np.float32)
    q = np.zeros((n, k), E4M3)
    for i in range(scale.shape[0]):
        for j in range(scale.shape[1]):
            block = w[i * b:(i + 1) * b, j * b:(j + 1) * b]
            scale[i, j] = cases.np_scale(np.abs(block).max(), 448.0)
            q[i * b:(i + 1) * b, j * b:(j + 1) * b] = cases.np_to_e4m3(block / scale[i, j])
    suffix = ".weight_scale_inv" if layout == "block128" else ".weight_scale"
    return {".weight": q, suffix: scale}


def write_quantized_checkpoint(hf_dir: Path, out_dir: Path, layout_name: str) -> Path:
    qcfg, layout, _ = LAYOUTS[layout_name]
    shutil.copytree(hf_dir, out_dir)
    config = json.loads((out_dir / "config.json").read_text())
    config["quantization_config"] = qcfg
    (out_dir / "config.json").write_text(json.dumps(config))
    cfg = ModelConfig.from_pretrained(out_dir)
    tensors = load_file(str(out_dir / "model.safetensors"))
    for name, (path, transpose) in hf_name_table(cfg).items():
        if transpose and path[0] == "layers":  # the layers' linears; lm_head stays (ignored)
            prefix = name.removesuffix(".weight")
            for suffix, array in quantize_like_a_checkpoint(tensors.pop(name), layout).items():
                if layout_name.endswith("-static") or suffix != ".input_scale":
                    tensors[prefix + suffix] = array
    save_file(tensors, str(out_dir / "model.safetensors"))
    return out_dir


@pytest.fixture(scope="module")
def checkpoint(hf_checkpoints, tmp_path_factory):
    root = tmp_path_factory.mktemp("quantized")

    def make(arch: str, layout_name: str) -> Path:
        out = root / f"{arch}-{layout_name}"
        return out if out.exists() else write_quantized_checkpoint(hf_checkpoints[arch], out,
                                                                   layout_name)
    return make


def linear_paths(cfg):
    return [path for path, spec in spec_leaves_with_paths(cfg)
            if spec.transpose and path[0] == "layers"]


@pytest.mark.parametrize("layout_name", list(LAYOUTS))
@pytest.mark.parametrize("arch", ["llama_gqa", "qwen2"])  # untied; tied with q/k/v biases
def test_loads_each_layout(checkpoint, layout_name, arch):
    path = checkpoint(arch, layout_name)
    cfg = ModelConfig.from_pretrained(path)
    params = load_quantized_hf_params(path, cfg)
    _, _, method = LAYOUTS[layout_name]
    stored = read_safetensors(path / "model.safetensors")
    block = {"ct-block": (32, 32), "fp8-block-128": (128, 128)}.get(layout_name)
    for p in linear_paths(cfg):
        qw = get_at_path(params, p)
        assert Q.is_quantized(qw) and qw.method == method
        Q.validate(qw)
        hf_name = [n for n, (q, _) in hf_name_table(cfg).items() if q == p][0]
        np.testing.assert_array_equal(np.asarray(qw.qweight).view(np.uint8),
                                      stored[hf_name].view(np.uint8))  # as stored, [out, in]
        deq = np.asarray(Q.dequantize(qw))
        if layout_name.endswith("tensor-static"):
            want = stored[hf_name].astype(np.float32) * stored[hf_name + "_scale"].reshape(())
            np.testing.assert_array_equal(deq, want.T)
            np.testing.assert_allclose(np.asarray(qw.input_scale), 0.02)
        else:  # quantize-on-load of the dequantized weight finds the same QuantizedWeight
            again = Q.quantize_weight(deq, method, block_shape=block)
            assert again.method == qw.method and again.block_shape == qw.block_shape
            np.testing.assert_array_equal(np.asarray(again.qweight).view(np.uint8),
                                          np.asarray(qw.qweight).view(np.uint8))
            np.testing.assert_allclose(np.asarray(again.scale), np.asarray(qw.scale), rtol=3e-7)
            assert qw.input_scale is None


def test_dense_tensors_match_the_unquantized_loader(checkpoint, hf_checkpoints):
    path = checkpoint("qwen3_head_dim", "ct-channel-dynamic")
    cfg = ModelConfig.from_pretrained(path)
    quantized = load_quantized_hf_params(path, cfg)
    dense = load_hf_params(hf_checkpoints["qwen3_head_dim"], cfg)
    q_leaves = jax.tree.leaves_with_path(quantized, is_leaf=Q.is_quantized)
    d_leaves = dict(jax.tree.leaves_with_path(dense))
    assert len(q_leaves) == len(d_leaves)
    for keys, leaf in q_leaves:
        if Q.is_quantized(leaf):  # close to the float weight it came from
            np.testing.assert_allclose(np.asarray(Q.dequantize(leaf)), np.asarray(d_leaves[keys]),
                                       atol=np.abs(np.asarray(d_leaves[keys])).max() / 16)
        else:
            np.testing.assert_array_equal(np.asarray(leaf), np.asarray(d_leaves[keys]))
    assert not Q.is_quantized(quantized["lm_head"])  # in the ignore list: stored unquantized


def test_method_override_runs_w8a8_checkpoints_weight_only(checkpoint):
    path = checkpoint("llama_gqa", "ct-tensor-static")
    cfg = ModelConfig.from_pretrained(path)
    params = load_quantized_hf_params(path, cfg, method="fp8_w8a16")
    wq = params["layers"][0]["wq"]
    assert wq.method == "fp8_w8a16" and wq.input_scale is None
    with pytest.raises(ValueError, match="fp8_block"):
        load_quantized_hf_params(checkpoint("llama_gqa", "ct-block"), cfg, method="fp8")


def _corrupt(src: Path, dst: Path, edit) -> Path:
    shutil.copytree(src, dst)
    tensors = {k: np.array(v) for k, v in read_safetensors(dst / "model.safetensors").items()}
    edit(tensors)
    save_file(tensors, str(dst / "model.safetensors"))
    return dst


PREFIX = "model.layers.0.self_attn.q_proj"


@pytest.mark.parametrize("layout_name, edit, error, message", [
    ("ct-channel-dynamic", lambda t: t.update({PREFIX + ".weight_scale": np.ones((3, 1), np.float32)}),
     CheckpointError, "per-tensor scale nor one per output channel"),
    ("fp8-block-128", lambda t: t.update({PREFIX + ".weight_scale_inv": np.ones((2, 2), np.float32)}),
     CheckpointError, "block scale of 'model.layers.0.self_attn.q_proj.weight' must be"),
    ("ct-channel-dynamic", lambda t: t.pop(PREFIX + ".weight_scale"), CheckpointError,
     "no weight_scale"),
    ("ct-channel-dynamic", lambda t: t.update({PREFIX + ".weight": t[PREFIX + ".weight"].astype(np.float32)}),
     CheckpointError, "not float8_e4m3fn"),
    ("ct-channel-dynamic", lambda t: t.update({PREFIX + ".weight_scale": -t[PREFIX + ".weight_scale"]}),
     CheckpointError, "finite and >= 0"),
    ("ct-tensor-static", lambda t: t.pop(PREFIX + ".input_scale"), CheckpointError,
     "no input_scale"),
    ("ct-channel-dynamic", lambda t: t.update({PREFIX + ".weight": t[PREFIX + ".weight"].astype(
        np.float32).astype(ml_dtypes.float8_e5m2)}), NotImplementedError, "only e4m3"),
    ("ct-channel-dynamic", lambda t: t.update({"model.layers.0.extra.weight_scale": np.ones(2)}),
     CheckpointError, "unexpected tensor"),
])
def test_refuses_inconsistent_checkpoints(checkpoint, tmp_path, layout_name, edit, error, message):
    path = _corrupt(checkpoint("llama_gqa", layout_name), tmp_path / "bad", edit)
    with pytest.raises(error, match=message):
        load_quantized_hf_params(path, ModelConfig.from_pretrained(path))


@pytest.mark.parametrize("qcfg, message", [
    ({"quant_method": "gptq", "bits": 4}, "quant_method 'gptq'"),
    (_group("channel", "dynamic") | {"config_groups": {"g": {"weights": {
        "num_bits": 4, "type": "int", "strategy": "group"}}}}, "num_bits=4"),
    ({"quant_method": "fp8", "activation_scheme": "dynamic", "weight_block_size": [128]},
     "two positive ints"),
    (_group("block", "static", [128, 128]), "static activation scales with block-wise"),
])
def test_refuses_unsupported_schemes(qcfg, message):
    with pytest.raises((NotImplementedError, CheckpointError), match=message):
        parse_quantization_config(qcfg)


def test_refuses_a_checkpoint_without_quantization_config(hf_checkpoints):
    path = hf_checkpoints["llama_gqa"]
    with pytest.raises(CheckpointError, match="no quantization_config"):
        load_quantized_hf_params(path, ModelConfig.from_pretrained(path))
