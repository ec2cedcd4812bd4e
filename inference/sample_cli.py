"""`python sample.py`: its options and their checks, the checks of --out, and main (load the checkpoint, then
generate, print or write the samples). What the command does, for its user, is sample.py's docstring (the
usage, the prompts, the seeds); the prompts are read and encoded in inference/prompts.py."""
from __future__ import annotations

import argparse
import os
import signal
import sys
import threading
from pathlib import Path

import torch

from checkpoint import checkpoint_dirs, checkpoint_files, default_checkpoint, load_for_inference
from errors import ArgumentParser, UserError, point_at_devnull, reader_left, short_error, to_stderr, write_fix
from fileio import atomic_write_bytes, check_output_not_input, check_path_value, output_target, file_arg, path_arg
from inference.prompts import encode_prompt, read_prompts, reads_stdin
from model.generate import generate, generate_stream
from ownership import check_output
from runtime.device import resolve_device
from runtime.decoding import check_logits_finite, decode_compile, setup_decoding
from runtime.memory import check_fits, sampling_bytes
from runtime.precision import DTYPE_NAMES, dtype_name
from runtime.sampling import Sampling, check_repetition_penalty, check_temperature, check_top_k, check_top_p
from runtime.text import StreamPrinter

MAX_NEW_TOKENS = 1_000_000  # hours of text at any speed; a typo of a few zeros more is refused
MAX_ROWS = 65_536  # samples in all (--num-samples times the prompts), one batch: far past any memory's batch


def build_parser() -> argparse.ArgumentParser:
    p = ArgumentParser(prog="python sample.py", description="Generate text from a checkpoint with the KV cache.")
    given = p.add_argument_group("input")
    # no `choices`: argparse would report `--bogus 3` as an invalid choice of this argument (validate_args says it)
    given.add_argument("stdin", nargs="?", metavar="-", help="read the prompt from stdin")
    given.add_argument("--checkpoint", default=None, type=path_arg,
                       help="ckpt file or training out_dir; or an HF GPT-2 directory or hub name "
                            "(default: the run under out/ trained last, e.g. out/small)")
    given.add_argument("--prompt", action="append", default=None, help="the prompt ('-' = stdin); repeat for several")
    given.add_argument("--prompt-file", action="append", default=None, type=path_arg, help="read the prompt from a file ('-' = stdin)")
    decoding = p.add_argument_group("decoding")
    decoding.add_argument("--num-samples", type=int, default=1, help="samples per prompt (default: %(default)s)")
    decoding.add_argument("--max-new-tokens", type=int, default=500, help="tokens generated per sample (default: %(default)s)")
    decoding.add_argument("--temperature", type=float, default=Sampling.temperature, help="0 means greedy (default: %(default)s)")
    decoding.add_argument("--top-k", type=int, default=Sampling.top_k, help="keep the K most likely tokens (default: %(default)s)")
    decoding.add_argument("--top-p", type=float, default=1.0, help="nucleus sampling; 1 turns it off (default: %(default)s)")
    decoding.add_argument("--min-p", type=float, default=0.0,
                          help="keep the tokens at least MIN_P times as likely as the top one; 0 turns it off "
                               "(default: %(default)s)")
    decoding.add_argument("--repetition-penalty", type=float, default=1.0,
                          help="divide the (positive) logits of tokens already in the text by this; 1 turns it "
                               "off, 1.1-1.3 is typical (default: %(default)s)")
    decoding.add_argument("--seed", type=int, default=None, help="random seed (default: a fresh one, shown on stderr)")
    decoding.add_argument("--stop-at-eot", action=argparse.BooleanOptionalAction, default=True,
                          help="end a sample at the end-of-text token (default: on)")
    output = p.add_argument_group("output")
    output.add_argument("--stream", action=argparse.BooleanOptionalAction, default=True,
                        help="print a single sample token by token as it is generated (default: on; "
                             "--no-stream prints it whole at the end)")
    output.add_argument("--out", default=None, metavar="FILE", type=file_arg,
                        help="write the samples to FILE (written whole, atomically) instead of stdout")
    device = p.add_argument_group("device")
    device.add_argument("--device", default="auto", help="auto (cuda > mps > cpu; the default), cpu, cuda, cuda:N, mps")
    device.add_argument("--dtype", default="auto", choices=DTYPE_NAMES,
                        help="auto: on GPUs bf16 where native, else fp16; on a CPU with native bf16 the faster of "
                             "float32 and bfloat16 for this model, timed on a few decoding steps; float32 on "
                             "other CPUs (default: auto)")
    device.add_argument("--compile", action=argparse.BooleanOptionalAction, default=None,
                        help="torch.compile the one-token decode step (CUDA graphs on a GPU); default: on a GPU when "
                             "the run is long enough to win back the compile, with a notice; never on a CPU")
    return p


