"""Training-step rows: the step train.py runs (training.step.train_step, with the model, optimizers,
scaler, precision and loss path set up by the same functions train.py uses) against nanoGPT's loop
(benchmarks/baseline.py), from the same initial weights on the same batches; and the same-loss check.

Shapes:
- CPU: nanoGPT's CPU recipe, 4 layers, 4 heads, 128 wide, block 64, batch 12, with GPT-2's BPE
  vocabulary ("BPE train") and a character vocabulary ("char train");
- CUDA: GPT-2 124M (12 layers, 12 heads, 768 wide, block 1024), vocab 50257 and 50304 (padded to a
  multiple of 64), micro-batch 16 and the largest batch that fits (estimated from batch 16's peak
  memory, then run).
"""
from __future__ import annotations

import sys
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Callable

import torch

from data import BatchLoader
from checkpoint.meta import meta_model
from model import GPT, GPTConfig
from runtime.loss_path import choose_loss_chunk_rows
from runtime.precision import DTYPE_BY_NAME, autocast, dtype_name
from training.builders import Trainer, build_trainer, use_other_loss_path
from training.config.sections import Config, ModelSection, TrainSection
from training.parallel.distributed import Parallel
from training.report.evaluate import evaluate
from training.report.mfu import mfu
from training.plan import RunPlan
from training.timing.schedule import apply_lr, lr_at

from .baseline import BETAS, FULL_LOGITS, GRAD_CLIP, LR, WEIGHT_DECAY, nanogpt_setup, nanogpt_step
from .timing import Variant, median, run_interleaved


@dataclass(frozen=True)
class Shape:
    label: str
    n_layer: int
    n_head: int
    n_embd: int
    block_size: int
    vocab_size: int
    batch_size: int

    def gpt_config(self, attn_backend: str) -> GPTConfig:
        return GPTConfig(n_layer=self.n_layer, n_head=self.n_head, n_embd=self.n_embd, block_size=self.block_size,
                         vocab_size=self.vocab_size, dropout=0.0, attn_backend=attn_backend)


CPU_SHAPES = (Shape("BPE train", 4, 4, 128, 64, 50257, 12), Shape("char train", 4, 4, 128, 64, 65, 12))
GPT2_124M = Shape("GPT-2 124M", 12, 12, 768, 1024, 50257, 16)
QUICK_GPU = Shape("tiny (quick)", 2, 2, 128, 256, 50304, 8)


def random_batches(shape: Shape, device: torch.device, n: int = 4, batch_size: int | None = None):
    gen = torch.Generator().manual_seed(0)
    B = batch_size or shape.batch_size
    out = []
    for _ in range(n):
        d = torch.randint(0, shape.vocab_size, (B, shape.block_size + 1), generator=gen)
        out.append((d[:, :-1].contiguous().to(device), d[:, 1:].contiguous().to(device)))
    return out


def reference_weights(shape: Shape, seed: int = 1337) -> dict[str, torch.Tensor]:
    torch.manual_seed(seed)
    return GPT(shape.gpt_config("sdpa")).state_dict()


def _model(shape: Shape, weights, backend: str, device: torch.device) -> GPT:
    m = GPT(shape.gpt_config(backend))
    m.load_state_dict(weights)
    return m.to(device).train()


AUTO = "auto"


def bench_config(shape: Shape, compiled: bool, dtype: str, float8: str = "off") -> Config:
    """The baseline's hyperparameters, and the shape, as train.py's config."""
    model = ModelSection(block_size=shape.block_size, n_layer=shape.n_layer, n_head=shape.n_head, n_embd=shape.n_embd,
                         vocab_size=shape.vocab_size, dropout=0.0)
    train = TrainSection(lr=LR, weight_decay=WEIGHT_DECAY, beta1=BETAS[0], beta2=BETAS[1], grad_clip=GRAD_CLIP,
                         compile=compiled, dtype=dtype, float8=float8, batch_size=shape.batch_size)
    return Config(model=model, train=train).freeze()


class GivenBatches:
    """The chain's loaders, for a benchmark: its own batches (get_batch(i)), no eval batches."""

    def __init__(self, get_batch: Callable[[int], tuple]):
        self.get = get_batch

    def get_batch(self, i: int, micro: int = 0) -> tuple:
        return self.get(i)


