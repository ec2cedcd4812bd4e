"""DDP against FSDP on the CPU (`python bench.py --only fsdp`): 2 gloo ranks under torchrun, each
running the training step train.py runs (training.step.train_step on the model set up by the builders
train.py uses: shard_model, build_optimizers, parallelize), on the same random batches. Per rank: the
peak RSS while stepping, what it holds of the parameters, gradients and optimizer state, and the step
time. The model is big enough for the state to dominate (8 layers, 768 wide, GPT-2's padded
vocabulary: ~95M parameters, 1.5 GB of fp32 weights, gradients and AdamW moments per whole copy).

The parent process launches one torchrun per variant (`python -m benchmarks.fsdp` is the ranks'
script); each rank writes its figures to a JSON file the parent reads back.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

from model import GPT
from runtime.memory import release_freed_memory
from training.builders import build_trainer
from training.config.sections import load_config
from training.parallel.distributed import destroy_distributed, dist_from_env
from training.plan import RunPlan
from training.report.state_size import shard_counts, state_bytes

from .timing import reset_peak_rss, rss_kb

ROOT = Path(__file__).resolve().parents[1]
FULL = dict(n_layer=8, n_head=12, n_embd=768, block_size=128, vocab_size=50304, batch_size=2)
QUICK = dict(n_layer=2, n_head=2, n_embd=64, block_size=32, vocab_size=512, batch_size=2)


def bench_fsdp(*, quick: bool, warmup: int, iters: int, say) -> dict:
    """One torchrun per variant (ddp, fsdp), 2 ranks each -> {"shape", "rows": [per variant]}."""
    shape = QUICK if quick else FULL
    rows = []
    for parallel in ("ddp", "fsdp"):
        say(f"[fsdp] {parallel}: 2 gloo ranks, {warmup} warm-up + {iters} timed steps")
        env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
        with tempfile.TemporaryDirectory(prefix="smallgpt-fsdp-") as out:
            r = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
                                "-m", "benchmarks.fsdp", parallel, json.dumps(shape), str(warmup), str(iters), out],
                               capture_output=True, text=True, env=env, timeout=3600)
            ranks = [json.loads(f.read_text()) for f in sorted(Path(out).glob("rank*.json"))]
        if r.returncode != 0 or len(ranks) != 2:
            raise RuntimeError(f"the {parallel} ranks failed (exit {r.returncode}):\n{r.stderr[-3000:]}")
        ranks.sort(key=lambda x: x["rank"])
        rows.append({"parallel": parallel, "ranks": ranks,
                     "step_s": max(x["step_s"] for x in ranks),  # the step ends when the slower rank is done
                     "peak_rss_mb": max(x["peak_rss_mb"] for x in ranks),
                     "state_mb": max(x["state_mb"] for x in ranks), "params": ranks[0]["params"]})
    return {"shape": shape, "rows": rows}


def format_fsdp(result: dict) -> str:
    s = result["shape"]
    head = ["parallel", "params per rank", "state MB per rank", "peak RSS MB per rank", "step s"]
    body = [[r["parallel"], f"{r['ranks'][0]['local_params']:,} of {r['params']:,}", f"{r['state_mb']:.0f}",
             " / ".join(f"{x['peak_rss_mb']:.0f}" for x in r["ranks"]), f"{r['step_s']:.3f}"] for r in result["rows"]]
    widths = [max(len(x[i]) for x in [head] + body) for i in range(len(head))]
    lines = [f"DDP against FSDP, 2 gloo ranks on this CPU: {s['n_layer']} layers, {s['n_embd']} wide, vocab "
             f"{s['vocab_size']}, batch {s['batch_size']} x {s['block_size']} per rank, fp32, AdamW "
             "(state = parameters + gradients + optimizer moments; peak RSS while stepping, rank 0 / rank 1)"]
    for cells in [head, ["-" * w for w in widths]] + body:
        lines.append("  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(cells, widths))))
    return "\n".join(lines)


# ------------------------------------------------------------------------------------------ one rank

class _Batches:
    def __init__(self, batches):
        self.batches = batches

    def get_batch(self, i: int, micro: int = 0):
        return self.batches[micro]


def rank_main(parallel: str, shape: dict, warmup: int, iters: int, out: Path) -> None:
    torch.set_num_threads(1)
    par = dist_from_env(parallel)
    device = torch.device("cpu")
    par.join(device)
    cfg = load_config([f"--train.parallel={parallel}", f"--train.batch_size={shape['batch_size']}",
                       f"--train.grad_accum_steps={par.world_size}",  # one micro-step of batch_size on each rank
                       "--train.compile=false", "--train.dtype=float32", "--train.device=cpu", "--model.dropout=0.0"]
                      + [f"--model.{k}={shape[k]}" for k in ("n_layer", "n_head", "n_embd", "block_size", "vocab_size")])
    torch.manual_seed(1337)  # the same initial weights on every rank, as train.py draws them
    model = GPT(cfg.model.gpt_config(shape["vocab_size"]))
    gen = torch.Generator().manual_seed(par.rank)
    data = torch.randint(0, shape["vocab_size"], (shape["batch_size"], shape["block_size"] + 1), generator=gen)
    batches = [(data[:, :-1].contiguous(), data[:, 1:].contiguous())]
    # the run's chain (training/builders.py): loss path, its product, shard (FSDP), optimizers, scaler, DDP
    trainer = build_trainer(cfg, par, device, model, RunPlan(), lambda micro: (_Batches(batches), {}),
                            say=lambda line: None)
    model, optimizers = trainer.model, trainer.step.optimizers
    assert trainer.accum == 1 and trainer.train_loader.batches[0][0].shape[0] == shape["batch_size"]

    def step():
        trainer.step(batches).loss.item()  # the host sync a logged step makes

    step()  # the optimizer state exists from here on
    release_freed_memory()  # what set-up freed (the whole model, built before sharding) goes back to the kernel
    reset_peak_rss()  # the steady state: set-up is not counted
    for _ in range(max(0, warmup - 1)):
        step()
    times = []
    for _ in range(iters):
        t0 = time.perf_counter()
        step()
        times.append(time.perf_counter() - t0)
    local, whole = shard_counts(model)
    result = {"rank": par.rank, "parallel": parallel, "step_s": sorted(times)[len(times) // 2],
              "peak_rss_mb": (rss_kb("VmHWM") or 0) / 1024, "state_mb": state_bytes(model, optimizers) / 2**20,
              "local_params": local, "params": whole}
    (out / f"rank{par.rank}.json").write_text(json.dumps(result))
    trainer = model = optimizers = None  # DDP's reducer goes before the process group
    destroy_distributed()


if __name__ == "__main__":  # a rank: python -m benchmarks.fsdp <parallel> <shape json> <warmup> <iters> <out dir>
    rank_main(sys.argv[1], json.loads(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), Path(sys.argv[5]))
