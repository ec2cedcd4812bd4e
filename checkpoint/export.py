"""Export one of our checkpoints as a directory the HF ecosystem uses as it is.

    python -m checkpoint.export --checkpoint out/small --out my-gpt2

The directory holds config.json and model.safetensors in the HF format that expresses the model exactly
(model/hf_modern.py: GPT-2, Llama, Qwen3, or our own modeling code for trust_remote_code=True), GPT-2's
tokenizer (vocab.json, merges.txt, tokenizer_config.json, special_tokens_map.json, taken from tiktoken's
copy of GPT-2's own BPE files), generation_config.json with sample.py's sampling defaults and a length
within the context, and a model card (README.md) with the config, the data, the val loss and bits/byte
and how it was trained, so AutoTokenizer, AutoModelForCausalLM, pipeline("text-generation") and
lm-eval's `--model hf` load it unchanged.

A vocabulary padded for GPU speed (50304) is cut to the tokenizer's 50257 rows. A chat model's checkpoint (its
`chat_template` entry) adds the chat template and its four markers (the rows above the tokenizer's, kept):
see hf_chat.py. A checkpoint whose
tokenizer was trained on its corpus (data.tokenizer: bpe:<n>) exports that BPE as tokenizer.json (HF
tokenizers' own format, which PreTrainedTokenizerFast loads) instead of GPT-2's files. Refused with one
line: a character-level checkpoint (no HF tokenizer reproduces its vocabulary) and any other tokenizer.
The directory is written under a temporary name beside --out and renamed into place at the end, so a
failure (a full disk, Ctrl-C) never leaves a partial export.
"""
from __future__ import annotations

import errors

if __name__ == "__main__":  # a command: Ctrl-C while the imports below run is one line (errors.quiet_interrupts)
    errors.quiet_interrupts()

import json
import os
import shutil
from pathlib import Path

import tiktoken.load

from errors import ArgumentParser, UserError, clipped, run_cli, short_error, write_fix
from fileio import atomic_write_bytes, fsync_dir, json_loads, no_empty_dirs_left, path_arg, path_kind, temp_dir
from locks import remove_stale_temps
from ownership import EXPORT, check_output, check_target

from model.gpt import GPT
from runtime.sampling import Sampling

from .format import resolve_checkpoint_path
from .hf import write_hf_model
from .hf_chat import BPE_CLASS, chat_generation_config, template_of, with_chat
from .load import load_model
from .model_card import model_card, tokenizer_words

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
SAMPLING = {"do_sample": True, "temperature": Sampling.temperature, "top_k": Sampling.top_k}


def refusal(model: GPT, tokenizer: dict) -> str | None:
    """Why this model can't be an HF GPT-2 directory, or None."""
    if tokenizer.get("chars") is not None or tokenizer.get("tokenizer") == "char":
        return ("it is character-level: GPT-2's tokenizer can't reproduce its vocabulary, and transformers would "
                "load it with the wrong one; sample from it with sample.py")
    if isinstance(tokenizer.get("bpe"), str):  # a BPE trained on the corpus: its tokenizer.json goes along
        return None
    if tokenizer.get("tokenizer") != "gpt2":
        return f"its tokenizer is {clipped(tokenizer.get('tokenizer'))}: GPT-2's format carries GPT-2's BPE only"
    if model.config.vocab_size < GPT2_VOCAB:
        return f"its vocab_size {model.config.vocab_size} is smaller than GPT-2's {GPT2_VOCAB}"
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
    spec = json_loads(bpe)
    eot = next(t["id"] for t in spec["added_tokens"] if t["content"] == EOT_TEXT)
    special = {"bos_token": EOT_TEXT, "eos_token": EOT_TEXT, "unk_token": EOT_TEXT}
    config = {"tokenizer_class": BPE_CLASS, "model_max_length": block_size, **special,
              "clean_up_tokenization_spaces": False, "split_special_tokens": True}
    files = {"tokenizer.json": bpe.encode(), "tokenizer_config.json": _json(config), "special_tokens_map.json": _json(special)}
    return files, eot, len(spec["model"]["vocab"]) + sum(t["id"] >= len(spec["model"]["vocab"]) for t in spec["added_tokens"])


def generation_config(model: GPT, eot: int = EOT) -> bytes:
    """The sampling defaults (runtime/sampling.py), and at most block_size tokens in all (the prompt
    included): transformers does not crop the context to its last block_size tokens as our generation
    does, and a longer sequence runs past GPT-2's position table (IndexError) or past the positions a
    rotary model was trained on. max_length rather
    than max_new_tokens, which would override it; pipeline() adds its own max_new_tokens only when
    max_length is set."""
    config = {"bos_token_id": eot, "eos_token_id": eot, "pad_token_id": eot, **SAMPLING,
              "max_length": model.config.block_size}
    return _json(config)


def _json(obj) -> bytes:
    return (json.dumps(obj, indent=2) + "\n").encode()


