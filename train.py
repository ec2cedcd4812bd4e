"""Train a GPT.

    python train.py --config small.yaml [--section.key=value ...]
    torchrun --standalone --nproc_per_node=N train.py --config ...       # data parallel (nccl / gloo)

Reads top to bottom: `set_up` builds the run (resume decision, data, precision, model, optimizers,
the checkpointed states, logging), `loop` runs one `train_step` per iteration and then whatever is due
(log, eval, checkpoint, stop), and `train` tears everything down. Hardware switches (precision,
compile, DDP) are applied from outside the model, one line each. `<out_dir>/ckpt.pt` is always the
latest complete checkpoint, `best.pt` the best val loss, `metrics.jsonl` every logged step (rank 0).
"""
from __future__ import annotations

import errors

if __name__ == "__main__":  # before the heavy imports below: Ctrl-C during start-up is one line too
    errors.quiet_interrupts()

import sys
import time
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import torch
import torch.nn as nn
from tqdm import tqdm

from data import BatchLoader, hold_data, load_meta, prepare_data, tokenizer_entry, tokenizer_from_meta
from errors import UserError, run_cli, short_error
from eval.hellaswag import check_tokenizer, evaluate_hellaswag, hellaswag_metrics, load_items
from fileio import DirLock, check_writable_dir
from model import GPT, GPTConfig
from model.checkpoint import BEST_NAME, CKPT_NAME, load_checkpoint, model_config_dict
from runtime.device import compile_failed, resolve_device
from runtime.loss_path import choose_loss_chunk_rows
from runtime.memory import check_fits, training_bytes
from runtime.precision import DTYPE_BY_NAME, allow_tf32, autocast, dtype_name, make_scaler, training_dtype
from training.checkpoint import Checkpointer, OptimizerState, ScalerState
from training.config import Config, load_config, resume_conflicts, to_yaml
from training.distributed import (
    DistInfo, all_gather_object, all_reduce_mean, all_reduce_sum, any_rank, apply_ddp, broadcast_object,
    control_group, destroy_distributed, dist_from_env, init_distributed, on_rank0,
)
from training.evaluate import bits_per_byte, evaluate
from training.health import NonFiniteGuard
from training.init_from import initial_model
from training.metrics import METRICS_NAME, LossWindow, MetricsLog, Progress
from training.mfu import mfu, peak_flops
from training.optim import make_optimizers
from training.rng import RNGState, seed_everything
from training.schedule import apply_lr, due_after, lr_at
from training.signals import StopFlag
from training.state import TrainState
from training.step import StepOutput, forward_backward_probe, train_step
from training.wandb_logger import WandbLogger


def main(argv: list[str] | None = None) -> int:
    cfg = load_config(sys.argv[1:] if argv is None else argv)
    train(cfg)
    return 0


def train(cfg: Config) -> dict[str, Any]:
    """Run (or resume) the training described by cfg. Returns a summary: the logged train losses by
    iteration, the last eval, best val loss, final iteration and why it stopped."""
    dist = dist_from_env()
    if cfg.train.grad_accum_steps % dist.world_size:
        raise UserError(f"train.grad_accum_steps={cfg.train.grad_accum_steps} (global) is not divisible by the "
                        f"{dist.world_size} ranks; use a multiple of {dist.world_size}")
    started = time.perf_counter()
    device = resolve_device(cfg.train.device, dist.local_rank)
    init_distributed(dist, device)
    failed = True
    try:
        with ExitStack() as cleanup:  # closes the progress bar, restores signal handlers, finishes wandb
            run = set_up(cfg, dist, device, cleanup)
            run.clock = (started, run.state.elapsed_s)
            summary = loop(run)
            failed = False
            return summary
    finally:
        # DDP's wrapper must be gone while its process group is still registered: freed after
        # destroy_process_group, the gloo group's destructor can wait for the GIL this thread holds
        run = None
        destroy_distributed(healthy=not failed)


# ---------------------------------------------------------------------------------------- set-up

