"""Train a GPT.

    python train.py --config small.yaml [--section.key=value ...]
    torchrun --standalone --nproc_per_node=N train.py --config ...       # data parallel (nccl / gloo)
    torchrun ... train.py --config ... --train.parallel=fsdp           # sharded: weights, grads, optimizer

Reads top to bottom: `set_up` builds the run by one chain of builders (the out_dir and the resume
decision, the data, the model, its training step, the checkpointed states, logging), settling every
start-up decision into the run plan (training/plan.py) on the way; `loop` runs one step per iteration
and then whatever is due (log, eval, checkpoint, stop); `train` tears everything down. Hardware
switches (precision, compile, DDP or FSDP) are applied from outside the model, one line each, and which
ranks take part in what is the parallel context's answer (training/parallel/distributed.py). `<out_dir>/ckpt.pt`
is always the latest complete checkpoint, `best.pt` the best val loss (ckpt.dcp/ and best.dcp/, sharded,
with train.parallel=fsdp), `metrics.jsonl` every logged step (rank 0).
"""
from __future__ import annotations

import errors

if __name__ == "__main__":  # before the heavy imports below: Ctrl-C during start-up is one line too
    errors.quiet_interrupts()

import math
import sys
import time
import traceback
from contextlib import ExitStack
from pathlib import Path
from typing import Any, Callable

import torch
from tqdm import tqdm

from checkpoint import Resume, claim_out_dir, decide_resume
from data import hold_data, load_meta, prepare_data, tokenizer_entry, tokenizer_from_meta
from errors import UserError, run_cli
from eval.hellaswag import check_tokenizer, evaluate_hellaswag, hellaswag_metrics, load_items
from fileio import no_empty_dirs_left
from runtime.device import resolve_device
from ownership import unmark_if_unused
from training.timing.budget import resumed_length_notes, resumed_ranks_notes, schedule_for
from training.chat import chat_vocab_size, data_notes
from training.init_from import check_init_from, resumed_init_from
from training.builders import build_checkpointer, build_model, build_trainer, check_memory, data_loaders
from training.batch_size import check_world_size
from training.config.sections import Config, keep_what_older_runs_did, load_config, parse_duration, resume_conflicts, to_yaml
from training.parallel.distributed import Parallel, destroy_distributed, dist_from_env
from training.report.evaluate import bits_per_byte
from training.float8 import check_float8
from training.health import NonFiniteGuard
from training.report.metrics import METRICS_NAME, MetricsLog, Progress, console_guard
from training.report.mfu import mfu
from training.plan import RunPlan
from training.rng import seed_everything
from training.run import Clock, HellaSwag, Run, RunLog, evaluate_splits, lr_of_plan, resumed_clock_notes, step_at
from training.timing.schedule import Cadence
from training.report.showcase import build_showcase, replayed_media
from training.parallel.signals import StopFlag, launched_by_torchrun
from training.state import TrainState
from training.report.state_size import shard_counts, state_bytes
from training.step import StepOutput
from training.report.wandb_logger import WandbLogger
from training.report.window import LossWindow

if __name__ == "__main__":  # the imports are done: Ctrl-C is a KeyboardInterrupt again (run_cli says it)
    errors.start_up_done()


def main(argv: list[str] | None = None) -> int:
    cfg = load_config(sys.argv[1:] if argv is None else argv)
    with console_guard():  # a closed or full stdout never stops a run
        train(cfg)
    return 0


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


# ---------------------------------------------------------------------------------------- set-up

