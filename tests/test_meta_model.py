"""checkpoint/meta.py's meta_model: GPT(config) on the meta device with its random init skipped. The same
parameters, shapes and dtypes as the model built for real, over the architecture options; and loading a
checkpoint for inference no longer imports torch._dynamo (the meta device's normal_ did: ~0.9 s of every
sample.py start-up)."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch

from checkpoint.meta import meta_model
from model import GPT, GPTConfig

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("options", [{}, {"tie_embeddings": False, "bias": False, "zero_init_proj": True},
                                     {"pos_embedding": "rope", "norm": "rmsnorm", "qk_norm": True, "mlp_act": "swiglu"}])
def test_the_meta_model_has_the_built_models_parameters(options):
    config = GPTConfig(n_layer=2, n_head=2, n_embd=16, block_size=8, vocab_size=37, **options)
    meta, real = meta_model(config), GPT(config)
    got = {k: (v.shape, v.dtype, v.is_meta) for k, v in meta.state_dict().items()}
    assert got == {k: (v.shape, v.dtype, True) for k, v in real.state_dict().items()}
    assert (meta.lm_head.weight is meta.transformer.wte.weight) == config.tie_embeddings
    # outside it, a meta tensor's init runs as torch runs it (the mode is not left on)
    assert torch.nn.init.normal_(torch.empty(3)).abs().sum() > 0


def test_loading_a_checkpoint_for_inference_does_not_import_dynamo(tmp_path):
    code = f"""
import sys, torch
from checkpoint.format import save_checkpoint
from checkpoint import load_model
from model import GPT, GPTConfig
from checkpoint.load import model_config_dict
m = GPT(GPTConfig(n_layer=1, n_head=2, n_embd=16, block_size=8, vocab_size=37))
save_checkpoint({str(tmp_path / 'ckpt.pt')!r}, {{"model": m.state_dict(), "model_config": model_config_dict(m),
                "config": {{}}, "tokenizer": {{"tokenizer": "gpt2", "chars": None}}}})
loaded = load_model({str(tmp_path)!r}).model
assert all(torch.equal(a, b) for a, b in zip(loaded.state_dict().values(), m.state_dict().values()))
print("dynamo" if "torch._dynamo" in sys.modules else "no dynamo")
"""
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout.strip().splitlines()[-1] == "no dynamo"
