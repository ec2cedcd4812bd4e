"""Writing a prepared dir's token shards (format v2): tokenized by a pool of processes, written in order,
resumable after a kill.

The main process reads the source (sources.py) and hands batches of document pieces to forked worker
processes that tokenize them (`_encode`); when they have IN_FLIGHT_PER_WORKER batches each, it tokenizes
the next one itself, so `num_proc` processes in all do the work. The results are appended in source order to
each split's open shard. At most IN_FLIGHT_PER_WORKER small batches per process are in flight, so memory
stays bounded whatever the corpus size.

Each split is one token stream (documents joined by eot) cut into shards of exactly `shard_tokens`
tokens (the last one shorter). A shard is written to `.<name>.partial`, synced, hashed and renamed to
its name when full. After a shard is finished, and at least every RECORD_EVERY_S seconds, at the next
document start, the writer syncs the open partials and records (atomically) where the source stands:
the next document's position, and each split's finished shards (with checksums) and partial length;
so a kill loses at most those seconds of work and the batches in flight. A prepare killed at any moment and run
again verifies the finished shards, cuts the partials back to the recorded length and reads the
source on from the recorded document: it ends byte-equal to an uninterrupted prepare.
"""
from __future__ import annotations

import ctypes
import gc
import hashlib
import json
import multiprocessing as mp
import os
import re
import resource
import signal
import sys
import time
from collections import deque
from pathlib import Path
from typing import Any, Iterator

import numpy as np

from bounded import read_own
from errors import UserError
from fileio import atomic_write_bytes, json_loads, open_own
from ownership import MANIFEST_MAX

from .pieces import Piece
from .tokenizer import Tokenizer, get_tokenizer

SPLITS = ("train", "val")
# what a prepared folder's bookkeeping file too large to be ours says to do (a rebuild would replace it, so not that):
# the resume record's here, the manifest's, the source records' and a trained tokenizer's (manifest.py imports shards)
MOVE_AWAY = "it is not one prepare wrote: move it away (or set data.root to another directory), then rerun"
BATCH_CHARS = 1 << 16  # text per task; with IN_FLIGHT_PER_WORKER tasks per process at most, this bounds memory
IN_FLIGHT_PER_WORKER = 4
RECORD_EVERY_S = 1.0  # the longest a kill can set a prepare back (plus the batches in flight)
INLINE_BELOW = 8 << 20  # sources smaller than this (bytes) are tokenized in this process: no pool to start
SAMPLE_BLOCKS, SAMPLE_BLOCK = 64, 64 << 10  # the sampled checksum: 64 blocks of 64 KiB spread over a shard


# every name a build writes under (shard_name, its partial, state_path; build_writer's tokenizer file and
# fingerprint.SOURCE_RECORDS): what a rebuild may remove beside the files the replaced manifest names
BUILD_FILE = re.compile(r"\.?(train|val)-[0-9a-f]{12}-\d{5}\.bin(\.partial)?|\.prepare-[0-9a-f]{12}\.json"
                        r"|tokenizer-[0-9a-f]{12}\.json|\.source-hashes\.json")


def shard_name(build: str, split: str, index: int) -> str:
    return f"{split}-{build}-{index:05d}.bin"


def doc_in_val(text: str, val_fraction: float) -> bool:
    """A document's split: a hash of its (first piece of) text, so it stays put when files are renamed,
    reordered or added."""
    h = int.from_bytes(hashlib.blake2b(text.encode("utf-8", "surrogatepass"), digest_size=8).digest(), "little")
    return h < val_fraction * 2.0**64


