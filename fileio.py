"""Crash-safe file writing, shared by checkpoints, HF export and data preparation.

Every file the project writes for keeps goes through `atomic_write`: the bytes go to a fresh temp file
beside the target (same filesystem, so the rename is atomic), which is fsynced and then renamed over
the target with os.replace, and the directory is fsynced. A crash at any moment leaves either the old
file or the new one, never a half-written one. Temp names are unique per writer
(`.<name>.<pid>-<start time>.<random>.tmp`), so two writers never share or delete each other's temp file, and the
files of a writer killed mid-write can be told apart and removed (locks.py's `remove_stale_temps`). Only
a regular file (or a new name) is ever replaced (`output_target` says where other kinds' bytes go), and
never one a command reads (`check_output_not_input`).

Also here: bounded reads of the files a user names (`read_user_file`, on bounded.py's `read_at_most`;
`json_loads`), and `check_writable_dir`, the start-up check of a directory the run will write. Directory locks and the
temps of dead writers are locks.py's.

Two rules every writer keeps (docs/reliability.md, classes 1 and 3):
- A file the project names for itself (a marker, a lock, a log, a temp, a checkpoint, a shard, a cache) is
  never written through a symlink: `atomic_write(final)` refuses a link at `final` in one line, and
  `open_own(path, mode)` opens with O_NOFOLLOW. Only a file the user named (`--out FILE`) may be a link on
  purpose: its writer says so with `atomic_write(final, what, follow=True)`.
- Every path a user gives (an option, a config key) is checked by `check_path_value` before it is used:
  empty, a NUL byte, a name over 255 bytes, a path over 4096 bytes or bytes that are not UTF-8 are one
  line each. As an argparse type: `p.add_argument("--out", type=path_arg)` (tests enumerate those).
The gate an output goes through before anything is written is ownership.check_output, which calls both.
"""
from __future__ import annotations

import argparse
import errno
import json
import os
import re
import secrets
import shutil
import stat
import sys
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import Any, Iterable, Iterator

from bounded import TooLarge, read_at_most
from errors import UserError, short_error



def _start_time(pid: int) -> str | None:
    """The process's start time (/proc/<pid>/stat field 22), which tells a reused pid from its first owner;
    None when the process does not exist (or where /proc is not available)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[19]
    except (OSError, IndexError):
        return None


process_start_time = _start_time  # public: what DirLock and data.holds.hold_data record beside a pid


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


# the one place a file of ours is opened for writing: O_NOFOLLOW, so a link planted at its name fails (ELOOP)
NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)
_OPEN_FLAGS = {"wb": os.O_WRONLY | os.O_CREAT | os.O_TRUNC, "ab": os.O_WRONLY | os.O_CREAT | os.O_APPEND,
               "a": os.O_WRONLY | os.O_CREAT | os.O_APPEND, "r+b": os.O_RDWR}


def link_refusal(path: str | os.PathLike) -> UserError:
    """The one line for a file of the project's own found to be a symlink: it is never written through."""
    try:
        to = f" (to {os.readlink(path)})"
    except OSError:
        to = ""
    return UserError(f"{path} is a symlink{to}; this file is the project's own and is never written through a link, "
                     f"which would overwrite a file outside {Path(path).parent}: remove the link (rm {path}), then rerun")


def open_own(path: str | os.PathLike, mode: str = "wb", **kw):
    """Open a file the project names for itself (a log, a shard, a lock) for writing, never through a symlink
    (a link there is link_refusal's line). `mode`: "wb", "ab", "a" (text, `kw` for io.open) or "r+b"."""
    try:
        fd = os.open(path, _OPEN_FLAGS[mode] | NOFOLLOW, 0o666)
    except OSError as e:
        if e.errno == errno.ELOOP or os.path.islink(path):
            raise link_refusal(path) from None
        raise
    return os.fdopen(fd, mode, **kw)


def check_no_links(folder: str | os.PathLike, names: Iterable[str]) -> None:
    """Refuse, in one line, a folder whose own files (`names`: what its command writes there) include a
    symlink: checked at start, so a link is said before any work, not at the first save."""
    for name in names:
        if os.path.islink(os.path.join(folder, name)):
            raise link_refusal(Path(folder) / name)


def write_synced(path: str | os.PathLike, data: bytes, *, own: bool = True) -> None:
    """Write `data` to `path` and fsync it. `own`: a file of ours (a temp, a lock), never through a link;
    False for a file the user named that is written straight into (/dev/stdout is a link to a pipe)."""
    with (open_own(path, "wb") if own else open(path, "wb")) as f:
        f.write(data)
        f.flush()
        if stat.S_ISREG(os.fstat(f.fileno()).st_mode):  # a device or a FIFO (output_target) has nothing to sync
            os.fsync(f.fileno())


