"""The oracle: random tiny checkpoints written by HF transformers itself, and greedy decoding in PyTorch.

Everything here runs transformers on the CPU in float32 with eager attention; jaxinfer is compared to it.

Where it runs. When ``torch`` and ``transformers`` import in this interpreter (CI's Python 3.11 leg, with the
``oracle`` extra), everything runs in process. Where torch does not (CI's Python 3.12 leg: the only torch
wheel there is a multi-GB CUDA build, which the project does not install), set
``JAXINFER_TEST_ORACLE_PYTHON`` to an interpreter that has both (CI points it at the 3.11 leg's
``.venv/bin/python``): every function below is then executed by one persistent child process, this same
file run by that interpreter as ``python tests/hf_oracle.py --serve``. The child imports only the standard
library, numpy, torch and transformers (never jaxinfer or JAX). Checkpoints are still written by
transformers and HF outputs still computed by PyTorch, in that child, exactly as in process.

The protocol is one JSON object per line: the parent writes ``{"op": name, "args": {...}}`` to the child's
stdin, the child answers ``{"ok": true, "result": ...}`` or ``{"ok": false, "error": traceback}`` on the
protocol stream (its original stdout; the child's fd 1 is pointed at its stderr, so nothing transformers or
torch prints can corrupt the stream). numpy arrays travel as base64 of their raw bytes with dtype and shape
(bit-exact); a model loaded in the child stays there and the parent holds a ``RemoteModel`` handle to it.
The child's stderr goes to a temporary file whose tail is quoted if the child dies.

``available()`` / ``unavailable_reason()`` say whether an oracle can be had here (the fixtures in
``tests/conftest.py`` skip with that reason when not).
"""

from __future__ import annotations

import atexit
import base64
import dataclasses
import functools
import importlib.util
import json
import os
import subprocess
import sys
import tempfile
import threading
import traceback
from pathlib import Path
from typing import Any

import numpy as np

ORACLE_PYTHON_VAR = "JAXINFER_TEST_ORACLE_PYTHON"

# name -> (config class name, config kwargs). Larger initializer_range than HF's default keeps greedy
# choices away from near-ties, so token identity is a meaningful check.
TINY = dict(vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
            max_position_embeddings=512, initializer_range=0.08)
