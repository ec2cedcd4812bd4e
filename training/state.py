"""The run's stateful parts that are not a model, a loader or RNG streams: its counters (TrainState), its
optimizers and its GradScaler, each with the state_dict / load_state_dict pair the Checkpointer calls."""
from __future__ import annotations

import math
import secrets
import string
from dataclasses import asdict, dataclass, field, fields
from typing import Any

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
            # the checkpoint gives the moments and step counts; the hyperparameters (peak lr, betas,
            # weight decay) stay the config's, which may change on resume
            fresh = [{k: v for k, v in g.items() if k != "params"} for g in opt.param_groups]
            opt.load_state_dict(sd)
            for group, hyper in zip(opt.param_groups, fresh):
                group.update(hyper)


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
