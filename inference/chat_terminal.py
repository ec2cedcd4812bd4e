"""chat.py's conversation in the terminal: at a terminal, the reply streamed after `bot> `, Ctrl-C stopping
a reply and not the chat; piped, one user message a line and one stdout line a reply (escaped), commands and
errors on stderr only, so that line N of stdout answers message N. The commands (/clear, /system,
/temperature, /quit) and the bounded, UTF-8-checked reading of each line. inference/chat_cli.py parses chat.py's
options, loads the model and hands a ChatSession (inference/chat_session.py) to `converse`."""
from __future__ import annotations

import select
import signal
import sys
import threading

from errors import UserError, clipped, point_at_devnull, short_error, to_stderr, utf8_text
from inference.chat_session import ChatSession
from runtime.sampling import check_temperature

MAX_MESSAGE_BYTES = 2**20  # far past any context: a longer line is skipped to its end, with one line
MAX_SKIPPED_BYTES = 16 * 2**20  # a line still going past this (/dev/zero) ends the chat: its end may never come
COMMANDS = "/clear, /system TEXT, /temperature X, /quit"


class Quit(Exception):
    pass


class CommandLineError(UserError):
    """A line starting with '/' that could not be read: a command's error, which writes nothing on stdout."""


class EndlessLine(UserError):
    """A line that goes on past MAX_SKIPPED_BYTES: the chat ends (run_cli's one line, exit 2), since the next
    message, if any, can't be found without reading on for ever."""


def note(msg: str) -> None:
    to_stderr(f"chat.py: {msg}")


# ---------------------------------------------------------------------------------- input

def read_message(raw, where: str) -> str | None:
    """The next line of `raw` (bytes) as text without its line end; None at the end of input. A line over
    MAX_MESSAGE_BYTES (skipped to its end) or not valid UTF-8 is a one-line UserError; one whose end is not
    found within MAX_SKIPPED_BYTES, EndlessLine."""
    line = raw.readline(MAX_MESSAGE_BYTES + 1)
    if not line:
        return None
    # a refused line that was meant as a command gets no empty stdout line (piped: one line per message)
    refused = CommandLineError if line.startswith(b"/") and not line.startswith(b"//") else UserError
    if len(line) > MAX_MESSAGE_BYTES and not line.endswith(b"\n"):
        skipped = len(line)
        while (rest := raw.readline(MAX_MESSAGE_BYTES)) and not rest.endswith(b"\n"):
            skipped += len(rest)
            if skipped > MAX_SKIPPED_BYTES:
                raise EndlessLine(f"{where} goes on past {MAX_SKIPPED_BYTES // 2**20} MiB without a line end (e.g. "
                                  "/dev/zero), so no later message can be found; send one message a line")
        raise refused(f"{where} is longer than {MAX_MESSAGE_BYTES // 2**20} MiB, far past the model's context; "
                      "send a shorter message")
    return utf8_text(line.rstrip(b"\n").rstrip(b"\r"), where, "send it as UTF-8", refused)


def run_command(session: ChatSession, line: str) -> str:
    """Do the command on `line` ('/name arg'); what to tell the user. Quit for /quit; UserError for a bad one."""
    # any whitespace after the name ("/clear\t" too), none before it ("/ clear" is no command)
    name, arg = (([] if line[1:2].isspace() else line[1:].split(maxsplit=1)) + ["", ""])[:2]
    if name == "quit":  # "/quit now" too: whatever follows, the user asked to stop
        raise Quit
    if name == "clear":
        if arg.strip():  # "/clear all": it was done as if alone, the words dropped unsaid
            raise UserError(f"/clear takes nothing after it, got {clipped(arg.strip())}; type /clear alone")
        session.clear()
        return "the conversation is cleared" + (" (the system message stays)" if session.messages else "")
    if name == "system":
        session.set_system(arg.strip())
        return "the system message is set" if arg.strip() else "the system message is removed"
    if name == "temperature":
        try:
            value = float(arg)
        except ValueError:
            raise UserError(f"/temperature takes a number, got {arg.strip()!r}; e.g. /temperature 0.8, or 0 for "
                            "greedy") from None
        session.sampling.temperature = check_temperature(value, "/temperature")
        return f"temperature {value:g}" + (" (greedy)" if value == 0 else "")
    raise UserError(f"unknown command {line.split()[0]!r}; the commands are {COMMANDS} (start a message with // to "
                    "send one that begins with '/')")


def is_command(line: str) -> bool:
    return line.startswith("/") and not line.startswith("//")


def message_text(line: str) -> str:
    return line[1:] if line.startswith("//") else line


def escape(text: str) -> str:
    """One reply on one line: backslash, newline and carriage return written as \\\\, \\n, \\r."""
    return text.replace("\\", "\\\\").replace("\n", "\\n").replace("\r", "\\r")


