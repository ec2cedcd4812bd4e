"""What the loop logs: `<out_dir>/metrics.jsonl`, the window of steps each log line averages, the
progress display (a bar on a terminal, plain lines elsewhere), and the console they print to.

`metrics.jsonl` holds one JSON record per logged step (train and eval values of that step
together), written by rank 0, readable without wandb.

Values are plain JSON: a non-finite number is written as null (json.dumps would write `Infinity`,
which is not JSON). A resumed run first drops the records after the checkpoint's iteration, since it is
about to log those steps again, so every step appears once.
"""
from __future__ import annotations

import io
import json
import math
import sys
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch
from tqdm import tqdm

from bounded import TooLarge, read_at_most
from errors import UserError, short_error, to_stderr
from fileio import atomic_write_bytes, json_loads, open_own, point_at_devnull

METRICS_NAME = "metrics.jsonl"
# ~3M logged steps (a record is ~300 bytes): what a run writes is not bounded by the trainer, and a resume must
# not refuse its own run's log (256 MiB, ~1M lines, was passed in ~3 hours at log_interval 1 and 10 ms a step).
# Past it (or endless: /dev/zero) refused by its size, unread; the plot (training/plot.py) reads the same bound.
MAX_METRICS_BYTES = 1 << 30


def _plain(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


class MetricsLog:
    def __init__(self, out_dir: str | Path, *, active: bool = True):
        self.path = Path(out_dir) / METRICS_NAME
        self.active = active
        self.kept: list[dict[str, Any]] = []  # the records a resumed run kept (resume_at): its earlier sessions
        if active and self.path.exists() and not self.path.is_file():
            raise UserError(f"{self.path} is not a file; move it away (train.py writes its metrics there)")

    def resume_at(self, iter_num: int) -> list[dict[str, Any]]:
        """Keep the records up to `iter_num` (the checkpoint's): later ones are about to be redone.
        Returns the kept records (wandb_logger sends those wandb lacks). A line that is not a JSON
        record (torn by a crash mid-write, or damaged: not UTF-8, not JSON) is dropped with a note, so a
        damaged file never makes a run unresumable."""
        if not self.active or not self.path.is_file():
            return []
        kept, records, dropped = [], [], 0
        try:
            raw = read_at_most(self.path, MAX_METRICS_BYTES)  # by its size first: a sparse 100 GB file stays unread
        except TooLarge as e:
            size = f"{e.size:,} bytes" if e.size is not None else "endless"
            raise UserError(f"{self.path} is {size}, over the {MAX_METRICS_BYTES >> 20} MiB of ~3M logged steps; move it "
                            "away (the run then logs into a new one), then resume") from None
        except OSError as e:
            raise UserError(f"cannot read {self.path} ({short_error(e)}); fix or move the file, then resume") from None
        for line in io.BytesIO(raw):  # a line at a time (splitlines would hold a second copy of the file)
            try:
                record = json_loads(line.decode("utf-8"))
            except ValueError:  # not UTF-8 (UnicodeDecodeError is a ValueError) or not JSON (nested too deep too)
                dropped += bool(line.strip())
                continue
            if isinstance(record, dict) and type(record.get("iter")) is int and record["iter"] <= iter_num:  # not a bool
                kept.append(json.dumps(record, allow_nan=False) + "\n")
                records.append(record)
        if dropped:
            print(f"note: {self.path}: dropped {dropped} damaged line(s) (not UTF-8 JSON); the other records are kept",
                  flush=True)
        atomic_write_bytes(self.path, "".join(kept).encode("utf-8"))
        self.kept = records
        return records

    def append(self, iter_num: int, values: dict[str, Any]) -> None:
        if not self.active or not values:
            return
        record = {"iter": iter_num, **{k: _plain(v) for k, v in values.items()}}
        try:
            with open_own(self.path, "a", encoding="utf-8") as f:  # never through a link
                f.write(json.dumps(record, allow_nan=False) + "\n")
        except OSError as e:
            raise UserError(f"cannot append to {self.path} ({short_error(e)}); free some space or fix the file, then "
                            "rerun the same command to resume") from None


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


class Progress:
    """What the user watches: tqdm's bar when stdout is a terminal; otherwise (nohup, SLURM, CI) one
    plain line per logged step, since a bar's carriage-return frames would fill a log file."""

    def __init__(self, total: int, initial: int, *, active: bool = True, interactive: bool | None = None):
        self.interactive = _is_terminal(sys.stdout) if interactive is None else interactive
        self.active = active
        self.bar = tqdm(total=total, initial=initial, dynamic_ncols=True, desc="train") \
            if active and self.interactive else None

    def update(self) -> None:
        if self.bar is not None:
            self.bar.update(1)

    def total(self, n: int) -> None:
        """The steps the run will take, once the plan's schedule is decided."""
        if self.bar is not None:
            self.bar.total = n

    def show(self, step: int, text: str) -> None:
        if self.bar is not None:
            self.bar.set_postfix_str(text, refresh=False)
        elif self.active:
            print(f"iter {step}: {text}", flush=True)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()


def _is_terminal(stream) -> bool:
    """A closed stream (None: the process started with it closed) or one closed since is no terminal."""
    try:
        return stream is not None and stream.isatty()
    except (OSError, ValueError):
        return False


class Console(io.TextIOBase):
    """sys.stdout while a run trains. The console log is a courtesy (metrics.jsonl and the checkpoints
    are the record), so it never ends a run: a stdout closed at start (`>&-`, sys.stdout None) is a sink,
    and one whose writes fail (a full disk behind `> log.txt`, /dev/full, a pipe whose reader left) is
    given up after one warning on stderr, and the run goes on."""

    def __init__(self, stream):
        self.stream = stream  # None: discard everything

    def writable(self) -> bool:
        return True

    def isatty(self) -> bool:
        return _is_terminal(self.stream)

    @property
    def encoding(self) -> str:  # tqdm picks its bar's characters by it
        return getattr(self.stream, "encoding", None) or "utf-8"

    def fileno(self) -> int:
        if self.stream is None:
            raise io.UnsupportedOperation("stdout is closed")
        return self.stream.fileno()

    def write(self, text: str) -> int:
        if self.stream is not None:
            try:
                self.stream.write(text)
            except OSError as e:
                self._give_up(e)
        return len(text)

    def flush(self) -> None:
        if self.stream is not None:
            try:
                self.stream.flush()
            except OSError as e:
                self._give_up(e)

    def _give_up(self, e: OSError) -> None:
        failed, self.stream = self.stream, None
        point_at_devnull(failed)
        to_stderr(f"warning: cannot write to stdout ({short_error(e)}); training goes on without console output: "
                  "metrics.jsonl and the checkpoints in the out_dir record the run")


@contextmanager
def console_guard():
    """For the block, sys.stdout is a Console over the real one (see there); restored after."""
    saved = sys.stdout
    sys.stdout = Console(saved)
    try:
        yield
    finally:
        sys.stdout = saved