ARCHS = {
    "llama_gqa": ("LlamaConfig", dict(TINY, num_attention_heads=4, num_key_value_heads=2)),
    "llama_mqa_tied": ("LlamaConfig", dict(TINY, num_attention_heads=4, num_key_value_heads=1, tie_word_embeddings=True)),
    "llama3_rope": ("LlamaConfig", dict(TINY, num_attention_heads=4, num_key_value_heads=2, rope_theta=500000.0,
                                        rope_scaling={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                                                      "high_freq_factor": 4.0, "original_max_position_embeddings": 64})),
    "llama_linear_rope": ("LlamaConfig", dict(TINY, num_attention_heads=4, num_key_value_heads=4,
                                              rope_scaling={"rope_type": "linear", "factor": 2.0})),
    "mistral_window": ("MistralConfig", dict(TINY, num_attention_heads=4, num_key_value_heads=2, sliding_window=24)),
    "qwen2": ("Qwen2Config", dict(TINY, num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=True)),
    "qwen3_head_dim": ("Qwen3Config", dict(TINY, num_attention_heads=4, num_key_value_heads=2, head_dim=32,
                                           tie_word_embeddings=False)),
    # Mixture of experts. Mixtral: top-2 of 8, weights renormalised; 8 query heads for TP = 8.
    "mixtral": ("MixtralConfig", dict(TINY, num_attention_heads=8, num_key_value_heads=2, num_local_experts=8,
                                      num_experts_per_tok=2)),
    # Qwen2-MoE: q/k/v bias, a shared expert behind a sigmoid gate, top-k weights not renormalised.
    "qwen2_moe": ("Qwen2MoeConfig", dict(TINY, num_attention_heads=4, num_key_value_heads=2, num_experts=8,
                                         num_experts_per_tok=2, moe_intermediate_size=32,
                                         shared_expert_intermediate_size=96, norm_topk_prob=False)),
    # Qwen3-MoE: q/k norm, top-4 of 16 renormalised, MQA with 8 query heads (KV head replicated at TP > 1).
    "qwen3_moe": ("Qwen3MoeConfig", dict(TINY, num_attention_heads=8, num_key_value_heads=1, head_dim=16,
                                         num_experts=16, num_experts_per_tok=4, moe_intermediate_size=32,
                                         norm_topk_prob=True)),
    # Gemma 2: (1 + w) norms (perturbed: HF initialises them to 0), sqrt(hidden) embedding scale, GeGLU, sandwich
    # norms, query_pre_attn_scalar != head_dim, attention and final soft-capping small enough to bite, a
    # sliding layer (window 12) then a global one; tied; an odd vocabulary.
    "gemma2": ("Gemma2Config", dict(TINY, vocab_size=301, num_attention_heads=4, num_key_value_heads=2, head_dim=32,
                                    query_pre_attn_scalar=24, sliding_window=12, attn_logit_softcapping=2.0,
                                    final_logit_softcapping=3.0, _perturb_norms=0.3)),
    # Gemma 3: q/k norms, local RoPE base 10k on the sliding layer, 1M (linear-scaled x4) on the global one; MQA;
    # untied head.
    "gemma3": ("Gemma3TextConfig", dict(TINY, num_attention_heads=4, num_key_value_heads=1, head_dim=32,
                                        query_pre_attn_scalar=32, sliding_window=10, tie_word_embeddings=False,
                                        layer_types=["sliding_attention", "full_attention"],
                                        rope_parameters={"full_attention": {"rope_type": "linear", "factor": 4.0,
                                                                            "rope_theta": 1e6},
                                                         "sliding_attention": {"rope_type": "default",
                                                                               "rope_theta": 10000.0}},
                                        _perturb_norms=0.3)),
    # Phi-3: fused qkv_proj and gate_up_proj (split at load), longrope (short factors and the attention factor of a
    # 2x extension), a sliding window of 20; odd vocabulary.
    "phi3": ("Phi3Config", dict(TINY, vocab_size=263, num_attention_heads=4, num_key_value_heads=2, sliding_window=20,
                                pad_token_id=0, bos_token_id=1, eos_token_id=2, original_max_position_embeddings=256,
                                rope_parameters={"rope_type": "longrope", "rope_theta": 10000.0,
                                                 "short_factor": [1.0, 1.2, 1.5, 2.0, 3.0, 4.0, 6.0, 8.0],
                                                 "long_factor": [1.0, 2.0, 4.0, 8.0, 16.0, 24.0, 32.0, 48.0]})),
    # GPT-OSS: attention sinks (perturbed to bite: HF initialises them small), q/k/v/o biases, a sliding layer
    # (window 8) then a full one, YaRN (x8 over 64 positions, untruncated), top-2 of 4 experts by a biased
    # router with the softmax over the chosen two, expert biases (HF initialises them to 0: perturbed) and the
    # clamped SwiGLU with a limit low enough to clamp; odd vocabulary.
    "gpt_oss": ("GptOssConfig", dict(TINY, vocab_size=257, intermediate_size=32, num_attention_heads=4,
                                     num_key_value_heads=2, head_dim=16, num_local_experts=4, num_experts_per_tok=2,
                                     sliding_window=8, swiglu_limit=0.6,
                                     rope_parameters={"rope_type": "yarn", "factor": 8.0, "beta_fast": 32.0,
                                                      "beta_slow": 1.0, "truncate": False, "rope_theta": 150000.0,
                                                      "original_max_position_embeddings": 64},
                                     _perturb={"bias": 0.2, "sinks": 1.0})),
}
# Built on demand by the tests that need them (not by the session fixture): a dense model with 8 query heads
# and 2 KV heads, for tensor parallelism over 8 devices.
EXTRA_ARCHS = {
    "llama_8heads": ("LlamaConfig", dict(TINY, num_attention_heads=8, num_key_value_heads=2)),
    # vocabularies that tensor parallelism must pad to split (odd, prime, Llama-2 + one added token)
    "llama_vocab333": ("LlamaConfig", dict(TINY, vocab_size=333, num_attention_heads=4, num_key_value_heads=2)),
    "qwen2_vocab389_tied": ("Qwen2Config", dict(TINY, vocab_size=389, num_attention_heads=4, num_key_value_heads=2,
                                                tie_word_embeddings=True)),
    "llama_vocab32001_mqa": ("LlamaConfig", dict(TINY, vocab_size=32001, num_attention_heads=4,
                                                 num_key_value_heads=1)),
    "mixtral_vocab333": ("MixtralConfig", dict(TINY, vocab_size=333, num_attention_heads=8, num_key_value_heads=2,
                                               num_local_experts=4, num_experts_per_tok=2)),
}

