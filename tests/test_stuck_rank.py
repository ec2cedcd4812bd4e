"""A rank that stops answering ends the others (train.collective_timeout), and a signal to a rank that waits
on it ends that rank within seconds: 2 gloo ranks on the CPU, one of them made to hang (tests/faults.py)."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from checkpoint import load_checkpoint

from multirank_runs import Rank, argv, free_port, rank_env

ROOT = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.slow
HANG_AT = 5  # rank 1 stops answering before step index 5 (iter 6), after the checkpoint at iter 4


def start_ranks(tmp_path: Path, args: list[str]) -> list[Rank]:
    """Rank 0 and rank 1 (which hangs at HANG_AT), with torchrun's environment, output to files."""
    port = free_port()
    return [Rank(args, rank_env(port, rank, **({"SMALLGPT_TEST_HANG_AT": str(HANG_AT)} if rank else {})),
                 tmp_path / f"rank{rank}.out", tmp_path / f"rank{rank}.err") for rank in range(2)]


def wait_for(pred, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if pred():
            return True
        time.sleep(0.1)
    return False


def kill_all(procs):
    for p in procs:
        try:
            os.killpg(p.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        p.wait()


def error_lines(path: Path) -> list[str]:
    return [ln for ln in path.read_text().splitlines() if ln.startswith("error:")]


def test_the_other_rank_ends_within_the_collective_timeout_with_one_line(tmp_path, data_root):
    out = tmp_path / "out"
    procs = start_ranks(tmp_path, argv(out, data_root, "--train.collective_timeout=4s", "--train.max_iters=40"))
    try:
        assert wait_for(lambda: "hanging before" in (tmp_path / "rank1.out").read_text(), 120)
        hung = time.monotonic()
        assert wait_for(lambda: procs[0].poll() is not None, 60), "rank 0 did not end"
        waited = time.monotonic() - hung
        assert procs[0].returncode != 0 and 3 <= waited < 4 + 15, waited
        lines = error_lines(tmp_path / "rank0.err")
        assert len(lines) == 1 and "Traceback" not in (tmp_path / "rank0.err").read_text(), lines
        assert lines[0].startswith(f"error: rank 0 stopped at iter {HANG_AT + 1}: another rank did not answer within "
                                   "train.collective_timeout=4s (it hangs or is far behind) in the step's gradient "
                                   "all-reduce"), lines
        assert load_checkpoint(out)["train"]["iter"] == 4  # what was saved before is whole
    finally:
        kill_all(procs)


def test_sigterm_to_a_rank_waiting_on_a_stuck_one_ends_it_within_seconds(tmp_path, data_root):
    out = tmp_path / "out"
    procs = start_ranks(tmp_path, argv(out, data_root, "--train.collective_timeout=10m", "--train.max_iters=40"))
    try:
        assert wait_for(lambda: "hanging before" in (tmp_path / "rank1.out").read_text(), 120)
        time.sleep(3)  # rank 0 is now inside the step's all-reduce, waiting for rank 1
        sent = time.monotonic()
        procs[0].send_signal(signal.SIGTERM)
        assert wait_for(lambda: procs[0].poll() is not None, 10), "SIGTERM did not end the waiting rank in 10 s"
        assert time.monotonic() - sent < 10 and procs[0].returncode == 3
        lines = error_lines(tmp_path / "rank0.err")
        assert len(lines) == 1 and lines[0].startswith(
            f"error: stopped by SIGTERM while rank 0 waited in the step's gradient all-reduce at iter {HANG_AT + 1}"), lines
        assert f"{out / 'ckpt.pt'} holds iter 4" in lines[0]
        assert load_checkpoint(out)["train"]["iter"] == 4
    finally:
        kill_all(procs)


PATIENT = """
import sys, time
sys.path.insert(0, sys.argv[1])
import torch
from training.parallel.distributed import dist_from_env, destroy_distributed
from training.parallel.signals import StopFlag
par = dist_from_env(timeout_s=3.0)
par.join(torch.device("cpu"))
stop = StopFlag(par).install()
print("ready", flush=True)
if par.is_main:
    time.sleep(6)  # rank 0's long work (an eval, a checkpoint write): longer than the timeout and the grace
value = par.broadcast("done", "rank 0's eval", patient=True)
print(f"got {value}, stop requested: {stop.requested}", flush=True)
stop.restore()
destroy_distributed(healthy=True, par=par)
"""


def test_a_signal_while_waiting_for_rank_0s_long_work_stops_the_run_as_between_steps(tmp_path):
    """A patient wait (rank 0's eval, its checkpoint write) is not a stuck rank: a SIGTERM that arrives then
    is kept for the loop (a checkpoint, exit 0), never ends the waiting rank, and the wait outlasts
    train.collective_timeout."""
    script = tmp_path / "patient.py"
    script.write_text(PATIENT)
    port = free_port()
    procs = [subprocess.Popen([sys.executable, str(script), str(ROOT)], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              text=True, env=rank_env(port, r), start_new_session=True) for r in range(2)]
    try:
        assert procs[1].stdout.readline().strip() == "ready"
        time.sleep(1)
        procs[1].send_signal(signal.SIGTERM)  # rank 1 now waits in the patient broadcast
        outs = [p.communicate(timeout=60) for p in procs]
        assert [p.returncode for p in procs] == [0, 0], outs
        assert "got done, stop requested: True" in outs[1][0], outs[1]
    finally:
        kill_all(procs)


@pytest.mark.parametrize("message", ["[gloo/transport/tcp/pair.cc:534] Connection closed by peer [127.0.0.1]:5",
                                     "Timed out waiting 4000ms for recv operation to complete"])
def test_a_lost_peers_line_is_printed_before_the_run_unwinds_and_once(capsys, message):
    # found from outside: with one rank killed -9, torchrun SIGTERMs the others; the survivor raised its line,
    # unwound (putting the default SIGTERM action back) and was killed before run_cli could print it
    from errors import UserError, run_cli
    from training.parallel.distributed import Parallel

    par = Parallel(0, 0, 2)
    with pytest.raises(UserError) as e:
        with par.waiting("the step's gradient all-reduce"):
            raise RuntimeError(message)
    assert capsys.readouterr().err == f"error: {e.value}\n"  # already on stderr as the exception leaves
    with pytest.raises(SystemExit) as code:
        run_cli(lambda: (_ for _ in ()).throw(e.value))
    assert code.value.code == 2 and capsys.readouterr().err == ""  # and not a second time
