"""Reading a prepared dir's tokens the plain way (json + numpy), for tests: independent of data/."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np


def read_split(d: Path, split: str) -> list[int]:
    """A split's token stream: its shards in manifest order (format 2), or <split>.bin (format 1)."""
    meta = json.loads((Path(d) / "meta.json").read_text())
    if meta["format_version"] == 1:
        return np.fromfile(Path(d) / f"{split}.bin", dtype=meta["dtype"]).tolist()
    return [t for sh in meta["shards"][split] for t in np.fromfile(Path(d) / sh["name"], dtype=meta["dtype"]).tolist()]


def first_file(d: Path, split: str) -> Path:
    """The first token file of a split."""
    meta = json.loads((Path(d) / "meta.json").read_text())
    return Path(d) / (f"{split}.bin" if meta["format_version"] == 1 else meta["shards"][split][0]["name"])


def read_bins(d: Path) -> tuple[list[int], list[int]]:
    return read_split(d, "train"), read_split(d, "val")


def split_on(ids: list[int], eot: int) -> list[list[int]]:
    """The documents of a token stream joined by eot."""
    docs, cur = [], []
    for t in ids:
        if t == eot:
            docs.append(cur)
            cur = []
        else:
            cur.append(t)
    return docs + [cur] if ids else []


def tail_cut(text: str, fraction: float) -> int:
    """Where the val tail of a one-document text starts, by data/README.md's rule: the first place at or
    after the last `fraction` of its UTF-8 bytes where a newline or a space sits between two non-space
    characters (after the newline, before the space); in a short text with no such place, the last one before."""
    raw = text.encode("utf-8")
    at = len(raw[: len(raw) - int(len(raw) * fraction)].decode("utf-8", errors="ignore"))
    cuts = [j + 1 if text[j] == "\n" else j for j in range(1, len(text) - 1)
            if text[j] in "\n " and not text[j - 1].isspace() and not text[j + 1].isspace()]
    after = [c for c in cuts if c >= at]
    return min(after) if after else max(cuts, default=at)  # a short text: its last cut; none: the byte itself