def output_target(final: str | os.PathLike, what: str = "the output", *, follow: bool = True) -> tuple[Path, bool]:
    """Where writing the file `final` goes, and whether it is written straight into (True) rather than
    replaced by a renamed temp file (False). A rename replaces whatever the name is, so it is used only
    for a regular file or a new name; every other kind is kept:
    - a symlink: its target is written (atomically, the temp beside the target), never the link replaced;
      a loop is refused;
    - a character device (/dev/null, /dev/full) or a FIFO: written straight into, since there is no file
      to replace (a FIFO only while a process reads it: writing one nobody reads would hang);
    - a directory, a socket, a block device: refused, in one line naming `what` (the option) and `final`.
    follow=False (a file of the project's own): a symlink is refused (link_refusal), never followed."""
    final = Path(final)
    try:
        st = os.lstat(final)
    except OSError:  # a new name (or one that can't be looked at: the write says why)
        return final, False
    target = final
    if not follow:  # renamed over whatever is there (never written through), except a link: said, not replaced
        if stat.S_ISLNK(st.st_mode):
            raise link_refusal(final)
        if stat.S_ISDIR(st.st_mode):
            raise UserError(f"{what} {final} is a directory, which this does not write over; move it away")
        return final, False
    if stat.S_ISLNK(st.st_mode):
        target = Path(os.path.realpath(final))
        try:
            st = os.stat(final)
        except OSError as e:  # a dangling link: its target is created (a loop: refused)
            if e.errno == errno.ELOOP:
                raise UserError(f"{what} {final} is a symlink loop; point it at a file or choose another path") from None
            return target, False
    if stat.S_ISREG(st.st_mode):
        return target, False
    # a link to a device or a pipe is written through the link itself (/dev/stdout -> /proc/self/fd/1 ->
    # "pipe:[N]", which no path resolves to)
    if stat.S_ISCHR(st.st_mode):
        return final, True
    if stat.S_ISFIFO(st.st_mode):
        _reserve_fifo(final, what)
        return final, True
    raise UserError(f"{what} {final} is {path_kind(target)}, which this does not write over; name a file")


# FIFOs probed for a reader, each kept open for writing until the output is written (release_fifo) or the
# process ends: a probe that closed its end would give the reader an end of file before the output came
_FIFO_WRITERS: dict[str, int] = {}


def _reserve_fifo(path: Path, what: str) -> None:
    key = os.path.abspath(path)
    if key in _FIFO_WRITERS:
        return
    try:  # non-blocking: fails at once (ENXIO) when no process has the FIFO open for reading
        _FIFO_WRITERS[key] = os.open(path, os.O_WRONLY | os.O_NONBLOCK)
    except OSError:
        raise UserError(f"{what} {path} is a FIFO that no process reads; start its reader first, or write to a "
                        "file") from None


def release_fifo(path: str | os.PathLike) -> None:
    """Close the writing end a probe of the FIFO `path` kept open (the output is written: the reader may end)."""
    fd = _FIFO_WRITERS.pop(os.path.abspath(path), None)
    if fd is not None:
        os.close(fd)


@contextmanager
def atomic_write(final: str | os.PathLike, what: str = "the output", *, follow: bool = False) -> Iterator[Path]:
    """Yield a fresh temp path beside `final`; write the whole file there inside the block.

    Leaving the block normally fsyncs the temp file, renames it over `final` and fsyncs the directory.
    An exception (a full disk, Ctrl-C) removes the temp file and leaves `final` as it was. What `final`
    names decides where the bytes go (output_target): a symlink's target, or straight into a device or
    a FIFO (then the path yielded is that file, and nothing is renamed); never over anything but a
    regular file. `what` names the output in a refusal. `follow`: `final` is a file the user named, which
    may be a link (or a device, a FIFO) on purpose; without it (the project's own files) a link is refused.
    """
    final, straight = output_target(final, what, follow=follow)
    if straight:
        try:
            yield final
        finally:
            release_fifo(final)
        return
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


def atomic_write_bytes(final: str | os.PathLike, data: bytes, what: str = "the output", *, follow: bool = False) -> None:
    with atomic_write(final, what, follow=follow) as tmp:
        write_synced(tmp, data, own=not follow)


