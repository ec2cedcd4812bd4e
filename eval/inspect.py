"""See inside a model on one text: the attention weights of every layer and head, and how surprised the
model is by each token, with its top-5 guesses.

    python -m eval.inspect --checkpoint out/shakespeare_char --text $'ROMEO:\nBut soft' --out inspect/  # $'' makes \n a newline
    python -m eval.inspect --checkpoint gpt2 --text-file snippet.txt --out inspect/ --layer 5 --head 1

writes into --out (created if needed; its own files there from an earlier run are replaced, a file of the user's
at one of these names is refused before anything is written: ownership.check_replaceable):
- attention.png: every layer (rows) and head (columns) as a heatmap, query tokens down, key tokens across;
- surprisal.png and surprisal.html: the text, each token coloured by its surprisal -log2 p(token | the
  text before it), in bits, with the model's top-5 guesses for it (the HTML shows them on hover and needs
  nothing but itself: inline CSS, no script, no external asset);
- with --layer and --head, attention_L<l>_H<h>.png: that one map, large, every token labelled (--layer
  alone: attention_L<l>.png, that layer's heads; --head alone: attention_H<h>.png, that head in every layer).
The checkpoint is anything sample.py loads (checkpoint.load_for_inference: a ckpt.pt, an out_dir, a sharded
.dcp, an HF GPT-2 directory).
A text longer than block_size keeps its last block_size tokens, and a note says so.

For the training loop (no file written, no random number drawn, the model's train/eval mode restored):
    insp = inspect_tokens(model, tok, ids, description=f"iter {it}")   # one forward pass, no grad
    wandb.log({"inspect/attention": wandb.Image(attention_figure(insp)),
               "inspect/surprisal": wandb.Html(surprisal_html(insp))})
with `model` the raw GPT (not torch.compile's or DDP's wrapper: recording changes the traced forward).
"""
from __future__ import annotations

import errors

if __name__ == "__main__":  # a command: Ctrl-C while the imports below run is one line (errors.quiet_interrupts)
    errors.quiet_interrupts()

import argparse
import math
import os
import stat
from pathlib import Path
from typing import Sequence

import torch
import torch.nn.functional as F

from errors import ArgumentParser, UserError, run_cli, short_error, to_stderr, write_fix
from fileio import (atomic_write_bytes, check_output_not_input, check_writable_dir, no_empty_dirs_left, output_target,
                    path_arg, path_kind, read_user_file)
from ownership import check_output, check_replaceable, record_written
from model.gpt import CausalSelfAttention
from checkpoint import checkpoint_files, default_checkpoint, load_for_inference

from .figures import Inspection, attention_figure, figure_png, surprisal_figure, surprisal_html

TOP_K = 5
MAX_TEXT_BYTES = 16 * 2**20  # far past any block_size of text


def attention_layers(model: torch.nn.Module) -> list[CausalSelfAttention]:
    return [m for m in model.modules() if isinstance(m, CausalSelfAttention)]


@torch.no_grad()
def inspect_tokens(model: torch.nn.Module, tok, ids: Sequence[int], *, top_k: int = TOP_K,
                   description: str = "") -> Inspection:
    """One forward pass of `model` (our GPT) over `ids` (1 to block_size token ids), recording every
    layer's attention probabilities: softmax(q k^T / sqrt(head_dim) + causal mask) of the q and k the
    layer uses (after rotary embeddings and QK-norm; model/gpt.py's record_attention). In eval mode, so no
    dropout and no random draw; its train/eval mode is restored after, and no file is touched. Runs in
    the model's own dtype and device, outside any autocast; what is returned is on the CPU."""
    layers = attention_layers(model)
    if not layers:
        raise UserError(f"{description or 'this model'} has no attention layers (model.gpt.CausalSelfAttention) "
                        "whose weights could be shown; pass a GPT from this project")
    weight = next(model.parameters())
    idx = torch.as_tensor(list(ids), dtype=torch.long, device=weight.device).view(1, -1)
    block_size = getattr(getattr(model, "config", None), "block_size", idx.size(1))
    if not 1 <= idx.size(1) <= block_size:
        raise ValueError(f"inspect_tokens takes 1 to block_size ({block_size}) tokens, got {idx.size(1)}")
    was_training = model.training
    model.eval()
    try:
        for layer in layers:
            layer.record_attention = True
        with torch.autocast(weight.device.type, enabled=False):
            logits = model(idx)
        attention = torch.stack([layer.attention[0] for layer in layers]).float().cpu()  # (L, H, T, T)
    finally:
        for layer in layers:
            layer.record_attention, layer.attention = False, None
        model.train(was_training)
    logp = F.log_softmax(logits[0].float(), dim=-1).cpu()  # (T, V)
    nats = -logp[:-1].gather(1, idx[0, 1:].cpu().unsqueeze(1)).squeeze(1)
    bits = [math.nan] + (nats / math.log(2)).tolist()
    # guesses among the tokenizer's ids only: a vocabulary padded for speed has ids no text contains
    usable = logp[:, : tok.vocab_size]
    top_p, top_ids = usable.exp().topk(min(top_k, usable.size(1)), dim=-1)
    guesses = [[(i, tok.decode([i]), p) for i, p in zip(row_ids, row_p)]
               for row_ids, row_p in zip(top_ids.tolist(), top_p.tolist())]
    labels = [tok.decode([i]) for i in idx[0].tolist()]
    return Inspection(idx[0].tolist(), labels, attention, bits, guesses, tok.vocab_size, description)


