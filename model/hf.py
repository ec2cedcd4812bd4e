"""The mapping between our GPT and HF transformers' GPT-2 format: config.json's fields and the tensors.

Our parameter names are GPT-2's, so the only change is that HF's Conv1D stores its weight as
(in, out) where nn.Linear stores (out, in): those four matrices per block are transposed.

    model = gpt_from_hf(config_json, hf_state_dict)   # HF GPT-2 -> ours
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
    """Our config from HF GPT-2's config.json (a dict); checkpoint/model_config.py checks what it holds."""
    act = hf.get("activation_function", "gelu_new")
    if act not in HF_ACTIVATIONS:
        raise ValueError(f"unsupported activation_function {act!r} in config.json; expected one of {sorted(HF_ACTIVATIONS)}")
    n_inner = hf.get("n_inner")
    if n_inner not in (None, 4 * hf["n_embd"]):
        raise ValueError(f"unsupported n_inner={n_inner} in config.json: this GPT uses 4 * n_embd")
    for flag in ("scale_attn_by_inverse_layer_idx", "reorder_and_upcast_attn"):
        if hf.get(flag):
            raise ValueError(f"unsupported {flag}=true in config.json")
    if hf.get("scale_attn_weights") is False:
        raise ValueError("unsupported scale_attn_weights=false in config.json")
    fields = dict(
        block_size=hf["n_positions"],
        vocab_size=hf["vocab_size"],
        n_layer=hf["n_layer"],
        n_head=hf["n_head"],
        n_embd=hf["n_embd"],
        bias=True,
        gelu_approximate=HF_ACTIVATIONS[act],
        layer_norm_eps=hf.get("layer_norm_epsilon", 1e-5),
        tie_embeddings=bool(hf.get("tie_word_embeddings", True)),
        dropout=0.0,
    )
    fields.update(overrides)
    return GPTConfig(**fields)


def gpt_from_hf(config: GPTConfig, hf_sd: dict[str, torch.Tensor]) -> GPT:
    """Our GPT from its config (config_from_hf) and HF GPT-2's state dict: the names are the same, the four
    Conv1D matrices per block are transposed. Raises ValueError naming what does not fit."""
    with torch.device("meta"):  # the shapes only: a config.json that disagrees with its weights (or asks for an
        ours = GPT(config).state_dict()  # absurd size) is refused below before any memory is spent on it
    converted = {}
    for key, tensor in hf_sd.items():
        if not key.startswith(("transformer.", "lm_head.")):
            key = "transformer." + key  # the original OpenAI-converted files have no "transformer." prefix
        if key.endswith((".attn.bias", ".attn.masked_bias")):
            continue  # causal-mask buffers of older HF versions, not weights
        if key == "lm_head.weight" and config.tie_embeddings:
            continue  # tied to wte
        if key not in ours:
            raise ValueError(f"unexpected tensor {key!r} in the HF checkpoint")
        converted[key] = tensor.t() if key.endswith(CONV1D_SUFFIXES) else tensor
    ours_names = {k for k in ours if k != "lm_head.weight" or not config.tie_embeddings}
    missing = ours_names - converted.keys()
    if missing:
        raise ValueError(f"the HF checkpoint lacks {sorted(missing)[:4]}")
    for key, tensor in converted.items():
        if tensor.shape != ours[key].shape:
            raise ValueError(f"shape mismatch for {key}: HF {tuple(tensor.shape)} vs ours {tuple(ours[key].shape)}")
    model = GPT(config)
    model.load_state_dict(converted, strict=False)  # strict=False only for a tied lm_head.weight
    return model


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