@dataclass
class Run:
    """Everything the loop needs, built once by set_up."""
    cfg: Config
    dist: DistInfo
    device: torch.device
    dtype: torch.dtype
    raw_model: GPT  # the plain module: saved and evaluated
    model: nn.Module  # what the step runs: raw_model, compiled and/or wrapped in DDP
    optimizers: list[torch.optim.Optimizer]
    scaler: torch.amp.GradScaler
    train_loader: BatchLoader
    eval_loaders: dict[str, BatchLoader]  # rank 0 only
    hellaswag: tuple | None  # (tokenizer, items) when eval.hellaswag_interval is set
    state: TrainState
    checkpointer: Checkpointer
    metrics: MetricsLog
    logger: WandbLogger
    stop: StopFlag
    progress: Progress
    group: Any  # the CPU control group of the ranks (None on one process)
    ckpt_path: Path
    accum: int  # micro-steps per rank per optimizer step
    tokens_per_step: int
    flops_per_token: float
    peak: float | None
    say: Callable[[str], None]
    clock: tuple[float, float] = (0.0, 0.0)  # (perf_counter at start, elapsed_s of earlier sessions)

    def amp(self):
        return autocast(self.device, self.dtype)

    def step(self, batches) -> StepOutput:
        """train_step; if torch.compile fails (no C++ compiler for Inductor on a CPU, an unsupported GPU),
        the step is redone from the same state without compile, and the run goes on eager."""
        try:
            return train_step(self.model, self.optimizers, self.scaler, batches, amp=self.amp,
                              grad_clip=self.cfg.train.grad_clip)
        except Exception as e:
            if not (self.cfg.train.compile and self.model is not self.raw_model and compile_failed(e)):
                raise
            self.say(f"warning: torch.compile failed ({short_error(e)}); training continues without it")
            for opt in self.optimizers:
                opt.zero_grad(set_to_none=True)  # a failed backward may have left partial gradients
            self.model = apply_ddp(self.raw_model, self.dist, self.device)
            return self.step(batches)


