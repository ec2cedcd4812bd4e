"""The run, built by one chain (`set_up`): the out_dir's claim and the resume decision, the data, the model,
its training step, the checkpointed states, the log and the stop flag, each builder taking what the ones
before it made, and every start-up decision settled into the run plan (training/plan.py) on the way.
train.py runs it through training/loop.py's `train`; the builders themselves are training/builders.py."""
from __future__ import annotations

import os
from contextlib import ExitStack, suppress
from pathlib import Path
from typing import Callable

import torch
from tqdm import tqdm

from checkpoint import Resume, claim_out_dir, decide_resume
from data import hold_data, load_meta, prepare_data, tokenizer_entry, tokenizer_from_meta
from errors import UserError
from eval.hellaswag import check_tokenizer, load_items
from fileio import no_empty_dirs_left
from ownership import unmark_if_unused
from training.builders import build_checkpointer, build_model, build_trainer, check_memory, data_loaders
from training.chat import chat_vocab_size, data_notes
from training.config.sections import Config, keep_what_older_runs_did, resume_conflicts, to_yaml
from training.init_from import check_init_from, resumed_init_from
from training.parallel.distributed import Parallel
from training.parallel.signals import StopFlag, launched_by_torchrun
from training.plan import RunPlan
from training.report.metrics import METRICS_NAME, MetricsLog, Progress
from training.report.showcase import Replay, build_showcase
from training.report.state_size import shard_counts, state_bytes
from training.report.wandb_logger import WandbLogger
from training.report.window import LossWindow
from training.run import Clock, HellaSwag, Run, RunLog, resumed_clock_notes
from training.state import TrainState, seed_everything
from training.timing.budget import resumed_length_notes, resumed_ranks_notes, schedule_for


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
    had: set[str] = set()  # what the folder held before the claim: a refusal leaves it as it was
    with suppress(OSError):  # (none, or unreadable: the claim says why)
        had = set(os.listdir(out_dir)) if par.is_main else had
    lock = par.on_main(lambda: claim_out_dir(out_dir, say), "rank 0's claim of the out_dir")  # None off rank 0
    if lock is not None:
        cleanup.callback(lock.release)
        cleanup.callback(unmark_if_unused, out_dir, had)  # before the release: a refused start leaves no marker
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
                         printer=say, history=history, media=Replay(out_dir))
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
