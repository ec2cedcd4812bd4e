"""The training run: `train` builds it (training/chain.py's `set_up`), runs `loop` (one optimizer step per
iteration, then whatever is due: log, eval, checkpoint, stop) and tears everything down. `python train.py`
calls it through training/cli.py. Which ranks take part in what is the parallel context's answer
(training/parallel/distributed.py)."""
from __future__ import annotations

import math
import time
import traceback
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import torch

from checkpoint import no_resume_advice
from errors import UserError
from eval.hellaswag import evaluate_hellaswag, hellaswag_metrics
from runtime.device import resolve_device
from training.batch_size import check_world_size
from training.chain import set_up
from training.config.sections import Config, parse_duration
from training.float8 import check_float8
from training.parallel.distributed import Parallel, destroy_distributed, dist_from_env
from training.report.evaluate import bits_per_byte
from training.report.metrics import METRICS_NAME
from training.report.mfu import mfu
from training.report.window import LossWindow
from training.run import Run, evaluate_splits, lr_of_plan, step_at
from training.step import StepOutput
from training.timing.schedule import Cadence


def train(cfg: Config) -> dict[str, Any]:
    """Run (or resume) the training described by cfg. Returns a summary: the logged train losses by
    iteration, the last eval, best val loss, final iteration and why it stopped."""
    par = dist_from_env(cfg.train.parallel, parse_duration(cfg.train.collective_timeout, "train.collective_timeout"))
    check_world_size(cfg.train, par.world_size)
    started = time.perf_counter()
    device = resolve_device(cfg.train.device, par.local_rank)
    check_float8(cfg.train.float8, device)
    par.join(device)
    failed = True
    try:
        with ExitStack() as cleanup:  # closes the progress bar, restores signal handlers, finishes wandb
            run = set_up(cfg, par, device, cleanup, started)
            summary = loop(run)
            failed = False
            return summary
    except BaseException as e:
        traceback.clear_frames(e.__traceback__)  # its frames hold the run, DDP's wrapper with it (below)
        raise
    finally:
        # DDP's wrapper must be gone while its process group is still registered: freed after
        # destroy_process_group, the gloo group's destructor can wait for the GIL this thread holds
        run = None
        destroy_distributed(healthy=not failed, par=par)


def loop(r: Run) -> dict[str, Any]:
    """One optimizer step per iteration, then whatever is due after it. Returns the run's summary."""
    t, state, plan = r.cfg.train, r.state, r.plan
    if state.iter >= plan.max_iters:
        fix = ("its time budget fixed max_iters when it started; to train further, train into a new --train.out_dir "
               "with model.init_from set to this one" if r.cfg.train.time_budget not in ("0", "")
               else "raise --train.max_iters to train further")
        r.log.say(f"{r.checkpointer.latest} is already at iter {state.iter} >= max_iters={plan.max_iters}; nothing to do "
                  f"({fix})")
    e = r.cfg.eval
    cadence = Cadence(plan.max_iters, log=t.log_interval, eval=t.eval_interval, checkpoint=t.checkpoint_interval,
                      hellaswag=e.hellaswag_interval, sample=e.sample_interval, inspect=e.inspect_interval)
    losses: dict[int, float] = {}  # the logged train losses, by iteration
    last_eval: dict[str, Any] = {}
    stopped = None
    window = r.window  # restored: a run stopped inside a window goes on with it (training/report/window.py)
    window.resume()  # its clock: the set-up is no step's time
    guard = NonFiniteGuard(r.device, fp16=r.trainer.step.scaler.is_enabled(), params=list(r.trainer.model.parameters()))
    r.trainer.model.train()
    while state.iter < plan.max_iters:
        r.par.at = f"iter {state.iter + 1}"  # for the line a rank that stops answering makes the others print
        lr = lr_of_plan(plan, t, state.iter)
        out = step_at(r, state.iter, lr)
        guard.observe(out, state.iter)
        state.iter += 1
        state.tokens_seen += r.log.tokens_per_step
        window.add(out.loss)
        r.log.progress.update()

        stopping = r.par.any(r.stop.requested)  # every rank stops after the same step
        due = cadence.after(state.iter, stopping)
        if due.log or due.checkpoint:  # never log, evaluate or save poisoned weights
            guard.check(r.par, r.checkpointer.latest, r.checkpointer.last_saved_iter, state.iter)
        record = log_step(r, out, lr, window) if due.log else {}
        if record:
            losses[state.iter] = record["train/loss"]
        window.pause()  # evals and checkpoints don't count against tokens/s
        if due.eval:
            evaluated = evaluate_and_keep_best(r, full=t.eval_full and state.iter == plan.max_iters)
            if evaluated:  # rank 0
                last_eval = {"iter": state.iter, "train/loss": evaluated["eval/train_loss"],
                             **{k: v for k, v in evaluated.items() if k.startswith("val/")}}
            record |= evaluated
        if due.hellaswag:
            record |= hellaswag_step(r)
        record |= r.showcase.after_step(r, due)  # samples, attention maps
        state.elapsed_s = r.clock.elapsed()  # evals included, for time budgets
        r.log.metrics.append(state.iter, record | {"elapsed_s": state.elapsed_s} if record else record)
        r.log.wandb.end_step()  # the step whole, in one call: a stop mid-step sends wandb none of it
        if due.checkpoint:
            save(r)
        window.resume()
        if stopping:
            stopped = stop_reason(r)
            r.log.say(f"stopped by {stopped} after iter {state.iter}; {r.checkpointer.latest} written; "
                      "rerun the same command to resume")
            break

    if last_eval:
        r.log.wandb.summary({k: v for k, v in last_eval.items() if k.startswith("val/")}
                            | {"best_val_loss": state.best_val_loss})
    return {"losses": losses, "eval": last_eval, "stopped": stopped, "iter": state.iter,
            "best_val_loss": state.best_val_loss, "tokens_seen": state.tokens_seen,
            "out_dir": str(r.checkpointer.out_dir), "wandb_run_id": r.log.wandb.run_id, "dtype": plan.dtype}