def trainer_for(shape: Shape, weights, device: torch.device, dtype: str, compiled: bool,
                get_batch: Callable[[int], tuple], loss_chunk_rows: int | None | str = AUTO,
                float8: str = "off", par: Parallel | None = None) -> tuple[Trainer, RunPlan]:
    """The run's chain (training.builders.build_trainer) on the reference weights: the plan decides what
    train.py's would, then float8, compile, fused AdamW, GradScaler (fp16 only). A `loss_chunk_rows` given
    (to compare loss paths) replaces the chain's loss path afterwards, with the weight-gradient product
    measured for it, before the first step compiles."""
    plan = RunPlan()
    trainer = build_trainer(bench_config(shape, compiled, dtype, float8), par or Parallel(), device,
                            _model(shape, weights, "sdpa", device), plan, lambda micro: (GivenBatches(get_batch), {}),
                            say=no_fallback)
    if loss_chunk_rows != AUTO:
        use_other_loss_path(trainer, device, compiled=compiled, rows=loss_chunk_rows,
                            tokens=shape.batch_size * shape.block_size)
    return trainer, plan


def no_fallback(line: str) -> None:
    """What the step says when compile or the CUDA-graphed step failed and it goes on eagerly. A compile
    failure is an error here, or a 'compiled' row would time eager code; a graph's is said and the row goes on
    (its name claims no graph), so that one GPU's failed capture does not lose the whole table."""
    if "CUDA-graphed" in line:
        print(line, file=sys.stderr, flush=True)
        return
    raise RuntimeError(f"torch.compile failed in the benchmark: {line}")


def ours_step(shape: Shape, weights, device: torch.device, dtype: torch.dtype, compiled: bool,
              get_batch: Callable[[int], tuple], loss_chunk_rows: int | None | str = AUTO,
              float8: str = "off") -> Callable[[int], torch.Tensor]:
    """train.py's step, built by the run's chain (trainer_for)."""
    trainer, _ = trainer_for(shape, weights, device, dtype_name(dtype), compiled, get_batch, loss_chunk_rows, float8)

    def step(i: int, lr: float | None = None) -> torch.Tensor:
        if lr is not None:
            apply_lr(trainer.step.optimizers, lr, LR)  # what the training loop (training/loop.py) does before each step
        return trainer.step([get_batch(i)]).loss
    step.model, step.loss = trainer.model, trainer.step.loss  # for the loss check's evaluation
    return step


def baseline_step(shape: Shape, weights, device: torch.device, get_batch: Callable[[int], tuple]):
    raw = _model(shape, weights, "sdpa" if device.type == "cuda" else "manual", device)
    model, optimizer, dtype = nanogpt_setup(raw, device)

    def step(i: int, lr: float | None = None) -> torch.Tensor:
        if lr is not None:  # nanoGPT's loop: every group's lr set before the step
            for group in optimizer.param_groups:
                group["lr"] = lr
        x, y = get_batch(i)
        return nanogpt_step(model, optimizer, x, y, dtype)
    step.model, step.loss = raw, FULL_LOGITS
    step.dtype = dtype
    return step


def auto_dtype_for(shape: Shape, weights, device: torch.device, batch) -> tuple[torch.dtype, str]:
    """What train.py's dtype=auto picks for this shape: its chain's decision (the same probe of the real
    forward + backward, kept per machine as train.py keeps it)."""
    _, plan = trainer_for(shape, weights, device, "auto", False, lambda i: batch)
    return DTYPE_BY_NAME[plan.dtype], plan.decisions["dtype"].note


