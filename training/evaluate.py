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


@torch.no_grad()
def evaluate_full(model: nn.Module, loader, autocast_ctx: Callable) -> float:
    """Mean loss over every window of the loader's split, read in order (BatchLoader.sequential_batch):
    the split's exact loss, where `evaluate`'s eval_iters random batches estimate it (on tiny shakespeare,
    20 batches of 8 x 128 tokens read 1.63-1.67 for one model whose whole val split gives 1.643). Every
    window has block_size targets, so the mean of the batches weighted by their rows is the token mean."""
    was_training = model.training
    model.eval()
    total, rows = torch.zeros((), dtype=torch.float64), 0
    for k in range(math.ceil(loader.num_windows() / loader.batch_size)):
        x, y = loader.sequential_batch(k)
        with autocast_ctx():
            _, loss = model(x, y, return_logits=False)
        total += loss.detach().double().cpu() * x.shape[0]
        rows += x.shape[0]
    model.train(was_training)
    return (total / rows).item()


def bits_per_byte(loss_nats_per_token: float, bytes_per_token: float) -> float:
    """loss x tokens / bytes / ln 2: bits per UTF-8 byte, comparable across tokenizers."""
    return loss_nats_per_token / math.log(2) / bytes_per_token
