"""The hostile tests' shared pieces: an entry point run in-process (one line, never a hang), every kind of
path made at a name, a path's snapshot, and the world (a 1-rank FSDP run, a single-file checkpoint, a tiny
GPT-2 one, a HellaSwag item, a prompt, a corpus, held-out task rows) that tests/conftest.py's `world` fixture
builds."""
from __future__ import annotations

import contextlib
import dataclasses
import io
import json
import os
import shutil
import signal
import socket
import stat
import tempfile
from pathlib import Path
from typing import Callable
import pytest
import torch
from training.config.sections import load_config
from training import loop
from checkpoint import save_checkpoint
from data.tasks import generate, write_jsonl
from errors import run_cli
from model import GPT, GPTConfig
from multirank_runs import argv as tiny_train_argv


HANG_S = 30  # "within seconds": a case that takes longer is a hang


class Hang(BaseException):
    """Raised by the alarm: not an Exception, so no `except Exception` of the code under test swallows it."""


def run_entry(main: Callable[[list[str]], int | None], argv: list[str], capsys) -> tuple[int, str, str]:
    """An entry point in-process through errors.run_cli -> (exit code, stdout, stderr). A traceback is
    raised through (the test fails with it); a case that runs past HANG_S raises Hang."""
    fired = []

    def alarm(signum, frame):
        fired.append(True)
        raise Hang(f"{argv} ran past {HANG_S} s")

    previous = signal.signal(signal.SIGALRM, alarm)
    signal.alarm(HANG_S)
    try:
        with pytest.raises(SystemExit) as exc:
            run_cli(lambda: main([str(a) for a in argv]))
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)
        # an exception raised in the middle of any code may be swallowed there (seen: inside logging's lock
        # release, which then stayed held and hung wandb later in this process): a fired alarm fails anyway
        if fired:
            pytest.fail(f"{argv} ran past {HANG_S} s")
    out, err = capsys.readouterr()
    return exc.value.code or 0, out, err


OLD = b"old bytes\n"


def char_device(path: Path, which: str) -> Path:
    """A character device behaving as /dev/null or /dev/full at `path` (mknod, as root), else the real one."""
    if os.geteuid() != 0:
        return Path(f"/dev/{which}")
    os.mknod(path, stat.S_IFCHR | 0o666, os.makedev(1, {"null": 3, "full": 7}[which]))
    return path


def make_kind(kind: str, path: Path, content: bytes = OLD) -> Path:
    """`path` made into `kind`; returns the path to pass (the device's, where it cannot be made here)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    if kind == "regular":
        path.write_bytes(content)
    elif kind == "empty":
        path.write_bytes(b"")
    elif kind == "directory":
        path.mkdir()
    elif kind in ("fifo", "fifo_read"):
        os.mkfifo(path)
    elif kind in ("null_device", "full_device"):
        return char_device(path, kind.split("_")[0])
    elif kind == "socket":
        with socket.socket(socket.AF_UNIX) as s:
            s.bind(str(path))
    elif kind == "symlink_loop":
        path.symlink_to(path.name)
    elif kind == "symlink":
        (path.parent / f"target-of-{path.name}").write_bytes(content)
        path.symlink_to(f"target-of-{path.name}")
    elif kind == "dangling_symlink":
        path.symlink_to(f"target-of-{path.name}")
    else:  # (trailing_separator: a missing name, given with a separator after it)
        assert kind in ("missing", "trailing_separator")
    return path


def snapshot(path: Path):
    """What a path is: its kind, and a regular file's bytes, a directory's names, a symlink's target."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return ("missing",)
    if stat.S_ISLNK(st.st_mode):
        return ("symlink", os.readlink(path))
    if stat.S_ISREG(st.st_mode):
        return ("regular", path.read_bytes())
    if stat.S_ISDIR(st.st_mode):
        return ("directory", sorted(p.name for p in path.iterdir()))
    return (stat.S_IFMT(st.st_mode), st.st_rdev)


@dataclasses.dataclass
class World:
    root: Path  # short: a socket's path must fit in 108 bytes
    data_root: Path
    run: Path  # a 1-rank FSDP run: ckpt.dcp/, best.dcp/, metrics.jsonl
    ckpt: Path  # a single-file char checkpoint
    gpt2: Path  # a tiny checkpoint with GPT-2's tokenizer (HellaSwag, the export)
    hellaswag: Path
    prompt: Path
    corpus: Path
    tasks: Path  # held-out rows of data/tasks.py (eval.chat_tasks --tasks)


TRAIN_TINY = ("--model.dropout=0.0", "--model.n_layer=1", "--model.n_embd=16", "--model.block_size=16",
              "--train.max_iters=2", "--train.eval_interval=2", "--train.eval_iters=1", "--train.batch_size=2",
              "--train.grad_accum_steps=1")


def train_argv(out: Path, data_root: Path, *extra: str) -> list[str]:
    return tiny_train_argv(out, data_root, *TRAIN_TINY, *extra)


def tiny_gpt2_checkpoint(path: Path) -> None:
    torch.manual_seed(0)
    config = GPTConfig(vocab_size=50257, block_size=16, n_layer=1, n_head=1, n_embd=8)
    save_checkpoint(path, {"model": GPT(config).state_dict(), "model_config": dataclasses.asdict(config),
                           "config": {}, "tokenizer": {"tokenizer": "gpt2", "chars": None}})


def build_world(data_root: Path):
    """The hostile tests' world (a generator: the folder goes after the session); tests/conftest.py's
    `world` fixture, shared by every test_hostile_* file."""
    root = Path(tempfile.mkdtemp(prefix="hx-", dir="/tmp" if Path("/tmp").is_dir() else None))
    run = root / "run"
    with contextlib.redirect_stdout(io.StringIO()):
        loop.train(load_config(train_argv(run, data_root, "--train.parallel=fsdp")))
        single = root / "single"
        loop.train(load_config(train_argv(single, data_root)))
    gpt2 = root / "gpt2" / "ckpt.pt"
    tiny_gpt2_checkpoint(gpt2)
    item = {"ctx": "A man sits down.", "endings": ["He eats.", "He runs.", "It rains.", "She sings."], "label": 0}
    (root / "hs.jsonl").write_text(json.dumps(item) + "\n")
    (root / "prompt.txt").write_text("hear")
    (root / "corpus.txt").write_text("To be, or not to be, that is the question.\n" * 40)
    write_jsonl(root / "heldout.jsonl", generate(2, 4)[1])
    yield World(root, data_root, run, single / "ckpt.pt", gpt2, root / "hs.jsonl", root / "prompt.txt",
                root / "corpus.txt", root / "heldout.jsonl")
    shutil.rmtree(root, ignore_errors=True)


SAMPLE_FAST = ["--max-new-tokens", "2", "--seed", "1", "--dtype", "float32", "--no-stream"]
