"""Train a GPT.

    python train.py --config small.yaml [--section.key=value ...]
    torchrun --standalone --nproc_per_node=N train.py --config ...       # data parallel (nccl / gloo)
    torchrun ... train.py --config ... --train.parallel=fsdp           # sharded: weights, grads, optimizer

Reads top to bottom: `set_up` builds the run (resume decision, data, precision, model, optimizers,
the checkpointed states, logging), `loop` runs one `train_step` per iteration and then whatever is due
(log, eval, checkpoint, stop), and `train` tears everything down. Hardware switches (precision,
compile, DDP or FSDP) are applied from outside the model, one line each. `<out_dir>/ckpt.pt` is always
the latest complete checkpoint, `best.pt` the best val loss (ckpt.dcp/ and best.dcp/, sharded, with
train.parallel=fsdp), `metrics.jsonl` every logged step (rank 0).
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
from tqdm import tqdm

from checkpoint import Checkpointer, claim_out_dir, decide_resume
from data import BatchLoader, hold_data, load_meta, prepare_data, tokenizer_entry, tokenizer_from_meta
from errors import UserError, run_cli
from eval.hellaswag import check_tokenizer, evaluate_hellaswag, hellaswag_metrics, load_items
from model import GPT
from runtime.device import resolve_device, with_compile_fallback
from runtime.loss_path import use_loss_path
from runtime.memory import keep_freed_memory
from runtime.precision import DTYPE_BY_NAME, allow_tf32, autocast, make_scaler
from training.builders import (
    build_checkpointer, build_loaders, build_model, build_optimizers, check_memory, choose_dtype, dtype_shape, parallelize,
    set_loss_product, shard_model,
)
from training.budget import fit_to_budget
from training.batch_size import divisors, plan_batch
from training.config import (AUTO_BATCH, Config, TrainSection, keep_what_older_runs_did, load_config,
                             resume_conflicts, to_yaml)
from training.distributed import (
    DistInfo, all_gather_object, all_reduce_mean, all_reduce_sum, any_rank, broadcast_object, control_group,
    destroy_distributed, dist_from_env, init_distributed, on_rank0,
)
from training.evaluate import bits_per_byte, evaluate, evaluate_full
from training.float8 import check_float8, convert_to_float8
from training.health import NonFiniteGuard
from training.metrics import METRICS_NAME, LossWindow, MetricsLog, Progress, console_guard
from training.mfu import mfu, peak_flops
from training.rng import seed_everything
from training.schedule import apply_lr, due_after, lr_at
from training.state_size import shard_counts, state_bytes
from training.signals import StopFlag
from training.state import TrainState
from training.step import StepOutput, forward_backward_probe, train_step
from training.wandb_logger import WandbLogger

if __name__ == "__main__":  # the imports are done: Ctrl-C is a KeyboardInterrupt again (run_cli says it)
    errors.start_up_done()


def main(argv: list[str] | None = None) -> int:
    cfg = load_config(sys.argv[1:] if argv is None else argv)
    with console_guard():  # a closed or full stdout never stops a run (training/metrics.py's Console)
        train(cfg)
    return 0


def train(cfg: Config) -> dict[str, Any]:
    """Run (or resume) the training described by cfg. Returns a summary: the logged train losses by
    iteration, the last eval, best val loss, final iteration and why it stopped."""
    dist = dist_from_env()
    check_world_size(cfg.train, dist.world_size)
    started = time.perf_counter()
    device = resolve_device(cfg.train.device, dist.local_rank)
    check_float8(cfg.train.float8, device)
    init_distributed(dist, device)
    failed = True
    try:
        with ExitStack() as cleanup:  # closes the progress bar, restores signal handlers, finishes wandb
            run = set_up(cfg, dist, device, cleanup)
            run.clock = (started, run.state.elapsed_s)
            fit_to_budget(run)  # train.time_budget: max_iters and the schedule sized to this machine
            summary = loop(run)
            failed = False
            return summary
    finally:
        # DDP's wrapper must be gone while its process group is still registered: freed after
        # destroy_process_group, the gloo group's destructor can wait for the GIL this thread holds
        run = None
        destroy_distributed(healthy=not failed)


def check_world_size(t: TrainSection, world_size: int) -> None:
    """The global batch (train.grad_accum_steps micro-batches of train.batch_size) is split evenly over
    the ranks, whatever their number: a run saved on N ranks resumes on M by giving each rank accum / M
    micro-steps. An M that does not divide it cannot keep the global batch: one line with the options.
    With batch_size auto, the ranks share train.global_batch_size's sequences the same way."""
    auto = t.batch_size == AUTO_BATCH
    key, n = ("train.global_batch_size", t.global_batch_size) if auto else ("train.grad_accum_steps", t.grad_accum_steps)
    if n % world_size:
        raise UserError(f"{key}={n}{'' if auto else ' (global)'} is not divisible by the {world_size} ranks, so they "
                        f"cannot share {'it' if auto else 'its global batch'}; run on {', '.join(map(str, divisors(n)))} "
                        f"rank(s), or (a new run) set {key} to a multiple of {world_size}")