# DeepSeek (multi-head latent attention; built by tests/test_deepseek.py only). Awkward on purpose: odd
# vocabularies, a dense first layer (first_k_dense_replace=1), q_lora_rank None and set, v_head_dim != the nope
# dims, group-limited routing with fewer groups than experts chosen (V2: top-3 from 1 of 2 groups; with
# topk_group >= top-k the limit never binds), YaRN with mscale_all_dim (V2), V3's correction bias perturbed so that
# it changes choices (HF initialises it to 0), and a V3 with the half-split (not interleaved) RoPE.
_MLA = dict(TINY, num_attention_heads=4, num_key_value_heads=4, kv_lora_rank=32, qk_nope_head_dim=16,
            qk_rope_head_dim=8, moe_intermediate_size=32, n_routed_experts=8, num_experts_per_tok=2, n_group=4,
            topk_group=2, first_k_dense_replace=1)
DEEPSEEK_ARCHS = {
    "deepseek_v2": ("DeepseekV2Config", dict(_MLA, vocab_size=301, q_lora_rank=None, v_head_dim=12, n_shared_experts=2,
                                             topk_method="group_limited_greedy", n_group=2, topk_group=1,
                                             num_experts_per_tok=3, routed_scaling_factor=1.5,
                                             rope_parameters={"rope_type": "yarn", "rope_theta": 10000.0,
                                                              "factor": 4.0, "original_max_position_embeddings": 128,
                                                              "mscale": 1.0, "mscale_all_dim": 0.8})),
    "deepseek_v3": ("DeepseekV3Config", dict(_MLA, vocab_size=263, q_lora_rank=24, v_head_dim=16, n_shared_experts=1,
                                             routed_scaling_factor=2.5, norm_topk_prob=True, rope_interleave=True,
                                             _perturb={"e_score_correction_bias": 0.3})),
    "deepseek_v3_halfsplit": ("DeepseekV3Config", dict(_MLA, q_lora_rank=None, v_head_dim=16, n_shared_experts=1,
                                                       first_k_dense_replace=0, rope_interleave=False,
                                                       norm_topk_prob=False, _perturb={"e_score_correction_bias": 0.3})),
}


# ================================================================== the public functions (in process or not)


@dataclasses.dataclass(frozen=True)
class RemoteModel:
    """A model loaded in the oracle process (``load_hf`` in remote mode): pass it back to ``hf_logits`` etc."""

    handle: int
    path: str
    python: str  # the interpreter whose oracle process holds it


def build_checkpoint(name: str, out_dir: Path, seed: int = 0) -> Path:
    """Write the random checkpoint ``name`` of ``ARCHS`` / ``EXTRA_ARCHS`` / ``DEEPSEEK_ARCHS`` to ``out_dir / name``."""
    return Path(_dispatch("build_checkpoint", name=name, out_dir=str(out_dir), seed=seed))


def write_random_checkpoint(config_class: str, config_kwargs: dict, path: Path, *, seed: int | None = 0,
                            dtype: str | None = None, max_shard_size: str | None = None,
                            attn_implementation: str | None = None, return_state: bool = False):
    """``transformers.<config_class>(**config_kwargs)`` with random weights (``torch.manual_seed(seed)``;
    None: unseeded), cast to ``dtype`` ("bfloat16"...) if given, saved to ``path`` with ``save_pretrained``.
    Returns ``path``, or ``(path, state)`` with ``return_state``: the state dict as float32 numpy arrays."""
    out = _dispatch("write_random_checkpoint", config_class=config_class, config_kwargs=config_kwargs,
                    path=str(path), seed=seed, dtype=dtype, max_shard_size=max_shard_size,
                    attn_implementation=attn_implementation, return_state=return_state)
    return (Path(out[0]), out[1]) if return_state else Path(out)


