"""A training run as the loop sees it (`Run`, built once at set-up), and the loop's two units of
work, which the time budget (training/timing/budget.py) times too, so that nothing about ranks or batches can
differ between what is timed and what runs:

    out = step_at(r, i, lr)                       # optimizer step i on this rank's micro-batches
    losses = evaluate_splits(r, iters, full)      # every rank that must take part; rank 0 gets the numbers
"""
from __future__ import annotations

import math
import time
from dataclasses import dataclass
from typing import Any, Callable, NamedTuple

import torch

from checkpoint import Checkpointer

from .builders import Trainer
from .config.sections import Config
from .parallel.distributed import Parallel
from .report.evaluate import evaluate, evaluate_full
from .report.metrics import MetricsLog, Progress
from .report.window import LossWindow
from .plan import RunPlan
from .timing.schedule import apply_lr, lr_at
from .report.showcase import Showcase
from .parallel.signals import StopFlag
from .state import TrainState
from .step import StepOutput
from .report.wandb_logger import WandbLogger


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


class Clock(NamedTuple):
    """The run's wall time, across sessions: a resumed one starts from the earlier sessions' seconds."""
    started: float  # time.perf_counter() when this session started
    earlier_s: float  # elapsed_s of the sessions before this one

    def elapsed(self) -> float:
        return self.earlier_s + time.perf_counter() - self.started


def resumed_clock_notes(payload: dict[str, Any]) -> list[str]:
    """A checkpoint that recorded no wall time (version 1: format.upgrade gives it elapsed_s 0, and a run that
    saved spent more than 0 s) is resumed with a clock from 0: said in a line, so that the wall time the run
    records from here on (metrics.jsonl's elapsed_s, the model card, a time budget) is read as the time since
    this resume, not the run's."""
    train = payload.get("train") if isinstance(payload, dict) else None
    elapsed = train.get("elapsed_s") if isinstance(train, dict) else None
    if isinstance(elapsed, (int, float)) and not isinstance(elapsed, bool) and elapsed > 0:
        return []
    it = train.get("iter") if isinstance(train, dict) else None
    return [f"the checkpoint did not record the wall time of its {it if isinstance(it, int) else 'earlier'} steps (a "
            "version 1 checkpoint): the run's wall time (metrics.jsonl's elapsed_s, the model card's) counts from "
            "this resume, and is less than the run took"]


class HellaSwag(NamedTuple):
    """HellaSwag's items, loaded once, and the tokenizer that scores them."""
    tok: Any
    items: list


@dataclass
class Run:
    """What the loop needs, built once by set_up."""
    cfg: Config
    par: Parallel
    device: torch.device
    trainer: Trainer  # the model, its step, the batches
    plan: RunPlan  # every start-up decision: the loop reads the schedule from here, never from cfg
    state: TrainState
    window: LossWindow  # the steps since the last logged record (kept in the checkpoint)
    checkpointer: Checkpointer
    log: RunLog
    stop: StopFlag
    showcase: Showcase  # samples and attention maps at their intervals
    hellaswag: HellaSwag | None = None  # when eval.hellaswag_interval is set
    clock: Clock = Clock(0.0, 0.0)
    step_s: float = 0.0  # the last step's wall time: how long a signal lets a step run on


def lr_of_plan(plan: RunPlan, t, i: int) -> float:
    """The learning rate of step i under the plan's schedule (warmup, cosine to min_lr at max_iters)."""
    return lr_at(i, lr=t.lr, min_lr=t.min_lr, warmup_iters=plan.warmup_iters, max_iters=plan.max_iters)


def step_at(r: Run, i: int, lr: float) -> StepOutput:
    """Optimizer step i at learning rate `lr`: this rank's micro-batches of that step, then one step."""
    apply_lr(r.trainer.step.optimizers, lr, r.cfg.train.lr)
    batches = [r.trainer.train_loader.get_batch(i, micro) for micro in range(r.trainer.accum)]
    started = time.perf_counter()
    with r.par.waiting(f"the step's gradient {'reduce-scatter' if r.par.sharded else 'all-reduce'}",
                       grace_s=max(2.0, 3 * r.step_s) if r.step_s else math.inf):  # the first: compiling
        out = r.trainer.step(batches)
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
        loss = r.trainer.step.eval_loss  # the run's loss; replayed as CUDA graphs where the step is
        losses = evaluate(r.trainer.model, loss, loaders, iters, r.trainer.amp)
        whole = evaluate_full(r.trainer.model, loss, loaders["val"], r.trainer.amp) if full else None
    return (losses, whole) if r.par.is_main else None