def set_up(cfg: Config, dist: DistInfo, device: torch.device, cleanup: ExitStack) -> Run:
    t = cfg.train
    say = tqdm.write if dist.is_main else (lambda *a, **k: None)
    group = control_group(dist)
    out_dir = Path(t.out_dir)
    ckpt_path = out_dir / CKPT_NAME

    lock = DirLock(out_dir, ".train.lock")
    on_rank0(lambda: claim_out_dir(lock, out_dir), dist, group)  # every rank stops if it is taken
    cleanup.callback(lock.release)
    resume = decide_resume(ckpt_path, cfg, dist, group)
    # rank 0 prepares the data (or finds it up to date); the others wait, then read only meta.json
    data_dir = Path(on_rank0(lambda: str(prepare_data(cfg.data, progress=True)), dist, group))
    cleanup.callback(hold_data(data_dir, f"the training run into {out_dir}"))  # never rebuilt under this run
    meta = load_meta(data_dir)
    tokenizer = tokenizer_entry(meta)
    if resume is not None and resume.get("tokenizer") != tokenizer:
        raise UserError(f"cannot resume {ckpt_path}: it was trained with tokenizer "
                        f"{resume.get('tokenizer', {}).get('tokenizer')!r} and different data; "
                        "use the original data settings, or a new --train.out_dir")

    planned = planned_model(cfg, meta["vocab_size"], resume)
    if planned is not None:  # before allocating anything big: refuse what can't fit, in one line
        check_fits(training_bytes(planned, batch_size=t.batch_size, block_size=cfg.model.block_size,
                                  loss_chunk_rows=choose_loss_chunk_rows(device, compiled=t.compile,
                                                                         vocab_size=planned.vocab_size)),
                   device, "training", "train.batch_size, model.block_size, or the model's size (n_layer, n_embd)")
    seed_everything(t.seed)
    raw_model, notes = initial_model(cfg.model, vocab_size=meta["vocab_size"], tokenizer=tokenizer, seed=t.seed,
                                     resume=resume)
    raw_model.to(device)
    raw_model.loss_chunk_rows = choose_loss_chunk_rows(device, compiled=t.compile, vocab_size=raw_model.config.vocab_size)
    block = cfg.model.block_size
    train_loader = BatchLoader(data_dir, "train", block_size=block, batch_size=t.batch_size, seed=t.seed,
                               rank=dist.rank, world_size=dist.world_size, device=device)
    eval_loaders = {split: BatchLoader(data_dir, split, block_size=block, batch_size=t.batch_size, seed=t.eval_seed,
                                       device=device) for split in ("train", "val")} if dist.is_main else {}

    # precision: rank 0 decides (on a CPU by timing this model's forward and backward in each candidate),
    # every rank uses its choice, and a resumed run keeps the one it made
    saved = resume.get("train") if resume is not None else None
    saved_dtype = saved.get("dtype", "") if isinstance(saved, dict) else ""  # a damaged entry: restore says so
    probe = forward_backward_probe(raw_model, train_loader.get_batch(0, 0), lambda dt: autocast(device, dt))
    name, dtype_note = on_rank0(lambda: choose_dtype(t.dtype, saved_dtype, device, probe), dist, group)
    dtype = DTYPE_BY_NAME[name]
    allow_tf32(device)

    optimizers = make_optimizers(raw_model, lr=t.lr, weight_decay=t.weight_decay, betas=(t.beta1, t.beta2),
                                 device_type=device.type, kind=t.optimizer, muon_lr=t.muon_lr,
                                 muon_momentum=t.muon_momentum)
    scaler = make_scaler(device, dtype)
    model = torch.compile(raw_model) if t.compile else raw_model  # raw_model stays the plain module
    model = apply_ddp(model, dist, device)

    # every stateful part, registered once: saved and restored by the same mapping, RNG streams last
    state = TrainState(dtype=name)
    rng = RNGState(dist, group)
    checkpointer = Checkpointer(
        {"model": raw_model, "optimizer": OptimizerState(optimizers), "scaler": ScalerState(scaler),
         "loader": train_loader, "train": state, "rng": rng},
        static={"model_config": model_config_dict(raw_model), "config": cfg.to_dict(), "tokenizer": tokenizer},
        is_main=dist.is_main)
    if resume is not None:
        checkpointer.restore(resume, ckpt_path)
        checkpointer.last_saved, checkpointer.last_saved_iter = ckpt_path, state.iter
        state.dtype = name  # kept from the checkpoint unless train.dtype overrides it (choose_dtype)
    elif dist.rank:
        torch.manual_seed(t.seed + dist.rank)  # different dropout masks per rank; same init (above)

    hellaswag = None
    if cfg.eval.hellaswag_interval:  # items loaded once, by rank 0 (a download for the HF copy)
        tok = tokenizer_from_meta(tokenizer)
        check_tokenizer(tok)
        hellaswag = tok, on_rank0(lambda: load_items(cfg.eval.hellaswag_data or None, cfg.eval.hellaswag_limit or None),
                                  dist, group)

    metrics = MetricsLog(out_dir, active=dist.is_main)
    logged_through = metrics.resume_at(state.iter) if resume is not None else None
    tokens_per_step = t.batch_size * block * t.grad_accum_steps
    peak, peak_note = peak_flops(device, dtype, override=t.peak_flops) if dist.is_main else (None, "")
    say(f"config:\n{to_yaml(cfg)}")
    for note in notes + ([rng.note] if rng.note else []):
        say(note)
    say(f"{dtype_note}; {peak_note}")
    say(f"device {device}, {dist.world_size} rank(s), {raw_model.num_params() / 1e6:.2f}M non-embedding params, "
        f"{tokens_per_step} tokens/step ({t.batch_size} x {block} x {t.grad_accum_steps} micro-steps), "
        + (f"resuming {ckpt_path} at iter {state.iter}" if resume is not None else f"fresh run into {out_dir}"))

    logger = WandbLogger(mode=cfg.wandb.mode, project=cfg.wandb.project, run_name=cfg.wandb.run_name,
                         run_id=state.run_id, out_dir=str(out_dir), config=cfg.to_dict(), active=dist.is_main,
                         printer=say, logged_through=logged_through)
    cleanup.push(lambda exc_type, *_: logger.finish(exit_code=1 if exc_type else 0))
    stop = StopFlag().install()
    cleanup.callback(stop.restore)
    progress = Progress(t.max_iters, state.iter, active=dist.is_main)
    cleanup.callback(progress.close)
    return Run(cfg=cfg, dist=dist, device=device, dtype=dtype, raw_model=raw_model, model=model, optimizers=optimizers,
               scaler=scaler, train_loader=train_loader, eval_loaders=eval_loaders, hellaswag=hellaswag, state=state,
               checkpointer=checkpointer, metrics=metrics, logger=logger, stop=stop, progress=progress, group=group,
               ckpt_path=ckpt_path, accum=t.grad_accum_steps // dist.world_size, tokens_per_step=tokens_per_step,
               flops_per_token=raw_model.flops_per_token(block), peak=peak, say=say)


