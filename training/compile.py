"""Optional torch.compile, applied from outside the model. The caller keeps the plain module for
saving and evaluation, so no `_orig_mod.` prefix reaches a checkpoint."""
from __future__ import annotations

import torch
import torch.nn as nn


def apply_compile(model: nn.Module, enabled: bool) -> nn.Module:
    return torch.compile(model) if enabled else model
