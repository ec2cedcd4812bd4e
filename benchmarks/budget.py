"""Quality in a time budget: what each shipped config reaches within the wall time W that nanoGPT's own
CPU recipe takes on the same machine.

W: nanoGPT's CPU recipe for shakespeare_char (`python train.py config/train_shakespeare_char.py
--device=cpu --compile=False --eval_iters=20 --block_size=64 --batch_size=12 --n_layer=4 --n_head=4
--n_embd=128 --max_iters=2000 --lr_decay_iters=2000 --dropout=0.0`: lr 1e-3, 100 warmup steps, cosine to
1e-4, beta2 0.99, eval every 250 steps on 20 batches of each split), run with nanoGPT's loop
(benchmarks/baseline.py) on the char-level tiny shakespeare prepared by this project: its model as nanoGPT
builds it (textbook attention, the exact GELU), its get_lr (baseline.nanogpt_lr; since 2026-11-27, eighth
session: before, our lr_at and the tanh GELU, figures in docs/performance.md so marked); W is its wall time
from data loading to the last eval, imports left out.

Each config then runs as a user runs it, `python train.py --config NAME`, to its end; its val loss at W
is that of its last eval whose `elapsed_s` (metrics.jsonl: wall seconds since train.py started
training, set-up included, imports not) is at most W.

Those evals read 20 random batches of val: an estimate, which moved by +-0.02 with the eval windows for one
model on tiny shakespeare. So both sides are also measured on the whole val split at their end (nanoGPT's
model by training.report.evaluate.evaluate_full here, ours by train.eval_full, on in the char configs): "whole
val" is the figure to compare, the estimate is shown as each run printed it.
"""
from __future__ import annotations

import contextlib
import json
import math
import subprocess
import sys
import time
from pathlib import Path

import torch

from data import BatchLoader, DataConfig, prepare_data
from errors import UserError
from model import GPT, GPTConfig
from training.config.sections import load_config
from training.report.evaluate import evaluate_full

from .baseline import FULL_LOGITS, nanogpt_lr, nanogpt_setup, nanogpt_step

ROOT = Path(__file__).resolve().parents[1]
RECIPE = dict(n_layer=4, n_head=4, n_embd=128, block_size=64, batch_size=12, max_iters=2000, lr=1e-3, min_lr=1e-4,
              warmup_iters=100, eval_interval=250, eval_iters=20)


def nanogpt_recipe(data_root: Path, device: torch.device, say) -> dict:
    """Train nanoGPT's CPU recipe with nanoGPT's loop; -> wall time and the val loss of each eval."""
    t0 = time.perf_counter()
    r = RECIPE
    data_dir = prepare_data(DataConfig(tokenizer="char", root=str(data_root)), progress=False)
    train = BatchLoader(data_dir, "train", block_size=r["block_size"], batch_size=r["batch_size"], seed=1337, device=device)
    evals = {s: BatchLoader(data_dir, s, block_size=r["block_size"], batch_size=r["batch_size"], seed=4242, device=device)
             for s in ("train", "val")}
    torch.manual_seed(1337)
    raw = GPT(GPTConfig(n_layer=r["n_layer"], n_head=r["n_head"], n_embd=r["n_embd"], block_size=r["block_size"],
                        vocab_size=train.meta["vocab_size"], dropout=0.0, attn_backend="manual",
                        gelu_approximate="none")).to(device)  # nanoGPT's nn.GELU(): the exact one
    model, optimizer, dtype = nanogpt_setup(raw, device)
    optimizer.param_groups[0]["betas"] = optimizer.param_groups[1]["betas"] = (0.9, 0.99)
    say(f"[budget] nanoGPT's CPU recipe: {r['max_iters']} steps of {r['batch_size']} x {r['block_size']} tokens")
    history = []

    @torch.no_grad()
    def val_loss() -> float:
        raw.eval()
        losses = [FULL_LOGITS(raw, *evals["val"].get_batch(k, 0)).item() for k in range(r["eval_iters"])]
        raw.train()
        return sum(losses) / len(losses)

    for it in range(r["max_iters"] + 1):
        if it % r["eval_interval"] == 0:  # nanoGPT evaluates at iter 0 too, and at the last one
            history.append({"iter": it, "val/loss": val_loss(), "elapsed_s": time.perf_counter() - t0})
        if it == r["max_iters"]:
            break
        for group in optimizer.param_groups:
            group["lr"] = nanogpt_lr(it, lr=r["lr"], min_lr=r["min_lr"], warmup_iters=r["warmup_iters"],
                                     lr_decay_iters=r["max_iters"])
        x, y = train.get_batch(it, 0)
        nanogpt_step(model, optimizer, x, y, dtype)
    wall = time.perf_counter() - t0
    bpb = history[-1]["val/loss"] / math.log(2) / evals["val"].bytes_per_token
    full = evaluate_full(raw, FULL_LOGITS, evals["val"], contextlib.nullcontext)  # after W: not part of the recipe's time
    return {"wall_s": wall, "val_loss": history[-1]["val/loss"], "val_bpb": bpb, "evals": history, "val_loss_full": full}


