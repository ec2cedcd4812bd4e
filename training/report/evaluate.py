"""Evaluation on fixed batches: the same windows every eval, so evals are comparable across a run.

Each takes the run's loss (runtime/loss_path.py's LMLoss: `loss(model, idx, targets)`, the mean over the
targets != -1), and weighs each batch by its counted targets: the result is the mean over every counted
target, whatever each batch holds (with every target counted, as in pretraining, the plain mean of the
batches' means, to float rounding).
"""
from __future__ import annotations

import math
from typing import Callable

import torch
import torch.nn as nn


def _losses(model: nn.Module, loss_fn: Callable, batches, autocast_ctx: Callable) -> tuple[torch.Tensor, torch.Tensor]:
    """(the fp32 loss of each (x, y) batch, its counted targets), in eval mode (no dropout, so the training
    RNG is untouched), left on the device: the caller reads them back at once."""
    was_training = model.training
    model.eval()
    losses, counts = [], []
    for x, y in batches:
        with autocast_ctx():
            loss = loss_fn(model, x, y)  # fused head + loss, no (B, T, V) logits
        losses.append(loss.float())
        counts.append((y != -1).sum())
    model.train(was_training)
    return torch.stack(losses), torch.stack(counts)


def _token_mean(losses: torch.Tensor, counts: torch.Tensor) -> torch.Tensor:
    """The batches' means weighted by their counted targets: the mean over every counted target (0 for none)."""
    c = counts.to(losses.device, torch.float64 if losses.device.type == "cpu" else torch.float32)
    return (losses.to(c.dtype) * c).sum() / c.sum().clamp(min=1)


@torch.no_grad()
def evaluate(model: nn.Module, loss_fn: Callable, loaders: dict, eval_iters: int, autocast_ctx: Callable
             ) -> dict[str, float]:
    """Mean loss over the counted targets of batches 0..eval_iters-1 of each loader (a loader with its own
    eval seed), in eval mode. One host sync per split."""
    return {split: _token_mean(*_losses(model, loss_fn, (loader.get_batch(k, 0) for k in range(eval_iters)),
                                        autocast_ctx)).item() for split, loader in loaders.items()}


@torch.no_grad()
def evaluate_full(model: nn.Module, loss_fn: Callable, loader, autocast_ctx: Callable) -> float:
    """Mean loss over every window of the loader's split, read in order (BatchLoader.sequential_batch):
    the split's exact loss, where `evaluate`'s eval_iters random batches estimate it (on tiny shakespeare,
    20 batches of 8 x 128 tokens read 1.63-1.67 for one model whose whole val split gives 1.643). One host
    sync."""
    n, size = loader.num_windows(), loader.batch_size
    return _token_mean(*_losses(model, loss_fn, (loader.sequential_batch(k) for k in range(math.ceil(n / size))),
                                autocast_ctx)).item()


def bits_per_byte(loss_nats_per_token: float, bytes_per_token: float) -> float:
    """loss x tokens / bytes / ln 2: bits per UTF-8 byte, comparable across tokenizers."""
    return loss_nats_per_token / math.log(2) / bytes_per_token
