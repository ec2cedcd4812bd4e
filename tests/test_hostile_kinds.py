"""Every path option of every entry point, given every kind of path: a regular file (junk, or for an output
one with old bytes), an empty file, a directory, a FIFO (for an output also one being read), character
devices behaving as /dev/null and /dev/full, a socket, a symlink loop, a symlink to a file, a dangling
symlink and a missing path. Each either works (the output loads) or ends within seconds with one line
naming the path; never a traceback, never a hang, and the path is what it was (an input unchanged, an
output still of its kind: a device, a FIFO or a symlink is written into, never replaced).

The whole class, exhaustively: (option) x (kind) is small enough to run every pair instead of sampling
it. An unreadable file (chmod 000) is no kind here when the tests run as root, who reads it anyway:
test_unreadable_inputs_are_one_line says so when it skips.

The devices are made with mknod where the tests run as root (the real /dev/null must never be at stake:
the defect this guards against replaced it with a regular file); elsewhere /dev/null itself is safe,
as no other user can replace it.

The shared world of the hostile tests (a 1-rank FSDP run, a tiny GPT-2 tokenizer checkpoint, a HellaSwag
item, a prompt, a corpus, held-out task rows) and their helpers: tests/hostile_world.py.
"""
from __future__ import annotations

import contextlib
import dataclasses
import io
import json
import os
import sys
import tempfile
import threading
from pathlib import Path
from typing import Callable
from unittest import mock

import pytest

from benchmarks import cli as bench_cli
import eval.chat_tasks as chat_tasks
import eval.hellaswag as hellaswag
import eval.inspect as inspect_cli
from inference import chat_cli, sample_cli
from server import cli as serve_cli
from training import cli as train_cli
from checkpoint import load_checkpoint
from checkpoint.__main__ import main as checkpoint_main
from checkpoint.export import main as export_main
from data.prepare import main as prepare_main
from data import tasks as tasks_cli
from errors import UserError, short_error
from fileio import atomic_write_bytes
from training import plot

from hostile_world import run_entry, make_kind, snapshot, World, train_argv, SAMPLE_FAST
from cli_lines import an_error_line


# ------------------------------------------------------------------------------------------ the kinds

INPUT_KINDS = ("regular", "empty", "directory", "fifo", "null_device", "full_device", "socket", "symlink_loop",
               "symlink", "dangling_symlink", "missing", "trailing_separator")
OUTPUT_KINDS = INPUT_KINDS + ("fifo_read",)


@contextlib.contextmanager
def fifo_reader(path: Path):
    """A reader of the FIFO `path` for the block, open before the block starts (non-blocking, so it is
    open at once): a thread collecting what is written until the block ends."""
    got = bytearray()
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    done = threading.Event()

    def read():
        while True:
            try:
                chunk = os.read(fd, 1 << 16)
            except BlockingIOError:  # a writer, nothing yet
                chunk = None
            if chunk:
                got.extend(chunk)
            elif done.is_set():
                return
            else:
                done.wait(0.01)
    t = threading.Thread(target=read, daemon=True)
    t.start()
    try:
        yield got
    finally:
        done.set()
        t.join(5)
        os.close(fd)


# ------------------------------------------------------------------------------------------ the world



# ------------------------------------------------------------------------------------------ the options



def _png(path: Path) -> bool:
    return path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def _loads(path: Path) -> bool:
    return "model" in load_checkpoint(path, needed=("model",))


def chat_main(argv: list[str]) -> int | None:
    """chat.py with an empty stdin (piped, no terminal): a checkpoint that loads ends at once, with no message."""
    with mock.patch.object(sys, "stdin", io.TextIOWrapper(io.BytesIO(b""))):
        return chat_cli.main(argv)


def serve_main(argv: list[str]) -> int | None:
    """serve.py up to the point of serving: everything that reads --checkpoint is done before uvicorn's
    Server.run, which a real server stays in until stopped; here it returns at once (the seam: the socket
    bound, the engine started and stopped, nothing served)."""
    with mock.patch.object(serve_cli.uvicorn.Server, "run", lambda self, sockets=None: None):
        return serve_cli.main(argv)


