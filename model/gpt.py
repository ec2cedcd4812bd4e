"""A GPT-2 style decoder-only transformer: config, attention, MLP, block, model, KV cache.

Parameter names follow GPT-2 / HF (`wte`, `wpe`, `h.N.ln_1`, `h.N.attn.c_attn`, ...), so converting
weights to and from HF's format is a transpose of the Conv1D matrices and nothing else (see model/hf.py).

Conventions for the optional arguments of `GPT.forward`:
- `input_pos` (T,) long: the sequence slots the T new tokens occupy. Without a KV cache it defaults to
  0..T-1; with a cache it says where to write the new keys and values. (B, T): each row's own slots, so
  that rows at different lengths decode in one batch (the server's continuous batching); a row's
  position ids are then its slots.
- `pad_mask` (B, S) bool, True for real tokens, over all S slots the keys live in (S = T without a
  cache, the cache length with one). Left padding lets prompts of different lengths share a batch: each
  row's position ids count only its real tokens, and no real query ever attends to a pad.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Callable

import torch
import torch.nn as nn
import torch.nn.functional as F


ATTN_BACKENDS = ("sdpa", "manual")
GELU_APPROXIMATIONS = ("tanh", "none")
POS_EMBEDDINGS = ("learned", "rope")
NORMS = ("layernorm", "rmsnorm")
MLP_ACTS = ("gelu", "relu2", "swiglu")


@dataclass
class GPTConfig:
    block_size: int = 1024  # the longest context, in tokens
    vocab_size: int = 50257  # rows of the token embedding and of the LM head
    n_layer: int = 12  # transformer blocks
    n_head: int = 12  # attention heads per block; n_embd must divide into them
    n_embd: int = 768  # width of the residual stream
    dropout: float = 0.0  # on attention weights, residual branches and embeddings, while training
    bias: bool = True  # biases in Linear and LayerNorm, as in GPT-2; False is a little faster and no worse
    attn_backend: str = "sdpa"  # "sdpa": F.scaled_dot_product_attention, "manual": the textbook math
    gelu_approximate: str = "tanh"  # GPT-2 was trained with the tanh approximation ("gelu_new" in HF)
    layer_norm_eps: float = 1e-5  # the epsilon of every norm
    # A modern recipe, as in the fastest public GPT runs (modded-nanogpt's speedrun, nanochat). Each is off
    # by default, and with all of them off the model is GPT-2's, parameter for parameter.
    pos_embedding: str = "learned"  # "learned": a wpe table (GPT-2); "rope": rotary embeddings of q and k
    rope_base: float = 10000.0  # rotary: the angle of pair i at position p is p * rope_base ** (-2i / head_dim)
    norm: str = "layernorm"  # "layernorm" (GPT-2) or "rmsnorm" (no mean subtraction, no bias)
    qk_norm: bool = False  # RMS-normalise each head's q and k before attention: bounded logits, stabler at high lr
    # "gelu" (GPT-2, see gelu_approximate), "relu2": relu(x) ** 2, or "swiglu": silu(x W_gate) * (x W_up), the
    # gated MLP of Llama and Qwen (its hidden layer is 2/3 as wide, so it has about GPT-2's parameter count)
    mlp_act: str = "gelu"
    tie_embeddings: bool = True  # the LM head shares wte's weight (GPT-2); False gives it its own
    zero_init_proj: bool = False  # zero-init the residual projections (and an untied head): each block starts as identity
    logit_softcap: float = 0.0  # > 0: logits = cap * tanh(logits / cap), which keeps them in (-cap, cap)

    def num_params(self, blocks: bool = True) -> int:
        """The parameters GPT(self) holds (tied ones once), counted from the config alone, with no module built:
        a model of any size is sized by arithmetic, and counting a meta-device build would cost ~1 s (its
        random init imports torch._dynamo). blocks=False: only those outside the blocks (embeddings, final
        norm, an untied head). The shapes are the modules' below; tests/test_config.py holds the two together."""
        C, V, L, b = self.n_embd, self.vocab_size, self.n_layer, int(self.bias)
        norm = C if self.norm == "rmsnorm" else C * (1 + b)  # RMSNorm: a gain; LayerNorm: a gain and a bias
        hidden = mlp_hidden(self)
        fc_out = 2 * hidden if self.mlp_act == "swiglu" else hidden
        block = (2 * norm + (C * 3 * C + b * 3 * C) + (C * C + b * C)  # ln_1, ln_2, c_attn, attn.c_proj
                 + (C * fc_out + b * fc_out) + (hidden * C + b * C))  # mlp.c_fc, mlp.c_proj
        outside = V * C * (1 if self.tie_embeddings else 2) + norm + (self.block_size * C if self.pos_embedding ==
                                                                        "learned" else 0)
        return outside + (L * block if blocks else 0)

    def gpt2_incompatibilities(self) -> list[str]:
        """What HF's GPT-2 format can't express about this model, one short reason each ([] for GPT-2).
        An untied head, zero-initialised projections, a padded vocabulary and bias=False are expressible."""
        reasons = []
        if self.pos_embedding != "learned":
            reasons.append("rotary position embeddings (pos_embedding=rope)")
        if self.norm != "layernorm":
            reasons.append("RMSNorm (norm=rmsnorm)")
        if self.qk_norm:
            reasons.append("QK-norm (qk_norm=true)")
        if self.mlp_act == "relu2":
            reasons.append("the ReLU² MLP (mlp_act=relu2)")
        if self.mlp_act == "swiglu":
            reasons.append("the SwiGLU MLP (mlp_act=swiglu)")
        if self.logit_softcap:
            reasons.append(f"a logit soft-cap (logit_softcap={self.logit_softcap})")
        return reasons


