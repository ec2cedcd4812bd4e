"""The modern recipe in HF transformers' formats: Llama, Qwen3, or our own modeling code.

Each model goes to the one format that expresses it exactly (the export's logits equal ours):

    format     when                                                     loads with
    gpt2       GPT-2's architecture (GPTConfig.gpt2_incompatibilities   GPT2LMHeadModel (model/hf.py)
               is empty; bias=False and an untied head included)
    llama      rope + rmsnorm + swiglu, no QK-norm, no soft-cap         LlamaForCausalLM
    qwen3      the same with QK-norm, and bias=False (Qwen3's MLP has   Qwen3ForCausalLM
               no biases)
    smallgpt   anything else (ReLU², a soft-cap, LayerNorm with rope    AutoModelForCausalLM with
               or QK-norm, ...): checkpoint/remote_code/modeling_smallgpt.py is     trust_remote_code=True
               copied into the directory

Llama's and Qwen3's blocks are ours with other names: q_proj, k_proj and v_proj are the three row
blocks of c_attn (heads in the same order, and the same rotate-half rotary layout), gate_proj and
up_proj the two halves of a SwiGLU c_fc, and every norm shares layer_norm_eps (rms_norm_eps), the
QK-norm's too. Qwen3's q_norm and k_norm have gains, which are ones here.
"""
from __future__ import annotations

import torch

from .gpt import GPT, GPTConfig, mlp_hidden
from .hf import cropped_state

FORMATS = ("gpt2", "llama", "qwen3", "smallgpt")


def hf_format(config: GPTConfig) -> str:
    """The HF format that expresses this model exactly (see the module docstring)."""
    if not config.gpt2_incompatibilities():
        return "gpt2"
    llama_like = (config.pos_embedding == "rope" and config.norm == "rmsnorm" and config.mlp_act == "swiglu"
                  and not config.logit_softcap)
    if llama_like and not config.qk_norm:
        return "llama"
    if llama_like and not config.bias:
        return "qwen3"
    return "smallgpt"


def _common(cfg: GPTConfig, vocab_size: int, eos_token_id: int | None) -> dict:
    return {
        "vocab_size": vocab_size,
        "hidden_size": cfg.n_embd,
        "intermediate_size": mlp_hidden(cfg),
        "num_hidden_layers": cfg.n_layer,
        "num_attention_heads": cfg.n_head,
        "num_key_value_heads": cfg.n_head,
        "head_dim": cfg.n_embd // cfg.n_head,
        "hidden_act": "silu",
        "max_position_embeddings": cfg.block_size,
        "rms_norm_eps": cfg.layer_norm_eps,
        "rope_parameters": {"rope_type": "default", "rope_theta": cfg.rope_base},
        "rope_theta": cfg.rope_base,  # where transformers 4 reads it
        "tie_word_embeddings": cfg.tie_embeddings,
        "attention_bias": cfg.bias,
        "attention_dropout": 0.0,
        "initializer_range": 0.02,
        "bos_token_id": eos_token_id,
        "eos_token_id": eos_token_id,
        "use_cache": True,
        "dtype": "float32",  # transformers 5 reads dtype,
        "torch_dtype": "float32",  # transformers 4 torch_dtype
    }


def llama_config(cfg: GPTConfig, vocab_size: int, eos_token_id: int | None) -> dict:
    return {"architectures": ["LlamaForCausalLM"], "model_type": "llama", **_common(cfg, vocab_size, eos_token_id),
            "mlp_bias": cfg.bias, "pretraining_tp": 1}


def qwen3_config(cfg: GPTConfig, vocab_size: int, eos_token_id: int | None) -> dict:
    return {"architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3", **_common(cfg, vocab_size, eos_token_id),
            "use_sliding_window": False, "sliding_window": None, "max_window_layers": cfg.n_layer,
            "layer_types": ["full_attention"] * cfg.n_layer}


def llama_tensors(model: GPT, vocab_size: int) -> dict[str, torch.Tensor]:
    """Our tensors under Llama's (and Qwen3's) names; QK-norm gains (ones) for Qwen3."""
    cfg = model.config
    C, hidden = cfg.n_embd, mlp_hidden(cfg)
    ours = cropped_state(model, vocab_size)
    out = {"model.embed_tokens.weight": ours["transformer.wte.weight"], "model.norm.weight": ours["transformer.ln_f.weight"]}
    if not cfg.tie_embeddings:
        out["lm_head.weight"] = ours["lm_head.weight"]
    for i in range(cfg.n_layer):
        src, dst = f"transformer.h.{i}.", f"model.layers.{i}."
        out[dst + "input_layernorm.weight"] = ours[src + "ln_1.weight"]
        out[dst + "post_attention_layernorm.weight"] = ours[src + "ln_2.weight"]
        for kind in ("weight", "bias") if cfg.bias else ("weight",):
            q, k, v = ours[f"{src}attn.c_attn.{kind}"].split(C, dim=0)  # rows: q | k | v
            out[f"{dst}self_attn.q_proj.{kind}"] = q.contiguous()
            out[f"{dst}self_attn.k_proj.{kind}"] = k.contiguous()
            out[f"{dst}self_attn.v_proj.{kind}"] = v.contiguous()
            out[f"{dst}self_attn.o_proj.{kind}"] = ours[f"{src}attn.c_proj.{kind}"]
            gate, up = ours[f"{src}mlp.c_fc.{kind}"].split(hidden, dim=0)  # rows: gate | up
            out[f"{dst}mlp.gate_proj.{kind}"] = gate.contiguous()
            out[f"{dst}mlp.up_proj.{kind}"] = up.contiguous()
            out[f"{dst}mlp.down_proj.{kind}"] = ours[f"{src}mlp.c_proj.{kind}"]
        if cfg.qk_norm:
            head_dim = C // cfg.n_head
            out[dst + "self_attn.q_norm.weight"] = torch.ones(head_dim)
            out[dst + "self_attn.k_norm.weight"] = torch.ones(head_dim)
    return out


def smallgpt_config(cfg: GPTConfig, vocab_size: int, eos_token_id: int | None) -> dict:
    """config.json for remote_code/modeling_smallgpt.py: our fields, with HF's names where HF has one."""
    return {
        "architectures": ["SmallGPTForCausalLM"],
        "model_type": "smallgpt",
        "auto_map": {"AutoConfig": "modeling_smallgpt.SmallGPTConfig",
                     "AutoModelForCausalLM": "modeling_smallgpt.SmallGPTForCausalLM"},
        "vocab_size": vocab_size,
        "n_positions": cfg.block_size,
        "n_layer": cfg.n_layer,
        "n_head": cfg.n_head,
        "n_embd": cfg.n_embd,
        "mlp_hidden": mlp_hidden(cfg),
        "bias": cfg.bias,
        "layer_norm_eps": cfg.layer_norm_eps,
        "norm": cfg.norm,
        "pos_embedding": cfg.pos_embedding,
        "rope_base": cfg.rope_base,
        "qk_norm": cfg.qk_norm,
        "mlp_act": cfg.mlp_act,
        "gelu_approximate": cfg.gelu_approximate,
        "logit_softcap": cfg.logit_softcap,
        "tie_word_embeddings": cfg.tie_embeddings,
        "bos_token_id": eos_token_id,
        "eos_token_id": eos_token_id,
        "use_cache": True,
        "dtype": "float32",
        "torch_dtype": "float32",
    }
