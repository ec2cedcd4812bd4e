"""One error type for bad user input, the wrapper that turns it into a one-line message, the one
way to shorten a library's exception into a clause of such a message, and the one place that reads a
library's message to tell what went wrong, where the library raises no type that says it (torch's CPU
allocator and its collectives raise plain RuntimeErrors): is_out_of_memory, lost_peer.

Anything the user can fix (a config value, a path, a prompt, a checkpoint) raises `UserError` with a
message that names the problem and the fix. The CLIs run their `main` through `run_cli`, which prints
that message on one line, with no traceback, and exits with status 2.
"""
from __future__ import annotations

import argparse
import errno
import os
import re
import select
import signal
import sys
from typing import Any, Callable


class UserError(Exception):
    """A problem with the user's input. The message says what is wrong and how to fix it."""


class EntryMismatch(UserError):
    """A checkpoint entry that is well formed but does not fit this run (a loader's state of other data, or of
    another split): its message names the cause and the fix, and the checkpointer puts the checkpoint's path
    before it, never calling the entry malformed (that is for an entry it cannot read)."""


# the end of a sentence: not the dot of an abbreviation ("e.g. 64" was cut to "e.g", losing the example)
FULL_STOP = re.compile(r"(?<!\be\.g)(?<!\bi\.e)(?<!\betc)(?<!\bvs)\. ")


def short_error(e: BaseException, limit: int = 160) -> str:
    """`Type: first sentence of the message`, on one line and at most `limit` characters of message:
    what goes inside the parentheses of a UserError built from a library's exception."""
    msg = FULL_STOP.split(" ".join(str(e).split()), maxsplit=1)[0][:limit]
    return f"{type(e).__name__}: {msg}" if msg else type(e).__name__


def clipped(value: Any, limit: int = 40) -> str:
    """repr(value) for a one-line message, cut at `limit` characters (a value of 5000 digits would make the
    line 5000 characters long). An integer too long to show is named by its size, unprinted: past 4300 digits
    (a checkpoint's pickle can hold one) repr itself raises ValueError."""
    if isinstance(value, int) and not isinstance(value, bool) and value.bit_length() > 4 * limit:
        return f"an integer of about {int(value.bit_length() * 0.30103) + 1} digits"
    text = repr(value)
    return text if len(text) <= limit else text[:limit - 1] + "…"


def utf8_text(raw: bytes, what: str, fix: str, error: type[UserError] = UserError) -> str:
    """`raw` as text, or one line naming the first byte that is not UTF-8 and where it is:
    "<what> is not valid UTF-8 (byte 0x.. at byte offset N); <fix>" (an `error`, a UserError)."""
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise error(f"{what} is not valid UTF-8 (byte 0x{raw[e.start]:02x} at byte offset {e.start}); {fix}") from None


def utf8_arg(text: str, option: str) -> str:
    """A text option as typed (argv's undecodable bytes reach Python as lone surrogates, which no encoder
    takes: a traceback later, or a server whose every JSON reply fails), or a one-line UserError."""
    return utf8_text(os.fsencode(text), option, "pass it as UTF-8")


def write_fix(e: OSError, otherwise: str) -> str:
    """The fix to name when writing failed with `e`: space for a full disk or quota, permissions for a
    refused write, and `otherwise` (another place to write) in every case: "free some space" would be
    wrong advice for, say, a file that another program removed."""
    if e.errno in (errno.ENOSPC, errno.EDQUOT):
        return f"free some space or {otherwise}"
    if e.errno in (errno.EACCES, errno.EPERM):
        return f"fix the permissions or {otherwise}"
    return otherwise


class ArgumentParser(argparse.ArgumentParser):
    """argparse, with its own errors (an unknown option, a bad value) raised as one-line UserErrors."""

    def error(self, message: str):
        raise UserError(f"{message}; see `{self.prog} --help`")


def quiet_interrupts() -> None:
    """For an entry script, before its heavy imports (torch takes seconds): Ctrl-C then prints
    `interrupted` and exits 130 at once. At once (os._exit), not by raising: an exception raised inside a
    C extension's import can be swallowed by the library (the script then ran on) or turned into an
    ImportError with a traceback (numpy), and while the imports run nothing is open or half-written.
    The script calls start_up_done() after its imports: from there on Ctrl-C is a KeyboardInterrupt
    again, which run_cli (or the script's own handlers) turn into the same line after cleaning up."""
    def interrupted(signum, frame):
        os.write(2, b"interrupted\n")
        os._exit(130)

    signal.signal(signal.SIGINT, interrupted)


def start_up_done() -> None:
    """The end of quiet_interrupts' window: Ctrl-C raises KeyboardInterrupt again."""
    signal.signal(signal.SIGINT, signal.default_int_handler)


def to_stderr(line: str) -> None:
    """One line on stderr; nothing where stderr is closed (print(file=None) would put it on stdout, among the
    samples or the log), or where writing it fails: the exit code still says what happened."""
    if sys.stderr is not None:
        try:
            print(line, file=sys.stderr, flush=True)
        except (OSError, ValueError):
            pass