def validate_args(args: argparse.Namespace) -> None:
    if args.stdin not in (None, "-"):
        raise UserError(f"unexpected argument {args.stdin!r}; the only positional argument is '-' (the prompt from "
                        "stdin): see `python sample.py --help`")
    prompts = max(1, len(args.prompt or []) + len(args.prompt_file or []) + bool(args.stdin))
    if not 1 <= args.num_samples <= MAX_ROWS // prompts:  # bounded before any list of rows is built
        raise UserError(f"--num-samples must be >= 1 and at most {MAX_ROWS // prompts} ({MAX_ROWS} samples in all, "
                        f"over {prompts} prompt{'s' * (prompts > 1)}), got {args.num_samples}; run several times for more")
    if not 1 <= args.max_new_tokens <= MAX_NEW_TOKENS:
        raise UserError(f"--max-new-tokens must be in [1, {MAX_NEW_TOKENS}], got {args.max_new_tokens}; an "
                        "interrupted run (Ctrl-C) keeps the text generated so far")
    check_temperature(args.temperature)
    check_top_k(args.top_k)
    check_top_p(args.top_p)
    if not 0.0 <= args.min_p < 1.0:  # also rejects nan
        raise UserError(f"--min-p must be in [0, 1), got {args.min_p}; e.g. 0.05, or 0 to turn it off")
    check_repetition_penalty(args.repetition_penalty)
    if args.out is not None:
        check_out_file(args.out)
    elif sys.stdout is None:  # started with stdout closed (`>&-`): the samples would go nowhere
        raise UserError("stdout is closed, so the samples have nowhere to go; pass --out FILE, or run with stdout open")
    if args.seed is not None and not 0 <= args.seed < 2**63:
        raise UserError(f"--seed must be an integer in [0, 2**63), got {args.seed}")
    sources = (args.prompt or []) + (args.prompt_file or [])
    if args.stdin and sources:
        raise UserError("the prompt comes either from stdin ('-') or from --prompt/--prompt-file; pass only one")
    if sum(s == "-" for s in sources) > 1:
        raise UserError("stdin ('-') can be read only once; give the other prompts with --prompt or --prompt-file")


def check_out_file(name: str) -> None:
    """--out must name a file in an existing folder, or something written straight into (a device, a FIFO
    being read: fileio.output_target): checked before anything is loaded or generated."""
    path = check_path_value(name, "--out")
    if path.is_dir():
        raise UserError(f"--out {name} is a directory; name a file, e.g. {file_in(path)}")
    path, straight = output_target(path, "--out")
    if straight:
        return
    if not path.parent.is_dir():
        raise UserError(f"--out {name}: the folder {path.parent} does not exist; create it or choose another --out")
    if not os.access(path.parent, os.W_OK):
        raise UserError(f"--out {name}: the folder {path.parent} is not writable; choose another --out")


def file_in(folder: Path) -> Path:
    """A file to suggest for an --out that names a folder: in it, unless the gate refuses that (a folder another
    command manages, e.g. the run's own out_dir): then in the current folder."""
    try:
        return check_output(folder / "samples.txt", "--out")
    except UserError:
        return Path("samples.txt")


def check_out_is_no_input(name: str, spec: str, args: argparse.Namespace) -> None:
    """--out is written atomically, replacing whatever file it names: never one that sample.py reads
    (the checkpoint, a prompt file, the file behind a redirected stdin), which would be lost. Compared
    as files (os.path.samestat), so another spelling, a symlink or a hard link is caught too; an --out
    that does not exist yet is no input."""
    inputs = [(f"the checkpoint file {path}", path) for path in checkpoint_files(spec)]
    inputs += [(f"the checkpoint {path}", path) for path in checkpoint_dirs(spec)]
    inputs += [(f"the prompt file {f}", Path(f).expanduser()) for f in args.prompt_file or [] if f != "-"]
    check_output_not_input(Path(name).expanduser(), inputs, "--out")
    try:
        out = Path(name).expanduser().stat()
    except OSError:
        return
    if reads_stdin(args) and _same_as_stdin(out):
        raise UserError(f"--out {name} is the file on stdin, the prompt sample.py reads; writing the samples there "
                        "would replace it: choose another --out")


def check_out_place(name: str) -> None:
    """The gate (ownership.check_output): --out lies in no folder another command manages (a training
    out_dir, an HF export, prepared data, a sharded checkpoint). After check_out_is_no_input, whose line
    names the checkpoint read when --out is inside it."""
    check_output(name, "--out")


def _same_as_stdin(out: os.stat_result) -> bool:
    try:
        return sys.stdin is not None and os.path.samestat(out, os.fstat(sys.stdin.fileno()))
    except (OSError, ValueError):  # no descriptor behind stdin (closed, or a test's replacement): no file to keep
        return False


# ---------------------------------------------------------------------------------- main

