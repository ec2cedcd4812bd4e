"""Chat with a fine-tuned model in the terminal: the reply streamed, the conversation's KV cache kept across
turns (a turn prefills only its own tokens: inference/chat_session.py).
This script only starts the command: its options and main are inference/chat_cli.py.

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

if __name__ == "__main__":  # before the heavy imports: Ctrl-C during start-up is one line
    errors.quiet_interrupts()

from inference.chat_cli import main  # noqa: E402

if __name__ == "__main__":
    errors.start_up_done()
    errors.run_cli(main, oom_fix="lower --max-new-tokens, or chat with a smaller model")
