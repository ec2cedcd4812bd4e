"""Faults injected around the real training step, for tests only: the user config has no test hooks.

    with inject(interrupt_after=5):   # as if Ctrl-C arrived during the 5th step of this process
        loop.train(cfg)
    with inject(nan_at=7):            # the weights diverge at step index 7: its loss is NaN
    with inject(crash_at=5):          # the process dies before step index 5 (no checkpoint written)

Subprocess tests run `python tests/faults.py <train.py args>` (also under torchrun), which installs
the same wrapper from the environment and then runs train.py's main (training/cli.py's):
    SMALLGPT_TEST_INTERRUPT_AFTER=k, SMALLGPT_TEST_NAN_AT=k   as above
    SMALLGPT_TEST_TERM_AFTER=k           SIGTERM this process in the loop's step to iter k (as a scheduler's
                                         stop would); the steps a time budget times first don't count
    SMALLGPT_TEST_TERM_SIGNAL=SIGHUP     with TERM_AFTER: send this signal instead of SIGTERM
    SMALLGPT_TEST_TERM_RANK=r            with TERM_AFTER: only rank r signals itself (the others stop with it)
    SMALLGPT_TEST_COMPILE_BACKEND=name   torch.compile uses this backend (e.g. aot_eager: Dynamo traces and
                                         AOTAutograd runs the compiled path, without Inductor's C++ builds)
    SMALLGPT_TEST_STEP_GRAPH=1           the run plan's step_graph rule decides as on a CUDA device (on this
                                         CPU the graphed step then runs uncaptured: training/graphs/step.py)
    SMALLGPT_TEST_KILL_AFTER=k           SIGKILL this process right after its k-th step (before that step is logged)
    SMALLGPT_TEST_KILL_IN_SAVE=k         SIGKILL this process in the middle of writing its k-th checkpoint
                                         (k = 1, 2, ...): half the bytes are in the temp file, none renamed
    SMALLGPT_TEST_KILL_IN_SHARDED_SAVE=k  SIGKILL rank 0 in its k-th sharded checkpoint write, once every
                                         rank's shards and state.pt are in the temp dir, before the rename
    SMALLGPT_TEST_HANG_AT=k              this process stops answering before step index k: it sleeps, for an hour
    SMALLGPT_TEST_OUT_DIR_PER_RANK=1     each rank appends -rank<R> to train.out_dir (no shared out_dir)
    SMALLGPT_TEST_PREPARE_ON_RANK0_ONLY=1  data preparation fails loudly on any rank but 0
"""
from __future__ import annotations

import os
import signal
import sys
import time
from contextlib import contextmanager
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]


class InjectedCrash(RuntimeError):
    """What `crash_at` raises: the process dies mid-run, after its last checkpoint."""


def wrap_step(real_step, *, interrupt_after: int | None = None, nan_at: int | None = None,
              crash_at: int | None = None, kill_after: int | None = None, hang_at: int | None = None):
    calls = 0

    def step(model, loss, optimizers, scaler, batches, **kwargs):
        nonlocal calls
        index, calls = calls, calls + 1
        if index == crash_at:
            raise InjectedCrash(f"injected crash before step index {index}")
        if index == hang_at:
            print(f"hanging before step index {index}", flush=True)
            time.sleep(3600)
        if index == nan_at:
            with torch.no_grad():
                next(model.parameters()).fill_(float("nan"))
        out = real_step(model, loss, optimizers, scaler, batches, **kwargs)
        if kill_after is not None and index + 1 == kill_after:
            os.kill(os.getpid(), signal.SIGKILL)  # kill -9: nothing is flushed, no handler runs
        if interrupt_after is not None and index + 1 == interrupt_after:
            os.kill(os.getpid(), signal.SIGINT)  # the run's StopFlag stops it after this step
        return out
    return step


