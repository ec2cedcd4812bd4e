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
    "train.py --help": ("training.cli", ["--help"]),
    "train.py --print-config": ("training.cli", ["--print-config"]),
    "sample.py --help": ("inference.sample_cli", ["--help"]),
    "chat.py --help": ("inference.chat_cli", ["--help"]),
    "serve.py --help": ("server.cli", ["--help"]),
    "python -m data.prepare --help": ("data.prepare", ["--help"]),
    "python -m data.tasks --help": ("data.tasks", ["--help"]),
    "python -m eval.hellaswag --help": ("eval.hellaswag", ["--help"]),
    "python -m eval.chat_tasks --help": ("eval.chat_tasks", ["--help"]),
    "python -m eval.inspect --help": ("eval.inspect", ["--help"]),
    "python -m checkpoint --help": ("checkpoint.__main__", ["--help"]),
    "python -m checkpoint.export --help": ("checkpoint.export", ["--help"]),
    "python -m training.plot --help": ("training.plot", ["--help"]),
    "bench.py --help": ("benchmarks.cli", ["--help"]),
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
    """The reported command as a process: its stdout a pipe whose reader has left before its first write (a
    reader that left after the first line raced the listing, which fits in the pipe's buffer)."""
    r, w = os.pipe()
    os.close(r)
    try:
        child = subprocess.run([sys.executable, str(ROOT / "tests" / "matrix.py"), "--list"], stdout=w,
                               stderr=subprocess.PIPE, cwd=ROOT, timeout=120)
    finally:
        os.close(w)
    err = child.stderr.decode()
    assert child.returncode == 0 and "Traceback" not in err and "Exception" not in err, err


def test_another_pipes_reader_leaving_is_a_failure_in_one_line(tmp_path, capsys, monkeypatch):
    """Only stdout's reader leaving is the quiet end of `| head`: a command whose other pipe broke (a FIFO given
    as its output, a socket) failed, and says so (before: exit 0 and nothing said, its output cut short)."""
    r, w = os.pipe()
    os.close(r)

    def main():
        print("the first line")
        os.write(w, b"x")  # EPIPE: Python ignores SIGPIPE

    out = open(tmp_path / "stdout.txt", "w")
    monkeypatch.setattr(sys, "stdout", out)
    try:
        with pytest.raises(SystemExit) as e:
            run_cli(main)
    finally:
        monkeypatch.undo()
        out.close()
        os.close(w)
    err = capsys.readouterr().err.strip().splitlines()
    assert e.value.code == 1 and len(err) == 1 and err[0].startswith("error: ") and "went away" in err[0], err
    assert (tmp_path / "stdout.txt").read_text() == "the first line\n"


@pytest.mark.parametrize("writer", ["sample.py --out", "training.plot --out"])
def test_a_file_writer_pointed_at_stdout_ends_quietly_when_its_reader_left(writer, tmp_path, capsys, monkeypatch):
    """`--out /dev/stdout | head -c0` (found from outside: the plot said "cannot write /dev/stdout (BrokenPipeError)"
    and exited 2): the writers that take any path let stdout's reader leaving reach run_cli, which ends quietly.
    Here stdout is a pipe whose reader left, and the output path is that pipe (/dev/fd/N, as /dev/stdout is)."""
    stream = closed_pipe()
    path = f"/dev/fd/{stream.fileno()}"
    if writer == "sample.py --out":
        write = lambda: importlib.import_module("inference.sample_cli").write_out_file(path, "ROMEO:\n")  # noqa: E731
    else:
        (tmp_path / "metrics.jsonl").write_text('{"iter": 1, "train/loss": 5.0}\n{"iter": 2, "train/loss": 4.0}\n')
        write = lambda: importlib.import_module("training.plot").main([str(tmp_path), "--out", path])  # noqa: E731
    monkeypatch.setattr(sys, "stdout", stream)
    with pytest.raises(SystemExit) as e:
        run_cli(write)
    monkeypatch.undo()
    assert e.value.code in (0, None) and capsys.readouterr().err == ""
