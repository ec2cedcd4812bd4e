"""Faults injected around the real training step, for tests only: the user config has no test hooks.

    with inject(interrupt_after=5):   # as if Ctrl-C arrived during the 5th step of this process
        train.train(cfg)
    with inject(nan_at=7):            # the weights diverge at step index 7: its loss is NaN

Subprocess tests run `python tests/faults.py <train.py args>` with SMALLGPT_TEST_INTERRUPT_AFTER /
SMALLGPT_TEST_NAN_AT set, which installs the same wrapper and then runs train.py's main.
"""
from __future__ import annotations

import os
import signal
import sys
from contextlib import contextmanager
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]


def wrap_step(real_step, *, interrupt_after: int | None = None, nan_at: int | None = None):
    calls = 0

    def step(model, optimizers, scaler, batches, **kwargs):
        nonlocal calls
        index, calls = calls, calls + 1
        if index == nan_at:
            with torch.no_grad():
                next(model.parameters()).fill_(float("nan"))
        out = real_step(model, optimizers, scaler, batches, **kwargs)
        if interrupt_after is not None and index + 1 == interrupt_after:
            os.kill(os.getpid(), signal.SIGINT)  # handled by train.py's StopFlag after this step
        return out
    return step


@contextmanager
def inject(**faults):
    import train

    real = train.train_step
    train.train_step = wrap_step(real, **faults)
    try:
        yield
    finally:
        train.train_step = real


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT))
    import train
    from errors import run_cli

    env = {k: int(os.environ[v]) for k, v in (("interrupt_after", "SMALLGPT_TEST_INTERRUPT_AFTER"),
                                              ("nan_at", "SMALLGPT_TEST_NAN_AT")) if v in os.environ}
    train.train_step = wrap_step(train.train_step, **env)
    run_cli(lambda: train.main(sys.argv[1:]))
