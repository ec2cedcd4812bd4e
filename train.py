"""Train a GPT.

    python train.py --config small.yaml [--section.key=value ...]
    torchrun --standalone --nproc_per_node=N train.py --config ...       # data parallel (nccl / gloo)

Reads top to bottom: config -> devices and processes -> data -> model -> optimizer -> the loop.
Hardware switches (precision, compile, DDP) are applied from outside the model, one line each.
`<out_dir>/ckpt.pt` is always the latest complete checkpoint, `best.pt` the best val loss;
`<out_dir>/metrics.jsonl` logs every train/eval line (rank 0).
"""
from __future__ import annotations

import json
import math
import sys
import time
from contextlib import nullcontext
from pathlib import Path
from typing import Any

import torch
from tqdm import tqdm

from data import BatchLoader, load_meta, prepare_data
from errors import UserError, run_cli
from model.checkpoint import BEST_NAME, CKPT_NAME, load_checkpoint, model_config_dict, save_checkpoint
from training.compile import apply_compile
from training.config import Config, load_config, resume_conflicts, to_yaml
from training.device import resolve_device
from training.distributed import (
    all_reduce_mean, any_rank, apply_ddp, barrier, broadcast_object, cpu_group, destroy_distributed,
    dist_from_env, init_distributed,
)
from training.evaluate import bits_per_byte, evaluate
from training.mfu import mfu, peak_flops
from training.model_init import build_model
from training.optim import make_optimizer
from training.precision import DTYPE_BY_NAME, allow_tf32, autocast, make_scaler, resolve_dtype
from training.rng import get_rng_state, seed_everything, set_rng_state
from training.schedule import lr_at
from training.signals import StopFlag
from training.wandb_logger import WandbLogger


def main(argv: list[str] | None = None) -> int:
    cfg = load_config(sys.argv[1:] if argv is None else argv)
    train(cfg)
    return 0


