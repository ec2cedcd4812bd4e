"""What the loop logs: `<out_dir>/metrics.jsonl`, and the window of steps each log line averages.

`metrics.jsonl` holds one JSON record per logged step (train and eval values of that step
together), written by rank 0, readable without wandb.

Values are plain JSON: a non-finite number is written as null (json.dumps would write `Infinity`,
which is not JSON). A resumed run first drops the records after the checkpoint's iteration, since it is
about to log those steps again, so every step appears once.
"""
from __future__ import annotations

import json
import math
import time
from pathlib import Path
from typing import Any

import torch

from fileio import atomic_write_bytes

METRICS_NAME = "metrics.jsonl"


def _plain(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


class MetricsLog:
    def __init__(self, out_dir: str | Path, *, active: bool = True):
        self.path = Path(out_dir) / METRICS_NAME
        self.active = active

    def resume_at(self, iter_num: int) -> None:
        """Keep the records up to `iter_num` (the checkpoint's): later ones are about to be redone."""
        if not self.active or not self.path.is_file():
            return
        kept = []
        for line in self.path.read_text(encoding="utf-8").splitlines():
            try:
                record = json.loads(line)
            except ValueError:  # a line torn by a crash mid-write
                continue
            if isinstance(record, dict) and isinstance(record.get("iter"), int) and record["iter"] <= iter_num:
                kept.append(line + "\n")
        atomic_write_bytes(self.path, "".join(kept).encode("utf-8"))

    def append(self, iter_num: int, values: dict[str, Any]) -> None:
        if not self.active or not values:
            return
        self.path.parent.mkdir(parents=True, exist_ok=True)
        record = {"iter": iter_num, **{k: _plain(v) for k, v in values.items()}}
        with open(self.path, "a", encoding="utf-8") as f:
            f.write(json.dumps(record, allow_nan=False) + "\n")


class LossWindow:
    """The train losses and wall time of the steps since the last log line. Losses are summed on the
    device (no host sync per step); time spent evaluating or checkpointing is left out of tokens/s."""

    def __init__(self, device: torch.device):
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