def check_output_not_input(out: str | os.PathLike, inputs: Iterable[tuple[str, str | os.PathLike]], what: str) -> None:
    """An output must not be what the command reads: not one of the `inputs` ((description, path):
    files, or folders such as a sharded checkpoint), compared as files (os.path.samestat: another
    spelling, a symlink or a hard link is caught), and not inside an input folder. A one-line UserError
    naming `what` (the option) and the input; an input that does not exist is no input."""
    try:
        target = output_target(out, what)[0]
    except UserError:  # refused for its own reason when it is written; not an input either way
        return
    real = Path(os.path.realpath(target))
    try:
        out_st = os.stat(target)
    except OSError:
        out_st = None
    for description, path in inputs:
        try:
            in_st = os.stat(path)
        except OSError:
            continue
        folder = stat.S_ISDIR(in_st.st_mode)
        inside = folder and Path(os.path.realpath(path)) in real.parents
        same = out_st is not None and any(os.path.samestat(out_st, f) for f in [in_st, *(_stats(path) if folder else [])])
        if inside or same:  # (the same file under another name: a hard link to a file of a folder read)
            raise UserError(f"{what} {out} is {'inside ' if inside else ''}{description}, which this reads; writing "
                            f"there would damage it: choose another {what}")


# ------------------------------------------------------------------------------------------ path values

NAME_MAX, PATH_MAX = 255, 4096  # bytes: Linux's limits (ext4, xfs, btrfs, tmpfs), past which every call fails


def path_problem(value: str | os.PathLike) -> str | None:
    """What is wrong with a path a user gave, or None: empty (`--out ''` would be the current folder), a NUL
    byte (no system call takes one), a name over NAME_MAX bytes or a path over PATH_MAX ("File name too
    long" from the first os call, as a traceback), bytes that are not UTF-8 (argv's undecodable bytes, kept
    as surrogates, fail later in every message, log and JSON file that names the path)."""
    text = os.fspath(value)
    if isinstance(text, bytes):
        text = os.fsdecode(text)
    if text == "":
        return "is empty"
    if "\0" in text:
        return "holds a NUL byte"
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as e:
        return f"is not valid UTF-8 (byte 0x{os.fsencode(text[e.start])[0]:02x} at character {e.start})"
    raw = os.fsencode(text)
    longest = max(raw.split(b"/"), key=len)
    if len(longest) > NAME_MAX:
        return f"has a name of {len(longest)} bytes, over the {NAME_MAX} a filesystem takes"
    if len(raw) > PATH_MAX:
        return f"is {len(raw)} bytes long, over the {PATH_MAX} a system call takes"
    return None


def check_path_value(value: str | os.PathLike, option: str) -> Path:
    """`value` (from the option or config key `option`) as a Path, ~ expanded; a one-line UserError when
    path_problem finds a fault."""
    problem = path_problem(value)
    if problem:
        shown = ascii(os.fspath(value)) if len(os.fspath(value)) <= 80 else f"{ascii(os.fspath(value)[:40])}..."
        raise UserError(f"{option} {shown} {problem}; give a usable path")
    return Path(os.path.expanduser(os.fspath(value)))


def path_arg(value: str) -> str:
    """argparse `type=` of a path option: path_problem's fault is argparse's one line naming the option; ~
    expanded (the gate checks the expanded path: the command must write there, not into a folder named ~)."""
    problem = path_problem(value)
    if problem:
        raise argparse.ArgumentTypeError(f"{ascii(value) if len(value) <= 80 else ascii(value[:40]) + '...'} {problem}; "
                                         "give a usable path")
    return os.path.expanduser(value)


def file_arg(value: str) -> str:
    """path_arg for an option that writes one file: a name that spells a folder (ending in a separator, or . or
    ..) is argparse's one line, never a file written at the name without its separator."""
    path = path_arg(value)
    if os.path.basename(path) in ("", ".", ".."):
        raise argparse.ArgumentTypeError(f"{ascii(value[:80])} names a folder (by its spelling), but this option writes "
                                         "one file; name the file, e.g. samples/out.txt")
    return path


def path_arg_path(value: str) -> Path:
    """path_arg, returning a Path (for options whose code works on Paths)."""
    return Path(path_arg(value))


def optional_path_arg(value: str) -> str:
    """path_arg for an option where an empty value means "none" (its default)."""
    return value if value == "" else path_arg(value)


# what tests enumerate: every path option of every parser (empty_ok: '' is that option's "none")
path_arg.checks_path = path_arg_path.checks_path = optional_path_arg.checks_path = file_arg.checks_path = True
optional_path_arg.empty_ok = True


class _LongInteger(ValueError):
    """An integer literal past Python's int() digit limit (sys.get_int_max_str_digits)."""


def _json_int(digits: str) -> int:
    limit = sys.get_int_max_str_digits()  # (0: no limit)
    if limit and len(digits.lstrip("-")) > limit:
        raise _LongInteger(digits[:20])
    return int(digits)


