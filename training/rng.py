"""Seeding, and all RNG states (python, numpy, torch, cuda) in a form torch.load(weights_only=True)
accepts, gathered from every rank."""
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


class RNGState:
    """Every rank's RNG streams, as one stateful part of the checkpoint.

    state_dict() is collective: each rank's streams are gathered (on the CPU group), so the saved entry
    is {"ranks": [rank 0's, rank 1's, ...]}, and load_state_dict() gives each rank back its own: after
    a resume every rank draws the dropout masks it would have drawn. Resumed on a different number of
    ranks, each rank starts from rank 0's streams reseeded by its rank (not bitwise comparable then).
    """

    def __init__(self, par=None):
        self.par = par  # training.parallel.distributed.Parallel (None: one process)
        self.note = ""

    def state_dict(self) -> dict[str, Any]:
        mine = get_rng_state()
        return {"ranks": self.par.gather(mine) if self.par is not None else [mine]}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        ranks = state["ranks"]
        rank = self.par.rank if self.par is not None else 0
        world = self.par.world_size if self.par is not None else 1
        if len(ranks) == world:
            set_rng_state(ranks[rank])
            return
        set_rng_state(ranks[0])
        if rank:
            torch.manual_seed(int(torch.randint(2**62, ()).item()) + rank)
        self.note = (f"the checkpoint holds the RNG streams of {len(ranks)} rank(s), this run has {world}: "
                     "each rank continues from rank 0's streams reseeded by its rank")
