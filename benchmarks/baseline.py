"""The plain loops every row is compared against, written the way nanoGPT writes them. They are
deliberately NOT the project's code paths: they are the reference the project must beat.

Training, `nanogpt_step`: forward with full (B, T, V) logits and F.cross_entropy, backward, clip to
1.0, AdamW step, zero_grad: nanoGPT's train.py loop body. Its set-up, `nanogpt_setup`, follows what
nanoGPT does on each device:
- CPU (nanoGPT's CPU recipe): fp32, eager, textbook attention (`attn_backend="manual"`) and torch's
  default AdamW (neither fused nor foreach on a CPU: a loop over the parameters);
- CUDA (nanoGPT's GPU recipe): bf16 autocast, torch.compile, SDPA with is_causal (flash), fused AdamW.
"""
from __future__ import annotations

import math
from pathlib import Path
from typing import Callable

import numpy as np
import tiktoken
import torch

from model import GPT
from runtime.loss_path import LMLoss
from runtime.precision import autocast
from training.config.sections import TrainSection
from training.optim import param_groups

_DEFAULTS = TrainSection()  # train.py's defaults: the baseline trains with the same hyperparameters
LR, WEIGHT_DECAY, BETAS, GRAD_CLIP = (_DEFAULTS.lr, _DEFAULTS.weight_decay, (_DEFAULTS.beta1, _DEFAULTS.beta2),
                                      _DEFAULTS.grad_clip)

FULL_LOGITS = LMLoss()  # nanoGPT's loss: the full logits, then F.cross_entropy


def nanogpt_lr(it: int, *, lr: float, min_lr: float, warmup_iters: int, lr_decay_iters: int) -> float:
    """nanoGPT's get_lr (its train.py): a linear warm-up that first reaches `lr` at step warmup_iters
    (lr * (it + 1) / (warmup_iters + 1)), then cosine to min_lr at lr_decay_iters, min_lr after. Ours
    (training/timing/schedule.py's lr_at) reaches `lr` one step sooner; equal from warmup_iters on.
    tests/test_against_nanogpt.py checks this against nanoGPT's own function."""
    if it < warmup_iters:
        return lr * (it + 1) / (warmup_iters + 1)
    if it > lr_decay_iters:
        return min_lr
    ratio = (it - warmup_iters) / (lr_decay_iters - warmup_iters)
    return min_lr + 0.5 * (1.0 + math.cos(math.pi * ratio)) * (lr - min_lr)


def nanogpt_setup(model: GPT, device: torch.device):
    """(module to call, optimizer, dtype) for nanoGPT's recipe on this device; `model` must have been
    built with attn_backend "manual" on a CPU and "sdpa" on CUDA."""
    if device.type == "cuda":
        optimizer = torch.optim.AdamW(param_groups(model, WEIGHT_DECAY), lr=LR, betas=BETAS, fused=True)
        return torch.compile(model), optimizer, torch.bfloat16
    optimizer = torch.optim.AdamW(param_groups(model, WEIGHT_DECAY), lr=LR, betas=BETAS, foreach=False)
    return model, optimizer, torch.float32


def nanogpt_step(model, optimizer, x: torch.Tensor, y: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    with autocast(x.device, dtype):
        loss = FULL_LOGITS(model, x, y)  # full logits, then F.cross_entropy
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), GRAD_CLIP)
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return loss.detach()


def nanogpt_prepare(text_path: Path, out_dir: Path) -> int:
    """nanoGPT's data/shakespeare/prepare.py: first 90% of the characters -> train, the rest -> val,
    each encoded with tiktoken's gpt2 in one call and written as uint16. Returns the token count."""
    data = text_path.read_text(encoding="utf-8")
    n = len(data)
    enc = tiktoken.get_encoding("gpt2")
    train_ids = enc.encode_ordinary(data[: int(n * 0.9)])
    val_ids = enc.encode_ordinary(data[int(n * 0.9):])
    np.array(train_ids, dtype=np.uint16).tofile(out_dir / "train.bin")
    np.array(val_ids, dtype=np.uint16).tofile(out_dir / "val.bin")
    return len(train_ids) + len(val_ids)


def uncached_decode(model: GPT, prompt: list[int], new: int) -> Callable[[], list[int]]:
    """nanoGPT's generate, greedy: the whole (cropped) sequence through the model for every new token."""
    def run() -> list[int]:
        idx = torch.tensor([prompt], device=model.transformer.wte.weight.device)
        with torch.inference_mode():
            for _ in range(new):
                logits = model(idx[:, -model.config.block_size:])[:, -1]
                idx = torch.cat([idx, logits.argmax(-1, keepdim=True)], dim=1)
        return idx[0, len(prompt):].tolist()
    return run
