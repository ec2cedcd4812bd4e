"""The prompts of `python sample.py`: read from --prompt, --prompt-file or stdin ('-'), each valid UTF-8 and at
most MAX_PROMPT_BYTES, and encoded with the checkpoint's tokenizer (no prompt option: the default prompt; an
empty prompt: the end-of-text token). The command's options and main: inference/sample_cli.py."""
from __future__ import annotations

import argparse
import os
import sys

from errors import UserError, short_error
from fileio import read_user_file
from runtime.text import DEFAULT_PROMPT

MAX_PROMPT_BYTES = 16 * 2**20  # far past any block_size; /dev/zero is refused, not read forever


def reads_stdin(args: argparse.Namespace) -> bool:
    return bool(args.stdin) or "-" in (args.prompt or []) + (args.prompt_file or [])


def _decode_utf8(data: bytes, where: str) -> str:
    """The one rule for every prompt, whatever its source: valid UTF-8, or an error naming the byte
    offset. (Replacing bad bytes would silently change what the model is asked to continue.)"""
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise UserError(f"{where} is not valid UTF-8: byte 0x{data[e.start]:02x} at byte offset {e.start}; "
                        "re-encode it as UTF-8 (e.g. iconv -t UTF-8)") from None


def _read_stdin() -> str:
    if sys.stdin is None:  # started with stdin closed (`<&-`)
        raise UserError("stdin is closed, so there is no prompt to read from it ('-'); pipe the prompt in, or pass "
                        "--prompt TEXT or --prompt-file FILE")
    raw = getattr(sys.stdin, "buffer", None)  # the bytes as given (a text-only stdin: re-encoded as given)
    try:
        data = raw.read(MAX_PROMPT_BYTES + 1) if raw is not None else sys.stdin.read(MAX_PROMPT_BYTES + 1).encode(
            "utf-8", "surrogateescape")
    except OSError as e:  # e.g. a directory redirected in (`< some_dir`)
        raise UserError(f"cannot read the prompt from stdin ({short_error(e)}); pipe a prompt in, or pass --prompt "
                        "TEXT or --prompt-file FILE") from None
    if len(data) > MAX_PROMPT_BYTES:
        raise UserError(f"the prompt on stdin is larger than {MAX_PROMPT_BYTES // 2**20} MiB, the most this reads; "
                        "pass a shorter prompt")
    return _decode_utf8(data, "the prompt on stdin")


def _from_argv(text: str) -> str:
    """A --prompt as typed: Python keeps argv's undecodable bytes as lone surrogates (surrogateescape),
    so encoding back gives the bytes the user passed, to which the same rule applies."""
    return _decode_utf8(os.fsencode(text), "--prompt")


def _read_file(name: str) -> str:
    if name == "-":
        return _read_stdin()
    data = read_user_file(name, "prompt file", fix="check the path", limit=MAX_PROMPT_BYTES)
    return _decode_utf8(data, f"prompt file {name}")


def read_prompts(args) -> list[str] | None:
    """The prompt texts in the order given, or None when no prompt option was given."""
    if args.stdin:
        return [_read_stdin()]
    texts = []
    for text in args.prompt or []:
        texts.append(_read_stdin() if text == "-" else _from_argv(text))
    for name in args.prompt_file or []:
        texts.append(_read_file(name))
    return texts or None


def encode_prompt(tok, text: str | None, note) -> tuple[str, list[int]]:
    """(text to print before the sample, token ids). None = no prompt given; "" = start from EOT."""
    if text is None:
        try:
            return DEFAULT_PROMPT, tok.encode(DEFAULT_PROMPT)
        except UserError:  # a char vocabulary without "\n"
            return "", [tok.eot]
    ids = tok.encode(text)  # the char tokenizer raises UserError for characters it lacks
    if not ids:
        note("the prompt is empty: generation starts from the end-of-text token")
        return "", [tok.eot]
    return text, ids

