"""Checkpointing a run: every stateful part is registered once, by name, and the same mapping is walked
to save and to restore, so the two always cover the same keys (torchtitan's Checkpointer).

    states = {"model": raw_model, "optimizer": OptimizerState(optimizers), "scaler": ScalerState(scaler),
              "loader": train_loader, "train": train_state, "rng": RNGState(dist)}
    ckpt = Checkpointer(states, static={"model_config": ..., "config": ..., "tokenizer": ...})
    ckpt.save(path)         # every rank calls it (some states gather across ranks); rank 0 writes
    ckpt.restore(payload)   # every rank; each state gets back exactly what it saved

Restoring goes in the mapping's order, so the RNG streams come last and nothing consumes them after.
The `static` entries are written with every checkpoint and read only to build the run (the model's
architecture, the config, the tokenizer): the file format is in model/checkpoint.py.
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Mapping, Protocol

import torch

from errors import UserError, short_error
from model.checkpoint import save_checkpoint


class Stateful(Protocol):
    def state_dict(self) -> dict[str, Any]: ...

    def load_state_dict(self, state: dict[str, Any]) -> Any: ...


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


class Checkpointer:
    def __init__(self, states: Mapping[str, Stateful], *, static: Mapping[str, Any], is_main: bool = True):
        self.states = dict(states)
        self.static = dict(static)
        self.is_main = is_main
        self.last_saved: Path | None = None  # the latest ckpt.pt written or restored, and its iteration
        self.last_saved_iter: int | None = None

    def save(self, path: str | os.PathLike, iter_num: int | None = None) -> None:
        """Collect every state (on every rank: some gather across ranks), then rank 0 writes `path`."""
        payload = {name: obj.state_dict() for name, obj in self.states.items()}
        if self.is_main:
            try:
                save_checkpoint(path, {**self.static, **payload})
            except OSError as e:  # a full disk, a quota, a read-only mount: the files written before are intact
                kept = (f"the last checkpoint, {self.last_saved}, still holds iter {self.last_saved_iter}"
                        if self.last_saved is not None else "no checkpoint was written yet")
                raise UserError(f"cannot write {path} ({short_error(e)}); {kept}; free some space, then rerun the same "
                                "command to resume") from None
        if iter_num is not None and Path(path).name == "ckpt.pt":
            self.last_saved, self.last_saved_iter = Path(path), iter_num

    def restore(self, ckpt: Mapping[str, Any], where: str | os.PathLike) -> None:
        """Give every registered state its saved entry. A missing or malformed entry is a one-line
        UserError naming it."""
        missing = [name for name in self.states if name not in ckpt]
        if missing:
            raise UserError(f"checkpoint {where} has no {', '.join(map(repr, missing))} entr"
                            f"{'y' if len(missing) == 1 else 'ies'}; it was not written by train.py or is damaged: "
                            "use another checkpoint (e.g. best.pt), or a new --train.out_dir")
        for name, obj in self.states.items():
            try:
                obj.load_state_dict(ckpt[name])
            except UserError:
                raise
            except (KeyError, TypeError, ValueError, IndexError, AttributeError, RuntimeError) as e:
                raise UserError(f"checkpoint {where}: its {name!r} entry is malformed ({short_error(e, 120)}); "
                                "use another checkpoint (e.g. best.pt), or a new --train.out_dir") from None
