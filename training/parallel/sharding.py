"""Fully sharded data parallelism (train.parallel=fsdp), from outside the model: torch's FSDP2
(`fully_shard`) on each block and then the root, the precision policy of its all-gathers and reductions,
optional activation checkpointing per block, Muon on sharded matrices, and the model's and optimizers'
state as name-keyed (resharding) state dicts for the sharded checkpoint.

Each rank keeps 1/world of every parameter, gradient and optimizer moment; a block's parameters are
gathered whole just before its forward (and again before its backward) and freed after, and its
gradients are reduce-scattered, so the memory per rank falls with the number of ranks (see
`state_bytes`). The model object stays the same module: its parameters become DTensors.
"""
from __future__ import annotations

import functools
from typing import Any

import torch
import torch.nn as nn
import torch.utils.checkpoint
from torch.distributed.checkpoint.state_dict import (
    get_model_state_dict, get_optimizer_state_dict, set_model_state_dict, set_optimizer_state_dict,
)
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
from torch.distributed.tensor import DTensor, Shard

from model import GPT

from .distributed import Parallel
from ..optim import Muon


def apply_fsdp(model: GPT, par: Parallel, device: torch.device, *, param_dtype: torch.dtype | None,
               activation_checkpointing: bool) -> GPT:
    """Shard `model` in place over the ranks: each block is one FSDP unit (gathered for its own forward
    and backward only), then the root takes what is left (embeddings, final norm, head). Parameters are
    all-gathered in `param_dtype` (None: as stored, fp32) and gradients reduced in fp32. With one rank
    nothing is sharded (activation checkpointing still applies)."""
    if activation_checkpointing:
        checkpoint_blocks(model)
    if not par.enabled:
        return model
    mesh = par.mesh(device)
    policy = MixedPrecisionPolicy(param_dtype=param_dtype, reduce_dtype=torch.float32)
    for block in model.transformer.h:
        fully_shard(block, mesh=mesh, mp_policy=policy)
    fully_shard(model, mesh=mesh, mp_policy=policy)
    return model


def checkpoint_blocks(model: GPT) -> None:
    """Activation checkpointing per block: a block keeps only its input for the backward, which
    recomputes its forward (with the same dropout masks: the RNG state is saved with the input). About
    a third more compute for activations of one block instead of all of them. Each block's forward
    becomes torch.utils.checkpoint's: the parameter names stay (a wrapper module would add a prefix to
    every saved name), and torch.compile traces it (torch.distributed._composable's hook-based checkpoint
    recomputes eagerly what the compiled forward saved differently: CheckpointError on the first backward)."""
    for block in model.transformer.h:
        block.forward = functools.partial(torch.utils.checkpoint.checkpoint, type(block).forward.__get__(block),
                                          use_reentrant=False)


# ------------------------------------------------------------------------------------------ Muon

class ShardedMuon(Muon):
    """Muon (training/optim.py) on FSDP's sharded matrices. The Newton-Schulz iteration orthogonalises
    the whole matrix, so a shard of it is not enough: each update is gathered whole (one all-gather),
    orthogonalised as on one device, and each rank keeps its own rows. The momentum stays sharded. (Run
    on DTensors directly, the iteration's matmuls would reduce partial products across ranks, which is
    less exact than one device's matmul.)"""

    def orthogonalize(self, updates: list[torch.Tensor], group: dict, pieces: int = 1) -> list[torch.Tensor]:
        if not isinstance(updates[0], DTensor):
            return super().orthogonalize(updates, group, pieces)
        whole = super().orthogonalize([u.full_tensor() for u in updates], group, pieces)  # the same on every rank
        return [DTensor.from_local(_local_rows(w, u), u.device_mesh, u.placements, shape=u.shape, stride=u.stride())
                for w, u in zip(whole, updates)]


def _local_rows(whole: torch.Tensor, like: DTensor) -> torch.Tensor:
    """This rank's piece of `whole`, cut as `like` is sharded (FSDP2: dim 0, torch.chunk's split)."""
    out = whole
    for mesh_dim, placement in enumerate(like.placements):
        if isinstance(placement, Shard):
            n = like.device_mesh.size(mesh_dim)
            coord = like.device_mesh.get_coordinate()[mesh_dim]
            chunks = torch.chunk(out, n, dim=placement.dim)
            out = chunks[coord] if coord < len(chunks) else out.narrow(placement.dim, 0, 0)
    return out.to(like.dtype).contiguous()


# ------------------------------------------------------------------------------------------ state

class ShardedModelState:
    """The model as one stateful part of a sharded checkpoint: keyed by parameter name, each rank with
    its shards (plain tensors on one rank), so DCP can load it into any number of ranks."""

    def __init__(self, model: nn.Module):
        self.model = model

    def state_dict(self) -> dict[str, Any]:
        return get_model_state_dict(self.model)

    def load_state_dict(self, state: dict[str, Any]) -> None:
        set_model_state_dict(self.model, state)


class ShardedOptimizerState:
    """The optimizers (one or more) as one stateful part of a sharded checkpoint: their state keyed by
    parameter name (torch.distributed.checkpoint.state_dict), not by position, so it reshards. As with
    one file, the checkpoint gives the moments and step counts, and the hyperparameters (peak lr, betas, weight decay) stay the config's."""

    def __init__(self, model: nn.Module, optimizers: list[torch.optim.Optimizer]):
        self.model, self.optimizers = model, optimizers

    def state_dict(self) -> dict[str, Any]:
        # torch gives optimizers without state a step at lr 0 to create it (the template a sharded load fills
        # in), and counts it: AdamW's step becomes 1, so a state taken before the first step (the time
        # budget's snapshot) changed the run. Counted back, zero moments at step 0 are a fresh optimizer's.
        fresh = not any(opt.state for opt in self.optimizers)
        state = get_optimizer_state_dict(self.model, self.optimizers)
        if fresh:
            for entry in [*(s for opt in self.optimizers for s in opt.state.values()), *state["state"].values()]:
                if isinstance(entry.get("step"), torch.Tensor):
                    entry["step"].zero_()
                elif "step" in entry:
                    entry["step"] = 0
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        fresh = [[{k: v for k, v in g.items() if k != "params"} for g in opt.param_groups] for opt in self.optimizers]
        set_optimizer_state_dict(self.model, self.optimizers, state)
        for opt, hypers in zip(self.optimizers, fresh):
            for group, hyper in zip(opt.param_groups, hypers):
                group.update(hyper)