def set_up(cfg: Config, par: Parallel, device: torch.device, cleanup: ExitStack, started: float) -> Run:
    """The run, by one chain: each builder takes what the ones before it made, and every start-up
    decision is settled into `plan` by its one rule (training/plan.py)."""
    say = tqdm.write if par.is_main else (lambda *a, **k: None)
    resume, cfg = claim_and_decide_resume(cfg, par, say, cleanup)
    if resume is None:  # a resumed run's weights are its checkpoint's
        # before the data's preparation (long): a refusal at once; on rank 0 alone (a hub name's config.json is fetched)
        par.on_main(lambda: check_init_from(cfg.model, cfg.data.tokenizer), "the check of model.init_from", patient=True)
    data_dir, meta, tokenizer = prepare(cfg, par, resume, cleanup)
    showcase = build_showcase(cfg, tokenizer)  # samples and attention maps: the prompts checked before the model
    chat_vocab = chat_vocab_size(meta)  # conversations: the vocabulary their markers need (training/chat.py)
    check_memory(cfg, max(meta["vocab_size"], chat_vocab), resume, device, par)  # before allocating anything big
    seed_everything(cfg.train.seed)
    model, cfg, notes = build_model(cfg, vocab_size=meta["vocab_size"], tokenizer=tokenizer, resume=resume,
                                    device=device, chat_vocab=chat_vocab)
    plan = RunPlan.start(resume)
    trainer = build_trainer(cfg, par, device, model, plan, data_loaders(cfg, data_dir, par, device), say)
    notes += data_notes(trainer, cfg.model.block_size)  # conversations cut or dropped to fit the context
    state, window = TrainState(), LossWindow(device, par)
    checkpointer, rng = build_checkpointer(Path(cfg.train.out_dir), par, trainer=trainer, plan=plan, state=state,
                                           window=window, cfg=cfg, tokenizer=tokenizer)
    restore_or_start(checkpointer, resume, cfg.train.seed, par)
    hellaswag = load_hellaswag(cfg, tokenizer, par)
    log = open_log(cfg, par, trainer, plan, state, resume, cleanup, say)
    stop = install_stop_flag(par, checkpointer, cleanup)
    run = Run(cfg=cfg, par=par, device=device, trainer=trainer, plan=plan, state=state, window=window,
              checkpointer=checkpointer, log=log, stop=stop, hellaswag=hellaswag, clock=Clock(started, state.elapsed_s),
              showcase=showcase)
    plan.settle("schedule", schedule_for(run))  # train.time_budget: sized to this machine by timing the loop's work
    run.log.progress.total(plan.max_iters)
    say_start(run, notes + ([rng.note] if rng.note else []), resume)
    return run


def claim_and_decide_resume(cfg: Config, par: Parallel, say: Callable, cleanup: ExitStack) -> tuple[Resume | None, Config]:
    """Rank 0 takes the out_dir's lock (a taken out_dir stops every rank); every rank agrees on the
    checkpoint to resume, or none. A resumed run whose config lacks keys added since gets the values
    that continue it as it ran (a new frozen config; the one loaded is never changed)."""
    out_dir = Path(cfg.train.out_dir)
    if par.is_main:  # left last (the stack unwinds backwards), after the lock file: a refused start leaves no folder
        cleanup.enter_context(no_empty_dirs_left(out_dir))
    lock = par.on_main(lambda: claim_out_dir(out_dir, say), "rank 0's claim of the out_dir")  # None off rank 0
    if lock is not None:
        cleanup.callback(lock.release)
        cleanup.callback(unmark_if_unused, out_dir)  # before the release: a refused start leaves no marker
    resume = decide_resume(out_dir, mode=cfg.train.resume, config_conflicts=lambda saved: resume_conflicts(saved, cfg),
                           gather=par.gather, other_files=(METRICS_NAME,))
    if resume is None:
        return None, cfg
    cfg, notes = keep_what_older_runs_did(resume.config, cfg)
    cfg, applied = resumed_init_from(resume.config, cfg, str(resume.path))
    for note in (notes + applied + resumed_length_notes(resume.config, cfg)
                 + resumed_ranks_notes(resume.payload, cfg, par.world_size) + resumed_clock_notes(resume.payload)):
        say(note)
    return resume, cfg


def prepare(cfg: Config, par: Parallel, resume: Resume | None, cleanup: ExitStack) -> tuple[Path, dict, dict]:
    """(data dir, its meta, the tokenizer entry): rank 0 prepares the data (or finds it up to date) while
    the others wait; the dir is held, never rebuilt under this run; a resume must read the same tokens (checked
    by prepare_data, before and after preparing)."""
    trained_on = resume.tokens_sha256 if resume is not None else None
    resumes = (str(resume.path), trained_on) if trained_on else None
    data_dir = Path(par.decide(lambda: str(prepare_data(cfg.data, progress=True, resumes=resumes)),
                               "rank 0's data preparation", patient=True))
    cleanup.callback(hold_data(data_dir, f"the training run into {cfg.train.out_dir}"))
    meta = load_meta(data_dir)
    tokenizer = tokenizer_entry(meta)
    if resume is not None and resume.tokenizer != tokenizer:
        raise UserError(f"cannot resume {resume.path}: it was trained with tokenizer "
                        f"{(resume.tokenizer or {}).get('tokenizer')!r} and different data; "
                        "use the original data settings, or a new --train.out_dir")
    return data_dir, meta, tokenizer


def restore_or_start(checkpointer, resume: Resume | None, seed: int, par: Parallel) -> None:
    """Every registered state from the checkpoint; or, fresh, different dropout masks per rank (the same
    initial weights: they were drawn before this, from the same seed)."""
    if resume is not None:
        checkpointer.restore(resume)
    elif par.rank:
        torch.manual_seed(seed + par.rank)


