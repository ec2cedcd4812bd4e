"""What bounds a small model's training step on a GPU: kernel launches, or the GPU's own work.

Builds small.yaml's run with train.py's chain (training/builders.py's build_trainer; random tokens),
then for the eager step and the compiled one: the wall time of a step (host-synced), the GPU's busy time
in it and the kernels it launches (torch.profiler), and for compile its first call (the compile's cost).
A step whose GPU time is a small part of its wall time is bound by launches: fewer, larger kernels
(compile, CUDA graphs) are then what makes it faster, not a faster GPU.

    python -m benchmarks.gpu_step_profile [--config small.yaml] [--steps 50] [--top 12] [--set train.optimizer=adamw]

--set takes train.py's --section.key=value overrides (without the dashes), e.g. to time the char GPU config's
step with AdamW instead of Muon; --top lists the kernels that take the most GPU time, summed over a step
(what a slower step than nanoGPT's spends its time on).
"""
from __future__ import annotations

import argparse
import collections
import statistics
import time

import torch
from torch.profiler import ProfilerActivity, profile

from model import GPT
from training.builders import build_trainer
from training.config.sections import load_config
from training.parallel.distributed import Parallel
from training.plan import RunPlan


CHAR_VOCAB = 65  # tiny shakespeare's characters


def profile_step(config: str, compile: bool, steps: int, overrides: list[str] = (), top: int = 0,
                 device: torch.device = torch.device("cuda")) -> dict:
    """On a CPU (a smoke run of this script) the "kernels" are the aten ops and their self CPU time."""
    cfg = load_config(["--config", config, *[f"--{o}" for o in overrides], f"--train.compile={compile}",
                       "--wandb.mode=disabled"])
    t, block = cfg.train, cfg.model.block_size
    cuda = device.type == "cuda"
    torch.manual_seed(t.seed)
    vocab = cfg.model.vocab_size or (CHAR_VOCAB if cfg.data.tokenizer == "char" else 50257)
    model = GPT(cfg.model.gpt_config(vocab)).to(device)
    tokens = torch.randint(0, vocab, (t.batch_size, block + 1), device=device)
    batch = (tokens[:, :-1].contiguous(), tokens[:, 1:].contiguous())

    class Batches:
        def get_batch(self, i: int, micro: int = 0):
            return batch

    trainer = build_trainer(cfg, Parallel(), device, model, RunPlan(), lambda micro: (Batches(), {}),
                            say=lambda line: None)
    s = time.perf_counter()
    trainer.step([batch]).loss.item()
    first_s = time.perf_counter() - s
    for _ in range(5):
        trainer.step([batch])
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
    return {"compiled": compile, "first_step_s": round(first_s, 2), "step_ms": round(wall_ms, 3),
            "gpu_busy_ms": round(busy_ms, 3), "kernels_per_step": len(kernels) // 10,
            "gpu_busy_share": round(busy_ms / wall_ms, 3),
            "top_kernels_ms": [(name, round(ms, 3)) for name, ms in by_name.most_common(top)]}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--config", default="small.yaml")
    p.add_argument("--steps", type=int, default=50)
    p.add_argument("--top", type=int, default=0, help="list the N kernels that take the most GPU time")
    p.add_argument("--set", action="append", default=[], metavar="SECTION.KEY=VALUE", help="a config override")
    p.add_argument("--device", default="cuda", help="cpu: a smoke run of this script (aten ops for kernels)")
    p.add_argument("--eager-only", action="store_true", help="leave out the compiled step")
    args = p.parse_args(argv)
    device = torch.device(args.device)
    where = torch.cuda.get_device_name() if device.type == "cuda" else "cpu"
    print(f"{args.config} {' '.join(args.set)} on {where}, torch {torch.__version__}")
    for compile in (False,) if args.eager_only else (False, True):
        row = profile_step(args.config, compile, args.steps, args.set, args.top, device)
        print(f"{'compiled' if compile else 'eager':8s} first step {row['first_step_s']:6.2f} s, then {row['step_ms']:6.2f} ms "
              f"a step, GPU busy {row['gpu_busy_ms']:.2f} ms of it ({row['gpu_busy_share']:.0%}), "
              f"{row['kernels_per_step']} kernels a step", flush=True)
        for name, ms in row["top_kernels_ms"]:
            print(f"    {ms:8.3f} ms  {name}", flush=True)
    return 0


if __name__ == "__main__":
    from errors import run_cli

    run_cli(lambda: main())
