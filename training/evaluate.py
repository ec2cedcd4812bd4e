"""Evaluation on fixed batches: the same windows every eval, so evals are comparable across a run."""
from __future__ import annotations

import math
from typing import Callable

import torch
import torch.nn as nn


def _losses(model: nn.Module, batches, autocast_ctx: Callable) -> list[torch.Tensor]:
    """The fp32 loss of each (x, y) batch, in eval mode (no dropout, so the training RNG is untouched),
    left on the device: the caller reads them back at once."""
    was_training = model.training
    model.eval()
    losses = []
    for x, y in batches:
        with autocast_ctx():
            _, loss = model(x, y, return_logits=False)  # fused head + loss, no (B, T, V) logits
        losses.append(loss.float())
    model.train(was_training)
    return losses


@torch.no_grad()
def evaluate(model: nn.Module, loaders: dict, eval_iters: int, autocast_ctx: Callable) -> dict[str, float]:
    """Mean loss over batches 0..eval_iters-1 of each loader (a loader with its own eval seed), in eval
    mode. One host sync per split."""
    return {split: torch.stack(_losses(model, (loader.get_batch(k, 0) for k in range(eval_iters)), autocast_ctx))
            .mean().item() for split, loader in loaders.items()}


@torch.no_grad()
def evaluate_full(model: nn.Module, loader, autocast_ctx: Callable) -> float:
    """Mean loss over every window of the loader's split, read in order (BatchLoader.sequential_batch):
    the split's exact loss, where `evaluate`'s eval_iters random batches estimate it (on tiny shakespeare,
    20 batches of 8 x 128 tokens read 1.63-1.67 for one model whose whole val split gives 1.643). Every
    window has block_size targets, so the mean of the batches weighted by their rows is the token mean.
    One host sync."""
    n, size = loader.num_windows(), loader.batch_size
    rows = torch.tensor([min(size, n - k * size) for k in range(math.ceil(n / size))], dtype=torch.float64)
    losses = _losses(model, (loader.sequential_batch(k) for k in range(len(rows))), autocast_ctx)
    return ((torch.stack(losses).cpu().double() * rows).sum() / rows.sum()).item()


def bits_per_byte(loss_nats_per_token: float, bytes_per_token: float) -> float:
    """loss x tokens / bytes / ln 2: bits per UTF-8 byte, comparable across tokenizers."""
    return loss_nats_per_token / math.log(2) / bytes_per_token