# --port 0: no port fought over; --threads 1: the test process keeps its one torch thread (tests/conftest.py)
SERVE_FAST = ["--port", "0", "--threads", "1", "--device", "cpu", "--dtype", "float32"]
CHAT_FAST = ["--device", "cpu", "--dtype", "float32", "--max-new-tokens", "2", "--seed", "1"]
INSPECT_TEXT = ["--text", "hear me"]
TASKS_FAST = ["--train", "2", "--heldout", "0", "--pretrain-lines", "0"]


@dataclasses.dataclass
class Option:
    main: Callable
    argv: Callable[[Path, World, Path], list[str]]  # (the path, the world, a scratch folder) -> argv
    output: bool = False
    loads: Callable[[Path], bool] | None = None  # an output written whole: does it load?
    name: str = "x"  # the path's file name (a suffix decides some readers)


OPTIONS: dict[str, Option] = {
    "sample --checkpoint": Option(sample_cli.main, lambda p, w, t: ["--checkpoint", p, *SAMPLE_FAST], name="ckpt.pt"),
    "sample --prompt-file": Option(sample_cli.main, lambda p, w, t: ["--checkpoint", w.ckpt, "--prompt-file", p,
                                                                 *SAMPLE_FAST]),
    "sample --out": Option(sample_cli.main, lambda p, w, t: ["--checkpoint", w.ckpt, "--out", p, *SAMPLE_FAST],
                           output=True, loads=lambda f: f.read_text().startswith("\n"), name="samples.txt"),
    "consolidate SOURCE": Option(checkpoint_main, lambda p, w, t: ["consolidate", p, "--out", t / "one.pt"]),
    "consolidate --out": Option(checkpoint_main, lambda p, w, t: ["consolidate", w.run / "ckpt.dcp", "--out", p],
                                output=True, loads=_loads, name="one.pt"),
    "export --checkpoint": Option(export_main, lambda p, w, t: ["--checkpoint", p, "--out", t / "hf"], name="ckpt.pt"),
    "export --out": Option(export_main, lambda p, w, t: ["--checkpoint", w.gpt2, "--out", p], output=True,
                           loads=lambda d: (d / "config.json").is_file(), name="hf"),
    "training.plot RUN": Option(plot.main, lambda p, w, t: [p, "--out", t / "c.png"], name="metrics.jsonl"),
    "training.plot --out": Option(plot.main, lambda p, w, t: [w.run, "--out", p], output=True, loads=_png,
                                  name="curves.png"),
    "hellaswag --checkpoint": Option(hellaswag.main, lambda p, w, t: ["--checkpoint", p, "--data", w.hellaswag,
                                                                      "--device", "cpu"], name="ckpt.pt"),
    "hellaswag --data": Option(hellaswag.main, lambda p, w, t: ["--checkpoint", w.gpt2, "--data", p, "--device", "cpu"],
                               name="hs.jsonl"),
    "data.prepare --dataset": Option(prepare_main, lambda p, w, t: ["--dataset", p, "--tokenizer", "char", "--root",
                                                                    t / "prepared", "--no-progress"], name="in.txt"),
    "data.prepare --val-dataset": Option(prepare_main, lambda p, w, t: [
        "--dataset", w.corpus, "--val-dataset", p, "--tokenizer", "char", "--root", t / "prepared", "--no-progress"],
        name="val.txt"),
    "data.prepare --root": Option(prepare_main, lambda p, w, t: ["--dataset", w.corpus, "--tokenizer", "char", "--root",
                                                                 p, "--no-progress"], output=True,
                                  loads=lambda d: any(d.glob("*/meta.json")), name="prepared"),
    "data.prepare --local-path": Option(prepare_main, lambda p, w, t: ["--local-path", p, "--tokenizer", "char",
                                                                       "--root", t / "prepared", "--no-progress"],
                                        name="input.txt"),
    "train.py --config": Option(train_cli.main, lambda p, w, t: ["--config", p, *train_argv(t / "out", w.data_root)],
                                name="cfg.yaml"),
    "train.py train.out_dir": Option(train_cli.main, lambda p, w, t: train_argv(p, w.data_root), output=True,
                                     loads=lambda d: (d / "ckpt.pt").is_file(), name="out"),
    "train.py data.root": Option(train_cli.main, lambda p, w, t: [*train_argv(t / "out", w.data_root), f"--data.root={p}"],
                                 output=True, loads=lambda d: any(d.glob("*/meta.json")), name="prepared"),
    "train.py model.init_from": Option(train_cli.main, lambda p, w, t: [*train_argv(t / "out", w.data_root),
                                                                    f"--model.init_from={p}"], name="init/ckpt.pt"),
    "bench.py --json": Option(None, None, output=True, loads=lambda f: isinstance(json.loads(f.read_text()), dict),
                              name="bench.json"),
    "bench.py --budget-configs": Option(lambda a: bench_cli.parse_args(a) and 0, lambda p, w, t: [
        "--device", "cpu", "--budget-configs", p], name="cfg.yaml"),
    "bench.py --nanogpt-dir": Option(lambda a: bench_cli.parse_args(a) and 0, lambda p, w, t: [
        "--device", "cpu", "--only", "train", "--nanogpt-dir", p], name="nanogpt"),
    "chat.py --checkpoint": Option(chat_main, lambda p, w, t: ["--checkpoint", p, *CHAT_FAST], name="ckpt.pt"),
    "serve.py --checkpoint": Option(serve_main, lambda p, w, t: ["--checkpoint", p, *SERVE_FAST], name="ckpt.pt"),
    "eval.chat_tasks --checkpoint": Option(chat_tasks.main, lambda p, w, t: ["--checkpoint", p, "--tasks", w.tasks],
                                           name="ckpt.pt"),
    "eval.chat_tasks --tasks": Option(chat_tasks.main, lambda p, w, t: ["--checkpoint", w.ckpt, "--tasks", p],
                                      name="heldout.jsonl"),
    "eval.inspect --checkpoint": Option(inspect_cli.main, lambda p, w, t: ["--checkpoint", p, *INSPECT_TEXT, "--out",
                                                                           t / "inspect"], name="ckpt.pt"),
    "eval.inspect --text-file": Option(inspect_cli.main, lambda p, w, t: ["--checkpoint", w.ckpt, "--text-file", p,
                                                                          "--out", t / "inspect"], name="snippet.txt"),
    "eval.inspect --out": Option(inspect_cli.main, lambda p, w, t: ["--checkpoint", w.ckpt, *INSPECT_TEXT, "--out", p],
                                 output=True, loads=lambda d: _png(d / "attention.png"), name="inspect"),
    "data.tasks --out": Option(tasks_cli.main, lambda p, w, t: ["--out", p, *TASKS_FAST], output=True,
                               loads=lambda d: all((d / f).is_file() for f in tasks_cli.FILES), name="tasks"),
}
DIR_OUTPUTS = ("export --out", "data.prepare --root", "train.py train.out_dir", "train.py data.root",
               "eval.inspect --out", "data.tasks --out")
