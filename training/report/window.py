"""The log window: the train losses and wall time of the steps since the last logged record, which the next
record averages (train.log_interval steps), kept across a stop as a stateful part of the checkpoint.

A stop inside a window (a signal, a dead launcher) logs nothing partial: the checkpoint holds the window so
far ("window": checkpoint.format.check_window's fields), and the resumed run's first record completes it. So
an interrupted and resumed run's metrics.jsonl has the uninterrupted run's records, at the same steps, with
the same train/loss (bitwise where the weights are). Each rank sums its own losses and the record averages
the ranks' means (training/loop.py's log_step): every rank's sum is saved, and each rank gets its own back; resumed
on another number of ranks each starts from the mean of the saved sums, which keeps the ranks' average. The
window's wall seconds so far are saved too and carried over, so its tokens/s counts every step of it, and
neither the downtime nor the resumed run's set-up.
"""
from __future__ import annotations

import time
from typing import Any

import torch

from checkpoint.format import check_window

from ..parallel.distributed import Parallel


class LossWindow:
    """The losses are summed on the device (no host sync per step; the record's mean and a checkpoint's save
    are the window's syncs); time spent evaluating or checkpointing is left out of tokens/s (pause, resume)."""

    def __init__(self, device: torch.device, par: Parallel | None = None):
        self.par = par or Parallel()
        self.loss = torch.zeros((), device=device)
        self.steps = 0
        self._seconds = 0.0
        self._t0 = time.perf_counter()

    def add(self, loss: torch.Tensor) -> None:
        self.loss += loss
        self.steps += 1

    def pause(self) -> None:
        self._seconds += time.perf_counter() - self._t0

    def resume(self) -> None:
        self._t0 = time.perf_counter()

    def elapsed(self) -> float:
        return self._seconds + time.perf_counter() - self._t0

    def reset(self) -> None:
        self.loss.zero_()
        self.steps, self._seconds, self._t0 = 0, 0.0, time.perf_counter()

    def state_dict(self) -> dict[str, Any]:
        """Collective (as the RNG streams' are): every rank's loss sum, gathered in rank order. The seconds are
        those counted up to the last pause: the loop saves while the window is paused."""
        sums = self.par.gather(self.loss.item(), "the ranks' log window loss sums")  # a float32, exact as a float
        return {"steps": self.steps, "loss_sums": sums, "seconds": self._seconds}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """A saved window (check_window's TypeError or ValueError when damaged); its clock starts at the
        next resume()."""
        steps, sums, seconds = check_window(state)
        if len(sums) == self.par.world_size:
            mine = sums[self.par.rank]
        else:  # another number of ranks: the mean of the sums keeps the ranks' average (empty: no steps)
            mine = sum(sums) / len(sums) if sums else 0.0
        self.loss.fill_(mine)
        self.steps, self._seconds, self._t0 = steps, seconds, time.perf_counter()