def decide_resume(ckpt_path: Path, cfg: Config, dist: DistInfo, group) -> dict[str, Any] | None:
    """The checkpoint to resume from, or None for a fresh run. Every rank must see the same one (a
    train.out_dir shared by all nodes): the ranks compare what they found, and any difference or
    error stops every rank with the same one-line error."""
    resume, outcome = None, None
    out_dir = ckpt_path.parent
    earlier = [p.name for p in (ckpt_path, out_dir / BEST_NAME, out_dir / METRICS_NAME) if p.exists()]
    try:
        if earlier and cfg.train.resume == "never":
            raise UserError(f"{out_dir} holds an earlier run's {', '.join(earlier)} and train.resume=never refuses to "
                            "overwrite them; use --train.resume=auto to continue that run, or a new --train.out_dir")
        if earlier and not ckpt_path.exists():
            raise UserError(f"{out_dir} holds an earlier run's {', '.join(earlier)} but no {CKPT_NAME} to resume it; "
                            "a new run there would overwrite them: use a new --train.out_dir, or move those files away")
        if ckpt_path.exists():
            resume = load_checkpoint(ckpt_path)
            conflicts = resume_conflicts(resume.get("config", {}), cfg)
            if conflicts:
                raise UserError(f"cannot resume {ckpt_path}: the config changed in {'; '.join(conflicts)}; "
                                "restore those values, or train into a new --train.out_dir")
            train_state = resume.get("train") if isinstance(resume.get("train"), dict) else {}
            check_best_belongs_to(out_dir / BEST_NAME, train_state.get("run_id"))
            outcome = ("checkpoint", train_state.get("run_id"), train_state.get("iter"))
        else:
            outcome = ("fresh",)
    except UserError as e:
        outcome = ("error", str(e))
    seen = all_gather_object(outcome, dist, group)
    errors = [o[1] for o in seen if o[0] == "error"]
    if errors:
        raise UserError(errors[0])
    differ = [r for r, o in enumerate(seen) if o != seen[0]]
    if differ:
        def what(o):
            return "no checkpoint" if o[0] == "fresh" else f"run {o[1]} at iter {o[2]}"
        raise UserError(f"rank(s) {differ} see {what(seen[differ[0]])} in {ckpt_path} but rank 0 sees {what(seen[0])}; "
                        "every rank must read and write the same train.out_dir: put it on a filesystem shared by "
                        "all nodes")
    return resume


def planned_model(cfg: Config, vocab_size: int, resume: dict[str, Any] | None) -> GPTConfig | None:
    """The model this run will build, known before building it (None for another run's or HF weights)."""
    try:
        if resume is not None:
            return GPTConfig(**resume["model_config"])
        if cfg.model.init_from == "scratch":
            return cfg.model.gpt_config(max(cfg.model.vocab_size, vocab_size))
    except (KeyError, TypeError, ValueError):  # a damaged checkpoint: model_from_checkpoint says so
        pass
    return None