def json_loads(text: str | bytes):
    """json.loads, where a document nested deeper than the parser recurses (RecursionError, a traceback)
    and an integer past int()'s digit limit (whose own text says to raise it with
    sys.set_int_max_str_digits()) are the JSONDecodeError (a ValueError) every reader of ours reports in
    one line, the integer's with its line and column."""
    try:
        return json.loads(text, parse_int=_json_int)
    except RecursionError:
        raise json.JSONDecodeError("nested too deeply", text if isinstance(text, str) else "", 0) from None
    except _LongInteger:
        limit = sys.get_int_max_str_digits()
        doc = text if isinstance(text, str) else text.decode("utf-8", "replace")  # (for the line and column)
        at = re.search(r"\d{%d}" % (limit + 1), doc)
        raise json.JSONDecodeError(f"an integer of more than {limit} digits", doc, at.start() if at else 0) from None


# what temp_name makes; the start time is absent from names written by earlier versions
TEMP_NAME = re.compile(r"^\.(?P<final>.+)\.(?P<pid>\d+)(?:-(?P<start>\d+))?\.[0-9a-f]{8}\.tmp$")


def _stats(folder: str | os.PathLike) -> Iterator[os.stat_result]:
    for f in Path(folder).rglob("*"):
        with suppress(OSError):
            yield f.stat()


def read_user_file(path: str | os.PathLike, what: str, *, fix: str, limit: int, reader=read_at_most) -> Any:
    """The bytes of a file the user named (a prompt, a data file), at most `limit` of them. Every problem
    is a one-line UserError: `{what} {path}` and the problem, then `fix` where the file is missing. The
    read is bounded (bounded.read_at_most), so /dev/zero or a huge file is refused after `limit` bytes, or
    by its size unread (a sparse 100 GB file), not read to the end. `reader(path, limit)`: another bounded read
    (one that parses as it reads: eval.chat_tasks' rows), its open and read errors said as this one's."""
    p = Path(path).expanduser()
    try:
        return reader(p, limit)
    except FileNotFoundError:
        raise UserError(f"{what} {p} does not exist; {fix}") from None
    except OSError as e:  # a directory, a socket, a symlink loop; else a permission
        if e.errno in (errno.EISDIR, errno.ENXIO, errno.ELOOP):
            raise UserError(f"{what} {p} is {path_kind(p)}; pass a file") from None
        raise UserError(f"cannot read {what} {p} ({e.strerror or short_error(e)}); check its permissions") from None
    except TooLarge as e:
        raise too_large(what, p, limit, e) from None


def too_large(what: str, path: str | os.PathLike, limit: int, e: TooLarge) -> UserError:
    """The line for a file the user named that is over what its reader takes."""
    size = f" ({e.size} bytes)" if e.size is not None else ""
    return UserError(f"{what} {path} is larger than {limit / 2**20:.0f} MiB{size}, the most this reads; pass a smaller "
                     "file")


def path_kind(path: str | os.PathLike) -> str:
    """What is at `path`, in words (for a refusal)."""
    try:
        mode = os.lstat(path).st_mode
    except OSError:
        return "missing"
    if stat.S_ISLNK(mode):
        return f"a symlink to {path_kind(os.path.realpath(path))}" if os.path.exists(path) else "a symlink to nothing (or a loop)"
    kinds = {stat.S_IFREG: "a file", stat.S_IFDIR: "a directory", stat.S_IFIFO: "a FIFO", stat.S_IFSOCK: "a socket"}
    return kinds.get(stat.S_IFMT(mode), "a device")


@contextmanager
def no_empty_dirs_left(path: str | os.PathLike) -> Iterator[None]:
    """The folders that making `path` makes (it and its missing parents, ".." and links as the OS takes them),
    removed again, deepest first, on leaving where still empty: a command refused after making its output
    folder leaves nothing. Only folders missing on entry are tried; rmdir removes only an empty one."""
    lexical = Path(os.path.expanduser(path))
    missing = {Path(os.path.realpath(prefix)) for prefix in (lexical, *lexical.parents)}
    missing = sorted((p for p in missing if not os.path.lexists(p)), key=lambda p: len(p.parts), reverse=True)
    try:
        yield
    finally:
        for folder in missing:
            with suppress(OSError):  # written to (kept), never made, or removed meanwhile
                os.rmdir(folder)


def check_writable_dir(path: str | os.PathLike, what: str) -> None:
    """Make sure `path` is (or can be created as) a directory this process can write; else a one-line
    UserError naming `what` (the option that set it) and the fix. Checked at start, before any work."""
    path = Path(path)
    try:
        path.mkdir(parents=True, exist_ok=True)
    except FileExistsError:
        raise UserError(f"{what}={path} is {path_kind(path)}, not a directory; choose another {what}") from None
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
