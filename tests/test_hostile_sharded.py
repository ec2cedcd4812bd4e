"""A damaged sharded checkpoint (ckpt.dcp/ of a 1-rank train.parallel=fsdp run), every kind of damage x
every reader: one line naming the checkpoint, never a traceback (DCP's CheckpointException is a
BaseException, which `except Exception` let through), and the checkpoint left as it was.

The damage: a shard (.distcp) missing, truncated, emptied or replaced by a folder; the .metadata
truncated, emptied, missing, or holding a pickle the safe reader refuses; state.pt truncated or missing.
The readers: sample.py, consolidate, a resume (train.py on the same out_dir), model.init_from, HellaSwag
and the HF export (both load the model before anything of their own).
"""
from __future__ import annotations

import os
import pickle
import shutil
from pathlib import Path

import pytest

import eval.hellaswag as hellaswag
import sample
import train
from checkpoint.__main__ import main as checkpoint_main
from checkpoint.export import main as export_main

from test_hostile_kinds import SAMPLE_FAST, assert_one_line, run_entry, snapshot, train_argv


def _cut(path: Path, keep: float) -> None:
    path.write_bytes(path.read_bytes()[:int(path.stat().st_size * keep)])


def _shard(ckpt: Path) -> Path:
    return next(ckpt.glob("*.distcp"))


DAMAGE = {
    "shard missing": lambda c: _shard(c).unlink(),
    "shard truncated": lambda c: _cut(_shard(c), 0.5),
    "shard truncated by a byte": lambda c: _cut(_shard(c), 1 - 1 / _shard(c).stat().st_size),
    "shard empty": lambda c: _cut(_shard(c), 0),
    "shard a folder": lambda c: (_shard(c).unlink(), _shard_dir(c)),
    "metadata truncated": lambda c: _cut(c / ".metadata", 0.5),
    "metadata empty": lambda c: _cut(c / ".metadata", 0),
    "metadata refused": lambda c: (c / ".metadata").write_bytes(pickle.dumps(os.getcwd)),  # a function: no
    "metadata missing": lambda c: (c / ".metadata").unlink(),
    "state.pt truncated": lambda c: _cut(c / "state.pt", 0.5),
    "state.pt missing": lambda c: (c / "state.pt").unlink(),
}


def _shard_dir(ckpt: Path) -> None:
    (ckpt / "__0_0.distcp").mkdir()


READERS = {
    "sample.py": lambda run, w, t: (sample.main, ["--checkpoint", run, *SAMPLE_FAST]),
    "consolidate": lambda run, w, t: (checkpoint_main, ["consolidate", run, "--out", t / "one.pt"]),
    "resume": lambda run, w, t: (train.main, train_argv(run, w.data_root, "--train.parallel=fsdp",
                                                        "--train.max_iters=4")),
    "model.init_from": lambda run, w, t: (train.main, [*train_argv(t / "new", w.data_root),
                                                       f"--model.init_from={run / 'ckpt.dcp'}"]),
    "eval.hellaswag": lambda run, w, t: (hellaswag.main, ["--checkpoint", run, "--data", w.hellaswag, "--device", "cpu"]),
    "checkpoint.export": lambda run, w, t: (export_main, ["--checkpoint", run, "--out", t / "hf"]),
}


def tree(path: Path) -> dict:
    return {str(p.relative_to(path)): snapshot(p) for p in sorted(path.rglob("*"))}


@pytest.mark.parametrize("reader", READERS)
@pytest.mark.parametrize("damage", DAMAGE)
def test_a_damaged_sharded_checkpoint_is_one_line_for_every_reader(world, tmp_path, capsys, damage, reader):
    run = tmp_path / "run"
    shutil.copytree(world.run, run)
    for aside in run.glob("best.dcp"):  # no second checkpoint to fall back on: the damaged one is read
        shutil.rmtree(aside)
    DAMAGE[damage](run / "ckpt.dcp")
    before = tree(run / "ckpt.dcp")
    main, argv = READERS[reader](run, world, tmp_path)
    code, _, err = run_entry(main, argv, capsys)
    line = assert_one_line(code, err)
    assert "ckpt.dcp" in line or str(run) in line, line
    assert tree(run / "ckpt.dcp") == before  # read, never repaired or replaced