def stop_reason(r: Run) -> str:
    """What stopped the run: this rank's signal, else the first rank's that had one (a signal to rank 1 alone
    stops every rank after the same step, and rank 0, which prints the line, saw none: it read 'stopped by
    after iter 17'). Every rank is here: they all read the same stop flag."""
    reasons = r.par.gather(r.stop.reason, "the ranks' stop reasons")
    return r.stop.reason or next((f"{why} (to rank {i})" for i, why in enumerate(reasons) if why), "a signal")


def log_step(r: Run, out: StepOutput, lr: float, window: LossWindow) -> dict[str, Any]:
    """Average the window's loss over its steps and the ranks (the window's one host sync), then show
    it (bar or line) and send it to wandb. Returns the record for metrics.jsonl."""
    step = r.state.iter
    train_loss = r.par.mean_(window.loss / window.steps).item()
    tok_per_sec = window.steps * r.log.tokens_per_step / window.elapsed()
    util = mfu(r.log.flops_per_token, tok_per_sec, r.plan.peak_flops, r.par.world_size)
    record = {"train/loss": train_loss, "lr": lr, "grad_norm": out.grad_norm.item(), "tokens_per_sec": tok_per_sec,
              "mfu": util, "tokens_seen": r.state.tokens_seen}
    r.log.progress.show(step, f"loss {train_loss:.4f}, lr {lr:.2e}, tok/s {tok_per_sec:,.0f}"
                        + (f", mfu {util:.1%}" if util is not None else ""))
    r.log.wandb.log(record, step)
    window.reset()
    return record


def evaluate_and_keep_best(r: Run, full: bool = False) -> dict[str, Any]:
    """The evals (every rank that takes part runs them, rank 0 reports), and with `full` the whole val
    split; when val loss improves every rank joins in writing best.pt (the checkpoint gathers every rank's
    RNG streams). Returns the record for metrics.jsonl: {} on the ranks that do not report."""
    record: dict[str, Any] = {}
    improved = False
    result = evaluate_splits(r, r.cfg.train.eval_iters, full)
    if result is not None:  # rank 0
        losses, whole = result
        bpb = bits_per_byte(losses["val"], r.trainer.eval_loaders["val"].bytes_per_token)
        r.log.say(f"iter {r.state.iter}: train loss {losses['train']:.4f}, val loss {losses['val']:.4f}, val bpb {bpb:.4f}")
        record = {"val/loss": losses["val"], "val/bpb": bpb, "eval/train_loss": losses["train"]}
        if whole is not None:
            val = r.trainer.eval_loaders["val"]
            full_bpb = bits_per_byte(whole, val.bytes_per_token)
            r.log.say(f"iter {r.state.iter}: the whole val split ({val.num_windows():,} windows of up to {val.block_size} "
                      "tokens): "
                      f"val loss {whole:.4f}, val bpb {full_bpb:.4f}")
            record |= {"val/loss_full": whole, "val/bpb_full": full_bpb}
        r.log.wandb.log(record, r.state.iter)
        improved = losses["val"] < r.state.best_val_loss
        if improved:
            r.state.best_val_loss = losses["val"]
        diverged = next((f"{k} loss" for k, v in (*losses.items(), ("whole val", whole)) if v is not None
                         and not math.isfinite(v)), None)
    else:
        diverged = None
    improved, diverged = r.par.broadcast((improved, diverged), "rank 0's eval", patient=True)
    if diverged:  # finite weights can still overflow the logits (a step at lr 1e30): nothing of them is saved
        raise diverged_error(f"the eval's {diverged} became non-finite at iter {r.state.iter}", r.checkpointer.latest,
                             r.checkpointer.last_saved_iter)
    if improved:
        save(r, best=True)
    return record