def point_at_devnull(stream) -> None:
    """`stream`'s descriptor now leads to /dev/null, so that what its buffer still holds is flushed there at
    exit (a failing final flush prints a traceback-like note and exits 120), and child processes inheriting
    it write nowhere instead of failing. Nothing for a stream with no descriptor (closed, or a test's
    capture)."""
    try:
        fd = stream.fileno()
    except (AttributeError, OSError, ValueError):
        return
    devnull = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(devnull, fd)
    finally:
        os.close(devnull)


def said(e: UserError) -> UserError:
    """`e`, its line printed now, before the stack unwinds: for a rank whose peer died, which torchrun then
    ends with SIGTERM once our stop handlers are put back (found from outside: the surviving rank printed no
    line at all). run_cli does not print it again."""
    to_stderr(f"error: {e}")
    e.said = True
    return e


# what an entry point's user can lower when an allocation fails anyway (each passes its own: a generic "lower the
# batch size" misled sample.py's user, whose fix was --num-samples)
OOM_FIX = "close other programs, or give the command smaller sizes"


def run_cli(main: Callable[[], int | None], oom_fix: str = OOM_FIX) -> None:
    """`main` as a command: its UserError one line (exit 2), Ctrl-C one line (130), its output into a pipe
    whose reader left (`... | head -1`) quiet, exit 0, as sample.py's and chat.py's own writes did; another
    pipe's reader leaving is a failure, one line (exit 1)."""
    try:
        code = main()
        _flush_stdout()
    except SystemExit:  # argparse's --help and --version, a main's own exit: what it printed, flushed here
        _flush_stdout()
        raise
    except BrokenPipeError as e:
        if stdout_gone():  # the reader of the output left: nothing more to say, and no traceback
            point_at_devnull(sys.stdout)
            sys.exit(0)
        # another pipe or socket the command wrote (a FIFO as --out): a failure, not an end of reading
        to_stderr(f"error: {short_error(e)}{' ' + repr(e.filename) if e.filename else ''}: the reader of what this "
                  "command wrote went away before the end; run it again with the reader attached")
        sys.exit(1)
    except UserError as e:
        if not getattr(e, "said", False):
            to_stderr(f"error: {e}")
        sys.exit(2)
    except KeyboardInterrupt:
        to_stderr("interrupted")
        sys.exit(130)
    except (MemoryError, RuntimeError) as e:  # an allocation that failed despite the estimates (runtime/memory.py)
        if not is_out_of_memory(e):
            raise
        to_stderr(f"error: out of memory ({short_error(e)}); {oom_fix}")
        sys.exit(2)
    sys.exit(code or 0)


def stdout_gone() -> bool:
    """stdout is a pipe (or socket) whose reader has left: the poll of its write end says POLLERR (Linux). False
    where it can't be told (no descriptor, no poll)."""
    try:
        poll = select.poll()
        poll.register(sys.stdout.fileno(), select.POLLOUT)
        return any(events & (select.POLLERR | select.POLLHUP) for _, events in poll.poll(0))
    except (AttributeError, OSError, ValueError):
        return False


def reader_left(e: OSError) -> bool:
    """`e` is stdout's reader leaving (`--out /dev/stdout | head -1`): a writer re-raises it for run_cli to end
    quietly, rather than word it as a failure to write."""
    return isinstance(e, BrokenPipeError) and stdout_gone()


def _flush_stdout() -> None:
    """stdout's buffer written now, where a reader that left is caught (at exit it would print 'Exception
    ignored ... BrokenPipeError' and exit 120); from then on stdout leads to /dev/null."""
    try:
        if sys.stdout is not None:
            sys.stdout.flush()
    except BrokenPipeError:
        point_at_devnull(sys.stdout)
    except (OSError, ValueError):  # a full disk (the command's own writes report it), a closed stream
        pass


def is_out_of_memory(e: BaseException) -> bool:
    """MemoryError, torch.OutOfMemoryError (CUDA), or the CPU allocator's RuntimeError."""
    text = str(e)
    return (isinstance(e, MemoryError) or type(e).__name__ == "OutOfMemoryError"
            or "out of memory" in text or "can't allocate memory" in text)


def no_deterministic_algorithm(e: BaseException) -> bool:
    """torch's RuntimeError for an op with no deterministic implementation under
    torch.use_deterministic_algorithms(True) (torch gives it no type of its own)."""
    return isinstance(e, RuntimeError) and "does not have a deterministic implementation" in str(e)


WENT_AWAY, NO_ANSWER = "went away", "did not answer"


def lost_peer(e: BaseException) -> str | None:
    """Why a collective failed when another rank is the cause: WENT_AWAY (its connection closed) or
    NO_ANSWER (the wait timed out, or NCCL's watchdog fired); None for any other failure."""
    text = str(e).lower()
    if any(w in text for w in ("connection closed", "connection reset", "broken pipe", "socket closed")):
        return WENT_AWAY
    if any(w in text for w in ("timed out", "timeout", "watchdog")):
        return NO_ANSWER
    return None
