"""A source file's bytes, plain or decompressed (.gz/.zst, through pyarrow's codecs, so no extra package is
needed), and what a compressed file holds. The file on disk stays at hand: how far into ITS bytes reading has
come is what the progress bar counts, since a source's total is its files' sizes."""
from __future__ import annotations

import io
from pathlib import Path
from typing import BinaryIO

from errors import UserError, short_error

READ_BYTES = 1 << 20


def decompressed(disk: BinaryIO, path: Path, compression: str | None) -> BinaryIO:
    """The bytes `disk` (the opened file `path`) holds: itself when plain, else a reader decompressing it,
    which closes it when closed. disk.tell() stays the file's own bytes read so far."""
    if compression is None:
        return disk
    import pyarrow as pa

    try:  # buffered: readline(limit) for JSON Lines, which pyarrow's stream lacks
        return io.BufferedReader(pa.CompressedInputStream(disk, compression))
    except (OSError, ValueError) as e:
        raise UserError(f"cannot open {path} as {compression} ({short_error(e)}); check the file") from None


def open_bytes(path: Path, compression: str | None) -> BinaryIO:
    disk = open(path, "rb")
    try:
        return decompressed(disk, path, compression)
    except BaseException:
        disk.close()
        raise


def decompressed_size(path: Path, compression: str) -> int:
    """The bytes a compressed file holds, counted by decompressing it a block at a time (memory bounded). Its
    headers cannot be trusted for this: gzip keeps the size modulo 4 GiB and only per member, and a zstd
    frame written from a stream leaves the size out."""
    size = 0
    with open_bytes(path, compression) as f:
        while block := f.read(READ_BYTES):
            size += len(block)
    return size
