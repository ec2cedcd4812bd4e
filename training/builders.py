"""The parts of a training run, one builder each (torchtitan's shape). train.py chains them; the benchmark
calls the same ones, so what it times is what train.py runs.

    check_memory(cfg, vocab_size, resume, device)        # refuse what can't fit, before allocating
    model, notes = build_model(cfg, ...)                 # fresh, resumed, another run's or HF weights
    set_loss_product(model, resume, device, tokens, dist)  # the fused loss's weight-gradient product, measured once
    dtype, note = choose_dtype(cfg.train.dtype, resume, device, probe)
    model = shard_model(model, cfg.train, dist, device, dtype)  # activation checkpointing, FSDP (before the optimizers)
    batch = plan_batch(cfg.train, model, ...)           # training/batch_size.py: the config's, or auto's choice
    train_loader, eval_loaders = build_loaders(cfg, data_dir, dist, device, batch_size=batch.micro)
    optimizers = build_optimizers(model, cfg.train, device)
    step_model = parallelize(model, cfg.train, dist, device)   # loss path, compile, DDP: one line each
    checkpointer = build_checkpointer(out_dir, dist, model=..., optimizers=..., ...)

A new hardware switch (FSDP: shard_model; float8) is one more function here that train.py calls in order.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any, Callable

import torch
import torch.nn as nn

from checkpoint import Checkpointer, Resume, model_config_dict
from data import BatchLoader
from model import GPT, GPTConfig
from runtime.choices import auto_dtype
from runtime.loss_path import (DEFAULT_PRODUCT, WEIGHT_GRAD_PRODUCTS, choose_loss_chunk_rows, choose_weight_grad_product,
                               use_loss_path, use_weight_grad_product, weight_grad_product_available)
from runtime.memory import check_fits, training_bytes
from runtime.precision import DTYPE_BY_NAME, dtype_name, sharded_param_dtype, training_dtype

from .config import AUTO_BATCH, Config, TrainSection
from .distributed import DistInfo, apply_ddp, on_rank0
from .init_from import initial_model
from .optim import Muon, make_optimizers
from .rng import RNGState
from .state import OptimizerState, ScalerState, TrainState


def planned_model(cfg: Config, vocab_size: int, resume: Resume | None) -> GPTConfig | None:
    """The model this run will build, known before building it (None for another run's or HF weights)."""
    try:
        if resume is not None:
            return GPTConfig(**resume.payload["model_config"])
        if cfg.model.init_from == "scratch":
            return cfg.model.gpt_config(max(cfg.model.vocab_size, vocab_size))
    except (KeyError, TypeError, ValueError):  # a damaged checkpoint: model_from_checkpoint says so
        pass
    return None


def sharded_ranks(t: TrainSection, dist: DistInfo) -> int:
    """Over how many ranks the weights, gradients and optimizer state are sharded (1: not sharded)."""
    return dist.world_size if t.parallel == "fsdp" else 1


def check_memory(cfg: Config, vocab_size: int, resume: Resume | None, device: torch.device,
                 dist: DistInfo | None = None) -> None:
    """Refuse, in one line and before allocating anything big, a run whose model and batch can't fit
    (on each rank: with FSDP its share of the weights, gradients and optimizer state). batch_size auto
    is checked at its smallest micro-batch, 1 sequence."""
    planned = planned_model(cfg, vocab_size, resume)
    if planned is None:
        return
    dist = dist or DistInfo()
    rows = choose_loss_chunk_rows(device, compiled=cfg.train.compile, vocab_size=planned.vocab_size)
    could_shard = dist.enabled and cfg.train.parallel != "fsdp"
    auto = cfg.train.batch_size == AUTO_BATCH
    check_fits(training_bytes(planned, batch_size=1 if auto else cfg.train.batch_size, block_size=cfg.model.block_size,
                              loss_chunk_rows=rows, shards=sharded_ranks(cfg.train, dist),
                              activation_checkpointing=cfg.train.activation_checkpointing),
               device, "training" + (" (batch_size auto, at 1 sequence per micro-step)" if auto else ""),
               ("" if auto else "train.batch_size, ") + "model.block_size, or the model's size (n_layer, n_embd)"
               + (", or shard it over the ranks with --train.parallel=fsdp" if could_shard else ""))


def build_model(cfg: Config, *, vocab_size: int, tokenizer: dict[str, Any], resume: Resume | None,
                device: torch.device) -> tuple[GPT, list[str]]:
    """(the plain model on `device` in fp32, notes to print): the checkpoint's when resuming, else as
    model.init_from says (scratch weights drawn from train.seed)."""
    if resume is not None and resume.sharded:  # its weights are loaded in place, shard by shard (restore)
        runtime = {"dropout": cfg.model.dropout, "attn_backend": cfg.model.attn_backend}
        with torch.device("meta"):
            model = GPT(GPTConfig(**{**resume.payload["model_config"], **runtime}))
        model = model.to_empty(device="cpu")
        model.tie_weights()
        return model.to(device), []
    model, notes = initial_model(cfg.model, vocab_size=vocab_size, tokenizer=tokenizer, seed=cfg.train.seed,
                                 resume=resume.payload if resume is not None else None)
    return model.to(device), notes


def build_loaders(cfg: Config, data_dir: Path, dist: DistInfo, device: torch.device, *,
                  batch_size: int) -> tuple[BatchLoader, dict[str, BatchLoader]]:
    """(this rank's training batches, the fixed eval batches of each split: rank 0 only; with FSDP every
    rank, since every rank takes part in each forward), `batch_size` sequences each (the micro-batch:
    train.batch_size, or the one batch_size auto chose)."""
    t, block = cfg.train, cfg.model.block_size
    train = BatchLoader(data_dir, "train", block_size=block, batch_size=batch_size, seed=t.seed,
                        rank=dist.rank, world_size=dist.world_size, device=device)
    evaluates = dist.is_main or sharded_ranks(t, dist) > 1
    evals = {split: BatchLoader(data_dir, split, block_size=block, batch_size=batch_size, seed=t.eval_seed,
                                device=device) for split in ("train", "val")} if evaluates else {}
    return train, evals


def dtype_shape(model: GPT, batch_size: int, dist: DistInfo) -> dict[str, Any]:
    """What an `auto` dtype decision depends on besides the machine: the model, the batch it was timed
    at, the ranks."""
    return {"model": model_config_dict(model), "batch_size": batch_size, "world_size": dist.world_size}


def choose_dtype(name: str, resume: Resume | None, device: torch.device, probe: Callable[[torch.dtype], None], *,
                 run_steps: int = 0, shape: dict | None = None) -> tuple[str, str]:
    """(dtype name, note). A resumed run keeps the dtype it chose unless train.dtype names one, so a
    resume under another load never flips it (bitwise resume needs the same dtype). A fresh `auto` run
    decides once per (machine, `shape`: dtype_shape's model, batch, world size) and reuses that
    (runtime/choices.py); without a shape (the benchmark) it is measured now and not kept."""
    saved = resume.dtype if resume is not None else ""
    if name == "auto" and saved in DTYPE_BY_NAME:
        return saved, f"dtype {saved} (chosen when this run started; --train.dtype overrides)"
    decide = lambda: training_dtype(name, device, forward_backward=probe, run_steps=run_steps)  # noqa: E731
    dtype, note = auto_dtype("train", shape, decide, device) if name == "auto" and shape is not None else decide()
    return dtype_name(dtype), note


def set_loss_product(model: GPT, resume: Resume | None, device: torch.device, tokens: int, dist: DistInfo,
                     group=None) -> tuple[str, str]:
    """choose_loss_product on rank 0, every rank taking its choice, set on `model` (use_weight_grad_product).
    `tokens`: a micro-batch's tokens on one rank. -> (name, note)."""
    name, note = on_rank0(lambda: choose_loss_product(resume, device, model, tokens), dist, group)
    use_weight_grad_product(model, name)
    return name, note


def choose_loss_product(resume: Resume | None, device: torch.device, model: GPT, tokens: int) -> tuple[str, str]:
    """(WEIGHT_GRAD_PRODUCTS name, note) for the fused loss's weight gradient, set on the model with
    use_weight_grad_product. A resumed run keeps the one it chose (older checkpoints: torch.mm, what they
    ran), so a resume is bitwise the uninterrupted run whatever the machine's timing says now; a fresh run
    takes the measured choice for this machine and the chunks its micro-batch makes (`tokens`, a
    micro-batch's tokens on one rank)."""
    if model.loss_chunk_rows is None:  # the full logits: no fused loss, nothing to choose
        return DEFAULT_PRODUCT, ""
    if resume is not None:
        saved = resume.train.get("loss_product", DEFAULT_PRODUCT)
        saved = saved if isinstance(saved, str) else ""  # damaged: restoring the train state reports it, in one line
        if saved in WEIGHT_GRAD_PRODUCTS and (saved == DEFAULT_PRODUCT or weight_grad_product_available(device)):
            return saved, f"LM head's weight gradient by {saved} (chosen when this run started)"
        return DEFAULT_PRODUCT, (f"LM head's weight gradient by {DEFAULT_PRODUCT}: this run chose {saved!r} when it "
                                 "started, which this machine does not have (the last bits will differ)")
    rows = min(model.loss_chunk_rows, tokens)
    chunks = -(-tokens // rows)
    return choose_weight_grad_product(device, vocab_size=model.config.vocab_size, rows=rows, n_embd=model.config.n_embd,
                                      chunks=chunks)


def build_optimizers(model: GPT, t: TrainSection, device: torch.device) -> list[torch.optim.Optimizer]:
    optimizers = make_optimizers(model, lr=t.lr, weight_decay=t.weight_decay, betas=(t.beta1, t.beta2),
                                 device_type=device.type, kind=t.optimizer, muon_lr=t.muon_lr,
                                 muon_momentum=t.muon_momentum, muon_ns_steps=t.muon_ns_steps,
                                 muon_split_qkv=t.muon_split_qkv)
    if t.parallel == "fsdp":  # sharded (shard_model): Muon orthogonalises whole matrices, gathered for its step
        from .sharding import ShardedMuon

        for opt in optimizers:
            if type(opt) is Muon:
                opt.__class__ = ShardedMuon
    return optimizers


def shard_model(model: GPT, t: TrainSection, dist: DistInfo, device: torch.device, dtype: torch.dtype) -> GPT:
    """Activation checkpointing per block (train.activation_checkpointing), then FSDP (train.parallel=fsdp,
    several ranks): in place, before the optimizers are built, which must see the sharded parameters.
    The parameters are gathered in bf16 where the run trains in bf16 on a device that has it natively.
    training/sharding.py is imported only where it is used: FSDP, DTensor and DCP cost ~1 s of a start-up."""
    if t.parallel == "fsdp":
        from .sharding import apply_fsdp

        return apply_fsdp(model, dist, device, param_dtype=sharded_param_dtype(device, dtype),
                          activation_checkpointing=t.activation_checkpointing)
    if t.activation_checkpointing:
        from .sharding import checkpoint_blocks

        checkpoint_blocks(model)
    return model


def parallelize(model: GPT, t: TrainSection, dist: DistInfo, device: torch.device, *,
                compile: bool | None = None, loss_chunk_rows: int | None | str = "auto") -> nn.Module:
    """What the training step runs: `model` with the loss path for this device, compiled (train.compile),
    wrapped in DDP (several ranks). `model` itself stays the plain module, which is saved and evaluated.
    `compile` overrides train.compile (False: the eager fallback); `loss_chunk_rows` overrides the loss
    path's choice (the benchmark compares both)."""
    compile = t.compile if compile is None else compile
    use_loss_path(model, device, compiled=compile, rows=loss_chunk_rows)
    step_model = torch.compile(model) if compile else model
    return step_model if t.parallel == "fsdp" else apply_ddp(step_model, dist, device)  # FSDP: shard_model


def build_checkpointer(out_dir: Path, dist: DistInfo, group, *, model: GPT, optimizers: list, scaler,
                       loader: BatchLoader, state: TrainState, cfg: Config,
                       tokenizer: dict[str, Any]) -> tuple[Checkpointer, RNGState]:
    """Every stateful part, registered once: the same mapping is saved and restored. The RNG streams
    come last, so that restoring nothing after them consumes a random number."""
    sharded = cfg.train.parallel == "fsdp"  # the layout follows train.parallel, on any number of ranks
    if sharded:
        from .sharding import ShardedModelState, ShardedOptimizerState
    ckpt = Checkpointer(out_dir, is_main=dist.is_main, sharded=sharded)
    ckpt.register_static("model_config", model_config_dict(model))
    ckpt.register_static("config", cfg.to_dict())
    ckpt.register_static("tokenizer", tokenizer)
    ckpt.register("model", ShardedModelState(model) if sharded else model)
    ckpt.register("optimizer", ShardedOptimizerState(model, optimizers) if sharded else OptimizerState(optimizers))
    ckpt.register("scaler", ScalerState(scaler))
    ckpt.register("loader", loader)
    ckpt.register("train", state)
    rng = RNGState(dist, group)
    ckpt.register("rng", rng)
    return ckpt, rng