def load_hellaswag(cfg: Config, tokenizer: dict, par: Parallel) -> HellaSwag | None:
    """The items and their tokenizer when eval.hellaswag_interval is set: the items loaded once, by rank 0 (a
    download for the HF copy)."""
    if not cfg.eval.hellaswag_interval:
        return None
    tok = tokenizer_from_meta(tokenizer)
    check_tokenizer(tok)
    return HellaSwag(tok, par.decide(lambda: load_items(cfg.eval.hellaswag_data or None,
                                                        cfg.eval.hellaswag_limit or None),
                                     "rank 0's loading of HellaSwag", patient=True))


def install_stop_flag(par: Parallel, checkpointer, cleanup: ExitStack) -> StopFlag:
    """SIGTERM / SIGHUP / Ctrl-C, or the death of torchrun: stop after the step, with a checkpoint; while
    waiting on a rank that stopped answering, at once (training/parallel/signals.py)."""
    def saved() -> str:
        it = checkpointer.last_saved_iter
        return f"{checkpointer.latest} holds iter {it}" if it is not None else "no checkpoint was written yet"
    stop = StopFlag(par, saved, watch_parent=launched_by_torchrun()).install()
    cleanup.callback(stop.restore)
    return stop


def open_log(cfg: Config, par: Parallel, trainer, plan: RunPlan, state: TrainState, resume: Resume | None,
             cleanup: ExitStack, say: Callable) -> RunLog:
    """metrics.jsonl (continued where a resumed run left it), wandb (the same run id), the progress bar."""
    out_dir = Path(cfg.train.out_dir)
    metrics = MetricsLog(out_dir, active=par.is_main)
    history = metrics.resume_at(state.iter) if resume is not None else None
    logger = WandbLogger(mode=cfg.wandb.mode, project=cfg.wandb.project, run_name=cfg.wandb.run_name,
                         run_id=state.run_id, out_dir=str(out_dir), config=cfg.to_dict(), active=par.is_main,
                         printer=say, history=history, media=lambda record: replayed_media(out_dir, record))
    cleanup.push(lambda exc_type, *_: logger.finish(exit_code=1 if exc_type else 0))
    progress = Progress(cfg.train.max_iters, state.iter, active=par.is_main)  # its total: the plan's (budget)
    cleanup.callback(progress.close)
    return RunLog(say=say, progress=progress, metrics=metrics, wandb=logger,
                  tokens_per_step=plan.micro_batch * cfg.model.block_size * plan.accum,
                  flops_per_token=trainer.model.flops_per_token(cfg.model.block_size))


def say_start(r: Run, notes: list[str], resume: Resume | None) -> None:
    """The resolved config, the run plan as one block, and what this rank holds."""
    say, cfg, plan = r.log.say, r.cfg, r.plan
    say(f"config:\n{to_yaml(cfg)}")
    for note in notes:
        say(note)
    say("\n".join(["run plan (decided once, saved in the checkpoint):"] + plan.lines()))
    if r.trainer.float8_layers:
        say(f"float8 ({cfg.train.float8} scaling) in {r.trainer.float8_layers} Linear layers of the blocks"
            + ("" if cfg.train.compile else "; eager float8 is slower than bf16: set train.compile=true for its speed"))
    say(memory_line(r.par, r.trainer.model, r.trainer.step.optimizers))
    say(f"device {r.device}, {r.par.world_size} rank(s), {r.trainer.model.num_params() / 1e6:.2f}M non-embedding params, "
        f"{r.log.tokens_per_step} tokens/step ({plan.micro_batch} x {cfg.model.block_size} x {plan.accum} micro-steps"
        + (f", {plan.accum // r.par.world_size} on each rank" if r.par.world_size > 1 else "") + "), "
        + (f"resuming {resume.path} at iter {r.state.iter}" if resume is not None else f"fresh run into {cfg.train.out_dir}"))


def memory_line(par: Parallel, model, optimizers: list) -> str:
    """What each rank holds of the parameters, their gradients and the optimizer state (rank 0's)."""
    local, whole = shard_counts(model)
    mb = state_bytes(model, optimizers) / 1e6
    if not par.enabled:
        return f"1 rank: {whole:,} parameters, {mb:.2f} MB of parameters, gradients and optimizer state"
    return (f"{par.mode}: {par.world_size} ranks, {local:,} of {whole:,} parameters on this rank, {mb:.2f} MB of "
            "parameters, gradients and optimizer state per rank")


# ------------------------------------------------------------------------------------------ loop

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
    guard = NonFiniteGuard(r.device, fp16=r.trainer.step.scaler.is_enabled())
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
            guard.check(r.par, r.checkpointer.latest, r.checkpointer.last_saved_iter)
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
    if r.par.broadcast(improved, "rank 0's eval", patient=True):
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


if __name__ == "__main__":
    run_cli(main, oom_fix="lower train.batch_size (more train.grad_accum_steps keep the global batch), "
                          "model.block_size or the model's size")