def check_configs(names: list[str], option: str) -> list[str]:
    """The configs to run, each a name in configs/ or a YAML path that train.py loads: checked now, not
    after W has been measured (minutes). -> the names, blanks left out."""
    names = [n.strip() for n in names if n.strip()]
    if not names:
        raise UserError(f"{option} names no config; give names in configs/ or YAML paths, separated by commas")
    for name in names:
        try:
            load_config(["--config", name])
        except UserError as e:
            raise UserError(f"{option}: {e}") from None
    return names


def run_config(name: str, out_dir: Path, data_root: Path, say) -> dict:
    """`python train.py --config NAME` to its end (wandb off, its own out_dir); -> wall time and the
    eval records of its metrics.jsonl."""
    say(f"[budget] python train.py --config {name}")
    t0 = time.perf_counter()
    r = subprocess.run([sys.executable, str(ROOT / "train.py"), "--config", name, f"--train.out_dir={out_dir}",
                        f"--data.root={data_root}", "--wandb.mode=disabled"], capture_output=True, text=True)
    wall = time.perf_counter() - t0
    if r.returncode:
        raise RuntimeError(f"train.py --config {name} failed: {r.stderr.strip().splitlines()[-1:]}")
    records = [json.loads(line) for line in (out_dir / "metrics.jsonl").read_text().splitlines()]
    return {"wall_s": wall, "evals": [rec for rec in records if "val/loss" in rec]}


def at_budget(evals: list[dict], budget_s: float) -> dict | None:
    """The last eval at or before `budget_s` seconds of the run."""
    within = [e for e in evals if e["elapsed_s"] <= budget_s]
    return within[-1] if within else None


def bench_budget(configs: list[str], work: Path, device: torch.device, budget_s: float | None, say) -> dict:
    """The budget table: W (measured, or given), then each config's val loss at W. For a `*_modern`
    config whose GPT-2 twin is also in the list, the twin's own wall time is a second budget."""
    out: dict = {"rows": []}
    if budget_s is None:
        base = nanogpt_recipe(work / "prepared", device, say)
        budget_s = base["wall_s"]
        out["nanogpt"] = base
    out["budget_s"] = budget_s
    runs = {name: run_config(name, work / f"out-{Path(name).stem}", work / "prepared", say) for name in configs}
    for name, run in runs.items():
        twin = name.removesuffix("_modern")
        budgets = [("W", budget_s)] + ([(f"{twin}'s wall time", runs[twin]["evals"][-1]["elapsed_s"])]
                                       if name != twin and twin in runs else [])
        for label, seconds in budgets:
            hit = at_budget(run["evals"], seconds)
            out["rows"].append({"config": name, "budget": label, "budget_s": seconds, "wall_s": run["wall_s"],
                                "run_s": run["evals"][-1]["elapsed_s"], "final_val": run["evals"][-1]["val/loss"],
                                "iter": hit and hit["iter"], "val_loss": hit and hit["val/loss"],
                                "val_bpb": hit and hit["val/bpb"], "val_loss_full": hit and hit.get("val/loss_full")})
    return out
