"""A GPT-2 style decoder-only transformer: config, attention, MLP, block, model, KV cache.

Parameter names follow GPT-2 / HF (`wte`, `wpe`, `h.N.ln_1`, `h.N.attn.c_attn`, ...), so converting
weights to and from HF's format is a transpose of the Conv1D matrices and nothing else (see model/hf.py).

Conventions for the optional arguments of `GPT.forward`:
- `input_pos` (T,) long: the sequence slots the T new tokens occupy. Without a KV cache it defaults to
  0..T-1; with a cache it says where to write the new keys and values.
- `pad_mask` (B, S) bool, True for real tokens, over all S slots the keys live in (S = T without a
  cache, the cache length with one). Left padding lets prompts of different lengths share a batch: each
  row's position ids count only its real tokens, and no real query ever attends to a pad.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F

from .fused_ce import CHUNK_ROWS, linear_cross_entropy

ATTN_BACKENDS = ("sdpa", "manual")
GELU_APPROXIMATIONS = ("tanh", "none")


@dataclass
class GPTConfig:
    block_size: int = 1024
    vocab_size: int = 50257
    n_layer: int = 12
    n_head: int = 12
    n_embd: int = 768
    dropout: float = 0.0
    bias: bool = True  # biases in Linear and LayerNorm, as in GPT-2; False is a little faster and no worse
    attn_backend: str = "sdpa"  # "sdpa": F.scaled_dot_product_attention, "manual": the textbook math
    gelu_approximate: str = "tanh"  # GPT-2 was trained with the tanh approximation ("gelu_new" in HF)
    layer_norm_eps: float = 1e-5

    def __post_init__(self):
        self.validate()

    def gpt2_incompatibilities(self) -> list[str]:
        """What HF's GPT-2 format can't express about this model, one short reason each ([] for GPT-2)."""
        return []

    def validate(self) -> None:
        """The one check of every model field (the training config calls it too). Raises ValueError
        naming the field as `GPTConfig.<field>` and a valid value."""
        for name in ("block_size", "vocab_size", "n_layer", "n_head", "n_embd"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
                raise ValueError(f"GPTConfig.{name} must be a positive integer, got {value!r}")
        if self.n_embd % self.n_head != 0:
            raise ValueError(
                f"GPTConfig.n_embd ({self.n_embd}) must be divisible by GPTConfig.n_head ({self.n_head}); "
                f"pick n_head among the divisors of n_embd"
            )
        if not 0.0 <= self.dropout < 1.0:
            raise ValueError(f"GPTConfig.dropout must be in [0, 1), got {self.dropout!r}")
        if self.attn_backend not in ATTN_BACKENDS:
            raise ValueError(f"GPTConfig.attn_backend must be one of {', '.join(ATTN_BACKENDS)}, got {self.attn_backend!r}")
        if self.gelu_approximate not in GELU_APPROXIMATIONS:
            raise ValueError(
                f"GPTConfig.gelu_approximate must be one of {', '.join(GELU_APPROXIMATIONS)}, got {self.gelu_approximate!r}"
            )


class KVCache(nn.Module):
    """Preallocated keys and values of one attention layer, for incremental decoding."""

    def __init__(self, batch_size: int, max_seq_len: int, n_head: int, head_dim: int, dtype, device=None):
        super().__init__()
        shape = (batch_size, n_head, max_seq_len, head_dim)
        self.register_buffer("k", torch.zeros(shape, dtype=dtype, device=device), persistent=False)
        self.register_buffer("v", torch.zeros(shape, dtype=dtype, device=device), persistent=False)

    def update(self, pos: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Write k, v (B, nh, T, hs) at slots `pos` (T,); return the whole cache (B, nh, S, hs)."""
        self.k[:, :, pos] = k.to(self.k.dtype)
        self.v[:, :, pos] = v.to(self.v.dtype)
        return self.k, self.v