def make_norm(config: GPTConfig, dim: int) -> nn.Module:
    if config.norm == "rmsnorm":
        return nn.RMSNorm(dim, eps=config.layer_norm_eps)
    return nn.LayerNorm(dim, eps=config.layer_norm_eps, bias=config.bias)


def rotary_cos_sin(pos: torch.Tensor, head_dim: int, base: float) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin (B or 1, 1, T, head_dim / 2) of the rotary angles at positions pos (B or 1, T), in fp32:
    pair i of a head turns by pos * base ** (-2i / head_dim)."""
    inv_freq = base ** (-torch.arange(0, head_dim, 2, device=pos.device, dtype=torch.float32) / head_dim)
    angles = pos.float()[..., None] * inv_freq  # (B or 1, T, hs / 2)
    return angles.cos().unsqueeze(1), angles.sin().unsqueeze(1)


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate x (B, nh, T, hs) by the angles: the first and second halves of each head are the two
    coordinates of hs / 2 planes (the "rotate_half" layout of GPT-NeoX and HF's Llama). Rotating q and
    k by their positions makes q . k depend on the positions' difference only."""
    x1, x2 = x.chunk(2, dim=-1)
    cos, sin = cos.to(x.dtype), sin.to(x.dtype)
    return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1)


def mlp_hidden(config: GPTConfig) -> int:
    """Width of the MLP's hidden layer: 4 * n_embd (GPT-2). SwiGLU has two input matrices, so it takes 2/3 of
    that, rounded up to a multiple of 64 for matmul tiles (as Llama does): about GPT-2's parameter count."""
    if config.mlp_act == "swiglu":
        return math.ceil(8 * config.n_embd / 3 / 64) * 64
    return 4 * config.n_embd


class ReLUSquared(nn.Module):
    def forward(self, x):
        return F.relu(x).square()