# ---------------------------------------------------------------------------------------- set-up

@dataclass
class Run:
    """What the loop needs, built once by set_up."""
    cfg: Config
    dist: DistInfo
    group: Any  # the CPU control group of the ranks (None on one process)
    device: torch.device
    model: GPT  # the plain module: saved and evaluated
    step: Stepper  # one optimizer step on this rank's micro-batches
    amp: Callable[[], Any]  # autocast context for evals
    accum: int  # micro-steps per rank per optimizer step
    train_loader: BatchLoader
    eval_loaders: dict[str, BatchLoader]  # rank 0 only
    hellaswag: tuple | None  # (tokenizer, items) when eval.hellaswag_interval is set
    state: TrainState
    checkpointer: Checkpointer
    log: RunLog
    stop: StopFlag
    clock: tuple[float, float] = (0.0, 0.0)  # (perf_counter at start, elapsed_s of earlier sessions)


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
    peak: float | None


class Stepper:
    """train_step on the parallelized model; if torch.compile fails (no C++ compiler for Inductor on a
    CPU, an unsupported GPU) the step is redone from the same state without compile, and the run goes on
    eager (runtime/device.py's with_compile_fallback, the policy sample.py follows too)."""

    def __init__(self, model: GPT, optimizers, scaler, cfg: Config, dist: DistInfo, device, amp, say):
        self.raw, self.optimizers, self.scaler, self.amp, self.say = model, optimizers, scaler, amp, say
        self.t, self.dist, self.device = cfg.train, dist, device
        self.model = parallelize(model, cfg.train, dist, device)
        self.compiled = cfg.train.compile

    def __call__(self, batches) -> StepOutput:
        return with_compile_fallback(
            lambda: train_step(self.model, self.optimizers, self.scaler, batches, amp=self.amp,
                               grad_clip=self.t.grad_clip),
            compiled=self.compiled, go_eager=self.go_eager, say=self.say)

    def go_eager(self) -> None:
        for opt in self.optimizers:
            opt.zero_grad(set_to_none=True)  # a failed backward may have left partial gradients
        self.model = parallelize(self.raw, self.t, self.dist, self.device, compile=False)
        self.compiled = False


