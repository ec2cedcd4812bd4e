"""Directory locks, and the temp files of writers that died.

    lock = DirLock(out_dir / ".train.lock", "train.py").acquire()   # one holder at a time, across processes
    remove_stale_temps(out_dir)                                      # what killed writers left (fileio's temp names)

A lock file names its holder by pid and process start time, so a pid reused by an unrelated process does
not keep a dead holder's lock (pid_alive). Split from fileio.py, which writes files; this decides whose
they are.
"""
from __future__ import annotations

import json
import os
import shutil
import socket
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Iterable, Iterator

import fileio
from bounded import read_own
from errors import UserError, short_error, write_fix
from fileio import TEMP_NAME, _start_time, fsync_dir, json_loads, temp_name

try:
    import fcntl  # POSIX: DirLock's guard
except ImportError:  # Windows
    fcntl = None

def pid_alive(pid: int, start_time: str | None = None) -> bool:
    if not 0 < pid < 1 << 31:  # no process has it (0 and -n would name process groups, a huge one overflows kill)
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # alive, another user's
        return True
    return start_time is None or _start_time(pid) in (None, start_time)


def stale_temps(directory: str | os.PathLike, name: str | None = None) -> list[tuple[Path, int]]:
    """The temp files and temp directories (temp_name's names) in `directory` whose writer is gone, e.g.
    killed with -9 mid-write, with their sizes in bytes. A writer is gone when no process of this host
    has its pid, or when the process that has it now started at another time than the one recorded in
    the name (the pid was reused). Temps of live writers are left out. `name`: only the temps of that
    final name (a file or directory beside others that are not ours)."""
    out = []
    for path in Path(directory).glob(".*.tmp"):
        m = TEMP_NAME.match(path.name)
        if not m or (name is not None and m["final"] != name):
            continue
        start = m["start"] if m["start"] not in (None, "0") else None
        if not pid_alive(int(m["pid"]), start):
            out.append((path, _size(path)))
    return out


def temps_of(directory: str | os.PathLike, names: Iterable[str]) -> list[tuple[Path, int]]:
    """Every temp (temp_name's names) in `directory` of one of the final `names`, whoever wrote it, with
    its size: for the holder of a lock that makes it the only writer of those names, to whom each such temp
    is an orphan, even one whose name carries a live pid (reused, or an older name without a start time)."""
    names = set(names)
    return [(path, _size(path)) for path in Path(directory).glob(".*.tmp")
            if (m := TEMP_NAME.match(path.name)) and m["final"] in names]


def _size(path: Path) -> int:
    try:
        if path.is_dir() and not path.is_symlink():
            return sum(f.stat().st_size for f in path.rglob("*") if f.is_file() and not f.is_symlink())
        return path.lstat().st_size
    except OSError:
        return 0


def remove_temp(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path, ignore_errors=True)
    else:
        path.unlink(missing_ok=True)


def remove_stale_temps(directory: str | os.PathLike, name: str | None = None) -> list[Path]:
    """Delete stale_temps(directory, name); a live writer's temps are left alone."""
    stale = [path for path, _ in stale_temps(directory, name)]
    for path in stale:
        remove_temp(path)
    return stale


