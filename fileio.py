"""Crash-safe file writing, shared by checkpoints, HF export and data preparation.

Every file the project writes for keeps goes through `atomic_write`: the bytes go to a fresh temp file
beside the target (same filesystem, so the rename is atomic), which is fsynced and then renamed over
the target with os.replace, and the directory is fsynced. A crash at any moment leaves either the old
file or the new one, never a half-written one. Temp names are unique per writer
(`.<name>.<pid>.<random>.tmp`), so two writers never share or delete each other's temp file.
"""
from __future__ import annotations

import os
import secrets
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator


def temp_path(final: str | os.PathLike) -> Path:
    """A new, empty, hidden temp file beside `final`, named after it and this process's pid."""
    final = Path(final)
    path = final.with_name(f".{final.name}.{os.getpid()}.{secrets.token_hex(4)}.tmp")
    # Not tempfile.mkstemp: its files are 0600, and our outputs should get the usual umask mode.
    os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666))
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


def atomic_write_bytes(final: str | os.PathLike, data: bytes) -> None:
    with atomic_write(final) as tmp:
        write_synced(tmp, data)
