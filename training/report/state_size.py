"""How much of the model and its training state this rank holds: what train.py prints at start-up and
bench.py's FSDP rows report. Sharded (FSDP) tensors are DTensors, whose local shard is `.to_local()`;
they are recognised by that method, so that this module (imported by every run) does not import
torch.distributed.tensor (~1 s)."""
from __future__ import annotations

import torch
import torch.nn as nn

from ..optim import Muon


def _local(t: torch.Tensor) -> torch.Tensor:
    return t.to_local() if hasattr(t, "to_local") else t


def shard_counts(model: nn.Module) -> tuple[int, int]:
    """(parameters held on this rank, parameters of the whole model); tied weights count once."""
    local = whole = 0
    for p in model.parameters():
        whole += p.numel()
        local += _local(p).numel()
    return local, whole


def state_bytes(model: nn.Module, optimizers: list[torch.optim.Optimizer]) -> int:
    """Bytes of this rank's parameters, gradients (one per parameter, same dtype) and optimizer state
    (every tensor of every optimizer's state, once it exists; before the first step, AdamW's two
    moments and Muon's one momentum are counted as they will be)."""
    total = 0
    for p in model.parameters():
        local = _local(p)
        total += 2 * local.numel() * local.element_size()
    for opt in optimizers:
        moments = 1 if isinstance(opt, Muon) else 2
        for group in opt.param_groups:
            for p in group["params"]:
                local = _local(p)
                state = opt.state.get(p, {})
                held = [_local(t) for t in state.values()
                        if isinstance(t, torch.Tensor) and t.dim()]
                total += sum(t.numel() * t.element_size() for t in held) if held else moments * local.numel() * 4
    return total