class KVCache(nn.Module):
    """Preallocated keys and values of one attention layer, for incremental decoding."""

    def __init__(self, batch_size: int, max_seq_len: int, n_head: int, head_dim: int, dtype, device=None):
        super().__init__()
        shape = (batch_size, n_head, max_seq_len, head_dim)
        self.register_buffer("k", torch.zeros(shape, dtype=dtype, device=device), persistent=False)
        self.register_buffer("v", torch.zeros(shape, dtype=dtype, device=device), persistent=False)

    def update(self, pos: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Write k, v (B, nh, T, hs) at slots `pos`, (T,) for every row or (B, T) per row; return the whole
        cache (B, nh, S, hs)."""
        if pos.dim() == 2:  # advanced indices around a slice put their (B, T) dims first: (B, T, nh, hs)
            rows = torch.arange(k.size(0), device=pos.device).unsqueeze(1)
            self.k[rows, :, pos] = k.transpose(1, 2).to(self.k.dtype)
            self.v[rows, :, pos] = v.transpose(1, 2).to(self.v.dtype)
            return self.k, self.v
        self.k[:, :, pos] = k.to(self.k.dtype)
        self.v[:, :, pos] = v.to(self.v.dtype)
        return self.k, self.v


def attention_probs(q: torch.Tensor, k: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
    """softmax(q k^T / sqrt(hs) + mask): q (B, nh, T, hs), k (B, nh, S, hs) -> (B, nh, T, S). mask: None
    for plain causal attention (S = T), else bool (B, 1, T, S), True = may attend (-inf where False)."""
    att = q @ k.transpose(-2, -1) * q.size(-1) ** -0.5
    if mask is None:
        T, S = q.size(-2), k.size(-2)
        mask = ~torch.triu(torch.ones(T, S, dtype=torch.bool, device=q.device), diagonal=1)
    return F.softmax(att.masked_fill(~mask, float("-inf")), dim=-1)


class CausalSelfAttention(nn.Module):
    def __init__(self, config: GPTConfig):
        super().__init__()
        self.n_head = config.n_head
        self.head_dim = config.n_embd // config.n_head
        self.backend = config.attn_backend
        self.dropout = config.dropout
        self.qk_norm = config.qk_norm
        self.norm_eps = config.layer_norm_eps  # as every norm's (and Qwen3's q_norm and k_norm)
        # one Linear makes q, k and v together: a single larger matmul is faster than three small ones
        self.c_attn = nn.Linear(config.n_embd, 3 * config.n_embd, bias=config.bias)
        self.c_proj = nn.Linear(config.n_embd, config.n_embd, bias=config.bias)
        self.attn_dropout = nn.Dropout(config.dropout)
        self.resid_dropout = nn.Dropout(config.dropout)
        # Off but when asked (eval/inspect.py's attention maps): forward then keeps its attention
        # probabilities (B, nh, T, S) in `attention`. SDPA never materialises them, so they are computed
        # once more from the same q and k; the output is unchanged either way.
        self.record_attention = False
        self.attention: torch.Tensor | None = None

    def forward(self, x, mask=None, kv_cache: KVCache | None = None, input_pos=None, rope=None):
        """x (B, T, C). mask: None for plain causal attention, else bool (B, 1, T, S), True = may attend.
        rope: (cos, sin) of the tokens' positions when the model uses rotary embeddings."""
        B, T, C = x.shape
        q, k, v = self.c_attn(x).split(C, dim=2)
        q = q.view(B, T, self.n_head, self.head_dim).transpose(1, 2)  # (B, nh, T, hs)
        k = k.view(B, T, self.n_head, self.head_dim).transpose(1, 2)  # (B, nh, T, hs)
        v = v.view(B, T, self.n_head, self.head_dim).transpose(1, 2)  # (B, nh, T, hs)
        if self.qk_norm:
            q = F.rms_norm(q, (self.head_dim,), eps=self.norm_eps)
            k = F.rms_norm(k, (self.head_dim,), eps=self.norm_eps)
        if rope is not None:
            q, k = apply_rotary(q, *rope), apply_rotary(k, *rope)  # before caching: keys keep their positions
        if kv_cache is not None:
            k, v = kv_cache.update(input_pos, k, v)  # (B, nh, S, hs)
            q = q.to(k.dtype)  # the cache may be kept in a narrower dtype than the activations
        if self.record_attention:  # the weights of the very q and k used below, whichever backend runs
            self.attention = attention_probs(q, k, mask).detach()
        dropout_p = self.dropout if self.training else 0.0

        if self.backend == "sdpa":
            # with no mask, is_causal lets SDPA pick the flash / memory-efficient kernels on GPU
            y = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=dropout_p, is_causal=mask is None)
        else:
            att = self.attn_dropout(attention_probs(q, k, mask))  # (B, nh, T, S)
            y = att @ v  # (B, nh, T, hs)

        y = y.transpose(1, 2).contiguous().view(B, T, C)  # re-assemble the heads side by side
        return self.resid_dropout(self.c_proj(y.to(x.dtype)))


class MLP(nn.Module):
    """c_proj(act(c_fc(x))). With SwiGLU, c_fc makes the gate and the up projection side by side (one
    matmul, as c_attn makes q, k and v) and c_proj takes silu(gate) * up."""

    def __init__(self, config: GPTConfig):
        super().__init__()
        hidden = mlp_hidden(config)
        self.gated = config.mlp_act == "swiglu"
        self.c_fc = nn.Linear(config.n_embd, 2 * hidden if self.gated else hidden, bias=config.bias)
        if config.mlp_act == "gelu":
            self.act = nn.GELU(approximate=config.gelu_approximate)
        else:
            self.act = nn.SiLU() if self.gated else ReLUSquared()
        self.c_proj = nn.Linear(hidden, config.n_embd, bias=config.bias)
        self.dropout = nn.Dropout(config.dropout)

    def forward(self, x):
        h = self.c_fc(x)  # (B, T, hidden), or (B, T, 2 * hidden) = gate | up
        if self.gated:
            gate, up = h.chunk(2, dim=-1)  # (B, T, hidden) each
            h = self.act(gate) * up
        else:
            h = self.act(h)
        return self.dropout(self.c_proj(h))