class CausalSelfAttention(nn.Module):
    def __init__(self, config: GPTConfig):
        super().__init__()
        self.n_head = config.n_head
        self.head_dim = config.n_embd // config.n_head
        self.backend = config.attn_backend
        self.dropout = config.dropout
        # one Linear makes q, k and v together: a single larger matmul is faster than three small ones
        self.c_attn = nn.Linear(config.n_embd, 3 * config.n_embd, bias=config.bias)
        self.c_proj = nn.Linear(config.n_embd, config.n_embd, bias=config.bias)
        self.attn_dropout = nn.Dropout(config.dropout)
        self.resid_dropout = nn.Dropout(config.dropout)

    def forward(self, x, mask=None, kv_cache: KVCache | None = None, input_pos=None):
        """x (B, T, C). mask: None for plain causal attention, else bool (B, 1, T, S), True = may attend."""
        B, T, C = x.shape
        q, k, v = self.c_attn(x).split(C, dim=2)
        q = q.view(B, T, self.n_head, self.head_dim).transpose(1, 2)  # (B, nh, T, hs)
        k = k.view(B, T, self.n_head, self.head_dim).transpose(1, 2)  # (B, nh, T, hs)
        v = v.view(B, T, self.n_head, self.head_dim).transpose(1, 2)  # (B, nh, T, hs)
        if kv_cache is not None:
            k, v = kv_cache.update(input_pos, k, v)  # (B, nh, S, hs)
            q = q.to(k.dtype)  # the cache may be kept in a narrower dtype than the activations
        dropout_p = self.dropout if self.training else 0.0

        if self.backend == "sdpa":
            # with no mask, is_causal lets SDPA pick the flash / memory-efficient kernels on GPU
            y = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=dropout_p, is_causal=mask is None)
        else:
            att = q @ k.transpose(-2, -1) * self.head_dim**-0.5  # (B, nh, T, S)
            if mask is None:
                causal = torch.triu(torch.ones(T, T, dtype=torch.bool, device=x.device), diagonal=1)
                att = att.masked_fill(causal, float("-inf"))
            else:
                att = att.masked_fill(~mask, float("-inf"))
            att = F.softmax(att, dim=-1)
            att = self.attn_dropout(att)
            y = att @ v  # (B, nh, T, hs)

        y = y.transpose(1, 2).contiguous().view(B, T, C)  # re-assemble the heads side by side
        return self.resid_dropout(self.c_proj(y.to(x.dtype)))


class MLP(nn.Module):
    def __init__(self, config: GPTConfig):
        super().__init__()
        self.c_fc = nn.Linear(config.n_embd, 4 * config.n_embd, bias=config.bias)
        self.gelu = nn.GELU(approximate=config.gelu_approximate)
        self.c_proj = nn.Linear(4 * config.n_embd, config.n_embd, bias=config.bias)
        self.dropout = nn.Dropout(config.dropout)

    def forward(self, x):
        return self.dropout(self.c_proj(self.gelu(self.c_fc(x))))


class Block(nn.Module):
    def __init__(self, config: GPTConfig):
        super().__init__()
        self.ln_1 = nn.LayerNorm(config.n_embd, eps=config.layer_norm_eps, bias=config.bias)
        self.attn = CausalSelfAttention(config)
        self.ln_2 = nn.LayerNorm(config.n_embd, eps=config.layer_norm_eps, bias=config.bias)
        self.mlp = MLP(config)

    def forward(self, x, mask=None, kv_cache=None, input_pos=None):
        # pre-norm: the residual stream itself is never normalised, which keeps deep stacks trainable
        x = x + self.attn(self.ln_1(x), mask, kv_cache, input_pos)
        x = x + self.mlp(self.ln_2(x))
        return x


