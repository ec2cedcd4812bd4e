"""Class 1 (docs/reliability.md): a file the project names for itself (a marker, a lock, a log, a temp, a
checkpoint, a shard, a cache, a manifest) is never written through a symlink. Each writer of such a file
(BOOKKEEPING, a table: add a row for a new one), given a link at the name, refuses in one line naming
the link, and the link and the file it points at keep their bytes. A file the user named (`--out`) may
be a link on purpose: it is still followed (test_hostile_kinds)."""
from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Callable

import numpy as np
import pytest

import fileio
import ownership
from checkpoint import save_checkpoint
from checkpoint.out_dir import claim_out_dir
from data.shards import _Split, shard_name
from entry_points import run_entry, train_argv
from errors import UserError
from locks import DirLock
from training.report.metrics import MetricsLog

SECRET = b"a file outside the folder, which must keep its bytes\n"

# (name in its folder, what writes it there): each call writes the file `name` in `folder`
BOOKKEEPING: dict[str, tuple[str, Callable[[Path], object]]] = {
    "owner marker": (ownership.MARKER, lambda d: ownership.mark(d, ownership.OUT_DIR)),
    "train lock": (".train.lock", lambda d: DirLock(d, ".train.lock").try_acquire()),
    "prepare lock": (".prepare.lock", lambda d: DirLock(d, ".prepare.lock").try_acquire()),
    "metrics log (append)": ("metrics.jsonl", lambda d: MetricsLog(d).append(1, {"train/loss": 1.0})),
    "metrics log (resume)": ("metrics.jsonl", lambda d: MetricsLog(d).resume_at(0)),
    "checkpoint": ("ckpt.pt", lambda d: save_checkpoint(d / "ckpt.pt", {"train": {"iter": 1}})),
    "best checkpoint": ("best.pt", lambda d: save_checkpoint(d / "best.pt", {"train": {"iter": 1}})),
    "a temp written whole": (".ckpt.pt.1-1.abcdef01.tmp", lambda d: fileio.write_synced(d / ".ckpt.pt.1-1.abcdef01.tmp",
                                                                                         b"x")),
    "any atomic write of ours": ("meta.json", lambda d: fileio.atomic_write_bytes(d / "meta.json", b"{}")),
    "a shard being written": (f".{shard_name('b', 'train', 0)}.partial",
                              lambda d: _Split(d, "b", "train", np.dtype(np.uint16), 100, None)),
}


def plant_link(folder: Path, name: str) -> Path:
    """`folder/name` as a symlink to a file outside `folder`; returns that file."""
    folder.mkdir(parents=True, exist_ok=True)
    target = folder.parent / f"outside-{name.strip('.')}"
    target.write_bytes(SECRET)
    (folder / name).symlink_to(target)
    return target


@pytest.mark.parametrize("writer", BOOKKEEPING)
def test_class1_symlinked_bookkeeping_is_never_written_through(writer, tmp_path):
    name, write = BOOKKEEPING[writer]
    folder = tmp_path / "folder"
    target = plant_link(folder, name)
    with pytest.raises(UserError) as e:
        write(folder)
    assert "\n" not in str(e.value) and "symlink" in str(e.value) and name in str(e.value), str(e.value)
    assert target.read_bytes() == SECRET
    assert (folder / name).is_symlink() and os.readlink(folder / name) == str(target)


OUT_DIR_OWN = ownership.OWN_NAMES[ownership.OUT_DIR]


@pytest.mark.parametrize("name", OUT_DIR_OWN)
def test_class1_symlinked_bookkeeping_in_an_out_dir_is_refused_at_start(name, tmp_path):
    """Every name train.py writes in its out_dir, a link: refused by the claim, before any work."""
    out = tmp_path / "out"
    out.mkdir()
    if name.endswith(".dcp"):
        (tmp_path / "elsewhere.dcp").mkdir()
        (out / name).symlink_to(tmp_path / "elsewhere.dcp")
    else:
        target = plant_link(out, name)
    with pytest.raises(UserError, match="symlink") as e:
        claim_out_dir(out, say=lambda line: None)
    assert "\n" not in str(e.value) and name in str(e.value)
    if not name.endswith(".dcp"):
        assert target.read_bytes() == SECRET


def test_class1_symlinked_owner_marker_makes_train_refuse_not_overwrite(tmp_path, data_root, capsys):
    """The issue's example: a .smallgpt-owner.json that is a symlink in an out_dir made train.py overwrite
    the file it points at, outside the out_dir."""
    from training import cli as train_cli

    out = tmp_path / "out"
    target = plant_link(out, ownership.MARKER)
    code, _, err = run_entry(train_cli.main, train_argv(out, data_root, "--wandb.mode=disabled"), capsys)
    assert code == 2 and err.count("error: ") == 1 and "symlink" in err and ownership.MARKER in err, err
    assert target.read_bytes() == SECRET


def test_class1_symlinked_manifest_makes_prepare_refuse(tmp_path, capsys):
    from data.prepare import main as prepare_main

    src = tmp_path / "corpus.txt"
    src.write_text("to be or not to be\n" * 50)
    argv = ["--dataset", src, "--tokenizer", "char", "--root", tmp_path / "root", "--no-progress"]
    assert run_entry(prepare_main, argv, capsys)[0] == 0
    meta = next((tmp_path / "root").glob("*/meta.json"))
    kept = tmp_path / "kept-meta.json"
    kept.write_bytes(meta.read_bytes())
    meta.unlink()
    meta.symlink_to(kept)
    before = kept.read_bytes()
    code, _, err = run_entry(prepare_main, argv, capsys)
    assert code == 2 and err.count("error: ") == 1 and "symlink" in err and "meta.json" in err, err
    assert kept.read_bytes() == before and json.loads(before)


def test_class1_a_symlinked_lock_names_the_link_not_pid_question_marks(tmp_path):
    """Class 7's line for the same fault: `pid ? on host ?` for a symlinked lock."""
    out = tmp_path / "out"
    plant_link(out, ".train.lock")
    with pytest.raises(UserError) as e:
        claim_out_dir(out, say=lambda line: None)
    assert "pid ?" not in str(e.value) and "symlink" in str(e.value)


def test_class1_a_file_the_user_named_is_still_followed(tmp_path):
    """The other side of the rule: `--out link` (on purpose) writes the link's target; /dev/stdout, a link
    to the process's stdout, is written straight into."""
    import subprocess
    import sys

    target = plant_link(tmp_path / "mine", "samples.txt")
    fileio.atomic_write_bytes(tmp_path / "mine" / "samples.txt", b"new", "--out", follow=True)
    assert target.read_bytes() == b"new" and (tmp_path / "mine" / "samples.txt").is_symlink()
    code = "import fileio; fileio.atomic_write_bytes('/dev/stdout', b'through the link', '--out', follow=True)"
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, cwd=Path(fileio.__file__).parent)
    assert run.returncode == 0 and run.stdout == b"through the link", run
