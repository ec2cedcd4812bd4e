"""A training run as the loop sees it (`Run`, built once by train.py's set_up), and the loop's two units of
work, which the time budget (training/budget.py) times too, so that nothing about ranks or batches can
differ between what is timed and what runs:

    out = step_at(r, i, lr)                       # optimizer step i on this rank's micro-batches
    losses = evaluate_splits(r, iters, full)      # every rank that must take part; rank 0 gets the numbers
"""
from __future__ import annotations

import math
import time
from dataclasses import dataclass
from typing import Any, Callable

import torch

from checkpoint import Checkpointer
from model import GPT

from .builders import Stepper, Trainer
from .config import Config
from .distributed import Parallel
from .evaluate import evaluate, evaluate_full
from .metrics import MetricsLog, Progress
from .plan import RunPlan
from .schedule import apply_lr, lr_at
from .showcase import Showcase
from .signals import StopFlag
from .state import TrainState
from .step import StepOutput
from .wandb_logger import WandbLogger


@dataclass
class RunLog:
    """Where the run reports: the console (say), the progress bar, metrics.jsonl and wandb, and what the
    throughput line is computed from."""
    say: Callable[[str], None]
    progress: Progress
    metrics: MetricsLog
    wandb: WandbLogger
    tokens_per_step: int
    flops_per_token: float


@dataclass
class Run:
    """What the loop needs, built once by set_up."""
    cfg: Config
    par: Parallel
    device: torch.device
    trainer: Trainer  # the model, its step, the batches
    plan: RunPlan  # every start-up decision: the loop reads the schedule from here, never from cfg
    state: TrainState
    checkpointer: Checkpointer
    log: RunLog
    stop: StopFlag
    showcase: Showcase  # samples and attention maps at their intervals (training/showcase.py)
    hellaswag: tuple | None = None  # (tokenizer, items) when eval.hellaswag_interval is set
    clock: tuple[float, float] = (0.0, 0.0)  # (perf_counter at start, elapsed_s of earlier sessions)
    step_s: float = 0.0  # the last step's wall time: how long a signal lets a step run on (signals.py)

    @property
    def model(self) -> GPT:
        return self.trainer.model

    @property
    def step(self) -> Stepper:
        return self.trainer.step

    @step.setter
    def step(self, stepper: Stepper) -> None:  # a test wraps it, to slow some steps down
        self.trainer.step = stepper

    @property
    def amp(self) -> Callable[[], Any]:
        return self.trainer.amp


def lr_of_plan(plan: RunPlan, t, i: int) -> float:
    """The learning rate of step i under the plan's schedule (warmup, cosine to min_lr at max_iters)."""
    return lr_at(i, lr=t.lr, min_lr=t.min_lr, warmup_iters=plan.warmup_iters, max_iters=plan.max_iters)


def step_at(r: Run, i: int, lr: float) -> StepOutput:
    """Optimizer step i at learning rate `lr`: this rank's micro-batches of that step, then one step."""
    apply_lr(r.step.optimizers, lr, r.cfg.train.lr)
    batches = [r.trainer.train_loader.get_batch(i, micro) for micro in range(r.trainer.accum)]
    started = time.perf_counter()
    with r.par.waiting(f"the step's gradient {'reduce-scatter' if r.par.sharded else 'all-reduce'}",
                       grace_s=max(2.0, 3 * r.step_s) if r.step_s else math.inf):  # the first: compiling
        out = r.step(batches)
    r.step_s = time.perf_counter() - started  # the launch: on a GPU the step itself may still run
    return out


def evaluate_splits(r: Run, iters: int, full: bool = False) -> tuple[dict[str, float], float | None] | None:
    """The fixed eval batches of each split (`iters` each), and with `full` the whole val split. Every rank
    that takes part runs the forwards (rank 0; under FSDP every rank, Parallel.evaluates); rank 0 gets
    (losses by split, the whole val split's loss or None), the others None."""
    if not r.par.evaluates:
        return None
    loaders = r.trainer.eval_loaders
    with r.par.waiting("the eval's forwards", patient=True, grace_s=math.inf):  # under FSDP every rank's
        losses = evaluate(r.model, r.step.loss, loaders, iters, r.amp)
        whole = evaluate_full(r.model, r.step.loss, loaders["val"], r.amp) if full else None
    return (losses, whole) if r.par.is_main else None
