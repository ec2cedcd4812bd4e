"""Batches of conversations (a prepared dir of data.format chat, chat_prep.py): one conversation per row, padded,
so no conversation attends to another (docs/chat.md says why padding and not packing), and targets -1 wherever
the loss does not train (user and system turns, markers, padding).

The conversation of each row is a pure function of (seed, split, step, global sample index), the same rule as
BatchLoader's windows, so a resumed run sees the batches of the uninterrupted one on any number of ranks.

A conversation longer than the context (block_size + 1 tokens) is cut at a turn boundary: it keeps the whole
exchanges from its start that fit. One whose first exchange alone does not fit is dropped (cutting inside a
turn would teach replies that stop mid-sentence without their <|end|>). Both are counted (`ChatIndex.note`).
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
from .loader import _GOLDEN, _check_int, _mix64
from .manifest import load_meta, shard_files
from .shards import SPLITS

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
        """Tokens [start, end), across shard boundaries (a fresh memmap each call: see BatchLoader._window)."""
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
    seps = [np.flatnonzero(stream.read(lo, min(lo + SCAN_TOKENS, stream.size)) == sep) + lo
            for lo in range(0, stream.size, SCAN_TOKENS)]
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
    usable = keep > 1  # a row needs at least one target
    return ChatIndex(starts[usable], keep[usable], len(starts), cut, dropped)


def chat_index(data_dir: str | os.PathLike, meta: dict, split: str, block_size: int) -> ChatIndex:
    return _index(str(data_dir), meta["tokens_sha256"], split, block_size)


class ChatBatchLoader:
    """BatchLoader's surface (get_batch, sequential_batch, num_windows, state_dict) over conversations: x the
    ids, y the next ids with -1 where nothing is trained; rows padded to the batch's longest conversation
    (rounded up to PAD_MULTIPLE, at most block_size)."""

    def __init__(self, data_dir: str | os.PathLike, split: str, *, block_size: int, batch_size: int, seed: int,
                 rank: int = 0, world_size: int = 1, device: str | torch.device = "cpu"):
        if split not in SPLITS:
            raise UserError(f"unknown split {split!r}; use one of {', '.join(SPLITS)}")
        for name, value, low in (("block_size", block_size, 1), ("batch_size", batch_size, 1), ("seed", seed, 0),
                                 ("world_size", world_size, 1)):
            _check_int(name, value, low)
        if isinstance(rank, bool) or not isinstance(rank, int) or not 0 <= rank < world_size:
            raise UserError(f"rank must be a whole number in [0, {world_size}), got {rank!r}; check the launcher's RANK and WORLD_SIZE")
        self.meta = load_meta(data_dir)
        self.template = chat_of_meta(self.meta, data_dir)
        if self.template is None:
            raise UserError(f"{data_dir} holds documents, not conversations; set data.format: chat (and data.messages_field, "
                            "if the messages are not in 'messages') so that train.py prepares the conversations")
        self.split, self.block_size, self.batch_size, self.seed = split, block_size, batch_size, seed
        self.rank, self.world_size, self.device = rank, world_size, torch.device(device)
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
        info = self.meta["splits"][split]
        self.bytes_per_token: float = info["bytes"] / max(info["tokens"], 1)
        self._split_id = SPLITS.index(split)
        self._pad = self.meta["eot"]  # any valid id: padding is never a target and never attended by a real token

    def conversations(self, step: int, micro_step: int = 0) -> np.ndarray:
        """Which conversation each row of this rank takes at (step, micro_step): BatchLoader.offsets' rule."""
        _check_int("step", step, 0)
        _check_int("micro_step", micro_step, 0)
        key = np.random.SeedSequence([self.seed, self._split_id, step]).generate_state(1, np.uint64)[0]
        first = (micro_step * self.world_size + self.rank) * self.batch_size
        index = np.arange(first, first + self.batch_size, dtype=np.uint64)
        n = np.uint64(len(self.index.starts))
        return (_mix64(key + (index + np.uint64(1)) * _GOLDEN) % n).astype(np.int64)

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
        x_t, y_t = torch.from_numpy(x), torch.from_numpy(y)
        if self.device.type == "cuda":
            return x_t.pin_memory().to(self.device, non_blocking=True), y_t.pin_memory().to(self.device, non_blocking=True)
        return x_t.to(self.device), y_t.to(self.device)

    def state_dict(self) -> dict:
        return {"tokens_sha256": self.meta["tokens_sha256"], "split": self.split, "seed": self.seed}

    def load_state_dict(self, state: dict) -> None:
        if state.get("tokens_sha256") != self.meta["tokens_sha256"]:
            raise UserError(
                f"the checkpoint was trained on different data than {self._path} holds (tokens fingerprint "
                f"{str(state.get('tokens_sha256'))[:12]} vs {self.meta['tokens_sha256'][:12]}); resume with the same "
                f"data, or start a new run")
        if state.get("split") != self.split:
            raise UserError(f"loader state is for the {state.get('split')!r} split, not {self.split!r}; load each loader's own state")
        _check_int("seed", state.get("seed"), 0)
        self.seed = state["seed"]
