"""One error type for bad user input, the wrapper that turns it into a one-line message, and the one
way to shorten a library's exception into a clause of such a message.

Anything the user can fix (a config value, a path, a prompt, a checkpoint) raises `UserError` with a
message that names the problem and the fix. The CLIs run their `main` through `run_cli`, which prints
that message on one line, with no traceback, and exits with status 2.
"""
from __future__ import annotations

import argparse
import sys
from typing import Callable


class UserError(Exception):
    """A problem with the user's input. The message says what is wrong and how to fix it."""


def short_error(e: BaseException, limit: int = 160) -> str:
    """`Type: first sentence of the message`, on one line and at most `limit` characters of message:
    what goes inside the parentheses of a UserError built from a library's exception."""
    msg = " ".join(str(e).split()).split(". ")[0][:limit]
    return f"{type(e).__name__}: {msg}" if msg else type(e).__name__


class ArgumentParser(argparse.ArgumentParser):
    """argparse, with its own errors (an unknown option, a bad value) raised as one-line UserErrors."""

    def error(self, message: str):
        raise UserError(f"{message}; see `{self.prog} --help`")


def run_cli(main: Callable[[], int | None]) -> None:
    try:
        code = main()
    except UserError as e:
        print(f"error: {e}", file=sys.stderr)
        sys.exit(2)
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        sys.exit(130)
    sys.exit(code or 0)