def set_up(cfg: Config, dist: DistInfo, device: torch.device, cleanup: ExitStack) -> Run:
    t = cfg.train
    say = tqdm.write if dist.is_main else (lambda *a, **k: None)
    group = control_group(dist)
    out_dir = Path(t.out_dir)

    locks: list = []  # rank 0 holds the out_dir's lock; a taken out_dir stops every rank
    on_rank0(lambda: locks.append(claim_out_dir(out_dir, say)), dist, group)
    cleanup.callback(lambda: [lock.release() for lock in locks])
    resume = decide_resume(out_dir, mode=t.resume, config_conflicts=lambda saved: resume_conflicts(saved, cfg),
                           gather=lambda o: all_gather_object(o, dist, group), other_files=(METRICS_NAME,))
    for note in keep_what_older_runs_did(resume.config, cfg) if resume is not None else ():
        say(note)
    # rank 0 prepares the data (or finds it up to date); the others wait, then read only meta.json
    data_dir = Path(on_rank0(lambda: str(prepare_data(cfg.data, progress=True)), dist, group))
    cleanup.callback(hold_data(data_dir, f"the training run into {out_dir}"))  # never rebuilt under this run
    meta = load_meta(data_dir)
    tokenizer = tokenizer_entry(meta)
    if resume is not None and resume.tokenizer != tokenizer:
        raise UserError(f"cannot resume {resume.path}: it was trained with tokenizer "
                        f"{(resume.tokenizer or {}).get('tokenizer')!r} and different data; "
                        "use the original data settings, or a new --train.out_dir")

    check_memory(cfg, meta["vocab_size"], resume, device, dist)  # before allocating anything big
    seed_everything(t.seed)
    model, notes = build_model(cfg, vocab_size=meta["vocab_size"], tokenizer=tokenizer, resume=resume, device=device)
    if device.type == "cpu":
        keep_freed_memory()  # the next step reuses what this one frees: no page faults per step
    use_loss_path(model, device, compiled=t.compile)  # the probes below run the real loss path
    if t.batch_size != AUTO_BATCH:  # the product a micro-batch runs, chosen before the dtype probe times it
        product, product_note = set_loss_product(model, resume, device, t.batch_size * cfg.model.block_size, dist, group)
    # precision: rank 0 decides (on a CPU by timing this model's forward and backward in each candidate, on
    # the first micro-batch; batch_size auto: of 1 sequence), every rank uses its choice, and a resumed run
    # keeps the one it made
    rows = 1 if t.batch_size == AUTO_BATCH else t.batch_size
    loaders = build_loaders(cfg, data_dir, dist, device, batch_size=rows)
    probe = forward_backward_probe(model, loaders[0].get_batch(0, 0), lambda dt: autocast(device, dt))
    name, dtype_note = on_rank0(lambda: choose_dtype(t.dtype, resume, device, probe, run_steps=t.max_iters,
                                                     shape=dtype_shape(model, rows, dist)), dist, group)
    dtype = DTYPE_BY_NAME[name]
    allow_tf32(device)

    def amp():
        return autocast(device, dtype)
    float8_layers = convert_to_float8(model, t.float8)  # before FSDP and the optimizers: it swaps modules
    model = shard_model(model, t, dist, device, dtype)  # activation checkpointing, FSDP: before the optimizers
    # the micro-batch: train.batch_size, or (auto) the largest that fits, measured on this model in this
    # dtype, with the micro-steps that keep train.global_batch_size; a resumed run keeps its choice
    batch = plan_batch(t, model, resume.train if resume is not None else {}, device, dist, group, dtype=dtype,
                       block_size=cfg.model.block_size, vocab_size=meta["vocab_size"])
    if t.batch_size == AUTO_BATCH:  # for the micro-batch auto picked
        product, product_note = set_loss_product(model, resume, device, batch.micro * cfg.model.block_size, dist, group)
    train_loader, eval_loaders = (loaders if batch.micro == rows else
                                  build_loaders(cfg, data_dir, dist, device, batch_size=batch.micro))
    optimizers = build_optimizers(model, t, device)
    scaler = make_scaler(device, dtype)
    step = Stepper(model, optimizers, scaler, cfg, dist, device, amp, say)  # loss path, compile, DDP
    state = TrainState(dtype=name, micro_batch=batch.micro if t.batch_size == AUTO_BATCH else 0, batch_note=batch.note,
                       loss_product=product)
    checkpointer, rng = build_checkpointer(out_dir, dist, group, model=model, optimizers=optimizers, scaler=scaler,
                                           loader=train_loader, state=state, cfg=cfg, tokenizer=tokenizer)
    if resume is not None:
        checkpointer.restore(resume)
        state.dtype = name  # kept from the checkpoint unless train.dtype overrides it (choose_dtype)
        state.loss_product = product  # what the checkpoint said, or torch.mm where it predates the choice
    elif dist.rank:
        torch.manual_seed(t.seed + dist.rank)  # different dropout masks per rank; same init (above)

    hellaswag = None
    if cfg.eval.hellaswag_interval:  # items loaded once, by rank 0 (a download for the HF copy)
        tok = tokenizer_from_meta(tokenizer)
        check_tokenizer(tok)
        hellaswag = tok, on_rank0(lambda: load_items(cfg.eval.hellaswag_data or None, cfg.eval.hellaswag_limit or None),
                                  dist, group)

    metrics = MetricsLog(out_dir, active=dist.is_main)
    history = metrics.resume_at(state.iter) if resume is not None else None
    tokens_per_step = batch.micro * cfg.model.block_size * batch.accum
    peak, peak_note = peak_flops(device, dtype, override=t.peak_flops) if dist.is_main else (None, "")
    say(f"config:\n{to_yaml(cfg)}")
    for note in notes + ([rng.note] if rng.note else []):
        say(note)
    say(f"{dtype_note}; {peak_note}")
    if product_note and dtype == torch.float32:  # in bf16/fp16 the head's products are the autocast dtype's
        say(product_note)
    if float8_layers:
        say(f"float8 ({t.float8} scaling) in {float8_layers} Linear layers of the blocks"
            + ("" if t.compile else "; eager float8 is slower than bf16: set train.compile=true for its speed"))
    if batch.note:
        say(batch.note)
    say(memory_line(t.parallel, dist, model, optimizers))
    say(f"device {device}, {dist.world_size} rank(s), {model.num_params() / 1e6:.2f}M non-embedding params, "
        f"{tokens_per_step} tokens/step ({batch.micro} x {cfg.model.block_size} x {batch.accum} micro-steps), "
        + (f"resuming {resume.path} at iter {state.iter}" if resume is not None else f"fresh run into {out_dir}"))

    logger = WandbLogger(mode=cfg.wandb.mode, project=cfg.wandb.project, run_name=cfg.wandb.run_name,
                         run_id=state.run_id, out_dir=str(out_dir), config=cfg.to_dict(), active=dist.is_main,
                         printer=say, history=history)
    cleanup.push(lambda exc_type, *_: logger.finish(exit_code=1 if exc_type else 0))
    stop = StopFlag().install()
    cleanup.callback(stop.restore)
    progress = Progress(t.max_iters, state.iter, active=dist.is_main)
    cleanup.callback(progress.close)
    log = RunLog(say=say, progress=progress, metrics=metrics, wandb=logger, tokens_per_step=tokens_per_step,
                 flops_per_token=model.flops_per_token(cfg.model.block_size), peak=peak)
    return Run(cfg=cfg, dist=dist, group=group, device=device, model=model, step=step, amp=amp,
               accum=batch.accum // dist.world_size, train_loader=train_loader, eval_loaders=eval_loaders,
               hellaswag=hellaswag, state=state, checkpointer=checkpointer, log=log, stop=stop)


