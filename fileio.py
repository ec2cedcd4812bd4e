"""Crash-safe file writing, shared by checkpoints, HF export and data preparation.

Every file the project writes for keeps goes through `atomic_write`: the bytes go to a fresh temp file
beside the target (same filesystem, so the rename is atomic), which is fsynced and then renamed over
the target with os.replace, and the directory is fsynced. A crash at any moment leaves either the old
file or the new one, never a half-written one. Temp names are unique per writer
(`.<name>.<pid>-<start time>.<random>.tmp`), so two writers never share or delete each other's temp file, and the
files of a writer killed mid-write can be told apart and removed (`remove_stale_temps`).

Also here: `DirLock`, one process at a time in a directory (a training run's out_dir, a prepared data
dir), and `check_writable_dir`, the start-up check of a directory the run will write.
"""
from __future__ import annotations

import json
import os
import re
import secrets
import shutil
import socket
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

from errors import UserError, short_error, write_fix

try:
    import fcntl  # POSIX: DirLock's guard
except ImportError:  # Windows
    fcntl = None


def temp_name(final: str | os.PathLike) -> Path:
    """A fresh temp name beside `final`: `.<name>.<pid>-<start>.<random>.tmp`, where <start> is this
    process's start time, so that a temp left by a killed writer is told apart even once its pid has been
    reused by another process (stale_temps)."""
    final = Path(final)
    me = f"{os.getpid()}-{_start_time(os.getpid()) or 0}"
    return final.with_name(f".{final.name}.{me}.{secrets.token_hex(4)}.tmp")


def temp_path(final: str | os.PathLike) -> Path:
    """A new, empty, hidden temp file beside `final` (temp_name)."""
    path = temp_name(final)
    # Not tempfile.mkstemp: its files are 0600, and our outputs should get the usual umask mode.
    os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666))
    return path


def temp_dir(final: str | os.PathLike) -> Path:
    """A new, empty temp directory beside `final` (temp_name), to fill and then rename to `final`."""
    path = temp_name(final)
    path.mkdir()
    return path


def fsync_file(path: str | os.PathLike) -> None:
    with open(path, "rb+") as f:
        os.fsync(f.fileno())


def fsync_dir(path: str | os.PathLike) -> None:
    """Make renames inside `path` durable (a no-op where directories cannot be opened)."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def point_at_devnull(stream) -> None:
    """`stream`'s descriptor now leads to /dev/null, so that what its buffer still holds is flushed there at
    exit (a failing final flush prints a traceback-like note and exits 120), and child processes inheriting
    it write nowhere instead of failing. Nothing for a stream with no descriptor (closed, or a test's
    capture)."""
    try:
        fd = stream.fileno()
    except (AttributeError, OSError, ValueError):
        return
    devnull = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(devnull, fd)
    finally:
        os.close(devnull)


def write_synced(path: str | os.PathLike, data: bytes) -> None:
    with open(path, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())


@contextmanager
def atomic_write(final: str | os.PathLike) -> Iterator[Path]:
    """Yield a fresh temp path beside `final`; write the whole file there inside the block.

    Leaving the block normally fsyncs the temp file, renames it over `final` and fsyncs the directory.
    An exception (a full disk, Ctrl-C) removes the temp file and leaves `final` as it was.
    """
    final = Path(final)
    tmp = temp_path(final)
    try:
        yield tmp
        fsync_file(tmp)
        os.replace(tmp, final)
    finally:
        tmp.unlink(missing_ok=True)
    fsync_dir(final.parent)


def replaced_name(final: str | os.PathLike) -> Path:
    """Where replace_dir keeps the directory it replaces while the new one moves in."""
    final = Path(final)
    return final.with_name(f".{final.name}.replaced")


def replace_dir(tmp: str | os.PathLike, final: str | os.PathLike) -> None:
    """Move the complete directory `tmp` (from temp_dir) to `final`, replacing the one there. A rename
    cannot replace a non-empty directory, so the old one first moves aside (replaced_name) and is
    removed once the new one is in place. A crash between the two renames leaves no `final` but the
    old one aside, whole: `recover_replaced_dir` (readers and the next writer) takes it back."""
    tmp, final, aside = Path(tmp), Path(final), replaced_name(final)
    fsync_dir(tmp)
    if aside.exists():
        shutil.rmtree(aside)
    if final.exists():
        os.rename(final, aside)
    os.rename(tmp, final)
    fsync_dir(final.parent)
    shutil.rmtree(aside, ignore_errors=True)


def recover_replaced_dir(final: str | os.PathLike, *, repair: bool = True) -> Path | None:
    """The directory `final` stands for after a replace_dir killed midway: `final` itself when it
    exists (a leftover old copy is removed when `repair`), else the old copy set aside (moved back
    when `repair`), else None."""
    final, aside = Path(final), replaced_name(final)
    if final.exists():
        if repair and aside.exists():
            shutil.rmtree(aside, ignore_errors=True)
        return final
    if aside.is_dir():
        if not repair:
            return aside
        os.rename(aside, final)
        return final
    return None


def atomic_write_bytes(final: str | os.PathLike, data: bytes) -> None:
    with atomic_write(final) as tmp:
        write_synced(tmp, data)


# ------------------------------------------------------------------------------------------ locks, leftovers

# what temp_name makes; the start time is absent from names written by earlier versions
TEMP_NAME = re.compile(r"^\.(?P<final>.+)\.(?P<pid>\d+)(?:-(?P<start>\d+))?\.[0-9a-f]{8}\.tmp$")


def _start_time(pid: int) -> str | None:
    """The process's start time (/proc/<pid>/stat field 22), which tells a reused pid from its first owner;
    None when the process does not exist (or where /proc is not available)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[19]
    except (OSError, IndexError):
        return None


