"""Data parallelism across ranks, run for real with 2 gloo ranks on the CPU (torchrun): every rank gets
its own RNG streams back on resume, rank 0 decides whether to resume and every rank must see the same
checkpoint, and only rank 0 prepares data."""
from __future__ import annotations

import re
import signal
from pathlib import Path

import pytest
import torch

from checkpoint import load_checkpoint
from training.parallel.distributed import CONTROL_TIMEOUT
from multirank_runs import argv, torchrun, two_ranks, losses, hellaswag_during_training_equals_the_whole

ROOT = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.slow


def test_two_ranks_with_dropout_killed_9_resume_bitwise_equal_to_an_uninterrupted_run(tmp_path):
    """Each rank saves and gets back its own RNG streams: with dropout, rank 1 drawing rank 0's masks after a
    resume changes the weights (measured before the fix: max |dw| = 0.097). And every rank's rows are its share
    of the step's rows, a pure function of the step (data/loader.py's StepLoader, shared by the text and the
    conversation loaders), here with data.format chat: a kill -9 of both ranks and a rerun end bitwise where
    the uninterrupted run ends, and logs the uninterrupted run's train losses (the window the checkpoint holds
    completed after the resume)."""
    from data.tasks import generate, write_jsonl

    write_jsonl(tmp_path / "t.jsonl", generate(300, 4, seed=2)[0])
    chat = (f"--data.dataset={tmp_path / 't.jsonl'}", "--data.format=chat",
            "--model.block_size=64", "--train.checkpoint_interval=2", "--train.log_interval=3",
            "--train.eval_interval=8")
    r = two_ranks(argv(tmp_path / "full", tmp_path / "prepared", *chat))
    assert r.returncode == 0, r.stderr[-3000:]
    r = two_ranks(argv(tmp_path / "killed", tmp_path / "prepared", *chat), SMALLGPT_TEST_KILL_AFTER="5")
    ck = load_checkpoint(tmp_path / "killed")
    assert r.returncode == -signal.SIGKILL and ck["train"]["iter"] == 4 and len(ck["rng"]["ranks"]) == 2
    assert not torch.equal(ck["rng"]["ranks"][0]["torch"], ck["rng"]["ranks"][1]["torch"])  # own streams
    # the log window the checkpoint at step 4 holds (step 4 of the window 4-6): each rank's own loss sum, so the
    # resumed record at step 6 averages steps 4-6 as the uninterrupted run's does (training/report/window.py)
    assert ck["window"]["steps"] == 1 and len(set(ck["window"]["loss_sums"])) == 2
    r = two_ranks(argv(tmp_path / "killed", tmp_path / "prepared", *chat))
    assert r.returncode == 0 and "resuming" in r.stdout, r.stderr[-3000:]
    assert losses(tmp_path / "killed") == losses(tmp_path / "full") and list(losses(tmp_path / "full")) == [3, 6, 8]
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


def test_hellaswag_during_training_is_sharded_over_ranks_and_sums_to_the_whole(tmp_path):
    """eval.hellaswag_interval: each rank scores items[rank::2] and the counts are summed."""
    hellaswag_during_training_equals_the_whole(tmp_path)
