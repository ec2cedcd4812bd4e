"""Faults from outside, on real processes: `kill -9` at random moments of a training run, then resume,
ten times over, must end bitwise equal to an uninterrupted run; and a checkpoint written onto a really
full filesystem (a small tmpfs) must fail in one line and keep the previous checkpoint.

    python -m pytest tests/test_faults.py -v
"""
from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from checkpoint import load_checkpoint
from tiny_runs import tiny_argv
import warm_runs

ROOT = Path(__file__).resolve().parents[1]
ENV = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
pytestmark = pytest.mark.slow


def train_argv(out: Path, data_root: Path, *extra: str) -> list[str]:
    return tiny_argv(out, data_root, "--model.dropout=0.1", "--train.max_iters=60", "--train.checkpoint_interval=4",
                     "--train.eval_interval=20", "--train.log_interval=5", *extra)


def train(out: Path, data_root: Path, *extra: str, **env: str):
    """A run of train.py forked from a warm interpreter (tests/warm_runs.py): a fresh one's start-up is
    where the random kills below land, not what these runs are for."""
    return warm_runs.run([ROOT / "train.py", *train_argv(out, data_root, *extra)], env={**ENV, **env})


def test_kill_9_at_random_moments_then_resume_ends_bitwise_equal_to_an_uninterrupted_run(tmp_path, data_root):
    reference = train(tmp_path / "ref", data_root)
    assert reference.returncode == 0, reference.stderr[-2000:]
    out, rng = tmp_path / "killed", random.Random(1234)
    # first, deterministically, a kill in the middle of a checkpoint write (the 1st, then the 2nd of a
    # process): a half-written temp file is left behind, which the next trainer must remove
    for k in (1, 2):
        killed = warm_runs.run([ROOT / "tests" / "faults.py", *train_argv(out, data_root)],
                               env={**ENV, "SMALLGPT_TEST_KILL_IN_SAVE": str(k)})
        assert killed.returncode == -signal.SIGKILL
        assert len(list(out.glob(".ckpt.pt.*.tmp"))) == 1  # the killed writer's; the one before it was removed
    for _ in range(2):  # then each kill lands anywhere: imports, set-up, a step, mid-checkpoint-write
        proc = subprocess.Popen([sys.executable, str(ROOT / "train.py"), *train_argv(out, data_root)], env=ENV,
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)  # a fresh interpreter
        time.sleep(rng.uniform(0.3, 4.0))  # start-up takes ~3 s: some land in imports, some in steps
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    final = train(out, data_root)
    assert final.returncode == 0, final.stderr[-2000:]
    a, b = load_checkpoint(tmp_path / "ref"), load_checkpoint(out)
    assert a["train"]["iter"] == b["train"]["iter"] == 60
    for k in a["model"]:
        assert torch.equal(a["model"][k], b["model"][k]), k
    assert not list(out.glob(".*.tmp"))  # every killed writer's temp file was removed by the next trainer


def test_a_checkpoint_onto_a_full_filesystem_is_one_line_and_keeps_the_previous_one(tmp_path, data_root):
    probe = tmp_path / "probe"
    r = train(probe, data_root, "--train.max_iters=2")
    assert r.returncode == 0
    size = (probe / "ckpt.pt").stat().st_size
    disk = tmp_path / "disk"
    disk.mkdir()
    mount = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size * 3 // 2 // 1024 + 8}k", "tmpfs", str(disk)],
                           capture_output=True, text=True)
    if mount.returncode:
        pytest.skip(f"mounting a small tmpfs needs root or CAP_SYS_ADMIN here ({mount.stderr.strip()}): the "
                    "simulated full disk of test_train_reliability.py covers the code path instead")
    try:
        out = disk / "out"
        r = train(out, data_root, "--train.max_iters=8")
        errors = [ln for ln in r.stderr.replace("\r", "\n").splitlines() if ln.startswith("error:")]
        assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr[-2000:]
        assert len(errors) == 1 and "No space left on device" in errors[0] and "ckpt.pt, still holds iter 4" in errors[0]
        assert load_checkpoint(out)["train"]["iter"] == 4  # the first checkpoint, intact
        assert not list(out.glob(".*.tmp"))
    finally:
        subprocess.run(["umount", str(disk)], capture_output=True)
