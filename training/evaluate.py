"""Evaluation on fixed batches: the same windows every eval, so evals are comparable across a run."""
from __future__ import annotations

import math
from typing import Callable

import torch
import torch.nn as nn


@torch.no_grad()
def evaluate(model: nn.Module, loaders: dict, eval_iters: int, autocast_ctx: Callable) -> dict[str, float]:
    """Mean loss over batches 0..eval_iters-1 of each loader (a loader with its own eval seed), in eval
    mode (no dropout, so the training RNG is untouched). One host sync per split."""
    was_training = model.training
    model.eval()
    out = {}
    for split, loader in loaders.items():
        losses = []
        for k in range(eval_iters):
            x, y = loader.get_batch(k, 0)
            with autocast_ctx():
                _, loss = model(x, y, return_logits=False)  # fused head + loss, no (B, T, V) logits
            losses.append(loss.float())
        out[split] = torch.stack(losses).mean().item()
    model.train(was_training)
    return out


def bits_per_byte(loss_nats_per_token: float, bytes_per_token: float) -> float:
    """loss x tokens / bytes / ln 2: bits per UTF-8 byte, comparable across tokenizers."""
    return loss_nats_per_token / math.log(2) / bytes_per_token
