"""The learning-rate schedule: linear warmup, then cosine decay to min_lr."""
from __future__ import annotations

import math


def lr_at(step: int, *, lr: float, min_lr: float, warmup_iters: int, max_iters: int) -> float:
    """Learning rate for optimizer step `step` (0-based).

    - warmup, step < warmup_iters: lr * (step + 1) / warmup_iters, so step warmup_iters - 1 runs at lr;
    - then cosine from lr at step warmup_iters down to min_lr at step max_iters (one past the last
      step that runs): min_lr + (lr - min_lr) * (1 + cos(pi * progress)) / 2,
      progress = (step - warmup_iters) / (max_iters - warmup_iters);
    - min_lr from max_iters on.
    """
    if step < warmup_iters:
        return lr * (step + 1) / warmup_iters
    if step >= max_iters:
        return min_lr
    progress = (step - warmup_iters) / (max_iters - warmup_iters)
    return min_lr + (lr - min_lr) * 0.5 * (1.0 + math.cos(math.pi * progress))
