"""A time budget: `train.time_budget: 8m` sizes the run to the machine it runs on.

Before the first step, the real training step is timed for a few iterations (WARMUP untimed, then
enough to fill TIMED_S seconds, between MIN_TIMED and MAX_TIMED steps; the median), and one eval batch per
split; then every stateful part is put back exactly
as it was (the Checkpointer's own registry: weights, optimizer moments, scaler, RNG streams), so the
timing leaves no trace in the run. From those figures, the set-up time already spent and an estimate
of the checkpoint writes, `plan` fixes max_iters (at most the config's, which is the plan tuned on a
fast machine) and scales warmup_iters with it; the cosine decay ends at the new max_iters. Evals stay
every eval_interval steps, and the last step evaluates as always. One round of samples and one of the
attention maps (training/report/showcase.py, when eval.sample_interval / eval.inspect_interval are on) are
timed too, and counted ceil(n / interval) times, as the loop runs them.

The timing runs the loop's own units of work (step_at and evaluate_splits), so every
rank takes part in what it takes part in during the run (under FSDP, every rank in each eval forward).
The decision is the run plan's "schedule" (training/plan.py): printed, saved, and applied again by a
resumed run, which never re-decides, so an interrupted run resumes bit for bit. Changing
train.time_budget on resume is refused (the config's resume rules), since the plan would no
longer be the one saved.
"""
from __future__ import annotations

import copy
import math
import statistics
import time
from dataclasses import dataclass
from typing import Any

import torch

from checkpoint.format import saved_ranks
from errors import UserError, clipped

from ..config.sections import Config, parse_duration
from ..graphs.step import WARMUP_STEPS as GRAPH_WARMUP_STEPS
from ..plan import Decision, Schedule
from ..run import Run, evaluate_splits, step_at
from .schedule import lr_at

WARMUP = 2  # steps run before the timed ones (first-call costs, compile)
# The timed steps fill ~TIMED_S seconds: the median of three 0.2 s steps read 557 ms for a 190 ms step on a
# 2-core EPYC while another process started beside it, and the run it planned stopped at 902 of 1500 steps.
MIN_TIMED, MAX_TIMED, TIMED_S = 3, 20, 2.0
CKPT_BYTES_PER_S = 100e6  # a conservative write speed for the checkpoint estimate


@dataclass
class Timing:
    setup_s: float  # wall seconds from the run's start to the decision (data, dtype choice, the timing itself)
    step_s: float  # one optimizer step (the median of the timed steps)
    eval_s: float  # one eval (eval_iters batches of each split)
    checkpoint_s: float  # one checkpoint write (estimated from its size)
    final_s: float = 0.0  # train.eval_full's pass over the whole val split, once at the end (estimated)
    timed_steps: int = MIN_TIMED  # how many steps step_s is the median of
    sample_s: float = 0.0  # one round of samples (eval.sample_interval)
    inspect_s: float = 0.0  # one round of attention maps and their pictures (eval.inspect_interval)


def plan(budget_s: float, timing: Timing, *, max_iters: int, warmup_iters: int, eval_interval: int,
         sample_interval: int = 0, inspect_interval: int = 0, as_written: str = "") -> tuple[int, int]:
    """(max_iters, warmup_iters) for a run that fits in budget_s: the most steps n <= max_iters with
    setup + n * step + ceil(n / eval_interval) * (eval + 2 checkpoints) + final <= budget (each eval may
    write ckpt.pt and best.pt), plus ceil(n / sample_interval) sample rounds and ceil(n / inspect_interval)
    inspections where they are on (an interval of 0 is off). warmup keeps its share of the steps."""
    per_eval = timing.eval_s + 2 * timing.checkpoint_s
    left = budget_s - timing.setup_s - timing.final_s

    def rounds(n: int, interval: int) -> int:  # the loop's: at every multiple of interval, and at the last step
        return math.ceil(n / interval) if interval else 0

    def cost(n: int) -> float:
        return (n * timing.step_s + math.ceil(n / eval_interval) * per_eval
                + rounds(n, sample_interval) * timing.sample_s + rounds(n, inspect_interval) * timing.inspect_s)

    n = min(max_iters, max(0, int(left / timing.step_s)))  # evals left out: an upper bound, then down
    while n > 0 and cost(n) > left:
        n -= 1
    if n < 1:
        said = as_written or f"{budget_s:g}s"  # not rounded: 0.0001s read as '0s', which is 'off'
        raise UserError(f"train.time_budget={said} leaves no time to train: set-up took {timing.setup_s:.1f} s, "
                        f"a step {timing.step_s:.3f} s and an eval {timing.eval_s:.1f} s; give a larger budget, or 0 to "
                        "use train.max_iters")
    return n, min(n, round(warmup_iters * n / max_iters))


