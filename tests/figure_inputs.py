"""What the figure tests draw: a tiny character model with peaky attention and its checkpoint payload
(tests/test_inspect.py, tests/test_drawing.py), and a run folder's metrics.jsonl (tests/test_plot.py,
tests/test_drawing.py)."""
from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import torch

from data import tokenizer_from_meta
from model import GPT, GPTConfig

TEXT = "First Citizen:\nBefore we proceed any further, hear me speak.\n"
CHARS = "".join(sorted(set(TEXT)))
TOK = tokenizer_from_meta({"tokenizer": "char", "chars": CHARS})


def tiny_model(seed: int = 0, **options) -> GPT:
    """A 2-layer, 2-head GPT with large random weights: peaky attention, far from uniform."""
    torch.manual_seed(seed)
    config = GPTConfig(**{**dict(vocab_size=TOK.vocab_size, block_size=16, n_layer=2, n_head=2, n_embd=16), **options})
    model = GPT(config)
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() == 2:
                p.normal_(0.0, 0.5)
    return model.eval()


def checkpoint_payload(model: GPT) -> dict:
    return {"model": model.state_dict(), "model_config": dataclasses.asdict(model.config), "config": {},
            "tokenizer": {"tokenizer": "char", "chars": CHARS}, "iter": 0}


def write_run(path: Path, steps: int = 6, scale: float = 1.0) -> Path:
    path.mkdir(parents=True)
    lines = []
    for i in range(1, steps + 1):
        rec = {"iter": i, "train/loss": scale * (5 - 0.5 * i), "lr": 1e-3 * i / steps, "tokens_seen": 128 * i}
        if i % 3 == 0:
            rec["val/loss"] = scale * (5.2 - 0.5 * i)
            rec["val/bpb"] = scale * (5.2 - 0.5 * i) / 0.6931
        lines.append(json.dumps(rec))
    (path / "metrics.jsonl").write_text("\n".join(lines) + "\n")
    return path
