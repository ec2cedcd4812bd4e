"""What the loop logs: `<out_dir>/metrics.jsonl`, the progress display (a bar on a terminal, plain lines
elsewhere), and the console they print to (the window of steps each record averages: window.py).

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
import os
import sys
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator, NamedTuple

from tqdm import tqdm

from bounded import TooLarge, read_lines
from errors import UserError, point_at_devnull, short_error, to_stderr
from fileio import atomic_write, json_loads, open_own

METRICS_NAME = "metrics.jsonl"
# ~3M logged steps (a record is ~300 bytes): what a run writes is not bounded by the trainer, and a resume must
# not refuse its own run's log (256 MiB, ~1M lines, was passed in ~3 hours at log_interval 1 and 10 ms a step).
# Past it (or endless: /dev/zero) refused by its size, unread; the plot (training/plot.py) reads the same bound.
MAX_METRICS_BYTES = 1 << 30
# a record is a few hundred bytes, one with samples at most ~1 MiB (16 prompts x 1024 tokens, JSON-escaped): a longer
# line is damaged, and neither the resume nor the plot holds it
MAX_METRICS_LINE = 16 << 20


BOM = b"\xef\xbb\xbf"  # UTF-8's byte-order mark
ASCII_SPACE = " \t\n\r\v\f"  # what bytes.strip() takes away: the resume's blank line


class Damaged(NamedTuple):
    """A line of metrics.jsonl that is no text: why, in words ("not UTF-8", "over 16,777,216 bytes")."""
    why: str


def metrics_lines(f, *, bom: bool = False) -> Iterator[tuple[int, str | Damaged]]:
    """The lines of the open metrics.jsonl `f` as text, each with its number (from 1), read through bounded.read_lines:
    at most MAX_METRICS_BYTES in all (TooLarge past it: a regular file by its size, unread), and a line at a time in
    memory. A line over MAX_METRICS_LINE (none of its bytes held) or not UTF-8 comes as a Damaged; what it costs is
    the reader's (the resume drops it, the plot skips it with a note naming the line). `bom`: a UTF-8 byte-order mark
    before the first line is no data."""
    for number, raw in enumerate(read_lines(f, MAX_METRICS_BYTES, MAX_METRICS_LINE, skip_long=True), 1):
        if raw is None:
            yield number, Damaged(f"over {MAX_METRICS_LINE:,} bytes")
            continue
        try:
            line = (raw.removeprefix(BOM) if bom and number == 1 else raw).decode("utf-8")
        except UnicodeDecodeError:
            line = Damaged("not UTF-8")
        yield number, line


def _plain(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


class KeptRecords:
    """The records a resumed run kept (MetricsLog.resume_at): the first `size` bytes of metrics.jsonl, read again a
    line at a time each time they are iterated, in the file's order (step order: each session appends the steps
    past the checkpoint the file was cut at). Never held in memory: ~3M records (the 1 GiB the file may reach)
    took several GB as a list of dicts. Empty once the file is no longer the one resume_at wrote (moved away or replaced)."""

    def __init__(self, path: Path | None = None, size: int = 0, count: int = 0, ident: tuple[int, int] | None = None):
        self.path, self.size, self.count, self.ident = path, size, count, ident

    def __len__(self) -> int:
        return self.count

    def __iter__(self) -> Iterator[dict[str, Any]]:
        if not self.count:
            return
        try:
            with open(self.path, "rb") as f:
                st = os.fstat(f.fileno())
                if (st.st_dev, st.st_ino) != self.ident:
                    return
                while f.tell() < self.size and (line := f.readline(self.size - f.tell())):
                    try:
                        yield json_loads(line)
                    except ValueError:  # (a line changed under the run since: not one of the kept records)
                        continue
        except OSError:  # moved away: its records are gone with it, nothing to send
            return


class MetricsLog:
    def __init__(self, out_dir: str | Path, *, active: bool = True):
        self.path = Path(out_dir) / METRICS_NAME
        self.active = active
        self.kept = KeptRecords()  # the records a resumed run kept (resume_at): its earlier sessions
        if active and self.path.exists() and not self.path.is_file():
            raise UserError(f"{self.path} is not a file; move it away (train.py writes its metrics there)")

    def resume_at(self, iter_num: int) -> KeptRecords:
        """Keep the records up to `iter_num` (the checkpoint's): later ones are about to be redone.
        Returns the kept records (wandb_logger sends those wandb lacks), read from the file again when iterated.
        The file is rewritten a line at a time, so memory holds a line, never the file. A line that is not a
        JSON record (torn by a crash mid-write, or damaged: not UTF-8, not JSON) is dropped with a note, so a
        damaged file never makes a run unresumable; so is a record of a step at or before the one kept last (a
        file edited by hand): every step is logged once, in order."""
        if not self.active or not self.path.is_file():
            return self.kept
        count, size, dropped, unordered, last = 0, 0, 0, 0, None
        try:
            with open(self.path, "rb") as f, atomic_write(self.path) as tmp, open_own(tmp, "wb") as out:
                # by its size first: a sparse 100 GB file stays unread
                for _, line in metrics_lines(f):
                    if isinstance(line, Damaged):  # over MAX_METRICS_LINE, or not UTF-8
                        dropped += 1
                        continue
                    if not line.strip(ASCII_SPACE):  # (a line of other white space is no record: dropped below)
                        continue
                    try:  # not JSON (nested too deep too), NaN or inf (which this log never writes)
                        record = json_loads(line)
                        text = json.dumps(record, allow_nan=False) + "\n"
                    except ValueError:
                        dropped += 1
                        continue
                    if not isinstance(record, dict) or type(record.get("iter")) is not int:  # (a bool is no step)
                        dropped += 1
                    elif last is not None and record["iter"] <= last:  # every step once, in order (edited by hand)
                        unordered += 1
                    elif record["iter"] <= iter_num:  # (later ones are about to be redone)
                        size += out.write(text.encode("utf-8"))
                        count, last = count + 1, record["iter"]
        except TooLarge as e:  # (atomic_write left the file as it was)
            raise UserError(f"{self.path} is {e.words(MAX_METRICS_BYTES)}, over the {MAX_METRICS_BYTES >> 20} MiB of ~3M logged steps; "
                            "move it away (the run then logs into a new one), then resume") from None
        except OSError as e:
            raise UserError(f"cannot rewrite {self.path} ({short_error(e)}); fix or move the file (or free some space), "
                            "then resume") from None
        if dropped or unordered:
            said = [f"{dropped} damaged line(s) (not a JSON record of finite numbers, or over {MAX_METRICS_LINE >> 20} MiB)"
                    if dropped else "", f"{unordered} record(s) of a step already logged" if unordered else ""]
            print(f"note: {self.path}: dropped {' and '.join(w for w in said if w)}; the other records are kept",
                  flush=True)
        st = os.stat(self.path)
        self.kept = KeptRecords(self.path, size, count, (st.st_dev, st.st_ino))
        return self.kept

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