def export_hf(model: GPT, tokenizer: dict, out: str | os.PathLike, checkpoint: dict | None = None,
              source: str | os.PathLike | None = None, named: str | os.PathLike | None = None) -> str:
    """Write the whole HF directory `out`, or nothing: see the module docstring. `checkpoint` (the
    loaded dict) and `source` (its file) feed the model card; `named`: what the user named to read (an
    out_dir), which the export must not lie in either. Returns the HF format written."""
    out = Path(out)
    reason = refusal(model, tokenizer)
    if reason:
        raise UserError(f"cannot export to HF: {reason}")
    if os.path.lexists(out) and not out.is_dir():  # a file, a FIFO, a device, a socket, a dangling or looping link
        raise UserError(f"--out {out} is {path_kind(out)}; give the path of a new directory")
    # no other command's folder, and never in what it reads: the checkpoint, or the folder named for it (`named`)
    check_target(out, EXPORT, "--out", reading=tuple(r for r in (source, named) if r is not None))
    if out.is_dir() and any(out.iterdir()):
        held = "an exported model" if (out / "model.safetensors").exists() else "other files"
        names = sorted(p.name for p in out.iterdir())  # what is there, named: a user's config.json is no export
        shown = ", ".join(clipped(n) for n in names[:3]) + (f" and {len(names) - 3} more" if len(names) > 3 else "")
        raise UserError(f"{out} already holds {held} ({shown}); choose another --out or delete it first")
    eot, vocab = EOT, GPT2_VOCAB
    if isinstance(tokenizer.get("bpe"), str):
        files, eot, vocab = bpe_tokenizer_files(tokenizer["bpe"], model.config.block_size)
    else:
        files = tokenizer_files(model.config.block_size)  # before writing anything: they may need the network
    generation = generation_config(model, eot)
    chat = template_of(checkpoint, vocab)
    if chat is not None:  # a chat model: its markers' rows are kept, and the tokenizer knows them
        if model.config.vocab_size < chat.vocab_size:
            raise UserError(f"cannot export to HF: the chat template needs {chat.vocab_size} rows of vocabulary and the "
                            f"model has {model.config.vocab_size}; the checkpoint is damaged: use another one")
        files, vocab = with_chat(files, chat, eot), chat.vocab_size
        generation = chat_generation_config(generation, chat)
    with no_empty_dirs_left(out.parent):  # a write that fails leaves none of the folders made for it
        try:
            out.parent.mkdir(parents=True, exist_ok=True)
            remove_stale_temps(out.parent, name=out.name)  # what an export killed mid-write left beside --out
            tmp = temp_dir(out)
        except OSError as e:
            raise UserError(f"cannot create {out} ({short_error(e)}); choose an --out in a writable directory"
                            ) from None
        try:
            fmt = write_hf_model(model, tmp, vocab, eot)
            card = model_card(model, fmt, tokenizer, checkpoint, source, out.name, vocab, files).encode()
            for name, data in {**files, "generation_config.json": generation, "README.md": card}.items():
                atomic_write_bytes(tmp / name, data)
            if out.exists():
                out.rmdir()  # empty (checked above)
            os.replace(tmp, out)
        except OSError as e:
            raise UserError(f"cannot write the export to {out} ({short_error(e)}); "
                            f"{write_fix(e, 'choose another --out')}; nothing was left behind") from None
        finally:
            shutil.rmtree(tmp, ignore_errors=True)  # gone already after the rename
    fsync_dir(out.parent)
    return fmt


def build_parser() -> ArgumentParser:
    p = ArgumentParser(prog="python -m checkpoint.export", description=__doc__.splitlines()[0])
    p.add_argument("--checkpoint", required=True, type=path_arg, help="a ckpt.pt file or a training out_dir")
    p.add_argument("--out", required=True, type=path_arg, help="the directory to create (it must not exist, or be empty)")
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    check_output(args.out, "--out", kind=EXPORT, reading=(args.checkpoint,))  # the gate, before loading anything
    loaded = load_model(args.checkpoint, dropout=0.0)
    source = resolve_checkpoint_path(args.checkpoint) if loaded.checkpoint is not None else args.checkpoint
    fmt = export_hf(loaded.model, loaded.tokenizer, args.out, loaded.checkpoint, source, named=args.checkpoint)
    how = ("AutoModelForCausalLM.from_pretrained(dir, trust_remote_code=True): no transformers architecture "
           "expresses this model, so its modeling code is in the directory" if fmt == "smallgpt"
           else "AutoModelForCausalLM.from_pretrained(dir)")
    written = sorted(os.listdir(args.out))  # what is there, not what an export usually holds
    print(f"wrote {args.out} as HF {fmt} ({', '.join(written)}); tokenizer: {tokenizer_words(loaded.tokenizer, written)}; "
          f"load it with {how}")
    return 0


if __name__ == "__main__":
    errors.start_up_done()  # the imports are done: Ctrl-C is a KeyboardInterrupt again (run_cli says it)
    run_cli(main)
