"""What bounds a small model's training step on a GPU: kernel launches, or the GPU's own work.

Builds small.yaml's run with the run's chain (training/builders.py's build_trainer; random tokens),
then for each way to run the step (eager: train.cuda_graph=false; graph: the step replayed as one CUDA
graph, training/graphs/step.py, train.py's default on a GPU; compiled: train.compile=true) the wall time of
a step (host-synced), the GPU's busy time in it and the kernels it launches (torch.profiler), the slowest
of the first steps (the compile's or the capture's), an eval's time (its forwards graphed with the step),
and the first steps' losses (each on its own batch, under a changing learning rate) beside the eager
step's: the graph's should differ in the last bits at most (its AdamW reads the rate in fp32, and
attention's backward may add in another order).
A step whose GPU time is a small part of its wall time is bound by launches: fewer, larger kernels
(compile, CUDA graphs) are then what makes it faster, not a faster GPU.

    python -m benchmarks.gpu_step_profile [--config small.yaml] [--steps 50] [--top 12] [--set train.optimizer=adamw]
                                          [--modes eager,graph,compiled]

--set takes train.py's --section.key=value overrides (without the dashes), e.g. to time the char GPU config's
step with AdamW instead of Muon; --top lists the kernels that take the most GPU time, summed over a step
(what a slower step than nanoGPT's spends its time on).
"""
from __future__ import annotations

import errors

if __name__ == "__main__":  # a command: Ctrl-C while the imports below run is one line (errors.quiet_interrupts)
    errors.quiet_interrupts()

import argparse
import collections
import statistics
import time

import torch
from torch.profiler import ProfilerActivity, profile

from errors import UserError
from model import GPT
from training import builders
from training.config.sections import load_config
from training.parallel.distributed import Parallel
from training.plan import RunPlan
from training.report.evaluate import evaluate
from training.timing.schedule import apply_lr, lr_at


CHAR_VOCAB = 65  # tiny shakespeare's characters


MODES = ("eager", "graph", "compiled")
LOSS_STEPS = 24  # the first steps, each on its own batch and learning rate, whose losses the modes compare


class InTurn:
    """A loader's interface (get_batch) over fixed batches, in turn."""
    def __init__(self, batches):
        self.batches = batches

    def get_batch(self, k: int, micro: int = 0):
        return self.batches[k % len(self.batches)]


def as_on_cuda(rule):
    """builders.step_graph_for's `rule`, deciding as on a CUDA device whatever the device is: on a CPU the run then
    takes the graphed step's path, uncaptured (this script's smoke run; tests/faults.py's SMALLGPT_TEST_STEP_GRAPH)."""
    return lambda cfg, par, device, dtype: rule(cfg, par, torch.device("cuda"), dtype)