def save(r: Run, best: bool = False) -> None:
    """ckpt.pt (or best.pt); the other ranks wait for rank 0's write on the patient group, so that a long
    write is never taken for a rank that stopped answering by the next step's collectives."""
    with r.par.waiting("the checkpoint write", patient=True, grace_s=math.inf):  # sharded: every rank writes
        r.checkpointer.save(r.state.iter, best=best)
    r.par.broadcast(None, "rank 0's checkpoint write", patient=True)


def hellaswag_step(r: Run) -> dict[str, Any]:
    """HellaSwag's accuracy: each rank scores its share of the items and the counts are summed over the
    ranks, or (Parallel.scores_share false) every rank scores every item."""
    tok, items = r.hellaswag.tok, r.hellaswag.items
    share = r.par.scores_share  # else every rank scores every item (Parallel.scores_share says why)
    counts = evaluate_hellaswag(r.trainer.model, items, tok, batch_size=r.cfg.eval.hellaswag_batch_size,
                                autocast_ctx=r.trainer.amp,
                                rank=r.par.rank if share else 0, world_size=r.par.world_size if share else 1)
    total = torch.tensor([counts["correct"], counts["correct_norm"], counts["total"]], dtype=torch.int64)
    if share:
        r.par.sum_(total)
    metrics = hellaswag_metrics(dict(zip(("correct", "correct_norm", "total"), total.tolist())))
    r.log.say(f"iter {r.state.iter}: hellaswag acc {metrics['hellaswag/acc']:.4f}, acc_norm "
          f"{metrics['hellaswag/acc_norm']:.4f} ({int(total[2])} items)")
    r.log.wandb.log(metrics, r.state.iter)
    return metrics


# ------------------------------------------------------------------------ a diverged run stops

class NonFiniteGuard:
    """Stops a diverged run before it logs, evaluates or saves poisoned weights. Remembers on the device (no
    host sync per step) whether any step's loss or grad norm was non-finite, and the first such step. With a
    GradScaler (fp16) an inf grad norm is normal: that step was skipped and the scale lowered, so only the
    loss counts."""

    def __init__(self, device: torch.device, *, fp16: bool, params: list[torch.Tensor] = ()):
        self.fp16 = fp16
        self.params = params  # the weights, checked too: the loss and grad norm are the step's before its update
        self.bad = torch.zeros((), dtype=torch.bool, device=device)
        self.first = torch.full((), -1, dtype=torch.long, device=device)

    def observe(self, out: StepOutput, iter_num: int) -> None:
        ok = torch.isfinite(out.loss) if self.fp16 else torch.isfinite(out.loss) & torch.isfinite(out.grad_norm)
        self.first = torch.where(~ok & (self.first < 0), iter_num, self.first)
        self.bad |= ~ok

    def check(self, par: Parallel, ckpt_path: Path, last_saved: int | None, iter_num: int) -> None:
        """Raise the one-line error on every rank if any rank has seen a non-finite step, or holds non-finite
        weights (a step's update can break them after its own loss and grad norm were finite: a resumed NaN
        moment, a huge lr). Each rank checks its own weights (its shards, under FSDP)."""
        if par.any(bool(self.bad.item())):
            raise diverged_error(f"loss or grad norm became non-finite at iter {int(self.first.item())}", ckpt_path,
                                 last_saved)
        local = [p.detach().to_local() if hasattr(p, "to_local") else p.detach() for p in self.params]
        finite = [torch.isfinite(t).all() for t in local if t.is_floating_point() and t.numel()]
        if par.any(bool(finite) and not bool(torch.stack(finite).all())):
            raise diverged_error(f"the weights became non-finite by iter {iter_num}", ckpt_path, last_saved)


def diverged_error(what: str, ckpt_path: Path, last_saved: int | None) -> UserError:
    """The one line of a diverged run: what broke, and what the out_dir still holds."""
    fix = "lower train.lr (or train.weight_decay), raise train.warmup_iters or use bfloat16/float32"
    if last_saved is not None:
        where = f"{ckpt_path} still holds iter {last_saved}; {fix}, then rerun"
    else:  # nothing to resume, and the log it left would make the same out_dir refuse a fresh run
        where = (f"no checkpoint was written, so there is nothing to resume; {fix}, then "
                 + no_resume_advice(ckpt_path.parent, (METRICS_NAME,)))
    return UserError(f"{what}; stopped, {where}")
