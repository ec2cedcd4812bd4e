"""HF transformers directories, read and written: the one place that opens their weight files
(model.safetensors, pytorch_model.bin) and config.json. What the tensors mean (names, transposes, the
Llama and Qwen3 layouts) is model/hf.py and model/hf_modern.py; this file moves the bytes.

    model = from_pretrained("gpt2")                       # a hub name, or a local HF directory
    fmt = write_hf_model(model, directory, 50257, 50256)  # config.json + model.safetensors (+ modeling code)
"""
from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file

from fileio import atomic_write, atomic_write_bytes, json_loads
from network import hub_offline_unless_reachable
from model.gpt import GPT
from model.hf import config_from_hf, cropped_state, gpt2_tensors, gpt_from_hf, hf_config

from .model_config import model_config_problem
from model.hf_modern import hf_format, llama_config, llama_tensors, qwen3_config, smallgpt_config

REMOTE_CODE = Path(__file__).with_name("remote_code") / "modeling_smallgpt.py"


def _resolve_dir(name_or_dir: str) -> Path:
    path = Path(name_or_dir)
    if path.is_dir():
        return path
    # not a local directory: a hub name such as "gpt2" or "gpt2-medium" (needs the network once)
    from huggingface_hub import snapshot_download

    hub_offline_unless_reachable()  # the hub not answering: the cache or a quick error, not 30 s of retries
    try:
        return Path(snapshot_download(name_or_dir, allow_patterns=["config.json", "*.safetensors"]))
    except Exception as e:  # offline, unknown repo, ...: the caller turns this into a clear message
        raise FileNotFoundError(
            f"{name_or_dir!r} is neither a local HF directory nor a reachable hub model ({type(e).__name__})"
        ) from e


def _read_state_dict(path: Path) -> dict[str, torch.Tensor]:
    if (path / "model.safetensors").is_file():
        return load_file(str(path / "model.safetensors"))
    if (path / "pytorch_model.bin").is_file():
        return torch.load(path / "pytorch_model.bin", map_location="cpu", weights_only=True)
    raise FileNotFoundError(f"{path} holds neither model.safetensors nor pytorch_model.bin")


def from_pretrained(name_or_dir: str, **overrides) -> GPT:
    """HF GPT-2 weights from a local HF directory or a hub name ('gpt2', 'gpt2-medium', ...)."""
    path = _resolve_dir(name_or_dir)
    if not (path / "config.json").is_file():
        raise FileNotFoundError(f"{path} has no config.json; expected an HF GPT-2 directory")
    config = config_from_hf(json_loads((path / "config.json").read_text()), **overrides)
    problem = model_config_problem(config, prefix="config.json's ")
    if problem:  # checked before anything is built: an absurd size would spin even on the meta device
        raise ValueError(problem)
    return gpt_from_hf(config, _read_state_dict(path))


def write_safetensors(tensors: dict[str, torch.Tensor], path: Path) -> None:
    """Atomically, with the umask's mode like our other outputs (safetensors' save_file alone makes 0600)."""
    with atomic_write(path) as tmp:
        mode = tmp.stat().st_mode  # fileio made it with 0o666 & ~umask
        try:
            save_file(tensors, str(tmp), metadata={"format": "pt"})
        except SafetensorError as e:  # how safetensors reports a full disk: an OSError to the callers
            raise OSError(f"{type(e).__name__}: {e}") from None
        tmp.chmod(mode & 0o777)


def write_json(path: Path, obj: dict) -> None:
    atomic_write_bytes(path, (json.dumps(obj, indent=2) + "\n").encode())


def write_hf_weights(model: GPT, out_dir, eos_token_id: int | None = None, vocab_size: int | None = None) -> None:
    """GPT-2's config.json and model.safetensors in `out_dir` (which must exist), each written atomically;
    vocab_size crops a padded vocabulary (model.hf.cropped_state)."""
    out = Path(out_dir)
    if eos_token_id is None and model.config.vocab_size > 50256:
        eos_token_id = 50256  # GPT-2's <|endoftext|>
    write_safetensors(gpt2_tensors(model, vocab_size), out / "model.safetensors")
    write_json(out / "config.json", hf_config(model, eos_token_id, vocab_size))


def write_hf_model(model: GPT, out_dir: Path, vocab_size: int, eos_token_id: int | None) -> str:
    """config.json and model.safetensors (and the modeling code for smallgpt) in `out_dir`, in the format
    hf_format picks, the vocabulary cut to `vocab_size`. Returns the format."""
    cfg, out = model.config, Path(out_dir)
    fmt = hf_format(cfg)
    if fmt == "gpt2":
        write_hf_weights(model, out, eos_token_id, vocab_size)
    elif fmt in ("llama", "qwen3"):
        write_safetensors(llama_tensors(model, vocab_size), out / "model.safetensors")
        config = (llama_config if fmt == "llama" else qwen3_config)(cfg, vocab_size, eos_token_id)
        write_json(out / "config.json", config)
    else:
        write_safetensors(cropped_state(model, vocab_size), out / "model.safetensors")
        write_json(out / "config.json", smallgpt_config(cfg, vocab_size, eos_token_id))
        atomic_write_bytes(out / REMOTE_CODE.name, REMOTE_CODE.read_bytes())  # the code, as it is
    return fmt