def count_parameters(model_type: str, config_kwargs: dict) -> int:
    """Parameters of ``AutoModelForCausalLM.from_config(AutoConfig.for_model(model_type, **config_kwargs))``,
    built on torch's meta device (no memory for the weights)."""
    return int(_dispatch("count_parameters", model_type=model_type, config_kwargs=config_kwargs))


def rope_init(model_type: str, config_kwargs: dict) -> tuple[list[float], float]:
    """HF's RoPE inverse frequencies and attention factor (``ROPE_INIT_FUNCTIONS[rope_type]``) for a config."""
    inv, factor = _dispatch("rope_init", model_type=model_type, config_kwargs=config_kwargs)
    return list(inv), float(factor)


def load_hf(path: Path):
    """The model at ``path`` in eval mode (float32, eager attention): a torch module in process, a
    ``RemoteModel`` in remote mode."""
    return _dispatch("load_hf", path=str(path))


def num_parameters(model) -> int:
    return int(_dispatch("num_parameters", model=model))


def hf_logits(model, ids: list[int]) -> np.ndarray:
    """Logits [len(ids), vocab] (float32) of one forward pass over ``ids``."""
    return _dispatch("hf_logits", model=model, ids=[int(i) for i in ids])


def hf_log_softmax(model, ids: list[int]) -> np.ndarray:
    """Per-position ``log_softmax`` [len(ids), vocab] (float64, from float32 logits) of one forward pass over
    ``ids``: row i is the distribution of the token after ``ids[i]`` (prompt logprobs read row i - 1)."""
    return _dispatch("hf_log_softmax", model=model, ids=[int(i) for i in ids])


def hf_greedy(model, ids: list[int], num_tokens: int) -> tuple[list[int], list[float]]:
    """Greedy decoding by full forward passes (no HF cache): tokens and their logprobs."""
    tokens, lps = _dispatch("hf_greedy", model=model, ids=[int(i) for i in ids], num_tokens=int(num_tokens))
    return list(tokens), list(lps)


def versions() -> dict[str, str]:
    """Python, torch and transformers versions of whichever interpreter runs the oracle."""
    return _dispatch("versions")


# ================================================================== where the oracle runs


@functools.cache
def torch_in_process() -> bool:
    """torch and transformers can be imported by this interpreter."""
    return all(importlib.util.find_spec(m) is not None for m in ("torch", "transformers"))


def oracle_python() -> Path | None:
    """``$JAXINFER_TEST_ORACLE_PYTHON`` (read through jaxinfer.envs, where it is declared), or None."""
    from jaxinfer import envs

    return envs.get(ORACLE_PYTHON_VAR)


def mode() -> str | None:
    """``"local"`` (torch here), ``"remote"`` (the child process of ``$JAXINFER_TEST_ORACLE_PYTHON``), or
    None (no oracle: see ``unavailable_reason``)."""
    if torch_in_process():
        return "local"
    return "remote" if oracle_python() is not None else None


def available() -> bool:
    return mode() is not None


def unavailable_reason() -> str:
    return (f"HF oracle unavailable: torch/transformers are not importable by this Python "
            f"({sys.version.split()[0]}) and {ORACLE_PYTHON_VAR} is not set (point it at a Python with "
            "torch==2.13.0 and transformers, e.g. the 3.11 leg's .venv/bin/python: see README, Tests)")


def skip_unless_available() -> None:
    """pytest.skip (with ``unavailable_reason``) where no oracle can be had."""
    if not available():
        import pytest

        pytest.skip(unavailable_reason())


def _dispatch(op: str, **args):
    model = args.get("model")
    if isinstance(model, RemoteModel):  # it lives in the oracle process that loaded it
        return remote_client(model.python).call(op, **args)
    where = mode()
    if where == "local":
        return _OPS[op](**args)
    if where == "remote":
        return remote_client(oracle_python()).call(op, **args)
    raise RuntimeError(unavailable_reason())


# ================================================================== the client side of remote mode


class OracleError(RuntimeError):
    pass


_CLIENTS: dict[str, "OracleClient"] = {}
_CLIENTS_LOCK = threading.Lock()


def remote_client(python: str | os.PathLike) -> "OracleClient":
    """The persistent oracle process of interpreter ``python`` (started on first use, closed at exit)."""
    key = str(python)
    with _CLIENTS_LOCK:
        client = _CLIENTS.get(key)
        if client is None or not client.alive():
            client = _CLIENTS[key] = OracleClient(key)
        return client