def memory_line(parallel: str, dist: DistInfo, model: GPT, optimizers: list) -> str:
    """What each rank holds of the parameters, their gradients and the optimizer state (rank 0's)."""
    local, whole = shard_counts(model)
    mb = state_bytes(model, optimizers) / 1e6
    if not dist.enabled:
        return f"1 rank: {whole:,} parameters, {mb:.2f} MB of parameters, gradients and optimizer state"
    return (f"{parallel}: {dist.world_size} ranks, {local:,} of {whole:,} parameters on this rank, {mb:.2f} MB of "
            "parameters, gradients and optimizer state per rank")


# ------------------------------------------------------------------------------------------ loop

def loop(r: Run) -> dict[str, Any]:
    """One optimizer step per iteration, then whatever is due after it."""
    t, state = r.cfg.train, r.state
    summary: dict[str, Any] = {"losses": {}, "eval": {}, "stopped": None}
    if state.iter >= t.max_iters:
        r.log.say(f"{r.checkpointer.latest} is already at iter {state.iter} >= train.max_iters={t.max_iters}; nothing to do "
              "(raise --train.max_iters to train further)")
    window = LossWindow(r.device)
    guard = NonFiniteGuard(r.device, fp16=r.step.scaler.is_enabled())
    r.model.train()
    while state.iter < t.max_iters:
        lr = lr_at(state.iter, lr=t.lr, min_lr=t.min_lr, warmup_iters=t.warmup_iters, max_iters=t.max_iters)
        apply_lr(r.step.optimizers, lr, t.lr)
        batches = [r.train_loader.get_batch(state.iter, micro) for micro in range(r.accum)]
        out = r.step(batches)
        guard.observe(out, state.iter)
        state.iter += 1
        state.tokens_seen += r.log.tokens_per_step
        window.add(out.loss)
        r.log.progress.update()

        stopping = any_rank(r.stop.requested, r.dist, r.group)  # every rank stops after the same step
        due = due_after(state.iter, max_iters=t.max_iters, log_interval=t.log_interval,
                        eval_interval=t.eval_interval, checkpoint_interval=t.checkpoint_interval, stopping=stopping,
                        hellaswag_interval=r.cfg.eval.hellaswag_interval)
        if due.log or due.checkpoint:  # never log, evaluate or save poisoned weights
            guard.check(r.dist, r.group, r.checkpointer.latest, r.checkpointer.last_saved_iter)
        record = log_step(r, out, lr, window, summary) if due.log else {}
        window.pause()  # evals and checkpoints don't count against tokens/s
        if due.eval:
            record |= evaluate_and_keep_best(r, summary, full=t.eval_full and state.iter == t.max_iters)
        if due.hellaswag:
            record |= hellaswag_step(r)
        state.elapsed_s = r.clock[1] + time.perf_counter() - r.clock[0]  # evals included, for time budgets
        r.log.metrics.append(state.iter, record | {"elapsed_s": state.elapsed_s} if record else record)
        if due.checkpoint:
            r.checkpointer.save(state.iter)
        window.resume()
        if stopping:
            summary["stopped"] = r.stop.reason
            r.log.say(f"stopped by {r.stop.reason} after iter {state.iter}; {r.checkpointer.latest} written; "
                  "rerun the same command to resume")
            break

    summary.update(iter=state.iter, best_val_loss=state.best_val_loss, tokens_seen=state.tokens_seen,
                   out_dir=str(r.checkpointer.out_dir), wandb_run_id=r.log.wandb.run_id, dtype=state.dtype)
    if summary["eval"]:
        r.log.wandb.summary({k: v for k, v in summary["eval"].items() if k.startswith("val/")}
                            | {"best_val_loss": state.best_val_loss})
    return summary


