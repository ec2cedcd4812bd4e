"""The optimizers: AdamW in two parameter groups (weight decay on matrices and embeddings, none on
biases and norms). `make_optimizers` returns a list, so a recipe may give different parameters to
different optimizers; the training step, the schedule and the checkpoint handle any number of them."""
from __future__ import annotations

import torch
import torch.nn as nn


def param_groups(model: nn.Module, weight_decay: float) -> list[dict]:
    """Every parameter with 2+ dims (Linear weights, embeddings) decays; 1-dim ones (biases, LayerNorm) do not.
    Tied parameters appear once (named_parameters de-duplicates)."""
    params = [p for p in model.parameters() if p.requires_grad]
    decay = [p for p in params if p.dim() >= 2]
    no_decay = [p for p in params if p.dim() < 2]
    return [{"params": decay, "weight_decay": weight_decay}, {"params": no_decay, "weight_decay": 0.0}]


def make_optimizer(model: nn.Module, *, lr: float, weight_decay: float, betas: tuple[float, float],
                   device_type: str) -> torch.optim.AdamW:
    """The fused kernel on CUDA (one launch for all parameters) and on CPU (measured here: 3.5 ms per step
    against 14.3 ms for foreach on the 4-layer, 50k-vocab model); the foreach path elsewhere (e.g. MPS)."""
    fused = device_type in ("cuda", "cpu")
    return torch.optim.AdamW(param_groups(model, weight_decay), lr=lr, betas=betas, fused=fused,
                             foreach=None if fused else True)


def make_optimizers(model: nn.Module, *, lr: float, weight_decay: float, betas: tuple[float, float],
                    device_type: str) -> list[torch.optim.Optimizer]:
    """The optimizers of a training run. Each param group records its peak learning rate as
    "initial_lr"; the schedule scales every group by the same factor (training/schedule.py)."""
    optimizers = [make_optimizer(model, lr=lr, weight_decay=weight_decay, betas=betas, device_type=device_type)]
    for opt in optimizers:
        for group in opt.param_groups:
            group.setdefault("initial_lr", group["lr"])
    return optimizers