class OracleClient:
    """One child process running ``_serve`` under interpreter ``python``; calls are serialised."""

    def __init__(self, python: str):
        if not Path(python).exists():
            raise OracleError(f"{ORACLE_PYTHON_VAR}={python}: no such interpreter")
        self.python = python
        self._lock = threading.Lock()
        self._stderr = tempfile.TemporaryFile()
        env = dict(os.environ)
        env.pop("PYTHONPATH", None)  # this interpreter's paths, not the oracle's
        env["PYTHONUNBUFFERED"] = "1"
        self._proc = subprocess.Popen([python, str(Path(__file__).resolve()), "--serve"], stdin=subprocess.PIPE,
                                      stdout=subprocess.PIPE, stderr=self._stderr, text=True, env=env,
                                      cwd=tempfile.gettempdir())
        atexit.register(self.close)

    def alive(self) -> bool:
        return self._proc.poll() is None

    def _stderr_tail(self, n: int = 4000) -> str:
        self._stderr.seek(0)
        return self._stderr.read().decode(errors="replace")[-n:]

    def call(self, op: str, **args):
        if isinstance(args.get("model"), RemoteModel):
            if args["model"].python != self.python:
                raise OracleError(f"{args['model']} lives in another oracle process than {self.python}'s")
            args["model"] = args["model"].handle
        with self._lock:
            try:
                self._proc.stdin.write(json.dumps({"op": op, "args": _encode(args)}) + "\n")
                self._proc.stdin.flush()
                line = self._proc.stdout.readline()
            except (BrokenPipeError, OSError):
                line = ""
            if not line:
                code = self._proc.wait(timeout=30)
                raise OracleError(f"the oracle process ({self.python}) exited with code {code} during {op!r}; "
                                  f"its stderr ends with:\n{self._stderr_tail()}")
        reply = json.loads(line)
        if not reply["ok"]:
            raise OracleError(f"{op} failed in the oracle process ({self.python}):\n{reply['error']}")
        result = _decode(reply["result"])
        if op == "load_hf":
            result = RemoteModel(int(result), args["path"], self.python)
        return result

    def close(self):
        if self._proc.poll() is None:
            try:
                self._proc.stdin.close()
                self._proc.wait(timeout=30)
            except Exception:
                self._proc.kill()
                self._proc.wait()
        self._stderr.close()