def check_best_belongs_to(best: Path, run_id: str | None) -> None:
    """A resumed run writes best.pt when val loss improves on ITS best: a best.pt of another run would
    be replaced by a worse model, so it must be this run's."""
    if not best.exists() or run_id is None:  # no run id: the restore reports the damaged entry
        return
    other = load_checkpoint(best).get("train", {}).get("run_id")
    if other != run_id:
        raise UserError(f"{best} belongs to another run ({other}) than {best.with_name(CKPT_NAME)} ({run_id}); resuming "
                        "could replace it with a worse model: move it away, or train into a new --train.out_dir")


def claim_out_dir(lock: DirLock, out_dir: Path) -> None:
    """One trainer per out_dir (rank 0 holds the lock): a second one would write the same checkpoints."""
    check_writable_dir(out_dir, "train.out_dir")
    holder = lock.try_acquire()
    if holder is not None:
        raise UserError(f"another trainer (pid {holder.get('pid')} on host {holder.get('host')}, since "
                        f"{holder.get('since')}) is writing to {out_dir}; wait for it or stop it, or use another "
                        "--train.out_dir")


def choose_dtype(name: str, saved: str, device: torch.device, probe) -> tuple[str, str]:
    """(dtype name, note). A resumed run keeps the dtype it chose unless train.dtype names one, so a
    resume under another load never flips it (bitwise resume needs the same dtype)."""
    if name == "auto" and saved in DTYPE_BY_NAME:
        return saved, f"dtype {saved} (chosen when this run started; --train.dtype overrides)"
    dtype, note = training_dtype(name, device, forward_backward=probe)
    return dtype_name(dtype), note


# ------------------------------------------------------------------------------------------ loop

def loop(r: Run) -> dict[str, Any]:
    """One optimizer step per iteration, then whatever is due after it."""
    t, state = r.cfg.train, r.state
    summary: dict[str, Any] = {"losses": {}, "eval": {}, "stopped": None}
    if state.iter >= t.max_iters:
        r.say(f"{r.ckpt_path} is already at iter {state.iter} >= train.max_iters={t.max_iters}; nothing to do "
              "(raise --train.max_iters to train further)")
    window = LossWindow(r.device)
    guard = NonFiniteGuard(r.device, fp16=r.scaler.is_enabled())
    r.raw_model.train()
    while state.iter < t.max_iters:
        lr = lr_at(state.iter, lr=t.lr, min_lr=t.min_lr, warmup_iters=t.warmup_iters, max_iters=t.max_iters)
        apply_lr(r.optimizers, lr, t.lr)
        batches = [r.train_loader.get_batch(state.iter, micro) for micro in range(r.accum)]
        out = r.step(batches)
        guard.observe(out, state.iter)
        state.iter += 1
        state.tokens_seen += r.tokens_per_step
        window.add(out.loss)
        r.progress.update()

        stopping = any_rank(r.stop.requested, r.dist, r.group)  # every rank stops after the same step
        due = due_after(state.iter, max_iters=t.max_iters, log_interval=t.log_interval,
                        eval_interval=t.eval_interval, checkpoint_interval=t.checkpoint_interval, stopping=stopping,
                        hellaswag_interval=r.cfg.eval.hellaswag_interval)
        if due.log or due.checkpoint:  # never log, evaluate or save poisoned weights
            guard.check(r.dist, r.group, r.ckpt_path, r.checkpointer.last_saved_iter)
        record = log_step(r, out, lr, window, summary) if due.log else {}
        window.pause()  # evals and checkpoints don't count against tokens/s
        if due.eval:
            record |= evaluate_and_keep_best(r, summary)
        if due.hellaswag:
            record |= hellaswag_step(r)
        state.elapsed_s = r.clock[1] + time.perf_counter() - r.clock[0]  # evals included, for time budgets
        r.metrics.append(state.iter, record | {"elapsed_s": state.elapsed_s} if record else record)
        if due.checkpoint:
            r.checkpointer.save(r.ckpt_path, state.iter)
        window.resume()
        if stopping:
            summary["stopped"] = r.stop.reason
            r.say(f"stopped by {r.stop.reason} after iter {state.iter}; {r.ckpt_path} written; "
                  "rerun the same command to resume")
            break

    summary.update(iter=state.iter, best_val_loss=state.best_val_loss, tokens_seen=state.tokens_seen,
                   out_dir=str(r.ckpt_path.parent), wandb_run_id=r.logger.run_id, dtype=dtype_name(r.dtype))
    if summary["eval"]:
        r.logger.summary({"val/loss": summary["eval"]["val/loss"], "val/bpb": summary["eval"]["val/bpb"],
                          "best_val_loss": state.best_val_loss})
    return summary