class DirLock:
    """An exclusive lock on a directory: the file `<directory>/<name>` holds its owner's pid, host and
    start time. It is written whole to a temp file, then hard-linked to its name: the link fails when the
    name exists, so exactly one process creates it, and no reader ever sees it half-written. A lock
    whose owner is gone (same host, no such process, or the pid now belongs to a later process) is taken
    over by replacing it, under a kernel lock (flock) on the directory so that two processes taking over
    the same stale lock don't both get it (where flock is unavailable, e.g. NFS or Windows, that one case
    is unguarded). A lock held by a live process, or by one on another host (which can't be checked from
    here), is `holder()`. Where the filesystem has no hard links, the file is created with O_EXCL and
    written after, and an unreadable lock younger than TORN_GRACE_S counts as held (its writer may be
    between the two)."""

    TORN_GRACE_S = 10.0
    MAX_BYTES = 1 << 20  # a lock is one line of JSON (a pid, a host, a time, what the holder does): ~150 bytes

    def __init__(self, directory: str | os.PathLike, name: str = ".lock", what: str = ""):
        self.path = Path(directory) / name
        self.what = what  # what the holder does under it, in words (recorded: a waiter's line says it)
        self.held = False
        self._me: dict = {}

    def holder(self) -> dict | None:
        """Who holds the lock ({"pid", "host", "started", "since"}), or None when it is free or stale. A lock
        file that is a symlink is refused (fileio.link_refusal): it is neither read nor written through."""
        if self.path.is_symlink():
            raise fileio.link_refusal(self.path)
        try:  # bounded: a huge file at the lock's name is refused in one line, not read (nor replaced)
            raw = read_own(self.path, "a lock (one line of JSON naming the process that holds it)", limit=self.MAX_BYTES,
                           fix="no run of ours wrote it: move it away, then rerun")
            age = time.time() - self.path.stat().st_mtime
        except OSError:  # none (or unreadable): nobody holds it
            return None
        try:
            info = json_loads(raw)
        except ValueError:
            info = None
        if not isinstance(info, dict) or not isinstance(info.get("host"), str) or type(info.get("pid")) is not int:
            # torn: being written (no hard links), or left by a crash long ago (or not a lock of ours at all)
            return {"pid": "?", "host": "?", "since": "a moment ago"} if age < self.TORN_GRACE_S else None
        if info["host"] == socket.gethostname() and not pid_alive(info["pid"], info.get("started")):
            return None
        return info

    def try_acquire(self) -> dict | None:
        """Take the lock: None on success, else the live holder's info."""
        me = {"pid": os.getpid(), "host": socket.gethostname(), "started": _start_time(os.getpid()),
              "since": time.strftime("%Y-%m-%d %H:%M:%S"), **({"what": self.what} if self.what else {})}
        data = json.dumps(me).encode()
        tmp = temp_name(self.path)
        try:
            fileio.write_synced(tmp, data)  # (through the module: a test makes the disk full)
            if not self._create(tmp, data):  # there is a lock file: live, or stale and taken over
                with _flocked(self.path.parent):
                    holder = self.holder()
                    # None is also a lock released since: then another process may create it (without the
                    # flock) right now, and replacing it would make two holders. So create it exclusively
                    # again; only a lock file still there and still stale is replaced (no other process
                    # removes one but under this flock).
                    if holder is None and not self._create(tmp, data):
                        holder = self.holder()
                        if holder is None:
                            os.replace(tmp, self.path)  # a stale lock, replaced whole
                    if holder is not None:
                        return holder
            fsync_dir(self.path.parent)
        except OSError as e:  # a full disk: one line, no lock file of ours left behind
            raise UserError(f"cannot write the lock file {self.path} ({short_error(e)}); "
                            f"{write_fix(e, 'choose another directory than ' + str(self.path.parent))}, then rerun") from None
        finally:
            tmp.unlink(missing_ok=True)
        self.held, self._me = True, me
        return None

    def _create(self, tmp: Path, data: bytes) -> bool:
        """Create the lock file exclusively, whole (a hard link to `tmp`); False when it exists."""
        try:
            os.link(tmp, self.path)
        except FileExistsError:
            return False
        except OSError:  # no hard links here: create exclusively, then write
            try:
                fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
            except FileExistsError:
                return False
            with os.fdopen(fd, "wb") as f:
                f.write(data)
        return True

    def release(self) -> None:
        """Remove the lock file, if it is still ours (never another process's that took over meanwhile)."""
        if self.held:
            try:
                info = self.holder() or {}
            except UserError:  # the lock file was swapped for a link meanwhile: not ours to remove
                info = {}
            if (info.get("pid"), info.get("started")) == (self._me["pid"], self._me["started"]):
                self.path.unlink(missing_ok=True)
            self.held = False


@contextmanager
def _flocked(directory: Path, wait_s: float = 5.0) -> Iterator[None]:
    """An exclusive flock on `directory` for the block, waited for at most `wait_s` (then the block runs
    unguarded rather than hang on whatever else holds it): what makes DirLock's take-over of a stale lock
    one step between processes. Released by the kernel if this process dies, so it is never stale. Where
    flock is unavailable (no fcntl, or a filesystem that refuses it on a directory), the block runs unguarded."""
    try:
        fd = os.open(directory, os.O_RDONLY) if fcntl is not None else None
    except OSError:
        fd = None
    if fd is None:
        yield
        return
    try:
        deadline = time.monotonic() + wait_s
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() > deadline:
                    break
                time.sleep(0.01)
            except OSError:
                break
        yield
    finally:
        os.close(fd)  # releases the flock


