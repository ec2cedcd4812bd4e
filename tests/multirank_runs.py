"""Two gloo ranks on the CPU: the tiny run's arguments, torchrun (with its agent) or the two ranks started
directly (forked from a warm interpreter, with torchrun's environment), the losses a run logged, and the
HellaSwag-during-training check the multi-rank tests share."""
from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from warm_runs import Process


ROOT = Path(__file__).resolve().parents[1]


def argv(out: Path, data_root: Path, *extra: str) -> list[str]:
    return ["--data.tokenizer=char", f"--data.root={data_root}", f"--train.out_dir={out}", "--model.n_layer=2",
            "--model.n_head=2", "--model.n_embd=32", "--model.block_size=32", "--model.dropout=0.1",
            "--train.batch_size=4", "--train.grad_accum_steps=2", "--train.max_iters=8", "--train.warmup_iters=2",
            "--train.lr=3e-3", "--train.eval_interval=4", "--train.eval_iters=2", "--train.log_interval=1",
            "--train.dtype=float32", "--train.device=cpu", "--train.peak_flops=1e11", "--wandb.mode=disabled", *extra]


def torchrun(args: list[str], **env: str) -> subprocess.CompletedProcess:
    """2 gloo ranks running tests/faults.py (train.py's main with the test-only faults in `env`), under
    torchrun's agent: for the tests of what the agent does (stopping the other ranks when one fails)."""
    full_env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT), **env}
    return subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
                           str(ROOT / "tests" / "faults.py"), *args], capture_output=True, text=True, env=full_env,
                          timeout=300)


def rank_env(port: int, rank: int, **env: str) -> dict[str, str]:
    """The environment torchrun gives rank `rank` of 2 (RANK, WORLD_SIZE, MASTER_ADDR/PORT), with `env`."""
    return {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT), **env, "MASTER_ADDR": "127.0.0.1",
            "MASTER_PORT": str(port), "WORLD_SIZE": "2", "LOCAL_WORLD_SIZE": "2", "RANK": str(rank),
            "LOCAL_RANK": str(rank)}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def Rank(args: list[str], env: dict[str, str], stdout: Path, stderr: Path) -> Process:
    """`python tests/faults.py ARGS` (train.py's main with the test-only faults in `env`) as a process
    forked from the warm interpreter (tests/warm_runs.py: a fresh one spends ~2.5 s of CPU importing, for
    each rank of each run), in a session of its own so that a killpg reaches its workers too."""
    return Process([str(ROOT / "tests" / "faults.py"), *args], env=env, stdout=stdout, stderr=stderr,
                   start_new_session=True)


def two_ranks(args: list[str], *, timeout: float = 300, **env: str) -> subprocess.CompletedProcess:
    """The same 2 ranks started directly with the environment torchrun gives them, without its agent
    process (forked ranks, above). When a rank fails the other is stopped, as the agent would, and both
    are killed after `timeout` s; stdout and stderr are rank 0's, then rank 1's."""
    port = free_port()
    with tempfile.TemporaryDirectory(prefix="ranks-") as tmp:
        files = [(Path(tmp) / f"rank{r}.out", Path(tmp) / f"rank{r}.err") for r in range(2)]
        procs = [Rank(args, rank_env(port, r, **env), *files[r]) for r in range(2)]
        deadline, failed = time.time() + timeout, None
        while any(p.poll() is None for p in procs) and time.time() < deadline:
            failed = next((p.returncode for p in procs if p.poll() not in (None, 0)), None)
            if failed is not None:  # a rank failed: the other would wait in a collective
                break
            time.sleep(0.05)
        for p in procs:
            try:
                os.killpg(p.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            p.wait(30)
        code = failed if failed is not None else next((p.returncode for p in procs if p.returncode), 0)
        out = [(o.read_text(errors="replace"), e.read_text(errors="replace")) for o, e in files]
    return subprocess.CompletedProcess(args, code, out[0][0] + out[1][0], out[0][1] + out[1][1])


def losses(out: Path) -> dict[int, float]:
    return {r["iter"]: r["train/loss"] for r in map(json.loads, (out / "metrics.jsonl").read_text().splitlines())
            if "train/loss" in r}


def hellaswag_during_training_equals_the_whole(tmp_path: Path, make_argv=argv) -> None:
    """2 ranks train 2 steps with eval.hellaswag_interval=2 (`make_argv`: this file's run or another's,
    e.g. test_fsdp's); the logged accuracy must equal scoring every item of the final checkpoint in one
    process, and every item must be counted once."""
    from eval.hellaswag import evaluate_hellaswag, hellaswag_metrics, load_items
    from data import get_tokenizer
    from checkpoint import load_model
    from hellaswag_items import ITEMS, write_jsonl

    data = write_jsonl(tmp_path / "hellaswag.jsonl", ITEMS)
    args = [a for a in make_argv(tmp_path / "out", tmp_path / "prepared", "--train.max_iters=2",
                                 "--eval.hellaswag_interval=2", f"--eval.hellaswag_data={data}",
                                 "--eval.hellaswag_batch_size=2", "--model.block_size=64")
            if not a.startswith(("--data.tokenizer", "--model.block_size=32"))]
    r = two_ranks(args)
    assert r.returncode == 0, r.stderr[-3000:]
    logged = [rec for rec in map(json.loads, (tmp_path / "out" / "metrics.jsonl").read_text().splitlines())
              if "hellaswag/acc" in rec]
    assert [rec["iter"] for rec in logged] == [2]
    model = load_model(str(tmp_path / "out")).model
    whole = hellaswag_metrics(evaluate_hellaswag(model, load_items(data), get_tokenizer("gpt2")))
    assert logged[0]["hellaswag/acc"] == whole["hellaswag/acc"]
    assert logged[0]["hellaswag/acc_norm"] == whole["hellaswag/acc_norm"]
    assert f"({len(ITEMS)} items)" in r.stdout
