"""A tiny char checkpoint with peaky logits, and sample.py run in-process -> (code, stdout, stderr) with its
one-error-line check: for the sampling tests and the others that sample."""
from __future__ import annotations

import dataclasses
import os
from pathlib import Path
import pytest
import torch
from inference import sample_cli
from errors import run_cli
from model import GPT, GPTConfig
from checkpoint import save_checkpoint


TEXT = "First Citizen:\nBefore we proceed any further, hear me speak.\n\nAll:\nSpeak, speak.\n"


CHARS = "".join(sorted(set(TEXT)))


ENV = {**os.environ, "OMP_NUM_THREADS": "1"}  # tiny models: one thread is fastest, as tests/conftest.py does in-process


def make_char_checkpoint(path: Path, seed: int = 0) -> GPT:
    torch.manual_seed(seed)
    config = GPTConfig(vocab_size=len(CHARS) + 1, block_size=32, n_layer=2, n_head=2, n_embd=32)
    model = GPT(config)
    with torch.no_grad():  # peaky logits: greedy choices are far from float ties
        for p in model.parameters():
            if p.dim() == 2:
                p.normal_(0.0, 0.4)
    save_checkpoint(path, {
        "model": model.state_dict(), "model_config": dataclasses.asdict(config), "config": {},
        "tokenizer": {"tokenizer": "char", "chars": CHARS}, "iter": 0,
    })
    return model.eval()


def run(argv, capsys):
    """sample.py in-process through run_cli -> (exit code, stdout, stderr)."""
    with pytest.raises(SystemExit) as exc:
        run_cli(lambda: sample_cli.main([str(a) for a in argv]))
    out, err = capsys.readouterr()
    return exc.value.code, out, err
