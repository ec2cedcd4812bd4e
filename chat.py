"""Chat with a fine-tuned model in the terminal: the reply streamed, the conversation's KV cache kept across
turns (a turn prefills only its own tokens: runtime/chat_session.py).

    python chat.py                                  # the run under out/ trained last (as sample.py)
    python chat.py --checkpoint out/sft --system "Answer in one line."
    printf 'What is 2+3?\\nAnd 4+4?\\n' | python chat.py --checkpoint out/sft     # scripting

Commands (a line starting with '/'; '//' at the start sends a message beginning with '/'):
  /clear            forget the conversation (the system message stays)
  /system TEXT      set the system message (an empty TEXT removes it); the turns so far stay
  /temperature X    0 is greedy; e.g. 0.8
  /quit             (or Ctrl-D) leave
A bad command or value is one line, and the chat goes on. Ctrl-C during a reply stops the reply (what was
said stays in the conversation); Ctrl-C at the prompt, or end of input, quits.

At a terminal the reply is streamed after `bot> `. With stdin not a terminal (a pipe, a file), every line
is one user message and stdout gets exactly one line per message: the reply text, with backslash, newline
and carriage return written as \\\\, \\n and \\r (so a reply that holds new lines stays one line; undo it
with those three replacements). Blank lines are skipped; commands work and print nothing on stdout; a
message that is refused (not UTF-8, too long, characters the vocabulary lacks) gets its one-line error on
stderr and an empty line on stdout, so line N of stdout always answers message N. Piped, --temperature
defaults to 0 (greedy: the same text on every run and as serve.py's greedy reply at the same --dtype); at a
terminal to 0.8. Notices (the model loaded, the context full) go to stderr.

When the conversation outgrows the model's context (block_size) the oldest exchanges are dropped, the
system message kept, with a notice. Only a chat model can chat: a checkpoint without a chat template
(one not fine-tuned with sft.yaml) is refused in one line.
"""
from __future__ import annotations

import errors

if __name__ == "__main__":  # before the heavy imports below: Ctrl-C during start-up is one line too
    errors.quiet_interrupts()

import argparse
import os
import shlex
import sys

from checkpoint import default_checkpoint, load_for_inference
from errors import ArgumentParser, UserError, run_cli, utf8_arg
from fileio import path_arg
from runtime.chat_session import ChatSession
from runtime.chat_terminal import converse, note
from runtime.decoding import setup_decoding
from runtime.device import resolve_device
from runtime.precision import DTYPE_NAMES, dtype_name
from runtime.sampling import Sampling, check_temperature, check_top_k, check_top_p

if __name__ == "__main__":  # the imports are done: Ctrl-C is a KeyboardInterrupt again
    errors.start_up_done()

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
    session = ChatSession(ready.model, tok, template, system=args.system, max_new_tokens=args.max_new_tokens,
                          sampling=Sampling(temperature, args.top_k, args.top_p if args.top_p < 1 else None),
                          decode_fn=ready.decode_fn, seed=seed, notice=note)
    note(f"{loaded.description}, {tok.name} tokenizer, context {loaded.model.config.block_size} tokens; {device}, "
         f"{dtype_name(ready.dtype)}; temperature {temperature:g}; seed {seed}")
    return converse(session, interactive)


if __name__ == "__main__":
    run_cli(main, oom_fix="lower --max-new-tokens, or chat with a smaller model")
