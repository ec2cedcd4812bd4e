"""Random windows of a prepared split as (x, y) batches, reproducible from (seed, step) alone."""
from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import torch

from errors import EntryMismatch, UserError, clipped

from .manifest import load_meta, shard_files
from .shards import SPLITS

# SplitMix64 constants: its n-th output is _mix64(state + n * _GOLDEN), so any output can be computed
# directly from its index, which makes it a counter-based generator.
CHECK_ALL, CHECK_BLOCK = 64 << 20, 64 << 10  # the token-range check: see BatchLoader._check_token_range
_GOLDEN = np.uint64(0x9E3779B97F4A7C15)
_M1 = np.uint64(0xBF58476D1CE4E5B9)
_M2 = np.uint64(0x94D049BB133111EB)


def _mix64(x: np.ndarray) -> np.ndarray:
    x = (x ^ (x >> np.uint64(30))) * _M1
    x = (x ^ (x >> np.uint64(27))) * _M2
    return x ^ (x >> np.uint64(31))


def _check_int(name: str, value, minimum: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise UserError(f"{name} must be a whole number >= {minimum}, got {value!r}; set it to {minimum} or more")


class StepLoader:
    """What every loader of ours shares (BatchLoader: windows of documents; data/chat_loader.py's
    ChatBatchLoader: whole conversations): its integers checked once, the rows of (step, micro_step) as a
    pure function of (seed, split, step, global sample index), the hand-off to the device, and the state a
    checkpoint keeps of it. A subclass sets `_path`, the folder its checkpoint state names."""

    def __init__(self, data_dir: str | os.PathLike, split: str, *, block_size: int, batch_size: int, seed: int,
                 rank: int, world_size: int, device: str | torch.device):
        if split not in SPLITS:
            raise UserError(f"unknown split {split!r}; use one of {', '.join(SPLITS)}")
        _check_int("block_size", block_size, 1)
        _check_int("batch_size", batch_size, 1)
        _check_int("seed", seed, 0)
        _check_int("world_size", world_size, 1)
        if isinstance(rank, bool) or not isinstance(rank, int) or not 0 <= rank < world_size:
            raise UserError(f"rank must be a whole number in [0, {world_size}), got {rank!r}; check the launcher's RANK and WORLD_SIZE")
        self.meta = load_meta(data_dir)
        self.split, self.block_size, self.batch_size, self.seed = split, block_size, batch_size, seed
        self.rank, self.world_size, self.device = rank, world_size, torch.device(device)
        self._split_id = SPLITS.index(split)

    def draw(self, step: int, micro_step: int, n: int) -> np.ndarray:
        """Each of this rank's rows at (step, micro_step) as an index in [0, n)."""
        # One SeedSequence hash per call turns (seed, split, step) into a well-mixed key; the rows then
        # index a SplitMix64 stream with that key by their global sample index.
        key = np.random.SeedSequence([self.seed, self._split_id, step]).generate_state(1, np.uint64)[0]
        first = (micro_step * self.world_size + self.rank) * self.batch_size
        index = np.arange(first, first + self.batch_size, dtype=np.uint64)
        # the modulo bias is below n / 2**64: nothing for any real corpus
        return (_mix64(key + (index + np.uint64(1)) * _GOLDEN) % np.uint64(n)).astype(np.int64)

    def to_device(self, x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        if self.device.type == "cuda":
            return x.pin_memory().to(self.device, non_blocking=True), y.pin_memory().to(self.device, non_blocking=True)
        return x.to(self.device), y.to(self.device)

    def state_dict(self) -> dict:
        """Plain values for a checkpoint; the step itself lives in the training loop's state. The data is
        identified by its tokens (meta.json's tokens_sha256), so a resume checks it trains on the same
        tokens, whatever happened to the source files' timestamps."""
        return {"tokens_sha256": self.meta["tokens_sha256"], "split": self.split, "seed": self.seed}

    def load_state_dict(self, state: dict) -> None:
        """A checkpoint's state of this loader, each cause of a refusal named: an entry that cannot be read (not a
        dict, a field missing or of the wrong kind) is the ValueError naming the field that the checkpointer
        calls malformed; a readable one of other tokens or of another split is an EntryMismatch saying which."""
        if not isinstance(state, dict):
            raise ValueError(f"a {type(state).__name__}, not the dict of tokens_sha256, split and seed")
        sha, split, seed = (state.get(k) for k in ("tokens_sha256", "split", "seed"))
        for name, value, ok, kind in (("tokens_sha256", sha, isinstance(sha, str), "a fingerprint (a string)"),
                                      ("split", split, isinstance(split, str), "a split's name"),
                                      ("seed", seed, type(seed) is int and seed >= 0, "a whole number >= 0")):
            if not ok:
                raise ValueError(f"{name} is {'missing' if name not in state else clipped(value)}, not {kind}")
        if sha != self.meta["tokens_sha256"]:
            raise EntryMismatch(
                f"the checkpoint was trained on different data than {self._path} holds (tokens fingerprint "
                f"{sha[:12]} vs {self.meta['tokens_sha256'][:12]}); resume with the same data, or start a new run"
            )
        if split != self.split:
            raise EntryMismatch(f"its loader state is the {split!r} split's, not the {self.split!r} split's this "
                                "loader reads (a checkpoint edited or put together by hand); use another checkpoint, "
                                "or start a new run")
        self.seed = seed


class BatchLoader(StepLoader):
    """Draws `batch_size` windows of `block_size + 1` tokens per call from a split's token files (the
    shards of format v2, read through memmaps as one stream; train.bin / val.bin of format v1).

    The window of each sample is a pure function of (seed, split, step, global sample index), where
    the global index of row i on rank r at micro step m is (m * world_size + r) * batch_size + i.
    So the batches don't depend on history (resuming at step k sees what an uninterrupted run saw)
    nor on how many ranks share the global batch.
    """

    def __init__(
        self,
        data_dir: str | os.PathLike,
        split: str,
        *,
        block_size: int,
        batch_size: int,
        seed: int,
        rank: int = 0,
        world_size: int = 1,
        device: str | torch.device = "cpu",
    ):
        super().__init__(data_dir, split, block_size=block_size, batch_size=batch_size, seed=seed, rank=rank,
                         world_size=world_size, device=device)
        if self.meta.get("chat") is not None:
            raise UserError(f"{data_dir} holds conversations (data.format chat), not documents; set data.format: chat "
                            "to fine-tune on them (ChatBatchLoader), or prepare documents for pretraining")
        info = self.meta["splits"][split]
        if info["tokens"] < block_size + 1:
            raise UserError(
                f"the {split} split of {data_dir} has {info['tokens']} tokens, fewer than block_size + 1 = "
                f"{block_size + 1}; lower block_size, or prepare more text (or a larger val_fraction for val)"
            )
        self.bytes_per_token: float = info["bytes"] / info["tokens"]
        self._files = shard_files(Path(data_dir), self.meta, split)
        self._path = self._files[0][0].parent
        self._dtype = np.dtype(self.meta["dtype"])
        sizes = [p.stat().st_size // self._dtype.itemsize for p, _ in self._files]
        self._starts = np.cumsum([0] + sizes)  # where each file begins in the split's stream
        self._n_starts = info["tokens"] - block_size  # window starts 0 .. tokens - block_size - 1
        self._check_token_range()

    def _check_token_range(self) -> None:
        """Every id must be < vocab_size, or the embedding lookup fails mid-run (a file damaged or edited
        by hand, a lowered vocab_size in meta.json). Exact up to CHECK_ALL tokens a file; above that, 256
        blocks of 64k tokens spread over the file: a damaged region of a large file is found in
        milliseconds, scattered single bad ids are not (prepare checks every id as it writes them, and
        the files' checksums when a run starts)."""
        for path, _ in self._files:
            data = np.memmap(path, dtype=self._dtype, mode="r")
            if len(data) <= CHECK_ALL:
                top = int(data.max()) if len(data) else 0
            else:
                starts = np.linspace(0, len(data) - CHECK_BLOCK, 256).astype(np.int64)
                top = max(int(data[s : s + CHECK_BLOCK].max()) for s in starts)
            if top >= self.meta["vocab_size"]:
                raise UserError(f"{path} holds token id {top}, but meta.json says vocab_size {self.meta['vocab_size']}; "
                                f"the prepared data is damaged: re-run `python -m data.prepare` with the same settings")

    def offsets(self, step: int, micro_step: int = 0) -> np.ndarray:
        """Start of each row's window for this rank at (step, micro_step): counts >= 0 from the loop (the
        loader's own integers were checked once, when it was made)."""
        return self.draw(step, micro_step, self._n_starts)

    def get_batch(self, step: int, micro_step: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
        """(x, y), both int64 (batch_size, block_size), y shifted one token ahead of x."""
        return self._to_device(self._windows(self.offsets(step, micro_step)))

    def _to_device(self, windows: np.ndarray) -> tuple[torch.Tensor, torch.Tensor]:
        windows = torch.from_numpy(windows.astype(np.int64))
        return self.to_device(windows[:, :-1].contiguous(), windows[:, 1:].contiguous())

    def num_windows(self) -> int:
        """How many non-overlapping windows of block_size + 1 tokens (sharing their ends) the split holds."""
        return (self._n_starts - 1) // self.block_size + 1  # starts 0, T, 2T, ... <= n_starts - 1

    def sequential_batch(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Batch `index` of the split read in order, windows k * block_size for k in [index * batch_size,
        ...) up to num_windows(): together the batches predict every token of the split once (but the last
        < block_size + 1), which gives its exact mean loss where get_batch's random windows estimate it."""
        first = index * self.batch_size
        rows = range(first, min(first + self.batch_size, self.num_windows()))
        if not rows:
            raise ValueError(f"sequential batch {index} is past the {self.num_windows()} windows of the {self.split} split")
        return self._to_device(self._windows(np.array([k * self.block_size for k in rows], dtype=np.int64)))

    def _windows(self, starts: np.ndarray) -> np.ndarray:
        """(len(starts), block_size + 1): tokens [start, start + block_size + 1) of the split's stream for each
        start. The windows inside one file are read by one gather from one memmap of it; a window across a
        file boundary is read piece by piece. (64 windows of 257 tokens: 2.6 ms one memmap and slice each,
        0.1 ms so, on a 2-core EPYC Zen 5: a GPU step of a small model is not much longer.)"""
        # Fresh memmaps per call: a long-lived one keeps every page it touched mapped, and RSS grows over a
        # run (nanoGPT's note); opening one costs only microseconds.
        maps: dict[int, np.memmap] = {}

        def mapped(i: int) -> np.memmap:
            if i not in maps:
                maps[i] = np.memmap(self._files[i][0], dtype=self._dtype, mode="r")
            return maps[i]

        width = self.block_size + 1
        out = np.empty((len(starts), width), dtype=self._dtype)
        files = np.searchsorted(self._starts, starts, side="right") - 1
        inside = starts + width <= self._starts[files + 1]
        for i in np.unique(files[inside]):
            rows = np.nonzero(inside & (files == i))[0]
            out[rows] = mapped(int(i))[(starts[rows] - self._starts[i])[:, None] + np.arange(width)]
        for row in np.nonzero(~inside)[0]:
            start, end, i = int(starts[row]), int(starts[row]) + width, int(files[row])
            at = 0
            while start < end:
                part = mapped(i)[start - int(self._starts[i]): end - int(self._starts[i])]
                out[row, at: at + len(part)] = part
                at, start, i = at + len(part), start + len(part), i + 1
        return out
