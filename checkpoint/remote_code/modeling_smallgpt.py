"""smallgpt's decoder for HF transformers, loaded with trust_remote_code=True.

`python -m model.export` copies this file, as it is, into an export whose model no architecture of
transformers expresses exactly (ReLU², a logit soft-cap, QK-norm with LayerNorm, ...):

    AutoModelForCausalLM.from_pretrained(export_dir, trust_remote_code=True)

It needs torch and transformers only, and holds the same math as the project's model/gpt.py, with the
same parameter names, so the export's weights are our state dict unchanged: GPT-2's blocks (pre-norm,
fused q|k|v in c_attn, c_fc / c_proj) with each option of the modern recipe:
- pos_embedding "learned" (a wpe table) or "rope" (rotary, the rotate-half layout, fp32 angles);
- norm "layernorm" or "rmsnorm", all with layer_norm_eps; qk_norm: RMS-normalised q and k per head;
- mlp_act "gelu" (gelu_approximate "tanh" or "none"), "relu2" (relu(x) ** 2) or "swiglu" (c_fc makes
  gate | up, c_proj takes silu(gate) * up);
- logit_softcap > 0: logits = cap * tanh(logits / cap); tie_word_embeddings: lm_head shares wte.
generate() works with transformers' DynamicCache and left padding (positions count the real tokens).
"""
from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F
from transformers import GenerationMixin, PretrainedConfig, PreTrainedModel
from transformers.cache_utils import DynamicCache
from transformers.modeling_outputs import CausalLMOutputWithPast

# the output's cache field: `cache` since transformers 5.2x (which reads it back from there), `past_key_values` before
_CACHE_FIELD = "cache" if "cache" in CausalLMOutputWithPast.__dataclass_fields__ else "past_key_values"


class SmallGPTConfig(PretrainedConfig):
    model_type = "smallgpt"
    # the names the HF tools look for (lm-eval reads max_position_embeddings for its context length)
    attribute_map = {"hidden_size": "n_embd", "num_hidden_layers": "n_layer", "num_attention_heads": "n_head",
                     "max_position_embeddings": "n_positions", "intermediate_size": "mlp_hidden"}

    def __init__(self, vocab_size=50257, n_positions=1024, n_layer=12, n_head=12, n_embd=768, mlp_hidden=3072,
                 bias=True, layer_norm_eps=1e-5, norm="layernorm", pos_embedding="learned", rope_base=10000.0,
                 qk_norm=False, mlp_act="gelu", gelu_approximate="tanh", logit_softcap=0.0, tie_word_embeddings=True,
                 **kwargs):
        self.vocab_size, self.n_positions, self.n_layer, self.n_head, self.n_embd = (
            vocab_size, n_positions, n_layer, n_head, n_embd)
        self.mlp_hidden, self.bias, self.layer_norm_eps, self.norm = mlp_hidden, bias, layer_norm_eps, norm
        self.pos_embedding, self.rope_base, self.qk_norm = pos_embedding, rope_base, qk_norm
        self.mlp_act, self.gelu_approximate, self.logit_softcap = mlp_act, gelu_approximate, logit_softcap
        super().__init__(tie_word_embeddings=tie_word_embeddings, **kwargs)


def make_norm(config: SmallGPTConfig) -> nn.Module:
    if config.norm == "rmsnorm":
        return nn.RMSNorm(config.n_embd, eps=config.layer_norm_eps)
    return nn.LayerNorm(config.n_embd, eps=config.layer_norm_eps, bias=config.bias)