def _encode(obj):
    if isinstance(obj, np.ndarray):
        return {"__ndarray__": base64.b64encode(np.ascontiguousarray(obj).tobytes()).decode("ascii"),
                "dtype": obj.dtype.str, "shape": list(obj.shape)}
    if isinstance(obj, dict):
        return {str(k): _encode(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_encode(v) for v in obj]
    if isinstance(obj, Path):
        return str(obj)
    if isinstance(obj, np.generic):
        return obj.item()
    return obj


def _decode(obj):
    if isinstance(obj, dict):
        if "__ndarray__" in obj:
            data = base64.b64decode(obj["__ndarray__"])
            return np.frombuffer(data, dtype=np.dtype(obj["dtype"])).reshape(obj["shape"]).copy()
        return {k: _decode(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return [_decode(v) for v in obj]
    return obj


# ================================================================== the implementations (need torch)


def _write_random_checkpoint(config_class, config_kwargs, path, seed=0, dtype=None, max_shard_size=None,
                             attn_implementation=None, return_state=False):
    import torch
    import transformers

    config_kwargs = dict(config_kwargs)
    perturb_norms = config_kwargs.pop("_perturb_norms", 0.0)  # std of noise added to every norm's weight
    perturb = config_kwargs.pop("_perturb", {})  # name suffix -> std of noise added to those params / buffers
    config = getattr(transformers, config_class)(**config_kwargs)
    if seed is not None:
        torch.manual_seed(seed)
    kwargs = {} if attn_implementation is None else {"attn_implementation": attn_implementation}
    model = transformers.AutoModelForCausalLM.from_config(config, **kwargs)
    if perturb_norms:
        with torch.no_grad():
            for name, p in model.named_parameters():
                if name.endswith("norm.weight"):
                    p.add_(torch.randn_like(p) * perturb_norms)
    if perturb:
        with torch.no_grad():
            for name, t in model.state_dict(keep_vars=True).items():
                std = next((v for k, v in perturb.items() if name.endswith(k)), 0.0)
                if std:
                    t.add_(torch.randn_like(t) * std)
    if dtype is not None:
        model = model.to(getattr(torch, dtype))
    save_kwargs = {"safe_serialization": True}
    if max_shard_size is not None:
        save_kwargs["max_shard_size"] = max_shard_size
    model.save_pretrained(path, **save_kwargs)
    if not return_state:
        return str(path)
    return str(path), {k: v.detach().float().numpy() for k, v in model.state_dict().items()}


def _build_checkpoint(name, out_dir, seed=0):
    cls_name, kwargs = {**ARCHS, **EXTRA_ARCHS, **DEEPSEEK_ARCHS}[name]
    return _write_random_checkpoint(cls_name, kwargs, Path(out_dir) / name, seed=seed,
                                    attn_implementation="eager")


def _count_parameters(model_type, config_kwargs):
    import torch
    import transformers

    config = transformers.AutoConfig.for_model(model_type, **config_kwargs)
    with torch.device("meta"):
        model = transformers.AutoModelForCausalLM.from_config(config)
    return sum(p.numel() for p in model.parameters())


def _rope_init(model_type, config_kwargs):
    import transformers
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    config = transformers.AutoConfig.for_model(model_type, **config_kwargs)
    inv, factor = ROPE_INIT_FUNCTIONS[config.rope_parameters["rope_type"]](config)
    return [float(x) for x in inv], float(factor)


def _load_hf(path):
    import transformers

    model = transformers.AutoModelForCausalLM.from_pretrained(
        path, local_files_only=True, attn_implementation="eager", dtype="float32"
    )
    return model.eval()


def _num_parameters(model):
    return sum(p.numel() for p in model.parameters())


def _hf_logits(model, ids):
    import torch

    with torch.no_grad():
        return model(torch.tensor([ids])).logits[0].float().numpy()


def _hf_log_softmax(model, ids):
    import torch

    with torch.no_grad():
        return torch.log_softmax(model(torch.tensor([ids])).logits[0].double(), -1).numpy()


def _hf_greedy(model, ids, num_tokens):
    import torch

    ids = list(ids)
    out, lps = [], []
    for _ in range(num_tokens):
        with torch.no_grad():
            logits = model(torch.tensor([ids])).logits[0, -1].double()
        logp = torch.log_softmax(logits, -1)
        tok = int(torch.argmax(logits))
        out.append(tok)
        lps.append(float(logp[tok]))
        ids.append(tok)
    return out, lps


def _versions():
    import torch
    import transformers

    return {"python": sys.version.split()[0], "torch": torch.__version__, "transformers": transformers.__version__}


_OPS = {"build_checkpoint": _build_checkpoint, "write_random_checkpoint": _write_random_checkpoint,
        "count_parameters": _count_parameters, "rope_init": _rope_init, "load_hf": _load_hf, "num_parameters": _num_parameters,
        "hf_logits": _hf_logits, "hf_log_softmax": _hf_log_softmax, "hf_greedy": _hf_greedy, "versions": _versions}


# ================================================================== the server side of remote mode


def _serve() -> None:
    """Answer requests from stdin until it closes (see the module docstring for the protocol)."""
    protocol = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)  # anything printed to stdout from here on goes to stderr, not into the protocol
    sys.stdout = sys.stderr
    models: dict[int, Any] = {}
    for line in sys.stdin:
        try:
            request = json.loads(line)
            op, args = request["op"], _decode(request["args"])
            if "model" in args:
                args["model"] = models[args["model"]]
            result = _OPS[op](**args)
            if op == "load_hf":
                models[len(models)] = result
                result = len(models) - 1
            reply = {"ok": True, "result": _encode(result)}
        except Exception:
            reply = {"ok": False, "error": traceback.format_exc()}
        protocol.write(json.dumps(reply) + "\n")
        protocol.flush()


if __name__ == "__main__":
    if sys.argv[1:] != ["--serve"]:
        sys.exit("usage: python tests/hf_oracle.py --serve  (the oracle process; see the module docstring)")
    _serve()
