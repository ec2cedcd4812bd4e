"""Bounded reads: every file this project reads whole is read at most `limit` + 1 bytes, and one over its limit is
refused by arithmetic (a regular file's size, before a byte is read), or at byte limit + 1 where there is no size
(a device, a FIFO): never read to its end.

Two kinds of file are read whole: a file the user names (a prompt, a config: fileio.read_user_file, built on
`read_at_most`), and the small files the project keeps for itself beside its work (a folder's owner marker, a
lock, a prepared folder's manifest and its build record, a reader's record, a trained tokenizer): `read_own`.
Why: each of those was read with Path.read_bytes(), so a sparse 6 GB marker cost 6 GB of memory, then errors.py's
"out of memory; lower the batch size" line (or, with the memory to spare, it was silently replaced).
"""
from __future__ import annotations

import os
import re
import stat
from typing import Iterator

from errors import UserError


CHUNK = 1 << 20  # what one read of a file with no size takes at once
LINE_CHUNK = 1 << 14  # read_lines' reads: a chunk and its lines are in memory at once, beside the caller's line
LINE_END = re.compile(rb"\r\n|\r|\n")  # (in UTF-8 no byte of another character is \r or \n)


class TooLarge(Exception):
    """A file over the limit of its reader. Not an OSError nor a ValueError, so that no reader's "missing or
    damaged" clause takes it for a file to ignore (or to replace). `size`: its size in bytes, None where it has
    none (a device, a FIFO: more than `limit` bytes came)."""

    def __init__(self, size: int | None):
        super().__init__(size)
        self.size = size

    def words(self, limit: int) -> str:
        """Its size in words: "5,000,000 bytes", or "more than LIMIT bytes" where it has none (it kept coming)."""
        return f"{self.size:,} bytes" if self.size is not None else f"more than {limit:,} bytes"


class TooLargeError(UserError):
    """read_own's refusal: a rebuild would not fix it (the file may not be ours), so a reader that rebuilds what
    it finds damaged lets this one through."""


def opened(path: str | os.PathLike):
    """`path` open for reading as a binary file. O_NONBLOCK to open, then blocking reads: opening a FIFO that no
    process writes would wait forever (it reads as empty). A missing or unreadable file: the OSError os.open raises."""
    f = os.fdopen(os.open(path, os.O_RDONLY | os.O_NONBLOCK), "rb")
    os.set_blocking(f.fileno(), True)
    return f


def _stat_within(f, limit: int) -> os.stat_result:
    """The open file's stat; TooLarge, unread, where it is a regular file over `limit` bytes (a sparse 100 GB file)."""
    st = os.fstat(f.fileno())
    if stat.S_ISREG(st.st_mode) and st.st_size > limit:
        raise TooLarge(st.st_size)
    return st


def read_at_most(path: str | os.PathLike, limit: int) -> bytes:
    """The bytes of `path`, at most `limit` of them; TooLarge past that. A missing or unreadable file is the
    OSError os.open raises."""
    with opened(path) as f:
        st = _stat_within(f, limit)
        data = read_stream(f, limit, st.st_size if stat.S_ISREG(st.st_mode) else 0)
    if len(data) > limit:
        raise TooLarge(st.st_size if stat.S_ISREG(st.st_mode) else None)
    return data


def read_head(path: str | os.PathLike, n: int, limit: int) -> bytes:
    """The first `n` bytes of `path` (all of it where it is shorter), for a file recognised by its beginning; TooLarge
    where it is a regular file over `limit` bytes, as read_at_most (not read)."""
    with opened(path) as f:
        _stat_within(f, limit)
        return f.read(n)


class LineTooLong(Exception):
    """A line over the limit of read_lines; `number`: its line number (1-based)."""

    def __init__(self, number: int):
        super().__init__(number)
        self.number = number


def read_lines(f, limit: int, line_limit: int | None = None, *, skip_long: bool = False) -> Iterator[bytes | None]:
    """The lines of the open binary file `f` (see `opened`), ended by \\n, \\r\\n or \\r (the ends dropped), read a
    LINE_CHUNK at a time: memory holds a line and a chunk, whatever the file (a 1 GiB metrics.jsonl read whole took
    several GB; /dev/zero as a 256 MiB tasks file took 512 MiB before its refusal). At most `limit` bytes in all,
    else TooLarge: a regular file by its size before a byte is read (a sparse 100 GB file), a device or a FIFO (or a
    file growing while read) once more came. With `line_limit`, LineTooLong as soon as a line outgrows it, or, with
    `skip_long`, None in its place (its bytes dropped as they come: a reader that drops damaged lines goes on)."""
    regular = stat.S_ISREG(_stat_within(f, limit).st_mode)
    parts, held, got, number, carry = [], 0, 0, 0, b""  # the unended line's pieces and their bytes
    skipping = False  # the unended line is over line_limit (skip_long): its pieces are not kept
    while chunk := f.read(LINE_CHUNK):
        got += len(chunk)
        if got > limit:
            raise TooLarge(got if regular else None)
        data = carry + chunk if carry else chunk
        carry = data[-1:] if data.endswith(b"\r") else b""  # maybe the first half of a \r\n: read with the next chunk
        pieces = LINE_END.split(data[:len(data) - len(carry)])
        if len(pieces) > 1:  # a line ends in this chunk (pieces, not a join per chunk: a long line costs no copies)
            pieces[0] = None if skipping else b"".join(parts) + pieces[0]
            parts, held, skipping = [], 0, False
            for line in pieces[:-1]:
                number += 1
                yield _within(line, line_limit, number, skip_long)
        if not skipping:
            parts.append(pieces[-1])
            held += len(pieces[-1])
            if line_limit is not None and held > line_limit:
                if not skip_long:
                    raise LineTooLong(number + 1)
                parts, held, skipping = [], 0, True
    if held or carry or skipping:  # the last line, with no end (or ended by a lone \r)
        yield None if skipping else b"".join(parts)


def _within(line: bytes | None, line_limit: int | None, number: int, skip_long: bool) -> bytes | None:
    if line is None or line_limit is None or len(line) <= line_limit:
        return line
    if skip_long:
        return None
    raise LineTooLong(number)


def read_stream(f, limit: int, size: int = 0) -> bytes:
    """At most limit + 1 bytes of the open binary stream `f` (the caller refuses more than `limit`): read(n) takes
    n bytes of memory at once, so a stream of known `size` is read at its own size + 1, and one without (a FIFO,
    /proc, a decompressing reader, a file that grew since its size was taken) in CHUNKs, never the limit at once."""
    first = min(size + 1 if size else CHUNK, limit + 1)
    parts = [f.read(first)]
    got = len(parts[0])
    if got == first:  # all that was asked came: more may follow
        while got <= limit and (part := f.read(min(CHUNK, limit + 1 - got))):
            parts.append(part)
            got += len(part)
    return b"".join(parts)


def read_own(path: str | os.PathLike, what: str, *, limit: int, fix: str) -> bytes:
    """The bytes of a small file the project keeps for itself, `what` in words (what it should be: "a lock, one
    line of JSON"). Over `limit` bytes it is no file of ours: one line naming it, what it should be and `fix`
    (move it away, re-prepare), a TooLargeError, never a MemoryError. Missing or unreadable: the OSError open
    raises, which each reader treats by its own rule (most: as absent)."""
    try:
        return read_at_most(path, limit)
    except TooLarge as e:
        raise TooLargeError(f"{path} is {e.words(limit)}, but it should be {what}, at most {limit:,} bytes; {fix}") from None
