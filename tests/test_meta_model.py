"""checkpoint/meta.py's meta_model: GPT(config) on the meta device with its random init skipped. The same
parameters, shapes and dtypes as the model built for real, over the architecture options; and loading a
checkpoint for inference no longer imports torch._dynamo (the meta device's normal_ did: ~0.9 s of every
sample.py start-up)."""
from __future__ import annotations

import dataclasses
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from checkpoint.load import checked_model_config
from checkpoint.meta import _NoInitOnMeta, meta_model
from errors import UserError
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
    # the mode that skips the init is left when the model is built
    assert not any(isinstance(m, _NoInitOnMeta) for m in torch.overrides._get_current_function_mode_stack())


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


TINY = dict(n_layer=1, n_head=2, n_embd=8, block_size=8, vocab_size=11)
ANY_VALUE = st.one_of(st.none(), st.booleans(), st.integers(-2**70, 2**70), st.floats(allow_nan=True),
                      st.text(max_size=8), st.sampled_from(["true", "1", "rope", "rmsnorm", "swiglu", "sdpa", "none"]),
                      st.lists(st.integers(), max_size=3), st.dictionaries(st.text(max_size=3), st.integers(), max_size=2))


@settings(max_examples=300, deadline=None)
@given(field=st.sampled_from([f.name for f in dataclasses.fields(GPTConfig)]), value=ANY_VALUE)
def test_any_value_of_any_model_config_field_gives_a_model_or_one_line(field, value):
    """A checkpoint's model_config (the edge every checkpoint load and resume goes through) with any value in any
    field: a config whose meta model builds, or a one-line UserError naming the checkpoint and the entry. (A
    string for a bool once reached the size check's arithmetic first: a ValueError, not the field's line.)"""
    saved = {**dataclasses.asdict(GPTConfig(**TINY)), field: value}
    try:
        config = checked_model_config(saved, "run/ckpt.pt")
    except UserError as e:
        assert "\n" not in str(e) and "run/ckpt.pt" in str(e) and "model_config" in str(e), e
    else:
        assert meta_model(config).config == config