def measure(r: Run) -> Timing:
    """Time the run's real step and eval, then put every stateful part back (see the module docstring)."""
    t = r.cfg.train
    snapshot = {name: copy.deepcopy(obj.state_dict()) for name, obj in r.checkpointer.states.items()}

    def run_steps(first: int, n: int) -> list[float]:
        times = []
        for i in range(first, first + n):  # the config's schedule: the plan's is what is being decided
            lr = lr_at(i, lr=t.lr, min_lr=t.min_lr, warmup_iters=t.warmup_iters, max_iters=t.max_iters)
            t0 = time.perf_counter()
            step_at(r, i, lr).loss.item()  # the host sync: the step is done
            times.append(time.perf_counter() - t0)
        return times

    # a graphed step (training/graphs/step.py) warms up, then records: the steps timed are replays
    warmup = WARMUP + (GRAPH_WARMUP_STEPS + 1 if r.plan.step_graph else 0)
    last_warmup = run_steps(0, warmup)[-1]
    # as many timed steps as fill TIMED_S; rank 0 decides, since every rank must run as many steps
    n_timed = r.par.broadcast(min(MAX_TIMED, max(MIN_TIMED, math.ceil(TIMED_S / max(last_warmup, 1e-6)))))
    times = run_steps(warmup, n_timed)
    eval_s = final_s = 0.0
    for _ in range(2):  # the first call may pay one-time costs; the second is timed
        t0 = time.perf_counter()
        evaluate_splits(r, 1)
        eval_s = (time.perf_counter() - t0) * t.eval_iters
    if t.eval_full and r.par.is_main:  # one eval batch per split was timed; the full pass reads the val split's
        val = r.trainer.eval_loaders["val"]
        final_s = eval_s / (2 * t.eval_iters) * math.ceil(val.num_windows() / val.batch_size)
    sample_s = _timed(lambda: r.showcase.samples(r)) if r.cfg.eval.sample_interval else 0.0
    inspect_s = _timed(lambda: r.showcase.inspect(r)) if r.cfg.eval.inspect_interval else 0.0
    for name, obj in r.checkpointer.states.items():  # every part back as it was: the timing leaves no trace
        obj.load_state_dict(snapshot[name])
    size = sum(v.numel() * v.element_size() for v in _tensors(snapshot))
    return Timing(setup_s=time.perf_counter() - r.clock.started, step_s=statistics.median(times), eval_s=eval_s,
                  checkpoint_s=size / CKPT_BYTES_PER_S, final_s=final_s, timed_steps=len(times), sample_s=sample_s,
                  inspect_s=inspect_s)


def _timed(fn) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def _tensors(obj: Any):
    if isinstance(obj, torch.Tensor):
        yield obj
    elif isinstance(obj, dict):
        for v in obj.values():
            yield from _tensors(v)
    elif isinstance(obj, (list, tuple)):
        for v in obj:
            yield from _tensors(v)


