"""A stop inside a log window (train.log_interval) logs nothing partial, and the window so far is saved in the
checkpoint: the interrupted and resumed run's metrics.jsonl holds the uninterrupted run's records, at the same
steps, with the same train/loss bit for bit (training/report/window.py). Older checkpoints resume with an empty
window; a damaged window entry is one line."""
from __future__ import annotations

import json
import math
import shutil
from pathlib import Path

import pytest
import torch

from checkpoint import Checkpointer, load_checkpoint, save_checkpoint
from checkpoint.format import upgrade
from errors import UserError
from faults import inject

from tiny_runs import _one_thread, run  # noqa: F401 (_one_thread: an autouse fixture)

# a window of 4 steps, evals (which log too) only at the end, dropout and two micro-steps: every part of the state
COMMON = ("--train.max_iters=12", "--train.log_interval=4", "--train.eval_interval=12", "--train.grad_accum_steps=2",
          "--model.dropout=0.1")
TIMING = {"tokens_per_sec", "mfu", "elapsed_s"}  # wall-time fields: another session's, naturally different


def records(out: Path) -> list[dict]:
    return [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]


def without_timing(recs: list[dict]) -> list[dict]:
    return [{k: v for k, v in r.items() if k not in TIMING} for r in recs]


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory, data_root) -> Path:
    out, threads = tmp_path_factory.mktemp("full") / "out", torch.get_num_threads()
    torch.set_num_threads(1)  # as _one_thread does, which runs after a module's fixtures
    try:
        run(out, data_root, *COMMON)
    finally:
        torch.set_num_threads(threads)
    return out


@pytest.mark.parametrize("stop_after, window_steps", [(6, 2), (8, 0)])  # inside a window; at a window's end
def test_a_run_stopped_and_resumed_logs_the_uninterrupted_runs_records(stop_after, window_steps, uninterrupted,
                                                                       tmp_path, data_root):
    out = tmp_path / "out"
    with inject(interrupt_after=stop_after):
        part1 = run(out, data_root, *COMMON)
    assert part1["stopped"] == "SIGINT" and part1["iter"] == stop_after
    assert [r["iter"] for r in records(out)] == [i for i in (4, 8) if i <= stop_after]  # nothing at the stop
    window = load_checkpoint(out)["window"]
    assert window["steps"] == window_steps and len(window["loss_sums"]) == 1
    assert (window["loss_sums"][0] == 0.0) == (window_steps == 0)
    run(out, data_root, *COMMON)
    full, resumed = records(uninterrupted), records(out)
    assert [r["iter"] for r in resumed] == [r["iter"] for r in full] == [4, 8, 12]
    assert without_timing(resumed) == without_timing(full)  # train/loss, lr, grad_norm, evals: == on floats
    assert all(set(r) == set(f) for r, f in zip(resumed, full))
    assert load_checkpoint(out)["window"]["steps"] == 0  # the last step logged: an empty window


def test_an_older_checkpoint_without_a_window_resumes_with_an_empty_one(tmp_path, data_root):
    """A format 3 checkpoint (before the window was saved: its run logged the partial window at the stop) loads,
    and its first record after the resume averages the resumed steps alone."""
    out = tmp_path / "old"
    with inject(interrupt_after=6):
        run(out, data_root, *COMMON)
    ckpt = {k: v for k, v in load_checkpoint(out).items() if k != "window"}
    torch.save({**ckpt, "version": 3}, out / "ckpt.pt")  # as format 3 wrote it, by hand (not by the upgrade code)
    assert upgrade({**ckpt, "version": 3})["window"] == {"steps": 0, "loss_sums": [], "seconds": 0.0}
    shutil.copytree(out, tmp_path / "by_step")
    run(out, data_root, *COMMON)
    by_step = run(tmp_path / "by_step", data_root, *COMMON, "--train.log_interval=1")["losses"]
    logged = {r["iter"]: r["train/loss"] for r in records(out)}
    assert sorted(logged) == [4, 8, 12]
    assert logged[8] == pytest.approx((by_step[7] + by_step[8]) / 2, rel=1e-6)  # steps 7 and 8 only
    assert load_checkpoint(out)["version"] == 4 and load_checkpoint(out)["window"]["steps"] == 0


DAMAGED = [
    ([2, [1.0], 0.0], r"TypeError: the window should be a dict of steps, loss_sums and seconds, got \[2, \[1\.0\], 0\.0\]"),
    ({"steps": 2, "loss_sums": [1.0]}, r"TypeError: the window has no seconds"),
    ({"steps": "2", "loss_sums": [1.0], "seconds": 0.0}, r"TypeError: steps should be int, got '2'"),
    ({"steps": True, "loss_sums": [1.0], "seconds": 0.0}, r"TypeError: steps should be int, got True"),
    ({"steps": -1, "loss_sums": [1.0], "seconds": 0.0}, r"ValueError: steps must be >= 0, got -1"),
    ({"steps": 2, "loss_sums": 1.0, "seconds": 0.0}, r"TypeError: loss_sums should be a list of numbers, got 1\.0"),
    ({"steps": 2, "loss_sums": [math.nan], "seconds": 0.0}, r"ValueError: loss_sums should hold finite numbers >= 0, got nan"),
    ({"steps": 2, "loss_sums": ["1"], "seconds": 0.0}, r"ValueError: loss_sums should hold finite numbers >= 0, got '1'"),
    ({"steps": 1, "loss_sums": [-3.8], "seconds": 0.0}, r"ValueError: loss_sums should hold finite numbers >= 0, got -3\.8"),
    ({"steps": 2, "loss_sums": [], "seconds": 0.0}, r"ValueError: 2 step\(s\) but no rank's loss_sums"),
    ({"steps": 0, "loss_sums": [3.5], "seconds": 0.0}, r"ValueError: no steps but loss_sums \[3\.5\]"),
    ({"steps": 2, "loss_sums": [1.0], "seconds": -1.0}, r"ValueError: seconds should be a finite number >= 0, got -1\.0"),
    ({"steps": 2, "loss_sums": [1.0], "seconds": math.inf}, r"ValueError: seconds should be a finite number >= 0, got inf"),
]


