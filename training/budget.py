"""A time budget: `train.time_budget: 8m` sizes the run to the machine it runs on.

Before the first step, the real training step is timed for a few iterations (WARMUP untimed, then
enough to fill TIMED_S seconds, between MIN_TIMED and MAX_TIMED steps; the median), and one eval batch per
split; then every stateful part is put back exactly
as it was (the Checkpointer's own registry: weights, optimizer moments, scaler, RNG streams), so the
timing leaves no trace in the run. From those figures, the set-up time already spent and an estimate
of the checkpoint writes, `plan` fixes max_iters (at most the config's, which is the plan tuned on a
fast machine) and scales warmup_iters with it; the cosine decay ends at the new max_iters. Evals stay
every eval_interval steps, and the last step evaluates as always.

The decision is printed, and saved in the checkpoint (TrainState.budget_*): a resumed run applies it
again and never re-decides, so an interrupted run resumes bit for bit. Changing train.time_budget on
resume is refused (training/config.py's resume rules), since the plan would no longer be the one saved.
"""
from __future__ import annotations

import copy
import math
import re
import statistics
import time
from dataclasses import dataclass
from typing import Any

import torch

from errors import UserError

from .distributed import broadcast_object
from .evaluate import evaluate
from .schedule import apply_lr, lr_at

WARMUP = 2  # steps run before the timed ones (first-call costs, compile)
# The timed steps fill ~TIMED_S seconds: the median of three 0.2 s steps read 557 ms for a 190 ms step on a
# 2-core EPYC while another process started beside it, and the run it planned stopped at 902 of 1500 steps.
MIN_TIMED, MAX_TIMED, TIMED_S = 3, 20, 2.0
CKPT_BYTES_PER_S = 100e6  # a conservative write speed for the checkpoint estimate
_UNITS = {"": 1.0, "s": 1.0, "sec": 1.0, "m": 60.0, "min": 60.0, "h": 3600.0}


def parse_duration(text: str, name: str = "train.time_budget") -> float:
    """'90s', '8m', '1.5h', '600' (seconds) -> seconds; '0' or '' -> 0 (off). Anything else: UserError."""
    m = re.fullmatch(r"\s*(\d+(?:\.\d*)?)\s*(s|sec|m|min|h)?\s*", str(text).strip().lower() or "0")
    if not m:
        raise UserError(f"{name} must be a duration like 90s, 8m or 1h (0 = off), got {text!r}")
    return float(m.group(1)) * _UNITS[m.group(2) or ""]


@dataclass
class Timing:
    setup_s: float  # wall seconds from train.py's start to the decision (data, dtype choice, the timing itself)
    step_s: float  # one optimizer step (the median of the timed steps)
    eval_s: float  # one eval (eval_iters batches of each split)
    checkpoint_s: float  # one checkpoint write (estimated from its size)
    final_s: float = 0.0  # train.eval_full's pass over the whole val split, once at the end (estimated)
    timed_steps: int = MIN_TIMED  # how many steps step_s is the median of


def plan(budget_s: float, timing: Timing, *, max_iters: int, warmup_iters: int, eval_interval: int) -> tuple[int, int]:
    """(max_iters, warmup_iters) for a run that fits in budget_s: the most steps n <= max_iters with
    setup + n * step + ceil(n / eval_interval) * (eval + 2 checkpoints) + final <= budget (each eval may
    write ckpt.pt and best.pt). warmup keeps its share of the steps."""
    per_eval = timing.eval_s + 2 * timing.checkpoint_s
    left = budget_s - timing.setup_s - timing.final_s

    def cost(n: int) -> float:
        return n * timing.step_s + math.ceil(n / eval_interval) * per_eval

    n = min(max_iters, max(0, int(left / timing.step_s)))  # evals left out: an upper bound, then down
    while n > 0 and cost(n) > left:
        n -= 1
    if n < 1:
        raise UserError(f"train.time_budget={budget_s:.0f}s leaves no time to train: set-up took {timing.setup_s:.1f} s, "
                        f"a step {timing.step_s:.3f} s and an eval {timing.eval_s:.1f} s; give a larger budget, or 0 to "
                        "use train.max_iters")
    return n, min(n, round(warmup_iters * n / max_iters))


