"""What a source yields: `Piece`s of documents, the `Source` that reads them, and where a long document is cut.

A source yields `Piece`s. `new_doc` marks the first piece of a document and carries `pos`, the point
from which `read(pos)` starts again at that document (what a resumed prepare continues from).
`advance` is how far the progress bar moves (the file's own bytes for files, a compressed one's
too, as the Source's total counts them; rows for HF datasets). `split` is 0
(train) or 1 (val) where the source decides it (the tail of a single text file, a separate val
source), None where the builder decides by a hash of the document. Long documents come in pieces of
about CHUNK_CHARS characters so that memory stays bounded whatever the corpus size.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator, NamedTuple

CHUNK_CHARS = 1 << 20  # characters per piece handed to the tokenizer


class Piece(NamedTuple):
    new_doc: bool
    text: str
    advance: int
    pos: Any = None  # on a document's first piece: where read() starts again at this document
    split: int | None = None  # 0 train, 1 val, None: by the document's hash


@dataclass
class Source:
    slug: str  # readable, filesystem-safe name for the prepared dir
    identity: dict[str, Any]  # what the fingerprint covers: changes here mean the data changed
    total: int | None  # progress-bar total, None when unknown (streaming)
    unit: str  # progress-bar unit
    read: Callable[[Any], Iterator[Piece]]  # read(None) from the start, read(pos) from a document's pos
    files: list[Path] | None = None  # local files: their CONTENT joins the identity (see fingerprint.py)
    skipped: list = field(default_factory=list)  # bad rows skipped (data.skip_bad_rows): (file, row, why)

    def pieces(self) -> Iterator[Piece]:
        return self.read(None)


def safe_slug(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9._]+", "-", name).strip("-.") or "data"


# --- text splitting -------------------------------------------------------------------------------

# Places where cutting a text in two gives the same tokens as encoding it whole: after a newline, or
# before a space, that sits between two non-whitespace characters. In the pre-tokenizer regexes of
# gpt2 (tested), cl100k_base and o200k_base (by reading their patterns) no piece crosses such a place
# and no lookahead reaches past it, and BPE never merges across pieces.
_CUT_AFTER_NEWLINE = re.compile(r"(?<=\S)\n(?=\S)")
_CUT_BEFORE_SPACE = re.compile(r"(?<=\S) (?=\S)")


def _cut_point(text: str, limit: int) -> int:
    """Where to cut `text` so the first part is at most `limit` characters and tokenizes unchanged."""
    lo = limit // 2  # don't make tiny pieces: look for a cut in the second half only
    for pattern, use_end in ((_CUT_AFTER_NEWLINE, True), (_CUT_BEFORE_SPACE, False)):
        last = None
        for last in pattern.finditer(text, lo, limit):
            pass
        if last is not None:
            return last.end() if use_end else last.start()
    # No newline or space for limit/2 characters (not prose): cut anyway, which may change the
    # tokens at this one seam but keeps memory bounded.
    return limit


def first_cut_after(text: str, start: int) -> int:
    """The first safe cut point at or after `start`; else the last one before it (a short text); else `start`
    itself (no space or newline at all: the tokens may change at this one seam)."""
    cuts = [m.end() if p is _CUT_AFTER_NEWLINE else m.start()
            for p in (_CUT_AFTER_NEWLINE, _CUT_BEFORE_SPACE) for m in p.finditer(text)]
    after = [c for c in cuts if c >= start]
    return min(after) if after else max(cuts, default=start)


def split_off(text: str) -> tuple[list[str], str]:
    """Cut pieces of at most CHUNK_CHARS off the front of `text` while it is longer; return them and the rest."""
    pieces = []
    while len(text) > CHUNK_CHARS:
        cut = _cut_point(text, CHUNK_CHARS)
        pieces.append(text[:cut])
        text = text[cut:]
    return pieces, text


def doc_pieces(text: str, advance: int, pos: Any, split: int | None) -> Iterator[Piece]:
    parts, rest = split_off(text)
    for i, part in enumerate(parts + [rest]):
        yield Piece(i == 0, part, advance if i == 0 else 0, pos if i == 0 else None, split)
