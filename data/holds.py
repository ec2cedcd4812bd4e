"""Who reads a prepared directory: the runs registered with hold_data (prepare refuses to rebuild a directory
under them), and the prepare lock that a build and a new reader both take."""
from __future__ import annotations

import json
import os
import socket
import time
from pathlib import Path
from typing import Callable

from bounded import read_own
from errors import UserError, to_stderr
from fileio import atomic_write_bytes, json_loads, process_start_time
from locks import DirLock, pid_alive

PREPARE_LOCK = ".prepare.lock"
READERS = ".readers"  # one file per live process reading the dir (hold_data)
READER_MAX = 1 << 20  # bytes: a reader's record is one line of JSON (~150 bytes)


def hold_data(data_dir: str | os.PathLike, what: str) -> Callable[[], None]:
    """Register this process as a reader of `data_dir` (a training run): prepare refuses to rebuild it
    while the process lives. Returns the function that unregisters it."""
    data_dir = Path(data_dir)
    check_readers_dir(data_dir)
    # not while a prepare is rebuilding it (held for a moment: another rank of the run registering)
    lock = wait_for_lock(DirLock(data_dir, PREPARE_LOCK, what="registering as a reader of"), data_dir)
    try:
        (data_dir / READERS).mkdir(exist_ok=True)
        me = data_dir / READERS / f"{socket.gethostname()}-{os.getpid()}.json"
        atomic_write_bytes(me, json.dumps({"pid": os.getpid(), "host": socket.gethostname(), "what": what,
                                           "started": process_start_time(os.getpid())}).encode())
    finally:
        lock.release()
    return lambda: me.unlink(missing_ok=True)


def live_readers(data_dir: Path) -> dict | None:
    """The first live reader of `data_dir` ({"pid", "host", "what"}), removing the records of dead ones."""
    for path in sorted((data_dir / READERS).glob("*.json")):
        try:  # bounded: a huge file there is refused in one line, not read (nor removed: it is not a record of ours)
            info = json_loads(read_own(path, "a reader's record (one line of JSON naming a run that reads this data)",
                                       limit=READER_MAX, fix="move it away, then rerun"))
            pid, host = int(info["pid"]), info["host"]
        except (OSError, ValueError, KeyError, TypeError):
            path.unlink(missing_ok=True)
            continue
        if host != socket.gethostname() or pid_alive(pid, info.get("started")):
            return info
        path.unlink(missing_ok=True)
    return None


def check_readers_dir(out: Path) -> None:
    if (out / READERS).exists() and not (out / READERS).is_dir():
        raise UserError(f"{out / READERS} is a file where the prepared data keeps a directory (of the runs reading it); "
                        f"move it away (or set data.root to another directory), then rerun")


SAY_AFTER_S = 2.0  # a wait this long is said; shorter ones (a reader registering takes milliseconds) are not


def wait_for_lock(lock: DirLock, out: Path) -> DirLock:
    """Take `out`'s prepare lock, waiting while another live process holds it (preparing the directory, or
    registering as its reader): a wait past SAY_AFTER_S is said once, with what the holder does."""
    said, start = False, time.monotonic()
    while (holder := lock.try_acquire()) is not None:
        if holder.get("host") != socket.gethostname():
            raise UserError(f"{out} is being prepared by pid {holder.get('pid')} on host {holder.get('host')} (since "
                            f"{holder.get('since')}); wait for it, or delete {lock.path} if that process is gone")
        if not said and time.monotonic() - start >= SAY_AFTER_S:
            what = holder.get("what") if isinstance(holder.get("what"), str) else "preparing"
            to_stderr(f"waiting for pid {holder.get('pid')}, which is {what} {out}")
            said = True
        time.sleep(0.5)
    return lock
