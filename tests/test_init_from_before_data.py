"""A model.init_from that cannot load is refused before the data is prepared (which can take many minutes):
every kind of bad source checkable without its weights (a path that is not there, a folder of no kind that
loads, an HF folder without weights or with a bad config.json, a file that is no checkpoint, a checkpoint with
an invalid model_config or another tokenizer, a hub name that is not there) is one `error:` line, and the
preparation never starts."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from training import chain

from training import cli as train_cli

from multirank_runs import argv as tiny_argv
from cli_lines import an_error_line, cli

GPT2_CONFIG = {"model_type": "gpt2", "n_positions": 32, "vocab_size": 50257, "n_layer": 1, "n_head": 2, "n_embd": 8}
OUR_CONFIG = {"block_size": 32, "vocab_size": 65, "n_layer": 1, "n_head": 2, "n_embd": 8}


def hf_folder(t: Path, config: object) -> Path:
    t.mkdir()
    (t / "config.json").write_text(config if isinstance(config, str) else json.dumps(config))
    return t


def checkpoint(t: Path, model_config: dict, tokenizer: str, edit=lambda weights: weights) -> Path:
    """A checkpoint of ours as train.py's format has it (format, version, model_config, tokenizer, weights of a
    model of that config, `edit`ed), written as a plain torch.save."""
    from model import GPT, GPTConfig

    weights = GPT(GPTConfig(**OUR_CONFIG)).state_dict() if model_config == OUR_CONFIG else {}
    torch.save({"format": "smallgpt-checkpoint", "version": 3, "model_config": model_config,
                "tokenizer": {"tokenizer": tokenizer, "chars": None}, "model": edit(dict(weights))}, t)
    return t


def nan_in(name: str):
    return lambda weights: weights | {name: torch.full_like(weights[name], float("nan"))}


def not_a_checkpoint(t: Path) -> Path:
    t.write_text("not a checkpoint\n")
    return t


# kind -> (make the bad source under a temp folder, data.tokenizer, words its line must hold)
KINDS = {
    "a checkpoint path that does not exist": (lambda t: t / "nope" / "ckpt.pt", "char", ("does not exist",)),
    "a folder that does not exist": (lambda t: t / "no_such_run", "char", ("does not exist",)),
    "an empty folder": (lambda t: (t / "empty").mkdir() or t / "empty", "char", ("no ckpt.pt",)),
    "an HF folder without weights": (lambda t: hf_folder(t / "hf", GPT2_CONFIG), "gpt2", ("model.safetensors",)),
    "an HF folder whose config.json is no JSON": (lambda t: hf_folder(t / "hf", "{not json"), "gpt2", ("config.json",)),
    "an HF folder of another model type": (lambda t: hf_folder(t / "hf", GPT2_CONFIG | {"model_type": "bert"}),
                                           "gpt2", ("model_type", "bert")),
    "an HF folder whose config.json has a bad size": (lambda t: hf_folder(t / "hf", GPT2_CONFIG | {"n_layer": -3}),
                                                      "gpt2", ("n_layer",)),
    "an HF folder with char data": (lambda t: hf_folder(t / "hf", GPT2_CONFIG), "char", ("data.tokenizer=gpt2",)),
    "a file that is no checkpoint": (lambda t: not_a_checkpoint(t / "ckpt.pt"), "char", ("not a PyTorch checkpoint",)),
    "a checkpoint with an invalid model_config": (lambda t: checkpoint(t / "ckpt.pt", OUR_CONFIG | {"n_embd": -8}, "char"),
                                                  "char", ("invalid model_config",)),
    "a checkpoint of another tokenizer": (lambda t: checkpoint(t / "ckpt.pt", OUR_CONFIG, "gpt2"), "char",
                                          ("trained with tokenizer", "gpt2")),
    "a hub name not there (offline)": (lambda t: "no-such-model-xyz", "gpt2", ("no-such-model-xyz",)),
    # the weights themselves (found from outside: each was refused only after the data's preparation)
    "a checkpoint whose weights lack one": (lambda t: checkpoint(t / "ckpt.pt", OUR_CONFIG, "char", lambda w: {
        k: v for k, v in w.items() if k != "transformer.wpe.weight"}), "char", ("do not match", "wpe")),
    "a checkpoint whose weight has another shape": (lambda t: checkpoint(t / "ckpt.pt", OUR_CONFIG, "char", lambda w: w | {
        "transformer.wpe.weight": torch.zeros(3, 8)}), "char", ("do not match", "wpe")),
    "a checkpoint with NaN weights": (lambda t: checkpoint(t / "ckpt.pt", OUR_CONFIG, "char", nan_in("transformer.h.0.mlp.c_fc.weight")),
                                      "char", ("non-finite weights",)),
    "an HF folder whose model.safetensors is damaged": (lambda t: hf_folder(t / "hf", GPT2_CONFIG) and (
        (t / "hf" / "model.safetensors").write_text("junk") and t / "hf"), "gpt2", ("model.safetensors", "damaged")),
    "an HF folder whose pytorch_model.bin is no PyTorch file": (lambda t: hf_folder(t / "hf", GPT2_CONFIG) and (
        (t / "hf" / "pytorch_model.bin").write_text("junk") and t / "hf"), "gpt2", ("pytorch_model.bin", "damaged")),
}


@pytest.mark.parametrize("kind", KINDS)
def test_a_bad_init_from_is_refused_before_the_data_is_prepared(kind, tmp_path, monkeypatch, capsys):
    make, tokenizer, words = KINDS[kind]
    source = make(tmp_path)
    prepared = []
    monkeypatch.setattr(chain, "prepare_data", lambda *a, **k: prepared.append(a) or pytest.fail("data prepared"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    data_root = tmp_path / "data"
    argv = [*tiny_argv(tmp_path / "out", data_root), f"--data.tokenizer={tokenizer}", f"--model.init_from={source}"]
    code, _, err = cli(argv, capsys)
    an_error_line(code, err, *words)
    assert not prepared and not data_root.exists() and not (tmp_path / "out").exists()


def test_a_good_checkpoint_passes_the_check_and_is_loaded_after_the_data(tmp_path, data_root, monkeypatch):
    """The check refuses nothing that loads: a run's own checkpoint starts the next run (the weights read later)."""
    first = train_cli.main([*tiny_argv(tmp_path / "a", data_root), "--train.max_iters=1", "--train.eval_interval=1"])
    assert first == 0
    calls = []
    real = chain.prepare_data
    monkeypatch.setattr(chain, "prepare_data", lambda *a, **k: calls.append(1) or real(*a, **k))
    assert train_cli.main([*tiny_argv(tmp_path / "b", data_root), "--train.max_iters=1", "--train.eval_interval=1",
                       f"--model.init_from={tmp_path / 'a'}"]) == 0
    assert calls == [1]


@pytest.mark.parametrize("weights", ["model.safetensors", "pytorch_model.bin", "pytorch_model.bin (torch < 1.6)"])
def test_the_check_passes_a_good_hf_folder_in_each_weight_format(weights, tmp_path):
    """The check refuses nothing that loads (the reviewer's case): an HF GPT-2 folder whose weights are whole, in
    each file format from_pretrained reads, passes check_source, and load_model then loads it."""
    from safetensors.torch import load_file

    from checkpoint import check_source, load_model
    from checkpoint.hf import write_hf_weights
    from model import GPT, GPTConfig

    hf = tmp_path / "hf"
    hf.mkdir()
    write_hf_weights(GPT(GPTConfig(block_size=32, vocab_size=50257, n_layer=1, n_head=2, n_embd=8)), hf)
    if weights != "model.safetensors":  # the same tensors in a .bin, zip (torch >= 1.6) or legacy format
        tensors = load_file(hf / "model.safetensors")
        torch.save(tensors, hf / "pytorch_model.bin", _use_new_zipfile_serialization=weights == "pytorch_model.bin")
        (hf / "model.safetensors").unlink()
    assert check_source(str(hf)) is None
    assert load_model(str(hf)).model.config.n_embd == 8