def bench_shape(shape: Shape, *, device, dtypes: list[torch.dtype], compiled: list[bool], peaks: dict, warmup: int,
                iters: int, rounds: int, say, other_loss_path: bool = False,
                loss_chunks: tuple[int, ...] = (), float8: tuple[str, ...] = ()) -> tuple[list[dict], str]:
    """Rows for one shape: ours in each (dtype, compile) asked for, against the baseline, the dtype
    auto picks marked; with other_loss_path, also ours with the loss path this device does not choose
    (to show the choice); with loss_chunks (a large vocabulary only), also ours with the fused loss in
    chunks of each of those row counts (to choose runtime/loss_path.py's CHUNK_BYTES per CPU). Returns (rows, how auto chose)."""
    batches = random_batches(shape, device)
    weights = reference_weights(shape)
    auto_dtype, auto_note = auto_dtype_for(shape, weights, device, batches[0])
    say(f"[{shape.label}] {auto_note}")
    base = baseline_step(shape, weights, device, lambda i: batches[i % len(batches)])
    variants = [Variant("baseline", base)]
    kinds = {}
    for dt in dtypes:
        for c in compiled:
            chosen = choose_loss_chunk_rows(device, compiled=c, vocab_size=shape.vocab_size)
            paths = [chosen] + ([_other_path(chosen, device, shape)] if other_loss_path else [])
            paths += [n for n in loss_chunks if chosen is not None and n not in paths]
            for rows in paths:
                name = (f"ours {dtype_name(dt)}" + (" compiled" if c else "")
                        + (f", loss {'full logits' if rows is None else f'chunks of {rows}'}"
                           if other_loss_path or len(paths) > 1 else "")
                        + (" (auto)" if dt == auto_dtype and rows == chosen else ""))
                variants.append(Variant(name, ours_step(shape, weights, device, dt, c,
                                                        lambda i: batches[i % len(batches)], loss_chunk_rows=rows)))
                kinds[name] = (dt, c)
            for recipe in float8:  # train.float8: the blocks' Linear layers in float8, the loss path chosen
                name = f"ours {dtype_name(dt)}{' compiled' if c else ''}, float8 {recipe}"
                variants.append(Variant(name, ours_step(shape, weights, device, dt, c,
                                                        lambda i: batches[i % len(batches)], float8=recipe)))
                kinds[name] = (dt, c)
    for v in variants:
        v.resident_mb = weights_mb(shape)
    say(f"[{shape.label}] vocab {shape.vocab_size}, batch {shape.batch_size} x {shape.block_size}: "
        f"{', '.join(v.name for v in variants)}; {warmup} warm-up + {iters} timed steps each, {rounds} rounds")
    run_interleaved(variants, max(warmup, 2 if any(compiled) or device.type == "cuda" else 0), iters, rounds, device)

    fpt = flops_per_token(shape)
    tokens = shape.batch_size * shape.block_size
    base_s = median(variants[0].times)
    rows = []
    for v in variants[1:]:
        dt, c = kinds[v.name]
        s = median(v.times)
        rows.append({"auto": dt == auto_dtype,
            "section": shape.label, "name": v.name, "precision": dtype_name(dt), "compiled": c,
            "vocab": shape.vocab_size, "batch": shape.batch_size, "unit": "ms/iter",
            "ours": s * 1e3, "base": base_s * 1e3, "ours_tok_s": tokens / s, "base_tok_s": tokens / base_s,
            "ours_flops": fpt * tokens / s, "base_flops": fpt * tokens / base_s,
            "ours_mfu": mfu(fpt, tokens / s, peaks.get(dt)), "base_mfu": mfu(fpt, tokens / base_s, peaks.get(base.dtype)),
            "speedup": base_s / s, "ours_mem_mb": v.peak_mb, "base_mem_mb": variants[0].peak_mb,
            "ours_first_s": v.first, "base_first_s": variants[0].first,
            "ours_times_ms": [t * 1e3 for t in v.times], "base_times_ms": [t * 1e3 for t in variants[0].times],
        })
    return rows, auto_note


def _other_path(chosen: int | None, device: torch.device, shape: Shape) -> int | None:
    """The loss path not chosen: full logits if chunks were chosen, else the chunks eager CUDA takes."""
    if chosen is not None:
        return None
    return choose_loss_chunk_rows(device, compiled=False, vocab_size=shape.vocab_size)


def flops_per_token(shape: Shape) -> float:
    return meta_model(shape.gpt_config("sdpa")).flops_per_token(shape.block_size)  # no weights needed to count


def weights_mb(shape: Shape) -> float:
    return shape.gpt_config("sdpa").num_params() * 4 / 2**20