def measure(r) -> Timing:
    """Time the run's real step and eval, then put every stateful part back (see the module docstring)."""
    t = r.cfg.train
    snapshot = {name: copy.deepcopy(obj.state_dict()) for name, obj in r.checkpointer.states.items()}

    def run_steps(first: int, n: int) -> list[float]:
        times = []
        for i in range(first, first + n):
            apply_lr(r.step.optimizers, lr_at(i, lr=t.lr, min_lr=t.min_lr, warmup_iters=t.warmup_iters,
                                              max_iters=t.max_iters), t.lr)
            batches = [r.train_loader.get_batch(i, micro) for micro in range(r.accum)]
            t0 = time.perf_counter()
            r.step(batches).loss.item()  # the host sync: the step is done
            times.append(time.perf_counter() - t0)
        return times

    last_warmup = run_steps(0, WARMUP)[-1]
    # as many timed steps as fill TIMED_S; rank 0 decides, since every rank must run as many steps
    n_timed = min(MAX_TIMED, max(MIN_TIMED, math.ceil(TIMED_S / max(last_warmup, 1e-6))))
    times = run_steps(WARMUP, broadcast_object(n_timed if r.dist.is_main else None, r.dist, r.group))
    eval_s = final_s = 0.0
    if r.dist.is_main:
        for _ in range(2):  # the first call may pay one-time costs; the second is timed
            t0 = time.perf_counter()
            evaluate(r.model, r.eval_loaders, 1, r.amp)
            eval_s = (time.perf_counter() - t0) * t.eval_iters
        if t.eval_full:  # one eval batch per split was timed above; the full pass reads the val split's batches
            val = r.eval_loaders["val"]
            final_s = eval_s / (2 * t.eval_iters) * math.ceil(val.num_windows() / val.batch_size)
    r.checkpointer.restore_states(snapshot, "the state before the budget's timing")
    size = sum(v.numel() * v.element_size() for v in _tensors(snapshot))
    return Timing(setup_s=time.perf_counter() - r.clock[0], step_s=statistics.median(times), eval_s=eval_s,
                  checkpoint_s=size / CKPT_BYTES_PER_S, final_s=final_s, timed_steps=len(times))


def _tensors(obj: Any):
    if isinstance(obj, torch.Tensor):
        yield obj
    elif isinstance(obj, dict):
        for v in obj.values():
            yield from _tensors(v)
    elif isinstance(obj, (list, tuple)):
        for v in obj:
            yield from _tensors(v)


def fit_to_budget(r) -> None:
    """Apply train.time_budget to the run `r` (train.py's Run): decide once (rank 0, from timings every
    rank takes part in), or re-apply the decision a resumed run saved. Sets cfg.train.max_iters and
    warmup_iters, and the progress bar's total."""
    t, state = r.cfg.train, r.state
    budget = parse_duration(t.time_budget)
    if not budget:
        return
    if not state.budget_iters:
        if state.iter > 0:
            r.log.say(f"train.time_budget={t.time_budget} is not applied: this run started without a budget decision")
            return
        timing = measure(r)
        decision = None
        if r.dist.is_main:
            iters, warmup = plan(budget, timing, max_iters=t.max_iters, warmup_iters=t.warmup_iters,
                                 eval_interval=t.eval_interval)
            note = (f"time budget {t.time_budget}: set-up {timing.setup_s:.1f} s, a step {timing.step_s * 1e3:.1f} ms "
                    f"(median of {timing.timed_steps}), an eval {timing.eval_s:.1f} s + checkpoints {2 * timing.checkpoint_s:.1f} s "
                    f"every {t.eval_interval} steps"
                    + (f", the whole val split {timing.final_s:.1f} s at the end" if timing.final_s else "")
                    + f" -> max_iters {iters} (config: {t.max_iters}), warmup_iters {warmup}, "
                    f"lr decays to min_lr at step {iters}")
            decision = (iters, warmup, note)
        state.budget_iters, state.budget_warmup, state.budget_note = broadcast_object(decision, r.dist, r.group)
        r.log.say(state.budget_note)
    else:
        r.log.say(f"{state.budget_note} (decided when this run started)")
    t.max_iters, t.warmup_iters = state.budget_iters, state.budget_warmup
    if r.log.progress.bar is not None:
        r.log.progress.bar.total = t.max_iters
