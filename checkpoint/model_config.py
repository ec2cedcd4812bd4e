"""The one check of a model's config (GPTConfig's fields), for every place one comes in from outside: the
training config's `model:` section (training/config/sections.py), a checkpoint's model_config (checkpoint/load.py)
and an HF config.json (checkpoint/hf.py).

Here rather than in model/ or training/: the model asserts what it assumes (as nanoGPT does) and raises no
user errors, and inference must check what it loads without importing training/. Each caller raises the
problem in its own words (a config key, a checkpoint entry), so nothing rewrites an error's text.
"""
from __future__ import annotations

import math

from errors import clipped
from model.gpt import ATTN_BACKENDS, GELU_APPROXIMATIONS, MLP_ACTS, NORMS, POS_EMBEDDINGS, GPTConfig

# Sizes past any model this project can train: refused before anything is built (an absurd config would
# otherwise spin building millions of modules, or overflow a tensor's size, before the memory check).
MAX_LAYERS = 1024
MAX_BLOCK_SIZE = 2**24
MAX_PARAMS = 10**12


def model_config_problem(cfg: GPTConfig, prefix: str = "GPTConfig.", vocab_known: bool = True) -> str | None:
    """What is wrong with `cfg`, naming the field as `<prefix><field>` and a valid value; None if nothing.
    vocab_known False: the vocabulary comes from the data later (a config's vocab_size 0): cfg holds 1, and
    the size check counts the model without it. Every value is quoted cut (errors.clipped): a checkpoint's
    n_embd of 10,000 characters made a line of 10,177."""
    for name in ("block_size", "vocab_size", "n_layer", "n_head", "n_embd"):
        value = getattr(cfg, name)
        if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
            return f"{prefix}{name} must be a positive integer, got {clipped(value)}"
    if cfg.n_layer > MAX_LAYERS:
        return f"{prefix}n_layer must be at most {MAX_LAYERS}, got {clipped(cfg.n_layer)}"
    if cfg.block_size > MAX_BLOCK_SIZE:
        return f"{prefix}block_size must be at most {MAX_BLOCK_SIZE}, got {clipped(cfg.block_size)}"
    if cfg.n_embd % cfg.n_head != 0:
        return (f"{prefix}n_embd ({clipped(cfg.n_embd)}) must be divisible by {prefix}n_head ({clipped(cfg.n_head)}); "
                "pick n_head among the divisors of n_embd")
    if isinstance(cfg.dropout, bool) or not isinstance(cfg.dropout, (int, float)) or not 0.0 <= cfg.dropout < 1.0:
        return f"{prefix}dropout must be in [0, 1), got {clipped(cfg.dropout)}"
    for name, options in (("attn_backend", ATTN_BACKENDS), ("gelu_approximate", GELU_APPROXIMATIONS),
                          ("pos_embedding", POS_EMBEDDINGS), ("norm", NORMS), ("mlp_act", MLP_ACTS)):
        if getattr(cfg, name) not in options:
            return f"{prefix}{name} must be one of {', '.join(options)}, got {clipped(getattr(cfg, name))}"
    if cfg.pos_embedding == "rope" and (cfg.n_embd // cfg.n_head) % 2:
        return (f"{prefix}pos_embedding=rope needs an even head size (n_embd / n_head = {clipped(cfg.n_embd // cfg.n_head)}); "
                "change n_embd or n_head")
    for name in ("rope_base", "logit_softcap", "layer_norm_eps"):
        value = getattr(cfg, name)
        # an int is finite only within a float's range: math.isfinite(10**400) raises OverflowError, and so would the model
        finite = isinstance(value, float) and math.isfinite(value) or isinstance(value, int) and abs(value) < 2**1023
        if isinstance(value, bool) or not finite or value < 0:
            return f"{prefix}{name} must be a finite number >= 0, got {clipped(value)}"
    if cfg.rope_base <= 1:
        return f"{prefix}rope_base must be > 1, got {clipped(cfg.rope_base)}; 10000 is the usual value"
    for name in ("bias", "qk_norm", "tie_embeddings", "zero_init_proj"):
        if not isinstance(getattr(cfg, name), bool):
            return f"{prefix}{name} must be true or false, got {clipped(getattr(cfg, name))}"
    n = cfg.num_params()  # last: it reads the fields checked above
    if n > MAX_PARAMS:  # refused by arithmetic: building even on the meta device would take minutes
        shrink = (f"n_layer ({cfg.n_layer}), n_embd ({clipped(cfg.n_embd)}) or vocab_size ({clipped(cfg.vocab_size)})"
                  if vocab_known else f"n_layer ({cfg.n_layer}) or n_embd ({clipped(cfg.n_embd)})")
        about = f"{n:.2g}" if n < 10**300 else clipped(n)  # (past a float's range, :g raises OverflowError)
        return (f"a model of about {about} parameters{'' if vocab_known else ' before its vocabulary'}, more than the "
                f"{MAX_PARAMS:.0e} this project builds; lower {shrink}")
    return None