# ---------------------------------------------------------------------------------- the two modes

def wait_for_input(raw) -> None:
    """Until the terminal has something to read. A Ctrl-C whose signal lands after Python last looked for
    signals but before read() blocks (inside the buffered reader's C code) interrupts nothing, and would be
    seen only after the next line: waiting in short selects, Python looks every 0.1 s. `raw` is unbuffered
    (converse), so select sees all there is to read. (A test's stdin without a descriptor is read at once.)"""
    try:
        fd = raw.fileno()
    except (AttributeError, OSError, ValueError):
        return
    while not select.select([fd], [], [], 0.1)[0]:
        pass


def chat_at_terminal(session: ChatSession, raw, out) -> int:
    note(f"type a message; commands: {COMMANDS}; Ctrl-C stops a reply, Ctrl-D (or Ctrl-C here) quits")
    while True:
        try:  # the prompt's write is inside: a Ctrl-C that lands as it is shown still quits cleanly
            out.write("you> ")
            out.flush()
            wait_for_input(raw)
            line = read_message(raw, "the message")
        except KeyboardInterrupt:
            out.write("\n")
            return 0
        except EndlessLine:
            raise
        except UserError as e:
            to_stderr(f"error: {e}")
            continue
        if line is None:
            out.write("\n")
            return 0
        if line.strip() and terminal_turn(session, line, out) is Quit:
            return 0


def terminal_turn(session: ChatSession, line: str, out):
    """One command or one message and its streamed reply; Quit for /quit. Ctrl-C anywhere in it stops
    the reply, not the chat: what was said stays in the conversation."""
    pieces = None
    try:
        if is_command(line):
            note(run_command(session, line))
            return None
        pieces = session.reply(message_text(line))
        out.write("bot> ")
        out.flush()
        for piece in pieces:
            out.write(piece)
            out.flush()
        out.write("\n")
    except Quit:
        return Quit
    except UserError as e:
        to_stderr(f"error: {e}")
    except KeyboardInterrupt:
        if pieces is not None:
            pieces.close()
        out.write("\n")
        note("reply stopped (Ctrl-C at the prompt quits)")
    out.flush()
    return None


def chat_piped(session: ChatSession, raw, out) -> int:
    lineno = 0
    while True:
        lineno += 1
        try:
            line = read_message(raw, f"line {lineno} of stdin")
        except EndlessLine:  # the replies so far are on stdout; run_cli says this one and exits 2
            raise
        except UserError as e:
            to_stderr(f"error: {e}")
            if not isinstance(e, CommandLineError):
                out.write("\n")
            continue
        if line is None:
            return 0
        if not line.strip():
            continue
        if is_command(line):  # its answer, or its error, on stderr only: stdout has one line per message
            try:
                note(run_command(session, line))
            except Quit:
                return 0
            except UserError as e:
                to_stderr(f"error: line {lineno} of stdin: {e}")
            continue
        try:
            pieces = session.reply(message_text(line))
        except UserError as e:
            to_stderr(f"error: line {lineno} of stdin: {e}")
            out.write("\n")
            continue
        try:
            for piece in pieces:
                out.write(escape(piece))
                out.flush()
        finally:  # also on Ctrl-C: the reply's line is ended before `interrupted`
            pieces.close()
            out.write("\n")
            out.flush()


# ---------------------------------------------------------------------------------- the conversation

def converse(session: ChatSession, interactive: bool) -> int:
    """The chat on this process's stdin and stdout, at a terminal or piped; its exit status."""
    out = sys.stdout
    if hasattr(out, "reconfigure"):
        out.reconfigure(errors="replace")  # a terminal that cannot show a character gets '?', not a crash
    raw = getattr(sys.stdin, "buffer", None) or _TextAsBytes(sys.stdin)
    if interactive:  # unbuffered: wait_for_input's select must see every byte not yet read (a terminal gives a
        raw = getattr(raw, "raw", raw)  # line a read, so reading it byte by byte costs nothing a person notices)
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        return chat_at_terminal(session, raw, out) if interactive else chat_piped(session, raw, out)
    except BrokenPipeError:  # e.g. `... | python chat.py | head -1`: the reader left, nothing more to say
        point_at_devnull(sys.stdout)
        return 0
    except OSError as e:
        point_at_devnull(sys.stdout)
        raise UserError(f"cannot write the reply to stdout ({short_error(e)}); free some space where it goes") from None


class _TextAsBytes:
    """A text-only stdin (a test's replacement) read as the bytes it was given."""

    def __init__(self, stream):
        self.stream = stream

    def readline(self, limit: int = -1) -> bytes:
        return self.stream.readline(limit).encode("utf-8", "surrogateescape")
