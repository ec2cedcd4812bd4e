"""Seeding, and all RNG states (python, numpy, torch, cuda) in a form torch.load(weights_only=True) accepts."""
from __future__ import annotations

import random
from typing import Any

import numpy as np
import torch


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)  # seeds every CUDA device too


def get_rng_state() -> dict[str, Any]:
    version, internal, gauss = random.getstate()
    np_state = np.random.get_state(legacy=False)  # {"bit_generator", "state": {"key": ndarray, "pos"}, ...}
    np_state = {**np_state, "state": {**np_state["state"], "key": np_state["state"]["key"].tolist()}}
    return {
        "python": [version, list(internal), gauss],
        "numpy": np_state,
        "torch": torch.get_rng_state(),
        # this process's GPU only: get_rng_state_all() would create a context on every visible GPU
        "cuda": torch.cuda.get_rng_state() if torch.cuda.is_available() and torch.cuda.is_initialized() else None,
    }


def set_rng_state(state: dict[str, Any]) -> None:
    version, internal, gauss = state["python"]
    random.setstate((version, tuple(internal), gauss))
    np_state = state["numpy"]
    np_state = {**np_state, "state": {**np_state["state"], "key": np.asarray(np_state["state"]["key"], dtype=np.uint32)}}
    np.random.set_state(np_state)
    torch.set_rng_state(state["torch"].cpu())
    cuda = state.get("cuda")
    if isinstance(cuda, torch.Tensor) and torch.cuda.is_available():
        torch.cuda.set_rng_state(cuda.cpu())  # the current device (train.py sets it per rank)
