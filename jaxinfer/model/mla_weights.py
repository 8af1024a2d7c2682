"""The parameters of one DeepSeek-V2 / V3 layer (multi-head latent attention, dense or MoE MLP).

``mla_layer_specs(cfg, i)`` is what ``jaxinfer.model.weights.param_specs`` puts at ``layers[i]`` for a DeepSeek
config (the declaration format and everything derived from it are ``jaxinfer.model.weights``')::

    path                  shape                  logical axes        HF tensor under model.layers.{i} (transposed)
    attn_norm             [H]                    (embed,)            input_layernorm.weight
    wq                    [H, Hq*(dn+dr)]        (embed, q_heads)    self_attn.q_proj.weight (T)     -- q_lora_rank None
    wq_a                  [H, Rq]                (embed, None)       self_attn.q_a_proj.weight (T)   -- q_lora_rank set
    q_a_norm              [Rq]                   (None,)             self_attn.q_a_layernorm.weight  -- q_lora_rank set
    wq_b                  [Rq, Hq*(dn+dr)]       (None, q_heads)     self_attn.q_b_proj.weight (T)   -- q_lora_rank set
    wkv_a                 [H, R+dr]              (embed, None)       self_attn.kv_a_proj_with_mqa.weight (T)
    kv_a_norm             [R]                    (None,)             self_attn.kv_a_layernorm.weight
    wkv_b                 [R, Hq*(dn+dv)]        (None, q_heads)     self_attn.kv_b_proj.weight (T)
    wo                    [Hq*dv, H]             (q_heads, embed)    self_attn.o_proj.weight (T)
    mlp_norm              [H]                    (embed,)            post_attention_layernorm.weight

then a dense layer's ``w_gate`` / ``w_up`` / ``w_down`` (``mlp.gate_proj`` ...), or an MoE layer's ``router`` [H, E]
(``mlp.gate.weight``), ``router_bias`` [E] (V3: ``mlp.gate.e_score_correction_bias``, used for the choice only),
the stacked ``expert_w_*`` (``mlp.experts.{e}.gate_proj`` ...) and the shared experts ``shared_w_*`` [H, Fs]
(``mlp.shared_experts.gate_proj`` ..., Fs = n_shared_experts * moe_intermediate_size, no gate).

Hq query heads, R kv_lora_rank, Rq q_lora_rank, dn / dr / dv qk_nope / qk_rope / v head dims. Every ``q_heads``
axis is a flattened heads x per-head axis, so a tensor-parallel split of it is a split of whole heads; the
latent projections (``wkv_a``, ``kv_a_norm``, ``wq_a``) are replicated: every device computes the latent row.
"""

from __future__ import annotations

from jaxinfer.config.model import ModelConfig


def mla_layer_specs(cfg: ModelConfig, i: int, _linear, _vector, _experts) -> dict:
    """Layer ``i``'s ``{name: ParamSpec}``, built with ``weights``' constructors (``weights`` imports this module and
    hands them in): ``_linear(hf_name, n_in, n_out, axes)``, ``_vector(hf_name, n, axis, init)``,
    ``_experts(hf_name, n, n_in, n_out, axes)``."""
    h, heads, norm = cfg.hidden_size, cfg.num_heads, "ones"
    qk = cfg.qk_nope_head_dim + cfg.qk_rope_head_dim
    pre, attn = f"model.layers.{i}", f"model.layers.{i}.self_attn"
    specs = {"attn_norm": _vector(f"{pre}.input_layernorm.weight", h, "embed", norm)}
    if cfg.q_lora_rank is None:
        specs["wq"] = _linear(f"{attn}.q_proj.weight", h, heads * qk, ("embed", "q_heads"))
    else:
        rq = cfg.q_lora_rank
        specs["wq_a"] = _linear(f"{attn}.q_a_proj.weight", h, rq, ("embed", None))
        specs["q_a_norm"] = _vector(f"{attn}.q_a_layernorm.weight", rq, None, norm)
        specs["wq_b"] = _linear(f"{attn}.q_b_proj.weight", rq, heads * qk, (None, "q_heads"))
    r = cfg.kv_lora_rank
    specs["wkv_a"] = _linear(f"{attn}.kv_a_proj_with_mqa.weight", h, r + cfg.qk_rope_head_dim, ("embed", None))
    specs["kv_a_norm"] = _vector(f"{attn}.kv_a_layernorm.weight", r, None, norm)
    specs["wkv_b"] = _linear(f"{attn}.kv_b_proj.weight", r, heads * (cfg.qk_nope_head_dim + cfg.v_head_dim),
                             (None, "q_heads"))
    specs["wo"] = _linear(f"{attn}.o_proj.weight", heads * cfg.v_head_dim, h, ("q_heads", "embed"))
    specs["mlp_norm"] = _vector(f"{pre}.post_attention_layernorm.weight", h, "embed", norm)
    mlp = f"{pre}.mlp"
    if not cfg.layer_is_moe(i):
        f = cfg.intermediate_size
        specs["w_gate"] = _linear(f"{mlp}.gate_proj.weight", h, f, ("embed", "mlp"))
        specs["w_up"] = _linear(f"{mlp}.up_proj.weight", h, f, ("embed", "mlp"))
        specs["w_down"] = _linear(f"{mlp}.down_proj.weight", f, h, ("mlp", "embed"))
        return specs
    e, fe = cfg.num_experts, cfg.moe_intermediate_size
    specs["router"] = _linear(f"{mlp}.gate.weight", h, e, ("embed", None))
    if cfg.topk_method == "noaux_tc":
        specs["router_bias"] = _vector(f"{mlp}.gate.e_score_correction_bias", e, None, "zeros")
    gate, up, down = (f"{mlp}.experts.{{expert}}.{n}.weight" for n in ("gate_proj", "up_proj", "down_proj"))
    specs["expert_w_gate"] = _experts(gate, e, h, fe, ("embed", "expert_mlp"))
    specs["expert_w_up"] = _experts(up, e, h, fe, ("embed", "expert_mlp"))
    specs["expert_w_down"] = _experts(down, e, fe, h, ("expert_mlp", "embed"))
    if cfg.num_shared_experts:
        fs = cfg.num_shared_experts * fe
        specs["shared_w_gate"] = _linear(f"{mlp}.shared_experts.gate_proj.weight", h, fs, ("embed", "mlp"))
        specs["shared_w_up"] = _linear(f"{mlp}.shared_experts.up_proj.weight", h, fs, ("embed", "mlp"))
        specs["shared_w_down"] = _linear(f"{mlp}.shared_experts.down_proj.weight", fs, h, ("mlp", "embed"))
    return specs