def sample_sha256(path: Path, itemsize: int) -> str:
    """sha256 of SAMPLE_BLOCKS blocks at fixed places of the file (all of it when it is small): what a
    start-up check of a large corpus hashes instead of every byte."""
    size = path.stat().st_size
    h = hashlib.sha256()
    with open(path, "rb") as f:
        if size <= SAMPLE_BLOCKS * SAMPLE_BLOCK:
            h.update(f.read())
        else:
            for start in np.linspace(0, size - SAMPLE_BLOCK, SAMPLE_BLOCKS).astype(np.int64):
                f.seek(int(start) // itemsize * itemsize)
                h.update(f.read(SAMPLE_BLOCK))
    return h.hexdigest()


def file_sha256(path: Path, limit: int | None = None) -> str:
    h = hashlib.sha256()
    left = limit
    with open(path, "rb") as f:
        while chunk := f.read(16 << 20 if left is None else min(16 << 20, left)):
            h.update(chunk)
            if left is not None:
                left -= len(chunk)
    return h.hexdigest()


# --- workers --------------------------------------------------------------------------------------

_worker: dict[str, Any] = {}


def _init_worker(spec: dict, dtype: str, val_fraction: float | None, in_pool: bool = False) -> None:
    """Set up tokenizing in this process. A forked worker finds the parent's tokenizer already there
    (write_shards puts it in `_worker` before forking) and keeps it: its tables stay in pages shared
    with the parent, instead of ~20 MB of GPT-2 merges built again in every worker."""
    if in_pool:
        signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C: the main process stops the pool, quietly
        fixed_mmap_threshold()
        os.environ["TOKENIZERS_PARALLELISM"] = "false"  # one thread per worker; and no warning about the fork
    inherited = _worker.get("tok")
    if inherited is None or _worker.get("spec") != spec:
        inherited = get_tokenizer(spec["tokenizer"], spec.get("chars"), spec.get("bpe"))
    _worker.update(tok=inherited, spec=spec, dtype=np.dtype(dtype), val_fraction=val_fraction)


def fixed_mmap_threshold(nbytes: int = 64 << 10) -> None:
    """Make glibc's malloc serve every block of `nbytes` or more with its own mmap, returned to the OS when
    freed. By default glibc raises that threshold each time such a block is freed, after which the batches'
    texts, pickles and id arrays are carved from the heap and fragment it: a prepare's main process then
    grew ~0.2 MB/s for as long as it ran (flat with this). For a process of the prepare's own (the CLI, the
    pool's workers), never train.py's, whose tensors want the default. Elsewhere than glibc, nothing."""
    if sys.platform != "linux":
        return
    try:
        ctypes.CDLL(None).mallopt(-3, nbytes)  # M_MMAP_THRESHOLD
    except (OSError, AttributeError):  # not glibc
        pass


def _encode(items: list[tuple[bool, str, int | None]]) -> list[tuple[int | None, np.ndarray, int]]:
    """Tokenize a batch: for each piece (its split when it starts a document, its ids, its UTF-8 bytes)."""
    tok: Tokenizer = _worker["tok"]
    ids = tok.encode_arrays([text for _, text, _ in items])
    out = []
    for (new_doc, text, split), arr in zip(items, ids):
        if new_doc and split is None:
            split = int(doc_in_val(text, _worker["val_fraction"]))
        if len(arr) and int(arr.max()) >= tok.vocab_size:  # a tokenizer bug, never user data: say so
            raise UserError(f"the {tok.name} tokenizer produced id {int(arr.max())} >= its vocab_size {tok.vocab_size}; "
                            f"update the tokenizer library, or report this")
        out.append((split if new_doc else None, arr.astype(_worker["dtype"]), len(text.encode("utf-8", "surrogatepass"))))
    return out


# --- the writer -----------------------------------------------------------------------------------


class _Split:
    """One split's stream: finished shards, and the open partial shard."""

    def __init__(self, out: Path, build: str, name: str, dtype: np.dtype, shard_tokens: int, state: dict | None):
        self.out, self.build, self.name, self.dtype, self.size = out, build, name, dtype, shard_tokens
        st = state or {"shards": [], "partial": 0, "tokens": 0, "bytes": 0, "docs": 0}
        self.shards: list[dict] = st["shards"]
        self.partial, self.tokens, self.bytes, self.docs = st["partial"], st["tokens"], st["bytes"], st["docs"]
        self.hash = hashlib.sha256()
        path = self._partial_path()
        final = self.out / shard_name(build, name, len(self.shards))
        if self.partial and not path.exists():  # killed after this shard was finished, before the next record:
            with open(final, "rb") as src, open_own(path, "wb") as dst:  # its head is the recorded partial
                dst.write(src.read(self.partial * dtype.itemsize))
        if self.partial:  # resuming: the partial holds at least what was recorded; cut it back to that
            with open_own(path, "r+b") as f:
                f.truncate(self.partial * dtype.itemsize)
            self.hash = hashlib.sha256()
            with open(path, "rb") as f:
                while chunk := f.read(16 << 20):
                    self.hash.update(chunk)
        self.file = open_own(path, "r+b" if self.partial else "wb")
        self.file.seek(0, os.SEEK_END)

    def _partial_path(self) -> Path:
        return self.out / f".{shard_name(self.build, self.name, len(self.shards))}.partial"

    def state(self) -> dict:
        return {"shards": self.shards, "partial": self.partial, "tokens": self.tokens, "bytes": self.bytes,
                "docs": self.docs}

    def write(self, ids: np.ndarray) -> bool:
        """Append tokens; True when a shard was finished."""
        finished = False
        while len(ids):
            room = self.size - self.partial
            part, ids = ids[:room], ids[room:]
            data = part.tobytes()
            self.file.write(data)
            self.hash.update(data)
            self.partial += len(part)
            self.tokens += len(part)
            if self.partial == self.size:
                self.finish_shard()
                finished = True
        return finished

    def finish_shard(self) -> None:
        self.file.flush()
        os.fsync(self.file.fileno())
        self.file.close()
        name = shard_name(self.build, self.name, len(self.shards))
        os.replace(self._partial_path(), self.out / name)
        self.shards.append({"name": name, "tokens": self.partial, "sha256": self.hash.hexdigest(),
                            "sample_sha256": sample_sha256(self.out / name, self.dtype.itemsize)})
        self.partial, self.hash = 0, hashlib.sha256()
        self.file = open_own(self._partial_path(), "wb")

    def sync(self) -> None:
        self.file.flush()
        os.fsync(self.file.fileno())

    def close(self, keep_partial: bool) -> None:
        """At the end: the partial becomes the last shard (if it holds tokens) or is removed."""
        if self.partial and keep_partial:
            self.finish_shard()
        self.file.close()
        self._partial_path().unlink(missing_ok=True)


def state_path(out: Path, build: str) -> Path:
    return out / f".prepare-{build}.json"


def load_resume_state(out: Path, build: str, fingerprint: str, say) -> dict | None:
    """The recorded state of a killed prepare of this build, its finished shards verified; None (start
    over) when there is none or anything in it does not check out."""
    path = state_path(out, build)
    if not path.is_file():
        return None
    try:
        # bounded (a manifest's limit: it holds as much): a huge file there is refused, not read nor written over
        state = json_loads(read_own(path, "the record of an interrupted prepare (JSON)", limit=MANIFEST_MAX,
                                    fix=MOVE_AWAY))
        if state["fingerprint"] != fingerprint:  # another build's record (not an assert: python -O skips those)
            return None
        itemsize = np.dtype(state["dtype"]).itemsize
        for split in SPLITS:
            st = state["splits"][split]
            for shard in st["shards"]:
                f = out / shard["name"]
                if not f.is_file() or f.stat().st_size != shard["tokens"] * itemsize or file_sha256(f) != shard["sha256"]:
                    say(f"{f.name} of the interrupted prepare does not check out; starting over")
                    return None
            partial = out / f".{shard_name(build, split, len(st['shards']))}.partial"
            if st["partial"] and not partial.is_file():  # finished after the record was written: its head will do
                partial = out / shard_name(build, split, len(st["shards"]))
            if st["partial"] and (not partial.is_file() or partial.stat().st_size < st["partial"] * itemsize):
                say(f"{partial.name} of the interrupted prepare is shorter than recorded; starting over")
                return None
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return state


def write_shards(out: Path, build: str, fingerprint: str, pieces: Iterator[Piece], tok: Tokenizer, *,
                 shard_tokens: int, val_fraction: float | None, workers: int, resume: dict | None,
                 extra_state: dict, bar, say) -> dict:
    """Tokenize `pieces` into the shards of both splits; return {split: its _Split.state()} plus counts.

    `resume`: a verified state of an interrupted prepare (its pieces must start at resume["pos"]).
    `extra_state`: recorded beside the position (a char vocabulary, a tokenizer's file, skipped rows).
    """
    dtype = np.dtype(np.uint16 if tok.vocab_size <= 1 << 16 else np.uint32)
    splits = [_Split(out, build, s, dtype, shard_tokens, resume["splits"][s] if resume else None) for s in SPLITS]
    spec = {"tokenizer": tok.name, "chars": tok.chars, "bpe": tok.bpe}
    eot = np.array([tok.eot], dtype=dtype)
    cur: _Split | None = None  # the split of the document being written
    started = False  # has it written tokens yet (an eot goes before a document's first tokens)?
    due = False  # a shard was finished since the last record: record at the next document start
    t0, tokens_at_start = time.perf_counter(), sum(s.tokens for s in splits)
    last_record = t0

    def record(pos: Any) -> None:
        nonlocal last_record
        last_record = time.perf_counter()
        for s in splits:
            s.sync()
        state = {"fingerprint": fingerprint, "pos": pos, "splits": {s.name: s.state() for s in splits}, **extra_state()}
        atomic_write_bytes(state_path(out, build), json.dumps(state).encode())

    def results() -> Iterator[tuple[Piece, tuple]]:
        """(piece, (split, ids, bytes)) in source order. With `workers` processes, this one is one of them:
        it reads, writes and tokenizes whatever the pool (workers - 1 forked processes) has no room for."""
        batches = _batches(pieces)
        _worker.update(tok=tok, spec=spec)  # used here, and inherited by forked workers (_init_worker)
        _init_worker(spec, dtype.name, val_fraction)
        if workers <= 1:
            for batch in batches:
                yield from zip(batch, _encode(_items(batch)))
            return
        ctx = mp.get_context("fork" if sys.platform == "linux" else "spawn")
        gc.freeze()  # the parent's objects stay out of the workers' collections, so their pages stay shared
        try:
            pool = ctx.Pool(workers - 1, initializer=_init_worker, initargs=(spec, dtype.name, val_fraction, True))
        finally:
            gc.unfreeze()  # the workers are forked: the parent (train.py's, too) collects as before
        with pool:
            pending: deque = deque()  # (batch, its pool job or its ids tokenized here), in source order
            for batch in batches:
                in_pool = sum(not isinstance(job, list) for _, job in pending)
                if in_pool < IN_FLIGHT_PER_WORKER * (workers - 1):
                    pending.append((batch, pool.apply_async(_encode, (_items(batch),))))
                else:  # the pool is full: tokenize this one here instead of waiting
                    pending.append((batch, _encode(_items(batch))))
                while pending and (len(pending) > IN_FLIGHT_PER_WORKER * workers or _ready(pending[0][1])):
                    yield from _take(pending)
            while pending:
                yield from _take(pending)
            pool.close()
            pool.join()

    for piece, (split, ids, _nbytes) in results():
        if piece.new_doc:
            if due or time.perf_counter() - last_record > RECORD_EVERY_S:
                record(piece.pos)
                due = False
            cur, started = splits[split], False
        elif piece.split is not None and cur is not None and cur is not splits[piece.split]:
            cur, started = splits[piece.split], False  # the tail of a single text file: on into val
        if cur is None:  # progress-only pieces before the first document
            bar.update(piece.advance)
            continue
        if len(ids):
            if not started:
                if cur.docs:
                    due |= cur.write(eot)
                cur.docs += 1
                started = True
            due |= cur.write(ids)
        cur.bytes += _nbytes
        if piece.advance:
            bar.update(piece.advance)
            elapsed = time.perf_counter() - t0
            if elapsed > 0:
                bar.set_postfix_str(f"{(sum(s.tokens for s in splits) - tokens_at_start) / elapsed / 1e6:.2f}M tok/s",
                                    refresh=False)
    for s in splits:
        s.close(keep_partial=True)
    return {s.name: s.state() for s in splits}


def _items(batch: list[Piece]) -> list[tuple[bool, str, int | None]]:
    return [(p.new_doc, p.text, p.split) for p in batch]


def _ready(job: Any) -> bool:
    return isinstance(job, list) or job.ready()


def _take(pending: deque) -> Iterator[tuple[Piece, tuple]]:
    """The oldest batch's pieces with their results, waiting for its pool job if it has one."""
    done, job = pending.popleft()
    return zip(done, job if isinstance(job, list) else job.get())


def _batches(pieces: Iterator[Piece]) -> Iterator[list[Piece]]:
    batch: list[Piece] = []
    size = 0
    for piece in pieces:
        batch.append(piece)
        size += len(piece.text)
        if size >= BATCH_CHARS:
            yield batch
            batch, size = [], 0
    if batch:
        yield batch


def peak_memory_mb() -> tuple[float, float]:
    """(this process's peak RSS, the largest finished child's), in MB (Linux reports KB)."""
    scale = 1 / 1024 if sys.platform != "darwin" else 1 / 2**20
    return (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * scale,
            resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss * scale)