def kill_in_save(k: int) -> None:
    """Make the k-th checkpoint write of this process die of SIGKILL halfway through its bytes."""
    import io

    import checkpoint.format

    real, saves = checkpoint.format.torch.save, 0

    def save(obj, f, *a, **kw):
        nonlocal saves
        saves += 1
        if saves < k:
            return real(obj, f, *a, **kw)
        buf = io.BytesIO()
        real(obj, buf, *a, **kw)
        f.write(buf.getvalue()[: len(buf.getvalue()) // 2])
        f.flush()
        os.kill(os.getpid(), signal.SIGKILL)
    checkpoint.format.torch.save = save


def kill_in_sharded_save(k: int) -> None:
    """Make rank 0 die of SIGKILL in its k-th sharded checkpoint write, just before the rename that
    would publish it (the other ranks are then stopped by torchrun)."""
    import checkpoint.sharded

    real, saves = checkpoint.sharded.replace_dir, 0

    def replace_dir(tmp, final):
        nonlocal saves
        saves += 1
        if saves >= k:
            os.kill(os.getpid(), signal.SIGKILL)
        return real(tmp, final)
    checkpoint.sharded.replace_dir = replace_dir


@contextmanager
def inject(**faults):
    import training.builders  # the training step's one caller (its Stepper)

    real = training.builders.train_step
    training.builders.train_step = wrap_step(real, **faults)
    try:
        yield
    finally:
        training.builders.train_step = real


def main(argv: list[str]) -> None:
    """train.py's main with the faults the environment asks for (this module's docstring); the process
    it runs in is this script's own, or one forked from a warm interpreter (tests/warm_runs.py)."""
    sys.path.insert(0, str(ROOT))
    from training import chain, loop
    from training import cli as train_cli
    from errors import run_cli

    env = {k: int(os.environ[v]) for k, v in (("interrupt_after", "SMALLGPT_TEST_INTERRUPT_AFTER"),
                                              ("nan_at", "SMALLGPT_TEST_NAN_AT"),
                                              ("kill_after", "SMALLGPT_TEST_KILL_AFTER"),
                                              ("hang_at", "SMALLGPT_TEST_HANG_AT")) if v in os.environ}
    import training.builders

    training.builders.train_step = wrap_step(training.builders.train_step, **env)
    if "SMALLGPT_TEST_TERM_AFTER" in os.environ:
        term_after, real_step_at = int(os.environ["SMALLGPT_TEST_TERM_AFTER"]), loop.step_at

        def step_at(r, i, lr):  # the loop's step only: training/timing/budget.py times steps through its own import
            out = real_step_at(r, i, lr)
            if i + 1 == term_after and os.environ.get("SMALLGPT_TEST_TERM_RANK", str(r.par.rank)) == str(r.par.rank):
                # the StopFlag stops the loop after this step (SMALLGPT_TEST_TERM_SIGNAL: another, e.g. SIGHUP)
                os.kill(os.getpid(), getattr(signal, os.environ.get("SMALLGPT_TEST_TERM_SIGNAL", "SIGTERM")))
            return out
        loop.step_at = step_at
    if os.environ.get("SMALLGPT_TEST_COMPILE_BACKEND"):
        import functools
        torch.compile = functools.partial(torch.compile, backend=os.environ["SMALLGPT_TEST_COMPILE_BACKEND"])
    if os.environ.get("SMALLGPT_TEST_STEP_GRAPH"):
        from benchmarks.gpu_step_profile import as_on_cuda
        from training import builders

        builders.step_graph_for = as_on_cuda(builders.step_graph_for)
    if "SMALLGPT_TEST_KILL_IN_SAVE" in os.environ:
        kill_in_save(int(os.environ["SMALLGPT_TEST_KILL_IN_SAVE"]))
    if "SMALLGPT_TEST_KILL_IN_SHARDED_SAVE" in os.environ:
        kill_in_sharded_save(int(os.environ["SMALLGPT_TEST_KILL_IN_SHARDED_SAVE"]))
    rank = int(os.environ.get("RANK", "0"))
    argv = list(argv)
    if os.environ.get("SMALLGPT_TEST_OUT_DIR_PER_RANK"):
        argv = [f"{a}-rank{rank}" if a.startswith("--train.out_dir=") else a for a in argv]
    if os.environ.get("SMALLGPT_TEST_PREPARE_ON_RANK0_ONLY") and rank:
        def refuse(*a, **k):
            raise AssertionError(f"rank {rank} prepared data (or fingerprinted its source)")
        chain.prepare_data = refuse
        import data.build
        data.build.open_source = refuse
    run_cli(lambda: train_cli.main(argv))


if __name__ == "__main__":
    main(sys.argv[1:])
