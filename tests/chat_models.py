"""Tiny chat-capable models for the chat tests: a char-level GPT whose vocabulary has the chat template's
four marker rows, saved the way checkpoint/format.py saves a run's checkpoint, with a `chat_template` entry
(what sft records). Random weights, large enough that the next token depends on the context."""
from __future__ import annotations

import dataclasses
from pathlib import Path

import torch

from checkpoint import save_checkpoint
from data import get_tokenizer
from data.chat_template import template_for
from model import GPT, GPTConfig

CHARS = "".join(sorted(set("\n !',.?+-=0123456789:abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ")))


def char_tok():
    return get_tokenizer("char", CHARS)


def tiny_chat_model(seed: int = 0, block_size: int = 64, end_bias: float = 0.0, favour: str | None = None,
                    n_embd: int = 32, n_layer: int = 2) -> GPT:
    """fp32, eval mode. end_bias > 0 makes <|end|> likelier (replies that end on their own); `favour`: a
    character the model then writes every time (a reply that runs until the context is full)."""
    tok = char_tok()
    template = template_for(tok)
    torch.manual_seed(seed)
    model = GPT(GPTConfig(vocab_size=template.vocab_size, block_size=block_size, n_layer=n_layer, n_head=2,
                          n_embd=n_embd))
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() == 2:
                p.normal_(0.0, 0.4)
        # a final-norm bias along a token's row adds about `amount` to its logit everywhere
        target, amount = (tok.encode(favour)[0], 100.0) if favour else (template.end, end_bias)
        if amount:
            row = model.lm_head.weight[target]
            model.transformer.ln_f.bias.copy_(amount * row / row.square().sum())
    return model.eval()


def save_chat_checkpoint(path: Path, model: GPT, chat: bool = True) -> Path:
    tok = char_tok()
    payload = {"model": model.state_dict(), "model_config": dataclasses.asdict(model.config), "config": {},
               "tokenizer": {"tokenizer": "char", "chars": CHARS}, "iter": 0}
    if chat:
        payload["chat_template"] = template_for(tok).to_dict()
    save_checkpoint(path, payload)
    return path


def layout(template, tok, messages, add_generation_prompt: bool = True) -> list[int]:
    """The chat layout written out by hand: <|role|> content <|end|> per message, then <|assistant|>. What
    template.encode_prompt gives, also for a conversation it refuses (an empty reply the model wrote)."""
    role = {"system": "<|system|>", "user": "<|user|>", "assistant": "<|assistant|>"}
    ids = [i for m in messages for i in (template.id(role[m["role"]]), *tok.encode(m["content"]), template.end)]
    return ids + [template.id("<|assistant|>")] * add_generation_prompt
