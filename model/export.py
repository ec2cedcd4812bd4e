"""Export one of our checkpoints as a directory the HF ecosystem uses as it is.

    python -m model.export --checkpoint out/small --out my-gpt2

The directory holds what transformers' GPT-2 needs: config.json and model.safetensors (model/hf.py),
GPT-2's tokenizer (vocab.json, merges.txt, tokenizer_config.json, special_tokens_map.json, taken from
tiktoken's copy of GPT-2's own BPE files) and generation_config.json with sample.py's defaults, so
AutoTokenizer, GPT2LMHeadModel and pipeline("text-generation") load it unchanged.

A checkpoint whose tokenizer was trained on its corpus (data.tokenizer: bpe:<n>) exports that BPE as
tokenizer.json (HF tokenizers' own format, which PreTrainedTokenizerFast loads) instead.

Refused with one line: a character-level checkpoint (no GPT-2 tokenizer reproduces its vocabulary),
any other tokenizer but gpt2, and a model GPT-2's format can't express (GPTConfig.gpt2_incompatibilities).
The directory is written under a temporary name beside --out and renamed into place at the end, so a
failure (a full disk, Ctrl-C) never leaves a partial export.
"""
from __future__ import annotations

import json
import os
import secrets
import shutil
from pathlib import Path

import tiktoken.load

from errors import ArgumentParser, UserError, run_cli, short_error
from fileio import atomic_write_bytes, fsync_dir

from .checkpoint import load_model
from .gpt import GPT
from .hf import write_hf_weights

# GPT-2's BPE files as tiktoken fetches and checks them (tiktoken_ext/openai_public.py): encoder.json
# is HF's vocab.json and vocab.bpe its merges.txt, byte for byte
GPT2_BPE = {
    "vocab.json": ("https://openaipublic.blob.core.windows.net/gpt-2/encodings/main/encoder.json",
                   "196139668be63f3b5d6574427317ae82f612a97c5d1cdaf36ed2256dbf636783"),
    "merges.txt": ("https://openaipublic.blob.core.windows.net/gpt-2/encodings/main/vocab.bpe",
                   "1ce1664773c50f3e0cc8842619a93edc4624525b728b188a9e0be33b7726adc5"),
}
GPT2_VOCAB = 50257
EOT, EOT_TEXT = 50256, "<|endoftext|>"
SAMPLING = {"do_sample": True, "temperature": 0.8, "top_k": 200, "max_new_tokens": 500}  # sample.py's defaults


def refusal(model: GPT, tokenizer: dict) -> str | None:
    """Why this model can't be an HF GPT-2 directory, or None."""
    if tokenizer.get("chars") is not None or tokenizer.get("tokenizer") == "char":
        return ("it is character-level: GPT-2's tokenizer can't reproduce its vocabulary, and transformers would "
                "load it with the wrong one; sample from it with sample.py")
    if isinstance(tokenizer.get("bpe"), str):  # a BPE trained on the corpus: its tokenizer.json goes along
        problems = model.config.gpt2_incompatibilities()
        return f"GPT-2's format can't express {', '.join(problems)}" if problems else None
    if tokenizer.get("tokenizer") != "gpt2":
        return f"its tokenizer is {tokenizer.get('tokenizer')!r}: GPT-2's format carries GPT-2's BPE only"
    if model.config.vocab_size < GPT2_VOCAB:
        return f"its vocab_size {model.config.vocab_size} is smaller than GPT-2's {GPT2_VOCAB}"
    problems = model.config.gpt2_incompatibilities()
    if problems:
        return f"GPT-2's format can't express {', '.join(problems)}"
    return None


def tokenizer_files(block_size: int) -> dict[str, bytes]:
    files = {}
    for name, (url, sha256) in GPT2_BPE.items():
        try:
            files[name] = tiktoken.load.read_file_cached(url, sha256)
        except Exception as e:  # offline without a cache, a damaged cache, ...
            raise UserError(f"could not read GPT-2's BPE file {url.rsplit('/', 1)[-1]} ({short_error(e)}); connect to "
                            "the network once, or set TIKTOKEN_CACHE_DIR to a folder holding tiktoken's GPT-2 files") from None
    special = {"bos_token": EOT_TEXT, "eos_token": EOT_TEXT, "unk_token": EOT_TEXT}
    # split_special_tokens: the text "<|endoftext|>" is plain text, as in our data and sample.py
    # (tiktoken's encode_ordinary); the end-of-text id is only ever added by code, never typed
    config = {"tokenizer_class": "GPT2Tokenizer", "model_max_length": block_size, **special, "add_prefix_space": False,
              "add_bos_token": False, "clean_up_tokenization_spaces": False, "split_special_tokens": True}
    files["tokenizer_config.json"] = _json(config)
    files["special_tokens_map.json"] = _json(special)
    return files


