"""The mapping between our GPT and HF transformers' GPT-2 format: config.json's fields and the tensors.

Our parameter names are GPT-2's, so the only change is that HF's Conv1D stores its weight as
(in, out) where nn.Linear stores (out, in): those four matrices per block are transposed.

    state = state_from_hf(hf_state_dict, tie_embeddings=True)  # HF GPT-2 -> our names and layouts
    tensors = gpt2_tensors(model)                      # ours -> HF GPT-2's model.safetensors

The files themselves are read and written by checkpoint/hf.py; the whole export (tokenizer, generation
config, model card; Llama, Qwen3 or our own modeling code for what GPT-2 can't express, model/hf_modern.py)
is `python -m checkpoint.export --checkpoint out/small --out gpt2-small-hf`.
"""
from __future__ import annotations

import torch

from .gpt import GPT, GPTConfig

# the Conv1D weights of HF's GPT-2; every other tensor has the same layout in both
CONV1D_SUFFIXES = ("attn.c_attn.weight", "attn.c_proj.weight", "mlp.c_fc.weight", "mlp.c_proj.weight")
HF_ACTIVATIONS = {"gelu_new": "tanh", "gelu_pytorch_tanh": "tanh", "gelu": "none"}


def config_from_hf(hf: dict, **overrides) -> GPTConfig:
    """Our config from HF GPT-2's config.json (a dict). checkpoint/hf.py refuses first what this GPT cannot
    express (hf_config_problem) and checks the result (checkpoint/model_config.py)."""
    fields = dict(
        block_size=hf["n_positions"],
        vocab_size=hf["vocab_size"],
        n_layer=hf["n_layer"],
        n_head=hf["n_head"],
        n_embd=hf["n_embd"],
        bias=True,
        gelu_approximate=HF_ACTIVATIONS[hf.get("activation_function", "gelu_new")],
        layer_norm_eps=hf.get("layer_norm_epsilon", 1e-5),
        tie_embeddings=bool(hf.get("tie_word_embeddings", True)),
        dropout=0.0,
    )
    fields.update(overrides)
    return GPTConfig(**fields)


def state_from_hf(hf_sd: dict[str, torch.Tensor], tie_embeddings: bool) -> dict[str, torch.Tensor]:
    """HF GPT-2's state dict under our names: the same names (with "transformer." where the original
    OpenAI-converted files lack it), the four Conv1D matrices per block transposed, the causal-mask buffers
    of older HF versions and a tied head left out. checkpoint/hf.py checks the result against the model's
    shapes before anything is built."""
    ours = {}
    for key, tensor in hf_sd.items():
        if not key.startswith(("transformer.", "lm_head.")):
            key = "transformer." + key
        if key.endswith((".attn.bias", ".attn.masked_bias")) or (key == "lm_head.weight" and tie_embeddings):
            continue
        ours[key] = tensor.t() if key.endswith(CONV1D_SUFFIXES) else tensor
    return ours


def hf_config(model: GPT, eos_token_id: int | None, vocab_size: int | None = None) -> dict:
    """HF's GPT-2 config.json for our model (vocab_size: the exported rows, default all)."""
    cfg = model.config
    return {
        "architectures": ["GPT2LMHeadModel"],
        "model_type": "gpt2",
        "vocab_size": vocab_size or cfg.vocab_size,
        "n_positions": cfg.block_size,
        "n_ctx": cfg.block_size,
        "n_embd": cfg.n_embd,
        "n_layer": cfg.n_layer,
        "n_head": cfg.n_head,
        "n_inner": None,
        "activation_function": "gelu_new" if cfg.gelu_approximate == "tanh" else "gelu",
        "layer_norm_epsilon": cfg.layer_norm_eps,
        "resid_pdrop": cfg.dropout,
        "embd_pdrop": cfg.dropout,
        "attn_pdrop": cfg.dropout,
        "initializer_range": 0.02,
        "bos_token_id": eos_token_id,
        "eos_token_id": eos_token_id,
        "tie_word_embeddings": cfg.tie_embeddings,
        "dtype": "float32",  # what transformers 5 reads
        "torch_dtype": "float32",  # what transformers 4 reads (5 drops it when dtype is there)
    }


def cropped_state(model: GPT, vocab_size: int | None = None) -> dict[str, torch.Tensor]:
    """Our state dict in fp32 on the CPU, contiguous, a tied head left out (HF ties it to wte on load).
    vocab_size cuts the token embedding and the head to the tokenizer's rows: a vocabulary padded for
    GPU tiles (50304) has rows no tokenizer id reaches, which an HF model would otherwise sample."""
    state = {}
    for key, tensor in model.state_dict().items():
        if key == "lm_head.weight" and model.config.tie_embeddings:
            continue
        tensor = tensor.detach().float().cpu()
        if vocab_size and key in ("transformer.wte.weight", "lm_head.weight"):
            tensor = tensor[:vocab_size]
        state[key] = tensor.contiguous()
    return state


def gpt2_tensors(model: GPT, vocab_size: int | None = None) -> dict[str, torch.Tensor]:
    """The tensors of HF GPT-2's model.safetensors for our model: cropped_state with the Conv1D matrices
    transposed, and zero biases where ours has none (HF's GPT-2 always has biases: zeros are exactly "no
    bias")."""
    tensors = {key: (t.t().contiguous() if key.endswith(CONV1D_SUFFIXES) else t)
               for key, t in cropped_state(model, vocab_size).items()}
    if not model.config.bias:
        for name, module in model.named_modules():
            if isinstance(module, (torch.nn.Linear, torch.nn.LayerNorm)) and module.bias is None and name != "lm_head":
                tensors[f"{name}.bias"] = torch.zeros(module.weight.shape[0])
    return tensors
