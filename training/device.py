"""Which device to train on."""
from __future__ import annotations

import torch

from errors import UserError


def resolve_device(name: str, local_rank: int = 0) -> torch.device:
    """"auto": cuda (this rank's GPU) > mps > cpu. An explicit device that is not there is a UserError."""
    if name == "auto":
        if torch.cuda.is_available():
            return torch.device("cuda", local_rank % torch.cuda.device_count())
        if getattr(torch.backends, "mps", None) is not None and torch.backends.mps.is_available():
            return torch.device("mps")
        return torch.device("cpu")
    dev = torch.device(name)
    if dev.type == "cuda":
        if not torch.cuda.is_available():
            raise UserError(f"train.device={name} but CUDA is not available here; use --train.device=cpu or auto")
        if dev.index is None:
            dev = torch.device("cuda", local_rank % torch.cuda.device_count())
        elif dev.index >= torch.cuda.device_count():
            raise UserError(f"train.device={name} but only {torch.cuda.device_count()} GPU(s) exist; pick cuda:0..")
    if dev.type == "mps" and not (getattr(torch.backends, "mps", None) and torch.backends.mps.is_available()):
        raise UserError(f"train.device={name} but MPS is not available here; use --train.device=cpu or auto")
    return dev