def resumed_length_notes(saved: dict[str, Any], cfg: Config) -> list[str]:
    """A resumed budget run keeps the schedule its budget fixed when it started: a train.max_iters changed since
    is not applied (found from outside: lowered from 2000 to 5, the run trained on to its planned 11, silently)."""
    train = saved.get("train") if isinstance(saved, dict) else None
    before = train.get("max_iters") if isinstance(train, dict) else None
    t = cfg.train
    if not parse_duration(t.time_budget) or not isinstance(before, int) or before == t.max_iters:
        return []
    return [f"train.max_iters={t.max_iters} is not applied: train.time_budget={t.time_budget} fixed this run's length "
            f"when it started (from max_iters={before}), and a resume keeps it; for another length, train into a new "
            "--train.out_dir"]


def resumed_ranks_notes(payload: dict[str, Any], cfg: Config, world_size: int) -> list[str]:
    """A resumed budget run keeps the schedule its budget fixed when it started (training/plan.py: bit for bit),
    timed on the ranks of then. On another number of ranks a step takes another time, so the kept length no longer
    fits the budget: said in one warning (found from outside: resumed on fewer ranks, the run went on far past its
    budget without a word). The ranks that wrote the checkpoint: format.saved_ranks."""
    saved, ranks = payload.get("plan"), saved_ranks(payload)
    if (not parse_duration(cfg.train.time_budget) or not isinstance(saved, dict) or "max_iters" not in saved
            or not ranks or ranks == world_size):  # (no ranks told: restoring the RNG entry says what is wrong)
        return []
    return [f"warning: train.time_budget={cfg.train.time_budget} fixed this run's length (max_iters "
            f"{clipped(saved['max_iters'])}) by timing its steps when it started, and a resume keeps it; the "
            f"checkpoint was written on {ranks} rank(s), this run has {world_size}, whose steps take another "
            f"time, so it may end well before or past the budget: resume on {ranks} rank(s) to keep to it, or "
            "train into a new --train.out_dir (model.init_from set to this one) for a budget sized to these ranks"]


def schedule_for(r: Run) -> Decision[Schedule]:
    """The plan's schedule (max_iters, warmup_iters): the config's without train.time_budget; with it,
    what a resumed run decided, or (a fresh run) rank 0's plan from timings every rank takes part in."""
    t = r.cfg.train
    budget = parse_duration(t.time_budget)
    # a run that resumes past step 0 without a saved decision (it began without a budget) keeps the config's
    if not budget or (r.state.iter > 0 and "schedule" not in r.plan.saved):
        note = ("" if not budget else f"train.time_budget={t.time_budget} is not applied: this run started without a "
                "budget decision")
        return Decision(Schedule(t.max_iters, t.warmup_iters), note)
    return r.plan.kept("schedule") or timed_schedule(r, budget)


def timed_schedule(r: Run, budget: float) -> Decision[Schedule]:
    """Every rank steps and evaluates (measure); rank 0 plans, and every rank gets its plan."""
    t, e = r.cfg.train, r.cfg.eval
    timing = measure(r)

    def decide() -> Decision[Schedule]:
        iters, warmup = plan(budget, timing, max_iters=t.max_iters, warmup_iters=t.warmup_iters,
                             eval_interval=t.eval_interval, sample_interval=e.sample_interval,
                             inspect_interval=e.inspect_interval, as_written=str(t.time_budget).strip())
        return Decision(Schedule(iters, warmup), (
            f"time budget {t.time_budget}: set-up {timing.setup_s:.1f} s, a step {timing.step_s * 1e3:.1f} ms "
            f"(median of {timing.timed_steps}), an eval {timing.eval_s:.1f} s + checkpoints "
            f"{2 * timing.checkpoint_s:.1f} s every {t.eval_interval} steps"
            + (f", the whole val split {timing.final_s:.1f} s at the end" if timing.final_s else "")
            + (f", samples {timing.sample_s:.1f} s every {e.sample_interval} steps" if e.sample_interval else "")
            + (f", attention maps {timing.inspect_s:.1f} s every {e.inspect_interval} steps"
               if e.inspect_interval else "")
            + f" -> max_iters {iters} (config: {t.max_iters}), warmup_iters {warmup}, lr decays to min_lr at "
            f"step {iters}"))
    return r.par.decide(decide)
