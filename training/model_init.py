"""Build the model a run starts from: its own checkpoint (resume), fresh weights (`scratch`), another
run's checkpoint, or HF GPT-2 weights (`init_from`)."""
from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from errors import UserError
from model import GPT, GPTConfig

from model.checkpoint import CKPT_NAME, load_checkpoint, model_config_dict, model_from_checkpoint
from .config import ModelSection

ARCH_KEYS = ("n_layer", "n_head", "n_embd", "bias")


def build_model(m: ModelSection, *, vocab_size: int, tokenizer: dict[str, Any], seed: int,
                resume: dict[str, Any] | None = None) -> tuple[GPT, list[str]]:
    """(model on CPU in fp32, notes to print). For init_from other than scratch the architecture comes
    from the source, and `m` is updated to match it (so the saved config says what was trained)."""
    notes: list[str] = []
    runtime = {"dropout": m.dropout, "attn_backend": m.attn_backend}  # may differ from the source
    if resume is not None:
        return model_from_checkpoint(resume, "being resumed", **runtime), notes

    if m.init_from == "scratch":
        if 0 < m.vocab_size < vocab_size:
            raise UserError(f"model.vocab_size={m.vocab_size} is smaller than the tokenizer's {vocab_size} ids; "
                            f"use 0 (the tokenizer's) or a padded size >= {vocab_size}")
        torch.manual_seed(seed)
        cfg = m.gpt_config(max(m.vocab_size, vocab_size))
        return GPT(cfg.__class__(**{**cfg.__dict__, **runtime})), notes

    src = Path(m.init_from).expanduser()
    if src.is_file() or (src.is_dir() and (src / CKPT_NAME).is_file()):
        ck = load_checkpoint(src)
        if ck.get("tokenizer") != tokenizer:
            raise UserError(f"model.init_from={m.init_from} was trained with tokenizer {_tok(ck.get('tokenizer'))}, "
                            f"but this data uses {_tok(tokenizer)}; set data.tokenizer (and dataset) to match")
        model = model_from_checkpoint(ck, src, **runtime)
        source = f"checkpoint {src}"
    else:
        if not tokenizer.get("tokenizer") == "gpt2":
            raise UserError(f"model.init_from={m.init_from} is HF GPT-2, which needs data.tokenizer=gpt2 "
                            f"(got {tokenizer.get('tokenizer')!r}); set --data.tokenizer=gpt2")
        try:
            model = GPT.from_pretrained(m.init_from, **runtime)
        except (FileNotFoundError, ValueError, OSError) as e:
            raise UserError(f"model.init_from={m.init_from!r}: {e}; use 'scratch', a checkpoint path, "
                            "an HF GPT-2 directory, or a hub name such as 'gpt2' (needs the network once)") from None
        source = f"HF {m.init_from}"

    mc = model.config
    if vocab_size > mc.vocab_size:
        raise UserError(f"the data's vocab ({vocab_size}) is larger than {source}'s ({mc.vocab_size}); "
                        "use the tokenizer the source was trained with")
    changed = [f"{k} {getattr(m, k)}->{getattr(mc, k)}" for k in ARCH_KEYS if getattr(m, k) != getattr(mc, k)]
    if changed:
        notes.append(f"architecture taken from {source}: {', '.join(changed)}")
    for k in ARCH_KEYS:
        setattr(m, k, getattr(mc, k))
    if m.block_size > mc.block_size:
        raise UserError(f"model.block_size={m.block_size} exceeds {source}'s block_size {mc.block_size}; "
                        f"set --model.block_size={mc.block_size} or less")
    notes.append(f"initialised from {source} ({model.num_params() / 1e6:.2f}M non-embedding params)")
    return model, notes


def _tok(t: Any) -> str:
    if isinstance(t, dict):
        return repr(t.get("tokenizer")) + (" (char vocab)" if t.get("chars") else "")
    return repr(t)