process_start_time = _start_time  # public: what DirLock and data.build.hold_data record beside a pid


def pid_alive(pid: int, start_time: str | None = None) -> bool:
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

    def __init__(self, directory: str | os.PathLike, name: str = ".lock"):
        self.path = Path(directory) / name
        self.held = False
        self._me: dict = {}

    def holder(self) -> dict | None:
        """Who holds the lock ({"pid", "host", "started", "since"}), or None when it is free or stale."""
        try:
            raw = self.path.read_bytes()
            age = time.time() - self.path.stat().st_mtime
        except OSError:  # none (or unreadable): nobody holds it
            return None
        try:
            info = json.loads(raw)
        except ValueError:
            info = None
        if not isinstance(info, dict):  # torn: being written (no hard links), or left by a crash long ago
            return {"pid": "?", "host": "?", "since": "a moment ago"} if age < self.TORN_GRACE_S else None
        if info.get("host") == socket.gethostname() and not pid_alive(int(info.get("pid", -1)), info.get("started")):
            return None
        return info

    def try_acquire(self) -> dict | None:
        """Take the lock: None on success, else the live holder's info."""
        me = {"pid": os.getpid(), "host": socket.gethostname(), "started": _start_time(os.getpid()),
              "since": time.strftime("%Y-%m-%d %H:%M:%S")}
        data = json.dumps(me).encode()
        tmp = temp_name(self.path)
        try:
            write_synced(tmp, data)
            if not self._create(tmp, data):  # there is a lock file: live, or stale and taken over
                with _flocked(self.path.parent):
                    holder = self.holder()
                    if holder is not None:
                        return holder
                    os.replace(tmp, self.path)  # a stale lock, replaced whole
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
            info = self.holder() or {}
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


def read_user_file(path: str | os.PathLike, what: str, *, fix: str, limit: int) -> bytes:
    """The bytes of a file the user named (a prompt, a data file), at most `limit` of them. Every problem
    is a one-line UserError: `{what} {path}` and the problem, then `fix` where the file is missing. The
    read is bounded, so /dev/zero or a huge file is refused after `limit` bytes, not read to the end."""
    p = Path(path).expanduser()
    try:
        with open(p, "rb") as f:
            data = f.read(limit + 1)
    except FileNotFoundError:
        raise UserError(f"{what} {p} does not exist; {fix}") from None
    except IsADirectoryError:
        raise UserError(f"{what} {p} is a directory; pass a file") from None
    except OSError as e:
        raise UserError(f"cannot read {what} {p} ({e.strerror or short_error(e)}); check its permissions") from None
    if len(data) > limit:
        raise UserError(f"{what} {p} is larger than {limit / 2**20:.0f} MiB, the most this reads; pass a smaller file")
    return data


def check_writable_dir(path: str | os.PathLike, what: str) -> None:
    """Make sure `path` is (or can be created as) a directory this process can write; else a one-line
    UserError naming `what` (the option that set it) and the fix. Checked at start, before any work."""
    path = Path(path)
    try:
        path.mkdir(parents=True, exist_ok=True)
    except FileExistsError:
        raise UserError(f"{what}={path} is a file, not a directory; choose another {what}") from None
    except NotADirectoryError:
        raise UserError(f"{what}={path} lies under a file, not a directory; choose another {what}") from None
    except OSError as e:
        raise UserError(f"cannot create {what}={path} ({short_error(e)}); choose another {what}") from None
    if not path.is_dir():
        raise UserError(f"{what}={path} is not a directory; choose another {what}")
    try:
        probe = temp_path(path / ".write-probe")
        probe.unlink()
    except OSError as e:
        raise UserError(f"{what}={path} is not writable ({short_error(e)}); fix its permissions or choose another "
                        f"{what}") from None