def profile_step(cfg, mode: str, steps: int, top: int = 0, device: torch.device = torch.device("cuda")) -> dict:
    """`cfg`: the mode's config (config_of). On a CPU (a smoke run of this script) the "kernels" are the aten ops
    and their self CPU time, and the graph mode runs uncaptured."""
    t, block = cfg.train, cfg.model.block_size
    cuda = device.type == "cuda"
    if cuda:  # this mode's own peak, an eval's included (since 2026-11-27): the graphs' pools are held for the run
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(device)
    torch.manual_seed(t.seed)
    vocab = cfg.model.vocab_size or (CHAR_VOCAB if cfg.data.tokenizer == "char" else 50257)
    model = GPT(cfg.model.gpt_config(vocab)).to(device)
    gen = torch.Generator().manual_seed(0)  # the same batches in every mode
    windows = [torch.randint(0, vocab, (t.batch_size, block + 1), generator=gen).to(device) for _ in range(LOSS_STEPS)]
    batches = [(w[:, :-1].contiguous(), w[:, 1:].contiguous()) for w in windows]
    batch = batches[0]

    plan, rule = RunPlan(), builders.step_graph_for
    if mode == "graph" and not cuda:  # the rule decides as on a GPU, so that a CPU smoke run takes the same path
        builders.step_graph_for = as_on_cuda(rule)
    try:
        trainer = builders.build_trainer(cfg, Parallel(), device, model, plan, lambda micro: (InTurn([batch]), {}),
                                         say=lambda line: print("   ", line))
    finally:
        builders.step_graph_for = rule
    losses, slowest_s = [], 0.0
    for i, b in enumerate(batches):  # past the graph's warm-up and its capture, each step its own batch and rate
        apply_lr(trainer.step.optimizers, lr_at(i, lr=t.lr, min_lr=t.min_lr, warmup_iters=4, max_iters=LOSS_STEPS),
                 t.lr)
        s = time.perf_counter()
        losses.append(trainer.step([b]).loss.item())
        slowest_s = max(slowest_s, time.perf_counter() - s)  # the compile's, or the capture's (and its check)
    if cuda:
        torch.cuda.synchronize()
    walls = []
    for _ in range(steps):
        s = time.perf_counter()
        trainer.step([batch]).loss.item()
        walls.append(time.perf_counter() - s)
    with profile(activities=[ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])) as prof:
        for _ in range(10):
            trainer.step([batch]).loss.item()
    if cuda:
        kernels = [e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
        time_us = {id(e): e.device_time for e in kernels}
    else:
        kernels = [e for e in prof.events() if e.name.startswith("aten::")]
        time_us = {id(e): e.self_cpu_time_total for e in kernels}
    busy_ms = sum(time_us.values()) / 1e3 / 10
    wall_ms = statistics.median(walls) * 1e3
    by_name = collections.Counter()
    for e in kernels:
        by_name[e.name[:90]] += time_us[id(e)] / 1e3 / 10
    # an eval as train.py runs it (eval_iters batches of two splits, its forwards graphed where the step is; the
    # batches: the first steps', in turn): the first records, the next three are timed
    evals = {"train": InTurn(batches), "val": InTurn(batches[::-1])}
    evaluate(trainer.model, trainer.step.eval_loss, evals, t.eval_iters, trainer.amp)
    eval_walls, eval_loss = [], 0.0
    for _ in range(3):
        s = time.perf_counter()
        eval_loss = evaluate(trainer.model, trainer.step.eval_loss, evals, t.eval_iters, trainer.amp)["val"]
        eval_walls.append(time.perf_counter() - s)
    peak_gib = torch.cuda.max_memory_reserved(device) / 2**30 if cuda else 0.0
    return {"mode": mode, "graphed": plan.step_graph, "losses": losses, "slowest_step_s": round(slowest_s, 2),
            "peak_reserved_gib": round(peak_gib, 2),
            "step_ms": round(wall_ms, 3), "eval_ms": round(statistics.median(eval_walls) * 1e3, 2),
            "eval_loss": eval_loss, "eval_iters": t.eval_iters,
            "gpu_busy_ms": round(busy_ms, 3), "kernels_per_step": len(kernels) // 10,
            "gpu_busy_share": round(busy_ms / wall_ms, 3),
            "top_kernels_ms": [(name, round(ms, 3)) for name, ms in by_name.most_common(top)]}


def config_of(config: str, mode: str, overrides: list[str] = ()):
    """The config a mode profiles: the named config, the --set overrides, then the mode's own switches."""
    return load_config(["--config", config, *[f"--{o}" for o in overrides], f"--train.compile={mode == 'compiled'}",
                        f"--train.cuda_graph={mode == 'graph'}", "--wandb.mode=disabled"])


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--config", default="small.yaml")
    p.add_argument("--steps", type=int, default=50)
    p.add_argument("--top", type=int, default=0, help="list the N kernels that take the most GPU time")
    p.add_argument("--set", action="append", default=[], metavar="SECTION.KEY=VALUE", help="a config override")
    p.add_argument("--device", default="cuda", help="cpu: a smoke run of this script (aten ops for kernels)")
    p.add_argument("--modes", default=",".join(MODES), help=f"which of {', '.join(MODES)} to time")
    return p


def checked(argv: list[str] | None = None) -> tuple[argparse.Namespace, dict]:
    """The options and every mode's config, loaded: each check done before the first profile (a typo in the last
    mode would otherwise be found after the first ones' minutes on the GPU; tests/test_gpu_round.py runs it)."""
    args = build_parser().parse_args(argv)
    configs = {}
    for mode in args.modes.split(","):
        if mode not in MODES:
            raise UserError(f"--modes takes {', '.join(MODES)} separated by commas, got {mode!r}")
        configs[mode] = config_of(args.config, mode, args.set)
    return args, configs


def main(argv: list[str] | None = None) -> int:
    args, configs = checked(argv)
    device = torch.device(args.device)
    where = torch.cuda.get_device_name() if device.type == "cuda" else "cpu"
    print(f"{args.config} {' '.join(args.set)} on {where}, torch {torch.__version__}")
    eager_losses = None
    for mode, cfg in configs.items():
        row = profile_step(cfg, mode, args.steps, args.top, device)
        print(f"{mode:8s} slowest step {row['slowest_step_s']:6.2f} s, then {row['step_ms']:6.2f} ms "
              f"a step, GPU busy {row['gpu_busy_ms']:.2f} ms of it ({row['gpu_busy_share']:.0%}), "
              f"{row['kernels_per_step']} kernels a step, {row['peak_reserved_gib']:.2f} GiB reserved at peak"
              + ("" if row["graphed"] or mode != "graph" else " (the plan did not graph it)"), flush=True)
        print(f"         an eval ({row['eval_iters']} batches of each split): {row['eval_ms']:.1f} ms, val loss "
              f"{row['eval_loss']:.6f}", flush=True)
        if mode == "eager":
            eager_losses = row["losses"]
        elif eager_losses is not None:
            diff = max(abs(a - b) for a, b in zip(row["losses"], eager_losses))
            print(f"         first {LOSS_STEPS} losses against eager's: max |diff| {diff:.3g}"
                  + (" (bit for bit)" if row["losses"] == eager_losses else ""), flush=True)
        for name, ms in row["top_kernels_ms"]:
            print(f"    {ms:8.3f} ms  {name}", flush=True)
    return 0


if __name__ == "__main__":
    errors.start_up_done()  # the imports are done: Ctrl-C is a KeyboardInterrupt again (run_cli says it)
    from errors import run_cli

    run_cli(lambda: main())