def text_ids(tok, text: str, block_size: int, note, where: str = "the text") -> list[int]:
    """The token ids of `text` to inspect: at least 2 (one to predict from, one to predict), at most the
    last block_size, with a note saying what was kept. `where`: the text's source in a refusal (a --text-file
    names its path: an empty file, or a FIFO nobody writes, read as empty)."""
    ids = tok.encode(text)  # the char tokenizer raises UserError for characters it lacks
    if not ids:
        raise UserError(f"{where} is empty: there is nothing to inspect; pass --text TEXT or a non-empty --text-file")
    if len(ids) < 2:
        raise UserError(f"{where} is a single token: the model predicts nothing from it; pass at least 2 tokens")
    if len(ids) > block_size:
        kept = tok.decode(ids[-block_size:])
        note(f"the text is {len(ids)} tokens, longer than block_size ({block_size}): only its last {block_size} "
             f"are inspected, from {kept[:30]!r}{'...' if len(kept) > 30 else ''}")
        ids = ids[-block_size:]
    return ids


# ---------------------------------------------------------------------------------- the command line

def build_parser() -> argparse.ArgumentParser:
    p = ArgumentParser(prog="python -m eval.inspect",
                       description="Draw a model's attention weights (every layer and head) and each token's "
                                   "surprisal with its top-5 guesses, for one text, as PNG and HTML files.")
    p.add_argument("--checkpoint", default=None, metavar="PATH", type=path_arg,
                   help="ckpt file, training out_dir, sharded .dcp or HF GPT-2 directory (default: the run under out/ "
                        "trained last)")
    text = p.add_mutually_exclusive_group(required=True)
    text.add_argument("--text", default=None, help="the text to inspect")
    text.add_argument("--text-file", default=None, metavar="FILE", type=path_arg, help="read the text from this file (UTF-8)")
    p.add_argument("--out", required=True, metavar="DIR", type=path_arg, help="the folder to write the pictures into (created if needed)")
    p.add_argument("--layer", type=int, default=None, metavar="N",
                   help="also draw layer N's maps alone, large; with --head, that one map (0 = first)")
    p.add_argument("--head", type=int, default=None, metavar="N",
                   help="also draw head N's maps alone, large; with --layer, that one map (0 = first)")
    return p


def read_text(args: argparse.Namespace) -> tuple[str, str]:
    """(the text, where it came from: --text or --text-file PATH, for a refusal of it)."""
    if args.text is not None:
        data, where = os.fsencode(args.text), "--text"  # argv's undecodable bytes come back as they were typed
    else:
        data = read_user_file(args.text_file, "--text-file", fix="check the path", limit=MAX_TEXT_BYTES)
        where = f"--text-file {args.text_file}"
    try:
        return data.decode("utf-8"), where
    except UnicodeDecodeError as e:
        raise UserError(f"{where} is not valid UTF-8: byte 0x{data[e.start]:02x} at byte offset {e.start}; "
                        "re-encode it as UTF-8 (e.g. iconv -t UTF-8)") from None


def check_index(value: int | None, option: str, count: int | None, what: str) -> None:
    """--layer / --head: >= 0 always (checked before loading); < count once the model is known."""
    if value is None:
        return
    if value < 0 or (count is not None and value >= count):
        known = f"the model has {count} {what}s, 0 to {count - 1}" if count is not None else f"{what}s count from 0"
        raise UserError(f"{option} {value} is out of range: {known}; pass one of those")


