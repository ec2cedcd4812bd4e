"""What bounds a small model's training step on a GPU: kernel launches, or the GPU's own work.

Builds small.yaml's run with train.py's chain (training/builders.py's build_trainer; random tokens),
then for the eager step and the compiled one: the wall time of a step (host-synced), the GPU's busy time
in it and the kernels it launches (torch.profiler), and for compile its first call (the compile's cost).
A step whose GPU time is a small part of its wall time is bound by launches: fewer, larger kernels
(compile, CUDA graphs) are then what makes it faster, not a faster GPU.

    python -m benchmarks.gpu_step_profile [--config small.yaml] [--steps 50]
"""
from __future__ import annotations

import argparse
import statistics
import time

import torch
from torch.profiler import ProfilerActivity, profile

from model import GPT
from training.builders import build_trainer
from training.config.sections import load_config
from training.parallel.distributed import Parallel
from training.plan import RunPlan


def profile_step(config: str, compile: bool, steps: int) -> dict:
    cfg = load_config(["--config", config, f"--train.compile={compile}", "--wandb.mode=disabled"])
    t, block = cfg.train, cfg.model.block_size
    device = torch.device("cuda")
    torch.manual_seed(t.seed)
    model = GPT(cfg.model.gpt_config(50257)).to(device)
    tokens = torch.randint(0, 50257, (t.batch_size, block + 1), device=device)
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
    torch.cuda.synchronize()
    walls = []
    for _ in range(steps):
        s = time.perf_counter()
        trainer.step([batch]).loss.item()
        walls.append(time.perf_counter() - s)
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for _ in range(10):
            trainer.step([batch]).loss.item()
    kernels = [e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
    busy_ms = sum(e.device_time for e in kernels) / 1e3 / 10
    wall_ms = statistics.median(walls) * 1e3
    return {"compiled": compile, "first_step_s": round(first_s, 2), "step_ms": round(wall_ms, 3),
            "gpu_busy_ms": round(busy_ms, 3), "kernels_per_step": len(kernels) // 10,
            "gpu_busy_share": round(busy_ms / wall_ms, 3)}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--config", default="small.yaml")
    p.add_argument("--steps", type=int, default=50)
    args = p.parse_args(argv)
    print(f"{args.config} on {torch.cuda.get_device_name()}, torch {torch.__version__}")
    for compile in (False, True):
        row = profile_step(args.config, compile, args.steps)
        print(f"{'compiled' if compile else 'eager':8s} first step {row['first_step_s']:6.2f} s, then {row['step_ms']:6.2f} ms "
              f"a step, GPU busy {row['gpu_busy_ms']:.2f} ms of it ({row['gpu_busy_share']:.0%}), "
              f"{row['kernels_per_step']} kernels a step", flush=True)
    return 0


if __name__ == "__main__":
    from errors import run_cli

    run_cli(lambda: main())