@pytest.mark.parametrize("entry, problem", DAMAGED)
def test_a_damaged_window_entry_is_one_line(entry, problem, tmp_path):
    from training.report.window import LossWindow

    ckpt = Checkpointer(tmp_path)
    ckpt.register("window", LossWindow(torch.device("cpu")))
    with pytest.raises(UserError, match=rf"^checkpoint {tmp_path / 'ckpt.pt'}: its 'window' entry is malformed "
                                        rf"\({problem}\); use another checkpoint \(e\.g\. best\.pt\), or a new "
                                        r"--train\.out_dir$") as e:
        ckpt.restore_states({"window": entry}, tmp_path / "ckpt.pt")
    assert "\n" not in str(e.value)


@pytest.fixture(scope="module")
def stopped(tmp_path_factory, data_root) -> Path:
    """A 1-rank run stopped after step 6, inside its second window (steps 5-6 in the checkpoint's window)."""
    out, threads = tmp_path_factory.mktemp("stopped") / "out", torch.get_num_threads()
    torch.set_num_threads(1)  # as _one_thread does, which runs after a module's fixtures
    try:
        with inject(interrupt_after=6):
            run(out, data_root, *COMMON)
    finally:
        torch.set_num_threads(threads)
    return out


# a window edited by hand, and the line its resume gives: alone (check_window), or against the entries beside it
# (format.window_entry_problem: before, each of the last three resumed and logged a made-up train/loss)
EDITED = [
    ({"loss_sums": [math.nan]}, r"\(ValueError: loss_sums should hold finite numbers >= 0, got nan\)"),
    ({"steps": 1000}, r"\(its 1000 step\(s\) are more than the 6 the run had taken\)"),
    ({"loss_sums": [3.8, 100.0, 5.0]}, r"\(it holds 3 loss sum\(s\), one a rank, but 1 rank\(s\) saved it\)"),
    ({"seconds": 1e300}, r"\(its 1e\+300 s are more than the run's [0-9.e+-]+ s\)"),
]


@pytest.mark.parametrize("edit, problem", EDITED, ids=["nan", "steps", "ranks", "seconds"])
def test_a_resumed_run_refuses_an_edited_window_in_one_line(edit, problem, stopped, tmp_path, data_root):
    out = tmp_path / "out"
    shutil.copytree(stopped, out)
    ckpt = load_checkpoint(out)
    save_checkpoint(out / "ckpt.pt", ckpt | {"window": {**ckpt["window"], **edit}})
    with pytest.raises(UserError, match=r"its 'window' entry is malformed " + problem) as e:
        run(out, data_root, *COMMON)
    assert "\n" not in str(e.value)
    assert not (out / "metrics.jsonl").read_text().count('"iter": 8')  # nothing logged


class Ranks:
    """What the window asks of Parallel: this rank, the world, and a gather (here, the ranks' values given)."""

    def __init__(self, rank: int, world: int, gathered: list | None = None):
        self.rank, self.world_size, self.gathered = rank, world, gathered

    def gather(self, obj, what=""):
        return self.gathered if self.gathered is not None else [obj]


def test_every_ranks_sum_is_saved_and_each_rank_gets_its_own_back_or_the_mean_on_other_ranks():
    from training.report.window import LossWindow

    saved = LossWindow(torch.device("cpu"), Ranks(0, 2, gathered=[7.25, 9.5]))
    for loss in (3.5, 3.75):
        saved.add(torch.tensor(loss))
    saved.pause()
    state = saved.state_dict()
    assert state["steps"] == 2 and state["loss_sums"] == [7.25, 9.5] and state["seconds"] >= 0
    for rank, expected in ((0, 7.25), (1, 9.5)):
        window = LossWindow(torch.device("cpu"), Ranks(rank, 2))
        window.load_state_dict(state)
        assert window.steps == 2 and window.loss.item() == expected
    for world in (1, 4):  # another number of ranks: each starts from the mean, which keeps the ranks' average
        window = LossWindow(torch.device("cpu"), Ranks(0, world))
        window.load_state_dict(state)
        assert window.loss.item() == (7.25 + 9.5) / 2


def test_the_windows_seconds_carry_over_and_its_sum_is_restored_bit_for_bit():
    from training.report.window import LossWindow

    window = LossWindow(torch.device("cpu"))
    sum32 = torch.tensor(1.0) / 3  # a float32 that no short decimal writes
    window.load_state_dict({"steps": 3, "loss_sums": [sum32.item()], "seconds": 5.0})
    assert window.loss.dtype == torch.float32 and torch.equal(window.loss, sum32)
    assert 5.0 <= window.elapsed() < 60
    window.reset()
    assert window.steps == 0 and window.elapsed() < 60 and window.state_dict()["loss_sums"] == [0.0]