# The choice per kind (fileio.output_target): a file output is written into a regular file (replaced
# atomically), a symlink's target, a character device, a FIFO being read; refused for a FIFO nobody reads
# (writing would hang), a socket, a symlink loop and a directory (training.plot puts curves.png inside
# it). A full device is a write error, one line. A folder output: a new or existing folder, nothing else.
# A trailing separator (`name/`, missing) spells a folder: a folder output makes it; training.plot puts curves.png
# in it; every other file output refuses it in one line (fileio.file_arg), never writing a file at `name`.
WRITTEN = {"regular", "empty", "missing", "symlink", "dangling_symlink", "null_device", "fifo_read"}
FOLDER_WRITTEN = {"directory", "missing", "trailing_separator"}


def expected_to_work(option: str, kind: str) -> bool:
    if option in DIR_OUTPUTS:
        return kind in FOLDER_WRITTEN
    return kind in WRITTEN or (option == "training.plot --out" and kind in ("directory", "trailing_separator"))


def bench_json(argv: list[str]) -> int:
    """bench.py --json: its check before measuring (parse_args), then the very write its main ends with;
    the minutes of measuring between them read no path."""
    args = bench_cli.parse_args(argv)
    try:
        atomic_write_bytes(Path(args.json), (json.dumps({"rows": []}) + "\n").encode(), "--json", follow=True)
    except OSError as e:
        raise UserError(f"cannot write --json {args.json} ({short_error(e)}); the report is printed above")
    return 0


