"""Data parallelism across ranks, run for real with 2 gloo ranks on the CPU (torchrun): every rank gets
its own RNG streams back on resume, rank 0 decides whether to resume and every rank must see the same
checkpoint, and only rank 0 prepares data."""
from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import torch

from checkpoint import load_checkpoint
from training.parallel.distributed import CONTROL_TIMEOUT

ROOT = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.slow


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


def two_ranks(args: list[str], **env: str) -> subprocess.CompletedProcess:
    """The same 2 ranks started directly with the environment torchrun gives them (RANK, WORLD_SIZE,
    MASTER_ADDR/PORT), without its agent process: ~3 s less per run. When a rank fails the other is
    stopped, as the agent would; stdout and stderr are rank 0's, then rank 1's."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    base = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT), **env, "MASTER_ADDR": "127.0.0.1",
            "MASTER_PORT": str(port), "WORLD_SIZE": "2", "LOCAL_WORLD_SIZE": "2"}
    procs = [subprocess.Popen([sys.executable, str(ROOT / "tests" / "faults.py"), *args], stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True, env={**base, "RANK": str(r), "LOCAL_RANK": str(r)},
                              start_new_session=True)  # a group each: its forked workers go with it
             for r in range(2)]
    outs: list = [("", ""), ("", "")]
    threads = [threading.Thread(target=lambda i=i: outs.__setitem__(i, procs[i].communicate()), daemon=True)
               for i in range(2)]
    for t in threads:
        t.start()
    deadline, failed = time.time() + 300, None
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
    for t in threads:
        t.join(timeout=30)
    code = failed if failed is not None else next((p.returncode for p in procs if p.returncode), 0)
    return subprocess.CompletedProcess(args, code, outs[0][0] + outs[1][0], outs[0][1] + outs[1][1])


def losses(out: Path) -> dict[int, float]:
    return {r["iter"]: r["train/loss"] for r in map(json.loads, (out / "metrics.jsonl").read_text().splitlines())
            if "train/loss" in r}


def test_two_ranks_with_dropout_killed_9_resume_bitwise_equal_to_an_uninterrupted_run(tmp_path):
    """Each rank saves and gets back its own RNG streams: with dropout, rank 1 drawing rank 0's masks after a
    resume changes the weights (measured before the fix: max |dw| = 0.097). And every rank's rows are its share
    of the step's rows, a pure function of the step (data/loader.py's StepLoader, shared by the text and the
    conversation loaders), here with data.format chat: a kill -9 of both ranks and a rerun end bitwise where
    the uninterrupted run ends."""
    from data.tasks import generate, write_jsonl

    write_jsonl(tmp_path / "t.jsonl", generate(300, 4, seed=2)[0])
    chat = (f"--data.dataset={tmp_path / 't.jsonl'}", "--data.format=chat",
            "--model.block_size=64", "--train.checkpoint_interval=2")
    r = two_ranks(argv(tmp_path / "full", tmp_path / "prepared", *chat))
    assert r.returncode == 0, r.stderr[-3000:]
    r = two_ranks(argv(tmp_path / "killed", tmp_path / "prepared", *chat), SMALLGPT_TEST_KILL_AFTER="5")
    ck = load_checkpoint(tmp_path / "killed")
    assert r.returncode == -signal.SIGKILL and ck["train"]["iter"] == 4 and len(ck["rng"]["ranks"]) == 2
    assert not torch.equal(ck["rng"]["ranks"][0]["torch"], ck["rng"]["ranks"][1]["torch"])  # own streams
    r = two_ranks(argv(tmp_path / "killed", tmp_path / "prepared", *chat))
    assert r.returncode == 0 and "resuming" in r.stdout, r.stderr[-3000:]
    assert losses(tmp_path / "killed") == losses(tmp_path / "full")
    a, b = load_checkpoint(tmp_path / "full"), load_checkpoint(tmp_path / "killed")
    assert a["chat_template"] == b["chat_template"] and all(torch.equal(a["model"][k], b["model"][k]) for k in a["model"])


def test_a_rank_that_sees_another_checkpoint_stops_every_rank_with_one_line(tmp_path, data_root):
    """Without a shared out_dir rank 0 would resume at iter 4 while rank 1 starts fresh: the replicas
    would diverge silently, then hang. Both ranks stop at start with the same one-line error."""
    r = two_ranks(argv(tmp_path / "out", data_root, "--train.max_iters=4"), SMALLGPT_TEST_OUT_DIR_PER_RANK="1")
    assert r.returncode == 0, r.stderr[-3000:]
    assert not (tmp_path / "out-rank1" / "ckpt.pt").exists()  # rank 0 alone writes: rank 1's disk has no run
    before = (tmp_path / "out-rank0" / "ckpt.pt").read_bytes()
    r = torchrun(argv(tmp_path / "out", data_root), SMALLGPT_TEST_OUT_DIR_PER_RANK="1")
    assert r.returncode != 0
    errors = [ln for ln in re.split(r"[\r\n]", r.stderr) if ln.startswith("error:")]
    # one line per rank that got to print it: once a rank exits, torchrun's agent stops the other
    assert len(errors) in (1, 2), r.stderr[-3000:]
    # torchrun's agent prints its own ChildFailedError traceback for any failed worker; ours print none
    assert not re.search(r'File "[^"]*(train\.py|training/|model/|data/)', r.stderr), r.stderr[-3000:]
    for line in errors:
        assert "rank(s) [1] see no checkpoint" in line and "rank 0 sees run" in line and "at iter 4" in line
        assert "shared by all nodes" in line
    assert (tmp_path / "out-rank0" / "ckpt.pt").read_bytes() == before  # nothing overwritten


def test_only_rank_zero_prepares_the_data_and_the_others_wait_on_a_long_timeout(tmp_path, data_root):
    """Rank 1 would otherwise fingerprint the source again (load_dataset for an hf: source) while rank
    0 waited in a collective with a 30-minute timeout."""
    r = two_ranks(argv(tmp_path / "out", data_root, "--train.max_iters=2"), SMALLGPT_TEST_PREPARE_ON_RANK0_ONLY="1")
    assert r.returncode == 0, r.stderr[-3000:]
    assert "rank 1 prepared data" not in r.stderr
    assert CONTROL_TIMEOUT.total_seconds() >= 6 * 3600


def hellaswag_during_training_equals_the_whole(tmp_path: Path, make_argv=argv) -> None:
    """2 ranks train 2 steps with eval.hellaswag_interval=2 (`make_argv`: this file's run or another's,
    e.g. test_fsdp's); the logged accuracy must equal scoring every item of the final checkpoint in one
    process, and every item must be counted once."""
    from eval.hellaswag import evaluate_hellaswag, hellaswag_metrics, load_items
    from data import get_tokenizer
    from checkpoint import load_model
    from test_hellaswag import ITEMS, write_jsonl

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


def test_hellaswag_during_training_is_sharded_over_ranks_and_sums_to_the_whole(tmp_path):
    """eval.hellaswag_interval: each rank scores items[rank::2] and the counts are summed."""
    hellaswag_during_training_equals_the_whole(tmp_path)
