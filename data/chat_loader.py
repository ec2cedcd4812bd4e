"""Batches of conversations (a prepared dir of data.format chat, chat_prep.py): one conversation per row, padded,
so no conversation attends to another (docs/chat.md says why padding and not packing), and targets -1 wherever
the loss does not train (user and system turns, markers, padding).

The conversation of each row is a pure function of (seed, split, step, global sample index), the same rule as
BatchLoader's windows, so a resumed run sees the batches of the uninterrupted one on any number of ranks.

A conversation longer than the context (block_size + 1 tokens) is cut at a turn boundary: it keeps the whole
exchanges from its start that fit. One whose first exchange alone does not fit is dropped (cutting inside a
turn would teach replies that stop mid-sentence without their <|end|>). Both are counted (`ChatIndex.note`).

Bits per byte: the loss is the mean over the counted targets (the assistant's content tokens and each reply's
<|end|>), so `bytes_per_token` is the UTF-8 bytes those targets spell over their number, over the conversations
as the rows take them (a cut conversation's dropped exchanges and a dropped conversation count nothing). The
manifest's split bytes (the whole conversations' JSON) and tokens (every template token) measure another text.
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

import numpy as np
import torch

from errors import UserError

from .chat_prep import chat_of_meta
from .loader import StepLoader, _check_int
from .manifest import load_meta, shard_files
from .tokenizer import tokenizer_from_meta

PAD_MULTIPLE = 16  # a batch is padded to its longest row rounded up to this: few distinct shapes for compile
SCAN_TOKENS = 1 << 24  # the conversation scan reads the stream in pieces of this many tokens


@dataclass(frozen=True)
class ChatIndex:
    """Where each usable conversation of a split starts in its stream, and how many tokens of it a row takes."""
    starts: np.ndarray  # int64
    lengths: np.ndarray  # int64, each <= block_size + 1
    total: int  # conversations in the split
    cut: int  # longer than the context, cut at a turn boundary
    dropped: int  # first exchange longer than the context
    counted_tokens: int = 0  # targets the loss counts over the usable conversations as the rows take them
    counted_bytes: int = 0  # the UTF-8 bytes those targets spell (<|end|> spells none)

    def note(self, split: str, block_size: int) -> str:
        return (f"chat data, {split} split: {self.total:,} conversations; {self.cut:,} longer than the context "
                f"(block_size + 1 = {block_size + 1} tokens) cut at a turn boundary, {self.dropped:,} dropped "
                "(their first exchange alone is longer)")


class _Stream:
    """A split's shards read as one stream of stored values (2 * id + counted)."""

    def __init__(self, files: list[Path], dtype: np.dtype):
        self.files, self.dtype = files, dtype
        sizes = [p.stat().st_size // dtype.itemsize for p in files]
        self.starts = np.cumsum([0] + sizes)
        self.size = int(self.starts[-1])

    def read(self, start: int, end: int) -> np.ndarray:
        """Tokens [start, end), across shard boundaries (a fresh memmap each call: see BatchLoader._windows)."""
        i = int(np.searchsorted(self.starts, start, side="right")) - 1
        parts = []
        while start < end and i < len(self.files):
            data = np.memmap(self.files[i], dtype=self.dtype, mode="r")
            lo = start - int(self.starts[i])
            part = np.array(data[lo: lo + end - start])
            parts.append(part)
            start += len(part)
            i += 1
        return parts[0] if len(parts) == 1 else np.concatenate(parts) if parts else np.zeros(0, self.dtype)


@lru_cache(maxsize=8)
def _index(data_dir: str, tokens_sha256: str, split: str, block_size: int) -> ChatIndex:
    """The split's conversations (found by their eot separators) fitted to the context. Cached by the data's
    tokens, so the loaders a run builds (train, eval, several micro-batch sizes) scan it once."""
    meta = load_meta(data_dir)
    template = chat_of_meta(meta, data_dir)
    stream = _Stream([p for p, _ in shard_files(Path(data_dir), meta, split)], np.dtype(meta["dtype"]))
    sep, user = 2 * meta["eot"], 2 * template.id("<|user|>")
    spelled = _stored_byte_lengths(meta, template)
    seps, counted = [], np.zeros(2, dtype=np.int64)
    for lo in range(0, stream.size, SCAN_TOKENS):
        chunk = stream.read(lo, min(lo + SCAN_TOKENS, stream.size))
        seps.append(np.flatnonzero(chunk == sep) + lo)
        counted += _counted(chunk, spelled)
    bounds = np.concatenate([[-1], *seps, [stream.size]]).astype(np.int64)
    starts, lengths = bounds[:-1] + 1, np.diff(bounds) - 1
    limit = block_size + 1
    keep = lengths.copy()
    cut = dropped = 0
    for k in np.flatnonzero(lengths > limit):
        head = stream.read(int(starts[k]), int(starts[k]) + limit + 1)
        turns = np.flatnonzero(head == user)[1:]  # where the second, third, ... exchange starts
        fits = turns[turns <= limit]
        if len(fits):
            keep[k], cut = int(fits[-1]), cut + 1
        else:
            keep[k], dropped = 0, dropped + 1
        # what no row takes of it counts toward no loss: out of the bits-per-byte ratio too
        counted -= _counted(stream.read(int(starts[k] + keep[k]), int(starts[k] + lengths[k])), spelled)
    usable = keep > 1  # a row needs at least one target
    return ChatIndex(starts[usable], keep[usable], len(starts), cut, dropped, int(counted[0]), int(counted[1]))


def _stored_byte_lengths(meta: dict, template) -> np.ndarray:
    """The UTF-8 bytes each stored value (2 * id + counted) spells where it is counted: 0 for the markers,
    eot and anything not counted. Ids at or past the table (a damaged shard, refused by the loader) read 0."""
    per_id = np.zeros(template.vocab_size, dtype=np.int64)
    lengths = tokenizer_from_meta(meta).token_byte_lengths()
    per_id[: len(lengths)] = lengths
    per_stored = np.zeros(2 * template.vocab_size, dtype=np.uint32)  # a chunk's lookup: 4 bytes a token
    per_stored[1::2] = per_id
    return per_stored


def _counted(stored: np.ndarray, spelled: np.ndarray) -> np.ndarray:
    """[counted targets, the bytes they spell] among `stored` values."""
    return np.array([int((stored & 1).sum(dtype=np.int64)),
                     int(np.take(spelled, stored, mode="clip").sum(dtype=np.int64))], dtype=np.int64)


def chat_index(data_dir: str | os.PathLike, meta: dict, split: str, block_size: int) -> ChatIndex:
    return _index(str(data_dir), meta["tokens_sha256"], split, block_size)


class ChatBatchLoader(StepLoader):
    """BatchLoader's surface (get_batch, sequential_batch, num_windows, state_dict) over conversations: x the
    ids, y the next ids with -1 where nothing is trained; rows padded to the batch's longest conversation
    (rounded up to PAD_MULTIPLE, at most block_size)."""

    def __init__(self, data_dir: str | os.PathLike, split: str, *, block_size: int, batch_size: int, seed: int,
                 rank: int = 0, world_size: int = 1, device: str | torch.device = "cpu"):
        super().__init__(data_dir, split, block_size=block_size, batch_size=batch_size, seed=seed, rank=rank,
                         world_size=world_size, device=device)
        self.template = chat_of_meta(self.meta, data_dir)
        if self.template is None:
            raise UserError(f"{data_dir} holds documents, not conversations; set data.format: chat (and data.messages_field, "
                            "if the messages are not in 'messages') so that train.py prepares the conversations")
        self._path = Path(data_dir)
        self._stream = _Stream([p for p, _ in shard_files(self._path, self.meta, split)], np.dtype(self.meta["dtype"]))
        top = 2 * self.meta["chat"]["vocab_size"]
        for lo in range(0, self._stream.size, SCAN_TOKENS):  # a damaged shard: one line, never a failed lookup
            if int(self._stream.read(lo, min(lo + SCAN_TOKENS, self._stream.size)).max(initial=0)) >= top:
                raise UserError(f"the {split} split of {data_dir} holds a token beyond the chat vocabulary; the prepared "
                                "data is damaged: re-run `python -m data.prepare` with the same settings")
        self.index = chat_index(self._path, self.meta, split, block_size)
        if not len(self.index.starts):
            raise UserError(f"the {split} split of {data_dir} has no conversation that fits block_size + 1 = "
                            f"{block_size + 1} tokens; raise model.block_size, or add shorter conversations")
        # the bytes per token of what the loss counts (see the module docstring), for bits per byte
        self.bytes_per_token: float = self.index.counted_bytes / max(self.index.counted_tokens, 1)
        self._pad = self.meta["eot"]  # any valid id: padding is never a target and never attended by a real token

    def conversations(self, step: int, micro_step: int = 0) -> np.ndarray:
        """Which conversation each row of this rank takes at (step, micro_step): BatchLoader.offsets' rule."""
        _check_int("step", step, 0)
        _check_int("micro_step", micro_step, 0)
        return self.draw(step, micro_step, len(self.index.starts))

    def get_batch(self, step: int, micro_step: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
        return self._rows(self.conversations(step, micro_step))

    def num_windows(self) -> int:
        return len(self.index.starts)

    def sequential_batch(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Conversations index * batch_size ... in order: together the batches cover the split once."""
        _check_int("index", index, 0)
        first = index * self.batch_size
        rows = np.arange(first, min(first + self.batch_size, self.num_windows()))
        if not len(rows):
            raise ValueError(f"sequential batch {index} is past the {self.num_windows()} conversations of the "
                             f"{self.split} split")
        return self._rows(rows)

    def _rows(self, convs: np.ndarray) -> tuple[torch.Tensor, torch.Tensor]:
        stored = [self._stream.read(int(s), int(s) + int(n)).astype(np.int64)
                  for s, n in zip(self.index.starts[convs], self.index.lengths[convs])]
        longest = max(len(t) for t in stored) - 1
        T = min(self.block_size, -(-longest // PAD_MULTIPLE) * PAD_MULTIPLE)
        x = np.full((len(stored), T), self._pad, dtype=np.int64)
        y = np.full((len(stored), T), -1, dtype=np.int64)
        for r, t in enumerate(stored):
            ids, counted = t >> 1, (t & 1).astype(bool)
            x[r, : len(t) - 1] = ids[:-1]
            y[r, : len(t) - 1] = np.where(counted[1:], ids[1:], -1)
        return self.to_device(torch.from_numpy(x), torch.from_numpy(y))
