"""Class 5 (docs/reliability.md): every way a run is told to stop ends it the same way: after the step,
with a checkpoint, one line, exit 0. SIGHUP (the terminal closed) as SIGTERM; and a rank whose launcher
died (`kill -9` of torchrun) is not left training as an orphan: its parent watch stops it the same way.
Real processes: train.py (tests/faults.py) on a tiny model."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path


from checkpoint import load_checkpoint
from training.parallel.signals import STOP_SIGNALS

from multirank_runs import argv as train_argv, torchrun
import warm_runs

ROOT = Path(__file__).resolve().parents[1]
ENV = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}


def test_class5_every_stop_signal_is_handled():
    assert {signal.SIGINT, signal.SIGTERM, signal.SIGHUP} <= set(STOP_SIGNALS)


def test_class5_sighup_saves_says_one_line_and_exits_0(tmp_path, data_root):
    """The issue's example: SIGHUP killed the run with no line and no final checkpoint."""
    out = tmp_path / "out"
    run = warm_runs.run([ROOT / "tests" / "faults.py",
                         *train_argv(out, data_root, "--train.max_iters=50", "--train.eval_interval=50")],
                        env={**ENV, "SMALLGPT_TEST_TERM_AFTER": "2", "SMALLGPT_TEST_TERM_SIGNAL": "SIGHUP"})
    assert run.returncode == 0, run.stderr[-2000:]
    assert "stopped by SIGHUP after iter 2;" in run.stdout, run.stdout[-2000:]
    assert load_checkpoint(out / "ckpt.pt")["train"]["iter"] == 2


def test_class5_a_signal_to_one_rank_stops_both_and_rank_0_names_it(tmp_path, data_root):
    # found from outside: rank 0 saw no signal itself and printed "stopped by  after iter 17"
    out = tmp_path / "out"
    # under torchrun's own agent (it sets TORCHELASTIC_RUN_ID, which turns on the ranks' watch of their parent)
    run = torchrun(train_argv(out, data_root, "--train.max_iters=50", "--train.eval_interval=50"),
                   SMALLGPT_TEST_TERM_AFTER="2", SMALLGPT_TEST_TERM_SIGNAL="SIGHUP", SMALLGPT_TEST_TERM_RANK="1")
    assert run.returncode == 0, run.stderr[-2000:]
    assert "stopped by SIGHUP (to rank 1) after iter 2;" in run.stdout, run.stdout[-2000:]
    assert load_checkpoint(out / "ckpt.pt")["train"]["iter"] == 2


def running(pid: int) -> bool:
    """Alive and not a zombie (a container's init may never reap the orphan)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False


LAUNCHER = """
import subprocess, sys, time
print(subprocess.Popen(sys.argv[1:]).pid, flush=True)  # the rank: its stdout is this pipe too
time.sleep(600)
"""


def test_class5_a_rank_whose_launcher_was_killed_stops_after_a_save(tmp_path, data_root):
    """`kill -9` of the launcher (torchrun's role, played by a small script that starts the rank with
    torchrun's TORCHELASTIC_RUN_ID): the orphaned rank stops after its step, saves, says why, exits."""
    out = tmp_path / "out"
    args = train_argv(out, data_root, "--train.max_iters=100000", "--train.eval_interval=100000",
                      "--train.log_interval=1")
    launcher = subprocess.Popen([sys.executable, "-c", LAUNCHER, sys.executable, str(ROOT / "tests" / "faults.py"),
                                 *args], env={**ENV, "TORCHELASTIC_RUN_ID": "test"}, stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, text=True)
    rank = int(launcher.stdout.readline())
    lines = []
    try:
        deadline = time.monotonic() + 240
        for line in launcher.stdout:  # until the rank has trained a step
            lines.append(line)
            if line.startswith("iter 2:") or time.monotonic() > deadline:
                break
        assert any(ln.startswith("iter 2:") for ln in lines), "".join(lines)[-2000:]
        launcher.kill()  # SIGKILL: the launcher can tell its rank nothing
        launcher.wait()
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and running(rank):
            time.sleep(0.2)
        assert not running(rank), "the orphaned rank still runs a minute after its launcher died"
        rest = launcher.stdout.read()  # to the end: every writer of the pipe (the rank) has exited
    finally:
        if launcher.poll() is None:
            launcher.kill()
        if running(rank):
            os.kill(rank, signal.SIGKILL)
    stopped = [ln for ln in rest.splitlines() if ln.startswith("stopped by")]
    assert len(stopped) == 1 and "launcher" in stopped[0], rest[-2000:]
    saved = load_checkpoint(out / "ckpt.pt")["train"]["iter"]
    assert f"after iter {saved};" in stopped[0], (saved, stopped)