def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    validate_args(args)
    prompt_texts = read_prompts(args)

    def note(msg: str) -> None:  # never on stdout among the samples, never failing them (errors.to_stderr)
        to_stderr(f"sample.py: {msg}")

    spec = args.checkpoint if args.checkpoint is not None else default_checkpoint()
    if args.out is not None:  # before anything is loaded or generated
        check_out_is_no_input(args.out, spec, args)
        check_out_place(args.out)
    device = resolve_device(args.device, option="--device")
    loaded = load_for_inference(spec)
    model, tok, desc = loaded.model, loaded.tok, loaded.description
    n_params = model.num_params(non_embedding=False)

    prompts = [encode_prompt(tok, t, note) for t in (prompt_texts or [None])]
    block_size = model.config.block_size
    if any(len(ids) > block_size for _, ids in prompts):
        note(f"a prompt is longer than block_size ({block_size} tokens): only its last {block_size} tokens are context")
    rows = [p for p in prompts for _ in range(args.num_samples)]

    check_fits(sampling_bytes(model.config, rows=len(rows), prompt_len=max(len(ids) for _, ids in rows)), device,
               "sampling", "--num-samples (or the number of prompts)")
    seed = args.seed if args.seed is not None else int.from_bytes(os.urandom(4), "little")
    compiled, compile_note = decode_compile(args.compile, device, steps=args.max_new_tokens, n_layer=model.config.n_layer)
    if compile_note:
        note(compile_note)
    ready = setup_decoding(model, device, args.dtype, compile=compiled, say=note)
    model, decode_fn, dtype, packed = ready.model, ready.decode_fn, ready.dtype, ready.prepacked
    check_logits_finite(model, device, desc, dtype)
    generator = torch.Generator(device=device).manual_seed(seed)
    if args.dtype == "auto" and device.type == "cpu":
        note(ready.note)
    note(f"{desc}, {n_params / 1e6:.2f}M params, {tok.name} tokenizer; {device}, {dtype_name(dtype)}"
         f"{', compiled' if compiled else ''}{', prepacked' if packed else ''}; seed {seed}")

    decoding = dict(temperature=args.temperature, top_k=args.top_k, top_p=args.top_p if args.top_p < 1 else None,
                    generator=generator, eot=tok.eot, stop_at_eot=args.stop_at_eot, vocab_size=tok.vocab_size,
                    decode_fn=decode_fn, min_p=args.min_p or None,
                    repetition_penalty=args.repetition_penalty if args.repetition_penalty != 1 else None)
    out = sys.stdout
    if hasattr(out, "reconfigure"):
        out.reconfigure(errors="replace")  # a terminal that cannot show a character gets '?', not a crash
    # Ctrl-C from here on is a KeyboardInterrupt, caught below, so the text generated so far is kept
    # (the start-up handler of errors.quiet_interrupts would exit at once)
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGINT, signal.default_int_handler)
    stream = len(rows) == 1 and args.stream and args.out is None
    generated: list[list[int]] = [[] for _ in rows]
    try:
        if stream:  # one sample streams as it is generated
            printer = StreamPrinter(tok, out)
            out.write(rows[0][0])
            out.flush()
            try:
                for (token,) in generate_stream(model, [rows[0][1]], args.max_new_tokens, **decoding):
                    if token is not None:
                        printer.add(token)
            finally:  # also on Ctrl-C: what was generated stays on the screen, ending in a newline
                printer.finish()
        else:
            interrupted = False
            try:
                generate(model, [ids for _, ids in rows], args.max_new_tokens, into=generated, **decoding)
            except KeyboardInterrupt:  # keep what exists: it is printed (or written), then we exit 130
                interrupted = True
            text = format_samples(tok, rows, generated, interrupted)
            if args.out is not None:
                write_out_file(args.out, text)
                note(f"wrote {len(rows)} sample{'s' * (len(rows) > 1)} to {args.out}"
                     f"{' (interrupted: the text generated so far)' if interrupted else ''}")
            else:
                out.write(text)
                out.flush()
            if interrupted:
                raise KeyboardInterrupt
    except BrokenPipeError:  # e.g. `python sample.py | head`: the reader left, nothing more to say
        _silence_stdout()
    except OSError as e:  # e.g. `python sample.py > /dev/full`
        _silence_stdout()
        raise UserError(f"cannot write the samples to stdout ({short_error(e)}); free some space where it goes") from None
    return 0


def format_samples(tok, rows, generated: list[list[int]], interrupted: bool = False) -> str:
    """The text of every sample (its prompt, then what was generated); several under separator lines."""
    if len(rows) == 1:
        return rows[0][0] + tok.decode(generated[0]) + "\n"
    parts = []
    for r, ((text, _), ids) in enumerate(zip(rows, generated)):
        parts.append(f"---------- sample {r + 1}/{len(rows)}{' (interrupted)' if interrupted else ''} ----------\n")
        parts.append(text + tok.decode(ids) + "\n")
    return "".join(parts)


def write_out_file(name: str, text: str) -> None:
    try:
        atomic_write_bytes(Path(name).expanduser(), text.encode("utf-8", "replace"), "--out", follow=True)
    except OSError as e:
        if reader_left(e):  # --out /dev/stdout | head: run_cli's quiet end
            raise
        raise UserError(f"cannot write --out {name} ({short_error(e)}); {write_fix(e, 'choose another --out')}") from None


def _silence_stdout() -> None:
    """Point stdout at /dev/null, so that Python's final flush at exit has nowhere to fail."""
    point_at_devnull(sys.stdout)