def output_names(layer: int | None, head: int | None) -> list[str]:
    names = ["attention.png", "surprisal.png", "surprisal.html"]
    if layer is not None or head is not None:
        names.append("attention" + (f"_L{layer}" if layer is not None else "") + (f"_H{head}" if head is not None else "")
                     + ".png")
    return names


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    check_index(args.layer, "--layer", None, "layer")
    check_index(args.head, "--head", None, "head")
    names = output_names(args.layer, args.head)
    spec = args.checkpoint if args.checkpoint is not None else default_checkpoint()
    # the gate: --out is no folder another command manages (a training out_dir, an HF export, prepared data,
    # the ckpt.dcp it reads), lies in none, and is not what it reads
    out = check_output(args.out, "--out", reading=(spec,) if os.path.isdir(spec) else ())
    # the pictures replace files of their names in --out: never a file this reads
    inputs = [(f"the checkpoint file {p}", p) for p in checkpoint_files(spec)]
    inputs += [(f"the --text-file {args.text_file}", Path(args.text_file).expanduser())] if args.text_file else []
    for name in names:
        check_output_not_input(out / name, inputs, "--out")
        check_target(out, name)
    check_replaceable(out, names, "--out")  # a user's attention.png there is refused; its own pictures replaced
    text, where = read_text(args)
    with no_empty_dirs_left(out):  # a refusal after it (a bad checkpoint, a layer past the model's) leaves no --out
        check_writable_dir(out, "--out")  # before the model is loaded and run: a bad --out costs nothing
        draw(spec, text, out, names, args.layer, args.head, where)  # each picture recorded as it is written
        return 0


def check_target(out: Path, name: str) -> None:
    """The picture `name` can be written in --out, checked before the model runs and before any picture is
    written (found from outside: a surprisal.html that was a folder was refused after attention.png and
    surprisal.png had replaced the earlier ones, naming --out as if it were that file)."""
    if not os.path.isdir(out):  # new, or no folder (a file, a link loop: not a picture's fault): check_writable_dir
        return
    target = out / name
    try:
        kind = os.stat(target).st_mode  # through a link: what a write would reach
    except FileNotFoundError:  # a new name; or a link to nowhere, whose target is created if its folder is there
        if os.path.islink(target) and not Path(os.path.realpath(target)).parent.is_dir():
            raise UserError(f"--out {out}: {name} there is a link into a folder that does not exist; move it away "
                            "or choose another --out") from None
        return
    except OSError as e:  # a symlink loop, a name too long, ...
        raise UserError(f"--out {out}: {name} there cannot be written ({short_error(e)}); move it away or choose "
                        "another --out") from None
    if stat.S_ISFIFO(kind):
        output_target(target, f"--out {out}: {name}")  # one a process reads is written into; else one line
    elif not (stat.S_ISREG(kind) or stat.S_ISCHR(kind)):
        raise UserError(f"--out {out}: {name} there is {path_kind(target)}, which this does not write over; move it "
                        "away or choose another --out")


def draw(spec: str, text: str, out: Path, names: list[str], layer: int | None, head: int | None,
         where: str = "the text") -> int:
    """Load the model, run it on `text` (from `where`), and write the pictures into `out` (checked)."""
    def note(msg: str) -> None:
        to_stderr(f"eval.inspect: {msg}")

    loaded = load_for_inference(spec)
    model, tok, desc = loaded.model, loaded.tok, loaded.description
    check_index(layer, "--layer", model.config.n_layer, "layer")
    check_index(head, "--head", model.config.n_head, "head")
    ids = text_ids(tok, text, model.config.block_size, note, where)
    insp = inspect_tokens(model, tok, ids, description=desc)
    pictures = {names[0]: figure_png(attention_figure(insp)), names[1]: figure_png(surprisal_figure(insp)),
                names[2]: surprisal_html(insp, f"Surprisal: {desc}").encode("utf-8")}
    if len(names) == 4:
        pictures[names[3]] = figure_png(attention_figure(insp, layer, head))
    for name, data in pictures.items():
        try:
            atomic_write_bytes(out / name, data, what="--out", follow=True)
        except OSError as e:
            raise UserError(f"cannot write {out / name} ({short_error(e)}); {write_fix(e, 'choose another --out')}") from None
        # recorded now, not once all are written: a write that fails at the third (a full disk) leaves the first two
        # replaced and recorded, so the rerun replaces them again rather than refusing them as the user's
        record_written(out, (name,), "--out")
        print(out / name)
    note(f"{desc}: {len(ids)} tokens, {insp.mean_bits():.3f} bits/token")
    return 0


if __name__ == "__main__":
    errors.start_up_done()  # the imports are done: Ctrl-C is a KeyboardInterrupt again (run_cli says it)
    run_cli(main)
