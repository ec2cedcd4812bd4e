"""Every entry point's output into a pipe whose reader has left (`... | head -1`) is quiet: no traceback, no
"Exception ignored ... BrokenPipeError" at exit, and exit status 0, as sample.py's and chat.py's own writes
already did. In process, each command's --help (or --list, --print-config) writes into a pipe whose read end is
closed, the hardest case: its first write fails; afterwards stdout must flush without an error (Python's own
flush at exit). One subprocess runs the reported command end to end."""
from __future__ import annotations

import importlib
import io
import os
import subprocess
import sys
from pathlib import Path

import pytest

from errors import run_cli

ROOT = Path(__file__).resolve().parents[1]

# the entry point -> (its module, the arguments): --help, or the command's own listing
ENTRIES = {
    "train.py --help": ("train", ["--help"]),
    "train.py --print-config": ("train", ["--print-config"]),
    "sample.py --help": ("sample", ["--help"]),
    "chat.py --help": ("chat", ["--help"]),
    "serve.py --help": ("server.cli", ["--help"]),
    "python -m data.prepare --help": ("data.prepare", ["--help"]),
    "python -m data.tasks --help": ("data.tasks", ["--help"]),
    "python -m eval.hellaswag --help": ("eval.hellaswag", ["--help"]),
    "python -m eval.chat_tasks --help": ("eval.chat_tasks", ["--help"]),
    "python -m eval.inspect --help": ("eval.inspect", ["--help"]),
    "python -m checkpoint --help": ("checkpoint.__main__", ["--help"]),
    "python -m checkpoint.export --help": ("checkpoint.export", ["--help"]),
    "python -m training.plot --help": ("training.plot", ["--help"]),
    "bench.py --help": ("bench", ["--help"]),
    "tests/matrix.py --list": ("matrix", ["--list"]),
}


def closed_pipe() -> io.TextIOWrapper:
    """A text stream on the write end of a pipe whose read end is closed (Python ignores SIGPIPE: a write
    raises BrokenPipeError)."""
    r, w = os.pipe()
    os.close(r)
    return io.TextIOWrapper(io.BufferedWriter(io.FileIO(w, "w")), encoding="utf-8")


@pytest.mark.parametrize("entry", ENTRIES)
def test_output_into_a_closed_pipe_is_quiet_and_exits_0(entry, capsys, monkeypatch):
    module, args = ENTRIES[entry]
    main = importlib.import_module(module).main
    stream = closed_pipe()
    monkeypatch.setattr(sys, "stdout", stream)  # in the test: capsys puts its own stdout in when the test starts
    with pytest.raises(SystemExit) as e:
        run_cli(lambda: main(args))
    assert e.value.code in (0, None), e.value.code
    stream.write("x" * 100_000)  # what is left, and what Python flushes at exit: nowhere to fail
    stream.flush()
    monkeypatch.undo()
    stream.close()
    assert "Traceback" not in capsys.readouterr().err


def test_matrix_list_into_head_ends_quietly():
    """The reported command, as a shell runs it: its stdout a pipe closed after the first line."""
    child = subprocess.Popen([sys.executable, str(ROOT / "tests" / "matrix.py"), "--list"], stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, cwd=ROOT)
    first = child.stdout.readline()
    child.stdout.close()
    err = child.stderr.read().decode()
    assert child.wait(timeout=120) == 0 and first and "Traceback" not in err and "Exception" not in err, err
