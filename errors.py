"""One error type for bad user input, and the wrapper that turns it into a one-line message.

Anything the user can fix (a config value, a path, a prompt, a checkpoint) raises `UserError` with a
message that names the problem and the fix. The CLIs run their `main` through `run_cli`, which prints
that message on one line, with no traceback, and exits with status 2.
"""
from __future__ import annotations

import sys
from typing import Callable


class UserError(Exception):
    """A problem with the user's input. The message says what is wrong and how to fix it."""


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
