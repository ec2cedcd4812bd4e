"""One optimizer step: the function train.py, the benchmark and the tests all call.

    out = train_step(model, loss, optimizers, scaler, batches, amp=lambda: autocast(device, dtype), grad_clip=1.0)
    out.loss, out.grad_norm     # device tensors: reading them (.item()) is the caller's host sync

`batches` holds this rank's micro-batches of the step, [(x, y), ...], targets y = -1 where no loss is
taken; `loss` is the run's LMLoss (runtime/loss_path.py). Under DDP gradients are all-reduced on the last
micro-batch only (no_sync before it); under FSDP each micro-batch's gradients are reduce-scattered as
they are made (so no rank ever holds a whole gradient), and clip_grad_norm_ takes the norm over every
rank's shards.

The gradient is that of the mean loss over every counted target of the step, on every rank: micro-batches
(and ranks) that hold more counted targets weigh more. Each micro-batch's mean is divided by
total / (its count x ranks), total the step's count over the ranks (one all-reduce of one integer a step,
on the device: no host sync), and DDP and FSDP average the ranks' gradients. With every target counted
(pretraining) the divisor is the number of micro-batches exactly, as it was before masks existed, so
those runs are bitwise unchanged.
"""
from __future__ import annotations

import math
from contextlib import nullcontext
from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable, ContextManager, Sequence

import torch
import torch.nn as nn

if TYPE_CHECKING:
    from .parallel.distributed import Parallel


@dataclass
class StepOutput:
    loss: torch.Tensor  # mean training loss of the step (0-dim, on the device)
    grad_norm: torch.Tensor  # global gradient norm before clipping (inf/nan when fp16 overflowed)


def train_step(model: nn.Module, loss_fn: Callable[[nn.Module, torch.Tensor, torch.Tensor], torch.Tensor],
               optimizers: Sequence[torch.optim.Optimizer], scaler: torch.amp.GradScaler,
               batches: Sequence[tuple[torch.Tensor, torch.Tensor]], *, amp: Callable[[], ContextManager],
               grad_clip: float, par: Parallel | None = None) -> StepOutput:
    """Micro-steps (autocast forward with the fused LM-head loss, scaled backward), then unscale, clip,
    step every optimizer, update the scaler, zero the gradients. No host sync anywhere in here. `par`:
    the ranks the step's counted targets are summed over (None: this process alone)."""
    n = len(batches)
    counts = torch.stack([(y != -1).sum() for _, y in batches])  # (n,) counted targets of each micro-batch
    total = counts.sum()
    world = 1
    if par is not None and par.enabled:
        total, world = par.step_sum_(total), par.world_size
    # a micro-batch with no counted target has mean 0 and divisor inf: it adds 0 to the loss and the gradients.
    # In fp64 (fp32 on MPS, which has none), then cast to the loss's dtype: exact where it is a whole number
    exact = torch.float32 if total.device.type == "mps" else torch.float64
    divisors = total.clamp(min=1).to(exact) / (counts * world).to(exact)
    loss_sum = torch.zeros((), device=batches[0][0].device)
    for i, (x, y) in enumerate(batches):
        # DDP all-reduces in backward; skipping that on all but the last micro-step sums locally first
        sync = model.no_sync() if hasattr(model, "no_sync") and i < n - 1 else nullcontext()
        with sync:
            with amp():
                loss = loss_fn(model, x, y)  # fused head + loss: no (B, T, V) logits
            loss = loss / divisors[i].to(loss.dtype)
            scaler.scale(loss).backward()
        loss_sum += loss.detach()
    for opt in optimizers:
        scaler.unscale_(opt)  # clip the true gradients, not the scaled ones
    grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), grad_clip if grad_clip > 0 else math.inf)
    # FSDP: a DTensor, the norm over every rank's shards, replicated; a plain tensor for the log. (Duck-typed:
    # importing torch.distributed.tensor costs ~1 s of every start-up.)
    if hasattr(grad_norm, "full_tensor"):
        grad_norm = grad_norm.full_tensor()
    for opt in optimizers:
        scaler.step(opt)  # with fp16, skipped when the gradients overflowed
    scaler.update()
    for opt in optimizers:
        opt.zero_grad(set_to_none=True)
    return StepOutput(loss_sum, grad_norm)


def forward_backward_probe(model: nn.Module, loss_fn: Callable[[nn.Module, torch.Tensor, torch.Tensor], torch.Tensor],
                           batch: tuple[torch.Tensor, torch.Tensor],
                           amp: Callable[[torch.dtype], ContextManager]) -> Callable[[torch.dtype], None]:
    """run(dtype): one forward and backward pass of `model` on `batch` under amp(dtype), as train_step
    runs them, for timing (runtime.precision.training_dtype). It leaves the run as it was: dropout's RNG
    streams are restored (fork_rng) and the gradients dropped; no optimizer steps."""
    x, y = batch
    devices = [x.device] if x.device.type == "cuda" else []

    def run(dtype: torch.dtype) -> None:
        with torch.random.fork_rng(devices=devices):
            with amp(dtype):
                loss = loss_fn(model, x, y)
            loss.backward()
        model.zero_grad(set_to_none=True)
    return run
