"""The tiny training run the end-to-end tests share: a 2-layer, 32-wide char model on the session's
prepared data (conftest's data_root), trained in-process by loop.train or in a subprocess."""
from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

from training import loop
from training.config.sections import load_config

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(autouse=True)
def _one_thread():
    """Tiny models run fastest on one thread, and other jobs may share the cores. pytest uses it in a module only
    where the module imports it by name (test_train.py, test_train_wandb.py, test_showcase.py)."""
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


def tiny_argv(out_dir: Path, data_root: Path, *extra: str) -> list[str]:
    return [
        "--data.tokenizer=char", f"--data.root={data_root}", f"--train.out_dir={out_dir}",
        "--model.n_layer=2", "--model.n_head=2", "--model.n_embd=32", "--model.block_size=32",
        "--train.batch_size=4", "--train.max_iters=30", "--train.warmup_iters=5", "--train.lr=3e-3",
        "--train.min_lr=3e-4", "--train.eval_interval=10", "--train.eval_iters=4", "--train.log_interval=1",
        "--train.dtype=float32", "--train.device=cpu", "--train.peak_flops=1e11", "--wandb.mode=disabled",
        *extra,
    ]


def run(out_dir: Path, data_root: Path, *extra: str) -> dict:
    return loop.train(load_config(tiny_argv(out_dir, data_root, *extra)))


def sub_env() -> dict:
    """The environment of a train.py subprocess: one thread, the project importable."""
    return {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}


def as_version_2(ckpt: dict, without: tuple[str, ...] = ()) -> dict:
    """A checkpoint as format 2 wrote it: the plan's decisions among the counters of "train" (0 or "": none),
    less the fields in `without` (written before they existed), and no log window (format 4's). Written by hand,
    not by the upgrade code."""
    plan, ckpt = ckpt["plan"], {k: v for k, v in ckpt.items() if k not in ("plan", "window")}
    notes = plan.get("notes", {})
    v2 = {"dtype": plan.get("dtype", ""), "loss_product": plan.get("loss_product", "torch.mm"),
          "micro_batch": plan.get("micro_batch", 0) if notes.get("batch") else 0, "batch_note": notes.get("batch", ""),
          "budget_iters": plan.get("max_iters", 0) if notes.get("schedule") else 0,
          "budget_warmup": plan.get("warmup_iters", 0) if notes.get("schedule") else 0,
          "budget_note": notes.get("schedule", "")}
    ckpt["train"] = {**ckpt["train"], **{k: v for k, v in v2.items() if k not in without}}
    return {**ckpt, "version": 2}