def log_step(r: Run, out: StepOutput, lr: float, window: LossWindow, summary: dict) -> dict[str, Any]:
    """Average the window's loss over its steps and the ranks (the window's one host sync), then show
    it (bar or line) and send it to wandb. Returns the record for metrics.jsonl."""
    step = r.state.iter
    train_loss = all_reduce_mean(window.loss / window.steps, r.dist).item()
    tok_per_sec = window.steps * r.log.tokens_per_step / window.elapsed()
    util = mfu(r.log.flops_per_token, tok_per_sec, r.log.peak, r.dist.world_size)
    summary["losses"][step] = train_loss
    record = {"train/loss": train_loss, "lr": lr, "grad_norm": out.grad_norm.item(), "tokens_per_sec": tok_per_sec,
              "mfu": util, "tokens_seen": r.state.tokens_seen}
    r.log.progress.show(step, f"loss {train_loss:.4f}, lr {lr:.2e}, tok/s {tok_per_sec:,.0f}"
                    + (f", mfu {util:.1%}" if util is not None else ""))
    r.log.wandb.log(record, step)
    window.reset()
    return record


def evaluate_and_keep_best(r: Run, summary: dict, full: bool = False) -> dict[str, Any]:
    """Rank 0 evaluates on the fixed eval batches (and with `full`, on the whole val split); when val loss
    improves every rank joins in writing best.pt (the checkpoint gathers every rank's RNG streams).
    Returns the record for metrics.jsonl."""
    record: dict[str, Any] = {}
    improved = False
    if r.eval_loaders and not r.dist.is_main:  # FSDP: every rank takes part in each forward; rank 0 reports
        evaluate(r.model, r.eval_loaders, r.cfg.train.eval_iters, r.amp)
        if full:
            evaluate_full(r.model, r.eval_loaders["val"], r.amp)
    if r.dist.is_main:
        losses = evaluate(r.model, r.eval_loaders, r.cfg.train.eval_iters, r.amp)
        bpb = bits_per_byte(losses["val"], r.eval_loaders["val"].bytes_per_token)
        summary["eval"] = {"iter": r.state.iter, "train/loss": losses["train"], "val/loss": losses["val"], "val/bpb": bpb}
        r.log.say(f"iter {r.state.iter}: train loss {losses['train']:.4f}, val loss {losses['val']:.4f}, val bpb {bpb:.4f}")
        record = {"val/loss": losses["val"], "val/bpb": bpb, "eval/train_loss": losses["train"]}
        if full:
            val = r.eval_loaders["val"]
            loss = evaluate_full(r.model, val, r.amp)
            full_bpb = bits_per_byte(loss, val.bytes_per_token)
            r.log.say(f"iter {r.state.iter}: the whole val split ({val.num_windows() * val.block_size:,} tokens): "
                      f"val loss {loss:.4f}, val bpb {full_bpb:.4f}")
            record |= {"val/loss_full": loss, "val/bpb_full": full_bpb}
            summary["eval"] |= {"val/loss_full": loss, "val/bpb_full": full_bpb}
        r.log.wandb.log(record, r.state.iter)
        improved = losses["val"] < r.state.best_val_loss
        if improved:
            r.state.best_val_loss = losses["val"]
    if broadcast_object(improved, r.dist, r.group):
        r.checkpointer.save(r.state.iter, best=True)
    return record


