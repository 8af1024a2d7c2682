"""The oracle: random tiny checkpoints written by HF transformers itself, and greedy decoding in PyTorch.

Everything here runs transformers on the CPU in float32 with eager attention; jaxinfer is compared to it.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

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
}
# Built on demand by the tests that need them (not by the session fixture): a dense model with 8 query heads
# and 2 KV heads, for tensor parallelism over 8 devices.
EXTRA_ARCHS = {
    "llama_8heads": ("LlamaConfig", dict(TINY, num_attention_heads=8, num_key_value_heads=2)),
}


def build_checkpoint(name: str, out_dir: Path, seed: int = 0) -> Path:
    import torch
    import transformers

    cls_name, kwargs = ARCHS[name] if name in ARCHS else EXTRA_ARCHS[name]
    config = getattr(transformers, cls_name)(**kwargs)
    torch.manual_seed(seed)
    model = transformers.AutoModelForCausalLM.from_config(config, attn_implementation="eager")
    path = out_dir / name
    model.save_pretrained(path, safe_serialization=True)
    return path


def load_hf(path: Path):
    import transformers

    model = transformers.AutoModelForCausalLM.from_pretrained(
        path, local_files_only=True, attn_implementation="eager", dtype="float32"
    )
    return model.eval()


def hf_logits(model, ids: list[int]) -> np.ndarray:
    import torch

    with torch.no_grad():
        return model(torch.tensor([ids])).logits[0].float().numpy()


def hf_greedy(model, ids: list[int], num_tokens: int) -> tuple[list[int], list[float]]:
    """Greedy decoding by full forward passes (no HF cache): tokens and their logprobs."""
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