class GPT(nn.Module):
    def __init__(self, config: GPTConfig):
        super().__init__()
        self.config = config
        self.transformer = nn.ModuleDict(
            dict(
                wte=nn.Embedding(config.vocab_size, config.n_embd),
                wpe=nn.Embedding(config.block_size, config.n_embd),
                drop=nn.Dropout(config.dropout),
                h=nn.ModuleList([Block(config) for _ in range(config.n_layer)]),
                ln_f=nn.LayerNorm(config.n_embd, eps=config.layer_norm_eps, bias=config.bias),
            )
        )
        self.lm_head = nn.Linear(config.n_embd, config.vocab_size, bias=False)
        # weight tying (Press & Wolf 2017): the output layer reuses the token embedding, which saves
        # vocab_size * n_embd parameters and trains better at this scale
        self.tie_weights()
        self.init_weights()
        # rows per chunk of the fused LM-head loss (return_logits=False); None = through the full logits
        self.loss_chunk_rows: int | None = CHUNK_ROWS

    def tie_weights(self) -> None:
        self.lm_head.weight = self.transformer.wte.weight

    @torch.no_grad()
    def init_weights(self, generator: torch.Generator | None = None) -> None:
        """GPT-2 initialisation, in place.

        - every Linear weight and both embeddings (`wte`, `wpe`): normal(0, 0.02);
        - the residual projections `attn.c_proj` and `mlp.c_proj`: normal(0, 0.02 / sqrt(2 * n_layer)),
          because each of the 2 * n_layer residual additions adds its variance to the stream;
        - Linear biases: 0; LayerNorm weight 1 and bias 0.
        `lm_head` is tied to `wte` and so is not initialised separately.
        """
        residual_std = 0.02 / math.sqrt(2 * self.config.n_layer)
        for name, module in self.named_modules():
            if isinstance(module, nn.Linear):
                std = residual_std if name.endswith("c_proj") else 0.02
                if module is not self.lm_head:
                    module.weight.normal_(0.0, std, generator=generator)
                if module.bias is not None:
                    module.bias.zero_()
            elif isinstance(module, nn.Embedding):
                module.weight.normal_(0.0, 0.02, generator=generator)
            elif isinstance(module, nn.LayerNorm):
                module.reset_parameters()

    def forward(self, idx, targets=None, *, input_pos=None, pad_mask=None, kv_cache: list[KVCache] | None = None,
                return_logits: bool = True):
        """idx (B, T) token ids. Returns logits (B, T, vocab), or (logits, loss) when targets are given.

        targets (B, T): next-token ids; -1 marks positions left out of the mean cross-entropy.
        return_logits=False (with targets): returns (None, loss), what training wants. With
        `loss_chunk_rows` set the loss is computed a chunk of rows at a time, fused with the LM head,
        never holding the (B, T, vocab) logits; with None it goes through the full logits, which is
        what a compiled graph on a GPU fuses best (runtime/loss_path.py chooses, from outside).
        input_pos, pad_mask, kv_cache: see the module docstring; `new_kv_cache` makes the cache.
        """
        B, T = idx.shape
        device = idx.device
        if input_pos is None:
            if kv_cache is not None:
                raise ValueError("input_pos is required with a kv_cache: it says which slots the tokens fill")
            input_pos = torch.arange(T, device=device)
        S = kv_cache[0].k.shape[2] if kv_cache is not None else T
        if T > self.config.block_size or S > self.config.block_size:
            raise ValueError(f"sequence length {max(T, S)} exceeds block_size {self.config.block_size}")

        mask = None
        if pad_mask is None:
            pos = input_pos.unsqueeze(0)  # (1, T)
            if kv_cache is not None:
                # query at slot p may see key slots <= p; slots past the written ones are masked too
                mask = (torch.arange(S, device=device) <= input_pos.unsqueeze(1)).view(1, 1, T, S)
        else:
            # each row's positions count its real tokens only, so a left-padded prompt gets the same
            # position embeddings as when it runs alone
            pos = (pad_mask.long().cumsum(1) - 1).clamp(min=0).gather(1, input_pos.expand(B, T))  # (B, T)
            causal = torch.arange(S, device=device) <= input_pos.unsqueeze(1)  # (T, S)
            # a pad query sees itself too, so that its softmax row is never all -inf (that would be NaN)
            own_slot = torch.arange(S, device=device) == input_pos.unsqueeze(1)  # (T, S)
            mask = (causal & pad_mask[:, None, :]) | own_slot  # (B, T, S)
            mask = mask.unsqueeze(1)  # (B, 1, T, S), broadcast over heads

        x = self.transformer.wte(idx) + self.transformer.wpe(pos)  # (B, T, C)
        x = self.transformer.drop(x)
        for i, block in enumerate(self.transformer.h):
            x = block(x, mask, kv_cache[i] if kv_cache is not None else None, input_pos)
        x = self.transformer.ln_f(x)
        if targets is not None and not return_logits and self.loss_chunk_rows:
            return None, linear_cross_entropy(x.view(B * T, -1), self.lm_head.weight, targets.reshape(-1),
                                              chunk_rows=self.loss_chunk_rows)
        logits = self.lm_head(x)  # (B, T, vocab)
        if targets is None:
            return logits
        # bf16/fp16 logits are upcast for the softmax; fp32 and fp64 stay as they are
        acc = torch.promote_types(logits.dtype, torch.float32)
        loss = F.cross_entropy(logits.to(acc).view(-1, logits.size(-1)), targets.reshape(-1), ignore_index=-1)
        return (logits if return_logits else None), loss

    def new_kv_cache(self, batch_size: int, max_seq_len: int | None = None, dtype=None, device=None) -> list[KVCache]:
        """One preallocated KVCache per layer, for sequences of up to max_seq_len (default block_size) slots."""
        max_seq_len = max_seq_len or self.config.block_size
        if max_seq_len > self.config.block_size:
            raise ValueError(f"max_seq_len {max_seq_len} exceeds block_size {self.config.block_size}")
        weight = self.transformer.wte.weight
        head_dim = self.config.n_embd // self.config.n_head
        return [
            KVCache(batch_size, max_seq_len, self.config.n_head, head_dim, dtype or weight.dtype, device or weight.device)
            for _ in range(self.config.n_layer)
        ]

    def num_params(self, non_embedding: bool = True) -> int:
        """Parameter count. Tied weights count once; non_embedding leaves out wte and wpe (as in the
        scaling-law papers). wte still counts when non_embedding is False, since it is also the LM head."""
        n = sum(p.numel() for p in self.parameters())
        if non_embedding:
            n -= self.transformer.wte.weight.numel() + self.transformer.wpe.weight.numel()
        return n

    def flops_per_token(self, seq_len: int | None = None) -> float:
        """Training FLOPs per token (forward + backward), as in the PaLM paper's appendix B:
        6 * N for the matmuls (N = non-embedding params plus the LM head, which is a real matmul even
        though it is tied) plus 12 * n_layer * n_embd * seq_len for the attention scores and values."""
        cfg = self.config
        T = seq_len or cfg.block_size
        n_matmul = self.num_params(non_embedding=True) + cfg.vocab_size * cfg.n_embd
        return 6.0 * n_matmul + 12.0 * cfg.n_layer * cfg.n_embd * T
