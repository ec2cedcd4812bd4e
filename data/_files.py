"""Crash-safe file writing: write a temp file in the target's directory, fsync it, then os.replace."""
from __future__ import annotations

import os
import secrets
from pathlib import Path


def temp_path(final: Path) -> Path:
    """A new, empty, hidden temp file beside `final` (same filesystem, so os.replace is atomic)."""
    path = final.with_name(f".{final.name}.{secrets.token_hex(6)}.tmp")
    # Not tempfile.mkstemp: its files are 0600, and prepared data should get the usual umask mode.
    os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666))
    return path


def fsync_dir(path: Path) -> None:
    """Make renames inside `path` durable."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_synced(path: Path, data: bytes) -> None:
    with open(path, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())


def atomic_write_bytes(final: Path, data: bytes) -> None:
    tmp = temp_path(final)
    try:
        write_synced(tmp, data)
        os.replace(tmp, final)
    finally:
        tmp.unlink(missing_ok=True)
    fsync_dir(final.parent)
