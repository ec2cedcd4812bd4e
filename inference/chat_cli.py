"""`python chat.py`: its options and their checks, and main: load a chat model and hand a ChatSession
(inference/chat_session.py) to the terminal's conversation (inference/chat_terminal.py). What the command does,
for its user, is chat.py's docstring (the usage, the commands, the piped mode)."""
from __future__ import annotations

import argparse
import os
import shlex
import sys

from checkpoint import default_checkpoint, load_for_inference
from errors import ArgumentParser, UserError, utf8_arg
from fileio import path_arg
from inference.chat_session import ChatSession
from inference.chat_terminal import converse, note
from runtime.decoding import check_logits_finite, setup_decoding
from runtime.device import resolve_device
from runtime.precision import DTYPE_NAMES, dtype_name
from runtime.sampling import Sampling, check_temperature, check_top_k, check_top_p

MAX_NEW_TOKENS = 1_000_000


def build_parser() -> argparse.ArgumentParser:
    p = ArgumentParser(prog="python chat.py", description="Chat with a fine-tuned model (the reply streamed).")
    p.add_argument("--checkpoint", default=None, type=path_arg,
                   help="a chat model's ckpt file or training out_dir (default: the run under out/ trained last)")
    p.add_argument("--system", default=None, help="the system message (default: none)")
    p.add_argument("--temperature", type=float, default=None,
                   help="0 means greedy (default: 0.8 at a terminal, 0 with stdin piped)")
    p.add_argument("--top-k", type=int, default=Sampling.top_k, help="keep the K most likely tokens (default: %(default)s)")
    p.add_argument("--top-p", type=float, default=1.0, help="nucleus sampling; 1 turns it off (default: %(default)s)")
    p.add_argument("--max-new-tokens", type=int, default=512, help="the longest reply in tokens (default: %(default)s)")
    p.add_argument("--seed", type=int, default=None, help="random seed (default: a fresh one, shown on stderr)")
    p.add_argument("--device", default="auto", help="auto (cuda > mps > cpu; the default), cpu, cuda, cuda:N, mps")
    p.add_argument("--dtype", default="auto", choices=DTYPE_NAMES,
                   help="as sample.py's: auto picks bf16 on GPUs where native, on a CPU the faster of float32 and "
                        "bfloat16 where bf16 is native, else float32")
    return p


def validate_args(args: argparse.Namespace) -> None:
    if args.system is not None:  # argv's undecodable bytes are lone surrogates here (surrogateescape)
        # a blank one is none, as `/system   ` removes it (no training row has a blank message: never seen)
        args.system = utf8_arg(args.system, "--system") if args.system.strip() else None
    if args.temperature is not None:
        check_temperature(args.temperature)
    check_top_k(args.top_k)
    check_top_p(args.top_p)
    if not 1 <= args.max_new_tokens <= MAX_NEW_TOKENS:
        raise UserError(f"--max-new-tokens must be in [1, {MAX_NEW_TOKENS}], got {args.max_new_tokens}")
    if args.seed is not None and not 0 <= args.seed < 2**63:
        raise UserError(f"--seed must be an integer in [0, 2**63), got {args.seed}")
    if sys.stdin is None:
        raise UserError("stdin is closed, so there is nobody to chat with; run chat.py at a terminal or pipe "
                        "messages in")
    if sys.stdout is None:
        raise UserError("stdout is closed, so the replies have nowhere to go; run with stdout open")


# ---------------------------------------------------------------------------------- main

def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    validate_args(args)
    interactive = sys.stdin.isatty()
    temperature = args.temperature if args.temperature is not None else (Sampling.temperature if interactive else 0.0)
    spec = args.checkpoint if args.checkpoint is not None else default_checkpoint()
    device = resolve_device(args.device, option="--device")
    loaded = load_for_inference(spec)
    template, tok = loaded.chat_template, loaded.tok
    if template is None:
        # sft.yaml's data is characters: another tokenizer's model (GPT-2's, an HF directory) must say its own
        name = loaded.tokenizer.get("tokenizer")
        tokenizer = f" --data.tokenizer={name}" if name != "char" else ""
        raise UserError(f"{loaded.description} is not a chat model (its checkpoint has no chat template); fine-tune it "
                        f"on conversations first: `python train.py --config sft.yaml --model.init_from="
                        f"{shlex.quote(str(spec))}{tokenizer} --data.dataset=YOUR.jsonl` (docs/chat.md), then chat "
                        "with that run's out_dir")
    seed = args.seed if args.seed is not None else int.from_bytes(os.urandom(4), "little")
    ready = setup_decoding(loaded.model, device, args.dtype, say=note)
    check_logits_finite(ready.model, device, loaded.description, ready.dtype)
    try:  # the session's only refusal is the system message's (characters the vocabulary lacks, too long)
        session = ChatSession(ready.model, tok, template, system=args.system, max_new_tokens=args.max_new_tokens,
                              sampling=Sampling(temperature, args.top_k, args.top_p if args.top_p < 1 else None),
                              decode_fn=ready.decode_fn, seed=seed, notice=note)
    except UserError as e:  # named: with messages piped in, an unnamed line read as a message's
        raise UserError(f"--system: {e}") from None
    note(f"{loaded.description}, {tok.name} tokenizer, context {loaded.model.config.block_size} tokens; {device}, "
         f"{dtype_name(ready.dtype)}; temperature {temperature:g}; seed {seed}")
    return converse(session, interactive)