def bpe_tokenizer_files(bpe: str, block_size: int) -> tuple[dict[str, bytes], int, int]:
    """A BPE trained by data.prepare (`bpe:<n>`): HF tokenizers' own tokenizer.json, loaded by
    PreTrainedTokenizerFast as it is. -> (files, eot id, vocab size)."""
    spec = json.loads(bpe)
    eot = next(t["id"] for t in spec["added_tokens"] if t["content"] == EOT_TEXT)
    special = {"bos_token": EOT_TEXT, "eos_token": EOT_TEXT, "unk_token": EOT_TEXT}
    config = {"tokenizer_class": "PreTrainedTokenizerFast", "model_max_length": block_size, **special,
              "clean_up_tokenization_spaces": False, "split_special_tokens": True}
    files = {"tokenizer.json": bpe.encode(), "tokenizer_config.json": _json(config), "special_tokens_map.json": _json(special)}
    return files, eot, len(spec["model"]["vocab"]) + sum(t["id"] >= len(spec["model"]["vocab"]) for t in spec["added_tokens"])


def generation_config(model: GPT, eot: int = EOT, vocab: int = GPT2_VOCAB) -> bytes:
    """sample.py's defaults; ids past GPT-2's vocabulary (a vocab padded for GPU speed, e.g. 50304) are
    suppressed, as sample.py never samples them."""
    config = {"bos_token_id": eot, "eos_token_id": eot, "pad_token_id": eot, **SAMPLING}
    if model.config.vocab_size > vocab:
        config["suppress_tokens"] = list(range(vocab, model.config.vocab_size))
    return _json(config)


def _json(obj) -> bytes:
    return (json.dumps(obj, indent=2) + "\n").encode()


def export_hf(model: GPT, tokenizer: dict, out: str | os.PathLike) -> None:
    """Write the whole HF directory `out`, or nothing: see the module docstring."""
    out = Path(out)
    reason = refusal(model, tokenizer)
    if reason:
        raise UserError(f"cannot export to HF GPT-2: {reason}")
    if out.exists() and not out.is_dir():
        raise UserError(f"--out {out} is a file; give the path of a new directory")
    if out.is_dir() and any(out.iterdir()):
        held = "an exported model" if (out / "model.safetensors").exists() else "other files"
        raise UserError(f"{out} already holds {held}; choose another --out or delete it first")
    eot, vocab = EOT, GPT2_VOCAB
    if isinstance(tokenizer.get("bpe"), str):
        files, eot, vocab = bpe_tokenizer_files(tokenizer["bpe"], model.config.block_size)
    else:
        files = tokenizer_files(model.config.block_size)  # before writing anything: they may need the network
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        tmp = out.parent / f".{out.name}.{os.getpid()}.{secrets.token_hex(4)}.tmp"
        tmp.mkdir()
    except OSError as e:
        raise UserError(f"cannot create {out} ({short_error(e)}); choose an --out in a writable directory") from None
    try:
        write_hf_weights(model, tmp, eos_token_id=eot)
        for name, data in {**files, "generation_config.json": generation_config(model, eot, vocab)}.items():
            atomic_write_bytes(tmp / name, data)
        if out.exists():
            out.rmdir()  # empty (checked above)
        os.replace(tmp, out)
    except OSError as e:
        raise UserError(f"cannot write the export to {out} ({short_error(e)}); free some space or choose another --out; "
                        "nothing was left behind") from None
    finally:
        shutil.rmtree(tmp, ignore_errors=True)  # gone already after the rename
    fsync_dir(out.parent)


def main(argv: list[str] | None = None) -> int:
    p = ArgumentParser(prog="python -m model.export", description=__doc__.splitlines()[0])
    p.add_argument("--checkpoint", required=True, help="a ckpt.pt file or a training out_dir")
    p.add_argument("--out", required=True, help="the directory to create (it must not exist, or be empty)")
    args = p.parse_args(argv)
    loaded = load_model(args.checkpoint, dropout=0.0)
    export_hf(loaded.model, loaded.tokenizer, args.out)
    print(f"wrote {args.out}: config.json, model.safetensors, GPT-2's tokenizer files and generation_config.json")
    return 0


if __name__ == "__main__":
    run_cli(main)
