"""The parts of a training run, one builder each (torchtitan's shape), and the one chain that joins the
model to its training step. training/chain.py's set_up calls it, and so does every benchmark that times a step,
so what a benchmark times is what train.py runs.

    check_memory(cfg, vocab_size, resume, device, par)   # refuse what can't fit, before allocating
    model, cfg, notes = build_model(cfg, ...)            # fresh, resumed, another run's or HF weights
    trainer = build_trainer(cfg, par, device, model, plan, loaders)  # the chain: each decision into the plan
        loss (LMLoss) -> dtype -> float8 -> shard (activation checkpointing, FSDP) -> micro-batch -> weight-gradient
        product -> attention kernel -> loaders -> optimizers -> scaler -> step graph -> step (compile, DDP, CUDA graph)
    checkpointer, rng = build_checkpointer(out_dir, par, ...)   # every stateful part, registered once

Hardware switches are applied here from outside the model, one line each, and the loss is an object of
its own (runtime/loss_path.py's LMLoss) that the step and the evals call: nothing is set on the model.
Which ranks take part is the parallel context's (training/parallel/distributed.py) answer, never a test of
train.parallel here.
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Callable

import torch

from checkpoint import Checkpointer, Resume, model_config_dict
from checkpoint.load import checked_model_config
from checkpoint.meta import meta_model
from data import BatchLoader
from data.chat_loader import ChatBatchLoader
from errors import UserError
from model import GPT, GPTConfig
from runtime.choices import auto_dtype
from runtime.attention import fastest_kernel, use_kernel
from runtime.device import use_device, with_compile_fallback
from runtime.loss_path import (DEFAULT_PRODUCT, WEIGHT_GRAD_PRODUCTS, LMLoss, choose_loss_chunk_rows,
                               choose_weight_grad_product, loss_path, weight_grad_product_available)
from runtime.memory import check_fits, training_bytes
from runtime.precision import DTYPE_BY_NAME, autocast, dtype_name, make_scaler, sharded_param_dtype, training_dtype

from .batch_size import divisors, measure_batch, reapply_batch
from .config.sections import ARCH_KEYS, AUTO_BATCH, Config, TrainSection
from .parallel.distributed import Parallel
from .float8 import convert_to_float8
from .init_from import initial_model
from .report.mfu import peak_flops
from .report.window import LossWindow
from .optim import Muon, make_optimizers
from .plan import Batch, Decision, RunPlan
from .state import OptimizerState, RNGState, ScalerState, TrainState
from .graphs.evals import GraphedLoss
from .graphs.step import GraphedStep
from .step import StepOutput, forward_backward_probe, train_step


def planned_model(cfg: Config, vocab_size: int, resume: Resume | None) -> GPTConfig | None:
    """The model this run will build, known before building it (None for another run's or HF weights)."""
    try:
        if resume is not None:
            return checked_model_config(resume.payload["model_config"], resume.path)
        if cfg.model.init_from == "scratch":
            return cfg.model.gpt_config(max(cfg.model.vocab_size, vocab_size))
    except (KeyError, TypeError, ValueError, UserError):  # a damaged checkpoint: model_from_checkpoint says so
        pass
    return None


def check_memory(cfg: Config, vocab_size: int, resume: Resume | None, device: torch.device,
                 par: Parallel | None = None) -> None:
    """Refuse, in one line and before allocating anything big, a run whose model and batch can't fit
    (on each rank: with FSDP its share of the weights, gradients and optimizer state). batch_size auto
    is checked at its smallest micro-batch, 1 sequence. The loss chunk rows are estimated for the model
    planned; the run plan decides them on the model built."""
    planned = planned_model(cfg, vocab_size, resume)
    if planned is None:
        return
    par = par or Parallel()
    rows = choose_loss_chunk_rows(device, compiled=cfg.train.compile, vocab_size=planned.vocab_size)
    could_shard = par.enabled and not par.sharded
    auto = cfg.train.batch_size == AUTO_BATCH
    check_fits(training_bytes(planned, batch_size=1 if auto else cfg.train.batch_size, block_size=cfg.model.block_size,
                              loss_chunk_rows=rows, shards=par.shards,
                              activation_checkpointing=cfg.train.activation_checkpointing),
               device, "training" + (" (batch_size auto, at 1 sequence per micro-step)" if auto else ""),
               ("" if auto else "train.batch_size, ") + "model.block_size, or the model's size (n_layer, n_embd)"
               + (", or shard it over the ranks with --train.parallel=fsdp" if could_shard else ""))


def build_model(cfg: Config, *, vocab_size: int, tokenizer: dict[str, Any], resume: Resume | None,
                device: torch.device, chat_vocab: int = 0) -> tuple[GPT, Config, list[str]]:
    """(the plain model on `device` in fp32, the config that describes it, notes to print): the checkpoint's
    when resuming, else as model.init_from says (scratch weights drawn from train.seed). Another run's or
    HF weights bring their architecture: the config returned is a new frozen one saying so (the loaded one
    is never changed), and it is what the run saves and logs."""
    if resume is not None and resume.sharded:  # its weights are loaded in place, shard by shard (restore)
        runtime = {"dropout": cfg.model.dropout, "attn_backend": cfg.model.attn_backend}
        model = meta_model(checked_model_config(resume.payload["model_config"], resume.path, **runtime))
        model = model.to_empty(device="cpu")
        model.tie_weights()
        notes = []
    else:
        model, notes = initial_model(cfg.model, vocab_size=vocab_size, tokenizer=tokenizer, seed=cfg.train.seed,
                                     resume=resume.payload if resume is not None else None, chat_vocab=chat_vocab)
    return model.to(device), config_of_source(cfg, model), notes


def config_of_source(cfg: Config, model: GPT) -> Config:
    """`cfg`, or where model.init_from brought the architecture (another run's, HF GPT-2's), a new frozen
    config whose ARCH_KEYS and vocab_size say what the model is; fresh and resumed alike, so every
    checkpoint agrees (a requested vocab_size the source overrides is said by init_from.initial_model)."""
    arch = {k: getattr(model.config, k) for k in (*ARCH_KEYS, "vocab_size")}
    if cfg.model.init_from == "scratch" or all(getattr(cfg.model, k) == v for k, v in arch.items()):
        return cfg
    d = cfg.to_dict()
    return Config.from_dict(d | {"model": d["model"] | arch}).freeze()


Loaders = Callable[[int], tuple[Any, dict[str, Any]]]  # micro-batch -> (train batches, eval batches by split)


def data_loaders(cfg: Config, data_dir: Path, par: Parallel, device: torch.device) -> Loaders:
    """loaders(micro): this rank's training batches, `micro` sequences each, and the fixed eval batches of
    each split (on the ranks that evaluate: rank 0, or every rank under FSDP), train.batch_size sequences
    each whatever the ranks (`micro` with batch_size auto, sized to the device, not to the ranks): with the
    per-rank micro-batch, 2 ranks evaluated other sequences than 1, so a run resumed on another number of
    ranks compared its val loss, and chose best.pt, against another eval set."""
    t, block = cfg.train, cfg.model.block_size

    Loader = ChatBatchLoader if cfg.data.format == "chat" else BatchLoader  # conversations: one per row, padded

    def loaders(micro: int) -> tuple[BatchLoader, dict[str, BatchLoader]]:
        train = Loader(data_dir, "train", block_size=block, batch_size=micro, seed=t.seed,
                            rank=par.rank, world_size=par.world_size, device=device)
        rows = micro if t.batch_size == AUTO_BATCH else t.batch_size
        evals = {split: Loader(data_dir, split, block_size=block, batch_size=rows, seed=t.eval_seed,
                                    device=device) for split in ("train", "val")} if par.evaluates else {}
        return train, evals
    return loaders


# ------------------------------------------------------------------------------------ the chain

@dataclass
class Trainer:
    """The model joined to its training step, and the batches it steps on."""
    model: GPT  # the plain module: saved and evaluated
    step: "Stepper"  # one optimizer step on this rank's micro-batches; step.loss is the run's LMLoss (evals too)
    amp: Callable[[], Any]  # the run's autocast context (evals use it too)
    accum: int  # micro-steps per rank per optimizer step
    train_loader: Any
    eval_loaders: dict[str, Any]
    float8_layers: int = 0


def build_trainer(cfg: Config, par: Parallel, device: torch.device, model: GPT, plan: RunPlan, loaders: Loaders,
                  say: Callable[[str], None] = print) -> Trainer:
    """The chain from the plain model to its training step, each start-up decision settled into `plan`
    on the way by its one rule (training/plan.py): the config's, else the resumed run's, else measured."""
    t, block = cfg.train, cfg.model.block_size
    rows = plan.settle("loss_chunk_rows", par.decide(lambda: loss_chunk_rows_for(t, device, model)))  # rank 0's GPU
    loss = loss_path(device, compiled=t.compile, vocab_size=model.config.vocab_size, rows=rows)
    use_device(device)  # TF32 on a GPU; a CPU keeps what a step frees for the next
    first = 1 if t.batch_size == AUTO_BATCH else t.batch_size  # the dtype is timed at this micro-batch
    first_loaders = loaders(first)
    name = plan.settle("dtype", config_dtype(t.dtype, device) or plan.kept("dtype") or par.decide(
        lambda: measure_dtype(model, loss, first_loaders[0].get_batch(0, 0), device, t, first, par)))
    dtype = DTYPE_BY_NAME[name]
    float8_layers = convert_to_float8(model, t.float8)  # before FSDP and the optimizers: it swaps modules
    model = shard_model(model, t, par, device, dtype)  # activation checkpointing, FSDP: before the optimizers
    batch = plan.settle("batch", fixed_batch(t, par) or reapply_batch(t, plan.kept("batch"), par) or measure_batch(
        t, model, device, par, dtype=dtype, block_size=block, vocab_size=model.config.vocab_size, loss=loss))
    loss = replace(loss, product=settle_loss_product(plan, par, device, model, loss, batch.micro_batch * block))
    if cfg.model.attn_backend == "sdpa":  # the SDPA kernel a GPU trains with (nothing to choose elsewhere)
        m = cfg.model
        use_kernel(plan.settle("attention", plan.kept("attention") or par.decide(lambda: Decision(*fastest_kernel(
            device, batch=batch.micro_batch, n_head=m.n_head, seq=block, head_dim=m.n_embd // m.n_head, dtype=dtype)))))
    train_loader, eval_loaders = first_loaders if batch.micro_batch == first else loaders(batch.micro_batch)
    optimizers = build_optimizers(model, t, device, par)
    scaler = make_scaler(device, dtype)
    amp = lambda: autocast(device, dtype)  # noqa: E731
    plan.settle("step_graph", step_graph_for(cfg, par, device, dtype))
    step = Stepper(model, loss, optimizers, scaler, t, par, device, amp, say, plan)  # compile, DDP, CUDA graph
    plan.settle("peak_flops", par.decide(lambda: peak_flops_for(t, device, dtype)))  # for MFU: one probe, on rank 0
    return Trainer(model, step, amp, batch.accum // par.world_size, train_loader, eval_loaders, float8_layers)


# ----------------------------------------------------------------------- each decision's measure

def loss_chunk_rows_for(t: TrainSection, device: torch.device, model: GPT) -> Decision[int | None]:
    rows = choose_loss_chunk_rows(device, compiled=t.compile, vocab_size=model.config.vocab_size)
    return Decision(rows, f"fused LM-head loss in chunks of {rows} rows" if rows else "")


def step_graph_for(cfg: Config, par: Parallel, device: torch.device, dtype: torch.dtype) -> Decision[bool]:
    """Replay the training step as one CUDA graph (training/graphs/step.py) where nothing in the step needs the
    host or changes shape: on one CUDA device, train.cuda_graph on, and none of what the list below names.
    (A compiled step is Inductor's to launch: compile and the graph are two answers to the same cost.)"""
    t = cfg.train
    if device.type != "cuda" or not t.cuda_graph or t.compile:
        return Decision(False)
    why_not = [why for no, why in (
        (par.enabled, "several ranks"), (dtype == torch.float16, "float16's GradScaler reads the host"),
        (t.float8 != "off", "train.float8"), (t.activation_checkpointing, "activation checkpointing"),
        (t.batch_size == AUTO_BATCH, "batch_size auto (sized to the memory of an eager step)"),
        (cfg.data.format == "chat", "conversations' batches change shape")) if no]
    if why_not:
        return Decision(False, f"training step eager, not one CUDA graph: {'; '.join(why_not)}")
    return Decision(True, "training step and eval forwards replayed as CUDA graphs "
                          "(train.cuda_graph=false: eager)")


def config_dtype(name: str, device: torch.device) -> Decision[str] | None:
    """train.dtype where it names one (None: auto)."""
    if name == "auto":
        return None
    return Decision(dtype_name(training_dtype(name, device)[0]), f"dtype {name} (from config)")


def measure_dtype(model: GPT, loss: LMLoss, batch, device: torch.device, t: TrainSection, rows: int,
                  par: Parallel) -> Decision[str]:
    """train.dtype auto, by training_dtype's rule: on a CPU the faster of fp32 and bf16 for this model's
    forward and backward at `rows` sequences, decided once per (machine, model, batch, ranks) and reused."""
    probe = forward_backward_probe(model, loss, batch, lambda dt: autocast(device, dt))
    shape = {"model": model_config_dict(model), "batch_size": rows, "world_size": par.world_size}
    dtype, note = auto_dtype("train", shape, lambda: training_dtype("auto", device, forward_backward=probe,
                                                                    run_steps=t.max_iters), device)
    return Decision(dtype_name(dtype), note)


def fixed_batch(t: TrainSection, par: Parallel) -> Decision[Batch] | None:
    """train.batch_size sequences per micro-step and train.grad_accum_steps (global) micro-steps, where the
    ranks divide the micro-steps; else each rank's share of the global batch in the largest micro-batches
    up to train.batch_size that divide it (e.g. 12 x 1 on 2 ranks: 6 x 1 each): the same sequences, the
    same step. None: batch_size auto."""
    if t.batch_size == AUTO_BATCH:
        return None
    if t.grad_accum_steps % par.world_size == 0:
        return Decision(Batch(t.batch_size, t.grad_accum_steps))
    total = t.batch_size * t.grad_accum_steps
    micro = max(d for d in divisors(total // par.world_size) if d <= t.batch_size)
    return Decision(Batch(micro, total // micro), (
        f"train.batch_size={t.batch_size} x grad_accum_steps={t.grad_accum_steps} over {par.world_size} ranks: "
        f"{micro} sequences per micro-step, {total // micro // par.world_size} micro-step(s) each, the global batch "
        f"of {total} sequences kept"))


def settle_loss_product(plan: RunPlan, par: Parallel, device: torch.device, model: GPT, loss: LMLoss,
                        tokens: int) -> str:
    """The plan's weight-gradient product (a WEIGHT_GRAD_PRODUCTS name) for a micro-batch of `tokens` tokens
    on one rank."""
    return plan.settle("loss_product", reapply_loss_product(plan.kept("loss_product"), device)
                       or par.decide(lambda: measure_loss_product(device, model, loss, tokens)))


def measure_loss_product(device: torch.device, model: GPT, loss: LMLoss, tokens: int) -> Decision[str]:
    """The fused loss's weight-gradient product measured for this machine and the chunks a micro-batch of
    `tokens` tokens (on one rank) makes; torch.mm (nothing to choose) with the full logits."""
    if loss.chunk_rows is None:
        return Decision(DEFAULT_PRODUCT)
    rows = min(loss.chunk_rows, tokens)
    return Decision(*choose_weight_grad_product(device, vocab_size=model.config.vocab_size, rows=rows,
                                                n_embd=model.config.n_embd, chunks=-(-tokens // rows)))


def reapply_loss_product(kept: Decision[str] | None, device: torch.device) -> Decision[str] | None:
    """The product a resumed run chose, where this machine has it: a resume is then bitwise the
    uninterrupted run whatever the timing says now. Else torch.mm, and the last bits will differ."""
    if kept is None:
        return None
    saved = kept.value
    if saved in WEIGHT_GRAD_PRODUCTS and (saved == DEFAULT_PRODUCT or weight_grad_product_available(device)):
        return Decision(saved, f"LM head's weight gradient by {saved}" if kept.note else "", kept=True)
    return Decision(DEFAULT_PRODUCT, f"LM head's weight gradient by {DEFAULT_PRODUCT}: this run chose {saved!r} when "
                                     "it started, which this machine does not have (the last bits will differ)")


def use_other_loss_path(trainer: Trainer, device: torch.device, *, compiled: bool, rows: int | None,
                        tokens: int) -> None:
    """The trainer's loss path replaced by chunks of `rows` (None: the full logits), with the weight-gradient
    product measured for it, before its first step compiles: what a benchmark comparing loss paths times."""
    loss = loss_path(device, compiled=compiled, vocab_size=trainer.model.config.vocab_size, rows=rows)
    trainer.step.loss = replace(loss, product=measure_loss_product(device, trainer.model, loss, tokens).value)


def peak_flops_for(t: TrainSection, device: torch.device, dtype: torch.dtype) -> Decision[float | None]:
    """The device's peak FLOP/s in the training dtype, for MFU (train.peak_flops where given)."""
    return Decision(*peak_flops(device, dtype, override=t.peak_flops))


# ------------------------------------------------------------------------- hardware switches

def shard_model(model: GPT, t: TrainSection, par: Parallel, device: torch.device, dtype: torch.dtype) -> GPT:
    """Activation checkpointing per block (train.activation_checkpointing), then FSDP (sharded, several
    ranks): in place, before the optimizers are built, which must see the sharded parameters. The
    parameters are gathered in bf16 where the run trains in bf16 on a device that has it natively.
    training/parallel/sharding.py is imported only where it is used: FSDP, DTensor and DCP cost ~1 s of a start-up."""
    if par.sharded:
        from .parallel.sharding import apply_fsdp

        return apply_fsdp(model, par, device, param_dtype=sharded_param_dtype(device, dtype),
                          activation_checkpointing=t.activation_checkpointing)
    if t.activation_checkpointing:
        from .parallel.sharding import checkpoint_blocks

        checkpoint_blocks(model)
    return model


def build_optimizers(model: GPT, t: TrainSection, device: torch.device,
                     par: Parallel | None = None) -> list[torch.optim.Optimizer]:
    muon_class = Muon
    if par is not None and par.sharded:  # sharded (shard_model): Muon orthogonalises whole matrices, gathered
        from .parallel.sharding import ShardedMuon as muon_class
    return make_optimizers(model, lr=t.lr, weight_decay=t.weight_decay, betas=(t.beta1, t.beta2),
                           device_type=device.type, kind=t.optimizer, muon_lr=t.muon_lr,
                           muon_momentum=t.muon_momentum, muon_ns_steps=t.muon_ns_steps,
                           muon_split_qkv=t.muon_split_qkv, muon_class=muon_class)


def parallelize(model: GPT, t: TrainSection, par: Parallel, device: torch.device, *,
                compile: bool | None = None) -> torch.nn.Module:
    """What the training step runs: `model` compiled (train.compile) and wrapped in DDP where the ranks
    each hold the whole model. `model` itself stays the plain module, which is saved and evaluated.
    `compile` overrides train.compile (False: the eager fallback)."""
    compile = t.compile if compile is None else compile
    return par.wrap(torch.compile(model) if compile else model, device)


class Stepper:
    """train_step on the parallelized model; if torch.compile fails (no C++ compiler for Inductor on a
    CPU, an unsupported GPU) the step is redone from the same state without compile, and the run goes on
    eager (with_compile_fallback). Where the plan's step_graph says so, the step replays as one CUDA graph
    (training/graphs/step.py), which goes eager by itself if its capture fails."""

    def __init__(self, model: GPT, loss: LMLoss, optimizers, scaler, t: TrainSection, par: Parallel, device, amp,
                 say, plan: RunPlan | None = None):
        self.raw, self.loss, self.optimizers, self.scaler, self.amp, self.say = model, loss, optimizers, scaler, amp, say
        self.t, self.par, self.device, self.plan = t, par, device, plan
        self.model = parallelize(model, t, par, device)
        self.compiled = t.compile
        self.graphed = self.graphed_eval = None
        if plan is not None and plan.step_graph:
            capture = device.type == "cuda"
            self.graphed = GraphedStep(self.eager_step, optimizers, model, capture=capture, say=self.graph_off)
            # the evals' forwards replayed as CUDA graphs beside the step's (training/graphs/evals.py)
            self.graphed_eval = GraphedLoss(loss, capture=capture, say=lambda why: say(f"warning: {why}"))

    def __call__(self, batches) -> StepOutput:
        if self.graphed is not None:
            return self.graphed(batches)
        return with_compile_fallback(lambda: self.eager_step(batches), compiled=self.compiled,
                                     go_eager=self.go_eager, say=self.say)

    @property
    def eval_loss(self):
        """The loss the evals take: the run's (go_eager may have replaced it), or its graphed replay."""
        return self.graphed_eval if self.graphed_eval is not None else self.loss

    def eager_step(self, batches) -> StepOutput:
        return train_step(self.model, self.loss, self.optimizers, self.scaler, batches, amp=self.amp,
                          grad_clip=self.t.grad_clip, par=self.par)

    def graph_off(self, why: str) -> None:
        """The graphed step went eager (graphs/step.py says why): the plan says so too."""
        self.say(f"warning: {why}")
        if self.plan is not None:
            self.plan.revise("step_graph", Decision(False, why))

    def go_eager(self) -> None:
        for opt in self.optimizers:
            opt.zero_grad(set_to_none=True)  # a failed backward may have left partial gradients
        # compiled, a GPU's loss used the full logits; eager, the chunks this device takes (the plan says so)
        self.loss = loss_path(self.device, compiled=False, vocab_size=self.raw.config.vocab_size,
                              product=self.loss.product)
        rows = self.loss.chunk_rows
        if self.plan is not None and self.plan.value("loss_chunk_rows") != rows:
            eager = Decision(rows, f"fused LM-head loss in chunks of {rows} rows (eager: compile failed)")
            self.plan.revise("loss_chunk_rows", eager)
            self.say(eager.note)
        self.model = parallelize(self.raw, self.t, self.par, self.device, compile=False)
        self.compiled = False


def build_checkpointer(out_dir: Path, par: Parallel, *, trainer: Trainer, plan: RunPlan, state: TrainState,
                       window: LossWindow, cfg: Config, tokenizer: dict[str, Any]) -> tuple[Checkpointer, RNGState]:
    """Every stateful part, registered once: the same mapping is saved and restored. The RNG streams
    come last, so that restoring nothing after them consumes a random number."""
    if par.sharded:  # the layout follows train.parallel, on any number of ranks
        from .parallel.sharding import ShardedModelState, ShardedOptimizerState
    model, optimizers = trainer.model, trainer.step.optimizers
    ckpt = Checkpointer(out_dir, is_main=par.is_main, sharded=par.sharded)
    ckpt.register_static("model_config", model_config_dict(model))
    ckpt.register_static("config", cfg.to_dict())
    ckpt.register_static("tokenizer", tokenizer)
    template = getattr(trainer.train_loader, "template", None)  # conversations: the chat template's ids
    if template is not None:
        ckpt.register_static("chat_template", template.to_dict())
    ckpt.register("model", ShardedModelState(model) if par.sharded else model)
    ckpt.register("optimizer", ShardedOptimizerState(model, optimizers) if par.sharded else OptimizerState(optimizers))
    ckpt.register("scaler", ScalerState(trainer.step.scaler))
    ckpt.register("loader", trainer.train_loader)
    ckpt.register("train", state)
    ckpt.register("plan", plan)
    ckpt.register("window", window)  # the log window so far: a stop inside one logs nothing partial
    rng = RNGState(par)
    ckpt.register("rng", rng)
    return ckpt, rng