def largest_batch(rows: list[dict], shape: Shape, device: torch.device, headroom: float = 0.9) -> int:
    """The largest batch (a multiple of 8) that fits in `headroom` of the GPU's memory for every variant
    of the rows at shape.batch_size, with all of them resident as they are in a bench run: each
    variant's weights, gradients and AdamW state (4 copies of the fp32 weights) are fixed, and the
    rest of its measured peak (activations, logits) is extrapolated linearly in the batch."""
    total_mb = torch.cuda.get_device_properties(device).total_memory / 2**20
    peaks = [r[k] for r in rows for k in ("ours_mem_mb", "base_mem_mb") if r.get(k)]
    fixed = 4 * weights_mb(shape)
    per_sample = (max(peaks) - fixed) / shape.batch_size
    n_variants = len(rows) + 1  # ours rows + the baseline
    return max(8, int((headroom * total_mb - n_variants * fixed) / per_sample) // 8 * 8)


# ------------------------------------------------------------------------------------------ same loss

def loss_check(shape: Shape, *, device, dtype, compiled: bool, steps: int, eval_batches: int, data_dir: Path | None,
               tolerance: float, say, noise_runs: int = 0) -> dict:
    """The baseline and ours from the same init on the same batches for `steps` steps, under the same
    learning-rate schedule (nanoGPT's: linear warm-up over the first tenth, cosine to a tenth of the peak
    at the last step), then both evaluated by training.report.evaluate.evaluate (the eval train.py runs) in fp32
    on fixed held-out batches. Real tiny shakespeare when a prepared dir is given, else seeded random
    tokens. The verdict, on every device: the final val losses agree within `tolerance`.

    Why the schedule. The check used to train at a constant lr 1e-3 with no warm-up. In bf16 on a GPU
    that is chaotic: two equivalent loops whose kernels round differently (Inductor fuses ours and
    nanoGPT's graphs differently) tracked each other to ~1e-3 for the first steps, then drifted apart by
    a few hundredths of a nat, in either direction from run to run (-0.04, then +0.06 on an H100), and so
    did two runs of the baseline itself (noise_reference: the same graph, only atomic adds differ). The
    drift is the optimiser amplifying rounding at a high, undecayed lr, not a difference of the math:
    with the lr annealed, as every real run is, the runs end in the same basin, and what is left of the
    difference is what the check is for.

    noise_runs: the baseline run again that many times, from the same init on the same batches: how far
    a run is from itself (on a GPU, atomic adds and kernel choices differ between runs; on a CPU the runs
    are bitwise equal). Each run's per-step losses are kept, and the first step whose loss differs from
    the baseline's, bit for bit, is reported for ours and for each re-run: a difference of the math shows
    in ours at the first step while the re-runs still agree there; noise enters the re-runs alike."""
    if data_dir is not None:
        train = BatchLoader(data_dir, "train", block_size=shape.block_size, batch_size=shape.batch_size, seed=1337,
                            device=device)
        val = BatchLoader(data_dir, "val", block_size=shape.block_size, batch_size=shape.batch_size, seed=4242,
                          device=device)
        get_train, source = (lambda i: train.get_batch(i)), f"tiny shakespeare ({data_dir.name})"
    else:
        gen_batches = random_batches(shape, device, n=steps + eval_batches)
        get_train, source = (lambda i: gen_batches[i]), "seeded random tokens"
        val = _FixedLoader(gen_batches[steps:])
    weights = reference_weights(shape)
    if dtype is None:  # what train.py's dtype=auto picks for this shape
        dtype = auto_dtype_for(shape, weights, device, get_train(0))[0]
    base = baseline_step(shape, weights, device, get_train)
    ours = ours_step(shape, weights, device, dtype, compiled, get_train)
    say(f"[loss check] {steps} steps each, {shape.label}, {source}, ours in {dtype_name(dtype)}")
    lrs = [lr_at(i, lr=LR, min_lr=LR / 10, warmup_iters=max(1, steps // 10), max_iters=steps) for i in range(steps)]
    base_losses = torch.stack([base(i, lrs[i]) for i in range(steps)]).tolist()
    ours_losses = torch.stack([ours(i, lrs[i]) for i in range(steps)]).tolist()
    steps_run = [("base", base), ("ours", ours)]
    again_losses = []
    for k in range(noise_runs):
        again = baseline_step(shape, weights, device, get_train)
        again_losses.append(torch.stack([again(i, lrs[i]) for i in range(steps)]).tolist())
        steps_run.append((f"again{k}", again))
    vals = {name: evaluate(step.model, step.loss, {"val": val}, eval_batches, lambda: autocast(device, torch.float32))["val"]
            for name, step in steps_run}
    noise_diffs = [vals[f"again{k}"] - vals["base"] for k in range(noise_runs)]

    def first_differing(losses: list[float]) -> int | None:  # bit for bit: the step where two runs part
        return next((i for i, (a, b) in enumerate(zip(base_losses, losses)) if a != b), None)
    tail = min(20, steps)
    early = max(abs(a - b) for a, b in zip(base_losses[:tail], ours_losses[:tail]))
    val_diff = vals["ours"] - vals["base"]
    return {
        "noise": max(map(abs, noise_diffs)) if noise_runs else None, "noise_val_diffs": noise_diffs,
        "first_differing_step": {"ours": first_differing(ours_losses),
                                 **{f"again{k}": first_differing(a) for k, a in enumerate(again_losses)}},
        "again_train_losses": again_losses, "deterministic": torch.are_deterministic_algorithms_enabled(),
        "early_steps": tail, "early_max_diff": early,
        "verdict_on": "final val loss", "schedule": f"warm-up {max(1, steps // 10)}, cosine {LR:g} -> {LR / 10:g}",
        "steps": steps, "data": source, "eval_batches": eval_batches, "ours_dtype": dtype_name(dtype),
        "base_val_loss": vals["base"], "ours_val_loss": vals["ours"], "diff_val_loss": val_diff,
        "base_train_loss_last": sum(base_losses[-tail:]) / tail, "ours_train_loss_last": sum(ours_losses[-tail:]) / tail,
        "initial_train_loss": base_losses[0], "tolerance": tolerance,
        "agree": abs(val_diff) <= tolerance,
        "base_train_losses": base_losses, "ours_train_losses": ours_losses,
    }


class _FixedLoader:
    """get_batch(k, 0) -> the k-th of a fixed list of batches (evaluate's loader interface)."""

    def __init__(self, batches):
        self.batches = batches

    def get_batch(self, k: int, micro: int = 0):
        return self.batches[k]


def with_batch(shape: Shape, batch_size: int, label: str | None = None) -> Shape:
    return replace(shape, batch_size=batch_size, label=label or shape.label)
