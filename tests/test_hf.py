"""HF GPT-2 weights in and out, checked against transformers itself (random weights, nothing downloaded)."""
from __future__ import annotations

import pytest
import torch

transformers = pytest.importorskip("transformers")
from transformers import GPT2Config, GPT2LMHeadModel  # noqa: E402

from model import GPT, GPTConfig  # noqa: E402

HF_TINY = dict(n_layer=2, n_head=4, n_embd=64, n_positions=64, vocab_size=50257)


@pytest.fixture(scope="module")
def hf_model():
    torch.manual_seed(0)
    model = GPT2LMHeadModel(GPT2Config(**HF_TINY)).eval()
    with torch.no_grad():  # HF inits biases to zero; make them non-zero so the bias path is compared too
        for name, p in model.named_parameters():
            if name.endswith("bias"):
                p.normal_(0, 0.02)
    return model


@pytest.fixture(scope="module")
def hf_dir(hf_model, tmp_path_factory):
    path = tmp_path_factory.mktemp("hf")
    hf_model.save_pretrained(path)
    return path


def random_tokens(T=40, vocab=50257):
    return torch.randint(0, vocab, (2, T), generator=torch.Generator().manual_seed(3))


def test_from_pretrained_matches_transformers_logits(hf_model, hf_dir):
    ours = GPT.from_pretrained(str(hf_dir)).eval()
    assert ours.config.n_layer == 2 and ours.config.block_size == 64
    idx = random_tokens()
    with torch.no_grad():
        torch.testing.assert_close(ours(idx), hf_model(idx).logits, rtol=0, atol=1e-4)


def test_from_pretrained_reads_legacy_pytorch_model_bin(hf_model, tmp_path):
    # the original OpenAI-converted files: no "transformer." prefix, attention-mask buffers included
    sd = {k.removeprefix("transformer."): v for k, v in hf_model.state_dict().items() if k != "lm_head.weight"}
    sd["h.0.attn.bias"] = torch.tril(torch.ones(1, 1, 64, 64))
    torch.save(sd, tmp_path / "pytorch_model.bin")
    hf_model.config.to_json_file(tmp_path / "config.json")
    ours = GPT.from_pretrained(str(tmp_path)).eval()
    idx = random_tokens()
    with torch.no_grad():
        torch.testing.assert_close(ours(idx), hf_model(idx).logits, rtol=0, atol=1e-4)


def test_exported_directory_loads_in_transformers_with_same_logits(hf_dir, tmp_path):
    ours = GPT.from_pretrained(str(hf_dir)).eval()
    ours.export_hf(tmp_path / "out")
    reloaded = GPT2LMHeadModel.from_pretrained(tmp_path / "out").eval()
    idx = random_tokens()
    with torch.no_grad():
        torch.testing.assert_close(reloaded(idx).logits, ours(idx), rtol=0, atol=1e-4)


def test_export_of_a_biasless_exact_gelu_model_loads_in_transformers(tmp_path):
    torch.manual_seed(1)
    ours = GPT(GPTConfig(n_layer=2, n_head=2, n_embd=32, block_size=16, vocab_size=65, bias=False,
                         gelu_approximate="none")).eval()
    ours.export_hf(tmp_path)
    reloaded = GPT2LMHeadModel.from_pretrained(tmp_path).eval()
    assert reloaded.config.activation_function == "gelu"
    idx = random_tokens(T=16, vocab=65)
    with torch.no_grad():
        torch.testing.assert_close(reloaded(idx).logits, ours(idx), rtol=0, atol=1e-4)


def test_from_pretrained_of_a_directory_without_config_is_refused(tmp_path):
    with pytest.raises(FileNotFoundError, match="config.json"):
        GPT.from_pretrained(str(tmp_path))


def test_from_pretrained_of_an_unreachable_hub_name_is_refused(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(FileNotFoundError, match="neither a local HF directory nor a reachable hub model"):
        GPT.from_pretrained("gpt2-this-name-does-not-exist")


def run_export_cli(*args):
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    return subprocess.run([sys.executable, "-m", "model.hf", "export", *map(str, args)],
                          cwd=root, capture_output=True, text=True, timeout=120)


def test_export_cli_writes_a_directory_transformers_loads(tmp_path):
    import dataclasses

    from model.checkpoint import save_checkpoint

    torch.manual_seed(2)
    ours = GPT(GPTConfig(n_layer=1, n_head=2, n_embd=32, block_size=16, vocab_size=50257)).eval()
    save_checkpoint(tmp_path / "run" / "ckpt.pt", {"model": ours.state_dict(),
                                                   "model_config": dataclasses.asdict(ours.config),
                                                   "tokenizer": {"tokenizer": "gpt2", "chars": None}})
    result = run_export_cli("--checkpoint", tmp_path / "run", "--out", tmp_path / "hf")
    assert result.returncode == 0, result.stderr
    reloaded = GPT2LMHeadModel.from_pretrained(tmp_path / "hf").eval()
    assert reloaded.config.eos_token_id == 50256
    idx = random_tokens(T=16)
    with torch.no_grad():
        torch.testing.assert_close(reloaded(idx).logits, ours(idx), rtol=0, atol=1e-4)

    # a second export into the same directory is refused, and the first one is left as it was
    before = (tmp_path / "hf" / "model.safetensors").read_bytes()
    again = run_export_cli("--checkpoint", tmp_path / "run", "--out", tmp_path / "hf")
    assert again.returncode == 2
    assert again.stderr.startswith("error:") and len(again.stderr.strip().splitlines()) == 1
    assert "another --out" in again.stderr
    assert (tmp_path / "hf" / "model.safetensors").read_bytes() == before


def test_export_cli_with_a_missing_checkpoint_fails_in_one_line(tmp_path):
    result = run_export_cli("--checkpoint", tmp_path / "nope.pt", "--out", tmp_path / "hf")
    assert result.returncode == 2
    assert result.stderr.startswith("error:") and len(result.stderr.strip().splitlines()) == 1
    assert "Traceback" not in result.stderr
    assert not (tmp_path / "hf").exists()


def test_export_cli_with_a_checkpoint_whose_config_is_broken_fails_in_one_line(tmp_path):
    from model.checkpoint import save_checkpoint

    save_checkpoint(tmp_path / "ckpt.pt", {"model": {}, "model_config": {"n_embd": 30, "n_head": 4}})
    result = run_export_cli("--checkpoint", tmp_path / "ckpt.pt", "--out", tmp_path / "hf")
    assert result.returncode == 2
    assert result.stderr.startswith("error:") and len(result.stderr.strip().splitlines()) == 1
    assert "invalid model_config" in result.stderr and "Traceback" not in result.stderr
    assert not (tmp_path / "hf").exists()