def log_step(r: Run, out: StepOutput, lr: float, window: LossWindow, summary: dict) -> dict[str, Any]:
    """Average the window's loss over its steps and the ranks (the window's one host sync), then show
    it (bar or line) and send it to wandb. Returns the record for metrics.jsonl."""
    step = r.state.iter
    train_loss = all_reduce_mean(window.loss / window.steps, r.dist).item()
    tok_per_sec = window.steps * r.tokens_per_step / window.elapsed()
    util = mfu(r.flops_per_token, tok_per_sec, r.peak, r.dist.world_size)
    summary["losses"][step] = train_loss
    record = {"train/loss": train_loss, "lr": lr, "grad_norm": out.grad_norm.item(), "tokens_per_sec": tok_per_sec,
              "mfu": util, "tokens_seen": r.state.tokens_seen}
    r.progress.show(step, f"loss {train_loss:.4f}, lr {lr:.2e}, tok/s {tok_per_sec:,.0f}"
                    + (f", mfu {util:.1%}" if util is not None else ""))
    r.logger.log(record, step)
    window.reset()
    return record


def evaluate_and_keep_best(r: Run, summary: dict) -> dict[str, Any]:
    """Rank 0 evaluates on the fixed eval batches; when val loss improves every rank joins in writing
    best.pt (the checkpoint gathers every rank's RNG streams). Returns the record for metrics.jsonl."""
    record: dict[str, Any] = {}
    improved = False
    if r.dist.is_main:
        losses = evaluate(r.raw_model, r.eval_loaders, r.cfg.train.eval_iters, r.amp)
        bpb = bits_per_byte(losses["val"], r.eval_loaders["val"].bytes_per_token)
        summary["eval"] = {"iter": r.state.iter, "train/loss": losses["train"], "val/loss": losses["val"], "val/bpb": bpb}
        r.say(f"iter {r.state.iter}: train loss {losses['train']:.4f}, val loss {losses['val']:.4f}, val bpb {bpb:.4f}")
        record = {"val/loss": losses["val"], "val/bpb": bpb, "eval/train_loss": losses["train"]}
        r.logger.log(record, r.state.iter)
        improved = losses["val"] < r.state.best_val_loss
        if improved:
            r.state.best_val_loss = losses["val"]
    if broadcast_object(improved, r.dist, r.group):
        r.checkpointer.save(r.ckpt_path.with_name(BEST_NAME), r.state.iter)
    return record


def hellaswag_step(r: Run) -> dict[str, Any]:
    """Every rank scores its shard of HellaSwag; the counts are summed over the ranks."""
    tok, items = r.hellaswag
    counts = evaluate_hellaswag(r.raw_model, items, tok, batch_size=r.cfg.eval.hellaswag_batch_size, autocast_ctx=r.amp,
                                rank=r.dist.rank, world_size=r.dist.world_size)
    total = torch.tensor([counts["correct"], counts["correct_norm"], counts["total"]], dtype=torch.int64)
    all_reduce_sum(total, r.dist, r.group)
    metrics = hellaswag_metrics(dict(zip(("correct", "correct_norm", "total"), total.tolist())))
    r.say(f"iter {r.state.iter}: hellaswag acc {metrics['hellaswag/acc']:.4f}, acc_norm "
          f"{metrics['hellaswag/acc_norm']:.4f} ({int(total[2])} items)")
    r.logger.log(metrics, r.state.iter)
    return metrics


if __name__ == "__main__":
    run_cli(main)
