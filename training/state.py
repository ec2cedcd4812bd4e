"""The run's stateful parts that are not a model or a loader: its counters (TrainState), its optimizers and its
GradScaler, and every rank's RNG streams (RNGState: python, numpy, torch, cuda, in a form
torch.load(weights_only=True) accepts; and the seeding), each with the state_dict / load_state_dict pair the
Checkpointer calls."""
from __future__ import annotations

import math
import random
import secrets
import string
from dataclasses import asdict, dataclass, field, fields
from typing import Any

import numpy as np
import torch


def new_run_id() -> str:
    """8 lowercase alphanumerics, like wandb's own ids. Uses `secrets`, so no training RNG is consumed."""
    alphabet = string.ascii_lowercase + string.digits
    return "".join(secrets.choice(alphabet) for _ in range(8))


@dataclass
class TrainState:
    """The run's counters. What the run decided at start-up is its plan (training/plan.py), saved apart."""
    iter: int = 0  # optimizer steps done
    best_val_loss: float = math.inf
    tokens_seen: int = 0
    elapsed_s: float = 0.0  # wall seconds of the run so far (set-up, steps, evals, checkpoints), across resumes
    run_id: str = field(default_factory=new_run_id)  # one id per run, kept across resumes (also wandb's)

    def state_dict(self) -> dict[str, Any]:
        return asdict(self)

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Every field must be there with its type; an int where a float is expected is fine."""
        for f in fields(self):
            value = state[f.name]
            kind = {"int": int, "float": (int, float), "str": str}[f.type]
            if isinstance(value, bool) or not isinstance(value, kind):
                raise TypeError(f"{f.name} should be {f.type}, got {value!r}")
            setattr(self, f.name, float(value) if f.type == "float" else value)


class OptimizerState:
    """The run's optimizers (one or more), as one stateful part."""

    def __init__(self, optimizers: list[torch.optim.Optimizer]):
        self.optimizers = optimizers

    def state_dict(self) -> dict[str, Any]:
        return {"optimizers": [opt.state_dict() for opt in self.optimizers]}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        saved = state["optimizers"]
        if len(saved) != len(self.optimizers):
            raise ValueError(f"it holds {len(saved)} optimizer state(s), this run has {len(self.optimizers)}")
        for opt, sd in zip(self.optimizers, saved):
            check_optimizer_state(opt, sd)
            # the checkpoint gives the moments and step counts; the hyperparameters (peak lr, betas,
            # weight decay) stay the config's, which may change on resume
            fresh = [{k: v for k, v in g.items() if k != "params"} for g in opt.param_groups]
            opt.load_state_dict(sd)
            for group, hyper in zip(opt.param_groups, fresh):
                group.update(hyper)


def check_optimizer_state(opt: torch.optim.Optimizer, saved: Any) -> None:
    """A saved optimizer state against the parameters it will update (ValueError naming the first fault): torch's
    load_state_dict matches the groups' sizes only, and a moment of another shape then corrupted the heap in the
    fused step (free(): invalid next size, a segfault), a NaN one poisoned the weights. Each parameter's state
    tensors have its shape (a 0-dim step count aside), are floating point and finite; the state covers every
    parameter or none (a fresh optimizer's). A sharded (DTensor) state is DCP's, which checked its shapes."""
    groups, states = saved.get("param_groups"), saved.get("state")
    if not isinstance(groups, list) or not isinstance(states, dict) or len(groups) != len(opt.param_groups):
        raise ValueError("it is not an optimizer state of this run's parameter groups")
    covered = []
    for group, own in zip(groups, opt.param_groups):
        ids = group.get("params") if isinstance(group, dict) else None
        if not isinstance(ids, list) or len(ids) != len(own["params"]):
            raise ValueError("a parameter group of another size than this run's")
        for i, param in zip(ids, own["params"]):
            state = states.get(i)
            covered.append(state is not None)
            for key, value in (state or {}).items():
                if type(value) is not torch.Tensor or type(param.data) is not torch.Tensor:
                    continue
                if value.dim() and tuple(value.shape) != tuple(param.shape):
                    raise ValueError(f"{key} of parameter {i} is {tuple(value.shape)}, its parameter {tuple(param.shape)}")
                if value.dim() and not value.is_floating_point():
                    raise ValueError(f"{key} of parameter {i} is {str(value.dtype).removeprefix('torch.')}, not floating point")
                if value.is_floating_point() and not torch.isfinite(value).all():
                    raise ValueError(f"{key} of parameter {i} holds NaN or inf")
    if any(covered) and not all(covered):
        raise ValueError(f"it holds the state of {sum(covered)} of the {len(covered)} parameters")


class ScalerState:
    """The GradScaler. A disabled scaler saves {}; restoring {} into an enabled one (a bf16 run resumed
    in fp16) keeps the fresh scale."""

    def __init__(self, scaler: torch.amp.GradScaler):
        self.scaler = scaler

    def state_dict(self) -> dict[str, Any]:
        return self.scaler.state_dict()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if state and self.scaler.is_enabled():
            self.scaler.load_state_dict(state)


# ---------------------------------------------------------------------------------- RNG streams

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