def rotary_cos_sin(pos: torch.Tensor, head_dim: int, base: float):
    """cos, sin (B, 1, T, head_dim / 2) at positions pos (B, T): pair i turns by pos * base ** (-2i / head_dim)."""
    inv_freq = base ** (-torch.arange(0, head_dim, 2, device=pos.device, dtype=torch.float32) / head_dim)
    angles = pos.float()[..., None] * inv_freq  # (B, T, hs / 2)
    return angles.cos().unsqueeze(1), angles.sin().unsqueeze(1)


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x (B, nh, T, hs): the two halves of each head are the two coordinates of hs / 2 rotated planes."""
    x1, x2 = x.chunk(2, dim=-1)
    cos, sin = cos.to(x.dtype), sin.to(x.dtype)
    return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1)


class Attention(nn.Module):
    def __init__(self, config: SmallGPTConfig, layer_idx: int):
        super().__init__()
        self.n_head, self.head_dim, self.layer_idx = config.n_head, config.n_embd // config.n_head, layer_idx
        self.qk_norm, self.eps = config.qk_norm, config.layer_norm_eps
        self.c_attn = nn.Linear(config.n_embd, 3 * config.n_embd, bias=config.bias)
        self.c_proj = nn.Linear(config.n_embd, config.n_embd, bias=config.bias)

    def forward(self, x, mask, rope, cache):
        B, T, C = x.shape
        q, k, v = (t.view(B, T, self.n_head, self.head_dim).transpose(1, 2) for t in self.c_attn(x).split(C, dim=2))
        if self.qk_norm:
            q, k = F.rms_norm(q, (self.head_dim,), eps=self.eps), F.rms_norm(k, (self.head_dim,), eps=self.eps)
        if rope is not None:
            q, k = apply_rotary(q, *rope), apply_rotary(k, *rope)
        if cache is not None:
            k, v = cache.update(k, v, self.layer_idx)  # (B, nh, S, hs): the past keys and these
        y = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=mask is None and T > 1)
        return self.c_proj(y.transpose(1, 2).reshape(B, T, C))


class MLP(nn.Module):
    def __init__(self, config: SmallGPTConfig):
        super().__init__()
        self.gated = config.mlp_act == "swiglu"
        self.c_fc = nn.Linear(config.n_embd, (2 if self.gated else 1) * config.mlp_hidden, bias=config.bias)
        self.c_proj = nn.Linear(config.mlp_hidden, config.n_embd, bias=config.bias)
        self.mlp_act, self.approximate = config.mlp_act, config.gelu_approximate

    def forward(self, x):
        h = self.c_fc(x)
        if self.gated:
            gate, up = h.chunk(2, dim=-1)
            h = F.silu(gate) * up
        elif self.mlp_act == "relu2":
            h = F.relu(h).square()
        else:
            h = F.gelu(h, approximate=self.approximate)
        return self.c_proj(h)


class Block(nn.Module):
    def __init__(self, config: SmallGPTConfig, layer_idx: int):
        super().__init__()
        self.ln_1, self.attn = make_norm(config), Attention(config, layer_idx)
        self.ln_2, self.mlp = make_norm(config), MLP(config)

    def forward(self, x, mask, rope, cache):
        x = x + self.attn(self.ln_1(x), mask, rope, cache)
        return x + self.mlp(self.ln_2(x))


class SmallGPTForCausalLM(PreTrainedModel, GenerationMixin):
    config_class = SmallGPTConfig
    base_model_prefix = "transformer"
    _tied_weights_keys = {"lm_head.weight": "transformer.wte.weight"}

    def __init__(self, config: SmallGPTConfig):
        super().__init__(config)
        layers = {"wte": nn.Embedding(config.vocab_size, config.n_embd)}
        if config.pos_embedding == "learned":
            layers["wpe"] = nn.Embedding(config.n_positions, config.n_embd)
        layers["h"] = nn.ModuleList([Block(config, i) for i in range(config.n_layer)])
        layers["ln_f"] = make_norm(config)
        self.transformer = nn.ModuleDict(layers)
        self.lm_head = nn.Linear(config.n_embd, config.vocab_size, bias=False)
        self.post_init()

    def _init_weights(self, module):
        if isinstance(module, (nn.Linear, nn.Embedding)):
            module.weight.data.normal_(0.0, 0.02)
        if isinstance(module, nn.Linear) and module.bias is not None:
            module.bias.data.zero_()

    def get_input_embeddings(self):
        return self.transformer.wte

    def set_input_embeddings(self, value):
        self.transformer.wte = value

    def get_output_embeddings(self):
        return self.lm_head

    def set_output_embeddings(self, value):
        self.lm_head = value

    def forward(self, input_ids=None, attention_mask=None, position_ids=None, past_key_values=None, use_cache=None,
                labels=None, cache=None, **kwargs):
        B, T = input_ids.shape
        device = input_ids.device
        if use_cache is None:
            use_cache = getattr(self.config, "use_cache", True)
        # transformers 5.2x's generate() passes the cache as `cache`, earlier ones as `past_key_values`
        given = cache if cache is not None else past_key_values
        if use_cache and given is None:
            given = DynamicCache()
        cache = given if use_cache else None
        past = cache.get_seq_length() if cache is not None else 0
        S = past + T
        slots = torch.arange(past, S, device=device)  # the query tokens' slots
        if position_ids is None:
            if attention_mask is not None:  # left padding: each row's positions count its real tokens only
                position_ids = (attention_mask.long().cumsum(-1) - 1).clamp(min=0)[:, past:S]
            else:
                position_ids = slots.unsqueeze(0)
        mask = None
        if attention_mask is not None or past:
            key_slots = torch.arange(S, device=device)
            mask = (key_slots <= slots[:, None])[None, None]  # (1, 1, T, S): causal
            if attention_mask is not None:
                if attention_mask.dim() != 2:
                    raise ValueError("smallgpt takes a 2D attention_mask (batch, keys) of ones and zeros")
                # no real query attends to a pad; a pad query sees itself, so its softmax row is never empty
                mask = (mask & attention_mask[:, None, None, :S].bool()) | (key_slots == slots[:, None])

        x = self.transformer.wte(input_ids)  # (B, T, C)
        rope = None
        if self.config.pos_embedding == "learned":
            x = x + self.transformer.wpe(position_ids)
        else:
            rope = rotary_cos_sin(position_ids, self.config.n_embd // self.config.n_head, self.config.rope_base)
        for block in self.transformer.h:
            x = block(x, mask, rope, cache)
        logits = self.lm_head(self.transformer.ln_f(x))  # (B, T, vocab)
        cap = self.config.logit_softcap
        if cap:
            logits = cap * torch.tanh(logits / cap)
        loss = None
        if labels is not None:  # HF's convention: labels are the inputs; -100 is ignored
            loss = F.cross_entropy(logits[:, :-1].float().reshape(-1, logits.size(-1)), labels[:, 1:].reshape(-1),
                                   ignore_index=-100)
        return CausalLMOutputWithPast(loss=loss, logits=logits, **{_CACHE_FIELD: cache})