def hellaswag_step(r: Run) -> dict[str, Any]:
    """Every rank scores its shard of HellaSwag; the counts are summed over the ranks."""
    tok, items = r.hellaswag
    # FSDP: every rank takes part in each forward, so every rank scores every item (the ranks' shards of
    # the items could need different numbers of forwards), and the counts are not summed
    whole = r.cfg.train.parallel == "fsdp"
    counts = evaluate_hellaswag(r.model, items, tok, batch_size=r.cfg.eval.hellaswag_batch_size, autocast_ctx=r.amp,
                                rank=0 if whole else r.dist.rank, world_size=1 if whole else r.dist.world_size)
    total = torch.tensor([counts["correct"], counts["correct_norm"], counts["total"]], dtype=torch.int64)
    if not whole:
        all_reduce_sum(total, r.dist, r.group)
    metrics = hellaswag_metrics(dict(zip(("correct", "correct_norm", "total"), total.tolist())))
    r.log.say(f"iter {r.state.iter}: hellaswag acc {metrics['hellaswag/acc']:.4f}, acc_norm "
          f"{metrics['hellaswag/acc_norm']:.4f} ({int(total[2])} items)")
    r.log.wandb.log(metrics, r.state.iter)
    return metrics


if __name__ == "__main__":
    run_cli(main)