def train(cfg: Config) -> dict[str, Any]:
    """Run (or resume) the training described by cfg. Returns a summary: the logged train losses by
    iteration, the last eval, best val loss, final iteration and why it stopped."""
    t = cfg.train
    dist = dist_from_env()
    if t.grad_accum_steps % dist.world_size:
        raise UserError(f"train.grad_accum_steps={t.grad_accum_steps} (global) is not divisible by the "
                        f"{dist.world_size} ranks; use a multiple of {dist.world_size}")
    accum = t.grad_accum_steps // dist.world_size  # micro-steps per rank per optimizer step
    device = resolve_device(t.device, dist.local_rank)
    init_distributed(dist, device)
    main_rank = dist.is_main
    say = tqdm.write if main_rank else (lambda *a, **k: None)
    stop = StopFlag()
    logger: WandbLogger | None = None
    bar = None
    failed = True
    model = None
    try:
        # ---- output dir, resume decision
        out_dir = Path(t.out_dir)
        ckpt_path = out_dir / CKPT_NAME
        resume = None
        if ckpt_path.exists():
            if t.resume == "never":
                raise UserError(f"{ckpt_path} exists and train.resume=never refuses to overwrite it; "
                                "use --train.resume=auto to continue that run, or a new --train.out_dir")
            resume = load_checkpoint(ckpt_path)
            conflicts = resume_conflicts(resume.get("config", {}), cfg)
            if conflicts:
                raise UserError(f"cannot resume {ckpt_path}: the config changed in {'; '.join(conflicts)}; "
                                "restore those values, or train into a new --train.out_dir")

        # ---- data (rank 0 prepares; the others wait, then find it up to date)
        if main_rank:
            data_dir = prepare_data(cfg.data, progress=True)
        barrier(dist)
        if not main_rank:
            data_dir = prepare_data(cfg.data, progress=False)
        meta = load_meta(data_dir)
        tokenizer = {"tokenizer": meta["tokenizer"], "chars": meta["chars"]}
        if resume is not None and resume.get("tokenizer") != tokenizer:
            raise UserError(f"cannot resume {ckpt_path}: it was trained with tokenizer "
                            f"{resume.get('tokenizer', {}).get('tokenizer')!r} and different data; "
                            "use the original data settings, or a new --train.out_dir")

        # ---- precision (rank 0 measures on CPU; every rank uses its choice)
        dtype_name, measured, dtype_note = broadcast_object(_dtype_choice(t.dtype, device) if main_rank else None, dist)
        dtype = DTYPE_BY_NAME[dtype_name]
        allow_tf32(device)

        # ---- model, optimizer, scaler
        seed_everything(t.seed)
        raw_model, notes = build_model(cfg.model, vocab_size=meta["vocab_size"], tokenizer=tokenizer,
                                       seed=t.seed, resume=resume)
        raw_model.to(device)
        optimizer = make_optimizer(raw_model, lr=t.lr, weight_decay=t.weight_decay, betas=(t.beta1, t.beta2),
                                   device_type=device.type)
        scaler = make_scaler(device, dtype)
        if resume is not None:
            optimizer.load_state_dict(resume["optimizer"])
            if scaler.is_enabled() and resume.get("scaler"):
                scaler.load_state_dict(resume["scaler"])
        model = apply_compile(raw_model, t.compile)  # raw_model stays the plain module: saved, evaluated
        model = apply_ddp(model, dist, device)

        # ---- data loaders: training batches by (seed, step, micro, rank); fixed eval batches
        block = cfg.model.block_size
        train_loader = BatchLoader(data_dir, "train", block_size=block, batch_size=t.batch_size, seed=t.seed,
                                   rank=dist.rank, world_size=dist.world_size, device=device)
        if resume is not None:
            train_loader.load_state_dict(resume["loader"])
        eval_loaders = {split: BatchLoader(data_dir, split, block_size=block, batch_size=t.batch_size,
                                           seed=t.eval_seed, device=device) for split in ("train", "val")} if main_rank else {}

        # ---- state, logging
        start_iter = int(resume["iter"]) if resume else 0
        best_val = float(resume["best_val_loss"]) if resume else math.inf
        tokens_seen = int(resume["tokens_seen"]) if resume else 0
        tokens_per_step = t.batch_size * block * t.grad_accum_steps
        flops_per_token = raw_model.flops_per_token(block)
        peak, peak_note = peak_flops(device, dtype, override=t.peak_flops, measured=measured) if main_rank else (None, "")
        say(f"config:\n{to_yaml(cfg)}")
        for note in notes:
            say(note)
        say(f"{dtype_note}; {peak_note}")
        say(f"device {device}, {dist.world_size} rank(s), {raw_model.num_params() / 1e6:.2f}M non-embedding params, "
            f"{tokens_per_step} tokens/step ({t.batch_size} x {block} x {t.grad_accum_steps} micro-steps), "
            + (f"resuming {ckpt_path} at iter {start_iter}" if resume else f"fresh run into {out_dir}"))
        logger = WandbLogger(mode=cfg.wandb.mode, project=cfg.wandb.project, run_name=cfg.wandb.run_name,
                             run_id=resume.get("wandb_run_id") if resume else None, out_dir=str(out_dir),
                             config=cfg.to_dict(), active=main_rank, printer=say)
        if resume is not None:
            set_rng_state(resume["rng"])  # last, so nothing above consumes the restored streams
        elif dist.rank:
            torch.manual_seed(t.seed + dist.rank)  # different dropout masks per rank; same init (above)
        flag_group = cpu_group(dist, device)
        stop.install()

        def checkpoint_payload(iter_num: int) -> dict[str, Any]:
            return {"model": raw_model.state_dict(), "model_config": model_config_dict(raw_model),
                    "config": cfg.to_dict(), "tokenizer": tokenizer, "optimizer": optimizer.state_dict(),
                    "scaler": scaler.state_dict() if scaler.is_enabled() else None, "iter": iter_num,
                    "best_val_loss": best_val, "tokens_seen": tokens_seen, "loader": train_loader.state_dict(),
                    "rng": get_rng_state(), "wandb_run_id": logger.run_id}

        # ---- the loop
        result: dict[str, Any] = {"losses": {}, "eval": {}, "stopped": None}
        if start_iter >= t.max_iters:
            say(f"{ckpt_path} is already at iter {start_iter} >= train.max_iters={t.max_iters}; nothing to do "
                "(raise --train.max_iters to train further)")
        bad = torch.zeros((), dtype=torch.bool, device=device)  # sticky: any non-finite loss/grad so far
        first_bad = torch.full((), -1, dtype=torch.long, device=device)
        loss_window = torch.zeros((), device=device)  # sum of step losses since the last log line
        window_steps, window_time, last_saved = 0, 0.0, start_iter if resume else None
        bar = tqdm(total=t.max_iters, initial=start_iter, disable=not main_rank, dynamic_ncols=True, desc="train")
        step = start_iter
        raw_model.train()
        t_mark = time.perf_counter()
        while step < t.max_iters:
            lr = lr_at(step, lr=t.lr, min_lr=t.min_lr, warmup_iters=t.warmup_iters, max_iters=t.max_iters)
            for group in optimizer.param_groups:
                group["lr"] = lr
            step_loss = torch.zeros((), device=device)
            for micro in range(accum):  # no host sync in here: losses stay on the device
                x, y = train_loader.get_batch(step, micro)
                sync = model.no_sync() if dist.enabled and micro < accum - 1 else nullcontext()
                with sync:
                    with autocast(device, dtype):
                        _, loss = model(x, y, return_logits=False)  # fused head + loss, no (B, T, V) logits
                    if step == t.debug_nan_at_iter:
                        loss = loss * float("nan")
                    loss = loss / accum
                    scaler.scale(loss).backward()
                step_loss += loss.detach()
            scaler.unscale_(optimizer)
            grad_norm = torch.nn.utils.clip_grad_norm_(raw_model.parameters(), t.grad_clip if t.grad_clip > 0 else math.inf)
            scaler.step(optimizer)
            scaler.update()
            optimizer.zero_grad(set_to_none=True)
            # with a GradScaler an inf grad norm is normal (the step is skipped and the scale lowered)
            nonfinite = ~torch.isfinite(step_loss) if scaler.is_enabled() else ~(torch.isfinite(step_loss) & torch.isfinite(grad_norm))
            first_bad = torch.where(nonfinite & (first_bad < 0), step, first_bad)
            bad |= nonfinite
            step += 1
            tokens_seen += tokens_per_step
            loss_window += step_loss
            window_steps += 1
            bar.update(1)

            if step == t.debug_interrupt_at_iter:
                stop.request("debug_interrupt_at_iter")
            stopping = any_rank(stop.requested, dist, flag_group)  # every rank stops after the same step
            last = step == t.max_iters
            eval_step = step % t.eval_interval == 0 or last
            do_ckpt = (step % (t.checkpoint_interval or t.eval_interval) == 0) or last or stopping
            do_log = step % t.log_interval == 0 or last or stopping or eval_step  # same on every rank
            do_eval = main_rank and eval_step

            if do_log or do_ckpt:  # never log, evaluate or save poisoned weights
                if any_rank(bool(bad.item()), dist, flag_group):
                    kept = f"{ckpt_path} still holds iter {last_saved}" if last_saved is not None else "no checkpoint was written"
                    raise UserError(f"loss or grad norm became non-finite at iter {int(first_bad.item())}; stopped, "
                                    f"{kept}; lower train.lr, raise train.warmup_iters or use bfloat16/float32, then rerun")
            if do_log:
                train_loss = all_reduce_mean(loss_window / window_steps, dist).item()  # the sync of this window
                window_time += time.perf_counter() - t_mark
                tok_per_sec = window_steps * tokens_per_step / window_time
                util = mfu(flops_per_token, tok_per_sec, peak, dist.world_size)
                result["losses"][step] = train_loss
                metrics = {"train/loss": train_loss, "lr": lr, "grad_norm": grad_norm.item(),
                           "tokens_per_sec": tok_per_sec, "mfu": util, "tokens_seen": tokens_seen}
                bar.set_postfix_str(f"loss {train_loss:.4f} lr {lr:.2e} tok/s {tok_per_sec:,.0f}"
                                    + (f" mfu {util:.1%}" if util is not None else ""), refresh=False)
                logger.log(metrics, step)
                _append_jsonl(out_dir, main_rank, {"iter": step, **metrics})
                loss_window.zero_()
                window_steps, window_time = 0, 0.0
            else:
                window_time += time.perf_counter() - t_mark
            if do_eval:
                losses = evaluate(raw_model, eval_loaders, t.eval_iters, lambda: autocast(device, dtype))
                bpb = bits_per_byte(losses["val"], eval_loaders["val"].bytes_per_token)
                result["eval"] = {"iter": step, "train/loss": losses["train"], "val/loss": losses["val"], "val/bpb": bpb}
                say(f"iter {step}: train loss {losses['train']:.4f}, val loss {losses['val']:.4f}, val bpb {bpb:.4f}")
                logger.log({"val/loss": losses["val"], "val/bpb": bpb, "eval/train_loss": losses["train"]}, step)
                _append_jsonl(out_dir, main_rank, {"iter": step, "val/loss": losses["val"], "val/bpb": bpb,
                                                   "eval/train_loss": losses["train"]})
                if losses["val"] < best_val:
                    best_val = losses["val"]
                    save_checkpoint(out_dir / BEST_NAME, checkpoint_payload(step))
            if do_ckpt:
                if main_rank:
                    save_checkpoint(ckpt_path, checkpoint_payload(step))
                last_saved = step
            if stopping:
                result["stopped"] = stop.reason
                say(f"stopped by {stop.reason} after iter {step}; {ckpt_path} written; rerun the same command to resume")
                break
            t_mark = time.perf_counter()

        result.update(iter=step, best_val_loss=best_val, tokens_seen=tokens_seen, out_dir=str(out_dir),
                      wandb_run_id=logger.run_id, dtype=dtype_name)
        if result["eval"]:
            logger.summary({"val/loss": result["eval"]["val/loss"], "val/bpb": result["eval"]["val/bpb"],
                            "best_val_loss": best_val})
        failed = False
        return result
    finally:
        if bar is not None:
            bar.close()
        stop.restore()
        if logger is not None:
            logger.finish(exit_code=1 if failed else 0)
        # Drop the DDP wrapper while its process group is still registered: freed after
        # destroy_process_group, the gloo group's destructor joins a worker thread that may be waiting
        # for the GIL this thread holds (seen as a rare hang at exit of a 2-rank gloo run).
        model = None
        destroy_distributed(healthy=not failed)


def _dtype_choice(name: str, device: torch.device) -> tuple[str, dict[str, float], str]:
    dtype, measured, note = resolve_dtype(name, device)
    return {v: k for k, v in DTYPE_BY_NAME.items()}[dtype], measured, note


def _append_jsonl(out_dir: Path, main_rank: bool, record: dict[str, Any]) -> None:
    if main_rank:
        out_dir.mkdir(parents=True, exist_ok=True)
        with open(out_dir / "metrics.jsonl", "a", encoding="utf-8") as f:
            f.write(json.dumps(record) + "\n")


if __name__ == "__main__":
    run_cli(main)