OPTIONS["bench.py --json"] = dataclasses.replace(OPTIONS["bench.py --json"], main=bench_json,
                                                 argv=lambda p, w, t: ["--json", p])

CASES = [(o, k) for o in OPTIONS for k in (OUTPUT_KINDS if OPTIONS[o].output else INPUT_KINDS)]


@pytest.mark.parametrize("option,kind", CASES, ids=[f"{o}-{k}" for o, k in CASES])
def test_every_path_option_takes_every_kind_of_path(world, option, kind, capsys, monkeypatch):
    opt = OPTIONS[option]
    case = Path(tempfile.mkdtemp(dir=world.root))
    monkeypatch.chdir(case)
    path = make_kind(kind, case / opt.name)
    before = snapshot(path)
    target_before = snapshot(path.parent / f"target-of-{path.name}")
    given = f"{path}{os.sep}" if kind == "trailing_separator" else path
    with fifo_reader(path) if kind == "fifo_read" else contextlib.nullcontext(bytearray()) as got:
        code, out, err = run_entry(opt.main, opt.argv(given, world, case), capsys)
    assert "Traceback" not in err, err
    if opt.output:
        assert (code == 0) == expected_to_work(option, kind), (code, err)
    if code != 0:
        an_error_line(code, err, path.name)
    after = snapshot(path)
    if not opt.output or code != 0:  # an input, or a refused output: untouched
        assert after == before, (before, after)
        assert snapshot(path.parent / f"target-of-{path.name}") == target_before
    if opt.output and code == 0:
        if kind in ("symlink", "dangling_symlink"):  # the link stays; its target got the output
            assert after == before
            written = path.parent / f"target-of-{path.name}"
        elif kind in ("null_device", "full_device", "fifo", "fifo_read", "socket"):  # written into, kept
            assert after[0] == before[0] and after == before, (before, after)
            written = None
        elif kind in ("directory", "trailing_separator") and option not in DIR_OUTPUTS:  # the file goes inside
            written = next(p for p in path.iterdir())
        else:
            written = path
        if written is not None:
            assert opt.loads(written), written
        if kind == "fifo_read" and option not in DIR_OUTPUTS:
            assert len(got) > 0  # the reader got the output


def test_unreadable_inputs_are_one_line(world, tmp_path, capsys):
    if os.geteuid() == 0:
        pytest.skip("running as root: chmod 000 does not stop root from reading, so an unreadable file is no "
                    "kind of path here")
    path = tmp_path / "prompt.txt"
    path.write_text("hear")
    path.chmod(0)
    code, _, err = run_entry(sample_cli.main, ["--checkpoint", world.ckpt, "--prompt-file", path, *SAMPLE_FAST], capsys)
    an_error_line(code, err, str(path))


@pytest.mark.parametrize("kind", [k for k in INPUT_KINDS if k not in ("missing", "trailing_separator")])
def test_every_kind_of_entry_under_a_data_files_name_in_a_dataset_folder_is_read_or_named(tmp_path, kind):
    """Found from outside: a FIFO or a dangling link named b.jsonl inside data.dataset's folder was skipped
    silently (prepared, trained, exit 0), while the same path named by itself is refused. Each kind is read as
    the folder's file it claims to be, or refused in one line naming it; the folder is left as it was."""
    from data import DataConfig
    from data.sources import open_source

    folder = tmp_path / "corpus"
    folder.mkdir()
    (folder / "a.txt").write_text("some text\n")
    entry = make_kind(kind, folder / "b.txt", b"more text\n")
    if entry.parent != folder:
        pytest.skip(f"{kind}: a device can be made only as root (mknod); here it is {entry}, outside the folder")
    before = snapshot(entry)
    readable = kind in ("regular", "empty", "symlink", "directory")
    try:
        open_source(DataConfig(dataset=str(folder), tokenizer="char"))
    except UserError as e:
        assert not readable and "b.txt" in str(e) and "not a file" in str(e) and "\n" not in str(e), (kind, e)
    else:
        assert readable, kind
    assert snapshot(entry) == before