class Block(nn.Module):
    def __init__(self, config: GPTConfig):
        super().__init__()
        self.ln_1 = make_norm(config, config.n_embd)
        self.attn = CausalSelfAttention(config)
        self.ln_2 = make_norm(config, config.n_embd)
        self.mlp = MLP(config)

    def forward(self, x, mask=None, kv_cache=None, input_pos=None, rope=None):
        # pre-norm: the residual stream itself is never normalised, which keeps deep stacks trainable
        x = x + self.attn(self.ln_1(x), mask, kv_cache, input_pos, rope)
        x = x + self.mlp(self.ln_2(x))
        return x


class GPT(nn.Module):
    def __init__(self, config: GPTConfig):
        super().__init__()
        # what the code below assumes; a config from outside is checked where it comes in (checkpoint/model_config.py)
        assert config.n_embd % config.n_head == 0, "n_embd must divide into n_head heads"
        assert config.pos_embedding != "rope" or (config.n_embd // config.n_head) % 2 == 0, "rope needs an even head size"
        self.config = config
        layers = dict(wte=nn.Embedding(config.vocab_size, config.n_embd))
        if config.pos_embedding == "learned":
            layers["wpe"] = nn.Embedding(config.block_size, config.n_embd)
        layers.update(drop=nn.Dropout(config.dropout), h=nn.ModuleList([Block(config) for _ in range(config.n_layer)]),
                      ln_f=make_norm(config, config.n_embd))
        self.transformer = nn.ModuleDict(layers)
        self.lm_head = nn.Linear(config.n_embd, config.vocab_size, bias=False)
        self.tie_weights()
        self.init_weights()

    def tie_weights(self) -> None:
        """Weight tying (Press & Wolf 2017): the output layer reuses the token embedding, which saves
        vocab_size * n_embd parameters and trains better at GPT-2's scale. Nothing when untied."""
        if self.config.tie_embeddings:
            self.lm_head.weight = self.transformer.wte.weight

    @torch.no_grad()
    def init_weights(self, generator: torch.Generator | None = None) -> None:
        """GPT-2 initialisation, in place.

        - every Linear weight and the embeddings (`wte`, and `wpe` when learned): normal(0, 0.02);
        - the residual projections `attn.c_proj` and `mlp.c_proj`: normal(0, 0.02 / sqrt(2 * n_layer)),
          because each of the 2 * n_layer residual additions adds its variance to the stream; with
          zero_init_proj they are 0 instead (std 0), so that every block starts as the identity;
        - `lm_head`: tied to `wte` (not initialised separately); untied, normal(0, 0.02), or 0 with
          zero_init_proj, so that the first logits are all equal (loss ln(vocab));
        - Linear biases: 0; norm gains (LayerNorm, RMSNorm) 1 and LayerNorm biases 0.
        The random draws come in the same order for every option, so the GPT-2 default is unchanged.
        """
        cfg = self.config
        residual_std = 0.0 if cfg.zero_init_proj else 0.02 / math.sqrt(2 * cfg.n_layer)
        for name, module in self.named_modules():
            if isinstance(module, nn.Linear):
                std = residual_std if name.endswith("c_proj") else 0.02
                if module is self.lm_head:
                    if not cfg.tie_embeddings:
                        module.weight.zero_() if cfg.zero_init_proj else module.weight.normal_(0.0, 0.02, generator=generator)
                elif std:
                    module.weight.normal_(0.0, std, generator=generator)
                else:
                    module.weight.zero_()
                if module.bias is not None:
                    module.bias.zero_()
            elif isinstance(module, nn.Embedding):
                module.weight.normal_(0.0, 0.02, generator=generator)
            elif isinstance(module, (nn.LayerNorm, nn.RMSNorm)):
                module.reset_parameters()

    def forward(self, idx, *, input_pos=None, pad_mask=None, kv_cache: list[KVCache] | None = None,
                output: Callable[[torch.Tensor, GPT], Any] | None = None):
        """idx (B, T) token ids -> logits (B, T, vocab); the model computes nothing else (no loss).

        input_pos, pad_mask, kv_cache: see the module docstring; `new_kv_cache` makes the cache.
        output(hidden, model): replaces the head. It gets the final hidden states (B, T, C), after ln_f, and
        this module, and what it returns is forward's result. The training loss passes itself here
        (runtime/loss_path.py's LMLoss), fused with the head a chunk of rows at a time so that the (B, T,
        vocab) logits are never held: it runs inside this forward, so DDP's hooks see one forward, FSDP's
        unsharded lm_head weight is there, and torch.compile traces it with the rest.
        """
        B, T = idx.shape
        device = idx.device
        if input_pos is None:
            assert kv_cache is None, "input_pos says which cache slots the tokens fill"
            input_pos = torch.arange(T, device=device)
        S = kv_cache[0].k.shape[2] if kv_cache is not None else T
        assert max(T, S) <= self.config.block_size, f"sequence length {max(T, S)} > block_size {self.config.block_size}"

        mask = None
        if pad_mask is None:
            pos = input_pos if input_pos.dim() == 2 else input_pos.unsqueeze(0)  # (B or 1, T)
            if kv_cache is not None:
                # query at slot p may see key slots <= p; slots past the written ones are masked too
                mask = (torch.arange(S, device=device) <= input_pos.unsqueeze(-1)).view(-1, 1, T, S)
        else:
            # each row's positions count its real tokens only, so a left-padded prompt gets the same
            # position embeddings as when it runs alone
            pos = (pad_mask.long().cumsum(1) - 1).clamp(min=0).gather(1, input_pos.expand(B, T))  # (B, T)
            causal = torch.arange(S, device=device) <= input_pos.unsqueeze(-1)  # (T, S) or (B, T, S)
            # a pad query sees itself too, so that its softmax row is never all -inf (that would be NaN)
            own_slot = torch.arange(S, device=device) == input_pos.unsqueeze(-1)  # (T, S) or (B, T, S)
            mask = (causal & pad_mask[:, None, :]) | own_slot  # (B, T, S)
            mask = mask.unsqueeze(1)  # (B, 1, T, S), broadcast over heads

        x = self.transformer.wte(idx)  # (B, T, C)
        rope = None
        if self.config.pos_embedding == "learned":
            x = x + self.transformer.wpe(pos)
        else:  # rotary: positions enter through q and k in every layer, not through the stream
            rope = rotary_cos_sin(pos, self.config.n_embd // self.config.n_head, self.config.rope_base)
        x = self.transformer.drop(x)
        for i, block in enumerate(self.transformer.h):
            x = block(x, mask, kv_cache[i] if kv_cache is not None else None, input_pos, rope)
        x = self.transformer.ln_f(x)
        return self.head(x) if output is None else output(x, self)

    def head(self, x: torch.Tensor) -> torch.Tensor:
        """The LM head on final hidden states (..., C) -> logits (..., vocab), soft-capped when logit_softcap > 0."""
        logits = self.lm_head(x)
        cap = self.config.logit_softcap
        return cap * torch.tanh(logits / cap) if cap else logits

    def new_kv_cache(self, batch_size: int, max_seq_len: int | None = None, dtype=None, device=None) -> list[KVCache]:
        """One preallocated KVCache per layer, for sequences of up to max_seq_len (default block_size) slots."""
        max_seq_len = max_seq_len or self.config.block_size
        assert max_seq_len <= self.config.block_size, f"max_seq_len {max_seq_len} > block_size {self.config.block_size}"
        weight = self.transformer.wte.weight
        head_dim = self.config.n_embd // self.config.n_head
        return [
            KVCache(batch_size, max_seq_len, self.config.n_head, head_dim, dtype or weight.dtype, device or weight.device)
            for _ in range(self.config.n_layer)
        ]

    def num_params(self, non_embedding: bool = True) -> int:
        """Parameter count; tied weights count once. non_embedding leaves out the embedding tables (wte,
        and wpe when learned) and an untied LM head, as the scaling-law papers count N: what is left is
        the blocks and the final norm."""
        n = sum(p.numel() for p in self.parameters())
        if non_embedding:
            n -= sum(t.weight.numel() for name, t in self.transformer.items() if name in ("wte", "wpe"))
            if not self.config.tie_embeddings:
                n -= self.lm_head.weight.numel()
        return n

    def flops_per_token(self, seq_len: int | None = None) -> float:
        """Training FLOPs per token (forward + backward), as in the PaLM paper's appendix B:
        6 * N for the matmuls (N = the non-embedding params plus the LM head, which is a real matmul,
        tied or not) plus 12 * n_layer * n_embd * seq_len for the attention scores and values."""
        cfg = self.config
        T = seq_len or cfg.block_size
        n_matmul = self.num_params(non_embedding=True) + cfg.vocab_size * cfg.n_embd
        return 6.0 * n_matmul + 12.0 * cfg.n_layer * cfg.n_embd * T
